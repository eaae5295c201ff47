"""The job-side API (``airflow_provider_walsink.core.spark``) on a real local Spark session.

These run the job API in-process on the session ``spark`` fixture (no
spark-submit): staging, committable description without re-reading, manifest
sealing. The operator's spark-submit path is in ``test_write_operator.py``.
"""

from __future__ import annotations

import os

import pyarrow.parquet as pq
import pytest

from airflow_provider_walsink.core.protocol.checksum import file_checksum
from airflow_provider_walsink.core.protocol.file_schema import arrow_schema, file_schema_of
from airflow_provider_walsink.core.protocol.manifest import digest_of, read_manifest
from airflow_provider_walsink.core.spark import (
    CheckpointJob,
    ProtocolArgs,
    ProtocolArgumentError,
    StagingError,
)

pytestmark = pytest.mark.spark


def _protocol(tmp_path, **overrides) -> ProtocolArgs:
    values = dict(
        pipeline="events",
        checkpoint_key="20260101T000000Z",
        sequence=3,
        attempt=2,
        staging_root=str(tmp_path / "staging"),
        partition_by=("dt",),
        start_offsets={"incoming": "a.jsonl"},
    )
    values.update(overrides)
    return ProtocolArgs(**values)


def _events(spark, days: dict[str, int]):
    rows = [(f"{day}-{i}", day, i) for day, n in days.items() for i in range(n)]
    return spark.createDataFrame(rows, "id string, dt string, n int")


def test_protocol_args_round_trip_through_argv():
    protocol = ProtocolArgs(
        pipeline="p",
        checkpoint_key="k1",
        sequence=1,
        attempt=1,
        staging_root="/s",
        partition_by=("dt", "country"),
        start_offsets={"topic": {"0": 42}},
        checksum="sha256",
    )
    parsed, rest = ProtocolArgs.from_argv(["--raw", "/r", *protocol.to_argv(), "--day", "x"])
    assert parsed == protocol
    assert rest == ["--raw", "/r", "--day", "x"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "no --walsink-protocol argument"),
        (["--walsink-protocol"], "needs a value"),
        (["--walsink-protocol", "{"], "not valid JSON"),
        (["--walsink-protocol", '{"pipeline": "p"}'], "incomplete"),
        (
            [
                "--walsink-protocol",
                '{"pipeline": "../x", "checkpoint_key": "k", "sequence": 1, "attempt": 1, "staging_root": "/s"}',
            ],
            "invalid pipeline id",
        ),
        (
            [
                "--walsink-protocol",
                '{"pipeline": "p", "checkpoint_key": "k", "sequence": 1, "attempt": 1, "staging_root": "/s", '
                '"file_format": "delta"}',
            ],
            "file format 'delta'",
        ),
    ],
)
def test_protocol_args_errors_name_the_problem(argv, message):
    with pytest.raises(ProtocolArgumentError, match=message):
        ProtocolArgs.from_argv(argv)


def test_stage_describes_files_without_spark_bookkeeping_and_seals(spark, tmp_path):
    protocol = _protocol(tmp_path)
    with CheckpointJob(spark, protocol) as job:
        staged = job.stage(_events(spark, {"2026-01-01": 120, "2026-01-02": 80}).repartition(3))
        job.end_offsets = {"incoming": "b.jsonl"}
    attempt_dir = job.attempt_dir
    assert attempt_dir == tmp_path / "staging/events/20260101T000000Z/attempt-2"

    # Spark wrote its bookkeeping, but it is no committable.
    everything = [
        os.path.relpath(os.path.join(d, f), attempt_dir) for d, _, fs in os.walk(attempt_dir) for f in fs
    ]
    assert any(name.endswith(".crc") for name in everything)
    paths = {c.path for c in staged.committables}
    assert all(not os.path.basename(p).startswith(("_", ".")) for p in paths)
    data_files = {p for p in everything if p.endswith(".parquet") and not os.path.basename(p).startswith(".")}
    assert paths == data_files

    manifest = read_manifest(attempt_dir / "_manifest.json", expected_digest=job.sealed_digest)
    assert (manifest.pipeline, manifest.checkpoint_key, manifest.sequence, manifest.attempt) == (
        "events",
        "20260101T000000Z",
        3,
        2,
    )
    assert manifest.start_offsets == {"incoming": "a.jsonl"}
    assert manifest.end_offsets == {"incoming": "b.jsonl"}
    assert manifest.job.startswith("spark:local-")
    assert {c.partition_path for c in manifest.committables} == {"dt=2026-01-01", "dt=2026-01-02"}
    # Rows: Spark's observed total equals the footers' sum, and each footer is right.
    assert staged.observed_rows == manifest.total_rows == 200
    for c in manifest.committables:
        path = attempt_dir / c.path
        assert c.size == path.stat().st_size
        assert c.rows == pq.read_metadata(path).num_rows
        assert c.checksum == file_checksum(path, "crc32")
        assert c.writer and c.writer.startswith(manifest.job.removeprefix("spark:") + "/task-")
        # The one schema sealed in the manifest is every file's own.
        assert file_schema_of(pq.read_metadata(path)) == manifest.file_schema
    assert manifest.file_schema is not None
    assert [f.name for f in arrow_schema(manifest.file_schema)] == ["id", "n"]
    assert digest_of((attempt_dir / "_manifest.json").read_bytes()) == job.sealed_digest


def test_files_with_different_schemas_record_no_file_schema(spark, tmp_path):
    protocol = _protocol(tmp_path)
    with CheckpointJob(spark, protocol) as job:
        job.stage(_events(spark, {"2026-01-01": 3}).coalesce(1))
        assert job.file_schema() is not None
        from pyspark.sql import functions as F

        job.stage(_events(spark, {"2026-01-02": 3}).withColumn("extra", F.lit(1)).coalesce(1))
    manifest = read_manifest(job.attempt_dir / "_manifest.json")
    assert len(manifest.committables) == 2 and manifest.file_schema is None


def test_several_dataframes_share_one_attempt_under_prefixes(spark, tmp_path):
    protocol = _protocol(tmp_path, file_format="csv", partition_by=(), checksum="sha256")
    with CheckpointJob(spark, protocol) as job:
        web = job.stage(_events(spark, {"2026-01-01": 7}).coalesce(1), partition_prefix={"source": "web"})
        app = job.stage(_events(spark, {"2026-01-01": 5}).coalesce(1), partition_prefix={"source": "app"})
        job.declare_partition("source=empty")
    manifest = job.manifest()
    assert manifest.file_format == "csv"
    # One CSV file per write: the observed count is that file's row count.
    assert [c.rows for c in web.committables] == [7]
    assert [c.rows for c in app.committables] == [5]
    assert sorted(c.partition_path for c in manifest.committables) == ["source=app", "source=web"]
    assert manifest.replaced_partitions()[0] == "source=empty"
    assert all(c.checksum.startswith("sha256:") for c in manifest.committables)
    with pytest.raises(StagingError, match="one manifest has one format"):
        job2 = CheckpointJob(spark, _protocol(tmp_path, attempt=3))
        job2.stage(_events(spark, {"2026-01-01": 1}), file_format="json")
        job2.stage(_events(spark, {"2026-01-01": 1}), file_format="parquet")


def test_an_exception_in_the_job_leaves_no_manifest(spark, tmp_path):
    protocol = _protocol(tmp_path)
    with pytest.raises(RuntimeError, match="boom"):
        with CheckpointJob(spark, protocol) as job:
            job.stage(_events(spark, {"2026-01-01": 10}))
            raise RuntimeError("boom")
    assert any(job.attempt_dir.rglob("*.parquet"))  # data was staged...
    assert not (job.attempt_dir / "_manifest.json").exists()  # ...but the attempt is never sealed


def test_an_attempt_directory_must_start_empty(spark, tmp_path):
    protocol = _protocol(tmp_path)
    attempt_dir = tmp_path / "staging/events/20260101T000000Z/attempt-2/dt=2026-01-01"
    attempt_dir.mkdir(parents=True)
    (attempt_dir / "part-00000-stale.parquet").write_bytes(b"x")
    with pytest.raises(StagingError, match="already holds 1 file"):
        CheckpointJob(spark, protocol)


def test_empty_interval_stages_nothing_but_declares_its_partition(spark, tmp_path):
    with CheckpointJob(spark, _protocol(tmp_path)) as job:
        staged = job.stage(_events(spark, {}), replace_partitions=["dt=2026-01-01"])
    assert staged.observed_rows == 0 and staged.files == 0
    manifest = read_manifest(job.attempt_dir / "_manifest.json")
    assert manifest.committables == () and manifest.partitions == ("dt=2026-01-01",)
