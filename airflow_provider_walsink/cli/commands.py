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

This module is the parser and the entry point (``main``); each group of commands lives in a
module of its own beside it: ``status`` (status, checkpoints, history), ``abort``, ``reassign``
(reassign, reassign-group), ``db`` (db upgrade), ``gc``; ``database`` (where the database is)
and ``common`` (option checks, output) are shared by them.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import sys
import traceback
from collections.abc import Iterator, Sequence
from typing import IO, NoReturn

from airflow_provider_walsink import __version__
from airflow_provider_walsink.cli.abort import cmd_abort
from airflow_provider_walsink.cli.common import _dump, _first_line, _positive_int
from airflow_provider_walsink.cli.database import _DRIVER_EXTRAS, CliError
from airflow_provider_walsink.cli.db import cmd_db_upgrade
from airflow_provider_walsink.cli.gc import cmd_gc
from airflow_provider_walsink.cli.reassign import cmd_reassign, cmd_reassign_group
from airflow_provider_walsink.cli.status import (
    STATUS_LIMIT_ALL,
    STATUS_LIMIT_ONE,
    STATUS_PIPELINES,
    cmd_checkpoints,
    cmd_history,
    cmd_status,
)

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
    hist.add_argument(
        "checkpoint",
        help="checkpoint key, e.g. 20260101T000000Z, or a run's partition key as written (münchen-ü for "
        "pk=m+C3+BCnchen-+C3+BC)",
    )
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


#: Airflow's secrets masker, as the Task SDK and Airflow core each ship it.
_MASKER_LOGGERS = (
    "airflow.sdk._shared.secrets_masker.secrets_masker",
    "airflow._shared.secrets_masker.secrets_masker",
)


class _ShortSecretNotice(logging.Filter):
    """Drops Airflow's "Skipping masking for a secret as it's too short" warning.

    Reading a connection with a short password (or extra value) registers it with Airflow's
    log masker, which warns that it cannot mask it: on every command, as each is a new process.
    The warning is about log lines that could show the secret; this command logs none (a
    database URL is printed with its password hidden), so it has nothing a user could act on.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Skipping masking for a secret")


@contextlib.contextmanager
def _without_short_secret_notice() -> Iterator[None]:
    notice = _ShortSecretNotice()
    loggers = [logging.getLogger(name) for name in _MASKER_LOGGERS]
    for logger in loggers:
        logger.addFilter(notice)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(notice)


def _run(args: argparse.Namespace) -> int:
    with _results_stream() as out, _without_short_secret_notice():
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
