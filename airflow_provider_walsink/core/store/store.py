"""The committer store: every checkpoint state change, one transaction each.

Flink's ``CheckpointCommitter`` keeps ``isCheckpointCommitted`` /
``commitCheckpoint`` outside Flink's own state; this is that, for the whole
life cycle. Each public method

* runs in one database transaction that locks the checkpoint's row, checks
  the transition is allowed, updates the row and appends a
  :class:`Transition` naming who made it (invariant 7);
* is idempotent: repeating a call that already took effect (say after the
  connection dropped before the commit was acknowledged) succeeds again
  instead of failing, so transient database errors can be retried safely;
* binds every value as a parameter; no identifier is ever formatted into SQL.

**Fencing** (invariants 3 and 8). Taking a lease bumps the checkpoint's
``lease_epoch``, the fencing token, and returns it in the :class:`Lease`.
Every change made under a lease (:meth:`fence`, which also renews it,
:meth:`release_lease`, :meth:`mark_committed`, :meth:`fail` with a lease) is
a compare-and-set on ``(state, epoch)``; a holder whose lease was taken over
gets :class:`LeaseLostError` (a ``FencedError``) and changes nothing. Lease
owners are unique per task try (:attr:`Actor.lease_owner`), and expiry is
computed and judged on the **database's** clock (:mod:`.clock`), never a
client's. A write try may only fail its own attempt, never a checkpoint
another process holds.

The store is composed of parts, one concern each, over the locked-row
plumbing and the history of :mod:`.transitions`: the life cycle up to
durable and the ``append`` order (:mod:`.lifecycle`), the audit verdicts
(:mod:`.verdicts`), the leases and what is recorded under them
(:mod:`.leases`), the store's side of an abort (:mod:`.abort_transitions`; the abort *orchestration* is :mod:`.abort`),
the source plans (:mod:`.source_plans`), the first asset event's claim (:mod:`.first_event`),
missed commit deadlines (:mod:`.deadlines`) and the table targets' archived markers (:mod:`.archive`).

The read model lives in :mod:`.queries`, the PostgreSQL one-statement
transitions in :mod:`.fastpath`, the retry policy in :mod:`.retry`.
Connections are not pinged on checkout: every method, reads included, is
retried on a dropped connection instead, which saves a round trip per call.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy import Engine

from airflow_provider_walsink.core.store.abort_transitions import AbortTransitions
from airflow_provider_walsink.core.store.archive import TableArchives
from airflow_provider_walsink.core.store.deadlines import CommitDeadlines
from airflow_provider_walsink.core.store.engine import create_committer_engine, shared_engine
from airflow_provider_walsink.core.store.errors import (
    AuditRejectedError,
    CheckpointNotFoundError,
    LeaseHeldError,
    LeaseLostError,
    NotAuditedError,
    OffsetsError,
    OrderingError,
    StaleAttemptError,
    StoreError,
    TransitionError,
)
from airflow_provider_walsink.core.store.first_event import FirstEventClaims
from airflow_provider_walsink.core.store.group_lead import GroupLeads
from airflow_provider_walsink.core.store.leases import CheckpointLeases, next_epoch
from airflow_provider_walsink.core.store.lifecycle import MODES, CheckpointLifecycle
from airflow_provider_walsink.core.store.migrate import upgrade
from airflow_provider_walsink.core.store.queries import OPEN_STATES, CheckpointQueries
from airflow_provider_walsink.core.store.records import (
    Actor,
    CheckpointRecord,
    Lease,
    TransitionRecord,
    new_instance_id,
    utcnow,
)
from airflow_provider_walsink.core.store.retry import is_transient
from airflow_provider_walsink.core.store.source_plans import SourcePlans
from airflow_provider_walsink.core.store.transitions import retire_superseded
from airflow_provider_walsink.core.store.verdicts import AuditVerdicts

__all__ = [
    "MODES",
    "OPEN_STATES",
    "Actor",
    "AuditRejectedError",
    "CheckpointNotFoundError",
    "CheckpointRecord",
    "CommitterStore",
    "Lease",
    "LeaseHeldError",
    "LeaseLostError",
    "NotAuditedError",
    "OffsetsError",
    "OrderingError",
    "StaleAttemptError",
    "StoreError",
    "TransitionError",
    "TransitionRecord",
    "is_transient",
    "new_instance_id",
    "next_epoch",
    "retire_superseded",
    "utcnow",
]


class CommitterStore(
    CheckpointLifecycle,
    AuditVerdicts,
    CheckpointLeases,
    AbortTransitions,
    SourcePlans,
    FirstEventClaims,
    GroupLeads,
    CommitDeadlines,
    TableArchives,
    CheckpointQueries,
):
    """The committer table's API. Thread-safe; share one per process and engine.

    ``clock`` replaces the database's clock, for tests that need time to pass
    faster than it does; production code never sets it.
    """

    def __init__(self, engine: Engine, *, clock: Callable[[], datetime] | None = None) -> None:
        self.engine = engine
        self._clock = clock
        self._dialect = engine.dialect.name
        # Data-modifying CTEs: PostgreSQL only (see .fastpath); they read the
        # database's clock, so an injected test clock takes the general path.
        self._one_statement = self._dialect == "postgresql" and clock is None

    @classmethod
    def from_url(cls, url: str, *, migrate: bool = True, **engine_kwargs: Any) -> CommitterStore:
        store = cls(create_committer_engine(url, **engine_kwargs))
        if migrate:
            store.migrate()
        return store

    @classmethod
    def shared(cls, url: str, *, migrate: bool = True) -> CommitterStore:
        """A store on this process's one engine for ``url`` (:func:`.engine.shared_engine`): what a
        task uses, so that its store and an Iceberg SQL catalog on the same database hold one
        connection between them."""
        store = cls(shared_engine(url))
        if migrate:
            store.migrate()
        return store

    def migrate(self) -> None:
        """Create or upgrade the schema (Alembic, serialised across processes)."""
        upgrade(self.engine)

    def dispose(self) -> None:
        self.engine.dispose()
