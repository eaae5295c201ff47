"""Commit deadlines: a checkpoint whose pipeline's commit deadline passed before it was COMMITTED.

The deadline itself is Airflow's (a deadline alert on the DAG, measured from the run's
queued time; ``operators/commit_deadline.py``): Airflow decides that it was missed and
runs walsink's callback. Airflow runs it once, but a triggerer restart or a reassigned
trigger can run it again, and two triggerers can run it at once; so the callback first
claims the notification here (:meth:`CommitDeadlines.claim_deadline_notice`: one row of
``walsink_deadline_notice`` per pipeline and Airflow deadline, inserted under its primary
key), and only the run that inserted it records the miss (``commit_due_at`` on the
checkpoint's row and one history row, in the same transaction) and calls the user's
notifier. What the notifier did is then written on the claim
(:meth:`CommitDeadlines.finish_deadline_notice`). The UI and the CLI show the checkpoint
overdue (:func:`is_overdue`) until it commits, and the notifier is told the checkpoint's
state and the on-call reason walsink already records (:func:`on_call_reason`: the reason it
waits or was refused, else its error). The deadline never changes a checkpoint's state.

A new version of the checkpoint (a reprocess) clears ``commit_due_at``: it belongs to
another run, with its own deadline.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, select
from sqlalchemy.exc import IntegrityError

from airflow_provider_walsink.core.protocol.states import CheckpointState
from airflow_provider_walsink.core.store.errors import CheckpointNotFoundError
from airflow_provider_walsink.core.store.models import checkpoint_table as ckpt
from airflow_provider_walsink.core.store.models import deadline_notice_table as notices
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


#: A notice's outcome: claimed (its notifier not returned yet, or its claimer died calling it),
#: then what the notifier did.
CLAIMED, NOTIFIED, FAILED = "claimed", "notified", "failed"


class CommitDeadlines(CheckpointTransitions):
    """Claim and record a missed commit deadline; mixed into :class:`~.store.CommitterStore`."""

    @retrying
    def claim_deadline_notice(
        self,
        pipeline: str,
        deadline: str,
        *,
        checkpoint_key: str | None,
        due_at: datetime,
        actor: Actor,
        claimant: str,
        detail: str,
    ) -> bool:
        """Claim the notification of the missed commit deadline ``deadline`` (Airflow's id of
        the run's deadline) of ``pipeline`` for ``claimant`` (one token per run of the
        callback); ``True`` if this call holds it, so the caller notifies, ``False`` if another
        run of the callback claimed it first, so the caller does nothing.

        In the same transaction as the claim, a registered checkpoint ``checkpoint_key`` gets
        the miss recorded (:meth:`record_deadline_miss`: ``commit_due_at`` and ``detail`` in
        its history; its state unchanged), so the history row exists once, with the claim.

        Race-safe: the claim is an insert under the notice's primary key ``(pipeline,
        deadline)``; of two callbacks claiming at once (two triggerers) one inserts, the other
        fails on the key, rolls back and reads the holder. Safe to repeat: a retry whose first
        transaction did commit (its answer lost) finds its own ``claimant`` and holds the claim.
        """
        deadline = deadline[:255]
        try:
            with self._tx() as conn:
                conn.execute(
                    notices.insert().values(
                        pipeline=pipeline,
                        deadline=deadline,
                        dag_id=actor.dag_id,
                        run_id=actor.run_id,
                        checkpoint_key=checkpoint_key,
                        due_at=due_at,
                        claimed_by=claimant[:255],
                        claimed_at=self._now(conn),
                        outcome=CLAIMED,
                    )
                )
                if checkpoint_key is not None:
                    self._record_miss(conn, pipeline, checkpoint_key, due_at, actor, detail)
            return True
        except IntegrityError:
            holder = self.deadline_notice(pipeline, deadline)
            return holder is not None and holder["claimed_by"] == claimant[:255]

    @retrying
    def finish_deadline_notice(
        self, pipeline: str, deadline: str, *, claimant: str, outcome: str, detail: str | None = None
    ) -> None:
        """Write what the notifier did (:data:`NOTIFIED` or :data:`FAILED`, ``detail``: why) on
        the claim ``claimant`` holds; a failure also goes into the checkpoint's history (state
        unchanged). Safe to repeat."""
        mine = (
            (notices.c.pipeline == pipeline)
            & (notices.c.deadline == deadline[:255])
            & (notices.c.claimed_by == claimant[:255])
            & (notices.c.outcome == CLAIMED)
        )
        with self._tx() as conn:
            # Read, then update (no UPDATE ... RETURNING on MySQL/MariaDB); the claim is the
            # claimant's alone, so nothing else changes it in between.
            done = conn.execute(
                select(notices.c.checkpoint_key, notices.c.dag_id, notices.c.run_id).where(mine)
            ).first()
            if done is None:
                return
            conn.execute(notices.update().where(mine).values(outcome=outcome, detail=detail))
            if outcome != FAILED or done.checkpoint_key is None:
                return
            row = self._lock_or_none(conn, pipeline, done.checkpoint_key)
            if row is not None:
                actor = Actor(name=claimant[:255], dag_id=done.dag_id, run_id=done.run_id)
                self._event(conn, row, actor, f"commit deadline notifier failed (not called again): {detail}")

    def deadline_notice(self, pipeline: str, deadline: str) -> dict[str, Any] | None:
        """The notice of ``pipeline``'s deadline ``deadline`` as a dict of its columns, or ``None``."""
        with self.engine.connect() as conn:
            row = (
                conn.execute(
                    select(notices).where(
                        notices.c.pipeline == pipeline, notices.c.deadline == deadline[:255]
                    )
                )
                .mappings()
                .first()
            )
        return dict(row) if row is not None else None

    @retrying
    def record_deadline_miss(
        self, pipeline: str, checkpoint_key: str, *, due_at: datetime, actor: Actor, detail: str
    ) -> CheckpointRecord | None:
        """Record that the commit deadline ``due_at`` (naive UTC) passed while the checkpoint was
        not COMMITTED: sets its ``commit_due_at`` and appends ``detail`` to its history (state
        unchanged), in one transaction. The deadline callback does this through
        :meth:`claim_deadline_notice`, which records it once per deadline.

        Returns the checkpoint as it is now; ``None`` if it is not registered. A COMMITTED
        checkpoint (committed late, between the deadline and this call) gets the history row
        but no ``commit_due_at``: it is not overdue. Repeating it appends another history row.
        """
        with self._tx() as conn:
            return self._record_miss(conn, pipeline, checkpoint_key, due_at, actor, detail)

    def _record_miss(
        self, conn: Connection, pipeline: str, key: str, due_at: datetime, actor: Actor, detail: str
    ) -> CheckpointRecord | None:
        row = self._lock_or_none(conn, pipeline, key)
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
