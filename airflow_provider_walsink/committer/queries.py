"""The committer store's read model: the queries the committer, the UI and the CLI ask.

Read-only, each one statement or a few on indexed ranges; retried on a
dropped connection like every store call.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, and_, func, or_, select
from sqlalchemy.sql.elements import ColumnElement

from airflow_provider_walsink.protocol.errors import WalsinkError
from airflow_provider_walsink.protocol.identifiers import validate_identifier
from airflow_provider_walsink.protocol.states import ERROR_STATES, CheckpointState

from .errors import CheckpointNotFoundError
from .models import checkpoint_table as ckpt
from .models import pipeline_table as pipe
from .models import transition_table as trans
from .models import version_table as vers
from .records import CheckpointRecord, TransitionRecord, VersionRecord
from .retry import retrying

S = CheckpointState
#: States in which a checkpoint still holds data a later commit may need.
OPEN_STATES = frozenset(s.value for s in S if not s.is_final)


class CheckpointQueries:
    """Read-only queries; mixed into :class:`~airflow_provider_walsink.committer.store.CommitterStore`."""

    engine: Engine

    def _now_expr(self) -> ColumnElement:
        raise NotImplementedError

    @retrying
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

    @retrying
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

    @retrying
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

    @retrying
    def first_open(self, pipeline: str) -> CheckpointRecord | None:
        """The pipeline's earliest checkpoint neither COMMITTED nor ABORTED: in ``append`` mode
        it blocks every later one (invariant 5). One indexed probe per such state."""
        found = []
        with self.engine.connect() as conn:
            for state in _BLOCKING_STATES:
                row = (
                    conn.execute(
                        select(ckpt)
                        .where(ckpt.c.pipeline == pipeline, ckpt.c.state == state)
                        .order_by(ckpt.c.sequence)
                        .limit(1)
                    )
                    .mappings()
                    .first()
                )
                if row is not None:
                    found.append(CheckpointRecord.from_row(row))
        return min(found, key=lambda r: r.sequence) if found else None

    @retrying
    def checkpoints(
        self,
        pipeline: str,
        *,
        states: list[str] | None = None,
        after_sequence: int | None = None,
        before_sequence: int | None = None,
        limit: int = 100,
        descending: bool = True,
        registered_before: datetime | None = None,
    ) -> list[CheckpointRecord]:
        """One page of a pipeline's checkpoints, keyset-paginated by sequence.

        ``registered_before`` (naive UTC): only checkpoints registered before it that are
        neither COMMITTED nor ABORTED ("not committed for longer than X").
        """
        query = select(ckpt).where(ckpt.c.pipeline == pipeline)
        if states:
            query = query.where(ckpt.c.state.in_(states))
        if registered_before is not None:
            query = query.where(ckpt.c.state.in_(_BLOCKING_STATES), ckpt.c.created_at <= registered_before)
        if after_sequence is not None:
            query = query.where(ckpt.c.sequence > after_sequence)
        if before_sequence is not None:
            query = query.where(ckpt.c.sequence < before_sequence)
        order = ckpt.c.sequence.desc() if descending else ckpt.c.sequence
        with self.engine.connect() as conn:
            rows = conn.execute(query.order_by(order).limit(limit)).mappings().all()
        return [CheckpointRecord.from_row(r) for r in rows]

    @retrying
    def uncommitted(
        self, pipelines: list[str], *, registered_before: datetime | None = None, limit: int = 500
    ) -> list[CheckpointRecord]:
        """Checkpoints of ``pipelines`` neither COMMITTED nor ABORTED (registered before
        ``registered_before``, naive UTC, if given), oldest registration first: what is stuck."""
        if not pipelines:
            return []
        query = select(ckpt).where(ckpt.c.pipeline.in_(pipelines), ckpt.c.state.in_(_BLOCKING_STATES))
        if registered_before is not None:
            query = query.where(ckpt.c.created_at <= registered_before)
        query = query.order_by(ckpt.c.created_at, ckpt.c.pipeline, ckpt.c.sequence).limit(limit)
        with self.engine.connect() as conn:
            rows = conn.execute(query).mappings().all()
        return [CheckpointRecord.from_row(r) for r in rows]

    @retrying
    def staging_roots(self, pipelines: list[str] | None = None) -> list[str]:
        """The staging roots recorded on checkpoint rows (of ``pipelines``, or all), sorted.

        For staging GC, which walks every root a checkpoint was staged under.
        A scan of the checkpoint table (no index on the column): for
        maintenance, not for a request path.
        """
        query = select(ckpt.c.staging_root).where(ckpt.c.staging_root.is_not(None)).distinct()
        if pipelines is not None:
            query = query.where(ckpt.c.pipeline.in_(pipelines))
        with self.engine.connect() as conn:
            return sorted(conn.execute(query).scalars())

    @retrying
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

    @retrying
    def get_pipeline(self, name: str) -> dict[str, Any] | None:
        """One pipeline's row (name, mode, target, dag_id, next_sequence, created_at), or None."""
        with self.engine.connect() as conn:
            row = conn.execute(select(pipe).where(pipe.c.name == name)).mappings().first()
        return dict(row) if row is not None else None

    @retrying
    def pipeline_summary(self, pipeline: str) -> dict[str, Any]:
        """Counts per state, the latest committed and the latest failed/aborted/rejected checkpoint.

        Cost does not grow with the pipeline's history: ``register()`` allocates
        sequence numbers without gaps in the same transaction as the row, and only
        retention deletes rows (counting them in ``retired``, same transaction), so
        the number of COMMITTED checkpoints is the number allocated
        (``next_sequence - 1``) minus the retired rows and the others, which are
        counted on their own (few) ranges of the (pipeline, state, sequence) index.
        The latest committed/failed checkpoints are "newest first, limit 1" probes
        on it. ``retired`` is returned too (rows retention removed, any state).
        """
        latest = {}
        others = [s.value for s in S if s is not S.COMMITTED]
        with self.engine.connect() as conn:
            allocated = conn.execute(
                select(pipe.c.next_sequence, pipe.c.retired).where(pipe.c.name == pipeline)
            ).first()
            next_sequence, retired = allocated if allocated is not None else (1, 0)
            counts = dict(
                conn.execute(
                    select(ckpt.c.state, func.count())
                    .where(ckpt.c.pipeline == pipeline, ckpt.c.state.in_(others))
                    .group_by(ckpt.c.state)
                ).all()
            )
            committed = (next_sequence or 1) - 1 - (retired or 0) - sum(counts.values())
            if committed < 0:  # rows written around register(): count them exactly instead
                committed = conn.execute(
                    select(func.count()).where(ckpt.c.pipeline == pipeline, ckpt.c.state == S.COMMITTED.value)
                ).scalar_one()
            if committed:
                counts[S.COMMITTED.value] = committed
            for name, states in (
                ("committed", [S.COMMITTED.value]),
                ("error", sorted(s.value for s in ERROR_STATES)),
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
        return {
            "counts": counts,
            "retired": retired or 0,
            "latest_committed": latest["committed"],
            "last_error": latest["error"],
        }

    @retrying
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

    @retrying
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

    @retrying
    def versions(self, pipeline: str, checkpoint_key: str) -> list[VersionRecord]:
        """The earlier committed versions a reprocess replaced (or is replacing), oldest first."""
        record = self.require(pipeline, checkpoint_key)
        with self.engine.connect() as conn:
            rows = (
                conn.execute(select(vers).where(vers.c.checkpoint_id == record.id).order_by(vers.c.version))
                .mappings()
                .all()
            )
        return [VersionRecord.from_row(r) for r in rows]

    @retrying
    def version_starts(self, checkpoint_ids: list[int]) -> dict[int, datetime]:
        """When each checkpoint's current version began (its newest reprocess transition,
        COMMITTED -> REGISTERED), for the given checkpoint ids; absent when none is recorded
        (a first version, or history trimmed by retention)."""
        if not checkpoint_ids:
            return {}
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(trans.c.checkpoint_id, func.max(trans.c.at))
                .where(
                    trans.c.checkpoint_id.in_(checkpoint_ids),
                    trans.c.from_state == S.COMMITTED.value,
                    trans.c.to_state == S.REGISTERED.value,
                )
                .group_by(trans.c.checkpoint_id)
            ).all()
        return {checkpoint_id: at for checkpoint_id, at in rows}

    @retrying
    def expired_leases(self) -> list[CheckpointRecord]:
        """COMMITTING checkpoints whose lease has expired on the database's clock (or was released)."""
        now = self._now_expr()
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


#: States of an earlier ``append`` checkpoint that block the later ones.
_BLOCKING_STATES = [s.value for s in S if s not in (S.COMMITTED, S.ABORTED, S.SUPERSEDED)]
#: States in which an ``append`` checkpoint waits for its predecessors (to write, or to commit).
WAITING_STATES = frozenset({S.REGISTERED, S.DURABLE, S.AUDITED})


def wait_status(
    record: CheckpointRecord, mode: str | None, first_open: CheckpointRecord | None
) -> dict | None:
    """Why a checkpoint that is not failed does not move on, or ``None``.

    ``{"status": "blocked", "blocked_by": {...}, "reason": ...}``: an ``append`` checkpoint
    behind an earlier open one (``first_open``, see :meth:`CheckpointQueries.first_open`),
    decided now, not only when its task last tried; ``"refused"``: a recorded refusal
    (offsets, a range taken over) on a checkpoint in a state that is not an error;
    ``"unblocked"``: it was blocked, the blocker is done, its task has not tried again yet.
    Every reason says the fix.
    """
    from .lifecycle import BLOCKED_PREFIX, blocked_reason

    if record.state in (S.COMMITTED, S.ABORTED, S.SUPERSEDED) or record.state in ERROR_STATES:
        return None
    recorded = record.error or ""
    if (
        mode == "append"
        and first_open is not None
        and first_open.sequence < record.sequence
        and record.state in WAITING_STATES
    ):
        waiting_to = "start writing" if record.state is S.REGISTERED else "commit"
        reason = recorded if recorded.startswith(BLOCKED_PREFIX + first_open.checkpoint_key + " ") else None
        return {
            "status": "blocked",
            "blocked_by": {
                "checkpoint_key": first_open.checkpoint_key,
                "sequence": first_open.sequence,
                "state": first_open.state.value,
            },
            "reason": reason
            or blocked_reason(
                record.pipeline,
                record.checkpoint_key,
                record.sequence,
                first_open.checkpoint_key,
                first_open.sequence,
                first_open.state.value,
                waiting_to=waiting_to,
            ),
        }
    if not recorded:
        return None
    if recorded.startswith(BLOCKED_PREFIX):
        return {
            "status": "unblocked",
            "blocked_by": None,
            "reason": "no longer blocked: the earlier checkpoint it waited for is committed or aborted. "
            "Fix: none needed; its task goes on at its next try (clear it in Airflow if its retries are "
            f"used up). It was: {recorded}",
        }
    return {"status": "refused", "blocked_by": None, "reason": recorded}


def _is_identifier(value: object) -> bool:
    try:
        validate_identifier(value, "identifier")
    except WalsinkError:
        return False
    return True
