"""The ``walsink`` command: commit state, on-call queries and schema management from a shell.

``walsink status`` prints every checkpoint's state per pipeline;
``walsink checkpoints`` lists checkpoints filtered by state and age (for a ticket);
``walsink history`` shows one checkpoint's transitions (from, to, when, who, detail);
``walsink abort`` ends a stuck or unwanted checkpoint (fencing its committer out);
``walsink reassign`` / ``walsink reassign-group`` hand a pipeline to another DAG, a Kafka
consumer group to another pipeline;
``walsink db upgrade`` creates or upgrades the committer schema;
``walsink gc`` removes orphaned staging and trims old committer rows.

The database is ``--url``, else ``$WALSINK_DATABASE_URL``, else the Airflow
connection named by ``--conn-id`` (default ``walsink_default``, falling back
to the embedded SQLite file in ``$AIRFLOW_HOME``).

Contracts: results go to stdout and nothing else does (logs and warnings go to
stderr), so ``--json`` output always parses, errors included (``{"error": ...}``).
Every failure is one line on stderr and a non-zero exit status (1; 2 for a bad
command line); ``--debug`` adds the traceback. Only ``db upgrade`` creates a
database, and only the embedded default's directory is ever created: a mistyped
path is an error, not a new empty database.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import shlex
import sys
import traceback
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta
from typing import IO, TYPE_CHECKING, Any, NoReturn

from airflow_provider_walsink import __version__

if TYPE_CHECKING:
    from airflow_provider_walsink.core.staging.cleanup import StoreOpener

EXAMPLES = """\
examples:
  walsink status                                   every pipeline's checkpoints (connection walsink_default)
  walsink status --pipeline daily_events --json    one pipeline, as JSON
  walsink checkpoints --not-state COMMITTED --older-than 1h
                                                   what is stuck: paste the output into a ticket
  walsink checkpoints --state FAILED --state ABORTED --pipeline daily_events
  walsink history daily_events 20260101T000000Z    one checkpoint's transitions: when, who, why
  walsink abort daily_events 20260101T000000Z --reason "source file corrupt, INC-123"
  walsink --url postgresql+psycopg2://airflow@db/walsink db upgrade
  walsink --conn-id walsink_prod gc --dry-run      what gc would remove under the connection's staging root
  walsink gc --retention 2d --history-retention 30d

database drivers (SQLite needs none):
  PostgreSQL     pip install "airflow-provider-walsink[postgres]"   postgresql+psycopg2://...
                 pip install "airflow-provider-walsink[psycopg]"    postgresql+psycopg://...
  MySQL/MariaDB  pip install "airflow-provider-walsink[mysql]"      mysql+pymysql://...
"""

#: SQLAlchemy driver name -> (DBAPI module, the extra that installs it, the URL scheme to use).
_DRIVER_EXTRAS = {
    "mysql": ("MySQLdb", "mysql", "mysql+pymysql://"),
    "mysqldb": ("MySQLdb", "mysql", "mysql+pymysql://"),
    "pymysql": ("pymysql", "mysql", "mysql+pymysql://"),
    "mariadb": ("mariadb", "mysql", "mysql+pymysql://"),
    "psycopg2": ("psycopg2", "postgres", "postgresql+psycopg2://"),
    "postgresql": ("psycopg2", "postgres", "postgresql+psycopg2://"),
    "psycopg": ("psycopg", "psycopg", "postgresql+psycopg://"),
}


class CliError(Exception):
    """A failure the user can act on; printed as one line."""


# -- where the database is ----------------------------------------------------------------


class Target:
    """The committer database and staging root a command works on, and where they came from."""

    def __init__(
        self, url: str, source: str, staging_root: str | None, stores: StoreOpener | None = None
    ) -> None:
        self.url = url
        self.source = source  # "--url", "$WALSINK_DATABASE_URL", "connection X" or "embedded default"
        self.staging_root = staging_root
        #: Opens an object-store staging root with the connection's staging credentials
        #: (``staging_conn_id``); ``None`` without a connection: the default credential chain.
        self.stores = stores

    @property
    def display(self) -> str:
        from sqlalchemy.engine import make_url

        return make_url(self.url).render_as_string(hide_password=True)


def resolve(args: argparse.Namespace) -> Target:
    """Find the database (and, from a connection, the staging root) without touching it."""
    target = _resolve(args)
    args.resolved_url = target.url  # for _explain: a connection's URL names the database too
    return target


def _resolve(args: argparse.Namespace) -> Target:
    if args.url:
        return Target(args.url, "--url", None)
    if os.environ.get("WALSINK_DATABASE_URL"):
        return Target(os.environ["WALSINK_DATABASE_URL"], "$WALSINK_DATABASE_URL", None)
    # Outside a task the Task SDK reads connections only from environment variables and
    # external secrets backends; a shell tool (like `airflow connections get`) must also
    # read the metadata database, else a connection made in the UI is silently missed.
    # Set before the hook reads anything: url and staging root come from one read.
    os.environ.setdefault("_AIRFLOW_PROCESS_CONTEXT", "server")
    from airflow.exceptions import AirflowNotFoundException

    from airflow_provider_walsink.hooks.walsink import WalsinkHook, default_database_url

    hook = WalsinkHook(args.conn_id)
    try:
        url = hook.sqlalchemy_url
        staging_root = hook.staging_root
    except AirflowNotFoundException:
        raise CliError(f"no Airflow connection {args.conn_id!r} (see `airflow connections list`)") from None
    source = f"connection {args.conn_id}"
    if url == default_database_url() and not _connection_exists(hook):
        source = "embedded default"
    return Target(url, source, staging_root, stores=hook.get_staging_store)


def _connection_exists(hook: Any) -> bool:
    from airflow.exceptions import AirflowNotFoundException

    try:
        hook.get_connection(hook.walsink_conn_id)
    except AirflowNotFoundException:
        return False
    return True


def _check_sqlite_path(target: Target, *, create: bool) -> None:
    """Refuse a missing SQLite file (reads) or directory (``db upgrade``), so a mistyped
    path is an error instead of a new empty database; the embedded default's directory
    is the one ``db upgrade`` may create (task processes create it too)."""
    from sqlalchemy.engine import make_url

    url = make_url(target.url)
    if url.get_backend_name() != "sqlite":
        return
    database = url.database
    if not database or database == ":memory:" or database.startswith("file:"):
        return
    path = os.path.abspath(database)
    parent = os.path.dirname(path)
    if not create:
        if not os.path.isfile(path):
            where = "" if os.path.isdir(parent) else f" (directory {parent} does not exist)"
            raise CliError(
                f"no committer database at {path}{where}, from {target.source}; "
                "check the URL or connection, or create it with `walsink db upgrade`"
            )
        return
    if not os.path.isdir(parent):
        if target.source != "embedded default":
            raise CliError(
                f"directory {parent} does not exist (SQLite database {path}, from {target.source}); "
                "create it first: walsink creates no directories for a database path it is given"
            )
        os.makedirs(parent, exist_ok=True)


@contextlib.contextmanager
def open_store(target: Target, *, create: bool = False) -> Iterator[Any]:
    """A ``CommitterStore`` on ``target``, disposed of on exit; for reads (``create=False``) the
    schema must exist."""
    from sqlalchemy import inspect

    from airflow_provider_walsink.core.store.models import checkpoint_table
    from airflow_provider_walsink.core.store.store import CommitterStore

    _check_sqlite_path(target, create=create)
    store = CommitterStore.from_url(target.url, migrate=False)
    try:
        if not create:
            with store.engine.connect() as conn:
                present = inspect(conn).has_table(checkpoint_table.name)
            if not present:
                raise CliError(
                    f"no walsink committer schema in {target.display} (from {target.source}); "
                    "create it with `walsink db upgrade`"
                )
        yield store
    finally:
        store.dispose()


def _known_pipelines(store: Any, wanted: Sequence[str] | None) -> None:
    if not wanted:
        return
    unknown = [p for p in wanted if store.get_pipeline(p) is None]
    if unknown:
        known = [p["name"] for p in store.pipeline_page(limit=21)]  # a hint, not every pipeline
        listing = ", ".join(known[:20]) + (", ..." if len(known) > 20 else "") if known else "none"
        raise CliError(f"unknown pipeline {', '.join(map(repr, unknown))} (known: {listing})")


def _states(names: Sequence[str] | None, option: str) -> list[str]:
    from airflow_provider_walsink.core.protocol.states import CheckpointState

    valid = [s.value for s in CheckpointState]
    out = []
    for name in names or ():
        value = name.strip().upper()
        if value not in valid:
            raise CliError(f"{option}: unknown state {name!r} (one of {', '.join(valid)})")
        if value == CheckpointState.SUPERSEDED.value:
            # Only a checkpoint's earlier versions are SUPERSEDED (walsink_checkpoint_version);
            # the checkpoint itself is COMMITTED with its new version, so the filter would match nothing.
            raise CliError(
                f"{option}: SUPERSEDED is the state of a reprocessed checkpoint's earlier versions, never of "
                "a checkpoint (it is COMMITTED with its new version); the UI's checkpoint page lists them"
            )
        out.append(value)
    return out


def _duration(text: str | None, option: str) -> timedelta | None:
    from airflow_provider_walsink.core.commit.gc import parse_duration

    if text is None:
        return None
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise CliError(f"{option}: {exc}") from None


# -- output helpers ------------------------------------------------------------------------


def _fmt_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(n)


def _iso(ts: datetime | None) -> str | None:
    """Naive UTC (as stored) -> ``2026-01-01T00:00:00Z``."""
    return ts.replace(microsecond=0).isoformat() + "Z" if ts is not None else None


def _age(delta: timedelta) -> str:
    seconds = max(0, int(delta.total_seconds()))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{seconds:02d}s"


def _first_line(text: str | None, width: int = 80) -> str:
    return (text or "").strip().splitlines()[0][:width] if text and text.strip() else ""


def _table(out: IO[str], header: Sequence[str], rows: Sequence[Sequence[str]], noun: str) -> None:
    """``rows`` under ``header`` in left-aligned columns, then ``<n> <noun>s``."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    for row in (header, *rows):
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip(), file=out)
    print(f"{len(rows)} {noun}{'s' if len(rows) != 1 else ''}", file=out)


def _json_default(value: Any) -> Any:
    # A datetime that reached the output unformatted still says its zone (stored naive UTC).
    if isinstance(value, datetime):
        return _iso(value) if value.tzinfo is None else value.isoformat()
    return str(value)


def _dump(out: IO[str], data: Any) -> None:
    json.dump(data, out, indent=2, default=_json_default)
    out.write("\n")


# -- commands ------------------------------------------------------------------------------


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


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
                    f"  {c.sequence:>4}  {c.checkpoint_key:<20} {c.state.value:<11} {c.attempt:>3} "
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
    """The error column: why a checkpoint waits or was refused (with the fix), else its error."""
    waiting = _waiting(c, waits)
    if waiting is None:
        return _first_line(c.error, width)
    text = waiting["reason"]
    if waiting["status"] != "blocked":
        text = f"{waiting['status']}: {text}"
    return _first_line(text, width)


def _record_dict(c: Any, waits: dict[str, tuple[str | None, Any]] | None = None) -> dict[str, Any]:
    return {
        "pipeline": c.pipeline,
        "key": c.checkpoint_key,
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
            c.checkpoint_key,
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
        record = store.get(args.pipeline, args.checkpoint)
        if record is None:
            raise CliError(
                f"pipeline {args.pipeline!r} has no checkpoint {args.checkpoint!r} "
                f"(see `walsink checkpoints --pipeline {args.pipeline}`)"
            )
        history = store.history(args.pipeline, args.checkpoint)
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
        f"{record.pipeline}/{record.checkpoint_key}: {record.state.value} (sequence {record.sequence}, "
        f"attempt {record.attempt}, version {record.version}); committer database {target.display}",
        file=out,
    )
    if record.error:
        print(f"error: {_first_line(record.error, 200)}", file=out)
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


def cmd_db_upgrade(args: argparse.Namespace, out: IO[str]) -> int:
    target = resolve(args)
    with open_store(target, create=True) as store:
        store.migrate()
    if args.json:
        _dump(out, {"database": target.display, "source": target.source, "schema": "head"})
    else:
        print(f"committer schema is at head on {target.display}", file=out)
    return 0


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


def cmd_reassign(args: argparse.Namespace, out: IO[str]) -> int:
    """Hand a pipeline over to another DAG (the owner was renamed): the old DAG id is refused after."""
    target = resolve(args)
    with open_store(target) as store:
        _known_pipelines(store, [args.pipeline])
        previous = store.reassign_pipeline(args.pipeline, args.dag)
    if args.json:
        _dump(out, {"pipeline": args.pipeline, "dag_id": args.dag, "previous_dag_id": previous})
    else:
        print(f"pipeline {args.pipeline} belongs to DAG {args.dag} (was {previous or 'no DAG'})", file=out)
    return 0


def _group_cluster(groups: Sequence[dict[str, Any]], group_id: str, cluster: str | None) -> dict[str, Any]:
    """The recorded claim of ``group_id`` on ``cluster`` (as recorded, or a bare cluster id), or on
    the one cluster it is recorded on; a :class:`CliError` naming the recorded clusters otherwise."""
    clusters = ", ".join(g["cluster"] for g in groups) or "none"
    if not groups:
        raise CliError(
            f"no pipeline holds Kafka consumer group {group_id!r} (a pipeline claims its group at its first "
            "write task)"
        )
    if cluster is None:
        if len(groups) > 1:
            raise CliError(
                f"consumer group {group_id!r} is recorded on several clusters ({clusters}): pass --cluster"
            )
        return groups[0]
    for g in groups:
        if cluster in (g["cluster"], f"cluster:{g['cluster']}") or g["cluster"] == f"cluster:{cluster}":
            return g
    raise CliError(
        f"consumer group {group_id!r} is not recorded on cluster {cluster!r} (it is on: {clusters})"
    )


def cmd_reassign_group(args: argparse.Namespace, out: IO[str]) -> int:
    """Hand a Kafka consumer group over to another pipeline (or list who holds it)."""
    from airflow_provider_walsink.core.protocol.identifiers import validate_identifier

    if not args.list and not args.pipeline:
        raise CliError("pass --pipeline NEW (the pipeline that takes the group over), or --list")
    if args.pipeline:
        validate_identifier(args.pipeline, "pipeline id")
    target = resolve(args)
    with open_store(target) as store:
        groups = store.consumer_groups(args.group)
        if args.list:
            rows = [{**g, "claimed_at": _iso(g["claimed_at"])} for g in groups]
            if args.json:
                _dump(out, rows)
            else:
                for g in rows:
                    print(
                        f"{g['group_id']} on {g['cluster']}: pipeline {g['pipeline']} (since {g['claimed_at']})",
                        file=out,
                    )
            return 0
        found = _group_cluster(groups, args.group, args.cluster)
        previous = store.reassign_consumer_group(found["cluster"], args.group, args.pipeline)
        registered = store.get_pipeline(args.pipeline) is not None
    if args.json:
        _dump(out, {"group_id": args.group, "cluster": found["cluster"], "pipeline": args.pipeline,
                    "previous_pipeline": previous, "registered": registered})  # fmt: skip
    else:
        note = (
            ""
            if registered
            else f" (pipeline {args.pipeline} is not registered yet: its first write task plans with the group)"
        )
        print(f"consumer group {args.group} on {found['cluster']} belongs to pipeline {args.pipeline} "
              f"(was {previous}){note}", file=out)  # fmt: skip
    return 0


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


# -- plumbing ------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """Command-line errors as one line (and as JSON under ``--json``), exit status 2."""

    json_errors = False

    def error(self, message: str) -> NoReturn:
        # The same `walsink: error:` prefix as every other failure, naming the subcommand
        # (self.prog is e.g. "walsink abort"), so scripts and people match one form.
        command = self.prog.removeprefix("walsink").strip()
        where = f"{command}: " if command else ""
        _report(
            f"walsink: error: {where}{message} (see `{self.prog} --help`)",
            as_json=_Parser.json_errors,
            out=sys.stdout,
        )
        raise SystemExit(2)


def _common() -> argparse.ArgumentParser:
    # On every subcommand too (`walsink status --json` and `walsink --json status`);
    # SUPPRESS keeps a subcommand from resetting what was given before it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default=argparse.SUPPRESS, help="SQLAlchemy URL of the committer database")
    common.add_argument(
        "--conn-id", default=argparse.SUPPRESS, help="Airflow connection (default walsink_default)"
    )
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON")
    common.add_argument(
        "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="log to stderr"
    )
    common.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS, help="tracebacks with errors"
    )
    return common


def build_parser() -> argparse.ArgumentParser:
    # A fresh parent per parser: parents share their action objects, so one set_defaults
    # below would otherwise give every subcommand a default that overrides the global flag.
    common = _common()
    parser = _Parser(
        prog="walsink",
        description=__doc__.split("\n\n")[0].replace("``", ""),  # reST literals read as plain text
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[common],
    )
    parser.set_defaults(url=None, conn_id="walsink_default", json=False, verbose=False, debug=False)
    parser.add_argument(
        "--version", action="version", version=f"walsink {__version__} (airflow-provider-walsink)"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    status = sub.add_parser("status", parents=[_common()], help="commit state of every checkpoint")
    status.add_argument("--pipeline", help="only this pipeline")
    status.add_argument(
        "--limit",
        type=_positive_int,
        default=None,
        help=f"newest checkpoints shown per pipeline (default {STATUS_LIMIT_ONE} with --pipeline, "
        f"{STATUS_LIMIT_ALL} for every pipeline)",
    )
    status.add_argument(
        "--pipelines",
        type=_positive_int,
        default=STATUS_PIPELINES,
        help=f"without --pipeline: pipelines shown per page, in name order (default {STATUS_PIPELINES}); "
        "a last line says how to see the next page",
    )
    status.add_argument(
        "--after", metavar="NAME", help="without --pipeline: only pipelines whose name sorts after NAME"
    )
    status.set_defaults(func=cmd_status)

    cps = sub.add_parser(
        "checkpoints",
        parents=[_common()],
        help="checkpoints filtered by state and age, for a ticket",
        description="Checkpoints filtered by state and by how long they have been in it "
        "(time since their last change), per pipeline in sequence order, with their DAG run, lease "
        "and error.",
        epilog="example: walsink checkpoints --not-state COMMITTED --older-than 1h",
    )
    cps.add_argument("--state", action="append", help="only this state (repeatable)")
    cps.add_argument("--not-state", action="append", help="not this state (repeatable)")
    cps.add_argument(
        "--older-than", help="unchanged for at least this long, with a unit: 90s, 15m, 12h, 7d, 2w"
    )
    cps.add_argument("--pipeline", action="append", help="only this pipeline (repeatable)")
    cps.add_argument(
        "--limit", type=_positive_int, default=10000, help="checkpoints read per pipeline (default 10000)"
    )
    cps.set_defaults(func=cmd_checkpoints)

    hist = sub.add_parser(
        "history",
        parents=[_common()],
        help="one checkpoint's transitions: from, to, when, who, detail",
        description="Every recorded transition of one checkpoint, oldest first: from and to which "
        "state, when (UTC), who (the Airflow DAG, run, task and try, else the actor) and the detail "
        "(an error, an abort's reason, an audit's verdict), as the UI's checkpoint page shows them.",
        epilog="example: walsink history daily_events 20260101T000000Z",
    )
    hist.add_argument("pipeline", help="pipeline id")
    hist.add_argument("checkpoint", help="checkpoint key, e.g. 20260101T000000Z")
    hist.set_defaults(func=cmd_history)

    db = sub.add_parser("db", parents=[_common()], help="committer schema")
    db_sub = db.add_subparsers(dest="db_command", required=True, metavar="COMMAND", parser_class=_Parser)
    db_sub.add_parser(
        "upgrade", parents=[_common()], help="create or upgrade the schema (Alembic)"
    ).set_defaults(func=cmd_db_upgrade)

    abort = sub.add_parser(
        "abort",
        parents=[_common()],
        help="end a stuck or unwanted checkpoint's current attempt",
        description="Mark a checkpoint ABORTED: its current attempt is never published. A committer "
        "holding it (COMMITTING, even alive) is fenced out first; what the attempt had published is "
        "rolled back and its staging removed; later checkpoints of an append pipeline are no longer "
        "blocked by it, and a later run of its write task starts a fresh attempt. Refused when the "
        "target already holds the attempt (then re-run its commit task). Recorded in the checkpoint's "
        "history and, when reachable, in Airflow's audit log (event walsink.abort).",
    )
    abort.add_argument("pipeline", help="pipeline id")
    abort.add_argument("checkpoint", help="checkpoint key, e.g. 20260101T000000Z")
    abort.add_argument("--reason", required=True, help="why (recorded in the checkpoint's history)")
    abort.add_argument(
        "--staging-root",
        help="only for a checkpoint whose row records no staging root (written before walsink recorded "
        "it); default: the connection's staging root. A recorded root always wins",
    )
    abort.add_argument(
        "--target",
        help="the pipeline's target URI, if it was registered without one (default: the registered one)",
    )
    abort.add_argument(
        "--manifest-lost",
        action="store_true",
        help="the sealed manifest's staging is gone for good: abort a checkpoint that may have published "
        "without checking whether the target holds its attempt (without this, such an abort is refused "
        "when the manifest cannot be read, usually a wrong --staging-root)",
    )
    abort.set_defaults(func=cmd_abort)

    reassign = sub.add_parser(
        "reassign",
        parents=[_common()],
        help="hand a pipeline over to another DAG (its DAG was renamed)",
        description="A pipeline id belongs to the DAG that first registered it; another DAG declaring it "
        "is refused. When that DAG was renamed, hand the pipeline over to the new DAG id.",
        epilog="example: walsink reassign daily_events --dag daily_events_v2",
    )
    reassign.add_argument("pipeline", help="pipeline id")
    reassign.add_argument("--dag", required=True, help="the DAG id that owns the pipeline from now on")
    reassign.set_defaults(func=cmd_reassign)

    regroup = sub.add_parser(
        "reassign-group",
        parents=[_common()],
        help="hand a Kafka consumer group over to another pipeline (or list who holds it)",
        description="A Kafka consumer group belongs to the first pipeline that plans with it on its "
        "cluster; another pipeline naming it is refused at its write task, and a pipeline whose group "
        "was handed over is refused to send offsets after its commits. Hand the group over to the "
        "pipeline that reports its lag from now on (a renamed pipeline, say). A send of the previous "
        "owner in flight finishes first.",
        epilog="example: walsink reassign-group walsink_kafka_append --pipeline kafka_events_v2",
    )
    regroup.add_argument("group", help="the consumer group id (the source's group_id)")
    regroup.add_argument(
        "--cluster",
        help="the Kafka cluster as recorded (cluster:<ClusterId> or bootstrap.servers:<list>, as --list and "
        "the refusals print it; a bare cluster id works too); needed only when the group id is recorded on "
        "several clusters",
    )
    regroup.add_argument("--pipeline", help="the pipeline id that owns the group from now on")
    regroup.add_argument(
        "--list", action="store_true", help="only list which pipeline holds the group, per cluster"
    )
    regroup.set_defaults(func=cmd_reassign_group)

    gc = sub.add_parser("gc", parents=[_common()], help="remove orphaned staging and trim old committer rows")
    gc.add_argument(
        "--staging-root",
        help="default: the connection's staging root; the staging roots recorded on checkpoint rows are "
        "walked too",
    )
    gc.add_argument(
        "--retention", default="1d", help="minimum age of staging garbage (default 1d; 90s/15m/12h/7d)"
    )
    gc.add_argument(
        "--history-retention", help="also trim committed rows and history older than this (e.g. 30d)"
    )
    gc.add_argument("--pipeline", action="append", help="only this pipeline (repeatable)")
    gc.add_argument("--dry-run", action="store_true", help="report, remove nothing")
    gc.set_defaults(func=cmd_gc)
    return parser


@contextlib.contextmanager
def _results_stream() -> Iterator[IO[str]]:
    """Yield the stream for results; anything else written to stdout meanwhile (a library's
    log handler, a print) lands on stderr. At the file-descriptor level when stdout is a
    real file, so handlers that captured ``sys.stdout`` earlier are diverted too."""
    sys.stdout.flush()
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):
        fd = None  # e.g. pytest's capsys: a Python-level redirect is enough
    if fd is None:
        out = sys.stdout
        with contextlib.redirect_stdout(sys.stderr):
            yield out
        return
    saved = os.dup(fd)
    out = os.fdopen(saved, "w", encoding=sys.stdout.encoding or "utf-8", closefd=False)
    os.dup2(sys.stderr.fileno(), fd)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield out
    finally:
        out.flush()
        sys.stdout.flush()
        os.dup2(saved, fd)
        os.close(saved)


def _report(message: str, *, as_json: bool, out: IO[str]) -> None:
    print(message, file=sys.stderr)
    if as_json:
        _dump(out, {"error": message})


def _explain(exc: BaseException, args: argparse.Namespace) -> str:
    """One line naming the problem (no traceback) for any failure."""
    from sqlalchemy import exc as sa_exc
    from sqlalchemy.engine import make_url

    from airflow_provider_walsink.core.protocol.errors import WalsinkError

    if isinstance(exc, (CliError, WalsinkError)):
        return str(exc)  # walsink's own errors name the problem (a refused transition, a bad manifest)
    url = (
        getattr(args, "url", None)
        or os.environ.get("WALSINK_DATABASE_URL")
        or getattr(args, "resolved_url", None)
        or ""
    )
    try:
        parsed = make_url(url) if url else None
        shown = parsed.render_as_string(hide_password=True) if parsed else "the committer database"
    except sa_exc.ArgumentError:
        parsed, shown = None, "the committer database"
    if isinstance(exc, sa_exc.ArgumentError):
        return f"invalid database URL {url!r}: {exc} (e.g. postgresql+psycopg2://user@host/db, sqlite:////abs/path.db)"
    if isinstance(exc, (sa_exc.NoSuchModuleError, ImportError)):
        driver = (parsed.get_driver_name() if parsed else "") or ""
        if driver in _DRIVER_EXTRAS or (parsed and parsed.get_backend_name() in _DRIVER_EXTRAS):
            module, extra, scheme = _DRIVER_EXTRAS.get(driver) or _DRIVER_EXTRAS[parsed.get_backend_name()]
            return (
                f"no database driver for {shown}: module {module!r} is not installed; "
                f'pip install "airflow-provider-walsink[{extra}]" and use a {scheme} URL'
            )
        return f"cannot load what {shown} needs: {exc}"
    if isinstance(exc, sa_exc.DBAPIError):
        from airflow_provider_walsink.core.store.engine import missing_database_hint

        if getattr(args, "url", None):
            upgrade = "walsink --url <the same URL> db upgrade"
        elif os.environ.get("WALSINK_DATABASE_URL"):
            upgrade = "walsink db upgrade"  # the variable names the database again
        else:
            upgrade = f"walsink --conn-id {args.conn_id} db upgrade"
        hint = missing_database_hint(exc, parsed, upgrade=upgrade) if parsed is not None else None
        if hint is not None:
            return hint  # names the database and the fix: create it, then `walsink db upgrade`
        detail = _first_line(str(getattr(exc, "orig", None) or exc), 200)
        return f"cannot use {shown}: {detail}"
    if isinstance(exc, sa_exc.SQLAlchemyError):
        return f"database error on {shown}: {_first_line(str(exc), 200)}"
    if isinstance(exc, (OSError, ValueError)):
        return f"{type(exc).__name__}: {_first_line(str(exc), 200)}"
    return (
        f"unexpected {type(exc).__name__}: {_first_line(str(exc), 200)} (run with --debug for the traceback)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``walsink`` command; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    _Parser.json_errors = "--json" in argv
    # Parsed before stdout is diverted: --help and --version print to stdout.
    args = build_parser().parse_args(argv)
    # Airflow configures its logging when first imported: quiet unless asked, and as verbose as
    # asked whatever the environment says. Restored afterwards, so a caller's later
    # subprocesses (main() called in-process) do not inherit it.
    saved_level = os.environ.get(_AIRFLOW_LOG_LEVEL)
    if args.debug or args.verbose:
        os.environ[_AIRFLOW_LOG_LEVEL] = "DEBUG" if args.debug else "INFO"
    else:
        os.environ.setdefault(_AIRFLOW_LOG_LEVEL, "WARNING")
    try:
        return _run(args)
    finally:
        if saved_level is None:
            os.environ.pop(_AIRFLOW_LOG_LEVEL, None)
        else:
            os.environ[_AIRFLOW_LOG_LEVEL] = saved_level


_AIRFLOW_LOG_LEVEL = "AIRFLOW__LOGGING__LOGGING_LEVEL"


def _run(args: argparse.Namespace) -> int:
    with _results_stream() as out:
        level = logging.INFO if args.verbose or args.debug else logging.WARNING
        logging.basicConfig(level=level, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
        for name in ("alembic", "airflow_provider_walsink"):
            logging.getLogger(name).setLevel(level)
        try:
            return args.func(args, out)
        except KeyboardInterrupt:
            _report("walsink: interrupted", as_json=args.json, out=out)
            return 130
        except Exception as exc:  # noqa: BLE001 - every failure becomes one line
            if args.debug:
                traceback.print_exc(file=sys.stderr)
            _report(f"walsink: error: {_explain(exc, args)}", as_json=args.json, out=out)
            return 1


if __name__ == "__main__":
    sys.exit(main())
