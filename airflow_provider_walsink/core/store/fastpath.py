"""PostgreSQL: taking the lease and recording COMMITTED in one statement each.

A data-modifying CTE locks the row, checks the transition, updates the row
and appends the history row in one round trip. When its checks do not hold
(someone else's lease, expired or not; an ``append`` pipeline; an already
committed checkpoint) it changes nothing and returns no row, and the store's
general path runs and gives the precise answer or error. SQLite and
MySQL/MariaDB have no data-modifying CTEs and always take the general path.

Both statements keep the fencing rules of the general path: the lease take
bumps ``lease_epoch`` and computes the expiry on the database's clock;
COMMITTED is a compare-and-set on the epoch.
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import (
    BigInteger,
    Interval,
    Select,
    String,
    and_,
    bindparam,
    cast,
    func,
    insert,
    literal,
    null,
    or_,
    select,
    update,
)

from airflow_provider_walsink.core.protocol.states import CheckpointState
from airflow_provider_walsink.core.store.clock import db_now
from airflow_provider_walsink.core.store.models import checkpoint_table as ckpt
from airflow_provider_walsink.core.store.models import transition_table as trans

S = CheckpointState

#: History columns every transition writes (the store's ``_record`` and these statements).
HISTORY_COLUMNS = ("actor", "dag_id", "run_id", "task_id", "try_number", "detail")


@functools.cache
def one_statement_transition(to: CheckpointState, *, require_audit: bool = False) -> Select:
    """One statement that moves a checkpoint to COMMITTING or COMMITTED, or changes nothing.

    Parameters (``p_`` and: pipeline, checkpoint_key, owner, ttl, epoch,
    end_offsets, publication and the history columns) never share a column's
    name: SQLAlchemy would add such a name to the UPDATE's SET clause.

    * COMMITTING (take the lease): the checkpoint is DURABLE, AUDITED,
      COMMITTING or FAILED after it was durable, with no lease holder (a
      takeover takes the general path, which names whom it took over from);
      with ``require_audit`` it must be AUDITED (the other states need the
      history to tell whether the attempt was audited: general path). For
      ``overwrite`` pipelines only: ``append`` checks the order of commits.
      ``old`` locks the row first and keeps its state for the history.
    * COMMITTED: the checkpoint is COMMITTING under our epoch.
    """
    where = and_(
        ckpt.c.pipeline == bindparam("p_pipeline"), ckpt.c.checkpoint_key == bindparam("p_checkpoint_key")
    )
    now = db_now("postgresql")
    from_state: Any
    if to is S.COMMITTING:
        old = select(ckpt.c.id, ckpt.c.state.label("from_state")).where(where).with_for_update().cte("old")
        committable = (
            old.c.from_state == S.AUDITED.value
            if require_audit
            # Equalities, not IN: an IN list compiles to an expanding parameter that only
            # SQLAlchemy can bind (bench/ sends these statements through a bare driver).
            else or_(
                old.c.from_state == S.DURABLE.value,
                old.c.from_state == S.AUDITED.value,
                old.c.from_state == S.COMMITTING.value,
                and_(old.c.from_state == S.FAILED.value, ckpt.c.durable_at.is_not(None)),
            )
        )
        moved = (
            update(ckpt)
            .where(
                ckpt.c.id == old.c.id,
                committable,
                ckpt.c.lease_owner.is_(None),
            )
            .values(
                state=to.value,
                updated_at=now,
                lease_owner=bindparam("p_owner", type_=String),
                lease_expires_at=now + bindparam("p_ttl", type_=Interval),
                # leases.next_epoch: above the row's token and never below the clock in ms.
                lease_epoch=func.greatest(
                    ckpt.c.lease_epoch + 1,
                    cast(func.floor(func.extract("epoch", func.now()) * 1000), BigInteger),
                ),
            )
            .returning(*ckpt.c, old.c.from_state)
            .cte("moved")
        )
        from_state = moved.c.from_state
    else:
        moved = (
            update(ckpt)
            .where(
                where,
                ckpt.c.state == S.COMMITTING.value,
                ckpt.c.lease_epoch == bindparam("p_epoch"),
                # A new version also retires the one it replaces: the general path does both.
                ckpt.c.supersedes_attempt_id.is_(None),
            )
            .values(
                state=to.value,
                updated_at=now,
                lease_owner=null(),
                lease_expires_at=null(),
                committed_at=now,
                error=null(),
                end_offsets=func.coalesce(bindparam("p_end_offsets", type_=String), ckpt.c.end_offsets),
                publication=bindparam("p_publication", type_=String),
            )
            .returning(*ckpt.c)
            .cte("moved")
        )
        from_state = literal(S.COMMITTING.value, String)
    history = {c: bindparam(f"p_{c}", type_=trans.c[c].type) for c in HISTORY_COLUMNS}
    if to is S.COMMITTING:
        # The new epoch is known only here: the history names it, as the locking path does.
        history["detail"] = func.concat(history["detail"], " (epoch ", cast(moved.c.lease_epoch, String), ")")
    hist = (
        insert(trans)
        .from_select(
            ["checkpoint_id", "from_state", "to_state", "attempt", "at", *HISTORY_COLUMNS],
            select(
                moved.c.id,
                from_state,
                moved.c.state,
                moved.c.attempt,
                moved.c.updated_at,
                *history.values(),
            ),
        )
        .cte("hist")
    )
    return select(*(moved.c[c.name] for c in ckpt.c)).add_cte(hist)
