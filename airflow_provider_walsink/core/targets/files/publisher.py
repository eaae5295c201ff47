"""The file target's publisher: plan, check and publish a sealed attempt (see the package docstring)."""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import unquote, urlsplit

from airflow_provider_walsink.core.protocol.checksum import algorithm_of, file_checksum
from airflow_provider_walsink.core.protocol.errors import CommittableError, LayoutError
from airflow_provider_walsink.core.protocol.manifest import Committable, Manifest
from airflow_provider_walsink.core.protocol.modes import WriteMode
from airflow_provider_walsink.core.staging.cleanup import remove_staged_attempts
from airflow_provider_walsink.core.staging.layout import Confiner, StagingLayout, confine
from airflow_provider_walsink.core.staging.object_store import StagingStore
from airflow_provider_walsink.core.targets.base import (
    Publisher,
    PublisherContext,
    PublishOutcome,
    PublishResult,
    TargetCapabilities,
    check_partition_order,
)
from airflow_provider_walsink.core.targets.files import fsops  # called as fsops.X: one place to replace them
from airflow_provider_walsink.core.targets.files.fsops import _DirFds, _suffixes, write_atomic_at
from airflow_provider_walsink.core.targets.files.retract import Retraction
from airflow_provider_walsink.core.targets.files.schema import SchemaChecks
from airflow_provider_walsink.core.targets.files.spec import (
    BOOKKEEPING_DIR,
    MARKER_NAME,
    MAX_SUFFIX,
    SCHEMA_EVOLUTION,
    TargetNotWritableError,
    TargetSchemaError,
    refuse_object_store,
)


class FilePublisher(SchemaChecks, Retraction, Publisher):
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
        relatives = [self._relative(dest) for _c, _staged, dest, _there in plan]
        with _DirFds(self.target_root) as dirs:
            for (_c, staged, dest, there), rel in zip(plan, relatives, strict=True):
                if there:
                    result.already += 1
                    continue
                ctx.fence()
                parent, name = rel.rpartition("/")[::2]
                fsops._move(staged, dirs.open(parent, create=True), name, dest)
                result.published += 1
                ctx.event("publish.after_k")
            if self.mode == "append":
                result.target_files += relatives
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
                fsops._swap_in(
                    dirs.open(pending_parent), pending_name, dirs.open(live_parent, create=True), live_name
                )
                result.partitions_replaced.append(partition)
                ctx.event("publish.after_swap")
            # Where each file now is, relative to the target: a string slice, not relpath per file.
            prefix = pending_rel + "/"
            for rel in relatives:
                result.target_files.append(rel[len(prefix) :] if rel.startswith(prefix) else rel)
            # The old partitions now sit in the pending directory: they leave last.
            ctx.fence()
            dirs.rmtree(self._pending_rel(manifest))

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
