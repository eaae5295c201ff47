"""Engines for the committer database: SQLite by default, PostgreSQL or MySQL/MariaDB.

SQLite gets WAL mode and a busy timeout so several task processes can share
one file, and writes start with ``BEGIN IMMEDIATE`` so two writers never
deadlock upgrading a read lock.

A server database's engine keeps **one** idle connection (``pool_size=1``): a commit task
uses the database one transaction at a time, so it holds one connection, and hundreds of
tasks need hundreds of connections, not two or five each. Connections beyond it (threads of an
api-server) are opened when needed and closed when given back, never kept idle; the triggerer's
pool of durability checks, whose threads use the database all the time, keeps one per thread
(:func:`keep_idle_connections`).
:func:`shared_engine` is the one engine per URL and process, shared by the committer store and
an Iceberg SQL catalog on the same database (``core/targets/iceberg/catalog.py``).

Every transaction stands alone (no session state, no lock held across transactions), so the
committer works behind a pooler in transaction mode (PgBouncer): psycopg 3's server-side
prepared statements, which belong to one server session, are turned off.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url

WRITE = "walsink_write"
SQLITE_BUSY_TIMEOUT_S = 30
#: Idle connections a server database's engine keeps (module docstring).
POOL_SIZE = 1
#: Connections opened beyond it at once (closed when given back); a single-threaded task never does.
MAX_OVERFLOW = 10

#: Idle connections the engines this process creates from now on keep (:func:`keep_idle_connections`).
_idle_connections = POOL_SIZE

_shared: dict[str, Engine] = {}
_shared_lock = threading.Lock()


def create_committer_engine(url: str, **kwargs: Any) -> Engine:
    """Create an engine for the committer table at ``url`` (any SQLAlchemy URL)."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database
        if database and database != ":memory:" and not database.startswith("file:"):
            os.makedirs(os.path.dirname(os.path.abspath(database)) or ".", exist_ok=True)
        connect_args = {"timeout": SQLITE_BUSY_TIMEOUT_S, **kwargs.pop("connect_args", {})}
        engine = create_engine(parsed, connect_args=connect_args, **kwargs)
        _configure_sqlite(engine)
        return engine
    # No ping per checkout (a round trip each): the store retries every call
    # on a dropped connection instead (committer.retry.retrying).
    kwargs.setdefault("pool_pre_ping", False)
    kwargs.setdefault("pool_size", _idle_connections)
    kwargs.setdefault("max_overflow", MAX_OVERFLOW)
    connect_args = kwargs.setdefault("connect_args", {})
    if parsed.get_backend_name() in ("postgresql", "mysql", "mariadb"):
        connect_args.setdefault("connect_timeout", 10)
    if parsed.get_backend_name() == "postgresql" and parsed.get_driver_name() == "psycopg":
        # psycopg 3 prepares a statement on the server after its 5th run; a pooler in transaction
        # mode gives the next transaction another server session, which has no such statement.
        connect_args.setdefault("prepare_threshold", None)
    return create_engine(parsed, **kwargs)


def keep_idle_connections(n: int) -> None:
    """Let the server-database engines this process creates from now on keep up to ``n`` idle
    connections (default :data:`POOL_SIZE`, one). For a process whose threads use the database at
    once all the time, the triggerer's pool of durability checks (``triggers/watch.py``): with
    one kept, every check beyond the first would open a connection and close it again (a server
    process started and ended per check), and the checks would wait on that instead of the
    database. A task process never calls it: it holds one connection."""
    global _idle_connections
    _idle_connections = max(POOL_SIZE, n)


def shared_engine(url: str | URL) -> Engine:
    """This process's one engine for the database at ``url`` (:func:`create_committer_engine`).

    The committer store of every task in the process and an Iceberg SQL catalog on the same
    database share it, and with it its one pooled connection. URLs that differ only in how the
    driver is named (``postgresql://`` and ``postgresql+psycopg2://``) share one engine.
    """
    parsed = make_url(url) if isinstance(url, str) else url
    parsed = parsed.set(drivername=f"{parsed.get_backend_name()}+{parsed.get_driver_name()}")
    key = parsed.render_as_string(hide_password=False)
    with _shared_lock:
        engine = _shared.get(key)
        if engine is None:
            engine = _shared[key] = create_committer_engine(key)
        return engine


def _forget_parents_connections() -> None:
    """In a forked child: the parent's pooled connections are the parent's (a shared socket would
    interleave both processes' statements); the child opens its own."""
    global _shared_lock  # noqa: PLW0603 - a lock another thread held at the fork stays held
    _shared_lock = threading.Lock()
    for engine in _shared.values():
        engine.dispose(close=False)


os.register_at_fork(after_in_child=_forget_parents_connections)


def missing_database_hint(
    exc: BaseException, url: str | URL, *, upgrade: str = "walsink db upgrade"
) -> str | None:
    """What to do when ``exc`` says that the database ``url`` names does not exist, else None.

    PostgreSQL and MySQL/MariaDB refuse the connection ("database ... does not exist",
    "Unknown database"); walsink never creates a server database (only the SQLite file), so
    the message names both steps: create it, then create the schema with ``upgrade`` (the
    command to run, e.g. with the task's ``--conn-id``).
    """
    parsed = make_url(url) if isinstance(url, str) else url
    name = parsed.database
    backend = parsed.get_backend_name()
    if not name or backend not in ("postgresql", "mysql", "mariadb"):
        return None
    text = str(getattr(exc, "orig", None) or exc)
    if backend == "postgresql":
        missing = f'database "{name}" does not exist' in text
        how = f'`createdb -h {parsed.host or "localhost"} -p {parsed.port or 5432}{f" -U {parsed.username}" if parsed.username else ""} {name}`, or CREATE DATABASE "{name}"'
    else:
        missing = f"Unknown database '{name}'" in text
        how = f"CREATE DATABASE `{name}`"
    if not missing:
        return None
    where = parsed.render_as_string(hide_password=True)
    return (
        f"the committer database {name!r} does not exist on {where}: walsink creates no server "
        f"databases; create it ({how}) as a user allowed to, then run `{upgrade}` to create the "
        "committer schema"
    )


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event emit BEGIN itself (pysqlite's own
        # implicit BEGIN cannot be made IMMEDIATE).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_S * 1000}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get(WRITE) else "BEGIN")
