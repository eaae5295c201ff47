"""The durability trigger and the deadline's async callback never block the triggerer's event loop
(issue 46).

A triggerer runs every deferred task of a deployment on one asyncio loop; a callback on it that
takes longer than Airflow's slow-callback threshold stalls them all (Airflow 3.3's triggerer warns
"async thread was blocked ... badly-written trigger", and a long enough stall gets it marked
unhealthy). Here a cold interpreter (Airflow imported, as in the triggerer, walsink not yet) does
what the triggerer does, on a loop in asyncio's debug mode: imports the trigger class by its path
on the loop and runs four walsink durability triggers at once (each on its own sealed checkpoint,
checksums verified) until they fire; another imports and awaits the commit-deadline callback. No
callback may have blocked the loop past 0.2 s, and the triggers and the callback did their work.

A callback's block is its wall time less the time its thread waited for a core (Linux's
schedstat): asyncio's own check, wall time alone, failed this test in CI on a loaded machine
(a step of ``first_event`` over 0.2 s), and with eight busy loops beside it flagged every 50 ms
callback while this measure flagged none and still flagged every 0.3 s sleep or computation.
With the trigger's connection lookup moved back onto the loop, it fails (0.28 s).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from airflow_provider_walsink.core.staging.layout import StagingLayout
from airflow_provider_walsink.core.store.store import CommitterStore
from tests.helpers import REPO, stage_checkpoint

KEYS = [f"2026010{i}T000000Z" for i in range(1, 5)]

TRIGGERER = textwrap.dedent(
    """
    import asyncio, gc, json, os, sys, threading, time
    from datetime import datetime, timedelta, timezone

    import airflow.triggers.base  # loaded in the triggerer before any trigger
    from airflow._shared.module_loading import import_string

    what, keys = sys.argv[1], sys.argv[2:]
    slow = []

    def run_queue_seconds():
        # How long the loop's thread has waited for a core while runnable (Linux schedstat).
        try:
            with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as f:
                return int(f.read().split()[1]) / 1e9
        except OSError:
            return 0.0

    run_handle = asyncio.events.Handle._run

    def timed_run(handle):
        # As asyncio's slow-callback check, less the time the thread waited for a core: on a
        # loaded machine a callback of 50 ms of work can take 0.3 s of wall, blocking nothing.
        # What is left is the callback's running, and any waiting it did on the loop (I/O, sleep).
        start, queued = time.perf_counter(), run_queue_seconds()
        try:
            return run_handle(handle)
        finally:
            wall = time.perf_counter() - start
            blocked = wall - (run_queue_seconds() - queued)
            if blocked > 0.2:
                slow.append(f"{handle!r:.300} blocked the loop {blocked:.3f} s (wall {wall:.3f} s)")

    asyncio.events.Handle._run = timed_run

    async def first_event(trigger):
        async for event in trigger.run():
            return event.payload

    async def triggers():
        # As the triggerer's create_triggers: the class by its path, on the loop.
        cls = import_string("airflow_provider_walsink.triggers.durable.CheckpointDurableTrigger")
        triggers = [
            cls(pipeline="p", checkpoint_key=key, verify_checksums=True, poke_interval=0.05,
                actor={"name": "triggerer"})
            for key in keys
        ]
        return await asyncio.gather(*(first_event(t) for t in triggers))

    async def deadline():
        # The deadline's AsyncCallback, as Airflow's CallbackTrigger runs it (asyncio.sleep is
        # the notifier: an awaitable any interpreter can import).
        callback = import_string("airflow_provider_walsink.operators.commit_deadline.notify_commit_deadline")
        due = datetime.now(timezone.utc) - timedelta(seconds=1)
        walsink = {"pipeline": "p", "walsink_conn_id": "walsink_default", "key_from_interval": True,
                   "notifier": "asyncio.sleep", "notifier_kwargs": {"delay": 0}}
        context = {
            "dag_run": {"dag_run_id": "run", "dag_id": "tests", "data_interval_start": keys[0]},
            "deadline": {"id": "d-1", "deadline_time": due.isoformat()},
        }
        return await callback(walsink=walsink, context=context)

    loop = asyncio.new_event_loop()
    loop.set_debug(True)  # its other checks (a coroutine never awaited, a call from another thread)
    loop.slow_callback_duration = 3600  # its wall-clock check: timed_run's replaces it
    alive_before = len(gc.get_objects())
    result = loop.run_until_complete(triggers() if what == "triggers" else deadline())
    # What a full collection scans now (frozen objects are not in any generation), and what is frozen.
    heap = {"before": alive_before, "scanned": len(gc.get_objects()), "frozen": gc.get_freeze_count()}
    loop.close()
    # To a file of its own: the triggers' log lines share stdout, flushed in no fixed order.
    with open(os.environ["WALSINK_TEST_RESULT"], "w") as out:
        json.dump({"result": result, "slow": slow, "heap": heap}, out)
    """
)


@pytest.fixture
def sealed(tmp_path):
    """Four SEALED checkpoints in a committer table, and the connection naming it."""
    url = f"sqlite:///{tmp_path}/committer.db"
    store = CommitterStore.from_url(url)
    layout = StagingLayout(tmp_path / "staging")
    for key in KEYS:
        files = {f"dt={key[:8]}/part-{i}.csv": f"{key},{i}\n".encode() * 1000 for i in range(3)}
        stage_checkpoint(store, layout, "p", key, files, durable=False)
    yield store, {"url": url, "staging_root": str(layout.root)}
    store.dispose()


def _triggerer(what: str, extra: dict, *args: str) -> dict:
    """Run the triggerer's part ``what`` in a cold interpreter; its result and slow callbacks."""
    result = Path(extra["staging_root"]).parent / f"{what}-result.json"
    env = {
        **os.environ,
        "AIRFLOW_CONN_WALSINK_DEFAULT": json.dumps({"conn_type": "walsink", "extra": extra}),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "WALSINK_TRIGGERER_GC_FREEZE": "1",  # a triggerer's default (the test session turns it off)
        "WALSINK_TEST_RESULT": str(result),
    }
    done = subprocess.run(
        [sys.executable, "-c", TRIGGERER, what, *args], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(result.read_text())


def test_durability_triggers_never_block_the_event_loop(sealed):
    """...nor make the triggerer's garbage collections scan the modules they import: a full
    collection stops the loop for as long as it scans every object of the process (0.3-0.4 s
    at N = 1,000 in benchmark 10, the only loop blocks over 0.2 s walsink's triggers made while
    firing), so after the first check everything alive is frozen (``watch.settle_heap``), once."""
    store, extra = sealed
    run = _triggerer("triggers", extra, *KEYS)
    assert run["slow"] == []
    assert [e["status"] for e in run["result"]] == ["durable"] * len(KEYS)
    assert {store.require("p", key).state.value for key in KEYS} == {"DURABLE"}
    heap = run["heap"]
    # Airflow's modules and walsink's (more than were alive before the triggers ran) are frozen,
    # and a collection now scans a small part of the process (what the later checks made).
    assert heap["frozen"] > heap["before"], heap
    assert heap["scanned"] < heap["frozen"] // 10, heap


def test_the_deadline_callback_never_blocks_the_event_loop(sealed):
    store, extra = sealed
    run = _triggerer("deadline", extra, "2026-01-01T00:00:00+00:00")
    assert run["slow"] == []
    assert (
        run["result"].startswith("notified (commit deadline ")
        and "p/20260101T000000Z SEALED" in run["result"]
    )
    assert store.require("p", "20260101T000000Z").commit_due_at is not None
