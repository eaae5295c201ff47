"""Audit verdicts (write-audit-publish): a sealed attempt passes (AUDITED) or fails (REJECTED).

A verdict is owned by the attempt it judged: a stale audit never records a
verdict on a newer attempt. :meth:`~AuditVerdicts._audit_verdict` also tells
the lease take and :mod:`.tablefence` whether the sealed attempt passed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection, select

from airflow_provider_walsink.core.protocol.states import AUDIT_VERDICTS, CheckpointState
from airflow_provider_walsink.core.store.errors import StaleAttemptError, TransitionError
from airflow_provider_walsink.core.store.models import transition_table as trans
from airflow_provider_walsink.core.store.records import Actor, CheckpointRecord
from airflow_provider_walsink.core.store.retry import retrying
from airflow_provider_walsink.core.store.transitions import CheckpointTransitions

S = CheckpointState


class AuditVerdicts(CheckpointTransitions):
    """Record audit verdicts; mixed into :class:`~.store.CommitterStore`."""

    def _audit_verdict(self, conn: Connection, row: Mapping[str, Any]) -> CheckpointState | None:
        """The audit verdict (AUDITED or REJECTED) on the row's current attempt, or None.

        The newest of the checkpoint's WRITING, AUDITED and REJECTED transitions
        decides: a new attempt (WRITING) voids every earlier verdict. Needed when
        the state itself no longer says it (FAILED, COMMITTING after AUDITED).
        """
        last = conn.execute(
            select(trans.c.to_state)
            .where(
                trans.c.checkpoint_id == row["id"],
                trans.c.to_state.in_([S.WRITING.value, *(v.value for v in AUDIT_VERDICTS)]),
            )
            .order_by(trans.c.id.desc())
            .limit(1)
        ).scalar()
        return CheckpointState(last) if last in {v.value for v in AUDIT_VERDICTS} else None

    def _audit_row(
        self, conn: Connection, pipeline: str, checkpoint_key: str, attempt_id: str, verdict: CheckpointState
    ) -> tuple[dict[str, Any], bool]:
        """Lock the row for a verdict on ``attempt_id``; True if that verdict is already recorded."""
        row = self._lock(conn, pipeline, checkpoint_key)
        if row["sealed_attempt_id"] != attempt_id:
            raise StaleAttemptError(
                f"the audit of attempt {attempt_id} of {pipeline}/{checkpoint_key} is stale: the checkpoint's "
                f"sealed attempt is now {row['sealed_attempt_id']} ({row['state']}); its verdict is not recorded"
            )
        state = CheckpointState(row["state"])
        if state is verdict or (
            verdict is S.AUDITED
            and state in (S.COMMITTING, S.COMMITTED, S.FAILED)
            and self._audit_verdict(conn, row) is S.AUDITED
        ):
            return row, True
        if state is S.FAILED and not row["durable_at"]:
            raise TransitionError(
                f"checkpoint {pipeline}/{checkpoint_key} FAILED before it was durable; it cannot be audited"
            )
        return row, False

    @retrying
    def mark_audited(
        self, pipeline: str, checkpoint_key: str, *, attempt_id: str, actor: Actor, detail: str | None = None
    ) -> CheckpointRecord:
        """Record that the sealed attempt ``attempt_id`` passed the audit (DURABLE -> AUDITED).

        ``detail`` (the check results, JSON) goes into the history. Raises
        :class:`StaleAttemptError` if ``attempt_id`` is no longer the sealed
        attempt (a newer attempt started: this verdict is about old data), and
        :class:`TransitionError` if the checkpoint is not durable (or was
        REJECTED). Repeating it after it took effect returns the row.
        """
        with self._tx() as conn:
            row, done = self._audit_row(conn, pipeline, checkpoint_key, attempt_id, S.AUDITED)
            if done:
                return CheckpointRecord.from_row(row)
            return self._move(conn, row, S.AUDITED, actor, detail=detail, error=None)

    @retrying
    def reject(
        self,
        pipeline: str,
        checkpoint_key: str,
        *,
        attempt_id: str,
        reason: str,
        actor: Actor,
        detail: str | None = None,
    ) -> CheckpointRecord:
        """Record that the sealed attempt ``attempt_id`` failed the audit (DURABLE -> REJECTED).

        ``reason`` (the failed checks, one line each) becomes the checkpoint's
        ``error``; ``detail`` (every check's result, JSON) goes into the
        history. A REJECTED checkpoint is never committed; a new write attempt
        or an abort leaves it. Raises :class:`StaleAttemptError` if
        ``attempt_id`` is no longer the sealed attempt (a stale audit never
        rejects a newer attempt), :class:`TransitionError` if the checkpoint
        is not durable or already AUDITED. Repeating it is safe.
        """
        with self._tx() as conn:
            row, done = self._audit_row(conn, pipeline, checkpoint_key, attempt_id, S.REJECTED)
            if done:
                return CheckpointRecord.from_row(row)
            return self._move(conn, row, S.REJECTED, actor, detail=detail or reason, error=reason[:10000])
