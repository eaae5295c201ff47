"""An ``abfss://`` staging root's credentials from an Airflow ``wasb`` or ``adls`` connection.

Both are the Microsoft Azure provider's connection types, read here field by field as that
provider's ``WasbHook`` and ``AzureDataLakeStorageV2Hook`` read them (the provider itself need not
be installed):

* ``wasb`` (Azure Blob Storage): **Login** the storage account, **Password** its key; or in the
  extra ``account_key`` / ``shared_access_key``, or a ``connection_string``; **Host** the
  account's URL (for an emulator: ``http://127.0.0.1:10000/<account>``).
* ``adls`` (Azure Data Lake Storage Gen2): **Host** the storage account, **Password** its key;
  the extra ``account_url`` (an emulator's, as above) or ``connection_string``.

The one credential staging takes is the storage account's key, which the job receives as it is.
What the provider can do and staging cannot (a SAS token, whose signature ``pyarrow``'s error
messages would show in the task log; a service principal's ``tenant_id``; a managed identity;
``DefaultAzureCredential``, which reads the process environment) is refused naming the connection,
never replaced by other credentials. The account a connection names must
be the root's (``abfss://<container>@<account>.dfs.core.windows.net/...``).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from airflow_provider_walsink.hooks.staging import StagingConnectionError, provider_extra

#: The Azure provider's connection types; ``wasb_default`` is the connection an ``abfss://`` root
#: uses when the walsink connection names none. It must exist: an ``abfss://`` root is never
#: opened with credentials found in the process environment.
AZURE_CONN_TYPES = ("wasb", "adls")
DEFAULT_AZURE_CONN_ID = "wasb_default"
#: Extra fields that choose credentials staging cannot carry to the job: refused, with the fix.
_UNSUPPORTED_EXTRA = {
    "tenant_id": "a service principal (tenant_id, client id and secret) is not supported for the staging root",
    "managed_identity_client_id": "a managed identity is not supported for the staging root",
    "workload_identity_tenant_id": "workload identity is not supported for the staging root",
    "client_secret_auth_config": "a service principal is not supported for the staging root",
    "sas_token": "a SAS token is not supported for the staging root (pyarrow's errors show it in URLs)",
}
#: Extra fields read here (the rest are ignored, named in the log once).
_READ_EXTRA = frozenset({"account_key", "shared_access_key", "connection_string", "account_url"})


def is_azure_root(root: str) -> bool:
    return urlsplit(root).scheme.lower() in ("abfs", "abfss", "az") if "://" in root else False


def azure_options_from_connection(conn: Any, root: str) -> dict[str, str]:
    """:meth:`StagingStore.open` options of the ``abfss://`` root ``root`` from a ``wasb`` or
    ``adls`` connection: ``account_key``, and ``endpoint_url`` for an account URL that is not
    Azure's own (an emulator, a proxy).

    Raises:
        StagingConnectionError: a connection of another type, no key, a connection string that
            cannot be read, an account other than the root's, an account URL that is not the
            account's, or a credential kind staging cannot carry (SAS token, service principal,
            managed identity).
    """
    conn_id = getattr(conn, "conn_id", None)
    conn_type = getattr(conn, "conn_type", None)
    if conn_type not in AZURE_CONN_TYPES:
        raise StagingConnectionError(
            f"connection {conn_id!r} is of type {conn_type!r}: an abfss:// staging root needs a connection of "
            "type 'wasb' (Azure Blob Storage: login = storage account, password = account key) or 'adls' "
            "(host = storage account, password = account key); docs/production.md"
        )
    root_account = _root_account(root)
    extra = provider_extra(
        conn, conn_type, read=_READ_EXTRA, unsupported=_UNSUPPORTED_EXTRA,
        fix="give the connection the storage account's key (password)",
    )  # fmt: skip
    password = getattr(conn, "password", None)
    if conn_type == "wasb":
        account, url = getattr(conn, "login", None), getattr(conn, "host", None)
        keys = [password, extra.get("account_key"), extra.get("shared_access_key")]
    else:
        account, url = getattr(conn, "host", None), extra.get("account_url")
        keys = [password]
    key = next((str(k) for k in keys if k), None)
    if extra.get("connection_string"):
        if key:
            raise StagingConnectionError(
                f"connection {conn_id!r} gives a connection_string and a key: give one"
            )
        account, key, url = _connection_string(conn_id, str(extra["connection_string"]), account, url)
    if account and str(account) != root_account:
        raise StagingConnectionError(
            f"connection {conn_id!r} is for storage account {str(account)!r}, but staging root {root!r} is in "
            f"account {root_account!r}: name a connection for that account"
        )
    if not key:
        raise StagingConnectionError(
            f"connection {conn_id!r} holds no storage account key: give it (the password); walsink never "
            "falls back to Azure's default credential, which reads the process environment"
        )
    options = {"account_key": key}
    if url:
        endpoint = _endpoint(conn_id, str(url), root_account)
        if endpoint:
            options["endpoint_url"] = endpoint
    return options


def _root_account(root: str) -> str:
    """The storage account an ``abfss://`` root names (the store refuses a malformed root itself)."""
    return urlsplit(root).netloc.partition("@")[2].partition(".")[0]


def _connection_string(conn_id: str | None, text: str, account: Any, url: Any) -> tuple[Any, str | None, Any]:
    """(account, key, blob endpoint) of an Azure Storage connection string."""
    fields: dict[str, str] = {}
    for part in text.split(";"):
        name, eq, value = part.strip().partition("=")
        if part.strip() and not eq:
            raise StagingConnectionError(
                f"connection {conn_id!r}: its connection_string is not Name=value pairs separated by ';'"
            )
        if eq:
            fields[name.strip().lower()] = value.strip()
    for name in ("usedevelopmentstorage", "sharedaccesssignature"):
        if fields.get(name):
            raise StagingConnectionError(
                f"connection {conn_id!r}: a connection string with {name!r} is not supported for the "
                "staging root; give AccountName, AccountKey (and BlobEndpoint for an emulator)"
            )
    return fields.get("accountname") or account, fields.get("accountkey"), fields.get("blobendpoint") or url


def _endpoint(conn_id: str | None, url: str, account: str) -> str | None:
    """An account URL as the store's ``endpoint_url``: ``None`` for Azure's own
    (``https://<account>.blob.core.windows.net``, which the root already names), a path-style URL
    (``http://host:port/<account>``) as it is; refused otherwise."""
    parts = urlsplit(url if "://" in url else f"https://{url}")
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise StagingConnectionError(f"connection {conn_id!r}: the account URL {url!r} is not http(s)://host")
    host = parts.hostname or ""
    if host.startswith(f"{account}.blob.") or host.startswith(f"{account}.dfs."):
        return None
    if parts.path.strip("/") != account:
        raise StagingConnectionError(
            f"connection {conn_id!r}: the account URL {url!r} is neither Azure's "
            f"(https://{account}.blob.core.windows.net) nor an emulator's for the account "
            f"(http://host:port/{account})"
        )
    return f"{parts.scheme}://{parts.netloc}/{account}"
