"""The store's side of an abort: fence the lease holder out, then end the attempt.

:meth:`~AbortTransitions.begin_abort` bumps the fencing token;
:meth:`~AbortTransitions.abort` records ABORTED, or, for a new version that
never began publishing, makes the committed version it was to supersede the
checkpoint again. The orchestration around them (checking the target,
tombstones, rolling back) is :mod:`.abort`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import Connection, select, update

from airflow_provider_walsink.core.protocol.states import CheckpointState
from airflow_provider_walsink.core.store.errors import StaleAttemptError, StoreError, TransitionError
from airflow_provider_walsink.core.store.leases import next_epoch
from airflow_provider_walsink.core.store.models import checkpoint_table as ckpt
from airflow_provider_walsink.core.store.models import version_table as vers
from airflow_provider_walsink.core.store.records import Actor, CheckpointRecord, Lease
from airflow_provider_walsink.core.store.retry import retrying
from airflow_provider_walsink.core.store.transitions import CheckpointTransitions

S = CheckpointState


class AbortTransitions(CheckpointTransitions):
    """Begin and record aborts; mixed into :class:`~.store.CommitterStore`
    (the lease-lost error comes from :mod:`.leases`)."""

    @retrying
    def begin_abort(
        self,
        pipeline: str,
        checkpoint_key: str,
        *,
        actor: Actor,
        reason: str,
        ttl: timedelta,
        attempt_id: str | None = None,
    ) -> Lease:
        """First step of an abort (:mod:`.abort`): fence the lease holder out, change no state.

        One transaction bumps the fencing token, so whoever holds the lease
        (a live committer included) is refused at its next check. A COMMITTING
        checkpoint's lease passes to the abort (owner ``abort:<actor>``, for
        ``ttl``), so no commit try takes it while the abort looks at the
        target. The history records the request, who made it and why. Returns
        the abort's lease: :meth:`abort` with it is a compare-and-set on its
        epoch. Raises :class:`TransitionError` for a COMMITTED checkpoint (its
        data is in the target), :class:`StaleAttemptError` when ``attempt_id``
        (the attempt a person decided about) is no longer the checkpoint's
        attempt (nothing recorded). Repeating it takes a newer token (safe).
        """
        with self._tx() as conn:
            row = self._lock(conn, pipeline, checkpoint_key)
            self._check_decided_attempt(row, attempt_id)
            if row["state"] == S.COMMITTED.value:
                raise TransitionError(
                    f"checkpoint {pipeline}/{checkpoint_key} is COMMITTED: its data is in the target, "
                    "so it cannot be aborted"
                )
            if row["supersedes_attempt_id"] is not None and (
                row["state"] == S.COMMITTING.value or (row["state"] == S.FAILED.value and row["durable_at"])
            ):
                # Its publish may already have retracted part of the committed version:
                # neither version could be restored truthfully.
                raise TransitionError(
                    f"checkpoint {pipeline}/{checkpoint_key} is publishing (or failed publishing) version "
                    f"{row['version']}, which supersedes attempt {row['supersedes_attempt_id']}; its publish "
                    "may already have retracted the committed version, so it cannot be aborted: re-run its "
                    "commit task to finish it"
                )
            now = row["_now"]
            epoch = next_epoch(row["lease_epoch"], now)
            owner = f"abort:{actor.lease_owner}"[:255]
            values: dict[str, Any] = {"lease_epoch": epoch}
            if row["state"] == S.COMMITTING.value:
                values.update(lease_owner=owner, lease_expires_at=now + ttl)
            conn.execute(update(ckpt).where(ckpt.c.id == row["id"]).values(**values))
            holder = row["lease_owner"]
            self._event(
                conn,
                row,
                actor,
                f"abort requested: {reason}; "
                + (f"lease holder {holder} fenced out" if holder else "no lease holder")
                + f" (epoch {row['lease_epoch']} -> {epoch})",
            )
            record = dict(row, **values)
            return Lease(
                pipeline,
                checkpoint_key,
                owner,
                values.get("lease_expires_at") or now + ttl,
                epoch,
                taken_over_from=holder,
                record=CheckpointRecord.from_row(record),
            )

    @retrying
    def abort(
        self,
        pipeline: str,
        checkpoint_key: str,
        *,
        reason: str,
        actor: Actor,
        lease: Lease | None = None,
        attempt_id: str | None = None,
    ) -> CheckpointRecord:
        """Give a checkpoint's current attempt up for good (it unblocks later ``append`` checkpoints).

        Bumps the fencing token, so any committer still holding an old lease is
        refused at its next step. With ``lease`` (from :meth:`begin_abort`) it
        is a compare-and-set on that lease's epoch and may end a COMMITTING
        checkpoint; it raises :class:`LeaseLostError` if a committer took the
        checkpoint since. Without one, a COMMITTING checkpoint is refused (use
        :class:`~.abort.CheckpointAborter`, which fences the holder out and
        checks the target first). Repeating it returns the ABORTED row. A later
        run may start a new write attempt of an ABORTED checkpoint. ``attempt_id``:
        as :meth:`begin_abort`'s.
        """
        with self._tx() as conn:
            row = self._lock(conn, pipeline, checkpoint_key)
            if row["state"] == S.ABORTED.value:
                return CheckpointRecord.from_row(row)
            self._check_decided_attempt(row, attempt_id)
            if lease is not None and row["lease_epoch"] != lease.epoch:
                raise self._lease_lost(conn, lease, "abort")
            if row["state"] == S.COMMITTING.value and lease is None:
                raise TransitionError(
                    f"checkpoint {pipeline}/{checkpoint_key} is being committed; abort it with `walsink "
                    "abort` (which fences the committer out and checks the target first)"
                )
            if row["supersedes_attempt_id"] is not None and row["state"] != S.COMMITTED.value:
                return self._restore_committed_version(conn, row, actor, reason)
            return self._move(
                conn,
                row,
                S.ABORTED,
                actor,
                detail=reason,
                error=reason[:10000],
                lease_owner=None,
                lease_expires_at=None,
                lease_epoch=next_epoch(row["lease_epoch"], row["_now"]),
            )

    @staticmethod
    def _check_decided_attempt(row: dict[str, Any], attempt_id: str | None) -> None:
        """A person's abort decided about ``attempt_id`` (the REJECTED attempt the approval step
        showed) holds for that attempt only: a newer one (the interval written again meanwhile)
        has its own audit, and is not theirs to abort."""
        now = (row["attempt_id"], row["sealed_attempt_id"])
        if attempt_id is not None and now != (attempt_id, attempt_id):
            raise StaleAttemptError(
                f"the abort decided about attempt {attempt_id} of {row['pipeline']}/{row['checkpoint_key']} is "
                f"stale: its attempt is now {row['attempt_id']} (sealed {row['sealed_attempt_id']}, "
                f"{row['state']}); nothing is recorded"
            )

    def _restore_committed_version(
        self, conn: Connection, row: dict[str, Any], actor: Actor, reason: str
    ) -> CheckpointRecord:
        """Abort of a new version that never began publishing: the committed version it was to
        supersede (still what the target holds) is the checkpoint again, COMMITTED."""
        old = (
            conn.execute(
                select(vers).where(
                    vers.c.checkpoint_id == row["id"],
                    vers.c.attempt_id == row["supersedes_attempt_id"],
                    vers.c.state == S.COMMITTED.value,
                )
            )
            .mappings()
            .first()
        )
        if old is None:
            raise StoreError(
                f"checkpoint {row['pipeline']}/{row['checkpoint_key']}: the committed version "
                f"{row['supersedes_attempt_id']} it replaces is not in the version table"
            )
        now = row["_now"]
        values = dict(
            state=S.COMMITTED.value,
            updated_at=now,
            version=old["version"],
            version_token=old["version_token"],
            supersedes_attempt_id=None,
            sealed_attempt=old["attempt"],
            sealed_attempt_id=old["attempt_id"],
            manifest_uri=None,
            manifest_digest=old["manifest_digest"],
            committables=old["committables"],
            rows=old["rows"],
            bytes=old["bytes"],
            start_offsets=old["start_offsets"],
            end_offsets=old["end_offsets"],
            publication=old["publication"],
            committed_at=old["committed_at"],
            error=None,
            lease_owner=None,
            lease_expires_at=None,
            lease_epoch=next_epoch(row["lease_epoch"], now),
        )
        conn.execute(update(ckpt).where(ckpt.c.id == row["id"]).values(**values))
        conn.execute(vers.delete().where(vers.c.id == old["id"]))
        self._record(
            conn,
            row["id"],
            row["state"],
            S.COMMITTED.value,
            row["attempt"],
            actor,
            f"abort of version {row['version']} (attempt {row['attempt']}): {reason}; version "
            f"{old['version']} (attempt {old['attempt_id']}), which the target still holds, is the "
            "checkpoint again",
            now,
        )
        row.update(values)
        return CheckpointRecord.from_row(row)
