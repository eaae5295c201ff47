"""Table fencing: one committer-table transaction per commit, when the table's commit is the fence.

``CheckpointCommitter(..., fencing="table")`` (the commit operator's and
``walsink_pipeline``'s ``fencing="table"``): the :class:`TableFencing` strategy
of the commit sequence (:mod:`.fencing`). The default, ``"lease"``
(:mod:`.lease`), is a lease transaction, the publish under fence checks, a
COMMITTED transaction. This mode drops the lease. Per checkpoint:

1. **Read** the checkpoint's row (no lock, no write). It must be committable:
   DURABLE, AUDITED (AUDITED only, with ``require_audit``) or FAILED after it
   was durable, with a sealed attempt X; otherwise the usual explanation
   (:func:`.refusals.explain_not_committable`). A COMMITTING row is a lease-mode
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
   history row, and for a reprocess the superseded version retired
   (:mod:`.tablerecord` holds these transactions).
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
* *Abort* (:mod:`.abort`, :mod:`.tombstone`): there is no lease to fence out, so the abort makes
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
:func:`.fencing.require_table_fence` refuses them.

Mixing modes on one checkpoint is safe (never twice) but not useful: a lease
committer over a table-fenced publication may replace it (overwrite) or be
refused (append); choose the mode per pipeline.
"""

from __future__ import annotations

import logging
from typing import Any

from airflow_provider_walsink.core.commit.fencing import Fencing, Hold, Step
from airflow_provider_walsink.core.commit.refusals import (
    BAD_INPUT,
    describe_error,
    explain_not_committable,
    record_refusal,
)
from airflow_provider_walsink.core.commit.sealed import staged_attempts
from airflow_provider_walsink.core.commit.summary import CommitSummary, publication, summarize
from airflow_provider_walsink.core.commit.tablerecord import (
    check_append_order,
    committable,
    is_audited,
    read_checkpoint,
    reconcile,
    record_committed,
    table_token,
)
from airflow_provider_walsink.core.faults import crashpoint
from airflow_provider_walsink.core.protocol.errors import FencedError, NotDurableError, WalsinkError
from airflow_provider_walsink.core.protocol.manifest import Manifest
from airflow_provider_walsink.core.protocol.states import CheckpointState
from airflow_provider_walsink.core.store.errors import (
    AuditRejectedError,
    LeaseHeldError,
    NotAuditedError,
    OffsetsError,
)
from airflow_provider_walsink.core.store.lifecycle import UNKNOWN_OFFSETS
from airflow_provider_walsink.core.store.records import Actor, CheckpointRecord
from airflow_provider_walsink.core.store.store import CommitterStore
from airflow_provider_walsink.core.store.transitions import _dump
from airflow_provider_walsink.core.targets._tables import AbortedInTableError, HeldByAnotherAttemptError
from airflow_provider_walsink.core.targets.base import PublishResult

log = logging.getLogger(__name__)
S = CheckpointState

__all__ = ["TableFenceContext", "TableFencing"]


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


class TableFencing(Fencing):
    """``fencing="table"``: check the row, publish, one transaction records COMMITTED (module docstring)."""

    name = "table"

    def take(self, pipeline: str, checkpoint_key: str, *, actor: Actor) -> Hold | CheckpointRecord:
        c = self.committer
        store: CommitterStore = c.store
        record = read_checkpoint(store, pipeline, checkpoint_key)
        name = f"checkpoint {pipeline}/{checkpoint_key}"
        if record.is_committed:
            return record
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
        if c.require_audit and record.state is not S.AUDITED and not is_audited(store, record):
            raise NotAuditedError(
                f"{name} is {record.state} but its sealed attempt {record.sealed_attempt_id} has not passed the "
                "pipeline's audit; run the audit task first"
            )
        if c.mode == "append":
            try:
                check_append_order(store, pipeline, checkpoint_key)
            except OffsetsError as exc:
                record_refusal(store, pipeline, checkpoint_key, exc, actor)
                raise
        ctx = TableFenceContext(
            pipeline,
            checkpoint_key,
            attempt_id=record.sealed_attempt_id or "",
            epoch=table_token(record),
            supersedes=record.supersedes_attempt_id,
        )
        return Hold(record, ctx)

    def held_instead(self, hold: Hold, exc: Exception) -> str | None:
        if isinstance(exc, HeldByAnotherAttemptError):
            log.warning("checkpoint %s/%s: %s", hold.record.pipeline, hold.record.checkpoint_key, exc)
            return exc.held
        return None

    def record_committed(
        self, hold: Hold, manifest: Manifest, result: PublishResult, *, actor: Actor
    ) -> tuple[CheckpointRecord, bool] | None:
        c = self.committer
        return record_committed(
            c.store,
            hold.record,
            token=hold.ctx.epoch,
            actor=actor,
            end_offsets=manifest.end_offsets,
            publication=publication(c.publisher, result),
            detail=f"table-fenced: published {result.published}, already there {result.already}",
        )

    def failed(self, hold: Hold, step: Step, exc: Exception, *, actor: Actor) -> None:
        record, name = hold.record, f"checkpoint {hold.record.pipeline}/{hold.record.checkpoint_key}"
        if step == "read":
            # Bad input is the checkpoint's; an unreachable store is not (the next try reads it again).
            if isinstance(exc, BAD_INPUT):
                record_table_failure(self.committer.store, record, str(exc), actor)
        elif step == "publish":
            if isinstance(exc, (AbortedInTableError, FencedError)):
                # An abort tombstoned this attempt in the table (or the fence said stop): change
                # nothing, anywhere.
                log.error("stopped committing %s: %s", name, exc)
                return
            log.error("%s cannot be committed: %s", name, exc)
            record_table_failure(self.committer.store, record, describe_error(exc), actor)
        # "record": the table holds the attempt; what the row says is reconciled by the next try.

    def reconcile(
        self, hold: Hold, manifest: Manifest, *, held: str, actor: Actor, started: float
    ) -> CommitSummary:
        """The table is the source of truth: ask it what it holds now and record that."""
        c, record, token = self.committer, hold.record, hold.ctx.epoch
        if held == manifest.attempt_id:
            why = "the row moved on while attempt " + manifest.attempt_id + " was published"
        else:
            why = f"attempt {manifest.attempt_id} of the committer table was not published: first publication wins"
        held_now = c.publisher.published_attempt(manifest)
        if held_now is None:
            raise FencedError(
                f"checkpoint {record.pipeline}/{record.checkpoint_key}: the table holds no attempt of it after "
                f"this committer's publish ({why}); something outside walsink changed the table; nothing recorded"
            )
        held = held_now
        fields = _held_fields(c, record, manifest, held)
        try:
            done = reconcile(
                c.store,
                record,
                held,
                held_fields=fields,
                token=token,
                actor=actor,
                why=why,
                append=c.mode == "append",
            )
        except OffsetsError as exc:
            refused = OffsetsError(_refusal(record, manifest, held, fields, str(exc)))
            record_refusal(c.store, record.pipeline, record.checkpoint_key, refused, actor)
            log.error("%s", refused)
            raise refused from None
        if done.sealed_attempt_id == held and held == manifest.attempt_id:
            c.finish(manifest)
        elif held != manifest.attempt_id:
            _drop_unpublished(c, manifest)
        log.warning(
            "checkpoint %s/%s reconciled from the table: COMMITTED as attempt %s (%s)",
            record.pipeline,
            record.checkpoint_key,
            done.sealed_attempt_id,
            why,
        )
        return summarize(done, already=True, started=started)


def _held_fields(committer: Any, record: CheckpointRecord, manifest: Manifest, held: str) -> dict[str, Any]:
    """What the committer table records about the attempt the table holds.

    Its source offsets come from its manifest (ours, or its staging if still
    there), else from the table's marker; where neither says,
    ``start_offsets`` is :data:`~.lifecycle.UNKNOWN_OFFSETS` (never the
    offsets of another attempt: the row may carry a re-run's).
    """
    sealed = ("sealed_attempt", "manifest_digest", "manifest_uri", "committables", "rows", "bytes")
    if held == manifest.attempt_id:
        return {
            **{name: getattr(record, name) for name in (*sealed, "sealed_at", "durable_at")},
            "start_offsets": _dump(manifest.start_offsets),
            "end_offsets": _dump(manifest.end_offsets),
        }
    fields: dict[str, Any] = {**dict.fromkeys(sealed), "start_offsets": UNKNOWN_OFFSETS, "end_offsets": None}
    published_offsets = committer.publisher.published_offsets
    offsets = published_offsets(manifest, held) if callable(published_offsets) else None
    if offsets is not None:
        fields.update(start_offsets=_dump(offsets[0]), end_offsets=_dump(offsets[1]))
    staged = staged_attempts(committer.staging, record.pipeline, record.checkpoint_key)
    for number, attempt_id, where in staged:
        if attempt_id != held:
            continue
        fields["sealed_attempt"] = number
        try:
            other = committer.staging.read_manifest(where)
        except (WalsinkError, OSError):
            break  # finish() removed it once the attempt was committed: counts unknown
        fields.update(committables=other.expected_count, rows=other.total_rows, bytes=other.total_bytes)
        fields.update(start_offsets=_dump(other.start_offsets), end_offsets=_dump(other.end_offsets))
        break
    return fields


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
    holds = committer.publisher.holds_attempt
    try:
        if callable(holds) and not holds(manifest):
            staging = committer.staging
            staging.remove_attempt(
                staging.attempt(
                    manifest.pipeline, manifest.checkpoint_key, manifest.attempt, manifest.attempt_id
                )
            )
    except (WalsinkError, OSError) as exc:
        log.warning("leaving the staging of unpublished attempt %s: %s", manifest.attempt_id, exc)


def record_table_failure(store: CommitterStore, record: CheckpointRecord, error: str, actor: Actor) -> None:
    """FAILED only while the row is still the attempt this committer read (never an ABORTED row)."""
    try:
        current = store.require(record.pipeline, record.checkpoint_key)
        if current.state is S.ABORTED or current.attempt != record.attempt:
            return
        store.fail(record.pipeline, record.checkpoint_key, error=error, actor=actor, attempt=record.attempt)
    except Exception as exc:  # noqa: BLE001 - keep the original error
        log.warning("could not record the failure of %s/%s: %s", record.pipeline, record.checkpoint_key, exc)
