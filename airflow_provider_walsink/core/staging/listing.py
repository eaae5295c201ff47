"""What garbage collection sees of a staging root: its pipelines, checkpoints and attempts, their
ages, and the one deletion it may do. One listing per backend (:meth:`~.base.StagingBackend.listing`),
so GC never asks which kind of storage a root is on.

* :class:`LocalListing`: a local or mounted root, directories read with ``lstat`` (a symlink is
  never followed: it is a stray, and never deleted through).
* :class:`ObjectListing`: an object-store root, read by prefix (one level for pipelines and
  checkpoints, one recursive listing per checkpoint for its attempts and ages: an attempt's age
  is its newest object's, a prefix has no time of its own), deleting only through
  :meth:`~.object_store.StagingStore.remove_attempt`.
"""

from __future__ import annotations

import os
import shutil
import stat
import time
from collections.abc import Iterable
from datetime import timedelta
from pathlib import Path
from typing import Any

from airflow_provider_walsink.core.protocol.errors import WalsinkError
from airflow_provider_walsink.core.protocol.identifiers import validate_identifier
from airflow_provider_walsink.core.staging.base import AttemptLocation, Staged, StagingListing
from airflow_provider_walsink.core.staging.layout import StagingLayout, attempt_of


def span(delta: timedelta | float) -> str:
    """A duration as people read it and ``parse_duration`` takes it: ``90s``, ``2h05m``, ``7d``."""
    seconds = max(0, int(delta.total_seconds() if isinstance(delta, timedelta) else delta))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h" if hours else f"{days}d"
    if hours:
        return f"{hours}h{minutes:02d}m" if minutes else f"{hours}h"
    if minutes:
        return f"{minutes}m{seconds:02d}s" if seconds else f"{minutes}m"
    return f"{seconds}s"


def _mtime_age(path: Path) -> str:
    try:
        return span(time.time() - os.lstat(path).st_mtime)
    except OSError:
        return "?"


def _age_ok(path: Path, cutoff_ts: float) -> bool:
    """True when ``path`` (a real directory, not a symlink) was last modified before the cutoff."""
    st = os.lstat(path)
    return stat.S_ISDIR(st.st_mode) and st.st_mtime <= cutoff_ts


def _rmtree(path: Path, skipped: list[str], dry_run: bool) -> bool:
    if os.path.islink(path):
        skipped.append(f"{path} is a symlink; not followed")
        return False
    if not dry_run:
        shutil.rmtree(path)
    return True


def _subdirs(path: Path) -> Iterable[Path]:
    try:
        entries = sorted(os.scandir(path), key=lambda e: e.name)
    except FileNotFoundError:
        return []
    return [Path(e.path) for e in entries if e.is_dir(follow_symlinks=False)]


def entry_name(location: str) -> str:
    """The last segment of a local path or an object-store path."""
    return location.rstrip("/").rsplit("/", 1)[-1]


def _attempt_entries(cdir: Path) -> tuple[list[tuple[int, str | None, Path]], list[str]]:
    """A checkpoint directory's attempt directories (number, id, path) and its other entries' names.

    Only real directories named ``attempt-<n>`` or ``attempt-<n>-<32 hex>`` (n >= 1) are attempts;
    a file, a symlink or any other name is a stray.
    """
    attempts: list[tuple[int, str | None, Path]] = []
    strays: list[str] = []
    try:
        entries = sorted(os.scandir(cdir), key=lambda e: e.name)
    except FileNotFoundError:
        return [], []
    for entry in entries:
        named = attempt_of(entry.name)
        if named is not None and named[0] >= 1 and entry.is_dir(follow_symlinks=False):
            attempts.append((*named, Path(entry.path)))
        else:
            strays.append(entry.name)
    return attempts, strays


class LocalListing(StagingListing):
    """A staging root on a local or mounted file system: directories, ``lstat`` ages, no links."""

    def __init__(self, layout: StagingLayout) -> None:
        self.layout = layout
        self.label = str(layout.root)

    def pipelines(self) -> list[tuple[str, str]]:
        """(name, display) of each real directory directly under the root."""
        return [(p.name, str(p)) for p in _subdirs(self.layout.root)]

    def checkpoints(self, pipeline: str) -> list[tuple[str, str]]:
        return [(c.name, str(c)) for c in _subdirs(self.layout.root / pipeline)]

    def checkpoint(self, pipeline: str, key: str) -> str:
        return str(self.layout.checkpoint_dir(pipeline, key))

    def entries(self, pipeline: str, key: str) -> tuple[list[Staged], list[str]]:
        attempts, strays = _attempt_entries(self.layout.checkpoint_dir(pipeline, key))
        return [(n, i, str(p)) for n, i, p in attempts], strays

    def staged(self, pipeline: str, key: str) -> list[Staged]:
        return [(n, i, str(p)) for n, i, p in self.layout.staged_attempts(pipeline, key)]

    def old(self, location: str, cutoff_ts: float) -> bool:
        return _age_ok(Path(location), cutoff_ts)

    def age(self, location: str) -> str:
        return _mtime_age(Path(location))

    def delete(self, location: str, skipped: list[str], dry_run: bool) -> bool:
        return _rmtree(Path(location), skipped, dry_run)

    def drop_checkpoint(self, pipeline: str, key: str, dry_run: bool, removed: list[str]) -> bool:
        """Remove the emptied checkpoint directory; False if something is (again) in it.

        A dry run removed nothing: True when the directory holds nothing but ``removed``."""
        if dry_run:
            _attempts, strays = self.entries(pipeline, key)
            gone = {entry_name(p) for p in removed}
            return not strays and all(entry_name(p) in gone for _n, _i, p in _attempts)
        try:
            self.layout.checkpoint_dir(pipeline, key).rmdir()
        except FileNotFoundError:
            pass
        except OSError:  # not empty: something new was put there meanwhile
            return False
        return True


class ObjectListing(StagingListing):
    """A staging root on an object store, read through :class:`StagingStore`.

    Listed by prefix: one level at a time for pipelines and checkpoints, one
    recursive listing per checkpoint for its attempts and ages (an attempt's
    age is its newest object's; a prefix has no time of its own). Deletes
    only through :meth:`StagingStore.remove_attempt`, which deletes nothing
    but a location it builds itself from validated names.
    """

    def __init__(self, store: Any) -> None:  # an object-store StagingStore (it imports this module)
        self.store = store
        self.label = store.root_uri.rstrip("/")
        self._trees: dict[tuple[str, str], list[tuple[str, float]]] = {}
        self._locations: dict[str, AttemptLocation] = {}

    def _dirs(self, relative: str) -> list[tuple[str, str]]:
        path = f"{self.store.base}/{relative}" if relative else self.store.base
        shown = f"{self.label}/{relative}/" if relative else f"{self.label}/"
        return sorted((name, shown + name) for name in self.store.child_dirs(path))

    def pipelines(self) -> list[tuple[str, str]]:
        return self._dirs("")

    def checkpoints(self, pipeline: str) -> list[tuple[str, str]]:
        return self._dirs(pipeline)

    def checkpoint(self, pipeline: str, key: str) -> str:
        validate_identifier(pipeline, "pipeline id")
        validate_identifier(key, "checkpoint key")
        return f"{self.store.base}/{pipeline}/{key}"

    def _tree(self, pipeline: str, key: str) -> list[tuple[str, float]]:
        """Every object under the checkpoint: (path relative to it, modification time)."""
        import pyarrow.fs as pafs

        if (pipeline, key) not in self._trees:
            cdir = self.checkpoint(pipeline, key)
            selector = pafs.FileSelector(cdir, recursive=True, allow_not_found=True)
            self._trees[(pipeline, key)] = [
                (i.path[len(cdir) + 1 :], i.mtime.timestamp() if i.mtime else 0.0)
                for i in self.store.filesystem.get_file_info(selector)
                if i.type == pafs.FileType.File and i.path.startswith(cdir + "/")
            ]
        return self._trees[(pipeline, key)]

    def _locate(self, pipeline: str, key: str, name: str, named: tuple[int, str | None]) -> Staged:
        path = f"{self.checkpoint(pipeline, key)}/{name}"
        self._locations[path] = AttemptLocation(
            pipeline, key, named[0], named[1], path, f"{self.label}/{pipeline}/{key}/{name}"
        )
        return (*named, path)

    def entries(self, pipeline: str, key: str) -> tuple[list[Staged], list[str]]:
        attempts: dict[str, Staged] = {}
        strays: set[str] = set()
        for relative, _mtime in self._tree(pipeline, key):
            first, slash, _rest = relative.partition("/")
            named = attempt_of(first) if slash else None  # an object named like an attempt is a stray
            if named is not None and named[0] >= 1:
                attempts.setdefault(first, self._locate(pipeline, key, first, named))
            else:
                strays.add(first)
        return [attempts[n] for n in sorted(attempts)], sorted(strays)

    def staged(self, pipeline: str, key: str) -> list[Staged]:
        attempts, _strays = self.entries(pipeline, key)
        return sorted(attempts, key=lambda t: (t[0], t[1] or ""))

    def _newest(self, location: str) -> float | None:
        relative = location[len(self.store.base) + 1 :]
        pipeline, key, *rest = relative.split("/")
        inside = "/".join(rest)
        times = [
            mtime
            for rel, mtime in self._tree(pipeline, key)
            if not inside or rel == inside or rel.startswith(inside + "/")
        ]
        return max(times) if times else None

    def old(self, location: str, cutoff_ts: float) -> bool:
        newest = self._newest(location)
        return newest is None or newest <= cutoff_ts

    def age(self, location: str) -> str:
        newest = self._newest(location)
        return "?" if newest is None else span(time.time() - newest)

    def delete(self, location: str, skipped: list[str], dry_run: bool) -> bool:
        attempt = self._locations[location]
        if dry_run:
            return True
        try:
            return self.store.remove_attempt(attempt)
        except (WalsinkError, OSError) as exc:  # a refusal (not a location the store builds), a failure
            skipped.append(f"{attempt.uri}: not removed ({exc})")
            return False

    def drop_checkpoint(self, pipeline: str, key: str, dry_run: bool, removed: list[str]) -> bool:
        """A prefix has nothing to remove once empty: whether nothing is (again) under it.

        A dry run removed nothing: True when the prefix holds nothing but ``removed``. Nothing
        removed: False (a prefix holding only empty "directory" marker objects, which another
        tool left, would otherwise be reported removed on every run)."""
        if not removed:
            return False
        if dry_run:
            attempts, strays = self.entries(pipeline, key)
            return not strays and all(p in removed for _n, _i, p in attempts)
        self._trees.pop((pipeline, key), None)
        return not self._tree(pipeline, key)
