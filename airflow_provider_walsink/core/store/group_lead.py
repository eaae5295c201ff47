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

Waiting costs no polling where the database can signal: on PostgreSQL and
MySQL/MariaDB the leader also holds a session-level advisory lock named after
the pipeline (``pg_try_advisory_lock`` / ``GET_LOCK``) while it leads, and a waiting
task blocks on that lock (:meth:`GroupLeads.wait_for_group_end`; on PostgreSQL in
shared mode, so all waiters wake together), woken the moment the lead ends, or the
leader's connection dies. The lock is only a wake-up
signal: a wait that times out (or a leader that could not take it) just looks
again. SQLite has no such lock: waiting tasks look every ``poll``.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
import zlib
from datetime import timedelta
from typing import Any

from sqlalchemy import and_, select, text, update
from sqlalchemy.exc import DBAPIError

from airflow_provider_walsink.core.store.clock import as_datetime
from airflow_provider_walsink.core.store.first_event import claim_on_pipeline_row
from airflow_provider_walsink.core.store.models import pipeline_table as pipe
from airflow_provider_walsink.core.store.retry import retrying
from airflow_provider_walsink.core.store.transitions import CheckpointTransitions

log = logging.getLogger(__name__)

#: The first key of walsink's PostgreSQL advisory locks ('WAL'); the second is the pipeline's CRC-32.
_PG_LOCK_SPACE = 0x57414C


def _pg_key(pipeline: str) -> int:
    """The pipeline's signed 32-bit key (a collision only wakes a waiter early: it looks again)."""
    return zlib.crc32(pipeline.encode()) - 2**31


def _mysql_name(pipeline: str) -> str:
    return "walsink.group." + hashlib.sha1(pipeline.encode()).hexdigest()  # noqa: S324 - a name, not security


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
        self._hold_signal(pipeline, owner)
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
        self._drop_signal(pipeline, owner[:255])

    # ------------------------------------------------------------------ the wake-up signal

    def _signals(self) -> dict[str, Any]:
        return self.__dict__.setdefault("_group_signals", {})  # type: ignore[no-any-return]

    def _hold_signal(self, pipeline: str, owner: str) -> None:
        """Take the pipeline's advisory lock on a connection of its own, held while this process
        leads (PostgreSQL, MySQL/MariaDB; nothing elsewhere). Best effort: without it waiting
        tasks look again after their timeout."""
        if self._dialect not in ("postgresql", "mysql", "mariadb") or pipeline in self._signals():
            return
        conn = None
        try:
            conn = self.engine.connect()
            if self._dialect == "postgresql":
                held = conn.execute(
                    text("SELECT pg_try_advisory_lock(:space, :key)"),
                    {"space": _PG_LOCK_SPACE, "key": _pg_key(pipeline)},
                ).scalar()
            else:
                held = conn.execute(
                    text("SELECT GET_LOCK(:name, 0)"), {"name": _mysql_name(pipeline)}
                ).scalar()
            conn.commit()
            if held:
                self._signals()[pipeline] = (owner, conn)
                return
        except DBAPIError as exc:
            log.debug("no wake-up signal for the group lead of %s: %s", pipeline, exc)
        if conn is not None:
            conn.close()

    def _drop_signal(self, pipeline: str, owner: str) -> None:
        """Give up the signal ``owner`` took (also when its lead ran out and another took the row:
        the lock is this session's until released)."""
        held = self._signals().get(pipeline)
        if held is None or held[0] != owner:
            return
        conn = self._signals().pop(pipeline)[1]
        try:
            if self._dialect == "postgresql":
                conn.execute(
                    text("SELECT pg_advisory_unlock(:space, :key)"),
                    {"space": _PG_LOCK_SPACE, "key": _pg_key(pipeline)},
                )
            else:
                conn.execute(text("SELECT RELEASE_LOCK(:name)"), {"name": _mysql_name(pipeline)})
            conn.commit()
            conn.close()
        except DBAPIError:
            conn.invalidate()  # a session-level lock must never go back to the pool: drop the session

    def wait_for_group_end(self, pipeline: str, timeout: float) -> bool | None:
        """Block until the pipeline's group-commit lead ends or ``timeout`` seconds pass.

        ``True``: the leader gave the lead up (or its session died) during the wait (or no one
        held the signal); ``False``: the timeout passed. ``None`` at once where the database has
        no such lock (SQLite): the caller looks again on its own clock.
        """
        if self._dialect not in ("postgresql", "mysql", "mariadb"):
            return None
        try:
            with self.engine.connect() as conn:
                if self._dialect == "postgresql":
                    params = {"space": _PG_LOCK_SPACE, "key": _pg_key(pipeline)}
                    conn.execute(
                        text("SELECT set_config('lock_timeout', :ms, true)"),
                        {"ms": str(max(1, int(timeout * 1000)))},
                    )
                    # Shared and transaction-scoped: every waiter is granted it at once when the
                    # leader lets its exclusive lock go (not one after another), and the commit
                    # below gives it back, so no session in the pool keeps it.
                    try:
                        conn.execute(text("SELECT pg_advisory_xact_lock_shared(:space, :key)"), params)
                    except DBAPIError:  # lock_timeout: the lead is still held
                        conn.rollback()
                        return False
                    conn.commit()
                    return True
                name = _mysql_name(pipeline)
                got = conn.execute(
                    text("SELECT GET_LOCK(:name, :seconds)"),
                    {"name": name, "seconds": max(1, math.ceil(timeout))},
                ).scalar()
                if got:
                    conn.execute(text("SELECT RELEASE_LOCK(:name)"), {"name": name})
                conn.commit()
                return bool(got)
        except DBAPIError as exc:
            log.debug("waiting for the group lead of %s without its signal: %s", pipeline, exc)
            time.sleep(timeout)
            return False

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
