"""Audit verdicts (write-audit-publish): a sealed attempt passes (AUDITED) or fails (REJECTED).

A verdict is owned by the attempt it judged: a stale audit never records a
verdict on a newer attempt. Only a person overturns a REJECTED verdict
(:meth:`~AuditVerdicts.approve_rejected`: REJECTED -> AUDITED, who and why in
the history); an audit never does. :meth:`~AuditVerdicts._audit_verdict` also tells
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
#: How the history row of the approval step's question begins (a row that changes no state):
#: a person is asked in Airflow whether a REJECTED attempt is published anyway or aborted.
DECISION_ASKED = "waiting for a person's decision"


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
            if row["state"] == S.REJECTED.value:
                # REJECTED -> AUDITED is a person's decision (approve_rejected), never an audit's.
                raise TransitionError(
                    f"checkpoint {pipeline}/{checkpoint_key} was REJECTED by its audit; only an approval "
                    "with a recorded reason (approve_rejected) moves it to AUDITED"
                )
            return self._move(conn, row, S.AUDITED, actor, detail=detail, error=None)

    @retrying
    def approve_rejected(
        self,
        pipeline: str,
        checkpoint_key: str,
        *,
        attempt_id: str,
        approver: str,
        reason: str,
        actor: Actor,
    ) -> CheckpointRecord:
        """A person approves the REJECTED attempt ``attempt_id`` for publishing (REJECTED -> AUDITED).

        One transaction on the locked row: the history row names ``approver``
        and ``reason`` in its ``detail`` (``approved by <approver>: <reason>
        (published despite the audit: <the failed checks>)``, first line first,
        as ``walsink history`` and the UI show it) and ``actor`` (the task or
        face that recorded it); the rejection's ``error`` is cleared. The
        commit then publishes the attempt as any AUDITED one.

        Raises ``ValueError`` for an empty ``approver`` or ``reason``,
        :class:`StaleAttemptError` if ``attempt_id`` is no longer the sealed
        attempt (a person approved data that has since been written again:
        the new attempt needs its own audit), :class:`TransitionError` if the
        checkpoint is not REJECTED (nor already approved). Repeating it after
        it took effect returns the row and records nothing.
        """
        approver, reason = approver.strip(), reason.strip()
        if not approver or not reason:
            raise ValueError("an approval of a REJECTED checkpoint needs who approves it and a reason")
        with self._tx() as conn:
            row = self._lock(conn, pipeline, checkpoint_key)
            name = f"checkpoint {pipeline}/{checkpoint_key}"
            if row["sealed_attempt_id"] != attempt_id:
                raise StaleAttemptError(
                    f"the approval of attempt {attempt_id} of {name} is stale: its sealed attempt is now "
                    f"{row['sealed_attempt_id']} ({row['state']}); nothing is recorded"
                )
            state = CheckpointState(row["state"])
            if state is not S.REJECTED:
                if self._audit_verdict(conn, row) is S.AUDITED and state is not S.ABORTED:
                    return CheckpointRecord.from_row(row)  # approved (or passed) already
                raise TransitionError(f"{name} is {state}; only a REJECTED checkpoint can be approved")
            detail = f"approved by {approver}: {reason} (published despite the audit: {row['error'] or '-'})"
            return self._move(conn, row, S.AUDITED, actor, detail=detail[:10000], error=None)

    @retrying
    def ask_decision(
        self, pipeline: str, checkpoint_key: str, *, attempt_id: str | None, actor: Actor
    ) -> bool:
        """Record that a person is asked whether the REJECTED attempt ``attempt_id`` is published
        anyway or aborted (a history row that changes no state, naming the task that asks).

        Returns False and records nothing when the checkpoint is no longer REJECTED with that
        sealed attempt (decided, or written again meanwhile). Repeating it records the question
        again (a cleared approval task asks again).
        """
        with self._tx() as conn:
            row = self._lock(conn, pipeline, checkpoint_key)
            if row["state"] != S.REJECTED.value or row["sealed_attempt_id"] != attempt_id:
                return False
            self._event(
                conn,
                row,
                actor,
                f"{DECISION_ASKED} in Airflow (Required actions): publish REJECTED attempt "
                f"{row['sealed_attempt']} anyway, or abort the checkpoint",
            )
            return True

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
