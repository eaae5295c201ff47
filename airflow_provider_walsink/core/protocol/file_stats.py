"""A staged Parquet file's column statistics as a manifest records them (:class:`~.manifest.FileStats`).

The writer has each file's footer in hand (Spark's writer: the driver reads
it for the row count; the executors' writer: pyarrow hands it back when the
file closes), so the statistics cost no extra read. They are what Iceberg's
``DataFile`` metrics and Delta's add-action ``stats`` hold: per top-level
column the null count and, where bounds are well defined, a lower and an
upper bound over every row group. A table target publishes them so readers
skip files on non-partition columns (docs/targets.md, "Column statistics").

What gets bounds, and what does not (the null count is kept for every
top-level primitive column):

* integers, booleans, dates (``YYYY-MM-DD``), strings and timestamps with a
  time zone (UTC-adjusted; ISO-8601 with microseconds and ``Z``): bounds.
* strings longer than :data:`STRING_PREFIX_CHARS` characters: truncated as
  Iceberg truncates them (``truncate(n)``): the lower bound is the prefix,
  the upper bound the prefix with its last character incremented (the next
  code point, surrogates skipped; dropped when no character can be
  incremented), so both still bound every value of the file.
* floating point: no bounds. NaN is ordered differently by Parquet writers
  (left out of min/max), by Spark (greater than everything) and by IEEE
  comparisons (unordered), and -0.0/+0.0 compare equal but order apart, so a
  bound can exclude rows a reader's predicate matches.
* decimals: no bounds (Delta's stats JSON carries them as JSON numbers, which
  readers may parse as doubles: a rounded bound can exclude a row).
* timestamps without a time zone (``timestamp_ntz``), INT96 timestamps,
  binary, fixed-size binary, nested columns (structs, lists, maps): no bounds
  (no agreed textual form across readers, or no total order, or not a
  top-level column).

A column whose footer lacks min/max in some row group that holds a non-null
value gets no bounds; one whose footer lacks a null count gets none.

pyarrow is imported only when a function is called: the rest of the protocol
does not need it.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

from airflow_provider_walsink.core.protocol.manifest import FileStats

#: Strings longer than this many characters are truncated (Iceberg's rule; 32 is Delta's
#: default ``dataSkippingStringPrefixLength``).
STRING_PREFIX_CHARS = 32
_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)
_MAX_CODE_POINT = 0x10FFFF
_UNIT_MICROS = {"s": 1_000_000, "ms": 1_000, "us": 1, "ns": None}


def truncate_lower(value: str, length: int = STRING_PREFIX_CHARS) -> str:
    """Iceberg's lower bound of a string: its first ``length`` characters."""
    return value[:length]


def truncate_upper(value: str, length: int = STRING_PREFIX_CHARS) -> str | None:
    """Iceberg's upper bound of a string: the prefix with its last incrementable character
    incremented (greater than every string with that prefix), or ``None`` if there is none.

    Characters are code points, and code-point order is the UTF-8 byte order Parquet and the
    table readers compare strings in.
    """
    if len(value) <= length:
        return value
    prefix = value[:length]
    for i in range(len(prefix) - 1, -1, -1):
        code = ord(prefix[i]) + 1
        if 0xD800 <= code <= 0xDFFF:  # surrogates are not characters of a UTF-8 string
            code = 0xE000
        if code <= _MAX_CODE_POINT:
            return prefix[:i] + chr(code)
    return None


def bound_kind(arrow_type: Any) -> str | None:
    """How a column of this Arrow type is bounded (module docstring), or ``None``: no bounds."""
    import pyarrow as pa

    t = pa.types
    if t.is_integer(arrow_type):
        return "int"
    if t.is_boolean(arrow_type):
        return "bool"
    if t.is_date32(arrow_type) or t.is_date64(arrow_type):
        return "date"
    if t.is_string(arrow_type) or t.is_large_string(arrow_type):
        return "string"
    if t.is_timestamp(arrow_type) and arrow_type.tz is not None:
        return "timestamp"
    return None


def _timestamp_text(raw: int, unit: str, *, upper: bool) -> str | None:
    """ISO-8601 UTC with microseconds; nanoseconds round outwards (down for a lower bound, up for an upper)."""
    scale = _UNIT_MICROS[unit]
    if scale is None:
        micros = -((-raw) // 1000) if upper else raw // 1000
    else:
        micros = raw * scale
    try:
        value = _EPOCH + _dt.timedelta(microseconds=micros)
    except OverflowError:
        return None
    return value.isoformat(timespec="microseconds").replace("+00:00", "Z")


def _bound(kind: str, stats: Any, arrow_type: Any, *, upper: bool) -> Any:
    """One row group's min (``upper=False``) or max as the manifest records it, or ``None``."""
    if kind == "timestamp":
        return _timestamp_text(int(stats.max_raw if upper else stats.min_raw), arrow_type.unit, upper=upper)
    value = stats.max if upper else stats.min
    if kind == "date":
        return value.isoformat() if isinstance(value, _dt.date) else None
    if kind == "string":
        return value if isinstance(value, str) else None  # bytes: not valid UTF-8
    if kind == "bool":
        return bool(value)
    return int(value)


def file_stats_of(parquet_metadata: Any) -> FileStats:
    """The :class:`FileStats` of one Parquet file, from its footer (``pyarrow.parquet.FileMetaData``).

    Over all row groups: per top-level primitive column its null count and, for the
    types listed in the module docstring, its bounds (strings truncated).
    """
    arrow = parquet_metadata.schema.to_arrow_schema()
    parquet_schema = parquet_metadata.schema
    top_level = set(arrow.names)
    columns: list[tuple[int, str, str | None, Any]] = []
    for i in range(len(parquet_schema)):
        column = parquet_schema.column(i)
        name = column.path
        if name not in top_level or column.max_repetition_level != 0:
            continue  # a field inside a struct, list or map
        arrow_type = arrow.field(name).type
        kind = None if column.physical_type == "INT96" else bound_kind(arrow_type)
        columns.append((i, name, kind, arrow_type))
    nulls: dict[str, int] = {}
    lower: dict[str, Any] = {}
    upper: dict[str, Any] = {}
    for i, name, kind, arrow_type in columns:
        null_count: int | None = 0
        low: Any = None
        high: Any = None
        bounded = kind is not None
        for g in range(parquet_metadata.num_row_groups):
            chunk = parquet_metadata.row_group(g).column(i)
            stats = chunk.statistics
            if stats is None or not stats.has_null_count:
                null_count = None
            elif null_count is not None:
                null_count += int(stats.null_count)
            if not bounded:
                continue
            if stats is not None and stats.has_null_count and stats.null_count == chunk.num_values:
                continue  # only nulls in this row group: it bounds nothing
            if stats is None or not stats.has_min_max:
                bounded = False
                continue
            assert kind is not None
            g_low = _bound(kind, stats, arrow_type, upper=False)
            g_high = _bound(kind, stats, arrow_type, upper=True)
            if g_low is None or g_high is None:
                bounded = False
                continue
            low = g_low if low is None or g_low < low else low
            high = g_high if high is None or g_high > high else high
        if null_count is not None:
            nulls[name] = null_count
        if bounded and low is not None:
            if kind == "string":
                low, high = truncate_lower(low), truncate_upper(high)
            lower[name] = low
            if high is not None:
                upper[name] = high
    return FileStats.of(nulls=nulls, lower=lower, upper=upper)
