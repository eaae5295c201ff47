"""``walsink abort``: end a stuck or unwanted checkpoint, fencing its committer out, recorded in
Airflow's audit log where its metadata database is reachable.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import IO, Any

from airflow_provider_walsink.cli.common import _dump, _first_line, _known_pipelines
from airflow_provider_walsink.cli.database import CliError, open_store, resolve


def cmd_abort(args: argparse.Namespace, out: IO[str]) -> int:
    """End one checkpoint's current attempt: fence its committer out, mark ABORTED, clean up.

    Refused (exit 1, nothing changed but the history) when the target already
    holds the sealed attempt: the checkpoint is published and its commit task
    should be re-run. Recorded in Airflow's audit log when Airflow's metadata
    database is reachable from here; otherwise a warning on stderr says so.
    """
    import getpass
    import socket

    from airflow_provider_walsink.core.commit.abort import AbortRefusedError
    from airflow_provider_walsink.core.store import Actor
    from airflow_provider_walsink.hooks.aborts import aborter_for, audit_extra
    from airflow_provider_walsink.hooks.walsink import default_staging_root

    reason = args.reason.strip()
    if not reason:
        raise CliError("--reason must not be empty: it is recorded in the checkpoint's history")
    target = resolve(args)
    staging_root = args.staging_root or target.staging_root or default_staging_root()
    user = _os_user(getpass)
    actor = Actor(name=f"{user}@{socket.gethostname()} (walsink abort)")
    refused: str | None = None
    with open_store(target) as store:
        _known_pipelines(store, [args.pipeline])
        record = store.get(args.pipeline, args.checkpoint)
        if record is None:
            raise CliError(f"pipeline {args.pipeline!r} has no checkpoint {args.checkpoint!r}")
        aborter = aborter_for(
            store,
            args.pipeline,
            staging_root=staging_root,
            target=args.target,
            checkpoint_key=args.checkpoint,
            stores=target.stores,
        )
        try:
            outcome = aborter.abort(
                args.pipeline, args.checkpoint, reason=reason, actor=actor, manifest_lost=args.manifest_lost
            )
        except AbortRefusedError as exc:
            refused = str(exc)
        pipeline_row = store.get_pipeline(args.pipeline) or {}
    extra = audit_extra(
        pipeline=args.pipeline,
        checkpoint_key=args.checkpoint,
        reason=reason,
        source="walsink CLI",
        outcome=None if refused else outcome.to_dict(),
        refused=refused,
    )
    audit = _audit(record.dag_id or pipeline_row.get("dag_id"), record.run_id, user, extra)
    if refused:
        raise CliError(refused)
    if args.json:
        _dump(out, {**outcome.to_dict(), "audit_log": audit})
        return 0
    was = f" (was {outcome.previous_state})" if outcome.previous_state else " (already)"
    print(f"{outcome.pipeline}/{outcome.checkpoint_key} is {outcome.state}{was}: {outcome.reason}", file=out)
    if outcome.fenced_holder:
        print(f"  committer fenced out: {outcome.fenced_holder}", file=out)
    print(f"  published files rolled back: {outcome.files_rolled_back}", file=out)
    print(f"  staging removed: {', '.join(outcome.staging_removed) or 'none'}", file=out)
    for warning in outcome.warnings:
        print(f"  left undone (run the abort again): {warning}", file=out)
    print(f"  Airflow audit log: {audit}", file=out)
    return 0


def _os_user(getpass: Any) -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (containers)
        return f"uid {os.getuid()}"


def _audit(dag_id: str | None, run_id: str | None, user: str, extra: str) -> str:
    """Record the abort in Airflow's audit log if its metadata database is reachable; say what happened."""
    try:
        from airflow_provider_walsink.hooks.aborts import record_audit_log

        record_audit_log(dag_id=dag_id, run_id=run_id, owner=user, extra=extra)
    except Exception as exc:  # noqa: BLE001 - the abort is done; only the audit copy is missing
        detail = _first_line(str(getattr(exc, "orig", None) or exc), 200) or type(exc).__name__
        message = f"not recorded (Airflow's metadata database is not reachable from here: {detail})"
        print(
            f"walsink: warning: abort {message}; the checkpoint's history has it",
            file=sys.stderr,
        )
        return message
    return "recorded (event walsink.abort)"
