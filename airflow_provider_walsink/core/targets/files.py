"""A publisher for partitioned file tables (Parquet, ORC, JSON, CSV, ... as Spark writes them).

``append``: each committable is renamed into its partition under a name that
carries the attempt's globally unique id (``<key>-<attempt id>-<index>``), so
a re-publish recognises its own files by identity, never a same-sized file of
another attempt or of an earlier life of the checkpoint.

``overwrite``: each partition the checkpoint covers is assembled complete in
a hidden pending directory and then swapped with the live partition in one
``renameat2(RENAME_EXCHANGE)`` (two renames where the kernel lacks it); the
old files are deleted only after the new ones are in place. A marker file in
the partition names the pipeline, checkpoint key and attempt id that wrote
it: a re-publish of that attempt skips it, and a commit of an *older*
checkpoint key over it is refused (invariant 10) unless the pipeline allows
it explicitly.

Schema (Parquet): before anything changes, the staged schema (the
manifest's ``file_schema``, else the staged footers) is checked against what
the target holds, recorded in ``_walsink/schema.json`` (else, for a target
written before the record existed, the footer of one of its files). By
default the columns must match by name and type (any order: readers bind by
name); ``schema_evolution`` (a target option) allows more on purpose:
``"union"`` adds or leaves out nullable columns, ``"any"`` also changes a
type. See :func:`schema_changes` and docs/targets.md.

Bookkeeping lives under ``<target>/_walsink/``, which Spark and Hive readers
ignore (leading underscore): a *publish journal* per checkpoint names the
attempt being published and the files it creates, so a later attempt of the
same checkpoint can roll them back first.

Fencing: every side effect (a rename, a swap, a delete, a journal write) is
preceded by ``ctx.fence()``. On a POSIX file system a window remains between
that check and the side effect: a process paused right there for longer than
the lease TTL can still rename once after another committer took over
(docs/guarantees.md). Layout: the target is never followed through a
symlink; directories are opened with ``O_NOFOLLOW`` and renames are made
relative to those descriptors, so a link swapped in after planning cannot
redirect a rename or a delete.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import errno
import json
import logging
import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import unquote, urlsplit

from airflow_provider_walsink.core.protocol.checksum import algorithm_of, file_checksum
from airflow_provider_walsink.core.protocol.errors import (
    CommittableError,
    LayoutError,
    PathEscapeError,
    PreflightError,
    SymlinkRefusedError,
)
from airflow_provider_walsink.core.protocol.manifest import (
    Committable,
    FileSchema,
    Manifest,
    fsync_dir,
    write_atomic,
)
from airflow_provider_walsink.core.protocol.modes import WriteMode
from airflow_provider_walsink.core.staging.cleanup import remove_staged_attempts
from airflow_provider_walsink.core.staging.layout import Confiner, StagingLayout, confine
from airflow_provider_walsink.core.staging.object_store import StagingStore
from airflow_provider_walsink.core.targets._tables import normalise_type
from airflow_provider_walsink.core.targets.base import (
    Publisher,
    PublisherContext,
    PublishOutcome,
    PublishResult,
    TargetCapabilities,
    check_partition_order,
)

log = logging.getLogger(__name__)

BOOKKEEPING_DIR = "_walsink"
MARKER_NAME = "_walsink_checkpoint"
#: What the target holds: the Arrow schema of its data columns, kept by every publish.
SCHEMA_RECORD = "schema.json"
#: ``schema_evolution`` values: what a publish may change of the target's schema on purpose.
SCHEMA_EVOLUTION = ("none", "union", "any")
#: Files tried for a footer when a target has no schema record (written before it existed).
_FOOTER_CANDIDATES = 8


class TargetSchemaError(LayoutError):
    """The staged data's schema does not fit what the target holds; the message names the columns."""


#: A committable's own suffix (``.snappy.parquet``) is kept in its target name up to this length.
MAX_SUFFIX = 24


class TargetNotWritableError(LayoutError, PreflightError):
    """The file target's root cannot take new files here; raised before the write phase runs."""


class ObjectStoreFileTargetError(LayoutError):
    """A file target, or its staging root, on an object store: refused before anything is written.

    The file target's publish is a rename (``append``) or a directory swap
    (``overwrite``) on one POSIX file system; object stores have neither, and
    a copy-then-delete publish would be visible half done to readers and could
    not be fenced. Publishing to object storage is what the table targets are
    for: their commit is one atomic write of table metadata.
    """


#: What to use instead of a file target on an object store (every refusal says it).
OBJECT_STORE_ALTERNATIVE = (
    "publish to object storage with a table target, whose commit is atomic there: Iceberg "
    "(iceberg://<catalog>/<namespace>.<table>) or Delta (delta+s3://<bucket>/<path>); or give the file "
    "target and its staging root as local or mounted paths (docs/targets.md)"
)


def _object_store_uri(value: Any) -> str | None:
    """``value`` as text if it names a place on an object store (``s3://``, ``gs://``...), else None."""
    if not isinstance(value, str | os.PathLike):
        return None
    text = os.fspath(value)
    if "://" in text and urlsplit(text).scheme.lower() not in ("", "file"):
        return text
    return None


def refuse_object_store(target_root: Any = None, staging_root: Any = None) -> None:
    """Raise :class:`ObjectStoreFileTargetError` if the file target or its staging root is on an object store.

    For the pre-flight checks (before any Spark job runs): ``staging_root`` is a
    path or URI, or a staging store/layout (its ``root_uri``, if it has one).
    """
    if (uri := _object_store_uri(target_root)) is not None:
        raise ObjectStoreFileTargetError(
            f"file target {uri!r} is on an object store, where a file target cannot publish atomically "
            f"(it renames files and swaps directories); {OBJECT_STORE_ALTERNATIVE}. Nothing was written"
        )
    root = getattr(staging_root, "root_uri", staging_root)
    if (uri := _object_store_uri(root)) is not None:
        raise ObjectStoreFileTargetError(
            f"staging root {uri!r} is on an object store: a file target publishes by renaming staged files "
            f"into the target, which needs both on one file system; {OBJECT_STORE_ALTERNATIVE}. Nothing was "
            "written"
        )


class FilePublisher(Publisher):
    """Publishes committables into ``target_root`` (see the module docstring)."""

    kind: ClassVar[str] = "file"
    capabilities: ClassVar[TargetCapabilities] = TargetCapabilities(
        atomic=False, needs_rename=True, remembers_commits=False, fenced_by_target=False
    )
    references_staged_files: ClassVar[bool] = False  # files are moved into the target

    def __init__(
        self,
        target_root: str | os.PathLike[str],
        mode: str,
        *,
        layout: StagingLayout,
        verify_checksums: bool = False,
        partition_by: tuple[str, ...] | list[str] = (),
        allow_older_overwrite: bool = False,
        schema_evolution: str = "none",
    ) -> None:
        WriteMode.parse(mode)
        # Before anything else: ``Path("s3://b/t")`` would quietly become a local directory.
        refuse_object_store(target_root, layout)
        if schema_evolution not in SCHEMA_EVOLUTION:
            raise TargetSchemaError(
                f"file target option schema_evolution must be one of {list(SCHEMA_EVOLUTION)}, "
                f"got {schema_evolution!r}"
            )
        self.schema_evolution = schema_evolution
        self.target_root = Path(os.path.abspath(target_root))
        self.mode = mode
        self.layout = layout
        #: The staged committables' checksums are verified by the commit sequence, for every target
        #: (``CheckpointCommitter(verify_checksums=...)``, core/commit/checksums.py). Here it only
        #: re-checks a file found already in the target under this attempt's name: the file target
        #: alone moves committables out of staging, so after a crash those are checked where they are.
        self.verify_checksums = verify_checksums
        self.partition_by = tuple(partition_by)
        self.allow_older_overwrite = allow_older_overwrite
        self._real_prefix: str | None = None

    @classmethod
    def from_uri(cls, uri: str, options: Any) -> FilePublisher:
        """``/data/t`` or ``file:///data/t`` (see :mod:`..registry`)."""
        path = uri
        if not os.path.isabs(uri):
            parts = urlsplit(uri)
            if parts.scheme != "file" or parts.netloc not in ("", "localhost"):
                raise LayoutError(f"file target {uri!r} must be an absolute path or file:///absolute/path")
            path = unquote(parts.path)
        return cls(
            path,
            options.mode,
            layout=options.layout,
            verify_checksums=options.verify_checksums,
            partition_by=tuple(options.partition_by),
            allow_older_overwrite=options.allow_older_overwrite,
            schema_evolution=(options.extra or {}).get("schema_evolution", "none"),
        )

    def describe(self) -> str:
        return f"file://{self.target_root} ({self.mode})"

    def check_writable(self, staging_root: str | os.PathLike[str] | None = None) -> None:
        """Refuse, before any Spark job runs, a target root this process cannot create files in.

        With ``staging_root`` (where the write phase is about to stage), also
        refuse one on an object store (:class:`ObjectStoreFileTargetError`,
        naming the table targets), which the commit could not publish from.

        The commit moves files into the root (creating it and its partitions); a root in a
        read-only directory used to fail only then, after the whole write phase, naming a
        relative partition. Tried with a temporary file in the root (or in the nearest existing
        directory it would be created in), not inferred from permission bits, which say yes
        to root on a read-only mount and no under ACLs that allow it.

        Raises:
            TargetNotWritableError: naming the target root, what is in the way and the fix.
            ObjectStoreFileTargetError: the staging root is on an object store.
        """
        import tempfile

        refuse_object_store(staging_root=staging_root)

        root = str(self.target_root)
        probe = root
        while not os.path.lexists(probe):
            probe = os.path.dirname(probe)
        if not os.path.isdir(probe):
            raise TargetNotWritableError(
                f"file target root {root} cannot be created: {probe} is not a directory; "
                "choose another target path (nothing was written)"
            )
        try:
            fd, name = tempfile.mkstemp(prefix=".walsink-write-test-", dir=probe)
            os.close(fd)
            os.unlink(name)
        except OSError as exc:
            what = "is not writable" if probe == root else f"cannot be created: {probe} is not writable"
            raise TargetNotWritableError(
                f"file target root {root} {what} by this worker (uid {os.geteuid()}): {exc.strerror}; "
                "let the Airflow worker's user create files there, or choose another target "
                "(checked before the write phase: nothing was written)"
            ) from None

    # ------------------------------------------------------------------ naming

    @staticmethod
    def target_name(manifest: Manifest, index: int, committable: Committable) -> str:
        """Name of a committable in the target: unique per attempt, within NAME_MAX for any valid key."""
        suffix = "".join(_suffixes(committable.path)[-2:])
        if len(suffix) > MAX_SUFFIX:
            suffix = ""
        return f"{manifest.checkpoint_key}-{manifest.attempt_id}-{index:05d}{suffix}"

    def _target(self, relative: str) -> Path:
        return confine(self.target_root, relative, what="target path")

    def _relative(self, dest: str | Path) -> str:
        """``dest`` (a confined, resolved path) relative to the target root.

        A string slice: ``os.path.relpath`` per file cost more than the rename it describes.
        """
        path = os.fspath(dest)
        if self._real_prefix is None:
            self._real_prefix = os.path.realpath(self.target_root).rstrip("/") + "/"
        if path.startswith(self._real_prefix):
            return path[len(self._real_prefix) :]
        return os.path.relpath(path, self.target_root)

    def _journal_rel(self, manifest: Manifest) -> str:
        return f"{BOOKKEEPING_DIR}/journal/{manifest.pipeline}/{manifest.checkpoint_key}.json"

    def _pending_rel(self, manifest: Manifest) -> str:
        return f"{BOOKKEEPING_DIR}/pending/{manifest.pipeline}/{manifest.checkpoint_key}"

    def _marker(self, manifest: Manifest) -> dict[str, Any]:
        return {
            "pipeline": manifest.pipeline,
            "checkpoint": manifest.checkpoint_key,
            "attempt": manifest.attempt,
            "attempt_id": manifest.attempt_id,
        }

    # ------------------------------------------------------------------ publish

    def publish(self, manifest: Manifest, attempt_dir: Path, ctx: PublisherContext) -> PublishResult:
        result = PublishResult()
        self.target_root.mkdir(parents=True, exist_ok=True)
        self._check_layout(manifest)
        planned = self._plan(manifest, attempt_dir)
        schema = self._check_schema(manifest, planned)  # raises before anything changes
        self._roll_back_other_attempts(manifest, planned, result, ctx)
        while schema is not None:
            # Before the first file moves, so a concurrent publish of another schema sees it. A
            # target's first record is created only if absent: a publish that lost that race
            # is checked again against the winner's.
            ctx.fence()
            if self._record_schema(*schema):
                break
            schema = self._check_schema(manifest, planned)
        self._publish_files(manifest, planned, result, ctx)
        supersedes = getattr(ctx, "supersedes", None)
        if supersedes and supersedes != manifest.attempt_id:
            result.files_rolled_back += self._retract_superseded(manifest, supersedes, ctx)
        if not result.published and not result.partitions_replaced and not result.files_rolled_back:
            result.outcome = PublishOutcome.ALREADY_PUBLISHED
        return result

    def _check_layout(self, manifest: Manifest) -> None:
        """Partition directories must be exactly the declared columns, before anything changes."""
        declared = self.partition_by or manifest.partition_columns
        if declared and manifest.partition_columns and tuple(manifest.partition_columns) != tuple(declared):
            raise LayoutError(
                f"checkpoint {manifest.pipeline}/{manifest.checkpoint_key}: the job staged partition "
                f"columns {list(manifest.partition_columns)}, the pipeline declares {list(declared)}"
            )
        seen: set[tuple[str, ...]] = set()
        for c in manifest.committables:
            columns = tuple(col for col, _ in c.partition)
            if declared and columns != tuple(declared):
                raise LayoutError(
                    f"checkpoint {manifest.pipeline}/{manifest.checkpoint_key}: committable {c.path!r} is "
                    f"partitioned by {list(columns) or 'nothing'}, the pipeline declares {list(declared)}; "
                    "target left unchanged"
                )
            seen.add(columns)
        for p in manifest.partitions:
            columns = tuple(part.partition("=")[0] for part in p.split("/"))
            if declared and columns != tuple(declared):
                raise LayoutError(
                    f"checkpoint {manifest.pipeline}/{manifest.checkpoint_key}: declared partition {p!r} "
                    f"does not match the partition columns {list(declared)}; target left unchanged"
                )
            seen.add(columns)
        if self.mode == "overwrite" and len(seen) > 1:
            raise LayoutError(
                f"checkpoint {manifest.pipeline}/{manifest.checkpoint_key} mixes partition layouts "
                f"{sorted(list(s) for s in seen)}: an overwrite must replace partitions of one layout "
                "(declare partition_by on the pipeline)"
            )

    def _plan(self, manifest: Manifest, attempt_dir: Path) -> list[tuple[Committable, str, str, bool]]:
        """Check every committable can be published before anything changes.

        Returns ``(committable, staged path, destination, already there)``, paths as strings.
        Overwrite destinations are in the pending directory; a partition whose
        marker already names this attempt needs nothing.
        """
        done_partitions = set()
        target = Confiner(self.target_root, what="target path", list_dirs=True, follow_symlinks=False)
        if self.mode == "overwrite":
            if any(not p for p in manifest.replaced_partitions()):
                raise CommittableError(
                    f"overwrite mode needs a partitioned table: checkpoint {manifest.checkpoint_key} "
                    "has committables outside any partition directory"
                )
            for p in manifest.replaced_partitions():
                target.resolve(p)  # refuses a symlinked partition or parent before anything changes
                marker = self._live_marker(p)
                if marker is not None and marker.get("attempt_id") == manifest.attempt_id:
                    done_partitions.add(p)
                else:
                    self._check_order(manifest, p, marker)
        plan = []
        problems = []
        # One resolver per publish: each directory is resolved once, not once per file,
        # and the lstat each needs comes from the confinement check itself.
        staged_path = self.layout.committable_resolver(attempt_dir)
        for index, c in enumerate(manifest.committables):
            staged, staged_st = staged_path(c.path)
            name = self.target_name(manifest, index, c)
            if self.mode == "append":
                dest, dest_st = target.resolve(f"{c.partition_path}/{name}" if c.partition_path else name)
            else:
                if c.partition_path in done_partitions:
                    continue
                dest, dest_st = target.resolve(
                    f"{self._pending_rel(manifest)}/{manifest.attempt_id}/{c.partition_path}/{name}"
                )
            there = self._matches(dest, c, dest_st, checksum=self.verify_checksums)
            if there is None:
                problems.append(f"{c.path}: a different file already exists at {dest}")
            elif not there:
                # Its checksum was verified before the publish began (the commit sequence, step 3).
                staged_ok = self._matches(staged, c, staged_st, checksum=False)
                if staged_ok is None:
                    problems.append(f"{c.path}: staged file does not match the manifest (size)")
                elif not staged_ok:
                    problems.append(f"{c.path}: missing from staging and not in the target")
            plan.append((c, staged, dest, bool(there)))
        if problems:
            shown = "; ".join(problems[:5]) + (f" (+{len(problems) - 5} more)" if len(problems) > 5 else "")
            raise CommittableError(
                f"checkpoint {manifest.pipeline}/{manifest.checkpoint_key} attempt {manifest.attempt} "
                f"cannot be published, target left unchanged: {shown}"
            )
        return plan

    # ------------------------------------------------------------------ schema

    def _check_schema(self, manifest: Manifest, plan: list) -> tuple[Any, bool] | None:
        """Check the staged schema against the target's; return what to record (``None``: unchanged).

        What to record: the schema, and whether the target had no record yet
        (then it is created only if still absent, :meth:`_record_schema`).

        Parquet only (other formats carry no schema to read cheaply). What the
        target holds is its schema record, or, for a target written before the
        record existed, the footer of one of its Parquet files; a target with
        neither takes the staged schema. Raises :class:`TargetSchemaError`
        naming every column that does not fit (see :func:`schema_changes`).
        """
        if manifest.file_format != "parquet" or not plan:
            return None
        import pyarrow as pa

        staged = self._staged_schema(manifest, plan)
        if staged is None:
            return None
        recorded = self._has_schema_record()
        held = self._held_schema()
        if held is None:
            return staged, not recorded
        changed, added, missing, not_null = schema_changes(held, staged)
        problems = []
        if missing and self.schema_evolution == "none":
            problems.append(f"missing columns {missing}")
        if added and self.schema_evolution == "none":
            problems.append(f"columns not in the target {added}")
        if not_null and self.schema_evolution == "union":
            problems.append(f"new columns {not_null} are not nullable (the target's other rows hold none)")
        if self.schema_evolution != "any":
            problems += [f"column {name!r} is {new}, the target has {old}" for name, old, new in changed]
        if problems:
            hint = (
                "to change the schema on purpose, set the target option schema_evolution="
                + ("'any'" if changed else "'union'")
                + ", docs/targets.md"
            )
            raise TargetSchemaError(
                f"checkpoint {manifest.pipeline}/{manifest.checkpoint_key} does not match file target "
                f"{self.target_root}: {'; '.join(problems)}; target left unchanged ({hint})"
            )
        if not (changed or added):
            return None if recorded else (held, True)
        by_name = {f.name: f for f in staged}
        fields = [by_name.get(f.name, f) for f in held] + [by_name[n] for n in added]
        return pa.schema(fields), not recorded

    def _staged_schema(self, manifest: Manifest, plan: list) -> Any | None:
        """The data columns of the staged files: the manifest's ``file_schema``, else sampled footers.

        ``None``: the sampled files are not readable as Parquet (nothing to check against).
        Files that disagree on a column's type are refused (a reader could not read them together).
        """
        import pyarrow as pa
        import pyarrow.parquet as pq

        from airflow_provider_walsink.core.protocol.file_schema import arrow_schema

        partition_columns = set(manifest.partition_columns) | set(self.partition_by)
        if manifest.file_schema is not None:
            schemas = [arrow_schema(manifest.file_schema)]
        else:
            # No schema sealed (a writer other than the Spark job): a constant sample of footers, the
            # first and the last file, as the table targets confirm a recorded one. A file already
            # moved into the target (a re-publish) is read where it is now.
            sample = [plan[i] for i in sorted({0, len(plan) - 1})]
            try:
                schemas = [pq.read_schema(dest if there else staged) for _c, staged, dest, there in sample]
            except (OSError, pa.ArrowException) as exc:
                log.warning(
                    "checkpoint %s/%s: staged files are not readable as Parquet (%s); schema not checked",
                    manifest.pipeline,
                    manifest.checkpoint_key,
                    exc,
                )
                return None
        merged: dict[str, Any] = {}
        for schema in schemas:
            for f in schema:
                if f.name in partition_columns:
                    continue
                seen = merged.setdefault(f.name, f)
                if normalise_type(seen.type) != normalise_type(f.type):
                    raise TargetSchemaError(
                        f"checkpoint {manifest.pipeline}/{manifest.checkpoint_key}: staged files disagree "
                        f"on column {f.name!r} ({normalise_type(seen.type)} / {normalise_type(f.type)}); "
                        "target left unchanged"
                    )
        return pa.schema(list(merged.values()))

    def _has_schema_record(self) -> bool:
        return os.path.lexists(self.target_root / BOOKKEEPING_DIR / SCHEMA_RECORD)

    def _held_schema(self) -> Any | None:
        """What the target holds: its schema record, else one existing file's footer, else ``None``."""
        from airflow_provider_walsink.core.protocol.file_schema import arrow_schema

        try:
            with _DirFds(self.target_root) as dirs:
                fd = os.open(SCHEMA_RECORD, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dirs.open(BOOKKEEPING_DIR))
                with os.fdopen(fd, encoding="utf-8") as f:
                    record = json.loads(f.read())
        except (FileNotFoundError, NotADirectoryError):
            return self._footer_schema()
        except (OSError, json.JSONDecodeError) as exc:
            raise TargetSchemaError(
                f"schema record {self.target_root}/{BOOKKEEPING_DIR}/{SCHEMA_RECORD} cannot be read ({exc}); "
                "target left unchanged (remove it to take the schema from a data file again)"
            ) from None
        if not isinstance(record, dict) or not isinstance(record.get("arrow"), str):
            raise TargetSchemaError(
                f"schema record {self.target_root}/{BOOKKEEPING_DIR}/{SCHEMA_RECORD} is not a walsink schema "
                "record; target left unchanged"
            )
        return arrow_schema(FileSchema(record["arrow"], ()))

    def _footer_schema(self) -> Any | None:
        """The data columns of the first readable Parquet file found in the target (``None``: no file).

        A walk that stops at the first file: one directory per level, not a
        listing of the target. Hidden and ``_`` names (bookkeeping) are
        skipped, as readers skip them; no link is followed.
        """
        import pyarrow as pa
        import pyarrow.parquet as pq

        tried = 0
        pending = [self.target_root]
        while pending and tried < _FOOTER_CANDIDATES:
            directory = pending.pop()
            try:
                entries = os.scandir(directory)
            except (FileNotFoundError, NotADirectoryError):
                continue
            subdirs = []
            with entries:
                for e in entries:
                    if e.name.startswith(("_", ".")):
                        continue
                    if e.is_dir(follow_symlinks=False):
                        subdirs.append(e.path)
                    elif e.is_file(follow_symlinks=False) and e.name.endswith(".parquet"):
                        tried += 1
                        try:
                            schema = pq.read_schema(e.path)
                        except (OSError, pa.ArrowException):
                            continue  # not readable as Parquet: readers fail on it anyway; try another
                        # Columns the partition directories give are not data columns.
                        in_path = {
                            p.partition("=")[0] for p in Path(e.path).relative_to(self.target_root).parts
                        }
                        return pa.schema([f for f in schema if f.name not in in_path])
            pending.extend(sorted(subdirs, reverse=True))
        return None

    def _record_schema(self, schema: Any, first: bool) -> bool:
        """Write the target's schema record (atomically: readers of it see the old or the new one).

        ``first``: create it only if there is none (``False`` returned: another publish did first).
        """
        import pyarrow as pa

        # The encoding of the manifest's file_schema (protocol.file_schema): base64 of an Arrow IPC message.
        stripped = pa.schema([f.remove_metadata() for f in schema])
        record = {
            "arrow": base64.b64encode(stripped.serialize().to_pybytes()).decode("ascii"),
            "columns": {f.name: normalise_type(f.type) for f in stripped},
        }
        text = json.dumps(record, sort_keys=True)
        with _DirFds(self.target_root) as dirs:
            fd = dirs.open(BOOKKEEPING_DIR, create=True)
            if not first:
                write_atomic_at(fd, SCHEMA_RECORD, text)
                return True
            tmp = f".{SCHEMA_RECORD}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
            write_atomic_at(fd, tmp, text)
            try:
                os.link(tmp, SCHEMA_RECORD, src_dir_fd=fd, dst_dir_fd=fd, follow_symlinks=False)
            except FileExistsError:
                return False
            finally:
                os.unlink(tmp, dir_fd=fd)
            os.fsync(fd)
            return True

    def _check_order(self, manifest: Manifest, partition: str, marker: dict[str, Any] | None) -> None:
        """Invariant 10 (:func:`.base.check_partition_order`), on the partition's marker file."""
        marker = marker or {}
        holder = marker.get("checkpoint")
        check_partition_order(
            manifest,
            partition,
            marker.get("pipeline"),
            holder if isinstance(holder, str) else None,
            allow_older=self.allow_older_overwrite,
            target=f"file://{self.target_root}",
        )

    def _matches(
        self, path: str | Path, c: Committable, st: os.stat_result | None | bool = True, *, checksum: bool
    ) -> bool | None:
        """True: a regular file matching the committable; False: absent; None: something else.

        ``st`` is the path's ``lstat`` when the caller has it (``None``: absent); by default it is taken here.
        ``checksum``: also compare the file's checksum with the manifest's (when it records one).
        """
        if st is True:
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                return False
        if st is None:
            return False
        # One lstat answers "regular file, not a symlink" (isfile + islink would stat twice more).
        if not stat.S_ISREG(st.st_mode) or st.st_size != c.size:
            return None
        if checksum and c.checksum and file_checksum(path, algorithm_of(c.checksum)) != c.checksum:
            return None
        return True

    def _publish_files(
        self, manifest: Manifest, plan: list, result: PublishResult, ctx: PublisherContext
    ) -> None:
        """Move the planned files in: ``append`` where readers see them, ``overwrite`` into the
        pending partitions (``_plan``'s destinations), each then swapped in whole."""
        pending_rel = f"{self._pending_rel(manifest)}/{manifest.attempt_id}"
        with _DirFds(self.target_root) as dirs:
            for _c, staged, dest, there in plan:
                if there:
                    result.already += 1
                    continue
                ctx.fence()
                parent, name = self._relative(dest).rpartition("/")[::2]
                _move(staged, dirs.open(parent, create=True), name, dest)
                result.published += 1
                ctx.event("publish.after_k")
            if self.mode == "append":
                result.target_files += [self._relative(dest) for _c, _staged, dest, _there in plan]
                dirs.fsync_all()
                return
            for partition in manifest.replaced_partitions():
                marker = self._live_marker(partition)
                if marker is not None and marker.get("attempt_id") == manifest.attempt_id:
                    continue
                self._check_order(manifest, partition, marker)  # again: another pipeline run may have won
                ctx.fence()
                pending_fd = dirs.open(f"{pending_rel}/{partition}", create=True)
                write_atomic_at(pending_fd, MARKER_NAME, json.dumps(self._marker(manifest), sort_keys=True))
                live_parent, live_name = partition.rpartition("/")[::2]
                pending_parent, pending_name = f"{pending_rel}/{partition}".rpartition("/")[::2]
                ctx.fence()
                _swap_in(
                    dirs.open(pending_parent), pending_name, dirs.open(live_parent, create=True), live_name
                )
                result.partitions_replaced.append(partition)
                ctx.event("publish.after_swap")
            # Where each file now is, relative to the target: a string slice, not relpath per file.
            prefix = pending_rel + "/"
            for _c, _staged, dest, _there in plan:
                rel = self._relative(dest)
                result.target_files.append(rel[len(prefix) :] if rel.startswith(prefix) else rel)
            # The old partitions now sit in the pending directory: they leave last.
            ctx.fence()
            dirs.rmtree(self._pending_rel(manifest))

    def _retract_superseded(self, manifest: Manifest, superseded: str, ctx: PublisherContext) -> int:
        """Reprocess, second phase: remove the superseded version's files wherever they still are.

        Runs after the new version is in place (``append``: a reader listing in
        between sees both versions; a crash in between is finished by the
        re-run, which repeats this). Only files whose name carries the
        superseded attempt's id, and partition markers naming it, are removed;
        nothing is followed through a symlink. In ``overwrite`` the partition
        swap already removed them from every partition the new version covers;
        this clears partitions it no longer covers.
        """
        prefix = f"{manifest.checkpoint_key}-{superseded}-"
        removed = 0
        with _DirFds(self.target_root) as dirs:
            pending = [""]
            while pending:
                relative = pending.pop()
                fd = dirs.open(relative)
                with os.scandir(fd) as entries:
                    names = [
                        (e.name, e.is_dir(follow_symlinks=False), e.is_file(follow_symlinks=False))
                        for e in entries
                    ]
                for name, is_dir, is_file in names:
                    child = f"{relative}/{name}" if relative else name
                    if is_dir and child != BOOKKEEPING_DIR:
                        pending.append(child)
                    elif is_file and (
                        name.startswith(prefix)
                        or (
                            name == MARKER_NAME
                            and (self._live_marker(relative) or {}).get("attempt_id") == superseded
                        )
                    ):
                        ctx.fence()
                        try:
                            os.unlink(name, dir_fd=fd)
                        except FileNotFoundError:
                            continue
                        removed += name != MARKER_NAME
                        ctx.event("publish.after_retract")
            dirs.fsync_all()
        return removed

    def _live_marker(self, partition: str) -> dict[str, Any] | None:
        """The marker of the live partition, read without following links (None: no marker)."""
        try:
            with _DirFds(self.target_root) as dirs:
                fd = dirs.open(partition)
                mfd = os.open(MARKER_NAME, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=fd)
                with os.fdopen(mfd, encoding="utf-8") as f:
                    marker = json.loads(f.read())
        except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
            return None
        return marker if isinstance(marker, dict) else None

    def published_attempt(self, manifest: Manifest) -> str | None:
        """Overwrite: the attempt id every replaced partition's marker names (None: none or mixed)."""
        if self.mode != "overwrite":
            return None
        ids = {(self._live_marker(p) or {}).get("attempt_id") for p in manifest.replaced_partitions()}
        return ids.pop() if len(ids) == 1 and None not in ids else None

    # ------------------------------------------------------------------ journal

    def _roll_back_other_attempts(
        self, manifest: Manifest, plan: list, result: PublishResult, ctx: PublisherContext
    ) -> None:
        """Write the publish journal; first undo what another attempt of this checkpoint published.

        Files are removed only if their name carries the other attempt's id:
        the journal can never make this delete a file of another attempt.
        """
        journal_path = self._target(self._journal_rel(manifest))
        try:
            previous = json.loads(journal_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            previous = None
        except json.JSONDecodeError as exc:
            raise CommittableError(f"publish journal {journal_path} is not valid JSON ({exc})") from None
        previous_id = previous.get("attempt_id") if isinstance(previous, dict) else None
        if previous is not None and previous_id != manifest.attempt_id:
            ctx.fence()
            if self.mode == "append" and previous_id:
                # Also what an aborted attempt had published, if its abort did not finish.
                self._unlink_journal_files(previous, previous_id, result)
            # Overwrite: the partition swap replaces whatever is live; only the
            # other attempt's pending directory is garbage.
            if previous_id:
                with _DirFds(self.target_root) as dirs:
                    dirs.rmtree(f"{self._pending_rel(manifest)}/{previous_id}")
        if previous is None or previous_id != manifest.attempt_id:
            ctx.fence()
            journal_path.parent.mkdir(parents=True, exist_ok=True)
            files = [self._relative(dest) for _c, _s, dest, _t in plan]
            write_atomic(
                journal_path,
                json.dumps(
                    {
                        "pipeline": manifest.pipeline,
                        "checkpoint": manifest.checkpoint_key,
                        "attempt": manifest.attempt,
                        "attempt_id": manifest.attempt_id,
                        "epoch": ctx.epoch,
                        "mode": self.mode,
                        "files": files if self.mode == "append" else [],
                        "partitions": manifest.replaced_partitions() if self.mode == "overwrite" else [],
                    },
                    sort_keys=True,
                ).encode(),
            )

    def retract_attempt(
        self, pipeline: str, checkpoint_key: str, attempt_id: str, ctx: PublisherContext
    ) -> int:
        """Undo what ``attempt_id`` published of the checkpoint (an abort: it will never commit).

        Acts only if the publish journal names ``attempt_id``: a journal that
        names another attempt means a later publish already rolled this one
        back, or this one never started publishing. ``append``: the journal's
        files whose names carry the attempt id are removed. ``overwrite``:
        each partition whose live marker names the attempt is swapped back
        with the partition it replaced (kept in the attempt's pending
        directory), or moved out where there was none; then the attempt's
        pending directory is deleted. The journal stays (a later publish of
        the checkpoint repeats this harmlessly; ``finish`` removes it).
        ``ctx.fence()`` precedes every change. Returns the number of data
        files removed from the target. Repeating it is safe.
        """
        journal_path = self._target(f"{BOOKKEEPING_DIR}/journal/{pipeline}/{checkpoint_key}.json")
        try:
            journal = json.loads(journal_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return 0
        except json.JSONDecodeError as exc:
            raise CommittableError(f"publish journal {journal_path} is not valid JSON ({exc})") from None
        if not isinstance(journal, dict) or journal.get("attempt_id") != attempt_id:
            return 0
        removed = 0
        if journal.get("mode") == "append":
            result = PublishResult()
            ctx.fence()
            self._unlink_journal_files(journal, attempt_id, result)
            removed = result.files_rolled_back
        pending_rel = f"{BOOKKEEPING_DIR}/pending/{pipeline}/{checkpoint_key}/{attempt_id}"
        with _DirFds(self.target_root) as dirs:
            for partition in journal.get("partitions") or []:
                if not isinstance(partition, str) or not partition:
                    continue
                self._target(partition)  # confined: a journal entry cannot point outside the target
                if (self._live_marker(partition) or {}).get("attempt_id") != attempt_id:
                    continue  # not swapped in (or replaced since): the live partition is not this attempt's
                removed += sum(
                    1
                    for n in os.listdir(self._target(partition))
                    if n != MARKER_NAME and not n.startswith(".")
                )
                live_parent, live_name = partition.rpartition("/")[::2]
                pending_parent, pending_name = f"{pending_rel}/{partition}".rpartition("/")[::2]
                pending_fd = dirs.open(pending_parent, create=True)
                ctx.fence()
                try:
                    os.stat(pending_name, dir_fd=pending_fd, follow_symlinks=False)
                    had_old = True
                except FileNotFoundError:
                    had_old = False
                if had_old:  # the partition this attempt replaced: swap it back in
                    _swap_in(pending_fd, pending_name, dirs.open(live_parent), live_name)
                else:  # there was none: move this attempt's partition out of sight
                    os.rename(
                        live_name, pending_name, src_dir_fd=dirs.open(live_parent), dst_dir_fd=pending_fd
                    )
                    os.fsync(pending_fd)
                ctx.event("abort.after_swap_back")
            for partition in journal.get("partitions") or []:
                if isinstance(partition, str) and partition:
                    self._remove_own_pending(dirs, f"{pending_rel}/{partition}", attempt_id, ctx)
            _remove_empty_dirs(dirs, pending_rel)
        return removed

    def _remove_own_pending(
        self, dirs: _DirFds, relative: str, attempt_id: str, ctx: PublisherContext
    ) -> None:
        """Delete a pending partition of ``attempt_id`` only if it holds that attempt's files alone.

        A racing publish may swap a live partition (another checkpoint's committed
        rows) into this very name at any moment, so the directory is first renamed
        aside (after which no swap can reach it) and only then identified: by its
        marker naming the attempt, or, before the marker was written, by every
        file name carrying the attempt id. Anything else is renamed back and
        reported (:class:`LayoutError`): the rollback never deletes another
        checkpoint's data.
        """
        parent, _, name = relative.rpartition("/")
        try:
            parent_fd = dirs.open(parent)
        except FileNotFoundError:
            return
        aside = f".{name}.retract-{attempt_id}"
        ctx.fence()
        try:
            os.rename(name, aside, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
        except FileNotFoundError:
            aside_there = True
            try:
                os.stat(aside, dir_fd=parent_fd, follow_symlinks=False)
            except FileNotFoundError:
                aside_there = False
            if not aside_there:
                return  # nothing pending (an earlier run of this rollback finished it)
        moved = f"{parent}/{aside}" if parent else aside
        if self._only_attempt(dirs, moved, attempt_id):
            dirs.rmtree(moved)
            return
        os.rename(aside, name, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
        raise LayoutError(
            f"pending partition {relative} under {self.target_root} holds data that is not attempt "
            f"{attempt_id}'s (a partition another publish swapped out); the rollback left it in place. "
            "Check which checkpoint it belongs to before removing it"
        )

    def _only_attempt(self, dirs: _DirFds, relative: str, attempt_id: str) -> bool:
        """The directory holds ``attempt_id``'s partition: its marker names it, or no marker and
        every data file's name carries the id."""
        fd = dirs.open(relative)
        try:
            mfd = os.open(MARKER_NAME, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=fd)
        except FileNotFoundError:
            mfd = None
        if mfd is not None:
            with os.fdopen(mfd, encoding="utf-8") as f:
                try:
                    marker = json.loads(f.read())
                except json.JSONDecodeError:
                    return False
            return isinstance(marker, dict) and marker.get("attempt_id") == attempt_id
        with os.scandir(fd) as entries:
            for entry in entries:
                if entry.name.startswith("."):
                    continue  # a temporary file of an interrupted marker write
                if entry.is_dir(follow_symlinks=False):
                    if not self._only_attempt(dirs, f"{relative}/{entry.name}", attempt_id):
                        return False
                elif f"-{attempt_id}-" not in entry.name:
                    return False
        return True

    def _unlink_journal_files(self, journal: dict[str, Any], attempt_id: str, result: PublishResult) -> None:
        """Remove the journal's files whose names carry ``attempt_id`` (never another attempt's)."""
        for rel in journal.get("files", []):
            if not isinstance(rel, str) or f"-{attempt_id}-" not in rel.rpartition("/")[2]:
                continue
            with contextlib.suppress(FileNotFoundError, PathEscapeError):
                os.unlink(confine(self.target_root, rel, what="journal entry"))
                result.files_rolled_back += 1

    def finish(
        self, manifest: Manifest, layout: StagingStore, *, fence: Callable[[], None] | None = None
    ) -> None:
        """After COMMITTED: drop the publish journal, then the version's staged attempts.

        Fenced (:mod:`~..protocol.cleanup`): ``fence()`` is asked before the
        journal goes and before each attempt directory; the journal goes only
        while it names this attempt (a new version's publish owns it
        otherwise), and attempts numbered above this one (a reprocess, a new
        run) stay.
        """
        fence = fence or (lambda: None)
        fence()
        journal_path = self._target(self._journal_rel(manifest))
        try:
            journal = json.loads(journal_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            journal = None
        except json.JSONDecodeError:
            journal = {}  # unreadable: ours to drop only if nothing else claims it; leave it
        if isinstance(journal, dict) and journal.get("attempt_id") == manifest.attempt_id:
            fence()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(journal_path)
        remove_staged_attempts(
            layout, manifest.pipeline, manifest.checkpoint_key, up_to=manifest.attempt, fence=fence
        )

    def forget(self, manifest: Manifest) -> None:
        """Drop the publish journal only (kept for callers of the 0.1 API)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._target(self._journal_rel(manifest)))


def schema_changes(
    held: Any, staged: Any
) -> tuple[list[tuple[str, str, str]], list[str], list[str], list[str]]:
    """How ``staged`` differs from ``held`` (Arrow schemas), by column name: order never matters.

    Returns ``(changed, added, missing, added_not_null)``: columns whose type
    differs as ``(name, held type, staged type)``, columns only ``staged`` has,
    columns only ``held`` has, and the added ones that are not nullable.
    Why: readers bind Parquet columns by name (pyarrow datasets, DuckDB), so
    another order is safe; a changed type breaks them (pyarrow refuses the
    dataset, DuckDB casts silently: ``"12.50"`` read as 13); an added or missing
    column is read right only by readers that union the files' schemas by
    name (DuckDB ``union_by_name``, ``pyarrow.unify_schemas``).
    """
    held_types = {f.name: f.type for f in held}
    staged_names = set(staged.names)
    changed = [
        (f.name, normalise_type(held_types[f.name]), normalise_type(f.type))
        for f in staged
        if f.name in held_types and normalise_type(held_types[f.name]) != normalise_type(f.type)
    ]
    added = [f.name for f in staged if f.name not in held_types]
    missing = [name for name in held.names if name not in staged_names]
    not_null = [f.name for f in staged if f.name not in held_types and not f.nullable]
    return changed, added, missing, not_null


def _suffixes(path: str) -> list[str]:
    """``PurePosixPath(path).suffixes`` by string operations (called once per published file)."""
    name = path.rstrip("/").rpartition("/")[2]
    if name.endswith("."):
        return []
    return ["." + suffix for suffix in name.lstrip(".").split(".")[1:]]


class _DirFds:
    """Directories below a root opened component by component with ``O_NOFOLLOW``.

    Renames and deletes are made relative to these descriptors, so a symlink
    put in place of a directory after planning cannot redirect them: opening
    through it fails (``ELOOP``/``ENOTDIR``) and the publish stops with
    :class:`SymlinkRefusedError`.
    """

    _FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW

    def __init__(self, root: Path) -> None:
        self.root = root
        self._fds: dict[str, int] = {}

    def __enter__(self) -> _DirFds:
        self._fds[""] = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        return self

    def __exit__(self, *exc: object) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def open(self, relative: str, *, create: bool = False) -> int:
        fd = self._fds.get(relative)
        if fd is not None:
            return fd
        parent, _, name = relative.rpartition("/")
        parent_fd = self.open(parent, create=create) if relative else self._fds[""]
        if create:
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, dir_fd=parent_fd)
        try:
            fd = os.open(name, self._FLAGS, dir_fd=parent_fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise SymlinkRefusedError(
                    f"target path {relative!r} under {self.root} is a symlink or not a directory; walsink "
                    "never follows links inside a target"
                ) from None
            raise
        self._fds[relative] = fd
        return fd

    def fsync_all(self) -> None:
        for relative, fd in self._fds.items():
            if relative:
                os.fsync(fd)

    def rmtree(self, relative: str) -> None:
        """Delete a directory tree below the root without following any link (``shutil.rmtree`` with a dir fd)."""
        parent, _, name = relative.rpartition("/")
        try:
            parent_fd = self.open(parent)
        except FileNotFoundError:
            return
        try:
            st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(st.st_mode):
            raise SymlinkRefusedError(f"{self.root / relative} is a symlink; refusing to delete through it")
        # shutil.rmtree's fd-based implementation never follows links.
        shutil.rmtree(name, dir_fd=parent_fd, ignore_errors=True)
        for key in [k for k in self._fds if k == relative or k.startswith(relative + "/")]:
            os.close(self._fds.pop(key))


def _remove_empty_dirs(dirs: _DirFds, relative: str) -> None:
    """Remove ``relative`` and the directories below it that are empty (never a file)."""
    try:
        fd = dirs.open(relative)
    except (FileNotFoundError, SymlinkRefusedError):
        return
    with os.scandir(fd) as entries:
        children = [e.name for e in entries if e.is_dir(follow_symlinks=False)]
    for child in children:
        _remove_empty_dirs(dirs, f"{relative}/{child}")
    parent, _, name = relative.rpartition("/")
    for key in [k for k in dirs._fds if k == relative or k.startswith(relative + "/")]:
        os.close(dirs._fds.pop(key))
    with contextlib.suppress(OSError):  # not empty: something that is not the attempt's stays
        os.rmdir(name, dir_fd=dirs.open(parent))


def write_atomic_at(dir_fd: int, name: str, text: str) -> None:
    """:func:`write_atomic` relative to a directory descriptor (temp, fsync, rename, fsync dir)."""
    tmp = f".{name}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644, dir_fd=dir_fd)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    os.fsync(dir_fd)


def _move(src: str, dest_dir_fd: int, name: str, dest: str) -> None:
    """Rename ``src`` into a directory descriptor; a concurrent committer that got there first is fine."""
    try:
        os.rename(src, name, dst_dir_fd=dest_dir_fd)
    except FileNotFoundError:
        try:
            os.stat(name, dir_fd=dest_dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            raise CommittableError(f"{src} vanished before it could be published to {dest}") from None


# renameat2(2) with RENAME_EXCHANGE swaps two paths atomically. Python has no
# binding, so it is called through libc; where the kernel or file system lacks
# it, two renames are used (a reader may then briefly miss the partition, but
# never sees old and new rows mixed).
_RENAME_EXCHANGE = 2
try:
    _libc = ctypes.CDLL(None, use_errno=True)
    _renameat2 = _libc.renameat2
    _renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
except (OSError, AttributeError):
    _renameat2 = None


def _exchange(a_fd: int, a: str, b_fd: int, b: str) -> bool:
    if _renameat2 is None:
        return False
    if _renameat2(a_fd, os.fsencode(a), b_fd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), a, None, b)


def _swap_in(pending_fd: int, pending: str, live_fd: int, live: str) -> None:
    """Make ``pending`` the live partition; the old live directory ends up at ``pending``."""
    try:
        st = os.stat(live, dir_fd=live_fd, follow_symlinks=False)
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISLNK(st.st_mode):
        raise SymlinkRefusedError(f"live partition {live!r} is a symlink; refusing to replace it")
    if st is None:
        os.rename(pending, live, src_dir_fd=pending_fd, dst_dir_fd=live_fd)
    elif not _exchange(pending_fd, pending, live_fd, live):
        trash = pending + ".old"
        shutil.rmtree(trash, dir_fd=pending_fd, ignore_errors=True)
        os.rename(live, trash, src_dir_fd=live_fd, dst_dir_fd=pending_fd)
        os.rename(pending, live, src_dir_fd=pending_fd, dst_dir_fd=live_fd)
        os.rename(trash, pending, src_dir_fd=pending_fd, dst_dir_fd=pending_fd)
    os.fsync(live_fd)
    fsync_dir_fd = pending_fd
    os.fsync(fsync_dir_fd)


__all__ = ["BOOKKEEPING_DIR", "MARKER_NAME", "FilePublisher", "fsync_dir"]
