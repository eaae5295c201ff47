"""The write phase of one checkpoint (Flink's ``SinkWriter`` side), Airflow-free.

:class:`WritePhase` registers the checkpoint, starts a new attempt, plans the source, runs the
PySpark job through a :class:`~airflow_provider_walsink.core.runners.base.JobRunner` and records
the seal. The write task (``operators/write.py``) builds it through the walsink hook and calls
:meth:`WritePhase.run`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_walsink.core.commit.attempt_watch import WATCH_INTERVAL_S, AttemptWatch
from airflow_provider_walsink.core.protocol.errors import ManifestError, WalsinkError
from airflow_provider_walsink.core.protocol.manifest import (
    MANIFEST_NAME,
    digest_of,
    parse_manifest,
)
from airflow_provider_walsink.core.protocol.modes import REPROCESS_CONF_KEY
from airflow_provider_walsink.core.protocol.states import CheckpointState as S
from airflow_provider_walsink.core.runners import runner_class
from airflow_provider_walsink.core.runners.base import JobRunner
from airflow_provider_walsink.core.sources.base import FilesSource, Source
from airflow_provider_walsink.core.spark.args import ProtocolArgs
from airflow_provider_walsink.core.staging.cleanup import is_object_store
from airflow_provider_walsink.core.staging.layout import StagingLayout
from airflow_provider_walsink.core.staging.object_store import StagingStore
from airflow_provider_walsink.core.staging.resolve import recorded_root
from airflow_provider_walsink.core.store.store import Actor, CheckpointRecord, OrderingError, TransitionError

#: A run's conf key that asks for one reprocess policy for this run (``--run-conf`` of a backfill).

Log = logging.Logger | logging.LoggerAdapter[Any]


def same_root(a: str, b: str) -> bool:
    """Whether two staging roots name the same place (local paths resolved, URIs as written)."""
    if is_object_store(a) or is_object_store(b):
        return a.rstrip("/") == b.rstrip("/")
    return StagingLayout(a).root == StagingLayout(b).root


class AttemptCancelledError(WalsinkError):
    """The write job was cancelled because its attempt can no longer count (the checkpoint was
    aborted, or a newer attempt started): retrying this attempt is pointless."""


class CheckpointSkipped(WalsinkError):
    """A re-run of a COMMITTED checkpoint that rewrites nothing (reprocess ``skip``): the task
    ends skipped. ``record`` is the committed checkpoint, ``why`` the decision's reason."""

    def __init__(self, message: str, record: CheckpointRecord, why: str) -> None:
        super().__init__(message)
        self.record = record
        self.why = why


def attempt_range(
    store: Any,
    pipeline: str,
    existing: CheckpointRecord | None,
    *,
    initial_offsets: Mapping[str, Any] | None,
    replacing: bool,
) -> tuple[dict[str, Any] | None, dict[str, Any] | None] | None:
    """``(start_offsets, until_offsets)`` the write task's next attempt of ``existing`` will read,
    from the committer table only (reads, records nothing); ``None`` when no attempt will start
    (a COMMITTED checkpoint the run skips, an earlier checkpoint still open: the task fails on
    the ordering rule instead).

    ``replacing``: the run starts a new version of a COMMITTED ``existing`` (a ``replace``
    reprocess). :meth:`WritePhase.run` computes the same offsets after it registers the checkpoint.
    """
    if existing is not None and existing.is_committed:
        if not replacing:
            return None
        return existing.start_offsets, existing.end_offsets  # the version it will replace
    if existing is not None and existing.supersedes_attempt_id is not None:
        return existing.start_offsets, store.versions(pipeline, existing.checkpoint_key)[-1].end_offsets
    sequence = existing.sequence if existing is not None else None
    if any(sequence is None or r.sequence < sequence for r in store.pending(pipeline)):
        return None
    start = store.last_committed_offsets(pipeline)
    return (start if start is not None else initial_offsets), None


@dataclass
class WritePhase:
    """One write task's run: register, start an attempt, plan the source, run the job, record the seal.

    1. Registers the checkpoint (idempotent) and starts a new write attempt. In ``append``
       mode the attempt starts from the pipeline's last committed end offsets, and an earlier
       uncommitted checkpoint makes it fail (:class:`OrderingError`, retry later).
    2. Runs ``application`` through :attr:`runner` with the protocol arguments ahead of
       ``application_args``; the staging credentials and the source's secrets go in the job's
       environment.
    3. Reads and validates the sealed manifest and records the seal. A failed job records the
       error on the attempt (FAILED, retryable) and re-raises.

    A COMMITTED checkpoint is rewritten as a new version when :attr:`reprocess` says
    ``replace``; else :class:`CheckpointSkipped` is raised after the skip is recorded.

    The callables keep the Airflow side out: :attr:`staging` opens a staging root,
    :attr:`credentials_env` gives a root's credentials as the job's environment,
    :attr:`check_placement` refuses a root the job's nodes cannot see (returns the line to log),
    :attr:`reprocess` and :attr:`version_token` are asked only for a COMMITTED checkpoint.
    """

    store: Any
    runner: JobRunner
    pipeline: str
    checkpoint_key: str
    mode: str
    application: str
    staging_root: str
    staging: Callable[[str], StagingStore]
    credentials_env: Callable[[str], dict[str, str]]
    check_placement: Callable[[str], str]
    reprocess: Callable[[], tuple[str, str]]
    version_token: Callable[[], str]
    application_args: Sequence[Any] = ()
    source: Source = field(default_factory=FilesSource)
    target: str | None = None
    #: The connection references of the target's options (``connection_references``), recorded
    #: on the pipeline's row at registration: an abort opens the target with them.
    target_connections: Mapping[str, str] | None = None
    interval_start: str | None = None
    interval_end: str | None = None
    #: The run's partition (a partitioned run), and the one target partition its checkpoint replaces.
    partition_key: str | None = None
    partition_date: str | None = None
    target_partition: str | None = None
    file_format: str = "parquet"
    partition_by: Sequence[str] = ()
    checksum: str | None = "crc32"
    initial_offsets: Mapping[str, Any] | None = None
    log: Log = field(default_factory=lambda: logging.getLogger(__name__))
    #: Refuses, before anything is recorded, a staging root this run cannot stage into
    #: (``core/commit/preflight.py: check_staging``, naming the connection to fix); ``None``: unchecked.
    check_staging: Callable[[str], None] | None = None
    #: Seconds between two reads of the checkpoint's row while the job runs: an abort or a newer
    #: attempt cancels the job (``core/commit/attempt_watch.py``); ``None``: not watched.
    watch_interval: float | None = WATCH_INTERVAL_S

    def run(self, actor_of: Callable[[], Actor]) -> CheckpointRecord:
        """The sealed checkpoint record; :attr:`staging_root` is then where this attempt staged.

        ``actor_of`` is asked for who acts once no refusal (source plan, placement) stopped the run.
        """
        store, key = self.store, self.checkpoint_key
        existing = store.get(self.pipeline, key)
        # A source plan the source refuses is refused here, before anything is recorded.
        self._plan_source(existing)
        # A checkpoint staged before keeps its recorded root (docs/protocol.md, "Staging root").
        root = self.staging_root = self._recorded_root(existing, self.staging_root)
        # Before anything is recorded: a cluster master needs a staging root every node sees.
        self.log.info("Staging placement: %s", self.check_placement(root))
        if self.check_staging is not None:
            self.check_staging(root)  # the bucket exists and takes writes, before Spark (preflight.py)
        self.runner.check_reachable()  # a Spark Connect server answers (preflight.py)
        actor = actor_of()

        record = store.register(
            self.pipeline,
            key,
            mode=self.mode,
            actor=actor,
            target=self.target,
            staging_root=root,
            target_connections=self.target_connections,
        )
        if record.is_committed:
            record = self._reprocess_or_skip(record, actor)
        start_offsets, until_offsets = self._offsets(record, actor)
        # Fixed once per version and reused by every retry (docs/kafka.md, "The offset rule").
        start_offsets, until_offsets, source_extra = self.source.record(
            store, record, start_offsets=start_offsets, until_offsets=until_offsets, actor=actor
        )
        earlier = store.get(self.pipeline, key)
        try:
            record = store.start_attempt(
                self.pipeline,
                key,
                actor=actor,
                start_offsets=start_offsets,
                staging_root=root,
                write_job=self.runner.job_ref(),
            )
        except TransitionError as e:
            raise TransitionError(f"{e}; the write task cannot start a new attempt now") from None
        self._stop_orphan(earlier, record.attempt, actor)
        if record.staging_root and not same_root(record.staging_root, root):
            # Another writer recorded a root between our read and this attempt: it wins.
            root = self.staging_root = self._recorded_root(record, root)
            self.log.info("Staging placement: %s", self.check_placement(root))
        staging = self._clean_attempt(root, record)
        # Secrets reach the job in its environment, never on its command line.
        env = {**self.credentials_env(root), **self.source.job_env()}
        protocol = ProtocolArgs(
            pipeline=self.pipeline,
            checkpoint_key=key,
            sequence=record.sequence,
            attempt=record.attempt,
            staging_root=root,
            mode=self.mode,
            file_format=self.file_format,
            partition_by=tuple(self.partition_by),
            start_offsets=start_offsets,
            interval_start=self.interval_start,
            interval_end=self.interval_end,
            checksum=self.checksum,
            attempt_id=record.attempt_id or "",
            until_offsets=until_offsets,
            extra=source_extra,
            partition_key=self.partition_key,
            partition_date=self.partition_date,
            target_partition=self.target_partition,
        )
        self.log.info(
            "Checkpoint %s/%s sequence %d: attempt %d stages into %s (start offsets %s)",
            self.pipeline,
            key,
            record.sequence,
            record.attempt,
            staging.attempt(self.pipeline, key, record.attempt, record.attempt_id).uri,
            start_offsets,
        )
        watch = AttemptWatch(
            store,
            self.pipeline,
            key,
            record.attempt,
            self.runner.cancel,
            interval=self.watch_interval or 0,
            log=self.log,
        )
        try:
            with watch if self.watch_interval else contextlib.nullcontext():
                self.runner.submit(
                    self.application, [*protocol.to_argv(), *map(str, self.application_args)], env
                )
                self.runner.wait()
            return record_seal(store, staging, protocol, actor, log=self.log)
        except BaseException as exc:
            if watch.reason is not None:
                # The attempt no longer counts (the row says why): say so, and change no state.
                message = f"write attempt {record.attempt} cancelled: {watch.reason}"
                try:
                    store.record_event(self.pipeline, key, actor=actor, detail=message)
                except Exception as event_exc:  # noqa: BLE001 - keep the original error
                    self.log.warning("could not record the cancel: %s", event_exc)
                raise AttemptCancelledError(
                    f"checkpoint {self.pipeline}/{key}: {message}; nothing of it is sealed or published"
                ) from exc
            detail = self.runner.describe_failure(exc)
            try:
                # Owned: fails this attempt only, never a checkpoint a newer try or a committer holds.
                store.fail(
                    self.pipeline,
                    key,
                    error=f"write attempt {record.attempt}: {detail}",
                    actor=actor,
                    attempt=record.attempt,
                )
            except Exception as fail_exc:  # noqa: BLE001 - keep the original error
                self.log.warning("could not record the failure: %s", fail_exc)
            raise

    def _stop_orphan(self, earlier: CheckpointRecord | None, attempt: int, actor: Actor) -> None:
        """Stop the job of the attempt this one fenced when it may still run: its worker died
        mid-job (the attempt is still WRITING) on a runner whose job outlives the worker. Its
        output would never count; stopping it frees the cluster and keeps it from writing on."""
        if earlier is None or earlier.state is not S.WRITING or not earlier.write_job:
            return
        ref = earlier.write_job
        try:
            done = runner_class(str(ref.get("runner"))).stop_orphan(ref, self.log)
        except Exception as exc:  # noqa: BLE001 - never fails this attempt, which goes on
            done = f"could not stop it: {exc}"
        if done is None:
            return
        message = f"the job of write attempt {earlier.attempt} (fenced by attempt {attempt}): {done}"
        self.log.warning("%s", message)
        try:
            self.store.record_event(self.pipeline, self.checkpoint_key, actor=actor, detail=message)
        except Exception as exc:  # noqa: BLE001
            self.log.warning("could not record it: %s", exc)

    def _plan_source(self, existing: CheckpointRecord | None) -> None:
        """Plan the next attempt as it will run once registered, recording nothing: a refusal
        leaves the committer table unchanged (docs/kafka.md, "The offset rule")."""
        if not self.source.plans_input:
            return
        replacing = False
        if existing is not None and existing.is_committed:
            decision, _ = self.reprocess()
            replacing = decision == "replace" and existing.version_token != self.version_token()
        offsets = attempt_range(
            self.store, self.pipeline, existing, initial_offsets=self.initial_offsets, replacing=replacing
        )
        self.source.plan(self.store, self.pipeline, existing, offsets)

    def _offsets(self, record: CheckpointRecord, actor: Actor) -> tuple[Any, Any]:
        """``(start, until)`` of the attempt about to start; the ordering rule of ``append``."""
        store, key = self.store, self.checkpoint_key
        if self.mode != "append":
            return None, None
        if record.supersedes_attempt_id is not None:
            # A new version re-reads exactly the input of the version it replaces.
            return record.start_offsets, store.versions(self.pipeline, key)[-1].end_offsets
        earlier = [r for r in store.pending(self.pipeline) if r.sequence < record.sequence]
        if earlier:
            first = earlier[0]
            # Recorded on the checkpoint (its error, its history): the UI and the CLI show why it waits.
            reason = store.record_blocked(self.pipeline, key, actor=actor)
            raise OrderingError(
                reason
                or f"append checkpoint {self.pipeline}/{key} (sequence {record.sequence}) cannot start: "
                f"earlier checkpoint {first.checkpoint_key} (sequence {first.sequence}) is {first.state}; "
                "it must commit (or be aborted with `walsink`) first, or its input would be read twice"
            )
        start_offsets = store.last_committed_offsets(self.pipeline)
        return (self.initial_offsets if start_offsets is None else start_offsets), None

    def _clean_attempt(self, root: str, record: CheckpointRecord) -> StagingStore:
        """The staging store, with nothing left under this attempt's place by an earlier crash."""
        staging = self.staging(root)
        location = staging.attempt(self.pipeline, self.checkpoint_key, record.attempt, record.attempt_id)
        staging.prepare_attempt(location)
        return staging

    def _recorded_root(self, record: CheckpointRecord | None, configured: str) -> str:
        """The staging root this attempt stages under: the checkpoint's recorded root, if it has one.

        A checkpoint's attempts (and its later versions) never split across
        staging roots: the sensor, the commit, the UI, GC and abort all read
        the recorded root. So when the connection, the target or
        ``staging_root`` now name another place, the recorded root wins, and
        the task log says so.
        """
        recorded = recorded_root(record)
        if recorded is None:
            return configured
        if not same_root(recorded, configured):
            self.log.warning(
                "Checkpoint %s/%s is staged under %s (recorded when it was first written); this attempt "
                "stages there too, not under the configured %s: a checkpoint's attempts never split "
                'across staging roots (docs/protocol.md, "Staging root")',
                record.pipeline,
                record.checkpoint_key,
                recorded,
                configured,
            )
        return recorded

    def _reprocess_or_skip(self, record: CheckpointRecord, actor: Actor) -> CheckpointRecord:
        """A COMMITTED checkpoint: start a new version (reprocess ``replace``) or skip, loudly."""
        name = f"{self.pipeline}/{record.checkpoint_key}"
        decision, why = self.reprocess()
        if decision == "replace":
            token = self.version_token()
            new = self.store.begin_version(
                self.pipeline, record.checkpoint_key, token=token, actor=actor, reason=why
            )
            if new is not None:
                self.log.warning(
                    "Checkpoint %s is COMMITTED (version %d, attempt %s); REPROCESS: writing version %d, "
                    "which will supersede it when it commits (%s)",
                    name,
                    record.version,
                    record.sealed_attempt_id,
                    new.version,
                    why,
                )
                return new
            why = f"this run ({token}) already wrote version {record.version}"
        message = (
            f"Checkpoint {name} is already COMMITTED (version {record.version}, attempt "
            f"{record.sealed_attempt_id}, at {record.committed_at}): SKIPPED, nothing is rewritten ({why}). "
            f"To rewrite it, reprocess with reprocess='replace' or the run conf "
            f'{{"{REPROCESS_CONF_KEY}": "replace"}} (docs/backfill.md)'
        )
        self.log.warning("%s", message)
        self.store.record_event(
            self.pipeline,
            record.checkpoint_key,
            actor=actor,
            detail=f"write skipped: the checkpoint is already COMMITTED ({why})",
        )
        raise CheckpointSkipped(message, record, why)


def check_target_partition(replaced: Sequence[str], target_partition: str | None, path: str) -> None:
    """A partitioned run's checkpoint stages into its own target partition only (``dt=2026-01-05``,
    the pipeline's ``partition_column``): a sealed attempt naming another partition is refused
    before its seal is recorded, so it is never published (docs/backfill.md, "Partitioned runs").

    Raises:
        ManifestError: a replaced (written or declared) partition lies outside ``target_partition``.
    """
    if target_partition is None:
        return
    outside = sorted(p for p in replaced if target_partition not in p.split("/"))
    if outside:
        raise ManifestError(
            f"manifest {path} stages into partition(s) {outside[:5]}, but this run's partition key "
            f"names target partition {target_partition} and its checkpoint replaces that one only: "
            "refused before the seal is recorded, nothing will be published. The job must write only "
            "the rows of its partition (read job.protocol.partition_key)"
        )


def record_seal(
    store: Any, staging: StagingStore, protocol: ProtocolArgs, actor: Actor, *, log: Log
) -> CheckpointRecord:
    """Read and validate the attempt's sealed manifest and record the seal in the committer table."""
    location = staging.attempt(
        protocol.pipeline, protocol.checkpoint_key, protocol.attempt, protocol.attempt_id or None
    )
    path = f"{location.uri}/{MANIFEST_NAME}"
    try:
        data = staging.read_manifest_bytes(location)
    except FileNotFoundError:
        raise ManifestError(
            f"the Spark job finished but sealed no manifest at {path}: does it stage through "
            "CheckpointJob and leave its `with` block (or call job.seal())?"
        ) from None
    manifest_uri = staging.manifest_uri(location)
    manifest = parse_manifest(data, source=f"manifest {path}")
    names = ("pipeline", "checkpoint_key", "sequence", "attempt", "attempt_id")
    expected = tuple(getattr(protocol, name) for name in names)
    found = tuple(getattr(manifest, name) for name in names)
    if found != expected:
        raise ManifestError(f"manifest {path} describes {found}, not {expected}")
    if manifest.start_offsets != protocol.start_offsets:
        raise ManifestError(
            f"manifest {path} starts at offsets {manifest.start_offsets}, but the attempt was "
            f"started at {protocol.start_offsets}"
        )
    check_target_partition(manifest.replaced_partitions(), protocol.target_partition, path)
    if protocol.until_offsets is not None and manifest.end_offsets != protocol.until_offsets:
        raise ManifestError(
            f"manifest {path} ends at offsets {manifest.end_offsets}, but this reprocess must end "
            f"where the version it replaces ended, {protocol.until_offsets} (read job.until_offsets): "
            "otherwise later checkpoints would be read twice or skipped"
        )
    digest = digest_of(data)
    record = store.seal_manifest(manifest, manifest_uri=manifest_uri, manifest_digest=digest, actor=actor)
    log.info(
        "Sealed %s/%s attempt %d: %d committables, %d rows, %d bytes, end offsets %s, digest %s",
        protocol.pipeline,
        protocol.checkpoint_key,
        protocol.attempt,
        manifest.expected_count,
        manifest.total_rows,
        manifest.total_bytes,
        manifest.end_offsets,
        digest,
    )
    return record
