"""Run every walsink benchmark and print each table beside its baseline.

    .venv/bin/python -m bench.run                     # small: a few minutes
    .venv/bin/python -m bench.run --size medium       # + 10M-row Spark writes
    .venv/bin/python -m bench.run --size large        # + 50M-row Spark writes
    .venv/bin/python -m bench.run --only commit,table --repeats 7
    .venv/bin/python -m bench.run --size smoke        # seconds; correctness only (CI)

Benchmarks: ``write`` (1: Spark write + durability + commit vs plain
df.write.parquet), ``commit`` (2: N committables vs an os.rename loop),
``table`` (3: committer-table throughput vs pgbench), ``orchestration``
(4: one example DAG run under a real scheduler), ``sql`` (6: the SQL target's
load vs a plain COPY / LOAD DATA of the same rows, PostgreSQL and MariaDB).
The table targets' commit and marker costs are ``python -m bench.bench_tables``
(its own tables: it needs no size presets). Figures are medians over
``--repeats`` runs; baselines and walsink are interleaved in one run.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # `python bench/run.py` as well as `python -m bench.run`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    __package__ = "bench"

from bench.common import Table, machine, remove, work_dir  # noqa: E402

ALL = ("write", "commit", "table", "orchestration", "sql")


@dataclass(frozen=True)
class Size:
    """What one ``--size`` preset runs."""

    write_rows: tuple[int, ...]
    commit_files: tuple[int, ...]
    table_clients: tuple[int, ...]
    table_seconds: float
    repeats: int
    orchestration_runs: int
    sql_rows: tuple[int, ...]


SIZES = {
    "smoke": Size((), (10, 100), (1,), 1.0, 1, 0, (2_000,)),
    "small": Size((1_000_000,), (100, 1_000, 10_000), (1, 4, 16), 5.0, 5, 1, (1_000_000,)),
    "medium": Size((1_000_000, 10_000_000), (100, 1_000, 10_000), (1, 4, 16), 10.0, 5, 3, (1_000_000,)),
    "large": Size(
        (1_000_000, 10_000_000, 50_000_000), (100, 1_000, 10_000), (1, 4, 16), 10.0, 5, 3, (1_000_000,)
    ),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", choices=SIZES, default="small")
    parser.add_argument("--only", default=",".join(ALL), help=f"comma-separated subset of {','.join(ALL)}")
    parser.add_argument("--repeats", type=int, help="repeats per measurement (default: the size's)")
    parser.add_argument(
        "--write-repeats", type=int, help="repeats of the Spark write benchmark (default: --repeats)"
    )
    parser.add_argument(
        "--db",
        choices=("sqlite", "postgresql"),
        default="sqlite",
        help="committer database for the commit benchmark (the table benchmark is PostgreSQL)",
    )
    parser.add_argument("--spark-event-log", help="write Spark event logs here (for profiling benchmark 1)")
    parser.add_argument(
        "--write-sessions",
        default="classic,connect",
        help="benchmark 1's Spark sessions, one after another: classic (a spark-submit job's), "
        "connect (a Spark Connect client's); default both",
    )
    parser.add_argument("--work-dir", help="where scratch files go (default: the system temp dir)")
    parser.add_argument("--markdown", help="also write the tables to this file")
    args = parser.parse_args(argv)

    size = SIZES[args.size]
    repeats = args.repeats or size.repeats
    only = [b.strip() for b in args.only.split(",") if b.strip()]
    unknown = set(only) - set(ALL)
    if unknown:
        parser.error(f"unknown benchmark(s) {sorted(unknown)}; choose from {ALL}")

    scratch = work_dir(args.work_dir)
    tables: list[Table] = []
    started = time.monotonic()
    command = "python -m bench.run " + " ".join(sys.argv[1:] if argv is None else argv)
    try:
        tables.append(machine(str(scratch), {"command": command.strip()}))
        print(tables[-1].render(), "\n", flush=True)
        for name in only:
            result = RUNNERS[name](size, repeats, args, scratch)
            if result is not None:
                tables.append(result)
                print(result.render(), "\n", flush=True)
    finally:
        remove(scratch)
    footer = f"Total wall time {time.monotonic() - started:.0f} s."
    print(footer)
    if args.markdown:
        Path(args.markdown).write_text("\n\n".join(t.render() for t in tables) + f"\n\n{footer}\n")
    return 0


def run_commit(size: Size, repeats: int, args: argparse.Namespace, scratch: Path) -> Table:
    from airflow_provider_walsink.core.store import CommitterStore
    from bench import bench_commit
    from bench.common import private_pg_database

    if args.db == "postgresql":
        with private_pg_database() as url:
            store = CommitterStore.from_url(url)
            try:
                results = bench_commit.run(store, scratch / "commit", size.commit_files, repeats)
            finally:
                store.dispose()
    else:
        store = CommitterStore.from_url(f"sqlite:///{scratch}/committer.db")
        try:
            results = bench_commit.run(store, scratch / "commit", size.commit_files, repeats)
        finally:
            store.dispose()
    return bench_commit.table(results, repeats, args.db)


def run_table(size: Size, repeats: int, args: argparse.Namespace, scratch: Path) -> Table:
    from bench import bench_committer_table

    return bench_committer_table.run(size.table_clients, size.table_seconds, min(repeats, 3))


def run_write(size: Size, repeats: int, args: argparse.Namespace, scratch: Path) -> Table | None:
    if not size.write_rows:
        return None
    from bench import bench_write

    return bench_write.run(
        size.write_rows,
        args.write_repeats or repeats,
        scratch / "write",
        args.spark_event_log,
        sessions=tuple(args.write_sessions.split(",")),
    )


def run_orchestration(size: Size, repeats: int, args: argparse.Namespace, scratch: Path) -> Table | None:
    if not size.orchestration_runs:  # the smoke size starts no Airflow stack
        return None
    from bench import bench_orchestration

    return bench_orchestration.run(size, scratch / "orchestration", runs=size.orchestration_runs)


def run_sql(size: Size, repeats: int, args: argparse.Namespace, scratch: Path) -> Table:
    from bench import bench_sql

    # Three repeats at most: 1M rows into MariaDB takes ~15 s a load on this machine.
    return bench_sql.run(list(size.sql_rows), min(repeats, 3), scratch / "sql", ["postgresql", "mysql"])


RUNNERS = {
    "write": run_write,
    "commit": run_commit,
    "table": run_table,
    "orchestration": run_orchestration,
    "sql": run_sql,
}

if __name__ == "__main__":
    sys.exit(main())
