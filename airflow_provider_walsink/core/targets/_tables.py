"""What the table targets (:mod:`.iceberg`, :mod:`.delta`) share: the marker rule,
staged-file locations on a local disk or an object store, Parquet footers, the
schema check and the cleanup that never touches a file a table references.

No Airflow import, and no table library either: each table module brings its own.
"""

from __future__ import annotations

import logging
import os
import posixpath
import stat
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from airflow_provider_walsink.core.protocol.errors import (
    CommittableError,
    FencedError,
    LayoutError,
    PathEscapeError,
    SupersedeError,
    WalsinkError,
)
from airflow_provider_walsink.core.protocol.manifest import MANIFEST_NAME, FileStats, Manifest, parse_manifest
from airflow_provider_walsink.core.staging.base import StagingBackend
from airflow_provider_walsink.core.staging.object_store import StagingStore
from airflow_provider_walsink.core.targets.base import PublisherContext, StagedAttempt

log = logging.getLogger(__name__)

#: Directory, inside the table location, where the write phase stages attempts.
#: Leading underscore: Spark, Hive and ``VACUUM`` skip it, so an uncommitted
#: attempt is never visible and never vacuumed away from under a committer.
STAGING_DIR = "_walsink_staging"
#: Footers are read in parallel (object stores: one round trip each).
FOOTER_THREADS = 8
#: Files whose footer is read to confirm a manifest's recorded ``file_schema``
#: (the first and the last committable): a constant cost, whatever the file count.
SCHEMA_SAMPLE = 2


@dataclass(frozen=True)
class StagedFile:
    """What a publisher needs to know of one staged Parquet file besides its manifest entry."""

    #: Its Arrow schema (shared by every file when it comes from the manifest's ``file_schema``).
    schema: Any
    #: Columns stored as Parquet INT96 timestamps.
    int96: tuple[str, ...]
    rows: int
    #: Its column statistics (from the manifest, or from its footer when that was read);
    #: ``None``: unknown, the table gets none for this file.
    stats: FileStats | None = None


class TableCommitConflict(WalsinkError):
    """The table kept changing under every retry of a commit; the message says how often."""


@dataclass(frozen=True)
class CheckpointRef:
    """A checkpoint attempt named without its manifest (an abort may have none to read)."""

    pipeline: str
    checkpoint_key: str
    attempt_id: str = ""


@dataclass(frozen=True)
class TableFenceState:
    """What a table says about one checkpoint: the attempt it holds and the attempts aborted in it."""

    held: str | None
    aborted: frozenset[str] = frozenset()
    #: Attempt ids the table holds or held (older snapshots may reference their files).
    known: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Marker:
    """What the table records about the checkpoint attempt it holds."""

    attempt_id: str
    epoch: int
    snapshot: str | None = None
    #: Attempt ids of this checkpoint the table held before (their files may
    #: still be referenced by older snapshots: cleanup leaves them alone).
    previous: tuple[str, ...] = ()
    #: How many data files the held attempt's commit added (``None``: a marker written
    #: before walsink recorded it). A reprocess checks they are all still live
    #: (:func:`check_retractable`).
    files: int | None = None
    #: The held attempt's source offsets ``(start, end)`` as its manifest had them,
    #: or ``None`` when the marker does not record them (written before they were).
    offsets: tuple[Any, Any] | None = None


def offsets_value(manifest: Manifest) -> dict[str, Any] | None:
    """What a marker records of the attempt's source offsets: the committer table may lose its rows
    (retention), and a reconcile must record the offsets of the attempt the table holds, never guess.

    ``None`` (record nothing) for an attempt without offsets: a marker without them reads as
    "unknown", which for such a pipeline records no offsets either, and the markers a table keeps
    forever stay as small as before.
    """
    if manifest.start_offsets is None and manifest.end_offsets is None:
        return None
    return {"start": manifest.start_offsets, "end": manifest.end_offsets}


def offsets_of(value: Any) -> tuple[Any, Any] | None:
    """``(start, end)`` from :func:`offsets_value`'s record, or ``None`` if it is not one."""
    if not isinstance(value, dict) or "start" not in value or "end" not in value:
        return None
    return value["start"], value["end"]


class HeldByAnotherAttemptError(FencedError):
    """Table fencing: the table already holds another attempt of this checkpoint version.

    ``held`` names it: the committer records that attempt as the commit (the
    table is the source of truth) instead of publishing a second one.
    """

    def __init__(self, message: str, held: str) -> None:
        super().__init__(message)
        self.held = held


class AbortedInTableError(FencedError):
    """The table carries an abort's tombstone for this attempt: it is never published."""


def table_fenced(ctx: PublisherContext) -> bool:
    """The publish runs without a lease (``ctx.fencing == "table"``, ``core/commit/tablefence.py``):
    the table's commit is the only fence."""
    return getattr(ctx, "fencing", "lease") == "table"


def decide(
    marker: Marker | None,
    manifest: Manifest,
    ctx: PublisherContext,
    mode: str = "overwrite",
    aborted: frozenset[str] | set[str] = frozenset(),
) -> bool:
    """Apply the marker rule; True: the table already holds this attempt (publish nothing).

    In both fencing modes an attempt named by an abort's tombstone (``aborted``,
    read from the same table state) is refused first with
    :class:`AbortedInTableError`, unless the table holds it. With table fencing
    (:func:`table_fenced`) the rule is *first publication of a version wins*:
    the table may hold nothing of the checkpoint, our attempt (already
    published) or the attempt ``ctx.supersedes`` names (a reprocess replaces
    exactly that one); any other attempt raises
    :class:`HeldByAnotherAttemptError` naming it, whatever the tokens: a second
    attempt of the same version is never published over the first.
    Otherwise (the lease protocol):

    * our attempt id -> already published, whatever the epochs;
    * another attempt with an epoch >= ours -> :class:`FencedError`: a committer
      holding a newer lease published (a zombie must add nothing);
    * the attempt ``ctx.supersedes`` names, with a lower epoch -> False: a
      reprocess publishes the new version and retracts exactly that committed
      version, in either mode;
    * another attempt with a lower epoch -> False: publish ours and, in
      ``overwrite``, retract it (the interval's partitions are replaced). In
      ``append`` the table cannot tell a crashed older attempt from rows that
      were committed before the committer table was trimmed, so retracting
      could lose committed rows: refused with :class:`CommittableError`,
      nothing written (commit with table fencing, or re-run under a new key;
      an abort is refused while the table holds an attempt of the checkpoint).

    Call it on the table state the commit is based on, in every retry.
    """
    if marker is not None and marker.attempt_id == manifest.attempt_id:
        return True
    if manifest.attempt_id in aborted:
        raise AbortedInTableError(
            f"checkpoint {manifest.pipeline}/{manifest.checkpoint_key}: attempt {manifest.attempt_id} was "
            "aborted (the table carries the abort's tombstone); it is never published, table unchanged"
        )
    if marker is None:
        return False
    if table_fenced(ctx):
        if marker.attempt_id == superseded_attempt(ctx, manifest):
            return False
        raise HeldByAnotherAttemptError(
            f"checkpoint {manifest.pipeline}/{manifest.checkpoint_key}: the table already holds attempt "
            f"{marker.attempt_id} of this version (snapshot {marker.snapshot}); with table fencing the first "
            f"publication of a version wins, so attempt {manifest.attempt_id} is not published",
            marker.attempt_id,
        )
    if marker.epoch >= ctx.epoch:
        raise FencedError(
            f"checkpoint {manifest.pipeline}/{manifest.checkpoint_key}: the table already holds attempt "
            f"{marker.attempt_id} committed under fencing token {marker.epoch} (snapshot {marker.snapshot}); "
            f"this committer's token is {ctx.epoch}, so its attempt {manifest.attempt_id} is not published"
        )
    if marker.attempt_id == superseded_attempt(ctx, manifest):
        return False
    if mode == "append":
        raise CommittableError(
            f"checkpoint {manifest.pipeline}/{manifest.checkpoint_key}: the table already holds attempt "
            f"{marker.attempt_id} of this append checkpoint (snapshot {marker.snapshot}); walsink will not "
            f"retract rows that may have been committed, so attempt {manifest.attempt_id} is not published. "
            "Commit it with fencing='table' (which records the attempt the table holds), or write the "
            "interval under a new checkpoint key (an abort is refused while the table holds an attempt "
            "of it); table left unchanged"
        )
    return False


def superseded_attempt(ctx: PublisherContext, manifest: Manifest) -> str | None:
    """The committed attempt a reprocess replaces (``ctx.supersedes``), or ``None`` for a first version."""
    supersedes = getattr(ctx, "supersedes", None)
    return supersedes if supersedes and supersedes != manifest.attempt_id else None


def refuse_supersede(ctx: PublisherContext, manifest: Manifest, kind: str, mode: str, why: str) -> None:
    """Raise :class:`SupersedeError` if the publish is a reprocess this target cannot do in ``mode``.

    A new version must remove the superseded attempt's rows wherever they are,
    in the same commit; where a target cannot identify them (``why``), refusing
    with the target unchanged is the correct answer: replacing only what the
    new version covers could leave old rows beside new ones.
    """
    supersedes = superseded_attempt(ctx, manifest)
    if supersedes:
        raise SupersedeError(
            f"checkpoint {manifest.pipeline}/{manifest.checkpoint_key}: the {kind} target ({mode}) cannot "
            f"replace committed attempt {supersedes} with a new version ({why}); nothing written. Use "
            "reprocess='skip', or write the interval under a new checkpoint key"
        )


def check_retractable(
    manifest: Manifest,
    superseded: str,
    recorded: int | None,
    live: int,
    target: str,
) -> None:
    """Retraction by identity, one rule for the table targets: a reprocess retracts the
    superseded version's rows by the files its commit added, so all of them must still be live.

    ``recorded`` is the number of data files the superseded version's commit added, as
    the table's marker records it; ``live`` how many of those files (by path, or by the
    table's own record of what that commit added) the table state the new commit is
    based on still holds. Table maintenance (Delta ``OPTIMIZE``, an Iceberg rewrite, a
    ``DELETE``) moves rows into new files that carry no attempt identity: retracting the
    files left would leave those rows beside the new version's (a silent duplicate) or
    retract part of them. So anything but all of them refuses the reprocess before the
    table changes. ``overwrite`` does not need this: it replaces the partitions the
    checkpoint holds whatever files are in them. Safe to repeat; changes nothing.

    Raises:
        SupersedeError: fewer (or other) files than the version added are live, or the
            marker predates the record (nothing tells what the version added).
    """
    if recorded is not None and recorded == live:
        return
    if recorded is None:
        problem = (
            f"the table does not record how many files committed attempt {superseded} added (committed by an "
            "older walsink), so its rows cannot be told apart from rows table maintenance may have rewritten"
        )
    else:
        problem = (
            f"the files of committed attempt {superseded} were rewritten by table maintenance (compaction, "
            f"rewrite or delete): {live} of the {recorded} data files its commit added are still in the table, "
            "and its rows in the rewritten files can no longer be told apart from other rows"
        )
    raise SupersedeError(
        f"checkpoint {manifest.pipeline}/{manifest.checkpoint_key}: the {target} cannot replace the committed "
        f"version with attempt {manifest.attempt_id}: {problem}; retracting only what is left would show old "
        "and new rows together, so nothing was written and the committed version stays visible. To correct "
        "the interval, delete the committed version's rows from the table yourself and write the correction "
        "under a new checkpoint key (or use reprocess='skip'); reprocess before compacting the interval's "
        "files, or use mode 'overwrite', whose reprocess replaces whole partitions"
    )


# --------------------------------------------------------------------------- locations


@dataclass(frozen=True)
class S3Settings:
    """How to reach an S3-compatible store (credentials are never logged or described)."""

    endpoint: str | None = None
    access_key: str | None = None
    secret_key: str | None = None
    session_token: str | None = None
    region: str | None = None

    def filesystem(self, **options: Any) -> Any:
        """A ``pyarrow`` S3 file system; ``options`` (timeouts, a retry strategy) go to it as given."""
        import pyarrow.fs as pafs

        kwargs: dict[str, Any] = dict(options)
        if self.endpoint:
            parts = urlsplit(self.endpoint)
            kwargs["endpoint_override"] = parts.netloc or self.endpoint
            kwargs["scheme"] = parts.scheme or "https"
        if self.access_key:
            kwargs.update(access_key=self.access_key, secret_key=self.secret_key)
            if self.session_token:
                kwargs["session_token"] = self.session_token
        kwargs["region"] = self.region or "us-east-1"
        return pafs.S3FileSystem(**kwargs)


def staged_base(attempt_dir: StagedAttempt | str | os.PathLike[str]) -> str:
    """The attempt's location as a URI (``s3://...``) or an absolute local path."""
    if isinstance(attempt_dir, StagedAttempt):
        return attempt_dir.uri
    text = os.fspath(attempt_dir)
    if "://" in text:
        return text.rstrip("/")
    return os.path.abspath(text)


def staged_locations(
    attempt_dir: StagedAttempt | str | os.PathLike[str], manifest: Manifest, *, uri: bool = False
) -> tuple[str, list[str]]:
    """The attempt's base and each committable's location (``as_uri`` with ``uri``).

    From a :class:`StagedAttempt` every manifest path first passes the store's
    confinement check (``PathEscapeError`` naming it, before anything is read);
    a plain path or URI (tools, tests) is joined as the manifest validated it.
    """
    base = staged_base(attempt_dir)
    if isinstance(attempt_dir, StagedAttempt):
        locations = attempt_dir.committable_uris(c.path for c in manifest.committables)
    else:
        locations = [f"{base}/{c.path}" for c in manifest.committables]
    return base, [as_uri(loc) for loc in locations] if uri else locations


def staging_storage(default: Storage, where: Any) -> Storage:
    """The :class:`Storage` to read staged files with: the staging store's own file system when
    ``where`` (a :class:`StagedAttempt` or a ``StagingStore``) is an object store, so sizes,
    footers and clean-up use the credentials the attempt was staged and checked with; else
    ``default`` (local roots: unchanged, with their symlink refusals)."""
    store = where.store if isinstance(where, StagedAttempt) else where
    if isinstance(store, StagingBackend) and store.layout is None:  # a store with no local layout
        return StoreStorage(store)
    return default


def is_remote(location: str) -> bool:
    return "://" in location and not location.startswith("file://")


def local_path(location: str) -> str:
    return location[len("file://") :] if location.startswith("file://") else location


def as_uri(location: str) -> str:
    """A URI for a table library: ``file:///abs`` for local paths, remote URIs as they are."""
    if "://" in location:
        return location
    return "file://" + os.path.abspath(location)


class Storage:
    """Reads and deletes staged files on a local disk or an S3-compatible store (pyarrow's file systems)."""

    def __init__(self, s3: S3Settings | None = None) -> None:
        self.s3 = s3 or S3Settings()
        self._s3fs: Any = None

    def fs_and_path(self, location: str) -> tuple[Any, str]:
        import pyarrow.fs as pafs

        if is_remote(location):
            parts = urlsplit(location)
            if parts.scheme not in ("s3", "s3a"):
                raise LayoutError(f"staging location {location!r}: only local paths and s3:// are supported")
            if self._s3fs is None:
                self._s3fs = self.s3.filesystem()
            return self._s3fs, f"{parts.netloc}{parts.path}"
        return pafs.LocalFileSystem(), local_path(location)

    def footers(self, files: Sequence[tuple[str, int]]) -> list[Any]:
        """Parquet metadata of each ``(location, expected size)``; raise naming every file that does not match.

        Only footers are read (a few KiB per file), in parallel.
        """
        import pyarrow.parquet as pq

        def one(item: tuple[str, int]) -> Any:
            location, size = item
            fs, path = self.fs_and_path(location)
            linked = None if is_remote(location) else staged_symlink(path)
            if linked:
                return f"{location}: {linked}"
            try:
                info = fs.get_file_info(path)
            except OSError as e:
                return f"{location}: cannot be read ({e})"
            if info.type.name != "File":
                return f"{location}: missing from staging"
            if info.size != size:
                return f"{location}: {info.size} bytes staged, the manifest records {size}"
            try:
                with fs.open_input_file(path) as f:
                    return pq.ParquetFile(f).metadata
            except Exception as e:  # pyarrow raises ArrowInvalid/OSError for a corrupt footer
                return f"{location}: not a readable Parquet file ({e})"

        with ThreadPoolExecutor(max_workers=FOOTER_THREADS) as pool:
            found = list(pool.map(one, files))
        problems = [f for f in found if isinstance(f, str)]
        if problems:
            shown = "; ".join(problems[:5]) + (f" (+{len(problems) - 5} more)" if len(problems) > 5 else "")
            raise CommittableError(f"staged files cannot be published, table left unchanged: {shown}")
        return found

    def check_sizes(self, files: Sequence[tuple[str, int]]) -> None:
        """Raise naming every ``(location, expected size)`` that is missing or has another size.

        One ``stat`` per file (object stores: one HEAD each, in parallel): no file is opened.
        """
        if any(is_remote(location) for location, _ in files):
            size = -(-len(files) // FOOTER_THREADS)
            chunks = [files[i : i + size] for i in range(0, len(files), size)]
            with ThreadPoolExecutor(max_workers=len(chunks)) as pool:
                problems = [p for found in pool.map(self._remote_size_problems, chunks) for p in found]
        else:
            problems = _local_size_problems(files)
        if problems:
            shown = "; ".join(problems[:5]) + (f" (+{len(problems) - 5} more)" if len(problems) > 5 else "")
            raise CommittableError(f"staged files cannot be published, table left unchanged: {shown}")

    def _remote_size_problems(self, chunk: Sequence[tuple[str, int]]) -> list[str]:
        fs, _ = self.fs_and_path(chunk[0][0])
        try:
            infos = fs.get_file_info([self.fs_and_path(location)[1] for location, _ in chunk])
        except OSError as e:
            return [f"{chunk[0][0]} (or another of {len(chunk)} files): cannot be read ({e})"]
        problems = []
        for (location, want), info in zip(chunk, infos, strict=True):
            if info.type.name != "File":
                problems.append(f"{location}: missing from staging")
            elif info.size != want:
                problems.append(f"{location}: {info.size} bytes staged, the manifest records {want}")
        return problems

    def describe(self, manifest: Manifest, locations: Sequence[str]) -> list[StagedFile]:
        """Schema, INT96 columns, row count and column statistics of each staged file; raise if
        any file does not fit.

        With the manifest's ``file_schema`` and every row count recorded (what the
        write job seals), each file gets one ``stat`` (size) and only
        :data:`SCHEMA_SAMPLE` footers are read, to confirm the recorded schema
        (a mismatch raises, table unchanged); the job itself read every footer and
        recorded the schema only because all of them hold it. Column statistics
        are then the manifest's (version 4); if a sampled footer's statistics
        differ from what the manifest records for that file, none are used for the
        attempt (a warning: a file without statistics is read, never wrongly
        skipped). Otherwise every footer is read (older manifests, other writers),
        and the statistics come from those footers.
        """
        from airflow_provider_walsink.core.protocol.file_stats import file_stats_of

        files = [(loc, c.size) for loc, c in zip(locations, manifest.committables, strict=True)]
        recorded = manifest.file_schema
        if recorded is None or any(c.rows is None for c in manifest.committables):
            return [
                StagedFile(
                    meta.schema.to_arrow_schema(),
                    tuple(int96_columns(meta)),
                    meta.num_rows,
                    file_stats_of(meta),
                )
                for meta in self.footers(files)
            ]
        from airflow_provider_walsink.core.protocol.file_schema import arrow_schema, file_schema_of

        schema = arrow_schema(recorded)
        self.check_sizes(files)
        sample = sorted({0, len(files) - 1})[:SCHEMA_SAMPLE] if files else []
        for i, meta in zip(sample, self.footers([files[i] for i in sample]), strict=True):
            found = file_schema_of(meta)
            # Compared as schemas, not as bytes: the job's pyarrow may serialise differently.
            if not arrow_schema(found).equals(schema) or found.int96 != recorded.int96:
                raise CommittableError(
                    f"staged file {manifest.committables[i].path} of {manifest.pipeline}/"
                    f"{manifest.checkpoint_key} has the schema {_columns(arrow_schema(found))}"
                    f"{' (INT96: ' + str(list(found.int96)) + ')' if found.int96 else ''}, but its manifest "
                    f"records {_columns(schema)}"
                    f"{' (INT96: ' + str(list(recorded.int96)) + ')' if recorded.int96 else ''}; "
                    "table left unchanged"
                )
            recorded_stats = manifest.committables[i].stats
            if recorded_stats is not None and file_stats_of(meta) != recorded_stats:
                log.warning(
                    "staged file %s of %s/%s: its footer's column statistics differ from those its manifest "
                    "records; the attempt is published without column statistics",
                    manifest.committables[i].path,
                    manifest.pipeline,
                    manifest.checkpoint_key,
                )
                return [StagedFile(schema, recorded.int96, c.rows) for c in manifest.committables]  # type: ignore[arg-type]
        return [StagedFile(schema, recorded.int96, c.rows, c.stats) for c in manifest.committables]  # type: ignore[arg-type]

    def remove_unreferenced_attempts(
        self,
        checkpoint_location: str,
        manifest: Manifest,
        held: Callable[[str], bool],
        *,
        fence: Callable[[], None] | None = None,
    ) -> list[str]:
        """Delete what a committed checkpoint no longer needs; return what was removed.

        Removes this attempt's manifest file, and every other attempt directory
        of the checkpoint's version (numbered up to this attempt) whose attempt
        id the table does not hold or held. The id comes from the attempt's
        manifest or, once a commit has removed that, from the directory name
        (``attempt-<n>-<attempt id>``): a superseded or retracted attempt is
        still held, because older snapshots reference its files until the
        table's own expire-snapshots / VACUUM runs. An attempt that cannot be
        identified is left for the table's own orphan-file removal.

        Every deletion goes through :func:`~..protocol.cleanup.remove_attempts_fenced`:
        ``fence()`` (the committer row still names this attempt) and ``held(id)``
        are asked immediately before it, so ``held`` must ask the table's
        *current* state (reload it), never a snapshot read before the clean-up
        began. Raises :class:`~..protocol.cleanup.CleanupFencedError` when the row moved on.
        """
        from airflow_provider_walsink.core.faults import crashpoint
        from airflow_provider_walsink.core.staging.cleanup import remove_attempts_fenced
        from airflow_provider_walsink.core.staging.layout import attempt_of

        if is_remote(checkpoint_location):  # through the store, as the committer's clean-up does
            return self._store_of(checkpoint_location, manifest).remove_unreferenced_attempts(
                checkpoint_location, manifest, held, fence=fence
            )
        crashpoint("cleanup.started")
        fs, base = self.fs_and_path(checkpoint_location)
        import pyarrow.fs as pafs

        try:
            entries = fs.get_file_info(pafs.FileSelector(base, allow_not_found=True))
        except OSError as e:
            log.warning("cannot list %s: %s", checkpoint_location, e)
            return []
        attempts: list[tuple[int, str | None, str]] = []
        for entry in entries:
            name = posixpath.basename(entry.path)
            named = attempt_of(name)
            if entry.type.name != "Directory" or named is None:
                continue
            manifest_path = f"{entry.path}/{MANIFEST_NAME}"
            info = fs.get_file_info(manifest_path)
            if info.type.name == "File":
                try:
                    with fs.open_input_stream(manifest_path) as f:
                        attempt_id = parse_manifest(f.read(), source=manifest_path).attempt_id
                except (WalsinkError, OSError) as e:
                    log.warning("leaving %s alone: its manifest cannot be read (%s)", entry.path, e)
                    continue
            else:
                # No manifest: never sealed, or committed once (its commit removed the manifest).
                attempt_id = named[1]
                if attempt_id is None:
                    log.warning("leaving %s alone: no manifest and no attempt id in its name", entry.path)
                    continue
            attempts.append((named[0], attempt_id, entry.path))
        ids = {path: attempt_id for _n, attempt_id, path in attempts}

        def referenced(attempt_id: str | None) -> bool:
            # Our own attempt is referenced too, but only its manifest goes (delete() below).
            return attempt_id != manifest.attempt_id and held(attempt_id or "")

        def delete(path: str) -> bool:
            if ids[path] == manifest.attempt_id:
                manifest_path = f"{path}/{MANIFEST_NAME}"
                if fs.get_file_info(manifest_path).type.name != "File":
                    return False
                fs.delete_file(manifest_path)  # the data files stay: the table references them
                return True
            fs.delete_dir(path)  # not referenced by the table now: nothing needs it
            return True

        removed = remove_attempts_fenced(
            attempts,
            up_to=manifest.attempt,
            fence=fence or (lambda: None),
            referenced=referenced,
            delete=delete,
        )
        return [f"{p}/{MANIFEST_NAME}" if ids[p] == manifest.attempt_id else p for p in removed]

    def _store_of(self, checkpoint_location: str, manifest: Manifest) -> StoreStorage:
        """The staging store of an ``s3://`` checkpoint location, with this storage's S3 settings."""
        self.fs_and_path(checkpoint_location)  # only what this storage reads (LayoutError otherwise)
        suffix = f"/{manifest.pipeline}/{manifest.checkpoint_key}"
        if not checkpoint_location.endswith(suffix):
            raise LayoutError(
                f"{checkpoint_location} is not the location of checkpoint {manifest.pipeline}/"
                f"{manifest.checkpoint_key}; nothing deleted"
            )
        s3 = self.s3
        options = {"access_key": s3.access_key, "secret_key": s3.secret_key,
                   "session_token": s3.session_token, "region": s3.region or "us-east-1"}  # fmt: skip
        if s3.endpoint:  # as S3Settings.filesystem reads it: a URL, or host:port over https
            options |= (
                {"endpoint_url": s3.endpoint}
                if "://" in s3.endpoint
                else {"endpoint_override": s3.endpoint, "scheme": "https"}
            )
        root = checkpoint_location[: -len(suffix)]
        return StoreStorage(StagingStore.open(root, {k: v for k, v in options.items() if v}))


class StoreStorage(Storage):
    """A :class:`Storage` bound to one object-store :class:`StagingStore`: reads and deletes only
    under its root, through its file system (a location elsewhere is a ``LayoutError``)."""

    def __init__(self, store: StagingStore) -> None:
        super().__init__()
        self.store = store
        self._prefix = store.root_uri.rstrip("/") + "/"

    def fs_and_path(self, location: str) -> tuple[Any, str]:
        if location.startswith(self._prefix):
            return self.store.filesystem, f"{self.store.base}/{location[len(self._prefix) :]}"
        if location.rstrip("/") == self._prefix.rstrip("/"):
            return self.store.filesystem, self.store.base
        raise LayoutError(f"{location} is outside the staging root {self.store.root_uri}; not read")

    def remove_unreferenced_attempts(
        self,
        checkpoint_location: str,
        manifest: Manifest,
        held: Callable[[str], bool],
        *,
        fence: Callable[[], None] | None = None,
    ) -> list[str]:
        """:meth:`Storage.remove_unreferenced_attempts` through the store's own methods, whatever the
        service: the attempts its listing names (``gs://``: the service's prefixes, which ``pyarrow``
        does not list), each removed by :meth:`~.StagingStore.remove_attempt` or, for the committed
        attempt, :meth:`~.StagingStore.remove_manifest` (only locations the store builds itself; no
        marker object left behind), with the same fence and ``held`` check before each deletion."""
        from airflow_provider_walsink.core.faults import crashpoint
        from airflow_provider_walsink.core.staging.cleanup import remove_attempts_fenced, store_attempts

        crashpoint("cleanup.started")
        store = self.store
        self.fs_and_path(checkpoint_location)  # LayoutError outside this store's root
        suffix = f"/{manifest.pipeline}/{manifest.checkpoint_key}"
        if not checkpoint_location.endswith(suffix):
            raise LayoutError(
                f"{checkpoint_location} is not the location of checkpoint {manifest.pipeline}/"
                f"{manifest.checkpoint_key}; nothing deleted"
            )
        root = checkpoint_location[: -len(suffix)]
        if root.rstrip("/") != store.root_uri.rstrip("/"):
            # A staging root inside this store's (a Delta table's ``_walsink_staging``): that root,
            # opened with the same options, so the store builds every location it deletes from it.
            store = StagingStore.open(root, store._options)
        try:
            located = store_attempts(store, manifest.pipeline, manifest.checkpoint_key)
        except OSError as e:
            log.warning("cannot list %s: %s", checkpoint_location, e)
            return []
        attempts: list[tuple[int, str | None, str]] = []
        where: dict[str, tuple[Any, str]] = {}
        for loc in located:
            attempt_id: str | None
            try:
                data = store.read_manifest_bytes(loc)
                attempt_id = parse_manifest(data, source=f"{loc.uri}/{MANIFEST_NAME}").attempt_id
            except FileNotFoundError:
                # No manifest: never sealed, or committed once (its commit removed the manifest).
                attempt_id = loc.attempt_id
                if attempt_id is None:
                    log.warning("leaving %s alone: no manifest and no attempt id in its name", loc.uri)
                    continue
            except (WalsinkError, OSError) as e:
                log.warning("leaving %s alone: its manifest cannot be read (%s)", loc.uri, e)
                continue
            attempts.append((loc.attempt, attempt_id, loc.path))
            where[loc.path] = (loc, attempt_id)

        def referenced(attempt_id: str | None) -> bool:
            # Our own attempt is referenced too, but only its manifest goes (delete() below).
            return attempt_id != manifest.attempt_id and held(attempt_id or "")

        def delete(path: str) -> bool:
            loc, attempt_id = where[path]
            try:
                if attempt_id == manifest.attempt_id:
                    return store.remove_manifest(loc)  # the data files stay: the table references them
                return store.remove_attempt(loc)  # not referenced by the table now: nothing needs it
            except PathEscapeError as e:  # a name the store would not build (ambiguous): left alone
                log.warning("clean-up left %s: %s", loc.uri, e)
                return False

        removed = remove_attempts_fenced(
            attempts,
            up_to=manifest.attempt,
            fence=fence or (lambda: None),
            referenced=referenced,
            delete=delete,
        )
        return [f"{p}/{MANIFEST_NAME}" if where[p][1] == manifest.attempt_id else p for p in removed]


def _local_size_problems(files: Sequence[tuple[str, int]]) -> list[str]:
    problems = []
    checked: dict[str, str | None] = {}  # directories already checked for links (files share them)
    for location, want in files:
        path = local_path(location)
        try:
            st = os.lstat(path)  # lstat: the file itself must not be a link
        except FileNotFoundError:
            problems.append(f"{location}: missing from staging")
            continue
        except OSError as e:
            problems.append(f"{location}: cannot be read ({e})")
            continue
        linked = (
            _linked_file(path) if stat.S_ISLNK(st.st_mode) else _linked_dir(os.path.dirname(path), checked)
        )
        if linked:
            problems.append(f"{location}: {linked}")
        elif not stat.S_ISREG(st.st_mode):
            problems.append(f"{location}: missing from staging")
        elif st.st_size != want:
            problems.append(f"{location}: {st.st_size} bytes staged, the manifest records {want}")
    return problems


def staged_symlink(path: str) -> str | None:
    """Why a local staged file may not be read (a symlink on its way from its attempt directory), or ``None``.

    Invariant 6: nothing outside the staging root is read or published because a
    manifest names it. The table references a staged file in place, so a file (or a
    partition directory, or the attempt directory) swapped for a symlink after the
    durability check would make the table reference whatever it points to. Each
    component from the file up to its ``attempt-*`` directory is checked with
    ``lstat``; above that is the deployment's own staging root, which may be a link.
    A missing component is left to the size check (it reports "missing").
    """
    try:
        if stat.S_ISLNK(os.lstat(path).st_mode):
            return _linked_file(path)
    except FileNotFoundError:
        return None
    return _linked_dir(os.path.dirname(path), {})


def _linked_file(path: str) -> str:
    return f"{path} is a symlink (staged files are never followed; refused)"


def _linked_dir(directory: str, checked: dict[str, str | None]) -> str | None:
    """:func:`staged_symlink` for the directories from ``directory`` up to its ``attempt-*`` one, memoised in ``checked``."""
    walked = []
    found: str | None = None
    while directory not in checked:
        walked.append(directory)
        try:
            is_link = stat.S_ISLNK(os.lstat(directory).st_mode)
        except FileNotFoundError:
            break
        if is_link:
            found = f"{directory} is a symlink (staged files are never followed; refused)"
            break
        parent = os.path.dirname(directory)
        if os.path.basename(directory).startswith("attempt-") or parent == directory:
            break
        directory = parent
    else:
        found = checked[directory]
    for d in walked:
        checked[d] = found
    return found


def uri_flags(query: str, allowed: Sequence[str], uri: str) -> dict[str, bool]:
    """Boolean options written in a target URI's query (``?create_table=true``)."""
    from urllib.parse import parse_qsl

    flags = {}
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name not in allowed:
            raise LayoutError(f"target {uri!r}: unknown option {name!r} (known: {', '.join(allowed)})")
        if value.lower() not in ("true", "false", "1", "0", ""):
            raise LayoutError(f"target {uri!r}: option {name}={value!r} must be true or false")
        flags[name] = value.lower() in ("true", "1", "")
    return flags


def checkpoint_location(staging_root: str, manifest: Manifest) -> str:
    return f"{staging_root.rstrip('/')}/{manifest.pipeline}/{manifest.checkpoint_key}"


def layout_root(layout: Any) -> str | None:
    """The staging root of a :class:`StagingLayout`, a root URI, or ``None``."""
    if layout is None:
        return None
    if isinstance(layout, StagingBackend):
        return layout.root_location
    root = getattr(layout, "root", layout)
    return os.fspath(root) if isinstance(root, Path) else str(root)


# --------------------------------------------------------------------------- partitions and schema


def partition_values(manifest: Manifest, relative: str, declared: Sequence[str]) -> dict[str, str]:
    """The Hive-style ``column=value`` pairs of a committable, checked against the declared columns."""
    pairs = dict(partition_of_path(relative))
    if declared and tuple(pairs) != tuple(declared):
        raise LayoutError(
            f"committable {relative!r} of {manifest.pipeline}/{manifest.checkpoint_key} is partitioned by "
            f"{list(pairs) or 'nothing'}, but the table is partitioned by {list(declared)}; nothing was changed"
        )
    return pairs


def partition_of_path(relative: str) -> list[tuple[str, str]]:
    return [tuple(part.split("=", 1)) for part in relative.split("/")[:-1]]  # type: ignore[misc]


def normalise_type(t: Any) -> str:
    """A comparable name of an Arrow type: the string and binary flavours are one, dictionaries their values."""
    import pyarrow as pa

    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        t = pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        t = pa.binary()
    if pa.types.is_large_list(t):
        t = pa.list_(t.value_type)
    return str(t)


def schema_problems(
    table_columns: Mapping[str, Any],
    file_schema: Any,
    from_path: Iterable[str],
    *,
    int96: Iterable[str] = (),
) -> list[str]:
    """Differences between a table's columns and a staged file's (plus the columns its path gives).

    ``table_columns`` and ``file_schema`` hold Arrow types; an empty list means they match.
    """
    path_columns = set(from_path)
    found = {f.name: f.type for f in file_schema}
    problems = []
    missing = [c for c in table_columns if c not in found and c not in path_columns]
    extra = [c for c in found if c not in table_columns]
    if missing:
        problems.append(f"missing columns {missing}")
    if extra:
        problems.append(f"columns not in the table {extra}")
    int96 = set(int96)
    for name, want in table_columns.items():
        if name in found and normalise_type(found[name]) != normalise_type(want):
            hint = (
                " (an INT96 timestamp: make Spark write TIMESTAMP_MICROS with "
                "spark.sql.parquet.outputTimestampType=TIMESTAMP_MICROS)"
                if name in int96
                else ""
            )
            problems.append(
                f"column {name!r} is {normalise_type(found[name])}, the table has {normalise_type(want)}{hint}"
            )
    return problems


def _columns(schema: Any) -> str:
    return "[" + ", ".join(f"{f.name}: {normalise_type(f.type)}" for f in schema) + "]"


def int96_columns(parquet_metadata: Any) -> list[str]:
    schema = parquet_metadata.schema
    return [schema.column(i).path for i in range(len(schema)) if schema.column(i).physical_type == "INT96"]


def call_with_events(ctx: PublisherContext, name: str, action: Callable[[], Any]) -> Any:
    """Fence, mark ``before_<name>``, run ``action``, mark ``after_<name>`` (fault tests crash there)."""
    ctx.fence()
    ctx.event(f"table.before_{name}")
    result = action()
    ctx.event(f"table.after_{name}")
    return result
