"""The ``walsink`` command: commit state and schema management from a shell.

``walsink status`` prints every checkpoint's state per pipeline;
``walsink db upgrade`` creates or upgrades the committer schema;
``walsink gc`` removes orphaned staging and trims old committer rows.
The database is ``--url``, else ``$WALSINK_DATABASE_URL``, else the Airflow
connection named by ``--conn-id`` (default ``walsink_default``, falling back
to the embedded SQLite file in ``$AIRFLOW_HOME``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from airflow_provider_walsink.committer.store import CommitterStore

STATE_ORDER = ["REGISTERED", "WRITING", "SEALED", "DURABLE", "COMMITTING", "COMMITTED", "FAILED", "ABORTED"]


def _resolve_url(args: argparse.Namespace) -> str:
    if args.url:
        return args.url
    if os.environ.get("WALSINK_DATABASE_URL"):
        return os.environ["WALSINK_DATABASE_URL"]
    from airflow_provider_walsink.hooks.walsink import WalsinkHook

    # Outside a task the Task SDK reads connections only from environment variables and
    # external secrets backends; a shell tool (like `airflow connections get`) must also
    # read the metadata database, else a connection made in the UI is silently missed.
    os.environ.setdefault("_AIRFLOW_PROCESS_CONTEXT", "server")
    return WalsinkHook(args.conn_id).sqlalchemy_url


def _fmt_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def cmd_status(args: argparse.Namespace) -> int:
    store = CommitterStore.from_url(_resolve_url(args))
    pipelines = [p for p in store.pipelines() if not args.pipeline or p["name"] == args.pipeline]
    if args.json:
        out = []
        for p in pipelines:
            cps = store.checkpoints(p["name"], limit=args.limit, descending=False)
            out.append(
                {
                    "pipeline": p["name"],
                    "mode": p["mode"],
                    "counts": p["counts"],
                    "checkpoints": [
                        {
                            "key": c.checkpoint_key,
                            "sequence": c.sequence,
                            "state": c.state.value,
                            "attempt": c.attempt,
                            "rows": c.rows,
                            "error": c.error,
                        }
                        for c in cps
                    ],
                }
            )
        json.dump(out, sys.stdout, indent=2, default=str)
        print()
        return 0
    if not pipelines:
        print("no pipelines in the committer table")
        return 0
    for p in pipelines:
        counts = ", ".join(f"{s} {p['counts'][s]}" for s in STATE_ORDER if s in p["counts"])
        print(f"pipeline {p['name']} ({p['mode']}{', ' + p['target'] if p['target'] else ''}): {counts}")
        print(f"  {'seq':>4}  {'checkpoint':<20} {'state':<11} {'att':>3} {'rows':>10} {'bytes':>10}  error")
        for c in store.checkpoints(p["name"], limit=args.limit, descending=False):
            error = (c.error or "").splitlines()[0][:60] if c.error else ""
            print(
                f"  {c.sequence:>4}  {c.checkpoint_key:<20} {c.state.value:<11} {c.attempt:>3} "
                f"{c.rows if c.rows is not None else '-':>10} {_fmt_bytes(c.bytes):>10}  {error}"
            )
    return 0


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    url = _resolve_url(args)
    store = CommitterStore.from_url(url, migrate=False)
    store.migrate()
    print(f"committer schema is at head on {store.engine.url.render_as_string(hide_password=True)}")
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    from airflow_provider_walsink.gc import collect_garbage, parse_duration
    from airflow_provider_walsink.protocol.staging import StagingLayout

    staging_root = args.staging_root
    if not staging_root:
        from airflow_provider_walsink.hooks.walsink import WalsinkHook, default_staging_root

        staging_root = default_staging_root() if args.url else WalsinkHook(args.conn_id).staging_root
    report = collect_garbage(
        CommitterStore.from_url(_resolve_url(args)),
        StagingLayout(staging_root),
        retention=parse_duration(args.retention),
        history_retention=parse_duration(args.history_retention) if args.history_retention else None,
        pipelines=args.pipeline or None,
        dry_run=args.dry_run,
    )
    if args.json:
        json.dump(report.to_dict(), sys.stdout, indent=2)
        print()
    else:
        print(report.describe())
        for item in report.checkpoint_dirs_removed + report.attempts_removed:
            print(f"  {'would remove' if args.dry_run else 'removed'} {item}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="walsink", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="SQLAlchemy URL of the committer database")
    parser.add_argument(
        "--conn-id", default="walsink_default", help="Airflow connection (default walsink_default)"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    status = sub.add_parser("status", help="commit state of every checkpoint")
    status.add_argument("--pipeline", help="only this pipeline")
    status.add_argument("--limit", type=int, default=1000, help="checkpoints per pipeline (default 1000)")
    status.add_argument("--json", action="store_true", help="print JSON")
    status.set_defaults(func=cmd_status)
    db = sub.add_parser("db", help="committer schema")
    db_sub = db.add_subparsers(dest="db_command", required=True)
    db_sub.add_parser("upgrade", help="create or upgrade the schema (Alembic)").set_defaults(
        func=cmd_db_upgrade
    )
    gc = sub.add_parser("gc", help="remove orphaned staging and trim old committer rows")
    gc.add_argument("--staging-root", help="default: the connection's staging root")
    gc.add_argument(
        "--retention", default="1d", help="minimum age of staging garbage (default 1d; 90s/15m/12h/7d)"
    )
    gc.add_argument(
        "--history-retention", help="also trim committed rows and history older than this (e.g. 30d)"
    )
    gc.add_argument("--pipeline", action="append", help="only this pipeline (repeatable)")
    gc.add_argument("--dry-run", action="store_true", help="report, remove nothing")
    gc.add_argument("--json", action="store_true", help="print JSON")
    gc.set_defaults(func=cmd_gc)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
