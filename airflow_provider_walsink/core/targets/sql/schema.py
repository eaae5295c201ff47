"""The SQL target's names and types: what of the staged data a table can take.

Identifiers (schema, table, columns; the column names come from the staged
Parquet) must be plain names before the dialect quotes them. A new table's
column types come from the Parquet schema (:func:`sql_type_for`). An existing
table must accept every staged column (:func:`check_schema`), judged by type
family, not exact type: a reflected column rarely has the type walsink would
create (MySQL's BOOLEAN is TINYINT(1)), and a table made by hand still loads.

The target's errors are defined here, the module every SQL module imports
(no import cycle); :mod:`.sql` re-exports them, their public home.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from typing import Any

import pyarrow as pa
import sqlalchemy as sa
from sqlalchemy.dialects import mysql as mysql_types
from sqlalchemy.sql import sqltypes

from airflow_provider_walsink.core.protocol.errors import LayoutError, WalsinkError

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


class SqlTargetError(WalsinkError):
    """The SQL target cannot publish this checkpoint as asked; the message says why. Nothing was written."""


class SchemaMismatchError(SqlTargetError, LayoutError):
    """The staged Parquet does not fit the existing target table; the message names the columns."""


def validate_sql_identifier(value: object, what: str) -> str:
    """Return ``value`` if it is a plain SQL identifier (letters, digits, ``_``; 1-63 characters)."""
    if not isinstance(value, str) or not _IDENTIFIER.fullmatch(value):
        raise SqlTargetError(
            f"invalid {what} {value!r}: use 1-63 letters, digits and '_', starting with a letter or '_'"
        )
    return value


#: Collations that compare exactly: MySQL/MariaDB compare strings case-insensitively
#: by default (``Sales`` = ``sales``); PostgreSQL and SQLite compare text exactly.
EXACT_COLLATION = "utf8mb4_bin"


def exact_string(length: int | None = None) -> sa.types.TypeEngine:
    """A string type that compares exactly on every backend: key columns walsink creates use it.

    ``None``: unbounded text (LONGTEXT on MySQL/MariaDB, which cannot be in a key but is compared).
    """
    if length is None:
        return sa.Text().with_variant(
            mysql_types.LONGTEXT(charset="utf8mb4", collation=EXACT_COLLATION), "mysql", "mariadb"
        )
    return sa.String(length).with_variant(
        mysql_types.VARCHAR(length, charset="utf8mb4", collation=EXACT_COLLATION), "mysql", "mariadb"
    )


def is_exact_collation(collation: str | None) -> bool:
    """Whether a MySQL/MariaDB column collation compares exactly (``None``: a binary column)."""
    return collation is None or collation == "binary" or collation.endswith("_bin")


def inexact_columns(conn: Any, table: str, schema: str | None, columns: list[str]) -> list[tuple[str, str]]:
    """MySQL/MariaDB: the ``columns`` of ``table`` whose collation compares case-insensitively.

    Returns ``(column, collation)`` pairs; empty when all compare exactly.
    """
    rows = conn.execute(
        sa.text(
            "SELECT COLUMN_NAME, COLLATION_NAME FROM information_schema.COLUMNS "
            "WHERE TABLE_SCHEMA = COALESCE(:schema, DATABASE()) AND TABLE_NAME = :table"
        ),
        {"schema": schema, "table": table},
    ).all()
    wanted = {c.lower() for c in columns}
    return [
        (str(name), str(collation))
        for name, collation in rows
        if str(name).lower() in wanted and not is_exact_collation(collation)
    ]


def sql_type_for(field: pa.Field, *, key: bool = False) -> sa.types.TypeEngine:
    """The column type a new table gets for a staged Parquet column (``key``: it names rows, compared exactly)."""
    t = field.type
    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_boolean(t):
        return sa.Boolean()
    if pa.types.is_int8(t) or pa.types.is_int16(t) or pa.types.is_uint8(t):
        return sa.SmallInteger()
    if pa.types.is_int32(t) or pa.types.is_uint16(t):
        return sa.Integer()
    if pa.types.is_int64(t) or pa.types.is_uint32(t):
        return sa.BigInteger()
    if pa.types.is_uint64(t):
        return sa.Numeric(20, 0)
    if pa.types.is_float16(t) or pa.types.is_float32(t):
        return sa.Float(precision=24)
    if pa.types.is_float64(t):
        return sa.Double()
    if pa.types.is_decimal(t):
        return sa.Numeric(t.precision, t.scale)
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        if key:
            return exact_string()
        return sa.Text().with_variant(mysql_types.LONGTEXT(), "mysql", "mariadb")
    if pa.types.is_date(t):
        return sa.Date()
    if pa.types.is_timestamp(t):
        return sa.DateTime(timezone=t.tz is not None).with_variant(
            mysql_types.DATETIME(fsp=6), "mysql", "mariadb"
        )
    raise SchemaMismatchError(
        f"column {field.name!r} has Parquet type {field.type}, which the sql target cannot load "
        "(booleans, integers, floats, decimals, strings, dates and timestamps can)"
    )


def _arrow_family(t: pa.DataType) -> str:
    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_integer(t):
        return "integer"
    if pa.types.is_floating(t):
        return "float"
    if pa.types.is_decimal(t):
        return "decimal"
    if pa.types.is_date(t):
        return "date"
    if pa.types.is_timestamp(t):
        return "timestamp"
    return "string"


#: SQL type class → the Parquet families a column of it accepts (first match wins: Float before Numeric).
_ACCEPTS: tuple[tuple[type, frozenset[str]], ...] = (
    (sqltypes.Boolean, frozenset({"boolean"})),
    (sqltypes.Integer, frozenset({"integer", "boolean"})),  # MySQL's BOOLEAN is TINYINT(1)
    (sqltypes.Float, frozenset({"float", "integer", "decimal"})),
    (sqltypes.Numeric, frozenset({"integer", "decimal", "float"})),
    (sqltypes.String, frozenset({"string"})),
    (sqltypes.DateTime, frozenset({"timestamp", "date"})),
    (sqltypes.Date, frozenset({"date"})),
)


def _accepts(sql_type: sa.types.TypeEngine) -> frozenset[str]:
    for cls, families in _ACCEPTS:
        if isinstance(sql_type, cls):
            return families
    return frozenset()


def check_schema(
    schema: pa.Schema,
    partition_columns: Sequence[str],
    reflected: list[dict[str, Any]],
    *,
    mysql: bool,
    target_name: str,
    null_partitions: Collection[str] = (),
) -> None:
    """Raise, naming every column, unless the existing table (``reflected``) accepts the staged data:
    the data columns ``schema`` and the ``partition_columns`` read from the staged paths (a load plan's);
    ``null_partitions``: the partition columns the data holds NULL in (the NULL partition)."""
    # MySQL column names are case-insensitive.
    fold = (lambda s: s.lower()) if mysql else (lambda s: s)
    by_name = {fold(c["name"]): c for c in reflected}
    problems = []
    staged = {fold(n) for n in [*schema.names, *partition_columns]}
    for f in schema:
        col = by_name.get(fold(f.name))
        if col is None:
            problems.append(f"column {f.name!r} ({f.type}) is not in the table")
        elif _arrow_family(f.type) not in _accepts(col["type"]):
            problems.append(
                f"column {f.name!r} is {f.type} in the staged Parquet but {col['type']} in the table"
            )
    for name in partition_columns:
        col = by_name.get(fold(name))
        if col is None:
            problems.append(f"partition column {name!r} is not in the table")
        elif not _accepts(col["type"]) - {"boolean"}:
            problems.append(
                f"partition column {name!r} is {col['type']} in the table, which cannot hold its text"
            )
        elif name in null_partitions and not col.get("nullable", True):
            problems.append(
                f"partition column {name!r} is NOT NULL in the table, but the checkpoint holds its NULL "
                "partition (__HIVE_DEFAULT_PARTITION__: Spark's directory for a NULL or empty value); "
                f"make the column nullable (ALTER TABLE {target_name} ALTER/MODIFY {name} ... NULL)"
            )
    for c in reflected:
        if (
            fold(c["name"]) not in staged
            and not c.get("nullable", True)
            and c.get("default") is None
            and c.get("autoincrement") is not True
        ):
            problems.append(
                f"table column {c['name']!r} is NOT NULL without a default and not in the staged data"
            )
    if problems:
        raise SchemaMismatchError(
            f"target table {target_name} does not match the staged data, nothing written: "
            + "; ".join(problems)
        )
