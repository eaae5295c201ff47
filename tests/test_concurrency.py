"""Concurrent committers on PostgreSQL, each in its own process (DESIGN.md invariants 1, 3, 5).

Every race starts its processes on a barrier so they hit the committer table
at the same moment; every test then checks the target row by row and the
committer table's history: exactly one publish per checkpoint, whoever wins.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import time
import traceback
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest

from airflow_provider_walsink.core.commit import CheckpointCommitter, CheckpointWriter
from airflow_provider_walsink.core.protocol.errors import NotDurableError
from airflow_provider_walsink.core.staging.durability import check_attempt
from airflow_provider_walsink.core.staging.layout import StagingLayout
from airflow_provider_walsink.core.store import (
    Actor,
    CommitterStore,
    LeaseHeldError,
    OrderingError,
    StaleAttemptError,
    TransitionError,
)
from airflow_provider_walsink.core.store.engine import create_committer_engine
from airflow_provider_walsink.core.targets import FilePublisher
from tests.helpers import stage_checkpoint

pytestmark = pytest.mark.slow
N = 6  # processes per race; the machine has 2 cores, so they really interleave
RETRYABLE = (LeaseHeldError, OrderingError)


def run_processes(fn: Callable[..., object], argsets: list[tuple], tmp: Path) -> list[object]:
    """Run ``fn(store, *args)`` in one forked process per argset, all released by one barrier."""
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(len(argsets))
    procs = []
    for i, args in enumerate(argsets):
        out = tmp / f"proc-{i}.json"

        def body(args=args, out=out) -> None:
            code = 1
            try:
                url = args[0]
                store = CommitterStore(create_committer_engine(url))  # never the parent's pool
                barrier.wait(60)
                out.write_text(json.dumps({"ok": fn(store, *args[1:])}))
                code = 0
            except BaseException:  # noqa: BLE001 - reported to the parent
                out.write_text(json.dumps({"error": traceback.format_exc()}))
            os._exit(code)

        proc = ctx.Process(target=body)
        proc.start()
        procs.append((proc, out))
    results = []
    for proc, out in procs:
        proc.join(240)
        assert not proc.is_alive(), "a committer process hung"
        result = json.loads(out.read_text())
        assert "error" not in result, result.get("error")
        results.append(result["ok"])
    return results


def commit_until_done(store, layout_root, target, mode, pipeline, keys, who, ttl_s=60.0):
    """One committer process: commit every key (in the given order), retrying as Airflow would."""
    layout = StagingLayout(layout_root)
    out = []
    pending = list(keys)
    deadline = time.monotonic() + 180
    while pending:
        assert time.monotonic() < deadline, f"{who}: no progress on {pending}"
        key = pending.pop(0)
        actor = Actor(name=f"{who}", dag_id="race", run_id=key, task_id="commit", try_number=1)
        committer = CheckpointCommitter(
            store,
            layout,
            FilePublisher(target, mode, layout=layout),
            mode=mode,
            owner=who,
            lease_ttl=timedelta(seconds=ttl_s),
        )
        try:
            summary = committer.commit(pipeline, key, actor=actor)
        except RETRYABLE:
            pending.append(key)  # Airflow: this try fails, a later try succeeds
            time.sleep(random.uniform(0.01, 0.05))
            continue
        out.append({"key": key, "already": summary.already_committed, "published": summary.published})
    return out


def data_rows(root: Path) -> Counter:
    rows: Counter = Counter()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(("_", "."))]
        for name in filenames:
            if not name.startswith(("_", ".")):
                rows.update((Path(dirpath) / name).read_text().splitlines())
    return rows


def committed_transitions(store, pipeline, key) -> int:
    return sum(1 for t in store.history(pipeline, key) if t.to_state == "COMMITTED")


@pytest.mark.parametrize("mode", ["append", "overwrite"])
def test_racing_committers_for_one_checkpoint_publish_it_once(pg_url, tmp_path, mode):
    store = CommitterStore.from_url(pg_url, migrate=False)
    layout = StagingLayout(tmp_path / "staging")
    target = tmp_path / "target"
    for race in range(3):
        key = f"r{race}"
        files = {f"dt={key}/part-{i}.csv": f"{key},{i},{j}\n".encode() for i in range(5) for j in [0]}
        stage_checkpoint(store, layout, "race", key, files, mode=mode)
        results = run_processes(
            commit_until_done,
            [(pg_url, layout.root, target, mode, "race", [key], f"committer-{i}") for i in range(N)],
            tmp_path,
        )
        outcomes = [r for per in results for r in per]
        assert len(outcomes) == N
        assert sum(1 for o in outcomes if not o["already"]) == 1, outcomes  # exactly one publish
        assert sum(o["published"] for o in outcomes) == 5
        assert committed_transitions(store, "race", key) == 1
    assert data_rows(target) == Counter(f"r{r},{i},0" for r in range(3) for i in range(5))
    store.dispose()


@pytest.mark.parametrize("via", ["direct", "pgbouncer"])
def test_racing_committers_for_different_checkpoints_of_one_pipeline(pg_url, tmp_path, via, request):
    """Six committers, each trying every checkpoint in its own order: each published once. Also
    through PgBouncer in transaction mode (docs/production.md, "PgBouncer"): the leases'
    compare-and-sets need no session of their own."""
    store = CommitterStore.from_url(pg_url, migrate=False)
    url = request.getfixturevalue("pgbouncer").url(pg_url) if via == "pgbouncer" else pg_url
    layout = StagingLayout(tmp_path / "staging")
    target = tmp_path / "target"
    keys = [f"d{i:02d}" for i in range(8)]
    expected: Counter = Counter()
    for key in keys:
        files = {f"dt={key}/part-{i}.csv": f"{key},{i}\n".encode() for i in range(3)}
        expected.update(line for data in files.values() for line in data.decode().splitlines())
        stage_checkpoint(store, layout, "many", key, files, mode="overwrite")
    argsets = []
    for i in range(N):
        order = keys[:]
        random.Random(i).shuffle(order)
        argsets.append((url, layout.root, target, "overwrite", "many", order, f"committer-{i}"))
    results = run_processes(commit_until_done, argsets, tmp_path)
    publishes = Counter(o["key"] for per in results for o in per if not o["already"])
    assert publishes == Counter(keys), publishes  # each checkpoint published by exactly one process
    assert data_rows(target) == expected
    for key in keys:
        assert committed_transitions(store, "many", key) == 1
    store.dispose()


def test_append_commits_keep_checkpoint_order_under_concurrency(pg_url, tmp_path):
    """Racing committers, each trying the checkpoints in a different order: they commit in sequence."""
    store = CommitterStore.from_url(pg_url, migrate=False)
    layout = StagingLayout(tmp_path / "staging")
    target = tmp_path / "target"
    keys = [f"a{i:02d}" for i in range(6)]
    offset = 0
    for key in keys:
        rows = [f"row{offset + j}" for j in range(4)]
        files = {
            "part-0.csv": ("\n".join(rows[:2]) + "\n").encode(),
            "part-1.csv": ("\n".join(rows[2:]) + "\n").encode(),
        }
        stage_checkpoint(
            store, layout, "log", key, files, mode="append",
            start_offsets={"src": offset}, end_offsets={"src": offset + 4},
        )  # fmt: skip
        offset += 4
    argsets = []
    for i in range(N):
        order = keys[:]
        random.Random(100 + i).shuffle(order)
        argsets.append((pg_url, layout.root, target, "append", "log", order, f"committer-{i}"))
    results = run_processes(commit_until_done, argsets, tmp_path)
    assert Counter(o["key"] for per in results for o in per if not o["already"]) == Counter(keys)
    records = [store.require("log", k) for k in keys]
    committed_order = [r.checkpoint_key for r in sorted(records, key=lambda r: r.committed_at)]
    assert committed_order == keys  # invariant 5: append commits in checkpoint order
    assert [r.sequence for r in records] == sorted(r.sequence for r in records)
    assert store.last_committed_offsets("log") == {"src": offset}
    assert data_rows(target) == Counter(f"row{j}" for j in range(offset))
    store.dispose()


def write_durable_commit(store, layout_root, target, pipeline, keys, run):
    """One DAG run (scheduled or backfill) of every key: write, verify, commit; cleared on failure."""
    layout = StagingLayout(layout_root)
    done = []
    for key in keys:
        for attempt_try in range(1, 40):
            actor = Actor(name=f"{run}#{attempt_try}", dag_id="bf", run_id=f"{run}-{key}", task_id="t")
            if store.is_committed(pipeline, key):
                done.append({"key": key, "already": True})
                break
            try:
                store.register(pipeline, key, mode="overwrite", actor=actor)
                writer = CheckpointWriter(store, layout, pipeline, key, actor=actor)
                attempt_dir = writer.begin()
                rows = [f"{key},{run},{writer.attempt},{j}" for j in range(5)]
                for i, chunk in enumerate((rows[:3], rows[3:])):
                    path = attempt_dir / f"dt={key}" / f"part-{i}.csv"
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text("".join(r + "\n" for r in chunk))
                writer.add_files([f"dt={key}/part-0.csv", f"dt={key}/part-1.csv"])
                manifest, _ = writer.seal(file_format="csv")
                report = check_attempt(layout, manifest, attempt_dir)
                assert report.durable, report.describe()
                store.mark_durable(pipeline, key, attempt=writer.attempt, actor=actor)
                committer = CheckpointCommitter(
                    store, layout, FilePublisher(target, "overwrite", layout=layout), mode="overwrite",
                    owner=actor.name, lease_ttl=timedelta(seconds=60),
                )  # fmt: skip
                summary = committer.commit(pipeline, key, actor=actor)
                done.append({"key": key, "already": summary.already_committed})
                break
            except (StaleAttemptError, TransitionError, NotDurableError, LeaseHeldError, FileNotFoundError):
                # The other run superseded or is committing this attempt: Airflow clears and retries.
                time.sleep(random.uniform(0.01, 0.05))
        else:
            raise AssertionError(f"{run}: {key} never committed")
    return done


def test_backfill_overlapping_scheduled_runs_commits_each_interval_once(pg_url, tmp_path):
    """A backfill and the scheduled runs write and commit the same intervals at the same time."""
    store = CommitterStore.from_url(pg_url, migrate=False)
    layout = StagingLayout(tmp_path / "staging")
    target = tmp_path / "target"
    keys = [f"i{i:02d}" for i in range(5)]
    runs = ["scheduled", "backfill", "backfill2"]
    results = run_processes(
        write_durable_commit,
        [
            (pg_url, layout.root, target, "bf", keys if i % 2 == 0 else keys[::-1], run)
            for i, run in enumerate(runs)
        ],
        tmp_path,
    )
    publishes = Counter(o["key"] for per in results for o in per if not o["already"])
    assert publishes == Counter(keys)
    visible = data_rows(target)
    for key in keys:
        record = store.require("bf", key)
        assert record.is_committed and committed_transitions(store, "bf", key) == 1
        rows = sorted(r for r in visible if r.startswith(f"{key},"))
        # One complete attempt of one run, never a mix: the sealed attempt's five rows.
        writers = {tuple(r.split(",")[1:3]) for r in rows}
        assert len(writers) == 1 and len(rows) == 5, rows
        assert int(next(iter(writers))[1]) == record.sealed_attempt
        assert all(visible[r] == 1 for r in rows)
    store.dispose()
