"""Named crash points of the checkpoint protocol, for fault-injection tests.

``crashpoint(name)`` is a no-op unless the environment variable
``WALSINK_CRASH_AT`` names it (``name`` or ``name:nth``, the nth time this
process reaches it, default 1st). Then the process kills itself with SIGKILL:
no ``finally``, no ``atexit``, no flushed buffers, no database rollback sent,
exactly what the OOM killer or a lost node does to a task. If
``WALSINK_CRASH_LOG`` names a file, the point's name is appended to it first
(fsync'd), so a harness can tell an injected crash from any other death.

The check is one dictionary lookup of an environment variable, so the calls
can stay in production code. Every point is listed in :data:`CRASH_POINTS`.
"""

from __future__ import annotations

import os
import signal
import threading

ENV = "WALSINK_CRASH_AT"
LOG_ENV = "WALSINK_CRASH_LOG"
#: ``STOP`` makes the point SIGSTOP the process instead (a paused VM, a stalled
#: mount, a lost heartbeat): it goes on where it stopped once SIGCONTed, as a
#: zombie task try does.
SIGNAL_ENV = "WALSINK_CRASH_SIGNAL"

#: Every crash point of the write/durable/commit protocol, with where it sits (the crash
#: harness schedules each). Points of the table targets (``table.before_<step>`` /
#: ``table.after_<step>``) and of the fenced clean-up (``cleanup.started``: the table's
#: state read, nothing deleted; ``cleanup.before_delete``: before each attempt's fence
#: check and delete, ``core/staging/cleanup.py``) and of the executors' writer (``executor.after_file``:
#: a task's first attempt, after one of its files is complete, ``core/spark/executor_write.py``) and
#: of the Kafka source (``kafka.read.after_batch``: an executor handed Spark a batch of its range,
#: ``core/sources/kafka/reading.py``; ``commit.before_group_offsets``: COMMITTED recorded and the target
#: committed, the consumer group's offsets not yet committed, ``operators/commit.py``) are
#: reached by their own tests.
CRASH_POINTS: dict[str, str] = {
    "write.before_staging": "new attempt recorded (WRITING), its staging directory not yet created",
    "write.after_staging": "committables staged and described, manifest not yet written",
    "seal.after_manifest": "manifest written to staging, seal not yet recorded",
    "seal.after": "seal recorded (SEALED), durability not yet checked",
    "durable.verifying": "durability check in progress (nth = committable being checked)",
    "durable.before_mark": "attempt verified on storage, DURABLE not yet recorded",
    "lease.takeover": "inside the transaction taking over an expired lease",
    "lease.after_takeover": "expired lease taken over (COMMITTING, new owner), nothing published yet",
    "publish.after_k": "k of n committables moved into the target (nth = k)",
    "publish.after_swap": "overwrite: k of n partitions swapped in (nth = k)",
    "commit.after_publish": "everything published, COMMITTED not yet recorded",
    "commit.after_committed": "COMMITTED recorded, staging and publish journal not yet cleaned",
}

_counts: dict[str, int] = {}
_lock = threading.Lock()


def _target() -> tuple[str, int] | None:
    spec = os.environ.get(ENV)
    if not spec:
        return None
    name, _, nth = spec.partition(":")
    return name, int(nth) if nth else 1


def crashpoint(name: str) -> None:
    """SIGKILL this process if ``WALSINK_CRASH_AT`` names ``name`` (and this is the nth hit)."""
    target = _target()
    if target is None or target[0] != name:
        return
    with _lock:
        _counts[name] = _counts.get(name, 0) + 1
        hit = _counts[name] == target[1]
    if not hit:
        return
    log = os.environ.get(LOG_ENV)
    if log:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, f"{name}:{target[1]}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)
    stop = os.environ.get(SIGNAL_ENV, "KILL").upper() == "STOP"
    os.kill(os.getpid(), signal.SIGSTOP if stop else signal.SIGKILL)


def reset() -> None:
    """Forget how often each point was reached (for a forked child reusing this module)."""
    with _lock:
        _counts.clear()
