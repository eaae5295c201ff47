"""The crash campaign: seeded schedules of real pipelines, SIGKILLed, retried and checked.

One *schedule* is one pipeline (``append`` with source offsets, or
``overwrite`` of partitions that already hold stale data) of 2-4 checkpoints.
Each checkpoint goes through the three tasks of a walsink DAG run, **write**
(:class:`CheckpointWriter`: new attempt, stage files, seal), **durable** (read
the sealed manifest, verify every committable on storage, mark DURABLE) and
**commit** (:class:`CheckpointCommitter` with a :class:`FilePublisher`). Every
task try runs in its own forked process; the schedule arms
``WALSINK_CRASH_AT`` for some tries, so that process SIGKILLs itself at the
named point. The driver then retries as Airflow does: a new try of the same
task (the write starts a new attempt; a commit try is a new lease owner and
waits out the dead owner's lease, then takes it over).

After every injected crash the target is checked for what may be visible
mid-flight (committed checkpoints complete, the in-flight one never
duplicated, overwrite partitions old or new, never mixed). After the schedule
it is checked against the source: every checkpoint COMMITTED exactly once,
every source row in the target exactly once, no stale row, offsets continued,
a re-run commit a no-op that changes nothing, and after GC no staging and no
publish journal left.

Two more kinds of schedule prove the fencing (invariant 8) and re-runs after
retention (invariant 9):

* **zombie**: the first commit try is *stopped* (SIGSTOP, as a paused VM or a
  stalled mount) at a point where it holds the lease and has published part
  of the checkpoint. While it is stopped, a second try of the same task runs
  with a client clock two hours fast: it must not take the live lease early,
  waits it out, takes it over and commits. Then the first try is resumed
  (SIGCONT): it must stop with a fencing error and leave the target exactly
  as the second try left it.
* **retention** (``overwrite``): after the schedule, one committed
  checkpoint's rows are deleted from the committer table, as retention does,
  and its interval is re-run with new rows: its partitions must then hold
  exactly the new rows.
"""

from __future__ import annotations

import gc
import json
import logging
import multiprocessing
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from airflow_provider_walsink.core import faults
from airflow_provider_walsink.core.commit.commit import CheckpointCommitter
from airflow_provider_walsink.core.commit.gc import collect_garbage
from airflow_provider_walsink.core.commit.writer import CheckpointWriter
from airflow_provider_walsink.core.staging.layout import StagingLayout
from airflow_provider_walsink.core.store.store import Actor, CommitterStore, LeaseHeldError
from airflow_provider_walsink.core.targets.files import BOOKKEEPING_DIR, FilePublisher

STEPS = ("write", "durable", "commit")
POINTS_BY_STEP: dict[str, tuple[str, ...]] = {
    "write": ("write.before_staging", "write.after_staging", "seal.after_manifest", "seal.after"),
    "durable": ("durable.verifying", "durable.before_mark"),
    "commit": (
        "publish.after_k",
        "publish.after_swap",
        "commit.after_publish",
        "commit.after_committed",
        "lease.takeover",
        "lease.after_takeover",
    ),
}
STEP_OF = {p: s for s, points in POINTS_BY_STEP.items() for p in points}
assert set(STEP_OF) == set(faults.CRASH_POINTS), "every crash point must be scheduled by the harness"
#: Crash points that only exist in one mode.
ONLY_IN = {"publish.after_swap": "overwrite"}
#: Crashes that leave a live lease behind, so the next try must take it over.
HOLDS_LEASE = ("publish.after_k", "commit.after_publish", "lease.after_takeover")

LEASE_TTL = timedelta(milliseconds=100)
#: A stopped zombie's lease must outlive the second try's first attempts (which must wait).
ZOMBIE_LEASE_TTL = timedelta(milliseconds=1500)
#: Points where a stopped commit try holds the lease with work done (files moved, or all published).
ZOMBIE_POINTS = ("publish.after_k", "publish.after_swap", "commit.after_publish")
ZOMBIE_SHARE = 0.2
RETENTION_SHARE = 0.25
EXIT_LEASE_HELD = 75
MAX_TRIES = 12


# ----------------------------------------------------------------------------- schedules


@dataclass
class CheckpointSpec:
    key: str
    files: dict[str, bytes]
    declared: list[str] = field(default_factory=list)
    start: int = 0
    end: int = 0

    @property
    def partitions(self) -> list[str]:
        seen = dict.fromkeys(rel.rsplit("/", 1)[0] for rel in self.files)
        for p in self.declared:
            seen.setdefault(p, None)
        return list(seen)

    def rows(self, partition: str | None = None) -> list[str]:
        out = []
        for rel, data in self.files.items():
            if partition is None or rel.rsplit("/", 1)[0] == partition:
                out.extend(data.decode().splitlines())
        return out


@dataclass
class Schedule:
    index: int
    pipeline: str
    mode: str
    checkpoints: list[CheckpointSpec]
    #: (checkpoint index, step) -> crash point and nth for successive crashed tries.
    crashes: dict[tuple[int, str], list[tuple[str, int]]]
    stale: dict[str, bytes] = field(default_factory=dict)
    #: The write task is a real spark-submit of ``spark_job.py`` (CheckpointJob).
    spark: bool = False
    #: (checkpoint index, crash point, nth): that checkpoint's first commit try is
    #: stopped there and resumed after a second try committed (see the module docstring).
    zombie: tuple[int, str, int] | None = None
    #: Index of a committed checkpoint re-run after its rows are trimmed (overwrite).
    retention: int | None = None

    def describe(self) -> str:
        plan = ", ".join(
            f"{self.checkpoints[ci].key}.{step}: " + " then ".join(f"{p}:{n}" for p, n in crashes)
            for (ci, step), crashes in sorted(self.crashes.items())
        )
        kind = ", Spark" if self.spark else ""
        if self.zombie:
            kind += (
                f", zombie {self.checkpoints[self.zombie[0]].key}.commit at {self.zombie[1]}:{self.zombie[2]}"
            )
        if self.retention is not None:
            kind += f", retention re-run of {self.checkpoints[self.retention].key}"
        return (
            f"#{self.index} {self.pipeline} ({self.mode}{kind}, {len(self.checkpoints)} checkpoints) {plan}"
        )


def _chunks(rows: list[str], n: int, rng: random.Random) -> list[list[str]]:
    cuts = sorted(rng.randint(0, len(rows)) for _ in range(n - 1))
    bounds = [0, *cuts, len(rows)]
    return [rows[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def _encode(rows: list[str]) -> bytes:
    return "".join(r + "\n" for r in rows).encode()


def make_schedule(seed: int, index: int, combos: list[tuple[str, str]]) -> Schedule:
    """Schedule ``index`` of campaign ``seed``; the first ``len(combos)`` cover every (point, mode)."""
    rng = random.Random(f"{seed}:{index}")
    if index < len(combos):
        point, mode = combos[index]
    else:
        mode = rng.choice(("append", "overwrite"))
        point = rng.choice([p for p in STEP_OF if ONLY_IN.get(p, mode) == mode])
    pipeline = f"h{seed}-{index}-{mode[:3]}"
    checkpoints: list[CheckpointSpec] = []
    stale: dict[str, bytes] = {}
    offset = 0
    for ci in range(rng.randint(2, 4)):
        key = f"k{ci:02d}"
        files: dict[str, bytes] = {}
        if mode == "append":
            size = rng.randint(1, 9)
            rows = [f"{pipeline},row{offset + j}" for j in range(size)]
            for fi, chunk in enumerate(_chunks(rows, rng.randint(1, 3), rng)):
                files[f"b={rng.randint(0, 1)}/part-{fi:05d}.csv"] = _encode(chunk)
            checkpoints.append(CheckpointSpec(key, files, start=offset, end=offset + size))
            offset += size
        else:
            regions = rng.sample(["a", "b", "c"], rng.randint(1, 2))
            fi = 0
            for r in regions:
                rows = [f"{pipeline},{key},{r},{j}" for j in range(rng.randint(1, 6))]
                for chunk in _chunks(rows, rng.randint(1, 2), rng):
                    files[f"dt={key}/r={r}/part-{fi:05d}.csv"] = _encode(chunk)
                    fi += 1
            declared = [f"dt={key}/r=z"] if rng.random() < 0.3 else []
            spec = CheckpointSpec(key, files, declared)
            checkpoints.append(spec)
            for p in spec.partitions:
                stale[f"{p}/old-00000.csv"] = _encode([f"STALE,{pipeline},{p}"])
    if mode == "overwrite":
        stale["dt=untouched/r=a/old-00000.csv"] = _encode([f"KEEP,{pipeline}"])

    crashes: dict[tuple[int, str], list[tuple[str, int]]] = {}

    def nth_for(p: str, spec: CheckpointSpec) -> int:
        if p in ("publish.after_k", "durable.verifying"):
            return rng.randint(1, len(spec.files))
        if p == "publish.after_swap":
            return rng.randint(1, len(spec.partitions))
        return 1

    ci = rng.randrange(len(checkpoints))
    step = STEP_OF[point]
    if point in ("lease.takeover", "lease.after_takeover"):
        # Taking over needs a dead owner first: crash while holding the lease.
        first = rng.choice(HOLDS_LEASE[:2])
        plan = [(first, nth_for(first, checkpoints[ci])), (point, 1)]
    else:
        plan = [(point, nth_for(point, checkpoints[ci]))]
    if rng.random() < 0.3:  # a crash of the retry too, at any point of the same task
        extra = rng.choice([p for p in POINTS_BY_STEP[step] if ONLY_IN.get(p, mode) == mode])
        plan.append((extra, nth_for(extra, checkpoints[ci])))
    crashes[(ci, step)] = plan
    if rng.random() < 0.3:  # and sometimes a crash in another task of another checkpoint
        cj = rng.randrange(len(checkpoints))
        other = rng.choice(
            [p for p in STEP_OF if ONLY_IN.get(p, mode) == mode and p not in ("lease.takeover",)]
        )
        crashes.setdefault((cj, STEP_OF[other]), []).append((other, nth_for(other, checkpoints[cj])))
    zombie = None
    free = [i for i in range(len(checkpoints)) if (i, "commit") not in crashes]
    if free and rng.random() < ZOMBIE_SHARE:
        cz = rng.choice(free)
        point = rng.choice([p for p in ZOMBIE_POINTS if ONLY_IN.get(p, mode) == mode])
        zombie = (cz, point, nth_for(point, checkpoints[cz]))
    retention = (
        rng.randrange(len(checkpoints)) if mode == "overwrite" and rng.random() < RETENTION_SHARE else None
    )
    return Schedule(index, pipeline, mode, checkpoints, crashes, stale, zombie=zombie, retention=retention)


SPARK_WRITE_POINTS = ("write.after_staging", "seal.after_manifest")


def make_spark_schedule(seed: int, index: int, checkpoints: int = 2) -> Schedule:
    """The Spark driver of the first write is killed inside ``CheckpointJob.seal``, and the last
    checkpoint's commit is killed mid-publish."""
    sched = make_schedule(seed, index, [])
    sched.checkpoints = sched.checkpoints[:checkpoints]
    kept = {p for spec in sched.checkpoints for p in spec.partitions} | {"dt=untouched/r=a"}
    sched.stale = {r: d for r, d in sched.stale.items() if r.rsplit("/", 1)[0] in kept}
    sched.crashes = {
        (0, "write"): [(SPARK_WRITE_POINTS[index % 2], 1)],
        (len(sched.checkpoints) - 1, "commit"): [("publish.after_k", 1)],
    }
    sched.spark = True
    return sched


def all_combos() -> list[tuple[str, str]]:
    return [(p, m) for p in faults.CRASH_POINTS for m in ("append", "overwrite") if ONLY_IN.get(p, m) == m]


# ----------------------------------------------------------------------------- one task try


@dataclass
class Env:
    db_url: str
    staging: Path
    targets: Path
    scratch: Path
    #: A ``spark_connect`` connection id: the Spark writes run through Spark Connect (the job file
    #: as a Connect client in the write task's process, as ``SparkConnectRunner`` runs it), not
    #: spark-submit.
    spark_connect: str | None = None

    def target(self, sched: Schedule) -> Path:
        return self.targets / sched.pipeline

    def layout(self) -> StagingLayout:
        return StagingLayout(self.staging)


def _actor(step: str, key: str, try_number: int) -> Actor:
    return Actor(
        name=f"harness.{step}@{key}#try{try_number}",
        dag_id="harness",
        run_id=key,
        task_id=step,
        try_number=try_number,
    )


def lease_ttl(sched: Schedule) -> timedelta:
    return ZOMBIE_LEASE_TTL if sched.zombie else LEASE_TTL


def task_write(
    store: CommitterStore, env: Env, sched: Schedule, spec: CheckpointSpec, try_number: int
) -> None:
    actor = _actor("write", spec.key, try_number)
    store.register(sched.pipeline, spec.key, mode=sched.mode, actor=actor)
    start = end = None
    if sched.mode == "append":
        # An incremental job reads from where the last committed checkpoint ended.
        committed = store.last_committed_offsets(sched.pipeline) or {"src": 0}
        assert committed == {"src": spec.start}, f"source offsets {committed} != {spec.start}"
        start, end = committed, {"src": spec.end}
    writer = CheckpointWriter(store, env.layout(), sched.pipeline, spec.key, actor=actor)
    attempt_dir = writer.begin(start_offsets=start)
    for rel, data in spec.files.items():
        path = attempt_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    writer.add_files(
        list(spec.files), rows={r: d.count(b"\n") for r, d in spec.files.items()}, writer=f"w{try_number}"
    )
    for p in spec.declared:
        writer.declare_partition(p)
    writer.seal(file_format="csv", start_offsets=start, end_offsets=end, job="harness")


def task_durable(
    store: CommitterStore, env: Env, sched: Schedule, spec: CheckpointSpec, try_number: int
) -> None:
    """The durability sensor's check (:func:`evaluate_durability`, shared with the trigger)."""
    from airflow_provider_walsink.triggers.durable import evaluate_durability

    status = evaluate_durability(
        store,
        env.layout(),
        sched.pipeline,
        spec.key,
        actor=_actor("durable", spec.key, try_number),
        verify_checksums=True,
    )
    if not status.durable:
        raise AssertionError(f"{spec.key} is not durable after its write succeeded: {status.message}")


def task_commit(
    store: CommitterStore, env: Env, sched: Schedule, spec: CheckpointSpec, try_number: int
) -> None:
    layout = env.layout()
    publisher = FilePublisher(env.target(sched), sched.mode, layout=layout, verify_checksums=True)
    actor = _actor("commit", spec.key, try_number)
    ttl = lease_ttl(sched)
    committer = CheckpointCommitter(
        store, layout, publisher, mode=sched.mode, owner=actor.name, lease_ttl=ttl, verify_checksums=True
    )
    committer.commit(sched.pipeline, spec.key, actor=actor)


def task_write_spark(
    store: CommitterStore,
    env: Env,
    sched: Schedule,
    spec: CheckpointSpec,
    try_number: int,
    crash: tuple[str, int] | None,
    crash_log: str,
) -> tuple[int, str]:
    """The write task as WalWriteOperator runs it: start the attempt, spark-submit, record the seal."""
    from airflow_provider_walsink.core.commit.write_phase import record_seal
    from airflow_provider_walsink.core.spark.args import ProtocolArgs
    from airflow_provider_walsink.core.staging.resolve import as_store

    actor = _actor("write", spec.key, try_number)
    layout = env.layout()
    store.register(sched.pipeline, spec.key, mode=sched.mode, actor=actor)
    start = end = None
    if sched.mode == "append":
        start, end = store.last_committed_offsets(sched.pipeline) or {"src": 0}, {"src": spec.end}
    record = store.start_attempt(sched.pipeline, spec.key, actor=actor, start_offsets=start)
    attempt_dir = layout.attempt_dir(sched.pipeline, spec.key, record.attempt)
    if attempt_dir.exists():
        layout.remove_attempt(sched.pipeline, spec.key, record.attempt)
    attempt_dir.mkdir(parents=True)
    partition_by = ["b"] if sched.mode == "append" else ["dt", "r"]
    rows = []
    for rel, data in spec.files.items():
        values = [part.split("=", 1)[1] for part in rel.split("/")[:-1]]
        rows += [[line, *values] for line in data.decode().splitlines()]
    job_input = env.scratch / f"{uuid.uuid4().hex}.json"
    job_input.write_text(
        json.dumps(
            {"rows": rows, "partition_by": partition_by, "declared": spec.declared, "end_offsets": end}
        )
    )
    protocol = ProtocolArgs(
        pipeline=sched.pipeline,
        checkpoint_key=spec.key,
        sequence=record.sequence,
        attempt=record.attempt,
        attempt_id=record.attempt_id or "",
        staging_root=str(layout.root),
        mode=sched.mode,
        file_format="text",
        partition_by=tuple(partition_by),
        start_offsets=start,
    )
    child_env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    child_env.pop(faults.ENV, None)
    if crash is not None:
        child_env[faults.ENV] = f"{crash[0]}:{crash[1]}"
    child_env[faults.LOG_ENV] = crash_log
    proc = run_spark_job([*protocol.to_argv(), str(job_input)], env.spark_connect, child_env)
    if proc.returncode != 0:
        return proc.returncode, proc.stderr[-2000:]
    # The operator's own seal recording (manifest identity and offsets checked, then store.seal).
    record_seal(store, as_store(layout), protocol, actor, log=logging.getLogger("harness"))
    return 0, ""


def run_spark_job(
    arguments: list[str], spark_connect: str | None, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """Run the harness's job file (``spark_job.py``) with ``arguments`` as the write task does:
    spark-submit on ``local[1]``, or with ``spark_connect`` (a ``spark_connect`` connection id,
    from ``AIRFLOW_CONN_<ID>``) as a Connect client in a process of its own, the job's driver
    program (``tests/harness/connect_write.py``). The model checker's Spark writes run it too."""
    from airflow_provider_walsink.hooks.spark_submit_runner import default_spark_binary

    job = [str(Path(__file__).with_name("spark_job.py")), *arguments]
    if spark_connect:
        cmd = [sys.executable, "-m", "tests.harness.connect_write", spark_connect, *job]
    else:
        cmd = [
            default_spark_binary(), "--master", "local[1]",
            "--conf", "spark.ui.enabled=false",
            "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1",
            *job,
        ]  # fmt: skip
    cwd = Path(__file__).resolve().parents[2] if spark_connect else None  # for ``-m tests.harness...``
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, cwd=cwd)


TASKS: dict[str, Callable[..., None]] = {"write": task_write, "durable": task_durable, "commit": task_commit}


#: The driver's store, inherited by forked task tries.
_PARENT_STORE: list[CommitterStore] = []


def _child(
    env: Env,
    sched: Schedule,
    ci: int,
    step: str,
    try_number: int,
    crash: tuple[str, int] | None,
    out: str,
    stop: bool = False,
    clock_skew: timedelta | None = None,
) -> None:
    """Body of one task try in a forked process. Never returns: SIGKILL or ``os._exit``."""
    code = 1
    try:
        logging.disable(logging.CRITICAL)
        if crash is None:
            os.environ.pop(faults.ENV, None)
        else:
            os.environ[faults.ENV] = f"{crash[0]}:{crash[1]}"
        os.environ[faults.SIGNAL_ENV] = "STOP" if stop else "KILL"
        if clock_skew is not None:
            _skew_client_clock(clock_skew)
        os.environ[faults.LOG_ENV] = out + ".crash"
        faults.reset()
        # SQLAlchemy's fork recipe: a fresh pool (the parent's connections are
        # neither used nor closed here), keeping the compiled-statement cache.
        store = _PARENT_STORE[0]
        store.engine.dispose(close=False)
        try:
            TASKS[step](store, env, sched, sched.checkpoints[ci], try_number)
            code = 0
        except LeaseHeldError as exc:
            Path(out).write_text(str(exc))
            code = EXIT_LEASE_HELD
    except BaseException:  # noqa: BLE001 - reported to the parent
        Path(out).write_text(traceback.format_exc())
        code = 1
    os._exit(code)


def _skew_client_clock(skew: timedelta) -> None:
    """Make this process's wall clock (as Python reads it) run ``skew`` ahead."""
    import datetime as dt

    from airflow_provider_walsink.core.store import records, store

    class Skewed(dt.datetime):
        @classmethod
        def now(cls, tz=None):  # noqa: ANN001 - datetime's own signature
            return dt.datetime.now(tz) + skew

    for module in (records, store):
        if hasattr(module, "datetime"):
            module.datetime = Skewed  # type: ignore[attr-defined]


def _proc_state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return "X"


def run_zombie_commit(
    env: Env, sched: Schedule, ci: int, point: str, nth: int, result: HarnessResult
) -> list[str]:
    """Try 1 of a commit stopped at ``point`` while try 2 (fast client clock) commits; then try 1 resumes."""
    out1 = str(env.scratch / f"{uuid.uuid4().hex}.out")
    gc.freeze()
    zombie = multiprocessing.get_context("fork").Process(
        target=_child, args=(env, sched, ci, "commit", 1, (point, nth), out1, True)
    )
    zombie.start()
    deadline = time.monotonic() + 120
    while _proc_state(zombie.pid) != "T" and zombie.is_alive():
        if time.monotonic() > deadline:
            zombie.kill()
            return ["zombie try never reached its stop"]
        time.sleep(0.01)
    if not zombie.is_alive():  # the point was not reached (nth past the last hit): an ordinary commit
        zombie.join()
        return [] if zombie.exitcode == 0 else [f"commit try 1 failed: {Path(out1).read_text()[-400:]}"]
    result.covered["zombie:" + point] += 1
    spec = sched.checkpoints[ci]
    held = _PARENT_STORE[0].require(
        sched.pipeline, spec.key
    )  # the stopped try's lease, as the database has it
    problems: list[str] = []
    try_number, early_refusals = 2, 0
    while True:
        out2 = str(env.scratch / f"{uuid.uuid4().hex}.out")
        second = multiprocessing.get_context("fork").Process(
            target=_child,
            args=(env, sched, ci, "commit", try_number, None, out2, False, timedelta(hours=2)),
        )
        second.start()
        second.join(300)
        result.task_tries += 1
        if second.exitcode == 0:
            break
        if second.exitcode != EXIT_LEASE_HELD or try_number > MAX_TRIES:
            text = Path(out2).read_text() if os.path.exists(out2) else ""
            problems.append(f"commit try {try_number} failed (exit {second.exitcode}): {text[-600:]}")
            break
        early_refusals += 1
        try_number += 1
        time.sleep(ZOMBIE_LEASE_TTL.total_seconds() / 2)
    # The try with a clock two hours fast may take the lease only once it has expired on the
    # database's clock: the takeover's own history row says when that was.
    takeovers = [
        t
        for t in _PARENT_STORE[0].history(sched.pipeline, spec.key)
        if t.detail and t.detail.startswith("lease taken over")
    ]
    if held.lease_expires_at and any(t.at < held.lease_expires_at for t in takeovers):
        problems.append(
            f"a try with a fast client clock took the stopped try's lease at {takeovers[0].at}, "
            f"before it expired at {held.lease_expires_at}"
        )
    result.covered["zombie-refused-early"] += bool(early_refusals)
    before = read_target(env.target(sched))
    os.kill(zombie.pid, signal.SIGCONT)
    zombie.join(300)
    result.task_tries += 1
    text = Path(out1).read_text() if os.path.exists(out1) else ""
    if read_target(env.target(sched)) != before:
        problems.append("the resumed zombie try changed the target after another try committed")
    if zombie.exitcode != 0 and "LeaseLostError" not in text and "FencedError" not in text:
        problems.append(f"the resumed zombie try failed with something else than fencing: {text[-600:]}")
    if zombie.exitcode == 0 and point != "commit.after_committed":
        problems.append("the resumed zombie try reported success after losing its lease")
    return problems


def run_try(
    env: Env, sched: Schedule, ci: int, step: str, try_number: int, crash: tuple[str, int] | None
) -> tuple[int, str, str | None]:
    """Run one task try: (exit code, error text, crash point that fired).

    A try armed with a crash runs in a forked process that SIGKILLs itself;
    an unarmed try runs in this process (the same code, minus ~50 ms of fork
    and copy-on-write per try, which is what keeps 200 schedules in CI time).
    """
    if sched.spark and step == "write":
        log = str(env.scratch / f"{uuid.uuid4().hex}.crash")
        try:
            code, text = task_write_spark(
                _PARENT_STORE[0], env, sched, sched.checkpoints[ci], try_number, crash, log
            )
        except Exception:  # noqa: BLE001 - a task failure, reported as a violation
            code, text = 1, traceback.format_exc()
        fired = Path(log).read_text().strip() if os.path.exists(log) else None
        if fired:  # the Python driver was SIGKILLed at the crash point; spark-submit then failed
            code = -signal.SIGKILL
        return code, text, fired
    if crash is None:
        try:
            TASKS[step](_PARENT_STORE[0], env, sched, sched.checkpoints[ci], try_number)
            return 0, "", None
        except LeaseHeldError as exc:
            return EXIT_LEASE_HELD, str(exc), None
        except Exception:  # noqa: BLE001 - a task failure, reported as a violation
            return 1, traceback.format_exc(), None
    out = str(env.scratch / f"{uuid.uuid4().hex}.out")
    gc.freeze()  # keep the child from touching (and so copying) every object of the parent
    proc = multiprocessing.get_context("fork").Process(
        target=_child, args=(env, sched, ci, step, try_number, crash, out)
    )
    proc.start()
    proc.join(300)
    if proc.is_alive():
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        return -1, "task try hung for 300 s", None
    text = Path(out).read_text() if os.path.exists(out) else ""
    fired = Path(out + ".crash").read_text().strip() if os.path.exists(out + ".crash") else None
    for f in (out, out + ".crash"):
        if os.path.exists(f):
            os.unlink(f)
    return proc.exitcode or 0, text, fired


# ----------------------------------------------------------------------------- checks


def read_target(root: Path) -> dict[str, list[str]]:
    """Visible rows per partition directory (bookkeeping and hidden files excluded)."""
    out: dict[str, list[str]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(("_", "."))]
        rel = os.path.relpath(dirpath, root)
        for name in filenames:
            if not name.startswith(("_", ".")):
                out.setdefault(rel, []).extend((Path(dirpath) / name).read_text().splitlines())
    return out


def check_target(sched: Schedule, root: Path, committed: int, in_flight: bool) -> list[str]:
    """Problems with the target when checkpoints ``< committed`` are committed.

    ``in_flight``: checkpoint ``committed`` may be partly published (append)
    or have some of its partitions swapped in (overwrite).
    """
    problems = []
    visible = read_target(root)
    if sched.mode == "append":
        counts = Counter(row for rows in visible.values() for row in rows)
        for ci, spec in enumerate(sched.checkpoints):
            for row in spec.rows():
                n = counts.pop(row, 0)
                if n > 1:
                    problems.append(f"{spec.key}: row {row} visible {n} times (duplicate)")
                elif ci < committed and n == 0:
                    problems.append(f"{spec.key}: row {row} lost")
                elif ci > committed and n:
                    problems.append(f"{spec.key}: row {row} visible before its checkpoint was written")
                elif ci == committed and n and not in_flight:
                    problems.append(f"{spec.key}: row {row} visible before its commit")
        problems += [f"row {row} not in the source (x{n})" for row, n in counts.items()]
        return problems
    expected: dict[str, list[list[str]]] = {}
    for ci, spec in enumerate(sched.checkpoints):
        for p in spec.partitions:
            old = sorted(sched.stale[f"{p}/old-00000.csv"].decode().splitlines())
            new = sorted(spec.rows(p))
            expected[p] = [new] if ci < committed else [old, new] if ci == committed and in_flight else [old]
    expected["dt=untouched/r=a"] = [[f"KEEP,{sched.pipeline}"]]
    for p, options in expected.items():
        got = sorted(visible.pop(p, []))
        if got not in options:
            problems.append(f"partition {p}: {got} is none of {options} (mixed, lost or duplicated)")
    problems += [f"unexpected rows in {p}: {rows}" for p, rows in visible.items() if rows]
    return problems


def check_final(store: CommitterStore, env: Env, sched: Schedule) -> list[str]:
    problems = check_target(sched, env.target(sched), len(sched.checkpoints), in_flight=False)
    for spec in sched.checkpoints:
        record = store.require(sched.pipeline, spec.key)
        if not record.is_committed:
            problems.append(f"{spec.key} is {record.state}, not COMMITTED: {record.error}")
            continue
        # Transitions into COMMITTED (events recorded on a committed checkpoint have from = to).
        commits = [
            t
            for t in store.history(sched.pipeline, spec.key)
            if t.to_state == "COMMITTED" and t.from_state != "COMMITTED"
        ]
        if len(commits) != 1:
            problems.append(f"{spec.key}: {len(commits)} COMMITTED transitions in the history")
        if sched.mode == "append" and record.end_offsets != {"src": spec.end}:
            problems.append(f"{spec.key}: end offsets {record.end_offsets}, source says {spec.end}")
    return problems


# ----------------------------------------------------------------------------- driver


@dataclass
class HarnessResult:
    seed: int
    schedules: int = 0
    spark_schedules: int = 0
    #: How the Spark writes ran: ``spark-submit`` or ``Spark Connect``.
    spark_runner: str = "spark-submit"
    checkpoints: int = 0
    task_tries: int = 0
    crashes: int = 0
    covered: Counter = field(default_factory=Counter)
    planned_not_reached: int = 0
    takeovers: int = 0
    violations: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def uncovered(self) -> list[str]:
        return [p for p in faults.CRASH_POINTS if not self.covered[p]]

    def describe(self) -> str:
        lines = [
            f"walsink crash harness, seed {self.seed}",
            f"schedules run:        {self.schedules} ({self.checkpoints} checkpoints, {self.task_tries} task tries"
            + (f"; {self.spark_schedules} with {self.spark_runner} writes" if self.spark_schedules else "")
            + ")",
            f"crashes injected:     {self.crashes} SIGKILLs ({self.planned_not_reached} planned past the last hit)",
            f"lease takeovers:      {self.takeovers}",
            f"crash points covered: {len(faults.CRASH_POINTS) - len(self.uncovered)}/{len(faults.CRASH_POINTS)}",
        ]
        lines += [f"  {p:<24} {self.covered[p]:>5}" for p in faults.CRASH_POINTS]
        zombies = {p: n for p, n in self.covered.items() if p.startswith("zombie:")}
        lines.append(
            f"zombie tries resumed:  {sum(zombies.values())} "
            f"({', '.join(f'{p[7:]} {n}' for p, n in sorted(zombies.items())) or 'none'}; "
            f"{self.covered['zombie-refused-early']} refused a live lease to a fast-clock try first)"
        )
        lines.append(f"retention re-runs:    {self.covered['retention-rerun']}")
        if self.uncovered:
            lines.append(f"NOT covered: {', '.join(self.uncovered)}")
        lines.append(f"violations:           {len(self.violations)}")
        lines += [f"  {v}" for v in self.violations[:50]]
        lines.append(f"seconds:              {self.seconds:.1f}")
        return "\n".join(lines)


def run_schedule(
    store: CommitterStore, env: Env, sched: Schedule, result: HarnessResult, verbose: bool = False
) -> None:
    target = env.target(sched)
    for rel, data in sched.stale.items():
        (target / rel).parent.mkdir(parents=True, exist_ok=True)
        (target / rel).write_bytes(data)
    violations: list[str] = []
    for ci, spec in enumerate(sched.checkpoints):
        for step in STEPS:
            if sched.zombie and sched.zombie[0] == ci and step == "commit":
                violations += [
                    f"zombie {spec.key}.commit at {sched.zombie[1]}: {p}"
                    for p in run_zombie_commit(env, sched, ci, sched.zombie[1], sched.zombie[2], result)
                ]
                if violations:
                    break
                continue
            plan = list(sched.crashes.get((ci, step), []))
            try_number = 1
            while True:
                crash = plan[0] if plan else None
                code, text, fired = run_try(env, sched, ci, step, try_number, crash)
                result.task_tries += 1
                try_number += 1
                if code == 0:
                    if plan:
                        result.planned_not_reached += 1  # nth past the last hit in this try
                        plan.clear()
                    break
                if code == -signal.SIGKILL and fired:
                    point = fired.split(":")[0]
                    result.crashes += 1
                    result.covered[point] += 1
                    plan.pop(0)
                    problems = check_target(sched, target, ci, in_flight=step == "commit")
                    violations += [f"after crash at {fired} in {spec.key}.{step}: {p}" for p in problems]
                    if step == "commit":
                        time.sleep(
                            lease_ttl(sched).total_seconds()
                        )  # Airflow's retry delay; the lease expires
                elif code == EXIT_LEASE_HELD:
                    time.sleep(lease_ttl(sched).total_seconds())
                else:
                    violations.append(
                        f"{spec.key}.{step} try {try_number - 1} failed (exit {code}): {text.strip()[-800:]}"
                    )
                    break
                if try_number > MAX_TRIES:
                    violations.append(f"{spec.key}.{step}: no success after {MAX_TRIES} tries")
                    break
            if violations:
                break
        if violations:
            break
    if not violations:
        violations += check_final(store, env, sched)
        takeovers = sum(
            1
            for spec in sched.checkpoints
            for t in store.history(sched.pipeline, spec.key)
            if t.detail and t.detail.startswith("lease taken over")
        )
        result.takeovers += takeovers
        # A cleared commit task re-runs: a no-op that changes nothing (and finishes any cleanup).
        before = read_target(target)
        for ci, spec in enumerate(sched.checkpoints):
            code, text, _ = run_try(env, sched, ci, "commit", 99, None)
            if code != 0:
                violations.append(f"re-run commit of {spec.key} failed: {text.strip()[-400:]}")
        if read_target(target) != before:
            violations.append("a re-run commit changed the target")
        journal = target / BOOKKEEPING_DIR / "journal" / sched.pipeline
        if journal.exists() and any(journal.iterdir()):
            violations.append(
                f"publish journals left after every commit and re-run: {sorted(os.listdir(journal))}"
            )
        if sched.retention is not None and not violations:
            violations += rerun_after_retention(store, env, sched, sched.retention, result)
            before = read_target(target)
        collect_garbage(store, env.layout(), retention=timedelta(0), pipelines=[sched.pipeline])
        staged = env.staging / sched.pipeline
        if staged.exists() and any(staged.iterdir()):
            violations.append(f"staging left after GC: {sorted(os.listdir(staged))}")
        if read_target(target) != before:
            violations.append("GC changed the target")
    result.schedules += 1
    result.checkpoints += len(sched.checkpoints)
    result.violations += [f"{sched.describe()}: {v}" for v in violations]
    if verbose:
        print(f"{sched.describe()}: {'OK' if not violations else violations}", flush=True)


def rerun_after_retention(
    store: CommitterStore, env: Env, sched: Schedule, ci: int, result: HarnessResult
) -> list[str]:
    """Trim one committed checkpoint's rows (as retention does), re-run its interval with new rows."""
    from sqlalchemy import delete

    from airflow_provider_walsink.core.store.models import checkpoint_table, transition_table

    spec = sched.checkpoints[ci]
    record = store.require(sched.pipeline, spec.key)
    with store.engine.begin() as conn:
        conn.execute(delete(transition_table).where(transition_table.c.checkpoint_id == record.id))
        conn.execute(delete(checkpoint_table).where(checkpoint_table.c.id == record.id))
    # Same partitions, same file names and sizes where possible, other rows.
    spec.files = {
        rel: data.replace(b",", b";", 1) if data.count(b",") else data + b"!"
        for rel, data in spec.files.items()
    }
    for step in STEPS:
        code, text, _ = run_try(env, sched, ci, step, 50, None)
        result.task_tries += 1
        if code != 0:
            return [
                f"re-run of {spec.key}.{step} after retention failed (exit {code}): {text.strip()[-600:]}"
            ]
    result.covered["retention-rerun"] += 1
    return [f"after the retention re-run of {spec.key}: {p}" for p in check_final(store, env, sched)]


def run_harness(
    *,
    seed: int,
    schedules: int,
    workdir: str | os.PathLike[str],
    db_url: str | None = None,
    verbose: bool = False,
    spark_schedules: int = 0,
    spark_checkpoints: int = 2,
    workers: int = 1,
    spark_connect: str | None = None,
) -> HarnessResult:
    """Run ``schedules`` seeded crash schedules; see the module docstring.

    ``workers`` > 1 runs the (SQLite) schedules in that many forked driver processes, schedule
    ``i`` in worker ``i % workers``, each with its own committer database, staging and targets:
    schedules share nothing but that database in one process, so the same schedules run, with
    the same checks, in less wall time (a schedule mostly waits: retry delays, lease expiry).
    ``spark_connect``: the Spark schedules' writes run through that ``spark_connect`` connection.
    """
    started = time.monotonic()
    if workers > 1 and db_url is None and not spark_schedules:
        result = _run_in_workers(seed, schedules, workdir, verbose, workers)
    else:
        result = _run_schedules(
            seed,
            range(schedules),
            workdir,
            db_url,
            verbose,
            spark_schedules,
            spark_checkpoints,
            schedules,
            spark_connect,
        )
    result.seconds = time.monotonic() - started
    return result


def _run_schedules(
    seed: int,
    indices: Iterable[int],
    workdir: str | os.PathLike[str],
    db_url: str | None,
    verbose: bool,
    spark_schedules: int = 0,
    spark_checkpoints: int = 2,
    schedules: int = 0,
    spark_connect: str | None = None,
) -> HarnessResult:
    work = Path(workdir) / f"run-{uuid.uuid4().hex[:8]}"
    env = Env(
        db_url=db_url or f"sqlite:///{work}/committer.db",
        staging=work / "staging",
        targets=work / "targets",
        scratch=work / "scratch",
        spark_connect=spark_connect,
    )
    for d in (env.staging, env.targets, env.scratch):
        d.mkdir(parents=True)
    store = CommitterStore.from_url(env.db_url)
    _PARENT_STORE[:] = [store]
    result = HarnessResult(seed=seed)
    combos = all_combos()
    try:
        for i in indices:
            run_schedule(store, env, make_schedule(seed, i, combos), result, verbose)
        for i in range(spark_schedules):
            run_schedule(
                store, env, make_spark_schedule(seed, schedules + i, spark_checkpoints), result, verbose
            )
        result.spark_schedules = spark_schedules
        result.spark_runner = "Spark Connect" if spark_connect else "spark-submit"
    finally:
        store.dispose()
        shutil.rmtree(work, ignore_errors=True)
    return result


def _worker(seed: int, indices: list[int], workdir: str, verbose: bool, out: Any) -> None:
    try:
        out.send(_run_schedules(seed, indices, workdir, None, verbose))
    except BaseException as exc:  # noqa: BLE001 - the driver reports it as a violation
        out.send(f"harness worker failed: {type(exc).__name__}: {exc}")
    finally:
        out.close()


def _run_in_workers(
    seed: int, schedules: int, workdir: str | os.PathLike[str], verbose: bool, workers: int
) -> HarnessResult:
    ctx = multiprocessing.get_context("fork")
    running = []
    for w in range(workers):
        receive, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(
            target=_worker, args=(seed, list(range(w, schedules, workers)), str(workdir), verbose, send)
        )
        proc.start()
        send.close()
        running.append((proc, receive))
    total = HarnessResult(seed=seed)
    for proc, receive in running:
        try:
            part = receive.recv()
        except EOFError:
            part = f"harness worker {proc.pid} died without a result"
        proc.join()
        if isinstance(part, str):
            total.violations.append(part)
            continue
        for name in ("schedules", "checkpoints", "task_tries", "crashes", "planned_not_reached", "takeovers"):
            setattr(total, name, getattr(total, name) + getattr(part, name))
        total.covered.update(part.covered)
        total.violations += part.violations
    return total
