"""Staging on an object store in the model checker: a schedule's table and its staging live under
one prefix of the bucket (container) of an emulator on loopback, reached by the real clients.

=========  ====================  ============  =======================================================
staging    emulator              target kinds  why not Delta
=========  ====================  ============  =======================================================
``s3``     moto's S3 API server  iceberg,
                                 delta
``gs``     fake-gcs-server       iceberg       deltalake's GCS client writes through the XML API,
                                               which fake-gcs-server answers with 400
``abfss``  Azurite               iceberg       not yet one of the checker's combinations (walsink's
                                               Delta target on ``abfss://`` is tested on Azurite
                                               3.37 in tests/test_delta_target.py)
=========  ====================  ============  =======================================================

A target kind commits a checkpoint staged on an object store by reference (the table references
the staged objects in place), so the table is on the same store as its staging. The Iceberg
catalog stays an SQLite file; the table's metadata and data live in the bucket, read and written
by pyiceberg's file IO: pyarrow's for ``gs://``, adlfs (fsspec) for ``abfss://`` (pyiceberg's
pyarrow file IO takes ``container@account`` for the container's name there).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

#: The bucket (Azure: the container) every store's emulator serves.
BUCKET = "walsink"
#: Target kinds that can take a checkpoint staged on each object store (see the module's table).
KINDS: dict[str, tuple[str, ...]] = {"s3": ("iceberg", "delta"), "gs": ("iceberg",), "abfss": ("iceberg",)}
#: The emulator's account (Azurite) and project (fake-gcs-server).
ACCOUNT = "walsinkdev"
PROJECT = "walsink-test"
#: pyiceberg's GCS file IO has no anonymous setting: a bearer token the emulator does not check,
#: with the expiry pyarrow wants beside it (2100-01-01, in milliseconds).
_UNCHECKED_TOKEN = {"gcs.oauth2.token": "emulator", "gcs.oauth2.token-expires-at": "4102444800000"}


@dataclass(frozen=True)
class ObjectStore:
    """One emulator as a schedule reaches it (picklable: the fork server's children get it)."""

    scheme: str  # s3 | gs | abfss
    endpoint: str  # s3, gs: http://host:port; abfss: the account's blob endpoint, http://host:port/<account>
    key: str = ""  # abfss: the account key Azurite was started with

    def root(self, prefix: str) -> str:
        """The URI of ``prefix`` in the bucket, as a staging root and a table location name it."""
        if self.scheme == "abfss":
            return f"abfss://{BUCKET}@{ACCOUNT}.dfs.core.windows.net/{prefix}"
        return f"{self.scheme}://{BUCKET}/{prefix}"

    def options(self) -> dict[str, Any]:
        """:meth:`StagingStore.open` options of a root on this store."""
        if self.scheme == "s3":
            from tests.table_fixtures import ACCESS_KEY, REGION, SECRET_KEY

            return {"endpoint_url": self.endpoint, "access_key": ACCESS_KEY, "secret_key": SECRET_KEY,
                    "region": REGION}  # fmt: skip
        if self.scheme == "gs":
            return {"endpoint_url": self.endpoint, "anonymous": True, "project": PROJECT}
        return {"account_key": self.key, "endpoint_url": self.endpoint}

    def iceberg_properties(self) -> dict[str, str]:
        """pyiceberg's file IO properties for this store (the catalog's, the connection's extra)."""
        if self.scheme == "s3":
            return self._s3().iceberg_properties()
        if self.scheme == "gs":
            return {"gcs.service.host": self.endpoint, "gcs.project-id": PROJECT, **_UNCHECKED_TOKEN}
        # adlfs takes the emulator's endpoint only in a connection string.
        return {"adls.account-name": ACCOUNT, "adls.account-key": self.key,
                "adls.connection-string": f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};"
                                          f"AccountKey={self.key};BlobEndpoint={self.endpoint};"}  # fmt: skip

    def delta_options(self) -> dict[str, str]:
        """deltalake's storage options for this store."""
        if self.scheme == "s3":
            return self._s3().delta_options()
        raise ValueError(f"no Delta table on {self.scheme} here: {KINDS}")

    def delete(self, prefix: str) -> int:
        """Delete every object under ``prefix/`` through the store's own API (the emulators keep
        every object in memory); how many."""
        if self.scheme == "s3":
            import boto3

            o = self.options()
            s3 = boto3.client("s3", endpoint_url=o["endpoint_url"], aws_access_key_id=o["access_key"],
                              aws_secret_access_key=o["secret_key"], region_name=o["region"])  # fmt: skip
            pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=f"{prefix}/")
            keys = [obj["Key"] for page in pages for obj in page.get("Contents", [])]
            for i in range(0, len(keys), 1000):
                s3.delete_objects(
                    Bucket=BUCKET, Delete={"Objects": [{"Key": k} for k in keys[i : i + 1000]], "Quiet": True}
                )
            return len(keys)
        if self.scheme == "gs":
            from google.auth.credentials import AnonymousCredentials
            from google.cloud import storage

            client = storage.Client(project=PROJECT, credentials=AnonymousCredentials(),
                                    client_options={"api_endpoint": self.endpoint})  # fmt: skip
            blobs = list(client.list_blobs(BUCKET, prefix=f"{prefix}/"))
            for blob in blobs:
                blob.delete()
            return len(blobs)
        from azure.storage.blob import ContainerClient

        container = ContainerClient(
            self.endpoint, BUCKET, credential={"account_name": ACCOUNT, "account_key": self.key}
        )
        names = [b.name for b in container.list_blobs(name_starts_with=f"{prefix}/")]
        for name in names:
            container.delete_blob(name)
        return len(names)

    def _s3(self) -> Any:
        from tests.table_fixtures import S3Server

        return S3Server(self.endpoint, BUCKET)


@contextlib.contextmanager
def serve(scheme: str, *, memory_mib: int = 256) -> Iterator[ObjectStore]:
    """The emulator of ``scheme`` on a free loopback port, its bucket created; stopped on leaving
    (``memory_mib``: Azurite's in-memory limit)."""
    if scheme == "s3":
        from tests.moto_server import serve as moto

        with moto(BUCKET) as endpoint:
            yield ObjectStore("s3", endpoint)
    elif scheme == "gs":
        from tests.gcs_server import serve as gcs

        with gcs() as server:
            yield ObjectStore("gs", server.endpoint)
    elif scheme == "abfss":
        from tests.azurite_server import serve as azurite

        with azurite(memory_mib) as server:
            yield ObjectStore("abfss", server.endpoint, server.key)
    else:
        raise ValueError(f"an object store is one of {sorted(KINDS)}, not {scheme!r}")


def start(scheme: str, drops: list[Callable[[], None]]) -> ObjectStore:
    """:func:`serve` for a command line: the emulator, stopped by ``drops``."""
    stack = contextlib.ExitStack()
    store = stack.enter_context(serve(scheme))
    drops.append(stack.close)
    return store


def of_server(server: Any) -> ObjectStore:
    """The :class:`ObjectStore` of a session fixture's ``gcs_server`` or ``azurite_server``."""
    from tests.azurite_server import AzuriteServer

    if isinstance(server, AzuriteServer):
        return ObjectStore("abfss", server.endpoint, server.key)
    return ObjectStore("gs", server.endpoint)
