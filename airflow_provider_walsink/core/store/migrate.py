"""Create or upgrade the committer schema with Alembic, safely from many processes.

Many tasks may start at once against a fresh database; each takes a lock that
the database itself holds (an advisory lock on PostgreSQL, ``GET_LOCK`` on
MySQL/MariaDB, a file lock beside an SQLite file), checks the revision again
and only then runs the migrations.

On PostgreSQL the lock is transaction-scoped (``pg_advisory_xact_lock``) and the
check, every migration and the new revision are one transaction (PostgreSQL's DDL
is transactional), so ``walsink db upgrade`` and a task's first migration work
through a pooler in transaction mode (PgBouncer) as directly: the commit releases
the lock, and a session-level lock, which a pooler would leave on whichever server
connection took it, is never taken. MySQL/MariaDB keep ``GET_LOCK`` (session-level;
their DDL commits by itself): reach them directly.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, column, inspect, select, table, text

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
VERSION_TABLE = "walsink_alembic_version"
_PG_LOCK_KEY = 0x77616C73696E6B  # "walsink"
_MYSQL_LOCK_NAME = "walsink_migrate"
_LOCK_TIMEOUT_S = 300


def alembic_config(url: str | None = None) -> Config:
    """An Alembic config for the walsink migrations, without an ini file."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("version_table", VERSION_TABLE)
    if url:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def current_revision(conn: Connection) -> str | None:
    """The revision Alembic recorded in the version table (``None`` before the first migration).

    Read with SQLAlchemy, not through Alembic's ``MigrationContext``: configuring one logs two
    INFO lines ("Context impl ...", "Will assume ... DDL"), and every task opens the store, so
    every task log carried them although nothing was migrated.
    """
    if not inspect(conn).has_table(VERSION_TABLE):
        return None
    version = table(VERSION_TABLE, column("version_num"))
    heads = conn.execute(select(version.c.version_num)).scalars().all()
    if len(heads) > 1:  # walsink's migrations never branch: a hand-edited or foreign table
        raise RuntimeError(f"{VERSION_TABLE} holds {len(heads)} revisions {sorted(heads)}; expected one")
    return heads[0] if heads else None


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Bring the schema at ``engine`` to ``revision``; a no-op when it is there already."""
    head = head_revision()
    with engine.connect() as conn:
        if revision == "head" and current_revision(conn) == head:
            return
    with _migration_lock(engine) as conn:
        if revision == "head" and current_revision(conn) == head:
            return
        cfg = alembic_config()
        cfg.attributes["connection"] = conn
        with _without_context_lines():
            command.upgrade(cfg, revision)
        conn.commit()


class _ContextLines(logging.Filter):
    """Alembic's "Context impl SQLiteImpl." and "Will assume non-transactional DDL.": the
    dialect, on every migration; the "Running upgrade ..." lines say what changed."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(("Context impl ", "Will assume "))


@contextlib.contextmanager
def _without_context_lines() -> Iterator[None]:
    logger, quiet = logging.getLogger("alembic.runtime.migration"), _ContextLines()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


@contextlib.contextmanager
def _migration_lock(engine: Engine) -> Iterator[Connection]:
    backend = engine.url.get_backend_name()
    if backend == "sqlite":
        database = engine.url.database
        if not database or database == ":memory:":
            with engine.connect() as conn:
                yield conn
            return
        with open(os.path.abspath(database) + ".migrate-lock", "a+") as lock_file:
            fcntl.flock(lock_file, fcntl.LOCK_EX)
            try:
                with engine.connect() as conn:
                    yield conn
            finally:
                fcntl.flock(lock_file, fcntl.LOCK_UN)
        return
    with engine.connect() as conn:
        if backend == "postgresql":
            # Held until the caller's commit (or the rollback of a connection closed without one).
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_LOCK_KEY})
            yield conn
            return
        if backend in ("mysql", "mariadb"):
            got = conn.execute(
                text("SELECT GET_LOCK(:n, :t)"), {"n": _MYSQL_LOCK_NAME, "t": _LOCK_TIMEOUT_S}
            ).scalar()
            if got != 1:
                raise TimeoutError(f"could not take the walsink migration lock in {_LOCK_TIMEOUT_S}s")
            unlock = text("SELECT RELEASE_LOCK(:n)"), {"n": _MYSQL_LOCK_NAME}
        else:
            unlock = None
        conn.commit()
        try:
            yield conn
        finally:
            if unlock is not None:
                conn.rollback()
                conn.execute(*unlock)
                conn.commit()
