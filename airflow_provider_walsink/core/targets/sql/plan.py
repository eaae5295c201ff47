"""The SQL target's load plan: what one publish loads, read from the attempt's staging.

Everything is checked here, before the target changes: each committable is
staged with the size its manifest records, all are partitioned alike, the
files agree on one schema, and every column name and type is one the target
can load. In ``replace`` by key, the plan also holds the key values that name
the interval (:func:`replace_values`), which the publish deletes and its
marker row records.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_walsink.core.protocol.errors import CommittableError, LayoutError
from airflow_provider_walsink.core.protocol.manifest import Manifest
from airflow_provider_walsink.core.protocol.partitions import parse_partition_dir, partition_values
from airflow_provider_walsink.core.targets.sql.schema import (
    SchemaMismatchError,
    SqlTargetError,
    sql_type_for,
    validate_sql_identifier,
)


@dataclass
class LoadPlan:
    """What one publish loads, all checked before the target changes."""

    files: list[tuple[str, dict[str, str | None]]]  # (staged path, partition column → value; None: NULL)
    schema: pa.Schema  # the staged data columns (without partition columns)
    partition_columns: list[str]
    rows: int
    replace_values: list[tuple[str, ...]] = field(default_factory=list)

    @property
    def columns(self) -> list[str]:
        return [*self.schema.names, *self.partition_columns]


def plan_load(manifest: Manifest, resolve: Callable[[str], tuple[str, os.stat_result | None]]) -> LoadPlan:
    """Check the staged files and read their schema; raise before anything is written.

    ``resolve`` gives a committable's staged path and ``lstat`` (``StagingLayout.committable_resolver``).
    """
    files: list[tuple[str, dict[str, str | None]]] = []
    schemas: list[pa.Schema] = []
    partition_columns: list[str] | None = None
    rows = 0
    problems = []
    for c in manifest.committables:
        path, st = resolve(c.path)
        if st is None or not stat.S_ISREG(st.st_mode) or st.st_size != c.size:
            problems.append(f"{c.path}: missing from staging or not the size the manifest records")
            continue
        columns = [col for col, _ in c.partition]
        if partition_columns is None:
            partition_columns = columns
        elif columns != partition_columns:
            raise LayoutError(
                f"committables are partitioned differently: {partition_columns} and {columns} ({c.path})"
            )
        meta = pq.read_metadata(path)
        schemas.append(meta.schema.to_arrow_schema())
        rows += meta.num_rows
        files.append((path, partition_values(c.partition)))  # values, not directory text (NULL: None)
    if problems:
        shown = "; ".join(problems[:5]) + (f" (+{len(problems) - 5} more)" if len(problems) > 5 else "")
        raise CommittableError(
            f"checkpoint {manifest.pipeline}/{manifest.checkpoint_key} attempt {manifest.attempt_id} "
            f"cannot be loaded, target left unchanged: {shown}"
        )
    if partition_columns is None:  # no committables: an empty interval
        partition_columns = list(manifest.partition_columns)
    schema = _unify(schemas)
    for name in [*schema.names, *partition_columns]:
        validate_sql_identifier(name, "column name")
    clash = sorted(set(schema.names) & set(partition_columns))
    if clash:
        raise SchemaMismatchError(f"columns {clash} are both in the Parquet files and partition directories")
    for f in schema:
        sql_type_for(f)  # raises for a type the target cannot load
    return LoadPlan(files=files, schema=schema, partition_columns=partition_columns, rows=rows)


def replace_values(manifest: Manifest, plan: LoadPlan, key: list[str]) -> list[tuple[str, ...]]:
    """The ``key`` values that name the interval: from partition paths, or from the staged data."""
    missing = [k for k in key if k not in plan.columns and k not in manifest.partition_columns]
    if missing:
        raise SqlTargetError(
            f"replace key column(s) {missing} are not among the staged columns {plan.columns}"
        )
    values: set[tuple[Any, ...]] = set()
    if all(k in plan.partition_columns or k in manifest.partition_columns for k in key):
        for p in manifest.replaced_partitions():
            pairs = dict(parse_partition_dir(p))  # the NULL partition is a value too: replaced by IS NULL
            values.add(tuple(pairs[k] for k in key))
        return sorted(values, key=repr)
    data_key = [k for k in key if k in plan.schema.names]
    for path, partition in plan.files:
        table = pq.read_table(path, columns=data_key)
        unique = table.group_by(data_key).aggregate([]) if table.num_rows else table
        for row in unique.to_pylist():
            values.add(tuple(partition[k] if k in partition else row[k] for k in key))
    if any(v is None for t in values for v in t):
        raise SqlTargetError(f"replace key column(s) {key} hold NULL in the staged data")
    return sorted(values, key=repr)


def _unify(schemas: list[pa.Schema]) -> pa.Schema:
    """One schema for every staged file; files that disagree on a column's type are named."""
    if not schemas:
        return pa.schema([])
    first = schemas[0]
    for other in schemas[1:]:
        if other.names != first.names:
            raise SchemaMismatchError(f"staged files have different columns: {first.names} and {other.names}")
        diff = [
            f"{a.name!r} ({a.type} / {b.type})" for a, b in zip(first, other, strict=True) if a.type != b.type
        ]
        if diff:
            raise SchemaMismatchError(f"staged files disagree on column types: {', '.join(diff)}")
    # Spark writes every column nullable; a column is nullable if any file says so.
    return pa.schema(
        [f.with_nullable(any(s.field(i).nullable for s in schemas)) for i, f in enumerate(first)]
    )
