"""Benchmark 10 (issue 46): one real triggerer holding N durability triggers beside N DateTimeTriggers.

One ``airflow triggerer`` process (the real one, started as the end-to-end tests start it:
``tests/airflow_stack.py``, PostgreSQL metadata database, connections stored in it) holds, at
once, N walsink durability triggers, each on its own checkpoint of its own pipeline, and then,
on the same triggerer, N of Airflow's own ``DateTimeTrigger`` (``--triggers in-turn``, the
default: each kind measured under the same conditions, its loop blocks its own); N = 100, 500
and 1,000, the staging root local and on S3 (a ``moto_server`` process), in one run.
``--triggers both`` loads the 2N at once (a stress beyond the goals: what one kind's load does
to the other's), ``walsink`` or ``datetime`` one kind alone. Both are what the sensors defer in production: the DAG
``bench_triggerer`` has a ``CheckpointDurableSensor(deferrable=True)`` and a
``DateTimeSensorAsync(start_from_trigger=True, end_from_trigger=True)``, both started in the
triggerer and ending their tasks there. Each DAG run carries its pipeline and its moment in its
conf; the triggerer renders both.

How N task instances get there without N scheduler round trips: the benchmark creates the DAG
runs from the serialized DAG and defers each task instance as the scheduler does for a task
that starts in the triggerer (``TaskInstance.defer_task``: the Trigger row and the deferred
task instance), in batches, in a process on the stack's configuration. The triggerer then
assigns, loads and runs them as it would any.

Before the triggers start, every checkpoint is registered and its attempt staged (row WRITING:
the write task is running). The moments are spread over a window (``--window``): at moment i
the benchmark seals checkpoint i (the manifest written to the store, the seal recorded in the
committer table: the end of a write task), and DateTimeTrigger i is due. Measured:

* **latency**: from the seal recorded (walsink; the checkpoint is durable on storage from then
  on) or from the moment (DateTimeTrigger) to its **task succeeding** (``end_date`` of the task
  instance, set by the triggerer when it records the trigger's ``TaskSuccessEvent``): p50, p95,
  max. Both end their task in the triggerer, so this is the task's success, no worker involved;
* **longest event-loop block**: Airflow's own watchdog (``[triggerer]
  blocked_main_thread_warning_threshold``, set to 0.15 s here) logs every 0.1 s sleep of the
  triggerer's loop that took longer; the block is that time minus the 0.1 s asked for;
* **missed heartbeats**: the triggerer job's ``latest_heartbeat`` read from the metadata
  database every 0.5 s; a gap between two heartbeats of more than twice ``job_heartbeat_sec``
  (5 s) missed ``gap // 5 - 1`` of them;
* **memory**: resident set of the triggerer (its supervisor process and its trigger runner
  subprocess) at its peak while it holds the 2N triggers.

The triggerer is started afresh for each (N, staging). Loading triggers is Airflow's own work
(the supervisor builds every new trigger's workload, with the serialized DAG, in its loop):
blocks and heartbeat gaps are reported apart for the loading phase and for the wait and the
firing. Goals: walsink's p95 ≤ 1.2× DateTimeTrigger's, no block over 0.2 s, 0 missed
heartbeats.

    .venv/bin/python -m bench.bench_triggerer                      # N = 100, 500, 1000; local, s3
    .venv/bin/python -m bench.bench_triggerer --n 100 --staging local --window 30   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    __package__ = "bench"

from bench.common import PG_ADMIN_URL, REPO, Table, fmt_s, print_run, private_pg_database  # noqa: E402

DAG_ID = "bench_triggerer"
HEARTBEAT_S = 5.0
WATCHDOG_SLEEP_S = 0.1
WATCHDOG_THRESHOLD_S = 0.15
ACCESS_KEY, SECRET_KEY, REGION, BUCKET = "bench-key", "bench-secret", "us-east-1", "walsink-bench"
FIRST_DAY = datetime(2001, 1, 1, tzinfo=UTC)
#: --triggers: which of the DAG's tasks are deferred (durable: walsink's sensor; moment: DateTimeSensorAsync).
#: in-turn: one kind after the other on the same triggerer (each turn N triggers, measured apart).
TRIGGER_TURNS: dict[str, list[tuple[str, ...]]] = {
    "in-turn": [("durable",), ("moment",)],
    "both": [("durable", "moment")],
    "walsink": [("durable",)],
    "datetime": [("moment",)],
    # The control for in-turn: what a first turn of 1,000 finished tasks leaves to the second.
    "datetime-twice": [("moment",), ("moment",)],
}
LABELS = {"durable": "walsink", "moment": "DateTimeTrigger"}

_DAG = """\
from datetime import UTC, datetime

from airflow.providers.standard.sensors.date_time import DateTimeSensorAsync
from airflow.sdk import DAG

from airflow_provider_walsink.sensors.durable import CheckpointDurableSensor

with DAG(dag_id={dag_id!r}, schedule="@daily", start_date=datetime(2000, 1, 1, tzinfo=UTC), catchup=False):
    CheckpointDurableSensor(
        task_id="durable",
        pipeline="{{{{ dag_run.conf['pipeline'] }}}}",
        deferrable=True,
        poke_interval={poke},
        timeout=7200,
    )
    DateTimeSensorAsync(
        task_id="moment",
        target_time="{{{{ dag_run.conf['fire_at'] }}}}",
        start_from_trigger=True,
        end_from_trigger=True,
    )
"""


#: With ``--gc-log``: a ``sitecustomize`` the triggerer's processes load, logging every garbage
#: collection that takes over 50 ms (a collection stops the whole process, its event loop included).
_GC_LOG = """\
import gc, os, time

_log = os.environ.get("WALSINK_BENCH_GC_LOG")
_began = []


def _timed(phase, info):
    if phase == "start":
        _began[:] = [time.perf_counter()]
    elif _began and time.perf_counter() - _began[0] > 0.05:
        with open(_log, "a") as out:
            pause = time.perf_counter() - _began[0]
            scanned = len(gc.get_objects(2)) if info["generation"] == 2 else -1
            out.write(
                f"{time.time():.3f} {os.getpid()} {info['generation']} {pause:.3f} {scanned} {gc.get_freeze_count()}\\n"
            )


if _log:
    gc.callbacks.append(_timed)
"""


#: With ``--loop-log``: appended to the same ``sitecustomize``, logging every callback of an event
#: loop of the triggerer's processes that ran over 40 ms, with the CPU time its thread spent in it:
#: a callback whose CPU time is a small part of its time waited (for the interpreter lock, a lock,
#: a thread's start), which is how a block with no garbage collection behind it shows its cause.
_LOOP_LOG = """\
import asyncio.events, os, time

_loop_log = os.environ.get("WALSINK_BENCH_LOOP_LOG")
_run_handle = asyncio.events.Handle._run


def _timed_run(self):
    began, cpu = time.perf_counter(), time.thread_time()
    try:
        return _run_handle(self)
    finally:
        took = time.perf_counter() - began
        if took > 0.04:
            with open(_loop_log, "a") as out:
                spent = time.thread_time() - cpu
                out.write(f"{time.time():.3f} {os.getpid()} {took:.3f} {spent:.3f} {repr(self)[:300]!r}\\n")


if _loop_log:
    asyncio.events.Handle._run = _timed_run
"""


@dataclass
class Phase:
    """One phase as the monitor saw it: when it began and ended, the triggerer's resident set in
    it, and where its lines are in the triggerer's log."""

    began: float
    ended: float = float("inf")
    rss: list[tuple[int, int]] = field(default_factory=list)  # (supervisor, runner) bytes
    log_from: int = 0
    log_to: int = 0


# ------------------------------------------------------------------ in the stack's configuration


def defer_runs(spec_file: str) -> None:
    """Create the DAG runs of ``spec_file`` and defer their task instances as the scheduler does for
    a task that starts in the triggerer; runs in a process on the stack's configuration."""
    from airflow.models.serialized_dag import SerializedDagModel
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState
    from airflow.utils.types import DagRunTriggeredByType, DagRunType

    spec = json.loads(Path(spec_file).read_text())
    with create_session() as session:
        dag = SerializedDagModel.get_dag(DAG_ID, session=session)
    if dag is None:
        raise SystemExit(f"DAG {DAG_ID} is not serialized")
    runs = spec["runs"]
    for start in range(0, len(runs), spec["batch"]):
        with create_session() as session:
            for run in runs[start : start + spec["batch"]]:
                logical = datetime.fromisoformat(run["logical_date"])
                dag_run = dag.create_dagrun(
                    run_id=run["run_id"],
                    logical_date=logical,
                    data_interval=(logical, logical + timedelta(days=1)),
                    run_after=logical,
                    conf=run["conf"],
                    run_type=DagRunType.MANUAL,
                    triggered_by=DagRunTriggeredByType.TEST,
                    state=DagRunState.RUNNING,
                    start_date=datetime.now(UTC),
                    session=session,
                )
                for ti in dag_run.get_task_instances(session=session):
                    if ti.task_id not in spec["tasks"]:
                        continue  # left unscheduled (the benchmark's --triggers: one kind only)
                    ti.task = dag.get_task(ti.task_id)
                    if not ti.defer_task(session=session):
                        raise SystemExit(f"{ti.task_id} of {run['run_id']} does not start in the triggerer")
        time.sleep(spec["pause"])


# ------------------------------------------------------------------ the benchmark's side


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start_moto(log: Path) -> tuple[subprocess.Popen, str]:
    """A ``moto_server`` process (not a thread here: the benchmark's own timing must not share it)."""
    port = _free_port()
    binary = Path(sys.executable).with_name("moto_server")
    out = open(log, "ab")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        [str(binary), "-H", "127.0.0.1", "-p", str(port)], stdout=out, stderr=subprocess.STDOUT
    )
    endpoint = f"http://127.0.0.1:{port}"
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=ACCESS_KEY,
                          aws_secret_access_key=SECRET_KEY, region_name=REGION)  # fmt: skip
    deadline = time.monotonic() + 60
    while True:
        try:
            client.create_bucket(Bucket=BUCKET)
            return proc, endpoint
        except Exception:  # noqa: BLE001 - not serving yet
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise
            time.sleep(0.2)


class Monitor(threading.Thread):
    """Reads the triggerer job's heartbeat and the triggerer's resident set every 0.5 s."""

    def __init__(self, engine: Any, stack: Any, log_path: Path, after_job: int) -> None:
        super().__init__(daemon=True)
        self.engine, self.stack, self.log_path = engine, stack, log_path
        self.phases: dict[str, Phase] = {}
        self.current: Phase | None = None
        self.beats: list[float] = []  # every heartbeat seen (epoch seconds)
        self.supervisor: set[int] = set()  # the triggerer's own process
        self.runner: set[int] = set()  # its trigger runner subprocess
        self.stopping = threading.Event()
        self.after_job = after_job  # the triggerer started for this configuration has a newer job
        self.job_id: int | None = None

    def phase(self, name: str) -> None:
        size = self.log_path.stat().st_size if self.log_path.exists() else 0
        if self.current is not None:
            self.current.log_to, self.current.ended = size, time.time()
        self.current = self.phases[name] = Phase(began=time.time(), log_from=size)

    def finish(self) -> None:
        self.stopping.set()
        self.join()
        if self.current is not None:
            self.current.log_to, self.current.ended = self.log_path.stat().st_size, time.time()

    def gaps(self, phase: Phase) -> list[float]:
        """The gaps between heartbeats that began in ``phase`` (a block delays the next beat: the
        gap is the phase's in which the beat before it was written)."""
        return [
            b - a for a, b in zip(self.beats, self.beats[1:], strict=False) if phase.began <= a < phase.ended
        ]

    def _rss(self) -> tuple[int, int]:
        import psutil

        pids = self.stack.pids().get("triggerer", [])[1:]  # the guard's own pid first: not counted
        self.supervisor.update(pids[:1])
        self.runner.update(pids[1:])
        sizes = []
        for pid in pids:
            try:
                sizes.append(psutil.Process(pid).memory_info().rss)
            except psutil.Error:
                sizes.append(0)
        return (sizes[0] if sizes else 0, sum(sizes[1:]))

    def run(self) -> None:
        from sqlalchemy import text

        while not self.stopping.wait(0.5):
            phase = self.current
            try:
                with self.engine.connect() as conn:
                    if self.job_id is None:
                        self.job_id = conn.execute(
                            text("SELECT min(id) FROM job WHERE job_type = 'TriggererJob' AND id > :after"),
                            {"after": self.after_job},
                        ).scalar()
                    beat = (
                        conn.execute(
                            text("SELECT latest_heartbeat FROM job WHERE id = :id"), {"id": self.job_id}
                        ).scalar()
                        if self.job_id is not None
                        else None
                    )
                if beat is not None and (not self.beats or self.beats[-1] != beat.timestamp()):
                    self.beats.append(beat.timestamp())
                if phase is not None:
                    phase.rss.append(self._rss())
            except Exception as exc:  # noqa: BLE001 - a missed sample is reported by its gap
                print(f"  monitor: {exc}", file=sys.stderr)


def _blocks(log_path: Path, phase: Phase) -> list[tuple[float, float]]:
    """The loop blocks Airflow's watchdog logged in ``phase``: (when it ended, epoch; how long: the
    excess of a 0.1 s sleep)."""
    with log_path.open("rb") as f:
        f.seek(phase.log_from)
        text_ = f.read(max(0, phase.log_to - phase.log_from)).decode(errors="replace")
    found = re.findall(r"^(\S+)Z .*async thread was blocked for ([0-9.]+) seconds", text_, re.MULTILINE)
    return [
        (datetime.fromisoformat(at).replace(tzinfo=UTC).timestamp(), float(took) - WATCHDOG_SLEEP_S)
        for at, took in found
    ]


def _slow_lookups(log_path: Path, phase: Phase, trigger_logs: list[Path]) -> list[float]:
    """The connection lookups walsink's triggers logged as slow (1 s or more) in ``phase`` (in the
    triggerer's log) or in ``trigger_logs`` (a trigger's own log, where a lookup in its check goes):
    a fresh triggerer's first lookup of a connection in the metadata database, during which its
    supervisor builds Airflow's in-process Execution API and does not heartbeat."""
    with log_path.open("rb") as f:
        f.seek(phase.log_from)
        text_ = f.read(max(0, phase.log_to - phase.log_from)).decode(errors="replace")
    text_ += "".join(p.read_text(errors="replace") for p in trigger_logs)
    return [float(x) for x in re.findall(r"walsink: connection '[^']*' took ([0-9.]+) s to look up", text_)]


def _blocks_in_pauses(
    blocks: list[tuple[float, float]], collections: list[tuple[float, int, float]], pids: set[int]
) -> int:
    """How many of the blocks over 0.2 s (end, length) overlapped a GC pause (end, pid, length) of
    one of ``pids``."""
    return sum(
        b > 0.2
        and any(
            pid in pids and at - pause - 0.05 <= end and end - b - 0.05 <= at
            for at, pid, pause in collections
        )
        for end, b in blocks
    )


def _missed(gaps: list[float]) -> tuple[int, float]:
    """(heartbeats missed, longest gap) of gaps between heartbeats."""
    missed = sum(int(g // HEARTBEAT_S) - 1 for g in gaps if g > 2 * HEARTBEAT_S)
    return missed, max(gaps, default=0.0)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def one_config(
    *,
    stack: Any,
    engine: Any,
    committer: Any,
    n: int,
    staging_kind: str,
    staging: Any,
    index: int,
    window: float,
    poke: float,
    batch: int,
    scratch: Path,
    turns: list[tuple[str, ...]],
) -> dict[str, Any]:
    """Start a fresh triggerer, then for each of ``turns`` (the tasks it defers: both kinds at once,
    or one kind a turn) load N runs' triggers, fire them over ``window``, and measure."""
    from sqlalchemy import text

    from airflow_provider_walsink.core.commit.writer import CheckpointWriter
    from airflow_provider_walsink.core.store.records import Actor

    tasks = [t for t in ("durable", "moment") if any(t in turn for turn in turns)]
    prefix = f"c{index}_{staging_kind}_{n}"
    actor = Actor(name="bench-write", dag_id=DAG_ID, run_id=prefix, task_id="write", try_number=1)
    # The sensor takes its checkpoint's key from the run's logical date: pipeline i's checkpoint is
    # days[i] (the warm-up's days[n]); runs of a turn without walsink's sensor take days after those.
    days = [FIRST_DAY + timedelta(days=index * 5000 + i) for i in range((len(turns) + 1) * n + 1)]
    pipelines = [f"{prefix}_p{i:04d}" for i in range(n + 1)]

    def stage(i: int) -> Any:
        key = days[i].strftime("%Y%m%dT%H%M%SZ")
        committer.register(pipelines[i], key, mode="overwrite", actor=actor)
        writer = CheckpointWriter(committer, staging, pipelines[i], key, actor=actor)
        where = writer.begin()
        files = {f"part-{j}.csv": f"{key},{j}\n".encode() * 200 for j in range(2)}
        for rel, data in files.items():
            if isinstance(where, Path):
                (where / rel).write_bytes(data)
            else:
                with staging.filesystem.open_output_stream(staging.committable(where, rel)) as out:
                    out.write(data)
        writer.add_files(files, checksum="crc32", writer="bench")
        return writer

    with ThreadPoolExecutor(4) as pool:
        writers = list(pool.map(stage, range(n + 1)))  # every row WRITING: the write tasks are running
    warm_up = writers.pop()  # the last one: sealed now, waited on first

    def defer(runs: list[dict[str, Any]], name: str, deferred: list[str]) -> None:
        spec_file = scratch / f"{prefix}_{name}.json"
        spec_file.write_text(json.dumps({"batch": batch, "pause": 0.5, "runs": runs, "tasks": deferred}))
        done = subprocess.run(
            [sys.executable, "-m", "bench.bench_triggerer", "--defer-runs", str(spec_file)],
            env={
                **stack.env,
                "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
            },
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise RuntimeError(f"bench: deferring the {name} runs failed:\n{done.stderr[-3000:]}")

    def run_spec(run_id: str, day: int, pipeline: int, moment: float) -> dict[str, Any]:
        return {
            "run_id": run_id,
            "logical_date": days[day].isoformat(),
            "conf": {
                "pipeline": pipelines[pipeline],
                "fire_at": datetime.fromtimestamp(moment, UTC).isoformat(),
            },
        }

    def states(like: str) -> list[Any]:
        with engine.connect() as conn:
            return conn.execute(
                text(
                    "SELECT task_id, run_id, state, end_date FROM task_instance "
                    "WHERE dag_id = :d AND run_id LIKE :r"
                ),
                {"d": DAG_ID, "r": like},
            ).all()

    log_path = stack.logs_dir / "triggerer.out"
    with engine.connect() as conn:
        last_job = conn.execute(text("SELECT coalesce(max(id), 0) FROM job")).scalar()
    stack.start_component("triggerer")
    monitor = Monitor(engine, stack, log_path, last_job)
    # Start-up: one trigger of each kind, fired at once. A fresh triggerer's first connection lookup
    # starts Airflow's in-process execution API in its supervisor, and the trigger runner imports
    # what the triggers need: once per triggerer process, reported apart.
    monitor.phase("start-up (1 trigger of each kind)")
    monitor.start()
    warm_up.seal(file_format="csv")
    defer([run_spec(f"{prefix}__warm", n, n, time.time())], "warm-up", tasks)
    up_by = time.time() + 600
    while sum(r.state == "success" for r in states(f"{prefix}__warm")) < len(tasks) and time.time() < up_by:
        time.sleep(1)

    latency: dict[str, list[float]] = {"durable": [], "moment": []}
    failed: dict[str, int] = {"durable": 0, "moment": 0}
    loaded_in: list[float] = []
    overran: list[bool] = []
    sealed_at: list[float] = []
    seal_moments: list[float] = []
    per_turn: dict[str, dict[str, float]] = {}  # each turn's p95 by task
    for t, turn in enumerate(turns):
        label = "" if len(turns) == 1 else f" (turn {t + 1}: " + " and ".join(LABELS[x] for x in turn) + ")"
        monitor.phase("loading" + label)
        # Loading N runs takes the triggerer a while (its supervisor builds each workload): the
        # moments start after a lead that covers it; if it did not, the notes say so.
        lead = 30.0 + 0.15 * n
        t0 = time.time() + lead
        moments = [t0 + i * window / n for i in range(n)]
        started = time.time()
        run_ids = [f"{prefix}t{t}__{i:04d}" for i in range(n)]
        first_day = 0 if "durable" in turn else n + 1 + t * n
        defer([run_spec(run_ids[i], first_day + i, i, moments[i]) for i in range(n)], f"load{t}", list(turn))
        like = f"{prefix}t{t}__%"
        index_of = {run_id: i for i, run_id in enumerate(run_ids)}
        while True:  # every trigger assigned to the triggerer
            with engine.connect() as conn:
                waiting = conn.execute(
                    text(
                        "SELECT count(*) FROM task_instance ti JOIN trigger t ON t.id = ti.trigger_id "
                        "WHERE ti.dag_id = :d AND ti.run_id LIKE :r AND t.triggerer_id IS NOT NULL"
                    ),
                    {"d": DAG_ID, "r": like},
                ).scalar()
            if waiting >= len(turn) * n or time.time() > t0:
                break
            time.sleep(1)
        loaded_in.append(time.time() - started)
        # The triggerer builds the assigned triggers' workloads and starts them: a settling time.
        time.sleep(max(0.0, min(t0 - time.time(), 10.0 + 0.02 * n)))
        monitor.phase("waiting and firing" + label)
        overran.append(time.time() > t0)
        if "durable" in turn:
            for i, writer in enumerate(writers):
                delay = moments[i] - time.time()
                if delay > 0:
                    time.sleep(delay)
                writer.seal(
                    file_format="csv"
                )  # durable on storage from here: manifest written, seal recorded
                sealed_at.append(time.time())
            seal_moments = moments
        deadline = moments[-1] + 3 * poke + 180
        while True:
            rows = [r for r in states(like) if r.run_id in index_of and r.task_id in turn]
            done = [r for r in rows if r.state in ("success", "failed")]
            if len(done) >= len(turn) * n or time.time() > deadline:
                break
            time.sleep(1)
        turn_latency: dict[str, list[float]] = {task: [] for task in turn}
        for r in rows:
            if r.state != "success" or r.end_date is None:
                failed[r.task_id] += 1
                continue
            i = index_of[r.run_id]
            since = sealed_at[i] if r.task_id == "durable" else moments[i]
            turn_latency[r.task_id].append(r.end_date.timestamp() - since)
        for task, values in turn_latency.items():
            latency[task].extend(values)
        per_turn[f"turn {t + 1}"] = {
            LABELS[task]: _pct(values, 0.95) for task, values in turn_latency.items()
        }
    monitor.finish()
    stack.stop_component("triggerer")

    # walsink's latency in its two parts: the seal to the DURABLE mark (the watch and the check,
    # walsink's own) and the mark to the task's success (the event's way through Airflow, which a
    # DateTimeTrigger's event takes too). The mark's time is the committer database's clock
    # (naive UTC, the same machine).
    marked: list[float] = []
    if "durable" in tasks:
        with committer.engine.connect() as conn:
            found = conn.execute(
                text(
                    "SELECT c.pipeline, t.at FROM walsink_transition t JOIN walsink_checkpoint c"
                    " ON c.id = t.checkpoint_id WHERE t.to_state = 'DURABLE' AND c.pipeline LIKE :like"
                ),
                {"like": f"{prefix}_p%"},
            ).all()
        at_of = {p: at.replace(tzinfo=UTC).timestamp() for p, at in found}
        marked = [at_of[pipelines[i]] - sealed_at[i] for i in range(n) if pipelines[i] in at_of]
    collections = []  # (epoch, pid, seconds) of the long garbage collections, with --gc-log
    if (scratch / "gc.log").exists():
        for line in (scratch / "gc.log").read_text().splitlines():
            at, pid, _generation, pause, *_heap = (
                line.split()
            )  # and the old generation's and the frozen objects
            collections.append((float(at), int(pid), float(pause)))
    phases = {}
    for name, phase in monitor.phases.items():
        gaps = monitor.gaps(phase)
        missed, gap = _missed(gaps)
        blocks = _blocks(log_path, phase)
        pauses = [(pid, pause) for at, pid, pause in collections if phase.began <= at < phase.ended]
        phases[name] = {
            "gc_runner": max((x for pid, x in pauses if pid in monitor.runner), default=None),
            "gc_supervisor": max((x for pid, x in pauses if pid in monitor.supervisor), default=None),
            "missed": missed,
            "gap": gap,
            "beats": len(gaps),
            "block": max((b for _, b in blocks), default=0.0),
            "blocks_over": sum(b > 0.2 for _, b in blocks),
            # ...of them, those a long collection of the runner overlapped (a GC pause stops the
            # loop), and those one of the supervisor overlapped (the runner writes its triggers'
            # logs and events to the supervisor, which reads none while it collects).
            "blocks_over_gc": _blocks_in_pauses(blocks, collections, monitor.runner),
            "blocks_over_supervisor_gc": _blocks_in_pauses(blocks, collections, monitor.supervisor),
            "lookup": max(
                _slow_lookups(
                    log_path,
                    phase,
                    # the start-up's triggers: the first lookups of this triggerer
                    list(log_path.parent.glob(f"dag_id={DAG_ID}/run_id={prefix}__warm/*/*.trigger.*.log"))
                    if name.startswith("start-up")
                    else [],
                ),
                default=None,
            ),
            "rss": max((a + b for a, b in phase.rss), default=0),
            "rss_runner": max((b for _, b in phase.rss), default=0),
        }
    return {
        "n": n,
        "staging": staging_kind,
        "latency": latency,
        "marked": marked,
        "failed": failed,
        "phases": phases,
        "loaded_in": loaded_in,
        "per_turn_p95": per_turn,
        "overran": any(overran),
        "seal_lag": max((s - m for s, m in zip(sealed_at, seal_moments, strict=True)), default=0.0),
    }


def run(
    sizes: list[int],
    kinds: list[str],
    window: float,
    poke: float,
    batch: int,
    scratch: Path,
    asyncio_debug: bool = False,
    gc_log: bool = False,
    turns: list[tuple[str, ...]] = TRIGGER_TURNS["in-turn"],
    gc_freeze: bool = True,
    loop_log: bool = False,
    connections: str = "metadata",
) -> list[Table]:
    sys.path.insert(0, str(REPO / "tests"))
    from airflow_stack import AirflowStack  # the e2e tests' stack
    from sqlalchemy import create_engine

    from airflow_provider_walsink.core.staging.layout import StagingLayout
    from airflow_provider_walsink.core.staging.object_store import StagingStore
    from airflow_provider_walsink.core.store import CommitterStore

    dags = scratch / "dags"
    dags.mkdir(parents=True)
    (dags / f"{DAG_ID}.py").write_text(_DAG.format(dag_id=DAG_ID, poke=poke))
    local_root = scratch / "staging"
    diag: dict[str, str] = {}
    if gc_log or loop_log:
        (scratch / "diag").mkdir()
        (scratch / "diag" / "sitecustomize.py").write_text(_GC_LOG + (_LOOP_LOG if loop_log else ""))
        diag = {
            "WALSINK_BENCH_GC_LOG": str(scratch / "gc.log") if gc_log else "",
            "WALSINK_BENCH_LOOP_LOG": str(scratch / "loop.log") if loop_log else "",
        }
    results = []
    moto = None
    artifacts = REPO / "test-artifacts" / f"bench-triggerer-{time.strftime('%Y%m%dT%H%M%S')}"
    try:
        if "s3" in kinds:
            moto, endpoint = _start_moto(scratch / "moto.out")
            s3 = StagingStore.open(
                f"s3://{BUCKET}/staging",
                {
                    "endpoint_url": endpoint,
                    "access_key": ACCESS_KEY,
                    "secret_key": SECRET_KEY,
                    "region": REGION,
                },
            )
        with private_pg_database() as committer_url:
            committer = CommitterStore.from_url(committer_url)
            conns = {
                "walsink_default": {
                    "conn_type": "walsink",
                    "extra": {
                        "url": committer_url,
                        "staging_root": str(local_root),
                        "staging_conn_id": "bench_s3",
                    },
                }
            }
            if moto is not None:
                conns["bench_s3"] = {
                    "conn_type": "aws",
                    "login": ACCESS_KEY,
                    "password": SECRET_KEY,
                    "extra": {"region_name": REGION, "endpoint_url": endpoint},
                }
            # --connections environment: the trigger runner finds them in its environment and never
            # asks the supervisor, whose first lookup starts Airflow's in-process Execution API.
            in_env = (
                {f"AIRFLOW_CONN_{c.upper()}": json.dumps(v) for c, v in conns.items()}
                if connections == "environment"
                else {}
            )
            stack = AirflowStack.create(
                scratch / "stack",
                postgres_admin_url=PG_ADMIN_URL,
                dags_folder=dags,
                components=(),
                artifacts_dir=artifacts,
                env={
                    "AIRFLOW__TRIGGERER__CAPACITY": str(2 * max(sizes) + 100),
                    "AIRFLOW__TRIGGERER__BLOCKED_MAIN_THREAD_WARNING_THRESHOLD": str(WATCHDOG_THRESHOLD_S),
                    "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": str(HEARTBEAT_S),
                    # The triggerer imports this checkout's walsink, whatever the venv installed.
                    "PYTHONPATH": os.pathsep.join(
                        filter(
                            None,
                            [
                                str(scratch / "diag") if diag else "",
                                str(REPO),
                                os.environ.get("PYTHONPATH"),
                            ],
                        )
                    ),
                    **diag,
                    **in_env,
                    **({} if gc_freeze else {"WALSINK_TRIGGERER_GC_FREEZE": "0"}),
                    # asyncio's debug mode names each slow callback in the triggerer's log (and slows it).
                    **({"PYTHONASYNCIODEBUG": "1"} if asyncio_debug else {}),
                },
            )
            with stack:
                if not in_env:
                    for conn_id, conn in conns.items():
                        stack.airflow("connections", "add", conn_id, "--conn-json", json.dumps(conn))
                stack.airflow("dags", "reserialize", timeout=300)
                engine = create_engine(stack.metadata_url)
                index = 0
                for n in sizes:
                    for kind in kinds:
                        index += 1
                        print(f"  N={n} {kind}: staging, loading, firing over {window:.0f} s", flush=True)
                        staging = StagingLayout(local_root) if kind == "local" else s3
                        result = one_config(
                            stack=stack, engine=engine, committer=committer, n=n, staging_kind=kind,
                            staging=staging, index=index, window=window, poke=poke, batch=batch,
                            scratch=scratch, turns=turns,
                        )  # fmt: skip
                        results.append(result)
                        print(f"    {_summary(result)}", flush=True)
                engine.dispose()
            committer.dispose()
    finally:
        if moto is not None:
            moto.terminate()
            moto.wait(timeout=30)
    tables = _tables(results, window, poke, artifacts, gc_log)
    tables[-1].notes.append(
        "walsink's connections: "
        + (
            "in the triggerer's environment (AIRFLOW_CONN_*): no lookup reaches the supervisor."
            if connections == "environment"
            else "in Airflow's metadata database: a fresh triggerer's first lookup starts Airflow's "
            "in-process Execution API in its supervisor (start-up)."
        )
    )
    if loop_log:
        tables[-1].notes.append(_slow_callbacks(scratch / "loop.log", artifacts))
    return tables


def _slow_callbacks(log: Path, artifacts: Path) -> str:
    """The ``--loop-log`` note: the longest callbacks of the triggerer's loops, with their CPU time
    (the log itself copied to ``artifacts``)."""
    lines = log.read_text().splitlines() if log.exists() else []
    if lines:
        artifacts.mkdir(parents=True, exist_ok=True)
        (artifacts / "loop.log").write_text("\n".join(lines) + "\n")
    longest = sorted((line.split(" ", 4) for line in lines), key=lambda x: -float(x[2]))[:5]
    shown = "; ".join(
        f"{fmt_s(float(took))} (CPU {fmt_s(float(cpu))}, pid {pid}) {handle}"
        for _, pid, took, cpu, handle in longest
    )
    return f"Loop callbacks over 40 ms (--loop-log): {len(lines)}; the longest: {shown or 'none'}."


def _summary(r: dict[str, Any]) -> str:
    lat = r["latency"]
    return (
        f"walsink p95 {fmt_s(_pct(lat['durable'], 0.95))}, DateTimeTrigger p95 {fmt_s(_pct(lat['moment'], 0.95))}, "
        f"failed {r['failed']}, p95 by turn {r['per_turn_p95']}, phases {json.dumps(r['phases'], default=str)}"
    )


def _tables(
    results: list[dict[str, Any]], window: float, poke: float, artifacts: Path, gc_log: bool
) -> list[Table]:
    latency = Table(
        "Benchmark 10: one triggerer, N walsink durability triggers beside N DateTimeTriggers: from durable "
        "on storage (walsink: the seal recorded) or the moment (DateTimeTrigger) to the task succeeding "
        "(goal: walsink p95 ≤ 1.2× DateTimeTrigger's)",
        ["N", "staging", "trigger", "p50", "p95", "max", "tasks succeeded", "p95 × DateTimeTrigger"],
    )
    health = Table(
        "Benchmark 10: the triggerer's health, phase by phase (goals: no event-loop block over 0.2 s, 0 "
        "missed heartbeats)",
        [
            "N",
            "staging",
            "phase",
            "longest loop block",
            "blocks > 0.2 s",
            "heartbeat gaps seen",
            "missed heartbeats (longest gap)",
            "triggerer RSS (runner)",
            "longest GC pause (runner / supervisor)",
        ],
    )
    for r in results:
        lat = r["latency"]
        base = _pct(lat["moment"], 0.95)
        for task, label in (("durable", "walsink"), ("moment", "DateTimeTrigger")):
            values = lat[task]
            if not values and not r["failed"][task]:
                continue  # not loaded (--triggers)
            latency.rows.append(
                [
                    r["n"],
                    r["staging"],
                    label,
                    fmt_s(_pct(values, 0.5)),
                    fmt_s(_pct(values, 0.95)),
                    fmt_s(max(values, default=float("nan"))),
                    f"{len(values)} of {r['n']}",
                    "1.00×"
                    if task == "moment"
                    else (f"{_pct(values, 0.95) / base:.2f}×" if lat["moment"] else "-"),
                ]
            )
        for name, p in r["phases"].items():
            health.rows.append(
                [
                    r["n"],
                    r["staging"],
                    name,
                    fmt_s(p["block"]) if p["block"] else "none over 0.05 s",
                    f"{p['blocks_over']} ({p['blocks_over_gc']} in a GC pause of the runner, "
                    f"{p['blocks_over_supervisor_gc']} of the supervisor)"
                    if gc_log
                    else p["blocks_over"],
                    p["beats"],
                    f"{p['missed']} ({p['gap']:.1f} s)"
                    + (f"; a {p['lookup']:.1f} s connection lookup" if p.get("lookup") else ""),
                    f"{p['rss'] / 2**20:.0f} MiB ({p['rss_runner'] / 2**20:.0f} MiB)",
                    " / ".join(
                        ("none over 50 ms" if gc_log else "-") if x is None else fmt_s(x)
                        for x in (p["gc_runner"], p["gc_supervisor"])
                    ),
                ]
            )
    for r in results:
        if r.get("marked"):
            m = r["marked"]
            latency.notes.append(
                f"N={r['n']} {r['staging']}: walsink's own part, from the seal recorded to the DURABLE mark "
                f"(the watch and the check): p50 {fmt_s(_pct(m, 0.5))}, p95 {fmt_s(_pct(m, 0.95))}, "
                f"max {fmt_s(max(m))}; the rest is the event's way to the task's success."
            )
    latency.notes.append(
        f"Moments spread evenly over {window:.0f} s per (N, staging); the sensor's poke_interval {poke:g} s; "
        "each task ends in the triggerer (TaskSuccessEvent), so 'succeeding' is the task instance's end_date "
        "as the triggerer records it. Committer table and Airflow metadata on PostgreSQL; S3 is a moto_server "
        "process on loopback."
    )
    for r in results:
        if r["overran"]:
            latency.notes.append(
                f"N={r['n']} {r['staging']}: a loading took longer than its lead: the first "
                "moments came before every trigger ran, for both kinds alike."
            )
    latency.notes.append(
        "Loading: "
        + "; ".join(
            f"N={r['n']} {r['staging']} " + " + ".join(f"{x:.0f} s" for x in r["loaded_in"]) for r in results
        )
        + ". Longest lag of a seal behind its moment (the benchmark's own): "
        + "; ".join(f"{fmt_s(r['seal_lag'])}" for r in results)
        + f". Component logs kept in {artifacts}."
    )
    health.notes.append(
        "Loop blocks from Airflow's watchdog (threshold 0.15 s on its 0.1 s sleep, so blocks over 0.05 s are "
        "seen); heartbeats from the metadata database every 0.5 s (job_heartbeat_sec 5: a gap over 10 s "
        "missed one or more); RSS of the triggerer's supervisor and trigger runner processes, peak in the "
        "phase (the runner's alone in brackets)."
    )
    return [latency, health]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", default="100,500,1000", help="trigger counts, comma-separated")
    parser.add_argument("--staging", default="local,s3", help="staging roots: local, s3")
    parser.add_argument("--window", type=float, default=60.0, help="seconds over which the moments spread")
    parser.add_argument("--poke-interval", type=float, default=5.0, help="the sensor's (its default: 5)")
    parser.add_argument("--batch", type=int, default=50, help="DAG runs deferred per batch")
    parser.add_argument(
        "--asyncio-debug", action="store_true", help="run the triggerer's loop in asyncio's debug mode"
    )
    parser.add_argument(
        "--gc-log", action="store_true", help="report the triggerer's garbage collections over 50 ms"
    )
    parser.add_argument(
        "--loop-log",
        action="store_true",
        help="log the triggerer's loop callbacks over 40 ms with their CPU time (what a block waited for)",
    )
    parser.add_argument(
        "--triggers",
        choices=sorted(TRIGGER_TURNS),
        default="in-turn",
        help="in-turn (the benchmark): N walsink triggers, then N DateTimeTriggers, on the same triggerer; "
        "both: the 2N at once; walsink, datetime: one kind alone; datetime-twice: two turns of it",
    )
    parser.add_argument(
        "--no-gc-freeze", action="store_true", help="WALSINK_TRIGGERER_GC_FREEZE=0 in the triggerer"
    )
    parser.add_argument(
        "--connections",
        choices=("metadata", "environment"),
        default="metadata",
        help="where walsink's connections live: Airflow's metadata database (the default) or the "
        "triggerer's environment (AIRFLOW_CONN_*, which the trigger runner reads without its supervisor)",
    )
    parser.add_argument("--work-dir", default=None)
    parser.add_argument("--defer-runs", help=argparse.SUPPRESS)  # the loader, in the stack's configuration
    args = parser.parse_args(argv)
    if args.defer_runs:
        defer_runs(args.defer_runs)
        return 0
    sizes = [int(x) for x in args.n.split(",") if x.strip()]
    kinds = [x.strip() for x in args.staging.split(",") if x.strip()]
    return print_run(
        "walsink-bench-triggerer-",
        args.work_dir,
        lambda scratch: run(
            sizes,
            kinds,
            args.window,
            args.poke_interval,
            args.batch,
            scratch,
            args.asyncio_debug,
            args.gc_log,
            TRIGGER_TURNS[args.triggers],
            not args.no_gc_freeze,
            args.loop_log,
            args.connections,
        ),
    )


if __name__ == "__main__":
    raise SystemExit(main())
