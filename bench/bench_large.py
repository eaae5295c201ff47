"""Benchmark 9 (issue 24): one checkpoint of 10,000 and 100,000 committables, per-file cost and peak memory.

Two targets, each beside its baselines, interleaved in one run:

* **file target**: walsink's ``CheckpointCommitter.commit()`` with a ``FilePublisher``
  (as benchmark 2) against a bare loop of ``os.rename`` over the same number of
  same-sized files (the floor).
* **Iceberg** (SQL catalog on SQLite, local warehouse): walsink's ``publish`` of
  the staged Parquet files against the library's own append of the same files,
  pyiceberg ``Table.add_files`` (which, like walsink, reads every footer for
  the ``DataFile`` metrics).

Every measured operation runs in a **fresh child process** that does only that
operation and reports its wall and CPU time, its resident set just before the
operation (interpreter and imports) and its high-water mark during it
(``VmHWM``, reset just before through ``/proc/self/clear_refs``; ``ru_maxrss``
would include the parent's resident set at the fork). The staging (files
written, manifest sealed and recorded, the checkpoint made durable, the
Iceberg table created) is done before, by the parent; the child reads the
sealed manifest from disk, as a commit task does.

The goal (issue 24): per-file cost at 100,000 no higher than at 10,000. Every
figure is checked: all files published (file target: in the target, staging
removed; Iceberg: the snapshot's ``total-data-files`` and ``total-records``).

Run: ``python -m bench.bench_large [--files 10000,100000] [--repeats 1]``
(``--files 100,1000`` is the smoke size).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .common import REPO, Table, fmt_s, machine, median, ratio, remove, work_dir

PARTITION = "dt=2026-01-01"


# --------------------------------------------------------------------------- children


def _rss_mib(field: str) -> float:
    """``VmRSS`` / ``VmHWM`` of this process from ``/proc/self/status``, in MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _measure(fn: Any) -> dict[str, Any]:
    """Run ``fn``; return its wall and CPU seconds, and the process's resident set before it and at
    its peak during it (MiB).

    The peak is ``VmHWM`` after resetting it (``/proc/self/clear_refs``, ``5``) just before ``fn``:
    ``ru_maxrss`` would include the parent's resident set at the fork.
    """
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _rss_mib("VmRSS")
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return {
        "wall": time.perf_counter() - wall,
        "cpu": time.process_time() - cpu,
        "rss_before_mib": before,
        "peak_mib": _rss_mib("VmHWM"),
    }


def _child(kind: str, scratch: Path, n: int) -> dict[str, Any]:
    """One measured operation of ``kind`` on what the parent staged under ``scratch``."""
    if kind == "rename":
        src, dst = scratch / "src" / PARTITION, scratch / "dst" / PARTITION
        names = sorted(os.listdir(src))

        def rename() -> None:
            for name in names:
                os.rename(src / name, dst / name)

        return _measure(rename)
    if kind == "files":
        from airflow_provider_walsink.core.commit import CheckpointCommitter
        from airflow_provider_walsink.core.staging.layout import StagingLayout
        from airflow_provider_walsink.core.store import CommitterStore
        from airflow_provider_walsink.core.targets.files import FilePublisher

        from .bench_commit import ACTOR

        store = CommitterStore.from_url(f"sqlite:///{scratch}/committer.db")
        layout = StagingLayout(scratch / "staging")
        committer = CheckpointCommitter(
            store, layout, FilePublisher(scratch / "target", "append", layout=layout), mode="append"
        )
        return _measure(lambda: committer.commit("bench_large", "k", actor=ACTOR))
    from .bench_tables import _iceberg

    publisher = _iceberg(scratch)
    attempt_dir = scratch / "staging" / "bench" / "k" / "attempt-1"
    if kind == "iceberg-walsink":
        from airflow_provider_walsink.core.protocol.manifest import read_manifest
        from airflow_provider_walsink.core.targets.base import StaticContext

        def publish() -> None:
            manifest = read_manifest(attempt_dir / "_manifest.json")
            publisher.publish(manifest, attempt_dir, StaticContext.for_manifest(manifest, epoch=1))

        return _measure(publish)
    table = publisher.load_table()
    paths = [
        f"file://{attempt_dir}/{name}"
        for name in sorted(os.listdir(attempt_dir))
        if name.endswith(".parquet")
    ]
    return _measure(lambda: table.add_files(paths, check_duplicate_files=False))


def _run_child(kind: str, scratch: Path, n: int) -> dict[str, Any]:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.bench_large",
            "--child",
            kind,
            "--scratch",
            str(scratch),
            "--n",
            str(n),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} at {n:,} files failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- staging (parent)


def _stage_rename(scratch: Path, n: int) -> None:
    from .bench_commit import _write_files

    _write_files(scratch / "src" / PARTITION, n)
    (scratch / "dst" / PARTITION).mkdir(parents=True)


def _check_rename(scratch: Path, n: int) -> None:
    found = len(os.listdir(scratch / "dst" / PARTITION))
    if found != n:
        raise RuntimeError(f"rename: {found} files in the target, expected {n}")


def _stage_files(scratch: Path, n: int) -> None:
    from airflow_provider_walsink.core.commit import CheckpointWriter
    from airflow_provider_walsink.core.staging.layout import StagingLayout
    from airflow_provider_walsink.core.store import CommitterStore

    from .bench_commit import ACTOR, _write_files

    store = CommitterStore.from_url(f"sqlite:///{scratch}/committer.db")
    layout = StagingLayout(scratch / "staging")
    store.register("bench_large", "k", mode="append", actor=ACTOR)
    writer = CheckpointWriter(store, layout, "bench_large", "k", actor=ACTOR)
    attempt_dir = writer.begin()
    names = _write_files(attempt_dir / PARTITION, n)
    writer.add_files([f"{PARTITION}/{name}" for name in names], checksum=None, writer="bench-0")
    writer.seal()
    store.mark_durable("bench_large", "k", attempt=writer.attempt, actor=ACTOR)
    store.dispose()


def _check_files(scratch: Path, n: int) -> None:
    published = [f for f in os.listdir(scratch / "target" / PARTITION) if not f.startswith(("_", "."))]
    if len(published) != n:
        raise RuntimeError(f"walsink files: {len(published)} files in the target, expected {n}")
    if (scratch / "staging" / "bench_large" / "k").exists():
        raise RuntimeError("walsink files: staging was not cleaned up")


def _stage_iceberg(scratch: Path, n: int) -> None:
    from airflow_provider_walsink.core.protocol.manifest import write_manifest

    from .bench_tables import _iceberg, _iceberg_create, _stage

    attempt_dir = scratch / "staging" / "bench" / "k" / "attempt-1"
    manifest = _stage(attempt_dir, n, "k")
    write_manifest(attempt_dir / "_manifest.json", manifest)
    _iceberg_create(_iceberg(scratch), manifest, attempt_dir)


def _check_iceberg(scratch: Path, n: int) -> None:
    from .bench_tables import ROWS_PER_FILE, _iceberg

    summary = _iceberg(scratch).load_table().current_snapshot().summary
    files, rows = int(summary["total-data-files"]), int(summary["total-records"])
    if (files, rows) != (n, n * ROWS_PER_FILE):
        raise RuntimeError(
            f"iceberg: the table holds {files} files, {rows} rows; expected {n}, {n * ROWS_PER_FILE}"
        )


KINDS = {
    "rename": (_stage_rename, _check_rename),
    "files": (_stage_files, _check_files),
    "iceberg-add_files": (_stage_iceberg, _check_iceberg),
    "iceberg-walsink": (_stage_iceberg, _check_iceberg),
}
#: (target, baseline kind, walsink kind)
PAIRS = (("file", "rename", "files"), ("iceberg", "iceberg-add_files", "iceberg-walsink"))


def measure(scratch: Path, sizes: list[int], repeats: int) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """Every kind at every size, ``repeats`` times, baseline and walsink alternating which goes first."""
    results: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for n in sizes:
        for r in range(repeats):
            for _, base, walsink in PAIRS:
                for kind in (base, walsink) if r % 2 == 0 else (walsink, base):
                    d = scratch / f"{kind}-{n}-{r}"
                    stage, check = KINDS[kind]
                    stage(d, n)
                    result = _run_child(kind, d, n)
                    check(d, n)
                    results.setdefault((kind, n), []).append(result)
                    remove(d)
                    print(
                        f"  {kind:18} {n:>7,} files: {fmt_s(result['wall'])}, RSS {result['rss_before_mib']:.0f} MiB before, "
                        f"peak {result['peak_mib']:.0f} MiB",
                        flush=True,
                    )
    return results


def table(results: dict[tuple[str, int], list[dict[str, Any]]], sizes: list[int], repeats: int) -> Table:
    t = Table(
        "Benchmark 9: one checkpoint of N files (goal: per-file cost at 100,000 ≤ at 10,000; peak memory printed)",
        [
            "target",
            "files",
            "baseline",
            "baseline wall",
            "walsink wall",
            "ratio",
            "baseline µs/file",
            "walsink µs/file",
            "walsink CPU µs/file",
            "baseline RSS before → peak",
            "walsink RSS before → peak",
        ],
    )
    for target, base, walsink in PAIRS:
        for n in sizes:
            b, w = results[(base, n)], results[(walsink, n)]
            bw, ww = median([x["wall"] for x in b]), median([x["wall"] for x in w])
            t.rows.append(
                [
                    target,
                    f"{n:,}",
                    "os.rename loop" if base == "rename" else "pyiceberg add_files",
                    fmt_s(bw),
                    fmt_s(ww),
                    ratio(ww, bw),
                    f"{bw / n * 1e6:.1f}",
                    f"{ww / n * 1e6:.1f}",
                    f"{median([x['cpu'] for x in w]) / n * 1e6:.1f}",
                    _rss(b),
                    _rss(w),
                ]
            )
    t.notes.append(
        f"{repeats} repeat(s) per cell (medians), baseline and walsink alternating; each measured in a fresh "
        "child process that reads the sealed manifest from disk; RSS before = that process's resident set "
        "(interpreter and imports) just before the operation, peak = its high-water mark during it "
        "(VmHWM reset just before), the worst repeat. File target: 1 KiB files, one partition, committer "
        "table on SQLite; Iceberg: 10-row Parquet files, SQL catalog on SQLite, local warehouse."
    )
    return t


def _rss(runs: list[dict[str, Any]]) -> str:
    worst = max(runs, key=lambda x: x["peak_mib"] - x["rss_before_mib"])
    return f"{worst['rss_before_mib']:.0f} → {worst['peak_mib']:.0f} MiB"


def main(argv: list[str] | None = None) -> list[Table]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", default="10000,100000")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--work-dir")
    parser.add_argument("--child", choices=sorted(KINDS), help=argparse.SUPPRESS)
    parser.add_argument("--scratch", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child, Path(args.scratch), args.n)))
        return []
    sizes = [int(x) for x in args.files.split(",")]
    scratch = work_dir(args.work_dir)
    try:
        results = measure(scratch, sizes, args.repeats)
        tables = [machine(str(scratch)), table(results, sizes, args.repeats)]
    finally:
        remove(scratch)
    for t in tables:
        print(t.render(), end="\n\n")
    return tables


if __name__ == "__main__":
    main()
