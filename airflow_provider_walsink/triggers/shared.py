"""What the walsink triggers of one triggerer process share (issue 46).

A triggerer may hold hundreds of durability triggers on the same few connections. Checked one
by one, each check would look its connections up again (in Airflow 3 a round trip from the
triggerer's event loop to its supervisor process and its metadata database, per connection),
open a new committer engine and a new staging client. Here they share, per process:

* **one hook per walsink connection id** (:func:`hook_for`): the walsink connection, and the
  staging connection it names, are looked up once and kept for :data:`CONNECTION_TTL` seconds,
  and so are the storage options read from them. Reading a connection's extra in a triggerer
  is itself a round trip: the Task SDK masks every secret it finds there by sending it to the
  triggerer's supervisor, one message at a time for all threads. Done per check, it made every
  check wait for that channel, and a thousand checkpoints sealed over a minute on S3 queued for
  seconds (bench/README.md, benchmark 10);
* **one committer store per database URL** (its SQLAlchemy engine and pool:
  ``hooks/walsink.py: store_for_url``); the pool never holds more connections than the triggers'
  thread pool has threads (``watch.py: CHECK_THREADS``), and keeps them between checks instead of
  opening a server connection per check (``core/store/engine.py: keep_idle_connections``);
* **one staging store per root and credentials** (:func:`staging_store_for`; on S3 its
  ``pyarrow`` file system, and its boto3 client once made), the :data:`STAGING_STORES` most
  recently used kept.

Why a TTL on the lookups, and contents as the keys of what they open: a connection changed in
Airflow (keys rotated, the committer moved) must reach triggers that are already waiting, and
a triggerer cannot be told that it changed. So a lookup is trusted for :data:`CONNECTION_TTL`
seconds (a minute: at most that long on old credentials, against one lookup per connection per
minute instead of one per check of every trigger), and again sooner after a check failed
(:func:`expire`: a rotated key shows as a failure; at most one new lookup per
:data:`RETRY_LOOKUP_AFTER` seconds, so a database that is down is not answered by a storm of
lookups). What a lookup opens is keyed on what it read (the database URL; the root and the
credentials), so a new lookup with the same contents reuses the same engine and client, and
one with new contents opens new ones; the engine of a URL no connection names any more is
disposed of.

Everything here blocks (connection lookups, engines, clients): it runs in the triggers'
thread pool, never on the event loop, and is imported there.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from airflow_provider_walsink.core.staging.object_store import StagingStore
from airflow_provider_walsink.core.store.store import CommitterStore
from airflow_provider_walsink.hooks.staging import StagingCredentials
from airflow_provider_walsink.hooks.walsink import WalsinkHook, forget_store_for_url

#: Seconds a connection lookup is trusted by the triggers of one process.
CONNECTION_TTL = 60.0
#: After a failed check, the connections are looked up again, but at most this often.
RETRY_LOOKUP_AFTER = 5.0
#: Staging stores (clients) kept per process, most recently used first.
STAGING_STORES = 32
#: A connection lookup that took this many seconds or more is logged, with what it usually is.
SLOW_LOOKUP = 1.0

_lock = threading.Lock()
_hooks: dict[str, SharedWalsinkHook] = {}
#: walsink connection id -> the committer URL its current hook named (to dispose of a left one).
_urls: dict[str, str] = {}
_staging: OrderedDict[tuple[str, tuple[tuple[str, str], ...]], StagingStore] = OrderedDict()
#: Roots being opened: a lock each, held by the one thread opening it.
_opening: dict[tuple[str, tuple[tuple[str, str], ...]], threading.Lock] = {}


class SharedWalsinkHook(WalsinkHook):
    """A :class:`WalsinkHook` for many triggers: each connection it reads is looked up once in its
    life (an absent one too), and the staging stores it opens are shared (:func:`staging_store_for`).
    Thread-safe; :func:`hook_for` gives the current one and replaces it after its life."""

    def __init__(self, walsink_conn_id: str, **kwargs: Any) -> None:
        super().__init__(walsink_conn_id, **kwargs)
        self.looked_up_at = time.monotonic()
        self._connections: dict[str, Any] = {}
        self._credentials: dict[str, StagingCredentials] = {}
        self._lookup_lock = threading.Lock()
        self._credentials_lock = threading.Lock()

    def get_connection(self, conn_id: str) -> Any:  # type: ignore[override]
        """The connection, as looked up the first time (``AirflowNotFoundException`` again if absent)."""
        took: float | None = None  # set by a lookup made here, not by one kept
        with self._lookup_lock:
            if conn_id not in self._connections:
                began = time.monotonic()
                try:
                    self._connections[conn_id] = super().get_connection(conn_id)
                    took = time.monotonic() - began
                except Exception as exc:
                    from airflow.exceptions import AirflowNotFoundException

                    if not isinstance(exc, AirflowNotFoundException):
                        raise  # a secrets backend down: not cached, asked again next time
                    self._connections[conn_id] = exc
            found = self._connections[conn_id]
        if took is not None and took >= SLOW_LOOKUP:
            # Logged after the lock: a log line goes to the supervisor, and may wait for it.
            self.log.info(
                "walsink: connection %r took %.1f s to look up. A fresh triggerer's first lookup of "
                "a connection stored in Airflow's metadata database starts Airflow's in-process "
                "Execution API in the triggerer's supervisor, which meanwhile neither heartbeats nor "
                "records trigger events; connections in a secrets backend or environment variables "
                "never reach the supervisor (docs/production.md, 'The triggerer').",
                conn_id,
                took,
            )
        if isinstance(found, Exception):
            raise found
        return found

    def get_staging_credentials(self, staging_root: str | None = None) -> StagingCredentials:
        """The root's storage options, read from its connection once in the hook's life (a failure
        is not kept: raised again, and read again, at the next check)."""
        root = staging_root or self.staging_root
        with self._credentials_lock:  # one thread reads them while the others wait for it
            found = self._credentials.get(root)
            if found is None:
                found = self._credentials[root] = super().get_staging_credentials(root)
        return found

    def get_store(self) -> CommitterStore:
        store = super().get_store()
        _note_url(self.walsink_conn_id, self.sqlalchemy_url)
        return store

    def _open_staging_store(self, root: str, options: Mapping[str, str]) -> StagingStore:
        return staging_store_for(root, options)


def hook_for(walsink_conn_id: str) -> SharedWalsinkHook:
    """The hook the triggers of this process share for ``walsink_conn_id``: a new one (its
    connections looked up again) once the current one is :data:`CONNECTION_TTL` seconds old."""
    with _lock:
        hook = _hooks.get(walsink_conn_id)
        if hook is None or time.monotonic() - hook.looked_up_at >= CONNECTION_TTL:
            hook = _hooks[walsink_conn_id] = SharedWalsinkHook(walsink_conn_id)
        return hook


def expire(walsink_conn_id: str) -> None:
    """A check through ``walsink_conn_id`` failed: look its connections up again at the next
    check, unless they were looked up less than :data:`RETRY_LOOKUP_AFTER` seconds ago."""
    with _lock:
        hook = _hooks.get(walsink_conn_id)
        if hook is not None and time.monotonic() - hook.looked_up_at >= RETRY_LOOKUP_AFTER:
            del _hooks[walsink_conn_id]


def staging_store_for(root: str, options: Mapping[str, str]) -> StagingStore:
    """One opened staging store per ``root`` and storage ``options`` in this process (thread-safe:
    ``pyarrow`` file systems and boto3 clients are)."""
    key = (root, tuple(sorted((str(k), str(v)) for k, v in options.items())))
    with _lock:
        if (store := _cached_staging(key)) is not None:
            return store
        opening = _opening.setdefault(key, threading.Lock())
    # One thread opens a root while the others checking it wait (checks of other roots do not):
    # opening may take a while, and two threads must not each open a client for one root.
    with opening:
        with _lock:
            if (store := _cached_staging(key)) is not None:
                return store
        store = StagingStore.open(root, options)
        with _lock:
            _staging[key] = store
            _opening.pop(key, None)
            while len(_staging) > STAGING_STORES:
                _staging.popitem(last=False)
    return store


def _cached_staging(key: tuple) -> StagingStore | None:
    """The store opened for ``key``, now the most recently used (under ``_lock``)."""
    store = _staging.get(key)
    if store is not None:
        _staging.move_to_end(key)
    return store


def _note_url(walsink_conn_id: str, url: str) -> None:
    """Remember the committer URL ``walsink_conn_id`` names now; dispose of the engine of the one it
    named before if no other connection names it (a committer database moved)."""
    with _lock:
        previous = _urls.get(walsink_conn_id)
        if previous == url:
            return
        _urls[walsink_conn_id] = url
        left = previous is not None and previous not in _urls.values()
    if left:
        forget_store_for_url(previous)  # type: ignore[arg-type]


def clear() -> None:
    """Forget every shared hook and staging store (tests; a process about to fork)."""
    with _lock:
        _hooks.clear()
        _urls.clear()
        _staging.clear()
