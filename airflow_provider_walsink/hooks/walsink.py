"""Hook for the walsink committer database: Airflow connection → SQLAlchemy engine → store."""

from __future__ import annotations

import copy
import os
import threading
from collections.abc import Mapping
from typing import Any

from airflow.sdk import BaseHook
from sqlalchemy.engine import URL

from airflow_provider_walsink.core.commit.preflight import check_staging
from airflow_provider_walsink.core.commit.write_phase import WritePhase
from airflow_provider_walsink.core.sources import Source, source_from
from airflow_provider_walsink.core.spark.args import storage_env
from airflow_provider_walsink.core.staging.layout import StagingLayout
from airflow_provider_walsink.core.staging.object_store import StagingStore
from airflow_provider_walsink.core.staging.probe import local_root_status
from airflow_provider_walsink.core.store.engine import missing_database_hint
from airflow_provider_walsink.core.store.errors import CommitterDatabaseError
from airflow_provider_walsink.core.store.store import CommitterStore
from airflow_provider_walsink.hooks.azure_staging import (
    AZURE_CONN_TYPES,
    DEFAULT_AZURE_CONN_ID,
    is_azure_root,
)
from airflow_provider_walsink.hooks.connections import ConnectionNotFoundError, WrongConnectionTypeError
from airflow_provider_walsink.hooks.form import CONN_TYPE, HOOK_NAME, UI_FIELD_BEHAVIOUR
from airflow_provider_walsink.hooks.staging import (
    DEFAULT_AWS_CONN_ID,
    DEFAULT_GCP_CONN_ID,
    GCP_CONN_TYPE,
    StagingConnectionError,
    StagingCredentials,
    is_gcs_root,
    is_object_store_root,
    is_s3_root,
    staging_connection,
)
from airflow_provider_walsink.hooks.store_connections import options_from_connection

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
    """One migrated store per database URL and process (tasks, triggerer, api-server), on the
    process's one engine for the URL, which an Iceberg SQL catalog on the same database shares."""
    with _stores_lock:
        store = _stores.get(url)
        if store is None:
            store = _stores[url] = CommitterStore.shared(url)
        return store


def forget_store_for_url(url: str) -> None:
    """Close the pooled connections of the store :func:`store_for_url` keeps for ``url`` and
    forget it (its connection now names another database). A caller still holding it keeps a
    working store: SQLAlchemy opens a new pool on its next use."""
    with _stores_lock:
        store = _stores.pop(url, None)
    if store is not None:
        store.dispose()


class WalsinkHook(BaseHook):
    """Reaches the committer table through an Airflow connection.

    Connection fields: *Backend* (``sqlite``, ``postgresql`` or ``mysql``),
    host, port, login, password and *Database* (for SQLite, the database
    file's path), or a whole *Database URL* that wins over them. The extra
    ``staging_root`` names where write phases stage their output (default:
    ``$AIRFLOW_HOME/walsink/staging``): a local or mounted path, or an object
    store (``s3://bucket/prefix``, ``gs://bucket/prefix``,
    ``abfss://container@account.dfs.core.windows.net/prefix``). The extra ``staging_conn_id`` names the
    connection whose credentials reach an ``s3://`` root (an ``aws``
    connection; default ``aws_default`` when it exists, else the default
    credential chain; ``""``: the default credential chain, explicitly), a ``gs://`` root (a
    ``google_cloud_platform`` connection; default ``google_cloud_default``, which must exist) or an
    ``abfss://`` root (a ``wasb`` or ``adls`` connection; default ``wasb_default``, which must exist). Every
    field the hook reads is on the connection form (:data:`CONN_FIELDS`,
    :data:`UI_FIELD_BEHAVIOUR`).

    If ``walsink_default`` does not exist, the embedded default is used: an
    SQLite file at ``$AIRFLOW_HOME/walsink/committer.db``.

    :param walsink_conn_id: the connection to the committer database.
    """

    conn_name_attr = "walsink_conn_id"
    default_conn_name = "walsink_default"
    conn_type = CONN_TYPE
    hook_name = HOOK_NAME

    def __init__(self, walsink_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.walsink_conn_id = walsink_conn_id
        self._url: str | None = None
        self._extra: dict[str, Any] = {}
        self._said_default_staging = False
        self._said_credentials: set[str | None] = set()

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """The form's hidden fields, labels and placeholders (Airflow 3 takes them from
        provider info, which is built from the same :data:`UI_FIELD_BEHAVIOUR`)."""
        return copy.deepcopy(UI_FIELD_BEHAVIOUR)

    def _field(self, name: str) -> Any:
        # Forms store custom fields under their bare name; older ones under extra__<type>__<name>.
        return self._extra.get(name) or self._extra.get(f"extra__{self.conn_type}__{name}")

    def _load(self) -> None:
        if self._url is not None:
            return
        from airflow.exceptions import AirflowNotFoundException

        try:
            conn = self.get_connection(self.walsink_conn_id)
        except AirflowNotFoundException:
            if self.walsink_conn_id != self.default_conn_name:
                # A typo, not a reason to fall back on the embedded default: said with the fix.
                raise ConnectionNotFoundError(
                    f"connection {self.walsink_conn_id!r} (walsink_conn_id) does not exist: create it as a "
                    f"{self.conn_type!r} connection to the committer database (docs/production.md), or fix "
                    "the name"
                ) from None
            self._url = default_database_url()
            self.log.info("No connection %r: using the embedded default %s", self.walsink_conn_id, self._url)
            return
        if conn.conn_type != self.conn_type:
            # Another kind (a target's postgres connection, a generic one) would be read as a
            # committer database: the committer table created in a target database, or the
            # embedded default used under another name.
            raise WrongConnectionTypeError(
                f"connection {self.walsink_conn_id!r} (walsink_conn_id) is of type {conn.conn_type!r}, not "
                f"{self.conn_type!r}: the committer table needs a walsink connection (docs/production.md)"
            )
        self._extra = dict(conn.extra_dejson or {})
        backend = self._field("backend") or ("sqlite" if not conn.host else "postgresql")
        if backend == "sqlite" and not self._field("url") and not conn.schema and not conn.host:
            # A walsink connection naming no database file: the embedded default, said so.
            self.log.info(
                "Connection %r names no SQLite database file: using the embedded default %s",
                self.walsink_conn_id,
                default_database_url(),
            )
        self._url = url_from_connection(
            backend=backend,
            host=conn.host,
            port=conn.port,
            login=conn.login,
            password=conn.password,
            database=conn.schema,
            url=self._field("url"),
        )

    @property
    def sqlalchemy_url(self) -> str:
        self._load()
        assert self._url is not None
        return self._url

    @property
    def staging_root(self) -> str:
        self._load()
        configured = self._field("staging_root")
        if configured:
            return configured
        if not self._said_default_staging:
            self._said_default_staging = True
            self.log.info(
                "Connection %r sets no staging_root: staging under the default %s",
                self.walsink_conn_id,
                default_staging_root(),
            )
        return default_staging_root()

    def get_store(self) -> CommitterStore:
        """The committer store (schema migrated on first use in this process).

        Raises:
            CommitterDatabaseError: the database the connection names does not exist (the
                message says to create it, then run ``walsink db upgrade``).
        """
        from sqlalchemy.exc import DBAPIError

        url = self.sqlalchemy_url
        try:
            return store_for_url(url)
        except DBAPIError as exc:
            hint = missing_database_hint(
                exc, url, upgrade=f"walsink --conn-id {self.walsink_conn_id} db upgrade"
            )
            if hint is None:
                raise
            # Not chained: the task log shows what to do, not the driver's traceback.
            raise CommitterDatabaseError(f"connection {self.walsink_conn_id!r}: {hint}") from None

    def get_layout(self, staging_root: str | None = None) -> StagingLayout:
        """The local layout of ``staging_root`` (default: the connection's); ``ValueError`` for an
        object-store URI, which :meth:`get_staging_store` opens instead."""
        return StagingLayout(staging_root or self.staging_root)

    def staging_conn_id(self, staging_root: str) -> str | None:
        """The connection whose credentials open ``staging_root``, or ``None`` (default chain).

        The walsink connection's extra ``staging_conn_id`` when it has the key (``""``
        or ``null``: the default credential chain, refused for ``gs://`` and ``abfss://`` by
        :meth:`get_staging_credentials`); else, for an ``s3://`` root, ``aws_default`` if that
        connection exists; for a ``gs://`` root, ``google_cloud_default``; for an ``abfss://``
        root, ``wasb_default``. Local roots need none.
        """
        self._load()
        if not is_object_store_root(staging_root):
            return None
        for key in ("staging_conn_id", f"extra__{self.conn_type}__staging_conn_id"):
            if key in self._extra:
                return self._extra[key] or None
        if is_gcs_root(staging_root):
            return DEFAULT_GCP_CONN_ID
        if is_azure_root(staging_root):
            return DEFAULT_AZURE_CONN_ID
        if not is_s3_root(staging_root):
            return None
        from airflow.exceptions import AirflowNotFoundException

        try:
            self.get_connection(DEFAULT_AWS_CONN_ID)
        except AirflowNotFoundException:
            return None
        return DEFAULT_AWS_CONN_ID

    def get_staging_credentials(self, staging_root: str | None = None) -> StagingCredentials:
        """The storage options that open ``staging_root`` (default: the connection's), and their source.

        For an ``s3://`` root: the options of the ``aws`` connection named by
        :meth:`staging_conn_id` (:func:`~airflow_provider_walsink.hooks.staging.s3_options_from_connection`),
        or none (the default credential chain). For a ``gs://`` root: the options of the
        ``google_cloud_platform`` connection it names (:func:`~.staging.gcs_options_from_connection`);
        a ``gs://`` root always has one, never credentials found in the environment. For an
        ``abfss://`` root: the options of the ``wasb`` or ``adls`` connection it names
        (:func:`~.azure_staging.azure_options_from_connection`), likewise always one. Logged once
        per source, never with a secret.

        Raises:
            StagingConnectionError: the named connection does not exist, is not of the root's
                type (``aws``, ``google_cloud_platform``, ``wasb``/``adls``), or cannot give its
                credentials (the message says how to fix it); a ``gs://`` or ``abfss://`` root
                without a connection.
        """
        root = staging_root or self.staging_root
        conn_id = self.staging_conn_id(root)
        # Which connection types open the root, and whether it opens only with one of them.
        if is_gcs_root(root):
            kinds, default, required = (GCP_CONN_TYPE,), DEFAULT_GCP_CONN_ID, True
        elif is_azure_root(root):
            kinds, default, required = AZURE_CONN_TYPES, DEFAULT_AZURE_CONN_ID, True
        else:
            kinds, default, required = ("aws",), DEFAULT_AWS_CONN_ID, False
        kind = " or ".join(repr(k) for k in kinds)
        if conn_id is None and required:
            scheme = root.split("://", 1)[0]
            raise StagingConnectionError(
                f"walsink connection {self.walsink_conn_id!r} sets staging_conn_id to none, but staging root "
                f"{root!r} is on {scheme}://, which walsink opens only with a {kind} connection: name one "
                f'("staging_conn_id": "{default}")'
            )
        if conn_id is None:
            credentials = StagingCredentials(None)
        else:
            if not (is_s3_root(root) or required):
                raise StagingConnectionError(
                    f"walsink connection {self.walsink_conn_id!r} names staging_conn_id {conn_id!r}, but "
                    f"staging root {root!r} is on none of s3://, gs://, abfss://: only those roots take a "
                    'connection; other object stores use the default credential chain (set "staging_conn_id": '
                    '"" or remove it)'
                )
            from airflow.exceptions import AirflowNotFoundException

            try:
                conn = self.get_connection(conn_id)
            except AirflowNotFoundException:
                raise StagingConnectionError(
                    f"connection {conn_id!r} (staging_conn_id of walsink connection {self.walsink_conn_id!r}) "
                    f"does not exist: create it, of type {kind}, for staging root {root!r}"
                ) from None
            credentials = StagingCredentials(conn_id, options_from_connection(conn, root))
        if is_object_store_root(root) and conn_id not in self._said_credentials:
            self._said_credentials.add(conn_id)
            self.log.info("Staging root %s: credentials from %s", root, credentials.describe())
        return credentials

    def get_staging_store(self, staging_root: str | None = None) -> StagingStore:
        """The :class:`StagingStore` of ``staging_root`` (default: the connection's), with the
        credentials of :meth:`get_staging_credentials` for an object store."""
        root = staging_root or self.staging_root
        if not is_object_store_root(root):
            return self._open_staging_store(root, {})
        return self._open_staging_store(root, self.get_staging_credentials(root).options)

    def _open_staging_store(self, root: str, options: Mapping[str, str]) -> StagingStore:
        """Open ``root`` with ``options``: a new store (and client) each time; the triggers' shared
        hook (``triggers/shared.py``) keeps one per root and credentials instead."""
        return StagingStore.open(root, options)

    def get_source(self, source: Source | Mapping[str, Any] | None = None) -> Source:
        """The pipeline's source (default ``files``: the job finds its own input), its kind looked
        up in ``SOURCES``, reading its settings with connection ``conn_id`` (:func:`source_from`)."""
        return source_from(source)

    def get_write_phase(self, *, staging_root: str, **kwargs: Any) -> WritePhase:
        """The write phase of one checkpoint on this connection's committer table, staging under
        ``staging_root`` with this connection's staging credentials (passed to the job in its
        environment by the runner, never on a command line)."""
        return WritePhase(
            store=self.get_store(),
            staging_root=staging_root,
            staging=self.get_staging_store,
            credentials_env=lambda root: storage_env(root, self.get_staging_credentials(root).options),
            check_staging=self._check_staging,
            **kwargs,
        )

    def _check_staging(self, root: str) -> None:
        """The write phase's staging check (``core/commit/preflight.py``), naming the connection."""
        credentials = self.get_staging_credentials(root) if is_object_store_root(root) else None
        where = staging_connection(self.walsink_conn_id, root, credentials)
        check_staging(self.get_staging_store(root), connection=where)

    def test_connection(self) -> tuple[bool, str]:
        """The connection form's "Test" button: is the committer usable from here?

        Checks, changing nothing: the committer database answers and its schema
        is at the head revision of this walsink (the first task would migrate an
        empty one, so an empty database is reported as such), and the staging
        root exists or could be created, and is writable (an object-store root:
        its bucket exists and its prefix can be listed with the staging
        connection's credentials). Returns ``(ok,
        message)``; the message names the first problem found, or both checked
        places on success.
        """
        try:
            url = self.sqlalchemy_url
        except Exception as exc:
            return False, f"Bad connection: {_one_line(exc)}"
        ok, db_message = _check_database(url)
        if not ok:
            return False, db_message
        root = self.staging_root
        if is_object_store_root(root):
            ok, staging_message = self._check_object_store_root(root)
        else:
            ok, staging_message = local_root_status(root)
        if not ok:
            return False, staging_message
        return True, f"{db_message}; {staging_message}"

    def _check_object_store_root(self, root: str) -> tuple[bool, str]:
        """List the root's prefix with its credentials (reads nothing, writes nothing)."""
        import pyarrow.fs as pafs

        try:
            store = self.get_staging_store(root)
            bucket = store.base.split("/", 1)[0]
            if store.filesystem.get_file_info(bucket).type == pafs.FileType.NotFound:
                return False, (
                    f"Staging root {root} cannot be listed: bucket {bucket} does not exist "
                    "(or these credentials cannot see it)"
                )
            store.filesystem.get_file_info(pafs.FileSelector(store.base, allow_not_found=True))
        except Exception as exc:  # noqa: BLE001 - any failure is the answer
            return False, f"Staging root {root} cannot be listed: {_one_line(exc)}"
        return True, f"Staging root {root} can be listed with {self.get_staging_credentials(root).describe()}"


def _one_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _check_database(url: str) -> tuple[bool, str]:
    """Connect (without migrating) and compare the schema's revision with this walsink's head."""
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    from airflow_provider_walsink.core.store.migrate import current_revision, head_revision

    try:
        parsed = make_url(url)
    except Exception as exc:
        return False, f"Committer database URL is not valid: {_one_line(exc)}"
    where = parsed.render_as_string(hide_password=True)
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        # SQLite would create a missing file (and fail on a missing directory): say so instead.
        if not os.path.exists(parsed.database):
            return False, f"Committer database {where}: the file does not exist yet"
    try:
        engine = create_engine(parsed)
    except Exception as exc:  # e.g. a missing driver
        return False, f"Committer database {where}: {_one_line(exc)}"
    try:
        with engine.connect() as conn:
            revision = current_revision(conn)
    except Exception as exc:
        hint = missing_database_hint(exc, parsed)
        if hint is not None:
            return False, f"Committer database {where}: {hint}"
        return False, f"Committer database {where} is unreachable: {_one_line(exc)}"
    finally:
        engine.dispose()
    head = head_revision()
    if revision is None:
        return (
            False,
            f"Committer database {where} has no walsink schema (run: walsink db upgrade, or any task)",
        )
    if revision != head:
        return (
            False,
            f"Committer database {where} schema is at revision {revision}, this walsink needs {head}",
        )
    return True, f"Committer database {where} reachable, schema at head ({head})"


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
