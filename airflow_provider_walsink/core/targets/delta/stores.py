"""A Delta table on Google Cloud Storage or Azure (``delta+gs://``, ``delta+abfss://``): deltalake's
storage options from the connection staging reads, and the file system walsink reads its log with.

The table's ``conn_id`` names a ``google_cloud_platform`` connection (``gs://``) or a ``wasb`` /
``adls`` connection (``abfss://``). It is read by the same function that reads a staging root's
connection (``hooks/store_connections.py``, loaded by its dotted path: the core never imports the
Airflow faces), giving the staging store's options (``core/staging/gcs.py``, ``adls.py``); those
become deltalake's (object_store's) options here, so the table and the attempts staged inside it
are reached with one connection's credentials, never with the process environment's.

* GCS: object_store takes a service account's JSON key (``google_service_account_key``) and, in
  that key, ``gcs_base_url`` for another endpoint and ``disable_oauth`` for no credentials (what
  its own tests use against an emulator). Without key or ``anonymous``: the hosts' default
  credentials, as for staging.
* Azure: the account (from the root), its key, and ``endpoint`` for a path-style account URL (an
  emulator: ``http://host:port/<account>``).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

#: The reader of a store's connection (plain fields + root -> staging options), by dotted path.
CONNECTION_READER = "airflow_provider_walsink.hooks.store_connections:options_from_fields"
#: Table URI schemes (after ``delta+``) on Google Cloud Storage and on Azure, as deltalake names them.
GCS_SCHEMES = ("gs", "gcs")
AZURE_SCHEMES = ("abfss", "abfs")


def store_scheme(table_uri: str) -> str | None:
    """``"gs"`` or ``"abfss"`` for a table on one of those stores, else ``None``."""
    scheme = urlsplit(table_uri).scheme.lower() if "://" in table_uri else ""
    if scheme in GCS_SCHEMES:
        return "gs"
    if scheme in AZURE_SCHEMES:
        return "abfss"
    return None


def connection_options(fields: Mapping[str, Any], table_uri: str) -> dict[str, str]:
    """The staging store's options of ``table_uri`` from a connection's fields (its refusals name
    the connection: ``StagingConnectionError``)."""
    module, _, name = CONNECTION_READER.partition(":")
    read = getattr(importlib.import_module(module), name)
    return dict(read(fields, table_uri))


def deltalake_options(table_uri: str, options: Mapping[str, Any]) -> dict[str, str]:
    """deltalake's storage options for ``table_uri`` from the staging store's ``options``."""
    endpoint = str(options.get("endpoint_url") or "")
    found: dict[str, str] = {}
    if endpoint.startswith("http://"):
        found["allow_http"] = "true"
    if store_scheme(table_uri) == "gs":
        key: dict[str, Any] | None = None
        if options.get("keyfile_dict"):
            raw = options["keyfile_dict"]
            key = dict(json.loads(raw) if isinstance(raw, str | bytes) else raw)
        elif str(options.get("anonymous", "")).lower() in ("1", "true", "yes"):
            key = {"disable_oauth": True, "client_email": "", "private_key": "", "private_key_id": ""}
            endpoint = endpoint or "https://storage.googleapis.com"
        if key is not None:
            if endpoint:
                key["gcs_base_url"] = endpoint.rstrip("/")
            found["google_service_account_key"] = json.dumps(key)
        return found
    account = urlsplit(table_uri).netloc.partition("@")[2].partition(".")[0]
    found.update(account_name=account, account_key=str(options.get("account_key") or ""))
    if endpoint:
        found["endpoint"] = endpoint.rstrip("/")
    return found


def endpoint_of(options: Mapping[str, Any]) -> str | None:
    """Where a store's options point (for a message; no secret)."""
    return str(options["endpoint_url"]) if options.get("endpoint_url") else None
