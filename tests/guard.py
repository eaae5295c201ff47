"""Run one command so that it, and everything it starts, dies with the process that asked for it.

``python tests/guard.py PARENT_PID -- COMMAND...`` starts
COMMAND as its child and stays beside it:

* it is a *child subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``), so processes that
  leave COMMAND's process group (the Task SDK puts every task runner, and with it a
  task's spark-submit JVM, in a group of its own) or lose their parent are re-parented
  to the guard instead of to init, and remain reachable;
* when ``PARENT_PID`` disappears (a test session or demo killed with SIGKILL, or with a
  SIGTERM it does not handle), the guard notices within a second (it also asks for a
  parent-death signal, ``prctl(PR_SET_PDEATHSIG)``, to wake at once) and ends its whole
  tree: SIGTERM to every descendant, then SIGKILL to whatever is left after the grace;
* on SIGTERM or SIGINT (a normal ``stop()``) it does the same, so an orderly stop also
  reaches the task runners outside COMMAND's process group;
* when COMMAND exits by itself, the guard ends what COMMAND left behind and exits with
  COMMAND's status.

Linux only (prctl); elsewhere the guard still works by polling its parent id, without
the subreaper (orphans then escape to init).

The process that starts guarded commands (a test session, the demo) calls
:func:`interrupt_on_sigterm`, so a SIGTERM runs its clean-up (fixture teardown, ``finally``)
as Ctrl-C does, instead of leaving the guards to notice that it died.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

import psutil

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
POLL_S = 0.5
GRACE_S = 15.0


def _prctl(option: int, value: int) -> bool:
    """Call prctl(2); False where it does not exist (not Linux) or fails."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the main thread is, as Ctrl-C raises KeyboardInterrupt."""


def interrupt_on_sigterm() -> None:
    """Make SIGTERM (a CI time-out, ``timeout``, ``kill``) stop this process as Ctrl-C does: raise
    :class:`Terminated` in the main thread, so pytest tears down its fixtures and a script runs
    its ``finally`` blocks, stopping what they started. Later SIGTERMs while that clean-up runs
    are only reported (``timeout`` signals the process and then its whole group, so two arrive at
    once); SIGKILL still ends the process, and the guards then end what it started. A no-op
    outside the main thread (only the main thread can set a handler)."""
    if threading.current_thread() is not threading.main_thread():
        return

    def again(_signum: int, _frame: object) -> None:
        print("SIGTERM again: still stopping (SIGKILL ends it at once)", file=sys.stderr, flush=True)

    def first(_signum: int, _frame: object) -> None:
        signal.signal(signal.SIGTERM, again)
        raise Terminated("SIGTERM: stopping as on Ctrl-C, so that everything started is stopped")

    signal.signal(signal.SIGTERM, first)


def _reap() -> dict[int, int]:
    """Collect every exited child without blocking; ``{pid: exit status}``."""
    done = {}
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return done
        if pid == 0:
            return done
        done[pid] = os.waitstatus_to_exitcode(status)


def terminate_tree(grace: float = GRACE_S) -> None:
    """SIGTERM every descendant of this process, SIGKILL the survivors after ``grace``
    seconds, and repeat for processes re-parented to us meanwhile, until none is left."""
    me = psutil.Process()
    termed: set[int] = set()  # one SIGTERM each: a second one makes Airflow skip its clean exit
    deadline = time.monotonic() + grace
    while True:
        _reap()
        try:
            procs = me.children(recursive=True)
        except psutil.Error:
            procs = []
        if not procs:
            return
        kill = time.monotonic() >= deadline
        for proc in procs:
            if kill or proc.pid not in termed:
                termed.add(proc.pid)
                try:
                    proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
                except psutil.Error:
                    pass
        psutil.wait_procs(procs, timeout=0.5)
        _reap()


def run(parent: int, command: Sequence[str]) -> int:
    """Start ``command`` and guard it (see the module docstring); returns its exit status."""
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    stop = {"reason": None}

    def on_signal(signum: int, _frame: object) -> None:
        stop["reason"] = signal.Signals(signum).name

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    # Woken by the parent-death signal; the loop below decides from getppid().
    signal.signal(signal.SIGUSR1, lambda *_: None)
    _prctl(PR_SET_PDEATHSIG, signal.SIGUSR1)
    if os.getppid() != parent:  # the parent died before the death signal was armed
        return 1

    child = subprocess.Popen(list(command))  # same process group as the guard
    status: int | None = None
    while True:
        exited = _reap()
        if child.pid in exited:
            status = exited[child.pid]
            child.returncode = status  # reaped here, so Popen must not wait for it
        if status is not None:
            terminate_tree()  # whatever the command left behind
            return status
        if stop["reason"] or os.getppid() != parent:
            terminate_tree()
            return status if status is not None else 128 + signal.SIGTERM
        time.sleep(POLL_S)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3 or args[1] != "--" or not args[0].isdigit():
        print(
            "usage: python tests/guard.py PARENT_PID -- COMMAND...",
            file=sys.stderr,
        )
        return 2
    return run(int(args[0]), args[2:])


if __name__ == "__main__":
    sys.exit(main())
