"""The source contract: what a write job reads, planned once per checkpoint (Airflow-free)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:  # the job imports sources: keep the committer table's modules out of it
    from airflow_provider_walsink.core.store.store import Actor, CheckpointRecord

#: Offsets as they travel: ``{"<topic or source>": {"<partition>": <next offset>}}``.
Offsets = Mapping[str, Any]


class Source:
    """A pipeline's input, planned by the write task and read by the job (Flink's ``Source``).

    The contract, in the order the write phase and the commit use it:

    1. **plan** the checkpoint's input once, in the write task:

       * :meth:`plan` ``(store, pipeline, checkpoint, offsets)`` before anything is recorded
         (``checkpoint`` is ``None`` for one not yet registered; ``offsets`` is the
         ``(start, until)`` range its next attempt will read from the committer table, or
         ``None`` when no attempt will start). A refusal (missing topic, offsets gone
         backwards, a retention gap not accepted) is raised here, the table unchanged;
       * :meth:`record` ``(store, checkpoint, start_offsets, until_offsets, actor)`` after the
         attempt is registered: records the same plan on the checkpoint's row (the first
         attempt of a version fixes it; a retry reuses the recorded plan, never re-plans) and
         returns ``(start_offsets, until_offsets, extra)``: ``extra`` travels to the job in its
         protocol arguments, :meth:`job_env` (secrets: client settings) in its environment;
    2. **read** it in the job: :meth:`read` ``(job)`` gives what the job reads, from the plan
       it was handed (nothing is planned in the job);
    3. **after the commit**: :meth:`after_commit` ``(store, pipeline)``, once the checkpoint is
       COMMITTED (Flink's ``notifyCheckpointComplete``), from the committer table only (a re-run
       or the next commit catches up a crash before it); returns entries for the commit summary.

    :attr:`plans_input` ``False`` (files, or no source): the job finds its own input and the
    write phase asks nothing of the source. Sources are registered in
    :data:`airflow_provider_walsink.core.sources.SOURCES`; one that needs an Airflow connection
    is registered by its Airflow face under ``airflow_provider_walsink.hooks``. A pipeline's
    ``source={"kind": name, "conn_id": c, **settings}`` builds ``cls(settings, conn_id=c)``
    (without ``conn_id`` when none is given; ``cls()`` for ``{"kind": name}`` alone).
    """

    #: The registry name.
    name: ClassVar[str] = ""
    #: Whether the write task plans the input (an offsets source) or the job finds it (files).
    plans_input: ClassVar[bool] = False

    def plan(
        self,
        store: Any,
        pipeline: str,
        checkpoint: CheckpointRecord | None,
        offsets: tuple[Offsets | None, Offsets | None] | None,
    ) -> None:
        """Plan the checkpoint's next attempt before anything is recorded; raise a refusal."""

    def record(
        self,
        store: Any,
        checkpoint: CheckpointRecord,
        *,
        start_offsets: Offsets | None,
        until_offsets: Offsets | None,
        actor: Actor,
    ) -> tuple[Offsets | None, Offsets | None, dict[str, Any]]:
        """Record the plan on the checkpoint (a retry reuses it): ``(start, until, extra)``."""
        return start_offsets, until_offsets, {}

    def job_env(self) -> dict[str, str]:
        """The job's environment this source needs (secrets: never on a command line)."""
        return {}

    def read(self, job: Any) -> Any:
        """In the job: what it reads, from the plan the write task handed it."""
        raise NotImplementedError(f"source {self.name!r} has nothing to read: the job finds its input")

    def after_commit(self, store: Any, pipeline: str) -> dict[str, Any] | None:
        """After COMMITTED: the source's own step (a consumer group's offsets); summary entries."""
        return None


class FilesSource(Source):
    """The job finds its own input (files, a table, an interval of anything): nothing is planned."""

    name: ClassVar[str] = "files"
