"""Can this process stage under a root? Checked before the write phase records anything or starts
the job (:meth:`~.base.StagingBackend.check_writable`), and by the connection form's Test button.

Writability is tried, never inferred: a local root gets a temporary file in it (or in its nearest
existing parent), an object-store root a probe object put and deleted under its prefix with the
store's own credentials. Permission bits say yes to root on a read-only mount; a bucket policy
may allow listing and refuse writes.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from typing import Any

from airflow_provider_walsink.core.protocol.errors import PreflightError

#: Name prefix of a probe file or object; never an attempt, a pipeline or a checkpoint (those
#: are identifiers, which never start with a dot), so nothing else reads it.
PROBE_PREFIX = ".walsink-probe-"


class StagingNotWritableError(PreflightError):
    """A staging root this process cannot stage into (a bucket that does not exist, writes refused);
    the message names the root and what was wrong (and, from the write task, the connection)."""


def local_root_status(root: str) -> tuple[bool, str]:
    """``(ok, message)``: the local root exists and is writable, or its nearest existing parent
    would let it be made. Writability is tried (a temporary file, removed at once)."""
    import tempfile

    path = os.path.abspath(os.path.expanduser(root))
    probe = path
    while not os.path.lexists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        return False, f"Staging root {path}: {probe} is not a directory"
    try:
        fd, name = tempfile.mkstemp(prefix=PROBE_PREFIX, dir=probe)
        os.close(fd)
        os.unlink(name)
    except OSError as exc:
        what = "is not writable" if probe == path else f"cannot be created ({probe} is not writable)"
        return False, f"Staging root {path} {what}: {exc.strerror}"
    if probe != path:
        return True, f"Staging root {path} does not exist yet and can be created"
    return True, f"Staging root {path} exists and is writable"


def probe_object_root(
    filesystem: Any, base: str, root_uri: str, *, delete: Callable[[str], None] | None = None
) -> None:
    """The bucket (container) of ``base`` exists, and one empty probe object can be put under
    ``base`` and deleted again, through ``filesystem`` (a ``pyarrow.fs`` file system carrying the
    root's credentials). ``delete`` removes one object by its path (default: the file system's
    ``delete_file``; pyarrow's S3 one leaves a marker object for the parent). Changes nothing
    that stays.

    Raises:
        StagingNotWritableError: naming the root, the bucket and what the store answered
            (``NoSuchBucket``, ``AccessDenied``...).
    """
    import pyarrow.fs as pafs

    bucket = base.split("/", 1)[0]
    try:
        found = filesystem.get_file_info(bucket).type
    except OSError as exc:
        raise StagingNotWritableError(
            f"staging root {root_uri}: bucket {bucket!r} cannot be reached ({first_line(exc)})"
        ) from None
    if found == pafs.FileType.NotFound:
        raise StagingNotWritableError(
            f"staging root {root_uri}: bucket {bucket!r} does not exist (NoSuchBucket), or these "
            "credentials cannot see it; walsink creates objects under the prefix only, never the bucket"
        )
    key = f"{base.rstrip('/')}/{PROBE_PREFIX}{uuid.uuid4().hex}"
    try:
        with filesystem.open_output_stream(key) as out:
            out.write(b"")
    except OSError as exc:
        raise StagingNotWritableError(
            f"staging root {root_uri}: an object cannot be put under it ({first_line(exc)})"
        ) from None
    try:
        (delete or filesystem.delete_file)(key)
    except Exception as exc:  # noqa: BLE001 - OSError from pyarrow, ClientError from boto3
        raise StagingNotWritableError(
            f"staging root {root_uri}: a probe object was put but cannot be deleted ({first_line(exc)}); "
            "the write phase deletes the attempts a retry replaces: allow deletes under the prefix"
        ) from None


def first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
