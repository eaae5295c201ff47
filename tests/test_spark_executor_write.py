"""Executors write committables (``core/spark/executor_write.py``) on a real Spark session.

To a local root and to ``s3://`` on moto's S3 server (and ``gs://``, ``abfss://``: fake-gcs-server,
Azurite, where the claim depends on the store): the files each task wrote
and reported are the manifest's committables (sizes, rows, checksums, footer
schema), the data reads back, the seal is written once on the store, and the
durability check by listing finds a missing or resized object. A task attempt
killed after writing its file (a lost executor) is retried and its file never
reaches the manifest.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
import subprocess
import sys
import textwrap
import uuid

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from airflow_provider_walsink.core.protocol.checksum import Hasher
from airflow_provider_walsink.core.protocol.file_schema import arrow_schema, file_schema_of
from airflow_provider_walsink.core.protocol.manifest import Committable, digest_of
from airflow_provider_walsink.core.spark import CheckpointJob, ProtocolArgs, StagingError
from airflow_provider_walsink.core.staging.durability import check_stored_attempt
from airflow_provider_walsink.core.staging.object_store import AlreadySealedError, StagingStore
from tests.table_fixtures import ACCESS_KEY, REGION, SECRET_KEY, s3_server  # noqa: F401

pytestmark = pytest.mark.spark

ATTEMPT_ID = "a" * 32
PART_NAME = r"part-\d{5}-\d+-[0-9a-f]{32}\.parquet"


def _options(server) -> dict[str, str]:
    return {
        "endpoint_url": server.endpoint,
        "access_key": ACCESS_KEY,
        "secret_key": SECRET_KEY,
        "region": REGION,
    }


@pytest.fixture(params=["s3", "gs"])
def object_server(request):
    """(root maker, server, storage options) of the session's S3 (moto) or GCS (fake-gcs-server), or
    Azure (Azurite: only where a test asks for it, its claim depending on the store)."""
    if request.param == "abfss":
        server = request.getfixturevalue("azurite_server")
        return server.root, server, server.options
    if request.param == "gs":
        server = request.getfixturevalue("gcs_server")
        options = server.options
    else:
        server = request.getfixturevalue("s3_server")
        options = _options(server)
    return (lambda prefix: f"{request.param}://{server.bucket}/{prefix}"), server, options


def _protocol(root: str, **overrides) -> ProtocolArgs:
    values = dict(
        pipeline="events",
        checkpoint_key="20260101T000000Z",
        sequence=1,
        attempt=1,
        attempt_id=ATTEMPT_ID,
        staging_root=root,
        partition_by=("dt",),
    )
    values.update(overrides)
    return ProtocolArgs(**values)


def _events(spark, days: dict[str, int]):
    rows = [(f"{day}-{i}", day, i) for day, n in days.items() for i in range(n)]
    return spark.createDataFrame(rows, "id string, dt string, n int")


def _read_back(store: StagingStore, location, relative: str) -> tuple[bytes, pq.FileMetaData]:
    path = store.committable(location, relative)
    with store.filesystem.open_input_file(path) as f:
        data = f.read()
    return data, pq.read_metadata(pa.BufferReader(data))


def _checksum(data: bytes, algorithm: str) -> str:
    hasher = Hasher(algorithm)
    hasher.update(data)
    return hasher.value()


def _assert_manifest_describes_the_files(job: CheckpointJob, days: dict[str, int], algorithm: str) -> None:
    store, location = job.store, job.location
    manifest = store.read_manifest(location, expected_digest=job.sealed_digest)
    # Exactly the data files in the attempt are the committables (nothing else was written).
    assert set(store.list_attempt(location, visible_only=True)) == {c.path for c in manifest.committables}
    assert {c.partition_path for c in manifest.committables} == {f"dt={d}" for d in days}
    assert manifest.total_rows == sum(days.values())
    for c in manifest.committables:
        assert re.fullmatch(PART_NAME, c.path.rsplit("/", 1)[1]), c.path
        data, meta = _read_back(store, location, c.path)
        assert c.size == len(data)
        assert c.rows == meta.num_rows
        assert c.checksum == _checksum(data, algorithm)
        assert file_schema_of(meta) == manifest.file_schema
        assert c.writer.startswith(job.spark.sparkContext.applicationId + "/task-")
    # The partition column is in the directory names, not in the files, as Spark's partitionBy writes.
    assert [f.name for f in arrow_schema(manifest.file_schema)] == ["id", "n"]
    # Read back through the store, the rows are the DataFrame's.
    dataset = ds.dataset(
        [store.committable(location, c.path) for c in manifest.committables],
        filesystem=store.filesystem,
        format="parquet",
        partitioning=ds.partitioning(pa.schema([("dt", pa.string())]), flavor="hive"),
        partition_base_dir=location.path,
    )
    table = dataset.to_table()
    got = sorted(zip(table["id"].to_pylist(), table["dt"].to_pylist(), table["n"].to_pylist(), strict=True))
    want = sorted((f"{d}-{i}", d, i) for d, n in days.items() for i in range(n))
    assert got == want


def test_executors_write_to_a_local_root_and_the_manifest_is_their_report(spark, tmp_path):
    days = {"2026-01-01": 120, "2026-01-02": 80}
    with CheckpointJob(spark, _protocol(str(tmp_path / "staging")), writer="executors") as job:
        staged = job.stage(_events(spark, days).repartition(3))
    assert staged.observed_rows == 200
    assert job.attempt_dir == tmp_path / f"staging/events/20260101T000000Z/attempt-1-{ATTEMPT_ID}"
    _assert_manifest_describes_the_files(job, days, "crc32")
    assert check_stored_attempt(job.store, job.manifest(), job.location, verify_checksums=True).durable


@pytest.mark.parametrize("zone", ["Etc/UTC", "Europe/Paris"])
def test_executors_stage_timestamps_as_utc_whatever_the_session_time_zone(spark, tmp_path, zone):
    """Spark labels the instants it hands the executors with the session's time zone; the staged
    files label them UTC (what Delta and Iceberg take: delta-rs refuses ``Etc/UTC``), same values.
    (The Connect cluster run met this: its server's session zone was ``Etc/UTC``.)"""
    from datetime import UTC, datetime

    from deltalake import write_deltalake

    before = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", zone)
    try:
        frame = spark.createDataFrame(
            [("a", "2026-01-01 10:00:00"), ("b", "2026-01-01 23:30:00")], "id string, t string"
        )
        frame = frame.selectExpr("id", "to_utc_timestamp(to_timestamp(t), 'UTC') AS ts")
        with CheckpointJob(
            spark, _protocol(str(tmp_path / "staging"), partition_by=()), writer="executors"
        ) as job:
            job.stage(frame.coalesce(1))
        manifest = job.manifest()
        (committable,) = manifest.committables
        table = pq.read_table(job.store.committable(job.location, committable.path))
    finally:
        spark.conf.set("spark.sql.session.timeZone", before)
    assert table.schema.field("ts").type == pa.timestamp("us", tz="UTC")
    instants = sorted(v.astimezone(UTC) for v in table["ts"].to_pylist())
    # to_timestamp read the strings in the session's zone: the instants are those wall times there.
    from zoneinfo import ZoneInfo

    want = [datetime(2026, 1, 1, h, m, tzinfo=ZoneInfo(zone)).astimezone(UTC) for h, m in ((10, 0), (23, 30))]
    assert instants == want
    write_deltalake(str(tmp_path / "delta"), table)  # a Delta table takes the file's schema


def test_a_real_spark_job_stages_to_an_object_store_and_seals_there_once(spark, object_server):
    root_at, server, options = object_server
    root = root_at(f"{uuid.uuid4().hex[:12]}/staging")
    days = {"2026-01-01": 300, "2026-01-02": 150, "2026-01-03": 1}
    protocol = _protocol(root, checksum="sha256")
    with CheckpointJob(spark, protocol, storage_options=options) as job:
        assert job.writer == "executors"  # the default on an object store
        job.stage(_events(spark, days).repartition(4), options={"compression": "zstd"})
    assert job.attempt_dir == f"{root}/events/20260101T000000Z/attempt-1-{ATTEMPT_ID}"
    store, location = job.store, job.location
    # The seal is on the server, under the attempt's key.
    assert f"{location.path.split('/', 1)[1]}/_manifest.json" in server.list(location.path.split("/", 1)[1])
    _assert_manifest_describes_the_files(job, days, "sha256")
    _data, meta = _read_back(store, location, job.committables[0].path)
    assert meta.row_group(0).column(0).compression == "ZSTD"

    # Sealed once: the same manifest again is a no-op, another one is refused, the first stays.
    manifest = store.read_manifest(location)
    assert store.seal(location, manifest) == job.sealed_digest
    with pytest.raises(AlreadySealedError, match="already sealed with another manifest"):
        store.seal(location, dataclasses.replace(manifest, committables=manifest.committables[1:]))
    assert digest_of(manifest.to_bytes()) == job.sealed_digest == store.seal(location, manifest)

    # Durability by listing: durable now; an object lost or rewritten with another size is found.
    assert check_stored_attempt(store, manifest, location, verify_checksums=True).durable
    lost, resized = manifest.committables[0].path, manifest.committables[1].path
    store.filesystem.delete_file(store.committable(location, lost))
    with store.filesystem.open_output_stream(store.committable(location, resized)) as f:
        f.write(b"truncated")
    report = check_stored_attempt(store, manifest, location)
    assert report.missing == [lost]
    assert report.wrong_size == [f"{resized} (9 bytes, manifest says {manifest.committables[1].size})"]

    # A manifest naming a path outside the attempt is refused, not looked up.
    hostile = copy.copy(manifest)
    object.__setattr__(hostile, "committables", (Committable("../attempt-2/x.parquet", 1, 1),))
    assert "contains '..'" in check_stored_attempt(store, hostile, location).escaping[0]


def test_an_object_store_attempt_refuses_what_it_cannot_stage_and_must_start_empty(spark, s3_server):  # noqa: F811
    root = f"s3://{s3_server.bucket}/{uuid.uuid4().hex[:12]}"
    protocol = _protocol(root)
    store = StagingStore.open(root, _options(s3_server))
    location = store.attempt("events", "20260101T000000Z", 1, ATTEMPT_ID)
    with pytest.raises(StagingError, match="object store: Spark's own writer cannot stage there"):
        CheckpointJob(spark, protocol, storage_options=_options(s3_server), writer="spark")
    job = CheckpointJob(spark, protocol, storage_options=_options(s3_server))
    with pytest.raises(StagingError, match="stages parquet only, not 'json'"):
        job.stage(_events(spark, {"2026-01-01": 1}), file_format="json")
    with pytest.raises(StagingError, match=r"writer options \['maxRecordsPerFile'\] are not understood"):
        job.stage(_events(spark, {"2026-01-01": 1}), options={"maxRecordsPerFile": 1})
    with pytest.raises(StagingError, match=r"partition columns \['day'\] are not columns"):
        job.stage(_events(spark, {"2026-01-01": 1}), partition_by=["day"])
    # An empty interval: no file, no committable, the partition declared for an overwrite.
    staged = job.stage(_events(spark, {}), replace_partitions=["dt=2026-01-01"])
    assert staged.files == 0 and staged.observed_rows == 0
    job.seal()
    sealed = store.read_manifest(location, expected_digest=job.sealed_digest)
    assert sealed.committables == () and sealed.partitions == ("dt=2026-01-01",)
    assert store.list_attempt(location) == {"_manifest.json": len(sealed.to_bytes())}
    location = store.attempt("events", "20260101T000000Z", 2, ATTEMPT_ID.replace("a", "c"))
    protocol = _protocol(root, attempt=2, attempt_id=ATTEMPT_ID.replace("a", "c"))
    with store.filesystem.open_output_stream(f"{location.path}/dt=2026-01-01/stale.parquet") as f:
        f.write(b"x")
    with pytest.raises(StagingError, match="already holds 1 file"):
        CheckpointJob(spark, protocol, storage_options=_options(s3_server))


_LOST_EXECUTOR_JOB = textwrap.dedent(
    """
    import json, sys
    from pyspark.sql import SparkSession
    from airflow_provider_walsink.core.spark import CheckpointJob, ProtocolArgs

    root, options = sys.argv[1], json.loads(sys.argv[2])
    spark = (
        SparkSession.builder.master("local[2,2]")  # two tries per task: the killed one is retried
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    protocol = ProtocolArgs(
        pipeline="events", checkpoint_key="k1", sequence=1, attempt=1, attempt_id="b" * 32,
        staging_root=root, partition_by=("dt",),
    )
    rows = [(f"r{i}", "2026-01-0%d" % (1 + i % 2), i) for i in range(50)]
    with CheckpointJob(spark, protocol, storage_options=options) as job:
        job.stage(spark.createDataFrame(rows, "id string, dt string, n int").coalesce(1))
    print("SEALED", job.sealed_digest, flush=True)
    spark.stop()
    """
)


@pytest.mark.parametrize("object_server", ["s3", "gs", "abfss"], indirect=True)
def test_a_killed_task_attempts_file_never_reaches_the_manifest(object_server, tmp_path):
    root_at, server, options = object_server
    root = root_at(uuid.uuid4().hex[:12])
    script = tmp_path / "job.py"
    script.write_text(_LOST_EXECUTOR_JOB)
    crash_log = tmp_path / "crashes"
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        # The first attempt of the task is SIGKILLed after its first file is complete.
        "WALSINK_CRASH_AT": "executor.after_file",
        "WALSINK_CRASH_LOG": str(crash_log),
    }
    done = subprocess.run(
        [sys.executable, str(script), root, json.dumps(options)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert crash_log.read_text().splitlines() == ["executor.after_file:1"]  # it did die, once

    store = StagingStore.open(root, options)
    location = store.attempt("events", "k1", 1, "b" * 32)
    manifest = store.read_manifest(location)
    staged = store.list_attempt(location, visible_only=True)
    listed = {c.path for c in manifest.committables}
    # The dead attempt's complete file is in the store, beside the retry's two...
    assert len(staged) == 3 and listed < set(staged)
    (stray,) = set(staged) - listed
    # ...but the manifest lists only the retry's, and they hold every row once.
    attempts = {p.rsplit("/", 1)[1].split("-")[2] for p in listed}
    assert len(attempts) == 1 and stray.rsplit("/", 1)[1].split("-")[2] not in attempts
    assert manifest.total_rows == 50 and len(listed) == 2
    assert check_stored_attempt(store, manifest, location, verify_checksums=True).durable


def test_dictionary_encoding_only_where_at_most_half_the_values_are_distinct():
    from airflow_provider_walsink.core.spark.executor_write import _dictionary_columns

    sample = pa.table(
        {
            "id": list(range(1000)),  # unique: a dictionary would be kept and not pay
            "item": [f"item-{i % 400}" for i in range(1000)],
            "half": [i % 500 for i in range(1000)],
            "more": [i % 501 for i in range(1000)],
            "tags": [[i % 3] for i in range(1000)],  # nested, few distinct lists
        }
    )
    assert _dictionary_columns(sample) == ["item", "half", "tags"]


def test_the_durability_gate_checks_a_checkpoint_staged_on_s3(spark, s3_server, sqlite_store):  # noqa: F811
    from airflow_provider_walsink.core.protocol.states import CheckpointState
    from airflow_provider_walsink.triggers.durable import evaluate_durability
    from tests.helpers import ACTOR

    root = f"s3://{s3_server.bucket}/{uuid.uuid4().hex[:12]}"
    staging = StagingStore.open(root, _options(s3_server))
    for key in ("k-kept", "k-lost"):
        sqlite_store.register("events", key, mode="overwrite", actor=ACTOR)
        record = sqlite_store.start_attempt("events", key, actor=ACTOR)
        protocol = _protocol(
            root,
            checkpoint_key=key,
            sequence=record.sequence,
            attempt=record.attempt,
            attempt_id=record.attempt_id,
        )
        with CheckpointJob(spark, protocol, storage_options=_options(s3_server)) as job:
            job.stage(_events(spark, {"2026-01-01": 20, "2026-01-02": 10}))
        manifest = staging.read_manifest(job.location)
        sqlite_store.seal_manifest(
            manifest, manifest_uri=f"{job.location.uri}/_manifest.json", manifest_digest=job.sealed_digest,
            actor=ACTOR,
        )  # fmt: skip
    lost = manifest.committables[0].path
    staging.filesystem.delete_file(staging.committable(job.location, lost))

    kept = evaluate_durability(sqlite_store, staging, "events", "k-kept", actor=ACTOR, verify_checksums=True)
    assert kept.durable, kept.message
    assert sqlite_store.require("events", "k-kept").state is CheckpointState.DURABLE
    missing = evaluate_durability(sqlite_store, staging, "events", "k-lost", actor=ACTOR)
    assert not missing.durable and f"1 missing: {lost}" in missing.message
    assert sqlite_store.require("events", "k-lost").state is CheckpointState.SEALED
