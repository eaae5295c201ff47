"""The model checker's write step through a real Spark job (issue 36): ``Config.spark_write``.

The model draws the rows as always (``World.op_write``); instead of writing the Parquet files
itself, the attempt is staged and sealed by the harness's PySpark job (``tests/harness/spark_job.py``
through ``CheckpointJob``), run by spark-submit or as a Spark Connect client exactly as the fault
harness runs it, and the seal is recorded by the write operator's own ``record_seal``. Everything
after the seal (durability, commit, crashes, the checks) is the model's usual path, so a schedule
replayed with Spark writes must end as it does with the model's own.

Local staging, the one ``dt`` column, and no Kafka source (``Config`` refuses the rest).

In the Connect mode only, ``cancel_write`` (:func:`cancel_write`): a write through the write
phase itself (``WritePhase`` with the Spark Connect runner and its ``AttemptWatch``), its job
still running when a person aborts the checkpoint or a newer attempt of it starts; the job must
stop on the server and nothing of the cancelled attempt ever be sealed or published.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_provider_walsink.core import faults
from airflow_provider_walsink.core.commit.write_phase import record_seal
from airflow_provider_walsink.core.protocol.errors import WalsinkError
from airflow_provider_walsink.core.spark.args import ProtocolArgs
from airflow_provider_walsink.core.staging.resolve import as_store
from tests.harness.runner import run_spark_job

#: ``Config.spark_write`` values: spark-submit on local[1], or ``connect:<spark_connect conn id>``.
SPARK_SUBMIT = "spark-submit"
CONNECT_PREFIX = "connect:"


def write_job_input(
    cfg: Any,
    rows: list[tuple[Any, str, int | None]],
    partitions: list[str],
    directories: dict[str, str],
    end: int | None,
) -> Path:
    """The job's JSON input (``tests/harness/spark_job.py``'s format): ``rows`` (``(dt, id, v)``)
    into the ``dt`` column, a partition of ``partitions`` without rows declared."""
    job_input = Path(cfg.work) / f"spark-write-{uuid.uuid4().hex}.json"
    job_input.write_text(
        json.dumps(
            {
                "rows": [[id_, v, dt] for dt, id_, v in rows],
                "columns": [["id", "string"], ["v", "bigint"], ["dt", "string"]],
                "partition_by": ["dt"],
                "file_format": "parquet",
                "declared": [directories[dt] for dt in partitions if not any(r[0] == dt for r in rows)],
                "end_offsets": {"src": end} if end is not None else None,
            }
        )
    )
    return job_input


def stage_and_seal(
    world: Any,
    key: str,
    record: Any,
    actor: Any,
    rows: list[tuple[Any, str, int | None]],
    partitions: list[str],
    directories: dict[str, str],
    start: int | None,
    end: int | None,
) -> None:
    """Stage ``rows`` (``(dt, id, v)``) into the attempt ``record`` began, through Spark, and record
    its seal; a partition of ``partitions`` without rows is declared (replaced by nothing)."""
    cfg = world.cfg
    job_input = write_job_input(cfg, rows, partitions, directories, end)
    protocol = ProtocolArgs(
        pipeline=cfg.pipeline,
        checkpoint_key=key,
        sequence=record.sequence,
        attempt=record.attempt,
        attempt_id=record.attempt_id or "",
        staging_root=str(world.layout.root),
        mode=cfg.mode,
        file_format="parquet",
        partition_by=("dt",),
        start_offsets={"src": start} if start is not None else None,
    )
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    env.pop(faults.ENV, None)  # the model's crash points are for its own steps, not the job
    connect = cfg.spark_write[len(CONNECT_PREFIX) :] if cfg.spark_write.startswith(CONNECT_PREFIX) else None
    done = run_spark_job([*protocol.to_argv(), str(job_input)], connect, env)
    job_input.unlink()
    if done.returncode != 0:
        raise RuntimeError(f"the Spark write of {key} failed ({cfg.spark_write}): {done.stderr[-1500:]}")
    record_seal(world.store, as_store(world.layout), protocol, actor, log=logging.getLogger("model"))


# ----------------------------------------------------------------------------- cancel while writing

#: The job ``cancel_write`` runs: stages its rows, then runs on until cancelled.
WATCHED_JOB = Path(__file__).with_name("watched_job.py")
#: Seconds between the watch's reads of the checkpoint's row (the write task's default is 5).
WATCH_INTERVAL_S = 0.5
#: Seconds the watched job may take to start running its last stage (a loaded CI machine).
START_WAIT_S = 180.0
#: Seconds after the abort (or the newer attempt's start) by which the watched write must have
#: ended cancelled; past them the job still runs: a violation (the checker then stops it itself).
CANCEL_WAIT_S = 30.0
#: What ends the watched attempt: a person's abort, or a newer attempt (a cleared write task).
CANCEL_BY = ("abort", "newer_attempt")


def cancel_write(world: Any, key: str, by: str, n: int = 2, parts: list[int] | None = None) -> str:
    """``cancel_write``: a write of ``key`` through the real write phase (``WritePhase``) with the
    Spark Connect runner and its ``AttemptWatch``; while its job runs, the checkpoint is aborted
    (``by="abort"``, ``CheckpointAborter`` as a person does) or a newer attempt of it starts and
    seals (``by="newer_attempt"``, a cleared write task: the model's own write, through Connect).

    Checked here (violations go to ``world.notes``): the watched write ends within
    :data:`CANCEL_WAIT_S` with the runner's cancel error naming the connection; no operation of its
    Connect session still runs on the server; the watched attempt is never sealed (no manifest in
    its staging); the checkpoint's history records the cancel; after an abort the checkpoint stays
    ABORTED (a durability check and a commit change nothing); after a newer attempt, that attempt
    is verified and committed. The watched attempt's rows join the model as never to be published,
    so the check after the step finds any of them in the target.
    """
    import threading

    from airflow_provider_walsink.core.commit.write_phase import WritePhase
    from airflow_provider_walsink.core.protocol.states import CheckpointState as S
    from airflow_provider_walsink.core.staging.layout import StagingLayout
    from airflow_provider_walsink.hooks.spark_connect_runner import SparkConnectRunner

    from .world import actor, append_range, earlier_open

    cfg, store = world.cfg, world.store
    if by not in CANCEL_BY:
        raise ValueError(f"cancel_write by {by!r}: one of {CANCEL_BY}")
    if not (cfg.spark_write or "").startswith(CONNECT_PREFIX):
        return "skipped: the Spark Connect write mode only"
    conn_id = cfg.spark_write[len(CONNECT_PREFIX) :]
    a = actor("cancel_write", key, world._next())
    # Registered again if retention trimmed its row (as the write task registers).
    record = store.register(cfg.pipeline, key, mode=cfg.mode, actor=a, target=cfg.uri())
    if record.is_committed or record.state is S.COMMITTING:
        return f"skipped: {record.state.value}"
    if (waits := earlier_open(store, cfg, record)) is not None:
        return waits
    start, end = append_range(store, cfg.pipeline, key, record, n) if cfg.mode == "append" else (None, None)
    # Drawn as the model's own write draws them, without nulls.
    rows, partitions, directories = world.draw_rows(
        key, n, parts or [0], record.version, start, end, nulls=False
    )
    job_input = write_job_input(cfg, rows, partitions, directories, end)
    running = Path(cfg.work) / f"running-{uuid.uuid4().hex}"
    runner = SparkConnectRunner(job_name="walsink-model", spark_conn_id=conn_id)
    phase = WritePhase(
        store=store, runner=runner, pipeline=cfg.pipeline, checkpoint_key=key, mode=cfg.mode,
        application=str(WATCHED_JOB), staging_root=str(world.layout.root),
        staging=lambda root: as_store(StagingLayout(root)), credentials_env=lambda root: {},
        check_placement=lambda root: f"local staging {root}, one machine", version_token=lambda: "model",
        reprocess=lambda: ("skip", "cancel_write writes an open checkpoint only"), target=cfg.uri(),
        application_args=[str(job_input), str(running)], file_format="parquet", partition_by=("dt",),
        initial_offsets={"src": 0} if cfg.mode == "append" else None, watch_interval=WATCH_INTERVAL_S,
    )  # fmt: skip

    def write() -> None:
        try:
            phase.run(lambda: a)
        except BaseException as exc:  # noqa: BLE001 - judged by _watch_and_end
            w.ended["error"] = exc

    w = WatchedWrite(threading.Thread(target=write, name="model-watched-write", daemon=True), runner, running,
                     (rows, partitions, start, end))  # fmt: skip
    w.thread.start()
    try:
        return _watch_and_end(world, key, by, n, parts or [0], w)
    finally:
        job_input.unlink(missing_ok=True)
        if w.thread.is_alive():  # still running (a violation already noted): stopped, so the schedule goes on
            SparkConnectRunner.stop_orphan(runner.job_ref(), logging.getLogger("model"))
            w.thread.join(60)


@dataclass
class WatchedWrite:
    """The write phase :func:`cancel_write` runs in ``thread``: its runner, the file its job touches
    once running, the attempt's drawn rows (the model's ``Attempt`` fields) and how it ended."""

    thread: Any
    runner: Any
    running: Path
    drawn: tuple[list[Any], list[str], int | None, int | None]  # rows, partitions, start, end
    ended: dict[str, BaseException] = field(default_factory=dict)


def _watch_and_end(world: Any, key: str, by: str, n: int, parts: list[int], w: WatchedWrite) -> str:
    """:func:`cancel_write` once its write runs: wait for its job, end the attempt ``by`` an abort
    or a newer attempt, and check how the write ended."""
    import time

    from airflow_provider_walsink.core.commit.write_phase import AttemptCancelledError
    from airflow_provider_walsink.core.protocol.manifest import MANIFEST_NAME
    from airflow_provider_walsink.core.protocol.states import CheckpointState as S
    from airflow_provider_walsink.hooks.spark_connect_runner import SparkConnectJobError

    from .world import Attempt

    cfg, store = world.cfg, world.store
    thread, runner, running, ended = w.thread, w.runner, w.running, w.ended
    conn_id = runner.spark_conn_id
    deadline = time.monotonic() + START_WAIT_S
    while not running.exists() and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    if not running.exists():  # ended before its last stage, or never got there (then stopped by the caller)
        error = ended.get("error")
        why = f"{type(error).__name__}: {str(error)[:300]}" if error else f"alive {thread.is_alive()}"
        if isinstance(error, WalsinkError) and not isinstance(error, AttemptCancelledError):
            return f"refused before its job ran: {why}"
        world.notes.append(f"{key}: the watched write did not get to run its job, nothing stopping it: {why}")
        return f"did not run its job: {why}"
    watched = store.require(cfg.pipeline, key)
    attempt, attempt_id = watched.attempt, watched.attempt_id or ""
    if watched.state is not S.WRITING:
        world.notes.append(
            f"{key}: attempt {attempt} runs its job, yet the checkpoint is {watched.state.value}"
        )
    # Never to be published: any of its rows in the target is then a violation of the usual check.
    rows, partitions, start, end = w.drawn
    world.model.attempts[attempt_id] = Attempt(key, attempt_id, watched.version, rows, partitions, start, end)
    world.model.aborted.add(attempt_id)

    acted = time.monotonic()
    try:
        told = world.op_abort(key) if by == "abort" else world.op_write(key, n, parts)
    except WalsinkError as exc:
        told = f"refused: {type(exc).__name__}: {str(exc)[:160]}"
    thread.join(max(0.0, acted + CANCEL_WAIT_S - time.monotonic()))
    problems: list[str] = []
    if thread.is_alive():
        problems.append(f"its job still runs {CANCEL_WAIT_S:.0f} s after the {by.replace('_', ' ')}")
    # Asked of the server: nothing of the job's session still runs (a released session: nothing can).
    left = runner.stop_orphan(runner.job_ref(), logging.getLogger("model"))
    if left is not None and not left.startswith("interrupted 0 "):
        problems.append(f"on the server, after the write ended: {left}")
    thread.join(60)
    error = ended.get("error")
    cause = error.__cause__ if error is not None else None
    if not isinstance(error, AttemptCancelledError) or f"write attempt {attempt} cancelled" not in str(error):
        problems.append(f"the write did not end cancelled: {type(error).__name__}: {str(error)[:300]}")
    elif not (isinstance(cause, SparkConnectJobError) and "was cancelled on" in str(cause)
              and f"(connection {conn_id!r})" in str(cause)):  # fmt: skip
        problems.append(
            f"the job did not end by the runner's cancel: {type(cause).__name__}: {str(cause)[:300]}"
        )
    now = store.require(cfg.pipeline, key)
    staged = world.layout.attempt_dir(cfg.pipeline, key, attempt, attempt_id)
    if now.sealed_attempt_id == attempt_id or (staged / MANIFEST_NAME).exists():
        problems.append(f"the cancelled attempt was sealed (the checkpoint is {now.state.value})")
    reason = "was aborted" if by == "abort" else f"attempt {attempt + 1} of the checkpoint started since"
    history = [h.detail or "" for h in store.history(cfg.pipeline, key)]
    if not any(f"write attempt {attempt} cancelled" in d and reason in d for d in history):
        problems.append(f"the history does not record the cancel ({reason}): {history[-3:]}")
    if by == "abort":
        after = f"{world.op_durable(key)}; commit {json.dumps(world._commit_here(key))[:200]}"
        if store.require(cfg.pipeline, key).state is not S.ABORTED:
            problems.append(f"the aborted checkpoint moved on: {after}")
    elif told.startswith("sealed "):
        newer = store.require(cfg.pipeline, key).sealed_attempt_id
        after = f"{world.op_durable(key)}; {json.dumps(world._commit_until_done(key))[:200]}"
        done = store.require(cfg.pipeline, key)
        if not done.is_committed or done.sealed_attempt_id != newer:
            problems.append(
                f"the newer attempt {(newer or '-')[:8]} did not commit: {done.state.value}: {after}"
            )
    else:
        after = ""
        problems.append(f"the newer attempt was not written: {told}")
    world.notes += [
        f"{key}: cancel_write by {by}, attempt {attempt} ({attempt_id[:8]}): {p}" for p in problems
    ]
    if not problems:
        world.counts[f"cancel_write.{by}"] += 1
    ending = f"{type(error).__name__}: {str(cause or error)[:200]}" if error else "no error"
    return (
        f"attempt {attempt} watched (Spark Connect session {runner.session_id}); {by}: {told}; "
        f"the write ended: {ending}; {after}"
    )
