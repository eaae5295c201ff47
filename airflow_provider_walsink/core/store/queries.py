"""The committer store's read model: the queries the committer, the UI and the CLI ask.

Read-only, each one statement or a few on indexed ranges; retried on a
dropped connection like every store call.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, and_, func, or_, select, tuple_
from sqlalchemy.sql.elements import ColumnElement

from airflow_provider_walsink.core.protocol.errors import WalsinkError
from airflow_provider_walsink.core.protocol.identifiers import validate_identifier
from airflow_provider_walsink.core.protocol.partition_keys import partition_key_of_checkpoint
from airflow_provider_walsink.core.protocol.states import ERROR_STATES, CheckpointState
from airflow_provider_walsink.core.store.errors import CheckpointNotFoundError
from airflow_provider_walsink.core.store.models import checkpoint_table as ckpt
from airflow_provider_walsink.core.store.models import pipeline_table as pipe
from airflow_provider_walsink.core.store.models import transition_table as trans
from airflow_provider_walsink.core.store.models import version_table as vers
from airflow_provider_walsink.core.store.records import CheckpointRecord, TransitionRecord, VersionRecord
from airflow_provider_walsink.core.store.retry import retrying

S = CheckpointState
#: States in which a checkpoint still holds data a later commit may need.
OPEN_STATES = frozenset(s.value for s in S if not s.is_final)


class CheckpointQueries:
    """Read-only queries; mixed into :class:`~airflow_provider_walsink.core.store.store.CommitterStore`."""

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

    @retrying
    def checkpoint_states(
        self, keys: list[tuple[str, str]]
    ) -> dict[tuple[str, str], tuple[str, int, int | None]]:
        """``(pipeline, checkpoint key) -> (state, attempt, sealed attempt)`` of each of ``keys`` that
        is registered, in one statement per 500 keys (the unique index): what the durability
        triggers of a triggerer watch for all of them at once instead of each reading its own row."""
        wanted = {(p, k) for p, k in keys if _is_identifier(p) and _is_identifier(k)}
        ordered = sorted(wanted)
        out: dict[tuple[str, str], tuple[str, int, int | None]] = {}
        columns = (
            ckpt.c.pipeline,
            ckpt.c.checkpoint_key,
            ckpt.c.state,
            ckpt.c.attempt,
            ckpt.c.sealed_attempt,
        )
        with self.engine.connect() as conn:
            for start in range(0, len(ordered), 500):
                chunk = ordered[start : start + 500]
                query = select(*columns).where(tuple_(ckpt.c.pipeline, ckpt.c.checkpoint_key).in_(chunk))
                for row in conn.execute(query):
                    if (row.pipeline, row.checkpoint_key) in wanted:  # not a case-insensitive match
                        out[(row.pipeline, row.checkpoint_key)] = (row.state, row.attempt, row.sealed_attempt)
        return out

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
            return newest_committed_offsets(conn, pipeline)

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
    def wait_heads(self, pipelines: list[str]) -> dict[str, tuple[str | None, CheckpointRecord | None]]:
        """Per pipeline its mode and, for an ``append`` one, its :meth:`first_open` checkpoint
        (``None`` for others): what tells a blocked checkpoint from a moving one, for a whole
        page in two statements (an "oldest first, limit 1" index probe per open state and
        pipeline, then those rows by primary key). An unknown pipeline maps to ``(None, None)``."""
        names = sorted(set(pipelines))
        out: dict[str, tuple[str | None, CheckpointRecord | None]] = dict.fromkeys(names, (None, None))
        if not names:
            return out

        def earliest(state: str) -> Any:
            # A correlated "oldest first, limit 1" probe of the (pipeline, state, sequence) index.
            return (
                select(ckpt.c.id)
                .where(ckpt.c.pipeline == pipe.c.name, ckpt.c.state == state)
                .order_by(ckpt.c.sequence)
                .limit(1)
                .scalar_subquery()
            )

        query = select(
            pipe.c.name, pipe.c.mode, *[earliest(s).label(f"s{i}") for i, s in enumerate(_BLOCKING_STATES)]
        ).where(pipe.c.name.in_(names))
        ids: list[int] = []
        with self.engine.connect() as conn:
            for row in conn.execute(query).mappings():
                if row["name"] not in out:
                    continue  # a case-insensitive match (MySQL/MariaDB collation)
                out[row["name"]] = (row["mode"], None)
                if row["mode"] == "append":
                    ids += [row[f"s{i}"] for i in range(len(_BLOCKING_STATES)) if row[f"s{i}"] is not None]
            rows = conn.execute(select(ckpt).where(ckpt.c.id.in_(ids))).mappings().all() if ids else []
        for row in rows:
            record = CheckpointRecord.from_row(row)
            if record.state.value not in _BLOCKING_STATES:
                continue  # moved on between the two statements: not blocking
            mode, head = out[record.pipeline]
            if head is None or record.sequence < head.sequence:
                out[record.pipeline] = (mode, record)
        return out

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
    def newest_checkpoints(self, pipelines: list[str], limit: int) -> dict[str, list[CheckpointRecord]]:
        """The ``limit`` newest checkpoints of each of ``pipelines``, newest first, in one
        statement for all of them plus one per pipeline whose newest sequence numbers
        retention has thinned.

        Sequence numbers are allocated without gaps, so a pipeline's ``limit`` newest
        checkpoints are those from ``next_sequence - limit`` on: one bounded range of the
        (pipeline, sequence) index each, read in one statement. Where that range
        holds fewer rows (retention removed some), the keyset query of :meth:`checkpoints`
        answers for that pipeline.
        """
        names = sorted(set(pipelines))
        if not names:
            return {}
        out: dict[str, list[CheckpointRecord]] = {name: [] for name in names}
        with self.engine.connect() as conn:
            ranges = [
                (name, next_sequence)
                for name, next_sequence in conn.execute(
                    select(pipe.c.name, pipe.c.next_sequence).where(pipe.c.name.in_(names))
                )
                if name in out  # not a case-insensitive match (MySQL/MariaDB collation)
            ]
            if ranges:
                # One explicit range per pipeline: the planner sees each bound (a join on
                # ``next_sequence - limit`` left it guessing, and it chose to scan the table).
                query = select(ckpt).where(
                    or_(
                        *(
                            and_(ckpt.c.pipeline == name, ckpt.c.sequence >= (next_sequence or 1) - limit)
                            for name, next_sequence in ranges
                        )
                    )
                )
                for row in conn.execute(query).mappings():
                    if row["pipeline"] in out:
                        out[row["pipeline"]].append(CheckpointRecord.from_row(row))
        for name, next_sequence in ranges:
            if name not in out:
                continue
            records = sorted(out[name], key=lambda r: r.sequence, reverse=True)[:limit]
            if len(records) < min(limit, (next_sequence or 1) - 1):
                records = self.checkpoints(name, limit=limit, descending=True)  # gaps: ask the index
            out[name] = records
        return out

    @retrying
    def pipelines_in_states(self, states: list[str]) -> list[str]:
        """The pipelines having a checkpoint in one of ``states``, sorted: where a listing
        by state needs to look. Reads those states' ranges of the (state, created_at) index,
        so it is cheap for the open and failed states and as long as the history for COMMITTED."""
        if not states:
            return []
        with self.engine.connect() as conn:
            names = conn.execute(select(ckpt.c.pipeline).where(ckpt.c.state.in_(states)).distinct()).scalars()
            return sorted(names)

    @retrying
    def uncommitted(
        self,
        pipelines: list[str] | None,
        *,
        registered_before: datetime | None = None,
        limit: int = 500,
        after: tuple[datetime, str, int] | None = None,
    ) -> list[CheckpointRecord]:
        """Checkpoints of ``pipelines`` (``None``: of every pipeline) neither COMMITTED nor
        ABORTED (registered before ``registered_before``, naive UTC, if given), oldest
        registration first: what is stuck.

        Keyset-paginated on ``(created_at, pipeline, sequence)``: ``after`` is that triple of
        the last row of the previous page. Reads the open states' ranges of the
        (state, created_at) index, not the committed history.
        """
        if pipelines is not None and not pipelines:
            return []
        query = select(ckpt).where(ckpt.c.state.in_(_BLOCKING_STATES))
        if pipelines is not None:
            query = query.where(ckpt.c.pipeline.in_(pipelines))
        if registered_before is not None:
            query = query.where(ckpt.c.created_at <= registered_before)
        if after is not None:
            at, name, sequence = after
            query = query.where(
                ckpt.c.created_at >= at,
                or_(
                    ckpt.c.created_at > at,
                    ckpt.c.pipeline > name,
                    and_(ckpt.c.pipeline == name, ckpt.c.sequence > sequence),
                ),
            )
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
        """One pipeline's row (name, mode, target, dag_id, next_sequence, created_at,
        target_connections: a dict, ``{}`` for none), or None."""
        with self.engine.connect() as conn:
            row = conn.execute(select(pipe).where(pipe.c.name == name)).mappings().first()
        return _pipeline_row(row) if row is not None else None

    def pipeline_summary(self, pipeline: str) -> dict[str, Any]:
        """Counts per state, the latest committed and the latest failed/aborted/rejected checkpoint.

        ``{"counts": {state: n}, "retired": n, "latest_committed": record | None,
        "last_error": record | None}``; see :meth:`pipeline_summaries`.
        """
        return self.pipeline_summaries([pipeline])[pipeline]

    @retrying
    def pipeline_summaries(self, pipelines: list[str]) -> dict[str, dict[str, Any]]:
        """:meth:`pipeline_summary` of each of ``pipelines`` in two statements, whatever
        the length of their histories (an unknown pipeline gets an empty summary).

        Counts are exact without counting the history: ``register()`` allocates
        sequence numbers without gaps in the same transaction as the row, and only
        retention deletes rows (counting them in ``retired``, same transaction), so
        the number of COMMITTED checkpoints is the number allocated
        (``next_sequence - 1``) minus the retired rows and the others. The others are
        counted on their own ranges of the (pipeline, state, sequence) index, which
        hold what is open or failed, not the committed history. The latest committed
        and latest error checkpoints are a "newest first, limit 1" probe of that index
        per (pipeline, state), then their rows by primary key.
        """
        names = sorted(set(pipelines))
        out: dict[str, dict[str, Any]] = {
            name: {"counts": {}, "retired": 0, "latest_committed": None, "last_error": None} for name in names
        }
        if not names:
            return out
        others = [s.value for s in S if s is not S.COMMITTED]
        latest_states = [S.COMMITTED.value, *sorted(s.value for s in ERROR_STATES)]

        def count(state: str) -> Any:
            return (
                select(func.count())
                .where(ckpt.c.pipeline == pipe.c.name, ckpt.c.state == state)
                .scalar_subquery()
            )

        def newest(state: str) -> Any:
            # A correlated "newest first, limit 1" probe of the (pipeline, state, sequence) index.
            return (
                select(ckpt.c.id)
                .where(ckpt.c.pipeline == pipe.c.name, ckpt.c.state == state)
                .order_by(ckpt.c.sequence.desc())
                .limit(1)
                .scalar_subquery()
            )

        query = select(
            pipe.c.name,
            pipe.c.next_sequence,
            pipe.c.retired,
            *[count(s).label(f"n{i}") for i, s in enumerate(others)],
            *[newest(s).label(f"m{i}") for i, s in enumerate(latest_states)],
        ).where(pipe.c.name.in_(names))
        ids: list[int] = []
        with self.engine.connect() as conn:
            for row in conn.execute(query).mappings():
                name = row["name"]
                if name not in out:
                    continue  # a case-insensitive match (MySQL/MariaDB collation): not this pipeline
                counts = {s: row[f"n{i}"] for i, s in enumerate(others) if row[f"n{i}"]}
                retired = row["retired"] or 0
                committed = (row["next_sequence"] or 1) - 1 - retired - sum(counts.values())
                if committed < 0:  # rows written around register(): count them exactly instead
                    committed = conn.execute(
                        select(func.count()).where(ckpt.c.pipeline == name, ckpt.c.state == S.COMMITTED.value)
                    ).scalar_one()
                if committed:
                    counts[S.COMMITTED.value] = committed
                out[name]["counts"] = counts
                out[name]["retired"] = retired
                ids += [row[f"m{i}"] for i in range(len(latest_states)) if row[f"m{i}"] is not None]
            rows = conn.execute(select(ckpt).where(ckpt.c.id.in_(ids))).mappings().all() if ids else []
        errors = {s.value for s in ERROR_STATES}
        for row in rows:
            record = CheckpointRecord.from_row(row)
            if record.state.value == S.COMMITTED.value:
                kind = "latest_committed"
            elif record.state.value in errors:
                kind = "last_error"
            else:
                continue  # moved on between the two statements: the next read shows it
            current = out[record.pipeline][kind]
            if current is None or current.sequence < record.sequence:
                out[record.pipeline][kind] = record  # the newest of the error states
        return out

    @retrying
    def pipelines(self, *, with_counts: bool = True) -> list[dict[str, Any]]:
        """Every pipeline with its mode, target and (unless ``with_counts=False``) checkpoint
        count per state, counted as :meth:`pipeline_summaries` does (never over the history).

        For a bounded view of many pipelines use :meth:`pipeline_page`.
        """
        with self.engine.connect() as conn:
            prows = conn.execute(select(pipe).order_by(pipe.c.name)).mappings().all()
        if not with_counts:
            return [dict(p) for p in prows]
        out = []
        for start in range(0, len(prows), PIPELINE_BATCH):
            batch = prows[start : start + PIPELINE_BATCH]
            summaries = self.pipeline_summaries([p["name"] for p in batch])
            out += [{**dict(p), "counts": summaries[p["name"]]["counts"]} for p in batch]
        return out

    @retrying
    def pipeline_page(self, *, after: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """At most ``limit`` pipeline rows in name order, those after ``after`` (exclusive):
        keyset pagination on the primary key, so a page costs the same at any depth and a
        pipeline added meanwhile is neither repeated nor skipped by the pages after it.

        Raises ``ValueError`` for a ``limit`` below 1.
        """
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        query = select(pipe)
        if after is not None:
            query = query.where(pipe.c.name > after)
        with self.engine.connect() as conn:
            rows = conn.execute(query.order_by(pipe.c.name).limit(limit)).mappings().all()
        # MySQL/MariaDB: the binary collation of the name column orders by bytes, as Python does.
        return [_pipeline_row(r) for r in rows]

    @retrying
    def pipeline_writers(self, pipelines: list[str]) -> dict[str, set[str]]:
        """Pipeline -> the DAG ids that write it: the DAG that registered the pipeline and
        every DAG that registered one of its checkpoints.

        A skip scan of the (pipeline, dag_id) index: per pipeline its smallest and
        largest DAG id in one statement (two index probes each), then, only where
        they differ, one probe per further DAG id. The cost follows the number of
        pipelines and writers, never the number of checkpoints.
        """
        names = sorted(set(pipelines))
        if not names:
            return {}

        def bound(agg: Any) -> Any:
            return select(agg(ckpt.c.dag_id)).where(ckpt.c.pipeline == pipe.c.name).scalar_subquery()

        out: dict[str, set[str]] = {}
        with self.engine.connect() as conn:
            spans = conn.execute(
                select(pipe.c.name, pipe.c.dag_id, bound(func.min), bound(func.max)).where(
                    pipe.c.name.in_(names)
                )
            ).all()
            for name, dag_id, low, high in spans:
                writers = {d for d in (dag_id, low, high) if d}
                current = low
                while current is not None and current != high:
                    current = conn.execute(
                        select(func.min(ckpt.c.dag_id)).where(
                            ckpt.c.pipeline == name, ckpt.c.dag_id > current
                        )
                    ).scalar()
                    if current is not None:
                        writers.add(current)
                out[name] = writers
        return out

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


#: Pipelines summarised per statement by :meth:`CheckpointQueries.pipelines` (bound parameters
#: stay far below every backend's limit).
PIPELINE_BATCH = 500
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
    from airflow_provider_walsink.core.store.lifecycle import BLOCKED_PREFIX, blocked_reason

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
                "partition_key": partition_key_of_checkpoint(first_open.checkpoint_key),
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


def newest_committed_offsets(conn: Connection, pipeline: str) -> dict[str, Any] | None:
    """End offsets of the pipeline's newest COMMITTED checkpoint, read on ``conn``."""
    return newest_committed_json(conn, pipeline, ckpt.c.end_offsets)


def newest_committed_json(conn: Connection, pipeline: str, column: Any) -> dict[str, Any] | None:
    """A JSON ``column`` of the pipeline's newest COMMITTED checkpoint that has it, read on ``conn``."""
    value = conn.execute(
        select(column)
        .where(ckpt.c.pipeline == pipeline, ckpt.c.state == S.COMMITTED.value, column.is_not(None))
        .order_by(ckpt.c.sequence.desc())
        .limit(1)
    ).scalar()
    return json.loads(value) if value else None


def _pipeline_row(row: Any) -> dict[str, Any]:
    """A pipeline row as a dict, its recorded target connection references decoded."""
    out = dict(row)
    out["target_connections"] = json.loads(out.get("target_connections") or "{}")
    return out
