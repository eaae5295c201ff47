"""The Spark services of ``docker/compose.yaml``, started as local processes on loopback.

The compose file is the description; this module runs it without Docker: the
``spark-master`` and ``spark-worker`` services' ``command:`` lists are started
with the virtualenv's ``spark-class`` (from the pip ``pyspark``), with only the
container-specific values mapped to local ones:

* the master's ``--host`` → ``127.0.0.1``, ``--port`` and ``--webui-port`` → free ports;
* each worker (``deploy.replicas`` of them): ``--webui-port`` → a free port,
  ``--work-dir`` → its own directory, the ``spark://<host>:<port>`` master URL →
  the local master; every other argument (``--cores``, ``--memory``...) is kept.
  Each worker is its own host, as each container is: worker N (and its
  executors) binds and advertises the loopback address ``127.0.0.<N+1>``
  (``SPARK_LOCAL_IP``). Spark tells hosts apart (it never runs a speculative
  copy of a task on the host of the first attempt, and schedules by locality),
  so one shared address would hide what a real cluster does;
* the Airflow connections (``AIRFLOW_CONN_*`` of ``x-airflow-common``):
  :meth:`SparkCluster.connections` returns them with the same mapping.

Every process runs in its own process group (the workers' executor JVMs are in
their worker's group); :meth:`SparkCluster.stop` kills the groups and copies the
logs to ``artifacts_dir``. ``SPARK_LOCAL_IP`` (``127.0.0.1`` for the master, the
worker's own ``127.0.0.<N+1>``) keeps the RPC endpoints and the web UIs on loopback.

Usage::

    with SparkCluster.from_compose(tmp, artifacts_dir=...) as cluster:
        cluster.master_url            # spark://127.0.0.1:<port>
        cluster.master_status()       # the master's /json/ (workers, apps)

Run as a script (``python tests/spark_cluster.py [ROOT]``) it starts the cluster,
prints its master URL and web UI and the connection URIs, and runs until Ctrl-C.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import yaml

REPO = Path(__file__).resolve().parent.parent
COMPOSE_FILE = REPO / "docker" / "compose.yaml"
MASTER_SERVICE = "spark-master"
WORKER_SERVICE = "spark-worker"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


class ClusterError(RuntimeError):
    """The cluster did not come up (or the compose file does not describe one); with log tails."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def spark_class() -> str:
    """``spark-class`` of the pip ``pyspark`` beside this interpreter."""
    import pyspark

    path = Path(pyspark.__file__).resolve().parent / "bin" / "spark-class"
    if not os.access(path, os.X_OK):
        raise ClusterError(f"{path} is missing or not executable: is the full pyspark package installed?")
    return str(path)


def load_compose(path: Path = COMPOSE_FILE) -> dict[str, Any]:
    """The compose file, parsed (anchors and merge keys resolved by PyYAML)."""
    return yaml.safe_load(path.read_text())


def _option(args: list[str], flag: str) -> str:
    try:
        return args[args.index(flag) + 1]
    except (ValueError, IndexError):
        raise ClusterError(f"the compose command {args} has no {flag} value") from None


def _replace_option(args: list[str], flag: str, value: str) -> list[str]:
    _option(args, flag)  # must be there: the mapping never invents settings
    out = list(args)
    out[out.index(flag) + 1] = value
    return out


def _service_command(compose: Mapping[str, Any], service: str, main_class: str) -> list[str]:
    command = [str(a) for a in compose["services"][service]["command"]]
    if command[:2] != ["spark-class", main_class]:
        raise ClusterError(f"service {service} must run `spark-class {main_class} ...`, not {command}")
    return command


def connection_env(compose: Mapping[str, Any]) -> dict[str, str]:
    """``AIRFLOW_CONN_*`` variables of the compose file's Airflow services (as written there)."""
    env = compose["x-airflow-common"]["environment"]
    return {k: str(v) for k, v in env.items() if k.startswith("AIRFLOW_CONN_")}


@dataclass(frozen=True)
class WorkerProcess:
    """One local worker: its loopback host, web UI port (they name the worker in executor log URLs)
    and work dir."""

    index: int
    webui_port: int
    work_dir: Path
    host: str = "127.0.0.1"

    @property
    def webui_url(self) -> str:
        return f"http://{self.host}:{self.webui_port}"


class SparkCluster:
    """A Spark standalone master and workers as local processes; see the module docstring."""

    def __init__(self, root: Path, compose: Mapping[str, Any], *, artifacts_dir: Path | None = None) -> None:
        self.root = Path(root).resolve()
        self.logs_dir = self.root / "logs"
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        self.compose = compose
        self.artifacts_dir = Path(artifacts_dir) if artifacts_dir else None
        self._procs: dict[str, subprocess.Popen] = {}
        self._logs: dict[str, Any] = {}

        self._master_cmd = _service_command(compose, MASTER_SERVICE, MASTER_CLASS)
        self.compose_master_host = _option(self._master_cmd, "--host")
        self.compose_master_port = int(_option(self._master_cmd, "--port"))
        worker_service = compose["services"][WORKER_SERVICE]
        self._worker_cmd = _service_command(compose, WORKER_SERVICE, WORKER_CLASS)
        compose_master_url = f"spark://{self.compose_master_host}:{self.compose_master_port}"
        if self._worker_cmd[-1] != compose_master_url:
            raise ClusterError(f"{WORKER_SERVICE} must end with the master URL {compose_master_url}")
        self._replicas = int(worker_service.get("deploy", {}).get("replicas", 1))
        self._assign_ports()

        self.env = {
            **os.environ,
            **{k: str(v) for k, v in compose["x-spark-common"]["environment"].items()},
            "SPARK_LOCAL_IP": "127.0.0.1",
            # The compose file's `python` is the image's; here, this interpreter (pyspark installed).
            "PYSPARK_PYTHON": sys.executable,
            "SPARK_LOG_DIR": str(self.logs_dir),
            "SPARK_NO_DAEMONIZE": "1",
            # A port taken between free_port() and the bind fails the process (then start() takes
            # new ports) instead of Spark moving to the next port, where nothing would look for it.
            "SPARK_DAEMON_JAVA_OPTS": " ".join(
                filter(None, [os.environ.get("SPARK_DAEMON_JAVA_OPTS"), "-Dspark.port.maxRetries=0"])
            ),
        }

    def _assign_ports(self) -> None:
        """Free loopback ports for the master (RPC, web UI) and each worker's web UI, and the
        commands that use them."""
        self.port = free_port()
        self.webui_port = free_port()
        self.rest_port = free_port()  # Spark's default 6066 is one per machine: a second cluster's is taken
        self.master_url = f"spark://127.0.0.1:{self.port}"
        self.webui_url = f"http://127.0.0.1:{self.webui_port}"
        cmd = _replace_option(self._master_cmd, "--host", "127.0.0.1")
        cmd = _replace_option(cmd, "--port", str(self.port))
        self.master_command = [spark_class(), *_replace_option(cmd, "--webui-port", str(self.webui_port))[1:]]
        self.workers: list[WorkerProcess] = []
        self.worker_commands: list[list[str]] = []
        for i in range(self._replicas):
            worker = WorkerProcess(i + 1, free_port(), self.root / f"worker-{i + 1}", host=f"127.0.0.{i + 2}")
            worker.work_dir.mkdir(parents=True, exist_ok=True)
            cmd = _replace_option(self._worker_cmd, "--webui-port", str(worker.webui_port))
            cmd = _replace_option(cmd, "--work-dir", str(worker.work_dir))
            self.workers.append(worker)
            self.worker_commands.append([spark_class(), *cmd[1:-1], self.master_url])

    @classmethod
    def from_compose(
        cls, root: Path, *, compose_file: Path = COMPOSE_FILE, artifacts_dir: Path | None = None
    ) -> SparkCluster:
        return cls(root, load_compose(compose_file), artifacts_dir=artifacts_dir)

    # -- connections ---------------------------------------------------------------------------

    def connections(self, **walsink_overrides: Any) -> dict[str, dict[str, Any]]:
        """The compose file's Airflow connections ``{conn_id: JSON form}``, mapped to this cluster.

        The Spark connection's master becomes the local master; ``walsink_overrides``
        replace fields of the walsink connection (host, port, schema, login, password)
        and keys of its extra (``staging_root``), since the committer database and the
        shared volume are the test's own.
        """
        out: dict[str, dict[str, Any]] = {}
        for var, value in connection_env(self.compose).items():
            conn = json.loads(value)
            conn_id = var[len("AIRFLOW_CONN_") :].lower()
            if conn["conn_type"] == "spark":
                host = urlsplit(f"{conn['host']}:{conn['port']}")
                if (host.hostname, host.port) != (self.compose_master_host, self.compose_master_port):
                    raise ClusterError(f"connection {conn_id} does not point at the compose file's master")
                conn["host"], conn["port"] = "spark://127.0.0.1", self.port
            elif conn["conn_type"] == "walsink":
                fields = {k: v for k, v in walsink_overrides.items() if k != "extra"}
                extra = {**conn.get("extra", {}), **walsink_overrides.get("extra", {})}
                conn = {**conn, **fields, "extra": extra}
            out[conn_id] = conn
        return out

    # -- lifecycle -----------------------------------------------------------------------------

    def __enter__(self) -> SparkCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _spawn(
        self, name: str, command: list[str], *, host: str = "127.0.0.1", env: Mapping[str, str] = {}
    ) -> None:
        log = open(self.logs_dir / f"{name}.out", "ab")  # noqa: SIM115 - closed in stop()
        self._logs[name] = log
        self._procs[name] = subprocess.Popen(
            command,
            env={**self.env, **env, "SPARK_LOCAL_IP": host},
            cwd=self.root,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def start(self, timeout: float = 180, attempts: int = 3) -> None:
        """Start the master, wait for its JSON status, start the workers, wait until all are ALIVE.

        A process that could not bind its port (another process took it after ``free_port()``)
        ends the attempt: everything started is stopped and the next attempt takes new ports.
        """
        for attempt in range(1, attempts + 1):
            logged = {p: p.stat().st_size for p in self.logs_dir.glob("*.out")}
            try:
                self._start_once(timeout)
                return
            except ClusterError:
                self.stop(save_logs=False)
                if attempt == attempts or not self._bind_failed(logged):
                    raise
                self._assign_ports()

    def _bind_failed(self, logged: dict[Path, int]) -> bool:
        """Whether a log written since ``logged`` (sizes before the attempt) shows a port taken."""
        for path in self.logs_dir.glob("*.out"):
            with path.open("rb") as f:
                f.seek(logged.get(path, 0))
                if re.search(rb"BindException|Address already in use|could not bind", f.read()):
                    return True
        return False

    def _start_once(self, timeout: float) -> None:
        opts = " ".join(
            filter(None, [self.env.get("SPARK_MASTER_OPTS"), f"-Dspark.master.rest.port={self.rest_port}"])
        )
        self._spawn("master", self.master_command, env={"SPARK_MASTER_OPTS": opts})
        self.wait_until("the master's /json/", lambda: self.master_status(), timeout)
        for worker, command in zip(self.workers, self.worker_commands, strict=True):
            self._spawn(f"worker-{worker.index}", command, host=worker.host)
        want = {w.webui_url for w in self.workers}

        def all_alive() -> bool:
            alive = {w["webuiaddress"] for w in self.master_status()["workers"] if w["state"] == "ALIVE"}
            return want <= alive

        self.wait_until(f"{len(want)} workers to register as ALIVE", all_alive, timeout)

    def stop(self, grace: float = 15, *, save_logs: bool = True) -> None:
        """Kill every process group (master, workers and their executors), save the logs."""
        for proc in self._procs.values():
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self._procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _signal_group(proc, signal.SIGKILL)  # executors left in the group go too
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self._procs.clear()
        for log in self._logs.values():
            log.close()
        self._logs.clear()
        if self.artifacts_dir and save_logs:
            self.artifacts_dir.mkdir(parents=True, exist_ok=True)
            shutil.copytree(self.logs_dir, self.artifacts_dir / "logs", dirs_exist_ok=True)
            for worker in self.workers:  # executor stdout/stderr, per app and executor id
                shutil.copytree(
                    worker.work_dir, self.artifacts_dir / f"worker-{worker.index}-work", dirs_exist_ok=True
                )

    # -- status --------------------------------------------------------------------------------

    def master_status(self) -> dict[str, Any]:
        """The master's ``/json/``: workers (id, webuiaddress, state, cores), active/completed apps."""
        response = httpx.get(f"{self.webui_url}/json/", timeout=10)
        response.raise_for_status()
        return response.json()

    def worker_of_webui(self, url: str) -> WorkerProcess:
        """The local worker whose web UI is at ``url`` (scheme, host and port compared)."""
        port = urlsplit(url).port
        for worker in self.workers:
            if worker.webui_port == port:
                return worker
        raise KeyError(url)

    def log_tail(self, lines: int = 30) -> str:
        out = []
        for path in sorted(self.logs_dir.glob("*.out")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"\n--- {path.name} (last {len(text)} lines) ---\n" + "\n".join(text))
        return "".join(out)

    def wait_until(self, what: str, predicate: Any, timeout: float) -> Any:
        """Poll ``predicate`` until truthy; ClusterError naming ``what`` (and the logs) on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            dead = {n: p.returncode for n, p in self._procs.items() if p.poll() is not None}
            if dead:
                raise ClusterError(f"Spark process(es) exited: {dead}" + self.log_tail())
            try:
                value = predicate()
                if value:
                    return value
            except (httpx.HTTPError, json.JSONDecodeError):
                # Not answering yet, or not with JSON: a page that is not the master's status
                # (seen once: an HTML page at /json/ while the master started) is waited out too.
                pass
            if time.monotonic() > deadline:
                raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}" + self.log_tail())
            time.sleep(0.5)


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def main() -> int:
    import tempfile

    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="walsink-spark-"))
    with SparkCluster.from_compose(root) as cluster:
        print(f"Spark master {cluster.master_url}, web UI {cluster.webui_url}, logs {cluster.logs_dir}")
        for conn_id, conn in cluster.connections().items():
            print(f"connection {conn_id}: {json.dumps(conn)}")
        print("Ctrl-C stops the cluster.", flush=True)
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
