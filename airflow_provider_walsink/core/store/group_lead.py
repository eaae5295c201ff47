"""The group-commit lead: one commit of a pipeline's table in flight at a time.

A database's group commit lets the first transaction to reach the log flush
everyone's records while the others wait for its answer. Here the first commit
task of a pipeline to claim ``group_leader`` on the pipeline's row (a
compare-and-set, expiry on the database's clock) leads: it takes the leases of
the pipeline's other durable checkpoints and publishes them in one table
commit (:mod:`~airflow_provider_walsink.core.commit.group`). A task that finds
the lead held leaves its checkpoint unheld for that leader's group and waits
for the answer, instead of taking its own lease and racing the leader at the
table (many tasks released together each leased their own checkpoint, formed
groups of 2-8 and conflicted at the table).

The lead decides who publishes, never what is published: every checkpoint is
still published under its own lease's fencing token, so a leader whose lead ran
out (paused, killed) can cost time but never a duplicate or a loss.

A waiting task reads, never writes: one read per look
(:meth:`GroupLeads.group_wait`) of its checkpoint's state and holder and of whether the lead is
live, both judged on the database's clock, until the leader has committed its checkpoint, taken
it and let its lease run out, or given the lead up with the checkpoint still unheld. No lock is
held across transactions (an earlier version held a session-level advisory lock on a second
connection while leading, for the waiters to block on): a task holds at most one connection, and
every transaction stands alone, so the committer works behind a pooler in transaction mode
(PgBouncer), where a session's lock would stay on whichever server connection took it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import and_, select, update

from airflow_provider_walsink.core.protocol.states import CheckpointState
from airflow_provider_walsink.core.store.clock import as_datetime
from airflow_provider_walsink.core.store.first_event import claim_on_pipeline_row
from airflow_provider_walsink.core.store.models import checkpoint_table as ckpt
from airflow_provider_walsink.core.store.models import pipeline_table as pipe
from airflow_provider_walsink.core.store.retry import retrying
from airflow_provider_walsink.core.store.transitions import CheckpointTransitions


@dataclass(frozen=True)
class GroupWait:
    """One look of a task waiting for its pipeline's group commit (:meth:`GroupLeads.group_wait`)."""

    state: CheckpointState
    #: Who holds the checkpoint's lease (``group:...`` while a leader's group has it), if anyone.
    lease_owner: str | None
    #: That lease has not run out.
    lease_live: bool
    #: Some task leads the pipeline's group commit and its lead has not run out.
    lead_live: bool


class GroupLeads(CheckpointTransitions):
    """Claim and release a pipeline's group-commit lead; mixed into :class:`~.store.CommitterStore`."""

    @retrying
    def lead_group(self, pipeline: str, owner: str, *, ttl: timedelta) -> str | None:
        """Make ``owner`` the pipeline's group-commit leader for ``ttl``; who leads after the call.

        ``owner`` leads when no one did, when it already did (its retry, or a leader
        extending its lead), or when the lead ran out on the database's clock: one
        statement, so two claimants never both lead. Otherwise the live leader is returned
        (from the same transaction). ``None`` for a pipeline with no row (nothing to
        coordinate with: lead).
        """
        owner = owner[:255]
        with self._tx() as conn:
            now = self._now(conn)
            until = pipe.c.group_leader_until
            led = claim_on_pipeline_row(
                conn,
                pipeline,
                pipe.c.group_leader,
                owner,
                expired=and_(until.is_not(None), until < now),
                values={"group_leader": owner, "group_leader_until": now + ttl},
            )
            if not led:
                return conn.execute(select(pipe.c.group_leader).where(pipe.c.name == pipeline)).scalar()
        return owner

    @retrying
    def release_group_lead(self, pipeline: str, owner: str) -> None:
        """Give the lead up, if ``owner`` still holds it (a lead taken over is left alone)."""
        with self._tx() as conn:
            conn.execute(
                update(pipe)
                .where(pipe.c.name == pipeline, pipe.c.group_leader == owner[:255])
                .values(group_leader=None, group_leader_until=None)
            )

    @retrying
    def group_wait(self, pipeline: str, checkpoint_key: str) -> GroupWait | None:
        """What a task waiting for the pipeline's group commit needs to know, in one read (no
        write, no lock): its checkpoint's state and lease holder, whether that lease and the
        pipeline's lead are live on the database's clock. ``None`` for an unknown checkpoint."""
        now = self._now_expr()
        until = pipe.c.group_leader_until
        with self.engine.connect() as conn:
            row = conn.execute(
                select(
                    ckpt.c.state,
                    ckpt.c.lease_owner,
                    and_(ckpt.c.lease_expires_at.is_not(None), ckpt.c.lease_expires_at >= now),
                    and_(pipe.c.group_leader.is_not(None), until.is_not(None), until >= now),
                )
                .select_from(ckpt.outerjoin(pipe, pipe.c.name == ckpt.c.pipeline))
                .where(ckpt.c.pipeline == pipeline, ckpt.c.checkpoint_key == checkpoint_key)
            ).first()
        if row is None:
            return None
        return GroupWait(CheckpointState(row[0]), row[1], bool(row[2]), bool(row[3]))

    @retrying
    def group_leader(self, pipeline: str) -> str | None:
        """Who leads the pipeline's group commit now (``None``: no one, or the lead ran out)."""
        with self.engine.connect() as conn:
            row = conn.execute(
                select(pipe.c.group_leader, pipe.c.group_leader_until, self._now_expr()).where(
                    pipe.c.name == pipeline
                )
            ).first()
        if row is None or row[0] is None:
            return None
        return row[0] if as_datetime(row[1]) >= as_datetime(row[2]) else None
