"""The committer store: every checkpoint state change, one transaction each.

Flink's ``CheckpointCommitter`` keeps ``isCheckpointCommitted`` /
``commitCheckpoint`` outside Flink's own state; this is that, for the whole
life cycle. Each public method

* runs in one database transaction that locks the checkpoint's row, checks
  the transition is allowed, updates the row and appends a
  :class:`Transition` naming who made it (invariant 7);
* is idempotent: repeating a call that already took effect (say after the
  connection dropped before the commit was acknowledged) succeeds again
  instead of failing, so transient database errors can be retried safely;
* binds every value as a parameter; no identifier is ever formatted into SQL.

On PostgreSQL the two transitions every commit makes (taking the lease,
recording COMMITTED) are each one statement in one round trip: a
data-modifying CTE locks the row, checks the transition, updates the row and
inserts the history row (see :func:`_one_statement_transition`). When its
checks do not hold (a held or expired lease, an ``append`` pipeline, an
already committed checkpoint) it changes nothing and the general path above
runs, which gives the precise answer or error. SQLite and MySQL/MariaDB have
no data-modifying CTEs and always take the general path.

Connections are not pinged on checkout: every method, reads included, is
retried on a dropped connection instead (:func:`_retrying`), which saves a
round trip per call.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import random
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, ParamSpec, TypeVar

from sqlalchemy import (
    Connection,
    Engine,
    Select,
    String,
    and_,
    bindparam,
    func,
    insert,
    literal,
    null,
    or_,
    select,
    update,
)
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError

from airflow_provider_walsink.faults import crashpoint
from airflow_provider_walsink.protocol.errors import WalsinkError
from airflow_provider_walsink.protocol.identifiers import validate_identifier
from airflow_provider_walsink.protocol.manifest import Manifest
from airflow_provider_walsink.protocol.states import TRANSITIONS, CheckpointState

from .engine import WRITE, create_committer_engine
from .migrate import upgrade
from .models import Timestamp
from .models import checkpoint_table as ckpt
from .models import pipeline_table as pipe
from .models import transition_table as trans

log = logging.getLogger(__name__)

S = CheckpointState
MODES = ("append", "overwrite")
#: States in which a checkpoint still holds data a later commit may need.
OPEN_STATES = frozenset(s.value for s in S if not s.is_final)


class StoreError(WalsinkError):
    """A committer-store operation was refused; the message says why."""


class CheckpointNotFoundError(StoreError):
    pass


class TransitionError(StoreError):
    """The checkpoint is not in a state that allows the requested change."""


class StaleAttemptError(TransitionError):
    """An older write attempt tried to seal after a newer one started."""


class LeaseHeldError(StoreError):
    """Another committer holds a live lease on the checkpoint."""


class LeaseLostError(StoreError):
    """The lease expired and was taken over, or was released."""


class OrderingError(StoreError):
    """An ``append`` checkpoint must wait for an earlier one to commit (invariant 5)."""


@dataclass(frozen=True)
class Actor:
    """Who makes a transition: a free-form name plus the Airflow task instance, if any."""

    name: str
    dag_id: str | None = None
    run_id: str | None = None
    task_id: str | None = None
    try_number: int | None = None

    @classmethod
    def local(cls, label: str = "walsink") -> Actor:
        return cls(name=f"{label}@{socket.gethostname()}:{os.getpid()}")


@dataclass(frozen=True)
class CheckpointRecord:
    id: int
    pipeline: str
    checkpoint_key: str
    sequence: int
    state: CheckpointState
    attempt: int
    sealed_attempt: int | None
    manifest_uri: str | None
    manifest_digest: str | None
    committables: int | None
    rows: int | None
    bytes: int | None
    start_offsets: dict[str, Any] | None
    end_offsets: dict[str, Any] | None
    lease_owner: str | None
    lease_expires_at: datetime | None
    error: str | None
    dag_id: str | None
    run_id: str | None
    created_at: datetime
    updated_at: datetime
    sealed_at: datetime | None
    durable_at: datetime | None
    committed_at: datetime | None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> CheckpointRecord:
        values = dict(row)
        values["state"] = CheckpointState(values["state"])
        for key in ("start_offsets", "end_offsets"):
            values[key] = json.loads(values[key]) if values[key] is not None else None
        return cls(**values)

    @property
    def is_committed(self) -> bool:
        return self.state is S.COMMITTED


@dataclass(frozen=True)
class TransitionRecord:
    id: int
    checkpoint_id: int
    from_state: str | None
    to_state: str
    attempt: int
    at: datetime
    actor: str | None
    dag_id: str | None
    run_id: str | None
    task_id: str | None
    try_number: int | None
    detail: str | None


@dataclass(frozen=True)
class Lease:
    """A committer's right to publish one checkpoint until ``expires_at`` (naive UTC)."""

    pipeline: str
    checkpoint_key: str
    owner: str
    expires_at: datetime
    taken_over_from: str | None = None
    #: The checkpoint as the lease left it (COMMITTING, this owner), so the
    #: committer needs no second read of the row it just locked.
    record: CheckpointRecord | None = field(default=None, compare=False, repr=False)


def utcnow() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


P = ParamSpec("P")
T = TypeVar("T")

_RETRY_DELAYS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0)
# PostgreSQL serialization failure / deadlock; MySQL deadlock / lock wait timeout.
_TRANSIENT_SQLSTATES = {"40001", "40P01"}
_TRANSIENT_MYSQL_CODES = {1205, 1213}


def is_transient(exc: BaseException) -> bool:
    """True for database errors after which repeating the whole transaction is safe."""
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    orig = getattr(exc, "orig", None)
    # psycopg2 names the SQLSTATE pgcode, psycopg 3 sqlstate.
    if (getattr(orig, "pgcode", None) or getattr(orig, "sqlstate", None)) in _TRANSIENT_SQLSTATES:
        return True
    args = getattr(orig, "args", ())
    if args and isinstance(args[0], int) and args[0] in _TRANSIENT_MYSQL_CODES | {2003, 2006, 2013}:
        return True
    if isinstance(exc, OperationalError):
        text = str(orig).lower()
        return any(
            s in text
            for s in (
                "database is locked",
                "could not connect",
                "server closed",
                "connection refused",
                "terminating connection",
                "connection",
            )
        )
    return False


def _retrying(fn: Callable[P, T]) -> Callable[P, T]:
    """Repeat a store operation on transient database errors, with jittered backoff.

    Safe because every operation is idempotent (see the module docstring).
    """

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        for delay in (*_RETRY_DELAYS_S, None):
            try:
                return fn(*args, **kwargs)
            except DBAPIError as exc:
                if delay is None or not is_transient(exc):
                    raise
                log.warning(
                    "committer database: %s; retrying %s in %.2fs",
                    str(exc).splitlines()[0],
                    fn.__name__,
                    delay,
                )
                time.sleep(delay * (1 + random.random()))
        raise AssertionError("unreachable")

    return wrapper


#: History columns every transition writes (``_record`` and the one-statement path).
_HISTORY_COLUMNS = ("actor", "dag_id", "run_id", "task_id", "try_number", "detail")


def _history_values(actor: Actor, detail: str | None) -> dict[str, Any]:
    return dict(
        actor=actor.name[:255],
        dag_id=actor.dag_id,
        run_id=actor.run_id,
        task_id=actor.task_id,
        try_number=actor.try_number,
        detail=detail[:10000] if detail else None,
    )


@functools.cache
def _one_statement_transition(to: CheckpointState) -> Select:
    """One PostgreSQL statement that moves a checkpoint to COMMITTING or COMMITTED, or changes nothing.

    ``moved`` updates the row only if the general path would allow the move
    without asking anything more (below); ``hist`` appends the transition; the
    result is the moved row, or no row when nothing changed. Parameters
    (``p_`` and: pipeline, checkpoint_key, owner, now, expires, end_offsets
    and the history columns) never share a column's name: SQLAlchemy would
    add such a name to the UPDATE's SET clause.

    * COMMITTING (take the lease): the checkpoint is DURABLE, COMMITTING or
      FAILED after it was durable, with no lease or our own (a takeover of
      someone else's, expired or not, takes the general path). For
      ``overwrite`` pipelines only: ``append`` checks the order of commits.
      ``old`` locks the row first and keeps its state for the history, which
      RETURNING (new values only) cannot give.
    * COMMITTED: the checkpoint is COMMITTING under our lease, so that is the
      state before; the UPDATE's own row lock suffices.
    """
    where = and_(
        ckpt.c.pipeline == bindparam("p_pipeline"), ckpt.c.checkpoint_key == bindparam("p_checkpoint_key")
    )
    owner = bindparam("p_owner", type_=String)
    now = bindparam("p_now", type_=Timestamp)
    from_state: Any
    if to is S.COMMITTING:
        old = select(ckpt.c.id, ckpt.c.state.label("from_state")).where(where).with_for_update().cte("old")
        moved = (
            update(ckpt)
            .where(
                ckpt.c.id == old.c.id,
                or_(
                    old.c.from_state == S.DURABLE.value,
                    old.c.from_state == S.COMMITTING.value,
                    and_(old.c.from_state == S.FAILED.value, ckpt.c.durable_at.is_not(None)),
                ),
                or_(ckpt.c.lease_owner.is_(None), ckpt.c.lease_owner == owner),
            )
            .values(
                state=to.value,
                updated_at=now,
                lease_owner=owner,
                lease_expires_at=bindparam("p_expires", type_=Timestamp),
            )
            .returning(*ckpt.c, old.c.from_state)
            .cte("moved")
        )
        from_state = moved.c.from_state
    else:
        moved = (
            update(ckpt)
            .where(where, ckpt.c.state == S.COMMITTING.value, ckpt.c.lease_owner == owner)
            .values(
                state=to.value,
                updated_at=now,
                lease_owner=null(),
                lease_expires_at=null(),
                committed_at=now,
                error=null(),
                end_offsets=func.coalesce(bindparam("p_end_offsets", type_=String), ckpt.c.end_offsets),
            )
            .returning(*ckpt.c)
            .cte("moved")
        )
        from_state = literal(S.COMMITTING.value, String)
    hist = (
        insert(trans)
        .from_select(
            ["checkpoint_id", "from_state", "to_state", "attempt", "at", *_HISTORY_COLUMNS],
            select(
                moved.c.id,
                from_state,
                moved.c.state,
                moved.c.attempt,
                now,
                *(bindparam(f"p_{c}", type_=trans.c[c].type) for c in _HISTORY_COLUMNS),
            ),
        )
        .cte("hist")
    )
    return select(*(moved.c[c.name] for c in ckpt.c)).add_cte(hist)


class CommitterStore:
    """The committer table's API. Thread-safe; share one per process and engine."""

    def __init__(self, engine: Engine, *, clock: Callable[[], datetime] = utcnow) -> None:
        self.engine = engine
        self._clock = clock
        # Data-modifying CTEs: PostgreSQL only (see the module docstring).
        self._one_statement = engine.dialect.name == "postgresql"

    @classmethod
    def from_url(cls, url: str, *, migrate: bool = True, **engine_kwargs: Any) -> CommitterStore:
        store = cls(create_committer_engine(url, **engine_kwargs))
        if migrate:
            store.migrate()
        return store

    def migrate(self) -> None:
        """Create or upgrade the schema (Alembic, serialised across processes)."""
        upgrade(self.engine)

    def dispose(self) -> None:
        self.engine.dispose()

    # ------------------------------------------------------------------ plumbing

    @contextmanager
    def _tx(self) -> Iterator[Connection]:
        with self.engine.connect().execution_options(**{WRITE: True}) as conn, conn.begin():
            yield conn

    def _lock(self, conn: Connection, pipeline: str, key: str) -> dict[str, Any]:
        row = (
            conn.execute(
                select(ckpt)
                .where(ckpt.c.pipeline == pipeline, ckpt.c.checkpoint_key == key)
                .with_for_update()
            )
            .mappings()
            .first()
        )
        if row is None:
            raise CheckpointNotFoundError(f"checkpoint {pipeline}/{key} is not registered")
        return dict(row)

    def _move(
        self,
        conn: Connection,
        row: dict[str, Any],
        to: CheckpointState,
        actor: Actor,
        *,
        detail: str | None = None,
        **values: Any,
    ) -> CheckpointRecord:
        """Apply one allowed transition to a locked row and record it in the history."""
        current = CheckpointState(row["state"])
        if to not in TRANSITIONS[current]:
            raise TransitionError(
                f"checkpoint {row['pipeline']}/{row['checkpoint_key']} is {current}; it cannot move to {to}"
            )
        now = self._clock()
        values = {"state": to.value, "updated_at": now, **values}
        conn.execute(update(ckpt).where(ckpt.c.id == row["id"]).values(**values))
        self._record(
            conn,
            row["id"],
            current.value,
            to.value,
            values.get("attempt", row["attempt"]),
            actor,
            detail,
            now,
        )
        row.update(values)
        return CheckpointRecord.from_row(row)

    def _record(
        self,
        conn: Connection,
        checkpoint_id: int,
        from_state: str | None,
        to_state: str,
        attempt: int,
        actor: Actor,
        detail: str | None,
        now: datetime,
    ) -> None:
        conn.execute(
            trans.insert().values(
                checkpoint_id=checkpoint_id,
                from_state=from_state,
                to_state=to_state,
                attempt=attempt,
                at=now,
                **_history_values(actor, detail),
            )
        )

    def _try_one_statement(
        self, to: CheckpointState, lease_owner: str, actor: Actor, detail: str | None, **params: Any
    ) -> CheckpointRecord | None:
        """Run :func:`_one_statement_transition` (autocommit: it is its own transaction)."""
        params.update(owner=lease_owner, **_history_values(actor, detail))
        params.setdefault("expires", None)
        params.setdefault("end_offsets", None)
        with self.engine.connect() as conn:
            # The statement is its own transaction. The driver's autocommit
            # switch is free; SQLAlchemy's isolation_level="AUTOCOMMIT" costs
            # psycopg2 a round trip per checkout to restore the level.
            driver = conn.connection.driver_connection
            driver.autocommit = True
            try:
                row = (
                    conn.execute(_one_statement_transition(to), {f"p_{k}": v for k, v in params.items()})
                    .mappings()
                    .first()
                )
            finally:
                if not conn.invalidated:
                    driver.autocommit = False
        return CheckpointRecord.from_row(row) if row is not None else None

    # ------------------------------------------------------------------ life cycle

    @_retrying
    def register(
        self,
        pipeline: str,
        checkpoint_key: str,
        *,
        mode: str,
        actor: Actor,
        target: str | None = None,
        start_offsets: Mapping[str, Any] | None = None,
    ) -> CheckpointRecord:
        """Register a checkpoint (idempotent) and give it the pipeline's next sequence number."""
        validate_identifier(pipeline, "pipeline id")
        validate_identifier(checkpoint_key, "checkpoint key")
        if mode not in MODES:
            raise StoreError(f"mode must be one of {MODES}, got {mode!r}")
        try:
            with self._tx() as conn:
                existing = (
                    conn.execute(
                        select(ckpt).where(
                            ckpt.c.pipeline == pipeline, ckpt.c.checkpoint_key == checkpoint_key
                        )
                    )
                    .mappings()
                    .first()
                )
                if existing is not None:
                    return CheckpointRecord.from_row(_exact(existing, pipeline, checkpoint_key))
                now = self._clock()
                prow = (
                    conn.execute(select(pipe).where(pipe.c.name == pipeline).with_for_update())
                    .mappings()
                    .first()
                )
                if prow is not None and prow["name"] != pipeline:
                    raise StoreError(_collision("pipeline id", pipeline, prow["name"]))
                if prow is None:
                    conn.execute(
                        pipe.insert().values(
                            name=pipeline,
                            mode=mode,
                            target=target,
                            dag_id=actor.dag_id,
                            next_sequence=1,
                            created_at=now,
                        )
                    )
                    sequence = 1
                else:
                    if prow["mode"] != mode:
                        raise StoreError(
                            f"pipeline {pipeline} is registered in {prow['mode']} mode, not {mode}"
                        )
                    sequence = prow["next_sequence"]
                conn.execute(update(pipe).where(pipe.c.name == pipeline).values(next_sequence=sequence + 1))
                values = dict(
                    pipeline=pipeline,
                    checkpoint_key=checkpoint_key,
                    sequence=sequence,
                    state=S.REGISTERED.value,
                    attempt=0,
                    start_offsets=_dump(start_offsets),
                    dag_id=actor.dag_id,
                    run_id=actor.run_id,
                    created_at=now,
                    updated_at=now,
                )
                new_id = conn.execute(ckpt.insert().values(**values)).inserted_primary_key[0]
                self._record(conn, new_id, None, S.REGISTERED.value, 0, actor, None, now)
        except IntegrityError:
            # Another process registered the same checkpoint or pipeline first.
            with self.engine.connect() as conn:
                existing = (
                    conn.execute(
                        select(ckpt).where(
                            ckpt.c.pipeline == pipeline, ckpt.c.checkpoint_key == checkpoint_key
                        )
                    )
                    .mappings()
                    .first()
                )
            if existing is None:
                return self.register(
                    pipeline,
                    checkpoint_key,
                    mode=mode,
                    actor=actor,
                    target=target,
                    start_offsets=start_offsets,
                )
            return CheckpointRecord.from_row(_exact(existing, pipeline, checkpoint_key))
        return self.get(pipeline, checkpoint_key)  # type: ignore[return-value]

    @_retrying
    def start_attempt(
        self,
        pipeline: str,
        checkpoint_key: str,
        *,
        actor: Actor,
        start_offsets: Mapping[str, Any] | None = None,
    ) -> CheckpointRecord:
        """Start a new write attempt; any earlier attempt, sealed or not, no longer counts."""
        with self._tx() as conn:
            row = self._lock(conn, pipeline, checkpoint_key)
            state = CheckpointState(row["state"])
            if state is S.COMMITTED:
                raise TransitionError(f"checkpoint {pipeline}/{checkpoint_key} is already COMMITTED")
            if state is S.COMMITTING:
                raise TransitionError(
                    f"checkpoint {pipeline}/{checkpoint_key} is being committed by {row['lease_owner']}; "
                    "a new write attempt would race the publish"
                )
            values: dict[str, Any] = dict(
                attempt=row["attempt"] + 1,
                sealed_attempt=None,
                manifest_uri=None,
                manifest_digest=None,
                committables=None,
                rows=None,
                bytes=None,
                end_offsets=None,
                error=None,
                sealed_at=None,
                durable_at=None,
            )
            if start_offsets is not None:
                values["start_offsets"] = _dump(start_offsets)
            return self._move(conn, row, S.WRITING, actor, **values)

    @_retrying
    def seal(
        self,
        pipeline: str,
        checkpoint_key: str,
        *,
        attempt: int,
        manifest_uri: str,
        manifest_digest: str,
        committables: int,
        rows: int,
        bytes: int,  # noqa: A002 - the column's name
        actor: Actor,
        start_offsets: Mapping[str, Any] | None = None,
        end_offsets: Mapping[str, Any] | None = None,
    ) -> CheckpointRecord:
        """Record that ``attempt`` sealed its manifest. Only the current attempt may seal."""
        with self._tx() as conn:
            row = self._lock(conn, pipeline, checkpoint_key)
            if row["sealed_attempt"] == attempt and row["manifest_digest"] == manifest_digest:
                return CheckpointRecord.from_row(row)  # repeated call
            if row["attempt"] != attempt or row["state"] != S.WRITING.value:
                raise StaleAttemptError(
                    f"attempt {attempt} of {pipeline}/{checkpoint_key} cannot seal: the checkpoint is "
                    f"{row['state']} at attempt {row['attempt']} (only the newest attempt counts)"
                )
            values: dict[str, Any] = dict(
                sealed_attempt=attempt,
                manifest_uri=manifest_uri,
                manifest_digest=manifest_digest,
                committables=committables,
                rows=rows,
                bytes=bytes,
                end_offsets=_dump(end_offsets),
                sealed_at=self._clock(),
            )
            if start_offsets is not None:
                values["start_offsets"] = _dump(start_offsets)
            return self._move(conn, row, S.SEALED, actor, detail=manifest_digest, **values)

    def seal_manifest(
        self, manifest: Manifest, *, manifest_uri: str, manifest_digest: str, actor: Actor
    ) -> CheckpointRecord:
        """:meth:`seal` with every recorded figure taken from the sealed ``manifest`` itself."""
        return self.seal(
            manifest.pipeline,
            manifest.checkpoint_key,
            attempt=manifest.attempt,
            manifest_uri=manifest_uri,
            manifest_digest=manifest_digest,
            committables=manifest.expected_count,
            rows=manifest.total_rows,
            bytes=manifest.total_bytes,
            start_offsets=manifest.start_offsets,
            end_offsets=manifest.end_offsets,
            actor=actor,
        )

    @_retrying
    def mark_durable(
        self, pipeline: str, checkpoint_key: str, *, attempt: int, actor: Actor, detail: str | None = None
    ) -> CheckpointRecord:
        """Record that the sealed ``attempt`` was verified complete on storage."""
        with self._tx() as conn:
            row = self._lock(conn, pipeline, checkpoint_key)
            if row["sealed_attempt"] != attempt:
                raise StaleAttemptError(
                    f"attempt {attempt} of {pipeline}/{checkpoint_key} is not the sealed attempt "
                    f"({row['sealed_attempt']})"
                )
            if row["state"] in (S.DURABLE.value, S.COMMITTING.value, S.COMMITTED.value):
                return CheckpointRecord.from_row(row)
            return self._move(
                conn, row, S.DURABLE, actor, detail=detail, durable_at=self._clock(), error=None
            )

    @_retrying
    def acquire_lease(
        self,
        pipeline: str,
        checkpoint_key: str,
        *,
        owner: str,
        ttl: timedelta,
        actor: Actor,
        mode: str | None = None,
    ) -> Lease:
        """Take the right to publish a durable checkpoint (compare-and-set on the row).

        Succeeds when nobody holds the lease, when ``owner`` already holds it,
        or when the holder's lease has expired (takeover: the holder crashed).
        In ``append`` mode an earlier uncommitted checkpoint of the pipeline
        blocks this one, and the checkpoint's start offsets must continue the
        last committed checkpoint's end offsets.
        """
        if self._one_statement and mode == "overwrite":
            now = self._clock()
            expires = now + ttl
            record = self._try_one_statement(
                S.COMMITTING,
                owner,
                actor,
                f"lease until {expires:%H:%M:%S}",
                pipeline=pipeline,
                checkpoint_key=checkpoint_key,
                now=now,
                expires=expires,
            )
            if record is not None:
                return Lease(pipeline, checkpoint_key, owner, expires, record=record)
        with self._tx() as conn:
            row = self._lock(conn, pipeline, checkpoint_key)
            state = CheckpointState(row["state"])
            now = self._clock()
            if state is S.COMMITTED:
                raise TransitionError(f"checkpoint {pipeline}/{checkpoint_key} is already COMMITTED")
            if state is S.COMMITTING and row["lease_owner"] not in (None, owner):
                if row["lease_expires_at"] is not None and row["lease_expires_at"] > now:
                    raise LeaseHeldError(
                        f"checkpoint {pipeline}/{checkpoint_key} is being committed by {row['lease_owner']} "
                        f"(lease until {row['lease_expires_at']:%Y-%m-%d %H:%M:%S} UTC)"
                    )
            elif state not in (S.DURABLE, S.COMMITTING) and not (state is S.FAILED and row["durable_at"]):
                raise TransitionError(
                    f"checkpoint {pipeline}/{checkpoint_key} is {state}, not DURABLE; "
                    "it cannot be committed until its sealed attempt is verified"
                )
            if (mode or self._mode(conn, pipeline)) == "append":
                self._check_append_order(conn, row)
            previous = row["lease_owner"] if row["lease_owner"] not in (None, owner) else None
            if previous:
                crashpoint("lease.takeover")
            expires = now + ttl
            record = self._move(
                conn,
                row,
                S.COMMITTING,
                actor,
                detail=f"lease taken over from {previous}" if previous else f"lease until {expires:%H:%M:%S}",
                lease_owner=owner,
                lease_expires_at=expires,
            )
            return Lease(pipeline, checkpoint_key, owner, expires, taken_over_from=previous, record=record)

    def _mode(self, conn: Connection, pipeline: str) -> str:
        return conn.execute(select(pipe.c.mode).where(pipe.c.name == pipeline)).scalar_one()

    def _check_append_order(self, conn: Connection, row: Mapping[str, Any]) -> None:
        earlier = conn.execute(
            select(ckpt.c.checkpoint_key, ckpt.c.state, ckpt.c.sequence)
            .where(
                ckpt.c.pipeline == row["pipeline"],
                ckpt.c.sequence < row["sequence"],
                ckpt.c.state.notin_([S.COMMITTED.value, S.ABORTED.value]),
            )
            .order_by(ckpt.c.sequence)
            .limit(1)
        ).first()
        if earlier is not None:
            raise OrderingError(
                f"append checkpoint {row['pipeline']}/{row['checkpoint_key']} (sequence {row['sequence']}) "
                f"waits for earlier checkpoint {earlier.checkpoint_key} (sequence {earlier.sequence}, "
                f"{earlier.state}) to commit or be aborted"
            )
        last = conn.execute(
            select(ckpt.c.checkpoint_key, ckpt.c.end_offsets)
            .where(
                ckpt.c.pipeline == row["pipeline"],
                ckpt.c.sequence < row["sequence"],
                ckpt.c.state == S.COMMITTED.value,
                ckpt.c.end_offsets.is_not(None),
            )
            .order_by(ckpt.c.sequence.desc())
            .limit(1)
        ).first()
        if last is not None and row["start_offsets"] is not None:
            if json.loads(row["start_offsets"]) != json.loads(last.end_offsets):
                raise OrderingError(
                    f"append checkpoint {row['pipeline']}/{row['checkpoint_key']} starts at offsets "
                    f"{row['start_offsets']} but the last committed checkpoint {last.checkpoint_key} ended "
                    f"at {last.end_offsets}; write it again from the committed offsets"
                )

    @_retrying
    def renew_lease(self, lease: Lease, ttl: timedelta) -> Lease:
        """Extend a held lease; raise :class:`LeaseLostError` if it is no longer ours."""
        now = self._clock()
        expires = now + ttl
        with self._tx() as conn:
            result = conn.execute(
                update(ckpt)
                .where(
                    ckpt.c.pipeline == lease.pipeline,
                    ckpt.c.checkpoint_key == lease.checkpoint_key,
                    ckpt.c.state == S.COMMITTING.value,
                    ckpt.c.lease_owner == lease.owner,
                )
                .values(lease_expires_at=expires, updated_at=now)
            )
            if result.rowcount != 1:
                raise LeaseLostError(
                    f"lease of {lease.owner} on {lease.pipeline}/{lease.checkpoint_key} was lost"
                )
        return replace(lease, expires_at=expires)

    @_retrying
    def release_lease(self, lease: Lease) -> None:
        """Give a lease back without committing (the checkpoint stays COMMITTING, lease free)."""
        with self._tx() as conn:
            conn.execute(
                update(ckpt)
                .where(
                    ckpt.c.pipeline == lease.pipeline,
                    ckpt.c.checkpoint_key == lease.checkpoint_key,
                    ckpt.c.lease_owner == lease.owner,
                )
                .values(lease_owner=None, lease_expires_at=None)
            )

    @_retrying
    def mark_committed(
        self,
        lease: Lease,
        *,
        actor: Actor,
        end_offsets: Mapping[str, Any] | None = None,
        detail: str | None = None,
    ) -> CheckpointRecord:
        """Record the commit. Only the lease holder may, and only once."""
        if self._one_statement:
            record = self._try_one_statement(
                S.COMMITTED,
                lease.owner,
                actor,
                detail,
                pipeline=lease.pipeline,
                checkpoint_key=lease.checkpoint_key,
                now=self._clock(),
                end_offsets=_dump(end_offsets),
            )
            if record is not None:
                return record
        with self._tx() as conn:
            row = self._lock(conn, lease.pipeline, lease.checkpoint_key)
            if row["state"] == S.COMMITTED.value:
                return CheckpointRecord.from_row(row)  # repeated call after a lost acknowledgement
            if row["state"] != S.COMMITTING.value or row["lease_owner"] != lease.owner:
                raise LeaseLostError(
                    f"cannot mark {lease.pipeline}/{lease.checkpoint_key} COMMITTED: lease of {lease.owner} "
                    f"was lost (state {row['state']}, holder {row['lease_owner']})"
                )
            values: dict[str, Any] = dict(
                lease_owner=None,
                lease_expires_at=None,
                committed_at=self._clock(),
                error=None,
            )
            if end_offsets is not None:
                values["end_offsets"] = _dump(end_offsets)
            return self._move(conn, row, S.COMMITTED, actor, detail=detail, **values)

    @_retrying
    def fail(
        self,
        pipeline: str,
        checkpoint_key: str,
        *,
        error: str,
        actor: Actor,
        lease: Lease | None = None,
    ) -> CheckpointRecord:
        """Record an error; the checkpoint stays uncommitted (FAILED) and keeps its data.

        A committer passes its lease: if the lease was taken over meanwhile, the
        new holder's progress is not disturbed and the error is only logged in
        the history.
        """
        with self._tx() as conn:
            row = self._lock(conn, pipeline, checkpoint_key)
            state = CheckpointState(row["state"])
            if state.is_final:
                raise TransitionError(f"checkpoint {pipeline}/{checkpoint_key} is {state}; it cannot fail")
            if lease is not None and state is S.COMMITTING and row["lease_owner"] != lease.owner:
                self._record(
                    conn,
                    row["id"],
                    state.value,
                    state.value,
                    row["attempt"],
                    actor,
                    f"error after losing the lease: {error}",
                    self._clock(),
                )
                return CheckpointRecord.from_row(row)
            return self._move(
                conn,
                row,
                S.FAILED,
                actor,
                detail=error,
                error=error[:10000],
                lease_owner=None,
                lease_expires_at=None,
            )

    @_retrying
    def abort(self, pipeline: str, checkpoint_key: str, *, reason: str, actor: Actor) -> CheckpointRecord:
        """Give a checkpoint up for good (it unblocks later ``append`` checkpoints)."""
        with self._tx() as conn:
            row = self._lock(conn, pipeline, checkpoint_key)
            if row["state"] == S.ABORTED.value:
                return CheckpointRecord.from_row(row)
            if row["state"] == S.COMMITTING.value:
                raise TransitionError(
                    f"checkpoint {pipeline}/{checkpoint_key} is being committed; it cannot be aborted now"
                )
            return self._move(conn, row, S.ABORTED, actor, detail=reason, error=reason[:10000])

    @_retrying
    def record_event(self, pipeline: str, checkpoint_key: str, *, actor: Actor, detail: str) -> None:
        """Append a history row that changes no state (from = to = the current state).

        Used to record that a task ran against the checkpoint and deliberately
        did nothing, e.g. a backfill re-run that skipped a COMMITTED checkpoint,
        so the audit trail shows every run that touched it.
        """
        with self._tx() as conn:
            row = self._lock(conn, pipeline, checkpoint_key)
            self._record(
                conn, row["id"], row["state"], row["state"], row["attempt"], actor, detail, self._clock()
            )

    # ------------------------------------------------------------------ queries

    @_retrying
    def get(self, pipeline: str, checkpoint_key: str) -> CheckpointRecord | None:
        if not (_is_identifier(pipeline) and _is_identifier(checkpoint_key)):
            return None  # register() never stores such a name (and a NUL would make the driver raise)
        with self.engine.connect() as conn:
            row = (
                conn.execute(
                    select(ckpt).where(ckpt.c.pipeline == pipeline, ckpt.c.checkpoint_key == checkpoint_key)
                )
                .mappings()
                .first()
            )
        if row is None or (row["pipeline"], row["checkpoint_key"]) != (pipeline, checkpoint_key):
            return None  # not a case-insensitive match (MySQL/MariaDB collation): not this checkpoint
        return CheckpointRecord.from_row(row)

    def require(self, pipeline: str, checkpoint_key: str) -> CheckpointRecord:
        record = self.get(pipeline, checkpoint_key)
        if record is None:
            raise CheckpointNotFoundError(f"checkpoint {pipeline}/{checkpoint_key} is not registered")
        return record

    def is_committed(self, pipeline: str, checkpoint_key: str) -> bool:
        record = self.get(pipeline, checkpoint_key)
        return record is not None and record.is_committed

    @_retrying
    def last_committed_offsets(self, pipeline: str) -> dict[str, Any] | None:
        """End offsets of the pipeline's latest committed checkpoint (where the next one starts)."""
        with self.engine.connect() as conn:
            value = conn.execute(
                select(ckpt.c.end_offsets)
                .where(
                    ckpt.c.pipeline == pipeline,
                    ckpt.c.state == S.COMMITTED.value,
                    ckpt.c.end_offsets.is_not(None),
                )
                .order_by(ckpt.c.sequence.desc())
                .limit(1)
            ).scalar()
        return json.loads(value) if value is not None else None

    @_retrying
    def pending(self, pipeline: str) -> list[CheckpointRecord]:
        """Checkpoints neither committed nor aborted, in sequence order."""
        with self.engine.connect() as conn:
            rows = (
                conn.execute(
                    select(ckpt)
                    .where(ckpt.c.pipeline == pipeline, ckpt.c.state.in_(OPEN_STATES))
                    .order_by(ckpt.c.sequence)
                )
                .mappings()
                .all()
            )
        return [CheckpointRecord.from_row(r) for r in rows]

    @_retrying
    def checkpoints(
        self,
        pipeline: str,
        *,
        states: list[str] | None = None,
        after_sequence: int | None = None,
        before_sequence: int | None = None,
        limit: int = 100,
        descending: bool = True,
    ) -> list[CheckpointRecord]:
        """One page of a pipeline's checkpoints, keyset-paginated by sequence."""
        query = select(ckpt).where(ckpt.c.pipeline == pipeline)
        if states:
            query = query.where(ckpt.c.state.in_(states))
        if after_sequence is not None:
            query = query.where(ckpt.c.sequence > after_sequence)
        if before_sequence is not None:
            query = query.where(ckpt.c.sequence < before_sequence)
        order = ckpt.c.sequence.desc() if descending else ckpt.c.sequence
        with self.engine.connect() as conn:
            rows = conn.execute(query.order_by(order).limit(limit)).mappings().all()
        return [CheckpointRecord.from_row(r) for r in rows]

    @_retrying
    def checkpoints_of_run(
        self, dag_id: str, run_id: str | None = None, *, limit: int | None = None
    ) -> list[CheckpointRecord]:
        """Checkpoints registered by a DAG (or one of its runs), uses the (dag_id, run_id) index."""
        query = select(ckpt).where(ckpt.c.dag_id == dag_id)
        if run_id is not None:
            query = query.where(ckpt.c.run_id == run_id)
        query = query.order_by(ckpt.c.pipeline, ckpt.c.sequence)
        if limit is not None:
            query = query.limit(limit)
        with self.engine.connect() as conn:
            rows = conn.execute(query).mappings().all()
        return [CheckpointRecord.from_row(r) for r in rows]

    @_retrying
    def get_pipeline(self, name: str) -> dict[str, Any] | None:
        """One pipeline's row (name, mode, target, dag_id, next_sequence, created_at), or None."""
        with self.engine.connect() as conn:
            row = conn.execute(select(pipe).where(pipe.c.name == name)).mappings().first()
        return dict(row) if row is not None else None

    @_retrying
    def pipeline_summary(self, pipeline: str) -> dict[str, Any]:
        """Counts per state, the latest committed and the latest failed/aborted checkpoint.

        Cost does not grow with the pipeline's history: ``register()`` allocates
        sequence numbers without gaps in the same transaction as the row, and rows
        are never deleted, so the number of COMMITTED checkpoints is the number
        allocated (``next_sequence - 1``) minus the others, which are counted on
        their own (few) ranges of the (pipeline, state, sequence) index. The latest
        committed/failed checkpoints are "newest first, limit 1" probes on it.
        """
        latest = {}
        others = [s.value for s in S if s is not S.COMMITTED]
        with self.engine.connect() as conn:
            next_sequence = conn.execute(select(pipe.c.next_sequence).where(pipe.c.name == pipeline)).scalar()
            counts = dict(
                conn.execute(
                    select(ckpt.c.state, func.count())
                    .where(ckpt.c.pipeline == pipeline, ckpt.c.state.in_(others))
                    .group_by(ckpt.c.state)
                ).all()
            )
            committed = (next_sequence or 1) - 1 - sum(counts.values())
            if committed < 0:  # rows written around register(): count them exactly instead
                committed = conn.execute(
                    select(func.count()).where(ckpt.c.pipeline == pipeline, ckpt.c.state == S.COMMITTED.value)
                ).scalar_one()
            if committed:
                counts[S.COMMITTED.value] = committed
            for name, states in (
                ("committed", [S.COMMITTED.value]),
                ("error", [S.FAILED.value, S.ABORTED.value]),
            ):
                # One indexed "newest first, limit 1" probe per state, then the newer of them.
                found = []
                for state in states:
                    row = (
                        conn.execute(
                            select(ckpt)
                            .where(ckpt.c.pipeline == pipeline, ckpt.c.state == state)
                            .order_by(ckpt.c.sequence.desc())
                            .limit(1)
                        )
                        .mappings()
                        .first()
                    )
                    if row is not None:
                        found.append(CheckpointRecord.from_row(row))
                latest[name] = max(found, key=lambda r: r.sequence) if found else None
        return {"counts": counts, "latest_committed": latest["committed"], "last_error": latest["error"]}

    @_retrying
    def pipelines(self, *, with_counts: bool = True) -> list[dict[str, Any]]:
        """Every pipeline with its mode, target and (unless ``with_counts=False``, which
        skips a scan of the whole checkpoint table) checkpoint count per state."""
        with self.engine.connect() as conn:
            prows = conn.execute(select(pipe).order_by(pipe.c.name)).mappings().all()
            if not with_counts:
                return [dict(p) for p in prows]
            counts = conn.execute(
                select(ckpt.c.pipeline, ckpt.c.state, func.count()).group_by(ckpt.c.pipeline, ckpt.c.state)
            ).all()
        by_pipeline: dict[str, dict[str, int]] = {}
        for name, state, count in counts:
            by_pipeline.setdefault(name, {})[state] = count
        return [{**dict(p), "counts": by_pipeline.get(p["name"], {})} for p in prows]

    @_retrying
    def history(self, pipeline: str, checkpoint_key: str) -> list[TransitionRecord]:
        """The checkpoint's transitions, oldest first."""
        record = self.require(pipeline, checkpoint_key)
        with self.engine.connect() as conn:
            rows = (
                conn.execute(select(trans).where(trans.c.checkpoint_id == record.id).order_by(trans.c.id))
                .mappings()
                .all()
            )
        return [TransitionRecord(**r) for r in rows]

    @_retrying
    def expired_leases(self) -> list[CheckpointRecord]:
        now = self._clock()
        with self.engine.connect() as conn:
            rows = (
                conn.execute(
                    select(ckpt).where(
                        ckpt.c.state == S.COMMITTING.value,
                        or_(
                            ckpt.c.lease_owner.is_(None),
                            and_(ckpt.c.lease_expires_at.is_not(None), ckpt.c.lease_expires_at < now),
                        ),
                    )
                )
                .mappings()
                .all()
            )
        return [CheckpointRecord.from_row(r) for r in rows]


def _collision(what: str, given: str, stored: str) -> str:
    return (
        f"{what} {given!r} collides with the registered {stored!r}: this database compares them as "
        "equal (a case-insensitive collation, as MySQL/MariaDB use by default); use names that "
        "differ by more than letter case"
    )


def _exact(row: Mapping[str, Any], pipeline: str, checkpoint_key: str) -> Mapping[str, Any]:
    """The row only if it is the one asked for, byte for byte, never a case-insensitive match."""
    if row["pipeline"] != pipeline:
        raise StoreError(_collision("pipeline id", pipeline, row["pipeline"]))
    if row["checkpoint_key"] != checkpoint_key:
        raise StoreError(_collision("checkpoint key", checkpoint_key, row["checkpoint_key"]))
    return row


def _is_identifier(value: object) -> bool:
    try:
        validate_identifier(value, "identifier")
    except WalsinkError:
        return False
    return True


def _dump(offsets: Mapping[str, Any] | None) -> str | None:
    return json.dumps(offsets, sort_keys=True) if offsets is not None else None
