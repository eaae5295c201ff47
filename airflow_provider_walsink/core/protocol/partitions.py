"""Hive partition directories as Spark names them: the one escape/parse pair every part uses.

A partition directory is ``column=text``. ``text`` is the value as Spark's
``ExternalCatalogUtils.escapePathName`` writes it: the characters a path
cannot hold as they are (``"#%'*/:=?\\{[]^``, DEL and the control characters)
as ``%XX`` (upper-case hex); everything else, spaces and non-ASCII letters
included, as it is. A NULL value, and the empty string (Spark cannot tell the
two apart in a path: an empty directory name is no name), are written
:data:`HIVE_NULL`, and read back as NULL.

* :func:`partition_text`: a value (string, date, timestamp, number, boolean, None)
  as the directory text (the writer's side: the executors' committable writer);
  :func:`partition_string`: the same value as the string it names (a typed table
  column's value compared with a directory's);
* :func:`partition_value`: a directory text as the value it names (``None`` for
  :data:`HIVE_NULL`); the inverse of :func:`escape_path_name` on everything Spark
  writes (Spark's ``unescapePathName``: a ``%`` not followed by two hex digits
  stays as it is);
* :func:`partition_values`: the ``column=text`` pairs of a committable's path as
  ``{column: value}``; :func:`partition_dir`: the inverse.

Targets store the value (Delta ``partitionValues``, an Iceberg identity
partition, an SQL column), never the directory text: ``a%3Ab`` on disk is
``a:b`` in the table, and a replace of a partition compares values, so the
NULL partition is replaced by ``IS NULL``, never by ``= NULL``.
"""

from __future__ import annotations

import datetime as _dt
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

#: Spark's (and Hive's) directory name of a NULL (or empty) partition value.
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"

#: The characters ``ExternalCatalogUtils.escapePathName`` escapes (Spark 4, on a POSIX file system).
_ESCAPED = frozenset(chr(c) for c in range(1, 0x20)) | frozenset("\"#%'*/:=?\\\x7f{[]^")
_HEX = re.compile(r"%([0-9A-Fa-f]{2})")


def escape_path_name(value: str) -> str:
    """``value`` as Spark writes it in a partition directory (``a:b`` -> ``a%3Ab``)."""
    if not any(ch in _ESCAPED for ch in value):
        return value
    return "".join(f"%{ord(ch):02X}" if ch in _ESCAPED else ch for ch in value)


def unescape_path_name(text: str) -> str:
    """The inverse of :func:`escape_path_name` (``%XX`` -> the character; any other ``%`` stays)."""
    if "%" not in text:
        return text
    return _HEX.sub(lambda m: chr(int(m.group(1), 16)), text)


def partition_string(value: Any) -> str | None:
    """A partition value as the string Spark casts it to (``true``, ``2026-01-01``,
    ``2026-01-02 12:30:45.5``: a timestamp's wall time, the fraction without trailing zeros);
    ``None`` for NULL and ``""``. What :func:`partition_value` reads back from the directory."""
    if value is None:
        return None
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, _dt.datetime):
        text = value.strftime("%Y-%m-%d %H:%M:%S")
        if value.microsecond:  # Spark's cast to string: the fraction without trailing zeros
            text += f".{value.microsecond:06d}".rstrip("0")
    elif isinstance(value, _dt.date):
        text = value.isoformat()
    else:
        text = str(value)
    return text or None


def partition_text(value: Any) -> str:
    """A partition value as the directory text Spark writes (None and ``""``: :data:`HIVE_NULL`)."""
    text = partition_string(value)
    return HIVE_NULL if text is None else escape_path_name(text)


def partition_value(text: str) -> str | None:
    """The value a partition directory's text names (``None``: the NULL partition)."""
    return None if text == HIVE_NULL else unescape_path_name(text)


def partition_values(pairs: Iterable[tuple[str, str]]) -> dict[str, str | None]:
    """``column=text`` pairs (a committable's ``partition``) as ``{column: value}``."""
    return {column: partition_value(text) for column, text in pairs}


def partition_dir(columns: Sequence[str], values: Sequence[Any] | Mapping[str, Any]) -> str:
    """The ``col=text/col=text`` directory of a partition's values (the inverse of :func:`partition_values`)."""
    if isinstance(values, Mapping):
        values = [values[c] for c in columns]
    return "/".join(f"{c}={partition_text(v)}" for c, v in zip(columns, values, strict=True))


def parse_partition_dir(directory: str) -> list[tuple[str, str | None]]:
    """A ``col=text/col=text`` directory as ``[(column, value)]``, values unescaped (None: NULL)."""
    pairs = []
    for part in directory.split("/"):
        if part:
            column, _, text = part.partition("=")
            pairs.append((column, partition_value(text)))
    return pairs
