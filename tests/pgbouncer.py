"""PgBouncer (Debian package ``pgbouncer``) in transaction pooling mode in front of the test
PostgreSQL, on a free loopback port: what a deployment with hundreds of commit tasks puts
between them and the committer database (docs/production.md, "PgBouncer").

Every database on the server is reachable through it under its own name (``* =`` in
``[databases]``), so a test's private database is: :meth:`PgBouncer.url` turns a direct URL into
the same database through PgBouncer. Transaction mode, ``default_pool_size`` server connections
per database and user, ``auth_type = trust`` (the test server trusts loopback too). It runs under
``tests/guard.py``, so it ends with the process that started it however that ends (as root it
drops to the ``postgres`` user, PgBouncer refuses to run as root, and a parent-death signal would
not survive that change of user). Used by the test session (``pgbouncer`` fixture) and by
``bench/bench_group.py --pgbouncer``.
"""

from __future__ import annotations

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
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.engine import make_url

GUARD = Path(__file__).with_name("guard.py")
INSTALL_HINT = "PgBouncer is not installed (Debian: apt-get install -y pgbouncer; scripts/setup.sh does)"


@dataclass(frozen=True)
class PgBouncer:
    host: str
    port: int
    #: Server connections per database and user (``default_pool_size``).
    pool_size: int
    log_path: Path

    def url(self, direct: str) -> str:
        """The database of the direct URL ``direct``, reached through PgBouncer."""
        return make_url(direct).set(host=self.host, port=self.port).render_as_string(hide_password=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _config(workdir: Path, port: int, server: str, pool_size: int, user: str | None) -> Path:
    server_url = make_url(server)
    (workdir / "users.txt").write_text(f'"{server_url.username or "postgres"}" ""\n')
    ini = workdir / "pgbouncer.ini"
    ini.write_text(
        "\n".join(
            [
                "[databases]",
                f"* = host={server_url.host or '127.0.0.1'} port={server_url.port or 5432}",
                "[pgbouncer]",
                "listen_addr = 127.0.0.1",
                f"listen_port = {port}",
                "unix_socket_dir =",
                "auth_type = trust",
                f"auth_file = {workdir / 'users.txt'}",
                "pool_mode = transaction",
                f"default_pool_size = {pool_size}",
                "min_pool_size = 0",
                "reserve_pool_size = 0",
                # Hundreds of commit tasks are clients; the server sees only the pool.
                "max_client_conn = 1000",
                "server_idle_timeout = 60",
                *([f"user = {user}"] if user else []),
                "",
            ]
        )
    )
    return ini


@contextmanager
def running_pgbouncer(
    server: str, *, pool_size: int = 20, workdir: Path | None = None
) -> Iterator[PgBouncer]:
    """PgBouncer in front of the PostgreSQL server of the URL ``server`` until the block ends.

    Raises ``FileNotFoundError`` (:data:`INSTALL_HINT`) when the binary is missing and
    ``RuntimeError`` with its log when it does not serve.
    """
    binary = shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.access(p, os.X_OK)), None
    )
    if binary is None:
        raise FileNotFoundError(INSTALL_HINT)
    own_dir = workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="walsink-pgbouncer-")) if workdir is None else workdir
    user = None
    if os.geteuid() == 0:
        user = "postgres"
        pw = pwd.getpwnam(user)
        os.chown(workdir, pw.pw_uid, pw.pw_gid)  # its files, read again after it drops to the user
    port = _free_port()
    ini = _config(workdir, port, server, pool_size, user)
    log_path = workdir / "pgbouncer.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, str(GUARD), str(os.getpid()), "--", binary, str(ini)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"pgbouncer exited ({process.returncode}): {log_path.read_text()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"pgbouncer did not listen on {port}: {log_path.read_text()[-2000:]}"
                    ) from None
                time.sleep(0.05)
        yield PgBouncer("127.0.0.1", port, pool_size, log_path)
    finally:
        process.terminate()  # the guard ends pgbouncer and exits
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if own_dir:
            shutil.rmtree(workdir, ignore_errors=True)
