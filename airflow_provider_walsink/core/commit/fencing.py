"""Fencing: how a commit stays the only one that changes its checkpoint. One interface, two strategies.

:class:`~.commit.CheckpointCommitter` runs the commit sequence; the steps that
depend on *what fences* the publish are a :class:`Fencing` strategy's, chosen
once when the committer is built from the pipeline's ``fencing`` setting and
the target's capabilities (:func:`validate_fencing`, :func:`require_table_fence`):

* ``"lease"`` (:class:`~.lease.LeaseFencing`, the default, every target): a
  lease in the committer table whose epoch is the fencing token; the publish
  runs under fence checks and COMMITTED is a compare-and-set on the token.
* ``"table"`` (:class:`~.tablefence.TableFencing`, Iceberg and Delta): no
  lease; the table's own atomic commit is the fence and COMMITTED is one
  committer-table transaction after it, reconciled from the table when the
  table holds another attempt.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, ClassVar, Literal, Protocol

from airflow_provider_walsink.core.commit.summary import CommitSummary
from airflow_provider_walsink.core.protocol.errors import WalsinkError
from airflow_provider_walsink.core.protocol.manifest import Manifest
from airflow_provider_walsink.core.protocol.modes import FENCING_MODES, FencingMode
from airflow_provider_walsink.core.staging.object_store import StagingStore
from airflow_provider_walsink.core.store.records import Actor, CheckpointRecord
from airflow_provider_walsink.core.store.store import CommitterStore
from airflow_provider_walsink.core.targets.base import Publisher, PublishResult

__all__ = [
    "FENCING_MODES",
    "Committing",
    "Fencing",
    "Hold",
    "Step",
    "TableFenceUnsupportedError",
    "require_table_fence",
    "validate_fencing",
]


class TableFenceUnsupportedError(WalsinkError, ValueError):
    """``fencing="table"`` was asked for a target whose commit cannot be the fence."""


def validate_fencing(fencing: str) -> str:
    FencingMode.parse(fencing)
    return fencing


def require_table_fence(publisher: Publisher) -> None:
    """Raise :class:`TableFenceUnsupportedError` unless the target can be the only fence."""
    caps, kind = publisher.capabilities, publisher.kind
    missing = [
        name
        for name, offered in (
            ("atomic", caps.atomic),
            ("remembers_commits", caps.remembers_commits),
            ("table_fence", caps.table_fence),
        )
        if not offered
    ]
    if missing:
        raise TableFenceUnsupportedError(
            f"fencing='table' needs a target whose own atomic commit refuses a second publication of a "
            f"checkpoint version and carries abort tombstones; the {kind} target does not "
            f"({', '.join(missing)}: no). Use fencing='lease' (the default)"
        )


class Committing(Protocol):
    """What a strategy (and the group commit) uses of its :class:`~.commit.CheckpointCommitter`.

    Read at each call, never copied: a caller may change a setting (``group_commit``) after building it.
    """

    store: CommitterStore
    staging: StagingStore
    publisher: Publisher
    mode: str
    owner: str | None
    lease_ttl: timedelta
    require_audit: bool
    group_commit: int
    fencing: str
    verify_checksums: bool

    def finish(self, manifest: Manifest) -> None: ...


@dataclass
class Hold:
    """A checkpoint a strategy let this committer publish: the row it checked, and the fence.

    ``ctx`` is the publisher context the publish runs under (its ``fence()``
    is the strategy's check); its ``attempt_id`` is set to the sealed
    manifest's once that is read.
    """

    record: CheckpointRecord
    ctx: Any
    #: Lease fencing: the holder whose expired lease this committer took over.
    taken_over_from: str | None = None


#: The steps of the sequence a strategy records a failure of (:meth:`Fencing.failed`).
Step = Literal["read", "publish", "record"]


class Fencing(ABC):
    """The fencing steps of the commit sequence (numbers as in :class:`~.commit.CheckpointCommitter`).

    1-2. :meth:`take`: check the row and take the checkpoint (the lease, or
       nothing to take with table fencing). Returns the row when it is
       COMMITTED already (nothing to publish), else a :class:`Hold`. Raises
       the refusals (``NotDurableError``, ``LeaseHeldError``, ...). Safe to repeat.
    4. :meth:`held_instead`: a publish error that means the target already
       holds *another* attempt of this version (table fencing: the table is
       the source of truth); ``None``: a failure.
    5. :meth:`record_committed`: record COMMITTED for the published attempt,
       as ``(row, whether this call recorded it)``, or ``None`` when the row
       moved on and :meth:`reconcile` must decide. Raises ``FencedError``
       when the fence was lost. Safe to repeat (a compare-and-set).
    *. :meth:`failed`: record a failure of step ``read``, ``publish`` or
       ``record`` on the checkpoint as this fencing records it; the caller
       raises the error.
    """

    #: The ``fencing`` setting that chooses this strategy.
    name: ClassVar[str]
    #: Whether a group commit may run under this fencing (it takes members' leases).
    groups: ClassVar[bool] = False

    def __init__(self, committer: Committing) -> None:
        self.committer = committer

    @abstractmethod
    def take(self, pipeline: str, checkpoint_key: str, *, actor: Actor) -> Hold | CheckpointRecord: ...

    def held_instead(self, hold: Hold, exc: Exception) -> str | None:
        return None

    @abstractmethod
    def record_committed(
        self, hold: Hold, manifest: Manifest, result: PublishResult, *, actor: Actor
    ) -> tuple[CheckpointRecord, bool] | None: ...

    def reconcile(
        self, hold: Hold, manifest: Manifest, *, held: str, actor: Actor, started: float
    ) -> CommitSummary:
        raise NotImplementedError(f"{self.name} fencing never reconciles from the target")

    @abstractmethod
    def failed(self, hold: Hold, step: Step, exc: Exception, *, actor: Actor) -> None: ...
