"""The ``gs://`` staging backend: Google Cloud Storage through two well-kept clients.

* **Data** (the executors' committables, listings, reads, the write probe): ``pyarrow.fs.GcsFileSystem``,
  picklable, so Spark ships it to the executors inside their tasks as it ships S3's.
* **The seal and deletions**: ``google-cloud-storage``. The manifest is uploaded create-only
  (``ifGenerationMatch=0``): the service refuses a second create with 412, so a seal is written
  once by the service's own precondition, never by a read-then-write. Deleting an attempt lists
  its prefix and deletes those objects (``pyarrow``'s ``delete_dir`` wants a directory marker
  object that object writes never create). The same client lists an attempt with the sizes and
  CRC32C checksums the service keeps (:meth:`GcsStagingStore.stored_checksums`).

Storage options (:data:`GCS_OPTIONS`; values never logged or shown): ``keyfile_dict`` (a service
account's JSON key, text or mapping), ``project``, ``anonymous`` (no credentials: an emulator),
``endpoint_url`` (``http://host:port``: an emulator or a private endpoint). Without a key and not
anonymous, both clients use Google's default credentials of the host. In a deployment the options
come from an Airflow ``google_cloud_platform`` connection (``hooks/staging.py``); the core reads
no environment variable for them.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from datetime import UTC, timedelta
from typing import Any
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

#: Storage options a ``gs://`` root understands.
GCS_OPTIONS = frozenset({"keyfile_dict", "project", "anonymous", "endpoint_url"})
#: How long pyarrow's GCS client retries transient errors (its own default is 15 minutes).
RETRY_TIME_LIMIT_S = 60
#: The one scope staging needs: objects read, written and deleted, nothing else of the project.
_SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"
_INSTALL = "pip install 'airflow-provider-walsink[gcs]'"


class GcsStagingStore(ObjectStagingStore):
    """:class:`~.base.StagingBackend` on ``gs://bucket/prefix`` (module docstring: which client does what).

    Everything else (layout, confinement, manifest reads, sizes from a listing, GC's listing, the
    write probe) is :class:`~.object_store.StagingStore`'s, through :attr:`filesystem`.
    """

    #: The ``google-cloud-storage`` client (:meth:`_gcs`), made on first use.
    _gcs_client: Any = None

    @classmethod
    def open_root(cls, root: str, options: Mapping[str, Any]) -> StagingStore:
        parts = split_object_root(root)
        settings = _settings(root, options)
        base = f"{parts.netloc}/{parts.path.strip('/')}".rstrip("/")
        return cls(root, _filesystem(root, settings), base, kind="gs", options=settings)

    # ------------------------------------------------------------------ the seal

    def _seal_once(self, location: AttemptLocation, data: bytes, digest: str) -> str:
        """Upload the manifest create-only (``ifGenerationMatch=0``); a 412 means a manifest is
        there: the same bytes are that seal again, other bytes are refused (``AlreadySealedError``).
        The client retries a conditional upload on a transient error; a retry of an upload that
        did land answers 412 and is then recognised as the same seal."""
        from google.api_core import exceptions as gexc

        bucket, _, key = location.manifest_path.partition("/")
        blob = self._gcs().bucket(bucket).blob(key)
        try:
            blob.upload_from_string(data, content_type="application/json", if_generation_match=0)
        except gexc.PreconditionFailed:  # a manifest is there: sealed before
            return self._same_seal(location, digest)
        except (gexc.GoogleAPIError, OSError) as e:
            raise StagingStoreError(
                f"sealing {location.uri}/{MANIFEST_NAME} failed ({first_line(e)})"
            ) from None
        return digest

    # ------------------------------------------------------------------ listing with the service's checksums

    def stored_checksums(self, location: AttemptLocation) -> dict[str, tuple[int, str]]:
        """Every object under the attempt from one listing of the service: relative path ->
        (size, ``"crc32c:<8 hex>"``), the CRC32C GCS computed and keeps for the object (no data read)."""
        bucket, _, key = location.path.partition("/")
        prefix = key + "/"
        found: dict[str, tuple[int, str]] = {}
        for blob in self._gcs().list_blobs(bucket, prefix=prefix):
            if blob.name.endswith("/"):  # a "directory" placeholder another tool left
                continue
            crc = base64.b64decode(blob.crc32c).hex() if blob.crc32c else ""
            found[blob.name[len(prefix) :]] = (int(blob.size or 0), f"crc32c:{crc}")
        return found

    def child_dirs(self, path: str) -> list[str]:
        """The prefixes directly under ``path``, from the service's listing with a ``/`` delimiter:
        ``pyarrow``'s GCS listing gives only objects there, and an attempt's prefix has no
        object of its own (nothing writes directory markers)."""
        bucket, _, key = path.partition("/")
        prefix = f"{key}/" if key else ""
        pages = self._gcs().list_blobs(bucket, prefix=prefix, delimiter="/")
        for _blob in pages:  # the prefixes are known once every page is read
            pass
        return sorted(p[len(prefix) :].rstrip("/") for p in pages.prefixes)

    # ------------------------------------------------------------------ deleting

    def _delete_attempt(self, location: AttemptLocation) -> bool:
        """Delete every object under ``<attempt>/`` (located and checked by :meth:`remove_attempt`):
        listed by that prefix, deleted one by one; one already gone is not an error."""
        from google.api_core import exceptions as gexc

        bucket, _, key = location.path.partition("/")
        client = self._gcs()
        blobs = list(client.list_blobs(bucket, prefix=key + "/"))
        failed: list[str] = []
        for blob in blobs:
            try:
                blob.delete()
            except gexc.NotFound:
                pass
            except (gexc.GoogleAPIError, OSError) as e:
                failed.append(f"{blob.name}: {first_line(e)}")
        if failed:
            raise StagingStoreError(
                f"deleting {location.uri} failed for {len(failed)} objects (first: {failed[0]}); "
                "run the clean-up again"
            )
        return bool(blobs)

    def _delete_object(self, path: str) -> None:
        bucket, _, key = path.partition("/")
        self._gcs().bucket(bucket).blob(key).delete()

    # ------------------------------------------------------------------ the client

    def _gcs(self) -> Any:
        """The ``google-cloud-storage`` client of this root's options (made on first use)."""
        if self._gcs_client is None:
            try:
                from google.auth.credentials import AnonymousCredentials
                from google.cloud import storage
            except ImportError:
                raise StagingStoreError(
                    f"staging on gs:// needs google-cloud-storage for the seal: {_INSTALL}"
                ) from None
            o = self._options
            credentials: Any = None
            project = o.get("project")
            if o.get("anonymous"):
                credentials, project = AnonymousCredentials(), project or "<none>"
            elif o.get("keyfile_dict"):
                credentials = _service_account(self.root_uri, o["keyfile_dict"])
                project = project or credentials.project_id
            client_options = {"api_endpoint": o["endpoint_url"]} if o.get("endpoint_url") else None
            self._gcs_client = storage.Client(
                project=project, credentials=credentials, client_options=client_options
            )
        return self._gcs_client

    def __getstate__(self) -> dict[str, Any]:  # the client holds sockets; rebuilt where unpickled
        return {**self.__dict__, "_gcs_client": None}


def _settings(root: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` checked: known names, a usable endpoint, a key that parses (never shown)."""
    unknown = sorted(set(options) - GCS_OPTIONS)
    if unknown:
        raise StagingStoreError(
            f"staging root {root!r}: unknown GCS storage options {unknown}; known: {sorted(GCS_OPTIONS)}"
        )
    settings: dict[str, Any] = {k: v for k, v in options.items() if v not in (None, "")}
    anonymous = settings.get("anonymous", False)
    if isinstance(anonymous, str):
        anonymous = anonymous.strip().lower() in ("1", "true", "yes")
    settings["anonymous"] = bool(anonymous)
    if settings["anonymous"] and settings.get("keyfile_dict"):
        raise StagingStoreError(f"staging root {root!r}: give a service-account key or anonymous, not both")
    if settings.get("keyfile_dict"):
        settings["keyfile_dict"] = _key_info(root, settings["keyfile_dict"])
    endpoint = settings.get("endpoint_url")
    if endpoint:
        parts = urlsplit(str(endpoint))
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise StagingStoreError(f"staging root {root!r}: endpoint_url must be like http://host:port")
    return settings


def _key_info(root: str, key: Any) -> dict[str, Any]:
    """A service account's JSON key as a mapping; refused (without its content) when it is not one."""
    if isinstance(key, str | bytes):
        try:
            key = json.loads(key)
        except ValueError:
            raise StagingStoreError(
                f"staging root {root!r}: the service-account key is not JSON (give the key file's content)"
            ) from None
    if not isinstance(key, Mapping):
        raise StagingStoreError(f"staging root {root!r}: the service-account key must be a JSON object")
    missing = [k for k in ("client_email", "private_key", "token_uri") if not key.get(k)]
    if key.get("type") != "service_account" or missing:
        raise StagingStoreError(
            f"staging root {root!r}: the key is not a service account's JSON key (type "
            f"{key.get('type')!r}{', missing ' + ', '.join(missing) if missing else ''})"
        )
    return dict(key)


def _service_account(root: str, info: Mapping[str, Any]) -> Any:
    from google.oauth2 import service_account

    try:
        return service_account.Credentials.from_service_account_info(dict(info), scopes=[_SCOPE])
    except ValueError as e:
        raise StagingStoreError(
            f"staging root {root!r}: the service-account key cannot be used ({e})"
        ) from None


def _filesystem(root: str, settings: Mapping[str, Any]) -> Any:
    """``pyarrow.fs.GcsFileSystem`` for the data. pyarrow takes no key file: a service account's
    key is turned into an access token here (Google's token endpoint, through ``google-auth``),
    which the executors receive with the pickled file system and use until it expires (one hour)."""
    import pyarrow.fs as pafs

    # pyarrow's default retries a GCS endpoint that does not answer for 15 minutes: a UI page
    # or a trigger check would hang that long; transient errors rarely outlast a minute.
    kwargs: dict[str, Any] = {"retry_time_limit": timedelta(seconds=RETRY_TIME_LIMIT_S)}
    endpoint = settings.get("endpoint_url")
    if endpoint:
        parts = urlsplit(str(endpoint))
        kwargs["scheme"], kwargs["endpoint_override"] = parts.scheme, parts.netloc
    if settings.get("project"):
        kwargs["project_id"] = settings["project"]
    if settings.get("anonymous"):
        kwargs["anonymous"] = True
    elif settings.get("keyfile_dict"):
        from google.auth.exceptions import GoogleAuthError
        from google.auth.transport.requests import Request

        credentials = _service_account(root, settings["keyfile_dict"])
        try:
            credentials.refresh(Request())
        except (GoogleAuthError, OSError) as e:
            raise StagingStoreError(
                f"staging root {root!r}: no access token for the service account ({first_line(e)})"
            ) from None
        kwargs["access_token"] = credentials.token
        kwargs["credential_token_expiration"] = credentials.expiry.replace(tzinfo=UTC)
    return pafs.GcsFileSystem(**kwargs)
