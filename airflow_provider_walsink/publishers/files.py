"""A publisher for partitioned file tables (Parquet, ORC, JSON, CSV, ... as Spark writes them).

``append``: each committable is renamed into its partition under a name
derived from pipeline, checkpoint, attempt and its index in the manifest, so
a re-publish recognises its own files (same name and size: already there).

``overwrite``: each partition the checkpoint covers is assembled complete in
a hidden pending directory and then swapped with the live partition in one
``renameat2(RENAME_EXCHANGE)`` (two renames where the kernel lacks it); the
old files are deleted only after the new ones are in place. A marker file in
the partition names the checkpoint that wrote it, so a re-publish skips it.

Bookkeeping lives under ``<target>/_walsink/``, which Spark and Hive readers
ignore (leading underscore): a *publish journal* per checkpoint names the
attempt being published and the files it creates, so a later attempt of the
same checkpoint can roll them back first.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

from airflow_provider_walsink.faults import crashpoint
from airflow_provider_walsink.protocol.checksum import algorithm_of, file_checksum
from airflow_provider_walsink.protocol.errors import CommittableError, PathEscapeError
from airflow_provider_walsink.protocol.manifest import Committable, Manifest, fsync_dir, write_atomic
from airflow_provider_walsink.protocol.staging import Confiner, StagingLayout, confine

from .base import PublishResult

MODES = ("append", "overwrite")
BOOKKEEPING_DIR = "_walsink"
MARKER_NAME = "_walsink_checkpoint"


class FilePublisher:
    """Publishes committables into ``target_root`` (see the module docstring)."""

    def __init__(
        self,
        target_root: str | os.PathLike[str],
        mode: str,
        *,
        layout: StagingLayout,
        verify_checksums: bool = False,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.target_root = Path(os.path.abspath(target_root))
        self.mode = mode
        self.layout = layout
        self.verify_checksums = verify_checksums
        self._real_prefix: str | None = None

    # ------------------------------------------------------------------ naming

    @staticmethod
    def target_name(manifest: Manifest, index: int, committable: Committable) -> str:
        """Deterministic file name of a committable in the target."""
        suffix = "".join(_suffixes(committable.path)[-2:])
        return f"{manifest.pipeline}-{manifest.checkpoint_key}-a{manifest.attempt}-{index:05d}{suffix}"

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

    def _journal_path(self, manifest: Manifest) -> Path:
        return self._target(f"{BOOKKEEPING_DIR}/journal/{manifest.pipeline}/{manifest.checkpoint_key}.json")

    def _pending_root(self, manifest: Manifest) -> Path:
        return self._target(f"{BOOKKEEPING_DIR}/pending/{manifest.pipeline}/{manifest.checkpoint_key}")

    def _marker(self, manifest: Manifest) -> str:
        return json.dumps(
            {
                "pipeline": manifest.pipeline,
                "checkpoint": manifest.checkpoint_key,
                "attempt": manifest.attempt,
            },
            sort_keys=True,
        )

    # ------------------------------------------------------------------ publish

    def publish(
        self, manifest: Manifest, attempt_dir: Path, *, keep_alive: Callable[[], None] | None = None
    ) -> PublishResult:
        keep_alive = keep_alive or (lambda: None)
        result = PublishResult()
        self.target_root.mkdir(parents=True, exist_ok=True)
        planned = self._plan(manifest, attempt_dir)
        self._roll_back_other_attempts(manifest, planned, result)
        keep_alive()
        if self.mode == "append":
            self._publish_append(manifest, planned, result, keep_alive)
        else:
            self._publish_overwrite(manifest, planned, result, keep_alive)
        return result

    def _plan(self, manifest: Manifest, attempt_dir: Path) -> list[tuple[Committable, str, str, bool]]:
        """Check every committable can be published before anything changes.

        Returns ``(committable, staged path, destination, already there)``, paths as strings.
        Overwrite destinations are in the pending directory; a partition whose
        marker already names this attempt needs nothing.
        """
        done_partitions = set()
        if self.mode == "overwrite":
            if any(not p for p in manifest.replaced_partitions()):
                raise CommittableError(
                    f"overwrite mode needs a partitioned table: checkpoint {manifest.checkpoint_key} "
                    "has committables outside any partition directory"
                )
            done_partitions = {
                p for p in manifest.replaced_partitions() if self._partition_is_ours(manifest, p)
            }
        plan = []
        problems = []
        # One resolver per publish: each directory is resolved once, not once per file.
        # and the lstat each needs comes from the confinement check itself.
        staged_path = self.layout.committable_resolver(attempt_dir)
        target = Confiner(self.target_root, what="target path", list_dirs=True)
        for index, c in enumerate(manifest.committables):
            staged, staged_st = staged_path(c.path)
            name = self.target_name(manifest, index, c)
            if self.mode == "append":
                dest, dest_st = target.resolve(f"{c.partition_path}/{name}" if c.partition_path else name)
            else:
                if c.partition_path in done_partitions:
                    continue
                dest, dest_st = target.resolve(
                    f"{BOOKKEEPING_DIR}/pending/{manifest.pipeline}/{manifest.checkpoint_key}/"
                    f"a{manifest.attempt}/{c.partition_path}/{name}"
                )
            there = self._matches(dest, c, dest_st)
            if there is None:
                problems.append(f"{c.path}: a different file already exists at {dest}")
            elif not there:
                staged_ok = self._matches(staged, c, staged_st)
                if staged_ok is None:
                    problems.append(f"{c.path}: staged file does not match the manifest (size or checksum)")
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

    def _matches(
        self, path: str | Path, c: Committable, st: os.stat_result | None | bool = True
    ) -> bool | None:
        """True: a regular file matching the committable; False: absent; None: something else.

        ``st`` is the path's ``lstat`` when the caller has it (``None``: absent); by default it is taken here.
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
        if (
            self.verify_checksums
            and c.checksum
            and file_checksum(path, algorithm_of(c.checksum)) != c.checksum
        ):
            return None
        return True

    def _publish_append(
        self, manifest: Manifest, plan: list, result: PublishResult, keep_alive: Callable[[], None]
    ) -> None:
        dirs: set[str] = set()
        for i, (_c, staged, dest, there) in enumerate(plan):
            result.target_files.append(self._relative(dest))
            if there:
                result.already += 1
                continue
            parent = os.path.dirname(dest)
            if parent not in dirs:
                os.makedirs(parent, exist_ok=True)
                dirs.add(parent)
            _move(staged, dest)
            result.published += 1
            crashpoint("publish.after_k")
            if i % 256 == 255:
                keep_alive()
        for d in dirs:
            fsync_dir(d)

    def _publish_overwrite(
        self, manifest: Manifest, plan: list, result: PublishResult, keep_alive: Callable[[], None]
    ) -> None:
        pending_attempt = self._pending_root(manifest) / f"a{manifest.attempt}"
        dirs: set[str] = set()
        for _c, staged, dest, there in plan:
            if there:
                result.already += 1
                continue
            parent = os.path.dirname(dest)
            if parent not in dirs:
                os.makedirs(parent, exist_ok=True)
                dirs.add(parent)
            _move(staged, dest)
            result.published += 1
            crashpoint("publish.after_k")
        for partition in manifest.replaced_partitions():
            keep_alive()
            if self._partition_is_ours(manifest, partition):
                continue
            pending = pending_attempt / partition
            pending.mkdir(parents=True, exist_ok=True)
            write_atomic(pending / MARKER_NAME, self._marker(manifest).encode())
            live = self._target(partition)
            live.parent.mkdir(parents=True, exist_ok=True)
            _swap_in(pending, live)
            result.partitions_replaced.append(partition)
            crashpoint("publish.after_swap")
        # Where each file now is, relative to the target: a string slice, not relpath per file.
        prefix = os.fspath(pending_attempt) + "/"
        for _c, _staged, dest, _there in plan:
            rel = dest[len(prefix) :] if dest.startswith(prefix) else os.path.relpath(dest, pending_attempt)
            result.target_files.append(rel)
        # The old partitions now sit in the pending directory: they leave last.
        _rmtree(self._pending_root(manifest))

    def _partition_is_ours(self, manifest: Manifest, partition: str) -> bool:
        try:
            with open(self._target(partition) / MARKER_NAME, encoding="utf-8") as f:
                return f.read() == self._marker(manifest)
        except (FileNotFoundError, NotADirectoryError):
            return False

    # ------------------------------------------------------------------ journal

    def _roll_back_other_attempts(self, manifest: Manifest, plan: list, result: PublishResult) -> None:
        """Write the publish journal; first undo what another attempt of this checkpoint published."""
        journal_path = self._journal_path(manifest)
        try:
            previous = json.loads(journal_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            previous = None
        if previous is not None and previous.get("attempt") != manifest.attempt:
            if self.mode == "append":
                for rel in previous.get("files", []):
                    try:
                        os.unlink(self._target(rel))
                        result.files_rolled_back += 1
                    except (FileNotFoundError, PathEscapeError):
                        pass
            # Overwrite: the partition swap replaces whatever is live; only the
            # other attempt's pending directory is garbage.
            _rmtree(self._pending_root(manifest) / f"a{previous.get('attempt')}")
        if previous is None or previous.get("attempt") != manifest.attempt:
            journal_path.parent.mkdir(parents=True, exist_ok=True)
            files = [self._relative(dest) for _c, _s, dest, _t in plan]
            write_atomic(
                journal_path,
                json.dumps(
                    {
                        "pipeline": manifest.pipeline,
                        "checkpoint": manifest.checkpoint_key,
                        "attempt": manifest.attempt,
                        "mode": self.mode,
                        "files": files if self.mode == "append" else [],
                        "partitions": manifest.replaced_partitions() if self.mode == "overwrite" else [],
                    },
                    sort_keys=True,
                ).encode(),
            )

    def forget(self, manifest: Manifest) -> None:
        """Drop the publish journal once the commit is recorded in the committer table."""
        try:
            os.unlink(self._journal_path(manifest))
        except FileNotFoundError:
            pass


def _suffixes(path: str) -> list[str]:
    """``PurePosixPath(path).suffixes`` by string operations (called once per published file)."""
    name = path.rstrip("/").rpartition("/")[2]
    if name.endswith("."):
        return []
    return ["." + suffix for suffix in name.lstrip(".").split(".")[1:]]


def _move(src: str | Path, dest: str | Path) -> None:
    """Rename ``src`` to ``dest``; a concurrent committer that got there first is fine."""
    try:
        os.rename(src, dest)
    except FileNotFoundError:
        if not os.path.exists(dest):
            raise CommittableError(f"{src} vanished before it could be published to {dest}") from None


def _rmtree(path: Path) -> None:
    if path.is_symlink():
        raise PathEscapeError(f"{path} is a symlink; refusing to delete through it")
    shutil.rmtree(path, ignore_errors=True)


# renameat2(2) with RENAME_EXCHANGE swaps two paths atomically. Python has no
# binding, so it is called through libc; where the kernel or file system lacks
# it, two renames are used (a reader may then briefly miss the partition, but
# never sees old and new rows mixed).
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
try:
    _libc = ctypes.CDLL(None, use_errno=True)
    _renameat2 = _libc.renameat2
    _renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
except (OSError, AttributeError):
    _renameat2 = None


def _exchange(a: Path, b: Path) -> bool:
    if _renameat2 is None:
        return False
    if _renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def _swap_in(pending: Path, live: Path) -> None:
    """Make ``pending`` the live partition; the old live directory ends up at ``pending``."""
    if live.exists() and not live.is_symlink():
        if _exchange(pending, live):
            fsync_dir(str(live.parent))
            return
        trash = pending.with_name(pending.name + ".old")
        _rmtree(trash)
        os.rename(live, trash)
        os.rename(pending, live)
        os.rename(trash, pending)
    elif live.is_symlink():
        raise PathEscapeError(f"live partition {live} is a symlink; refusing to replace it")
    else:
        os.rename(pending, live)
    fsync_dir(str(live.parent))
