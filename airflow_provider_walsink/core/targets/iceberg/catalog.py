"""Where an Iceberg target's catalog comes from: configured, never guessed (:mod:`.iceberg`).

The connection named like the catalog (its ``extra`` holds the catalog properties), else
``target_options={"catalog": {...}}``, else pyiceberg's own configuration of it; only
:data:`EMBEDDED_CATALOG` may have none, and is then walsink's embedded SQLite catalog.

An SQL catalog on a PostgreSQL or MySQL/MariaDB database uses this process's one engine for its
URL (:func:`~airflow_provider_walsink.core.store.engine.shared_engine`): where the catalog and the
committer table share a database, a commit task holds one connection for both, not one each.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from airflow_provider_walsink.core.store.engine import shared_engine
from airflow_provider_walsink.core.targets._tables import as_uri
from airflow_provider_walsink.core.targets.registry import TargetNotConfiguredError

# The Iceberg target's logger: its configuration is said where its publishes are logged.
log = logging.getLogger("airflow_provider_walsink.core.targets.iceberg")

#: The one catalog name that needs no configuration: walsink's embedded SQL catalog.
EMBEDDED_CATALOG = "walsink"
#: Catalog types that cannot work without a ``uri`` property.
_NEEDS_URI = ("sql", "rest")


def default_catalog_properties() -> dict[str, str]:
    """The embedded catalog: SQLite file and a local warehouse under ``$WALSINK_ICEBERG_HOME``."""
    home = Path(os.environ.get("WALSINK_ICEBERG_HOME") or Path.home() / ".walsink" / "iceberg")
    home.mkdir(parents=True, exist_ok=True)
    return {
        "type": "sql",
        "uri": f"sqlite:///{home / 'catalog.db'}",
        "warehouse": as_uri(str(home / "warehouse")),
    }


def embedded_catalog_properties() -> dict[str, str]:
    props = default_catalog_properties()
    # A documented default, named in the log: a table here is on this machine only.
    log.info(
        "Iceberg catalog %r is walsink's embedded SQL catalog: %s, warehouse %s "
        "($WALSINK_ICEBERG_HOME; for a shared catalog, create a connection and name it in the target URI)",
        EMBEDDED_CATALOG,
        props["uri"],
        props["warehouse"],
    )
    return props


def pyiceberg_configured(name: str) -> dict[str, str] | None:
    """pyiceberg's own configuration of catalog ``name`` (``~/.pyiceberg.yaml``, ``PYICEBERG_CATALOG__*``)."""
    from pyiceberg.utils.config import Config

    found = Config().get_catalog_config(name)
    return {str(k): str(v) for k, v in found.items()} if found else None


def open_catalog(name: str, props: Mapping[str, str]) -> Any:
    """pyiceberg's catalog ``name`` with ``props``; an SQL catalog on a server database on the
    process's shared engine for its URL (module docstring), any other through ``load_catalog``."""
    from pyiceberg.catalog import load_catalog

    merged = {**(pyiceberg_configured(name) or {}), **props}
    if _on_shared_engine(merged):
        return _shared_engine_sql_catalog()(name, **merged)
    return load_catalog(name, **props)


def _on_shared_engine(props: Mapping[str, str]) -> bool:
    from sqlalchemy.engine import make_url

    uri = props.get("uri", "")
    kind = props.get("type", "sql" if uri.startswith("postgresql") else "").lower()
    if kind != "sql" or props.get("py-catalog-impl"):
        return False
    # pyiceberg's own engine options: a catalog that asks for them keeps its own engine.
    if any(props.get(k, "false").lower() not in ("false", "0", "no") for k in ("echo", "pool_pre_ping")):
        return False
    try:
        return make_url(uri).get_backend_name() in ("postgresql", "mysql", "mariadb")
    except Exception:  # noqa: BLE001 - pyiceberg reports a bad uri in its own words
        return False


def _shared_engine_sql_catalog() -> type:
    from pyiceberg.catalog.sql import SqlCatalog

    class SharedEngineSqlCatalog(SqlCatalog):
        """pyiceberg's ``SqlCatalog`` on the process's shared engine for its ``uri``."""

        def _init_catalog(self) -> None:
            # SqlCatalog.__init__ made an engine of its own (not connected yet): use the shared one.
            self.engine.dispose()
            self.engine = shared_engine(self.properties["uri"])
            super()._init_catalog()

        def close(self) -> None:
            """The engine is the process's, not this catalog's: nothing to close."""

    return SharedEngineSqlCatalog


def not_configured(uri: str, name: str) -> TargetNotConfiguredError:
    return TargetNotConfiguredError(
        f"Iceberg target {uri!r}: Iceberg catalog {name!r} is not configured: there is no connection "
        f'{name!r}, no target_options={{"catalog": {{...}}}} and no pyiceberg configuration of it. '
        f"Create the connection (Admin > Connections, or AIRFLOW_CONN_{name.upper()}) with the catalog "
        'properties in its extra, e.g. {"type": "sql", "uri": "postgresql+psycopg2://...", "warehouse": '
        '"s3://bucket/warehouse"}; or pass them as target_options={"catalog": {...}}; or configure it for '
        f"pyiceberg (~/.pyiceberg.yaml, PYICEBERG_CATALOG__{name.upper()}__URI); or use "
        f"iceberg://{EMBEDDED_CATALOG}/... for walsink's embedded SQLite catalog on this machine "
        "(docs/targets.md). Nothing was written."
    )


def check_catalog_properties(uri: str, name: str, source: str, props: Mapping[str, str]) -> None:
    kind = props.get("type", "")
    if kind in _NEEDS_URI and not props.get("uri"):
        raise TargetNotConfiguredError(
            f"Iceberg target {uri!r}: catalog {name!r} from {source} is of type {kind!r} but has no 'uri' "
            "property (the catalog database's SQLAlchemy URL, or the REST endpoint): add it (docs/targets.md)"
        )


#: The connection type of the official Iceberg provider (``apache-airflow-providers-apache-iceberg``).
ICEBERG_CONN_TYPE = "iceberg"


def catalog_properties_from_connection(conn: Mapping[str, Any]) -> dict[str, str]:
    """Catalog properties from a connection's fields.

    A connection of type ``iceberg`` (the official Iceberg provider's) is read exactly as its
    ``IcebergHook`` reads it: the ``extra`` as pyiceberg properties (``warehouse``, ``s3.*``,
    ``token``, ``scope``, ``header.X-Iceberg-Access-Delegation`` for vended credentials...), the
    host as the catalog ``uri`` (winning over the extra's), ``type`` ``rest`` unless the extra
    says otherwise, and for a REST catalog the OAuth2 client credential ``login:password``.

    Any other type keeps walsink's earlier reading: ``extra`` as is, ``host``/``login`` filling
    gaps (an ``http`` connection's host as a REST ``uri``; ``login``/``password`` as S3 keys).
    """
    extra = conn.get("extra") or {}
    if isinstance(extra, str):
        extra = json.loads(extra) if extra.strip() else {}
    props = {str(k): str(v) for k, v in extra.items()}
    conn_type = (conn.get("conn_type") or "").lower()
    if conn_type == ICEBERG_CONN_TYPE:
        if conn.get("host"):
            props["uri"] = str(conn["host"]).rstrip("/")
        props.setdefault("type", "rest")
        login, password = conn.get("login"), conn.get("password")
        if props["type"] == "rest" and login and password:
            props["credential"] = f"{login}:{password}"
        elif props["type"] == "rest" and (login or password):
            log.warning(
                "Iceberg connection %r has only one of Client ID / Client Secret: both are needed for the "
                "OAuth2 client credential, so none is used",
                conn.get("conn_id", ""),
            )
        return props
    if "type" not in props:
        props["type"] = "rest" if conn_type in ("http", "https", "iceberg_rest", "rest") else "sql"
    if "uri" not in props and conn.get("host"):
        scheme = "https" if conn_type == "https" else "http"
        port = f":{conn['port']}" if conn.get("port") else ""
        props["uri"] = f"{scheme}://{conn['host']}{port}{conn.get('schema') and '/' + conn['schema'] or ''}"
    if conn.get("login") and "s3.access-key-id" not in props:
        props["s3.access-key-id"] = str(conn["login"])
        props["s3.secret-access-key"] = str(conn.get("password") or "")
    return props
