"""Table fencing's committer-table transactions: one read, then one transaction per commit.

The read takes no lock and writes nothing; COMMITTED is one compare-and-set on
"still committable with sealed attempt X" (one statement on PostgreSQL), or,
when the table holds another attempt, one transaction that records that
attempt (:func:`reconcile`). The protocol around them: :mod:`.tablefence`.
"""

from __future__ import annotations

import json
import time
from typing import Any

from sqlalchemy import BigInteger, Select, String, bindparam, func, insert, null, or_, select, update

from airflow_provider_walsink.core.protocol.errors import FencedError
from airflow_provider_walsink.core.protocol.states import CheckpointState
from airflow_provider_walsink.core.store.clock import db_now
from airflow_provider_walsink.core.store.errors import LeaseHeldError
from airflow_provider_walsink.core.store.fastpath import HISTORY_COLUMNS
from airflow_provider_walsink.core.store.lifecycle import UNKNOWN_OFFSETS
from airflow_provider_walsink.core.store.models import checkpoint_table as ckpt
from airflow_provider_walsink.core.store.models import transition_table as trans
from airflow_provider_walsink.core.store.records import Actor, CheckpointRecord
from airflow_provider_walsink.core.store.retry import retrying
from airflow_provider_walsink.core.store.store import CommitterStore
from airflow_provider_walsink.core.store.transitions import _history_values, retire_superseded

S = CheckpointState


def table_token(record: CheckpointRecord) -> int:
    """The token a table-fenced commit records: above every lease token of the row, else the clock in ms."""
    return max(record.lease_epoch + 1, int(time.time() * 1000))


def committable(record: CheckpointRecord) -> bool:
    return record.state in (S.DURABLE, S.AUDITED) or (record.state is S.FAILED and bool(record.durable_at))


# --------------------------------------------------------------------------- the read and the one transaction

_READ = select(ckpt).where(
    ckpt.c.pipeline == bindparam("p_pipeline"), ckpt.c.checkpoint_key == bindparam("p_checkpoint_key")
)


@retrying
def read_checkpoint(store: CommitterStore, pipeline: str, checkpoint_key: str) -> CheckpointRecord:
    """The row, read without a lock: ``store.require``, in one round trip on PostgreSQL.

    psycopg2 opens a transaction with a separate ``BEGIN`` and the pool ends it
    with a ``ROLLBACK``: for a single read, autocommit (the driver's own switch,
    as the store's one-statement transitions use) saves both round trips.
    """
    if not store._one_statement:
        return store.require(pipeline, checkpoint_key)
    with store.engine.connect() as conn:
        driver = conn.connection.driver_connection
        driver.autocommit = True
        try:
            row = (
                conn.execute(_READ, {"p_pipeline": pipeline, "p_checkpoint_key": checkpoint_key})
                .mappings()
                .first()
            )
        finally:
            if not conn.invalidated:
                driver.autocommit = False
    if row is None or (row["pipeline"], row["checkpoint_key"]) != (pipeline, checkpoint_key):
        return store.require(pipeline, checkpoint_key)  # its error (or a validated identifier's)
    return CheckpointRecord.from_row(row)


def one_statement_commit() -> Select:
    """PostgreSQL: COMMITTED for sealed attempt X of a committable row, with its history row, or nothing.

    Parameters: ``p_pipeline``, ``p_checkpoint_key``, ``p_attempt_id``, ``p_token``,
    ``p_end_offsets``, ``p_publication`` and the history columns. A reprocess
    (the row supersedes a version) and a FAILED row take the general path.
    """
    now = db_now("postgresql")
    old = (
        select(ckpt.c.id, ckpt.c.state.label("from_state"))
        .where(
            ckpt.c.pipeline == bindparam("p_pipeline"), ckpt.c.checkpoint_key == bindparam("p_checkpoint_key")
        )
        .with_for_update()
        .cte("old")
    )
    moved = (
        update(ckpt)
        .where(
            ckpt.c.id == old.c.id,
            ckpt.c.sealed_attempt_id == bindparam("p_attempt_id", type_=String),
            or_(ckpt.c.state == S.DURABLE.value, ckpt.c.state == S.AUDITED.value),
            ckpt.c.supersedes_attempt_id.is_(None),
        )
        .values(
            state=S.COMMITTED.value,
            updated_at=now,
            lease_owner=null(),
            lease_expires_at=null(),
            committed_at=now,
            error=null(),
            lease_epoch=func.greatest(ckpt.c.lease_epoch, bindparam("p_token", type_=BigInteger)),
            end_offsets=func.coalesce(bindparam("p_end_offsets", type_=String), ckpt.c.end_offsets),
            publication=bindparam("p_publication", type_=String),
        )
        .returning(*ckpt.c, old.c.from_state)
        .cte("moved")
    )
    history = {c: bindparam(f"p_{c}", type_=trans.c[c].type) for c in HISTORY_COLUMNS}
    hist = (
        insert(trans)
        .from_select(
            ["checkpoint_id", "from_state", "to_state", "attempt", "at", *HISTORY_COLUMNS],
            select(
                moved.c.id,
                moved.c.from_state,
                moved.c.state,
                moved.c.attempt,
                moved.c.updated_at,
                *history.values(),
            ),
        )
        .cte("hist")
    )
    return select(*(moved.c[c.name] for c in ckpt.c)).add_cte(hist)


_ONE_STATEMENT = one_statement_commit()


@retrying
def record_committed(
    store: CommitterStore,
    record: CheckpointRecord,
    *,
    token: int,
    actor: Actor,
    end_offsets: dict[str, Any] | None,
    publication: dict[str, Any] | None,
    detail: str,
) -> tuple[CheckpointRecord, bool] | None:
    """The table holds ``record``'s sealed attempt: record COMMITTED in one transaction, or ``None``.

    A compare-and-set: the row must still be committable with the same sealed
    attempt id and version. Returns the row and whether *this* call recorded
    COMMITTED: a row found COMMITTED already (a racing committer of the same
    attempt won, or a lost acknowledgement) is returned with ``False``, so
    only one committer reports a new commit (one asset event: missed on a
    lost acknowledgement, which the commit task's own-try check repairs,
    never doubled).
    """
    attempt_id = record.sealed_attempt_id
    offsets = json.dumps(end_offsets, sort_keys=True) if end_offsets is not None else None
    pub = json.dumps(publication, sort_keys=True) if publication is not None else None
    if store._one_statement and record.supersedes_attempt_id is None and record.state is not S.FAILED:
        params = dict(
            p_pipeline=record.pipeline,
            p_checkpoint_key=record.checkpoint_key,
            p_attempt_id=attempt_id,
            p_token=token,
            p_end_offsets=offsets,
            p_publication=pub,
            **{f"p_{k}": v for k, v in _history_values(actor, detail).items()},
        )
        with store.engine.connect() as conn:
            driver = conn.connection.driver_connection
            driver.autocommit = True
            try:
                row = conn.execute(_ONE_STATEMENT, params).mappings().first()
            finally:
                if not conn.invalidated:
                    driver.autocommit = False
        if row is not None:
            return CheckpointRecord.from_row(row), True
    with store._tx() as conn:
        row = store._lock(conn, record.pipeline, record.checkpoint_key)
        if row["version"] != record.version or row["sealed_attempt_id"] != attempt_id:
            return None
        if row["state"] == S.COMMITTED.value:
            return CheckpointRecord.from_row(row), False  # a racing committer, or a lost acknowledgement
        if not (
            row["state"] in (S.DURABLE.value, S.AUDITED.value)
            or (row["state"] == S.FAILED.value and row["durable_at"] is not None)
        ):
            return None
        values: dict[str, Any] = dict(
            state=S.COMMITTED.value,
            updated_at=row["_now"],
            lease_owner=None,
            lease_expires_at=None,
            committed_at=row["_now"],
            error=None,
            publication=pub,
            lease_epoch=max(row["lease_epoch"], token),
        )
        if offsets is not None:
            values["end_offsets"] = offsets
        detail = retire_superseded(conn, row, detail) or detail
        return _apply(store, conn, row, values, actor, detail), True


def _apply(
    store: CommitterStore, conn: Any, row: dict[str, Any], values: dict[str, Any], actor: Actor, detail: str
) -> CheckpointRecord:
    """Move a locked row to COMMITTED and write its history row.

    A table-fenced commit goes from a committable state straight to COMMITTED
    (no COMMITTING: there is no lease), so it bypasses ``TRANSITIONS``, which
    describes the lease protocol; the callers check the source state.
    """
    conn.execute(update(ckpt).where(ckpt.c.id == row["id"]).values(**values))
    store._record(
        conn, row["id"], row["state"], S.COMMITTED.value, row["attempt"], actor, detail, row["_now"]
    )
    row.update(values)
    return CheckpointRecord.from_row(row)


@retrying
def reconcile(
    store: CommitterStore,
    record: CheckpointRecord,
    held: str,
    *,
    held_fields: dict[str, Any],
    token: int,
    actor: Actor,
    why: str,
    append: bool = False,
) -> CheckpointRecord:
    """Record COMMITTED for the attempt the table holds (``held``), in one transaction.

    ``record`` is the row as the committer read it; the row must still be that
    version. ``held_fields`` carry the held attempt's source offsets
    (``start_offsets``/``end_offsets``, or ``start_offsets`` =
    :data:`~.lifecycle.UNKNOWN_OFFSETS`): COMMITTED is recorded with those and
    no others, and with ``append`` only if they pass the append rule
    (``_check_append_order``) in this transaction. Raises :class:`FencedError`
    (ABORTED: nothing is changed, and no history row either; or a newer
    version), :class:`LeaseHeldError` (COMMITTING: a lease committer owns it
    now), :class:`OrderingError` / :class:`OffsetsError` (the append rule;
    nothing changed). A row already COMMITTED is returned as it is.
    """
    with store._tx() as conn:
        row = store._lock(conn, record.pipeline, record.checkpoint_key)
        name = f"checkpoint {record.pipeline}/{record.checkpoint_key}"
        state = S(row["state"])
        if state is S.COMMITTED:
            return CheckpointRecord.from_row(row)
        if state is S.ABORTED:
            raise FencedError(
                f"{name} was ABORTED while this committer ran; the table holds attempt {held}, and the abort's "
                "record stands (nothing changed; a new write attempt's commit reconciles it)"
            )
        if state is S.COMMITTING:
            raise LeaseHeldError(
                f"{name} is being committed under a lease by {row['lease_owner']}; it records the outcome"
            )
        if row["version"] != record.version:
            raise FencedError(f"{name} moved on to version {row['version']}; nothing changed")
        was = f"{state} attempt {row['attempt']} ({row['attempt_id']})"
        held_fields = dict(held_fields)
        if append:
            store._check_append_order(conn, row, start_offsets=held_fields["start_offsets"])
        if held_fields["start_offsets"] is UNKNOWN_OFFSETS:
            # Not an append order to keep (checked above): record no offsets rather than a guess.
            held_fields.update(start_offsets=None, end_offsets=None)
        values: dict[str, Any] = dict(
            held_fields,
            sealed_attempt_id=held,
            state=S.COMMITTED.value,
            updated_at=row["_now"],
            lease_owner=None,
            lease_expires_at=None,
            committed_at=row["_now"],
            error=None,
            lease_epoch=max(row["lease_epoch"], token),
        )
        row_for_retire = dict(row, sealed_attempt_id=held)
        reconciled = (
            f"reconciled from the table: it holds attempt {held} of version {row['version']} ({why}); "
            f"the committer table had {was}"
        )
        detail = retire_superseded(conn, row_for_retire, reconciled) or reconciled
        return _apply(store, conn, row, values, actor, detail)


def is_audited(store: CommitterStore, record: CheckpointRecord) -> bool:
    """Whether the row's sealed attempt passed the pipeline's audit (read without a lock)."""
    with store.engine.connect() as conn:
        row = (
            conn.execute(
                select(ckpt).where(
                    ckpt.c.pipeline == record.pipeline, ckpt.c.checkpoint_key == record.checkpoint_key
                )
            )
            .mappings()
            .first()
        )
        return row is not None and store._audit_verdict(conn, row) is S.AUDITED


def check_append_order(store: CommitterStore, pipeline: str, checkpoint_key: str) -> None:
    """The ``append`` order rule, as the lease take checks it (reads, locks nothing)."""
    with store.engine.connect() as conn:
        row = (
            conn.execute(
                select(ckpt).where(ckpt.c.pipeline == pipeline, ckpt.c.checkpoint_key == checkpoint_key)
            )
            .mappings()
            .first()
        )
        store._check_append_order(conn, row)
