"""The model checker's Iceberg REST catalog (``--catalog rest``, issue 45).

The catalog is ``tests/iceberg_rest.py``'s :class:`RestCatalogServer`: the REST protocol over
pyiceberg's ``SqlCatalog``, in a thread of the process that starts it. It lives in the checker's
main process (started once per run, stopped at its end); the commit tries that are killed, paused
or raced run in children of the fork server and reach it over loopback, and the faults a step
injects (:meth:`World.op_unreported`) are counted by the server, which only the main process has:
hence a registry of the servers this process started, by URI (a :class:`Config` is pickled into
the children and carries only the URI).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: Seconds every request of the model's REST client may take (the ``walsink.request-timeout``
#: catalog property): above what a loaded machine needs for a real answer, below a "slow" answer.
REQUEST_TIMEOUT = 3.0
#: How long a ``slow`` fault holds the answer back (past :data:`REQUEST_TIMEOUT`).
SLOW_DELAY = REQUEST_TIMEOUT + 1.5
#: The faults of a commit the catalog applied but did not report (``tests/iceberg_rest.py``).
UNREPORTED = ("500", "502", "504", "drop", "slow")

_SERVERS: dict[str, Any] = {}


def start(root: str | None = None, s3_endpoint: str | None = None) -> tuple[str, Callable[[], None]]:
    """A REST catalog on a free loopback port: ``(uri, stop)``. Its backend catalog is an SQLite
    file under ``root``; with ``s3_endpoint`` its file IO also reaches the S3 server (the tables of
    ``--staging s3`` live there, each at the location its schedule gives it)."""
    from tests.iceberg_rest import RestCatalogServer

    props: dict[str, str] = {}
    if s3_endpoint:
        from .world import BUCKET

        props = {**_s3(s3_endpoint).iceberg_properties(), "warehouse": f"s3://{BUCKET}/rest-warehouse"}
    server = RestCatalogServer(Path(root or tempfile.mkdtemp(prefix="walsink-rest-")), props)
    _SERVERS[server.uri] = server

    def stop() -> None:
        _SERVERS.pop(server.uri, None)
        server.stop()

    return server.uri, stop


def server_of(uri: str) -> Any:
    """The running :class:`RestCatalogServer` at ``uri`` (started by this process)."""
    try:
        return _SERVERS[uri]
    except KeyError:
        raise RuntimeError(
            f"no REST catalog of this process at {uri} (start it with tests.model.rest.start)"
        ) from None


def connection(cfg: Any) -> dict[str, Any]:
    """The ``iceberg`` connection of ``cfg``'s REST catalog, as the official Iceberg provider's
    connection type holds it: the catalog's URI as host, the OAuth2 client id and secret as login
    and password, the catalog properties in the extra."""
    from tests.iceberg_rest import CLIENT_ID, CLIENT_SECRET

    extra: dict[str, str] = {"walsink.request-timeout": str(REQUEST_TIMEOUT), "warehouse": cfg.warehouse()}
    if cfg.staging == "s3":
        extra |= cfg.objects.iceberg_properties()
    return {"conn_type": "iceberg", "host": cfg.rest_uri, "login": CLIENT_ID, "password": CLIENT_SECRET,
            "extra": extra}  # fmt: skip


def create_table(cfg: Any) -> None:
    """Create the schedule's table through the catalog, at a location of the schedule's (``<work>``
    or its S3 prefix), with the schema and partition spec the target's first commit would give it
    (``new_table_schema``). A REST catalog names a new table's location only when it creates it,
    so the write phase could not stage inside the table before its first commit otherwise."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from airflow_provider_walsink.core.targets.iceberg.files import new_table_schema

    publisher = cfg.publisher(None)
    buf = io.BytesIO()
    pq.write_table(pa.table({"id": pa.array([], pa.string()), "v": pa.array([], pa.int64())}), buf)
    footer = pq.ParquetFile(io.BytesIO(buf.getvalue())).metadata
    schema, spec = new_table_schema(None, [footer], cfg.columns, identifier=publisher.identifier)
    publisher.catalog.create_namespace_if_not_exists(publisher.namespace)
    publisher.catalog.create_table(
        publisher.identifier,
        schema=schema,
        partition_spec=spec,
        location=f"{cfg.warehouse()}/{publisher.namespace}/{publisher.identifier.rpartition('.')[2]}",
    )


def _s3(endpoint: str) -> Any:
    from tests.table_fixtures import S3Server

    from .world import BUCKET

    return S3Server(endpoint, BUCKET)
