"""Engines for the committer database: SQLite by default, PostgreSQL or MySQL/MariaDB.

SQLite gets WAL mode and a busy timeout so several task processes can share
one file, and writes start with ``BEGIN IMMEDIATE`` so two writers never
deadlock upgrading a read lock.
"""

from __future__ import annotations

import os
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url

WRITE = "walsink_write"
SQLITE_BUSY_TIMEOUT_S = 30


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
    if parsed.get_backend_name() == "postgresql":
        kwargs.setdefault("connect_args", {}).setdefault("connect_timeout", 10)
    elif parsed.get_backend_name() in ("mysql", "mariadb"):
        kwargs.setdefault("connect_args", {}).setdefault("connect_timeout", 10)
    return create_engine(parsed, **kwargs)


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
