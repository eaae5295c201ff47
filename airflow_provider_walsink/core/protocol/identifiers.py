"""Validation of the names that become path segments and SQL values.

Pipeline ids and checkpoint keys end up in staging paths, target file names
and committer-table rows. They are bound as SQL parameters everywhere, but as
path segments they must be harmless, so they are restricted to a small
alphabet rather than escaped: a rejected name is easier to reason about than
an escaped one.
"""

from __future__ import annotations

import re

from airflow_provider_walsink.core.protocol.errors import InvalidIdentifierError

_IDENTIFIER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.=+-]{0,127}")
# Partition values come from the data: a directory's text as Spark writes it
# (core/protocol/partitions.py), so any character but a separator, a NUL or
# another control character (Spark writes those as %XX), and "%" only as %XX.
# The directory is always "column=text": the text alone is never a path segment.
_PARTITION_VALUE = re.compile(r"(?:[^\x00-\x1f\x7f/\\%]|%[0-9A-Fa-f]{2}){1,255}")
_PARTITION_COLUMN = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


def validate_identifier(value: object, what: str) -> str:
    """Return ``value`` if it is a valid pipeline id or checkpoint key, else raise.

    Allowed: 1-128 characters of ``A-Z a-z 0-9 _ . = + -``, starting with a
    letter or digit, and no ``..``.
    """
    if not isinstance(value, str):
        raise InvalidIdentifierError(f"{what} must be a string, got {type(value).__name__}")
    if not _IDENTIFIER.fullmatch(value) or ".." in value:
        raise InvalidIdentifierError(
            f"invalid {what} {value!r}: use 1-128 characters of letters, digits and "
            "'_.=+-', starting with a letter or digit, without '..'"
        )
    return value


def validate_partition(column: object, value: object) -> tuple[str, str]:
    """Validate one ``column=text`` pair of a Hive-style partition path (``text`` as Spark escapes it)."""
    if not isinstance(column, str) or not _PARTITION_COLUMN.fullmatch(column):
        raise InvalidIdentifierError(f"invalid partition column {column!r}")
    if not isinstance(value, str) or not _PARTITION_VALUE.fullmatch(value):
        raise InvalidIdentifierError(f"invalid value {value!r} for partition column {column!r}")
    return column, value
