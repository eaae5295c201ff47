"""Staged Parquet files as an Iceberg table takes them (:mod:`.iceberg`).

A staged file becomes a ``DataFile`` by path, its metrics from its footer and its partition
from its Hive path (identity partitions) or its statistics; a missing table takes its schema
from the first staged file. Everything is checked against the table before the commit, so a
file that does not fit fails the publish with the table unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.io.pyarrow import (
    UnsupportedPyArrowTypeException,
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
    schema_to_pyarrow,
)
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.table import Table
from pyiceberg.transforms import IdentityTransform
from pyiceberg.typedef import Record
from pyiceberg.types import BooleanType, DateType, IntegerType, LongType, StringType
from pyiceberg.utils.datetime import date_str_to_days

from airflow_provider_walsink.core.protocol.errors import LayoutError, WalsinkError
from airflow_provider_walsink.core.protocol.manifest import Manifest
from airflow_provider_walsink.core.protocol.partitions import partition_value
from airflow_provider_walsink.core.targets._tables import int96_columns, partition_of_path, schema_problems


class IcebergTargetError(WalsinkError):
    """The Iceberg target cannot be used as configured; the message says why (table unchanged)."""


def data_files(
    table: Table, manifest: Manifest, locations: list[str], footers: list[Any], *, identifier: str
) -> list[DataFile]:
    """One ``DataFile`` per staged file, from its footer; partition from its Hive path (identity) or stats."""
    schema = table.schema()
    spec = table.spec()
    columns = {f.name: f.type for f in schema_to_pyarrow(schema, include_field_ids=False)}
    plan = compute_statistics_plan(schema, table.metadata.properties)
    mapping = parquet_path_to_id_mapping(schema)
    fields = [(pf, schema.find_column_name(pf.source_id)) for pf in spec.fields]
    identity = {name for pf, name in fields if isinstance(pf.transform, IdentityTransform)}
    result = []
    for c, location, meta in zip(manifest.committables, locations, footers, strict=True):
        pairs = dict(partition_of_path(c.path))
        file_schema = meta.schema.to_arrow_schema()
        problems = schema_problems(columns, file_schema, pairs, int96=int96_columns(meta))
        lost = [col for col in pairs if col not in identity and col not in file_schema.names]
        if lost:
            problems.append(
                f"partition directories {lost} are not identity partitions of the table and not in the file"
            )
        if problems:
            raise IcebergTargetError(
                f"staged file {c.path} does not match Iceberg table {identifier}: "
                f"{'; '.join(problems)}; table unchanged"
            )
        stats = data_file_statistics_from_parquet_metadata(
            parquet_metadata=meta, stats_columns=plan, parquet_column_mapping=mapping
        )
        from_stats: Record | None = None
        values = []
        for i, (pf, name) in enumerate(fields):
            if name in pairs and isinstance(pf.transform, IdentityTransform):
                values.append(from_path(pairs[name], schema.find_field(pf.source_id).field_type, c.path))
            else:
                if from_stats is None:
                    from_stats = stats.partition(spec, schema)
                values.append(from_stats[i])
        result.append(
            DataFile.from_args(
                content=DataFileContent.DATA,
                file_path=location,
                file_format=FileFormat.PARQUET,
                partition=Record(*values),
                file_size_in_bytes=c.size,
                sort_order_id=None,
                spec_id=table.metadata.default_spec_id,
                equality_ids=None,
                key_metadata=None,
                **stats.to_serialized_dict(),
            )
        )
    return result


def new_table_schema(
    manifest: Manifest, footers: list[Any], partition_by: Sequence[str], *, identifier: str
) -> tuple[Schema, PartitionSpec]:
    """The schema and identity partition spec of a table created from the first staged file
    (``footers[0]``) plus the partition columns of its paths (as strings).

    Raises :class:`IcebergTargetError` for INT96 timestamps or a type Iceberg has no equivalent of."""
    import pyarrow as pa

    int96 = sorted({col for meta in footers for col in int96_columns(meta)})
    if int96:
        raise IcebergTargetError(
            f"staged files of {manifest.pipeline}/{manifest.checkpoint_key} hold INT96 timestamps {int96}, which "
            "Iceberg cannot read: make Spark write TIMESTAMP_MICROS "
            "(spark.sql.parquet.outputTimestampType=TIMESTAMP_MICROS); table not created"
        )
    file_schema = footers[0].schema.to_arrow_schema()
    columns = list(partition_by or manifest.partition_columns)
    fields = list(file_schema) + [pa.field(c, pa.string()) for c in columns if c not in file_schema.names]
    try:
        # Field ids first: converted from Arrow every field's id is -1, and a partition field
        # sourced from id -1 would take the last column's (two partition columns: both the last).
        schema = assign_fresh_schema_ids(Catalog._convert_schema_if_needed(pa.schema(fields)))
    except (TypeError, ValueError, UnsupportedPyArrowTypeException) as e:  # no Iceberg equivalent
        raise IcebergTargetError(f"cannot create Iceberg table {identifier}: {e}; table not created") from e
    spec = PartitionSpec(
        *(
            PartitionField(
                source_id=schema.find_field(c).field_id,
                field_id=1000 + i,
                transform=IdentityTransform(),
                name=c,
            )
            for i, c in enumerate(columns)
        )
    )
    return schema, spec


def from_path(text: str, iceberg_type: Any, where: str) -> Any:
    """A Hive path's partition text (as Spark escapes it) as the Iceberg value of an identity partition."""
    value = partition_value(text)
    if value is None:
        return None
    try:
        if isinstance(iceberg_type, StringType):
            return value
        if isinstance(iceberg_type, (IntegerType, LongType)):
            return int(value)
        if isinstance(iceberg_type, DateType):
            return date_str_to_days(value)
        if isinstance(iceberg_type, BooleanType):
            return {"true": True, "false": False}[value.lower()]
    except (ValueError, KeyError):
        raise LayoutError(
            f"{where}: partition value {value!r} is not a valid {iceberg_type}; table unchanged"
        ) from None
    raise LayoutError(
        f"{where}: partition columns of type {iceberg_type} cannot be read from a directory name; "
        "write the column into the files instead"
    )
