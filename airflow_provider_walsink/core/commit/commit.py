"""Committing one checkpoint: lease, sealed manifest, publish, COMMITTED, clean staging.

This is walsink's exactly-once step. Flink's GenericWriteAheadSink publishes
(``sendValues``) and then records the commit (``commitCheckpoint``) as two
steps, so a crash between them replays the data. Here the publish is
idempotent on the target side, so the crash window is harmless: a re-run
(after the lease expires, by anyone) recognises what is already published and
finishes the rest, and only then records COMMITTED.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from airflow_provider_walsink.core.faults import crashpoint
from airflow_provider_walsink.core.protocol.errors import (
    CommittableError,
    FencedError,
    InvalidIdentifierError,
    LayoutError,
    ManifestError,
    NotDurableError,
    OrderError,
    PathEscapeError,
    SupersedeError,
)
from airflow_provider_walsink.core.protocol.manifest import Manifest, read_manifest
from airflow_provider_walsink.core.protocol.states import COMMITTABLE, CheckpointState
from airflow_provider_walsink.core.staging.cleanup import CleanupFencedError
from airflow_provider_walsink.core.staging.layout import StagingLayout
from airflow_provider_walsink.core.staging.object_store import AttemptLocation, StagingStore
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
from airflow_provider_walsink.core.targets.base import Publisher, PublishResult, StagedAttempt

log = logging.getLogger(__name__)
S = CheckpointState

#: Errors caused by what is on disk: recorded on the checkpoint, which stays uncommitted.
BAD_INPUT = (
    ManifestError,
    PathEscapeError,
    CommittableError,
    InvalidIdentifierError,
    LayoutError,
    OrderError,
    SupersedeError,
)
#: How many published file names the committer table keeps per checkpoint (the UI shows them).
PUBLICATION_FILES = 1000


@dataclass
class CommitSummary:
    """What a commit did, as returned to Airflow (XCom) or printed by the CLI."""

    pipeline: str
    checkpoint_key: str
    sequence: int
    attempt: int | None
    state: str
    already_committed: bool
    attempt_id: str | None = None
    published: int = 0
    already_published: int = 0
    committables: int | None = None
    rows: int | None = None
    bytes: int | None = None
    partitions_replaced: list[str] = field(default_factory=list)
    lease_taken_over_from: str | None = None
    end_offsets: dict[str, Any] | None = None
    seconds: float = 0.0
    #: A group commit: its leader's checkpoint key, then every member published with it.
    group: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def explain_not_committable(record: CheckpointRecord) -> str:
    """Say, for a user, why a checkpoint cannot be committed yet."""
    name = f"checkpoint {record.pipeline}/{record.checkpoint_key}"
    match record.state:
        case S.REGISTERED:
            return f"{name} is not durable: its write phase has not started (no attempt, no manifest)"
        case S.WRITING:
            return f"{name} is not durable: attempt {record.attempt} is still writing; no sealed manifest yet"
        case S.SEALED:
            return (
                f"{name} is not durable: attempt {record.sealed_attempt} sealed its manifest but its "
                f"{record.committables} committables have not been verified (run the durability sensor)"
            )
        case S.FAILED:
            return f"{name} is not durable: it FAILED before it was verified: {record.error}"
        case S.ABORTED:
            return (
                f"{name} was ABORTED ({record.error}): its attempt {record.attempt} will never be "
                "committed; a new run of its write task starts a fresh attempt"
            )
        case S.REJECTED:
            return f"{name} was REJECTED by its audit and will never be committed: {record.error}"
    return f"{name} is {record.state}"


def read_sealed_manifest(layout: StagingLayout, record: CheckpointRecord) -> tuple[Manifest, Path]:
    """The checkpoint's sealed manifest and its attempt directory, checked against the record.

    The path is built from the record's identifiers inside ``layout`` (never
    taken from a row), the digest must be the sealed one, and the manifest
    must describe this checkpoint's sealed attempt. Raises ``ManifestError``.
    """
    assert record.sealed_attempt is not None and record.manifest_digest is not None
    pipeline, checkpoint_key = record.pipeline, record.checkpoint_key
    manifest_path = layout.manifest_path(
        pipeline, checkpoint_key, record.sealed_attempt, record.sealed_attempt_id
    )
    manifest = read_manifest(manifest_path, expected_digest=record.manifest_digest)
    if (manifest.pipeline, manifest.checkpoint_key, manifest.attempt) != (
        pipeline,
        checkpoint_key,
        record.sealed_attempt,
    ) or (record.sealed_attempt_id and manifest.attempt_id != record.sealed_attempt_id):
        raise ManifestError(
            f"manifest {manifest_path} describes {manifest.pipeline}/{manifest.checkpoint_key} "
            f"attempt {manifest.attempt} ({manifest.attempt_id}), not {pipeline}/{checkpoint_key} "
            f"attempt {record.sealed_attempt} ({record.sealed_attempt_id})"
        )
    return manifest, manifest_path.parent


#: Where a committer reads staged attempts: a local :class:`StagingLayout` (as always), or a
#: :class:`StagingStore` on any root (opened by the caller, with its credentials, for the
#: checkpoint's recorded staging root).
Staging = StagingLayout | StagingStore


def local_store(layout: StagingLayout) -> StagingStore:
    """A :class:`StagingStore` over a local layout that *is* that layout (same resolver, same checks)."""
    import pyarrow.fs as pafs

    root = str(layout.root)
    store = StagingStore(root, pafs.LocalFileSystem(), root, kind="local")
    store.layout = layout
    return store


def local_layout(staging: Staging) -> StagingLayout | None:
    """The local layout behind ``staging``, or ``None`` for an object store."""
    return staging if isinstance(staging, StagingLayout) else staging.layout


def read_sealed_attempt(staging: Staging, record: CheckpointRecord) -> tuple[Manifest, StagedAttempt]:
    """The checkpoint's sealed manifest and where its attempt is, on a local root or an object store.

    :func:`read_sealed_manifest`'s checks on any store: the location is built
    from the record's identifiers (never taken from a row or a manifest), the
    manifest read through the store with its size cap must carry the sealed
    digest and describe this checkpoint's sealed attempt. A :class:`StagingStore`
    whose root is not the one the row records is refused (``LayoutError``):
    the checkpoint's attempts are where the write phase recorded them.
    Raises ``ManifestError`` / ``LayoutError``; reads no data file.
    """
    if isinstance(staging, StagingLayout) or staging.is_local:
        layout = local_layout(staging)
        assert layout is not None
        manifest, attempt_dir = read_sealed_manifest(layout, record)
        path = str(attempt_dir)
        location = AttemptLocation(
            record.pipeline, record.checkpoint_key, manifest.attempt, manifest.attempt_id, path, path
        )
        store = staging if isinstance(staging, StagingStore) else local_store(staging)
        return manifest, StagedAttempt(store, location)
    assert record.sealed_attempt is not None and record.manifest_digest is not None
    recorded = (record.staging_root or "").rstrip("/")
    if recorded and recorded != staging.root_uri.rstrip("/"):
        raise LayoutError(
            f"checkpoint {record.pipeline}/{record.checkpoint_key} is staged under {recorded}, but the "
            f"committer was given the staging store {staging.root_uri}; open the store of the recorded root"
        )
    location = staging.attempt(
        record.pipeline, record.checkpoint_key, record.sealed_attempt, record.sealed_attempt_id
    )
    manifest = staging.read_manifest(location, expected_digest=record.manifest_digest)
    if (manifest.pipeline, manifest.checkpoint_key, manifest.attempt) != (
        record.pipeline,
        record.checkpoint_key,
        record.sealed_attempt,
    ) or (record.sealed_attempt_id and manifest.attempt_id != record.sealed_attempt_id):
        raise ManifestError(
            f"manifest {location.uri}/_manifest.json describes {manifest.pipeline}/{manifest.checkpoint_key} "
            f"attempt {manifest.attempt} ({manifest.attempt_id}), not {record.pipeline}/"
            f"{record.checkpoint_key} attempt {record.sealed_attempt} ({record.sealed_attempt_id})"
        )
    return manifest, StagedAttempt(staging, location)


def publish_argument(publisher: Publisher, attempt: StagedAttempt) -> StagedAttempt | Path:
    """What ``publisher.publish`` takes as the attempt: the :class:`StagedAttempt` itself, or (a
    publisher without ``takes_staged_attempt``) its local directory (``LayoutError`` on an object store)."""
    if getattr(publisher, "takes_staged_attempt", False):
        return attempt
    return attempt.local_dir()


class CheckpointCommitter:
    """Commits checkpoints of one pipeline into one target with one publisher.

    :meth:`commit` takes the checkpoint's lease (bumping its fencing token),
    reads the sealed manifest, has the publisher publish it under a
    :class:`FencingContext`, records COMMITTED by compare-and-set on the
    token, then lets the publisher clean up.

    Raises ``NotDurableError`` (not yet committable: says what is missing),
    ``LeaseHeldError`` (another committer is publishing: retry later),
    ``OrderingError`` (an earlier ``append`` checkpoint is open), ``OffsetsError``
    (its source offsets can never commit as they stand: recorded as its error),
    ``AuditRejectedError`` (REJECTED by its audit: never committed),
    ``NotAuditedError`` (``require_audit`` and the attempt was not audited),
    ``FencedError`` (the lease was lost mid-publish: this process stopped
    before its next change; the new holder finishes), or the publisher's
    error, after recording it on the checkpoint (FAILED, lease released).
    Repeating a commit is always safe; after COMMITTED it is a no-op that
    says so.

    ``layout`` is where staged attempts are read: a local :class:`StagingLayout`,
    or a :class:`StagingStore` (any root, object stores included) that the
    caller opened, with its credentials, for the checkpoint's recorded staging
    root. The publisher receives the attempt as one :class:`StagedAttempt`
    (store + location; ``publish_argument``), the table targets publishing an
    object-store attempt by reference.

    ``fencing="table"`` (targets whose capabilities allow it: Iceberg, Delta)
    takes no lease: the table's atomic commit is the fence and COMMITTED is
    recorded in one transaction after it (:mod:`.tablefence`).
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
    ) -> None:
        from airflow_provider_walsink.core.commit.tablefence import require_table_fence, validate_fencing

        #: ``"lease"`` (default) or ``"table"``: the target's atomic commit is the only
        #: fence and the committer table gets one transaction per commit (``tablefence.py``).
        self.fencing = validate_fencing(fencing)
        if self.fencing == "table":
            require_table_fence(publisher)
        self.store = store
        self.layout = layout
        self.publisher = publisher
        self.mode = mode
        self.owner = owner
        self.lease_ttl = lease_ttl
        #: The pipeline declares an audit: only an AUDITED sealed attempt is published.
        self.require_audit = require_audit
        #: Up to this many other durable checkpoints of the pipeline are published in the same
        #: table transaction (:mod:`.group`); 0: every commit alone (the default).
        self.group_commit = group_commit

    def commit(self, pipeline: str, checkpoint_key: str, *, actor: Actor) -> CommitSummary:
        if self.fencing == "table":
            from airflow_provider_walsink.core.commit.tablefence import commit_table_fenced

            return commit_table_fenced(self, pipeline, checkpoint_key, actor=actor)
        started = time.monotonic()
        # Unique per task try: try 2 never adopts try 1's live lease as its own.
        owner = self.owner or actor.lease_owner
        # Ask for the lease first: it refuses a committed or not yet durable
        # checkpoint itself, so the usual case needs no read before it.
        asked = time.monotonic()  # the lease runs from no earlier than this
        try:
            lease = self.store.acquire_lease(
                pipeline,
                checkpoint_key,
                owner=owner,
                ttl=self.lease_ttl,
                actor=actor,
                mode=self.mode,
                require_audit=self.require_audit,
            )
        except (AuditRejectedError, NotAuditedError):
            raise
        except OffsetsError as exc:
            record_refusal(self.store, pipeline, checkpoint_key, exc, actor)
            raise
        except TransitionError:
            record = self.store.require(pipeline, checkpoint_key)
            if record.is_committed:
                # A re-run, or a racing committer that finished first: nothing to publish.
                log.info(
                    "checkpoint %s/%s is already COMMITTED (at %s); nothing to do",
                    pipeline,
                    checkpoint_key,
                    record.committed_at,
                )
                self._finish_cleanup(record)
                return self._summary(record, already=True, started=started)
            if record.state not in COMMITTABLE or (record.state is S.FAILED and not record.durable_at):
                raise NotDurableError(explain_not_committable(record)) from None
            raise
        if lease.taken_over_from:
            log.warning(
                "took over the expired lease of %s on %s/%s", lease.taken_over_from, pipeline, checkpoint_key
            )
            crashpoint("lease.after_takeover")
        record = lease.record or self.store.require(pipeline, checkpoint_key)
        assert record.sealed_attempt is not None and record.manifest_digest is not None
        from airflow_provider_walsink.core.commit.group import can_lead_group, commit_as_leader

        if can_lead_group(self, record):
            return commit_as_leader(self, lease, record, actor=actor, asked=asked, started=started)
        return self._publish_alone(lease, record, actor=actor, asked=asked, started=started)

    def _publish_alone(
        self, lease: Lease, record: CheckpointRecord, *, actor: Actor, asked: float, started: float
    ) -> CommitSummary:
        """Publish the leased checkpoint by itself, record COMMITTED, clean up (:meth:`commit`)."""
        pipeline, checkpoint_key = record.pipeline, record.checkpoint_key
        ctx = FencingContext(
            self.store,
            lease,
            self.lease_ttl,
            attempt_id=record.sealed_attempt_id or "",
            confirmed_at=asked,
            supersedes=record.supersedes_attempt_id,
        )
        try:
            manifest, attempt = read_sealed_attempt(self.layout, record)
            ctx.attempt_id = manifest.attempt_id
            result = self.publisher.publish(manifest, publish_argument(self.publisher, attempt), ctx)
            crashpoint("commit.after_publish")
            # No fence first: recording COMMITTED is itself a compare-and-set on the epoch.
            done = self.store.mark_committed(
                ctx.lease,
                actor=actor,
                end_offsets=manifest.end_offsets,
                detail=f"published {result.published}, already there {result.already}",
                publication=self._publication(result),
            )
        except FencedError as exc:
            # Another committer holds the checkpoint now (or it was aborted): change nothing more.
            log.error("stopped committing %s/%s: %s", pipeline, checkpoint_key, exc)
            self._record_failure(pipeline, checkpoint_key, f"fenced out: {exc}", actor, ctx.lease)
            raise
        except Exception as exc:
            # Bad input, a layout the target cannot take, an OS error (ENAMETOOLONG,
            # ENOSPC...), a table library's error: recorded on the checkpoint, the
            # lease released, never a COMMITTING checkpoint left without a reason.
            log.error("checkpoint %s/%s cannot be committed: %s", pipeline, checkpoint_key, exc)
            self._record_failure(pipeline, checkpoint_key, _describe(exc), actor, ctx.lease)
            raise
        crashpoint("commit.after_committed")
        # The commit is recorded: the WAL (every staged attempt) is garbage now.
        self._finish(manifest)
        summary = self._summary(done, already=False, started=started)
        summary.published, summary.already_published = result.published, result.already
        summary.partitions_replaced = result.partitions_replaced
        summary.lease_taken_over_from = lease.taken_over_from
        log.info(
            "committed %s/%s: %d published, %d already there, %s rows",
            pipeline,
            checkpoint_key,
            result.published,
            result.already,
            done.rows,
        )
        return summary

    def _finish_cleanup(self, record: CheckpointRecord) -> None:
        """Do the cleanup a committer killed after COMMITTED never did (harmless when done).

        Without it the publish journal outlives the commit, and if the row were
        later trimmed by retention and the key re-run, a stale journal would
        make the new publish roll back committed files.
        """
        if record.sealed_attempt is None:
            return
        layout = local_layout(self.layout)
        try:
            if layout is not None:
                path = layout.manifest_path(
                    record.pipeline, record.checkpoint_key, record.sealed_attempt, record.sealed_attempt_id
                )
                if not path.exists():
                    return  # staging is removed after the journal: nothing left to do
                manifest = read_manifest(path, expected_digest=record.manifest_digest)
            else:
                assert isinstance(self.layout, StagingStore)
                location = self.layout.attempt(
                    record.pipeline, record.checkpoint_key, record.sealed_attempt, record.sealed_attempt_id
                )
                import pyarrow.fs as pafs

                if self.layout.filesystem.get_file_info(location.manifest_path).type != pafs.FileType.File:
                    return  # the commit's clean-up removed the manifest: nothing left to do
                manifest = self.layout.read_manifest(location, expected_digest=record.manifest_digest)
        except BAD_INPUT as exc:
            log.warning(
                "leaving staging of committed %s/%s alone: %s", record.pipeline, record.checkpoint_key, exc
            )
            return
        self._finish(manifest)

    def _record_failure(self, pipeline: str, key: str, error: str, actor: Actor, lease: Lease) -> None:
        try:
            self.store.fail(pipeline, key, error=error, actor=actor, lease=lease)
        except Exception as exc:  # noqa: BLE001 - keep the original error
            log.warning("could not record the failure of %s/%s: %s", pipeline, key, exc)

    def _publication(self, result: PublishResult) -> dict[str, Any]:
        return {
            "target": self.publisher.describe(),
            "kind": self.publisher.kind,
            "outcome": result.outcome.value,
            "snapshot": result.snapshot,
            "files": result.target_files[:PUBLICATION_FILES],
            "files_total": len(result.target_files),
            "partitions_replaced": result.partitions_replaced,
        }

    def _finish(self, manifest: Manifest) -> None:
        """Drop the journal and the staged attempts; best effort, the commit is already recorded.

        Racing committers (a loser finishing the cleanup, a zombie writer still
        writing) may remove or fill the directory meanwhile: that must not turn
        a recorded commit into a failed task. What is left, GC removes. Every
        deletion is fenced by :func:`committed_fence` (a reprocess may begin,
        and commit, while this process is paused) and checked against what the
        target references at that moment (:mod:`~..protocol.cleanup`).
        """
        try:
            # A local root as the publishers have always taken it; an object store as itself.
            where = local_layout(self.layout) or self.layout
            self.publisher.finish(manifest, where, fence=committed_fence(self.store, manifest))
        except CleanupFencedError as exc:
            log.warning(
                "committed %s/%s; its clean-up stopped (left to GC): %s",
                manifest.pipeline,
                manifest.checkpoint_key,
                exc,
            )
        except OSError as exc:
            log.warning(
                "committed %s/%s, but its staging was not fully removed (GC will): %s",
                manifest.pipeline,
                manifest.checkpoint_key,
                exc,
            )

    @staticmethod
    def _summary(record: CheckpointRecord, *, already: bool, started: float) -> CommitSummary:
        return CommitSummary(
            pipeline=record.pipeline,
            checkpoint_key=record.checkpoint_key,
            sequence=record.sequence,
            attempt=record.sealed_attempt,
            attempt_id=record.sealed_attempt_id,
            state=record.state.value,
            already_committed=already,
            committables=record.committables,
            rows=record.rows,
            bytes=record.bytes,
            end_offsets=record.end_offsets,
            seconds=round(time.monotonic() - started, 3),
        )


def committed_fence(store: CommitterStore, manifest: Manifest) -> Callable[[], None]:
    """The fence of a post-commit clean-up: the row must still be COMMITTED as ``manifest``'s attempt.

    Raises :class:`CleanupFencedError` once a new version began (or committed),
    or the row is gone (retention): the version that cleans up is no longer
    the checkpoint, so nothing of the checkpoint's staging is its to delete.
    """

    def fence() -> None:
        now = store.get(manifest.pipeline, manifest.checkpoint_key)
        if now is None or now.state is not S.COMMITTED or now.sealed_attempt_id != manifest.attempt_id:
            raise CleanupFencedError(
                f"clean-up of {manifest.pipeline}/{manifest.checkpoint_key} attempt {manifest.attempt_id} "
                f"stopped: the checkpoint moved on ({'no row' if now is None else now.state}, attempt "
                f"{None if now is None else now.sealed_attempt_id}); nothing more deleted"
            )

    return fence


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
    the target (``committer/abort.py``).
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


def _describe(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    if isinstance(exc, OSError) and not isinstance(exc, BAD_INPUT):
        return f"{type(exc).__name__} while publishing: {text}"
    return text


def record_refusal(store: CommitterStore, pipeline: str, key: str, exc: Exception, actor: Actor) -> None:
    """Record an :class:`OffsetsError` on the checkpoint (state unchanged), keeping the original error."""
    try:
        store.record_refusal(pipeline, key, actor=actor, error=str(exc))
    except Exception as failure:  # noqa: BLE001 - keep the original error
        log.warning("could not record the refusal of %s/%s: %s", pipeline, key, failure)
