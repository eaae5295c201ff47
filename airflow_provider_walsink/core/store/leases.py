"""Leases: taking, fencing (renewing) and releasing the right to publish, and what is recorded under it.

Every change made under a lease (:meth:`~CheckpointLeases.fence`,
:meth:`~CheckpointLeases.release_lease`, :meth:`~CheckpointLeases.mark_committed`,
:meth:`~CheckpointLeases.fail` with a lease) is a compare-and-set on its epoch,
the fencing token :func:`next_epoch` hands out at each take.
"""

from __future__ import annotations

import calendar
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, select, update

from airflow_provider_walsink.core.faults import crashpoint
from airflow_provider_walsink.core.protocol.states import COMMITTABLE, CheckpointState
from airflow_provider_walsink.core.store.errors import (
    AuditRejectedError,
    LeaseHeldError,
    LeaseLostError,
    NotAuditedError,
    TransitionError,
)
from airflow_provider_walsink.core.store.models import checkpoint_table as ckpt
from airflow_provider_walsink.core.store.records import Actor, CheckpointRecord, Lease
from airflow_provider_walsink.core.store.retry import retrying
from airflow_provider_walsink.core.store.transitions import CheckpointTransitions, _dump, retire_superseded

S = CheckpointState


def next_epoch(current: int, now: datetime) -> int:
    """The fencing token of the next lease take: above the row's, and never below the clock.

    Strictly greater than every token this row handed out. Taking the database's
    time in milliseconds as a floor also puts it above every token a *trimmed or
    lost* row of the same checkpoint handed out earlier, which a table target
    still holds in its marker: a re-run after retention is not mistaken for a
    zombie (and a zombie of the old row stays below it).
    """
    return max(current + 1, calendar.timegm(now.timetuple()) * 1000 + now.microsecond // 1000)


class CheckpointLeases(CheckpointTransitions):
    """Take, fence and release leases, and record COMMITTED or FAILED; mixed into
    :class:`~.store.CommitterStore`, whose other parts give the audit verdict
    (:mod:`.verdicts`) and the append order check (:mod:`.lifecycle`) a take asks.
    """

    @retrying
    def acquire_lease(
        self,
        pipeline: str,
        checkpoint_key: str,
        *,
        owner: str,
        ttl: timedelta,
        actor: Actor,
        mode: str | None = None,
        require_audit: bool = False,
    ) -> Lease:
        """Take the right to publish a durable checkpoint, bumping its fencing token.

        Succeeds when nobody holds the lease, when ``owner`` already holds it,
        or when the holder's lease has expired on the database's clock
        (takeover: the holder crashed or stalled; its token is now stale). In
        ``append`` mode an earlier uncommitted checkpoint of the pipeline
        blocks this one, and the checkpoint's start offsets must continue the
        last committed checkpoint's end offsets. A REJECTED checkpoint is never
        committed; with ``require_audit`` (a pipeline that declares an audit)
        neither is one whose sealed attempt has not passed the audit.

        Raises :class:`LeaseHeldError` (someone else holds a live lease; retry
        later), :class:`TransitionError` (committed, or not durable),
        :class:`AuditRejectedError` (REJECTED: names the failed checks),
        :class:`NotAuditedError` (``require_audit`` and not audited),
        :class:`OrderingError` (append order: an earlier checkpoint is open), its
        :class:`OffsetsError` (start offsets that do not continue the committed
        ones, or a range a later checkpoint took over; the caller records it).
        Repeating it is safe.
        """
        if self._one_statement and mode == "overwrite":
            record = self._try_one_statement(
                S.COMMITTING,
                actor,
                f"lease taken for {ttl.total_seconds():g}s",  # the statement appends the epoch
                require_audit=require_audit,
                owner=owner,
                pipeline=pipeline,
                checkpoint_key=checkpoint_key,
                ttl=ttl,
            )
            if record is not None:
                assert record.lease_expires_at is not None
                return Lease(
                    pipeline,
                    checkpoint_key,
                    owner,
                    record.lease_expires_at,
                    record.lease_epoch,
                    record=record,
                )
        with self._tx() as conn:
            row = self._lock(conn, pipeline, checkpoint_key)
            state = CheckpointState(row["state"])
            now = row["_now"]
            if state is S.COMMITTED:
                raise TransitionError(f"checkpoint {pipeline}/{checkpoint_key} is already COMMITTED")
            if state is S.COMMITTING and row["lease_owner"] not in (None, owner):
                if row["lease_expires_at"] is not None and row["lease_expires_at"] > now:
                    raise LeaseHeldError(
                        f"checkpoint {pipeline}/{checkpoint_key} is being committed by {row['lease_owner']} "
                        f"(lease until {row['lease_expires_at']:%Y-%m-%d %H:%M:%S} UTC on the committer "
                        "database's clock)"
                    )
            elif state is S.REJECTED:
                raise AuditRejectedError(
                    f"checkpoint {pipeline}/{checkpoint_key} was REJECTED by its audit and is never committed: "
                    f"{row['error']}; write it again (a new attempt) or abort it"
                )
            elif state not in COMMITTABLE or (state is S.FAILED and not row["durable_at"]):
                raise TransitionError(
                    f"checkpoint {pipeline}/{checkpoint_key} is {state}, not DURABLE; "
                    "it cannot be committed until its sealed attempt is verified"
                )
            if require_audit and state is not S.AUDITED and self._audit_verdict(conn, row) is not S.AUDITED:
                raise NotAuditedError(
                    f"checkpoint {pipeline}/{checkpoint_key} is {state} but its sealed attempt "
                    f"{row['sealed_attempt_id']} has not passed the pipeline's audit; run the audit task first"
                )
            if (mode or self._mode(conn, pipeline)) == "append":
                self._check_append_order(conn, row)
            previous = row["lease_owner"] if row["lease_owner"] not in (None, owner) else None
            if previous:
                crashpoint("lease.takeover")
            expires = now + ttl
            epoch = next_epoch(row["lease_epoch"], now)
            record = self._move(
                conn,
                row,
                S.COMMITTING,
                actor,
                detail=(
                    f"lease taken over from {previous} (epoch {epoch})"
                    if previous
                    else f"lease taken for {ttl.total_seconds():g}s (epoch {epoch})"
                ),
                lease_owner=owner,
                lease_expires_at=expires,
                lease_epoch=epoch,
            )
            return Lease(
                pipeline, checkpoint_key, owner, expires, epoch, taken_over_from=previous, record=record
            )

    def _lease_lost(self, conn: Connection, lease: Lease, doing: str) -> LeaseLostError:
        row = (
            conn.execute(
                select(ckpt.c.state, ckpt.c.lease_owner, ckpt.c.lease_epoch).where(
                    ckpt.c.pipeline == lease.pipeline, ckpt.c.checkpoint_key == lease.checkpoint_key
                )
            )
            .mappings()
            .first()
        )
        now = (
            f"state {row['state']}, epoch {row['lease_epoch']}, holder {row['lease_owner']}"
            if row
            else "gone"
        )
        return LeaseLostError(
            f"cannot {doing} {lease.pipeline}/{lease.checkpoint_key}: the lease of {lease.owner} "
            f"(epoch {lease.epoch}) was taken over, released or aborted ({now}); stopping before any "
            "further change"
        )

    @retrying
    def fence(self, lease: Lease, ttl: timedelta) -> Lease:
        """Confirm the lease is still ours and extend it: one compare-and-set on the epoch.

        Called before each side effect of a publish. Raises
        :class:`LeaseLostError` (a ``FencedError``) once another committer took
        the lease or the checkpoint was aborted; then nothing more may change.
        An expired lease that nobody took is still ours (the epoch did not
        move), and is extended.
        """
        with self._tx() as conn:
            now = self._now(conn)
            result = conn.execute(
                update(ckpt)
                .where(
                    ckpt.c.pipeline == lease.pipeline,
                    ckpt.c.checkpoint_key == lease.checkpoint_key,
                    ckpt.c.state == S.COMMITTING.value,
                    ckpt.c.lease_epoch == lease.epoch,
                )
                .values(lease_expires_at=now + ttl, lease_owner=lease.owner)
            )
            if result.rowcount != 1:
                raise self._lease_lost(conn, lease, "extend the lease on")
        return Lease(
            lease.pipeline,
            lease.checkpoint_key,
            lease.owner,
            now + ttl,
            lease.epoch,
            taken_over_from=lease.taken_over_from,
            record=lease.record,
        )

    #: The name older callers use: renewing is fencing.
    renew_lease = fence

    @retrying
    def release_lease(self, lease: Lease, *, actor: Actor | None = None, reason: str | None = None) -> None:
        """Give a lease back without committing (the checkpoint stays COMMITTING, lease free).

        Only the current holder (same epoch) releases; a stale holder changes nothing.
        """
        with self._tx() as conn:
            row = self._lock(conn, lease.pipeline, lease.checkpoint_key)
            if row["state"] != S.COMMITTING.value or row["lease_epoch"] != lease.epoch:
                return
            conn.execute(
                update(ckpt).where(ckpt.c.id == row["id"]).values(lease_owner=None, lease_expires_at=None)
            )
            self._event(
                conn,
                row,
                actor or Actor(lease.owner),
                f"lease released (epoch {lease.epoch}){': ' + reason if reason else ''}",
            )

    @retrying
    def mark_committed(
        self,
        lease: Lease,
        *,
        actor: Actor,
        end_offsets: Mapping[str, Any] | None = None,
        detail: str | None = None,
        publication: Mapping[str, Any] | None = None,
    ) -> CheckpointRecord:
        """Record the commit: a compare-and-set on the lease's epoch, once.

        Raises :class:`LeaseLostError` if the lease was taken over (the new
        holder records the commit). Repeating it after it took effect returns
        the committed row.
        """
        if self._one_statement:
            record = self._try_one_statement(
                S.COMMITTED,
                actor,
                detail,
                pipeline=lease.pipeline,
                checkpoint_key=lease.checkpoint_key,
                epoch=lease.epoch,
                end_offsets=_dump(end_offsets),
                publication=_dump(publication),
            )
            if record is not None:
                return record
        with self._tx() as conn:
            row = self._lock(conn, lease.pipeline, lease.checkpoint_key)
            if row["state"] == S.COMMITTED.value and row["lease_epoch"] == lease.epoch:
                return CheckpointRecord.from_row(row)  # repeated call after a lost acknowledgement
            if row["state"] != S.COMMITTING.value or row["lease_epoch"] != lease.epoch:
                raise self._lease_lost(conn, lease, "mark COMMITTED")
            values: dict[str, Any] = dict(
                lease_owner=None,
                lease_expires_at=None,
                committed_at=row["_now"],
                error=None,
                publication=_dump(publication),
            )
            if end_offsets is not None:
                values["end_offsets"] = _dump(end_offsets)
            detail = retire_superseded(conn, row, detail)
            return self._move(conn, row, S.COMMITTED, actor, detail=detail, **values)

    @retrying
    def fail(
        self,
        pipeline: str,
        checkpoint_key: str,
        *,
        error: str,
        actor: Actor,
        lease: Lease | None = None,
        attempt: int | None = None,
    ) -> CheckpointRecord:
        """Record an error; the checkpoint stays uncommitted (FAILED) and keeps its data.

        Failures are owned: a committer passes its ``lease`` and fails the
        checkpoint only while that lease is current (same epoch); a writer
        passes its ``attempt`` and fails only that attempt, and only before a
        committer took the checkpoint. Anyone else's error (a zombie's, a
        stale try's) is kept in the history and changes nothing. With neither,
        a COMMITTING checkpoint cannot be failed (abort it instead).
        """
        with self._tx() as conn:
            row = self._lock(conn, pipeline, checkpoint_key)
            state = CheckpointState(row["state"])
            if lease is not None:
                owned = state is S.COMMITTING and row["lease_epoch"] == lease.epoch
                why = f"the lease of epoch {lease.epoch} is no longer current (epoch {row['lease_epoch']})"
            elif attempt is not None:
                owned = row["attempt"] == attempt and state in (
                    S.REGISTERED,
                    S.WRITING,
                    S.SEALED,
                    S.DURABLE,
                    S.FAILED,
                )
                why = f"attempt {attempt} is not the checkpoint's current, uncommitted attempt ({row['attempt']}, {state})"
            else:
                owned = not state.is_final and state is not S.COMMITTING
                why = f"the checkpoint is {state}"
            if not owned:
                self._event(conn, row, actor, f"error not recorded as FAILED ({why}): {error}")
                return CheckpointRecord.from_row(row)
            return self._move(
                conn,
                row,
                S.FAILED,
                actor,
                detail=error,
                error=error[:10000],
                lease_owner=None,
                lease_expires_at=None,
            )
