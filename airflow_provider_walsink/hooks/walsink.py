"""Hook for the walsink committer database: Airflow connection → SQLAlchemy engine → store."""

from __future__ import annotations

import os
import threading
from typing import Any

from sqlalchemy.engine import URL

from airflow_provider_walsink.committer.store import CommitterStore
from airflow_provider_walsink.protocol.staging import StagingLayout

try:
    from airflow.sdk import BaseHook
except ImportError:  # pragma: no cover - Airflow < 3
    from airflow.hooks.base import BaseHook  # type: ignore[no-redef]

_DRIVERS = {"sqlite": "sqlite", "postgresql": "postgresql+psycopg2", "mysql": "mysql+pymysql"}
_stores: dict[str, CommitterStore] = {}
_stores_lock = threading.Lock()


def airflow_home() -> str:
    return os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow")


def default_database_url() -> str:
    """The embedded default: an SQLite file in the Airflow home."""
    return f"sqlite:///{os.path.join(airflow_home(), 'walsink', 'committer.db')}"


def default_staging_root() -> str:
    return os.path.join(airflow_home(), "walsink", "staging")


def store_for_url(url: str) -> CommitterStore:
    """One migrated store per database URL and process (tasks, triggerer, api-server)."""
    with _stores_lock:
        store = _stores.get(url)
        if store is None:
            store = _stores[url] = CommitterStore.from_url(url)
        return store


class WalsinkHook(BaseHook):
    """Reaches the committer table through an Airflow connection.

    Connection fields: *Backend* (``sqlite``, ``postgresql`` or ``mysql``),
    host, port, login, password and *Database* (for SQLite, the database
    file's path). The extra ``staging_root`` names where write phases stage
    their output (default: ``$AIRFLOW_HOME/walsink/staging``).

    If ``walsink_default`` does not exist, the embedded default is used: an
    SQLite file at ``$AIRFLOW_HOME/walsink/committer.db``.

    :param walsink_conn_id: the connection to the committer database.
    """

    conn_name_attr = "walsink_conn_id"
    default_conn_name = "walsink_default"
    conn_type = "walsink"
    hook_name = "walsink committer database"

    def __init__(self, walsink_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.walsink_conn_id = walsink_conn_id
        self._url: str | None = None
        self._extra: dict[str, Any] = {}

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        return {
            "hidden_fields": ["extra"],
            "relabeling": {"schema": "Database (file path for SQLite)"},
            "placeholders": {
                "host": "127.0.0.1 (leave empty for SQLite)",
                "schema": "walsink or /var/lib/airflow/walsink.db",
                "port": "5432 / 3306",
            },
        }

    def _load(self) -> None:
        if self._url is not None:
            return
        from airflow.exceptions import AirflowNotFoundException

        try:
            conn = self.get_connection(self.walsink_conn_id)
        except AirflowNotFoundException:
            if self.walsink_conn_id != self.default_conn_name:
                raise
            self._url = default_database_url()
            self.log.info("No connection %r: using the embedded default %s", self.walsink_conn_id, self._url)
            return
        self._extra = dict(conn.extra_dejson or {})
        self._url = url_from_connection(
            backend=self._extra.get("backend") or ("sqlite" if not conn.host else "postgresql"),
            host=conn.host,
            port=conn.port,
            login=conn.login,
            password=conn.password,
            database=conn.schema,
            url=self._extra.get("url"),
        )

    @property
    def sqlalchemy_url(self) -> str:
        self._load()
        assert self._url is not None
        return self._url

    @property
    def staging_root(self) -> str:
        self._load()
        return self._extra.get("staging_root") or default_staging_root()

    def get_store(self) -> CommitterStore:
        """The committer store (schema migrated on first use in this process)."""
        return store_for_url(self.sqlalchemy_url)

    def get_layout(self, staging_root: str | None = None) -> StagingLayout:
        return StagingLayout(staging_root or self.staging_root)

    def test_connection(self) -> tuple[bool, str]:
        try:
            store = CommitterStore.from_url(self.sqlalchemy_url, migrate=False)
            with store.engine.connect() as conn:
                conn.exec_driver_sql("SELECT 1")
            store.dispose()
        except Exception as e:
            return False, str(e)
        return True, "Connection successfully tested"


def url_from_connection(
    *,
    backend: str,
    host: str | None,
    port: int | None,
    login: str | None,
    password: str | None,
    database: str | None,
    url: str | None = None,
) -> str:
    """Build an SQLAlchemy URL from connection fields (or take ``url`` from the extra as is)."""
    if url:
        return url
    if backend not in _DRIVERS:
        raise ValueError(f"walsink connection backend must be one of {sorted(_DRIVERS)}, got {backend!r}")
    if backend == "sqlite":
        path = database or host
        if not path:
            return default_database_url()
        return f"sqlite:///{os.path.abspath(os.path.expanduser(path))}"
    return URL.create(
        _DRIVERS[backend],
        username=login or None,
        password=password or None,
        host=host or None,
        port=port or None,
        database=database or None,
    ).render_as_string(hide_password=False)
