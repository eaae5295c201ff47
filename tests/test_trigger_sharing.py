"""The walsink triggers of one triggerer process share what they can (issue 46,
``triggers/shared.py``, ``triggers/watch.py``): many durability triggers waiting at once on
checkpoints staged on S3 (moto's real S3 API) look each connection up once, open one committer
engine and one staging client, however many times each checks; a connection changed in Airflow
reaches them once the lookup's time is up (the committer URL it named before is let go), and at
once after a check failed on it. They read their checkpoints' rows together: while the rows say
the checkpoints are being written no trigger checks, whatever its ``poke_interval``, and a seal
wakes each trigger to one check, even one whose ``poke_interval`` is an hour.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections import Counter

import pytest
from airflow.sdk import BaseHook

from airflow_provider_walsink.core.commit.writer import CheckpointWriter
from airflow_provider_walsink.core.protocol import CheckpointState as S
from airflow_provider_walsink.core.staging.object_store import StagingStore
from airflow_provider_walsink.core.store.store import CommitterStore
from airflow_provider_walsink.hooks import walsink as walsink_hooks
from airflow_provider_walsink.triggers import durability_check, shared
from airflow_provider_walsink.triggers.durable import CheckpointDurableTrigger
from tests.helpers import ACTOR
from tests.table_fixtures import ACCESS_KEY, REGION, SECRET_KEY, s3_server  # noqa: F401

TRIGGERS = 12


def _conn(monkeypatch, conn_id: str, conn_type: str, **fields) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": conn_type, **fields}))


@pytest.fixture
def counted(monkeypatch):
    """Every connection lookup (by id), staging store and committer store opened, from here on."""
    lookups: Counter[str] = Counter()
    opened: list[str] = []
    engines: list[str] = []
    real_lookup = BaseHook.get_connection.__func__
    real_open = StagingStore.open.__func__
    real_engine = CommitterStore.from_url.__func__
    real_shared = CommitterStore.shared.__func__  # a task's (and a trigger's) store: its own engine

    def lookup(cls, conn_id):
        lookups[conn_id] += 1
        return real_lookup(cls, conn_id)

    def open_store(cls, root, options=None):
        opened.append(str(root))
        return real_open(cls, root, options)

    def open_engine(cls, url, **kwargs):
        engines.append(url)
        return real_engine(cls, url, **kwargs)

    monkeypatch.setattr(BaseHook, "get_connection", classmethod(lookup))
    monkeypatch.setattr(StagingStore, "open", classmethod(open_store))

    def open_shared(cls, url, **kwargs):
        engines.append(url)
        return real_shared(cls, url, **kwargs)

    monkeypatch.setattr(CommitterStore, "from_url", classmethod(open_engine))
    monkeypatch.setattr(CommitterStore, "shared", classmethod(open_shared))
    return lookups, opened, engines


def _stage(store: CommitterStore, staging: StagingStore, key: str, *, held_back: bool) -> tuple | None:
    """A SEALED checkpoint ``p/key`` on ``staging``; with ``held_back`` its second file is missing
    (returned, to put back), so the triggers check it several times."""
    store.register("p", key, mode="overwrite", actor=ACTOR)
    writer = CheckpointWriter(store, staging, "p", key, actor=ACTOR)
    location = writer.begin()
    files = {f"part-{i}.csv": f"{key},{i}\n".encode() * 100 for i in range(2)}
    for rel, data in files.items():
        with staging.filesystem.open_output_stream(staging.committable(location, rel)) as out:
            out.write(data)
    writer.add_files(files, checksum="crc32", writer="t")
    writer.seal(file_format="csv")
    if not held_back:
        return None
    path = staging.committable(location, "part-1.csv")
    staging.filesystem.delete_file(path)
    return path, files["part-1.csv"]


def _run_all(triggers: list[CheckpointDurableTrigger], before_second_look=None) -> list[dict]:
    async def first_event(trigger):
        async for event in trigger.run():
            return event.payload

    async def main():
        running = [asyncio.ensure_future(first_event(t)) for t in triggers]
        if before_second_look is not None:
            await asyncio.sleep(0.5)  # every trigger has checked, and found the file missing, by now
            await asyncio.to_thread(before_second_look)
        return await asyncio.gather(*running)

    return asyncio.run(main())


def _triggers(keys: list[str]) -> list[CheckpointDurableTrigger]:
    return [
        CheckpointDurableTrigger(
            pipeline="p", checkpoint_key=key, poke_interval=0.05, timeout=60, actor={"name": "triggerer"}
        )
        for key in keys
    ]


def test_many_triggers_share_one_lookup_engine_and_client_until_the_connection_changes(
    monkeypatch,
    tmp_path,
    s3_server,  # noqa: F811
    counted,
):
    lookups, opened, engines = counted
    options = {"endpoint_url": s3_server.endpoint, "access_key": ACCESS_KEY, "secret_key": SECRET_KEY,
               "region": REGION}  # fmt: skip
    root = f"s3://{s3_server.bucket}/{uuid.uuid4().hex[:12]}/staging"
    staging = StagingStore.open(root, options)
    first_url, second_url = (f"sqlite:///{tmp_path}/{name}.db" for name in ("first", "second"))
    first, second = CommitterStore.from_url(first_url), CommitterStore.from_url(second_url)
    keys = [f"2026010{i // 10}T{i % 10:02d}0000Z" for i in range(TRIGGERS)]
    held = [_stage(first, staging, key, held_back=True) for key in keys]
    _stage(second, staging, "20260201T000000Z", held_back=False)
    _conn(monkeypatch, "s3_stage", "aws", login=ACCESS_KEY, password=SECRET_KEY,
          extra={"region_name": REGION, "endpoint_url": s3_server.endpoint})  # fmt: skip
    _conn(monkeypatch, "walsink_default", "walsink",
          extra={"url": first_url, "staging_root": root, "staging_conn_id": "s3_stage"})  # fmt: skip
    lookups.clear()
    opened.clear()
    engines.clear()
    # Reading the options from the connection's extra is a round trip to the triggerer's
    # supervisor in a real triggerer (the Task SDK masks its secrets there): once per lookup too.
    options_read: list[str] = []
    real_options = walsink_hooks.options_from_connection

    def reading_options(conn, staging_root):
        options_read.append(conn.conn_id)
        return real_options(conn, staging_root)

    monkeypatch.setattr(walsink_hooks, "options_from_connection", reading_options)

    def put_back() -> None:
        for path, data in held:
            with staging.filesystem.open_output_stream(path) as out:
                out.write(data)

    events = _run_all(_triggers(keys), before_second_look=put_back)

    # Every trigger waited through several checks (the file was missing), then fired...
    assert [e["status"] for e in events] == ["durable"] * TRIGGERS, events
    assert {first.require("p", key).state for key in keys} == {S.DURABLE}
    # ...and all of them together looked each connection up once, read the staging options from
    # it once, and opened one committer engine and one S3 client.
    assert lookups == {"walsink_default": 1, "s3_stage": 1}, lookups
    assert options_read == ["s3_stage"], options_read
    assert (engines, opened) == ([first_url], [root])

    # The committer moves to another database: a trigger started within the lookup's minute
    # still reads the first one (the looked-up connection is trusted that long)...
    _conn(monkeypatch, "walsink_default", "walsink",
          extra={"url": second_url, "staging_root": root, "staging_conn_id": "s3_stage"})  # fmt: skip
    (early,) = _run_all(
        [CheckpointDurableTrigger(pipeline="p", checkpoint_key="20260201T000000Z", timeout_at=0.0)]
    )
    assert early["status"] == "timeout" and "is not registered" in early["message"], early
    # ...and once its time is up, the next trigger looks it up again and waits on the new one;
    # the first URL's engine is let go, the S3 client (same root, same keys) kept.
    shared.hook_for("walsink_default").looked_up_at -= shared.CONNECTION_TTL
    (moved,) = _run_all(_triggers(["20260201T000000Z"]))
    assert moved["status"] == "durable", moved
    assert second.require("p", "20260201T000000Z").state is S.DURABLE
    assert lookups == {"walsink_default": 2, "s3_stage": 2}, lookups
    assert options_read == ["s3_stage", "s3_stage"], options_read  # read afresh with the lookup
    assert (engines, opened) == ([first_url, second_url], [root])
    assert first_url not in walsink_hooks._stores and second_url in walsink_hooks._stores
    first.dispose()
    second.dispose()


def test_a_failed_check_looks_the_connection_up_again(monkeypatch, tmp_path, layout):
    url = f"sqlite:///{tmp_path}/committer.db"
    store = CommitterStore.from_url(url)
    writer = CheckpointWriter(store, layout, "p", "k", actor=ACTOR)
    store.register("p", "k", mode="overwrite", actor=ACTOR)
    (writer.begin() / "part-0.csv").write_bytes(b"a\n")
    writer.add_files(["part-0.csv"], writer="t")
    writer.seal(file_format="csv")
    # A connection of the wrong type: every check fails, naming it...
    _conn(monkeypatch, "walsink_default", "generic", extra={"url": url})
    monkeypatch.setattr(shared, "RETRY_LOOKUP_AFTER", 0.0)
    (refused,) = _run_all(
        [CheckpointDurableTrigger(pipeline="p", checkpoint_key="k", timeout_at=0.0, actor={"name": "t"})]
    )
    assert refused["status"] == "timeout" and "is of type 'generic'" in refused["message"], refused
    # ...and once it is fixed, the next check reads it afresh, well within the lookup's minute.
    _conn(monkeypatch, "walsink_default", "walsink", extra={"url": url, "staging_root": str(layout.root)})
    (fixed,) = _run_all(
        [CheckpointDurableTrigger(pipeline="p", checkpoint_key="k", poke_interval=0.05, timeout=20)]
    )
    assert fixed["status"] == "durable", fixed
    store.dispose()


def test_triggers_check_when_their_rows_change_not_at_every_poke(monkeypatch, tmp_path, layout):
    url = f"sqlite:///{tmp_path}/committer.db"
    store = CommitterStore.from_url(url)
    _conn(monkeypatch, "walsink_default", "walsink", extra={"url": url, "staging_root": str(layout.root)})
    keys = [f"k{i}" for i in range(TRIGGERS)]
    writers = []
    for key in keys:  # every checkpoint being written: registered, its attempt staged, not sealed
        store.register("p", key, mode="overwrite", actor=ACTOR)
        writer = CheckpointWriter(store, layout, "p", key, actor=ACTOR)
        (writer.begin() / "part-0.csv").write_bytes(b"a\n")
        writer.add_files(["part-0.csv"], writer="t")
        writers.append(writer)
    checks: Counter[str] = Counter()
    real_check = durability_check.evaluate_with_hook

    def counting(hook, root, pipeline, key, **kwargs):
        checks[key] += 1
        return real_check(hook, root, pipeline, key, **kwargs)

    monkeypatch.setattr(durability_check, "evaluate_with_hook", counting)
    # Half of them poke every 50 ms, the other half once an hour.
    triggers = [
        CheckpointDurableTrigger(
            pipeline="p", checkpoint_key=key, poke_interval=0.05 if i % 2 else 3600.0, timeout=60
        )
        for i, key in enumerate(keys)
    ]
    quiet: list[int] = []

    def seal_all() -> None:
        # Once the checks have settled (the watch has read every row since each trigger's check),
        # none happens for a while; then every checkpoint is sealed, as its write task ends.
        total, still, tries = -1, 0, 0
        while still < 10 and tries < 200:
            tries += 1
            time.sleep(0.1)
            total, still = sum(checks.values()), (still + 1 if sum(checks.values()) == total else 0)
        checks.clear()
        time.sleep(1.5)
        quiet.append(sum(checks.values()))
        for writer in writers:
            writer.seal(file_format="csv")

    async def main():
        async def first_event(trigger):
            async for event in trigger.run():
                return event.payload

        running = [asyncio.ensure_future(first_event(t)) for t in triggers]
        await asyncio.to_thread(seal_all)
        return await asyncio.gather(*running)

    events = asyncio.run(main())
    assert quiet == [0]  # rows being written: no trigger checked, not even those poking every 50 ms
    assert [e["status"] for e in events] == ["durable"] * TRIGGERS, events
    assert checks == dict.fromkeys(keys, 1)  # the seal woke each trigger to one check
    store.dispose()


def test_a_seal_is_checked_and_marked_durable_while_the_triggerers_loop_is_blocked(
    monkeypatch, tmp_path, layout
):
    """The watch reads the rows and runs the checks of the triggers whose row changed in threads,
    never waiting for a turn of the event loop (which a triggerer's thousands of triggers share,
    and which Airflow's own work blocks for seconds at a time): checkpoints sealed while the loop
    is blocked are verified and marked DURABLE before it runs again; only the triggers' events
    wait for it."""
    url = f"sqlite:///{tmp_path}/committer.db"
    store = CommitterStore.from_url(url)
    _conn(monkeypatch, "walsink_default", "walsink", extra={"url": url, "staging_root": str(layout.root)})
    keys = [f"k{i}" for i in range(TRIGGERS)]
    writers = []
    for key in keys:  # being written: registered, staged, not sealed
        store.register("p", key, mode="overwrite", actor=ACTOR)
        writer = CheckpointWriter(store, layout, "p", key, actor=ACTOR)
        (writer.begin() / "part-0.csv").write_bytes(b"a\n")
        writer.add_files(["part-0.csv"], writer="t")
        writers.append(writer)
    triggers = [CheckpointDurableTrigger(pipeline="p", checkpoint_key=key, poke_interval=3600.0, timeout=60)
                for key in keys]  # fmt: skip
    during: list[set] = []

    async def main():
        async def first_event(trigger):
            async for event in trigger.run():
                return event.payload

        running = [asyncio.ensure_future(first_event(t)) for t in triggers]
        # Every trigger has made its first check (rows WRITING) and waits.
        await asyncio.to_thread(lambda: time.sleep(1.5))
        for writer in writers:  # the write tasks end...
            writer.seal(file_format="csv")
        time.sleep(3.0)  # ...while the loop is blocked (as a long garbage collection blocks it)
        during.append({store.require("p", key).state for key in keys})
        return await asyncio.gather(*running)

    events = asyncio.run(main())
    assert during == [{S.DURABLE}], during  # checked and marked with the loop blocked throughout
    assert [e["status"] for e in events] == ["durable"] * TRIGGERS, events
    store.dispose()


def test_the_checks_of_many_triggers_reuse_their_committer_connections(monkeypatch, layout, database_urls):
    """Many triggers checking at once, again and again (a file of each is missing until it is put
    back), through the triggers' pool of threads: the committer's engine opens at most one
    connection per thread of the pools (the checks' and the watch's) and reuses them, where keeping one would open and close a
    server connection for nearly every check (a PostgreSQL backend started per check)."""
    from sqlalchemy import event

    from airflow_provider_walsink.core.store import engine as engines
    from airflow_provider_walsink.triggers import watch

    url = database_urls("postgresql")
    # As in a fresh triggerer, whose first engine is made in a check's thread: no engine of the URL
    # yet (other tests of this process made one), and the pool's threads started (what they set
    # is this process's until the test ends).
    monkeypatch.setattr(engines, "_shared", {})
    monkeypatch.setattr(walsink_hooks, "_stores", {})
    monkeypatch.setattr(engines, "_idle_connections", engines.POOL_SIZE)
    asyncio.run(watch.off_loop(watch._thread_started))
    store = walsink_hooks.store_for_url(url)  # the process's store of the URL, which the triggers' hook gets
    pipeline = f"pool{uuid.uuid4().hex[:8]}"
    keys = [f"202601{d:02d}T000000Z" for d in range(1, 3 * watch.CHECK_THREADS + 1)]
    held = []
    for key in keys:
        store.register(pipeline, key, mode="overwrite", actor=ACTOR)
        writer = CheckpointWriter(store, layout, pipeline, key, actor=ACTOR)
        where = writer.begin()
        for i in range(2):
            (where / f"part-{i}.csv").write_bytes(f"{key},{i}\n".encode())
        writer.add_files(["part-0.csv", "part-1.csv"], writer="t")
        writer.seal(file_format="csv")
        missing = where / "part-1.csv"
        held.append((missing, missing.read_bytes()))
        missing.unlink()
    _conn(monkeypatch, "walsink_default", "walsink", extra={"url": url, "staging_root": str(layout.root)})
    connects: list[int] = []
    event.listen(store.engine, "connect", lambda *_: connects.append(1))

    def put_back() -> None:
        for path, data in held:
            path.write_bytes(data)

    triggers = [
        CheckpointDurableTrigger(pipeline=pipeline, checkpoint_key=key, poke_interval=0.02, timeout=60,
                                 actor={"name": "triggerer"})
        for key in keys
    ]  # fmt: skip
    events = _run_all(triggers, before_second_look=put_back)

    assert [e["status"] for e in events] == ["durable"] * len(keys), events
    threads = watch.CHECK_THREADS + watch.WATCH_THREADS
    assert len(connects) <= threads, f"{len(connects)} connections opened for the checks and the watch"
    store.dispose()


def test_the_triggers_write_their_log_in_the_checks_threads_never_on_the_loop(monkeypatch, tmp_path, layout):
    """Writing a line of a trigger's log gives up the interpreter lock; on the loop, with checks
    running beside it, taking it back waited for them, once per line (benchmark 10's blocks while
    hundreds of triggers loaded, bench/README.md). So a check's "not durable yet" and its "durable"
    are written by the thread that ran the check."""
    url = f"sqlite:///{tmp_path}/committer.db"
    store = CommitterStore.from_url(url)
    _conn(monkeypatch, "walsink_default", "walsink", extra={"url": url, "staging_root": str(layout.root)})
    keys = [f"k{i}" for i in range(TRIGGERS)]
    held = []
    for key in keys:  # sealed, its second file missing until it is put back
        store.register("p", key, mode="overwrite", actor=ACTOR)
        writer = CheckpointWriter(store, layout, "p", key, actor=ACTOR)
        where = writer.begin()
        for i in range(2):
            (where / f"part-{i}.csv").write_bytes(f"{key},{i}\n".encode())
        writer.add_files(["part-0.csv", "part-1.csv"], writer="t")
        writer.seal(file_format="csv")
        held.append((where / "part-1.csv", (where / "part-1.csv").read_bytes()))
        (where / "part-1.csv").unlink()
    lines: list[tuple[int, str]] = []

    class Recorded:
        def _line(self, message: str, *args, **_kwargs) -> None:
            lines.append((threading.get_ident(), message % args if args else message))

        debug = info = warning = error = exception = _line

    monkeypatch.setattr(CheckpointDurableTrigger, "log", property(lambda _self: Recorded()))

    def put_back() -> None:
        for path, data in held:
            path.write_bytes(data)

    loop_threads: list[int] = []

    async def first_event(trigger):
        loop_threads.append(threading.get_ident())
        async for event in trigger.run():
            return event.payload

    async def run_all():
        running = [asyncio.ensure_future(first_event(t)) for t in _triggers(keys)]
        await asyncio.sleep(0.5)  # every trigger has checked, and found a file missing, by now
        await asyncio.to_thread(put_back)
        return await asyncio.gather(*running)

    events = asyncio.run(run_all())
    assert [e["status"] for e in events] == ["durable"] * TRIGGERS, events
    texts = [text for _, text in lines]
    assert sum(t.startswith("not durable yet") for t in texts) >= TRIGGERS, texts
    assert sum(not t.startswith("not durable yet") for t in texts) >= TRIGGERS, texts  # the durable ones
    on_loop = [text for ident, text in lines if ident in set(loop_threads)]
    assert on_loop == [], on_loop
    store.dispose()


def test_a_trigger_joins_and_asks_the_watch_while_its_thread_is_stalled_in_a_read(monkeypatch):
    """The watch's thread may lose the interpreter lock anywhere in its handling of a read (to the
    checks running beside it) and get it back only much later. The loop, adding a trigger or
    asking whether a check can wait, never waits for it: here the thread is held inside its
    handling of a read until the loop has done both."""
    from airflow_provider_walsink.triggers import watch

    inside, release, resumed = threading.Event(), threading.Event(), []

    class StalledRead(dict):
        def get(self, key, default=None):
            inside.set()
            release.wait(5)  # long enough to tell, short enough for a failing run
            resumed.append(release.is_set())
            return super().get(key, default)

    monkeypatch.setattr(watch, "_read_states", lambda _conn_id, keys: StalledRead())

    async def main():
        committer_watch = watch.CommitterWatch("stalled")
        with committer_watch.watching("p", "k1"):
            assert await asyncio.to_thread(inside.wait, 5)
            with committer_watch.watching("p", "k2"):
                committer_watch.rules_out("p", "k1", since=0.0)
                done_while_stalled = not resumed
            release.set()
        return done_while_stalled

    assert asyncio.run(main()) is True


def test_a_slow_connection_lookup_is_logged_with_what_it_usually_is(monkeypatch):
    """A lookup that took SLOW_LOOKUP seconds or more (a fresh triggerer's first, which starts
    Airflow's in-process Execution API in the supervisor) says so in the trigger's log, once per
    lookup; a quick one says nothing."""
    said: list[str] = []

    class Recorded:
        def info(self, msg, *args):
            said.append(msg % args)

    _conn(monkeypatch, "walsink_slow", "walsink", extra={"url": "sqlite://"})
    monkeypatch.setattr(shared, "SLOW_LOOKUP", 3600.0)
    hook = shared.SharedWalsinkHook("walsink_slow")
    hook._log = Recorded()
    assert hook.get_connection("walsink_slow").conn_type == "walsink"
    assert said == []
    monkeypatch.setattr(shared, "SLOW_LOOKUP", 0.0)
    hook = shared.SharedWalsinkHook("walsink_slow")
    hook._log = Recorded()
    hook.get_connection("walsink_slow")
    hook.get_connection("walsink_slow")  # kept: not looked up again, not logged again
    assert len(said) == 1 and said[0].startswith("walsink: connection 'walsink_slow' took 0.0 s")
    assert "secrets backend or environment variables" in said[0]
