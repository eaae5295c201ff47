"""A test session ended by SIGTERM leaves nothing running (issue 46).

A CI time-out, ``timeout`` or ``kill`` ends a pytest session with SIGTERM, which Python does not
handle: the session used to die without tearing down its fixtures, and the standalone Spark
master and workers (their own sessions, no guard) lived on for as long as the machine did. Here a
real pytest session (``tests/sigterm_session.py``, through the suite's conftest) starts the Spark
cluster (the cheapest of the session's servers that used to survive), reports every process it
started, and is SIGTERMed; it must tear down as on Ctrl-C, and none of those processes may be
left. (The Airflow stack's components die with a SIGKILLed parent too: test_stack_lifecycle.py.)
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.helpers import REPO, missing_prerequisite

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _alive(procs: list[dict]) -> list[str]:
    """The processes of ``procs`` still running (not zombies, not a reused pid)."""
    out = []
    for p in procs:
        try:
            proc = psutil.Process(p["pid"])
            if proc.create_time() == p["created"] and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(f"{p['pid']} {p['cmdline'][-160:]}")
        except psutil.NoSuchProcess:
            pass
    return out


def test_a_session_ended_by_sigterm_stops_every_process_it_started(tmp_path):
    java_home = os.environ.get("JAVA_HOME")
    if not (
        shutil.which("java") or (java_home and os.access(os.path.join(java_home, "bin", "java"), os.X_OK))
    ):
        missing_prerequisite("Java (17) is not installed: the Spark cluster cannot start")
    pids_file = tmp_path / "pids.json"
    # A session of its own: not this session's Airflow home, databases or xdist worker.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AIRFLOW", "WALSINK_TEST_SESSION", "PYTEST_", "SPARK_"))
    }
    env["WALSINK_SIGTERM_PIDS"] = str(pids_file)
    session = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "tests/sigterm_session.py",
            "-q",
            "-p",
            "no:cacheprovider",
            "-n",
            "0",
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # so the test can clean up should the session fail to
    )
    procs: list[dict] = []
    try:
        # Bounded only so a session that cannot start its servers does not hang the run.
        deadline = time.monotonic() + 300
        while not pids_file.exists() and session.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        if not pids_file.exists():
            session.kill()
            pytest.fail(f"the session did not start its servers:\n{session.communicate()[0][-3000:]}")
        procs = json.loads(pids_file.read_text())
        commands = " ".join(p["cmdline"] for p in procs)
        assert "deploy.master.Master" in commands and "deploy.worker.Worker" in commands
        assert len(_alive(procs)) == len(procs)

        session.send_signal(signal.SIGTERM)
        output = session.communicate(timeout=180)[0]
        assert _alive(procs) == [], output[-3000:]
        # Torn down as on Ctrl-C (the fixtures' teardown ran), not killed by the signal.
        assert session.returncode == pytest.ExitCode.INTERRUPTED, output[-3000:]
        assert "SIGTERM: stopping as on Ctrl-C" in output, output[-3000:]
    finally:
        if session.poll() is None:
            session.kill()
            session.wait()
        for p in procs:  # should the teardown have failed: leave nothing to the next test
            try:
                proc = psutil.Process(p["pid"])
                if proc.create_time() == p["created"]:
                    proc.kill()
            except psutil.Error:
                pass
