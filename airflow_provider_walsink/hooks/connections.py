"""Airflow connections as plain fields, for the Airflow-free target registry."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

try:
    from airflow.sdk import BaseHook
except ImportError:  # pragma: no cover
    from airflow.hooks.base import BaseHook  # type: ignore[no-redef]


def airflow_connection_fields(conn_id: str) -> Mapping[str, Any]:
    """The fields of an Airflow connection (a ``ConnectionResolver`` for ``publishers.registry``)."""
    conn = BaseHook.get_connection(conn_id)
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
