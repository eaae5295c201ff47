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

Order (invariant 10): a ``replace`` by key is refused (:class:`OrderError`)
when a newer checkpoint key of the pipeline recorded one of its key values,
unless ``allow_older_overwrite``; checked in the same transaction under the
pipeline's row of ``<marker table>_order`` (``_check_order``).

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

This module is the publisher and its transaction; what it builds on has a
module each: the load plan (:mod:`.plan`), the marker table
(:mod:`.markers`), names, types and errors (:mod:`.schema`) and the
bulk load (:mod:`.load`).
"""

from __future__ import annotations

import importlib.util
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import unquote, urlsplit

import sqlalchemy as sa
from sqlalchemy.dialects import mysql as mysql_types
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import DBAPIError, IntegrityError

from airflow_provider_walsink.core.protocol.errors import (
    NOTHING_DONE,
    CommittableError,
    FencedError,
    LayoutError,
    SupersedeError,
)
from airflow_provider_walsink.core.protocol.manifest import Manifest
from airflow_provider_walsink.core.protocol.partitions import partition_dir
from airflow_provider_walsink.core.staging.cleanup import remove_staged_attempts
from airflow_provider_walsink.core.staging.layout import StagingLayout
from airflow_provider_walsink.core.staging.object_store import StagingStore
from airflow_provider_walsink.core.targets._reach import REACH_TIMEOUT, host_port, one_line, within
from airflow_provider_walsink.core.targets._tables import refuse_supersede, superseded_attempt
from airflow_provider_walsink.core.targets.base import (
    Publisher,
    PublisherContext,
    PublishOutcome,
    PublishResult,
    TargetCapabilities,
    check_partition_order,
)
from airflow_provider_walsink.core.targets.registry import (
    TargetUnreachableError,
    connection_missing,
    lookup_connection,
)
from airflow_provider_walsink.core.targets.sql.load import bulk_load
from airflow_provider_walsink.core.targets.sql.markers import (
    Marker,
    as_text,
    define_marker_table,
    define_order_table,
    marker_key,
    read_marker,
    upgrade_marker_table,
)
from airflow_provider_walsink.core.targets.sql.plan import LoadPlan, plan_load, replace_values

# The target's errors and validate_sql_identifier are imported from this module, their public home.
from airflow_provider_walsink.core.targets.sql.schema import SchemaMismatchError as SchemaMismatchError
from airflow_provider_walsink.core.targets.sql.schema import (
    SqlTargetError,
    check_schema,
    exact_string,
    sql_type_for,
    validate_sql_identifier,
)

# One logger for the whole target (its name is what users filter on), whichever module logs.
log = logging.getLogger("airflow_provider_walsink.core.targets.sql")

MODES = ("append", "replace")
#: Pipeline modes that mean ``replace`` here (the file target calls it ``overwrite``).
MODE_ALIASES = {"append": "append", "replace": "replace", "overwrite": "replace"}
DEFAULT_MARKER_TABLE = "walsink_markers"
#: Suffix of the table holding one row per pipeline that ``replace`` publishes lock, so their
#: order checks (invariant 10) run one at a time (``<marker table>_order``).
ORDER_TABLE_SUFFIX = "_order"
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
#: How often a publish that lost the race for a new marker row starts over (it then finds the row).
_RACE_RETRIES = 3


class SqlPublisher(Publisher):
    """Loads a sealed attempt's Parquet into one SQL table, exactly once (module docstring)."""

    kind: ClassVar[str] = "sql"
    capabilities: ClassVar[TargetCapabilities] = TargetCapabilities(
        atomic=True, needs_rename=False, remembers_commits=True, fenced_by_target=True
    )
    #: The connection the database URL was read from (``sql://<conn_id>/...``); ``None``: ``url`` given.
    conn_id: str | None = None

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
        allow_older_overwrite: bool = False,
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
        self.allow_older_overwrite = allow_older_overwrite
        self._engine: Engine | None = None
        self._markers = define_marker_table(self.marker_table, self.schema)
        self._order = define_order_table(
            validate_sql_identifier(self.marker_table + ORDER_TABLE_SUFFIX, "marker table name + '_order'"),
            self.schema,
        )
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
        named = None
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
            fields = lookup_connection(options, conn_id, needed_by=f"sql target {uri!r}")
            if fields is None:
                raise connection_missing(
                    conn_id,
                    needed_by=f"sql target {uri!r}",
                    how=f"of type {' or '.join(sorted(CONN_TYPE_DRIVERS))} pointing at the database",
                )
            url = url_from_connection(conn_id, fields)
            named = conn_id
        publisher = cls(
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
            allow_older_overwrite=bool(getattr(options, "allow_older_overwrite", False)),
            label=f"sql://{conn_id}/{name}" if conn_id else None,
        )
        publisher.conn_id = named
        return publisher

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            connect_args: dict[str, Any] = {}
            if self.dialect_name == "mysql":
                # LOAD DATA LOCAL needs the client's consent; only this publisher's engine gives it.
                connect_args["local_infile"] = True
            self._engine = sa.create_engine(self.url, pool_pre_ping=True, connect_args=connect_args)
        return self._engine

    def check_writable(self) -> None:
        """1. Before the write phase (``core/commit/preflight.py``): the database accepts a connection
        and answers ``SELECT 1`` within :data:`._reach.REACH_TIMEOUT` seconds.

        Raises:
            TargetUnreachableError: naming the connection (or the target's ``url``), the database's
                ``host:port`` and what went wrong.
        """
        where = host_port(self.url.render_as_string(hide_password=True))
        connection = f"connection {self.conn_id!r}" if self.conn_id else "the target's url (target_options)"

        def answer() -> None:
            with self.engine.connect() as conn:
                conn.execute(sa.text("SELECT 1"))

        try:
            within(REACH_TIMEOUT, answer, what=f"database at {where}")
        except Exception as exc:  # noqa: BLE001 - whatever the driver raises is the answer
            raise TargetUnreachableError(
                f"{self.describe()}: the database at {where} does not accept a connection with {connection} "
                f"({one_line(exc)}): fix that connection (host, port, login, database); {NOTHING_DONE}"
            ) from None

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
            marker = read_marker(conn, self._markers, manifest, lock=False)
        return marker.attempt_id if marker else None

    def finish(
        self,
        manifest: Manifest,
        layout: StagingStore | None = None,
        *,
        fence: Callable[[], None] | None = None,
    ) -> None:
        """After COMMITTED: mark the marker row finished, then remove the version's staged attempts
        (fenced, :mod:`~..protocol.cleanup`: ``fence()`` before each; later attempts stay).

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
                    .where(
                        *marker_key(self._markers, manifest),
                        self._markers.c.attempt_id == manifest.attempt_id,
                    )
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
            remove_staged_attempts(
                layout,
                manifest.pipeline,
                manifest.checkpoint_key,
                up_to=manifest.attempt,
                fence=fence or (lambda: None),
            )

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
            marker = read_marker(conn, self._markers, manifest, lock=False)
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
        self, manifest: Manifest, plan: LoadPlan, target: sa.Table | None, ctx: PublisherContext
    ) -> PublishResult:
        # READ COMMITTED on both: a locking read sees the latest committed marker,
        # and MySQL takes no gap locks (a concurrent first insert then waits on
        # the key and fails cleanly instead of deadlocking).
        with self.engine.connect().execution_options(isolation_level="READ COMMITTED") as conn:
            with conn.begin():
                self._set_lock_timeout(conn)
                try:
                    marker = read_marker(conn, self._markers, manifest, lock=True)
                except DBAPIError as exc:
                    raise self._lock_error(exc, manifest) from exc
                if marker is not None:
                    outcome = self._judge(marker, manifest, ctx)
                    if outcome is not None:
                        return outcome  # nothing was written; committing an empty transaction
                self._check_supersede(marker, manifest, plan, ctx)  # raises before any write: rolled back
                self._check_order(conn, manifest, plan)  # likewise
                if marker is not None:
                    conn.execute(
                        self._markers.update()
                        .where(*marker_key(self._markers, manifest))
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
                loaded = bulk_load(conn, target, plan, dialect_name=self.dialect_name)
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

    def _judge(self, marker: Marker, manifest: Manifest, ctx: PublisherContext) -> PublishResult | None:
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
        self, marker: Marker | None, manifest: Manifest, plan: LoadPlan, ctx: PublisherContext
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
        uncovered = sorted(marker.replaced_values - {as_text(v) for v in plan.replace_values}, key=repr)
        if uncovered:
            key = self._key_columns()
            shown = ", ".join(partition_dir(key, t) for t in uncovered[:5])
            raise SupersedeError(
                f"{name}: the new version (attempt {manifest.attempt_id}) does not cover {len(uncovered)} key "
                f"value(s) that attempt {marker.attempt_id} wrote ({shown}); replacing would leave its rows "
                f"there; {hint}"
            )

    def _check_order(self, conn: Connection, manifest: Manifest, plan: LoadPlan) -> None:
        """Invariant 10 in the load's transaction: ``replace`` never takes key values back to an older checkpoint.

        The key values a ``replace`` by key deletes play the partitions' part
        (:func:`.base.check_partition_order`): if a marker row of a newer
        checkpoint key of the pipeline, in this table, records one of them, the
        publish is refused (:class:`OrderError`, rolled back, nothing written)
        unless ``allow_older_overwrite``. Replace publishes of one pipeline take
        its row's lock in the order table first (:data:`ORDER_TABLE_SUFFIX`, held to COMMIT), so
        two racing ones cannot both pass the check. ``replace_predicate`` names
        no values: not ordered (docs/targets.md).
        """
        if self.mode != "replace" or self.replace_predicate or self.allow_older_overwrite:
            return
        m = self._markers
        order = self._order
        lock = order.c.pipeline == manifest.pipeline
        try:
            if conn.execute(sa.select(order.c.pipeline).where(lock).with_for_update()).first() is None:
                conn.execute(order.insert().values(pipeline=manifest.pipeline))
        except IntegrityError:
            raise _LostRace() from None  # another publisher created it: start over, then wait on it
        except DBAPIError as exc:
            raise self._lock_error(exc, manifest) from exc
        ours = {as_text(v) for v in plan.replace_values}
        rows = conn.execute(
            sa.select(m.c.checkpoint_key, m.c.replaced_values).where(
                m.c.pipeline == manifest.pipeline,
                m.c.target_table == self._target_name(),
                m.c.replaced_values.is_not(None),
            )
        ).all()
        # Keys compare as Python strings (the order every target uses), not in the database's collation.
        for key, raw in sorted(rows, reverse=True):
            if key <= manifest.checkpoint_key:
                break
            held = sorted(ours & {tuple(v) for v in json.loads(raw)}, key=repr)
            if held:
                columns = self._key_columns()
                check_partition_order(
                    manifest,
                    partition_dir(columns, held[0]),
                    manifest.pipeline,
                    key,
                    allow_older=False,
                    target=f"table {self._target_name()}",
                )

    def _recorded_values(self, plan: LoadPlan) -> str | None:
        """What the marker row records of the rows a ``replace`` by key wrote: its key values as text."""
        if self.mode != "replace" or self.replace_predicate:
            return None
        return json.dumps(sorted((list(as_text(v)) for v in plan.replace_values), key=repr))

    def _snapshot(self, manifest: Manifest, epoch: int) -> str:
        return (
            f"{self.marker_table}:{manifest.pipeline}/{manifest.checkpoint_key}@{manifest.attempt_id}#{epoch}"
        )

    def _target_name(self) -> str:
        return f"{self.schema}.{self.table}" if self.schema else self.table

    # ------------------------------------------------------------------ planning

    def _plan(self, manifest: Manifest, attempt_dir: Path) -> LoadPlan:
        """Check the staged files and read their schema; raise before anything is written."""
        if manifest.file_format != "parquet":
            raise SqlTargetError(
                f"the sql target loads Parquet, but the checkpoint is {manifest.file_format!r}"
            )
        if self.layout is None:
            raise SqlTargetError("the sql target needs the staging layout to find the staged files")
        plan = plan_load(manifest, self.layout.committable_resolver(Path(attempt_dir)))
        if self.partition_by and plan.files and plan.partition_columns != list(self.partition_by):
            # As every target: committables partitioned otherwise than declared are refused.
            raise LayoutError(
                f"checkpoint {manifest.pipeline}/{manifest.checkpoint_key}: committables are partitioned by "
                f"{plan.partition_columns or 'nothing'}, the pipeline declares {list(self.partition_by)}; "
                "target left unchanged"
            )
        # Checked here, not when built: the write task builds a publisher only to ask where to stage.
        if self.mode == "replace" and not (self.replace_key or self.replace_predicate or self.partition_by):
            raise SqlTargetError(
                "replace mode needs the interval's rows to be named: set extra 'replace_key' (column names) "
                "or 'replace_predicate' (SQL with :pipeline, :checkpoint_key, :sequence), or declare "
                "partition columns"
            )
        if self.mode == "replace" and not self.replace_predicate:
            plan.replace_values = replace_values(manifest, plan, self._key_columns())
        return plan

    def _key_columns(self) -> list[str]:
        return list(self.replace_key or self.partition_by)

    # ------------------------------------------------------------------ tables

    def _ensure_markers(self) -> None:
        """Create the marker table, or add the column walsink 0.4 added to an older one (once per publisher)."""
        if self._markers_ready:
            return
        self._ensure_table(self._markers)
        upgrade_marker_table(self.engine, self._markers)
        if self.mode == "replace":
            self._ensure_table(self._order)
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

    def _prepare_target(self, plan: LoadPlan) -> sa.Table | None:
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
            # Columns that name rows (partition and replace key columns) compare exactly.
            keys = set(self._key_columns())
            columns = [
                sa.Column(f.name, sql_type_for(f, key=f.name in keys), nullable=f.nullable)
                for f in plan.schema
            ]
            # Nullable: Spark writes a NULL (and an empty) partition value as the NULL partition.
            columns += [sa.Column(c, exact_string(255), nullable=True) for c in plan.partition_columns]
            self._ensure_table(sa.Table(self.table, metadata, *columns, schema=self.schema))
        reflected = sa.inspect(self.engine).get_columns(self.table, schema=self.schema)
        check_schema(
            plan.schema,
            plan.partition_columns,
            reflected,
            mysql=self.dialect_name == "mysql",
            target_name=self._target_name(),
            null_partitions={c for _, values in plan.files for c, v in values.items() if v is None},
        )
        return sa.Table(
            self.table,
            sa.MetaData(),
            *[sa.Column(c["name"], c["type"]) for c in reflected],
            schema=self.schema,
        )

    def _delete_interval(
        self, conn: Connection, target: sa.Table, manifest: Manifest, plan: LoadPlan
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
        binary = [self.dialect_name == "mysql" and isinstance(c.type, sa.String) for c in cols]

        def equal(values: tuple[Any, ...]) -> Any:
            # The NULL partition is a value too: replaced by IS NULL ("= NULL" matches nothing). On
            # MySQL/MariaDB strings compare as bytes: in the column's collation a table made by hand
            # may ignore case (replacing "us" must not delete "US"), and every _bin collation but
            # the NO PAD ones pads with spaces (replacing "a" must not delete "a ").
            terms = []
            for c, v, b in zip(cols, values, binary, strict=True):
                if v is None:
                    terms.append(c.is_(None))
                elif b:
                    terms.append(
                        sa.cast(c, mysql_types.BINARY()) == sa.cast(sa.literal(v), mysql_types.BINARY())
                    )
                else:
                    terms.append(c == v)
            return sa.and_(*terms)

        plain = [v for v in plan.replace_values if None not in v]
        terms = [equal(v) for v in plan.replace_values if None in v]
        if plain:
            # The plain IN keeps the key's index usable; on MySQL/MariaDB the byte comparison decides.
            within = cols[0].in_([v[0] for v in plain]) if len(cols) == 1 else sa.tuple_(*cols).in_(plain)
            terms.append(sa.and_(within, sa.or_(*map(equal, plain))) if any(binary) else within)
        clause = sa.or_(*terms)
        conn.execute(target.delete().where(clause))
        return [partition_dir(key, values) for values in plan.replace_values]


class _LostRace(Exception):
    """A concurrent publisher created the checkpoint's marker row first."""


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
