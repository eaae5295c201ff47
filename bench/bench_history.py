"""Table targets after 1,000, 10,000 and 100,000 committed checkpoints (issue 45): does what walsink keeps grow?

Per checkpoint walsink leaves one marker property in an Iceberg table
(``walsink.marker.<pipeline>/<key>``; past ``table_markers`` the oldest are archived into
the committer database, ``core/targets/archive.py``) and three application transactions in a
Delta table: with the target's ``table_markers`` (``delta``, here 256) past the bound the
oldest are expired from the table and kept in the committer database
(``core/targets/delta/markers.py``), without it (``delta-kept``) kept for good. For a table holding the markers of N checkpoints this
measures, each beside its value at the smallest N (the goal: at 100,000 at most
1.2x that at 1,000):

* **commit**: walsink's commit of one more one-file checkpoint, through the
  real publisher (``publish``, as benchmark 6 commits), median of the samples;
* **load**: a plain reader's table load (pyiceberg ``load_table`` from its own
  catalog object, deltalake ``DeltaTable(uri)``), median;
* **metadata written**: what that commit writes besides data. Iceberg: the new
  metadata JSON. Delta: the new commit JSON; and, measured apart, the commit
  that lands on a multiple of ``delta.checkpointInterval`` (100) and so also
  writes a checkpoint (deltalake's post-commit hook): its time and its JSON plus
  checkpoint bytes.

**How the history is built** (seconds, not one commit per checkpoint): one real
walsink commit creates the table, then ONE library commit carries the markers
of N-1 further checkpoints exactly as walsink's commits leave them, produced by
the target's own marker functions (:func:`iceberg_history_properties` folds
``iceberg.markers.marker_properties``, and :func:`iceberg_archived_history` archives them as
walsink's commits would; :func:`delta_history_transactions` folds
``delta.log.marker_transactions``, and :func:`delta_archived_history` expires and archives them
as walsink's commits would). Iceberg: a pyiceberg ``set_properties``
commit; Delta: a deltalake commit of those app transactions, then deltalake's
``create_checkpoint`` (a checkpoint holds every app transaction, as the
hundredth real commit's checkpoint would). A marker design that changes what a
commit leaves is measured by changing those two functions (a design whose
markers depend on the table's earlier state folds over it there).

What is held constant, so the figures isolate walsink's markers: the table's
data (one file per timed commit) and its snapshots (Iceberg: the real ones
only, as after ``expire_snapshots``; benchmark 6 measures snapshot history).
Keys are hourly (``20140101T000000Z`` + i hours), the pipeline is ``hourly``,
appends with no offsets: the issue's "hourly pipeline after ten years" case.

Run: ``python -m bench.bench_history [--sizes 1000,10000,100000] [--samples 5] [--kinds iceberg,delta,delta-kept]``.
Each table's marker count is checked through walsink's own lookup (the first
and the last synthetic checkpoint are found as committed).
"""

from __future__ import annotations

import argparse
import random
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

from airflow_provider_walsink.core.protocol.manifest import Committable, Manifest, build_manifest
from airflow_provider_walsink.core.targets.base import StaticContext

from .bench_tables import _iceberg, _size, _stage, _v
from .common import Table, Timer, fmt_s, machine, median, remove, work_dir

PIPELINE = "hourly"
GOAL = 1.2
CHECKPOINT_INTERVAL = 100  # deltalake's default delta.checkpointInterval


def history_manifests(n: int, seed: int = 0) -> Iterator[tuple[Manifest, str]]:
    """The manifests of ``n`` committed hourly checkpoints, each with the snapshot/version its commit made."""
    rng = random.Random(seed)
    start = datetime(2014, 1, 1, tzinfo=UTC)
    for i in range(n):
        key = (start + timedelta(hours=i)).strftime("%Y%m%dT%H%M%SZ")
        manifest = build_manifest(
            pipeline=PIPELINE, checkpoint_key=key, sequence=i + 1, attempt=1, file_format="parquet",
            committables=[Committable("part-00000.parquet", 900, 10)], attempt_id=uuid.UUID(int=rng.getrandbits(128)).hex,
        )  # fmt: skip
        yield manifest, str(rng.getrandbits(63))


# --------------------------------------------------------------------------- Iceberg


def iceberg_history_properties(manifests: Iterator[tuple[Manifest, str]]) -> dict[str, str]:
    """The table properties that walsink's commits of these checkpoints leave (fencing token 1, one file each)."""
    from airflow_provider_walsink.core.targets.iceberg.markers import marker_properties

    props: dict[str, str] = {}
    for manifest, snapshot in manifests:
        props.update(marker_properties(manifest, 1, snapshot, None, 1, ()))
    return props


def iceberg_table(base: Path, history: list[tuple[Manifest, str]]):
    """An Iceberg table holding the markers of ``len(history) + 1`` checkpoints: one real commit, then one
    holding ``history``'s as walsink's commits leave them: the newest in the table, the rest archived
    (:func:`iceberg_archived_history`) into a committer database beside it."""
    from airflow_provider_walsink.core.store.store import CommitterStore

    publisher = _iceberg(base, property_archive=CommitterStore.from_url(f"sqlite:///{base}/committer.db"))
    first = _stage(base / "staging" / "seed" / "attempt-1", 1, "seed")
    publisher.publish(first, base / "staging" / "seed" / "attempt-1", StaticContext.for_manifest(first))
    table = publisher.load_table()
    props = iceberg_history_properties(iter(history))
    kept, removed = iceberg_archived_history(publisher, str(table.metadata.table_uuid), props)
    tx = table.transaction().set_properties(kept)
    if removed:
        tx.remove_properties(*removed)
    tx.commit_transaction()
    return publisher


def iceberg_archived_history(
    publisher, table_uuid: str, props: dict[str, str]
) -> tuple[dict[str, str], list[str]]:
    """What walsink's archiving leaves of ``props`` (in commit order): the newest ``keep`` (the
    publisher's bound) in the table, the rest chained into the table's archive property, the older of them copied into the
    committer database and the last batch carried by the table (``core/targets/archive.py``)."""
    from airflow_provider_walsink.core.targets.archive import (
        ARCHIVE_PREFIX,
        ArchivedEntry,
    )

    keep, batch = publisher.archive_keep
    names = list(props)
    cut = max(0, len(names) - (keep - 1))  # with the seed checkpoint's, keep in the table
    archived, kept = names[:cut], names[cut:]
    if not archived:
        return props, []
    entries = [ArchivedEntry("marker", n.split("/", 1)[1], n.split("/", 1)[1], props[n]) for n in archived]
    state = archived_chain(publisher.property_archive, table_uuid, entries, batch)
    return {n: props[n] for n in kept} | {ARCHIVE_PREFIX + PIPELINE: state.dump()}, []


def archived_chain(archive, table_uuid: str, entries: list[Any], batch: int) -> Any:
    """The archive state after ``entries`` (in commit order): chained from the table's genesis, all
    but the last ``batch`` copied into the committer database ``archive``, which the state carries."""
    from airflow_provider_walsink.core.targets.archive import ArchiveState, chained, genesis

    digests, d = [], genesis(table_uuid, PIPELINE)
    for e in entries:
        d = chained(d, e)
        digests.append(d)
    first = max(0, len(entries) - batch)
    for start in range(0, first, 5000):
        end = min(first, start + 5000)
        archive.archive_extend(
            table_uuid, PIPELINE, start + 1, list(zip(entries[start:end], digests[start:end], strict=True))
        )
    base = digests[first - 1] if first else genesis(table_uuid, PIPELINE)
    return ArchiveState(len(entries), digests[-1], base, tuple(entries[first:]))


def iceberg_reader(publisher) -> Any:
    from pyiceberg.catalog.sql import SqlCatalog

    # Its own catalog object, under the name walsink's catalog has (the SQL catalog keys tables by it).
    catalog = SqlCatalog(publisher.catalog.name, **publisher.catalog_properties)
    return lambda: catalog.load_table(publisher.identifier)


def iceberg_commit(publisher, base: Path, tag: str) -> tuple[float, int, int]:
    """One walsink commit of a one-file checkpoint: (seconds, metadata JSON bytes written, 0)."""
    d = base / "staging" / tag / "attempt-1"
    m = _stage(d, 1, tag)
    with Timer() as t:
        publisher.publish(m, d, StaticContext.for_manifest(m))
    location = publisher.load_table().metadata_location.removeprefix("file://")
    return t.wall, Path(location).stat().st_size, 0


def iceberg_check(publisher, history: list[tuple[Manifest, str]]) -> None:
    """The table holds at most its bound of markers, and walsink's lookup finds the first and the last."""
    from airflow_provider_walsink.core.targets.iceberg.markers import MARKER_PREFIX, marker_of

    table = publisher.load_table()
    held = sum(1 for k in table.metadata.properties if k.startswith(MARKER_PREFIX))
    assert held == min(len(history) + 1, publisher.archive_keep[0]), held
    for manifest, _ in (history[0], history[-1]):
        assert marker_of(publisher._props(table), manifest).attempt_id == manifest.attempt_id, (
            manifest.checkpoint_key
        )


# --------------------------------------------------------------------------- Delta


def delta_history_transactions(manifests: Iterator[tuple[Manifest, str]]) -> list[Any]:
    """The application transactions that walsink's commits of these checkpoints leave (token 1, one file each)."""
    from airflow_provider_walsink.core.targets.delta.log import marker_transactions

    txns: list[Any] = []
    for manifest, _ in manifests:
        txns += marker_transactions(manifest, 1, 1, (), 0)
    return txns


def delta_table(base: Path, history: list[tuple[Manifest, str]], *, bounded: bool = True) -> tuple[str, Any]:
    """A Delta table holding the markers of ``len(history) + 1`` checkpoints: one real commit, one holding
    ``history``'s, then a checkpoint; ``(uri, committer store)``. ``bounded``: the target sets
    ``table_markers`` (the default 256), so the first commit bounds the table and the history commit
    leaves what walsink's archiving would (:func:`delta_archived_history`); else every marker is kept."""
    from deltalake import CommitProperties, DeltaTable

    from airflow_provider_walsink.core.store.store import CommitterStore
    from airflow_provider_walsink.core.targets.archive import DEFAULT_KEEP
    from airflow_provider_walsink.core.targets.delta import DeltaPublisher
    from airflow_provider_walsink.core.targets.delta.log import append_commit

    uri = str(base / "delta")
    store = CommitterStore.from_url(f"sqlite:///{base}/committer.db") if bounded else None
    publisher = DeltaPublisher(
        uri,
        "append",
        create_table=True,
        property_archive=store,
        table_markers=DEFAULT_KEEP if bounded else None,
    )
    d = Path(uri) / "_walsink_staging" / "seed" / "attempt-1"
    first = _stage(d, 1, "seed")
    publisher.publish(first, d, StaticContext.for_manifest(first))
    dt = DeltaTable(uri)
    txns = delta_history_transactions(iter(history))
    if bounded:
        txns, metadata = delta_archived_history(publisher, dt, txns)
    else:
        metadata = {}
    append_commit(
        dt, [], CommitProperties(custom_metadata=metadata, app_transactions=txns, max_commit_retries=0)
    )
    dt = DeltaTable(uri)
    dt.create_checkpoint()
    return uri, store


def delta_archived_history(publisher, dt, txns: list[Any]) -> tuple[list[Any], dict[str, str]]:
    """What walsink's archiving leaves of ``txns`` (in commit order), committed in the next version:
    the newest within the publisher's bound live, the rest re-emitted expired and chained into the
    pipeline's archive state, the older of them copied into the committer database and the last
    batch carried by the commit's ``commitInfo`` (``core/targets/delta/markers.py``)."""
    from deltalake import Transaction

    from airflow_provider_walsink.core.targets.archive import ArchivedEntry
    from airflow_provider_walsink.core.targets.delta.log import EXPIRED, now_ms
    from airflow_provider_walsink.core.targets.delta.markers import (
        ARCHIVE_INFO,
        KIND,
        _words,
        checkpoint_of,
        state_apps,
    )

    keep, batch = publisher.archive_keep
    cut = max(0, len(txns) - (keep - 3))  # with the seed checkpoint's three, keep in the table
    archived, kept = txns[:cut], txns[cut:]
    if not archived:
        return txns, {}
    table_uuid = str(dt.metadata().id)
    entries = [ArchivedEntry(KIND, t.app_id, checkpoint_of(t.app_id), str(t.version)) for t in archived]
    state = archived_chain(publisher.property_archive, table_uuid, entries, batch)
    apps, at = state_apps(PIPELINE), now_ms()
    chain = [Transaction(apps["count"], state.count, at), Transaction(apps["at"], dt.version() + 1, at)]
    chain += [Transaction(apps[f"digest{i}"], w, at) for i, w in enumerate(_words(state.digest))]
    expired = [Transaction(t.app_id, t.version, EXPIRED) for t in archived]
    return [*expired, *kept, *chain], {ARCHIVE_INFO + PIPELINE: state.dump()}


def delta_publisher(handle: tuple[str, Any]):
    """walsink's publisher of a table :func:`delta_table` built: bounded with its committer store, or not."""
    from airflow_provider_walsink.core.targets.archive import DEFAULT_KEEP
    from airflow_provider_walsink.core.targets.delta import DeltaPublisher

    uri, store = handle
    return DeltaPublisher(
        uri, "append", property_archive=store, table_markers=DEFAULT_KEEP if store else None
    )


def delta_commit(handle: tuple[str, Any], base: Path, tag: str) -> tuple[float, int, int]:
    """One walsink commit of a one-file checkpoint: (seconds, commit JSON bytes, checkpoint bytes written)."""
    uri = handle[0]
    publisher = delta_publisher(handle)
    d = Path(uri) / "_walsink_staging" / tag / "attempt-1"
    m = _stage(d, 1, tag)
    with Timer() as t:
        result = publisher.publish(m, d, StaticContext.for_manifest(m))
    log = Path(uri) / "_delta_log"
    version = int(result.snapshot)
    checkpoints = list(log.glob(f"{version:020d}.checkpoint*.parquet"))
    return t.wall, (log / f"{version:020d}.json").stat().st_size, sum(p.stat().st_size for p in checkpoints)


def delta_pad_to_checkpoint(handle: tuple[str, Any]) -> None:
    """Marker-only commits (as walsink's, through deltalake) up to one version before a checkpoint's."""
    from deltalake import DeltaTable

    from airflow_provider_walsink.core.targets.delta.log import (
        append_commit,
        commit_properties,
        marker_transactions,
    )

    uri = handle[0]
    dt = DeltaTable(uri)
    i = 0
    while (dt.version() + 2) % CHECKPOINT_INTERVAL:
        m = _stage(Path(uri) / "_pad" / str(i), 0, f"pad{dt.version()}")
        txns = marker_transactions(m, 1, 0, (), dt.version() + 1)
        append_commit(dt, [], commit_properties(m, 1, txns, exact_version=False))
        dt.update_incremental()
        i += 1


def delta_check(handle: tuple[str, Any], history: list[tuple[Manifest, str]]) -> None:
    """walsink's lookup finds the first and the last checkpoint of the history committed; a bounded
    table's checkpoint holds at most the bound of the pipeline's application transactions."""
    import pyarrow.parquet as pq
    from deltalake import DeltaTable

    from airflow_provider_walsink.core.targets.delta.markers import pipeline_of

    publisher = delta_publisher(handle)
    if handle[1] is not None:
        dt = DeltaTable(handle[0])
        (checkpoint,) = (Path(handle[0]) / "_delta_log").glob(f"{dt.version():020d}.checkpoint.parquet")
        txns = [t for t in pq.read_table(checkpoint, columns=["txn"]).column("txn").to_pylist() if t]
        held = sum(1 for t in txns if pipeline_of(t["appId"]) == PIPELINE)
        assert held <= publisher.archive_keep[0], held
    for manifest, _ in (history[0], history[-1]):
        assert publisher.published_attempt(manifest) == manifest.attempt_id, manifest.checkpoint_key


# --------------------------------------------------------------------------- run


def _goal(values: dict[int, float], n: int, smallest: int) -> tuple[str, str]:
    r = values[n] / values[smallest] if values[smallest] else float("nan")
    return f"{r:.2f}x", ("met" if r <= GOAL else "missed") if n != smallest else "-"


def main(argv: list[str] | None = None) -> list[Table]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--samples", type=int, default=5, help="timed commits and loads per table")
    parser.add_argument(
        "--checkpoint-samples", type=int, default=3, help="Delta: timed checkpoint-writing commits (0: none)"
    )
    parser.add_argument(
        "--kinds",
        default="iceberg,delta",
        help="iceberg, delta (bounded: table_markers 256), delta-kept (every marker kept, no table_markers)",
    )
    parser.add_argument("--work-dir", default=None)
    args = parser.parse_args(argv)
    from deltalake import DeltaTable

    sizes = [int(x) for x in args.sizes.split(",")]
    root = work_dir(args.work_dir)
    tables = [machine(str(root), {"pyiceberg": _v("pyiceberg"), "deltalake": _v("deltalake")})]
    out = Table(
        "Table targets after N committed checkpoints: one more commit, a reader's load, metadata written",
        ["target", "measure", *(f"N={n:,}" for n in sizes), *(f"ratio at {n:,}" for n in sizes[1:]), "goal"],
    )
    build = Table("History built (synthetic)", ["target", "N", "seconds to build and check"])
    try:
        histories = {n: list(history_manifests(n - 1)) for n in sizes}
        for kind in args.kinds.split(","):
            handles: dict[int, Any] = {}
            loads: dict[int, Any] = {}
            for n in sizes:
                d = root / f"{kind}-{n}"
                d.mkdir()
                t0 = time.perf_counter()
                if kind == "iceberg":
                    handles[n] = iceberg_table(d, histories[n])
                    loads[n] = iceberg_reader(handles[n])
                    iceberg_check(handles[n], histories[n])
                else:
                    handles[n] = delta_table(d, histories[n], bounded=kind == "delta")
                    loads[n] = partial(DeltaTable, handles[n][0])
                    delta_check(handles[n], histories[n])
                build.rows.append([kind, n, f"{time.perf_counter() - t0:.1f}"])
            commit_s: dict[int, list[float]] = {n: [] for n in sizes}
            load_s: dict[int, list[float]] = {n: [] for n in sizes}
            written: dict[int, list[int]] = {n: [] for n in sizes}
            for i in range(args.samples):  # interleaved: every size in each round, the order rotating
                for n in sizes[i % len(sizes) :] + sizes[: i % len(sizes)]:
                    d = root / f"{kind}-{n}"
                    if kind == "iceberg":
                        wall, size, _ = iceberg_commit(handles[n], d, f"c{i}")
                    else:
                        wall, size, _ = delta_commit(handles[n], d, f"c{i}")
                    commit_s[n].append(wall)
                    written[n].append(size)
                    with Timer() as t:
                        loads[n]()
                    load_s[n].append(t.wall)
            rows = [
                ("walsink commit (1 file)", {n: median(v) for n, v in commit_s.items()}, fmt_s),
                ("reader's table load", {n: median(v) for n, v in load_s.items()}, fmt_s),
                (
                    "metadata JSON written" if kind == "iceberg" else "commit JSON written",
                    {n: median(v) for n, v in written.items()},
                    _bytes,
                ),
            ]
            if kind.startswith("delta") and args.checkpoint_samples:
                ck_s: dict[int, list[float]] = {n: [] for n in sizes}
                ck_b: dict[int, list[int]] = {n: [] for n in sizes}
                for i in range(args.checkpoint_samples):
                    for n in sizes:
                        delta_pad_to_checkpoint(handles[n])
                        wall, size, ck = delta_commit(handles[n], root / f"{kind}-{n}", f"k{i}")
                        assert ck > 0, "the commit at a checkpoint interval wrote no checkpoint"
                        ck_s[n].append(wall)
                        ck_b[n].append(size + ck)
                rows += [
                    ("walsink commit writing a checkpoint", {n: median(v) for n, v in ck_s.items()}, fmt_s),
                    ("its JSON + checkpoint written", {n: median(v) for n, v in ck_b.items()}, _bytes),
                ]
            for label, values, fmt in rows:
                ratios = [_goal(values, n, sizes[0]) for n in sizes[1:]]
                verdict = ratios[-1][1] if ratios else "-"
                out.rows.append(
                    [kind, label, *(fmt(values[n]) for n in sizes), *(r[0] for r in ratios), verdict]
                )
            for n in sizes:
                remove(root / f"{kind}-{n}")
        out.notes.append(
            f"medians of {args.samples} samples per table, sizes interleaved; ratio = value / value at "
            f"N={sizes[0]:,}; goal: at N={sizes[-1]:,} <= {GOAL}x (met/missed)"
        )
        out.notes.append(
            "Delta: the commit landing on a multiple of delta.checkpointInterval (100) also writes a checkpoint "
            f"(deltalake's post-commit hook), measured apart ({args.checkpoint_samples} sample(s)); the other 99 "
            "of 100 commits write the commit JSON only"
        )
        tables += [out, build]
    finally:
        remove(root)
    for t in tables:
        print(t.render(), end="\n\n")
    return tables


def _bytes(n: float) -> str:
    return f"{n:,.0f} B" if n < 1024 else _size(n)


if __name__ == "__main__":
    main()
