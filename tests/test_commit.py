"""The commit step and the file publisher: DESIGN.md invariants 1-4, 6 and 7."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import subprocess
import sys
import textwrap
from datetime import timedelta

import pytest

from airflow_provider_walsink.core.commit import CheckpointCommitter
from airflow_provider_walsink.core.commit.commit import collector_paused
from airflow_provider_walsink.core.protocol import CheckpointState as S
from airflow_provider_walsink.core.protocol import NotDurableError
from airflow_provider_walsink.core.store import Actor, CommitterStore
from airflow_provider_walsink.core.targets import FilePublisher
from tests.helpers import ACTOR, REPO, stage_checkpoint, target_files

DAY1 = {f"dt=2026-01-01/part-{i}.csv": f"2026-01-01,{i}\n".encode() * (i + 1) for i in range(4)}
DAY1_V2 = {"dt=2026-01-01/part-0.csv": b"2026-01-01,new\n" * 3}
DAY2 = {f"dt=2026-01-02/part-{i}.csv": f"2026-01-02,{i}\n".encode() for i in range(2)}


def make_committer(store, layout, target, mode, **kw):
    return CheckpointCommitter(store, layout, FilePublisher(target, mode, layout=layout), mode=mode, **kw)


def rows(files: dict[str, bytes]) -> list[bytes]:
    return sorted(line for data in files.values() for line in data.splitlines())


@pytest.mark.parametrize("mode", ["append", "overwrite"])
def test_commit_publishes_once_and_a_rerun_is_a_noop(store, layout, tmp_path, mode):
    target = tmp_path / "target"
    stage_checkpoint(store, layout, "p", "k1", DAY1, mode=mode)
    committer = make_committer(store, layout, target, mode)
    summary = committer.commit("p", "k1", actor=ACTOR)
    assert summary.published == 4 and not summary.already_committed
    assert rows(target_files(target)) == rows(DAY1)
    assert not layout.checkpoint_dir("p", "k1").exists()  # the WAL is deleted after COMMITTED
    before = {p: os.stat(target / p).st_mtime_ns for p in target_files(target)}
    history_len = len(store.history("p", "k1"))

    again = committer.commit("p", "k1", actor=ACTOR)

    assert again.already_committed and again.published == 0
    assert {p: os.stat(target / p).st_mtime_ns for p in target_files(target)} == before
    assert len(store.history("p", "k1")) == history_len  # invariant 4: no transition either


def test_overwrite_replaces_the_partition_and_keeps_others(sqlite_store, layout, tmp_path):
    target = tmp_path / "target"
    committer = make_committer(sqlite_store, layout, target, "overwrite")
    stage_checkpoint(sqlite_store, layout, "p", "k1", DAY1)
    stage_checkpoint(sqlite_store, layout, "p", "k2", DAY2)
    committer.commit("p", "k1", actor=ACTOR)
    committer.commit("p", "k2", actor=ACTOR)
    # The same interval written again as a new version replaces its partition only.
    stage_checkpoint(sqlite_store, layout, "p", "k1-v2", DAY1_V2)
    summary = committer.commit("p", "k1-v2", actor=ACTOR)
    assert summary.partitions_replaced == ["dt=2026-01-01"]
    assert rows(target_files(target)) == rows({**DAY1_V2, **DAY2})


def test_append_keeps_earlier_checkpoints(sqlite_store, layout, tmp_path):
    target = tmp_path / "target"
    committer = make_committer(sqlite_store, layout, target, "append")
    stage_checkpoint(sqlite_store, layout, "p", "k1", DAY1, mode="append")
    stage_checkpoint(sqlite_store, layout, "p", "k2", DAY1_V2, mode="append")
    committer.commit("p", "k1", actor=ACTOR)
    committer.commit("p", "k2", actor=ACTOR)
    assert rows(target_files(target)) == sorted(rows(DAY1) + rows(DAY1_V2))


def test_not_durable_says_what_is_missing(sqlite_store, layout, tmp_path):
    target = tmp_path / "target"
    committer = make_committer(sqlite_store, layout, target, "overwrite")
    sqlite_store.register("p", "k0", mode="overwrite", actor=ACTOR)
    with pytest.raises(NotDurableError, match="write phase has not started"):
        committer.commit("p", "k0", actor=ACTOR)
    stage_checkpoint(sqlite_store, layout, "p", "k1", DAY1, durable=False)
    with pytest.raises(NotDurableError, match="4 committables have not been verified"):
        committer.commit("p", "k1", actor=ACTOR)
    assert not target.exists()


def test_only_the_sealed_attempt_is_published(sqlite_store, layout, tmp_path):
    """Invariant 2: a later attempt supersedes an earlier sealed one; the earlier is garbage."""
    target = tmp_path / "target"
    stage_checkpoint(sqlite_store, layout, "p", "k1", DAY1)
    second, _, second_dir = stage_checkpoint(sqlite_store, layout, "p", "k1", DAY1_V2)
    assert second_dir.name == f"attempt-2-{second.attempt_id}"  # staging names carry the attempt's identity
    make_committer(sqlite_store, layout, target, "overwrite").commit("p", "k1", actor=ACTOR)
    assert rows(target_files(target)) == rows(DAY1_V2)
    assert not layout.checkpoint_dir("p", "k1").exists()


KILL_AFTER = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {repo!r})
    from airflow_provider_walsink.core.commit import CheckpointCommitter
    from airflow_provider_walsink.core.store import CommitterStore, Actor
    from airflow_provider_walsink.core.staging.layout import StagingLayout
    from airflow_provider_walsink.core.targets import FilePublisher, files
    url, staging, target, mode, kill_after = sys.argv[1:6]
    moved = [0]
    real_move = files.fsops._move
    def move_then_maybe_die(*args):
        if moved[0] == int(kill_after):
            os.kill(os.getpid(), signal.SIGKILL)  # a crash in the middle of the publish
        real_move(*args)
        moved[0] += 1
    files.fsops._move = move_then_maybe_die
    store = CommitterStore.from_url(url)
    layout = StagingLayout(staging)
    from datetime import timedelta
    committer = CheckpointCommitter(store, layout, FilePublisher(target, mode, layout=layout), mode=mode,
                                    owner="doomed", lease_ttl=timedelta(seconds=float(sys.argv[6])))
    committer.commit("p", "k1", actor=Actor(name="doomed"))
""")


@pytest.mark.parametrize("mode", ["append", "overwrite"])
@pytest.mark.parametrize("kill_after", [0, 2])
def test_commit_killed_mid_publish_then_rerun_has_no_duplicate_and_no_loss(
    db_url, layout, tmp_path, mode, kill_after
):
    """Invariants 1 and 3: SIGKILL after k of n committables; the lease expires; a rerun finishes."""
    store = CommitterStore.from_url(db_url)
    target = tmp_path / "target"
    stage_checkpoint(store, layout, "p", "k1", DAY1, mode=mode)
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            KILL_AFTER.format(repo=str(REPO)),
            db_url,
            str(layout.root),
            str(target),
            mode,
            str(kill_after),
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -9, proc.stderr
    crashed = store.require("p", "k1")
    assert crashed.state is S.COMMITTING and crashed.lease_owner == "doomed"
    if mode == "append":
        assert len(target_files(target)) == kill_after  # partly published, not yet committed

    # Before the lease expires, nobody else may publish.
    rescuer = make_committer(store, layout, target, mode, owner="rescuer", lease_ttl=timedelta(minutes=1))
    import time

    deadline = time.monotonic() + 30
    while True:
        try:
            summary = rescuer.commit("p", "k1", actor=Actor(name="rescuer"))
            break
        except Exception as exc:  # LeaseHeldError until the dead committer's lease expires
            assert "being committed by doomed" in str(exc)
            assert time.monotonic() < deadline
            time.sleep(0.3)
    assert summary.lease_taken_over_from == "doomed"
    assert rows(target_files(target)) == rows(DAY1)
    assert len(target_files(target)) == len(DAY1)
    assert store.require("p", "k1").state is S.COMMITTED
    store.dispose()


RACER = textwrap.dedent("""
    import json, sys, time
    sys.path.insert(0, {repo!r})
    from airflow_provider_walsink.core.commit import CheckpointCommitter
    from airflow_provider_walsink.core.store import CommitterStore, Actor
    from airflow_provider_walsink.core.staging.layout import StagingLayout
    from airflow_provider_walsink.core.targets import FilePublisher
    url, staging, target, mode, name, start_at = sys.argv[1:7]
    store = CommitterStore.from_url(url)
    layout = StagingLayout(staging)
    committer = CheckpointCommitter(store, layout, FilePublisher(target, mode, layout=layout), mode=mode, owner=name)
    while time.time() < float(start_at):
        time.sleep(0.001)
    try:
        s = committer.commit("p", "k1", actor=Actor(name=name))
        print(json.dumps({{"published": s.published, "already": s.already_committed}}))
    except Exception as e:
        print(json.dumps({{"error": type(e).__name__ + ": " + str(e)}}))
""")


@pytest.mark.parametrize("mode", ["append", "overwrite"])
def test_committers_in_separate_processes_racing_on_postgres_publish_exactly_once(
    pg_url, layout, tmp_path, mode
):
    import time

    store = CommitterStore.from_url(pg_url)
    target = tmp_path / "target"
    stage_checkpoint(store, layout, "p", "k1", DAY1, mode=mode)
    start_at = time.time() + 4
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                RACER.format(repo=str(REPO)),
                pg_url,
                str(layout.root),
                str(target),
                mode,
                f"racer-{i}",
                str(start_at),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    winners = [r for r in results if "published" in r and not r["already"]]
    assert sum(r.get("published", 0) for r in results) == len(DAY1)
    assert len(winners) == 1
    assert all("LeaseHeldError" in r["error"] for r in results if "error" in r)
    assert rows(target_files(target)) == rows(DAY1)
    history = store.history("p", "k1")
    assert [h.to_state for h in history].count("COMMITTED") == 1
    assert [h.to_state for h in history].count("COMMITTING") == 1
    store.dispose()


@pytest.mark.parametrize("already", [False, True], ids=["fresh commit", "answered no-op"])
def test_a_clean_up_that_fails_never_fails_a_recorded_commit(sqlite_store, layout, tmp_path, caplog, already):
    """After COMMITTED the clean-up is best effort: a table or catalog that cannot be read then
    (64 tasks over PostgreSQL's connection limit: pyiceberg's SQL catalog raised
    OperationalError) leaves the staging to GC, and the task still answers COMMITTED."""
    target = tmp_path / "target"
    stage_checkpoint(sqlite_store, layout, "p", "k1", DAY1)
    committer = make_committer(sqlite_store, layout, target, "overwrite")
    if already:
        failing = make_committer(sqlite_store, layout, target, "overwrite")
        failing.publisher.finish = lambda *a, **k: None  # the first commit left its staging
        failing.commit("p", "k1", actor=ACTOR)

    def unreachable(*args, **kwargs):
        raise RuntimeError("catalog unreachable: too many clients already")

    committer.publisher.finish = unreachable
    summary = committer.commit("p", "k1", actor=ACTOR)

    assert summary.already_committed is already
    assert sqlite_store.require("p", "k1").state is S.COMMITTED
    assert rows(target_files(target)) == rows(DAY1)
    assert layout.checkpoint_dir("p", "k1").exists()  # left whole, for GC
    assert "not fully removed (GC will): catalog unreachable" in caplog.text


@pytest.mark.parametrize("fails", [False, True], ids=["published", "publish_raises"])
def test_a_publish_runs_with_the_cycle_collector_paused_and_leaves_it_as_it_was(
    sqlite_store, layout, tmp_path, fails
):
    """The cyclic collector is off while the committables are read and published (a full
    collection per commit of 10,000 files otherwise, benchmark 2), and on again afterwards,
    also when the publish raises; a collector the caller had turned off stays off."""
    stage_checkpoint(sqlite_store, layout, "p", "k1", DAY1)
    committer = make_committer(sqlite_store, layout, tmp_path / "target", "overwrite")
    seen = []
    publish = committer.publisher.publish

    def watched(*args, **kwargs):
        seen.append(gc.isenabled())
        if fails:
            raise OSError("disk full")
        return publish(*args, **kwargs)

    committer.publisher.publish = watched
    assert gc.isenabled()
    with pytest.raises(OSError) if fails else contextlib.nullcontext():
        committer.commit("p", "k1", actor=ACTOR)
    assert seen == [False]
    assert gc.isenabled()

    gc.disable()
    try:
        with collector_paused(), collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the caller's choice stands
    finally:
        gc.enable()
