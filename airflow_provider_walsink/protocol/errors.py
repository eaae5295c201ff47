"""Errors of the checkpoint protocol.

Every error a user can meet names the problem in its message; the Airflow
faces turn them into task failures without rewording them.
"""

from __future__ import annotations


class WalsinkError(Exception):
    """Base class of every walsink error."""


class InvalidIdentifierError(WalsinkError, ValueError):
    """A pipeline id, checkpoint key or partition value is not allowed."""


class ManifestError(WalsinkError):
    """A manifest cannot be read, parsed or validated."""


class PathEscapeError(WalsinkError):
    """A path named by a manifest resolves outside the root it must stay under."""


class CommittableError(WalsinkError):
    """A committable is missing, or its size or checksum does not match the manifest."""


class NotDurableError(WalsinkError):
    """The checkpoint is not durable yet; the message says what is missing."""
