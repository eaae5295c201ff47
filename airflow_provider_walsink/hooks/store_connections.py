"""An object store's options from the Airflow connection of its kind: one dispatch by the root's scheme.

Used by the walsink hook (a staging root's store) and, by its dotted path, by the table targets on
the same stores (a ``delta+gs://`` or ``delta+abfss://`` table's ``conn_id``: the core never imports
this module), so a ``google_cloud_platform``, ``wasb``/``adls`` or ``aws`` connection is read in one
place, with the same refusals, whatever opens the store.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

from airflow_provider_walsink.hooks.azure_staging import azure_options_from_connection, is_azure_root
from airflow_provider_walsink.hooks.staging import (
    gcs_options_from_connection,
    is_gcs_root,
    s3_options_from_connection,
)


def options_from_connection(conn: Any, root: str) -> dict[str, str]:
    """The :meth:`StagingStore.open` options of ``root`` (``gs://``, ``abfss://``, else ``s3://``)
    from ``conn`` (an Airflow ``Connection``, or anything with its attributes).

    Raises:
        StagingConnectionError: the connection is not of the root's type or cannot give its
            credentials; the message names it and says how to fix it.
    """
    if is_gcs_root(root):
        return gcs_options_from_connection(conn)
    if is_azure_root(root):
        return azure_options_from_connection(conn, root)
    return s3_options_from_connection(conn)


def options_from_fields(fields: Mapping[str, Any], root: str) -> dict[str, str]:
    """:func:`options_from_connection` of a connection given as the core's plain fields
    (``conn_id``, ``conn_type``, ``host``, ``login``, ``password``, ``extra``: a
    ``ConnectionResolver``'s answer)."""
    conn = SimpleNamespace(
        conn_id=fields.get("conn_id"),
        conn_type=fields.get("conn_type"),
        host=fields.get("host"),
        login=fields.get("login"),
        password=fields.get("password"),
        extra_dejson=dict(fields.get("extra") or {}),
    )
    return options_from_connection(conn, root)
