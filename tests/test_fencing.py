"""Fencing: a committer that lost its lease never touches the target again (issue 11).

One test per symptom the issue lists, on every committer database where the
database matters: zombie tries (a second try while the first still runs,
SIGSTOPped past its lease), clients with a fast clock, a stale write try,
re-runs after retention, odd target layouts, long ids and OS errors, and
overwrite order.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from datetime import datetime, timedelta

import pytest
from sqlalchemy import delete

from airflow_provider_walsink.core.commit import CheckpointCommitter
from airflow_provider_walsink.core.protocol import CheckpointState as S
from airflow_provider_walsink.core.protocol.errors import (
    FencedError,
    InvalidIdentifierError,
    LayoutError,
    OrderError,
    SymlinkRefusedError,
)
from airflow_provider_walsink.core.store import Actor, CommitterStore
from airflow_provider_walsink.core.store import abort_transitions as abort_transitions_module
from airflow_provider_walsink.core.store import leases as leases_module
from airflow_provider_walsink.core.store import lifecycle as lifecycle_module
from airflow_provider_walsink.core.store import records as records_module
from airflow_provider_walsink.core.store import store as store_module
from airflow_provider_walsink.core.store import transitions as transitions_module
from airflow_provider_walsink.core.store import verdicts as verdicts_module
from airflow_provider_walsink.core.store.models import checkpoint_table, pipeline_table, transition_table
from airflow_provider_walsink.core.store.store import LeaseHeldError
from airflow_provider_walsink.core.targets import FilePublisher
from airflow_provider_walsink.core.targets import files as files_module
from tests.helpers import ACTOR, REPO, stage_checkpoint, target_files

DAY1 = {f"dt=2026-01-01/part-{i}.csv": f"2026-01-01,{i}\n".encode() * (i + 1) for i in range(4)}
# Byte for byte the same sizes as DAY1, other rows.
DAY1_NEW = {f"dt=2026-01-01/part-{i}.csv": f"2026-01-01,{'abcd'[i]}\n".encode() * (i + 1) for i in range(4)}


def committer(store, layout, target, mode, **kw) -> CheckpointCommitter:
    publisher_kw = {k: kw.pop(k) for k in ("partition_by", "allow_older_overwrite") if k in kw}
    return CheckpointCommitter(
        store, layout, FilePublisher(target, mode, layout=layout, **publisher_kw), mode=mode, **kw
    )


def try_actor(try_number: int) -> Actor:
    """One Airflow task's try: same dag, task and run for every try, as Airflow names them."""
    return Actor(name="dag.commit@run1", dag_id="dag", run_id="run1", task_id="commit", try_number=try_number)


def lines(files: dict[str, bytes]) -> list[bytes]:
    return sorted(line for data in files.values() for line in data.splitlines())


# A committer process that stops itself (SIGSTOP, as a paused VM or a stalled mount
# would) after moving ``stop_after`` committables; the test resumes it later.
STOPPING_COMMITTER = textwrap.dedent("""
    import os, signal, sys
    from datetime import timedelta
    sys.path.insert(0, {repo!r})
    from airflow_provider_walsink.core.store import Actor, CommitterStore
    from airflow_provider_walsink.core.commit import CheckpointCommitter
    from airflow_provider_walsink.core.staging.layout import StagingLayout
    from airflow_provider_walsink.core.targets import FilePublisher, files
    url, staging, target, mode, stop_after, ttl = sys.argv[1:7]
    moved = [0]
    real_move = files.fsops._move
    def move_then_stop(*args):
        if moved[0] == int(stop_after):
            os.kill(os.getpid(), signal.SIGSTOP)
        real_move(*args)
        moved[0] += 1
    files.fsops._move = move_then_stop
    store = CommitterStore.from_url(url)
    layout = StagingLayout(staging)
    committer = CheckpointCommitter(store, layout, FilePublisher(target, mode, layout=layout), mode=mode,
                                    lease_ttl=timedelta(seconds=float(ttl)))
    actor = Actor(name="dag.commit@run1", dag_id="dag", run_id="run1", task_id="commit", try_number=1)
    committer.commit("p", "k1", actor=actor)
""")


def start_stopping_committer(db_url, layout, target, mode, *, stop_after=1, ttl=1.0) -> subprocess.Popen:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            STOPPING_COMMITTER.format(repo=str(REPO)),
            db_url,
            str(layout.root),
            str(target),
            mode,
            str(stop_after),
            str(ttl),
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while _state_of(proc.pid) != "T":
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, "the committer never reached its stop"
        time.sleep(0.05)
    return proc


def _state_of(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rpartition(")")[2].split()[0]


# ----------------------------------------------------------------------------- 1. identity per try


@pytest.mark.parametrize("mode", ["append", "overwrite"])
def test_a_second_try_does_not_adopt_the_first_tries_live_lease(db_url, layout, tmp_path, mode):
    """Symptom 1: try 2 of a commit task while try 1 still runs (and holds a live lease)."""
    store = CommitterStore.from_url(db_url)
    target = tmp_path / "target"
    stage_checkpoint(store, layout, "p", "k1", DAY1, mode=mode)
    zombie = start_stopping_committer(db_url, layout, target, mode, stop_after=1, ttl=600)
    try:
        before = target_files(target)
        with pytest.raises(LeaseHeldError, match="being committed by"):
            committer(store, layout, target, mode).commit("p", "k1", actor=try_actor(2))
        assert target_files(target) == before  # try 2 published nothing
        assert store.require("p", "k1").state is S.COMMITTING
    finally:
        zombie.kill()
        zombie.wait()


def test_a_client_with_a_fast_clock_does_not_take_a_live_lease(store, layout, monkeypatch):
    """Symptom 1: lease expiry is judged on the database's clock, never the client's."""
    stage_checkpoint(store, layout, "p", "k1", DAY1)
    store.acquire_lease("p", "k1", owner="c1", ttl=timedelta(minutes=10), actor=ACTOR, mode="overwrite")

    class FastClock(datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime.now(tz) + timedelta(hours=2)

    # Every module the store's code lives in, so no part of it can read the client's clock.
    for module in (
        store_module,
        transitions_module,
        lifecycle_module,
        verdicts_module,
        leases_module,
        abort_transitions_module,
        records_module,
    ):
        if hasattr(module, "datetime"):
            monkeypatch.setattr(module, "datetime", FastClock)
    fast = CommitterStore(store.engine)
    with pytest.raises(LeaseHeldError):
        fast.acquire_lease("p", "k1", owner="c2", ttl=timedelta(minutes=10), actor=ACTOR, mode="overwrite")
    assert store.require("p", "k1").lease_owner == "c1"


# ----------------------------------------------------------------------------- 2. zombies


@pytest.mark.parametrize("mode", ["append", "overwrite"])
def test_a_zombie_committer_resumed_after_a_takeover_changes_nothing(db_url, layout, tmp_path, mode):
    """Symptom 2: SIGSTOPped past its TTL, taken over, then SIGCONTed: it stops before its next step."""
    store = CommitterStore.from_url(db_url)
    target = tmp_path / "target"
    stage_checkpoint(store, layout, "p", "k1", DAY1, mode=mode)
    zombie = start_stopping_committer(db_url, layout, target, mode, stop_after=1, ttl=1.0)
    try:
        time.sleep(1.5)  # past the zombie's lease
        summary = committer(store, layout, target, mode).commit("p", "k1", actor=try_actor(2))
        assert summary.state == "COMMITTED" and summary.lease_taken_over_from
        committed = target_files(target)
        assert lines(committed) == lines(DAY1)
        os.kill(zombie.pid, signal.SIGCONT)
        _, err = zombie.communicate(timeout=60)
    finally:
        if zombie.poll() is None:
            zombie.kill()
    assert zombie.returncode != 0 and ("FencedError" in err or "LeaseLostError" in err), err
    assert target_files(target) == committed  # not one file moved, replaced or deleted
    assert not (target / "_walsink" / "journal" / "p" / "k1.json").exists()  # no journal rewritten
    record = store.require("p", "k1")
    assert record.state is S.COMMITTED
    assert any("fenced out" in (h.detail or "") for h in store.history("p", "k1"))


def test_a_slow_publish_keeps_its_lease_alive(store, layout, tmp_path, monkeypatch):
    """Symptom 2: the overwrite move loop renews (fences) the lease, so a slow mount is not taken over."""
    target = tmp_path / "target"
    stage_checkpoint(store, layout, "p", "k1", DAY1)
    ttl = timedelta(seconds=1.5)
    real_move = files_module.fsops._move

    def slow_move(*args):
        time.sleep(0.6)  # four moves: 2.4 s in all, longer than the TTL
        real_move(*args)

    monkeypatch.setattr(files_module.fsops, "_move", slow_move)
    result: dict = {}
    slow = threading.Thread(
        target=lambda: result.update(
            summary=committer(store, layout, target, "overwrite", lease_ttl=ttl).commit(
                "p", "k1", actor=ACTOR
            )
        )
    )
    slow.start()
    while store.require("p", "k1").state is not S.COMMITTING:  # the slow committer holds the lease
        time.sleep(0.01)
    taken = []
    while slow.is_alive():
        try:
            store.acquire_lease("p", "k1", owner="rival", ttl=ttl, actor=ACTOR, mode="overwrite")
            taken.append(True)
            break
        except LeaseHeldError:
            pass
        except Exception:  # noqa: BLE001 - COMMITTED meanwhile: the race is over
            break
        time.sleep(0.05)
    slow.join()
    assert not taken, "another committer took the lease of a publish still in progress"
    assert result["summary"].state == "COMMITTED"


# ----------------------------------------------------------------------------- 3. owned failures


def test_a_stale_write_try_cannot_fail_a_checkpoint_being_committed(store, layout):
    """Symptom 3: a write try that fails late records its error but does not reset the checkpoint."""
    record, _, _ = stage_checkpoint(store, layout, "p", "k1", DAY1)
    lease = store.acquire_lease(
        "p", "k1", owner="c1", ttl=timedelta(minutes=5), actor=ACTOR, mode="overwrite"
    )
    store.fail("p", "k1", error="write attempt 1: spark-submit died", actor=ACTOR, attempt=record.attempt)
    store.fail("p", "k1", error="no owner at all", actor=ACTOR)
    after = store.require("p", "k1")
    assert after.state is S.COMMITTING and after.lease_owner == "c1" and after.lease_epoch == lease.epoch
    assert "spark-submit died" in store.history("p", "k1")[-2].detail
    assert store.mark_committed(lease, actor=ACTOR).state is S.COMMITTED


def test_a_write_try_fails_only_its_own_attempt(store, layout):
    first, _, _ = stage_checkpoint(store, layout, "p", "k1", DAY1, durable=False)
    newer = store.start_attempt("p", "k1", actor=ACTOR)  # try 2 started while try 1 still ran
    store.fail("p", "k1", error="try 1 failed late", actor=ACTOR, attempt=first.attempt)
    after = store.require("p", "k1")
    assert after.state is S.WRITING and after.attempt == newer.attempt and after.error is None
    store.fail("p", "k1", error="try 2 failed", actor=ACTOR, attempt=newer.attempt)
    assert store.require("p", "k1").state is S.FAILED


# ----------------------------------------------------------------------------- 4. re-runs after retention


def _forget_checkpoint(store, pipeline: str, key: str) -> None:
    """What retention does to an old checkpoint's rows (and a restore from an old backup, worse)."""
    record = store.require(pipeline, key)
    with store.engine.begin() as conn:
        conn.execute(delete(transition_table).where(transition_table.c.checkpoint_id == record.id))
        conn.execute(delete(checkpoint_table).where(checkpoint_table.c.id == record.id))
        conn.execute(delete(pipeline_table).where(pipeline_table.c.name == pipeline))


def test_overwrite_rerun_after_retention_publishes_the_new_data(store, layout, tmp_path):
    """Symptom 4: the old partition marker must not look like the new attempt's own."""
    target = tmp_path / "target"
    stage_checkpoint(store, layout, "p", "k1", DAY1)
    committer(store, layout, target, "overwrite").commit("p", "k1", actor=ACTOR)
    _forget_checkpoint(store, "p", "k1")
    stage_checkpoint(store, layout, "p", "k1", DAY1_NEW)  # the same attempt number, 1, again
    summary = committer(store, layout, target, "overwrite").commit("p", "k1", actor=ACTOR)
    assert summary.published == 4
    assert lines(target_files(target)) == lines(DAY1_NEW)


def test_append_rerun_after_retention_is_not_mistaken_for_same_sized_files(store, layout, tmp_path):
    """Symptom 4: "already published" is decided by identity, never by a file's size."""
    target = tmp_path / "target"
    stage_checkpoint(store, layout, "p", "k1", DAY1, mode="append", end_offsets={"f": 1})
    committer(store, layout, target, "append").commit("p", "k1", actor=ACTOR)
    _forget_checkpoint(store, "p", "k1")
    assert all(len(a) == len(b) for a, b in zip(DAY1.values(), DAY1_NEW.values(), strict=True))
    stage_checkpoint(store, layout, "p", "k1", DAY1_NEW, mode="append", end_offsets={"f": 2})
    summary = committer(store, layout, target, "append").commit("p", "k1", actor=ACTOR)
    assert summary.published == 4 and summary.already_published == 0
    assert lines(target_files(target)) == sorted(lines(DAY1) + lines(DAY1_NEW))
    assert store.last_committed_offsets("p") == {"f": 2}


# ----------------------------------------------------------------------------- 5. layouts


def test_nested_partitions_under_a_declared_column_fail_before_the_target_changes(store, layout, tmp_path):
    """Symptom 5: a job writing dt=.../hour=... for a pipeline that declares dt."""
    target = tmp_path / "target"
    (target / "dt=2026-01-01").mkdir(parents=True)
    (target / "dt=2026-01-01" / "old.csv").write_bytes(b"old\n")
    nested = {"dt=2026-01-01/hour=5/part-0.csv": b"new\n"}
    stage_checkpoint(store, layout, "p", "k1", nested)
    with pytest.raises(LayoutError, match="declares"):
        committer(store, layout, target, "overwrite", partition_by=["dt"]).commit("p", "k1", actor=ACTOR)
    assert target_files(target) == {"dt=2026-01-01/old.csv": b"old\n"}
    record = store.require("p", "k1")
    assert record.state is S.FAILED and "partition" in record.error and record.lease_owner is None


@pytest.mark.parametrize("mode", ["append", "overwrite"])
def test_a_symlinked_partition_in_the_target_is_refused_and_its_twin_kept(store, layout, tmp_path, mode):
    """Symptom 5: dt=2 is a link to dt=1; a commit of dt=2 must not replace or delete dt=1."""
    target = tmp_path / "target"
    (target / "dt=1").mkdir(parents=True)
    (target / "dt=1" / "keep.csv").write_bytes(b"keep\n")
    os.symlink(target / "dt=1", target / "dt=2")
    stage_checkpoint(store, layout, "p", "k1", {"dt=2/part-0.csv": b"two\n"}, mode=mode)
    with pytest.raises(SymlinkRefusedError, match="symlink"):
        committer(store, layout, target, mode).commit("p", "k1", actor=ACTOR)
    assert sorted(os.listdir(target / "dt=1")) == ["keep.csv"]
    assert (target / "dt=2").is_symlink()
    assert store.require("p", "k1").state is S.FAILED


def test_a_link_swapped_in_after_planning_cannot_redirect_the_swap(store, layout, tmp_path, monkeypatch):
    """Symptom 5: the partition becomes a link between the plan and the rename."""
    target = tmp_path / "target"
    (target / "dt=1").mkdir(parents=True)
    (target / "dt=1" / "keep.csv").write_bytes(b"keep\n")
    (target / "dt=2").mkdir()
    stage_checkpoint(store, layout, "p", "k1", {"dt=2/part-0.csv": b"two\n"})
    real_swap = files_module.fsops._swap_in

    def swap_after_an_attack(*args):
        os.rmdir(target / "dt=2")
        os.symlink(target / "dt=1", target / "dt=2")
        real_swap(*args)

    monkeypatch.setattr(files_module.fsops, "_swap_in", swap_after_an_attack)
    with pytest.raises(SymlinkRefusedError):
        committer(store, layout, target, "overwrite").commit("p", "k1", actor=ACTOR)
    assert sorted(os.listdir(target / "dt=1")) == ["keep.csv"]


# ----------------------------------------------------------------------------- 6. limits and OS errors


def test_the_longest_valid_ids_publish(store, layout, tmp_path):
    """Symptom 6: 128-character pipeline ids and keys fit every staging and target path."""
    pipeline, key = "p" * 128, "k" * 128
    target = tmp_path / "target"
    stage_checkpoint(store, layout, pipeline, key, DAY1)
    summary = committer(store, layout, target, "overwrite").commit(pipeline, key, actor=ACTOR)
    assert summary.state == "COMMITTED"
    assert lines(target_files(target)) == lines(DAY1)


def test_ids_too_long_fail_when_the_dag_is_parsed():
    from airflow_provider_walsink.operators.commit import WalCommitOperator

    with pytest.raises(InvalidIdentifierError, match="1-128 characters"):
        WalCommitOperator(task_id="c", pipeline="p" * 129, target="/tmp/t")
    WalCommitOperator(task_id="c", pipeline="{{ params.p }}", target="/tmp/t")  # checked when rendered


def test_an_os_error_while_publishing_is_recorded_and_releases_the_lease(
    store, layout, tmp_path, monkeypatch
):
    """Symptom 6: never a COMMITTING checkpoint left without an error."""
    target = tmp_path / "target"
    stage_checkpoint(store, layout, "p", "k1", DAY1)

    def no_space(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files_module.fsops, "_move", no_space)
    with pytest.raises(OSError):
        committer(store, layout, target, "overwrite").commit("p", "k1", actor=ACTOR)
    record = store.require("p", "k1")
    assert record.state is S.FAILED and record.lease_owner is None
    assert "No space left on device" in record.error
    monkeypatch.undo()
    assert committer(store, layout, target, "overwrite").commit("p", "k1", actor=ACTOR).state == "COMMITTED"
    assert lines(target_files(target)) == lines(DAY1)


# ----------------------------------------------------------------------------- 7. overwrite order


def test_an_older_checkpoint_never_rolls_a_partition_back(store, layout, tmp_path):
    """Symptom 7 / invariant 10: a late retry of an older key over a newer one is refused."""
    target = tmp_path / "target"
    newer = {"dt=2026-01-01/part-0.csv": b"newer\n"}
    older = {"dt=2026-01-01/part-0.csv": b"older\n"}
    stage_checkpoint(store, layout, "p", "20260101T000000Z-v2", newer)
    stage_checkpoint(store, layout, "p", "20260101T000000Z", older)
    committer(store, layout, target, "overwrite").commit("p", "20260101T000000Z-v2", actor=ACTOR)
    with pytest.raises(OrderError, match="newer checkpoint"):
        committer(store, layout, target, "overwrite").commit("p", "20260101T000000Z", actor=ACTOR)
    assert lines(target_files(target)) == [b"newer"]
    record = store.require("p", "20260101T000000Z")
    assert record.state is S.FAILED and "newer checkpoint" in record.error
    # Asked for explicitly, the roll-back happens.
    explicit = committer(store, layout, target, "overwrite", allow_older_overwrite=True)
    assert explicit.commit("p", "20260101T000000Z", actor=ACTOR).state == "COMMITTED"
    assert lines(target_files(target)) == [b"older"]


def test_fenced_error_is_what_a_stale_lease_gets(store, layout):
    stage_checkpoint(store, layout, "p", "k1", DAY1)
    ttl = timedelta(milliseconds=50)
    old = store.acquire_lease("p", "k1", owner="a", ttl=ttl, actor=ACTOR, mode="overwrite")
    time.sleep(0.1)
    new = store.acquire_lease("p", "k1", owner="b", ttl=timedelta(minutes=1), actor=ACTOR, mode="overwrite")
    assert new.epoch > old.epoch
    for call in (lambda: store.fence(old, ttl), lambda: store.mark_committed(old, actor=ACTOR)):
        with pytest.raises(FencedError, match="epoch"):
            call()
    store.release_lease(old)  # a stale release changes nothing
    assert store.require("p", "k1").lease_owner == "b"
