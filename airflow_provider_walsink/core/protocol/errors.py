"""Errors of the checkpoint protocol.

Every error a user can meet names the problem in its message; the Airflow
faces turn them into task failures without rewording them.
"""

from __future__ import annotations


class WalsinkError(Exception):
    """Base class of every walsink error."""


class PreflightError(WalsinkError):
    """Something checked before the write phase records anything or starts the job cannot work:
    a bucket that does not exist, a connection without credentials, a catalog that does not
    answer. The message names the connection to fix; a retry would meet the same configuration,
    so the write task fails at once (docs/production.md, "Checked before Spark starts")."""


#: Said by every :class:`PreflightError` of the write task.
NOTHING_DONE = "nothing was recorded and the Spark job was not started"


class InvalidIdentifierError(WalsinkError, ValueError):
    """A pipeline id, checkpoint key or partition value is not allowed."""


class ManifestError(WalsinkError):
    """A manifest cannot be read, parsed or validated."""


class PathEscapeError(WalsinkError):
    """A path named by a manifest resolves outside the root it must stay under."""


class TargetStateError(WalsinkError):
    """What the target records of walsink's commits and what the committer database holds disagree
    (a lost, restored or swapped database, a replaced table): nothing is published until an
    operator restores the one that is wrong; the message names both sides."""


class CommittableError(WalsinkError):
    """A committable is missing, or its size or checksum does not match the manifest."""


class ChecksumMismatchError(CommittableError):
    """A staged committable's bytes no longer match the checksum its sealed manifest records
    (``verify_checksums``): refused before anything is published; the message names each one."""


class NotDurableError(WalsinkError):
    """The checkpoint is not durable yet; the message says what is missing."""


class FencedError(WalsinkError):
    """This committer no longer holds the checkpoint: its lease was taken over,
    released or the checkpoint was aborted (the fencing token moved on).

    Raised before the next side effect; the process must stop touching the
    target and the committer table for this checkpoint.
    """


class LayoutError(WalsinkError):
    """The staged data or the target does not have the layout the pipeline declares
    (partition columns, a symlink where a directory must be); nothing was changed."""


class OrderError(WalsinkError):
    """An ``overwrite`` commit would replace a partition with an older checkpoint's data."""


class SymlinkRefusedError(PathEscapeError, LayoutError):
    """A symlink inside a staging area or a target: walsink never follows one (invariant 11)."""


class SupersedeError(LayoutError):
    """A reprocess asked a target to replace a committed version in a way it cannot; target unchanged."""
