"""A test session that holds its servers until it is SIGTERMed (not collected by the suite).

``tests/test_sigterm_session.py`` runs it as a pytest session of its own, through the suite's
conftest and its real session fixture that starts the Spark standalone cluster (master and two
workers). Once it serves, it writes every process the session started (guards, JVMs and their
children: pid and start time) to the file ``WALSINK_SIGTERM_PIDS`` names, then waits to be stopped.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import psutil


def test_hold_the_session_servers_until_stopped(spark_cluster):
    assert spark_cluster.master_status()["workers"]
    procs = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:  # a launcher that exited, not yet reaped
                cmdline = " ".join(proc.cmdline())
                procs.append({"pid": proc.pid, "created": proc.create_time(), "cmdline": cmdline})
        except psutil.Error:  # gone meanwhile
            pass
    target = Path(os.environ["WALSINK_SIGTERM_PIDS"])
    target.with_suffix(".tmp").write_text(json.dumps(procs))
    target.with_suffix(".tmp").rename(target)  # whole, or not there
    time.sleep(3600)  # SIGTERMed by the test long before
