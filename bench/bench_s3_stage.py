"""The write phase staging to S3 against a plain pyarrow write of the same data to the same server (issue 23).

Both sides run in one local Spark session against one S3 API (moto's server on
a loopback port, started here), on the same generated DataFrame:

* baseline: each Spark task writes its rows as one Parquet file with pyarrow's
  S3 file system (``mapInArrow``), nothing else: the least a Spark job can do
  to put the data on the store without Hadoop's S3 connector;
* walsink: what the write task and its job do on an object-store root:
  register the checkpoint and start an attempt, ``CheckpointJob.stage`` with the
  executors' writer (per task: Parquet through pyarrow under a name unique to
  the task attempt, CRC32 over the bytes as written, the footer's schema, one
  row back per file), the manifest sealed by a conditional put, the seal
  recorded, and the durability check (one listing of the attempt, sizes
  compared; no download).

moto keeps objects in memory, so the figures say what walsink adds around the
same puts, not what S3 costs.

    .venv/bin/python -m bench.bench_s3_stage --rows 1000000,4000000 --repeats 5
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import uuid
from pathlib import Path

from .bench_write import _frame, _session
from .common import Table, fmt_s, machine, median, ratio, spread, stopwatch

PIPELINE = "bench_s3_stage"
BUCKET = "walsink-bench"
KEY, SECRET, REGION = "bench-key", "bench-secret", "us-east-1"


def _options(endpoint: str) -> dict[str, str]:
    return {"endpoint_url": endpoint, "access_key": KEY, "secret_key": SECRET, "region": REGION}


def plain_once(spark, rows: int, endpoint: str, run: str) -> float:
    """Each task writes its rows as one Parquet file to ``s3://BUCKET/plain/<run>/`` with pyarrow."""
    from pyspark.sql.types import LongType, StructField, StructType

    df = _frame(spark, rows)
    host = endpoint.split("://", 1)[1]

    def write(batches):
        import uuid as _uuid

        import pyarrow as pa
        import pyarrow.compute  # noqa: F401 - the writer needs it loaded in the worker
        import pyarrow.fs as pafs
        import pyarrow.parquet as pq

        fs = pafs.S3FileSystem(access_key=KEY, secret_key=SECRET, region=REGION, endpoint_override=host,
                               scheme="http")  # fmt: skip
        writer, written = None, 0
        path = f"{BUCKET}/plain/{run}/dt=2026-01-01/part-{_uuid.uuid4().hex}.parquet"
        stream = None
        for batch in batches:
            if writer is None:
                stream = fs.open_output_stream(path)
                writer = pq.ParquetWriter(stream, batch.schema)
            writer.write_batch(batch)
            written += batch.num_rows
        if writer is not None:
            writer.close()
            stream.close()
        yield pa.RecordBatch.from_pydict({"rows": [written]}, schema=pa.schema([("rows", pa.int64())]))

    schema = StructType([StructField("rows", LongType())])
    with stopwatch() as elapsed:
        got = sum(r["rows"] for r in df.mapInArrow(write, schema).collect())
    if got != rows:
        raise RuntimeError(f"bench: the plain write wrote {got} rows, expected {rows}")
    return elapsed()


def walsink_once(spark, rows: int, store, staging, key: str) -> float:
    from airflow_provider_walsink.core.protocol.manifest import MANIFEST_NAME
    from airflow_provider_walsink.core.spark import CheckpointJob, ProtocolArgs
    from airflow_provider_walsink.core.store import Actor
    from airflow_provider_walsink.triggers.durable import evaluate_durability

    actor = Actor(name="bench-s3-stage")
    df = _frame(spark, rows)
    with stopwatch() as elapsed:
        store.register(PIPELINE, key, mode="overwrite", actor=actor, staging_root=staging.root_uri)
        record = store.start_attempt(PIPELINE, key, actor=actor, staging_root=staging.root_uri)
        protocol = ProtocolArgs(
            pipeline=PIPELINE,
            checkpoint_key=key,
            sequence=record.sequence,
            attempt=record.attempt,
            attempt_id=record.attempt_id,
            staging_root=staging.root_uri,
        )
        with CheckpointJob(spark, protocol, storage_options=staging.options, writer="executors") as job:
            job.stage(df, partition_prefix={"dt": "2026-01-01"})
        manifest = staging.store.read_manifest(job.location, expected_digest=job.sealed_digest)
        store.seal_manifest(
            manifest, manifest_uri=f"{job.location.uri}/{MANIFEST_NAME}", manifest_digest=job.sealed_digest,
            actor=actor,
        )  # fmt: skip
        status = evaluate_durability(store, staging.store, PIPELINE, key, actor=actor)
        if not status.durable:
            raise RuntimeError(f"bench: checkpoint not durable: {status.message}")
    if manifest.total_rows != rows:
        raise RuntimeError(f"bench: staged {manifest.total_rows} rows, expected {rows}")
    return elapsed()


class _Staging:
    """The staging store and the options it was opened with (the job gets them as the operator passes them)."""

    def __init__(self, endpoint: str) -> None:
        from airflow_provider_walsink.core.staging.object_store import StagingStore

        self.options = _options(endpoint)
        self.root_uri = f"s3://{BUCKET}/staging"
        self.store = StagingStore.open(self.root_uri, self.options)


def run(sizes: tuple[int, ...], repeats: int, scratch: Path) -> Table:
    import boto3
    from moto.server import ThreadedMotoServer

    from airflow_provider_walsink.core.store import CommitterStore

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers need this venv's pyarrow
    logging.getLogger("airflow_provider_walsink").setLevel(logging.WARNING)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's server logs every request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=KEY, aws_secret_access_key=SECRET,
                 region_name=REGION).create_bucket(Bucket=BUCKET)  # fmt: skip
    spark = _session(None)
    store = CommitterStore.from_url(f"sqlite:///{scratch}/committer.db")
    staging = _Staging(endpoint)
    t = Table(
        "Write phase staging to S3 (moto): walsink's executors' writer + seal + durability check "
        "vs plain pyarrow writes from the executors",
        ["rows", "plain pyarrow (median)", "walsink (median)", "ratio", "plain range", "walsink range"],
    )
    try:
        plain_once(spark, 100_000, endpoint, "warmup")  # Python workers, JIT: not counted
        walsink_once(spark, 100_000, store, staging, "warmup")
        for rows in sizes:
            plain, ws = [], []
            for r in range(repeats):
                steps = ["plain", "walsink"] if r % 2 == 0 else ["walsink", "plain"]
                for step in steps:
                    if step == "plain":
                        plain.append(plain_once(spark, rows, endpoint, uuid.uuid4().hex[:8]))
                    else:
                        ws.append(walsink_once(spark, rows, store, staging, f"n{rows}_r{r}"))
            t.rows.append([f"{rows:,}", fmt_s(median(plain)), fmt_s(median(ws)),
                           ratio(median(ws), median(plain)), spread(plain), spread(ws)])  # fmt: skip
    finally:
        store.dispose()
        spark.stop()
        server.stop()
    t.notes.append(
        f"{repeats} repeats per size, alternating, one local[2] Spark session; moto's S3 server on "
        "loopback (objects in memory); committer table on SQLite; checksums CRC32."
    )
    return t


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default="1000000,4000000", help="comma-separated sizes")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    sizes = tuple(int(x) for x in args.rows.split(","))
    with tempfile.TemporaryDirectory(prefix="walsink-bench-s3-") as tmp:
        print(machine(tmp).render())
        print(run(sizes, args.repeats, Path(tmp)).render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
