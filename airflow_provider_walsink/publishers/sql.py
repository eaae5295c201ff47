"""A transactional SQL target: a checkpoint attempt's staged Parquet into a PostgreSQL or MySQL table.

``sql://<conn_id>/<schema>.<table>`` (or ``sql://<conn_id>/<table>`` for the
connection's default schema). The connection is an Airflow ``postgres`` or
``mysql`` connection, looked up through ``TargetOptions.connections``; outside
Airflow, ``TargetOptions.extra["url"]`` gives a SQLAlchemy URL instead.

Exactly once, as Delta Lake's application transactions do it: the data and a
**marker row** ``(pipeline, checkpoint_key, attempt_id, epoch, rows,
published_at)`` go into the target database in **one transaction**, so the
target alone knows whether a checkpoint is published, even if the committer
table is trimmed or lost. Inside that transaction, before any row is written:

1. the checkpoint's marker row is locked (``SELECT ... FOR UPDATE``; when it
   does not exist yet, inserting it takes the lock, and a concurrent publisher
   of the same checkpoint waits on the primary key, then finds it);
2. a stored ``epoch`` higher than ``ctx.epoch`` (the lease's fencing token)
   raises :class:`FencedError` and rolls back: a zombie committer is refused by
   the target itself, not only by the committer table;
3. a marker naming this attempt means ALREADY_PUBLISHED: nothing is written;
4. a marker naming another attempt: in ``replace`` mode the interval is
   replaced; in ``append`` mode it is an error while that attempt's commit
   was never recorded (loading would duplicate its rows), and a plain append
   once ``finish()`` has marked it finished (a re-run after retention trimmed
   the committer table: new rows, as the file target treats it).

A reprocess (``ctx.supersedes``, a new version of a committed checkpoint) is
refused in ``append`` (rows carry no attempt id). In ``replace`` by key the
marker row records the key values each attempt replaced, and the new version
must cover the ones its marker names, or it is refused
(:class:`SupersedeError`, nothing written): see ``_check_supersede``.

Modes: ``append`` inserts the rows; ``replace`` (the pipeline mode
``overwrite``) first deletes the interval's rows, in the same transaction,
selected by ``extra["replace_key"]`` (column(s) whose values in the staged
data, or in the checkpoint's partition paths, name the interval; default: the
declared partition columns) or by ``extra["replace_predicate"]`` (SQL written
by the DAG author, with the bound parameters ``:pipeline``,
``:checkpoint_key`` and ``:sequence``; never taken from a manifest).

Bulk load, never row by row in Python: pyarrow streams the Parquet record
batches as CSV into PostgreSQL's ``COPY ... FROM STDIN`` (psycopg2 or psycopg
3), or writes them to a private temporary file for MySQL/MariaDB's ``LOAD DATA
LOCAL INFILE`` (PyMySQL), whose warnings are turned into errors (``LOCAL``
would otherwise accept bad values with a warning). Partition columns of the
Hive-style staged paths (``dt=2026-01-01/part-0.parquet``) become columns.

The table is created (with SQLAlchemy, types from the Parquet schema) when it
does not exist; an existing table must accept every staged column, or the
publish fails before anything is written with a message naming the columns.
Identifiers (schema, table, columns) are validated and quoted by the
dialect's identifier preparer; every value is a bound parameter.
"""

from __future__ import annotations

import importlib.util
import io
import json
import logging
import os
import queue
import re
import shutil
import stat
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import unquote, urlsplit

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import sqlalchemy as sa
from sqlalchemy.dialects import mysql as mysql_types
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.sql import sqltypes

from airflow_provider_walsink.protocol.errors import (
    CommittableError,
    FencedError,
    LayoutError,
    SupersedeError,
    WalsinkError,
)
from airflow_provider_walsink.protocol.manifest import Manifest
from airflow_provider_walsink.protocol.staging import StagingLayout

from ._tables import refuse_supersede, superseded_attempt
from .base import PublisherContext, PublishOutcome, PublishResult, TargetCapabilities

log = logging.getLogger(__name__)

MODES = ("append", "replace")
#: Pipeline modes that mean ``replace`` here (the file target calls it ``overwrite``).
MODE_ALIASES = {"append": "append", "replace": "replace", "overwrite": "replace"}
DEFAULT_MARKER_TABLE = "walsink_markers"
#: Seconds a publish waits for the checkpoint's marker row (held by another,
#: perhaps paused, publisher) before it gives up with an error; Airflow retries.
DEFAULT_LOCK_TIMEOUT = 60.0
#: Airflow connection types → SQLAlchemy drivers (the common-sql providers' connection types).
CONN_TYPE_DRIVERS = {
    "postgres": "postgresql+psycopg2",
    "postgresql": "postgresql+psycopg2",
    "mysql": "mysql+pymysql",
    "mariadb": "mysql+pymysql",
}
#: SQLAlchemy driver name → (module, the walsink extra that installs it).
_DRIVER_EXTRAS = {
    "psycopg2": ("psycopg2", "postgres"),
    "psycopg": ("psycopg", "psycopg"),
    "pymysql": ("pymysql", "mysql"),
}
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
_BATCH_ROWS = 64 * 1024
#: Threads converting Parquet to CSV while the load runs.
_CONVERT_THREADS = 2
#: How often a publish that lost the race for a new marker row starts over (it then finds the row).
_RACE_RETRIES = 3


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


# --------------------------------------------------------------------------- types


def _sql_type_for(field: pa.Field) -> sa.types.TypeEngine:
    """The column type a new table gets for a staged Parquet column."""
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


# --------------------------------------------------------------------------- plan


@dataclass
class _Plan:
    """What one publish loads, all checked before the target changes."""

    files: list[tuple[str, dict[str, str]]]  # (staged path, partition column → value)
    schema: pa.Schema  # the staged data columns (without partition columns)
    partition_columns: list[str]
    rows: int
    replace_values: list[tuple[str, ...]] = field(default_factory=list)

    @property
    def columns(self) -> list[str]:
        return [*self.schema.names, *self.partition_columns]


@dataclass(frozen=True)
class _Marker:
    attempt_id: str
    epoch: int
    rows: int
    #: The committer recorded the commit of this attempt (``finish()`` ran).
    finished: bool
    #: ``replace`` by key: the key values (as text) this attempt replaced; ``None`` when not recorded.
    replaced_values: frozenset[tuple[str, ...]] | None = None


class SqlPublisher:
    """Loads a sealed attempt's Parquet into one SQL table, exactly once (module docstring)."""

    kind: ClassVar[str] = "sql"
    capabilities: ClassVar[TargetCapabilities] = TargetCapabilities(
        atomic=True, needs_rename=False, remembers_commits=True, fenced_by_target=True
    )

    def __init__(
        self,
        url: str | URL,
        table: str,
        *,
        schema: str | None = None,
        mode: str = "append",
        layout: StagingLayout | None = None,
        replace_key: Sequence[str] | str | None = None,
        replace_predicate: str | None = None,
        marker_table: str = DEFAULT_MARKER_TABLE,
        create_table: bool = True,
        partition_by: Sequence[str] = (),
        label: str | None = None,
        lock_timeout: float = 60.0,
    ) -> None:
        if mode not in MODE_ALIASES:
            raise SqlTargetError(f"sql target mode must be one of {sorted(MODE_ALIASES)}, got {mode!r}")
        self.mode = MODE_ALIASES[mode]
        self.url = make_url(url)
        backend = self.url.get_backend_name()
        if backend not in ("postgresql", "mysql", "mariadb"):
            raise SqlTargetError(f"sql target supports PostgreSQL and MySQL/MariaDB, not {backend!r}")
        self.dialect_name = "postgresql" if backend == "postgresql" else "mysql"
        if self.dialect_name == "mysql" and self.url.get_driver_name() != "pymysql":
            raise SqlTargetError(
                f"sql target loads MySQL/MariaDB through PyMySQL (mysql+pymysql://), not {self.url.drivername!r}"
            )
        driver, extra = _DRIVER_EXTRAS.get(self.url.get_driver_name(), (None, None))
        if driver is not None and importlib.util.find_spec(driver) is None:
            raise SqlTargetError(
                f"the sql target's driver {driver!r} is not installed: "
                f'pip install "airflow-provider-walsink[{extra}]"'
            )
        self.table = validate_sql_identifier(table, "table name")
        self.schema = validate_sql_identifier(schema, "schema name") if schema else None
        self.marker_table = validate_sql_identifier(marker_table, "marker table name")
        if isinstance(replace_key, str):
            replace_key = [replace_key]
        self.replace_key = [validate_sql_identifier(c, "replace key column") for c in replace_key or ()]
        self.replace_predicate = replace_predicate
        if self.replace_key and replace_predicate:
            raise SqlTargetError("give the sql target replace_key or replace_predicate, not both")
        self.partition_by = tuple(partition_by)
        self.create_table = create_table
        self.layout = layout
        self.label = label
        if not lock_timeout > 0:
            raise SqlTargetError(
                f"sql target lock_timeout must be a positive number of seconds, got {lock_timeout!r}"
            )
        self.lock_timeout = lock_timeout
        self._engine: Engine | None = None
        self._markers = _marker_table(self.marker_table, self.schema)
        self._markers_ready = False

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_uri(cls, uri: str, options: Any) -> SqlPublisher:
        """Build from ``sql://<conn_id>/<schema>.<table>`` and :class:`~.registry.TargetOptions`."""
        parts = urlsplit(uri)
        conn_id = unquote(parts.netloc)
        name = parts.path.lstrip("/")
        schema, _, table = name.rpartition(".")
        if not table or "/" in name or parts.query or parts.fragment:
            raise SqlTargetError(f"sql target {uri!r} must look like sql://<conn_id>/<schema>.<table>")
        extra: Mapping[str, Any] = options.extra or {}
        known = {"url", "replace_key", "replace_predicate", "marker_table", "create_table", "lock_timeout"}
        unknown = sorted(set(extra) - known)
        if unknown:
            raise SqlTargetError(f"sql target: unknown option(s) {unknown}; known: {sorted(known)}")
        if extra.get("url"):
            url: str | URL = extra["url"]
        else:
            if not conn_id:
                raise SqlTargetError(f"sql target {uri!r} names no connection id")
            if options.connections is None:
                raise SqlTargetError(
                    f"sql target {uri!r}: no connection resolver to look up {conn_id!r} "
                    "(outside Airflow, pass extra={'url': <SQLAlchemy URL>})"
                )
            url = url_from_connection(conn_id, options.connections(conn_id))
        return cls(
            url,
            table,
            schema=schema or None,
            mode=options.mode,
            layout=options.layout,
            replace_key=extra.get("replace_key"),
            replace_predicate=extra.get("replace_predicate"),
            marker_table=extra.get("marker_table", DEFAULT_MARKER_TABLE),
            create_table=bool(extra.get("create_table", True)),
            lock_timeout=float(extra.get("lock_timeout", DEFAULT_LOCK_TIMEOUT)),
            partition_by=options.partition_by,
            label=f"sql://{conn_id}/{name}" if conn_id else None,
        )

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            connect_args: dict[str, Any] = {}
            if self.dialect_name == "mysql":
                # LOAD DATA LOCAL needs the client's consent; only this publisher's engine gives it.
                connect_args["local_infile"] = True
            self._engine = sa.create_engine(self.url, pool_pre_ping=True, connect_args=connect_args)
        return self._engine

    def close(self) -> None:
        """Release the publisher's database connections."""
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

    def describe(self) -> str:
        where = f"{self.schema}.{self.table}" if self.schema else self.table
        return (
            self.label
            or f"sql {self.url.get_backend_name()}://{self.url.host or ''}/{self.url.database} {where}"
        )

    # ------------------------------------------------------------------ the contract

    def published_attempt(self, manifest: Manifest) -> str | None:
        """The attempt id the target's marker names for this checkpoint, or ``None``."""
        if not sa.inspect(self.engine).has_table(self.marker_table, schema=self.schema):
            return None
        self._ensure_markers()
        with self.engine.connect() as conn:
            marker = self._read_marker(conn, manifest, lock=False)
        return marker.attempt_id if marker else None

    def finish(self, manifest: Manifest, layout: StagingLayout | None = None) -> None:
        """After COMMITTED: mark the marker row finished, then remove the checkpoint's staging.

        A finished marker tells a later ``append`` of *another* attempt of the
        same key (a re-run after retention trimmed the committer table, with
        new rows) that the old rows are final, so it appends; an unfinished one
        (its commit was never recorded) refuses it instead of duplicating the
        interval. Best effort: a database error is logged, never raised (the
        commit is recorded; a re-run of the commit task finishes it).
        """
        try:
            with self.engine.begin() as conn:
                conn.execute(
                    self._markers.update()
                    .where(*self._marker_key(manifest), self._markers.c.attempt_id == manifest.attempt_id)
                    .where(self._markers.c.finished_at.is_(None))
                    .values(finished_at=sa.func.now())
                )
        except DBAPIError as exc:
            log.warning(
                "committed %s/%s, but its marker row was not marked finished: %s",
                manifest.pipeline,
                manifest.checkpoint_key,
                exc,
            )
        layout = layout or self.layout
        if layout is not None:
            layout.remove_checkpoint(manifest.pipeline, manifest.checkpoint_key)

    def publish(self, manifest: Manifest, attempt_dir: Path, ctx: PublisherContext) -> PublishResult:
        """Load the attempt and its marker row in one transaction (module docstring).

        Raises :class:`FencedError` (a newer epoch holds the checkpoint: nothing
        written), :class:`SchemaMismatchError` / :class:`SqlTargetError` /
        :class:`CommittableError` (bad input: nothing written) and database
        errors (the transaction rolled back). Repeating it is safe.
        """
        if self.mode == "append":
            # "replace" deletes the interval's rows by key or predicate in the same transaction.
            refuse_supersede(
                ctx,
                manifest,
                "sql",
                self.mode,
                "appended rows carry no attempt id, so its rows cannot be told apart",
            )
        if ctx.attempt_id != manifest.attempt_id or ctx.checkpoint_key != manifest.checkpoint_key:
            raise SqlTargetError(
                f"publish context is for {ctx.checkpoint_key}/{ctx.attempt_id}, "
                f"the manifest for {manifest.checkpoint_key}/{manifest.attempt_id}"
            )
        ctx.fence()
        self._ensure_markers()
        # A cheap look without a lock first: a re-run of a published attempt
        # needs no staging (which finish() may already have removed).
        with self.engine.connect() as conn:
            marker = self._read_marker(conn, manifest, lock=False)
        if marker is not None:
            outcome = self._judge(marker, manifest, ctx)
            if outcome is not None:
                return outcome
        plan = self._plan(manifest, attempt_dir)
        target = self._prepare_target(plan)
        for _ in range(_RACE_RETRIES):
            try:
                return self._transaction(manifest, plan, target, ctx)
            except _LostRace:
                continue
        raise SqlTargetError(
            f"checkpoint {manifest.pipeline}/{manifest.checkpoint_key}: lost the race for its marker row "
            f"{_RACE_RETRIES} times; try again"
        )

    # ------------------------------------------------------------------ transaction

    def _transaction(
        self, manifest: Manifest, plan: _Plan, target: sa.Table | None, ctx: PublisherContext
    ) -> PublishResult:
        # READ COMMITTED on both: a locking read sees the latest committed marker,
        # and MySQL takes no gap locks (a concurrent first insert then waits on
        # the key and fails cleanly instead of deadlocking).
        with self.engine.connect().execution_options(isolation_level="READ COMMITTED") as conn:
            with conn.begin():
                self._set_lock_timeout(conn)
                try:
                    marker = self._read_marker(conn, manifest, lock=True)
                except DBAPIError as exc:
                    raise self._lock_error(exc, manifest) from exc
                if marker is not None:
                    outcome = self._judge(marker, manifest, ctx)
                    if outcome is not None:
                        return outcome  # nothing was written; committing an empty transaction
                self._check_supersede(marker, manifest, plan, ctx)  # raises before any write: rolled back
                if marker is not None:
                    conn.execute(
                        self._markers.update()
                        .where(*self._marker_key(manifest))
                        .values(
                            attempt_id=manifest.attempt_id,
                            epoch=ctx.epoch,
                            rows=plan.rows,
                            target_table=self._target_name(),
                            published_at=sa.func.now(),
                            finished_at=None,
                            replaced_values=self._recorded_values(plan),
                        )
                    )
                else:
                    try:
                        conn.execute(
                            self._markers.insert().values(
                                pipeline=manifest.pipeline,
                                checkpoint_key=manifest.checkpoint_key,
                                attempt_id=manifest.attempt_id,
                                epoch=ctx.epoch,
                                rows=plan.rows,
                                target_table=self._target_name(),
                                published_at=sa.func.now(),
                                replaced_values=self._recorded_values(plan),
                            )
                        )
                    except IntegrityError:
                        # Another publisher inserted it and committed while we waited: start over.
                        raise _LostRace() from None
                    except DBAPIError as exc:
                        raise self._lock_error(exc, manifest) from exc
                ctx.event("sql.marker_locked")
                replaced: list[str] = []
                if self.mode == "replace" and target is not None:
                    replaced = self._delete_interval(conn, target, manifest, plan)
                ctx.event("sql.before_load")
                loaded = self._bulk_load(conn, target, plan)
                if loaded != plan.rows:
                    raise CommittableError(
                        f"checkpoint {manifest.pipeline}/{manifest.checkpoint_key}: loaded {loaded} rows but the "
                        f"staged Parquet holds {plan.rows}; rolled back"
                    )
                ctx.event("sql.loaded")
                # The committer database may be another database: ask it last, just before COMMIT.
                ctx.fence()
        ctx.event("sql.committed")
        return PublishResult(
            outcome=PublishOutcome.PUBLISHED,
            published=len(manifest.committables),
            partitions_replaced=replaced,
            snapshot=self._snapshot(manifest, ctx.epoch),
            rows=plan.rows,
        )

    def _set_lock_timeout(self, conn: Connection) -> None:
        """Bound the wait for the marker row, so a paused publisher holding it cannot block forever."""
        if self.dialect_name == "postgresql":
            conn.execute(
                sa.select(sa.func.set_config("lock_timeout", f"{int(self.lock_timeout * 1000)}ms", True))
            )
        else:
            conn.execute(
                sa.text("SET SESSION innodb_lock_wait_timeout = :s"), {"s": max(1, int(self.lock_timeout))}
            )

    def _lock_error(self, exc: DBAPIError, manifest: Manifest) -> Exception:
        """A lock wait that timed out, as a clear error; any other database error as it is."""
        code = getattr(exc.orig, "pgcode", None) or getattr(getattr(exc.orig, "diag", None), "sqlstate", None)
        mysql_code = exc.orig.args[0] if self.dialect_name == "mysql" and exc.orig.args else None
        if code == "55P03" or mysql_code == 1205:
            return SqlTargetError(
                f"checkpoint {manifest.pipeline}/{manifest.checkpoint_key}: its marker row in "
                f"{self.marker_table} stayed locked by another publisher (a slow or paused committer) for "
                f"{self.lock_timeout:g} s; nothing written, try again"
            )
        return exc

    def _judge(self, marker: _Marker, manifest: Manifest, ctx: PublisherContext) -> PublishResult | None:
        """What an existing marker means: fenced, already published, refused, or ``None`` (go on)."""
        if marker.epoch > ctx.epoch:
            raise FencedError(
                f"checkpoint {manifest.pipeline}/{manifest.checkpoint_key}: the target holds epoch "
                f"{marker.epoch}, newer than this committer's {ctx.epoch}; its lease was taken over, "
                "nothing written (if the checkpoint was registered again after retention trimmed the "
                "committer table and its epochs restarted, the target's marker row still fences it)"
            )
        if marker.attempt_id == manifest.attempt_id:
            return PublishResult(
                outcome=PublishOutcome.ALREADY_PUBLISHED,
                already=len(manifest.committables),
                snapshot=self._snapshot(manifest, marker.epoch),
                rows=marker.rows,
            )
        if self.mode == "append" and not marker.finished:
            raise SqlTargetError(
                f"checkpoint {manifest.pipeline}/{manifest.checkpoint_key} was already appended to "
                f"{self._target_name()} by attempt {marker.attempt_id}, whose commit was never recorded; "
                f"appending attempt {manifest.attempt_id} could duplicate its rows, nothing written (use "
                "replace mode to reprocess an interval, or delete the marker row once the rows are checked)"
            )
        # replace: the interval is replaced. append over a finished marker: a re-run after
        # retention with new rows (the old rows are final), appended like any checkpoint.
        return None

    def _check_supersede(
        self, marker: _Marker | None, manifest: Manifest, plan: _Plan, ctx: PublisherContext
    ) -> None:
        """A reprocess in ``replace`` by key must delete every row the version it replaces wrote.

        The table's rows carry no attempt id: what the checkpoint's rows are is
        known only from the key values its marker row recorded. The new version
        deletes its own key values; if the held version covered a value the new
        one does not, deleting it could take rows another checkpoint has since
        written there, and keeping it would leave old rows beside new ones:
        refused (:class:`SupersedeError`), nothing written. ``replace_predicate``
        names the interval itself and always applies.
        """
        supersedes = superseded_attempt(ctx, manifest)
        if not supersedes or self.mode != "replace" or self.replace_predicate:
            return
        name = f"checkpoint {manifest.pipeline}/{manifest.checkpoint_key}"
        hint = (
            "declare the interval's partitions in the write phase, or set extra 'replace_predicate'; "
            f"nothing written to {self._target_name()}"
        )
        if marker is None or marker.replaced_values is None:
            held = f"attempt {marker.attempt_id}" if marker else f"committed attempt {supersedes}"
            state = "records no key values for it" if marker else "is missing"
            raise SupersedeError(
                f"{name}: cannot replace {held} with a new version: its marker row {state} "
                f"({self.marker_table}), so its rows cannot be identified; {hint}"
            )
        uncovered = sorted(marker.replaced_values - {_as_text(v) for v in plan.replace_values})
        if uncovered:
            key = self._key_columns()
            shown = ", ".join(
                "/".join(f"{k}={v}" for k, v in zip(key, t, strict=True)) for t in uncovered[:5]
            )
            raise SupersedeError(
                f"{name}: the new version (attempt {manifest.attempt_id}) does not cover {len(uncovered)} key "
                f"value(s) that attempt {marker.attempt_id} wrote ({shown}); replacing would leave its rows "
                f"there; {hint}"
            )

    def _recorded_values(self, plan: _Plan) -> str | None:
        """What the marker row records of the rows a ``replace`` by key wrote: its key values as text."""
        if self.mode != "replace" or self.replace_predicate:
            return None
        return json.dumps(sorted(list(_as_text(v)) for v in plan.replace_values))

    def _read_marker(self, conn: Connection, manifest: Manifest, *, lock: bool) -> _Marker | None:
        m = self._markers
        query = sa.select(m.c.attempt_id, m.c.epoch, m.c.rows, m.c.finished_at, m.c.replaced_values).where(
            *self._marker_key(manifest)
        )
        if lock:
            query = query.with_for_update()
        row = conn.execute(query).first()
        if row is None:
            return None
        values = None
        if row.replaced_values is not None:
            values = frozenset(tuple(v) for v in json.loads(row.replaced_values))
        return _Marker(row.attempt_id, int(row.epoch), int(row.rows), row.finished_at is not None, values)

    def _marker_key(self, manifest: Manifest) -> tuple[Any, ...]:
        m = self._markers
        return (m.c.pipeline == manifest.pipeline, m.c.checkpoint_key == manifest.checkpoint_key)

    def _snapshot(self, manifest: Manifest, epoch: int) -> str:
        return (
            f"{self.marker_table}:{manifest.pipeline}/{manifest.checkpoint_key}@{manifest.attempt_id}#{epoch}"
        )

    def _target_name(self) -> str:
        return f"{self.schema}.{self.table}" if self.schema else self.table

    # ------------------------------------------------------------------ planning

    def _plan(self, manifest: Manifest, attempt_dir: Path) -> _Plan:
        """Check the staged files and read their schema; raise before anything is written."""
        if manifest.file_format != "parquet":
            raise SqlTargetError(
                f"the sql target loads Parquet, but the checkpoint is {manifest.file_format!r}"
            )
        if self.layout is None:
            raise SqlTargetError("the sql target needs the staging layout to find the staged files")
        resolve = self.layout.committable_resolver(Path(attempt_dir))
        files: list[tuple[str, dict[str, str]]] = []
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
            files.append((path, dict(c.partition)))
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
            raise SchemaMismatchError(
                f"columns {clash} are both in the Parquet files and partition directories"
            )
        for f in schema:
            _sql_type_for(f)  # raises for a type the target cannot load
        plan = _Plan(files=files, schema=schema, partition_columns=partition_columns, rows=rows)
        # Checked here, not when built: the write task builds a publisher only to ask where to stage.
        if self.mode == "replace" and not (self.replace_key or self.replace_predicate or self.partition_by):
            raise SqlTargetError(
                "replace mode needs the interval's rows to be named: set extra 'replace_key' (column names) "
                "or 'replace_predicate' (SQL with :pipeline, :checkpoint_key, :sequence), or declare "
                "partition columns"
            )
        if self.mode == "replace" and not self.replace_predicate:
            plan.replace_values = self._replace_values(manifest, plan)
        return plan

    def _key_columns(self) -> list[str]:
        return list(self.replace_key or self.partition_by)

    def _replace_values(self, manifest: Manifest, plan: _Plan) -> list[tuple[str, ...]]:
        """The key values that name the interval: from partition paths, or from the staged data."""
        key = self._key_columns()
        missing = [k for k in key if k not in plan.columns and k not in manifest.partition_columns]
        if missing:
            raise SqlTargetError(
                f"replace key column(s) {missing} are not among the staged columns {plan.columns}"
            )
        values: set[tuple[Any, ...]] = set()
        if all(k in plan.partition_columns or k in manifest.partition_columns for k in key):
            for p in manifest.replaced_partitions():
                pairs = dict(part.split("=", 1) for part in p.split("/") if part)
                values.add(tuple(pairs[k] for k in key))
            return sorted(values)
        data_key = [k for k in key if k in plan.schema.names]
        for path, partition in plan.files:
            table = pq.read_table(path, columns=data_key)
            unique = table.group_by(data_key).aggregate([]) if table.num_rows else table
            for row in unique.to_pylist():
                values.add(tuple(partition[k] if k in partition else row[k] for k in key))
        if any(v is None for t in values for v in t):
            raise SqlTargetError(f"replace key column(s) {key} hold NULL in the staged data")
        return sorted(values, key=repr)

    # ------------------------------------------------------------------ tables

    def _ensure_markers(self) -> None:
        """Create the marker table, or add the column walsink 0.4 added to an older one (once per publisher)."""
        if self._markers_ready:
            return
        self._ensure_table(self._markers)
        columns = {
            c["name"] for c in sa.inspect(self.engine).get_columns(self.marker_table, schema=self.schema)
        }
        if "replaced_values" not in columns:
            column = self._markers.c.replaced_values
            with self.engine.connect() as conn:
                preparer = conn.dialect.identifier_preparer
                ddl = (
                    f"ALTER TABLE {preparer.format_table(self._markers)} ADD COLUMN "
                    f"{preparer.quote(column.name)} {column.type.compile(dialect=conn.dialect)}"
                )
                try:
                    with conn.begin():
                        conn.execute(sa.text(ddl))
                except DBAPIError:
                    # A concurrent publisher added it first.
                    inspector = sa.inspect(self.engine)
                    if "replaced_values" not in {
                        c["name"] for c in inspector.get_columns(self.marker_table, schema=self.schema)
                    }:
                        raise
        self._markers_ready = True

    def _ensure_table(self, table: sa.Table) -> None:
        """Create ``table`` if it is absent; a concurrent creator winning the race is fine."""
        if sa.inspect(self.engine).has_table(table.name, schema=table.schema):
            return
        try:
            table.create(self.engine, checkfirst=True)
        except DBAPIError:
            if not sa.inspect(self.engine).has_table(table.name, schema=table.schema):
                raise

    def _prepare_target(self, plan: _Plan) -> sa.Table | None:
        """Create the target table, or check the existing one accepts the staged columns.

        ``None``: no table and an empty checkpoint, so there is nothing to create, replace or load.
        """
        metadata = sa.MetaData()
        if not sa.inspect(self.engine).has_table(self.table, schema=self.schema):
            if not plan.files:
                return None
            if not self.create_table:
                raise SqlTargetError(
                    f"target table {self._target_name()} does not exist (create_table is off)"
                )
            columns = [sa.Column(f.name, _sql_type_for(f), nullable=f.nullable) for f in plan.schema]
            columns += [sa.Column(c, sa.String(255), nullable=False) for c in plan.partition_columns]
            self._ensure_table(sa.Table(self.table, metadata, *columns, schema=self.schema))
        reflected = sa.inspect(self.engine).get_columns(self.table, schema=self.schema)
        self._check_schema(plan, reflected)
        return sa.Table(
            self.table,
            sa.MetaData(),
            *[sa.Column(c["name"], c["type"]) for c in reflected],
            schema=self.schema,
        )

    def _check_schema(self, plan: _Plan, reflected: list[dict[str, Any]]) -> None:
        fold = (lambda s: s.lower()) if self.dialect_name == "mysql" else (lambda s: s)
        by_name = {fold(c["name"]): c for c in reflected}
        problems = []
        staged = {fold(n) for n in plan.columns}
        for f in plan.schema:
            col = by_name.get(fold(f.name))
            if col is None:
                problems.append(f"column {f.name!r} ({f.type}) is not in the table")
            elif _arrow_family(f.type) not in _accepts(col["type"]):
                problems.append(
                    f"column {f.name!r} is {f.type} in the staged Parquet but {col['type']} in the table"
                )
        for name in plan.partition_columns:
            col = by_name.get(fold(name))
            if col is None:
                problems.append(f"partition column {name!r} is not in the table")
            elif not _accepts(col["type"]) - {"boolean"}:
                problems.append(
                    f"partition column {name!r} is {col['type']} in the table, which cannot hold its text"
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
                f"target table {self._target_name()} does not match the staged data, nothing written: "
                + "; ".join(problems)
            )

    def _delete_interval(
        self, conn: Connection, target: sa.Table, manifest: Manifest, plan: _Plan
    ) -> list[str]:
        if self.replace_predicate:
            conn.execute(
                target.delete().where(sa.text(self.replace_predicate)),
                {
                    "pipeline": manifest.pipeline,
                    "checkpoint_key": manifest.checkpoint_key,
                    "sequence": manifest.sequence,
                },
            )
            return [self.replace_predicate]
        key = self._key_columns()
        if not plan.replace_values:
            return []
        cols = [target.c[k] for k in key]
        clause = (
            cols[0].in_([v[0] for v in plan.replace_values])
            if len(cols) == 1
            else sa.tuple_(*cols).in_(plan.replace_values)
        )
        conn.execute(target.delete().where(clause))
        return [
            "/".join(f"{k}={v}" for k, v in zip(key, values, strict=True)) for values in plan.replace_values
        ]

    # ------------------------------------------------------------------ bulk load

    def _bulk_load(self, conn: Connection, target: sa.Table | None, plan: _Plan) -> int:
        """Load every staged row through the driver's bulk path; return the rows the database loaded."""
        if not plan.files or target is None:
            return 0
        preparer = conn.dialect.identifier_preparer
        table_sql = preparer.format_table(target)
        columns_sql = ", ".join(preparer.quote(c) for c in plan.columns)
        dbapi = conn.connection.dbapi_connection
        chunks = _csv_chunks(plan, mysql=self.dialect_name == "mysql")
        try:
            if self.dialect_name == "postgresql":
                sql = f"COPY {table_sql} ({columns_sql}) FROM STDIN WITH (FORMAT csv)"
                return _pg_copy(dbapi, sql, chunks)
            return _mysql_load(dbapi, table_sql, columns_sql, chunks)
        finally:
            chunks.close()  # a failed load stops the converter threads now, not at garbage collection


class _LostRace(Exception):
    """A concurrent publisher created the checkpoint's marker row first."""


def _marker_table(name: str, schema: str | None) -> sa.Table:
    return sa.Table(
        name,
        sa.MetaData(),
        sa.Column("pipeline", sa.String(128), primary_key=True),
        sa.Column("checkpoint_key", sa.String(128), primary_key=True),
        sa.Column("attempt_id", sa.String(40), nullable=False),
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


def _as_text(values: Sequence[Any]) -> tuple[str, ...]:
    """Key values as the marker row records them (dates ISO, numbers as written): comparable across attempts."""
    return tuple(v.isoformat() if hasattr(v, "isoformat") else str(v) for v in values)


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


def _load_type(t: pa.DataType, *, mysql: bool) -> pa.DataType:
    """The Arrow type a column is written to CSV as, so the database parses it as the same value."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_timestamp(t):
        # Microseconds: what both databases store. MySQL has no time zones: UTC wall time.
        return pa.timestamp("us", None if mysql else t.tz)
    if mysql and pa.types.is_boolean(t):
        return pa.int8()  # LOAD DATA reads 1/0, not true/false
    if pa.types.is_date64(t):
        return pa.date32()
    return t


def _file_csv_chunks(
    path: str, partition: Mapping[str, str], plan: _Plan, load_schema: pa.Schema, options: pa_csv.WriteOptions
) -> Iterator[bytes]:
    """One staged file's rows as CSV, one chunk per Parquet record batch (pyarrow does the work, in C++)."""
    parquet = pq.ParquetFile(path)
    for batch in parquet.iter_batches(batch_size=_BATCH_ROWS, use_threads=False):
        table = pa.Table.from_batches([batch])
        if table.schema != load_schema:
            table = table.cast(load_schema, safe=False)
        for name in plan.partition_columns:
            table = table.append_column(
                name, pa.repeat(pa.scalar(partition[name], pa.string()), table.num_rows)
            )
        sink = io.BytesIO()
        pa_csv.write_csv(table, sink, options)
        yield sink.getvalue()


_DONE = object()


def _csv_chunks(plan: _Plan, *, mysql: bool, workers: int = _CONVERT_THREADS) -> Iterator[bytes]:
    """Every staged row as CSV chunks, converted by ``workers`` threads while the caller sends.

    Why threads: converting Parquet to CSV costs about half as much as the
    database's own load; done ahead (pyarrow releases the GIL) it overlaps the
    send instead of adding to it. Rows of a table have no order, so chunks of
    different files arrive interleaved. A worker's error is raised here.
    """
    load_schema = pa.schema([pa.field(f.name, _load_type(f.type, mysql=mysql)) for f in plan.schema])
    options = pa_csv.WriteOptions(include_header=False, null_string="NULL" if mysql else "")
    files = iter(plan.files)
    lock = threading.Lock()
    chunks: queue.Queue[Any] = queue.Queue(maxsize=2 * workers + 2)
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                chunks.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        try:
            while not stop.is_set():
                with lock:
                    item = next(files, None)
                if item is None:
                    break
                for chunk in _file_csv_chunks(item[0], item[1], plan, load_schema, options):
                    if not put(chunk):
                        return
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which raises it
            put(exc)
        finally:
            put(_DONE)

    threads = [
        threading.Thread(target=work, name=f"walsink-sql-csv-{i}", daemon=True)
        for i in range(max(1, min(workers, len(plan.files))))
    ]
    for t in threads:
        t.start()
    try:
        running = len(threads)
        while running:
            item = chunks.get()
            if item is _DONE:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        stop.set()
        for t in threads:
            t.join()


class _ChunkReader(io.RawIOBase):
    """A file-like view of an iterator of byte chunks (what a driver's COPY reads from)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buffer = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while not self._buffer:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._buffer = memoryview(chunk)
        n = min(len(b), len(self._buffer))
        b[:n] = self._buffer[:n]
        self._buffer = self._buffer[n:]
        return n


def _pg_copy(dbapi: Any, sql: str, chunks: Iterator[bytes]) -> int:
    cursor = dbapi.cursor()
    try:
        if hasattr(cursor, "copy_expert"):  # psycopg2
            cursor.copy_expert(sql, _ChunkReader(chunks), size=1 << 20)
            return cursor.rowcount
        with cursor.copy(sql) as copy:  # psycopg 3
            for chunk in chunks:
                copy.write(chunk)
        return cursor.rowcount
    finally:
        cursor.close()


def _mysql_load(dbapi: Any, table_sql: str, columns_sql: str, chunks: Iterator[bytes]) -> int:
    """``LOAD DATA LOCAL INFILE`` of the chunks, through a private named pipe.

    PyMySQL sends a LOCAL file by opening it by name; a FIFO lets a feeder
    thread write the CSV while the server loads it (no temporary copy on
    disk, conversion overlapping the load, as the PostgreSQL COPY does).
    """
    tmp = tempfile.mkdtemp(prefix="walsink-sql-")
    fifo = os.path.join(tmp, "rows.csv")
    os.mkfifo(fifo, 0o600)
    failed: list[BaseException] = []

    def feed() -> None:
        try:
            with open(fifo, "wb") as f:  # returns once PyMySQL opens the other end
                for chunk in chunks:
                    f.write(chunk)
        except BrokenPipeError:
            pass  # the reader went away: the load has failed and says why
        except BaseException as exc:  # noqa: BLE001 - raised by the caller below
            failed.append(exc)

    feeder = threading.Thread(target=feed, name="walsink-sql-feed", daemon=True)
    feeder.start()
    try:
        cursor = dbapi.cursor()
        try:
            # %s: PyMySQL quotes the file name as a string literal; identifiers come quoted by the preparer.
            cursor.execute(
                f"LOAD DATA LOCAL INFILE %s INTO TABLE {table_sql} CHARACTER SET utf8mb4 "
                "FIELDS TERMINATED BY ',' OPTIONALLY ENCLOSED BY '\"' ESCAPED BY '' "
                f"LINES TERMINATED BY '\\n' ({columns_sql})",
                (fifo,),
            )
            loaded = cursor.rowcount
            # LOCAL implies IGNORE: bad values and duplicate keys become warnings. Refuse them.
            cursor.execute("SHOW WARNINGS LIMIT 5")
            warnings = [w for w in cursor.fetchall() if str(w[0]).lower() in ("warning", "error")]
        finally:
            cursor.close()
    finally:
        _release_feeder(fifo, feeder)
        shutil.rmtree(tmp, ignore_errors=True)
    if failed:
        raise failed[0]  # the rows sent were incomplete; the caller's transaction rolls back
    if warnings:
        raise SqlTargetError(
            "LOAD DATA reported problems, rolled back: " + "; ".join(f"{w[1]}: {w[2]}" for w in warnings)
        )
    return loaded


def _release_feeder(fifo: str, feeder: threading.Thread) -> None:
    """Wait for the feeder; if the load never read the pipe, open and close it so the feeder ends."""
    while feeder.is_alive():
        try:
            fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            feeder.join(0.05)
            continue
        try:
            feeder.join(0.05)
        finally:
            os.close(fd)


def url_from_connection(conn_id: str, fields: Mapping[str, Any]) -> URL:
    """A SQLAlchemy URL for an Airflow ``postgres`` or ``mysql`` connection's fields."""
    conn_type = str(fields.get("conn_type") or "").lower()
    driver = CONN_TYPE_DRIVERS.get(conn_type)
    if driver is None:
        raise SqlTargetError(
            f"connection {conn_id!r} has type {conn_type or 'none'!r}; the sql target needs one of "
            f"{sorted(CONN_TYPE_DRIVERS)}"
        )
    extra = fields.get("extra") or {}
    query = {
        k: str(v) for k, v in extra.items() if k in ("sslmode", "sslrootcert", "sslcert", "sslkey", "charset")
    }
    return URL.create(
        driver,
        username=fields.get("login") or None,
        password=fields.get("password") or None,
        host=fields.get("host") or None,
        port=int(fields["port"]) if fields.get("port") else None,
        database=fields.get("schema") or None,
        query=query,
    )
