"""``walsink db upgrade``: create or upgrade the committer schema (the only command that creates a
database).
"""

from __future__ import annotations

import argparse
from typing import IO

from airflow_provider_walsink.cli.common import _dump
from airflow_provider_walsink.cli.database import open_store, resolve


def cmd_db_upgrade(args: argparse.Namespace, out: IO[str]) -> int:
    target = resolve(args)
    with open_store(target, create=True) as store:
        store.migrate()
    if args.json:
        _dump(out, {"database": target.display, "source": target.source, "schema": "head"})
    else:
        print(f"committer schema is at head on {target.display}", file=out)
    return 0
