"""Benchmark 1: write phase + durability check + commit vs plain ``df.write.parquet``.

Both sides write the same generated DataFrame, in the same Spark session, as
one ``dt=2026-01-01`` partition that replaces the previous run's:

* baseline: ``df.write.mode("overwrite").parquet(<plain>/dt=2026-01-01)``;
* walsink: everything a DAG run does around its Spark job, in-process:
  register the checkpoint and start an attempt (the write operator),
  ``CheckpointJob.stage`` + seal (the job side: Spark write into the attempt,
  file listing, Parquet footers, CRC32 checksums, manifest), record the seal
  (the operator), ``evaluate_durability`` (the sensor: manifest digest, totals,
  one stat per file, mark DURABLE) and ``CheckpointCommitter.commit`` (the
  commit task: lease, partition swap, COMMITTED, staging cleanup).

Orchestration (spark-submit, Airflow task start-up) is benchmark 4.
"""

from __future__ import annotations

import logging
import os
from collections import defaultdict
from pathlib import Path

from .common import Table, fmt_s, median, ratio, spread, stopwatch

PARTITION = "dt=2026-01-01"
PIPELINE = "bench_write"


def _session(event_log_dir: str | None):
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master("local[2]")
        .appName("walsink-bench-write")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "3g")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "4")
    )
    if event_log_dir:
        os.makedirs(event_log_dir, exist_ok=True)
        builder = builder.config("spark.eventLog.enabled", "true").config("spark.eventLog.dir", event_log_dir)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _frame(spark, rows: int):
    """The DataFrame both sides write: generated, not cached, so each write computes it anew."""
    from pyspark.sql import functions as F

    slices = max(2, rows // 2_500_000)
    return spark.range(0, rows, 1, slices).select(
        F.col("id"),
        (F.col("id") % 100_000).alias("user_id"),
        F.concat(F.lit("item-"), (F.col("id") % 9_973).cast("string")).alias("item"),
        (F.col("id") * 0.25).alias("amount"),
        (F.col("id") % 97).cast("int").alias("category"),
    )


def plain_once(spark, rows: int, target: Path) -> float:
    df = _frame(spark, rows)
    with stopwatch() as elapsed:
        df.write.mode("overwrite").parquet(str(target / PARTITION))
    return elapsed()


def _timed(obj: object, method: str) -> list[float]:
    """Wrap ``obj.method`` so the seconds spent in it accumulate in the returned one-item list."""
    spent = [0.0]
    real = getattr(obj, method)

    def timed(*args, **kwargs):
        with stopwatch() as elapsed:
            try:
                return real(*args, **kwargs)
            finally:
                spent[0] += elapsed()

    setattr(obj, method, timed)
    return spent


def walsink_once(
    spark, rows: int, store, layout, target: Path, key: str, phases: dict, writer: str | None = None
) -> float:
    from airflow_provider_walsink.core.commit import CheckpointCommitter
    from airflow_provider_walsink.core.protocol.manifest import read_manifest
    from airflow_provider_walsink.core.spark import CheckpointJob, ProtocolArgs
    from airflow_provider_walsink.core.store import Actor
    from airflow_provider_walsink.core.targets.files import FilePublisher
    from airflow_provider_walsink.triggers.durable import evaluate_durability

    actor = Actor(name="bench-write")
    df = _frame(spark, rows)
    marks: list[tuple[str, float]] = []
    with stopwatch() as elapsed:
        # Write operator, before spark-submit.
        store.register(PIPELINE, key, mode="overwrite", actor=actor, target=str(target))
        record = store.start_attempt(PIPELINE, key, actor=actor)
        layout.attempt_dir(PIPELINE, key, record.attempt, record.attempt_id).mkdir(
            parents=True, exist_ok=True
        )
        marks.append(("register + attempt", elapsed()))
        # Job side.
        protocol = ProtocolArgs(
            pipeline=PIPELINE,
            checkpoint_key=key,
            sequence=record.sequence,
            attempt=record.attempt,
            attempt_id=record.attempt_id,
            staging_root=str(layout.root),
        )
        job = CheckpointJob(spark, protocol, writer=writer)
        describe = _timed(job, "_describe")  # the real method, timed: listing, footers, checksums
        job.stage(df, partition_prefix={"dt": PARTITION.split("=", 1)[1]})
        marks.append(("Spark write", elapsed() - describe[0]))
        marks.append(("describe files (footers, CRC32)", elapsed()))
        job.seal()
        marks.append(("manifest", elapsed()))
        # Write operator, after the job: record the seal.
        path = layout.manifest_path(PIPELINE, key, record.attempt, record.attempt_id)
        manifest = read_manifest(path, expected_digest=job.sealed_digest)
        store.seal(
            PIPELINE,
            key,
            attempt=record.attempt,
            manifest_uri=path.as_uri(),
            manifest_digest=job.sealed_digest,
            committables=manifest.expected_count,
            rows=manifest.total_rows,
            bytes=manifest.total_bytes,
            actor=actor,
        )
        marks.append(("record seal", elapsed()))
        # Sensor.
        status = evaluate_durability(store, layout, PIPELINE, key, actor=actor)
        if not status.durable:
            raise RuntimeError(f"bench: checkpoint not durable: {status.message}")
        marks.append(("durability check", elapsed()))
        # Commit task.
        publisher = FilePublisher(target, "overwrite", layout=layout)
        summary = CheckpointCommitter(store, layout, publisher, mode="overwrite").commit(
            PIPELINE, key, actor=actor
        )
        marks.append(("commit", elapsed()))
    if summary.rows != rows:
        raise RuntimeError(f"bench: committed {summary.rows} rows, expected {rows}")
    previous = 0.0
    for name, at in marks:
        phases[name].append(at - previous)
        previous = at
    return elapsed()


#: The kinds of Spark session benchmark 1 runs in: ``classic`` (what a spark-submit job gets) and
#: ``connect`` (a Spark Connect client of a local server, what the Connect runner's job gets).
SESSIONS = ("classic", "connect")


def _connect_session(scratch: Path):
    """A Spark Connect server over ``local[2]`` (the tests' launcher) and a client session of it."""
    import sys

    from pyspark.sql import SparkSession

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from spark_connect_server import ConnectServer

    server = ConnectServer(scratch / "connect-server", master="local[2]", driver_memory="3g",
                           conf={"spark.sql.shuffle.partitions": "4"}).launch()  # fmt: skip
    return server, SparkSession.builder.remote(server.url).getOrCreate()


def _measure(spark, sizes, repeats, scratch: Path, label: str, table: Table, notes: list[str]) -> None:
    from airflow_provider_walsink.core.staging.layout import StagingLayout
    from airflow_provider_walsink.core.store import CommitterStore

    store = CommitterStore.from_url(f"sqlite:///{scratch}/committer.db")
    layout = StagingLayout(scratch / "staging")
    try:
        # Warm-up (JIT, class loading, first-job costs), not counted.
        plain_once(spark, 100_000, scratch / "warmup")
        walsink_once(spark, 100_000, store, layout, scratch / "warmup-ws", "warmup", defaultdict(list))
        for rows in sizes:
            plain, ws = [], []
            phases: dict[str, list[float]] = defaultdict(list)
            for r in range(repeats):
                steps = ["plain", "walsink"] if r % 2 == 0 else ["walsink", "plain"]
                for step in steps:
                    if step == "plain":
                        plain.append(plain_once(spark, rows, scratch / "plain"))
                    else:
                        ws.append(
                            walsink_once(
                                spark,
                                rows,
                                store,
                                layout,
                                scratch / "target",
                                f"n{rows:012d}_r{r}",  # keys ascend across sizes (the order check)
                                phases,
                            )
                        )
            table.rows.append(
                [
                    label,
                    f"{rows:,}",
                    fmt_s(median(plain)),
                    fmt_s(median(ws)),
                    ratio(median(ws), median(plain)),
                    spread(plain),
                    spread(ws),
                ]
            )
            notes.append(
                f"{label}, {rows:,} rows, walsink phases (medians): "
                + ", ".join(f"{name} {fmt_s(median(v))}" for name, v in phases.items())
            )
    finally:
        store.dispose()


def run(
    sizes: tuple[int, ...],
    repeats: int,
    scratch: Path,
    event_log_dir: str | None = None,
    sessions: tuple[str, ...] = ("classic",),
) -> Table:
    """Benchmark 1 in each kind of session of ``sessions`` (:data:`SESSIONS`), one after another
    in this run; each ratio compares walsink with the plain write in the same session."""
    scratch.mkdir(parents=True, exist_ok=True)
    logging.getLogger("airflow_provider_walsink").setLevel(logging.WARNING)  # one line per run is enough
    t = Table(
        "Benchmark 1: Spark write + durability check + commit vs plain df.write.parquet (goal ≤ 1.10×)",
        [
            "session",
            "rows",
            "plain write (median)",
            "walsink total (median)",
            "ratio",
            "plain range",
            "walsink range",
        ],
    )
    phase_rows: list[str] = []
    for kind in sessions:
        if kind == "classic":
            spark = _session(event_log_dir)
            try:
                _measure(spark, sizes, repeats, scratch / kind, "classic (spark-submit's)", t, phase_rows)
            finally:
                spark.stop()
        elif kind == "connect":
            server, spark = _connect_session(scratch / kind)
            with server:
                try:
                    _measure(spark, sizes, repeats, scratch / kind, "Spark Connect client", t, phase_rows)
                finally:
                    spark.stop()
        else:
            raise ValueError(f"session must be one of {SESSIONS}, got {kind!r}")
    t.notes.append(
        f"{repeats} repeats per size, plain and walsink alternating in one Spark session per kind over "
        "local[2] (driver 3 GiB): a classic session, as a spark-submit job has, and a Spark Connect "
        "client of a local Connect server, as the Connect runner's job has; both replace the previous "
        "run's partition; committer table on SQLite; checksums CRC32 (the job's default)."
    )
    t.notes.extend(phase_rows)
    return t
