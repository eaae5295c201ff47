"""File-system steps relative to directory descriptors opened with ``O_NOFOLLOW`` (a link swapped
in after planning cannot redirect them): moves, atomic writes, the partition swap
(``renameat2(RENAME_EXCHANGE)``), removal of emptied directories.

The publisher calls :func:`_move` and :func:`_swap_in` as ``fsops._move`` / ``fsops._swap_in``, so a
test (the fault harness, the fencing tests) replaces them here, in one place.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import stat
from pathlib import Path

from airflow_provider_walsink.core.protocol.errors import CommittableError, SymlinkRefusedError


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
