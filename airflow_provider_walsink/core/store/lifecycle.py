"""A checkpoint's life cycle before its commit: register, write attempts, new versions, seal, durable.

Also the ``append`` order check that the lease take and :mod:`.tablefence`
ask before a publish (and a table-fenced reconcile before it records
COMMITTED): every earlier checkpoint committed or aborted, the offsets
continuing the last committed ones, and no later checkpoint having taken the
range over (which a new write attempt is refused for too).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection, select, update
from sqlalchemy.exc import IntegrityError

from airflow_provider_walsink.core.protocol.identifiers import validate_identifier
from airflow_provider_walsink.core.protocol.manifest import Manifest
from airflow_provider_walsink.core.protocol.modes import WRITE_MODES, WriteMode
from airflow_provider_walsink.core.protocol.states import VERIFIED_DURABLE, CheckpointState
from airflow_provider_walsink.core.store.errors import (
    OffsetsError,
    OrderingError,
    PipelineOwnedError,
    StaleAttemptError,
    StoreError,
    TransitionError,
)
from airflow_provider_walsink.core.store.models import checkpoint_table as ckpt
from airflow_provider_walsink.core.store.models import pipeline_table as pipe
from airflow_provider_walsink.core.store.models import transition_table as trans
from airflow_provider_walsink.core.store.models import version_table as vers
from airflow_provider_walsink.core.store.records import Actor, CheckpointRecord
from airflow_provider_walsink.core.store.retry import retrying
from airflow_provider_walsink.core.store.transitions import CheckpointTransitions, _dump

S = CheckpointState
MODES = WRITE_MODES
#: ``_check_append_order``'s default: the start offsets the row records.
_ROW: Any = object()
#: Start offsets nobody can tell: the target holds an attempt whose manifest is gone and whose
#: marker does not record them.
UNKNOWN_OFFSETS: Any = object()


#: What a new write attempt (or a new version) clears: nothing sealed, verified or failed yet.
_NO_SEALED_ATTEMPT: dict[str, Any] = dict.fromkeys(
    "sealed_attempt sealed_attempt_id manifest_uri manifest_digest committables rows bytes end_offsets error "
    "sealed_at durable_at".split()
)

#: What a reprocess copies from the checkpoint's row into the version it replaces, as it is.
_VERSION_COPIES = (
    "version version_token manifest_digest committables rows bytes start_offsets end_offsets publication "
    "dag_id run_id committed_at"
).split()


class CheckpointLifecycle(CheckpointTransitions):
    """Register, attempts, versions, seal, durable, append order; mixed into
    :class:`~.store.CommitterStore` (``register`` reads back through :mod:`.queries`)."""

    @retrying
    def reassign_pipeline(self, pipeline: str, dag_id: str) -> str | None:
        """Hand a pipeline over to ``dag_id`` (its DAG was renamed); return the previous owner.

        Refused for an unknown pipeline. The checkpoints keep the DAG that wrote them.
        """
        with self._tx() as conn:
            row = conn.execute(select(pipe.c.dag_id).where(pipe.c.name == pipeline).with_for_update()).first()
            if row is None:
                raise StoreError(f"no pipeline {pipeline!r} is registered")
            conn.execute(update(pipe).where(pipe.c.name == pipeline).values(dag_id=dag_id))
        return row[0]

    @retrying
    def register(
        self,
        pipeline: str,
        checkpoint_key: str,
        *,
        mode: str,
        actor: Actor,
        target: str | None = None,
        start_offsets: Mapping[str, Any] | None = None,
        staging_root: str | None = None,
        target_connections: Mapping[str, str] | None = None,
    ) -> CheckpointRecord:
        """Register a checkpoint (idempotent) and give it the pipeline's next sequence number.

        ``staging_root``: where the write phase stages its attempts (a path or a
        URI, as the write phase uses it), recorded on a new row. A checkpoint
        registered already keeps the root it has (see :meth:`start_attempt`).

        ``target_connections``: the connection references of the target's options
        (``core/targets/registry.py: connection_references``, never a secret),
        recorded on the pipeline's row and replaced whenever a registration brings
        different ones (the DAG was edited; ``{}``: none any more); ``None`` leaves
        the recorded ones as they are. An abort opens the target with them.
        """
        validate_identifier(pipeline, "pipeline id")
        validate_identifier(checkpoint_key, "checkpoint key")
        WriteMode.parse(mode, error=StoreError)
        try:
            with self._tx() as conn:
                existing = _find(conn, pipeline, checkpoint_key)
                if existing is not None:
                    owner = conn.execute(
                        select(pipe.c.dag_id, pipe.c.target_connections).where(pipe.c.name == pipeline)
                    ).first()
                    _refuse_other_dag(pipeline, owner[0] if owner else None, actor)
                    if owner is not None:
                        _record_connections(conn, pipeline, owner[1], target_connections)
                    return CheckpointRecord.from_row(_exact(existing, pipeline, checkpoint_key))
                now = self._now(conn)
                prow = (
                    conn.execute(select(pipe).where(pipe.c.name == pipeline).with_for_update())
                    .mappings()
                    .first()
                )
                if prow is not None and prow["name"] != pipeline:
                    raise StoreError(_collision("pipeline id", pipeline, prow["name"]))
                if prow is not None:
                    _refuse_other_dag(pipeline, prow["dag_id"], actor)
                    if prow["dag_id"] is None and actor.dag_id is not None:
                        # Registered from a script first: the first DAG to write it owns it.
                        conn.execute(update(pipe).where(pipe.c.name == pipeline).values(dag_id=actor.dag_id))
                if prow is None:
                    conn.execute(
                        pipe.insert().values(
                            name=pipeline,
                            mode=mode,
                            target=target,
                            target_connections=_dump(target_connections or None),
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
                    _record_connections(conn, pipeline, prow["target_connections"], target_connections)
                    sequence = prow["next_sequence"]
                conn.execute(update(pipe).where(pipe.c.name == pipeline).values(next_sequence=sequence + 1))
                values = dict(
                    pipeline=pipeline,
                    checkpoint_key=checkpoint_key,
                    sequence=sequence,
                    state=S.REGISTERED.value,
                    attempt=0,
                    start_offsets=_dump(start_offsets),
                    staging_root=staging_root,
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
                existing = _find(conn, pipeline, checkpoint_key)
            if existing is None:
                return self.register(
                    pipeline,
                    checkpoint_key,
                    mode=mode,
                    actor=actor,
                    target=target,
                    start_offsets=start_offsets,
                    staging_root=staging_root,
                    target_connections=target_connections,
                )
            return CheckpointRecord.from_row(_exact(existing, pipeline, checkpoint_key))
        return self.get(pipeline, checkpoint_key)  # type: ignore[return-value]

    @retrying
    def start_attempt(
        self,
        pipeline: str,
        checkpoint_key: str,
        *,
        actor: Actor,
        start_offsets: Mapping[str, Any] | None = None,
        staging_root: str | None = None,
        write_job: Mapping[str, Any] | None = None,
    ) -> CheckpointRecord:
        """Start a new write attempt; any earlier attempt, sealed or not, no longer counts.

        ``write_job``: where the new attempt's job will run, when it can outlive the worker
        (recorded, and named in the history, in place of the earlier attempt's).

        The attempt gets a globally unique ``attempt_id`` (its number repeats
        once retention has trimmed the row and the interval is re-run).

        ``staging_root`` is where the caller means to stage. The rule: a
        checkpoint's attempts never split across roots, so the root recorded
        on the row wins for every later attempt and every later version
        (reprocess) of the checkpoint. It is recorded here only when the row
        has none (registered without one, or before walsink recorded roots);
        when it differs from the recorded one, the recorded root is kept, the
        history of the transition says so, and the caller must stage under
        the returned record's ``staging_root``.

        Raises :class:`TransitionError` (COMMITTED, or COMMITTING) and, for an
        ``append`` attempt that reads source offsets, :class:`OffsetsError` when
        a later checkpoint already took its source range over (the refusal is
        recorded as the checkpoint's error; nothing else changes). Each call
        that succeeds starts another attempt.
        """
        refused: OffsetsError | None = None
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
            # A new version (reprocess) re-reads exactly its own range: never taken over.
            if (
                start_offsets is not None
                and row["supersedes_attempt_id"] is None
                and self._mode(conn, pipeline) == "append"
            ):
                refused = self._taken_over(conn, row, _dump(start_offsets), same_start=state is S.ABORTED)
            if refused is not None:
                # Recorded (state unchanged) so the CLI status and the UI show why it will not run.
                self._refuse(conn, row, actor, str(refused))
            else:
                values: dict[str, Any] = dict(
                    _NO_SEALED_ATTEMPT,
                    attempt=row["attempt"] + 1,
                    attempt_id=uuid.uuid4().hex,
                    # The run of the newest attempt (the only one that can seal) names the row.
                    **_run_of(actor),
                    write_job=_dump(write_job) if write_job else None,
                )
                if start_offsets is not None:
                    values["start_offsets"] = _dump(start_offsets)
                detail = None
                if staging_root and not row["staging_root"]:
                    values["staging_root"] = staging_root
                elif staging_root and row["staging_root"] != staging_root:
                    detail = (
                        f"staging root {staging_root} asked for; the checkpoint's recorded staging root "
                        f"{row['staging_root']} is kept (its attempts never split across roots)"
                    )
                return self._move(conn, row, S.WRITING, actor, detail=detail, **values)
        raise refused

    @retrying
    def begin_version(
        self, pipeline: str, checkpoint_key: str, *, token: str, actor: Actor, reason: str
    ) -> CheckpointRecord | None:
        """Start a new version of a COMMITTED checkpoint (a reprocess), or return ``None``.

        ``token`` names the run that asks (``dag/run#clear_number``). If the
        checkpoint's current version was started by that same token, this run
        already replaced it (a retry of the reprocessing run): nothing changes
        and ``None`` is returned. Otherwise, in one transaction, the committed
        version is copied into the version table (still COMMITTED: its data is
        what readers see until the new version commits) and the row goes back
        to REGISTERED as version + 1, keeping its sequence, start offsets,
        attempt counter and fencing token, and naming the attempt it will
        supersede. Raises :class:`TransitionError` unless the checkpoint is
        COMMITTED.
        """
        with self._tx() as conn:
            row = self._lock(conn, pipeline, checkpoint_key)
            if row["state"] != S.COMMITTED.value:
                if row["version_token"] == token:
                    return None  # this run's new version is already under way
                raise TransitionError(
                    f"checkpoint {pipeline}/{checkpoint_key} is {row['state']}, not COMMITTED: "
                    "only a committed checkpoint can be reprocessed as a new version"
                )
            if row["version_token"] == token:
                return None
            conn.execute(
                vers.insert().values(
                    checkpoint_id=row["id"],
                    state=S.COMMITTED.value,
                    attempt=row["sealed_attempt"],
                    attempt_id=row["sealed_attempt_id"],
                    **{column: row[column] for column in _VERSION_COPIES},
                )
            )
            detail = (
                f"reprocess: version {row['version'] + 1} begins; it will supersede version "
                f"{row['version']} (attempt {row['sealed_attempt']}, {row['sealed_attempt_id']}): {reason}"
            )
            return self._move(
                conn,
                row,
                S.REGISTERED,
                actor,
                detail=detail,
                version=row["version"] + 1,
                version_token=token[:600],
                supersedes_attempt_id=row["sealed_attempt_id"],
                dag_id=actor.dag_id or row["dag_id"],
                run_id=actor.run_id or row["run_id"],
                **_NO_SEALED_ATTEMPT,
                publication=None,
                committed_at=None,
                commit_due_at=None,  # the new version has its own run, so its own deadline
                lease_owner=None,
                lease_expires_at=None,
            )

    @retrying
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
        attempt_id: str | None = None,
    ) -> CheckpointRecord:
        """Record that ``attempt`` sealed its manifest. Only the current attempt may seal.

        ``attempt_id`` (the manifest's) must be the current attempt's: a writer
        of an earlier life of this checkpoint (same number, before retention)
        cannot seal it.
        """
        with self._tx() as conn:
            row = self._lock(conn, pipeline, checkpoint_key)
            if row["sealed_attempt"] == attempt and row["manifest_digest"] == manifest_digest:
                return CheckpointRecord.from_row(row)  # repeated call
            if row["attempt"] != attempt or row["state"] != S.WRITING.value:
                raise StaleAttemptError(
                    f"attempt {attempt} of {pipeline}/{checkpoint_key} cannot seal: the checkpoint is "
                    f"{row['state']} at attempt {row['attempt']} (only the newest attempt counts); "
                    + _who_has_it(conn, row, attempt)
                )
            legacy = attempt_id is not None and attempt_id.startswith("v1-")  # a 0.1 manifest, no id
            if attempt_id is not None and not legacy and row["attempt_id"] not in (None, attempt_id):
                raise StaleAttemptError(
                    f"attempt {attempt} of {pipeline}/{checkpoint_key} cannot seal: its attempt id "
                    f"{attempt_id} is not the current attempt's ({row['attempt_id']}); "
                    + _who_has_it(conn, row, attempt)
                )
            values: dict[str, Any] = dict(
                sealed_attempt=attempt,
                sealed_attempt_id=attempt_id or row["attempt_id"],
                manifest_uri=manifest_uri,
                manifest_digest=manifest_digest,
                committables=committables,
                rows=rows,
                bytes=bytes,
                end_offsets=_dump(end_offsets),
                sealed_at=row["_now"],
                # The run whose data this is (the one that will be committed) names the row.
                **_run_of(actor),
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
            attempt_id=manifest.attempt_id,
            actor=actor,
        )

    @retrying
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
            if CheckpointState(row["state"]) in VERIFIED_DURABLE:
                return CheckpointRecord.from_row(row)
            return self._move(conn, row, S.DURABLE, actor, detail=detail, durable_at=row["_now"], error=None)

    # ------------------------------------------------------------------ ordering

    def _mode(self, conn: Connection, pipeline: str) -> str:
        return conn.execute(select(pipe.c.mode).where(pipe.c.name == pipeline)).scalar_one()

    def _check_append_order(
        self, conn: Connection, row: Mapping[str, Any], *, start_offsets: Any = _ROW
    ) -> None:
        """The ``append`` rule (invariant 5), checked before a publish and before COMMITTED is recorded.

        Every earlier checkpoint committed or aborted (else :class:`OrderingError`: wait);
        then, for a checkpoint that reads source offsets, its start offsets (the row's,
        or ``start_offsets``: those of the attempt a reconcile would record, as the
        row stores them, or :data:`UNKNOWN_OFFSETS`) continue the last committed
        checkpoint's end offsets, and no later checkpoint took its range over (else :class:`OffsetsError`). A new version
        (reprocess) re-reads exactly its own range: only the earlier-checkpoint rule.
        """
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
        name = f"append checkpoint {row['pipeline']}/{row['checkpoint_key']}"
        if earlier is not None:
            raise OrderingError(
                f"{name} (sequence {row['sequence']}) waits for earlier checkpoint {earlier.checkpoint_key} "
                f"(sequence {earlier.sequence}, {earlier.state}) to commit or be aborted"
            )
        start = row["start_offsets"] if start_offsets is _ROW else start_offsets
        if start is UNKNOWN_OFFSETS:
            if row["start_offsets"] is None:
                return  # a pipeline without source offsets: nothing to continue
            raise OffsetsError(
                f"{name}: the target holds an attempt of it whose source offsets cannot be known (its "
                "manifest is gone and the target's marker does not record them), so walsink will not "
                "record it COMMITTED: a guess could skip or repeat source rows"
            )
        if start is None:
            return
        if row["supersedes_attempt_id"] is None:
            taken = self._taken_over(conn, row, start, same_start=False)
            if taken is not None:
                raise taken
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
        if last is not None and json.loads(start) != json.loads(last.end_offsets):
            raise OffsetsError(
                f"{name} starts at offsets {start} but the last committed checkpoint {last.checkpoint_key} "
                f"ended at {last.end_offsets}; write it again from the committed offsets"
            )

    def _taken_over(
        self, conn: Connection, row: Mapping[str, Any], start: str, *, same_start: bool
    ) -> OffsetsError | None:
        """Whether a later checkpoint already owns the source range an attempt from ``start`` would read.

        Offsets advance in sequence order, so once a later checkpoint committed (or is
        committing, or is a committed one being reprocessed) an earlier one can never
        commit: the order check would compare it with the offsets before the later one,
        which already read them. With ``same_start`` (a re-run of an ABORTED checkpoint)
        a later checkpoint that started from the same offsets owns the range too: it
        read it while this one was aborted, and may be publishing it right now without
        a lease (table fencing). The way out is the later checkpoint's, never a second
        read of the same rows.
        """
        later = conn.execute(
            select(ckpt.c.checkpoint_key, ckpt.c.state, ckpt.c.sequence, ckpt.c.start_offsets)
            .where(
                ckpt.c.pipeline == row["pipeline"],
                ckpt.c.sequence > row["sequence"],
                ckpt.c.state.notin_([S.REGISTERED.value, S.ABORTED.value])
                | ckpt.c.supersedes_attempt_id.is_not(None),
            )
            .order_by(ckpt.c.sequence)
        ).all()
        for other in later:
            committed = other.state in (S.COMMITTED.value, S.COMMITTING.value)
            same = (
                same_start
                and other.start_offsets is not None
                and json.loads(other.start_offsets) == json.loads(start)
            )
            if committed or same:
                how = (
                    "committed" if committed else f"is {other.state} and reads from the same offsets {start}"
                )
                return OffsetsError(
                    f"append checkpoint {row['pipeline']}/{row['checkpoint_key']} (sequence {row['sequence']}) "
                    f"cannot be written or committed: later checkpoint {other.checkpoint_key} (sequence "
                    f"{other.sequence}) {how}, so it already took over this checkpoint's source range "
                    "(its rows are published, or will be, by that checkpoint: none are lost). Leave this "
                    "checkpoint as it is (abort it if it is open); to change the data of that range, "
                    f"reprocess {other.checkpoint_key}"
                )
        return None

    def _refuse(self, conn: Connection, row: dict[str, Any], actor: Actor, error: str) -> None:
        """Record a refusal as the checkpoint's error and in its history; its state is unchanged."""
        conn.execute(update(ckpt).where(ckpt.c.id == row["id"]).values(error=error))
        self._event(conn, row, actor, error)

    @retrying
    def record_refusal(self, pipeline: str, checkpoint_key: str, *, actor: Actor, error: str) -> None:
        """Record why a checkpoint cannot commit as it stands (its error, its history), state unchanged.

        Used for :class:`OffsetsError`: a refusal that retrying does not lift, which the
        CLI status and the UI must show. Safe to repeat (one more history row each time).
        """
        with self._tx() as conn:
            self._refuse(conn, self._lock(conn, pipeline, checkpoint_key), actor, error)

    @retrying
    def record_blocked(
        self, pipeline: str, checkpoint_key: str, *, actor: Actor, waiting_to: str = "start writing"
    ) -> str | None:
        """Record that an ``append`` checkpoint waits behind an earlier open one; return the reason.

        The reason (which checkpoint blocks it, in which state, and the fix) becomes the
        checkpoint's error and, when it changed, one history row; the state is unchanged
        (a new attempt or the commit clears it). Returns ``None`` when nothing blocks it
        (any more): nothing is recorded then.
        """
        with self._tx() as conn:
            row = self._lock(conn, pipeline, checkpoint_key)
            earlier = conn.execute(
                select(ckpt.c.checkpoint_key, ckpt.c.state, ckpt.c.sequence)
                .where(
                    ckpt.c.pipeline == pipeline,
                    ckpt.c.sequence < row["sequence"],
                    ckpt.c.state.notin_([S.COMMITTED.value, S.ABORTED.value]),
                )
                .order_by(ckpt.c.sequence)
                .limit(1)
            ).first()
            if earlier is None:
                return None
            reason = blocked_reason(
                pipeline,
                checkpoint_key,
                row["sequence"],
                earlier.checkpoint_key,
                earlier.sequence,
                earlier.state,
                waiting_to=waiting_to,
            )
            if row["error"] != reason:
                self._refuse(conn, row, actor, reason)
            return reason


#: How a recorded "blocked" reason begins (the UI and the CLI tell it from a refusal by it).
BLOCKED_PREFIX = "blocked by earlier checkpoint "


def blocked_reason(
    pipeline: str,
    checkpoint_key: str,
    sequence: int,
    blocker_key: str,
    blocker_sequence: int,
    blocker_state: str,
    *,
    waiting_to: str = "start writing",
) -> str:
    """Why an ``append`` checkpoint waits, and what to do: the first line names the blocker."""
    if blocker_state in (S.FAILED.value, S.REJECTED.value):
        fix = (
            f"fix {blocker_key} first (see its error; re-run its write task, or its commit task if it "
            f"is durable) or abort it: walsink abort {pipeline} {blocker_key} --reason '...'"
        )
    else:
        fix = (
            f"let {blocker_key} finish (its DAG run is still working on it) or, if it will never "
            f"finish, abort it: walsink abort {pipeline} {blocker_key} --reason '...'"
        )
    return (
        f"{BLOCKED_PREFIX}{blocker_key}: append checkpoint {pipeline}/{checkpoint_key} (sequence {sequence}) "
        f"cannot {waiting_to}: earlier checkpoint {blocker_key} (sequence {blocker_sequence}) is "
        f"{blocker_state}; it must be committed or aborted first, or its input would be read twice. "
        f"Fix: {fix}; then this checkpoint's task goes on at its next try (clear it in Airflow if its "
        "retries are used up)"
    )


def _run_of(actor: Actor) -> dict[str, Any]:
    """``dag_id``/``run_id`` of an Airflow actor for the row; nothing for one outside Airflow."""
    return {"dag_id": actor.dag_id, "run_id": actor.run_id} if actor.dag_id else {}


def _who_has_it(conn: Connection, row: Mapping[str, Any], attempt: int) -> str:
    """Which run owns the checkpoint now that ``attempt`` is stale, and what to do (two runs
    writing one interval: the loser's error names the winner, never only itself)."""
    if row["state"] == S.COMMITTED.value:
        done = conn.execute(
            select(trans.c.dag_id, trans.c.run_id, trans.c.at)
            .where(trans.c.checkpoint_id == row["id"], trans.c.to_state == S.COMMITTED.value)
            .order_by(trans.c.id.desc())
            .limit(1)
        ).first()
        dag_id, run_id = (
            (done.dag_id, done.run_id) if done and done.dag_id else (row["dag_id"], row["run_id"])
        )
        at = done.at if done is not None else row["committed_at"]
        by = f"run {run_id} of DAG {dag_id}" if dag_id else "a writer outside Airflow"
        when = f" at {at.isoformat(timespec='seconds')}Z" if at else ""
        return (
            f"the interval was committed by {by}{when} (attempt {row['sealed_attempt']}): its "
            f"data is published, once. This run's attempt {attempt} is not needed and is never published; "
            "nothing to fix (walsink gc removes its staging). Two runs wrote the same interval: keep one "
            "(e.g. do not backfill an interval a scheduled run covers)"
        )
    started = conn.execute(
        select(trans.c.dag_id, trans.c.run_id)
        .where(
            trans.c.checkpoint_id == row["id"],
            trans.c.to_state == S.WRITING.value,
            trans.c.attempt == row["attempt"],
        )
        .order_by(trans.c.id.desc())
        .limit(1)
    ).first()
    dag_id, run_id = (
        (started.dag_id, started.run_id) if started and started.dag_id else (row["dag_id"], row["run_id"])
    )
    by = f"run {run_id} of DAG {dag_id}" if dag_id else "a writer outside Airflow"
    return (
        f"attempt {row['attempt']} was started after it by {by} and is {row['state']}: two runs are writing "
        "the same interval and only the newest attempt can be committed. Let that run finish; do not "
        "re-run this one (it would supersede that run's attempt in turn)"
    )


def _record_connections(
    conn: Connection, pipeline: str, recorded: str | None, given: Mapping[str, str] | None
) -> None:
    """Replace the pipeline's recorded target connection references by ``given`` when they differ
    (``None``: not told, kept)."""
    if given is None:
        return
    value = _dump(dict(given) or None)
    if value != recorded:
        conn.execute(update(pipe).where(pipe.c.name == pipeline).values(target_connections=value))


def _refuse_other_dag(pipeline: str, owner: str | None, actor: Actor) -> None:
    """A pipeline id belongs to the DAG that first registered it: two DAGs writing one
    pipeline would skip or replace each other's checkpoints of the same key."""
    if owner is not None and actor.dag_id is not None and actor.dag_id != owner:
        raise PipelineOwnedError(
            f"pipeline {pipeline!r} belongs to DAG {owner!r}; DAG {actor.dag_id!r} declares it too, and "
            "two DAGs writing one pipeline would skip or replace each other's checkpoints. Give DAG "
            f"{actor.dag_id!r} its own pipeline id, or, if {owner!r} was renamed to {actor.dag_id!r}, hand "
            f"the pipeline over: walsink reassign {pipeline} --dag {actor.dag_id}"
        )


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


def _find(conn: Connection, pipeline: str, checkpoint_key: str) -> Mapping[str, Any] | None:
    """The checkpoint's row, unlocked (None if it is not registered)."""
    query = select(ckpt).where(ckpt.c.pipeline == pipeline, ckpt.c.checkpoint_key == checkpoint_key)
    return conn.execute(query).mappings().first()
