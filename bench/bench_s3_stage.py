"""The write phase staging to an object store against a plain pyarrow write of the same data to
the same emulator (issue 23: S3; issue 48: GCS and ADLS).

For each store asked for (``--stores``: moto's S3 API server, fake-gcs-server, Azurite, each
started here on a loopback port and stopped), both sides run in one local Spark session, on the
same generated DataFrame, through the same pyarrow file system (the staging store's, shipped to
the executors inside their tasks):

* baseline: each Spark task writes its rows as one Parquet file with that file system
  (``mapInArrow``), in row groups of the executors' writer's size (``ROW_GROUP_ROWS``), nothing
  else: the least a Spark job can do to put the data on the store without Hadoop's connector for
  it. (One row group per 10,000-row batch, as this baseline wrote before issue 48, made it 2.7x
  slower than walsink at 4M rows on fake-gcs-server, whose resumable uploads copy the object
  so far for every chunk: the write pattern, not the store, was being measured);
* walsink: what the write task and its job do on an object-store root:
  register the checkpoint and start an attempt, ``CheckpointJob.stage`` with the
  executors' writer (per task: Parquet through pyarrow under a name unique to
  the task attempt, CRC32 over the bytes as written, the footer's schema, one
  row back per file), the manifest sealed by the service's conditional create (S3: a put with
  ``If-None-Match: *``; GCS: ``ifGenerationMatch=0``; ADLS: a Put Blob with ``If-None-Match: *``),
  the seal recorded, and the durability check (one listing of the attempt, sizes compared; no
  download).

The emulators keep objects in memory (fake-gcs-server and Azurite as separate processes, moto
in this one), so the figures say what walsink adds around the same writes, not what a cloud
store costs; the three stores' absolute times compare emulators, not clouds.

    .venv/bin/python -m bench.bench_s3_stage --rows 1000000,4000000 --repeats 3 --stores s3,gs,abfss
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from .bench_write import _frame, _session
from .common import Table, fmt_s, machine, median, ratio, spread, stopwatch

PIPELINE = "bench_s3_stage"
STORES = ("s3", "gs", "abfss")
NAMES = {"s3": "S3 (moto)", "gs": "GCS (fake-gcs-server)", "abfss": "ADLS (Azurite)"}


def plain_once(spark, rows: int, fs: Any, base: str) -> float:
    """Each task writes its rows as one Parquet file under ``base`` with the file system ``fs``,
    a row group per :data:`ROW_GROUP_ROWS` rows (as the executors' writer groups them)."""
    from pyspark.sql.types import LongType, StructField, StructType

    from airflow_provider_walsink.core.spark.executor_write import ROW_GROUP_ROWS

    df = _frame(spark, rows)

    def write(batches):
        import uuid as _uuid

        import pyarrow as pa
        import pyarrow.compute  # noqa: F401 - the writer needs it loaded in the worker
        import pyarrow.parquet as pq

        writer, written, held = None, 0, []
        path = f"{base}/dt=2026-01-01/part-{_uuid.uuid4().hex}.parquet"
        stream = None
        for batch in batches:
            if writer is None:
                stream = fs.open_output_stream(path)
                writer = pq.ParquetWriter(stream, batch.schema)
            held.append(batch)
            written += batch.num_rows
            if sum(b.num_rows for b in held) >= ROW_GROUP_ROWS:
                writer.write_table(pa.Table.from_batches(held), row_group_size=ROW_GROUP_ROWS)
                held = []
        if writer is not None:
            if held:
                writer.write_table(pa.Table.from_batches(held), row_group_size=ROW_GROUP_ROWS)
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

    def __init__(self, where: Any) -> None:
        from airflow_provider_walsink.core.staging.object_store import StagingStore

        self.options = where.options()
        self.root_uri = where.root("staging")
        self.store = StagingStore.open(self.root_uri, self.options)
        self.plain = where.root("plain")  # the baseline's prefix, beside the staging root
        self.plain_base = StagingStore.open(self.plain, self.options).base
        self._where = where

    def empty(self) -> None:
        """Delete what both sides wrote (through the store's own API)."""
        for prefix in ("staging", "plain"):
            self._where.delete(prefix)


def _one_store(spark, store, staging: _Staging, scheme: str, sizes: tuple[int, ...], repeats: int,
               t: Table) -> None:  # fmt: skip
    fs = staging.store.filesystem
    plain_once(spark, 100_000, fs, f"{staging.plain_base}/warmup")  # Python workers, JIT: not counted
    walsink_once(spark, 100_000, store, staging, f"warmup_{scheme}")
    for rows in sizes:
        plain, ws = [], []
        for r in range(repeats):
            steps = ["plain", "walsink"] if r % 2 == 0 else ["walsink", "plain"]
            for step in steps:
                if step == "plain":
                    plain.append(plain_once(spark, rows, fs, f"{staging.plain_base}/{uuid.uuid4().hex[:8]}"))
                else:
                    ws.append(walsink_once(spark, rows, store, staging, f"{scheme}_n{rows}_r{r}"))
                staging.empty()  # untimed: the emulators keep every object in memory
        t.rows.append([NAMES[scheme], f"{rows:,}", fmt_s(median(plain)), fmt_s(median(ws)),
                       ratio(median(ws), median(plain)), spread(plain), spread(ws)])  # fmt: skip


def run(sizes: tuple[int, ...], repeats: int, scratch: Path, stores: tuple[str, ...] = STORES) -> Table:
    from airflow_provider_walsink.core.store import CommitterStore
    from tests.model.stores import serve

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers need this venv's pyarrow
    logging.getLogger("airflow_provider_walsink").setLevel(logging.WARNING)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's server logs every request
    logging.getLogger("azure").setLevel(logging.WARNING)  # the Azure client logs every request
    logging.getLogger("py4j").setLevel(logging.WARNING)  # a closed callback connection, at INFO
    spark = _session(None)
    store = CommitterStore.from_url(f"sqlite:///{scratch}/committer.db")
    t = Table(
        "Write phase staging to an object store's emulator: walsink's executors' writer + seal + "
        "durability check vs plain pyarrow writes from the executors through the same file system",
        [
            "store",
            "rows",
            "plain pyarrow (median)",
            "walsink (median)",
            "ratio",
            "plain range",
            "walsink range",
        ],
    )
    try:
        for scheme in stores:  # one emulator at a time: each is stopped before the next starts
            with serve(scheme, memory_mib=2048) as where:
                _one_store(spark, store, _Staging(where), scheme, sizes, repeats, t)
    finally:
        store.dispose()
        spark.stop()
    t.notes.append(
        f"{repeats} repeats per size, alternating, one local[2] Spark session; each emulator on "
        "loopback (objects in memory); committer table on SQLite; checksums CRC32."
    )
    return t


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default="1000000,4000000", help="comma-separated sizes")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--stores", default=",".join(STORES), help=f"comma-separated, of {', '.join(STORES)}")
    args = p.parse_args(argv)
    sizes = tuple(int(x) for x in args.rows.split(","))
    stores = tuple(x.strip() for x in args.stores.split(",") if x.strip())
    if not stores or set(stores) - set(STORES):
        p.error(f"--stores: of {', '.join(STORES)}, not {args.stores!r}")
    with tempfile.TemporaryDirectory(prefix="walsink-bench-s3-") as tmp:
        print(machine(tmp).render())
        print(run(sizes, args.repeats, Path(tmp), stores).render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
