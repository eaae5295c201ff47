"""Airflow components die with the process that started them.

A CI timeout kills a test session (or the demo) from outside: SIGTERM, which Python
does not handle, then SIGKILL; neither runs ``stop()``. The components must not
outlive it holding ports and CPU. Here a parent process starts a small real stack
(api-server and scheduler with its LocalExecutor workers, on SQLite), reports every
process of it, and is SIGKILLed; every one of those processes must be gone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from tests.helpers import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PARENT = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from airflow_stack import AirflowStack

    stack = AirflowStack(Path(sys.argv[1]), components=("api-server", "scheduler"), dags_folder=Path(sys.argv[2]))
    stack.start(timeout=900)
    # The scheduler forks its LocalExecutor workers as it starts: report once they exist.
    stack.wait_until("LocalExecutor workers", lambda: len(stack.pids()["scheduler"]) >= 3, timeout=900)
    print(json.dumps(stack.pids()), flush=True)
    time.sleep(3600)  # killed by the test long before
    """
)


def _alive(procs: dict[int, float]) -> list[str]:
    """The processes of ``procs`` (pid -> create time) still running (not zombies, not a reused pid)."""
    out = []
    for pid, created in procs.items():
        try:
            proc = psutil.Process(pid)
            if proc.create_time() == created and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(f"{pid} {' '.join(proc.cmdline())[:100]}")
        except psutil.NoSuchProcess:
            pass
    return out


def test_components_die_when_their_parent_is_killed(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "tests"), str(REPO), env.get("PYTHONPATH")]))
    (tmp_path / "dags").mkdir()
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(tmp_path / "home"), str(tmp_path / "dags")],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        start_new_session=True,  # so the test can also clean up should the guards fail
    )
    try:
        line = parent.stdout.readline()  # blocks until the stack is up (or the parent died)
        assert line, f"the parent exited with {parent.wait()} before its stack was up"
        pids = json.loads(line)
        assert set(pids) == {"api-server", "scheduler"}
        procs = {}
        for pid in (p for tree in pids.values() for p in tree):
            procs[pid] = psutil.Process(pid).create_time()
        assert len(_alive(procs)) == len(procs) >= 6  # 2 guards, 2 components, workers

        parent.kill()  # SIGKILL: no stop(), no atexit, no finally
        parent.wait()
        # Bounded wait for the guards to act (SIGTERM, then SIGKILL after their grace);
        # the limit only keeps a broken guard from hanging the run.
        deadline = time.monotonic() + 120
        while _alive(procs) and time.monotonic() < deadline:
            time.sleep(1)
        assert _alive(procs) == []
    finally:
        parent.kill()
        for pid in (p for tree in locals().get("pids", {}).values() for p in tree):
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
