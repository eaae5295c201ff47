"""Aborting a checkpoint (issue 15): the committer holding it is fenced out, even alive; the
abort never lies about a checkpoint the target holds; what the aborted attempt published
is rolled back; a later run starts a fresh attempt and commits once.

The central test runs real processes: a committer child stopped (SIGSTOP at a crash point)
mid-publish while its lease is live, ``walsink abort`` as a subprocess, then SIGCONT.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from datetime import timedelta
from pathlib import Path

import pytest

from airflow_provider_walsink.core import faults
from airflow_provider_walsink.core.commit import CheckpointCommitter
from airflow_provider_walsink.core.commit.abort import AbortRefusedError, CheckpointAborter
from airflow_provider_walsink.core.protocol import CheckpointState as S
from airflow_provider_walsink.core.store import Actor, CommitterStore
from airflow_provider_walsink.core.targets import FilePublisher
from airflow_provider_walsink.core.targets import files as files_module
from airflow_provider_walsink.core.targets.base import StaticContext
from tests.helpers import ACTOR, REPO, stage_checkpoint, target_files

DAY = {f"dt=2026-01-01/part-{i}.csv": f"2026-01-01,{i}\n".encode() * (i + 1) for i in range(4)}
DAY_NEW = {f"dt=2026-01-01/part-{i}.csv": f"2026-01-01,{'abcd'[i]}\n".encode() * (i + 1) for i in range(4)}
REASON = "INC-7: upstream file corrupt"
USER = Actor(name="oncall@host (walsink abort)")


def lines(files: dict[str, bytes]) -> list[bytes]:
    return sorted(line for data in files.values() for line in data.splitlines())


def everything(root: Path) -> dict[str, bytes]:
    """Every file under ``root``, bookkeeping (journal, markers, pending) included."""
    return (
        {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
        if root.exists()
        else {}
    )


def by_partition(root: Path) -> dict[str, list[bytes]]:
    out: dict[str, list[bytes]] = {}
    for rel, data in target_files(root).items():
        out.setdefault(rel.rpartition("/")[0], []).extend(data.splitlines())
    return {k: sorted(v) for k, v in out.items()}


def committer(store, layout, target, mode, **kw) -> CheckpointCommitter:
    return CheckpointCommitter(store, layout, FilePublisher(target, mode, layout=layout), mode=mode, **kw)


def aborter(store, layout, target, mode) -> CheckpointAborter:
    # No holder runs in these in-process tests: nothing to wait for.
    return CheckpointAborter(store, layout, FilePublisher(target, mode, layout=layout), sleep=lambda s: None)


def walsink(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), full_env.get("PYTHONPATH")]))
    full_env.pop("WALSINK_DATABASE_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "airflow_provider_walsink.cli.commands", *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=REPO,
        timeout=300,
    )


# A commit task's process: the real committer with a live 10-minute lease, stopped by the
# crash point (WALSINK_CRASH_SIGNAL=STOP) after moving two committables.
COMMITTER = textwrap.dedent("""
    import sys
    from datetime import timedelta
    sys.path.insert(0, {repo!r})
    from airflow_provider_walsink.core.store import Actor, CommitterStore
    from airflow_provider_walsink.core.commit import CheckpointCommitter
    from airflow_provider_walsink.core.staging.layout import StagingLayout
    from airflow_provider_walsink.core.targets.registry import TargetOptions, resolve_target
    url, staging, target, mode, pipeline = sys.argv[1:6]
    store = CommitterStore.from_url(url)
    layout = StagingLayout(staging)
    publisher = resolve_target(target, TargetOptions(mode=mode, layout=layout))
    committer = CheckpointCommitter(store, layout, publisher, mode=mode, lease_ttl=timedelta(minutes=10))
    actor = Actor(name="dag.commit@run1", dag_id="dag", run_id="run1", task_id="commit", try_number=1)
    committer.commit(pipeline, "k1", actor=actor)
""")


def start_stopped_committer(
    db_url: str,
    layout,
    target: Path | str,
    mode: str,
    point: str,
    env: dict[str, str] | None = None,
    pipeline: str = "p",
) -> subprocess.Popen:
    env = {**os.environ, **(env or {}), faults.ENV: point, faults.SIGNAL_ENV: "STOP"}
    proc = subprocess.Popen(
        [sys.executable, "-c", COMMITTER.format(repo=str(REPO)), db_url, str(layout.root), str(target), mode]
        + [pipeline],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    deadline = time.monotonic() + 120
    while _state_of(proc.pid) != "T":
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, "the committer never reached its stop"
        time.sleep(0.05)
    return proc


def _state_of(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rpartition(")")[2].split()[0]


# ----------------------------------------------------------------------------- the must-show


@pytest.mark.parametrize("mode", ["append", "overwrite"])
def test_abort_fences_out_a_live_committer_and_the_next_run_commits_once(db_url, layout, tmp_path, mode):
    """`walsink abort` on a COMMITTING checkpoint whose committer is alive (SIGSTOPped mid-publish,
    its lease live for ten minutes): the committer, resumed, changes nothing; the next run commits once."""
    store = CommitterStore.from_url(db_url)
    target = tmp_path / "target"
    store.register("p", "k1", mode=mode, actor=ACTOR, target=str(target))
    first, _, _ = stage_checkpoint(store, layout, "p", "k1", DAY, mode=mode)
    zombie = start_stopped_committer(db_url, layout, target, mode, "publish.after_k:2")
    try:
        held = store.require("p", "k1")
        assert held.state is S.COMMITTING and held.lease_owner.startswith("dag.commit@run1")
        assert (held.lease_expires_at - held.updated_at) > timedelta(minutes=9)  # a live lease
        if mode == "append":  # two of four files are visible in the target
            assert len(target_files(target)) == 2

        result = walsink(
            "--url",
            db_url,
            "abort",
            "p",
            "k1",
            "--reason",
            REASON,
            "--staging-root",
            str(layout.root),
            "--json",
        )
        assert result.returncode == 0, result.stderr
        outcome = json.loads(result.stdout)
        assert outcome["state"] == "ABORTED" and outcome["previous_state"] == "COMMITTING"
        assert outcome["fenced_holder"] == held.lease_owner
        assert outcome["files_rolled_back"] == (2 if mode == "append" else 0)
        assert outcome["staging_removed"] == [f"p/k1/attempt-1-{first.attempt_id}"]
        assert target_files(target) == {}  # nothing of the aborted attempt is visible
        assert not layout.checkpoint_dir("p", "k1").exists()
        after_abort = everything(target)

        os.kill(zombie.pid, signal.SIGCONT)
        _, err = zombie.communicate(timeout=120)
    finally:
        if zombie.poll() is None:
            zombie.kill()
            zombie.wait()
    assert zombie.returncode != 0 and "LeaseLostError" in err, err
    assert everything(target) == after_abort  # not one file moved, swapped, deleted or rewritten
    record = store.require("p", "k1")
    assert record.state is S.ABORTED and record.error == REASON
    history = store.history("p", "k1")
    request = next(h for h in history if h.detail and h.detail.startswith("abort requested"))
    assert REASON in request.detail and f"lease holder {held.lease_owner} fenced out" in request.detail
    aborted = next(h for h in history if h.to_state == "ABORTED")
    assert aborted.from_state == "COMMITTING" and aborted.detail == REASON
    assert aborted.actor.endswith("(walsink abort)")

    # The next run: a fresh attempt, sealed, durable and committed once.
    second, _, _ = stage_checkpoint(store, layout, "p", "k1", DAY_NEW, mode=mode)
    assert second.attempt == 2 and second.attempt_id != first.attempt_id
    summary = committer(store, layout, target, mode).commit("p", "k1", actor=ACTOR)
    assert summary.state == "COMMITTED" and summary.published == 4 and summary.already_published == 0
    assert lines(target_files(target)) == lines(DAY_NEW)
    assert [h.to_state for h in store.history("p", "k1")][-4:] == [
        "SEALED",
        "DURABLE",
        "COMMITTING",
        "COMMITTED",
    ]


def test_abort_of_a_table_checkpoint_its_stopped_committer_published_is_refused(sqlite_store, tmp_path):
    """Iceberg, through real processes: the committer published the attempt in one table commit
    and was stopped before recording COMMITTED. `walsink abort` refuses (the table holds the
    attempt); the committer, resumed, is fenced and changes nothing; the commit task's re-run
    records COMMITTED, and the rows are in the table once."""
    pytest.importorskip("pyiceberg")
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from airflow_provider_walsink.core.commit import CheckpointWriter
    from airflow_provider_walsink.core.staging.layout import StagingLayout
    from airflow_provider_walsink.core.targets.registry import TargetOptions, resolve_target

    store, home = sqlite_store, tmp_path / "iceberg"
    env = {"WALSINK_ICEBERG_HOME": str(home)}
    os.environ.update(env)  # this process resolves the same embedded catalog
    try:
        uri = "iceberg://walsink/ns.events?create_table=true"
        publisher = resolve_target(uri, TargetOptions(mode="append", layout=StagingLayout(tmp_path)))
        layout = StagingLayout(publisher.staging_root())
        store.register("events", "k1", mode="append", actor=ACTOR, target=uri)
        writer = CheckpointWriter(store, layout, "events", "k1", actor=ACTOR)
        attempt_dir = writer.begin()
        rows = {"part-0.parquet": [1, 2, 3], "part-1.parquet": [4, 5]}
        for rel, ids in rows.items():
            buf = io.BytesIO()
            pq.write_table(pa.table({"id": pa.array(ids, pa.int64())}), buf)
            (attempt_dir / rel).parent.mkdir(parents=True, exist_ok=True)
            (attempt_dir / rel).write_bytes(buf.getvalue())
        writer.add_files(rows, rows={rel: len(ids) for rel, ids in rows.items()})
        writer.seal()
        store.mark_durable("events", "k1", attempt=writer.attempt, actor=ACTOR)
        url = store.engine.url.render_as_string(hide_password=False)
        zombie = start_stopped_committer(
            url, layout, uri, "append", "commit.after_publish", env=env, pipeline="events"
        )
        try:
            table = publisher.load_table()
            snapshots = [s.snapshot_id for s in table.snapshots()]
            assert len(snapshots) == 1  # published, COMMITTED not recorded
            result = walsink("--url", url, "abort", "events", "k1", "--reason", REASON, env=env)
            assert result.returncode == 1, result.stdout
            assert "is published: the target already holds its sealed attempt" in result.stderr
            refused = store.require("events", "k1")
            assert refused.state is S.COMMITTING and refused.lease_owner is None
            assert layout.attempt_dir("events", "k1", 1, refused.sealed_attempt_id).exists()
            os.kill(zombie.pid, signal.SIGCONT)
            _, err = zombie.communicate(timeout=120)
        finally:
            if zombie.poll() is None:
                zombie.kill()
                zombie.wait()
        assert zombie.returncode != 0 and "LeaseLostError" in err, err
        assert [s.snapshot_id for s in publisher.load_table().snapshots()] == snapshots
        assert store.require("events", "k1") == refused  # the fenced committer recorded nothing

        summary = CheckpointCommitter(store, layout, publisher, mode="append").commit(
            "events", "k1", actor=ACTOR
        )
        assert summary.state == "COMMITTED" and summary.published == 0 and summary.already_published == 2
        assert [s.snapshot_id for s in publisher.load_table().snapshots()] == snapshots
        ids = sorted(r["id"] for r in publisher.load_table().scan().to_arrow().to_pylist())
        assert ids == [1, 2, 3, 4, 5]
    finally:
        for key in env:
            os.environ.pop(key, None)


# ----------------------------------------------------------------------------- never lie


def test_abort_refuses_a_checkpoint_the_target_already_holds(store, layout, tmp_path):
    """Published but COMMITTED not yet recorded (the committer stopped there): refused; the
    commit task's re-run then records COMMITTED without publishing anything again."""
    target = tmp_path / "target"
    _, manifest, attempt_dir = stage_checkpoint(store, layout, "p", "k1", DAY)
    lease = store.acquire_lease(
        "p", "k1", owner="c1", ttl=timedelta(minutes=10), actor=ACTOR, mode="overwrite"
    )
    publisher = FilePublisher(target, "overwrite", layout=layout)
    publisher.publish(manifest, attempt_dir, StaticContext.for_manifest(manifest, epoch=lease.epoch))
    published, visible = everything(target), target_files(target)

    with pytest.raises(AbortRefusedError, match="is published: the target already holds its sealed attempt"):
        aborter(store, layout, target, "overwrite").abort("p", "k1", reason=REASON, actor=USER)
    record = store.require("p", "k1")
    assert record.state is S.COMMITTING and record.lease_owner is None  # given back, not ABORTED
    assert everything(target) == published and layout.attempt_dir("p", "k1", 1, manifest.attempt_id).exists()
    assert "abort refused" in store.history("p", "k1")[-1].detail
    # The fenced-out committer can record nothing.
    with pytest.raises(Exception, match="epoch"):
        store.mark_committed(lease, actor=ACTOR)

    summary = committer(store, layout, target, "overwrite").commit("p", "k1", actor=ACTOR)
    assert summary.state == "COMMITTED" and summary.published == 0
    assert target_files(target) == visible and lines(visible) == lines(DAY)


def test_a_committed_checkpoint_cannot_be_aborted(store, layout, tmp_path):
    target = tmp_path / "target"
    stage_checkpoint(store, layout, "p", "k1", DAY)
    committer(store, layout, target, "overwrite").commit("p", "k1", actor=ACTOR)
    with pytest.raises(Exception, match="COMMITTED: its data is in the target"):
        aborter(store, layout, target, "overwrite").abort("p", "k1", reason=REASON, actor=USER)
    assert store.require("p", "k1").state is S.COMMITTED


# ----------------------------------------------------------------------------- rolling back


def test_abort_swaps_back_the_partitions_an_overwrite_had_swapped_in(store, layout, tmp_path, monkeypatch):
    """Stopped after two of three partition swaps (dt=1 replaced, dt=3 new): the abort puts the
    old dt=1 back and takes dt=3 away, so the target is as before the attempt."""
    target = tmp_path / "target"
    old = {"dt=1/part-0.csv": b"old-1\n", "dt=2/part-0.csv": b"old-2\n"}
    stage_checkpoint(store, layout, "p", "k0", old)
    committer(store, layout, target, "overwrite").commit("p", "k0", actor=ACTOR)
    before = target_files(target)
    new = {"dt=1/part-0.csv": b"new-1\n", "dt=3/part-0.csv": b"new-3\n", "dt=4/part-0.csv": b"new-4\n"}
    stage_checkpoint(store, layout, "p", "k1", new)
    real_swap, swaps = files_module.fsops._swap_in, []

    def swap_twice_then_fail(*args):
        if len(swaps) == 2:
            raise OSError(5, "Input/output error")
        real_swap(*args)
        swaps.append(args)

    monkeypatch.setattr(files_module.fsops, "_swap_in", swap_twice_then_fail)
    with pytest.raises(OSError):
        committer(store, layout, target, "overwrite").commit("p", "k1", actor=ACTOR)
    monkeypatch.undo()
    assert by_partition(target) == {"dt=1": [b"new-1"], "dt=2": [b"old-2"], "dt=3": [b"new-3"]}
    assert store.require("p", "k1").state is S.FAILED

    outcome = aborter(store, layout, target, "overwrite").abort("p", "k1", reason=REASON, actor=USER)
    assert outcome.state == "ABORTED" and outcome.previous_state == "FAILED"
    assert target_files(target) == before  # byte for byte, under the old names
    assert everything(target / "_walsink" / "pending") == {}  # nothing of the attempt kept aside
    assert outcome.files_rolled_back == 2
    assert "abort cleanup: 2 published files of attempt 1 rolled back" in store.history("p", "k1")[-1].detail


def test_the_next_run_rolls_back_what_an_unfinished_abort_left(store, layout, tmp_path, monkeypatch):
    """An abort recorded but never cleaned up (its process died): the next attempt's publish
    rolls the aborted attempt's files back from the journal, so the interval lands once."""
    target = tmp_path / "target"
    stage_checkpoint(store, layout, "p", "k1", DAY, mode="append")
    real_move, moved = files_module.fsops._move, []

    def move_twice_then_fail(*args):
        if len(moved) == 2:
            raise OSError(28, "No space left on device")
        real_move(*args)
        moved.append(args)

    monkeypatch.setattr(files_module.fsops, "_move", move_twice_then_fail)
    with pytest.raises(OSError):
        committer(store, layout, target, "append").commit("p", "k1", actor=ACTOR)
    monkeypatch.undo()
    assert len(target_files(target)) == 2
    store.abort("p", "k1", reason=REASON, actor=USER)  # the record only: no rollback, no cleanup
    assert len(target_files(target)) == 2

    stage_checkpoint(store, layout, "p", "k1", DAY_NEW, mode="append")
    summary = committer(store, layout, target, "append").commit("p", "k1", actor=ACTOR)
    assert summary.state == "COMMITTED" and summary.published == 4
    assert lines(target_files(target)) == lines(DAY_NEW)


# ----------------------------------------------------------------------------- Airflow's audit log


def _audit_rows(key: str) -> list[dict]:
    from sqlalchemy import create_engine, text

    engine = create_engine(os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text("SELECT event, dag_id, run_id, owner, extra FROM log WHERE event = 'walsink.abort'")
            ).mappings()
            return [dict(r) for r in rows if json.loads(r["extra"])["checkpoint_key"] == key]
    finally:
        engine.dispose()


def test_walsink_abort_is_recorded_in_airflows_audit_log(airflow_db, sqlite_store, layout):
    import getpass

    store, key = sqlite_store, f"k{time.monotonic_ns()}"
    stage_checkpoint(store, layout, "p", key, DAY, durable=False)  # registered by DAG "tests", run "run"
    url = store.engine.url.render_as_string(hide_password=False)
    result = walsink(
        "--url", url, "abort", "p", key, "--reason", REASON, "--staging-root", str(layout.root), "--json"
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["audit_log"] == "recorded (event walsink.abort)"
    [row] = _audit_rows(key)
    assert (row["dag_id"], row["run_id"], row["owner"]) == ("tests", "run", getpass.getuser())
    extra = json.loads(row["extra"])
    assert extra["reason"] == REASON and extra["state"] == "ABORTED" and extra["previous_state"] == "SEALED"
    assert extra["source"] == "walsink CLI" and extra["staging_removed"]


def test_walsink_abort_without_airflows_database_says_so_and_still_aborts(sqlite_store, layout, tmp_path):
    store = sqlite_store
    stage_checkpoint(store, layout, "p", "k1", DAY, durable=False)
    url = store.engine.url.render_as_string(hide_password=False)
    unreachable = {"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "postgresql+psycopg2://nobody@127.0.0.1:9/none"}
    result = walsink("--url", url, "abort", "p", "k1", "--reason", REASON, "--json", env=unreachable)
    assert result.returncode == 0, result.stderr
    audit = json.loads(result.stdout)["audit_log"]
    assert audit.startswith("not recorded (Airflow's metadata database is not reachable from here")
    assert (
        "warning: abort not recorded" in result.stderr and "the checkpoint's history has it" in result.stderr
    )
    assert store.require("p", "k1").state is S.ABORTED


def _published_but_committing(store, layout, target):
    """A files checkpoint whose committer published it whole and stopped before COMMITTED."""
    store.register("p", "k1", mode="overwrite", actor=ACTOR, target=str(target))
    _, manifest, attempt_dir = stage_checkpoint(store, layout, "p", "k1", DAY)
    lease = store.acquire_lease(
        "p", "k1", owner="c1", ttl=timedelta(minutes=10), actor=ACTOR, mode="overwrite"
    )
    FilePublisher(target, "overwrite", layout=layout).publish(
        manifest, attempt_dir, StaticContext.for_manifest(manifest, epoch=lease.epoch)
    )
    return manifest


def test_walsink_abort_refusal_is_one_line_and_changes_nothing(sqlite_store, layout, tmp_path):
    store, target = sqlite_store, tmp_path / "target"
    _published_but_committing(store, layout, target)
    url = store.engine.url.render_as_string(hide_password=False)
    result = walsink("--url", url, "abort", "p", "k1", "--reason", REASON, "--staging-root", str(layout.root))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    [line] = [x for x in result.stderr.strip().splitlines() if not x.startswith("walsink: warning")]
    assert "is published" in line and "Re-run (clear) its commit task" in line
    assert store.require("p", "k1").state is S.COMMITTING
    assert lines(target_files(target)) == lines(DAY)


def test_walsink_abort_with_a_wrong_staging_root_is_refused_not_rolled_back(sqlite_store, layout, tmp_path):
    """The sealed manifest is the only way to tell a published attempt (refuse) from a partly
    published one (roll back). Under a wrong staging root it cannot be read: the abort is refused,
    the published partition stays, and with the right root the usual refusal follows."""
    store, target = sqlite_store, tmp_path / "target"
    _published_but_committing(store, layout, target)
    published = everything(target)
    url = store.engine.url.render_as_string(hide_password=False)
    wrong = tmp_path / "not-the-staging-root"
    result = walsink("--url", url, "abort", "p", "k1", "--reason", REASON, "--staging-root", str(wrong))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "sealed manifest cannot be read under the staging root" in result.stderr
    assert str(wrong) in result.stderr and "--manifest-lost" in result.stderr
    assert store.require("p", "k1").state is S.COMMITTING
    assert everything(target) == published  # nothing rolled back

    right = walsink("--url", url, "abort", "p", "k1", "--reason", REASON, "--staging-root", str(layout.root))
    assert right.returncode == 1 and "is published" in right.stderr
    assert everything(target) == published


def test_abort_with_the_manifest_lost_goes_ahead_when_asked(sqlite_store, layout, tmp_path):
    """The staging really is gone: --manifest-lost aborts without the check (the files target
    rolls back from its publish journal)."""
    import shutil

    store, target = sqlite_store, tmp_path / "target"
    manifest = _published_but_committing(store, layout, target)
    shutil.rmtree(layout.attempt_dir("p", "k1", manifest.attempt, manifest.attempt_id))
    with pytest.raises(AbortRefusedError, match="sealed manifest cannot be read"):
        aborter(store, layout, target, "overwrite").abort("p", "k1", reason=REASON, actor=USER)
    outcome = aborter(store, layout, target, "overwrite").abort(
        "p", "k1", reason=REASON, actor=USER, manifest_lost=True
    )
    assert outcome.state == "ABORTED" and outcome.files_rolled_back == len(DAY)
    assert target_files(target) == {}


def test_walsink_abort_refuses_a_target_other_than_the_registered_one(sqlite_store, layout, tmp_path):
    store, target = sqlite_store, tmp_path / "target"
    _published_but_committing(store, layout, target)
    published = everything(target)
    url = store.engine.url.render_as_string(hide_password=False)
    result = walsink(
        "--url", url, "abort", "p", "k1", "--reason", REASON, "--staging-root", str(layout.root),
        "--target", str(tmp_path / "elsewhere"),
    )  # fmt: skip
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert f"registered with target {str(target)!r}" in result.stderr
    assert store.require("p", "k1").state is S.COMMITTING and everything(target) == published


def test_walsink_abort_of_a_committed_checkpoint_is_an_answer_not_an_internal_error(
    sqlite_store, layout, tmp_path
):
    store, target = sqlite_store, tmp_path / "target"
    store.register("p", "k1", mode="overwrite", actor=ACTOR, target=str(target))
    stage_checkpoint(store, layout, "p", "k1", DAY)
    committer(store, layout, target, "overwrite").commit("p", "k1", actor=ACTOR)
    url = store.engine.url.render_as_string(hide_password=False)
    result = walsink("--url", url, "abort", "p", "k1", "--reason", REASON, "--staging-root", str(layout.root))
    assert result.returncode == 1 and "unexpected" not in result.stderr
    assert "COMMITTED" in result.stderr and store.require("p", "k1").state is S.COMMITTED


# ----------------------------------------------------------------------------- issue 22


def test_an_abort_waits_out_a_committer_that_took_the_lease_after_the_abort_read_the_row(
    pg_url, layout, tmp_path
):
    """Issue 22, symptom 4. The abort reads the row (DURABLE, no holder); a committer then takes
    the lease and assembles its overwrite of a partition another checkpoint committed; only then
    does the abort fence it out. The wait must follow the row the fencing transaction saw (a
    holder), not the row read before: the committer, resumed within its trust, is refused, and
    the other checkpoint's committed partition is intact (read back by DuckDB)."""
    import duckdb

    store = CommitterStore.from_url(pg_url)
    target = tmp_path / "target"
    store.register("p", "k0", mode="overwrite", actor=ACTOR, target=str(target))
    stage_checkpoint(store, layout, "p", "k0", DAY, mode="overwrite")
    assert committer(store, layout, target, "overwrite").commit("p", "k0", actor=ACTOR).state == "COMMITTED"
    committed = by_partition(target)
    store.register("p", "k1", mode="overwrite", actor=ACTOR, target=str(target))
    stage_checkpoint(store, layout, "p", "k1", DAY_NEW, mode="overwrite")

    abort_store = CommitterStore.from_url(pg_url, migrate=False)
    fence_out = abort_store.begin_abort
    racers: list[subprocess.Popen] = []

    def begin_abort_after_a_committer_took_the_lease(*args, **kwargs):
        # The committer takes the lease and moves every file into its pending partition, then stops.
        racers.append(start_stopped_committer(pg_url, layout, target, "overwrite", "publish.after_k:4"))
        return fence_out(*args, **kwargs)

    abort_store.begin_abort = begin_abort_after_a_committer_took_the_lease
    aborter = CheckpointAborter(abort_store, layout, FilePublisher(target, "overwrite", layout=layout))
    try:
        outcome = aborter.abort("p", "k1", reason=REASON, actor=USER)
        assert outcome.state == "ABORTED" and outcome.fenced_holder.startswith("dag.commit@run1")
        os.kill(racers[0].pid, signal.SIGCONT)
        _, err = racers[0].communicate(timeout=120)
    finally:
        for proc in racers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert racers[0].returncode != 0 and "LeaseLostError" in err, err[-2000:]
    assert store.require("p", "k1").state is S.ABORTED
    assert by_partition(target) == committed  # k0's committed rows, nothing of k1
    rows = duckdb.sql(
        f"select * from read_csv('{target}/*/*.csv', header=false, hive_partitioning=false, columns={{'d': 'VARCHAR', 'v': 'VARCHAR'}})"
    ).fetchall()
    assert sorted(f"{a},{b}".encode() for a, b in rows) == lines(DAY)
