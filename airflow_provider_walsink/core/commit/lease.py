"""Lease fencing (the default): the checkpoint's lease epoch is the fencing token of every step.

Taking the lease bumps the epoch in the checkpoint's row (compare-and-set,
expiry on the database's clock); the publish checks it before each side
effect (:class:`FencingContext`), and COMMITTED is a compare-and-set on it,
so a committer whose lease was taken over (or whose checkpoint was aborted)
stops before its next change (invariant 8). On a plain file system a window
between a check and a rename remains, bounded by the lease TTL.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from airflow_provider_walsink.core.commit.fencing import Fencing, Hold, Step
from airflow_provider_walsink.core.commit.refusals import (
    describe_error,
    explain_not_committable,
    record_refusal,
)
from airflow_provider_walsink.core.commit.summary import publication
from airflow_provider_walsink.core.faults import crashpoint
from airflow_provider_walsink.core.protocol.errors import FencedError, NotDurableError
from airflow_provider_walsink.core.protocol.manifest import Manifest
from airflow_provider_walsink.core.protocol.states import COMMITTABLE, CheckpointState
from airflow_provider_walsink.core.store.store import (
    Actor,
    AuditRejectedError,
    CheckpointRecord,
    CommitterStore,
    Lease,
    NotAuditedError,
    OffsetsError,
    TransitionError,
)
from airflow_provider_walsink.core.targets.base import PublishResult

log = logging.getLogger(__name__)
S = CheckpointState


class FencingContext:
    """The :class:`~airflow_provider_walsink.core.targets.base.PublisherContext` of a lease.

    ``fence()`` asks the committer database (one compare-and-set on the epoch,
    which also extends the lease) unless the lease was confirmed less than
    :attr:`FRESH` of its TTL ago: until a confirmed lease's TTL has passed on
    the database's clock nobody else can take it, so a publish of 10,000
    files costs a few statements, not 10,000. A process paused for longer
    than that is asked again when it resumes, and stops. ``force=True`` always
    asks (before recording the outcome).

    An abort moves the epoch on without waiting for the lease to expire, so a
    confirmation is never trusted for longer than :attr:`MAX_TRUST` either:
    the abort waits that long after fencing the holder out before it looks at
    the target (:mod:`.abort`).
    """

    #: Fraction of the TTL during which a confirmation is trusted without asking again.
    FRESH = 1 / 3
    #: The longest a confirmation is trusted, whatever the TTL (an abort waits it out).
    MAX_TRUST = timedelta(seconds=2)

    def __init__(
        self,
        store: CommitterStore,
        lease: Lease,
        ttl: timedelta,
        *,
        attempt_id: str,
        confirmed_at: float | None = None,
        supersedes: str | None = None,
    ) -> None:
        self.store, self.lease, self.ttl = store, lease, ttl
        self.pipeline, self.checkpoint_key = lease.pipeline, lease.checkpoint_key
        self.attempt_id = attempt_id
        #: The committed version's attempt id that this publish replaces (a reprocess).
        self.supersedes = supersedes
        self.epoch = lease.epoch
        # When the lease was asked for (monotonic): it cannot run out before then + TTL.
        self._confirmed = time.monotonic() if confirmed_at is None else confirmed_at

    def fence(self, *, force: bool = False) -> None:
        started = time.monotonic()
        trusted = min(self.ttl.total_seconds() * self.FRESH, self.MAX_TRUST.total_seconds())
        if not force and started - self._confirmed < trusted:
            return
        self.lease = self.store.fence(self.lease, self.ttl)
        # Measured from before the statement: the database extended the lease after it.
        self._confirmed = started

    def event(self, name: str) -> None:
        crashpoint(name)


def lease_context(
    store: CommitterStore, lease: Lease, ttl: timedelta, record: CheckpointRecord, asked: float
) -> FencingContext:
    """The fence of a publish of ``record`` under ``lease``, asked for at ``asked`` (monotonic)."""
    return FencingContext(
        store,
        lease,
        ttl,
        attempt_id=record.sealed_attempt_id or "",
        confirmed_at=asked,
        supersedes=record.supersedes_attempt_id,
    )


def record_failure(
    store: CommitterStore, pipeline: str, key: str, error: str, actor: Actor, lease: Lease
) -> None:
    """FAILED under ``lease`` (the lease released), keeping the original error if that fails too."""
    try:
        store.fail(pipeline, key, error=error, actor=actor, lease=lease)
    except Exception as exc:  # noqa: BLE001 - keep the original error
        log.warning("could not record the failure of %s/%s: %s", pipeline, key, exc)


def record_lease_failure(store: CommitterStore, ctx: FencingContext, exc: Exception, actor: Actor) -> None:
    """Log and record a commit's error under its lease: fenced out, or what went wrong."""
    pipeline, key = ctx.pipeline, ctx.checkpoint_key
    if isinstance(exc, FencedError):
        # Another committer holds the checkpoint now (or it was aborted): change nothing more.
        log.error("stopped committing %s/%s: %s", pipeline, key, exc)
        record_failure(store, pipeline, key, f"fenced out: {exc}", actor, ctx.lease)
        return
    # Bad input, a layout the target cannot take, an OS error (ENAMETOOLONG, ENOSPC...), a table
    # library's error: recorded on the checkpoint, the lease released, never a COMMITTING
    # checkpoint left without a reason.
    log.error("checkpoint %s/%s cannot be committed: %s", pipeline, key, exc)
    record_failure(store, pipeline, key, describe_error(exc), actor, ctx.lease)


class LeaseFencing(Fencing):
    """``fencing="lease"``: take the lease, publish under its fence, COMMITTED by compare-and-set."""

    name = "lease"
    groups = True

    def take(self, pipeline: str, checkpoint_key: str, *, actor: Actor) -> Hold | CheckpointRecord:
        c = self.committer
        # Unique per task try: try 2 never adopts try 1's live lease as its own.
        owner = c.owner or actor.lease_owner
        # Ask for the lease first: it refuses a committed or not yet durable
        # checkpoint itself, so the usual case needs no read before it.
        asked = time.monotonic()  # the lease runs from no earlier than this
        try:
            lease = c.store.acquire_lease(
                pipeline,
                checkpoint_key,
                owner=owner,
                ttl=c.lease_ttl,
                actor=actor,
                mode=c.mode,
                require_audit=c.require_audit,
            )
        except (AuditRejectedError, NotAuditedError):
            raise
        except OffsetsError as exc:
            record_refusal(c.store, pipeline, checkpoint_key, exc, actor)
            raise
        except TransitionError:
            record = c.store.require(pipeline, checkpoint_key)
            if record.is_committed:
                return record  # a re-run, or a racing committer that finished first
            if record.state not in COMMITTABLE or (record.state is S.FAILED and not record.durable_at):
                raise NotDurableError(explain_not_committable(record)) from None
            raise
        if lease.taken_over_from:
            log.warning(
                "took over the expired lease of %s on %s/%s", lease.taken_over_from, pipeline, checkpoint_key
            )
            crashpoint("lease.after_takeover")
        record = lease.record or c.store.require(pipeline, checkpoint_key)
        assert record.sealed_attempt is not None and record.manifest_digest is not None
        ctx = lease_context(c.store, lease, c.lease_ttl, record, asked)
        return Hold(record, ctx, taken_over_from=lease.taken_over_from)

    def record_committed(
        self, hold: Hold, manifest: Manifest, result: PublishResult, *, actor: Actor
    ) -> tuple[CheckpointRecord, bool]:
        c = self.committer
        # No fence first: recording COMMITTED is itself a compare-and-set on the epoch.
        done = c.store.mark_committed(
            hold.ctx.lease,
            actor=actor,
            end_offsets=manifest.end_offsets,
            detail=f"published {result.published}, already there {result.already}",
            publication=publication(c.publisher, result),
        )
        return done, True

    def failed(self, hold: Hold, step: Step, exc: Exception, *, actor: Actor) -> None:
        # Every step's error is recorded under the lease, which it releases.
        record_lease_failure(self.committer.store, hold.ctx, exc, actor)
