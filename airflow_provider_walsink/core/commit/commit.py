"""Committing one checkpoint: the commit sequence, on one class (:class:`CheckpointCommitter`).

This is walsink's exactly-once step. Flink's GenericWriteAheadSink publishes
(``sendValues``) and then records the commit (``commitCheckpoint``) as two
steps, so a crash between them replays the data. Here the publish is
idempotent on the target side, so the crash window is harmless: a re-run
(after the lease expires, by anyone) recognises what is already published and
finishes the rest, and only then records COMMITTED.

The pieces the sequence uses each live in one module: reading the sealed
attempt (:mod:`.sealed`), refusals and failures (:mod:`.refusals`), the
fencing strategies (:mod:`.fencing`: :mod:`.lease`, :mod:`.tablefence`), group
commit (:mod:`.group`), clean-up after COMMITTED (:mod:`.aftercommit`) and the
summary (:mod:`.summary`).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import threading
import time
from collections.abc import Iterator
from datetime import timedelta

from airflow_provider_walsink.core.commit import aftercommit
from airflow_provider_walsink.core.commit.checksums import read_verified_attempt
from airflow_provider_walsink.core.commit.fencing import Fencing, Hold, require_table_fence, validate_fencing
from airflow_provider_walsink.core.commit.group import (
    GROUPS_PER_LEAD,
    can_lead_group,
    claim_lead,
    commit_as_leader,
    next_group,
)
from airflow_provider_walsink.core.commit.lease import LeaseFencing
from airflow_provider_walsink.core.commit.sealed import publish_argument
from airflow_provider_walsink.core.commit.summary import CommitSummary, summarize, with_result
from airflow_provider_walsink.core.commit.tablefence import TableFencing
from airflow_provider_walsink.core.faults import crashpoint
from airflow_provider_walsink.core.protocol.manifest import Manifest
from airflow_provider_walsink.core.staging.resolve import Staging, as_store
from airflow_provider_walsink.core.store.records import Actor, CheckpointRecord
from airflow_provider_walsink.core.store.store import CommitterStore
from airflow_provider_walsink.core.targets.base import Publisher

log = logging.getLogger(__name__)

__all__ = ["CheckpointCommitter", "CommitSummary"]

_paused = 0
_paused_lock = threading.Lock()
_resume = False


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while one checkpoint is published.

    Why: a publish holds a few objects per committable until it returns, and
    none of them is in a reference cycle. Every ``heap / 4`` such objects,
    CPython 3.11 scans the whole heap for cycles and finds none of these: at
    10,000 committables that was one full collection in about every other
    commit, 45 ms each, a tenth of the commit (bench/README.md, benchmark 2).
    Reference counting still frees everything as usual; cycles made
    meanwhile are collected once the last pause ends. Nested and concurrent
    pauses are counted, and a collector that was already off stays off.
    """
    global _paused, _resume
    with _paused_lock:
        if _paused == 0:
            _resume = gc.isenabled()
            gc.disable()
        _paused += 1
    try:
        yield
    finally:
        with _paused_lock:
            _paused -= 1
            if _paused == 0 and _resume:
                gc.enable()


class CheckpointCommitter:
    """Commits checkpoints of one pipeline into one target with one publisher.

    :meth:`commit` runs the commit sequence. The steps marked *fencing* are
    the strategy's (:class:`~.fencing.Fencing`, chosen once here from
    ``fencing`` and the target's capabilities): ``"lease"``
    (:class:`~.lease.LeaseFencing`, the default) or ``"table"``
    (:class:`~.tablefence.TableFencing`: targets whose capabilities allow it,
    Iceberg and Delta; no lease, the table's atomic commit is the fence).

    1. *Check* (fencing): the row must be committable. A COMMITTED row ends
       the sequence here: the clean-up a killed committer never did is done,
       and the summary says ``already_committed``. Raises ``NotDurableError``
       (says what is missing), ``AuditRejectedError`` (REJECTED by its audit:
       never committed), ``NotAuditedError`` (``require_audit`` and the
       attempt was not audited), ``OrderingError`` (an earlier ``append``
       checkpoint is open), ``OffsetsError`` (its source offsets can never
       commit as they stand: recorded as its error). Changes nothing else.
    2. *Take the lease / fence* (fencing): lease fencing takes the lease by
       compare-and-set, bumping the fencing token (one statement that also
       checks step 1); ``LeaseHeldError``: another committer is publishing,
       retry later. Table fencing takes nothing (``LeaseHeldError`` if a
       lease committer is at it). With ``group_commit`` and lease fencing,
       the pipeline's group-commit lead is claimed first
       (``GroupCommitInFlightError``, a ``LeaseHeldError``: another task
       leads and takes this checkpoint into its group; wait with
       :func:`~.group.commit_waiting_for_group`), and steps 3-6 run for a
       group (:mod:`.group`).
    3. *Read the sealed attempt* (:func:`~.sealed.read_sealed_attempt`):
       ``ManifestError`` / ``LayoutError`` (bad input: recorded on the
       checkpoint). With ``verify_checksums``, every staged committable's
       checksum is recomputed and compared with the sealed manifest's
       (:mod:`.checksums`, the same for every target and staging store):
       ``ChecksumMismatchError`` (bad input: recorded, nothing published).
       Reads only.
    4. *Publish* under the strategy's publisher context; idempotent on the
       target, by the attempt id. The publisher's error is recorded on the
       checkpoint (FAILED, lease released) and raised; ``FencedError``: the
       fence was lost, this process stopped before its next change and the new
       holder finishes. With table fencing, a table that holds another
       attempt of the version is the source of truth (reconciled in step 5).
    5. *Record COMMITTED* (fencing): a compare-and-set on the token (lease)
       or on the sealed attempt (table); ``FencedError`` as in step 4.
    6. *After commit*: the publisher drops its journal and the staged
       attempts, fenced by the COMMITTED row; best effort, never raises.

    Repeating a commit is always safe: every step is idempotent or a
    compare-and-set, and after COMMITTED it is a no-op that says so.

    ``layout`` is where staged attempts are read: a local :class:`StagingLayout`,
    or a :class:`StagingStore` (any root, object stores included) that the
    caller opened, with its credentials, for the checkpoint's recorded staging
    root. The publisher receives the attempt as one :class:`StagedAttempt`
    (store + location; :func:`~.sealed.publish_argument`), the table targets
    publishing an object-store attempt by reference.
    """

    def __init__(
        self,
        store: CommitterStore,
        layout: Staging,
        publisher: Publisher,
        *,
        mode: str,
        owner: str | None = None,
        lease_ttl: timedelta = timedelta(minutes=10),
        require_audit: bool = False,
        fencing: str = "lease",
        group_commit: int = 0,
        verify_checksums: bool = False,
    ) -> None:
        #: ``"lease"`` (default) or ``"table"``: the target's atomic commit is the only
        #: fence and the committer table gets one transaction per commit (:mod:`.tablefence`).
        self.fencing = validate_fencing(fencing)
        if self.fencing == "table":
            require_table_fence(publisher)
        self.store = store
        #: Where staged attempts are read, as a store (a local layout is made one here).
        self.staging = as_store(layout)
        self.publisher = publisher
        self.mode = mode
        self.owner = owner
        self.lease_ttl = lease_ttl
        #: The pipeline declares an audit: only an AUDITED sealed attempt is published.
        self.require_audit = require_audit
        #: Up to this many other durable checkpoints of the pipeline are published in the same
        #: table transaction (:mod:`.group`); 0: every commit alone (the default).
        self.group_commit = group_commit
        #: Step 3 recomputes every staged committable's checksum before anything is published
        #: (:mod:`.checksums`), whatever the target and the staging store.
        self.verify_checksums = verify_checksums
        #: The fencing steps of the sequence, chosen once.
        self.fencing_strategy: Fencing = (
            TableFencing(self) if self.fencing == TableFencing.name else LeaseFencing(self)
        )

    def commit(self, pipeline: str, checkpoint_key: str, *, actor: Actor) -> CommitSummary:
        """Run the commit sequence for one checkpoint (class docstring)."""
        started = time.monotonic()
        lead = claim_lead(self, pipeline, checkpoint_key, actor) if self.fencing_strategy.groups else None
        try:
            summary = self._commit(pipeline, checkpoint_key, actor=actor, started=started)
            if lead is not None and summary.group:
                self._lead_more_groups(pipeline, lead, actor=actor)
            return summary
        finally:
            if lead is not None:
                self.store.release_group_lead(pipeline, lead)

    def _lead_more_groups(self, pipeline: str, lead: str, *, actor: Actor) -> None:
        """Go on publishing the durable checkpoints left to this leader, a group at a time
        (:func:`~.group.next_group`); each one's error is recorded on it, never raised here."""
        for _ in range(GROUPS_PER_LEAD):  # then the lead is handed on: one task is not the backfill's
            if (hold := next_group(self, pipeline, lead, actor=actor)) is None:
                return
            began = time.monotonic()
            try:
                done = commit_as_leader(
                    self,
                    hold,
                    actor=actor,
                    started=began,
                    alone=lambda hold=hold, began=began: self.publish_alone(hold, actor=actor, started=began),
                )
            except Exception as exc:  # noqa: BLE001 - recorded on that checkpoint; its task answers
                log.warning("stopped leading group commits of %s: %s", pipeline, exc)
                return
            if len(done.group) < 2:
                return  # nothing joined: what is left commits by its own tasks

    def _commit(self, pipeline: str, checkpoint_key: str, *, actor: Actor, started: float) -> CommitSummary:
        taken = self.fencing_strategy.take(pipeline, checkpoint_key, actor=actor)  # steps 1-2
        if isinstance(taken, CheckpointRecord):
            log.info(
                "checkpoint %s/%s is already COMMITTED (at %s); nothing to do",
                pipeline,
                checkpoint_key,
                taken.committed_at,
            )
            self.finish_cleanup(taken)
            return summarize(taken, already=True, started=started)
        if self.fencing_strategy.groups and can_lead_group(self, taken.record):
            return commit_as_leader(
                self,
                taken,
                actor=actor,
                started=started,
                alone=lambda: self.publish_alone(taken, actor=actor, started=started),
            )
        return self.publish_alone(taken, actor=actor, started=started)

    def publish_alone(self, hold: Hold, *, actor: Actor, started: float) -> CommitSummary:
        """Steps 3-6 for the one checkpoint ``hold`` holds."""
        with collector_paused():
            return self._publish_alone(hold, actor=actor, started=started)

    def _publish_alone(self, hold: Hold, *, actor: Actor, started: float) -> CommitSummary:
        fencing, record = self.fencing_strategy, hold.record
        try:
            manifest, attempt = read_verified_attempt(
                self.staging, record, verify_checksums=self.verify_checksums, publisher=self.publisher
            )  # 3
        except Exception as exc:
            fencing.failed(hold, "read", exc, actor=actor)
            raise
        hold.ctx.attempt_id = manifest.attempt_id
        held, result = manifest.attempt_id, None
        try:
            result = self.publisher.publish(
                manifest, publish_argument(self.publisher, attempt), hold.ctx
            )  # 4
        except Exception as exc:
            held = fencing.held_instead(hold, exc)
            if held is None:
                fencing.failed(hold, "publish", exc, actor=actor)
                raise
        try:
            crashpoint("commit.after_publish")
            recorded = (
                fencing.record_committed(hold, manifest, result, actor=actor)  # 5
                if result is not None and held == manifest.attempt_id
                else None
            )
        except Exception as exc:
            fencing.failed(hold, "record", exc, actor=actor)
            raise
        if recorded is None:
            return fencing.reconcile(hold, manifest, held=held, actor=actor, started=started)
        assert result is not None
        done, fresh = recorded
        if not fresh:
            log.info(
                "checkpoint %s/%s was recorded COMMITTED by a racing committer of the same attempt",
                record.pipeline,
                record.checkpoint_key,
            )
            self.finish(manifest)
            summary = summarize(done, already=True, started=started)
            # What this call did to the table, still: the racer that found our commit in the
            # table may record COMMITTED before we do.
            summary.published, summary.already_published = result.published, result.already
            return summary
        crashpoint("commit.after_committed")
        # The commit is recorded: the WAL (every staged attempt) is garbage now.  # 6
        self.finish(manifest)
        summary = with_result(summarize(done, already=False, started=started), result)
        summary.lease_taken_over_from = hold.taken_over_from
        log.info(
            "committed %s/%s (%s fencing): %d published, %d already there, %s rows",
            record.pipeline,
            record.checkpoint_key,
            fencing.name,
            result.published,
            result.already,
            done.rows,
        )
        return summary

    def finish(self, manifest: Manifest) -> None:
        """Step 6: drop the journal and the staged attempts (:func:`~.aftercommit.finish`)."""
        aftercommit.finish(self.store, self.staging, self.publisher, manifest)

    def finish_cleanup(self, record: CheckpointRecord) -> None:
        """Step 6 for a row found COMMITTED (:func:`~.aftercommit.finish_cleanup`)."""
        aftercommit.finish_cleanup(self.store, self.staging, self.publisher, record)
