"""The read-only on-call queries: ``walsink status``, ``walsink checkpoints``, ``walsink history``."""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import IO, Any

from airflow_provider_walsink.cli.common import (
    _age,
    _dump,
    _duration,
    _first_line,
    _fmt_bytes,
    _iso,
    _known_pipelines,
    _states,
    _table,
)
from airflow_provider_walsink.cli.database import CliError, open_store, resolve
from airflow_provider_walsink.core.protocol.partition_keys import (
    checkpoint_key_as_written,
    checkpoint_keys_named_by,
    partition_key_of_checkpoint,
)
from airflow_provider_walsink.core.runners import describe_job_ref

#: The all-pipelines view of ``walsink status``: pipelines per page and newest checkpoints each.
STATUS_PIPELINES = 20
STATUS_LIMIT_ALL = 10
STATUS_LIMIT_ONE = 1000


def cmd_status(args: argparse.Namespace, out: IO[str]) -> int:
    from airflow_provider_walsink.core.protocol.states import CheckpointState

    target = resolve(args)
    with open_store(target) as store:
        _known_pipelines(store, [args.pipeline] if args.pipeline else None)
        if args.pipeline:
            rows, more = [store.get_pipeline(args.pipeline)], False
        else:
            # A keyset page of pipelines by name: bounded at any number of pipelines.
            rows = store.pipeline_page(after=args.after, limit=args.pipelines + 1)
            more = len(rows) > args.pipelines
            rows = rows[: args.pipelines]
        limit = args.limit or (STATUS_LIMIT_ONE if args.pipeline else STATUS_LIMIT_ALL)
        summaries = store.pipeline_summaries([r["name"] for r in rows])
        pipelines = [{**r, "counts": summaries[r["name"]]["counts"]} for r in rows]
        # Per pipeline its mode and earliest open checkpoint: what blocks a later ``append`` one
        # (two statements for all of them).
        waits = store.wait_heads([p["name"] for p in pipelines])
        # The newest ``limit`` of every pipeline shown, oldest first, read for the page at once.
        newest = {
            name: list(reversed(records))
            for name, records in store.newest_checkpoints([p["name"] for p in pipelines], limit).items()
        }
        hint = (
            f"... more pipelines after {rows[-1]['name']!r}, not shown (--pipelines {args.pipelines}): "
            f"walsink status --after {shlex.quote(rows[-1]['name'])} for the next page, "
            "or --pipeline NAME for one"
            if more
            else None
        )
        if args.json:
            _dump(
                out,
                [
                    {
                        "pipeline": p["name"],
                        "mode": p["mode"],
                        "target": p["target"],
                        "counts": p["counts"],
                        "checkpoints": [_record_dict(c, waits) for c in newest[p["name"]]],
                    }
                    for p in pipelines
                ],
            )
            if hint:
                print(hint, file=sys.stderr)  # stdout holds the JSON only
            return 0
        if not pipelines:
            after = f" after {args.after!r}" if args.after else ""
            print(f"no pipelines{after} in the committer table ({target.display})", file=out)
            return 0
        order = [s.value for s in CheckpointState]
        for p in pipelines:
            counts = ", ".join(f"{s} {p['counts'][s]}" for s in order if s in p["counts"])
            print(
                f"pipeline {p['name']} ({p['mode']}{', ' + p['target'] if p['target'] else ''}): {counts}",
                file=out,
            )
            print(
                f"  {'seq':>4}  {'checkpoint':<20} {'state':<11} {'att':>3} {'rows':>10} {'bytes':>10}  error",
                file=out,
            )
            shown = newest[p["name"]]
            hidden = sum(p["counts"].values()) - len(shown)
            if hidden > 0:
                print(f"  ... {hidden} earlier checkpoints not shown (--limit {limit})", file=out)
            for c in shown:
                print(
                    f"  {c.sequence:>4}  {checkpoint_key_as_written(c.checkpoint_key):<20} {c.state.value:<11} {c.attempt:>3} "
                    f"{c.rows if c.rows is not None else '-':>10} {_fmt_bytes(c.bytes):>10}  "
                    f"{_why(c, waits, 120)}",
                    file=out,
                )
        if hint:
            print(hint, file=out)
        return 0


def _waiting(c: Any, waits: dict[str, tuple[str | None, Any]] | None) -> dict[str, Any] | None:
    from airflow_provider_walsink.core.store.queries import wait_status

    mode, first_open = (waits or {}).get(c.pipeline, (None, None))
    return wait_status(c, mode, first_open)


def _why(c: Any, waits: dict[str, tuple[str | None, Any]] | None, width: int = 80) -> str:
    """The error column: why a checkpoint waits or was refused (with the fix), else its error;
    first, OVERDUE when its pipeline's commit deadline passed (as the UI's badge)."""
    waiting = _waiting(c, waits)
    if waiting is None:
        text = c.error or ""
    else:
        text = waiting["reason"]
        if waiting["status"] != "blocked":
            text = f"{waiting['status']}: {text}"
    if _overdue(c):
        text = f"OVERDUE (commit due {_iso(c.commit_due_at)})" + (f"; {text}" if text else "")
    return _first_line(text or None, width)


def _overdue(c: Any) -> bool:
    from airflow_provider_walsink.core.store.deadlines import is_overdue
    from airflow_provider_walsink.core.store.records import utcnow

    return is_overdue(c, utcnow())


def _record_dict(c: Any, waits: dict[str, tuple[str | None, Any]] | None = None) -> dict[str, Any]:
    return {
        "pipeline": c.pipeline,
        "key": c.checkpoint_key,
        # The run's partition key as written (``münchen-ü`` for ``pk=m+C3+BCnchen-+C3+BC``);
        # None for a data-interval or explicit checkpoint key.
        "partition_key": partition_key_of_checkpoint(c.checkpoint_key),
        "sequence": c.sequence,
        "state": c.state.value,
        "attempt": c.attempt,
        "version": c.version,
        "supersedes_attempt_id": c.supersedes_attempt_id,
        "rows": c.rows,
        "bytes": c.bytes,
        "committables": c.committables,
        # Where its attempts are staged (None: a row from before walsink recorded it).
        "staging_root": c.staging_root,
        "lease_owner": c.lease_owner,
        "dag_id": c.dag_id,
        "run_id": c.run_id,
        "created_at": _iso(c.created_at),
        "updated_at": _iso(c.updated_at),
        "committed_at": _iso(c.committed_at),
        "error": c.error,
        # blocked (by which checkpoint) / refused (for what) / unblocked, with the fix; else None.
        "waiting": _waiting(c, waits),
        # Its pipeline's commit deadline (Airflow's deadline alert) passed and it is not COMMITTED.
        "commit_due_at": _iso(c.commit_due_at),
        "overdue": _overdue(c),
        # Where the current attempt's job runs when it can outlive the task ({runner, conn_id,
        # session_id}; never a secret), else None.
        "write_job": c.write_job,
    }


def cmd_checkpoints(args: argparse.Namespace, out: IO[str]) -> int:
    """Checkpoints filtered by state and by how long they have been in it, per pipeline in sequence order."""
    from airflow_provider_walsink.core.protocol.states import CheckpointState
    from airflow_provider_walsink.core.store.store import utcnow

    wanted = _states(args.state, "--state")
    excluded = _states(args.not_state, "--not-state")
    states = [
        s.value for s in CheckpointState if (not wanted or s.value in wanted) and s.value not in excluded
    ]
    older_than = _duration(args.older_than, "--older-than")
    target = resolve(args)
    with open_store(target) as store:
        _known_pipelines(store, args.pipeline)
        if args.pipeline:
            names = args.pipeline
        elif CheckpointState.COMMITTED.value in states:
            names = [p["name"] for p in store.pipelines(with_counts=False)]
        else:
            # Only the pipelines with a checkpoint in those states (few, found on the state
            # index), not one query per pipeline of thousands.
            names = store.pipelines_in_states(states)
        now = utcnow()
        found = []
        for name in names:
            if not states:
                break
            for c in store.checkpoints(name, states=states, limit=args.limit, descending=False):
                if older_than is None or now - c.updated_at >= older_than:
                    found.append(c)
        waits = store.wait_heads(list({c.pipeline for c in found}))
    # Sequence order, as the checkpoints commit (append) and as the UI lists them: the first
    # one stuck is the one blocking the rest. Ordering by time put a retried earlier
    # checkpoint after the later ones it blocks.
    found.sort(key=lambda c: (c.pipeline, c.sequence))
    query = _describe_query(wanted, excluded, args.older_than, args.pipeline)
    if args.json:
        _dump(
            out,
            {
                "query": query,
                "as_of": _iso(now),
                "database": target.display,
                "checkpoints": [
                    {**_record_dict(c, waits), "age_seconds": int((now - c.updated_at).total_seconds())}
                    for c in found
                ],
            },
        )
        return 0
    print(f"walsink checkpoints: {query}; as of {_iso(now)}", file=out)
    print(f"committer database: {target.display} ({target.source})", file=out)
    if not found:
        print("no checkpoints match", file=out)
        return 0
    rows = [
        (
            c.pipeline,
            str(c.sequence),
            checkpoint_key_as_written(c.checkpoint_key),
            c.state.value,
            str(c.attempt),
            _iso(c.updated_at) or "",
            _age(now - c.updated_at),
            f"{c.dag_id or '-'} / {c.run_id or '-'}",
            c.lease_owner or "-",
            _why(c, waits, 120) or "-",
        )
        for c in found
    ]
    header = ("pipeline", "seq", "checkpoint", "state", "att", "in state since", "for", "dag / run", "lease")
    _table(out, (*header, "error"), rows, "checkpoint")
    return 0


def _describe_query(
    wanted: list[str], excluded: list[str], older_than: str | None, pipelines: list[str] | None
) -> str:
    parts = []
    if wanted:
        parts.append("state " + " or ".join(wanted))
    if excluded:
        parts.append("state not " + " or ".join(excluded))
    if older_than:
        parts.append(f"unchanged for at least {older_than}")
    parts.append("pipeline " + ", ".join(pipelines) if pipelines else "all pipelines")
    return ", ".join(parts)


def _who(t: Any) -> str:
    """The Airflow task try that made a transition (dag / run / task / try), else the actor's name."""
    if t.dag_id:
        parts = [t.dag_id, t.run_id or "-", t.task_id or "-"]
        return " / ".join(parts) + (f" / try {t.try_number}" if t.try_number is not None else "")
    return t.actor or "-"


#: A transition's fields in ``history --json``, after its time.
_TRANSITION_FIELDS = "from_state to_state attempt actor dag_id run_id task_id try_number detail".split()


def cmd_history(args: argparse.Namespace, out: IO[str]) -> int:
    """One checkpoint's transitions, oldest first, as the UI's checkpoint page and the API show them."""
    target = resolve(args)
    with open_store(target) as store:
        _known_pipelines(store, [args.pipeline])
        # The key as given, else (a partition key as written) its encoded checkpoint key.
        candidates = checkpoint_keys_named_by(args.checkpoint)
        record = next(
            (found for key in candidates if (found := store.get(args.pipeline, key)) is not None), None
        )
        if record is None:
            tried = " or ".join(repr(key) for key in candidates)
            raise CliError(
                f"pipeline {args.pipeline!r} has no checkpoint {tried} "
                f"(see `walsink checkpoints --pipeline {args.pipeline}`)"
            )
        history = store.history(args.pipeline, record.checkpoint_key)
    if args.json:
        _dump(
            out,
            {
                "database": target.display,
                "checkpoint": _record_dict(record),
                "transitions": [
                    {"at": _iso(t.at), **{name: getattr(t, name) for name in _TRANSITION_FIELDS}}
                    for t in history
                ],
            },
        )
        return 0
    print(
        f"{record.pipeline}/{checkpoint_key_as_written(record.checkpoint_key)}: {record.state.value} (sequence {record.sequence}, "
        f"attempt {record.attempt}, version {record.version}); committer database {target.display}",
        file=out,
    )
    if record.error:
        print(f"error: {_first_line(record.error, 200)}", file=out)
    if _overdue(record):
        print(f"OVERDUE: its pipeline's commit deadline passed at {_iso(record.commit_due_at)}", file=out)
    if (job := describe_job_ref(record.write_job)) is not None:
        print(f"write job: {job}", file=out)
    if not history:
        # Retention (`walsink gc --history-retention`) may have compacted it away.
        print("no transitions recorded (trimmed by history retention?)", file=out)
        return 0
    rows = [
        (
            _iso(t.at) or "",
            t.from_state or "-",
            t.to_state,
            str(t.attempt),
            _who(t),
            _first_line(t.detail, 200) or "-",
        )
        for t in history
    ]
    _table(out, ("at", "from", "to", "att", "by (dag / run / task / try)", "detail"), rows, "transition")
    return 0
