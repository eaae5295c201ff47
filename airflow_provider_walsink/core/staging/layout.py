"""Staging layout and path confinement.

Staged data lives at ``<staging_root>/<pipeline>/<checkpoint>/<attempt>/`` with
the manifest beside the data files. Every path that comes from a manifest is
resolved (symlinks included) and must stay under the root it belongs to; no
manifest can make walsink read, move or delete anything outside it.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from airflow_provider_walsink.core.protocol.errors import PathEscapeError, SymlinkRefusedError
from airflow_provider_walsink.core.protocol.identifiers import validate_identifier
from airflow_provider_walsink.core.protocol.manifest import MANIFEST_NAME

_ATTEMPT_ID = re.compile(r"[0-9a-f]{32}")


def _check_relative(relative: str, what: str, root: str | os.PathLike[str]) -> None:
    """The lexical half of :func:`confine`: no NUL, not absolute, no ``..``."""
    if not isinstance(relative, str) or not relative or "\x00" in relative:
        raise PathEscapeError(f"{what} {relative!r} is empty or contains a NUL")
    if os.path.isabs(relative) or relative.startswith("/"):
        raise PathEscapeError(f"{what} {relative!r} is absolute; it must be relative to {os.fspath(root)}")
    if ".." in relative.replace("\\", "/").split("/"):  # list membership: runs once per staged file
        raise PathEscapeError(f"{what} {relative!r} contains '..'")


def confine(root: str | os.PathLike[str], relative: str, *, what: str = "path") -> Path:
    """Resolve ``relative`` under ``root`` and return it, or raise :class:`PathEscapeError`.

    Rejects absolute paths, ``..`` segments and any symlink along the way that
    resolves outside ``root``. The file itself need not exist.
    """
    _check_relative(relative, what, root)
    real_root = Path(os.path.realpath(root))
    resolved = Path(os.path.realpath(real_root / relative))
    if resolved != real_root and real_root not in resolved.parents:
        raise PathEscapeError(f"{what} {relative!r} resolves to {resolved}, outside {real_root}")
    return resolved


def _is_under(path: str, directory: str) -> bool:
    """``path`` is ``directory`` or inside it (both already resolved, absolute, normalised)."""
    return path == directory or path.startswith(directory.rstrip("/") + "/")


class Confiner:
    """:func:`confine` for many paths under one root, resolving each directory once.

    ``Confiner(root)(relative)`` returns what ``confine(root, relative)`` returns
    and raises what it raises, but the real path of each parent directory is
    cached, so a path costs one ``lstat`` of its last component (resolved in
    full only if it is a symlink) instead of one per component. Why: a publish
    of 10,000 files spent most of its time in ``realpath``. Use one per
    operation (one publish, one durability check), never longer: a directory
    replaced by a symlink after it was cached is not noticed.

    With ``list_dirs``, each directory is also listed once, and a name missing
    from its listing is reported absent without an ``lstat``: for destinations
    that mostly do not exist yet, one ``listdir`` per directory replaces one
    failed ``lstat`` per file. Only for paths nothing else creates during
    the operation (a publish's destinations, under its lease).

    With ``follow_symlinks=False`` a symlink anywhere below the root (a
    directory on the way or the path itself) raises :class:`LayoutError`
    instead of being resolved: targets and staging areas never contain
    links, and a link to another partition would make a publish of one
    partition replace or delete the other.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        what: str = "path",
        list_dirs: bool = False,
        follow_symlinks: bool = True,
    ) -> None:
        self.root = root
        self.what = what
        self.follow_symlinks = follow_symlinks
        self.real_root = os.path.realpath(root)
        self._dirs: dict[str, str] = {}
        self._listings: dict[str, frozenset[str]] | None = {} if list_dirs else None

    def __call__(self, relative: str, *, what: str | None = None) -> Path:
        return Path(self.resolve(relative, what=what)[0])

    def resolve(self, relative: str, *, what: str | None = None) -> tuple[str, os.stat_result | None]:
        """The confined path, as a string, and its ``lstat`` (``None`` if nothing is there).

        One system call per path, and no ``Path`` object: this runs once per file of a publish.
        """
        what = what or self.what
        _check_relative(relative, what, self.root)
        parent, _, name = relative.rpartition("/")
        real_parent = self._dirs.get(parent)
        if real_parent is None:
            real_parent = os.path.realpath(os.path.join(self.real_root, parent)) if parent else self.real_root
            if not self.follow_symlinks and real_parent != os.path.normpath(
                os.path.join(self.real_root, parent)
            ):
                raise SymlinkRefusedError(
                    f"{what} {relative!r}: a directory on the way ({parent!r}) is a symlink, which walsink "
                    f"never follows inside {self.real_root}; replace it with a real directory"
                )
            self._dirs[parent] = real_parent
        resolved = os.path.join(real_parent, name) if name not in ("", ".") else real_parent
        st: os.stat_result | None = None
        if resolved == real_parent or self._listed(real_parent, name):
            try:
                st = os.lstat(resolved)
            except (FileNotFoundError, NotADirectoryError):
                st = None
        if st is not None and stat.S_ISLNK(st.st_mode):
            if not self.follow_symlinks:
                raise SymlinkRefusedError(
                    f"{what} {relative!r} is a symlink, which walsink never follows inside {self.real_root}"
                )
            resolved = os.path.realpath(resolved)
            try:
                st = os.lstat(resolved)
            except OSError:
                st = None
        if not _is_under(resolved, self.real_root):
            raise PathEscapeError(f"{what} {relative!r} resolves to {resolved}, outside {self.real_root}")
        return resolved, st

    def _listed(self, real_parent: str, name: str) -> bool:
        """Whether ``name`` may exist in ``real_parent`` (always True without ``list_dirs``)."""
        if self._listings is None:
            return True
        names = self._listings.get(real_parent)
        if names is None:
            try:
                names = frozenset(os.listdir(real_parent))
            except (FileNotFoundError, NotADirectoryError):
                names = frozenset()
            self._listings[real_parent] = names
        return name in names


def staging_path(root: str | os.PathLike[str]) -> str:
    """A staging root as a local path: ``/data/staging`` or ``file:///data/staging``.

    The write phase, the durability check and the commit all open staged files
    through the file system (a local disk or a shared mount); a relative
    ``file:/...`` directory under the working directory must never be made of a
    URI, nor a local directory named ``s3:``.
    """
    text = os.fspath(root)
    if "://" not in text:
        return text
    parts = urlsplit(text)
    if parts.scheme == "file" and parts.netloc in ("", "localhost"):
        # As table libraries write a local location: the raw path, not percent-quoted.
        return text[len(f"file://{parts.netloc}") :]
    raise ValueError(
        f"staging root {text!r} is not a local or mounted path: walsink stages through the file system "
        "(a table on object storage needs its staging root mounted, or a staging_root given as a path; "
        "docs/targets.md)"
    )


@dataclass(frozen=True)
class StagingLayout:
    """Where each checkpoint attempt is staged under one staging root."""

    root: Path

    def __init__(self, root: str | os.PathLike[str]) -> None:
        object.__setattr__(self, "root", Path(os.path.abspath(staging_path(root))))

    def checkpoint_dir(self, pipeline: str, checkpoint_key: str) -> Path:
        validate_identifier(pipeline, "pipeline id")
        validate_identifier(checkpoint_key, "checkpoint key")
        return confine(self.root, f"{pipeline}/{checkpoint_key}", what="checkpoint directory")

    def attempt_dir(
        self, pipeline: str, checkpoint_key: str, attempt: int, attempt_id: str | None = None
    ) -> Path:
        """``<root>/<pipeline>/<key>/attempt-<n>-<attempt id>``: unique across lives of a checkpoint.

        Attempt numbers repeat once retention has trimmed a checkpoint's row and
        the interval is written again; the attempt id never does, so a new life
        never writes into (or deletes) an old life's staging, which a table
        target may still reference. Without ``attempt_id`` (attempts sealed by
        walsink 0.1, and tools that only know the number) the one directory of
        that number is meant.
        """
        if not isinstance(attempt, int) or attempt < 1:
            raise ValueError(f"attempt must be a positive integer, got {attempt!r}")
        base = self.checkpoint_dir(pipeline, checkpoint_key)
        if attempt_id and not attempt_id.startswith("v1-"):
            if not _ATTEMPT_ID.fullmatch(attempt_id):
                raise ValueError(f"attempt id must be 32 hex digits, got {attempt_id!r}")
            return base / f"attempt-{attempt}-{attempt_id}"
        plain = base / f"attempt-{attempt}"
        if attempt_id is None and not plain.exists() and base.is_dir():
            named = [e for e in base.iterdir() if e.name.startswith(f"attempt-{attempt}-")]
            if len(named) == 1:
                return named[0]
        return plain

    def manifest_path(
        self, pipeline: str, checkpoint_key: str, attempt: int, attempt_id: str | None = None
    ) -> Path:
        return self.attempt_dir(pipeline, checkpoint_key, attempt, attempt_id) / MANIFEST_NAME

    def committable_path(self, attempt_dir: Path, relative: str) -> Path:
        """The staged file of a committable, confined to the attempt, never through a symlink."""
        return Path(self.committable_resolver(attempt_dir)(relative)[0])

    def committable_resolver(self, attempt_dir: Path) -> Callable[[str], tuple[str, os.stat_result | None]]:
        """:meth:`committable_path` for the many committables of one attempt (see :class:`Confiner`).

        The returned function gives the path (a string) and its ``lstat`` (``None`` when absent).
        """
        prefix = os.path.relpath(attempt_dir, self.root) + "/"
        # Staged files are never links (invariant 11): a link inside staging is refused, not followed.
        confiner = Confiner(self.root, follow_symlinks=False)
        inside = os.path.realpath(attempt_dir).rstrip("/") + "/"

        def resolve(relative: str) -> tuple[str, os.stat_result | None]:
            path, st = confiner.resolve(prefix + relative, what=f"committable {relative!r}")
            if not path.startswith(inside):
                raise PathEscapeError(f"committable {relative!r} resolves to {path}, outside {inside[:-1]}")
            return path, st

        return resolve

    def remove_attempt(
        self, pipeline: str, checkpoint_key: str, attempt: int, attempt_id: str | None = None
    ) -> bool:
        """Delete one attempt's staging directory (the WAL). True if something was removed."""
        return self._remove(self.attempt_dir(pipeline, checkpoint_key, attempt, attempt_id))

    def remove_checkpoint(self, pipeline: str, checkpoint_key: str) -> bool:
        return self._remove(self.checkpoint_dir(pipeline, checkpoint_key))

    def _remove(self, path: Path) -> bool:
        # The layout only builds paths from validated identifiers, but a symlink
        # planted in place of a directory must not redirect the delete.
        if path.is_symlink():
            raise PathEscapeError(f"staging directory {path} is a symlink; refusing to delete through it")
        if not path.exists():
            return False
        shutil.rmtree(path)
        return True

    def attempts(self, pipeline: str, checkpoint_key: str) -> list[int]:
        """Attempt numbers staged for a checkpoint, in order."""
        return sorted({n for n, _id, _path in self.staged_attempts(pipeline, checkpoint_key)})

    def staged_attempts(self, pipeline: str, checkpoint_key: str) -> list[tuple[int, str | None, Path]]:
        """Every attempt directory of a checkpoint: (number, attempt id or None, path), in order."""
        base = self.checkpoint_dir(pipeline, checkpoint_key)
        if not base.is_dir():
            return []
        found = []
        for entry in base.iterdir():
            named = attempt_of(entry.name)
            if named is not None and entry.is_dir() and not entry.is_symlink():
                found.append((*named, entry))
        return sorted(found, key=lambda t: (t[0], t[1] or ""))


def attempt_of(name: str) -> tuple[int, str | None] | None:
    """``attempt-<n>`` or ``attempt-<n>-<32 hex>`` (:meth:`StagingLayout.attempt_dir`) -> (n, id or
    None); None for any other directory name."""
    prefix, _, rest = name.partition("-")
    number, _, attempt_id = rest.partition("-")
    if prefix != "attempt" or not number.isdigit() or (attempt_id and not _ATTEMPT_ID.fullmatch(attempt_id)):
        return None
    return int(number), attempt_id or None
