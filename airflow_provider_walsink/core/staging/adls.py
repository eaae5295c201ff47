"""The ``abfss://`` / ``abfs://`` staging backend: Azure Data Lake Storage Gen2 and Blob Storage.

**The root** is written as Hadoop's ABFS driver (and so Spark, Databricks and fsspec's ``adlfs``)
writes it: ``abfss://<container>@<account>.dfs.core.windows.net/<prefix>``. The account is part of
the root, so a root names one place and a connection holding another account's key is refused.
``abfs://`` names the same place (Hadoop's non-TLS variant); walsink talks HTTPS to Azure for both
(unless ``endpoint_url`` says otherwise), and a recorded root must match the scheme it was written
with. Other Azure clouds: the root's domain after ``.dfs.`` (``core.chinacloudapi.cn``...).

Two well-kept clients, each for what it does best:

* **Data** (the executors' committables, listings with sizes, reads, deleting an attempt):
  ``pyarrow.fs.AzureFileSystem``, picklable, so Spark ships it to the executors inside their tasks
  as it ships S3's. It writes each blob as blocks and a block list, and on an account with a
  hierarchical namespace it uses the DFS API's directories (an attempt is deleted as one directory).
* **The seal, the listing with the service's checksums, single deletes**: ``azure-storage-blob``. The
  manifest is uploaded in one Put Blob with ``If-None-Match: *`` (``upload_blob(overwrite=False)``):
  the service refuses a second create (409 ``BlobAlreadyExists``), so a seal is written once by the
  service's own condition, never by a read-then-write. Its listing gives each blob's size and the
  checksum the service keeps (:meth:`AdlsStagingStore.stored_checksums`). A single object (the
  write probe) is deleted through it because ``pyarrow``'s ``delete_file`` leaves a marker blob for
  the parent "directory" on a flat namespace.

Storage options (:data:`ADLS_OPTIONS`; values never logged or shown): ``account_key`` (the storage
account's shared key, base64), and ``endpoint_url`` (the account's blob endpoint for an emulator or
a proxy, path style: ``http://127.0.0.1:10000/<account>``). Without a key the store is not opened:
Azure's default credential would read the process environment. Not a SAS token: ``pyarrow`` puts it
in the URLs its error messages show (a task log would carry it), and its batch delete of an
attempt failed with one on Azurite. In a deployment the options come from an
Airflow ``wasb`` or ``adls`` connection (``hooks/staging.py``); the core reads no environment
variable for them.
"""

from __future__ import annotations

import base64
import binascii
import logging
import re
from collections.abc import Mapping
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from airflow_provider_walsink.core.protocol.manifest import MANIFEST_NAME
from airflow_provider_walsink.core.staging.base import AttemptLocation
from airflow_provider_walsink.core.staging.object_store import (
    ObjectStagingStore,
    StagingStore,
    StagingStoreError,
    split_object_root,
)
from airflow_provider_walsink.core.staging.probe import first_line

#: Storage options an ``abfss://`` root understands.
ADLS_OPTIONS = frozenset({"account_key", "endpoint_url"})
_INSTALL = "pip install 'airflow-provider-walsink[azure]'"
#: Azure's rules for names (storage account: 3-24 lowercase letters and digits; container: 3-63
#: lowercase letters, digits and single hyphens, starting and ending with a letter or digit).
_ACCOUNT = re.compile(r"[a-z0-9]{3,24}")
_CONTAINER = re.compile(r"(?=.{3,63}$)[a-z0-9]+(-[a-z0-9]+)*")
#: Metadata Azure sets on a hierarchical namespace's directory when listed as a blob.
_FOLDER = "hdi_isfolder"


class AdlsRoot(NamedTuple):
    """An ``abfss://`` root taken apart: the container, the account, the cloud's domain, the prefix."""

    container: str
    account: str
    suffix: str  # core.windows.net
    prefix: str


def parse_adls_root(root: str) -> AdlsRoot:
    """``abfss://<container>@<account>.dfs.<suffix>/<prefix>`` (or ``.blob.``), each part checked;
    :class:`StagingStoreError` naming what is wrong."""
    parts = split_object_root(root)
    if parts.scheme.lower() not in ("abfs", "abfss"):
        raise StagingStoreError(
            f"staging root {root!r}: write an Azure root as abfss://<container>@<account>.dfs.core.windows.net"
            "/<prefix> (the form Spark and Databricks use)"
        )
    container, at, host = parts.netloc.partition("@")
    account, dot, domain = host.partition(".")
    service, _, suffix = domain.partition(".")
    if not at or not dot or service not in ("dfs", "blob") or not suffix:
        raise StagingStoreError(
            f"staging root {root!r} names no container and account: write it as "
            "abfss://<container>@<account>.dfs.core.windows.net/<prefix>"
        )
    if not _CONTAINER.fullmatch(container):
        raise StagingStoreError(
            f"staging root {root!r}: {container!r} is not a container name (3-63 lowercase letters, "
            "digits and hyphens)"
        )
    if not _ACCOUNT.fullmatch(account):
        raise StagingStoreError(
            f"staging root {root!r}: {account!r} is not a storage account name (3-24 lowercase letters "
            "and digits)"
        )
    return AdlsRoot(container, account, suffix.lower(), parts.path.strip("/"))


class AdlsStagingStore(ObjectStagingStore):
    """:class:`~.base.StagingBackend` on ``abfss://container@account.dfs.core.windows.net/prefix``
    (module docstring: the root, which client does what).

    Everything else (layout, confinement, manifest reads, sizes from a listing, GC's listing,
    deleting an attempt, the write probe) is :class:`~.object_store.StagingStore`'s, through
    :attr:`filesystem`.
    """

    #: The ``azure-storage-blob`` service client (:meth:`_blob_service`), made on first use.
    _blob_client: Any = None

    @classmethod
    def open_root(cls, root: str, options: Mapping[str, Any]) -> StagingStore:
        where = parse_adls_root(root)
        settings = _settings(root, where, options)
        base = f"{where.container}/{where.prefix}".rstrip("/")
        return cls(root, _filesystem(root, where, settings), base, kind="abfs", options=settings)

    # ------------------------------------------------------------------ the seal

    def _seal_once(self, location: AttemptLocation, data: bytes, digest: str) -> str:
        """Upload the manifest in one Put Blob with ``If-None-Match: *``; 409 ``BlobAlreadyExists``
        (or 412) means a manifest is there: the same bytes are that seal again, other bytes are
        refused (``AlreadySealedError``). The client retries a transient error; a retry of an
        upload that did land is answered 409 and then recognised as the same seal."""
        from azure.core.exceptions import AzureError, ResourceExistsError
        from azure.storage.blob import ContentSettings

        container, _, key = location.manifest_path.partition("/")
        blob = self._blob_service().get_blob_client(container, key)
        try:
            blob.upload_blob(
                data, overwrite=False, content_settings=ContentSettings(content_type="application/json")
            )
        except (AzureError, OSError) as e:
            # 409 BlobAlreadyExists, or the same condition answered as a failed precondition (412):
            # a manifest is there, sealed before.
            if isinstance(e, ResourceExistsError) or getattr(e, "status_code", None) == 412:
                return self._same_seal(location, digest)
            raise StagingStoreError(
                f"sealing {location.uri}/{MANIFEST_NAME} failed ({first_line(e)})"
            ) from None
        return digest

    # ------------------------------------------------------------------ listing with the service's checksums

    def stored_checksums(self, location: AttemptLocation) -> dict[str, tuple[int, str]]:
        """Every blob under the attempt from one listing of the service: relative path -> (size,
        checksum). The checksum is ``"md5:<32 hex>"`` where the service keeps a Content-MD5 (a blob
        uploaded in one Put Blob, such as the manifest: the service computed it); else the blob's
        ETag, ``"etag:<hex>"``, which the service changes with every write of the blob. Azure keeps
        no whole-blob checksum of a blob written as blocks and a block list (how ``pyarrow``, and so
        the executors, write), and lists no CRC64 (Azurite and the Blob API alike)."""
        container, _, key = location.path.partition("/")
        prefix = key + "/"
        found: dict[str, tuple[int, str]] = {}
        listed = (
            self._blob_service()
            .get_container_client(container)
            .list_blobs(name_starts_with=prefix, include=["metadata"])
        )
        for blob in listed:
            if blob.name.endswith("/") or (blob.metadata or {}).get(_FOLDER) == "true":
                continue  # a "directory": a marker blob, or a hierarchical namespace's own
            md5 = blob.content_settings.content_md5
            checksum = f"md5:{bytes(md5).hex()}" if md5 else "etag:" + str(blob.etag).strip('"').lower()
            found[blob.name[len(prefix) :]] = (int(blob.size or 0), checksum)
        return found

    # ------------------------------------------------------------------ deleting

    def _delete_object(self, path: str) -> None:
        container, _, key = path.partition("/")
        self._blob_service().get_blob_client(container, key).delete_blob()

    # ------------------------------------------------------------------ the client

    def _blob_service(self) -> Any:
        """The ``azure-storage-blob`` client of this root's options (made on first use)."""
        if self._blob_client is None:
            try:
                from azure.core.credentials import AzureNamedKeyCredential
                from azure.storage.blob import BlobServiceClient
            except ImportError:
                raise StagingStoreError(
                    f"staging on abfss:// needs azure-storage-blob for the seal: {_INSTALL}"
                ) from None
            # Its request log says every request at INFO; a task log wants walsink's lines (the
            # Azure provider's hooks quiet it the same way), unless someone chose a level.
            http_log = logging.getLogger("azure.core.pipeline.policies.http_logging_policy")
            if http_log.level == logging.NOTSET:
                http_log.setLevel(logging.WARNING)
            o, where = self._options, parse_adls_root(self.root_uri)
            credential = AzureNamedKeyCredential(where.account, o["account_key"])
            self._blob_client = BlobServiceClient(account_url=_account_url(where, o), credential=credential)
        return self._blob_client

    def __getstate__(self) -> dict[str, Any]:  # the client holds sockets; rebuilt where unpickled
        return {**self.__dict__, "_blob_client": None}


def _account_url(where: AdlsRoot, settings: Mapping[str, Any]) -> str:
    return settings.get("endpoint_url") or f"https://{where.account}.blob.{where.suffix}"


def _settings(root: str, where: AdlsRoot, options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` checked: known names, one credential that parses, a usable endpoint (never shown)."""
    unknown = sorted(set(options) - ADLS_OPTIONS)
    if unknown:
        raise StagingStoreError(
            f"staging root {root!r}: unknown Azure storage options {unknown}; known: {sorted(ADLS_OPTIONS)}"
        )
    settings: dict[str, Any] = {k: str(v) for k, v in options.items() if v not in (None, "")}
    key = settings.get("account_key")
    if not key:
        raise StagingStoreError(
            f"staging root {root!r}: give the storage account's key (account_key); walsink never falls "
            "back to Azure's default credential, which reads the process environment"
        )
    try:
        base64.b64decode(key, validate=True)
    except (binascii.Error, ValueError):
        raise StagingStoreError(
            f"staging root {root!r}: the account key is not base64 (give the key as the portal shows it)"
        ) from None
    endpoint = settings.get("endpoint_url")
    if endpoint:
        parts = urlsplit(endpoint)
        if (
            parts.scheme not in ("http", "https")
            or not parts.netloc
            or parts.path.strip("/") != where.account
        ):
            raise StagingStoreError(
                f"staging root {root!r}: endpoint_url must be the account's blob endpoint in path style, "
                f"like http://127.0.0.1:10000/{where.account}"
            )
        settings["endpoint_url"] = f"{parts.scheme}://{parts.netloc}/{where.account}"
    return settings


def _filesystem(root: str, where: AdlsRoot, settings: Mapping[str, Any]) -> Any:
    """``pyarrow.fs.AzureFileSystem`` for the data: the account's endpoints from the root's domain
    (``.blob.<suffix>`` / ``.dfs.<suffix>``, pyarrow's form for ``<account>.blob.<suffix>``), or the
    emulator's ``host:port`` (pyarrow then puts the account in the path, as ``endpoint_url`` does)."""
    import pyarrow.fs as pafs

    endpoint = settings.get("endpoint_url")
    if endpoint:
        parts = urlsplit(endpoint)
        scheme, blob, dfs = parts.scheme, parts.netloc, parts.netloc
    else:
        scheme, blob, dfs = "https", f".blob.{where.suffix}", f".dfs.{where.suffix}"
    try:
        return pafs.AzureFileSystem(
            account_name=where.account,
            account_key=settings["account_key"],
            blob_storage_authority=blob,
            dfs_storage_authority=dfs,
            blob_storage_scheme=scheme,
            dfs_storage_scheme=scheme,
        )
    except (TypeError, ValueError, OSError) as e:
        raise StagingStoreError(f"staging root {root!r}: pyarrow cannot open it ({first_line(e)})") from None
