"""The ``spark_connect`` job runner: the write job as a Spark Connect client in the task's process.

Chosen by the type of the write task's ``spark_conn_id``: a ``spark_connect`` connection (the
Spark provider's own type; its ``SparkConnectHook`` builds the ``sc://`` URL with the token, user
id and ``use_ssl``). Registered in :data:`airflow_provider_walsink.core.runners.RUNNERS`; it lives
here, not in the core, because it reads an Airflow connection.

How the job runs (docs/production.md, "Choosing a runner"):

* :meth:`SparkConnectRunner.submit` opens a Connect session with a session id of its own
  (``;session_id=<uuid>`` on the URL), checks that the server answers (a short retry policy, so
  an unreachable server or a refused token fails in seconds, naming the connection), applies the
  task's ``conf`` that the server lets a session set, adds a zip of walsink's Airflow-free core to
  the session's Python files (``addArtifacts(pyfile=True)``: the executors import it, so they need
  no walsink installed; connection extra ``ship_walsink: false`` when they have it), tags the
  session's operations, then runs
  the job file **in this process** (``runpy``, as ``__main__``, with ``sys.argv`` set to the
  protocol arguments and the job's own, and the job's secrets in ``os.environ`` while it runs):
  the job's ``SparkSession.builder.getOrCreate()`` returns that session, so the same job file
  runs unchanged under spark-submit and Spark Connect. The job's DataFrames are plans sent to
  the server; the executors run its ``mapInArrow`` functions (cloudpickled with the plan) and
  write the committables straight into the staging store; the job (here) seals the manifest.
* The token is only in the URL given to the Connect client: never on a command line, never in a
  log line (the URL is never logged; error messages are scrubbed of it). ``SPARK_REMOTE`` is set
  to the server's address without it.
* :meth:`cancel` interrupts every operation of the session (``interruptAll``): the task was
  killed, so the job stops writing into an attempt that will never count.
* :meth:`submit` returns when the job has ended (as spark-submit in client mode); the session is
  released then, whatever the outcome.
"""

from __future__ import annotations

import logging
import os
import re
import runpy
import socket
import sys
import tempfile
import uuid
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import quote, urlsplit

from airflow_provider_walsink.core.protocol.errors import PreflightError
from airflow_provider_walsink.core.runners.base import JobRunner
from airflow_provider_walsink.hooks.spark_submit_runner import PLAIN_ENV

#: The retry policy of the first call (and of the release at the end): ~4 s of retries, so an
#: unreachable server fails the task quickly instead of after the client's 10-minute default.
PROBE_RETRY_POLICY: dict[str, Any] = {
    "max_retries": 4,
    "initial_backoff": 250,
    "backoff_multiplier": 2.0,
    "max_backoff": 2000,
}
#: Seconds the write task's preflight waits for the server to accept a TCP connection.
REACH_TIMEOUT_S = 5.0
#: The Connect server's port when the connection names none (Spark's default).
DEFAULT_PORT = 15002
#: The oldest server Spark version the job's calls need (``mapInArrow``, ``Observation`` over Connect).
MIN_SERVER_VERSION = (3, 5)
#: Connection extra: the Connect client's retry policy while the job runs (``max_retries``,
#: ``initial_backoff`` and ``max_backoff`` in ms, ``backoff_multiplier``); default the client's own
#: (at least 10 minutes of retries while the server is unavailable).
RETRY_POLICY_EXTRA = "retry_policy"
#: Connection extra: further ``sc://`` URL parameters (gRPC headers such as Databricks'
#: ``x-databricks-cluster-id``); not secrets (the token is the connection's password).
PARAMS_EXTRA = "connect_params"
#: URL parameters that have their own connection fields (or are the runner's).
_OWN_PARAMS = frozenset({"token", "user_id", "use_ssl", "session_id"})
#: Connection extra: ``false`` when the executors have walsink installed themselves (then it is
#: not shipped with the job; default ``true``).
SHIP_EXTRA = "ship_walsink"


def walsink_core_zip() -> Path:
    """A zip of walsink's Airflow-free core (``airflow_provider_walsink/__init__.py`` and ``core/``):
    what the executors import when they run the job's ``mapInArrow`` functions. Built once per process."""
    global _CORE_ZIP
    if _CORE_ZIP is None or not _CORE_ZIP.exists():
        import airflow_provider_walsink

        package = Path(airflow_provider_walsink.__file__).resolve().parent
        target = (
            Path(tempfile.mkdtemp(prefix="walsink-ship-"))
            / f"airflow_provider_walsink-{airflow_provider_walsink.__version__}.zip"
        )
        with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
            for path in [package / "__init__.py", *sorted((package / "core").rglob("*.py"))]:
                archive.write(path, f"airflow_provider_walsink/{path.relative_to(package).as_posix()}")
        _CORE_ZIP = target
    return _CORE_ZIP


_CORE_ZIP: Path | None = None


def _truthy(value: object) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


class SparkConnectJobError(RuntimeError):
    """The write job could not run, or failed, on a Spark Connect server; the message names the
    connection and the server (never the token)."""


class SparkConnectUnreachableError(PreflightError):
    """Before anything is recorded: nothing accepts a connection at the Spark Connect server's
    host and port; the message names the connection and the server (never the token)."""


#: A gRPC error's status and details, as the Connect client's exceptions print them.
_GRPC_STATUS = re.compile(r'status = StatusCode\.(\w+)\s+details = "([^"]*)"')


def _first_line(exc: BaseException) -> str:
    """``Type: what`` of an error in one line (a gRPC error as its status and details)."""
    text = str(exc).strip()
    grpc_status = _GRPC_STATUS.search(text)
    if grpc_status:
        return f"{type(exc).__name__}: {grpc_status.group(1)}: {grpc_status.group(2)}"[:800]
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return f"{type(exc).__name__}: {line}"[:800] if line else type(exc).__name__


class SparkConnectRunner(JobRunner):
    """Runs the write job as a Spark Connect client of the ``spark_connect`` connection ``spark_conn_id``.

    ``conf`` is applied to the session (SQL settings such as ``spark.sql.shuffle.partitions``); a
    setting the server refuses to change per session is logged and skipped. Spark core settings
    (``spark.default.parallelism``, executor sizes) belong where the Connect server starts: a
    session may accept them without effect. ``env_vars`` join the job's environment while it runs.
    """

    name: ClassVar[str] = "spark_connect"

    def __init__(
        self,
        *,
        job_name: str,
        spark_conn_id: str | None = None,
        conf: Mapping[str, Any] | None = None,
        env_vars: Mapping[str, str] | None = None,
        log: logging.Logger | logging.LoggerAdapter[Any] | None = None,
    ) -> None:
        if not spark_conn_id:
            raise ValueError("the spark_connect job runner needs a spark_connect connection (spark_conn_id)")
        self.job_name = job_name
        self.spark_conn_id = spark_conn_id
        self.conf = dict(conf or {})
        self.env_vars = {k: str(v) for k, v in (env_vars or {}).items()}
        self.log = log or logging.getLogger(__name__)
        #: The Connect session of the running job (``None`` before :meth:`submit` and after it ends).
        self.session: Any = None
        #: The session id the job runs under (chosen here, recorded on the attempt: :meth:`job_ref`).
        self.session_id: str = str(uuid.uuid4())
        #: ``host:port`` of the server (no credentials).
        self.server: str | None = None
        #: The tag on the job's operations (``interruptTag`` stops them from another session).
        self.tag = f"walsink-{uuid.uuid4().hex[:12]}"
        #: The name of walsink's core as shipped to the executors with the job (``None``: not shipped).
        self.shipped: str | None = None
        self._secrets: list[str] = []
        self._cancelled = False

    # ------------------------------------------------------------------ the contract

    def submit(self, application: str, arguments: Sequence[str], env: Mapping[str, str]) -> None:
        self._secrets = [v for k, v in env.items() if v and k not in PLAIN_ENV]
        url, extra = self._connection_url()
        where = self._where()
        session = self._open_session(f"{url};session_id={self.session_id}", extra)
        try:
            self.log.info(
                "Running %s as a Spark Connect client of %s (session %s, tag %s)",
                application,
                where,
                self.session_id,
                self.tag,
            )
            self._apply_conf(session)
            if _truthy(extra.get(SHIP_EXTRA, True)):
                self._ship_walsink(session)
            session.addTag(self.tag)  # this thread's operations: the job runs in it
            try:
                with self._job_process_state(application, arguments, env):
                    runpy.run_path(application, run_name="__main__")
            except SystemExit as exc:
                if exc.code not in (None, 0):
                    raise SparkConnectJobError(
                        self._redact(f"the job {application} exited with {exc.code!r} on {where}")
                    ) from None
            except Exception as exc:
                raise self._job_error(application, exc, session) from exc
        finally:
            self.session = None
            self._release(session)

    def wait(self) -> None:
        """Nothing left to wait for: :meth:`submit` returned when the job ended."""

    def check_reachable(self) -> None:
        """The server accepts a TCP connection at its host and port within :data:`REACH_TIMEOUT_S`
        (no session is opened: the token, TLS and the server's version are checked by
        :meth:`submit`'s first call). A server that is down, or a wrong host or port, is refused
        here, before the write phase records anything, naming the connection."""
        url, _ = self._connection_url()
        parts = urlsplit(url.split(";", 1)[0])
        host, port = parts.hostname or "", parts.port or DEFAULT_PORT
        try:
            with socket.create_connection((host, port), timeout=REACH_TIMEOUT_S):
                pass
        except OSError as exc:
            why = exc.strerror or str(exc) or type(exc).__name__
            raise SparkConnectUnreachableError(
                self._redact(
                    f"{self._where()} does not answer: nothing accepted a connection at {host}:{port} "
                    f"within {REACH_TIMEOUT_S:g}s ({why}): start the server, or fix the host and port of "
                    f"connection {self.spark_conn_id!r}"
                )
            ) from None

    def describe_failure(self, exc: BaseException) -> str:
        return self._redact(super().describe_failure(exc))

    def cancel(self) -> None:
        session = self.session
        if session is None or session.is_stopped:
            return
        self._cancelled = True
        try:
            interrupted = session.interruptAll()
            self.log.info(
                "Interrupted %d Spark Connect operation(s) of session %s", len(interrupted), self.session_id
            )
        except Exception as exc:  # noqa: BLE001 - the task is being killed anyway
            self.log.warning("could not interrupt the Spark Connect job: %s", self._redact(_first_line(exc)))

    def job_ref(self) -> dict[str, Any]:
        # The job's operations run on the server: they outlive this worker (until the server's
        # detached-operation timeout), so the next attempt stops them (stop_orphan).
        return {"runner": self.name, "conn_id": self.spark_conn_id, "session_id": self.session_id}

    @classmethod
    def stop_orphan(
        cls, ref: Mapping[str, Any], log: logging.Logger | logging.LoggerAdapter[Any]
    ) -> str | None:
        """Interrupt every operation of the recorded session and release it (a session the
        server no longer holds: nothing to do)."""
        from pyspark.sql.connect.client.retries import DefaultPolicy
        from pyspark.sql.connect.session import SparkSession as ConnectSession

        runner = cls(job_name="walsink-stop-orphan", spark_conn_id=str(ref["conn_id"]), log=log)
        url, _ = runner._connection_url()
        session_id = str(ref["session_id"])
        try:
            session = ConnectSession(connection=f"{url};session_id={session_id}")
        except Exception as exc:  # noqa: BLE001 - a malformed recorded reference: say so, go on
            return runner._redact(f"could not reach Spark Connect session {session_id}: {_first_line(exc)}")
        try:
            session.client.set_retry_policies([DefaultPolicy(**PROBE_RETRY_POLICY)])
            interrupted = session.interruptAll()
        except Exception as exc:  # noqa: BLE001
            session.client.close()
            if _names_a_lost_session(exc):
                return None  # the server released it already: its operations are gone with it
            return runner._redact(
                f"could not stop Spark Connect session {session_id} on {runner._where()}: {_first_line(exc)}"
            )
        done = f"interrupted {len(interrupted)} operation(s) of Spark Connect session {session_id} on {runner._where()}"
        try:
            session.client.release_session()
        except Exception:  # noqa: BLE001 - an operation still winding down: the server's idle timeout ends it
            done += " (the session is left to the server's idle timeout)"
        finally:
            session.client.close()
        return done

    # ------------------------------------------------------------------ the session

    def _connection_url(self) -> tuple[str, dict[str, Any]]:
        from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

        hook = SparkConnectHook(self.spark_conn_id)
        conn = hook.get_connection(self.spark_conn_id)
        if conn.conn_type != self.name:
            raise ValueError(
                f"connection {self.spark_conn_id!r} is of type {conn.conn_type!r}, not {self.name}"
            )
        if not conn.host:
            raise ValueError(f"spark_connect connection {self.spark_conn_id!r} has no host")
        if conn.password:
            self._secrets += [conn.password, quote(conn.password)]
        url = hook.get_connection_url()
        self.server = urlsplit(url).netloc
        extra = dict(conn.extra_dejson or {})
        params = dict(extra.get(PARAMS_EXTRA) or {})
        own = sorted(set(params) & _OWN_PARAMS)
        if own:
            raise ValueError(
                f"spark_connect connection {self.spark_conn_id!r}: {', '.join(own)} in the extra "
                f"{PARAMS_EXTRA!r} (the token is the password, the user id the login, use_ssl its own extra)"
            )
        for key, value in params.items():
            url += f";{key}={quote(str(value))}"
        return url, extra

    def _where(self) -> str:
        return f"Spark Connect server {self.server} (connection {self.spark_conn_id!r})"

    def _open_session(self, url: str, extra: Mapping[str, Any]) -> Any:
        """A new session on the server, checked with one short call; a clear error otherwise."""
        from pyspark.sql.connect.client.retries import DefaultPolicy
        from pyspark.sql.connect.session import SparkSession as ConnectSession

        if ConnectSession.getActiveSession() is not None:
            raise SparkConnectJobError(
                "a Spark Connect session is already active in this process: the write job needs its own"
            )
        try:
            session = ConnectSession.builder.remote(url).create()
        except Exception as exc:  # a malformed URL
            raise SparkConnectJobError(
                self._redact(f"cannot open a session on {self._where()}: {_first_line(exc)}")
            ) from None
        client = session.client
        job_policies = client.get_retry_policies()
        if extra.get(RETRY_POLICY_EXTRA):
            job_policies = [DefaultPolicy(**dict(extra[RETRY_POLICY_EXTRA]))]
        client.set_retry_policies([DefaultPolicy(**PROBE_RETRY_POLICY)])
        try:
            version = session.version
        except Exception as exc:
            self._release(session)
            if "UNAUTHENTICATED" in str(exc):
                raise SparkConnectJobError(
                    self._redact(
                        f"{self._where()} refused the connection's token (UNAUTHENTICATED): set the "
                        f"server's token as the password of connection {self.spark_conn_id!r}"
                    )
                ) from None
            raise SparkConnectJobError(
                self._redact(
                    f"{self._where()} did not answer: {_first_line(exc)} (is the server running and "
                    "reachable from the Airflow worker, and are the connection's host, port, token and "
                    "use_ssl right?)"
                )
            ) from None
        client.set_retry_policies(job_policies)
        numbers = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
        if numbers < MIN_SERVER_VERSION:
            self._release(session)
            raise SparkConnectJobError(
                f"{self._where()} runs Spark {version}; the write job needs Spark "
                f"{'.'.join(map(str, MIN_SERVER_VERSION))} or later"
            )
        self.log.info("%s answers: Spark %s", self._where(), version)
        self.session = session
        return session

    def _apply_conf(self, session: Any) -> None:
        for key, value in self.conf.items():
            try:
                session.conf.set(key, str(value))
            except Exception as exc:  # noqa: BLE001 - a server-side setting: said, then skipped
                self.log.warning(
                    "Spark setting %s is not applied: %s cannot change it per session (set it where the "
                    "server starts): %s",
                    key,
                    self._where(),
                    self._redact(_first_line(exc)),
                )

    def _ship_walsink(self, session: Any) -> None:
        """Add walsink's core to the session's Python files: the executors import it from there
        (the job's functions are cloudpickled, but the modules they name are imported)."""
        archive = walsink_core_zip()
        try:
            session.addArtifacts(str(archive), pyfile=True)
        except Exception as exc:
            raise SparkConnectJobError(
                self._redact(
                    f"could not ship walsink's core to {self._where()}: {_first_line(exc)} (install "
                    f'airflow-provider-walsink on the executors and set the connection extra "{SHIP_EXTRA}": false)'
                )
            ) from None
        self.shipped = archive.name
        self.log.info("Shipped %s to the executors of session %s", archive.name, self.session_id)

    def _release(self, session: Any) -> None:
        """Release the session on the server (quickly: a lost server is not waited for)."""
        if session.is_stopped:
            return
        from pyspark.sql.connect.client.retries import DefaultPolicy

        session.client.set_retry_policies([DefaultPolicy(**PROBE_RETRY_POLICY)])
        session.stop()

    # ------------------------------------------------------------------ the job in this process

    @contextmanager
    def _job_process_state(
        self, application: str, arguments: Sequence[str], env: Mapping[str, str]
    ) -> Iterator[None]:
        """``sys.argv``, ``sys.path`` and the environment the job would have as a script, for its run.

        A classic Spark session already in this process (a notebook, ``dag.test()`` in a process
        that ran Spark before; never an Airflow task process) is hidden from the job's builder
        while it runs, which would otherwise refuse to make a Connect session beside it.
        """
        from pyspark import SparkContext
        from pyspark.sql import SparkSession as ClassicSession

        overlay = {
            **self.env_vars,
            **env,
            # The job's builder then returns the session opened here (no token in the environment).
            "SPARK_REMOTE": f"sc://{self.server}",
            "SPARK_CONNECT_MODE_ENABLED": "1",  # pyspark.sql.functions build Connect columns
        }
        saved_env = {k: os.environ.get(k) for k in overlay}
        saved_argv, saved_path = sys.argv, list(sys.path)
        saved_classic = SparkContext._active_spark_context, ClassicSession._instantiatedSession
        os.environ.update(overlay)
        sys.argv = [application, *map(str, arguments)]
        sys.path.insert(0, os.path.dirname(os.path.abspath(application)))  # as `python job.py` does
        SparkContext._active_spark_context, ClassicSession._instantiatedSession = None, None
        try:
            yield
        finally:
            SparkContext._active_spark_context, ClassicSession._instantiatedSession = saved_classic
            sys.argv = saved_argv
            sys.path[:] = saved_path
            for key, value in saved_env.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def _job_error(self, application: str, exc: BaseException, session: Any) -> SparkConnectJobError:
        what = _first_line(exc)
        if self._cancelled:
            return SparkConnectJobError(
                self._redact(f"the job {application} was cancelled on {self._where()}: {what}")
            )
        lost = _names_a_lost_session(exc)
        if not lost and "OPERATION_CANCELED" in str(exc):
            # Not cancelled here: the server cancels a session's operations before it closes the
            # session, so a released or expired session can fail the job this way; ask the server.
            lost = self._session_closed(session)
            if not lost:
                return SparkConnectJobError(
                    self._redact(
                        f"the job {application} was cancelled on {self._where()} from outside this task "
                        f"(an interrupt from another session): {what}"
                    )
                )
        if lost:
            return SparkConnectJobError(
                self._redact(
                    f"the job {application} lost its session {self.session_id} on {self._where()}: {what}"
                )
            )
        return SparkConnectJobError(self._redact(f"the job {application} failed on {self._where()}: {what}"))

    def _session_closed(self, session: Any) -> bool:
        """Whether the server no longer holds the job's session (one quick call naming it)."""
        from pyspark.sql.connect.client.retries import DefaultPolicy

        try:
            session.client.set_retry_policies([DefaultPolicy(**PROBE_RETRY_POLICY)])
            session.conf.get("spark.app.name")
        except Exception as exc:  # noqa: BLE001 - what it says is the answer
            return _names_a_lost_session(exc)
        return False

    def _redact(self, text: str) -> str:
        for secret in self._secrets:
            if secret:
                text = text.replace(secret, "***")
        return text


def _names_a_lost_session(exc: BaseException) -> bool:
    """Whether a Connect error says the session is gone (closed, unknown, or its server unreachable)."""
    text = str(exc)
    return type(exc).__name__ == "RetriesExceeded" or any(
        mark in text
        for mark in ("SESSION_CLOSED", "SESSION_NOT_FOUND", "StatusCode.UNAVAILABLE", "RetriesExceeded")
    )
