"""``python -m tests.harness --seed S --schedules N [--db-url URL]``: a crash campaign from a shell.

``--target iceberg|delta|sql [--sql-url URL]`` runs the table targets' campaign instead
(``tests/harness/targets.py``; CI runs 4 schedules per target, a long run many more)."""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile

from .runner import run_harness


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.harness", description=__doc__)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--schedules", type=int, default=200)
    parser.add_argument(
        "--spark-schedules",
        type=int,
        default=0,
        help="extra schedules whose writes are real spark-submit jobs",
    )
    parser.add_argument(
        "--spark-connect",
        metavar="CONN_ID",
        help="run the --spark-schedules' writes through this spark_connect connection (AIRFLOW_CONN_<ID>)",
    )
    parser.add_argument(
        "--db-url", help="committer database (default: a fresh SQLite file in a temporary directory)"
    )
    parser.add_argument("--workdir", help="where staging and targets live (default: a temporary directory)")
    parser.add_argument("--verbose", "-v", action="store_true", help="print every schedule")
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="driver processes for the SQLite schedules, each with its own database (default 1)",
    )
    parser.add_argument(
        "--target",
        choices=("iceberg", "delta", "sql"),
        help="run the table targets' crash campaign against this target kind instead",
    )
    parser.add_argument("--sql-url", help="the SQL target's database (PostgreSQL or MySQL/MariaDB URL)")
    args = parser.parse_args(argv)
    if not args.verbose:
        logging.disable(logging.WARNING)  # the figures, not every commit's log line
    if args.target:
        from .targets import run_target_campaign

        with tempfile.TemporaryDirectory(prefix="walsink-harness-") as tmp:
            found = run_target_campaign(
                args.target,
                seed=args.seed,
                schedules=args.schedules,
                workdir=args.workdir or tmp,
                db_url=args.db_url or f"sqlite:///{tmp}/committer.db",
                sql_url=args.sql_url,
            )
        print(found.describe())
        return 0 if found.violations == [] else 1
    with tempfile.TemporaryDirectory(prefix="walsink-harness-") as tmp:
        result = run_harness(
            seed=args.seed,
            schedules=args.schedules,
            workdir=args.workdir or tmp,
            db_url=args.db_url,
            verbose=args.verbose,
            spark_schedules=args.spark_schedules,
            workers=args.workers,
            spark_connect=args.spark_connect,
        )
    print(result.describe())
    return 0 if result.violations == [] and not result.uncovered else 1


if __name__ == "__main__":
    sys.exit(main())
