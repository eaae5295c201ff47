"""Aborting a checkpoint: fence its lease holder out, never over published data, then clean up.

``walsink abort`` and the UI's Abort button end a stuck or unwanted checkpoint
through :class:`CheckpointAborter`. The steps, in this order (each is safe to
repeat, and running the abort again finishes one that crashed):

1. **Fence.** :meth:`~.store.CommitterStore.begin_abort` bumps the fencing
   token in one transaction; a COMMITTING checkpoint's lease passes to the
   abort. The committer that held it (alive, stalled or SIGSTOPped) is refused
   at its next check, and no commit try can take the checkpoint meanwhile.
2. **Wait out the holder's trust.** A committer trusts a confirmed lease for
   at most :attr:`~.lease.FencingContext.MAX_TRUST` without asking the
   database again; the abort waits that long (plus a margin) when a committer
   held the lease *as the fencing transaction saw it* (the row read before
   the abort began is never trusted for this or any later decision: a
   committer may take the lease in between). From then on the holder changes
   nothing more: its next step asks, and is refused. (As for any fenced committer on a plain file
   system, a process paused exactly between its check and a rename can still
   do that one rename: docs/guarantees.md.)
3. **Never lie.** If the target holds *any* attempt of this checkpoint
   version (its marker, :meth:`~..publishers.base.Publisher.published_attempt`;
   not only the sealed attempt: a write retry after a commit that died past
   its publish seals a new attempt while the target holds the earlier one;
   the committed version a reprocess supersedes excepted), the checkpoint is
   published: the abort is refused with :class:`AbortRefusedError` naming
   that attempt, its lease is given back (the checkpoint stays as it was,
   COMMITTING without a holder) and the message says to re-run the commit
   task, which finds the attempt published and records COMMITTED. A
   checkpoint is never ABORTED while the target shows its data as committed.
   For a target that can carry a tombstone (``capabilities.table_fence``:
   Iceberg, Delta), the check is the table's own atomic commit: the abort
   commits a tombstone naming every attempt of the checkpoint a committer
   could still publish (:func:`.tombstone.tombstone_for_abort`), checked
   against the marker in the state it commits over (any attempt held
   refuses), and every publish checks the tombstone the same way. Either the publish lands first (the abort is
   refused: published) or the tombstone does (the publish is refused). This is
   what makes an abort hold under ``fencing="table"``, where there is no lease
   to fence out; under the lease it also closes the window between a
   committer's last fence check and its table commit. If the tombstone cannot
   be written (the table does not exist and may not be created), the abort is
   refused.
4. **ABORTED**, with who and why: a compare-and-set on the abort's token
   (:class:`~.errors.LeaseLostError` if a committer took the checkpoint since).
5. **Clean up** (after ABORTED, so no commit can start on the attempt any
   more): what the aborted attempt had published is rolled back where the
   target can (files: its journal's files in ``append``; the partitions it
   swapped in, in ``overwrite``; only what the attempt itself put there,
   identified by its attempt id: never a partition holding another
   checkpoint's data), and its staging is removed through the one fenced
   clean-up (:mod:`~..protocol.cleanup`): the attempts up to the aborted one,
   each after checking the abort's token and, for a table target, asking the
   table *then* whether it holds or held the attempt (a snapshot references
   its staged files in place).

A later run of the write task starts a fresh attempt (ABORTED -> WRITING);
its publish rolls back, from the journal, anything of the aborted attempt an
interrupted abort left in a files target.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any

from airflow_provider_walsink.core.commit.lease import FencingContext
from airflow_provider_walsink.core.commit.tombstone import tombstone_for_abort
from airflow_provider_walsink.core.protocol.errors import WalsinkError
from airflow_provider_walsink.core.protocol.manifest import MANIFEST_NAME, Manifest
from airflow_provider_walsink.core.protocol.states import CheckpointState
from airflow_provider_walsink.core.staging.cleanup import remove_staged_attempts, staged_locations
from airflow_provider_walsink.core.staging.layout import StagingLayout
from airflow_provider_walsink.core.staging.object_store import AttemptLocation, StagingStore
from airflow_provider_walsink.core.staging.resolve import as_store
from airflow_provider_walsink.core.store.errors import LeaseLostError, StoreError
from airflow_provider_walsink.core.store.records import Actor, CheckpointRecord
from airflow_provider_walsink.core.store.store import CommitterStore
from airflow_provider_walsink.core.targets.base import Publisher

log = logging.getLogger(__name__)
S = CheckpointState

#: Added to the holder's longest trust before the abort treats it as stopped (clock rates, scheduling).
TRUST_MARGIN = timedelta(milliseconds=500)
#: How long the abort holds a COMMITTING checkpoint's lease while it checks the target.
ABORT_LEASE_TTL = timedelta(minutes=5)


def _published_before(record: CheckpointRecord) -> bool:
    """The checkpoint may have published part of its sealed attempt (COMMITTING, or FAILED once durable)."""
    return record.state is S.COMMITTING or bool(record.state is S.FAILED and record.durable_at)


class AbortRefusedError(StoreError):
    """The target already holds the checkpoint's sealed attempt: it is published, not abortable."""


@dataclass
class AbortOutcome:
    """What an abort did, for the CLI, the UI and the audit log."""

    pipeline: str
    checkpoint_key: str
    state: str
    attempt: int
    attempt_id: str | None
    reason: str
    #: The previous state, and the committer that held the lease and was fenced out.
    previous_state: str | None = None
    fenced_holder: str | None = None
    already_aborted: bool = False
    files_rolled_back: int = 0
    staging_removed: list[str] = field(default_factory=list)
    #: Cleanup left undone (the abort is recorded; running it again retries the cleanup).
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class _AbortContext:
    """The publisher context of the cleanup: fenced by the abort's own token.

    ``fence()`` raises :class:`LeaseLostError` once the token moved on (a new
    run of the checkpoint reached COMMITTING: its publish rolls back the
    aborted attempt itself).
    """

    def __init__(self, store: CommitterStore, record: CheckpointRecord) -> None:
        self.store = store
        self.pipeline, self.checkpoint_key = record.pipeline, record.checkpoint_key
        self.attempt_id = record.sealed_attempt_id or record.attempt_id or ""
        self.epoch = record.lease_epoch
        self.supersedes = None

    def fence(self) -> None:
        now = self.store.require(self.pipeline, self.checkpoint_key)
        if now.lease_epoch != self.epoch:
            raise LeaseLostError(
                f"abort cleanup of {self.pipeline}/{self.checkpoint_key} stopped: the checkpoint moved on "
                f"({now.state}, epoch {now.lease_epoch}); its new run rolls the aborted attempt back itself"
            )

    def event(self, name: str) -> None:
        from airflow_provider_walsink.core.faults import crashpoint

        crashpoint(name)


class CheckpointAborter:
    """Aborts checkpoints of one pipeline whose target is ``publisher`` (module docstring).

    ``publisher`` may be ``None`` when the target is unknown (a pipeline
    registered without one): the abort then cannot check or roll back the
    target and refuses a checkpoint that has begun publishing (COMMITTING, or
    FAILED after it was durable). ``sleep`` is replaced by tests only.

    ``layout``: where the checkpoints are staged, a local :class:`StagingLayout`
    or a :class:`StagingStore` (an object-store root, opened with its storage
    options, e.g. by :func:`~..protocol.cleanup.open_object_store`). On an
    object store the same steps hold: the sealed manifest is read through the
    store, and the attempts are removed through the same fenced clean-up, by
    :meth:`StagingStore.remove_attempt` only (nothing outside the root).
    """

    def __init__(
        self,
        store: CommitterStore,
        layout: StagingLayout | StagingStore,
        publisher: Publisher | None,
        *,
        grace: timedelta = FencingContext.MAX_TRUST + TRUST_MARGIN,
        lease_ttl: timedelta = ABORT_LEASE_TTL,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        #: Where the checkpoints are staged, as a store (a local layout is made one here).
        self.store, self.staging, self.publisher = store, as_store(layout), publisher
        self.grace, self.lease_ttl, self._sleep = grace, lease_ttl, sleep

    def abort(
        self,
        pipeline: str,
        checkpoint_key: str,
        *,
        reason: str,
        actor: Actor,
        manifest_lost: bool = False,
        attempt_id: str | None = None,
    ) -> AbortOutcome:
        """Abort the checkpoint's current attempt; see the module docstring for the steps.

        Raises :class:`~.errors.CheckpointNotFoundError`, :class:`~.errors.TransitionError`
        (COMMITTED), :class:`AbortRefusedError` (the target holds the attempt, or
        may hold it and the sealed manifest to check it against cannot be read:
        a wrong staging root; nothing changed but the history),
        :class:`~.errors.LeaseLostError` (a committer took the checkpoint during
        the abort; run it again).

        ``manifest_lost``: the sealed manifest is gone for good (its staging was
        deleted); abort without checking whether the target holds the attempt.
        What it published is rolled back only where the target keeps its own
        record of the attempt (a directory target's publish journal).

        ``attempt_id``: abort only while that attempt is the checkpoint's (the
        REJECTED attempt a person decided about); a newer one (the interval
        written again meanwhile) raises :class:`~.errors.StaleAttemptError` and
        nothing is recorded. An ABORTED checkpoint is answered as aborted.
        """
        if not reason or not reason.strip():
            raise StoreError("an abort needs a reason (it is recorded in the checkpoint's history)")
        reason = reason.strip()
        record = self.store.require(pipeline, checkpoint_key)
        if record.state is S.ABORTED:
            outcome = self._outcome(record, reason, already=True)
            self._clean_up(record, outcome, actor=actor)
            return outcome
        if self.publisher is None and _published_before(record):
            raise AbortRefusedError(
                f"checkpoint {pipeline}/{checkpoint_key} is {record.state} and may have published part of "
                f"attempt {record.sealed_attempt}, but its target is not known here (the pipeline was "
                "registered without one), so the abort cannot check or roll it back; nothing changed"
            )
        lease = self.store.begin_abort(
            pipeline, checkpoint_key, actor=actor, reason=reason, ttl=self.lease_ttl, attempt_id=attempt_id
        )
        assert lease.record is not None
        # Every decision from here on is taken from the row as the fencing transaction saw it:
        # a committer may have taken the lease since ``record`` was read (issue 22).
        record = lease.record
        published_before = _published_before(record)
        if self.publisher is None and published_before:
            message = (
                f"checkpoint {pipeline}/{checkpoint_key} began publishing attempt {record.sealed_attempt} "
                "while the abort started, and its target is not known here, so the abort cannot check or "
                "roll it back; nothing changed"
            )
            self._give_back(lease, actor, message)
            raise AbortRefusedError(message)
        if record.state is S.COMMITTING and lease.taken_over_from:
            # Whoever held the lease when the token moved may still act on a confirmation it
            # trusts; after this it asks and is refused.
            self._sleep(self.grace.total_seconds())
        manifest, unreadable = self._sealed_manifest(lease.record)
        table_fence = self.publisher is not None and self.publisher.capabilities.table_fence
        if manifest is None and unreadable and published_before and not table_fence and not manifest_lost:
            # Only the manifest says whether the target holds the whole attempt (refuse) or a
            # part of it (roll back): never guess, a wrong staging root is the usual cause.
            message = (
                f"checkpoint {pipeline}/{checkpoint_key} is {record.state} and may have published "
                f"attempt {record.sealed_attempt}, but its sealed manifest cannot be read under the "
                f"staging root {self._root()} ({unreadable}); without it the abort cannot tell "
                "whether the target holds the attempt. Check the staging root (walsink abort "
                "--staging-root, or the connection's staging_root); if the staging is gone for good, "
                "abort with --manifest-lost. Nothing changed"
            )
            self._give_back(lease, actor, message)
            raise AbortRefusedError(message)
        if table_fence:
            # The table is the fence too (table fencing has no lease to fence out): tombstone.
            def tombstone(accepted: str | None = None) -> str | None:
                try:
                    return tombstone_for_abort(
                        self.publisher, self.staging, lease.record, manifest, accepted=accepted
                    )
                except Exception as exc:
                    message = (
                        f"checkpoint {pipeline}/{checkpoint_key} cannot be aborted: its target could not "
                        f"record the abort's tombstone, which stops any committer still publishing it "
                        f"({exc}); nothing changed"
                    )
                    self._give_back(lease, actor, message)
                    raise AbortRefusedError(message) from exc

            held = tombstone()
            if held is not None and self._accounted_for(lease.record, manifest, held):
                # The table holds a commit of this key from an earlier life of its row (trimmed by
                # retention) whose source range the committed offsets already cover: not this
                # row's to abort, and aborting this row cannot make the next interval re-read it.
                # The tombstone then fences this row's attempts, checked against that one held.
                held = tombstone(accepted=held)
            if held is not None:
                message = self._published(record, held)
                self._give_back(lease, actor, message)
                raise AbortRefusedError(message)
        elif manifest is not None and self.publisher is not None:
            # The marker rule for targets without a tombstone: any attempt of this checkpoint
            # version the target holds (not only the sealed one) means it is published.
            held = self.publisher.published_attempt(manifest)
            ours = self._attempt_numbers(record)
            if held is not None and held != record.supersedes_attempt_id and held in ours:
                message = self._published(record, held)
                self._give_back(lease, actor, message)
                raise AbortRefusedError(message)
        done = self.store.abort(
            pipeline, checkpoint_key, reason=reason, actor=actor, lease=lease, attempt_id=attempt_id
        )
        if done.state is S.COMMITTED:
            # An abandoned new version (a reprocess): the committed version is the checkpoint
            # again and stays in the target; only the new version's own staging goes.
            outcome = self._outcome(done, reason, previous=record.state.value, holder=lease.taken_over_from)
            if record.attempt_id:
                try:
                    self._remove_one(pipeline, checkpoint_key, record.attempt, record.attempt_id)
                except (WalsinkError, OSError) as exc:
                    outcome.warnings.append(f"removing the new version's staging: {exc}")
            return outcome
        outcome = self._outcome(done, reason, previous=record.state.value, holder=lease.taken_over_from)
        self._clean_up(done, outcome, manifest, actor=actor)
        if unreadable and not manifest_lost:
            outcome.warnings.append(
                f"the sealed manifest is not under the staging root {self._root()} ({unreadable}); "
                "if the staging root is another, its staging is still there (walsink gc with that root "
                "removes an aborted checkpoint's staging)"
            )
        log.info(
            "aborted %s/%s (was %s): %s; rolled back %d files, removed %s",
            pipeline,
            checkpoint_key,
            record.state,
            reason,
            outcome.files_rolled_back,
            outcome.staging_removed or "no staging",
        )
        return outcome

    # ------------------------------------------------------------------ staging

    def _root(self) -> str:
        return self.staging.root_location

    def _staged(self, pipeline: str, key: str) -> list[tuple[int, str | None, AttemptLocation]]:
        """The checkpoint's staged attempts: (number, id, location)."""
        return [(loc.attempt, loc.attempt_id, loc) for loc in staged_locations(self.staging, pipeline, key)]

    def _remove_one(self, pipeline: str, key: str, attempt: int, attempt_id: str) -> None:
        self.staging.remove_attempt(self.staging.attempt(pipeline, key, attempt, attempt_id))

    # ------------------------------------------------------------------ steps

    def _attempt_numbers(self, record: CheckpointRecord) -> dict[str, int | None]:
        """Attempt id -> number of every attempt of the checkpoint the row or its staging knows."""
        known: dict[str, int | None] = {}
        if record.attempt_id:
            known[record.attempt_id] = record.attempt
        if record.sealed_attempt_id:
            known[record.sealed_attempt_id] = record.sealed_attempt
        try:
            staged = self._staged(record.pipeline, record.checkpoint_key)
        except (WalsinkError, OSError):
            staged = []
        for number, attempt_id, _path in staged:
            if attempt_id:
                known[attempt_id] = number
        return known

    def _accounted_for(self, record: CheckpointRecord, manifest: Manifest | None, held: str) -> bool:
        """Whether attempt ``held``, which the table holds, is an earlier life's commit already in the offsets chain.

        Only for an ``append`` checkpoint with source offsets that is not a reprocess, and only
        when the table records the held attempt's offsets (its marker) and they end at or before
        the pipeline's last committed end offsets, partition by partition: then its rows are
        published and accounted for, the next interval starts after them, and aborting this row
        neither loses nor repeats a row. Anything unknown or not comparable: ``False`` (refuse).
        """
        if manifest is None or manifest.end_offsets is None or record.supersedes_attempt_id:
            return False
        lookup = self.publisher.published_offsets if self.publisher is not None else None
        held_offsets = lookup(manifest, held) if lookup is not None else None
        last = self.store.last_committed_offsets(record.pipeline)
        if held_offsets is None or not isinstance(held_offsets[1], dict) or not isinstance(last, dict):
            return False
        return all(
            isinstance(end, int) and isinstance(last.get(part), int) and end <= last[part]
            for part, end in held_offsets[1].items()
        )

    def _published(self, record: CheckpointRecord, held: str) -> str:
        """The refusal of an abort whose target holds attempt ``held`` of the checkpoint version."""
        number = self._attempt_numbers(record).get(held)
        which = f"attempt {number} ({held})" if number is not None else f"attempt {held}"
        if held == record.sealed_attempt_id:
            which = f"its sealed {which}"
        else:
            which = (
                f"{which}, an earlier attempt of this checkpoint version than the sealed attempt "
                f"{record.sealed_attempt} ({record.sealed_attempt_id}),"
            )
        rerun = (
            f"it finds attempt {held} in the target and records it as COMMITTED"
            if held == record.sealed_attempt_id
            else f"with fencing='table' it records attempt {held}, the one the target holds, as COMMITTED "
            "(under the lease an append commit refuses to publish another attempt over it: "
            "docs/guarantees.md, Aborts and clean-up)"
        )
        return (
            f"checkpoint {record.pipeline}/{record.checkpoint_key} is published: the target already holds "
            f"{which} so it cannot be aborted (published is published). Re-run (clear) its commit task: "
            f"{rerun}"
        )

    def _give_back(self, lease: Any, actor: Actor, message: str) -> None:
        record = lease.record
        if record.state is S.COMMITTING:
            self.store.release_lease(lease, actor=actor, reason=f"abort refused: {message}")
        else:
            self.store.record_event(
                lease.pipeline, lease.checkpoint_key, actor=actor, detail=f"abort refused: {message}"
            )

    def _sealed_manifest(self, record: CheckpointRecord) -> tuple[Manifest | None, str | None]:
        """The sealed attempt's manifest, or None and why it could not be read (None: none sealed)."""
        if record.sealed_attempt is None or record.manifest_digest is None:
            return None, None
        try:
            location = self.staging.attempt(
                record.pipeline, record.checkpoint_key, record.sealed_attempt, record.sealed_attempt_id
            )
            return self.staging.read_manifest(location, expected_digest=record.manifest_digest), None
        except (WalsinkError, OSError, ValueError) as exc:
            log.warning(
                "abort of %s/%s: sealed manifest unreadable (%s)", record.pipeline, record.checkpoint_key, exc
            )
            return None, str(exc)

    def _clean_up(
        self,
        record: CheckpointRecord,
        outcome: AbortOutcome,
        manifest: Manifest | None = None,
        *,
        actor: Actor,
    ) -> None:
        """Roll back what the aborted attempt published, then remove its staging; best effort.

        What was done (or left undone) goes into the checkpoint's history.
        """
        ctx = _AbortContext(self.store, record)
        retract = self.publisher.retract_attempt if self.publisher is not None else None
        attempt_id = record.sealed_attempt_id
        if retract is not None and attempt_id:
            try:
                outcome.files_rolled_back += retract(record.pipeline, record.checkpoint_key, attempt_id, ctx)
            except (WalsinkError, OSError) as exc:
                outcome.warnings.append(f"rolling back attempt {attempt_id} in the target: {exc}")
        try:
            self._remove_staging(record, outcome, manifest, ctx)
        except (WalsinkError, OSError) as exc:
            outcome.warnings.append(f"removing staging: {exc}")
        if outcome.warnings:
            log.warning(
                "abort of %s/%s left work undone: %s",
                record.pipeline,
                record.checkpoint_key,
                outcome.warnings,
            )
        if outcome.files_rolled_back or outcome.staging_removed or outcome.warnings:
            detail = (
                f"abort cleanup: {outcome.files_rolled_back} published files of attempt {record.attempt} "
                f"rolled back; staging removed: {', '.join(outcome.staging_removed) or 'none'}"
            )
            if outcome.warnings:
                detail += f"; left undone (run the abort again): {'; '.join(outcome.warnings)}"
            try:
                self.store.record_event(record.pipeline, record.checkpoint_key, actor=actor, detail=detail)
            except StoreError as exc:
                log.warning(
                    "could not record the abort cleanup of %s/%s: %s",
                    record.pipeline,
                    record.checkpoint_key,
                    exc,
                )

    def _remove_staging(
        self,
        record: CheckpointRecord,
        outcome: AbortOutcome,
        manifest: Manifest | None,
        ctx: _AbortContext | None = None,
    ) -> None:
        """Remove the attempts up to the aborted one; a newer attempt belongs to a new run.

        Through the one fenced clean-up (:mod:`~..protocol.cleanup`): before
        each attempt the abort's token is checked (a new run of the checkpoint
        stops it) and, for a target that references staged files in place
        (tables), the table is asked *then* whether it holds or held the
        attempt: an attempt is removed only if it is known to be unreferenced
        (the current attempt while never sealed, or an attempt whose manifest
        is readable and which the table neither holds nor held).
        """
        ctx = ctx or _AbortContext(self.store, record)
        references = self.publisher is not None and self.publisher.references_staged_files
        paths = {
            attempt_id: (number, path)
            for number, attempt_id, path in self._staged(record.pipeline, record.checkpoint_key)
        }

        def referenced(attempt_id: str | None) -> bool:
            number, path = paths[attempt_id]
            return references and not self._unreferenced(record, number, attempt_id, path)

        removed = remove_staged_attempts(
            self.staging,
            record.pipeline,
            record.checkpoint_key,
            up_to=record.attempt,
            fence=ctx.fence,
            referenced=referenced,
            wanted=lambda _number, attempt_id: attempt_id in paths,
        )
        outcome.staging_removed += [f"{record.pipeline}/{record.checkpoint_key}/{name}" for name in removed]

    def _unreferenced(
        self, record: CheckpointRecord, number: int, attempt_id: str | None, location: AttemptLocation
    ) -> bool:
        current = (number, attempt_id) == (record.attempt, record.attempt_id)
        try:
            if self.staging.describe(location, MANIFEST_NAME) is None:
                # Never sealed only if it is the current attempt and no seal was recorded; an older
                # attempt without a manifest may be a committed one whose manifest finish() removed.
                return current and record.sealed_attempt != number
            manifest = self.staging.read_manifest(location)
        except (WalsinkError, OSError):
            return False
        holds = self.publisher.holds_attempt if self.publisher is not None else None
        if holds is None:
            return False  # a target that cannot say may reference it: keep it
        return not holds(manifest)

    @staticmethod
    def _outcome(
        record: CheckpointRecord,
        reason: str,
        *,
        already: bool = False,
        previous: str | None = None,
        holder: str | None = None,
    ) -> AbortOutcome:
        return AbortOutcome(
            pipeline=record.pipeline,
            checkpoint_key=record.checkpoint_key,
            state=record.state.value,
            attempt=record.attempt,
            attempt_id=record.sealed_attempt_id or record.attempt_id,
            reason=record.error if already and record.error else reason,
            previous_state=previous,
            fenced_holder=holder if holder and not holder.startswith("abort:") else None,
            already_aborted=already,
        )
