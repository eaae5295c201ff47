"""The job runner contract: where the write phase's PySpark job runs (Airflow-free)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import ClassVar


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
    * :meth:`cancel` stops a running job (the task was killed); it does nothing once the
      job has ended.

    Runners are registered by name (the connection type) in
    :data:`airflow_provider_walsink.core.runners.RUNNERS` as ``"module:Class"``, imported only
    when used. An implementation that needs Airflow (as spark-submit through the Spark
    provider's ``SparkSubmitHook`` does) lives under ``airflow_provider_walsink.hooks`` and is
    registered by its dotted path: the core never imports Airflow.
    """

    #: The registry name (the connection type) of this runner.
    name: ClassVar[str] = ""
    #: Whether the job outlives the worker, so the operator could defer while it runs.
    deferrable: ClassVar[bool] = False

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
