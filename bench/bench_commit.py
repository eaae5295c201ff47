"""Benchmark 2: committing one checkpoint of N committables vs a bare ``os.rename`` loop.

The floor is the least any file publish can do: one ``os.rename`` per staged
file into the target directory, nothing else. walsink's figure is one
``CheckpointCommitter.commit()`` call with a ``FilePublisher``: take the
lease (one transaction), read and digest-check the manifest, confine and check every path, rename every file, fsync the target
directories, record COMMITTED (one transaction) and delete the staging
directory. The database work is per checkpoint, never per file.

Both sides move the same number of same-sized files within one file system
into a fresh, empty target; the staging (creating the files, sealing the
manifest, marking the checkpoint durable) is set up before the clock starts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from airflow_provider_walsink.core.commit import CheckpointCommitter, CheckpointWriter
from airflow_provider_walsink.core.staging.layout import StagingLayout
from airflow_provider_walsink.core.store import Actor, CommitterStore
from airflow_provider_walsink.core.targets.files import FilePublisher

from .common import Table, Timer, fmt_s, median, ratio, spread

ACTOR = Actor(name="bench-commit")
PARTITION = "dt=2026-01-01"
FILE_BYTES = 1024
PAYLOAD = os.urandom(FILE_BYTES)


@dataclass
class CommitRun:
    """Timings of one N: the floor and each walsink mode, one ``Timer`` per repeat."""

    n: int
    floor: list[Timer]
    walsink: dict[str, list[Timer]]


def _write_files(directory: Path, n: int) -> list[str]:
    directory.mkdir(parents=True, exist_ok=True)
    names = [f"part-{i:05d}-c000.snappy.parquet" for i in range(n)]
    for name in names:
        with open(directory / name, "wb") as f:
            f.write(PAYLOAD)
    return names


def floor_once(scratch: Path, n: int) -> Timer:
    """Time a bare loop of ``os.rename`` of ``n`` staged files into an empty target directory."""
    src = scratch / "src" / PARTITION
    dst = scratch / "dst" / PARTITION
    names = _write_files(src, n)
    dst.mkdir(parents=True)
    with Timer() as timer:
        for name in names:
            os.rename(src / name, dst / name)
    if len(os.listdir(dst)) != n:
        raise RuntimeError(f"floor: expected {n} files in {dst}, found {len(os.listdir(dst))}")
    return timer


def walsink_once(store: CommitterStore, scratch: Path, n: int, mode: str, key: str) -> Timer:
    """Stage and seal a durable checkpoint of ``n`` files, then time its commit."""
    layout = StagingLayout(scratch / "staging")
    target = scratch / "target"
    pipeline = f"bench_commit_{mode}"
    store.register(pipeline, key, mode=mode, actor=ACTOR)
    writer = CheckpointWriter(store, layout, pipeline, key, actor=ACTOR)
    attempt_dir = writer.begin()
    names = _write_files(attempt_dir / PARTITION, n)
    writer.add_files([f"{PARTITION}/{name}" for name in names], checksum=None, writer="bench-0")
    writer.seal()
    store.mark_durable(pipeline, key, attempt=writer.attempt, actor=ACTOR)
    committer = CheckpointCommitter(store, layout, FilePublisher(target, mode, layout=layout), mode=mode)
    with Timer() as timer:
        summary = committer.commit(pipeline, key, actor=ACTOR)
    published = [f for f in os.listdir(target / PARTITION) if not f.startswith(("_", "."))]
    if summary.published != n or len(published) != n:
        raise RuntimeError(
            f"walsink {mode}: expected {n} published files, summary says {summary.published}, "
            f"target holds {len(published)}"
        )
    if layout.checkpoint_dir(pipeline, key).exists():
        raise RuntimeError(f"walsink {mode}: staging of {pipeline}/{key} was not cleaned up")
    return timer


def run(
    store: CommitterStore,
    scratch: Path,
    sizes: tuple[int, ...],
    repeats: int,
    modes: tuple[str, ...] = ("append", "overwrite"),
) -> list[CommitRun]:
    """Measure every size; floor and walsink alternate their order on each repeat."""
    results = []
    for n in sizes:
        run_ = CommitRun(n, [], {m: [] for m in modes})
        for r in range(repeats):
            steps = [("floor", None)] + [("walsink", m) for m in modes]
            if r % 2:
                steps.reverse()
            for kind, mode in steps:
                d = scratch / f"n{n}-r{r}-{kind}-{mode or 'floor'}"
                if kind == "floor":
                    run_.floor.append(floor_once(d, n))
                else:
                    run_.walsink[mode].append(walsink_once(store, d, n, mode, f"n{n}_r{r}"))
        results.append(run_)
    return results


def table(results: list[CommitRun], repeats: int, db: str) -> Table:
    t = Table(
        "Benchmark 2: commit of N committables vs a bare os.rename loop (goal at 10,000: ≤ 2× the floor)",
        [
            "files",
            "mode",
            "os.rename floor",
            "walsink commit",
            "ratio (wall)",
            "floor CPU",
            "walsink CPU",
            "ratio (CPU)",
            "walsink wall range",
        ],
    )
    for res in results:
        floor_wall = median([x.wall for x in res.floor])
        floor_cpu = median([x.cpu for x in res.floor])
        for mode, timers in res.walsink.items():
            wall = [x.wall for x in timers]
            cpu = median([x.cpu for x in timers])
            t.rows.append(
                [
                    f"{res.n:,}",
                    mode,
                    fmt_s(floor_wall),
                    fmt_s(median(wall)),
                    ratio(median(wall), floor_wall),
                    fmt_s(floor_cpu),
                    fmt_s(cpu),
                    ratio(cpu, floor_cpu),
                    spread(wall),
                ]
            )
    t.notes.append(
        "Times are medians; CPU = user + system time of the benchmark process (the committer database "
        "is SQLite, in-process), the fairer comparison while other work shares the machine."
    )
    t.notes.append(
        f"{repeats} repeats per cell, floor and walsink interleaved; {FILE_BYTES}-byte files in one "
        f"partition; committer table on {db}; fresh empty target each time."
    )
    return t
