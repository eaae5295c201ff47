"""The job runner contract: where the write phase's PySpark job runs (Airflow-free)."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar


class JobRunner(ABC):
    """Runs the write phase's PySpark job somewhere and reports how it ended.

    The contract, as the write phase (:class:`~airflow_provider_walsink.core.commit.write_phase.WritePhase`)
    uses it:

    * :meth:`submit` ``(application, arguments, env)`` starts the job: ``arguments`` are the
      protocol arguments followed by the job's own; ``env`` holds the secrets the job needs
      (staging credentials, a source's client configuration), which a runner passes in the
      job's environment and never on a command line or in a log line (refusing a cluster
      where it cannot). A runner may return only when the job has ended (spark-submit in
      client mode does).
    * :meth:`wait` returns once the job has ended well and raises the runner's own error
      otherwise (the write phase then records the attempt FAILED). A runner whose job can
      outlive the worker declares :attr:`deferrable`; the operator may then defer instead
      of waiting (none does yet).
    * :meth:`describe_failure` is the outcome of a failed job in one line for the
      committer table's history.
    * :meth:`logs_link` is where the job's own logs are (``None``: in the task log).
    * :meth:`cancel` stops a running job (the task was killed, the checkpoint aborted, a newer
      attempt started); it does nothing once the job has ended. It may be called from another
      thread while :meth:`submit` blocks.
    * :meth:`check_reachable` is asked before the write phase records anything: a runner whose
      job runs on a server (Spark Connect) checks, quickly, that the server answers, and refuses
      with a :class:`~airflow_provider_walsink.core.protocol.errors.PreflightError` naming its
      connection (the write task then fails without a retry). Default: nothing to check.
    * :meth:`job_ref` names where the job about to be submitted will run when it can outlive
      the worker (a Spark Connect session); the write phase records it on the attempt before
      :meth:`submit`, and the next attempt of the checkpoint hands it to the class method
      :meth:`stop_orphan` of the runner it names, which stops the job if it still runs (the
      worker died under it). A runner whose job dies with the worker returns ``None``.

    Runners are registered by name (the connection type) in
    :data:`airflow_provider_walsink.core.runners.RUNNERS` as ``"module:Class"``, imported only
    when used. The write task picks one by the type of its ``spark_conn_id`` connection and
    builds it with :meth:`for_task`: the arguments every runner takes (``job_name``,
    ``spark_conn_id``, ``conf``, ``env_vars``, ``log``) plus the task arguments the runner
    declares in :attr:`task_options` (spark-submit's ``master``, ``spark_binary``,
    ``spark_submit_kwargs``); a task argument set for a runner that does not take it is refused. An implementation that needs Airflow (as spark-submit through the Spark
    provider's ``SparkSubmitHook`` does) lives under ``airflow_provider_walsink.hooks`` and is
    registered by its dotted path: the core never imports Airflow.
    """

    #: The registry name (the connection type) of this runner.
    name: ClassVar[str] = ""
    #: Whether the job outlives the worker, so the operator could defer while it runs.
    deferrable: ClassVar[bool] = False
    #: The write task's arguments this runner takes besides the common ones.
    task_options: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def for_task(
        cls,
        *,
        job_name: str,
        spark_conn_id: str | None,
        conf: Mapping[str, Any],
        env_vars: Mapping[str, str],
        options: Mapping[str, Any],
        log: logging.Logger | logging.LoggerAdapter[Any] | None = None,
    ) -> JobRunner:
        """The runner of one write task: ``options`` holds the task arguments that were set
        beyond the common ones; one this runner does not take is a ``ValueError``."""
        refused = sorted(set(options) - cls.task_options)
        if refused:
            raise ValueError(
                f"{', '.join(refused)} cannot be used with a {cls.name} connection ({spark_conn_id!r}): "
                f"the {cls.name} job runner takes {sorted(cls.task_options) or 'none of them'}"
            )
        return cls(  # type: ignore[call-arg]
            job_name=job_name, spark_conn_id=spark_conn_id, conf=conf, env_vars=env_vars, log=log, **options
        )

    @abstractmethod
    def submit(self, application: str, arguments: Sequence[str], env: Mapping[str, str]) -> None:
        """Start the job (may block until it ends)."""

    @abstractmethod
    def wait(self) -> None:
        """Return once the job has ended well; raise if it failed."""

    def describe_failure(self, exc: BaseException) -> str:
        """One line for the committer table's history: what failed."""
        text = str(exc).strip()
        return text.splitlines()[0][:1000] if text else type(exc).__name__

    def logs_link(self) -> str | None:
        """Where the job's logs are, when not in the task log."""
        return None

    @abstractmethod
    def cancel(self) -> None:
        """Stop the job if it runs."""

    def check_reachable(self) -> None:
        """Before anything is recorded: raise a ``PreflightError`` naming the connection when
        the job could not be started (its server does not answer). Quick; changes nothing."""
        return None  # a job started by this process (spark-submit) has no server to reach first

    def job_ref(self) -> dict[str, Any] | None:
        """Where the job :meth:`submit` will start runs, as JSON with ``"runner"`` (this runner's
        name) and never a secret; ``None``: the job ends when the worker does."""
        return None

    @classmethod
    def stop_orphan(
        cls, ref: Mapping[str, Any], log: logging.Logger | logging.LoggerAdapter[Any]
    ) -> str | None:
        """Stop the job ``ref`` (:meth:`job_ref` of an earlier attempt) if it still runs, and say
        what was done in one line (``None``: nothing to do). A job already gone is not an error."""
        return None


def describe_job_ref(ref: Mapping[str, Any] | None) -> str | None:
    """:meth:`JobRunner.job_ref` in one line for people (``walsink status``, the UI): the runner,
    its connection and the session to look for on the server, or to stop by hand."""
    if not ref:
        return None
    where = f"{ref.get('runner', 'job')} on connection {ref.get('conn_id')!r}"
    return where + (f", session {ref['session_id']}" if ref.get("session_id") else "")
