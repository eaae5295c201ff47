"""What the walsink triggers of one triggerer do together on its event loop (issue 46).

Imported on the loop with :mod:`.durable`: the standard library only.

* :func:`off_loop`: every blocking step of a check runs in one pool of :data:`CHECK_THREADS`
  threads per triggerer process, never on the loop and never in the default executor that
  Airflow's ``sync_to_async`` and other triggers use. The watches' reads run in a thread of their
  own (:func:`watch_off_loop`): queued behind a burst of checks, they would delay the very wake-ups
  that start the next checks (bench/README.md, benchmark 10).
* :class:`CommitterWatch`: one per walsink connection and loop. Every :data:`WATCH_INTERVAL`
  seconds it reads the rows of every checkpoint a trigger waits on, in one query
  (``CommitterStore.checkpoint_states``), and wakes the triggers whose row changed. A
  trigger's own check (row, manifest, staged files) then runs only when its row changed, or
  every ``poke_interval`` while its row is SEALED (its files checked again), so a checkpoint is
  seen within about half a second of its seal, however many triggers wait and whatever their
  ``poke_interval``, and waiting costs one query per interval for all of them. While the watch
  cannot read the table (the database is down), each trigger checks on its own, as before.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")

#: Threads of the pool every walsink trigger of one triggerer process checks in: at most this
#: many checks (and committer connections) at once, whatever the number of triggers. A check
#: mostly waits (on the committer database, on the object store), so more threads than cores:
#: with 4, a thousand checkpoints sealed over a minute on S3 queued for seconds (bench/README.md,
#: benchmark 10).
CHECK_THREADS = 8
#: Seconds between two reads of the watched checkpoints' rows (one query per walsink connection).
WATCH_INTERVAL = 0.5

#: Threads that read the watched rows (one query per walsink connection every interval).
WATCH_THREADS = 1

CHECKS, WATCHES = "walsink-durability", "walsink-watch"
_pools: dict[str, ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()
_watches: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, CommitterWatch]] = (
    weakref.WeakKeyDictionary()
)

Key = tuple[str, str]
#: What the thread side reads for each watched checkpoint that has a row: its fingerprint (state,
#: attempt, sealed attempt) and whether a check could find it durable (SEALED, or verified).
States = dict[Key, tuple[tuple[Any, ...], bool]]


def _pool(name: str) -> ThreadPoolExecutor:
    """The process's pool ``name``: ``walsink-durability`` (the checks, :data:`CHECK_THREADS`
    threads) or ``walsink-watch`` (the watches' reads, :data:`WATCH_THREADS`)."""
    with _pools_lock:
        pool = _pools.get(name)
        if pool is None:
            size = CHECK_THREADS if name == CHECKS else WATCH_THREADS
            pool = _pools[name] = ThreadPoolExecutor(
                size, thread_name_prefix=name, initializer=_thread_started
            )
        return pool


def _thread_started() -> None:
    """In each thread of either pool, before its first call: every thread uses the committer
    database, so its engine keeps one connection per thread between calls instead of opening and
    closing one per check (``core/store/engine.py``). Imported here, off the loop."""
    from airflow_provider_walsink.core.store.engine import keep_idle_connections

    keep_idle_connections(CHECK_THREADS + WATCH_THREADS)


async def _in(pool: ThreadPoolExecutor, fn: Callable[..., T], *args: Any) -> T:
    call = functools.partial(contextvars.copy_context().run, fn, *args)
    return await asyncio.get_running_loop().run_in_executor(pool, call)


async def off_loop(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in the walsink triggers' thread pool, with the caller's context variables
    (as :func:`asyncio.to_thread` passes them: Airflow's trigger logging reads them)."""
    return await _in(_pool(CHECKS), fn, *args)


async def watch_off_loop(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in the watches' own thread, never queued behind the checks."""
    return await _in(_pool(WATCHES), fn, *args)


def _read_states(walsink_conn_id: str, keys: list[Key]) -> States:
    from airflow_provider_walsink.triggers.durability_check import checkpoint_states

    return checkpoint_states(walsink_conn_id, keys)


class CommitterWatch:
    """The rows of the checkpoints the triggers of one loop wait on through one walsink connection."""

    def __init__(self, walsink_conn_id: str) -> None:
        self.walsink_conn_id = walsink_conn_id
        self._waiters: dict[Key, set[asyncio.Event]] = {}
        #: The last fingerprint read per key (``None``: no row) and whether it could be durable.
        self._seen: dict[Key, tuple[tuple[Any, ...] | None, bool]] = {}
        #: Monotonic time at which the last successful read started.
        self.read_started = float("-inf")
        self._task: asyncio.Task[None] | None = None

    @contextmanager
    def watching(self, pipeline: str, checkpoint_key: str) -> Iterator[asyncio.Event]:
        """Watch one checkpoint while the block runs: the event is set when its row changes."""
        key = (pipeline, checkpoint_key)
        event = asyncio.Event()
        self._waiters.setdefault(key, set()).add(event)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"walsink-committer-watch-{self.walsink_conn_id}"
            )
        try:
            yield event
        finally:
            events = self._waiters.get(key)
            if events is not None:
                events.discard(event)
                if not events:
                    del self._waiters[key]
                    self._seen.pop(key, None)

    def rules_out(self, pipeline: str, checkpoint_key: str, *, since: float) -> bool:
        """Whether a read started after ``since`` (monotonic) found the checkpoint's row in a state
        no check could find durable (not registered, writing, failed...): its check can wait."""
        seen = self._seen.get((pipeline, checkpoint_key))
        return seen is not None and not seen[1] and self.read_started > since

    async def _run(self) -> None:
        while self._waiters:
            keys = list(self._waiters)
            started = time.monotonic()
            try:
                states = await watch_off_loop(_read_states, self.walsink_conn_id, keys)
            except Exception:  # noqa: BLE001 - the triggers check on their own until it reads again
                states = None
            if states is not None:
                self.read_started = started
                for key in keys:
                    fingerprint, checkable = states.get(key, (None, False))
                    before = self._seen.get(key)
                    self._seen[key] = (fingerprint, checkable)
                    # A change wakes; so does a first sight of a row a check could find durable
                    # (it may have changed between the trigger's check and this read).
                    if (before[0] != fingerprint) if before is not None else checkable:
                        for event in self._waiters.get(key, ()):
                            event.set()
            await asyncio.sleep(WATCH_INTERVAL)


def watch_for(walsink_conn_id: str) -> CommitterWatch:
    """The running loop's watch of ``walsink_conn_id`` (one per loop: tests run several loops)."""
    loop = asyncio.get_running_loop()
    watches = _watches.setdefault(loop, {})
    watch = watches.get(walsink_conn_id)
    if watch is None:
        watch = watches[walsink_conn_id] = CommitterWatch(walsink_conn_id)
    return watch
