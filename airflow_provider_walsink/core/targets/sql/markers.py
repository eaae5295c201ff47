"""The SQL target's marker table: one row per checkpoint, naming the attempt the target holds.

The publish writes the row in the transaction that loads the data (:mod:`.sql`),
so the target alone knows what it has published, even when the committer
table is trimmed or lost. The row carries the fencing token (``epoch``) that
refuses a zombie committer, whether the committer recorded the commit
(``finished_at``), and, in ``replace`` by key, the key values the attempt
replaced, which a new version of the checkpoint must cover.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql as mysql_types
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError

from airflow_provider_walsink.core.protocol.manifest import Manifest
from airflow_provider_walsink.core.targets.sql.schema import SqlTargetError, exact_string, inexact_columns

#: The marker columns that name a row: compared exactly, or ``Sales`` and ``sales`` share a row.
KEY_COLUMNS = ("pipeline", "checkpoint_key", "attempt_id")


@dataclass(frozen=True)
class Marker:
    """One checkpoint's marker row, as read."""

    attempt_id: str
    epoch: int
    rows: int
    #: The committer recorded the commit of this attempt (``finish()`` ran).
    finished: bool
    #: ``replace`` by key: the key values (as text) this attempt replaced; ``None`` when not recorded.
    replaced_values: frozenset[tuple[str | None, ...]] | None = None


def define_marker_table(name: str, schema: str | None) -> sa.Table:
    """The marker table (created when absent by the publisher, upgraded by :func:`upgrade_marker_table`)."""
    return sa.Table(
        name,
        sa.MetaData(),
        # Exact comparison (binary collation on MySQL/MariaDB): pipeline ids and keys are case-sensitive.
        sa.Column("pipeline", exact_string(128), primary_key=True),
        sa.Column("checkpoint_key", exact_string(128), primary_key=True),
        sa.Column("attempt_id", exact_string(40), nullable=False),
        sa.Column("epoch", sa.BigInteger, nullable=False),
        sa.Column("rows", sa.BigInteger, nullable=False),
        sa.Column("target_table", sa.String(255), nullable=False),
        sa.Column("published_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        # replace by key: the key values the attempt replaced (JSON), so a reprocess knows its rows.
        sa.Column(
            "replaced_values",
            sa.Text().with_variant(mysql_types.LONGTEXT(), "mysql", "mariadb"),
            nullable=True,
        ),
        schema=schema,
    )


def define_order_table(name: str, schema: str | None) -> sa.Table:
    """One row per pipeline, locked by its ``replace`` publishes so their order checks run one at a time.

    The key compares exactly (as the marker table's): ``Sales`` and ``sales`` lock rows of their own.
    """
    return sa.Table(
        name, sa.MetaData(), sa.Column("pipeline", exact_string(128), primary_key=True), schema=schema
    )


def as_text(values: Sequence[Any]) -> tuple[str | None, ...]:
    """Key values as the marker row records them (dates ISO, numbers as written, NULL as null):
    comparable across attempts."""
    return tuple(None if v is None else v.isoformat() if hasattr(v, "isoformat") else str(v) for v in values)


def upgrade_marker_table(engine: Engine, markers: sa.Table) -> None:
    """Add the column walsink 0.4 added (``replaced_values``) to an older marker table.

    Raises :class:`SqlTargetError` for a marker table whose key columns compare
    case-insensitively (:func:`check_marker_keys`). Safe to repeat.
    """
    check_marker_keys(engine, markers)
    columns = {c["name"] for c in sa.inspect(engine).get_columns(markers.name, schema=markers.schema)}
    if "replaced_values" not in columns:
        column = markers.c.replaced_values
        with engine.connect() as conn:
            preparer = conn.dialect.identifier_preparer
            ddl = (
                f"ALTER TABLE {preparer.format_table(markers)} ADD COLUMN "
                f"{preparer.quote(column.name)} {column.type.compile(dialect=conn.dialect)}"
            )
            try:
                with conn.begin():
                    conn.execute(sa.text(ddl))
            except DBAPIError:
                # A concurrent publisher added it first.
                inspector = sa.inspect(engine)
                if "replaced_values" not in {
                    c["name"] for c in inspector.get_columns(markers.name, schema=markers.schema)
                }:
                    raise


def check_marker_keys(engine: Engine, markers: sa.Table) -> None:
    """Refuse a MySQL/MariaDB marker table (made by an older walsink) whose key columns ignore case.

    Not altered here: if pipelines differing only in case already shared a row,
    changing the collation would hide it, so the operator checks first and runs
    the one statement the error gives. PostgreSQL and SQLite compare exactly.

    Raises :class:`SqlTargetError` naming the table, its columns and the fix.
    """
    if engine.dialect.name != "mysql":
        return
    with engine.connect() as conn:
        inexact = inexact_columns(conn, markers.name, markers.schema, list(KEY_COLUMNS))
        if not inexact:
            return
        preparer = conn.dialect.identifier_preparer
        table = preparer.format_table(markers)
        fix = ", ".join(
            f"MODIFY {preparer.quote(c.name)} {c.type.compile(dialect=conn.dialect)} NOT NULL"
            for c in markers.columns
            if c.name in KEY_COLUMNS
        )
    shown = ", ".join(f"{name} ({collation})" for name, collation in inexact)
    # Statements shown to the operator, not run; identifiers come quoted by the dialect's preparer.
    look = f"SELECT pipeline, checkpoint_key FROM {table}"  # noqa: S608
    alter = f"ALTER TABLE {table} {fix};"
    raise SqlTargetError(
        f"marker table {table} compares its key columns case-insensitively: {shown}; pipelines or "
        "checkpoint keys differing only in case would share a marker row and a retried commit could "
        f"load its rows twice, nothing written. Check that no two pipelines differ only in case "
        f"({look}), then run: {alter}"
    )


def read_marker(conn: Connection, markers: sa.Table, manifest: Manifest, *, lock: bool) -> Marker | None:
    """The checkpoint's marker row (``lock``: ``SELECT ... FOR UPDATE``), or ``None``."""
    m = markers
    query = sa.select(m.c.attempt_id, m.c.epoch, m.c.rows, m.c.finished_at, m.c.replaced_values).where(
        *marker_key(markers, manifest)
    )
    if lock:
        query = query.with_for_update()
    row = conn.execute(query).first()
    if row is None:
        return None
    values = None
    if row.replaced_values is not None:
        values = frozenset(tuple(v) for v in json.loads(row.replaced_values))
    return Marker(row.attempt_id, int(row.epoch), int(row.rows), row.finished_at is not None, values)


def marker_key(markers: sa.Table, manifest: Manifest) -> tuple[Any, ...]:
    """The marker table's primary key for the checkpoint, as a ``where`` clause."""
    m = markers
    return (m.c.pipeline == manifest.pipeline, m.c.checkpoint_key == manifest.checkpoint_key)
