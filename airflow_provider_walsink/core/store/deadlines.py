"""Commit deadlines: a checkpoint whose pipeline's commit deadline passed before it was COMMITTED.

The deadline itself is Airflow's (a deadline alert on the DAG, measured from the run's
queued time; ``operators/commit_deadline.py``): Airflow decides that it was missed and
runs walsink's callback once. The callback records the miss here
(:meth:`CommitDeadlines.record_deadline_miss`: ``commit_due_at`` on the checkpoint's row and
one history row), so the UI and the CLI show the checkpoint overdue
(:func:`is_overdue`) until it commits, and tells the user's notifier the checkpoint's state
and the on-call reason walsink already records (:func:`on_call_reason`: the reason it waits
or was refused, else its error).

A new version of the checkpoint (a reprocess) clears ``commit_due_at``: it belongs to
another run, with its own deadline.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from airflow_provider_walsink.core.protocol.states import CheckpointState
from airflow_provider_walsink.core.store.errors import CheckpointNotFoundError
from airflow_provider_walsink.core.store.models import checkpoint_table as ckpt
from airflow_provider_walsink.core.store.records import Actor, CheckpointRecord
from airflow_provider_walsink.core.store.retry import retrying
from airflow_provider_walsink.core.store.transitions import CheckpointTransitions

S = CheckpointState

#: Why a checkpoint is where it is when nothing failed, was refused or blocks it: by state.
_PHASE_REASONS = {
    S.REGISTERED: "registered; its write task has not started an attempt",
    S.WRITING: "the write task has not sealed attempt {attempt} yet",
    S.SEALED: "sealed; waiting to be durable (the durability sensor has not verified every committable)",
    S.DURABLE: "durable; waiting for its audit or commit task",
    S.AUDITED: "audited; waiting for its commit task",
    S.COMMITTING: "being committed by {lease_owner}",
    S.COMMITTED: "committed",
}


def is_overdue(record: CheckpointRecord, now: datetime) -> bool:
    """``True`` when the checkpoint's recorded commit deadline has passed and it is still due:
    not final (COMMITTED, or ABORTED: a person ended it, nothing is late any more).

    ``now`` and ``commit_due_at`` are naive UTC (the committer table's convention).
    """
    return record.commit_due_at is not None and not record.state.is_final and now >= record.commit_due_at


def on_call_reason(record: CheckpointRecord | None, waiting: dict[str, Any] | None = None) -> str:
    """The reason an on-call engineer is shown for the checkpoint, as the UI and ``walsink status``
    show it: the reason it waits (blocked behind an earlier checkpoint, refused, with the fix:
    ``waiting`` is :func:`~.queries.wait_status`), else its recorded error, else what it waits
    for in its state. A checkpoint that is not registered says so."""
    if record is None:
        return (
            "not registered: the run's write task has not registered the checkpoint (it has not "
            "started, or failed before it registered it); see the run's write task"
        )
    if waiting is not None:
        text = waiting["reason"]
        return text if waiting["status"] == "blocked" else f"{waiting['status']}: {text}"
    if record.error:
        return record.error
    template = _PHASE_REASONS.get(record.state, record.state.value)
    return template.format(attempt=record.attempt, lease_owner=record.lease_owner or "a commit task")


class CommitDeadlines(CheckpointTransitions):
    """Record a missed commit deadline; mixed into :class:`~.store.CommitterStore`."""

    @retrying
    def record_deadline_miss(
        self, pipeline: str, checkpoint_key: str, *, due_at: datetime, actor: Actor, detail: str
    ) -> CheckpointRecord | None:
        """Record that the commit deadline ``due_at`` (naive UTC) passed while the checkpoint was
        not COMMITTED: sets its ``commit_due_at`` and appends ``detail`` to its history (state
        unchanged), in one transaction.

        Returns the checkpoint as it is now; ``None`` if it is not registered. A COMMITTED
        checkpoint (committed late, between the deadline and this call) gets the history row
        but no ``commit_due_at``: it is not overdue. Safe to repeat (the same values again).
        """
        with self._tx() as conn:
            row = self._lock_or_none(conn, pipeline, checkpoint_key)
            if row is None:
                return None
            if row["state"] != S.COMMITTED.value:
                conn.execute(ckpt.update().where(ckpt.c.id == row["id"]).values(commit_due_at=due_at))
                row["commit_due_at"] = due_at
            self._event(conn, row, actor, detail)
            return CheckpointRecord.from_row(row)

    def _lock_or_none(self, conn: Any, pipeline: str, key: str) -> dict[str, Any] | None:
        try:
            return self._lock(conn, pipeline, key)
        except CheckpointNotFoundError:
            return None
