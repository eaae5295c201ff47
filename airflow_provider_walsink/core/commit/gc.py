"""Garbage collection and retention for staging areas and the committer table.

Airflow-free (the operator and the ``walsink gc`` command are thin faces).

**Staging** (the write-ahead log). A commit deletes its checkpoint's staging
directory, but crashes, superseded attempts and aborted checkpoints leave
directories behind. :func:`collect_staging` removes, once older than the
retention period:

* every attempt of a COMMITTED checkpoint up to the attempt of the row GC read
  (the commit is recorded; a newer attempt, or one of that number with another
  attempt id, belongs to a reprocess that began a new version meanwhile), and
  every attempt of an ABORTED one up to the aborted attempt (a newer attempt
  belongs to a later run that started the checkpoint again);
* attempts of an uncommitted checkpoint that are neither its current attempt
  nor its sealed attempt and are *older* than the current attempt (a newer
  attempt number may belong to a writer that just started, so it is kept);
* checkpoint directories the committer table does not know at all (rows
  trimmed by retention), but only if every entry in them is an attempt
  directory by name (``attempt-<n>`` or ``attempt-<n>-<32 hex>``).

GC only ever removes what walsink staged. It walks ``<root>/<pipeline>/`` only
for pipelines the committer table knows (pipeline rows are never deleted, not
even by retention), so a staging root given one level too high, or pointing
anywhere else, removes nothing: unknown pipeline directories, and unknown
checkpoint directories holding anything but attempt directories, are reported
in ``skipped`` and left alone. It removes attempt by attempt, then the
emptied checkpoint directory (an attempt that appears meanwhile stays, and
so does its directory). It never touches the current or sealed attempt of an
uncommitted checkpoint, never follows a symlink, and only walks names that
are valid identifiers under the staging root.

**Object stores** (a recorded ``s3://``, ``gs://``... root): the same rules
by prefix, through :class:`~.protocol.staging_store.StagingStore`. A
"directory" is a prefix, an attempt's age is its newest object's last
modification time, and an attempt is deleted by
:meth:`~.protocol.staging_store.StagingStore.remove_attempt` (only a
location the store builds from validated names); objects under the root
that are not in walsink's layout are skipped, as on a local root.

**Table targets** (Iceberg, Delta) add the staged files to the table by path:
the staging directory of a committed attempt *is* table data. For pipelines
whose target keeps staged files (``references_staged_files`` of its
publisher, or a target kind that cannot be loaded here), GC removes nothing:
an attempt directory may be referenced by a snapshot even when the committer
table no longer knows it (rows trimmed by retention, a restore); the table's
own maintenance (remove orphan files, VACUUM) decides about files no snapshot
references (docs/targets.md).

**Committer table** (Spark's ``_spark_metadata`` log grew without bound; this
one does not). :func:`trim_committer_table` deletes COMMITTED checkpoint rows
(with their history) whose commit is older than the retention period, except

* the latest committed checkpoint of each pipeline (its end offsets are where
  the next incremental run starts, and append ordering checks against it);
* for each uncommitted checkpoint, the latest committed checkpoint before it
  (its offset-continuity check reads that row);
* rows of ``append`` pipelines without source offsets: for them the row is
  the only memory that the interval was published, so deleting it would let
  a re-run publish the interval again. Only their history is compacted.

Deleting an ``overwrite`` row is safe because re-running that interval
replaces its partitions instead of adding to them; deleting an ``append`` row
with offsets is safe because a re-run starts from the kept latest end offsets
and the store refuses a checkpoint that does not continue them. For every
kept committed row older than the retention period, the history is compacted
to its COMMITTED transition. ABORTED rows are deleted after the retention
period.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, delete, func, select, update

from airflow_provider_walsink.core.protocol.errors import InvalidIdentifierError, WalsinkError
from airflow_provider_walsink.core.protocol.identifiers import validate_identifier
from airflow_provider_walsink.core.protocol.states import CheckpointState
from airflow_provider_walsink.core.staging.base import Staged, StagingListing
from airflow_provider_walsink.core.staging.cleanup import (
    CleanupFencedError,
    StoreOpener,
    never_referenced,
    open_object_store,
    remove_attempts_fenced,
)
from airflow_provider_walsink.core.staging.layout import StagingLayout
from airflow_provider_walsink.core.staging.listing import entry_name, span
from airflow_provider_walsink.core.staging.resolve import as_store, open_staging
from airflow_provider_walsink.core.store.models import checkpoint_table as ckpt
from airflow_provider_walsink.core.store.models import pipeline_table as pipe
from airflow_provider_walsink.core.store.models import transition_table as trans
from airflow_provider_walsink.core.store.models import version_table as vers
from airflow_provider_walsink.core.store.store import CheckpointRecord, CommitterStore, utcnow

log = logging.getLogger(__name__)
S = CheckpointState

#: Rows deleted per statement, so one GC never holds long locks on a busy table.
BATCH = 500


@dataclass
class GcReport:
    """What a garbage collection removed (or, with ``dry_run``, would remove)."""

    dry_run: bool = False
    attempts_removed: list[str] = field(default_factory=list)
    checkpoint_dirs_removed: list[str] = field(default_factory=list)
    kept_recent: int = 0
    #: Each staged item left in place and why ("p/k: COMMITTED 2h ago, retention 7d"), so a
    #: dry run answers "why is this still here?" without reading the code.
    kept: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    rows_deleted: int = 0
    transitions_deleted: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        verb = "would remove" if self.dry_run else "removed"
        return (
            f"{verb} {len(self.attempts_removed)} orphaned attempts and "
            f"{len(self.checkpoint_dirs_removed)} checkpoint directories; kept {self.kept_recent} "
            f"younger than the retention period; {verb} {self.rows_deleted} committer rows and "
            f"{self.transitions_deleted} history entries"
            + (f"; skipped {len(self.skipped)}: {'; '.join(self.skipped[:3])}" if self.skipped else "")
        )


def _keep(report: GcReport, item: str, reason: str, *, recent: bool = False) -> None:
    report.kept.append(f"{item}: {reason}")
    if recent:
        report.kept_recent += 1


def _add_root(
    roots: dict[str, StagingListing], root: StagingLayout | str, stores: StoreOpener | None, report: GcReport
) -> None:
    """Add ``root`` (a layout, a local path or an object-store URI) to ``roots`` once, as its
    backend lists it (:meth:`~..staging.base.StagingBackend.listing`); a root that cannot be
    opened is reported in ``skipped`` and nothing under it is touched."""
    try:
        staging = as_store(
            root
            if isinstance(root, StagingLayout)
            else open_staging(root, lambda uri: open_object_store(uri, stores))
        )
    except (WalsinkError, OSError, ValueError, TypeError) as exc:
        report.skipped.append(f"staging root {root}: cannot be opened ({exc}); nothing under it removed")
        return
    roots.setdefault(staging.root_location.rstrip("/") or "/", staging.listing())


def collect_staging(
    store: CommitterStore,
    layout: StagingLayout | str,
    *,
    retention: timedelta,
    pipelines: Iterable[str] | None = None,
    dry_run: bool = False,
    clock: Callable[[], datetime] = utcnow,
    stores: StoreOpener | None = None,
) -> GcReport:
    """Remove orphaned attempts and finished checkpoints' staging (see the module docstring).

    Walks ``layout`` (the connection's staging root, where checkpoints whose
    rows record no root were staged: a local layout or path, or an object-store
    URI opened by ``stores``) and every staging root recorded on a
    checkpoint row of the pipelines asked for, each once, with the same rules.
    A recorded object-store root (``s3://``, ``gs://``, ``abfs://``...) is
    walked through :class:`StagingStore`, opened by ``stores(root_uri)`` (the
    caller's storage options and credentials; default: no options, the
    store's default credential chain); ages there are the objects' last
    modification times. A root that cannot be opened, or that is not a
    bucket and a plain prefix (``..``, ``.`` or empty segments), is reported
    in ``skipped`` and nothing under it is touched.
    """
    report = GcReport(dry_run=dry_run)
    now = clock()
    cutoff = now - timedelta(seconds=retention.total_seconds())
    # Directory ages come from the file system clock; row ages from the store's clock.
    cutoff_ts = _epoch(cutoff)
    wanted = set(pipelines) if pipelines is not None else None
    roots: dict[str, StagingListing] = {}
    for root in [layout, *store.staging_roots(sorted(wanted) if wanted is not None else None)]:
        _add_root(roots, root, stores, report)
    for each in roots.values():
        _collect_root(store, each, wanted, cutoff, cutoff_ts, report, dry_run, retention)
    return report


def _collect_root(
    store: CommitterStore,
    root: StagingListing,
    wanted: set[str] | None,
    cutoff: datetime,
    cutoff_ts: float,
    report: GcReport,
    dry_run: bool,
    retention: timedelta,
) -> None:
    """:func:`collect_staging` under one staging root."""
    for name, shown in root.pipelines():
        try:
            pipeline = validate_identifier(name, "pipeline id")
        except InvalidIdentifierError:
            report.skipped.append(f"{shown}: not a pipeline id")
            continue
        if wanted is not None and pipeline not in wanted:
            continue
        registered = store.get_pipeline(pipeline)
        if registered is None:
            # Not walsink's staging (a staging root given one level too high, a neighbour's
            # directory): pipeline rows are never deleted, so staging of a pipeline walsink ever
            # ran has one. Nothing under an unknown pipeline is touched.
            report.skipped.append(
                f"{shown}: no pipeline {pipeline!r} in the committer table (not walsink staging?); left alone"
            )
            continue
        keeps_staged = _target_keeps_staged_files(registered)
        for cname, cshown in root.checkpoints(pipeline):
            try:
                key = validate_identifier(cname, "checkpoint key")
            except InvalidIdentifierError:
                report.skipped.append(f"{cshown}: not a checkpoint key")
                continue
            if keeps_staged:
                # Staged files are table data once committed, also those of a checkpoint whose
                # rows retention trimmed: the table's own maintenance removes what it dropped.
                report.skipped.append(f"{pipeline}/{key}: staging of a table target, left to the table")
                continue
            record = store.get(pipeline, key)
            fence = _row_fence(store, pipeline, key, record)
            try:
                _collect_checkpoint(
                    root,
                    pipeline,
                    key,
                    record,
                    cutoff,
                    cutoff_ts,
                    report,
                    dry_run,
                    fence,
                    retention=retention,
                )
            except CleanupFencedError as exc:
                report.skipped.append(str(exc))


def _target_keeps_staged_files(row: dict[str, Any]) -> bool:
    """Whether the pipeline (its row) has a target that references staged files in place (tables)."""
    from airflow_provider_walsink.core.targets.registry import TargetError, publisher_class, target_scheme

    target = row.get("target")
    if not target:
        return False  # registered without a target: the directory-of-files default
    try:
        return publisher_class(target_scheme(target)).references_staged_files
    except TargetError:
        return True  # a kind this process cannot load: assume its files are referenced


def _row_fence(
    store: CommitterStore, pipeline: str, key: str, record: CheckpointRecord | None
) -> Callable[[], None]:
    """GC's fence (:mod:`.protocol.cleanup`): the checkpoint's row is still the one GC decided from.

    Asked before every deletion: a reprocess, a new run of an aborted
    checkpoint or a new life of a trimmed one that began since GC read the
    row stops the collection of that checkpoint.
    """

    def identity(r: CheckpointRecord | None) -> tuple[Any, ...] | None:
        if r is None:
            return None
        return (r.state, r.attempt, r.attempt_id, r.sealed_attempt_id, r.lease_epoch, r.version)

    read = identity(record)

    def fence() -> None:
        if identity(store.get(pipeline, key)) != read:
            raise CleanupFencedError(
                f"gc of {pipeline}/{key} stopped: the checkpoint changed since gc read it; nothing more removed"
            )

    return fence


def _collect_checkpoint(
    root: StagingListing,
    pipeline: str,
    key: str,
    record: CheckpointRecord | None,
    cutoff: datetime,
    cutoff_ts: float,
    report: GcReport,
    dry_run: bool,
    fence: Callable[[], None] = lambda: None,
    *,
    retention: timedelta | None = None,
) -> None:
    cdir = root.checkpoint(pipeline, key)
    now = utcnow()
    kept_for = f"retention {span(retention if retention is not None else now - cutoff)}"
    remove = functools.partial(
        _remove_attempts, root, pipeline, key, report=report, dry_run=dry_run, fence=fence, kept_for=kept_for
    )

    def recent(item: str, changed: str) -> None:
        _keep(report, item, f"{changed} ago, {kept_for}", recent=True)

    if record is None:
        # A checkpoint the committer table does not know (its row trimmed by retention after a
        # crash left staging behind): removed only if it is made of attempt directories alone,
        # i.e. looks like what walsink stages; anything else there is not walsink's to delete.
        attempts, strays = root.entries(pipeline, key)
        if strays:
            report.skipped.append(
                f"{pipeline}/{key}: unknown to the committer table and holds {strays[0]!r}, "
                "not an attempt directory; left alone"
            )
            return
        if not root.old(cdir, cutoff_ts):
            recent(f"{pipeline}/{key}", f"unknown to the committer table, changed {root.age(cdir)}")
            return
        remove(attempts, lambda _a, _i: True, cutoff_ts=cutoff_ts)
        return
    if record.state is S.ABORTED:
        # Its attempts up to the aborted one; a newer one belongs to a run that started it again.
        if record.updated_at > cutoff:
            recent(f"{pipeline}/{key}", f"ABORTED {span(now - record.updated_at)}")
            return
        remove(
            root.staged(pipeline, key),
            lambda a, _i: a <= record.attempt,
            unwanted=f"newer than the aborted attempt {record.attempt}: a later run started the checkpoint again",
        )
        return
    if record.state is S.COMMITTED:
        # The attempts of the version GC read, never the whole directory: a reprocess
        # (begin_version) may have started a newer attempt since the row was read.
        finished_at = record.committed_at or record.updated_at
        if finished_at > cutoff:
            recent(f"{pipeline}/{key}", f"COMMITTED {span(now - finished_at)}")
            return
        known_ids = {i for i in (record.attempt_id, record.sealed_attempt_id) if i}

        def read_version(attempt: int, attempt_id: str | None) -> bool:
            if attempt > record.attempt:
                return False  # started after GC read the row
            if attempt == record.attempt and attempt_id and known_ids and attempt_id not in known_ids:
                return False  # same number, another id: not the attempt the row names
            return True

        remove(
            root.staged(pipeline, key),
            read_version,
            cutoff_ts=cutoff_ts,
            unwanted=f"not the committed attempt {record.attempt}: a reprocess started it after gc read the row",
        )
        return
    # Uncommitted: only attempts older than the current one and not sealed are garbage. An
    # attempt is known by its number and id (numbers repeat across lives of a checkpoint).
    keep = {(record.attempt, record.attempt_id), (record.sealed_attempt, record.sealed_attempt_id)}
    garbage = []
    state = record.state.value
    for attempt, attempt_id, path in root.staged(pipeline, key):
        item = f"{pipeline}/{key}/{entry_name(path)}"
        if (attempt, attempt_id) in keep or (attempt_id is None and attempt in {a for a, _ in keep}):
            which = "sealed" if attempt == record.sealed_attempt and attempt != record.attempt else "current"
            _keep(report, item, f"the {which} attempt of a {state} checkpoint (never collected)")
            continue
        if attempt > record.attempt:
            _keep(
                report,
                item,
                f"newer than the {state} checkpoint's attempt {record.attempt} (a write just started)",
            )
            continue
        if attempt < 1:
            report.skipped.append(f"{item}: not an attempt number walsink uses")
            continue
        if not root.old(path, cutoff_ts):
            recent(item, f"an old attempt of a {state} checkpoint, changed {root.age(path)}")
            continue
        garbage.append((attempt, attempt_id, path))
    removed = remove_attempts_fenced(
        garbage,
        up_to=record.attempt,
        fence=fence,
        referenced=never_referenced,
        delete=lambda location: root.delete(location, report.skipped, dry_run),
    )
    report.attempts_removed += [f"{pipeline}/{key}/{entry_name(p)}" for p in removed]


def _remove_attempts(
    root: StagingListing,
    pipeline: str,
    key: str,
    attempts: list[Staged],
    wanted: Callable[[int, str | None], bool],
    *,
    cutoff_ts: float | None = None,
    report: GcReport,
    dry_run: bool,
    fence: Callable[[], None] = lambda: None,
    kept_for: str = "the retention period",
    unwanted: str = "not this gc's to remove",
) -> None:
    """Remove the ``wanted`` attempts one by one (each older than the cutoff, if one is given),
    then the checkpoint directory if that emptied it.

    Never the whole directory at once: an attempt started after GC listed it (a reprocess, a
    later run of an aborted checkpoint, a new life of a trimmed one) stays, and so does the
    directory holding it.
    """
    candidates = []
    kept = 0
    for attempt, attempt_id, path in attempts:
        item = f"{pipeline}/{key}/{entry_name(path)}"
        if not wanted(attempt, attempt_id):
            _keep(report, item, unwanted)
            kept += 1
            continue
        if cutoff_ts is not None and not root.old(path, cutoff_ts):
            _keep(report, item, f"changed {root.age(path)} ago, {kept_for}", recent=True)
            kept += 1
            continue
        candidates.append((attempt, attempt_id, path))
    # Each deletion fenced by the row GC read (core/staging/cleanup.py); staging GC removes is
    # never table data (table targets are skipped above), so nothing is referenced.
    removed = remove_attempts_fenced(
        candidates,
        up_to=max((a for a, _i, _p in candidates), default=0),
        fence=fence,
        referenced=never_referenced,
        delete=lambda location: root.delete(location, report.skipped, dry_run),
    )
    kept += len(candidates) - len(removed)
    whole = kept == 0 and root.drop_checkpoint(pipeline, key, dry_run, removed)
    if whole:
        report.checkpoint_dirs_removed.append(f"{pipeline}/{key}")
    else:
        report.attempts_removed += [f"{pipeline}/{key}/{entry_name(p)}" for p in removed]
    if removed:
        log.info(
            "gc: %s %d attempts of %s/%s",
            "would remove" if dry_run else "removed",
            len(removed),
            pipeline,
            key,
        )


def _epoch(naive_utc: datetime) -> float:
    from datetime import UTC

    return naive_utc.replace(tzinfo=UTC).timestamp()


def trim_committer_table(
    store: CommitterStore,
    *,
    retention: timedelta,
    pipelines: Iterable[str] | None = None,
    dry_run: bool = False,
    clock: Callable[[], datetime] = utcnow,
) -> GcReport:
    """Delete old COMMITTED/ABORTED rows and compact history (see the module docstring)."""
    report = GcReport(dry_run=dry_run)
    cutoff = clock() - retention
    with store.engine.connect() as conn:
        modes = dict(conn.execute(select(pipe.c.name, pipe.c.mode)).all())
    names = sorted(modes if pipelines is None else set(pipelines) & set(modes))
    for name in names:
        _trim_pipeline(store, name, modes[name], cutoff, report, dry_run)
    return report


def _trim_pipeline(
    store: CommitterStore, pipeline: str, mode: str, cutoff: datetime, report: GcReport, dry_run: bool
) -> None:
    # One transaction per pipeline, holding the pipeline row's lock so no
    # checkpoint is registered while the protected set is computed.
    with store._tx() as conn:  # noqa: SLF001 - same package family; the store's write transaction
        conn.execute(select(pipe.c.name).where(pipe.c.name == pipeline).with_for_update())
        committed = ckpt.c.state == S.COMMITTED.value
        protected: set[int] = set()
        latest = conn.execute(
            select(ckpt.c.id).where(ckpt.c.pipeline == pipeline, committed).order_by(ckpt.c.sequence.desc())
        ).first()
        if latest is not None:
            protected.add(latest.id)
        open_sequences = conn.execute(
            select(ckpt.c.sequence).where(
                ckpt.c.pipeline == pipeline,
                ckpt.c.state.notin_([S.COMMITTED.value, S.ABORTED.value]),
            )
        ).scalars()
        for seq in open_sequences:
            before = conn.execute(
                select(ckpt.c.id)
                .where(ckpt.c.pipeline == pipeline, committed, ckpt.c.sequence < seq)
                .order_by(ckpt.c.sequence.desc())
                .limit(1)
            ).first()
            if before is not None:
                protected.add(before.id)
        old_committed = and_(ckpt.c.pipeline == pipeline, committed, ckpt.c.committed_at <= cutoff)
        deletable = old_committed
        if mode == "append":
            # Without offsets the row is the only record that the interval was published.
            deletable = and_(deletable, ckpt.c.end_offsets.is_not(None))
        old_aborted = and_(
            ckpt.c.pipeline == pipeline, ckpt.c.state == S.ABORTED.value, ckpt.c.updated_at <= cutoff
        )
        doomed = [
            i for i in conn.execute(select(ckpt.c.id).where(deletable)).scalars() if i not in protected
        ] + list(conn.execute(select(ckpt.c.id).where(old_aborted)).scalars())
        # Kept old committed rows: compact their history to the COMMITTED transition.
        kept_old = [
            i for i in conn.execute(select(ckpt.c.id).where(old_committed)).scalars() if i not in doomed
        ]
        for chunk in _chunks(kept_old):
            keep_ids = (
                select(func.max(trans.c.id))
                .where(trans.c.checkpoint_id.in_(chunk), trans.c.to_state == S.COMMITTED.value)
                .group_by(trans.c.checkpoint_id)
            )
            keep = set(conn.execute(keep_ids).scalars())
            victims = [
                t
                for t in conn.execute(select(trans.c.id).where(trans.c.checkpoint_id.in_(chunk))).scalars()
                if t not in keep
            ]
            report.transitions_deleted += len(victims)
            if not dry_run:
                for vchunk in _chunks(victims):
                    conn.execute(delete(trans).where(trans.c.id.in_(vchunk)))
        for chunk in _chunks(doomed):
            n = conn.execute(select(func.count()).select_from(trans).where(trans.c.checkpoint_id.in_(chunk)))
            report.transitions_deleted += n.scalar_one()
            report.rows_deleted += len(chunk)
            if not dry_run:
                conn.execute(delete(trans).where(trans.c.checkpoint_id.in_(chunk)))
                conn.execute(delete(vers).where(vers.c.checkpoint_id.in_(chunk)))
                conn.execute(delete(ckpt).where(ckpt.c.id.in_(chunk)))
        if doomed and not dry_run:
            # The summary derives counts from allocated sequence numbers: say how many rows are gone.
            conn.execute(
                update(pipe).where(pipe.c.name == pipeline).values(retired=pipe.c.retired + len(doomed))
            )


def _chunks(ids: list[int]) -> Iterable[list[int]]:
    for i in range(0, len(ids), BATCH):
        yield ids[i : i + BATCH]


def collect_garbage(
    store: CommitterStore,
    layout: StagingLayout | str,
    *,
    retention: timedelta,
    history_retention: timedelta | None = None,
    pipelines: Iterable[str] | None = None,
    dry_run: bool = False,
    clock: Callable[[], datetime] = utcnow,
    stores: StoreOpener | None = None,
) -> GcReport:
    """Staging GC, then (if ``history_retention`` is given) committer-table retention.

    ``stores`` opens object-store staging roots with the caller's storage options
    (:func:`collect_staging`)."""
    pipelines = list(pipelines) if pipelines is not None else None
    report = collect_staging(
        store, layout, retention=retention, pipelines=pipelines, dry_run=dry_run, clock=clock, stores=stores
    )
    if history_retention is not None:
        table = trim_committer_table(
            store, retention=history_retention, pipelines=pipelines, dry_run=dry_run, clock=clock
        )
        report.rows_deleted, report.transitions_deleted = table.rows_deleted, table.transitions_deleted
    return report


#: The longest duration accepted (a century): longer ones mean "forever", and a cutoff that far
#: back (``now - duration``) would leave the range of dates the database and Python can hold.
MAX_DURATION = timedelta(days=36500)


def parse_duration(text: str) -> timedelta:
    """``90s``, ``15m``, ``12h``, ``7d`` or ``2w`` → timedelta.

    Refuses (``ValueError`` naming the value) what is not a duration, a number without a
    unit (is ``1`` a second or a day? a retention read in the wrong unit removes too much),
    and negative, infinite,
    NaN or absurdly large ones (over :data:`MAX_DURATION`): a negative retention would put the
    cutoff in the future and make everything look old enough to remove.
    """
    raw = text
    text = text.strip()
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    hint = "use e.g. 90s, 15m, 12h, 7d or 2w"
    if not text or text[-1] not in units:
        try:
            float(text)
        except ValueError:
            raise ValueError(f"invalid duration {raw!r}: {hint}") from None
        raise ValueError(
            f"invalid duration {raw!r}: give a unit, s (seconds), m (minutes), h (hours), d (days) "
            f"or w (weeks); {hint}"
        )
    try:
        seconds = float(text[:-1]) * units[text[-1]]
    except ValueError:
        raise ValueError(f"invalid duration {raw!r}: {hint}") from None
    if math.isnan(seconds):
        raise ValueError(f"invalid duration {raw!r}: not a number; {hint}")
    if seconds < 0:
        raise ValueError(f"invalid duration {raw!r}: must not be negative; {hint}")
    if not math.isfinite(seconds) or seconds > MAX_DURATION.total_seconds():
        raise ValueError(f"invalid duration {raw!r}: longer than {MAX_DURATION.days}d; {hint}")
    return timedelta(seconds=seconds)
