"""Where the database is (``--url``, ``$WALSINK_DATABASE_URL``, or an Airflow connection), and
the committer store opened on it; :class:`CliError`, the failure a user can act on.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_provider_walsink.core.staging.cleanup import StoreOpener


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
