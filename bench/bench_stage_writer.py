"""Benchmark 1 for each writer of a local staging root: Spark's own or the executors' (issue 23).

``CheckpointJob`` stages Parquet either with Spark's file writer (the driver then
lists the attempt and reads each footer and checksum) or with the executors
writing their files through pyarrow in ``mapInArrow`` and reporting them
(``core/spark/executor_write.py``, the only way onto an object store). This runs
benchmark 1 (write phase + durability check + commit, :func:`bench_write.walsink_once`)
with each, against plain ``df.write.parquet`` of the same DataFrame, in one
Spark session, the three alternating, and prints medians and ratios; the
faster writer (or Spark's, if they tie) is ``spark.job.LOCAL_WRITER``.

    .venv/bin/python -m bench.bench_stage_writer --rows 1000000,4000000 --repeats 5
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

from .bench_write import _session, plain_once, walsink_once
from .common import Table, fmt_s, machine, median, ratio, spread


def run(sizes: tuple[int, ...], repeats: int, scratch: Path) -> Table:
    from airflow_provider_walsink.core.staging.layout import StagingLayout
    from airflow_provider_walsink.core.store import CommitterStore

    # The executors' writer runs pyarrow and walsink in the Python workers: this interpreter.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    logging.getLogger("airflow_provider_walsink").setLevel(logging.WARNING)
    spark = _session(None)
    store = CommitterStore.from_url(f"sqlite:///{scratch}/committer.db")
    layout = StagingLayout(scratch / "staging")
    t = Table(
        "Benchmark 1 by writer, local staging root: write + durability check + commit vs plain df.write.parquet",
        ["rows", "plain (median)", "writer=spark", "writer=executors", "spark/plain", "executors/plain",
         "executors/spark", "ranges (plain; spark; executors)"],
    )  # fmt: skip
    try:
        plain_once(spark, 100_000, scratch / "warmup")  # JIT, class loading, Python workers: not counted
        for writer in ("spark", "executors"):
            walsink_once(spark, 100_000, store, layout, scratch / f"warm-{writer}", f"warm_{writer}",
                         defaultdict(list), writer)  # fmt: skip
        for rows in sizes:
            times: dict[str, list[float]] = {"plain": [], "spark": [], "executors": []}
            order = ["plain", "spark", "executors"]
            for r in range(repeats):
                for step in order[r % 3 :] + order[: r % 3]:  # rotate who goes first
                    if step == "plain":
                        times["plain"].append(plain_once(spark, rows, scratch / "plain"))
                    else:
                        times[step].append(
                            walsink_once(
                                spark,
                                rows,
                                store,
                                layout,
                                scratch / f"target-{step}",
                                f"n{rows}_r{r}_{step}",
                                defaultdict(list),
                                step,
                            )  # fmt: skip
                        )
            p, s, e = (median(times[k]) for k in ("plain", "spark", "executors"))
            t.rows.append(
                [f"{rows:,}", fmt_s(p), fmt_s(s), fmt_s(e), ratio(s, p), ratio(e, p), ratio(e, s),
                 f"{spread(times['plain'])}; {spread(times['spark'])}; {spread(times['executors'])}"]
            )  # fmt: skip
    finally:
        store.dispose()
        spark.stop()
    t.notes.append(
        f"{repeats} repeats per size, the three rotating first, one local[2] Spark session (driver 3 GiB), "
        "one dt partition per run (a prefix, no partition column), committer table on SQLite, CRC32."
    )
    return t


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1000000,4000000")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="walsink-bench-writer-"))
    try:
        print(machine(str(scratch)).render())
        print(run(tuple(int(n) for n in args.rows.split(",")), args.repeats, scratch).render())
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
