"""What the walsink triggers of one triggerer do together on its event loop (issue 46).

Imported on the loop with :mod:`.durable`: the standard library only.

* :func:`off_loop`: every blocking step of a check runs in one pool of :data:`CHECK_THREADS`
  threads per triggerer process, never on the loop and never in the default executor that
  Airflow's ``sync_to_async`` and other triggers use.
* :class:`CommitterWatch`: one per walsink connection and loop, in a thread of its own. Every
  :data:`WATCH_INTERVAL` seconds it reads the rows of every checkpoint a trigger waits on, in
  one query (``CommitterStore.checkpoint_states``), and for each trigger whose row changed it
  runs that trigger's check in the pool at once and hands it the status (:class:`Waiter`). A
  trigger checks on its own only at its start and every ``poke_interval`` while its row is
  SEALED (its files checked again), so a checkpoint is seen within about half a second of its
  seal, however many triggers wait and whatever their ``poke_interval``, and waiting costs one
  query per interval for all of them. Neither the read, its sleep nor the check waits for a
  turn of the event loop, which a triggerer's thousands of triggers share: only the status's
  delivery does, once, as a DateTimeTrigger's timer does (bench/README.md, benchmark 10).
  While the watch cannot read the table (the database is down), each trigger checks on its
  own, as before.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import gc
import os
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

#: Threads that read the watched rows: one per watch (walsink connection), one query per interval.
WATCH_THREADS = 1
#: Seconds a watch's thread waits for a new waiter once nobody waits, before it ends: a triggerer
#: whose walsink triggers come and go does not start it again (on its loop) each time.
WATCH_IDLE = 60.0

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
_watches: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, CommitterWatch]] = (
    weakref.WeakKeyDictionary()
)

Key = tuple[str, str]
#: What the thread side reads for each watched checkpoint that has a row: its fingerprint (state,
#: attempt, sealed attempt) and whether a check could find it durable (SEALED, or verified).
States = dict[Key, tuple[tuple[Any, ...], bool]]


def _checks_pool() -> ThreadPoolExecutor:
    """The process's pool of :data:`CHECK_THREADS` check threads, every one of them started when
    the pool is made (at the first trigger's first step).

    A ``ThreadPoolExecutor`` starts a thread in ``submit`` whenever none is idle, that is on the
    loop, and each start waits until the new thread has run. With checks already running beside
    it, the new thread waits for the interpreter lock, and so the loop waited: one of the blocks
    of benchmark 10 (bench/README.md). Started at once, while a triggerer's first trigger starts,
    later submits only queue work."""
    global _pool
    pool = _pool
    if pool is not None:
        return pool
    with _pool_lock:
        if _pool is None:
            pool = ThreadPoolExecutor(
                CHECK_THREADS, thread_name_prefix="walsink-durability", initializer=_thread_started
            )
            # The pool starts a thread per submit while none is idle: held at a barrier, none is
            # until all are started.
            all_started = threading.Barrier(CHECK_THREADS)
            for _ in range(CHECK_THREADS):
                pool.submit(all_started.wait, 60.0)
            _pool = pool
        return _pool


def _thread_started() -> None:
    """In each thread of the pool and each watch's thread, before its first call: every thread uses the committer
    database, so its engine keeps one connection per thread between calls instead of opening and
    closing one per check (``core/store/engine.py``). Imported here, off the loop."""
    from airflow_provider_walsink.core.store.engine import keep_idle_connections

    keep_idle_connections(CHECK_THREADS + WATCH_THREADS)


async def off_loop(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in the walsink triggers' thread pool, with the caller's context variables
    (as :func:`asyncio.to_thread` passes them: Airflow's trigger logging reads them)."""
    call = functools.partial(contextvars.copy_context().run, fn, *args)
    return await asyncio.get_running_loop().run_in_executor(_checks_pool(), call)


_heap_settled = False


def settle_heap() -> None:
    """Once per process, after the first check: move every object alive now (the modules a check
    imports, Airflow's own, the engine) out of the garbage collector's reach (``gc.freeze``).

    A full collection stops the whole triggerer, its event loop included, for as long as it takes
    to scan every object the process holds; most of them are modules and classes that are never
    garbage. Frozen, they are no longer scanned, so each later collection scans only what was made
    since (the triggers, their task instances): in benchmark 10 (bench/README.md, 1,000 walsink
    triggers) the trigger runner's longest collection fell from 0.34-0.44 s to 0.13 s, and other
    triggers that run after walsink's on the same triggerer are no slower for it (four runs
    alternating the freeze, bench/README.md: "Does the heap freeze make a later turn worse?"). What the
    freeze keeps from the cycle collector is what is alive at that moment, once: if it later
    becomes garbage in a reference cycle, it stays (what is freed by reference count, a check's
    own objects among it, is freed as before). ``WALSINK_TRIGGERER_GC_FREEZE=0`` in the
    triggerer's environment turns it off. ``dag.test()`` runs a deferred sensor's trigger in its
    own process, so the freeze happens there too, once; walsink's tests turn it off for theirs.
    """
    global _heap_settled
    with _pool_lock:
        if _heap_settled:
            return
        _heap_settled = True
    if os.environ.get("WALSINK_TRIGGERER_GC_FREEZE", "1").strip().lower() not in ("0", "false", "no", "off"):
        gc.freeze()


def _read_states(walsink_conn_id: str, keys: list[Key]) -> States:
    from airflow_provider_walsink.triggers.durability_check import checkpoint_states

    return checkpoint_states(walsink_conn_id, keys)


class Waiter:
    """One trigger's wait on its checkpoint's row (:meth:`CommitterWatch.watching`).

    ``event`` is set on the trigger's loop when the row changed. With a ``check`` (the trigger's
    own, a callable that never raises), the watch runs it at once in the checks' pool when the
    row changes, and sets ``event`` only when its status is there to :meth:`take`: the trigger
    then need not wake, submit and wait for a thread again, each of them a turn of a loop that
    2,000 triggers share (bench/README.md, benchmark 10).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, check: Callable[[], Any] | None) -> None:
        self.event = asyncio.Event()
        self._loop = loop
        self._check = check
        # The trigger's context variables (Airflow's trigger logging reads them), copied for each run.
        self._context = contextvars.copy_context()
        self._status: Any = None
        self._pending = False
        self._lock = threading.Lock()

    @property
    def pending(self) -> bool:
        """A check the watch started has not delivered its status yet."""
        with self._lock:
            return self._pending

    def take(self) -> Any:
        """The status of the check the watch ran since the last call, or ``None``."""
        with self._lock:
            status, self._status = self._status, None
        return status

    def _deliver(self, status: Any) -> None:  # in the check's thread
        with self._lock:
            self._pending = False
            self._status = status
        self._wake()

    def _wake(self) -> None:
        try:
            self._loop.call_soon_threadsafe(self.event.set)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    def _changed(self) -> None:
        """The row changed (in the watch's thread): check now, in the pool, or just wake the trigger."""
        if self._check is None:
            self._wake()
            return
        with self._lock:
            if self._pending:
                return
            self._pending = True
        future = _checks_pool().submit(self._context.copy().run, self._check)

        def done(f: Any) -> None:
            # A check never raises; a pool shut down cancels it: then the trigger checks itself.
            self._deliver(None if f.cancelled() or f.exception() is not None else f.result())

        future.add_done_callback(done)


class CommitterWatch:
    """The rows of the checkpoints the triggers of one loop wait on through one walsink connection.

    It reads them in a thread of its own (not on the loop: a read, its sleep and the wakes it
    sends never wait for a turn of the loop), one query per :data:`WATCH_INTERVAL`, while anyone
    waits. When nobody has waited for :data:`WATCH_IDLE` seconds it stops, and the next waiter
    starts it again.

    What the loop does here never waits for the watch's thread. Its lock guards only the thread's
    start and stop; the thread reads the waiters and publishes what it read (``_seen``, then
    ``read_started``) without it, one dictionary operation at a time (each atomic under the
    interpreter lock). Holding a lock through a read of hundreds of keys, the thread could lose the
    interpreter lock to the checks running beside it, and the loop, wanting the same lock to add a
    trigger, waited for it (issue 46).
    """

    def __init__(self, walsink_conn_id: str) -> None:
        self.walsink_conn_id = walsink_conn_id
        self._lock = threading.Lock()
        #: Changed on the loop only; the watch's thread reads it.
        self._waiters: dict[Key, set[Waiter]] = {}
        #: Written by the watch's thread only (the loop drops a key nobody waits on): the last
        #: fingerprint read per key (``None``: no row) and whether it could be durable.
        self._seen: dict[Key, tuple[tuple[Any, ...] | None, bool]] = {}
        #: Monotonic time at which the last successful read started (set after ``_seen``).
        self.read_started = float("-inf")
        self._thread: threading.Thread | None = None
        self._wanted = threading.Event()

    @contextmanager
    def watching(
        self, pipeline: str, checkpoint_key: str, *, check: Callable[[], Any] | None = None
    ) -> Iterator[Waiter]:
        """Watch one checkpoint while the block runs (see :class:`Waiter`)."""
        key = (pipeline, checkpoint_key)
        waiter = Waiter(asyncio.get_running_loop(), check)
        waiters = self._waiters.get(key)
        if waiters is None:
            # A new set, filled before it is published: the thread may be reading the old one.
            self._waiters[key] = {waiter}
        else:
            self._waiters[key] = waiters | {waiter}
        self._wanted.set()
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"walsink-watch-{self.walsink_conn_id}", daemon=True
                )
                self._thread.start()
        try:
            yield waiter
        finally:
            waiters = self._waiters.get(key, set()) - {waiter}
            if waiters:
                self._waiters[key] = waiters
            else:
                self._waiters.pop(key, None)
                self._seen.pop(key, None)

    def rules_out(self, pipeline: str, checkpoint_key: str, *, since: float) -> bool:
        """Whether a read started after ``since`` (monotonic) found the checkpoint's row in a state
        no check could find durable (not registered, writing, failed...): its check can wait.

        Read without a lock: a read's ``_seen`` is published before its ``read_started``, so a
        start after ``since`` comes with that read's state or a later one; and a row that becomes
        checkable wakes its trigger at once (:meth:`Waiter._changed`)."""
        seen = self._seen.get((pipeline, checkpoint_key))
        return seen is not None and not seen[1] and self.read_started > since

    def _run(self) -> None:
        _thread_started()
        while True:
            keys = list(self._waiters)
            if not keys:
                if self._idle():
                    continue
                return
            started = time.monotonic()
            try:
                states: States | None = _read_states(self.walsink_conn_id, keys)
            except Exception:  # noqa: BLE001 - the triggers check on their own until it reads again
                states = None
            if states is not None:
                changed: list[Waiter] = []
                for key in keys:
                    waiters = self._waiters.get(key)
                    if waiters is None:
                        continue  # its trigger ended during the read
                    fingerprint, checkable = states.get(key, (None, False))
                    before = self._seen.get(key)
                    self._seen[key] = (fingerprint, checkable)
                    # A change wakes; so does a first sight of a row a check could find
                    # durable (it may have changed between the trigger's check and this read).
                    if (before[0] != fingerprint) if before is not None else checkable:
                        changed.extend(waiters)
                for key in [key for key in list(self._seen) if key not in self._waiters]:
                    self._seen.pop(key, None)  # its trigger ended during the read
                self.read_started = started
                for waiter in changed:
                    waiter._changed()
            time.sleep(WATCH_INTERVAL)

    def _idle(self) -> bool:
        """Nobody waits: wait up to :data:`WATCH_IDLE` seconds for a waiter. ``False``: none came,
        and the thread is to end (decided under the lock, so a waiter added meanwhile starts a new one)."""
        self._wanted.clear()
        if self._waiters or self._wanted.wait(WATCH_IDLE):
            return True
        with self._lock:
            if self._waiters:
                return True
            self._thread = None
            return False


def watch_for(walsink_conn_id: str) -> CommitterWatch:
    """The running loop's watch of ``walsink_conn_id`` (one per loop: tests run several loops)."""
    loop = asyncio.get_running_loop()
    watches = _watches.setdefault(loop, {})
    watch = watches.get(walsink_conn_id)
    if watch is None:
        watch = watches[walsink_conn_id] = CommitterWatch(walsink_conn_id)
    return watch
