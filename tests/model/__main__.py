"""``python -m tests.model --seed S --schedules N [--targets files,delta,...]`` or ``--replay FILE``.

Runs the model checker over every target combination asked for (kind x mode x
fencing), ``N`` schedules in all, and prints its figures and every violation
with its shrunk, replayable schedule (also written to ``--out``). The figures
count every schedule run, Hypothesis's shrinking replays included; a violation
ends its combination's run (Hypothesis stops at the first failure it shrinks).
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable

from .machine import Combo, Figures, load_schedule, minimize, run_machine
from .world import Config, replay, schedule_text

TARGETS = ("files", "iceberg", "delta", "sql-postgresql", "sql-mysql")
PG_ADMIN = "postgresql+psycopg2://postgres@127.0.0.1:5432/test"
MYSQL_ADMIN = "mysql+pymysql://root@127.0.0.1:3306/test"


def sql_database(backend: str) -> tuple[str, Callable[[], None]]:
    """A private database on the local server (dropped by the returned function)."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    admin_url = PG_ADMIN if backend == "postgresql" else MYSQL_ADMIN
    name = f"walsink_model_{uuid.uuid4().hex[:8]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name}"))  # a generated name: hex digits only

    def drop() -> None:
        with admin.connect() as conn:
            if backend == "postgresql":
                conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :d"),
                             {"d": name})  # fmt: skip
            conn.execute(text(f"DROP DATABASE IF EXISTS {name}"))
        admin.dispose()

    return make_url(admin_url).set(database=name).render_as_string(hide_password=False), drop


def combos_for(
    targets: list[str], modes: list[str], fencings: list[str], sql_urls: dict[str, str]
) -> list[Combo]:
    out = []
    for target in targets:
        kind = target.split("-")[0]
        for mode in modes:
            for fencing in fencings:
                if fencing == "table" and kind not in ("iceberg", "delta"):
                    continue  # table fencing: Iceberg and Delta only
                out.append(Combo(kind, mode, fencing, sql_urls.get(target)))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.model", description=__doc__)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--schedules", type=int, default=20, help="schedules in all (split over the combinations)")
    p.add_argument("--steps", type=int, default=14, help="at most this many steps per schedule")
    p.add_argument("--targets", default=",".join(TARGETS), help=f"comma-separated, of {', '.join(TARGETS)}")
    p.add_argument("--modes", default="append,overwrite")
    p.add_argument("--fencing", default="lease,table")
    p.add_argument(
        "--replay", metavar="FILE", help="run one schedule (JSON, as printed) and check every step"
    )
    p.add_argument("--no-shrink", action="store_true")
    p.add_argument("--out", default=None, help="write the violations (with schedules) to this JSON file")
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.CRITICAL)
    for name in ("airflow_provider_walsink",):
        logging.getLogger(name).setLevel(logging.INFO if args.verbose else logging.CRITICAL)
    _quiet_structlog(args.verbose)
    if not args.verbose:
        logging.disable(logging.ERROR)  # the core logs every commit; the figures are the output
    workdir = tempfile.mkdtemp(prefix="walsink-model-")
    drops: list[Callable[[], None]] = []
    try:
        if args.replay:
            with open(args.replay) as f:
                text = f.read().strip()
            if text.startswith("schedule:"):
                text = text.removeprefix("schedule:").strip()
            config, steps = load_schedule(text)
            sql_url = None
            if config["kind"] == "sql":
                sql_url, drop = sql_database(config.get("sql", "postgresql"))
                drops.append(drop)
            cfg = Config(config["kind"], config["mode"], config["fencing"], workdir, f"sqlite:///{workdir}/c.db",
                         sql_url, pipeline=f"m{uuid.uuid4().hex[:10]}")  # fmt: skip
            found = replay(cfg, steps, verbose=True)
            print(f"{len(found)} violation(s)")
            for v in found:
                print(f"  {v}")
            return 1 if found else 0
        targets = [t.strip() for t in args.targets.split(",") if t.strip()]
        sql_urls = {}
        for t in targets:
            if t.startswith("sql-"):
                sql_urls[t], drop = sql_database(t.split("-", 1)[1])
                drops.append(drop)
        combos = combos_for(targets, args.modes.split(","), args.fencing.split(","), sql_urls)
        per = max(1, args.schedules // len(combos))
        figures = Figures()
        started = time.monotonic()
        for i, combo in enumerate(combos):
            t0 = time.monotonic()
            before = (figures.schedules, len(figures.violations))
            run_machine([combo], seed_value=args.seed * 1000 + i, schedules=per, steps=args.steps,
                        workdir=workdir, figures=figures, shrink=not args.no_shrink)  # fmt: skip
            figures.last_failure = None
            found = len(figures.violations) - before[1]
            if found and not args.no_shrink:
                for j in range(before[1], len(figures.violations)):
                    label, problems, schedule = figures.violations[j]
                    if schedule:
                        config, steps = load_schedule(schedule)
                        cfg = Config(combo.kind, combo.mode, combo.fencing, workdir, "sqlite", combo.sql_url)
                        steps, again = minimize(combo, steps, workdir)
                        figures.violations[j] = (label, again or problems, schedule_text(cfg, steps))
            print(f"{combo.label:32s} schedules {figures.schedules - before[0]:4d}  "
                  f"{time.monotonic() - t0:6.1f}s  violations {found}", flush=True)  # fmt: skip
            for label, problems, schedule in figures.violations[before[1] :]:
                print(f"  VIOLATION on {label}:\n    " + "\n    ".join(problems[:10]) + f"\n  schedule: {schedule}",
                      flush=True)  # fmt: skip
        print(f"\n{figures.describe()}\n  seconds: {time.monotonic() - started:.0f}")
        if args.out:
            with open(args.out, "w") as f:
                json.dump(
                    [{"combo": c, "problems": p, "schedule": s} for c, p, s in figures.violations],
                    f,
                    indent=1,
                )
        return 1 if figures.violations else 0
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        for drop in drops:
            try:
                drop()
            except Exception:  # noqa: BLE001,S110 - best effort clean-up of a test database
                pass


def _quiet_structlog(verbose: bool) -> None:
    try:
        import structlog
    except ImportError:
        return
    if not verbose:
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))


if __name__ == "__main__":
    sys.exit(main())
