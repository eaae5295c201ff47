"""A speculative duplicate on a real cluster: two attempts of one task both write their file to S3,
only one reaches the manifest, and each row is staged once.

On the session's standalone cluster (two workers, each its own loopback host: Spark never runs a
speculative copy on the host of the first attempt), a job stages 50 rows in one task through the
executors' writer into moto's S3 server, with speculation on. The task's first attempt writes its
whole file and then stops (``executor.after_file`` with ``WALSINK_CRASH_SIGNAL=STOP``: a straggler,
a paused VM) without reporting it; after the speculation threshold Spark starts a copy on the other
worker, which writes its own file and reports it; Spark then kills the straggler.

Checked: the event log shows the speculative launch and that the copy's attempt is the one that
succeeded; the store holds both attempts' complete files; the sealed manifest lists only the copy's,
which holds every row once; the durability check passes on it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_walsink.core.staging.durability import check_stored_attempt
from airflow_provider_walsink.core.staging.object_store import StagingStore
from tests.table_fixtures import ACCESS_KEY, REGION, SECRET_KEY, s3_server  # noqa: F401

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROWS = 50
ATTEMPT_ID = "5" * 32

_JOB = textwrap.dedent(
    """
    import json, sys
    from pyspark.sql import SparkSession
    from airflow_provider_walsink.core.spark import CheckpointJob, ProtocolArgs

    master, root, options, events, crash_log = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4], sys.argv[5]
    spark = (
        SparkSession.builder.master(master)
        .appName("walsink-speculation-test")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.executor.memory", "512m")
        # One executor on each worker (one core each), both up before the job starts.
        .config("spark.cores.max", "2")
        .config("spark.scheduler.minRegisteredResourcesRatio", "1.0")
        .config("spark.scheduler.maxRegisteredResourcesWaitingTime", "300s")
        # A one-task stage is speculated once its task runs longer than the threshold.
        .config("spark.speculation", "true")
        .config("spark.speculation.interval", "200ms")
        .config("spark.speculation.task.duration.threshold", "3s")
        # The straggler: the first attempt of each task stops once its file is complete.
        .config("spark.executorEnv.WALSINK_CRASH_AT", "executor.after_file")
        .config("spark.executorEnv.WALSINK_CRASH_SIGNAL", "STOP")
        .config("spark.executorEnv.WALSINK_CRASH_LOG", crash_log)
        .config("spark.eventLog.enabled", "true")
        .config("spark.eventLog.dir", events)
        .config("spark.eventLog.rolling.enabled", "false")
        .config("spark.eventLog.compress", "false")
        .getOrCreate()
    )
    protocol = ProtocolArgs(
        pipeline="events", checkpoint_key="k1", sequence=1, attempt=1, attempt_id="5" * 32,
        staging_root=root, partition_by=("dt",),
    )
    rows = [(f"r{i}", "2026-01-01", i) for i in range(50)]
    with CheckpointJob(spark, protocol, storage_options=options) as job:
        job.stage(spark.createDataFrame(rows, "id string, dt string, n int").coalesce(1))
    print("APP", spark.sparkContext.applicationId, flush=True)
    spark.stop()
    """
)


def _stopped_stragglers() -> list[int]:
    """Python workers still stopped at the crash point (Spark should have killed them)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            environ = (proc / "environ").read_bytes()
        except OSError:
            continue
        if state == "T" and b"WALSINK_CRASH_SIGNAL=STOP" in environ and b"executor.after_file" in environ:
            found.append(int(proc.name))
    return found


def test_a_speculative_copy_and_its_straggler_both_write_and_the_manifest_holds_each_row_once(
    spark_cluster,
    s3_server,  # noqa: F811
    tmp_path,
):
    root = f"s3://{s3_server.bucket}/speculation-{uuid.uuid4().hex[:8]}"
    options = {"endpoint_url": s3_server.endpoint, "access_key": ACCESS_KEY, "secret_key": SECRET_KEY,
               "region": REGION}  # fmt: skip
    script, events, crash_log = tmp_path / "job.py", tmp_path / "events", tmp_path / "crashes"
    script.write_text(_JOB)
    events.mkdir()
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    try:
        done = subprocess.run(
            [sys.executable, str(script), spark_cluster.master_url, root, json.dumps(options), str(events),
             str(crash_log)],
            env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-4000:]
    finally:
        stragglers = _stopped_stragglers()
        for pid in stragglers:
            os.kill(pid, signal.SIGKILL)
    assert not stragglers, f"Spark left the straggler's stopped Python worker(s) {stragglers} behind"
    # The first attempt did reach its crash point (file complete), once.
    assert crash_log.read_text().splitlines() == ["executor.after_file:1"]

    # The event log: a speculative copy was launched, and it is the attempt that succeeded.
    (app_id,) = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("APP ")]
    (log,) = [p for p in events.iterdir() if p.name.split(".")[0] == app_id]
    log_events = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    starts = [(e["Stage ID"], e["Task Info"]) for e in log_events if e["Event"] == "SparkListenerTaskStart"]
    ends = [
        (e["Stage ID"], e["Task Info"], e["Task End Reason"]["Reason"])
        for e in log_events
        if e["Event"] == "SparkListenerTaskEnd"
    ]
    speculative = [(stage, t) for stage, t in starts if t["Speculative"]]
    assert len(speculative) == 1, starts
    stage, copy = speculative[0]
    succeeded = [
        (t["Task ID"], t["Speculative"]) for s, t, reason in ends if s == stage and reason == "Success"
    ]
    assert succeeded == [(copy["Task ID"], True)], ends
    hosts = {t["Host"] for s, t in starts if s == stage}
    assert len(hosts) == 2, f"the copy ran on the straggler's host: {hosts}"

    # The store holds both attempts' complete files; the manifest only the copy's.
    store = StagingStore.open(root, options)
    location = store.attempt("events", "k1", 1, ATTEMPT_ID)
    manifest = store.read_manifest(location)
    staged = set(store.list_attempt(location, visible_only=True))
    listed = {c.path for c in manifest.committables}
    assert len(staged) == 2 and len(listed) == 1 and listed < staged, (staged, listed)
    (stray,) = staged - listed
    for path in staged:  # both complete Parquet files with all the rows: a real duplicate
        with store.filesystem.open_input_file(store.committable(location, path)) as f:
            assert pq.read_table(pa.BufferReader(f.read())).num_rows == ROWS, path
    (committable,) = manifest.committables
    assert committable.writer == f"{app_id}/task-0", committable.writer
    assert manifest.total_rows == ROWS
    with store.filesystem.open_input_file(store.committable(location, committable.path)) as f:
        table = pq.read_table(pa.BufferReader(f.read()))
    assert sorted(table["n"].to_pylist()) == list(range(ROWS))
    assert check_stored_attempt(store, manifest, location, verify_checksums=True).durable
