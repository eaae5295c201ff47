"""Airflow connections as plain fields, for the Airflow-free target registry."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

try:
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException
except ImportError:  # pragma: no cover
    from airflow.exceptions import AirflowNotFoundException  # type: ignore[no-redef]
    from airflow.hooks.base import BaseHook  # type: ignore[no-redef]


def airflow_connection_fields(conn_id: str) -> Mapping[str, Any] | None:
    """The fields of an Airflow connection (a ``ConnectionResolver`` for ``publishers.registry``).

    Returns ``None`` when no such connection exists; any other failure of the
    lookup (a secrets backend down) raises, so it is never mistaken for an
    absent connection.
    """
    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return None
    extra = conn.extra_dejson if hasattr(conn, "extra_dejson") else json.loads(conn.extra or "{}")
    return {
        "conn_id": conn_id,
        "conn_type": conn.conn_type,
        "host": conn.host,
        "port": conn.port,
        "login": conn.login,
        "password": conn.password,
        "schema": conn.schema,
        "extra": dict(extra or {}),
    }
