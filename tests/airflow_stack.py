"""A real Airflow 3.3 stack for end-to-end tests: scheduler, dag-processor,
triggerer and api-server, each a separate process on its own Airflow home.

Why a whole stack: backfills, deferral, clearing and the UI plugin only exist
when the real components talk to each other (the scheduler creates runs, the
LocalExecutor's task processes report to the api-server's execution API, the
triggerer runs deferred sensors). ``dag.test()`` exercises none of that.

One runner for the demo (``scripts/demo.py``) and the end-to-end
tests. Usage (pytest: the
session-scoped ``airflow_stack`` fixture in ``conftest.py`` builds one with the repo's
``dags/`` folder and a private PostgreSQL metadata database, started once and shared)::

    from airflow_stack import AirflowStack

    with AirflowStack.create(tmp_dir, artifacts_dir=...) as stack:   # started on enter
        stack.wait_for_dag("walsink_daily_overwrite")
        stack.unpause("walsink_daily_overwrite")
        backfill_id = stack.backfill("walsink_daily_overwrite", "2026-01-01", "2026-01-05")
        runs = stack.wait_for_backfill(backfill_id)
        stack.task_states("walsink_daily_overwrite", runs[0]["dag_run_id"])

    # REST as any configured user (JWT from POST /auth/token):
    stack.client("viewer").get("/api/v2/dags").json()

For a browser (issue 4's UI tests), everything needed is public:

* ``stack.base_url`` - ``http://127.0.0.1:<free port>`` (the api-server serves
  the UI, the REST API, ``/auth/login`` and any plugin's FastAPI app);
* ``stack.users`` - ``{name: StackUser(name, role, password)}``; by default
  ``admin`` (admin role) and ``viewer`` (viewer role, a restricted user),
  passwords fixed in advance (``SimpleAuthManager`` reads them from the
  passwords file this module writes), so a browser can fill in the login form;
* ``stack.login_cookie(user)`` - the ``_token`` cookie the login form would set,
  for ``context.add_cookies([...])`` when a test is not about logging in;
* ``AirflowStack.create(..., plugins_folder=..., env={...}, components=(...))`` -
  load a plugins folder, add ``AIRFLOW__...`` settings, or start only the
  api-server (``components=("api-server",)``) when no DAG needs to run;
* ``scheduled_runs=False`` (default): the scheduler creates no runs from schedules
  (``[scheduler] use_job_schedule``), only backfills and triggered runs, so a test
  decides exactly which intervals run. That switch also stops asset-triggered runs:
  ``with stack.asset_scheduling(keep_unpaused=[dag_id]):`` lets the scheduler create
  them (and only them) for a while.

Each component runs under a guard (``tests/guard.py``) in its own process group;
``stop()`` (also on ``__exit__`` and at the end of the fixture) asks each guard to end
its component's whole tree, then kills what is left. If the process that started the
stack dies without stopping it (SIGKILL, a CI timeout's SIGTERM), the guards end every
component within seconds: nothing keeps running, holding ports and CPU.

On SQLite (the embedded default, used by the demo) every Airflow process gets a long
busy timeout in the metadata database's URL (``?timeout=``; Airflow itself turns on
WAL), CLI steps that still meet "database is locked" are retried, and the scheduler
heartbeats less often. Every component's output and the task logs are copied to
``artifacts_dir`` when the stack stops; ``StackError`` messages (timeouts,
failed CLI calls) end with the tail of the component logs.

The configuration is passed as ``AIRFLOW__*`` environment variables to every
process (nothing is inherited from the calling process's ``AIRFLOW__*``
settings), so the stack never touches the test session's own Airflow home. No
``AWS_*`` variable is inherited either: object stores are reached through connections only.
``stack.env`` is that environment: ``subprocess.run([...], env=stack.env)``
runs any ``airflow`` command against the stack.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

# A checkout's root (its dags/ is the default dags folder); meaningless in an installed wheel.
REPO = Path(__file__).resolve().parent.parent
DEFAULT_COMPONENTS = ("api-server", "dag-processor", "scheduler", "triggerer")
TERMINAL_RUN_STATES = frozenset({"success", "failed"})

# Airflow's SQLite metadata database (the embedded default): Airflow turns on WAL itself
# (airflow.utils.orm_event_handlers); the driver's 5 s busy timeout is what a busy laptop
# exceeds ("database is locked" from `airflow backfill create` while the scheduler writes).
# The timeout goes in the URL (SQLAlchemy's pysqlite and aiosqlite dialects read `?timeout=`),
# not in `[database] sql_alchemy_connect_args`: that is an import path, and the demo's env.sh
# must work in any shell, with no module of this checkout on the path (issue 47).
SQLITE_BUSY_TIMEOUT_S = 120
_LOCKED = "database is locked"
LOCK_RETRIES = 5


class StackError(RuntimeError):
    """Something in the stack did not happen; the message carries the component log tails."""


@dataclass(frozen=True)
class StackUser:
    """A SimpleAuthManager user: name, role (viewer, user, op, admin) and password."""

    name: str
    role: str
    password: str


DEFAULT_USERS = (
    StackUser("admin", "admin", "admin-" + "walsink"),
    StackUser("viewer", "viewer", "viewer-" + "walsink"),
)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def create_postgres_database(admin_url: str, prefix: str = "walsink_af") -> tuple[str, Callable[[], None]]:
    """Create a private PostgreSQL database; return (SQLAlchemy URL, drop function).

    Raises whatever the driver raises when the server is unreachable, so the
    caller decides between skipping and failing.
    """
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 5})
    with admin.connect() as conn:
        # The name is built here from hex digits only; DDL cannot bind it.
        conn.execute(text(f"CREATE DATABASE {name}"))

    def drop() -> None:
        drop_postgres_database(admin, name)
        admin.dispose()

    url = make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    return url, drop


def drop_postgres_database(admin: Any, name: str) -> None:
    """Drop database ``name`` (its sessions ended first) through ``admin``, an AUTOCOMMIT engine
    on the server; the name must be a plain identifier (DDL cannot bind it)."""
    from sqlalchemy import text

    if not name.replace("_", "").isalnum():
        raise ValueError(f"not a plain database name: {name!r}")
    with admin.connect() as conn:
        conn.execute(
            text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :d"), {"d": name}
        )
        conn.execute(text(f"DROP DATABASE IF EXISTS {name}"))


class AirflowStack:
    """A running (or ready to run) Airflow deployment on loopback; see the module docstring."""

    def __init__(
        self,
        home: Path,
        *,
        metadata_url: str | None = None,
        dags_folder: Path = REPO / "dags",
        plugins_folder: Path | None = None,
        users: Sequence[StackUser] = DEFAULT_USERS,
        components: Sequence[str] = DEFAULT_COMPONENTS,
        env: Mapping[str, str] | None = None,
        artifacts_dir: Path | None = None,
        parallelism: int = 4,
        scheduled_runs: bool = False,
        backfills_via_api: bool = False,
        commands: Mapping[str, Sequence[str]] | None = None,
        on_stop: Iterable[Callable[[], None]] = (),
    ) -> None:
        self.home = Path(home).resolve()
        #: A component's command line as a page writes it (``["airflow", "scheduler"]``), instead of
        #: the stack's own (the api-server's host, port and workers flags, which the env also sets).
        self.commands = {name: list(words) for name, words in (commands or {}).items()}
        self.backfills_via_api = backfills_via_api
        self.home.mkdir(parents=True, exist_ok=True)
        self.logs_dir = self.home / "logs"
        self.logs_dir.mkdir(exist_ok=True)
        self.metadata_url = (
            metadata_url or f"sqlite:///{self.home}/airflow.db?timeout={SQLITE_BUSY_TIMEOUT_S}"
        )
        self.dags_folder = Path(dags_folder).resolve()
        self.users = {u.name: u for u in users}
        self.components = tuple(components)
        self.artifacts_dir = Path(artifacts_dir) if artifacts_dir else None
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._procs: dict[str, subprocess.Popen] = {}
        self._log_files: dict[str, Any] = {}
        self._on_stop = list(on_stop)
        self._tokens: dict[str, str] = {}
        self._clients: dict[str, httpx.Client] = {}

        passwords_file = self.home / "simple_auth_manager_passwords.json"
        passwords_file.write_text(json.dumps({u.name: u.password for u in users}) + "\n")
        self.env = self._build_env(
            passwords_file=passwords_file,
            plugins_folder=plugins_folder,
            parallelism=parallelism,
            scheduled_runs=scheduled_runs,
            extra=dict(env or {}),
        )

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        root: Path,
        *,
        postgres_admin_url: str | None = None,
        **kwargs: Any,
    ) -> AirflowStack:
        """A stack under ``root/airflow-home``; with ``postgres_admin_url`` its metadata
        database is a fresh PostgreSQL database (dropped on ``stop()``), else SQLite.

        Why PostgreSQL for e2e: with SQLite every component serialises on one file
        lock; PostgreSQL lets the LocalExecutor run backfill runs in parallel as
        production does.
        """
        on_stop = list(kwargs.pop("on_stop", ()))
        if postgres_admin_url:
            url, drop = create_postgres_database(postgres_admin_url)
            kwargs["metadata_url"] = url
            on_stop.append(drop)
        return cls(Path(root) / "airflow-home", on_stop=on_stop, **kwargs)

    def _build_env(
        self,
        *,
        passwords_file: Path,
        plugins_folder: Path | None,
        parallelism: int,
        scheduled_runs: bool,
        extra: dict[str, str],
    ) -> dict[str, str]:
        # Start from the caller's environment minus every Airflow setting, so the
        # stack never inherits the test session's home, database or connections, and minus
        # every AWS_* variable (keys, profile, endpoint, region, CA bundle): the stack reaches an
        # object store only through its Airflow connections, as a deployment configured by them.
        env = {
            k: v
            for k, v in os.environ.items()
            if not (
                k.startswith("AIRFLOW__")
                or k.startswith("AIRFLOW_CONN_")
                or k == "AIRFLOW_HOME"
                or k.startswith("AWS_")
                or k == "WALSINK_TRIGGERER_GC_FREEZE"  # the test session's own (conftest.py)
            )
        }
        from cryptography.fernet import Fernet

        users = ",".join(f"{u.name}:{u.role}" for u in self.users.values())
        env.update(
            {
                "AIRFLOW_HOME": str(self.home),
                "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
                "AIRFLOW__CORE__PLUGINS_FOLDER": str(plugins_folder or (self.home / "plugins")),
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
                "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
                "AIRFLOW__CORE__PARALLELISM": str(parallelism),
                "AIRFLOW__CORE__FERNET_KEY": Fernet.generate_key().decode(),
                "AIRFLOW__CORE__AUTH_MANAGER": (
                    "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
                ),
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": users,
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords_file),
                # Task processes reach the metadata only through this API.
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.base_url}/execution/",
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.metadata_url,
                "AIRFLOW__API__HOST": "127.0.0.1",
                "AIRFLOW__API__PORT": str(self.port),
                "AIRFLOW__API__BASE_URL": self.base_url + "/",
                "AIRFLOW__API__WORKERS": "1",
                "AIRFLOW__API__EXPOSE_STACKTRACE": "True",
                "AIRFLOW__API__SECRET_KEY": secrets.token_hex(16),
                # One signing secret shared by every component (each would invent its own).
                "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
                # Log servers default to fixed ports 8793/8794: other stacks may run on this host.
                "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
                "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
                "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(self.logs_dir),
                "AIRFLOW__LOGGING__COLORED_CONSOLE_LOG": "False",
                # Notice new and changed DAG files within seconds, not minutes.
                "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
                "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "30",
                "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
                "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
                "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
                # By default only backfills and triggered runs: unpausing a DAG must not
                # also start a run of the latest interval the test did not ask for.
                "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": str(scheduled_runs),
                "AIRFLOW__TRIGGERER__CAPACITY": "100",
                "PYTHONUNBUFFERED": "1",
                # Spark's JVM takes its session time zone from TZ: the same on every host.
                "TZ": "UTC",
                # The tasks' Spark jobs talk to their driver on loopback only.
                "SPARK_LOCAL_IP": "127.0.0.1",
            }
        )
        if self.metadata_url.startswith("sqlite"):
            env.update(
                {
                    # Fewer writers on the one file lock: a slower scheduler heartbeat.
                    "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "5",
                }
            )
        env.update(extra)
        return env

    @property
    def is_sqlite(self) -> bool:
        """Whether the metadata database is SQLite (one writer at a time, locks under load)."""
        return self.metadata_url.startswith("sqlite")

    # -- lifecycle ----------------------------------------------------------------------------

    def __enter__(self) -> AirflowStack:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 240, *, migrate: bool = True) -> None:
        """Migrate the metadata database (unless the caller did), start every component and wait
        for the api-server."""
        if migrate:
            self.airflow("db", "migrate", timeout=timeout)
        for component in self.components:
            self._spawn(component)
        if "api-server" in self.components:
            self._wait_http_ready(timeout)

    def _spawn(
        self, component: str, command: Sequence[str] | None = None, env: Mapping[str, str] | None = None
    ) -> None:
        words = list(command or self.commands.get(component) or ())
        if words:
            # `airflow ...` as written runs with this interpreter (the venv's), as its console script does.
            args = [sys.executable, "-m", "airflow", *words[1:]] if words[0] == "airflow" else words
        else:
            args = [sys.executable, "-m", "airflow", component]
            if component == "api-server":
                args += ["--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"]
        log = open(self.logs_dir / f"{component}.out", "ab")  # noqa: SIM115 - closed in stop()
        self._log_files[component] = log
        # Each component runs under a guard (tests/guard.py) that ends its whole tree -
        # LocalExecutor workers, task runners in their own groups, spark-submit JVMs,
        # uvicorn workers - on stop() and also when this process dies without stopping
        # (SIGKILL, an unhandled SIGTERM). start_new_session: its own process group, so
        # stop() can SIGKILL the lot if the guard itself hangs.
        guarded = [
            sys.executable,
            str(Path(__file__).with_name("guard.py")),
            str(os.getpid()),
            "--",
            *args,
        ]
        self._procs[component] = subprocess.Popen(
            guarded,
            env=dict(env or self.env),
            cwd=self.home,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def pids(self) -> dict[str, list[int]]:
        """``{component: [guard pid, component pid, its descendants...]}`` of running components."""
        out: dict[str, list[int]] = {}
        for name, proc in self._procs.items():
            try:
                tree = psutil.Process(proc.pid).children(recursive=True)
            except psutil.Error:
                tree = []
            out[name] = [proc.pid, *(p.pid for p in tree)]
        return out

    def stop_component(self, component: str, grace: float = 20) -> None:
        """Stop one running component (its whole process group), e.g. the triggerer, so a
        test can observe what waits for it; ``start_component`` brings it back."""
        proc = self._procs.pop(component)
        proc.send_signal(signal.SIGTERM)  # the guard stops the component's whole tree
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
            proc.wait(timeout=10)
        self._log_files.pop(component).close()

    def start_component(
        self, component: str, command: Sequence[str] | None = None, env: Mapping[str, str] | None = None
    ) -> None:
        """Start one component (again) with the stack's configuration; with ``command`` (and
        ``env``), any process beside the stack (a Spark Connect server), guarded and stopped with
        it, its output in ``logs_dir/<component>.out``."""
        if component in self._procs:
            raise StackError(f"{component} is already running")
        self._spawn(component, command, env)

    def _wait_http_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                if httpx.get(f"{self.base_url}/api/v2/monitor/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        raise StackError(
            f"api-server did not answer on {self.base_url} within {timeout:.0f}s" + self.log_tail()
        )

    def _check_alive(self) -> None:
        dead = {name: p.returncode for name, p in self._procs.items() if p.poll() is not None}
        if dead:
            raise StackError(f"Airflow component(s) exited: {dead}" + self.log_tail())

    def stop(self, grace: float = 20) -> None:
        """Terminate every component's process group, save logs, run cleanups (idempotent)."""
        for client in self._clients.values():
            client.close()
        self._clients.clear()
        for proc in self._procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)  # the guard stops the component's whole tree
        deadline = time.monotonic() + grace
        for proc in self._procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            # Whatever is left in the group (a hung guard, a stuck JVM) goes too.
            _signal_group(proc, signal.SIGKILL)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self._procs.clear()
        for log in self._log_files.values():
            log.close()
        self._log_files.clear()
        self.save_artifacts()
        while self._on_stop:
            cleanup = self._on_stop.pop()
            try:
                cleanup()
            except Exception as exc:  # noqa: BLE001 - cleanup must not hide the test's outcome
                print(f"warning: stack cleanup failed: {exc}", file=sys.stderr)

    def save_artifacts(self) -> Path | None:
        """Copy component output and task logs to ``artifacts_dir`` (if one was given)."""
        if not self.artifacts_dir:
            return None
        self.artifacts_dir.mkdir(parents=True, exist_ok=True)
        shutil.copytree(self.logs_dir, self.artifacts_dir / "logs", dirs_exist_ok=True)
        return self.artifacts_dir

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of each component's output, for error messages."""
        out = []
        for path in sorted(self.logs_dir.glob("*.out")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"\n--- {path.name} (last {len(text)} lines) ---\n" + "\n".join(text))
        return "".join(out)

    # -- CLI ----------------------------------------------------------------------------------

    def airflow(
        self, *args: str, timeout: float = 180, check: bool = True, retry_locked: bool = True
    ) -> subprocess.CompletedProcess:
        """Run ``airflow <args>`` against this stack; raise StackError with its output on failure.

        On SQLite a command that fails with "database is locked" (its transaction rolled
        back, nothing changed) is run again, up to ``LOCK_RETRIES`` times, unless
        ``retry_locked`` is false (for a caller that checks the outcome itself).
        """
        for attempt in range(LOCK_RETRIES + 1):
            result = subprocess.run(
                [sys.executable, "-m", "airflow", *args],
                env=self.env,
                cwd=self.home,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
            locked = result.returncode != 0 and _LOCKED in result.stdout + result.stderr
            if not (locked and retry_locked and self.is_sqlite and attempt < LOCK_RETRIES):
                break
            print(f"  `airflow {args[0]}`: SQLite database locked, retrying ({attempt + 1})", file=sys.stderr)
            time.sleep(2 + 3 * attempt)
        if check and result.returncode != 0:
            raise StackError(
                f"`airflow {' '.join(args)}` exited {result.returncode}\n"
                f"stdout:\n{result.stdout[-4000:]}\nstderr:\n{result.stderr[-4000:]}"
            )
        return result

    def unpause(self, dag_id: str) -> None:
        self.client().patch(f"/api/v2/dags/{dag_id}", json={"is_paused": False}).raise_for_status()

    def pause(self, dag_id: str) -> None:
        self.client().patch(f"/api/v2/dags/{dag_id}", json={"is_paused": True}).raise_for_status()

    @contextlib.contextmanager
    def asset_scheduling(self, keep_unpaused: Iterable[str]) -> Iterator[None]:
        """Inside the block, the scheduler creates asset-triggered runs (of the DAGs in
        ``keep_unpaused``, which must be unpaused) and nothing else.

        Why a block: with ``scheduled_runs=False`` the scheduler creates no runs from
        schedules (``[scheduler] use_job_schedule`` off), and that one switch also stops
        asset-triggered runs. So the block pauses every other unpaused DAG (none then gets
        a run of its latest interval), restarts the scheduler with the switch on, and on
        exit restarts it with the switch off and unpauses what it paused. Events emitted
        before the block are queued by Airflow and turn into runs inside it. The scheduler
        runs the tasks (LocalExecutor): enter and leave the block between runs, and wait
        inside it for the runs it should create to finish.
        """
        keep = set(keep_unpaused)
        unpaused = [d["dag_id"] for d in self.get("/api/v2/dags", paused=False, limit=1000)["dags"]]
        paused_here = [d for d in unpaused if d not in keep]
        for dag_id in paused_here:
            self.pause(dag_id)
        previous = self.env.get("AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE")
        self.stop_component("scheduler")
        self.env["AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE"] = "True"
        self.start_component("scheduler")
        try:
            yield
        finally:
            self.stop_component("scheduler")
            if previous is None:
                self.env.pop("AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE", None)
            else:
                self.env["AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE"] = previous
            self.start_component("scheduler")
            for dag_id in paused_here:
                self.unpause(dag_id)

    def backfill(
        self,
        dag_id: str,
        start: str,
        end: str,
        *,
        reprocess_behavior: str | None = None,
        max_active_runs: int | None = None,
        conf: Mapping[str, Any] | None = None,
    ) -> int:
        """``airflow backfill create`` over [start, end] (inclusive); returns the new backfill's id.

        With ``backfills_via_api`` the same backfill is created by ``POST /api/v2/backfills``
        (the UI's call; Airflow creates it with the same function as the CLI), which spares
        the 3-4 s of CPU an ``airflow`` process takes to start.

        On SQLite a creation that fails "database is locked" is tried again. Airflow commits
        the backfill row before it creates (or, to reprocess, clears) its runs in a second
        transaction; when that one is refused (a read snapshot the scheduler wrote past fails
        at once, whatever the busy timeout) the row can be left behind with no runs, and would
        refuse the next try as "another backfill is running". That orphan is cancelled first.
        """
        create = self._backfill_try(
            dag_id,
            start,
            end,
            reprocess_behavior=reprocess_behavior,
            max_active_runs=max_active_runs,
            conf=conf,
        )
        before = {b["id"] for b in self.backfills(dag_id)}
        for attempt in range(LOCK_RETRIES + 1):
            failure, locked = create()
            new = [b for b in self.backfills(dag_id) if b["id"] not in before]
            if failure is None or not (locked and self.is_sqlite and attempt < LOCK_RETRIES):
                break
            for orphan in new:
                self._cancel_backfill(orphan["id"])
                before.add(orphan["id"])
            print(
                f"  backfill of {dag_id}: SQLite database locked, retrying ({attempt + 1})", file=sys.stderr
            )
            time.sleep(2 + 3 * attempt)
        if failure is not None:
            raise StackError(failure)
        if len(new) != 1:
            raise StackError(f"creating a backfill of {dag_id} made {len(new)} backfills, expected 1")
        return new[0]["id"]

    def _backfill_try(
        self,
        dag_id: str,
        start: str,
        end: str,
        *,
        reprocess_behavior: str | None,
        max_active_runs: int | None,
        conf: Mapping[str, Any] | None,
    ) -> Callable[[], tuple[str | None, bool]]:
        """One try of the creation: returns (failure text or None, whether it was a lock).

        ``POST /api/v2/backfills`` takes the dates as the CLI reads them (midnight UTC); Airflow
        answers a lock it could not take with 503, and on SQLite any 5xx is taken for one.
        """
        if self.backfills_via_api:
            body: dict[str, Any] = {
                "dag_id": dag_id,
                "from_date": f"{start}T00:00:00Z" if len(start) == 10 else start,
                "to_date": f"{end}T00:00:00Z" if len(end) == 10 else end,
            }
            if reprocess_behavior:
                body["reprocess_behavior"] = reprocess_behavior
            if max_active_runs:
                body["max_active_runs"] = max_active_runs
            if conf is not None:
                body["dag_run_conf"] = dict(conf)

            def post() -> tuple[str | None, bool]:
                response = self.client().post("/api/v2/backfills", json=body)
                if response.status_code < 400:
                    return None, False
                failure = f"POST /api/v2/backfills {body} -> {response.status_code}: {response.text}"
                return failure, response.status_code >= 500

            return post

        args = ["backfill", "create", "--dag-id", dag_id, "--from-date", start, "--to-date", end]
        if reprocess_behavior:
            args += ["--reprocess-behavior", reprocess_behavior]
        if max_active_runs:
            args += ["--max-active-runs", str(max_active_runs)]
        if conf is not None:
            args += ["--dag-run-conf", json.dumps(dict(conf))]

        def run() -> tuple[str | None, bool]:
            result = self.airflow(*args, check=False, retry_locked=False)
            if result.returncode == 0:
                return None, False
            failure = (
                f"`airflow {' '.join(args)}` exited {result.returncode}\n"
                f"stdout:\n{result.stdout[-4000:]}\nstderr:\n{result.stderr[-4000:]}"
            )
            return failure, _LOCKED in result.stdout + result.stderr

        return run

    def _cancel_backfill(self, backfill_id: int) -> None:
        """Cancel a backfill (``PUT /api/v2/backfills/{id}/cancel``), asked again while SQLite is locked."""
        for attempt in range(LOCK_RETRIES + 1):
            response = self.client().put(f"/api/v2/backfills/{backfill_id}/cancel")
            # 409: already completed (the scheduler marks a run-less orphan complete after 2 min).
            if response.status_code in (200, 409):
                return
            if response.status_code < 500 or attempt == LOCK_RETRIES:
                raise StackError(
                    f"cancelling backfill {backfill_id} -> {response.status_code}: {response.text}"
                )
            time.sleep(2 + 3 * attempt)

    # -- REST ---------------------------------------------------------------------------------

    def set_connection(self, conn_id: str, conn: Mapping[str, Any]) -> None:
        """Add connection ``conn_id`` (the ``--conn-json`` form of ``airflow connections add``),
        replacing one of that id (a shared stack): through the REST API, as the UI does."""
        body: dict[str, Any] = {"connection_id": conn_id}
        for key, value in conn.items():
            body[key] = json.dumps(value) if key == "extra" and not isinstance(value, str) else value
        response = self.client().delete(f"/api/v2/connections/{conn_id}")
        if response.status_code not in (204, 404):
            raise StackError(f"DELETE connection {conn_id} -> {response.status_code}: {response.text}")
        response = self.client().post("/api/v2/connections", json=body)
        if response.status_code >= 400:
            raise StackError(f"POST connection {conn_id} -> {response.status_code}: {response.text}")

    def set_variable(self, key: str, value: str) -> None:
        """``airflow variables set key value``, through the REST API."""
        response = self.client().patch(f"/api/v2/variables/{key}", json={"key": key, "value": value})
        if response.status_code == 404:
            response = self.client().post("/api/v2/variables", json={"key": key, "value": value})
        if response.status_code >= 400:
            raise StackError(f"setting variable {key} -> {response.status_code}: {response.text}")

    def trigger(self, dag_id: str, logical_date: str, run_id: str | None = None) -> str:
        """A manual run of ``dag_id`` at ``logical_date`` (ISO, as ``airflow dags trigger -l``);
        returns its run id.

        A 5xx answer (e.g. SQLite locked under load) is asked again; a 409 on a retry means
        the earlier try did create the run. Raises StackError if the API refuses it.
        """
        run_id = run_id or f"manual__{logical_date}"
        body = {"logical_date": logical_date, "dag_run_id": run_id}
        for attempt in range(LOCK_RETRIES + 1):
            response = self.client().post(f"/api/v2/dags/{dag_id}/dagRuns", json=body)
            if response.status_code == 409 and attempt:
                return run_id
            if response.status_code < 500:
                break
            time.sleep(2 + 3 * attempt)
        if response.status_code >= 400:
            raise StackError(f"triggering {dag_id} at {logical_date}: {response.status_code} {response.text}")
        return str(response.json()["dag_run_id"])

    def token(self, user: str = "admin") -> str:
        """A JWT for ``user`` from ``POST /auth/token`` (cached per user)."""
        if user not in self._tokens:
            u = self.users[user]
            response = httpx.post(
                f"{self.base_url}/auth/token", json={"username": u.name, "password": u.password}, timeout=30
            )
            if response.status_code != 201:
                raise StackError(f"login as {user!r} failed: {response.status_code} {response.text}")
            self._tokens[user] = response.json()["access_token"]
        return self._tokens[user]

    def client(self, user: str = "admin") -> httpx.Client:
        """An httpx client on ``base_url`` sending ``user``'s bearer token."""
        if user not in self._clients:
            self._clients[user] = httpx.Client(
                base_url=self.base_url,
                headers={"Authorization": f"Bearer {self.token(user)}"},
                timeout=30,
            )
        return self._clients[user]

    def login_cookie(self, user: str = "admin") -> dict[str, Any]:
        """The ``_token`` cookie a browser holds after logging in as ``user`` (Playwright shape)."""
        return {"name": "_token", "value": self.token(user), "url": self.base_url + "/"}

    def get(self, path: str, **params: Any) -> Any:
        response = self.client().get(path, params=params or None)
        if response.status_code >= 400:
            raise StackError(f"GET {path} -> {response.status_code}: {response.text[:2000]}")
        return response.json()

    def backfills(self, dag_id: str) -> list[dict[str, Any]]:
        return list(self.get("/api/v2/backfills", dag_id=dag_id, limit=100)["backfills"])

    def dag_runs(self, dag_id: str) -> list[dict[str, Any]]:
        """Every run of ``dag_id``, oldest logical date first."""
        data = self.get(f"/api/v2/dags/{dag_id}/dagRuns", limit=100, order_by="logical_date")
        return list(data["dag_runs"])

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        return list(
            self.get(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances", limit=100)["task_instances"]
        )

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value") -> Any:
        """One XCom value (as stored: JSON)."""
        value = self.get(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/{key}")[
            "value"
        ]
        return json.loads(value) if isinstance(value, str) else value

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str | None]:
        """``{task_id: state}`` for one run (mapped tasks as ``task_id[i]``)."""
        out: dict[str, str | None] = {}
        for ti in self.task_instances(dag_id, run_id):
            key = ti["task_id"] if ti.get("map_index", -1) == -1 else f"{ti['task_id']}[{ti['map_index']}]"
            out[key] = ti["state"]
        return out

    def clear_task(
        self, dag_id: str, run_id: str, task_ids: Sequence[str], *, include_downstream: bool = False
    ) -> list[dict[str, Any]]:
        """Clear task instances of one run (as the UI's Clear does); returns what was cleared."""
        response = self.client().post(
            f"/api/v2/dags/{dag_id}/clearTaskInstances",
            json={
                "dry_run": False,
                "dag_run_id": run_id,
                "task_ids": list(task_ids),
                "only_failed": False,
                "reset_dag_runs": True,
                "include_downstream": include_downstream,
            },
        )
        if response.status_code >= 400:
            raise StackError(f"clearing {task_ids} of {run_id} -> {response.status_code}: {response.text}")
        return list(response.json()["task_instances"])

    # -- waiting ------------------------------------------------------------------------------

    def wait_until(
        self, what: str, predicate: Callable[[], Any], *, timeout: float = 300, interval: float = 0.5
    ) -> Any:
        """Poll ``predicate`` until it returns something truthy; StackError naming ``what`` on timeout.

        A timeout here is a failure of the thing awaited, not a timing assertion: the
        limit only bounds how long a broken stack can hang the test run. The waits poll every
        half second (one small REST call each): a test waits at most that long past the event.
        """
        deadline = time.monotonic() + timeout
        last_error: BaseException | None = None
        while True:
            self._check_alive()
            try:
                value = predicate()
                if value:
                    return value
            except (httpx.HTTPError, StackError) as exc:
                last_error = exc
            if time.monotonic() > deadline:
                detail = f" (last error: {last_error})" if last_error else ""
                raise StackError(
                    f"timed out after {timeout:.0f}s waiting for {what}{detail}" + self.log_tail()
                )
            time.sleep(interval)

    def wait_for_dag(self, dag_id: str, timeout: float = 180) -> dict[str, Any]:
        """Wait until the dag-processor has parsed ``dag_id``; fail fast on its import error."""

        def parsed() -> dict[str, Any] | None:
            response = self.client().get(f"/api/v2/dags/{dag_id}")
            if response.status_code == 200:
                return response.json()
            errors = self.get("/api/v2/importErrors", limit=100)["import_errors"]
            if errors:
                raise _ImportErrors(errors)
            return None

        try:
            return self.wait_until(f"DAG {dag_id!r} to be parsed", parsed, timeout=timeout, interval=0.5)
        except _ImportErrors as exc:
            raise StackError(f"the dags folder has import errors: {exc.errors}") from None

    def wait_for_backfill(self, backfill_id: int, timeout: float = 600) -> list[dict[str, Any]]:
        """Wait until the backfill is complete; return its runs (each in a terminal state)."""
        backfill = self.wait_until(
            f"backfill {backfill_id} to complete",
            lambda: (b := self.get(f"/api/v2/backfills/{backfill_id}"))["completed_at"] and b,
            timeout=timeout,
            interval=0.5,
        )
        lo, hi = backfill["from_date"], backfill["to_date"]
        return [
            r
            for r in self.dag_runs(backfill["dag_id"])
            if r["logical_date"] and lo <= r["logical_date"] <= hi and r["run_type"] == "backfill"
        ]

    def wait_for_runs(
        self, dag_id: str, run_ids: Iterable[str], *, timeout: float = 600, interval: float = 0.5
    ) -> dict[str, dict[str, Any]]:
        """Wait until every named run is finished (success or failed); return them by run id."""
        wanted = set(run_ids)

        def finished() -> dict[str, dict[str, Any]] | None:
            runs = {r["dag_run_id"]: r for r in self.dag_runs(dag_id) if r["dag_run_id"] in wanted}
            if len(runs) == len(wanted) and all(r["state"] in TERMINAL_RUN_STATES for r in runs.values()):
                return runs
            return None

        return self.wait_until(
            f"runs {sorted(wanted)} of {dag_id} to finish", finished, timeout=timeout, interval=interval
        )


class _ImportErrors(Exception):
    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__(errors)
        self.errors = errors


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)  # the group id is the leader's pid (start_new_session)
    except (ProcessLookupError, PermissionError):
        pass
