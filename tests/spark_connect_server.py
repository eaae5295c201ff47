"""A Spark Connect server from the virtualenv's pyspark, as a local process on loopback.

The pyspark wheel ships the server (``pyspark/jars/spark-connect_2.13-*.jar``): it is started
with that wheel's ``spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer``
on a free loopback port, over ``local[2]`` (or a given master, e.g. the standalone cluster of
``tests/spark_cluster.py``), with this interpreter as the executors' Python (``spark.pyspark.python``:
the executors' writer imports pyarrow and walsink) and a 1 GiB driver. It runs in its own process
group; :meth:`ConnectServer.stop` kills the group and keeps the log.

Usage::

    with ConnectServer.start(tmp_dir) as server:   # or .launch() now, .wait_ready() when needed
        server.url                       # sc://127.0.0.1:<port>
        server.connection_env("spark_connect_test")   # AIRFLOW_CONN_... for it

Run as a script (``python tests/spark_connect_server.py [DIR]``) it starts a server, prints its
URL and runs until Ctrl-C.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the parent (this test process) dies (Linux)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class ConnectServerError(RuntimeError):
    """The server did not come up; with the tail of its log."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def pyspark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def connect_jar() -> Path:
    """The Spark Connect server jar the pyspark wheel ships."""
    jars = sorted((pyspark_home() / "jars").glob("spark-connect_*.jar"))
    if not jars:
        raise ConnectServerError(
            f"no spark-connect_*.jar under {pyspark_home() / 'jars'}: is the full pyspark installed?"
        )
    return jars[-1]


class ConnectServer:
    """One Spark Connect server process (see the module docstring)."""

    def __init__(
        self,
        work_dir: Path,
        *,
        master: str = "local[2]",
        port: int | None = None,
        token: str | None = None,
        conf: dict[str, str] | None = None,
        driver_memory: str = "1g",
    ) -> None:
        self.work_dir = Path(work_dir)
        #: The token clients must send (``spark.connect.authenticate.token``); ``None``: any.
        self.token = token
        #: More ``--conf`` for the server's Spark application (executor sizes on a cluster).
        self.conf = dict(conf or {})
        self.driver_memory = driver_memory
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.master = master
        self.port = port or free_port()
        self.log_path = self.work_dir / "connect-server.log"
        self._proc: subprocess.Popen | None = None
        self._ready = False

    @property
    def url(self) -> str:
        """``sc://127.0.0.1:<port>``, once the server serves."""
        self.wait_ready()
        return f"sc://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        conf = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.pyspark.python": sys.executable,
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
        }
        if self.token:
            conf["spark.connect.authenticate.token"] = self.token
        conf.update(self.conf)
        cmd = [str(pyspark_home() / "bin" / "spark-submit"), "--class", SERVER_CLASS, "--master", self.master]
        cmd += ["--driver-memory", self.driver_memory, "--name", "walsink-tests-connect"]
        for key, value in conf.items():
            cmd += ["--conf", f"{key}={value}"]
        return [*cmd, str(connect_jar())]

    def launch(self) -> ConnectServer:
        """Start the process and return at once (:meth:`wait_ready` waits for it to serve)."""
        env = os.environ.copy()
        env["PYSPARK_PYTHON"] = sys.executable
        env["SPARK_LOCAL_IP"] = "127.0.0.1"
        with self.log_path.open("wb") as log:
            self._proc = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=self.work_dir,
                start_new_session=True,
                # The server goes when this process does, even killed (a timeout, Ctrl-C twice):
                # spark-submit execs the JVM, which keeps the parent-death signal.
                preexec_fn=_die_with_parent,
            )
        self._ready = False
        return self

    def wait_ready(self, timeout: float = 120.0) -> ConnectServer:
        """Return once the server serves on its port (at once after the first time)."""
        if self._ready:
            return self
        if self._proc is None:
            raise ConnectServerError("the Connect server was not launched")
        deadline = time.monotonic() + timeout
        started = f"Spark Connect server started at: 127.0.0.1:{self.port}"
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise ConnectServerError(
                    f"the Connect server exited with {self._proc.returncode}:\n{self.log_tail()}"
                )
            if started in self.log_path.read_text(errors="replace"):
                self._ready = True
                return self
            time.sleep(0.3)
        self.stop()
        raise ConnectServerError(
            f"the Connect server did not start within {timeout:.0f} s:\n{self.log_tail()}"
        )

    @classmethod
    def start(cls, work_dir: Path, **kwargs) -> ConnectServer:
        """Launch a server and wait until it serves."""
        return cls(work_dir, **kwargs).launch().wait_ready()

    def log_tail(self, lines: int = 30) -> str:
        if not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def connection_env(self, conn_id: str, **extra) -> dict[str, str]:
        """``AIRFLOW_CONN_<ID>``: a ``spark_connect`` connection to this server (once it serves)."""
        self.wait_ready()
        doc = {"conn_type": "spark_connect", "host": "127.0.0.1", "port": self.port}
        if extra:
            doc["extra"] = extra
        return {f"AIRFLOW_CONN_{conn_id.upper()}": json.dumps(doc)}

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        except ProcessLookupError:
            pass

    def __enter__(self) -> ConnectServer:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


if __name__ == "__main__":  # pragma: no cover - a manual tool
    import tempfile

    directory = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="walsink-connect-"))
    with ConnectServer.start(directory) as server:
        print(f"Spark Connect server at {server.url} (log {server.log_path}); Ctrl-C stops it", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
