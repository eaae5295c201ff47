"""Issue 36: the write job through Spark Connect (``hooks/spark_connect_runner.py``).

A ``spark_connect`` connection as the write task's ``spark_conn_id`` runs the same job file as a
Spark Connect client in the task's process, against a real Connect server started from the
venv's pyspark (``tests/spark_connect_server.py``, the session-scoped ``spark_connect_server``
fixture): the example pipeline through ``dag.test()``, each source row once in the target; an
unreachable server fails the attempt naming the connection, nothing sealed, no token anywhere.
"""

from __future__ import annotations

import importlib
import json
import sys
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow.dataset as ds
import pyspark
import pytest

from airflow_provider_walsink.core.protocol import CheckpointState as S
from airflow_provider_walsink.core.runners import runner_name
from airflow_provider_walsink.core.store import CommitterStore
from airflow_provider_walsink.operators.write import WalWriteOperator

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "dags"))

import walsink_example_common as examples  # noqa: E402

CONN_ID = "spark_connect_test"
TOKEN = "walsink-test-token-Zq81"


def use_committer(monkeypatch, url: str, staging: Path) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_WALSINK_DEFAULT",
        json.dumps({"conn_type": "walsink", "extra": {"url": url, "staging_root": str(staging)}}),
    )


def test_the_connection_type_picks_the_runner(monkeypatch):
    """``spark_connect`` → the Connect runner; ``spark``, any other type and no connection →
    spark-submit as before; spark-submit's own arguments are refused with a Connect connection."""
    from airflow_provider_walsink.hooks.spark_connect_runner import SparkConnectRunner
    from airflow_provider_walsink.hooks.spark_submit_runner import SparkSubmitRunner

    assert runner_name("spark_connect") == "spark_connect"
    assert runner_name("spark") == runner_name("yarn") == runner_name(None) == "spark"
    monkeypatch.setenv("AIRFLOW_CONN_SC", json.dumps({"conn_type": "spark_connect", "host": "127.0.0.1"}))
    monkeypatch.setenv("AIRFLOW_CONN_SP", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    op = WalWriteOperator(task_id="w", application="job.py", pipeline="p", spark_conn_id="sc")
    assert isinstance(op.get_runner(), SparkConnectRunner)
    op = WalWriteOperator(task_id="w", application="job.py", pipeline="p", spark_conn_id="sp")
    assert isinstance(op.get_runner(), SparkSubmitRunner)
    assert isinstance(
        WalWriteOperator(task_id="w", application="j.py", pipeline="p").get_runner(), SparkSubmitRunner
    )
    op = WalWriteOperator(
        task_id="w",
        application="job.py",
        pipeline="p",
        spark_conn_id="sc",
        spark_submit_kwargs={"py_files": "x"},
    )
    with pytest.raises(
        ValueError, match=r"spark_submit_kwargs cannot be used with a spark_connect connection \('sc'\)"
    ):
        op.get_runner()


@pytest.mark.spark
def test_a_wrong_token_fails_the_attempt_naming_the_connection(
    monkeypatch, sqlite_store, database_urls, tmp_path
):
    """The server (requiring a token) refuses the connection's: the write task fails within
    seconds, naming the connection and the server; the attempt is recorded FAILED with that
    error, nothing is sealed, and the token is in neither the error nor the committer table.
    (A server that does not answer at all is refused before anything is recorded:
    tests/test_preflight.py.)"""
    from spark_connect_server import ConnectServer

    url = database_urls("sqlite")
    staging = tmp_path / "staging"
    use_committer(monkeypatch, url, staging)
    # A server of its own: the session's takes any token.
    server = ConnectServer.start(tmp_path / "server", master="local[1]", token="the-servers-token-8Kx")
    # "localhost": the client sends a token without TLS only there.
    monkeypatch.setenv(
        "AIRFLOW_CONN_SPARK_CONNECT_DOWN",
        json.dumps(
            {"conn_type": "spark_connect", "host": "localhost", "port": server.port, "password": TOKEN}
        ),
    )
    try:
        _fails_naming_the_connection("wrong token", server.port, staging, url, tmp_path)
    finally:
        server.stop()


@pytest.mark.spark
def test_a_server_older_than_the_job_needs_fails_the_attempt_naming_the_connection(
    spark_connect_server, monkeypatch, database_urls, tmp_path
):
    """A server whose Spark version cannot run the job (below ``MIN_SERVER_VERSION``, 3.5) is
    refused after its one version call, before the job file runs: the attempt FAILED with the
    versions named, nothing sealed. No Spark older than 4.0 has a Connect server that runs here
    (Maven Central is unreachable; pyspark wheels before 4.0 ship none), so the session's real
    server answers its real version and the oldest version the job accepts is raised above it."""
    from airflow_provider_walsink.hooks import spark_connect_runner

    url = database_urls("sqlite")
    staging = tmp_path / "staging"
    use_committer(monkeypatch, url, staging)
    monkeypatch.setattr(spark_connect_runner, "MIN_SERVER_VERSION", (99, 0))
    env = spark_connect_server.connection_env("spark_connect_down")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    _fails_naming_the_connection("old server", spark_connect_server.port, staging, url, tmp_path,
                                 host="127.0.0.1")  # fmt: skip


def _fails_naming_the_connection(
    how: str, port: int, staging: Path, url: str, tmp_path: Path, host: str = "localhost"
) -> None:
    from airflow_provider_walsink.hooks.spark_connect_runner import SparkConnectJobError

    job = tmp_path / "job.py"
    job.write_text("raise SystemExit('the job must not start')\n")
    op = WalWriteOperator(
        task_id="write",
        application=str(job),
        pipeline="events",
        checkpoint_key="20260401T000000Z",
        spark_conn_id="spark_connect_down",
    )
    start = datetime(2026, 4, 1, tzinfo=UTC)
    ti = SimpleNamespace(dag_id="connect_test", task_id="write", run_id="manual", try_number=1, map_index=-1,
                         id=None, xcom_push=lambda key, value: None)  # fmt: skip
    context: dict[str, Any] = {"ti": ti, "logical_date": start, "data_interval_start": start,
                               "data_interval_end": start + timedelta(days=1)}  # fmt: skip
    with pytest.raises(SparkConnectJobError) as failed:
        op.execute(context)
    message = str(failed.value)
    what = {
        "wrong token": "refused the connection's token (UNAUTHENTICATED)",
        "old server": f"runs Spark {pyspark.__version__}; the write job needs Spark 99.0 or later",
    }[how]
    assert "'spark_connect_down'" in message and f"{host}:{port}" in message and what in message, message
    assert TOKEN not in message
    record = CommitterStore.from_url(url).require("events", "20260401T000000Z")
    assert record.state is S.FAILED and record.sealed_attempt is None
    assert "spark_connect_down" in record.error and TOKEN not in record.error
    assert not list(staging.rglob("_walsink_manifest*")) and not list(staging.rglob("*.json"))


@pytest.mark.spark
@pytest.mark.airflow
def test_example_pipeline_through_spark_connect(
    spark_connect_server, airflow_db, monkeypatch, tmp_path, sqlite_store, database_urls, capfd, caplog
):
    """``walsink_daily_overwrite`` with ``WALSINK_EXAMPLE_SPARK_CONN_ID`` naming a ``spark_connect``
    connection with a token: the unchanged job file runs as a Connect client of the server (its
    Spark jobs are the server's), the checkpoint commits, each source row is in the target once,
    and the token is in no line the run printed or logged."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    url = database_urls("sqlite")
    home, staging = tmp_path / "examples", tmp_path / "staging"
    use_committer(monkeypatch, url, staging)
    monkeypatch.setenv("AIRFLOW_VAR_WALSINK_EXAMPLE_HOME", str(home))
    spark_connect_server.wait_ready()
    # "localhost": the client then sends the token without TLS (the test server has none and
    # takes any token: it sets no spark.connect.authenticate.token).
    connection = {
        "conn_type": "spark_connect",
        "host": "localhost",
        "port": spark_connect_server.port,
        "password": TOKEN,
    }
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps(connection))
    monkeypatch.setenv("WALSINK_EXAMPLE_SPARK_CONN_ID", CONN_ID)  # read when the DAG is parsed
    jobs_before = spark_connect_server.log_path.read_text(errors="replace").count("Got job")
    from pyspark import SparkContext

    classic = SparkContext._active_spark_context  # the session's local Spark, if a test started it
    # A fresh module object, dropped again at teardown: other tests of this process import the
    # example DAG as parsed without the variable (a reload would change their cached module).
    monkeypatch.setitem(sys.modules, "walsink_daily_overwrite", None)  # records what to restore
    del sys.modules["walsink_daily_overwrite"]
    module = importlib.import_module("walsink_daily_overwrite")
    dag = module.dag
    assert dag.get_task("daily_events.write").spark_conn_id == CONN_ID

    day = date(2026, 2, 12)
    run = dag.test(logical_date=datetime(day.year, day.month, day.day, tzinfo=UTC))
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert run.state == "success", states

    store = CommitterStore.from_url(url)
    key = f"{day:%Y%m%d}T000000Z"
    record = store.require("daily_events", key)
    assert record.state is S.COMMITTED
    expected = examples.daily_events(day)
    assert record.rows == len(expected)
    rows = ds.dataset(home / "target/daily_events", format="parquet", partitioning="hive",
                      ignore_prefixes=[".", "_"]).to_table().to_pylist()  # fmt: skip
    assert sorted(r["event_id"] for r in rows) == sorted(e["event_id"] for e in expected)  # each once
    assert sum(r["amount_cents"] for r in rows) == sum(e["amount_cents"] for e in expected)
    # It ran on the server (its jobs are in the server's log; no SparkContext started here, one
    # already here left as it was), the session was released after the job, and the token was
    # printed nowhere.
    assert spark_connect_server.log_path.read_text(errors="replace").count("Got job") > jobs_before
    printed = capfd.readouterr()
    assert "as a Spark Connect client of Spark Connect server localhost:" in printed.out + printed.err
    assert TOKEN not in printed.out + printed.err and TOKEN not in caplog.text

    assert SparkContext._active_spark_context is classic
    assert ConnectSession.getActiveSession() is None


LONG_JOB = """
import sys
from pathlib import Path

from pyspark.sql import SparkSession

spark = SparkSession.builder.getOrCreate()
running = Path(sys.argv[1])


def progress(stages=None, inflight_tasks=0, operation_id=None, done=False, **_):
    if inflight_tasks:  # the server reports tasks running: past analysis and planning
        running.touch()


spark.registerProgressHandler(progress)
spark.range(0, 10**13, 1, 2).selectExpr("sum(hash(id))").collect()  # runs until stopped
"""


@pytest.mark.spark
@pytest.mark.parametrize("how", ["cancel", "session lost", "interrupted elsewhere"])
def test_a_cancelled_job_and_a_lost_session_end_the_job_naming_the_connection(
    how, spark_connect_server, monkeypatch, tmp_path
):
    """``cancel()`` (the write task killed) interrupts the running Connect operation; a session
    that ends under the job (released on the server, which cancels its operations first) fails it
    as a lost session; an interrupt from another client of the session is named as such. Each
    way the job ends within seconds with an error naming the connection and the session is released."""
    import threading
    import time

    from pyspark.sql.connect.session import SparkSession as ConnectSession

    from airflow_provider_walsink.hooks.spark_connect_runner import SparkConnectJobError, SparkConnectRunner

    for key, value in spark_connect_server.connection_env(CONN_ID).items():
        monkeypatch.setenv(key, value)
    job = tmp_path / "long_job.py"
    job.write_text(LONG_JOB)
    runner = SparkConnectRunner(job_name="walsink-test", spark_conn_id=CONN_ID)
    errors: list[BaseException] = []

    def submit() -> None:
        try:
            runner.submit(str(job), [str(running)], {})
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    running = tmp_path / "running"
    thread = threading.Thread(target=submit)
    thread.start()
    # Stop it once its tasks run: an interrupt that lands while the server still analyses or
    # plans the query can be lost, and the query then starts its job anyway (a Spark limit,
    # docs/production.md "Choosing a runner"), which would keep the test server's cores busy.
    deadline = time.monotonic() + 120
    while not running.exists() and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert thread.is_alive() and running.exists(), errors
    stopped = time.monotonic()
    if how == "cancel":
        runner.cancel()
    else:
        other = ConnectSession(connection=f"{spark_connect_server.url}/;session_id={runner.session_id}")
        if how == "session lost":
            other.client.release_session()
        else:
            other.interruptAll()
        other.client.close()
    thread.join(30)
    assert not thread.is_alive() and time.monotonic() - stopped < 30
    (error,) = errors
    assert isinstance(error, SparkConnectJobError)
    expected = {
        "cancel": "was cancelled on",
        "session lost": f"lost its session {runner.session_id} on",
        "interrupted elsewhere": "from outside this task (an interrupt from another session)",
    }[how]
    assert expected in str(error) and f"(connection '{CONN_ID}')" in str(error), error
    assert runner.session is None and ConnectSession.getActiveSession() is None
    # Seen on the server: the job's tasks were killed as its operation's (session's) job was cancelled.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not any(
        "SPARK_JOB_CANCELLED" in line and f"Session_{runner.session_id}" in line
        for line in spark_connect_server.log_path.read_text(errors="replace").splitlines()
    ):
        time.sleep(0.5)
    log = spark_connect_server.log_path.read_text(errors="replace")
    assert f"Session_{runner.session_id}" in log and "SPARK_JOB_CANCELLED" in log


EXECUTORS_JOB = """
import sys

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from airflow_provider_walsink.core.spark import CheckpointJob, ProtocolArgs

spark = SparkSession.builder.getOrCreate()
protocol, (report,) = ProtocolArgs.from_argv(sys.argv[1:])
with CheckpointJob(spark, protocol, writer="executors") as job:
    job.stage(spark.range(0, 1000, 1, 2).withColumn("dt", F.lit("2026-04-01")), partition_by=["dt"])


def where(batches):
    import pyarrow as pa

    import airflow_provider_walsink.core.spark.executor_write as module

    for _ in batches:
        yield pa.RecordBatch.from_pylist([{"file": module.__file__}])


with open(report, "w") as out:
    out.write(spark.range(0, 1, 1, 1).mapInArrow(where, "file string").collect()[0]["file"])
"""


@pytest.mark.spark
def test_executors_stage_through_connect_with_walsink_shipped_to_them(
    spark_connect_server, monkeypatch, tmp_path
):
    """The executors' writer (``mapInArrow``, cloudpickled with the plan) stages into the attempt
    and the job seals it; the executors import walsink from the zip the runner shipped with the
    session (``addArtifacts(pyfile=True)``), not from an installation."""
    from airflow_provider_walsink.core.protocol.manifest import read_manifest
    from airflow_provider_walsink.core.spark import ProtocolArgs
    from airflow_provider_walsink.core.staging import StagingLayout
    from airflow_provider_walsink.hooks.spark_connect_runner import SparkConnectRunner

    for key, value in spark_connect_server.connection_env(CONN_ID).items():
        monkeypatch.setenv(key, value)
    job, report = tmp_path / "executors_job.py", tmp_path / "where.txt"
    job.write_text(EXECUTORS_JOB)
    protocol = ProtocolArgs(pipeline="events", checkpoint_key="k1", sequence=1, attempt=1,
                            staging_root=str(tmp_path / "staging"), attempt_id="ab" * 16)  # fmt: skip
    runner = SparkConnectRunner(job_name="walsink-test", spark_conn_id=CONN_ID)
    runner.submit(str(job), [*protocol.to_argv(), str(report)], {})
    assert runner.shipped and runner.shipped in report.read_text()  # .../<zip>/airflow_provider_walsink/...
    attempt = StagingLayout(tmp_path / "staging").attempt_dir("events", "k1", 1, "ab" * 16)
    manifest = read_manifest(attempt / "_manifest.json")
    assert manifest.total_rows == 1000 and manifest.expected_count == 2
    assert manifest.job.startswith("spark:local-") and all(
        c.writer.startswith(manifest.job[6:]) for c in manifest.committables
    )


@pytest.mark.spark
def test_the_kafka_source_reads_its_ranges_through_connect(spark_connect_server):
    """The Kafka source's reader needs no SparkContext: through a Connect session its executors read
    exactly the planned ranges, one split per task (the rest of the Kafka pipeline is the job's, as
    under spark-submit)."""
    pytest.importorskip("confluent_kafka")
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    from airflow_provider_walsink.core.sources.kafka import (
        ConsumerMetadata,
        KafkaSourceSpec,
        kafka_dataframe,
        plan_offsets,
        split_ranges,
    )
    from tests.kafka_mock import MockKafka

    kafka = MockKafka()
    session = ConnectSession.builder.remote(spark_connect_server.url).create()
    try:
        topic = "connect-range"
        produced = kafka.produce(topic, [{"key": f"k{i}".encode(), "value": f"v{i}".encode(), "partition": i % 2} for i in range(20)])  # fmt: skip
        spec = KafkaSourceSpec(topics=[topic], max_records_per_split=4)
        with ConsumerMetadata(kafka.config) as meta:
            plan = plan_offsets(meta, spec, start={topic: {"0": 2, "1": 0, "2": 0, "3": 0}})
        df = kafka_dataframe(session, kafka.config, plan, max_records_per_split=spec.max_records_per_split)
        rows = df.select("partition", "offset", "value").collect()
        expected = {(p, o) for p, o in produced if not (p == 0 and o < 2)}
        assert {(r["partition"], r["offset"]) for r in rows} == expected and len(rows) == len(expected) == 18
        assert len(split_ranges(plan, 4)) == 2 + 3
    finally:
        session.stop()
        kafka.stop()


ABORTABLE_JOB = """
import sys
from pathlib import Path

from pyspark.sql import SparkSession

spark = SparkSession.builder.getOrCreate()
running = Path(sys.argv[-1])
if "connect" in type(spark).__module__:  # a Connect session: touched once its tasks run

    def progress(stages=None, inflight_tasks=0, **_):
        if inflight_tasks:
            running.touch()

    spark.registerProgressHandler(progress)
else:
    running.touch()
spark.range(0, 10**13, 1, 2).selectExpr("sum(hash(id))").collect()  # runs until stopped
"""


@pytest.mark.spark
@pytest.mark.parametrize("runner", ["spark_connect", "spark-submit"])
def test_aborting_a_writing_checkpoint_cancels_its_running_job(
    runner, spark_connect_server, monkeypatch, sqlite_store, database_urls, tmp_path
):
    """``walsink abort`` of a checkpoint whose write job runs (from another process: here the
    test's thread) cancels the job within the watch interval: a Connect job's operations are
    interrupted (the server cancels its Spark job), a spark-submit job is killed. The write task
    fails without a retry (an abort must not be undone), the checkpoint stays ABORTED with the
    cancel in its history, and nothing is sealed."""
    import threading
    import time

    from airflow.sdk.exceptions import AirflowFailException

    from airflow_provider_walsink.core.commit.abort import CheckpointAborter
    from airflow_provider_walsink.core.staging.layout import StagingLayout
    from airflow_provider_walsink.core.store.records import Actor

    url = database_urls("sqlite")
    staging = tmp_path / "staging"
    use_committer(monkeypatch, url, staging)
    for key, value in spark_connect_server.connection_env(CONN_ID).items():
        monkeypatch.setenv(key, value)
    job, running = tmp_path / "abortable_job.py", tmp_path / "running"
    job.write_text(ABORTABLE_JOB)
    where = {"spark_conn_id": CONN_ID} if runner == "spark_connect" else {"master": "local[1]"}
    op = WalWriteOperator(task_id="write", application=str(job), pipeline="events", application_args=[str(running)],
                          checkpoint_key="20260401T000000Z", **where)  # fmt: skip
    start = datetime(2026, 4, 1, tzinfo=UTC)
    ti = SimpleNamespace(dag_id="abort_test", task_id="write", run_id="manual", try_number=1, map_index=-1,
                         id=None, xcom_push=lambda key, value: None)  # fmt: skip
    context: dict[str, Any] = {"ti": ti, "logical_date": start, "data_interval_start": start,
                               "data_interval_end": start + timedelta(days=1)}  # fmt: skip
    errors: list[BaseException] = []

    def execute() -> None:
        try:
            op.execute(context)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    thread = threading.Thread(target=execute)
    thread.start()
    deadline = time.monotonic() + 180
    while not running.exists() and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert thread.is_alive() and running.exists(), errors
    store = CommitterStore.from_url(url)
    assert store.require("events", "20260401T000000Z").state is S.WRITING
    session_id = getattr(op._runner, "session_id", None)
    CheckpointAborter(store, StagingLayout(str(staging)), None).abort(
        "events", "20260401T000000Z", reason="wrong input file", actor=Actor.local("on-call")
    )
    thread.join(60)  # the watch reads the row every 5 s
    assert not thread.is_alive()
    (error,) = errors
    assert isinstance(error, AirflowFailException)
    assert "write attempt 1 cancelled: the checkpoint was aborted" in str(error), error
    record = store.require("events", "20260401T000000Z")
    assert record.state is S.ABORTED and record.sealed_attempt is None
    assert any(
        "write attempt 1 cancelled" in (h.detail or "") for h in store.history("events", "20260401T000000Z")
    )
    assert not list(staging.rglob("_walsink_manifest*"))
    if runner == "spark_connect":  # seen on the server: the session's Spark job was cancelled
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any(
            "SPARK_JOB_CANCELLED" in line and f"Session_{session_id}" in line
            for line in spark_connect_server.log_path.read_text(errors="replace").splitlines()
        ):
            time.sleep(0.5)
        assert f"Session_{session_id}" in spark_connect_server.log_path.read_text(errors="replace")
    else:
        assert op._runner.hook._submit_sp.returncode not in (0, None)


ORPHANED_JOB = """
import sys
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from airflow_provider_walsink.core.spark import CheckpointJob, ProtocolArgs

spark = SparkSession.builder.getOrCreate()
protocol, (running, long_run) = ProtocolArgs.from_argv(sys.argv[1:])
if Path(long_run).exists():  # the first attempt: runs until stopped, its tasks running
    def progress(stages=None, inflight_tasks=0, **_):
        if inflight_tasks:
            Path(running).touch()

    spark.registerProgressHandler(progress)
    spark.range(0, 10**13, 1, 2).selectExpr("sum(hash(id))").collect()
with CheckpointJob(spark, protocol) as job:
    job.stage(spark.range(0, 100, 1, 2).withColumn("dt", F.lit("2026-04-01")), partition_by=["dt"])
"""

WORKER = """
import sys
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

from airflow_provider_walsink.operators.write import WalWriteOperator

job, running, long_run, conn_id = sys.argv[1:]
op = WalWriteOperator(task_id="write", application=job, pipeline="events", checkpoint_key="20260401T000000Z",
                      application_args=[running, long_run], spark_conn_id=conn_id)
start = datetime(2026, 4, 1, tzinfo=UTC)
ti = SimpleNamespace(dag_id="orphan_test", task_id="write", run_id="manual", try_number=1, map_index=-1,
                     id=None, xcom_push=lambda key, value: None)
op.execute({"ti": ti, "logical_date": start, "data_interval_start": start,
            "data_interval_end": start + timedelta(days=1)})
"""


@pytest.mark.spark
def test_a_retry_after_the_worker_died_stops_the_connect_job_it_left_running(
    spark_connect_server, monkeypatch, sqlite_store, database_urls, tmp_path
):
    """The write task's worker SIGKILLed mid-job: its Connect operation goes on running on the
    server (the job's session was recorded on the attempt). The retry's new attempt stops it
    (the server cancels the old session's Spark job, the history says so) before its own job
    runs, then seals attempt 2 with each row once. A Connect job cannot be reattached: its
    driver program, the job file, ran in the dead worker (docs/production.md)."""
    import os
    import signal
    import subprocess
    import time

    from airflow_provider_walsink.core.protocol.manifest import read_manifest

    url = database_urls("sqlite")
    staging = tmp_path / "staging"
    use_committer(monkeypatch, url, staging)
    for key, value in spark_connect_server.connection_env(CONN_ID).items():
        monkeypatch.setenv(key, value)
    job, worker = tmp_path / "orphaned_job.py", tmp_path / "worker.py"
    running, long_run = tmp_path / "running", tmp_path / "long_run"
    job.write_text(ORPHANED_JOB)
    worker.write_text(WORKER)
    long_run.touch()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    first = subprocess.Popen([sys.executable, str(worker), str(job), str(running), str(long_run), CONN_ID],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while not running.exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert running.exists() and first.poll() is None
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(30)
    store = CommitterStore.from_url(url)
    orphan = store.require("events", "20260401T000000Z")
    assert orphan.state is S.WRITING and orphan.attempt == 1
    session_id = orphan.write_job["session_id"]
    assert orphan.write_job == {"runner": "spark_connect", "conn_id": CONN_ID, "session_id": session_id}

    def cancelled_on_server() -> bool:
        return any(
            "SPARK_JOB_CANCELLED" in line and f"Session_{session_id}" in line
            for line in spark_connect_server.log_path.read_text(errors="replace").splitlines()
        )

    time.sleep(1)
    assert not cancelled_on_server()  # the dead worker's job still runs on the server

    long_run.unlink()  # the retry's job stages and seals at once
    retry = WalWriteOperator(task_id="write", application=str(job), pipeline="events", spark_conn_id=CONN_ID,
                             checkpoint_key="20260401T000000Z", application_args=[str(running), str(long_run)])  # fmt: skip
    start = datetime(2026, 4, 1, tzinfo=UTC)
    ti = SimpleNamespace(dag_id="orphan_test", task_id="write", run_id="manual", try_number=2, map_index=-1,
                         id=None, xcom_push=lambda key, value: None)  # fmt: skip
    retry.execute({"ti": ti, "logical_date": start, "data_interval_start": start,
                   "data_interval_end": start + timedelta(days=1)})  # fmt: skip
    record = store.require("events", "20260401T000000Z")
    assert record.state is S.SEALED and record.sealed_attempt == 2 and record.rows == 100
    assert record.write_job["session_id"] != session_id
    assert any(
        f"the job of write attempt 1 (fenced by attempt 2): interrupted 1 operation(s) of Spark Connect "
        f"session {session_id}" in (h.detail or "")
        for h in store.history("events", "20260401T000000Z")
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not cancelled_on_server():
        time.sleep(0.5)
    assert cancelled_on_server()
    manifest = read_manifest(Path(record.manifest_uri.removeprefix("file://")))
    assert manifest.attempt == 2 and manifest.total_rows == 100
