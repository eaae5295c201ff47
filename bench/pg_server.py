"""A private PostgreSQL server for a benchmark that counts connections (``bench_group.py
--own-server``): the machine's PostgreSQL binaries (Debian's ``postgresql-15``), a fresh
cluster in a temporary directory on a free loopback port, ``max_connections`` as asked and
the rest at PostgreSQL's defaults, trust authentication on loopback. A shared server's
connection limit is also spent by whoever else uses it, so "K tasks fit in 100 connections"
can only be measured on a server of one's own.

It runs under ``tests/guard.py`` (as the ``postgres`` user when started by root: PostgreSQL
refuses to run as root), so it ends with the process that started it; the directory is
removed when the block ends.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

GUARD = Path(__file__).resolve().parent.parent / "tests" / "guard.py"


def _bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}")) or (
        [shutil.which(name)] if shutil.which(name) else []
    )
    if not found:
        raise FileNotFoundError(
            f"PostgreSQL's {name} is not installed (Debian: apt-get install -y postgresql)"
        )
    return found[-1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def private_postgres(max_connections: int = 100) -> Iterator[str]:
    """A fresh PostgreSQL server until the block ends; yields the admin URL of its ``postgres``
    database (user ``postgres``, no password)."""
    root = Path(tempfile.mkdtemp(prefix="walsink-bench-pg-"))
    data = root / "data"
    as_user: list[str] = []
    if os.geteuid() == 0:
        pw = pwd.getpwnam("postgres")
        os.chown(root, pw.pw_uid, pw.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    port = _free_port()
    process = None
    try:
        subprocess.run(
            [*as_user, _bin("initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"],
            check=True,
            capture_output=True,
        )
        log = open(root / "server.log", "wb")  # noqa: SIM115 - the server's, closed below
        process = subprocess.Popen(
            [sys.executable, str(GUARD), str(os.getpid()), "--", *as_user, _bin("postgres"), "-D", str(data),
             "-p", str(port), "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={root}",
             "-c", f"max_connections={max_connections}"],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while subprocess.run(
            [_bin("pg_isready"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres"], capture_output=True
        ).returncode:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"PostgreSQL did not start: {(root / 'server.log').read_text()[-2000:]}")
            time.sleep(0.2)
        yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/postgres"
    finally:
        if process is not None:
            process.terminate()  # the guard stops the server (SIGTERM: smart shutdown) and exits
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            log.close()
        shutil.rmtree(root, ignore_errors=True)
