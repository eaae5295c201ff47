"""Airflow connections as plain fields, for the Airflow-free target registry; and the one refusal
of a connection a task names that does not exist."""

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

from airflow_provider_walsink.core.protocol.errors import PreflightError


class ConnectionNotFoundError(PreflightError, AirflowNotFoundException):
    """A connection a task names does not exist: the message names it, the argument that names
    it and what to create. A retry meets the same configuration, so the write task fails without
    one; still an ``AirflowNotFoundException`` for callers that catch Airflow's own."""


class WrongConnectionTypeError(PreflightError, ValueError):
    """A connection a task names is of a type that cannot serve the argument that names it."""


def require_connection(conn_id: str, *, named_by: str, create: str) -> Any:
    """The Airflow connection ``conn_id``, or :class:`ConnectionNotFoundError` saying that
    ``named_by`` (``"spark_conn_id of write task 'write'"``) names a connection that does not
    exist and ``create`` (what to create instead); any other failure of the lookup (a secrets
    backend down) raises as it is, so it is never mistaken for a typo."""
    try:
        return BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        raise ConnectionNotFoundError(
            f"connection {conn_id!r} ({named_by}) does not exist: {create}, or fix the name"
        ) from None


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
