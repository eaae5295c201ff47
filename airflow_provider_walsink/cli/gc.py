"""``walsink gc``: remove orphaned staging and trim old committer rows."""

from __future__ import annotations

import argparse
import sys
from typing import IO

from airflow_provider_walsink.cli.common import _dump, _duration, _known_pipelines
from airflow_provider_walsink.cli.database import CliError, open_store, resolve


def cmd_gc(args: argparse.Namespace, out: IO[str]) -> int:
    from airflow_provider_walsink.core.commit.gc import collect_garbage
    from airflow_provider_walsink.core.staging.layout import StagingLayout
    from airflow_provider_walsink.hooks.walsink import default_staging_root

    retention = _duration(args.retention, "--retention")
    history_retention = _duration(args.history_retention, "--history-retention")
    target = resolve(args)  # reads the connection: its staging root is where pipelines stage
    staging_root = args.staging_root or target.staging_root or default_staging_root()
    from airflow_provider_walsink.core.staging.cleanup import is_object_store

    on_store = is_object_store(staging_root)  # opened with the connection's staging credentials
    layout: StagingLayout | str = staging_root if on_store else StagingLayout(staging_root)
    if not on_store and not layout.root.is_dir():
        if args.staging_root:  # given by hand: almost certainly a typo
            raise CliError(f"--staging-root {staging_root}: no such directory; nothing removed")
        print(
            f"walsink gc: warning: staging root {staging_root} does not exist (no pipeline staged "
            "there yet, or not the staging root you meant: pass --staging-root); nothing removed there "
            "(the staging roots recorded on checkpoint rows are walked all the same)",
            file=sys.stderr,
        )
    with open_store(target) as store:
        _known_pipelines(store, args.pipeline)
        report = collect_garbage(
            store,
            layout,
            retention=retention,
            history_retention=history_retention,
            pipelines=args.pipeline or None,
            dry_run=args.dry_run,
            stores=target.stores,
        )
    if args.json:
        _dump(out, {**report.to_dict(), "staging_root": str(staging_root), "database": target.display})
    else:
        print(f"staging root {staging_root}; committer database {target.display}", file=out)
        print(report.describe(), file=out)
        for item in report.checkpoint_dirs_removed + report.attempts_removed:
            print(f"  {'would remove' if args.dry_run else 'removed'} {item}", file=out)
        for item in report.kept:  # each with its reason: "why is this still here?"
            print(f"  kept {item}", file=out)
    return 0
