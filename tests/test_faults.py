"""Crash points and the bounded crash campaign (issue 5: exactly-once under SIGKILL).

The campaign runs real write → durable → commit pipelines whose task processes
SIGKILL themselves at every named protocol point, retries them as Airflow
would and checks the target against the source. It prints its figures; the
long run is ``python -m tests.harness --seed S --schedules 1000``.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from airflow_provider_walsink.core import faults
from tests.harness import run_harness
from tests.harness.runner import POINTS_BY_STEP, SPARK_WRITE_POINTS, all_combos, make_schedule
from tests.helpers import REPO


def _in_child(env: dict[str, str], calls: list[str], log: str) -> int:
    def body() -> None:
        os.environ.update(env)
        os.environ[faults.LOG_ENV] = log
        faults.reset()
        for name in calls:
            faults.crashpoint(name)
        os._exit(0)

    proc = multiprocessing.get_context("fork").Process(target=body)
    proc.start()
    proc.join(60)
    return proc.exitcode


def test_crashpoint_is_a_no_op_unless_armed(tmp_path, monkeypatch):
    monkeypatch.delenv(faults.ENV, raising=False)
    faults.crashpoint("publish.after_k")  # still alive
    assert (
        _in_child({faults.ENV: "seal.after"}, ["publish.after_k", "seal.after_manifest"], str(tmp_path / "l"))
        == 0
    )
    assert not (tmp_path / "l").exists()


def test_crashpoint_sigkills_at_the_nth_hit_and_logs_it(tmp_path):
    log = str(tmp_path / "crash.log")
    code = _in_child({faults.ENV: "publish.after_k:3"}, ["publish.after_k"] * 2, log)
    assert code == 0
    code = _in_child({faults.ENV: "publish.after_k:3"}, ["publish.after_k"] * 5, log)
    assert code == -signal.SIGKILL
    assert open(log).read() == "publish.after_k:3\n"


def test_every_crash_point_is_placed_in_the_code_and_scheduled():
    """A point listed in faults.CRASH_POINTS but called nowhere would never be covered."""
    sources = (
        "".join(
            p.read_text() for p in (REPO / "airflow_provider_walsink").rglob("*.py") if p.name != "faults.py"
        )
        + (REPO / "tests" / "harness" / "runner.py").read_text()
    )
    for name in faults.CRASH_POINTS:
        # Publishers mark their points through the publisher context (ctx.event), the core directly.
        placed = f'crashpoint("{name}")' in sources or f'ctx.event("{name}")' in sources
        assert placed, f"crash point {name} is not placed"
    assert sorted(p for ps in POINTS_BY_STEP.values() for p in ps) == sorted(faults.CRASH_POINTS)
    combos = all_combos()
    firsts = [make_schedule(0, i, combos) for i in range(len(combos))]
    planned = {p for s in firsts for plan in s.crashes.values() for p, _ in plan}
    assert planned == set(faults.CRASH_POINTS)


def test_harness_detects_a_duplicate(tmp_path, monkeypatch):
    """The checker can fail: a publisher that publishes every file twice is caught."""
    from airflow_provider_walsink.core.targets import files

    real = files.fsops._move

    def move_and_copy(src, dest):
        data = open(src, "rb").read()
        real(src, dest)
        with open(str(dest) + ".dup.csv", "wb") as f:
            f.write(data)

    monkeypatch.setattr(files.fsops, "_move", move_and_copy)
    result = run_harness(seed=5, schedules=2, workdir=tmp_path)
    assert result.violations and any("duplicate" in v or "none of" in v for v in result.violations)


@pytest.mark.slow
def test_bounded_crash_campaign_sqlite(tmp_path):
    """80 schedules, every crash point covered (each hit 6 to 27 times), no violation (figures printed).

    The schedules run in four driver processes, each with its own SQLite committer database
    (they share nothing else), in a memory file system where there is one: the faults are
    SIGKILLs, which the page cache survives, so fsync is no part of the claim. A schedule mostly
    waits (retry delays, lease expiry), so four drivers on two cores finish in about half the wall
    time of two, with the same schedules and checks. 80, not the 200 CI ran before: the 80 cover
    all twelve crash points with 141 SIGKILLs, and CI's minutes are spent elsewhere; the long
    runs (README) are where the count matters.
    """
    shm = Path("/dev/shm")
    workdir = Path(tempfile.mkdtemp(prefix="walsink-harness-", dir=shm)) if shm.is_dir() else tmp_path
    try:
        result = run_harness(seed=20261122, schedules=80, workdir=workdir, workers=4)
    finally:
        if workdir != tmp_path:
            shutil.rmtree(workdir, ignore_errors=True)
    print("\n" + result.describe())
    assert result.schedules == 80
    assert result.uncovered == []
    assert result.violations == []


@pytest.mark.slow
def test_crash_campaign_postgresql_from_a_shell(tmp_path, pg_url):
    """One schedule per (crash point, mode) on PostgreSQL: killed backends' transactions roll
    back. Run as a user runs it, ``python -m tests.harness`` (its figures and exit status)."""
    out = subprocess.run(
        [sys.executable, "-m", "tests.harness", "--seed", "7", "--schedules", str(len(all_combos())),
         "--db-url", pg_url, "--workdir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    print("\n" + out.stdout)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"schedules run:        {len(all_combos())} " in out.stdout, out.stdout
    assert "NOT covered" not in out.stdout
    assert "violations:           0" in out.stdout


@pytest.mark.spark
@pytest.mark.slow
def test_crash_campaign_with_a_real_spark_write(tmp_path):
    """The write task is WalWriteOperator's path: start the attempt, spark-submit a CheckpointJob
    (its Python driver SIGKILLed inside seal), retry with a new attempt, record the seal."""
    result = run_harness(seed=11, schedules=0, workdir=tmp_path, spark_schedules=1, spark_checkpoints=1)
    print("\n" + result.describe())
    assert "1 with spark-submit writes" in result.describe()
    assert result.spark_schedules == 1 and result.covered["write.after_staging"] == 1  # in the driver
    assert result.covered["publish.after_k"] == 1
    assert result.violations == []


@pytest.mark.spark
@pytest.mark.slow
def test_crash_campaign_with_a_spark_connect_write(tmp_path, spark_connect_server, monkeypatch):
    """The same schedule with the write job run through Spark Connect: the job file runs as a
    Connect client in the write task's process, which the crash point SIGKILLs inside seal (a
    worker dying mid-job; the server goes on), then a retry's new attempt seals and commits."""
    for key, value in spark_connect_server.connection_env("harness_connect").items():
        monkeypatch.setenv(key, value)
    result = run_harness(seed=12, schedules=0, workdir=tmp_path, spark_schedules=1, spark_checkpoints=1,
                         spark_connect="harness_connect")  # fmt: skip
    print("\n" + result.describe())
    assert "1 with Spark Connect writes" in result.describe()
    assert result.spark_schedules == 1 and sum(result.covered[p] for p in SPARK_WRITE_POINTS) == 1
    assert result.covered["publish.after_k"] == 1
    assert result.violations == []
