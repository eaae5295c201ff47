"""Table targets: a walsink commit of N staged files into Iceberg and Delta vs the library alone.

1. **Commit of N files.** walsink's figure is one ``publish`` of a checkpoint
   of N staged Parquet files (marker check, staged files checked, ``ctx.fence()``,
   one table commit carrying the marker). The manifest is what the write job
   seals, including ``file_schema`` (the files' one schema). The baseline is the
   same library appending the same files with no walsink around it: pyiceberg
   ``Table.add_files`` (which reads every footer, as walsink's Iceberg publish
   does for the column statistics), deltalake ``create_write_transaction`` with
   add actions built from ``stat`` (no footer read: the floor; walsink's Delta
   publish stats every file and reads 2 footers to confirm the recorded schema).
   Fresh table per measurement, files staged before the clock starts, baseline
   and walsink interleaved.
2. **Marker check as history grows.** After H commits (H checkpoints, one file
   each): (a) walsink's check, exactly ``published_attempt`` (load the table,
   look the checkpoint's marker up: the lookup the commit path runs on the
   table it loads to commit), for a checkpoint the table does not hold; (b) the
   library's own table load alone (``catalog.load_table`` / ``DeltaTable(uri)``),
   what any writer pays to commit. The goal is (a)/(b) flat: the marker is a
   table property (Iceberg) or an application transaction (Delta), never a
   walk through the history. Also the same load of the same history written
   without walsink's markers, and the metadata size (Iceberg metadata JSON,
   Delta newest checkpoint).

   **How the history is built.** Committing 10,000 times through the library
   is too slow (each Iceberg commit rewrites the whole metadata), so the
   history is built synthetically from one real walsink commit, in the formats
   the libraries write: :func:`iceberg_history` writes table metadata with H
   snapshots (summaries as walsink's), their snapshot log, 100 metadata-log
   entries and H marker properties, and registers it in the SQL catalog;
   :func:`delta_history` writes H-1 commit files copied from the real commit
   (``commitInfo``, ``add``, the two ``txn``) and lets deltalake write a
   checkpoint at every 100th version. Each builder checks the result through
   the library (snapshot count / version, a marker found).
3. **Iceberg markers after ``expire_snapshots``.** One marker property per
   checkpoint ever committed stays when snapshots are expired: metadata size,
   load, check and a one-file walsink commit after H checkpoints with one
   snapshot left, against the same table with no marker.

Run: ``python -m bench.bench_tables [--files 100,1000] [--history 10,100,1000,10000] [--repeats 3] [--samples 7]``.
Every figure is checked: the table holds exactly the rows staged.
"""

from __future__ import annotations

import argparse
import io
import os
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_walsink.core.protocol.file_schema import file_schema_of
from airflow_provider_walsink.core.protocol.manifest import Committable, build_manifest
from airflow_provider_walsink.core.targets.base import StaticContext

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
    # What the write job seals: the files' one schema, from the footers it reads for row counts.
    file_schema = file_schema_of(pq.read_metadata(pa.BufferReader(payload)))
    committables = []
    for i in range(n):
        name = f"part-{i:05d}.parquet"
        (part / name).write_bytes(payload)
        committables.append(Committable(name, len(payload), ROWS_PER_FILE))
    return build_manifest(
        pipeline="bench", checkpoint_key=key, sequence=1, attempt=attempt, file_format="parquet",
        committables=committables, attempt_id=uuid.uuid4().hex, file_schema=file_schema,
    )  # fmt: skip


# --------------------------------------------------------------------------- Iceberg


def _iceberg(base: Path, mode: str = "append", **kwargs: Any):
    from airflow_provider_walsink.core.targets.iceberg import IcebergPublisher

    props = {"type": "sql", "uri": f"sqlite:///{base}/catalog.db", "warehouse": f"file://{base}/wh"}
    return IcebergPublisher("bench.t", mode, catalog_properties=props, create_table=True, **kwargs)


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

    from airflow_provider_walsink.core.targets.delta import DeltaPublisher

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


def _check_and_load(check, load, samples: int) -> tuple[float, float]:
    """Median of walsink's check and of the library's load alone, interleaved."""
    checks, loads = [], []
    for i in range(samples):
        for which in ("check", "load") if i % 2 == 0 else ("load", "check"):
            with Timer() as t:
                (check if which == "check" else load)()
            (checks if which == "check" else loads).append(t.wall)
    return median(checks), median(loads)


def iceberg_history(base: Path, h: int, *, snapshots: bool = True, markers: bool = True):
    """An Iceberg table whose metadata holds ``h`` walsink commits, built synthetically.

    One real walsink commit makes the template (metadata JSON, snapshot, manifest
    list, marker property, name mapping). The history is that metadata with
    ``h`` snapshots as walsink's commits leave them (summary with the walsink.*
    keys and totals, chained parents, increasing sequence numbers; every one
    pointing at the real manifest list, which a table load never opens), their
    snapshot-log entries, 100 metadata-log entries (pyiceberg's default
    ``write.metadata.previous-versions-max``) and one marker property per
    checkpoint; written as pyiceberg writes metadata (compact JSON) and
    registered in the SQL catalog. ``snapshots=False``: as after
    ``expire_snapshots`` (one snapshot left, the ``h`` markers stay);
    ``markers=False``: the same history written by a writer with no walsink.
    Returns (publisher of the table, its metadata size in bytes).
    """
    import json
    import random

    from airflow_provider_walsink.core.targets.iceberg import MARKER_PREFIX

    template = _iceberg(base)
    if template.load_table() is None:
        d = base / "staging" / "bench" / "t0" / "attempt-1"
        m = _stage(d, 1, "t0")
        template.publish(m, d, StaticContext.for_manifest(m))
    table = template.load_table()
    meta = json.loads(Path(table.metadata_location.removeprefix("file://")).read_text())
    real = meta["snapshots"][0]
    props = {k: v for k, v in meta["properties"].items() if not k.startswith(MARKER_PREFIX)}
    rng = random.Random(h)
    ids = [rng.getrandbits(62) + 1 for _ in range(h)]
    t0 = real["timestamp-ms"] - h * 60_000
    snaps, log = [], []
    for i, sid in enumerate(ids):
        attempt = uuid.UUID(int=rng.getrandbits(128)).hex
        if markers:
            props[f"{MARKER_PREFIX}bench/k{i}"] = json.dumps(
                {"attempt_id": attempt, "epoch": 1, "previous": [], "snapshot": str(sid)}, sort_keys=True
            )
        if not snapshots and i < h - 1:
            continue
        summary = dict(real["summary"])
        for k in [k for k in summary if k.startswith("walsink.")]:
            del summary[k]
        if markers:
            summary.update({"walsink.pipeline": "bench", "walsink.checkpoint": f"k{i}", "walsink.sequence": "1",
                            "walsink.attempt-id": attempt, "walsink.epoch": "1"})  # fmt: skip
        n = i + 1 if snapshots else 1
        summary.update({"total-data-files": str(n), "total-records": str(n * ROWS_PER_FILE),
                        "total-files-size": str(n * int(summary["added-files-size"]))})  # fmt: skip
        snap = {**real, "snapshot-id": sid, "sequence-number": len(snaps) + 1, "timestamp-ms": t0 + i * 60_000,
                "summary": summary}  # fmt: skip
        snap.pop("parent-snapshot-id", None)
        if snaps:
            snap["parent-snapshot-id"] = snaps[-1]["snapshot-id"]
        snaps.append(snap)
        log.append({"snapshot-id": sid, "timestamp-ms": snap["timestamp-ms"]})
    metadata_dir = Path(table.metadata_location.removeprefix("file://")).parent
    meta.update(
        {
            "table-uuid": str(uuid.UUID(int=rng.getrandbits(128))),
            "properties": props,
            "snapshots": snaps,
            "snapshot-log": log,
            "current-snapshot-id": snaps[-1]["snapshot-id"],
            "refs": {"main": {"snapshot-id": snaps[-1]["snapshot-id"], "type": "branch"}},
            "last-sequence-number": len(snaps),
            "metadata-log": [
                {
                    "metadata-file": f"file://{metadata_dir}/{i:05d}-{uuid.UUID(int=rng.getrandbits(128))}.metadata.json",
                    "timestamp-ms": t0 + i,
                }  # fmt: skip
                for i in range(min(h, 100))
            ],
        }
    )
    name = f"h{h}{'' if snapshots else 'x'}{'' if markers else 'n'}"
    location = metadata_dir / f"{min(h, 100):05d}-{uuid.uuid4()}.metadata.json"
    location.write_text(json.dumps(meta, separators=(",", ":")))
    template.catalog.register_table(f"bench.{name}", f"file://{location}")
    publisher = _iceberg(base)
    publisher.identifier = f"bench.{name}"
    loaded = publisher.load_table()
    assert len(loaded.metadata.snapshots) == (h if snapshots else 1)
    if markers:  # the synthetic markers are found by walsink's own lookup
        last = _stage(base / "probe" / f"k{h - 1}", 0, f"k{h - 1}")
        assert publisher.published_marker(last) is not None
    return publisher, location.stat().st_size


def delta_history(base: Path, h: int, *, markers: bool = True) -> tuple[str, int]:
    """A Delta table of ``h`` versions as walsink's commits leave them, built synthetically.

    Version 0 is a real walsink commit (it creates the table); versions 1..h-1
    are commit files with the actions a real walsink commit writes (its
    ``commitInfo`` with the walsink.* metadata, one ``add``, the two ``txn``
    application transactions), copied from that real commit with a new key,
    attempt id and file name each (the added files are not written: a table
    load never opens data files). Checkpoints are the library's own
    (``create_checkpoint``) at every 100th version, as deltalake's default
    ``delta.checkpointInterval`` = 100 writes them. ``markers=False``: the same
    history with no ``txn`` actions (a writer with no walsink).
    Returns (table URI, bytes of the newest checkpoint, 0 if none).
    """
    import json

    from deltalake import DeltaTable

    from airflow_provider_walsink.core.targets.delta import DeltaPublisher

    uri = str(base / f"delta-h{h}{'' if markers else 'n'}")
    publisher = DeltaPublisher(uri, "append", create_table=True)
    d = Path(uri) / "_walsink_staging" / "bench" / "k0" / "attempt-1"
    m = _stage(d, 1, "k0")
    publisher.publish(m, d, StaticContext.for_manifest(m))
    log_dir = Path(uri) / "_delta_log"
    # Version 0 is the empty table walsink creates; version 1 its first commit, the model for the rest.
    first = [json.loads(line) for line in (log_dir / f"{1:020d}.json").read_text().splitlines()]
    commit_info = next(a["commitInfo"] for a in first if "commitInfo" in a)
    add = next(a["add"] for a in first if "add" in a)
    ts = commit_info["timestamp"]
    for v in range(2, h + 1):
        key, attempt = f"k{v - 1}", uuid.uuid4().hex
        info = {**commit_info, "timestamp": ts + v, "operation": "WRITE",
                "operationParameters": {"mode": "Append"}}  # fmt: skip
        if markers:
            info.update({"walsink.checkpoint": key, "walsink.attempt-id": attempt, "walsink.epoch": "1"})
        else:
            info = {k: val for k, val in info.items() if not k.startswith("walsink.")}
        actions = [{"commitInfo": info},
                   {"add": {**add, "path": f"_walsink_staging/bench/{key}/attempt-1/part-00000.parquet",
                            "modificationTime": ts + v}}]  # fmt: skip
        if markers:
            actions += [{"txn": {"appId": f"walsink/bench/{key}", "version": 1}},
                        {"txn": {"appId": f"walsink/bench/{key}/{attempt}", "version": 1}}]  # fmt: skip
        (log_dir / f"{v:020d}.json").write_text("\n".join(json.dumps(a) for a in actions) + "\n")
        if v % 100 == 0:
            DeltaTable(uri).create_checkpoint()
    dt = DeltaTable(uri)
    assert dt.version() == h
    if markers and h > 1:
        assert dt.transaction_version(f"walsink/bench/k{h - 1}") == 1
    checkpoints = sorted(log_dir.glob("*.checkpoint.parquet"))
    return uri, checkpoints[-1].stat().st_size if checkpoints else 0


def history_cost(base: Path, kind: str, h: int, samples: int = 7) -> dict[str, float]:
    """walsink's marker check vs the library's table load alone, after ``h`` commits.

    The check is exactly ``published_attempt`` (load the table, look the
    checkpoint's marker up; the commit path runs the same lookup on the table it
    loads to commit) for a checkpoint the table does not hold; the load is the
    library's own (``catalog.load_table`` / ``DeltaTable(uri)``), what any
    writer pays before it commits. Also: the same load on the same history
    without walsink's markers, and (Iceberg) after ``expire_snapshots``.
    """
    from deltalake import DeltaTable

    from airflow_provider_walsink.core.targets.delta import DeltaPublisher

    probe = _stage(base / "probe" / "none", 0, "probe")
    out: dict[str, float] = {}
    if kind == "iceberg":
        publisher, out["size"] = iceberg_history(base, h)
        assert publisher.published_attempt(probe) is None
        out["check"], out["load"] = _check_and_load(
            lambda: publisher.published_attempt(probe),
            lambda: publisher.catalog.load_table(publisher.identifier),
            samples,
        )
        plain, out["size_plain"] = iceberg_history(base, h, markers=False)
        out["load_plain"] = _check_and_load(lambda: None, lambda: plain.load_table(), samples)[1]
        expired, out["size_expired"] = iceberg_history(base, h, snapshots=False)
        out["check_expired"], out["load_expired"] = _check_and_load(
            lambda: expired.published_attempt(probe), lambda: expired.load_table(), samples
        )
        out["commit_expired"] = _commit_one(expired, base, "x", samples)
    else:
        uri, out["size"] = delta_history(base, h)
        publisher = DeltaPublisher(uri, "append")
        assert publisher.published_attempt(probe) is None
        out["check"], out["load"] = _check_and_load(
            lambda: publisher.published_attempt(probe), lambda: DeltaTable(uri), samples
        )
        plain, out["size_plain"] = delta_history(base, h, markers=False)
        out["load_plain"] = _check_and_load(lambda: None, lambda: DeltaTable(plain), samples)[1]
    return out


def main(argv: list[str] | None = None) -> list[Table]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", default="100,1000")
    parser.add_argument("--history", default="10,100,1000,10000")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--samples", type=int, default=7, help="timed loads per history size")
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
        commit.notes.append(
            "goal: <= 1.2x at 1,000 files. Delta: one stat per file + 2 footers (the schema is sealed in the "
            "manifest); Iceberg: every footer (column statistics), in 8 threads"
        )
        tables.append(commit)
        history = [int(x) for x in args.history.split(",")]
        marker = Table(
            "Table targets: marker check as history grows",
            ["target", "commits", "walsink check", "library load", "ratio", "metadata",
             "load without walsink markers", "metadata without markers"],
        )  # fmt: skip
        expired = Table(
            "Iceberg: marker properties after expire_snapshots",
            ["checkpoints", "metadata", "library load", "walsink check", "walsink commit (1 file)",
             "metadata without markers", "load without markers", "commit without markers"],
        )  # fmt: skip
        for kind in ("iceberg", "delta"):
            for h in history:
                d = root / f"history-{kind}-{h}"
                d.mkdir()
                c = history_cost(d, kind, h, samples=args.samples)
                marker.rows.append([kind, h, fmt_s(c["check"]), fmt_s(c["load"]), ratio(c["check"], c["load"]),
                                    _size(c["size"]), fmt_s(c["load_plain"]), _size(c["size_plain"])])  # fmt: skip
                if kind == "iceberg":
                    base = history_cost_expired_baseline(d, samples=args.samples)
                    expired.rows.append([h, _size(c["size_expired"]), fmt_s(c["load_expired"]),
                                         fmt_s(c["check_expired"]), fmt_s(c["commit_expired"]), _size(base[0]),
                                         fmt_s(base[1]), fmt_s(base[2])])  # fmt: skip
                remove(d)
        marker.notes.append(
            "check = published_attempt (load + marker lookup); load = the library's own table load; "
            "metadata: Iceberg metadata JSON / Delta newest checkpoint; goal: ratio flat (~1x)"
        )
        expired.notes.append(
            "one snapshot left, one marker property per checkpoint ever committed; 'without markers': the "
            "same table with no marker at all (its commit then adds the first)"
        )
        tables += [marker, expired]
    finally:
        remove(root)
    for t in tables:
        print(t.render(), end="\n\n")
    return tables


def _commit_one(publisher, base: Path, tag: str, samples: int) -> float:
    """Median wall time of a walsink publish of a one-file checkpoint (a new key each time)."""
    times = []
    for i in range(samples):
        d = base / "staging" / "bench" / f"{tag}{i}" / "attempt-1"
        m = _stage(d, 1, f"{tag}{i}")
        with Timer() as t:
            publisher.publish(m, d, StaticContext.for_manifest(m))
        times.append(t.wall)
    return median(times)


def history_cost_expired_baseline(base: Path, samples: int) -> tuple[int, float, float]:
    """Metadata size, load and one-file commit of an Iceberg table with one snapshot and no marker."""
    floor = base / "floor"
    floor.mkdir()
    publisher, size = iceberg_history(floor, 1, markers=False)
    load = _check_and_load(lambda: None, publisher.load_table, samples)[1]
    return size, load, _commit_one(publisher, floor, "f", samples)


def _size(n: float) -> str:
    if not n:
        return "-"
    return f"{n / 1024:.0f} KiB" if n < 1024 * 1024 else f"{n / 1024 / 1024:.1f} MiB"


def _v(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "-"


if __name__ == "__main__":
    main()
