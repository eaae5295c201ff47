"""Azurite (Microsoft's emulator of Azure Storage, npm package ``azurite``, installed by
scripts/setup.sh) serving the Blob API on a loopback port, one per test session.

Started on first use, in memory, with telemetry off, for one storage account of this session
(``AZURITE_ACCOUNTS``: its name and a key made here, so a wrong key is refused) and a container
``walsink``; stopped at the end of the session, and killed by the kernel if the test process dies
first (parent-death signal). Nothing is put in the tests' environment: the stores reach it through
their options (``account_key``, ``endpoint_url``), as a ``wasb`` or ``adls`` connection gives them.
"""

from __future__ import annotations

import base64
import contextlib
import os
import secrets
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.gcs_server import emulator, free_port

ACCOUNT = "walsinkdev"
CONTAINER = "walsink"


@dataclass(frozen=True)
class AzuriteServer:
    endpoint: str  # http://127.0.0.1:PORT/<account>: the account's blob endpoint, path style
    account: str
    key: str
    bucket: str  # the container, named as the other servers name their bucket

    @property
    def options(self) -> dict[str, Any]:
        """The storage options of an ``abfss://`` root on this server."""
        return {"account_key": self.key, "endpoint_url": self.endpoint}

    def root(self, prefix: str, container: str | None = None) -> str:
        """An ``abfss://`` staging root under ``prefix`` in the session's container."""
        return f"abfss://{container or self.bucket}@{self.account}.dfs.core.windows.net/{prefix}"

    def _container(self, name: str | None = None) -> Any:
        from azure.storage.blob import BlobServiceClient

        client = BlobServiceClient(
            self.endpoint, credential={"account_name": self.account, "account_key": self.key}
        )
        return client.get_container_client(name or self.bucket)

    def list(self, prefix: str) -> list[str]:
        """The names of the container's blobs under ``prefix``, from the Blob API itself."""
        return [blob.name for blob in self._container().list_blobs(name_starts_with=prefix)]

    def create_bucket(self, name: str) -> None:
        self._container(name).create_container()


@contextlib.contextmanager
def serve(memory_mib: int = 256) -> Iterator[AzuriteServer]:
    """Azurite on a free loopback port, with this session's account and the container, stopped on
    leaving (the session fixture, the model checker's command line and bench/ start it through this);
    ``memory_mib``: its in-memory store's limit (a write past it is answered 409)."""
    program = shutil.which("azurite-blob")
    if program is None:
        raise FileNotFoundError("Azurite is not installed (bash scripts/setup.sh installs it from npm)")
    key = base64.b64encode(secrets.token_bytes(64)).decode()
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}/{ACCOUNT}"

    def answers() -> bool:
        try:
            urllib.request.urlopen(f"{endpoint}?comp=list", timeout=1).close()
        except urllib.error.HTTPError:  # any HTTP answer (403 without credentials): it listens
            return True
        except OSError:
            return False
        return True

    # Keep-alive longer than a test's pauses: pyarrow's Azure client reuses pooled connections,
    # and one the server has closed costs it about 7 s of retries.
    argv = [program, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--inMemoryPersistence",
            "--extentMemoryLimit", str(memory_mib), "--blobKeepAliveTimeout", "600", "--disableTelemetry", "--silent",
            "--skipApiVersionCheck"]  # fmt: skip
    with emulator("Azurite", argv, answers, env={**os.environ, "AZURITE_ACCOUNTS": f"{ACCOUNT}:{key}"}):
        server = AzuriteServer(endpoint, ACCOUNT, key, CONTAINER)
        server.create_bucket(CONTAINER)
        yield server


@pytest.fixture(scope="session")
def azurite_server():
    from tests.helpers import missing_prerequisite

    if shutil.which("azurite-blob") is None:
        missing_prerequisite("Azurite is not installed (bash scripts/setup.sh installs it from npm)")
    with serve() as server:
        yield server
