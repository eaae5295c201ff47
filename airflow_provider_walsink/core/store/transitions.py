"""Checkpoint transitions: the locked-row plumbing every state change of the store goes through.

One transaction per change (``_tx``), the checkpoint's row locked and read
with the database's time (``_lock``), the allowed move and its history row
(``_move``, ``_record``), history rows that change no state (``_event``,
:meth:`~CheckpointTransitions.record_event`), and the PostgreSQL
one-statement path (``_try_one_statement``, :mod:`.fastpath`). The history-row
helpers :mod:`.tablefence` shares (``_history_values``,
:func:`retire_superseded`) live here too.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, select, update
from sqlalchemy.sql.elements import ColumnElement

from airflow_provider_walsink.core.protocol.states import TRANSITIONS, CheckpointState
from airflow_provider_walsink.core.store.clock import as_datetime, db_now
from airflow_provider_walsink.core.store.engine import WRITE
from airflow_provider_walsink.core.store.errors import CheckpointNotFoundError, TransitionError
from airflow_provider_walsink.core.store.fastpath import HISTORY_COLUMNS, one_statement_transition
from airflow_provider_walsink.core.store.models import checkpoint_table as ckpt
from airflow_provider_walsink.core.store.models import transition_table as trans
from airflow_provider_walsink.core.store.models import version_table as vers
from airflow_provider_walsink.core.store.records import Actor, CheckpointRecord
from airflow_provider_walsink.core.store.retry import retrying

S = CheckpointState


def _history_values(actor: Actor, detail: str | None) -> dict[str, Any]:
    return dict(
        actor=actor.name[:255],
        dag_id=actor.dag_id,
        run_id=actor.run_id,
        task_id=actor.task_id,
        try_number=actor.try_number,
        detail=detail[:10000] if detail else None,
    )


assert tuple(_history_values(Actor("x"), None)) == HISTORY_COLUMNS


class CheckpointTransitions:
    """The base of the store's parts: the engine, the clock and the locked-row plumbing.

    :class:`~.store.CommitterStore` sets these attributes in its ``__init__``.
    """

    engine: Engine
    _clock: Callable[[], datetime] | None
    _dialect: str
    _one_statement: bool

    def _now_expr(self) -> ColumnElement:
        if self._clock is not None:
            from sqlalchemy import literal

            from airflow_provider_walsink.core.store.models import Timestamp

            return literal(self._clock(), Timestamp)
        return db_now(self._dialect)

    def _now(self, conn: Connection) -> datetime:
        """The database's current time (naive UTC), read inside ``conn``'s transaction."""
        if self._clock is not None:
            return self._clock()
        return as_datetime(conn.execute(select(db_now(self._dialect))).scalar_one())

    @contextmanager
    def _tx(self) -> Iterator[Connection]:
        with self.engine.connect().execution_options(**{WRITE: True}) as conn, conn.begin():
            yield conn

    def _lock(self, conn: Connection, pipeline: str, key: str) -> dict[str, Any]:
        """Lock the checkpoint's row; the row's ``_now`` is the database's time, read with it."""
        row = (
            conn.execute(
                select(ckpt, self._now_expr().label("_now"))
                .where(ckpt.c.pipeline == pipeline, ckpt.c.checkpoint_key == key)
                .with_for_update()
            )
            .mappings()
            .first()
        )
        if row is None:
            raise CheckpointNotFoundError(f"checkpoint {pipeline}/{key} is not registered")
        values = dict(row)
        values["_now"] = as_datetime(values["_now"])
        return values

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
        now = row["_now"]
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

    def _event(self, conn: Connection, row: Mapping[str, Any], actor: Actor, detail: str) -> None:
        """A history row that changes no state (from = to = the current state)."""
        self._record(conn, row["id"], row["state"], row["state"], row["attempt"], actor, detail, row["_now"])

    def _try_one_statement(
        self,
        to: CheckpointState,
        actor: Actor,
        detail: str | None,
        *,
        require_audit: bool = False,
        **params: Any,
    ) -> CheckpointRecord | None:
        """Run :func:`.fastpath.one_statement_transition` (autocommit: it is its own transaction)."""
        params.update(**_history_values(actor, detail))
        for name in ("owner", "ttl", "epoch", "end_offsets", "publication"):
            params.setdefault(name, None)
        with self.engine.connect() as conn:
            # The statement is its own transaction. The driver's autocommit
            # switch is free; SQLAlchemy's isolation_level="AUTOCOMMIT" costs
            # psycopg2 a round trip per checkout to restore the level.
            driver = conn.connection.driver_connection
            driver.autocommit = True
            try:
                row = (
                    conn.execute(
                        one_statement_transition(to, require_audit=require_audit),
                        {f"p_{k}": v for k, v in params.items()},
                    )
                    .mappings()
                    .first()
                )
            finally:
                if not conn.invalidated:
                    driver.autocommit = False
        return CheckpointRecord.from_row(row) if row is not None else None

    @retrying
    def record_event(self, pipeline: str, checkpoint_key: str, *, actor: Actor, detail: str) -> None:
        """Append a history row that changes no state (from = to = the current state).

        Used to record that a task ran against the checkpoint and deliberately
        did nothing, e.g. a backfill re-run that skipped a COMMITTED checkpoint,
        so the audit trail shows every run that touched it.
        """
        with self._tx() as conn:
            self._event(conn, self._lock(conn, pipeline, checkpoint_key), actor, detail)


def retire_superseded(conn: Connection, row: Mapping[str, Any], detail: str | None) -> str | None:
    """In the COMMITTED transaction of a new version: mark the version it replaced SUPERSEDED,
    linked to its successor, and say so in the history ``detail`` (returned)."""
    if row["supersedes_attempt_id"] is None:
        return detail
    superseded = conn.execute(
        update(vers)
        .where(
            vers.c.checkpoint_id == row["id"],
            vers.c.attempt_id == row["supersedes_attempt_id"],
            vers.c.state == S.COMMITTED.value,
        )
        .values(
            state=S.SUPERSEDED.value,
            superseded_at=row["_now"],
            superseded_by_attempt_id=row["sealed_attempt_id"],
        )
    ).rowcount
    if not superseded:
        return detail
    return (
        f"{detail + '; ' if detail else ''}version {row['version'] - 1} (attempt "
        f"{row['supersedes_attempt_id']}) SUPERSEDED by version {row['version']} "
        f"(attempt {row['sealed_attempt_id']})"
    )


def _dump(value: Mapping[str, Any] | None) -> str | None:
    return json.dumps(value, sort_keys=True) if value is not None else None
