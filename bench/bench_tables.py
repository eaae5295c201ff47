"""Table targets: a walsink commit of N staged files into Iceberg and Delta vs the library alone.

1. **Commit of N files.** walsink's figure is one ``publish`` of a checkpoint
   of N staged Parquet files (marker check, footers read for the schema
   check and statistics, ``ctx.fence()``, one table commit carrying the
   marker). The baseline is the same library appending the same files with no
   walsink around it: pyiceberg ``Table.add_files`` (which reads the same
   footers), deltalake ``create_write_transaction`` with add actions built from
   ``stat`` (no footer read: the floor). Fresh table per measurement, files
   staged before the clock starts, baseline and walsink interleaved.
2. **Marker check as history grows.** Time of walsink's "is this attempt
   already in the table?" (load the table, look up the marker) after H
   commits. Flat is the goal: the marker is a table property (Iceberg) or an
   application transaction (Delta), not a walk through the history.

Run: ``python -m bench.bench_tables [--files 100,1000] [--history 10,100,1000] [--repeats 3]``.
Every figure is checked: the table holds exactly the rows staged.
"""

from __future__ import annotations

import argparse
import io
import os
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_walsink.protocol.manifest import Committable, build_manifest
from airflow_provider_walsink.publishers.base import StaticContext

from .common import Table, Timer, fmt_s, machine, median, ratio, remove, spread, work_dir

ROWS_PER_FILE = 10


def _stage(attempt_dir: Path, n: int, key: str, attempt: int = 1):
    """N small Parquet files of an unpartitioned table (so the library's own add_files takes them as they are)."""
    part = attempt_dir
    part.mkdir(parents=True, exist_ok=True)
    table = pa.table(
        {"id": pa.array(range(ROWS_PER_FILE), pa.int64()), "name": pa.array(["x"] * ROWS_PER_FILE)}
    )
    buf = io.BytesIO()
    pq.write_table(table, buf)
    payload = buf.getvalue()
    committables = []
    for i in range(n):
        name = f"part-{i:05d}.parquet"
        (part / name).write_bytes(payload)
        committables.append(Committable(name, len(payload), ROWS_PER_FILE))
    return build_manifest(
        pipeline="bench", checkpoint_key=key, sequence=1, attempt=attempt, file_format="parquet",
        committables=committables, attempt_id=uuid.uuid4().hex,
    )  # fmt: skip


# --------------------------------------------------------------------------- Iceberg


def _iceberg(base: Path, mode: str = "append"):
    from airflow_provider_walsink.publishers.iceberg import IcebergPublisher

    props = {"type": "sql", "uri": f"sqlite:///{base}/catalog.db", "warehouse": f"file://{base}/wh"}
    return IcebergPublisher("bench.t", mode, catalog_properties=props, create_table=True)


def _iceberg_create(publisher, manifest, attempt_dir: Path):
    footers = publisher.storage.footers(
        [(f"{attempt_dir}/{c.path}", c.size) for c in manifest.committables[:1]]
    )
    return publisher._create(manifest, footers)


def iceberg_commit(base: Path, n: int, walsink: bool) -> float:
    publisher = _iceberg(base)
    attempt_dir = base / "staging" / "bench" / "k" / "attempt-1"
    manifest = _stage(attempt_dir, n, "k")
    table = _iceberg_create(publisher, manifest, attempt_dir)
    paths = [f"file://{attempt_dir}/{c.path}" for c in manifest.committables]
    if walsink:
        with Timer() as t:
            publisher.publish(manifest, attempt_dir, StaticContext.for_manifest(manifest, epoch=1))
    else:
        with Timer() as t:  # the library's own "append these existing files" (reads the same footers)
            table.add_files(paths, check_duplicate_files=False)
    rows = publisher.load_table().scan().to_arrow().num_rows
    assert rows == n * ROWS_PER_FILE, (rows, n)
    return t.wall


# --------------------------------------------------------------------------- Delta


def delta_commit(base: Path, n: int, walsink: bool) -> float:
    from deltalake import DeltaTable
    from deltalake.transaction import AddAction

    from airflow_provider_walsink.publishers.delta import DeltaPublisher

    uri = str(base / "delta")
    publisher = DeltaPublisher(uri, "append", create_table=True)
    seed = _stage(Path(uri) / "_walsink_staging" / "bench" / "seed" / "attempt-1", 1, "seed")
    publisher.publish(
        seed, Path(uri) / "_walsink_staging/bench/seed/attempt-1", StaticContext.for_manifest(seed)
    )
    attempt_dir = Path(uri) / "_walsink_staging" / "bench" / "k" / "attempt-1"
    manifest = _stage(attempt_dir, n, "k")
    if walsink:
        with Timer() as t:
            publisher.publish(manifest, attempt_dir, StaticContext.for_manifest(manifest, epoch=1))
    else:
        with Timer() as t:
            dt = DeltaTable(uri)
            now = int(time.time() * 1000)
            adds = []
            for c in manifest.committables:
                size = os.stat(attempt_dir / c.path).st_size
                rel = f"_walsink_staging/bench/k/attempt-1/{c.path}"
                adds.append(AddAction(rel, size, {}, now, True, '{"numRecords": 10}'))
            dt.create_write_transaction(adds, "append", dt.schema())
    rows = DeltaTable(uri).to_pyarrow_table().num_rows
    assert rows == (n + 1) * ROWS_PER_FILE, (rows, n)
    return t.wall


# --------------------------------------------------------------------------- history


def marker_check_cost(base: Path, kind: str, history: list[int], samples: int = 5) -> list[tuple[int, float]]:
    """Median time of the marker check after each H commits (one file per commit)."""
    from airflow_provider_walsink.publishers.delta import DeltaPublisher

    if kind == "iceberg":
        publisher = _iceberg(base)
        staging = base / "staging"
    else:
        publisher = DeltaPublisher(str(base / "delta"), "append", create_table=True)
        staging = base / "delta" / "_walsink_staging"
    probe = _stage(staging / "bench" / "probe" / "attempt-1", 1, "probe")
    out = []
    done = 0
    for h in history:
        while done < h:
            d = staging / "bench" / f"k{done}" / "attempt-1"
            m = _stage(d, 1, f"k{done}")
            publisher.publish(m, d, StaticContext.for_manifest(m))
            done += 1
        times = []
        for _ in range(samples):
            with Timer() as t:
                assert publisher.published_attempt(probe) is None
            times.append(t.wall)
        out.append((h, median(times)))
    return out


def main(argv: list[str] | None = None) -> list[Table]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", default="100,1000")
    parser.add_argument("--history", default="10,100,1000")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--work-dir", default=None)
    args = parser.parse_args(argv)
    root = work_dir(args.work_dir)
    tables = [machine(str(root), {"pyiceberg": _v("pyiceberg"), "deltalake": _v("deltalake")})]
    try:
        commit = Table(
            "Table targets: commit of N files vs the library alone",
            [
                "target",
                "files",
                "library (median)",
                "walsink (median)",
                "ratio",
                "library spread",
                "walsink spread",
            ],
        )
        for kind, fn in (("iceberg", iceberg_commit), ("delta", delta_commit)):
            for n in [int(x) for x in args.files.split(",")]:
                lib, ws = [], []
                for r in range(args.repeats):
                    order = (False, True) if r % 2 == 0 else (True, False)
                    for walsink in order:
                        d = root / f"{kind}-{n}-{r}-{int(walsink)}"
                        d.mkdir()
                        (ws if walsink else lib).append(fn(d, n, walsink))
                        remove(d)
                commit.rows.append([kind, n, fmt_s(median(lib)), fmt_s(median(ws)), ratio(median(ws), median(lib)),
                                    spread(lib), spread(ws)])  # fmt: skip
        commit.notes.append("goal: <= 1.2x at 1,000 files; walsink also reads every footer (schema check)")
        tables.append(commit)
        history = [int(x) for x in args.history.split(",")]
        marker = Table(
            "Table targets: marker check as history grows", ["target", *[f"after {h}" for h in history]]
        )
        for kind in ("iceberg", "delta"):
            d = root / f"history-{kind}"
            d.mkdir()
            marker.rows.append([kind, *[fmt_s(t) for _, t in marker_check_cost(d, kind, history)]])
        marker.notes.append("load the table + look up the marker; goal: flat")
        tables.append(marker)
    finally:
        remove(root)
    for t in tables:
        print(t.render(), end="\n\n")
    return tables


def _v(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "-"


if __name__ == "__main__":
    main()
