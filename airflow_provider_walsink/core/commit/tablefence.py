"""Table fencing: one committer-table transaction per commit, when the table's commit is the fence.

``CheckpointCommitter(..., fencing="table")`` (the commit operator's and
``walsink_pipeline``'s ``fencing="table"``). The default, ``"lease"``, is the
protocol of :mod:`.commit`: a lease transaction, the publish under fence
checks, a COMMITTED transaction. This mode drops the lease. Per checkpoint:

1. **Read** the checkpoint's row (no lock, no write). It must be committable:
   DURABLE, AUDITED (AUDITED only, with ``require_audit``) or FAILED after it
   was durable, with a sealed attempt X; otherwise the usual explanation
   (:func:`.commit.explain_not_committable`). A COMMITTING row is a lease-mode
   commit in flight: refused (:class:`LeaseHeldError`), never raced.
2. **Publish X** with a :class:`TableFenceContext` (``ctx.fencing == "table"``,
   ``fence()`` does nothing). The target's one atomic commit carries the marker
   and checks, in the table state that commit is based on, that the table holds
   no other attempt of this checkpoint version ("first publication of a
   version wins": ``publishers/_tables.decide``) and no abort tombstone for X.
   The table's own compare-and-swap (Iceberg: the catalog's swap on the branch
   head; Delta: the log's put-if-absent and its conflict check on the
   application transaction ids) makes the check and the commit one step.
3. **One transaction** records COMMITTED: a compare-and-set on the row "still
   committable with sealed attempt X" (one statement on PostgreSQL), with its
   history row, and for a reprocess the superseded version retired.
4. If the table holds another attempt H of the version, or the compare-and-set
   finds the row moved on (a new write attempt, FAILED, REJECTED), the table is
   the source of truth: one transaction records COMMITTED **for H** (read back
   from the table), with a history row saying it was reconciled from the table.
   ABORTED and COMMITTING rows are never reconciled (see below). The row
   records H's source offsets (its manifest, else the table's marker), never
   the ones it carried; in ``append`` only if they pass the order rule in the
   same transaction, and never when nobody can say them (``OffsetsError``,
   recorded as the checkpoint's error).

**Why it is exactly-once** (DESIGN.md invariants 1, 2, 4, 8).

* *Once in the table.* Every publish of the checkpoint version goes through the
  table's atomic commit, whose check (based on the very state it commits over)
  admits a publication only if the table holds nothing of this version, or
  exactly the version a reprocess supersedes. Two committers racing (same
  attempt or different attempts): one commit lands; the other's compare-and-
  swap fails, it reloads and finds the winner's marker (already published, or
  another attempt: reconcile). A crash after the table commit leaves the
  marker; every later try finds it. The committer table's rows are never
  consulted for this, so trimmed, restored or lost rows change nothing.
* *Never report an attempt the table does not hold.* COMMITTED is recorded
  either for X after the table said it holds X (our commit landed or the
  marker names X), or, reconciling, for the attempt the table names when read
  after the failed compare-and-set. The target's marker for a version can only
  change to a *newer version* (a reprocess, which first needs the row
  COMMITTED, then a new version row: the compare-and-set on the sealed attempt
  id and the version check both fail for the old one).
* *The lease's other jobs.* Without a lease two committers may publish at
  once: harmless, the table serialises them. A write attempt may start while a
  committer publishes the previous sealed attempt (the row is never
  COMMITTING): whichever attempt the table takes first is the version, and the
  row is reconciled to it; the other attempt is never published.
* *Abort* (:mod:`.abort`): there is no lease to fence out, so the abort makes
  the table the fence too. Its tombstone names every attempt of the version a
  committer could still publish (the row's current and sealed attempts and
  every attempt staged under the checkpoint), and is one atomic commit of the
  table checked against the same marker: if the table holds the sealed
  attempt, the abort is refused (published); otherwise the tombstone lands
  first and every publish of those attempts is refused by its in-commit check.
  A committer resumed after the abort therefore changes nothing in the table,
  and, finding the row ABORTED, nothing in the committer table either.
* *Ordering* (``append``): checked by a read before the publish, as the lease
  take checks it (it too reads the other checkpoints' rows without locking
  them), and for a reconcile again with the offsets of the attempt the table
  holds: a re-run after retention of an interval the table already holds is
  refused, not recorded with offsets that would skip the rows it read.

Requires a target whose ``capabilities`` declare ``atomic``,
``remembers_commits`` and ``table_fence`` (Iceberg, Delta). The files target
has no atomic commit and the SQL target's marker row has no tombstone yet:
:func:`require_table_fence` refuses them.

Mixing modes on one checkpoint is safe (never twice) but not useful: a lease
committer over a table-fenced publication may replace it (overwrite) or be
refused (append); choose the mode per pipeline.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from sqlalchemy import BigInteger, Select, String, bindparam, func, insert, null, or_, select, update

from airflow_provider_walsink.core.faults import crashpoint
from airflow_provider_walsink.core.protocol.errors import FencedError, NotDurableError, WalsinkError
from airflow_provider_walsink.core.protocol.manifest import MANIFEST_NAME, Manifest, read_manifest
from airflow_provider_walsink.core.protocol.states import CheckpointState
from airflow_provider_walsink.core.staging.cleanup import store_attempts
from airflow_provider_walsink.core.staging.layout import StagingLayout
from airflow_provider_walsink.core.staging.object_store import AttemptLocation, StagingStore
from airflow_provider_walsink.core.store.clock import db_now
from airflow_provider_walsink.core.store.errors import (
    AuditRejectedError,
    LeaseHeldError,
    NotAuditedError,
    OffsetsError,
)
from airflow_provider_walsink.core.store.fastpath import HISTORY_COLUMNS
from airflow_provider_walsink.core.store.lifecycle import UNKNOWN_OFFSETS
from airflow_provider_walsink.core.store.models import checkpoint_table as ckpt
from airflow_provider_walsink.core.store.models import transition_table as trans
from airflow_provider_walsink.core.store.records import Actor, CheckpointRecord
from airflow_provider_walsink.core.store.retry import retrying
from airflow_provider_walsink.core.store.store import CommitterStore
from airflow_provider_walsink.core.store.transitions import _dump, _history_values, retire_superseded
from airflow_provider_walsink.core.targets._tables import (
    FENCING_MODES,
    AbortedInTableError,
    HeldByAnotherAttemptError,
)
from airflow_provider_walsink.core.targets.base import StagedAttempt

log = logging.getLogger(__name__)
S = CheckpointState

__all__ = ["FENCING_MODES", "TableFenceContext", "TableFenceUnsupportedError", "require_table_fence"]


class TableFenceUnsupportedError(WalsinkError, ValueError):
    """``fencing="table"`` was asked for a target whose commit cannot be the fence."""


def require_table_fence(publisher: Any) -> None:
    """Raise :class:`TableFenceUnsupportedError` unless the target can be the only fence."""
    caps = getattr(publisher, "capabilities", None)
    kind = getattr(publisher, "kind", type(publisher).__name__)
    missing = [
        name
        for name in ("atomic", "remembers_commits", "table_fence")
        if caps is None or not getattr(caps, name, False)
    ]
    if missing:
        raise TableFenceUnsupportedError(
            f"fencing='table' needs a target whose own atomic commit refuses a second publication of a "
            f"checkpoint version and carries abort tombstones; the {kind} target does not "
            f"({', '.join(missing)}: no). Use fencing='lease' (the default)"
        )


def validate_fencing(fencing: str) -> str:
    if fencing not in FENCING_MODES:
        raise ValueError(f"fencing must be one of {FENCING_MODES}, got {fencing!r}")
    return fencing


class TableFenceContext:
    """The publisher context of a table-fenced commit: no lease, the table decides.

    ``epoch`` is a token above every lease token the row handed out and the
    client's clock in ms: recorded in the marker (and kept by the row), never
    compared by the table-fenced rule.
    """

    fencing = "table"

    def __init__(
        self, pipeline: str, checkpoint_key: str, *, attempt_id: str, epoch: int, supersedes: str | None
    ) -> None:
        self.pipeline, self.checkpoint_key = pipeline, checkpoint_key
        self.attempt_id, self.epoch, self.supersedes = attempt_id, epoch, supersedes

    def fence(self, *, force: bool = False) -> None:
        return None

    def event(self, name: str) -> None:
        crashpoint(name)


def table_token(record: CheckpointRecord) -> int:
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


# --------------------------------------------------------------------------- the commit


def commit_table_fenced(committer: Any, pipeline: str, checkpoint_key: str, *, actor: Actor) -> Any:
    """:meth:`.commit.CheckpointCommitter.commit` with ``fencing="table"`` (module docstring)."""
    from airflow_provider_walsink.core.commit.commit import (
        BAD_INPUT,
        explain_not_committable,
        publish_argument,
        read_sealed_attempt,
    )

    started = time.monotonic()
    store: CommitterStore = committer.store
    record = read_checkpoint(store, pipeline, checkpoint_key)
    name = f"checkpoint {pipeline}/{checkpoint_key}"
    if record.is_committed:
        log.info("%s is already COMMITTED (at %s); nothing to do", name, record.committed_at)
        committer._finish_cleanup(record)
        return committer._summary(record, already=True, started=started)
    if record.state is S.COMMITTING:
        raise LeaseHeldError(
            f"{name} is being committed under a lease by {record.lease_owner} (fencing='lease'); a "
            "table-fenced commit does not race it: retry later, or commit with fencing='lease' to take an "
            "expired lease over"
        )
    if record.state is S.REJECTED:
        raise AuditRejectedError(
            f"{name} was REJECTED by its audit and is never committed: {record.error}; write it again "
            "(a new attempt) or abort it"
        )
    if not committable(record):
        raise NotDurableError(explain_not_committable(record))
    if committer.require_audit and record.state is not S.AUDITED and not _audited(store, record):
        raise NotAuditedError(
            f"{name} is {record.state} but its sealed attempt {record.sealed_attempt_id} has not passed the "
            "pipeline's audit; run the audit task first"
        )
    if committer.mode == "append":
        try:
            _check_order(store, pipeline, checkpoint_key)
        except OffsetsError as exc:
            record_refusal(store, pipeline, checkpoint_key, exc, actor)
            raise
    token = table_token(record)
    try:
        manifest, attempt = read_sealed_attempt(committer.layout, record)
    except BAD_INPUT as exc:
        _record_failure(store, record, str(exc), actor)
        raise
    ctx = TableFenceContext(
        pipeline,
        checkpoint_key,
        attempt_id=manifest.attempt_id,
        epoch=token,
        supersedes=record.supersedes_attempt_id,
    )
    held: str = manifest.attempt_id
    result = None
    try:
        result = committer.publisher.publish(manifest, publish_argument(committer.publisher, attempt), ctx)
    except HeldByAnotherAttemptError as exc:
        held = exc.held
        log.warning("%s: %s", name, exc)
    except AbortedInTableError as exc:
        # An abort tombstoned this attempt in the table: change nothing, anywhere.
        log.error("stopped committing %s: %s", name, exc)
        raise
    except FencedError as exc:
        log.error("stopped committing %s: %s", name, exc)
        raise
    except Exception as exc:
        log.error("%s cannot be committed: %s", name, exc)
        _record_failure(store, record, _describe(exc), actor)
        raise
    crashpoint("commit.after_publish")
    if held == manifest.attempt_id:
        assert result is not None
        recorded = record_committed(
            store,
            record,
            token=token,
            actor=actor,
            end_offsets=manifest.end_offsets,
            publication=committer._publication(result),
            detail=f"table-fenced: published {result.published}, already there {result.already}",
        )
        if recorded is not None:
            done, fresh = recorded
            if not fresh:
                log.info("%s was recorded COMMITTED by a racing committer of the same attempt", name)
                committer._finish(manifest)
                summary = committer._summary(done, already=True, started=started)
                # What this call did to the table, still: the racer that found our commit in the
                # table may record COMMITTED before we do.
                summary.published, summary.already_published = result.published, result.already
                return summary
            crashpoint("commit.after_committed")
            committer._finish(manifest)
            summary = committer._summary(done, already=False, started=started)
            summary.published, summary.already_published = result.published, result.already
            summary.partitions_replaced = result.partitions_replaced
            log.info(
                "committed %s (table-fenced): %d published, %d already there",
                name,
                result.published,
                result.already,
            )
            return summary
        why = "the row moved on while attempt " + manifest.attempt_id + " was published"
    else:
        why = (
            f"attempt {manifest.attempt_id} of the committer table was not published: first publication wins"
        )
    return _reconcile(committer, record, manifest, actor=actor, token=token, why=why, started=started)


def _reconcile(
    committer: Any,
    record: CheckpointRecord,
    manifest: Manifest,
    *,
    actor: Actor,
    token: int,
    why: str,
    started: float,
) -> Any:
    """The table is the source of truth: ask it what it holds now and record that."""
    held = committer.publisher.published_attempt(manifest)
    if held is None:
        raise FencedError(
            f"checkpoint {record.pipeline}/{record.checkpoint_key}: the table holds no attempt of it after "
            f"this committer's publish ({why}); something outside walsink changed the table; nothing recorded"
        )
    fields = _held_fields(committer, record, manifest, held)
    try:
        done = reconcile(
            committer.store,
            record,
            held,
            held_fields=fields,
            token=token,
            actor=actor,
            why=why,
            append=committer.mode == "append",
        )
    except OffsetsError as exc:
        refused = OffsetsError(_refusal(record, manifest, held, fields, str(exc)))
        record_refusal(committer.store, record.pipeline, record.checkpoint_key, refused, actor)
        log.error("%s", refused)
        raise refused from None
    if done.sealed_attempt_id == held and held == manifest.attempt_id:
        committer._finish(manifest)
    elif held != manifest.attempt_id:
        _drop_unpublished(committer, manifest)
    log.warning(
        "checkpoint %s/%s reconciled from the table: COMMITTED as attempt %s (%s)",
        record.pipeline,
        record.checkpoint_key,
        done.sealed_attempt_id,
        why,
    )
    return committer._summary(done, already=True, started=started)


def _held_fields(committer: Any, record: CheckpointRecord, manifest: Manifest, held: str) -> dict[str, Any]:
    """What the committer table records about the attempt the table holds.

    Its source offsets come from its manifest (ours, or its staging if still
    there), else from the table's marker; where neither says,
    ``start_offsets`` is :data:`~.lifecycle.UNKNOWN_OFFSETS` (never the
    offsets of another attempt: the row may carry a re-run's).
    """
    if held == manifest.attempt_id:
        return dict(
            sealed_attempt=record.sealed_attempt,
            manifest_digest=record.manifest_digest,
            manifest_uri=record.manifest_uri,
            committables=record.committables,
            rows=record.rows,
            bytes=record.bytes,
            sealed_at=record.sealed_at,
            durable_at=record.durable_at,
            start_offsets=_dump(manifest.start_offsets),
            end_offsets=_dump(manifest.end_offsets),
        )
    fields: dict[str, Any] = dict(
        sealed_attempt=None,
        manifest_digest=None,
        manifest_uri=None,
        committables=None,
        rows=None,
        bytes=None,
        start_offsets=UNKNOWN_OFFSETS,
        end_offsets=None,
    )
    published_offsets = getattr(committer.publisher, "published_offsets", None)
    offsets = published_offsets(manifest, held) if callable(published_offsets) else None
    if offsets is not None:
        fields.update(start_offsets=_dump(offsets[0]), end_offsets=_dump(offsets[1]))
    staged = staged_attempts(committer.layout, record.pipeline, record.checkpoint_key)
    for number, attempt_id, where in staged:
        if attempt_id != held:
            continue
        fields["sealed_attempt"] = number
        try:
            other = _read_attempt_manifest(committer.layout, where)
        except (WalsinkError, OSError):
            break  # finish() removed it once the attempt was committed: counts unknown
        fields.update(committables=other.expected_count, rows=other.total_rows, bytes=other.total_bytes)
        fields.update(start_offsets=_dump(other.start_offsets), end_offsets=_dump(other.end_offsets))
        break
    return fields


def staged_attempts(
    staging: StagingLayout | StagingStore, pipeline: str, checkpoint_key: str
) -> list[tuple[int, str | None, Path | AttemptLocation]]:
    """The checkpoint's staged attempts as ``(number, attempt id, where)``, on any staging root.

    ``where`` is the attempt's directory on a local root (a :class:`StagingLayout`, or a
    local :class:`StagingStore`: :meth:`StagingLayout.staged_attempts`) and its
    :class:`AttemptLocation` on an object store (one listing,
    :func:`~..protocol.cleanup.store_attempts`: only names walsink gives attempts).
    A root that cannot be listed gives ``[]``: callers decide from the row alone then.
    """
    from airflow_provider_walsink.core.commit.commit import local_layout

    layout = local_layout(staging)
    try:
        if layout is not None:
            return list(layout.staged_attempts(pipeline, checkpoint_key))
        assert isinstance(staging, StagingStore)
        return [
            (loc.attempt, loc.attempt_id, loc) for loc in store_attempts(staging, pipeline, checkpoint_key)
        ]
    except (WalsinkError, OSError):
        return []


def _read_attempt_manifest(staging: StagingLayout | StagingStore, where: Path | AttemptLocation) -> Manifest:
    """The manifest of one staged attempt as :func:`staged_attempts` located it (no digest to check)."""
    if isinstance(where, AttemptLocation):
        assert isinstance(staging, StagingStore)
        return staging.read_manifest(where)
    return read_manifest(where / MANIFEST_NAME)


def _refusal(
    record: CheckpointRecord, manifest: Manifest, held: str, fields: dict[str, Any], why: str
) -> str:
    """Why the attempt the table holds cannot be recorded COMMITTED here, and the way out."""
    start, end = fields["start_offsets"], fields["end_offsets"]
    held_range = "unknown offsets" if start is UNKNOWN_OFFSETS else f"offsets {start} to {end}"
    return (
        f"checkpoint {record.pipeline}/{record.checkpoint_key} is not recorded COMMITTED: the table holds "
        f"attempt {held} of it, published from {held_range} (by an earlier run the committer table "
        f"does not record, e.g. before retention removed its rows), while attempt {manifest.attempt_id} "
        f"read offsets {_dump(manifest.start_offsets)} to {_dump(manifest.end_offsets)}, which the table "
        "will not take (the first publication of a checkpoint wins). Recording either would skip or repeat "
        f"source rows: {why}. Abort this checkpoint (`walsink abort {record.pipeline} "
        f"{record.checkpoint_key} --reason ...`): the next checkpoint then reads on from the last "
        "committed offsets, and the rows the table holds stay once"
    )


def _drop_unpublished(committer: Any, manifest: Manifest) -> None:
    """Our attempt lost to the one the table holds: remove its staging if the table never held it."""
    holds = getattr(committer.publisher, "holds_attempt", None)
    try:
        if callable(holds) and not holds(manifest):
            staging = committer.layout
            if isinstance(staging, StagingStore):
                staging.remove_attempt(
                    staging.attempt(
                        manifest.pipeline, manifest.checkpoint_key, manifest.attempt, manifest.attempt_id
                    )
                )
            else:
                staging.remove_attempt(
                    manifest.pipeline, manifest.checkpoint_key, manifest.attempt, manifest.attempt_id
                )
    except (WalsinkError, OSError) as exc:
        log.warning("leaving the staging of unpublished attempt %s: %s", manifest.attempt_id, exc)


def _record_failure(store: CommitterStore, record: CheckpointRecord, error: str, actor: Actor) -> None:
    """FAILED only while the row is still the attempt this committer read (never an ABORTED row)."""
    try:
        current = store.require(record.pipeline, record.checkpoint_key)
        if current.state is S.ABORTED or current.attempt != record.attempt:
            return
        store.fail(record.pipeline, record.checkpoint_key, error=error, actor=actor, attempt=record.attempt)
    except Exception as exc:  # noqa: BLE001 - keep the original error
        log.warning("could not record the failure of %s/%s: %s", record.pipeline, record.checkpoint_key, exc)


def _audited(store: CommitterStore, record: CheckpointRecord) -> bool:
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


def _check_order(store: CommitterStore, pipeline: str, checkpoint_key: str) -> None:
    with store.engine.connect() as conn:
        row = (
            conn.execute(
                select(ckpt).where(ckpt.c.pipeline == pipeline, ckpt.c.checkpoint_key == checkpoint_key)
            )
            .mappings()
            .first()
        )
        store._check_append_order(conn, row)


def record_refusal(store: CommitterStore, pipeline: str, key: str, exc: Exception, actor: Actor) -> None:
    from airflow_provider_walsink.core.commit.commit import record_refusal as record

    record(store, pipeline, key, exc, actor)


def _describe(exc: BaseException) -> str:
    from airflow_provider_walsink.core.commit.commit import _describe as describe

    return describe(exc)


# --------------------------------------------------------------------------- abort


def tombstone_for_abort(
    publisher: Any,
    layout: StagingLayout | StagingStore,
    record: CheckpointRecord,
    manifest: Manifest | None,
    *,
    accepted: str | None = None,
) -> str | None:
    """Make the table refuse every attempt of the checkpoint a committer could still publish.

    Called by the abort (:mod:`.abort`) after it fenced the lease holder out, for
    targets that can carry a tombstone (``capabilities.table_fence``), in both
    fencing modes: with table fencing there is no lease, and with a lease it
    closes the window between a committer's last fence check and its table
    commit. The attempts: the row's current and sealed attempts and every
    attempt staged under the checkpoint, except the committed version a
    reprocess supersedes (the table holds it: not ours to abort) and attempts
    the table holds or held (the publisher leaves those out).

    Returns the id of the attempt the table holds if it holds *any* attempt of
    the checkpoint but the committed version a reprocess supersedes (the
    checkpoint is published: the abort must refuse; not only the sealed
    attempt: a write retry after a commit that died past its table commit
    seals a new attempt while the table holds the earlier one), else ``None``
    once the tombstone is in the table (or nothing needed one). The check is
    made on the table state the tombstone's own commit is based on. ``accepted``: an attempt the
    table may hold (an earlier life's commit the abort found accounted for), treated as a
    reprocess's superseded version is: left in the table, not tombstoned, not a refusal; any other
    attempt held is. Raises the target's error when it
    cannot carry the tombstone (e.g. the table does not exist and may not be
    created): the abort must then refuse too.
    """
    from airflow_provider_walsink.core.targets._tables import CheckpointRef

    ids: set[str] = {a for a in (record.attempt_id, record.sealed_attempt_id) if a}
    for _number, attempt_id, where in staged_attempts(layout, record.pipeline, record.checkpoint_key):
        if attempt_id is None:
            try:
                attempt_id = _read_attempt_manifest(layout, where).attempt_id
            except (WalsinkError, OSError):
                continue  # never sealed (no manifest): nothing a committer could publish
        ids.add(attempt_id)
    superseded = accepted or record.supersedes_attempt_id
    ids.discard(superseded or "")
    if not ids:
        return None
    create_from = None
    if manifest is not None:
        from airflow_provider_walsink.core.commit.commit import local_layout

        local = local_layout(layout)
        if local is not None:
            attempt_dir = local.attempt_dir(
                record.pipeline, record.checkpoint_key, manifest.attempt, manifest.attempt_id
            )
            create_from = (manifest, str(attempt_dir))
        else:
            # On an object store the table is created from the staged objects, read through the
            # store that holds them (its credentials), as a publish reads them.
            location = layout.attempt(
                record.pipeline, record.checkpoint_key, manifest.attempt, manifest.attempt_id
            )
            create_from = (manifest, StagedAttempt(layout, location))
    ref = CheckpointRef(record.pipeline, record.checkpoint_key, record.sealed_attempt_id or "")
    return publisher.tombstone(ref, frozenset(ids), superseded=superseded, create_from=create_from)
