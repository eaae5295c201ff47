"""The committer database failing mid-commit (PostgreSQL): cut connections, killed backends,
deadlocks and serialization failures.

The shared PostgreSQL server is never stopped (other sessions use it): the
connection is cut by a loopback TCP proxy this test starts between the
committer and the server, or the committer's own backend is terminated with
``pg_terminate_backend``. Each case must end with the checkpoint published
exactly once: retried with backoff inside the store where that is safe,
otherwise a clear failure that the next task try completes.
"""

from __future__ import annotations

import logging
import socket
import threading
from datetime import timedelta

import pytest
from sqlalchemy import create_engine, event, select, text, update
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from airflow_provider_walsink.core.commit.commit import CheckpointCommitter
from airflow_provider_walsink.core.protocol.states import CheckpointState as S
from airflow_provider_walsink.core.store import retry as retry_module
from airflow_provider_walsink.core.store.engine import create_committer_engine
from airflow_provider_walsink.core.store.models import checkpoint_table as ckpt
from airflow_provider_walsink.core.store.store import CommitterStore
from airflow_provider_walsink.core.targets import FilePublisher
from tests.helpers import ACTOR, stage_checkpoint, target_files

FILES = {f"dt=d1/part-{i}.csv": f"d1,{i}\n".encode() for i in range(4)}


class CuttableProxy:
    """A loopback TCP proxy to PostgreSQL whose connections can be cut, and refused, on demand."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.down = False
        self.cuts = 0
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.down:
                client.close()  # the database is "unreachable": refused right after connect
                continue
            upstream = socket.create_connection(self.upstream)
            with self._lock:
                self._socks += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        """Drop every open connection (both directions) and refuse new ones until :meth:`restore`."""
        self.down = True
        self.cuts += 1
        with self._lock:
            socks, self._socks = self._socks, []
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def restore(self) -> None:
        self.down = False

    def close(self) -> None:
        self._closed = True
        self.cut()
        self.listener.close()


@pytest.fixture
def proxy(pg_url):
    url = make_url(pg_url)
    p = CuttableProxy((url.host or "127.0.0.1", url.port or 5432))
    yield p
    p.close()


def via(pg_url: str, port: int) -> str:
    return make_url(pg_url).set(host="127.0.0.1", port=port).render_as_string(hide_password=False)


def on_commit_statement(engine, action) -> list[int]:
    """Call ``action(connection)`` once, just before the UPDATE that records COMMITTED is sent.

    On PostgreSQL that UPDATE is inside the one statement that records COMMITTED
    (``store._one_statement_transition``).
    """
    fired: list[int] = []

    @event.listens_for(engine, "before_cursor_execute")
    def _before(conn, cursor, statement, parameters, context, executemany):
        if not fired and "UPDATE walsink_checkpoint" in statement and "'COMMITTED'" in str(parameters):
            fired.append(1)
            action(conn)

    return fired


def committer_for(store, layout, target, owner="committer", ttl=timedelta(minutes=5)):
    return CheckpointCommitter(
        store,
        layout,
        FilePublisher(target, "overwrite", layout=layout),
        mode="overwrite",
        owner=owner,
        lease_ttl=ttl,
    )


def assert_published_once(setup_store, target, key="d1"):
    rows = sorted(line for data in target_files(target).values() for line in data.splitlines())
    assert rows == sorted(line for data in FILES.values() for line in data.splitlines())
    record = setup_store.require("p", key)
    assert record.state is S.COMMITTED
    assert sum(1 for t in setup_store.history("p", key) if t.to_state == "COMMITTED") == 1


def test_connection_cut_mid_commit_is_retried_with_backoff_and_publishes_once(
    pg_url, proxy, layout, tmp_path, caplog
):
    setup = CommitterStore.from_url(pg_url, migrate=False)
    stage_checkpoint(setup, layout, "p", "d1", FILES)
    store = CommitterStore(create_committer_engine(via(pg_url, proxy.port)))

    def cut_then_heal(_conn) -> None:
        proxy.cut()  # the statement recording COMMITTED goes into a dead socket
        threading.Timer(0.3, proxy.restore).start()

    fired = on_commit_statement(store.engine, cut_then_heal)
    caplog.set_level(logging.WARNING, logger="airflow_provider_walsink.core.store.store")

    summary = committer_for(store, layout, tmp_path / "target").commit("p", "d1", actor=ACTOR)

    assert fired and proxy.cuts == 1
    assert any("retrying mark_committed" in r.getMessage() for r in caplog.records), caplog.text
    assert summary.published == len(FILES) and not summary.already_committed
    assert_published_once(setup, tmp_path / "target")
    store.dispose()
    setup.dispose()


def test_outage_longer_than_the_retries_fails_clearly_and_the_next_try_completes(
    pg_url, proxy, layout, tmp_path, monkeypatch
):
    setup = CommitterStore.from_url(pg_url, migrate=False)
    stage_checkpoint(setup, layout, "p", "d1", FILES)
    store = CommitterStore(create_committer_engine(via(pg_url, proxy.port)))
    on_commit_statement(store.engine, lambda _conn: proxy.cut())  # and it stays down
    monkeypatch.setattr(retry_module, "_RETRY_DELAYS_S", (0.05, 0.1))  # a short retry budget
    target = tmp_path / "target"

    with pytest.raises(DBAPIError) as err:
        committer_for(store, layout, target).commit("p", "d1", actor=ACTOR)

    assert "connection" in str(err.value).lower() or "server closed" in str(err.value).lower()
    # Published but not recorded: the checkpoint is not COMMITTED, the data waits in place.
    record = setup.require("p", "d1")
    assert record.state is S.COMMITTING and record.committed_at is None
    assert len(target_files(target)) == len(FILES)

    proxy.restore()  # the database is back: Airflow's next try of the same task
    summary = committer_for(store, layout, target).commit("p", "d1", actor=ACTOR)
    assert summary.published == 0 and not summary.already_committed  # nothing published twice
    assert_published_once(setup, target)
    store.dispose()
    setup.dispose()


def test_committer_backend_terminated_mid_commit_is_retried(pg_url, layout, tmp_path, caplog):
    """``pg_terminate_backend`` of the committer's own connection inside the COMMITTED transaction."""
    setup = CommitterStore.from_url(pg_url, migrate=False)
    stage_checkpoint(setup, layout, "p", "d1", FILES)
    store = CommitterStore(create_committer_engine(pg_url))
    admin = create_engine(pg_url, isolation_level="AUTOCOMMIT")
    terminated: list[bool] = []

    def terminate(conn) -> None:
        pid = conn.connection.dbapi_connection.info.backend_pid
        with admin.connect() as a:
            terminated.append(a.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid}).scalar())

    on_commit_statement(store.engine, terminate)
    caplog.set_level(logging.WARNING, logger="airflow_provider_walsink.core.store.store")

    summary = committer_for(store, layout, tmp_path / "target").commit("p", "d1", actor=ACTOR)

    assert terminated == [True]
    assert any("retrying mark_committed" in r.getMessage() for r in caplog.records)
    assert summary.published == len(FILES)
    assert_published_once(setup, tmp_path / "target")
    admin.dispose()
    store.dispose()
    setup.dispose()


class _InterferingStore(CommitterStore):
    """Runs ``hook(conn)`` inside the first locking transaction, before the row lock is taken.

    A deadlock or a serialization failure needs a transaction of several
    statements: this store takes the locking path for every transition (as
    ``append`` pipelines, SQLite and MySQL do), not PostgreSQL's one statement.
    """

    hook = None
    calls = 0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._one_statement = False

    def _lock(self, conn, pipeline, key):
        type(self).calls += 1
        if type(self).calls == 1 and self.hook is not None:
            self.hook(conn)
        return super()._lock(conn, pipeline, key)


def test_deadlock_is_retried_and_the_commit_completes(pg_url, layout, tmp_path, caplog):
    """A real deadlock: the store's transaction is PostgreSQL's victim (40P01), then retried."""
    setup = CommitterStore.from_url(pg_url, migrate=False)
    stage_checkpoint(setup, layout, "p", "d1", FILES)
    stage_checkpoint(setup, layout, "p", "other", {"dt=d2/part-0.csv": b"x\n"})
    engine = create_committer_engine(pg_url)

    @event.listens_for(engine, "connect")
    def _fast_detector(dbapi_conn, _record):
        with dbapi_conn.cursor() as cur:  # this side looks for deadlocks first, so it is the victim
            cur.execute("SET deadlock_timeout = '100ms'")
        dbapi_conn.commit()  # a SET inside a rolled-back transaction would be undone

    store = _InterferingStore(engine)
    holder = create_engine(pg_url)
    have_x, have_y = threading.Event(), threading.Event()
    outcome: list[str] = []

    def other_transaction() -> None:
        """Locks d1's row, then wants 'other''s row, which the store holds: a cycle."""
        with holder.connect() as c, c.begin():
            c.execute(text("SET LOCAL deadlock_timeout = '10s'"))
            c.execute(select(ckpt.c.id).where(ckpt.c.checkpoint_key == "d1").with_for_update())
            have_x.set()
            have_y.wait(30)
            c.execute(select(ckpt.c.id).where(ckpt.c.checkpoint_key == "other").with_for_update())
            outcome.append("other transaction committed")

    def lock_other_first(conn) -> None:
        conn.execute(select(ckpt.c.id).where(ckpt.c.checkpoint_key == "other").with_for_update())
        have_y.set()

    thread = threading.Thread(target=other_transaction)
    thread.start()
    have_x.wait(30)
    _InterferingStore.hook, _InterferingStore.calls = staticmethod(lock_other_first), 0
    caplog.set_level(logging.WARNING, logger="airflow_provider_walsink.core.store.store")
    try:
        summary = committer_for(store, layout, tmp_path / "target").commit("p", "d1", actor=ACTOR)
    finally:
        thread.join(60)
        _InterferingStore.hook = None
    assert outcome == ["other transaction committed"]
    assert any("deadlock" in r.getMessage().lower() for r in caplog.records), caplog.text
    assert summary.published == len(FILES)
    assert_published_once(setup, tmp_path / "target")
    for e in (holder, engine):
        e.dispose()
    setup.dispose()


def test_serialization_failure_is_retried_and_the_commit_completes(pg_url, layout, tmp_path, caplog):
    """REPEATABLE READ: a concurrent update of the row after our snapshot raises 40001, retried."""
    setup = CommitterStore.from_url(pg_url, migrate=False)
    stage_checkpoint(setup, layout, "p", "d1", FILES)
    engine = create_committer_engine(pg_url, isolation_level="REPEATABLE READ")
    store = _InterferingStore(engine)
    other = create_engine(pg_url)

    def snapshot_then_concurrent_update(conn) -> None:
        conn.execute(text("SELECT 1"))  # our snapshot starts here
        with other.begin() as c:  # someone else changes the row and commits
            c.execute(update(ckpt).where(ckpt.c.checkpoint_key == "d1").values(updated_at=ckpt.c.updated_at))

    _InterferingStore.hook, _InterferingStore.calls = staticmethod(snapshot_then_concurrent_update), 0
    caplog.set_level(logging.WARNING, logger="airflow_provider_walsink.core.store.store")
    try:
        summary = committer_for(store, layout, tmp_path / "target").commit("p", "d1", actor=ACTOR)
    finally:
        _InterferingStore.hook = None
    assert any("serialize" in r.getMessage().lower() for r in caplog.records), caplog.text
    assert summary.published == len(FILES)
    assert_published_once(setup, tmp_path / "target")
    for e in (other, engine):
        e.dispose()
    setup.dispose()
