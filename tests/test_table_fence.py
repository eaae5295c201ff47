"""Table fencing (issue 12, item 7): ``fencing="table"`` commits with no lease and one
committer-table transaction; the table's atomic commit is the fence, for commits and aborts.

Real processes throughout where a race or a crash is the point:

* two table-fenced committers of one checkpoint, spawned and released together: one table
  commit, rows once, COMMITTED once;
* a committer SIGKILLed after its table commit (``table.after_table_commit``), before the
  COMMITTED transaction: the re-run finds the marker and records COMMITTED without a second
  table commit; then the committer rows are deleted (retention) and the interval is written
  and committed again: still once (the table's attempt is reconciled, the new one dropped);
* ``walsink abort`` against a table-fenced committer SIGSTOPped just before its table commit
  (the abort's tombstone lands first: the committer, resumed, changes nothing) and one stopped
  just after it (the abort is refused as published; the re-run records COMMITTED);
* the files (and SQL) targets refuse the mode.

Iceberg (SQL catalog on SQLite) and Delta on a local warehouse; the committer table on
PostgreSQL (its one-statement path) and SQLite (the locking path).
"""

from __future__ import annotations

import io
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_walsink.core import faults
from airflow_provider_walsink.core.commit import CheckpointCommitter, CheckpointWriter
from airflow_provider_walsink.core.commit.abort import AbortRefusedError, CheckpointAborter
from airflow_provider_walsink.core.commit.fencing import TableFenceUnsupportedError
from airflow_provider_walsink.core.protocol import CheckpointState as S
from airflow_provider_walsink.core.protocol.errors import FencedError
from airflow_provider_walsink.core.staging.layout import StagingLayout
from airflow_provider_walsink.core.store import CommitterStore
from airflow_provider_walsink.core.targets import FilePublisher
from airflow_provider_walsink.core.targets._tables import AbortedInTableError
from tests.helpers import ACTOR, REPO, forget_checkpoint
from tests.table_fixtures import local_table_spec

pytestmark = pytest.mark.slow

KEY = "20260101T000000Z"
DAY = [("2026-01-01", 1, "a"), ("2026-01-01", 2, "b"), ("2026-01-02", 3, "c")]
DAY_NEW = [("2026-01-01", 1, "A"), ("2026-01-01", 2, "B"), ("2026-01-02", 3, "C")]
REASON = "INC-9: wrong source"


# ----------------------------------------------------------------------------- fixtures


def make_publisher(kind: str, spec: dict, mode: str):
    """The publisher of one test table; ``spec`` is picklable (spawned processes build the same)."""
    if kind == "iceberg":
        from airflow_provider_walsink.core.targets.iceberg import IcebergPublisher

        return IcebergPublisher(
            spec["identifier"], mode, catalog_properties=spec["props"], partition_by=["dt"], create_table=True
        )
    from airflow_provider_walsink.core.targets.delta import DeltaPublisher

    return DeltaPublisher(spec["uri"], mode, partition_by=["dt"], create_table=True)


@pytest.fixture(params=["iceberg", "delta"])
def kind(request) -> str:
    return request.param


@pytest.fixture
def spec(kind, tmp_path) -> dict:
    return local_table_spec(kind, tmp_path)


@pytest.fixture(params=["postgresql", "sqlite"])
def url(request, database_urls) -> str:
    from tests.conftest import _empty, _migrated_store

    url = database_urls(request.param)
    _empty(_migrated_store(url))
    return url


def staging_of(kind: str, spec: dict) -> StagingLayout:
    return StagingLayout(make_publisher(kind, spec, "overwrite").staging_root())


def stage(store: CommitterStore, layout: StagingLayout, rows: list[tuple], mode: str = "overwrite"):
    """Register (once), write a new attempt of Parquet files partitioned by dt, seal it, DURABLE."""
    store.register("events", KEY, mode=mode, actor=ACTOR, target="table")
    writer = CheckpointWriter(store, layout, "events", KEY, actor=ACTOR, partition_columns=("dt",))
    attempt_dir = writer.begin()
    files, counts = {}, {}
    for dt in sorted({r[0] for r in rows}):
        part = [r for r in rows if r[0] == dt]
        buf = io.BytesIO()
        pq.write_table(
            pa.table({"id": pa.array([r[1] for r in part], pa.int64()), "name": [r[2] for r in part]}), buf
        )
        rel = f"dt={dt}/part-{uuid.uuid4().hex[:8]}.parquet"
        (attempt_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (attempt_dir / rel).write_bytes(buf.getvalue())
        files[rel], counts[rel] = buf.getvalue(), len(part)
    writer.add_files(files, rows=counts)
    manifest, _ = writer.seal()
    store.mark_durable("events", KEY, attempt=writer.attempt, actor=ACTOR)
    return manifest


def table_rows(kind: str, spec: dict) -> list[tuple]:
    table = make_publisher(kind, spec, "append").load_table()
    if table is None:
        return []
    arrow = table.scan().to_arrow() if kind == "iceberg" else table.to_pyarrow_table()
    return sorted((r["dt"], r["id"], r["name"]) for r in arrow.to_pylist())


def table_commits(kind: str, spec: dict) -> int:
    table = make_publisher(kind, spec, "append").load_table()
    if table is None:
        return 0
    if kind == "iceberg":
        return len(table.snapshots())
    # Delta: the versions a walsink commit wrote; not the empty table created before the first one
    # (delta.py _create_empty), which racing committers may both write.
    return sum(1 for h in table.history() if "walsink.pipeline" in h)


def committer(store, layout, kind, spec, mode="overwrite") -> CheckpointCommitter:
    return CheckpointCommitter(store, layout, make_publisher(kind, spec, mode), mode=mode, fencing="table")


def to_states(store) -> list[str]:
    return [h.to_state for h in store.history("events", KEY)]


# ----------------------------------------------------------------------------- processes


def _racing_commit(kind, spec, mode, url, staging, barrier, out) -> None:
    store = CommitterStore.from_url(url, migrate=False)
    c = CheckpointCommitter(
        store, StagingLayout(staging), make_publisher(kind, spec, mode), mode=mode, fencing="table"
    )
    barrier.wait()
    try:
        summary = c.commit("events", KEY, actor=ACTOR)
        out.put(
            ("ok", summary.state, summary.published, summary.already_published, summary.already_committed)
        )
    except Exception as exc:  # noqa: BLE001 - reported to the test
        out.put(("error", type(exc).__name__, str(exc), 0, False))


def _killed_commit(kind, spec, mode, url, staging) -> None:
    os.environ[faults.ENV] = "table.after_table_commit"
    store = CommitterStore.from_url(url, migrate=False)
    CheckpointCommitter(
        store, StagingLayout(staging), make_publisher(kind, spec, mode), mode=mode, fencing="table"
    ).commit("events", KEY, actor=ACTOR)
    os._exit(3)


STOPPED_COMMITTER = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {repo!r})
    from tests.test_table_fence import make_publisher
    from airflow_provider_walsink.core.store import Actor, CommitterStore
    from airflow_provider_walsink.core.commit import CheckpointCommitter
    from airflow_provider_walsink.core.staging.layout import StagingLayout
    kind, spec, mode, url, staging = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
    store = CommitterStore.from_url(url, migrate=False)
    committer = CheckpointCommitter(
        store, StagingLayout(staging), make_publisher(kind, spec, mode), mode=mode, fencing="table"
    )
    actor = Actor(name="dag.commit@run1", dag_id="dag", run_id="run1", task_id="commit", try_number=1)
    print(json.dumps(committer.commit("events", {key!r}, actor=actor).to_dict()))
""")


def start_stopped_committer(kind, spec, mode, url, staging, point) -> subprocess.Popen:
    import json

    env = {**os.environ, faults.ENV: point, faults.SIGNAL_ENV: "STOP"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            STOPPED_COMMITTER.format(repo=str(REPO), key=KEY),
            kind,
            json.dumps(spec),
            mode,
            url,
            staging,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )
    deadline = time.monotonic() + 120
    while _state_of(proc.pid) != "T":
        if proc.poll() is not None:
            raise AssertionError(proc.stderr.read())
        assert time.monotonic() < deadline, "the committer never reached its stop"
        time.sleep(0.05)
    return proc


def _state_of(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rpartition(")")[2].split()[0]


def resume(proc: subprocess.Popen) -> tuple[int, str, str]:
    try:
        os.kill(proc.pid, signal.SIGCONT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out, err


# ----------------------------------------------------------------------------- tests


def test_files_and_sql_targets_refuse_table_fencing(sqlite_store, tmp_path):
    layout = StagingLayout(tmp_path / "staging")
    with pytest.raises(TableFenceUnsupportedError, match="the file target does not"):
        CheckpointCommitter(
            sqlite_store,
            layout,
            FilePublisher(tmp_path / "t", "overwrite", layout=layout),
            mode="overwrite",
            fencing="table",
        )
    from airflow_provider_walsink.core.targets.sql import SqlPublisher

    assert not SqlPublisher.capabilities.table_fence
    with pytest.raises(ValueError, match="fencing must be one of"):
        CheckpointCommitter(
            sqlite_store,
            layout,
            FilePublisher(tmp_path / "t", "overwrite", layout=layout),
            mode="overwrite",
            fencing="none",
        )


def test_a_table_fenced_commit_is_one_transaction_and_a_rerun_is_a_noop(kind, spec, url):
    store = CommitterStore.from_url(url, migrate=False)
    layout = staging_of(kind, spec)
    stage(store, layout, DAY)
    before = len(store.history("events", KEY))
    summary = committer(store, layout, kind, spec).commit("events", KEY, actor=ACTOR)
    assert summary.state == "COMMITTED" and summary.published == 2 and not summary.already_committed
    history = store.history("events", KEY)
    assert [(h.from_state, h.to_state) for h in history[before:]] == [("DURABLE", "COMMITTED")]
    assert "table-fenced" in history[-1].detail
    record = store.require("events", KEY)
    assert record.lease_owner is None and record.lease_epoch > 0
    assert table_rows(kind, spec) == sorted(DAY) and table_commits(kind, spec) == 1
    again = committer(store, layout, kind, spec).commit("events", KEY, actor=ACTOR)
    assert again.already_committed and len(store.history("events", KEY)) == len(history)
    assert table_commits(kind, spec) == 1


def test_two_table_fenced_committers_racing_publish_once(kind, spec, pg_url):
    store = CommitterStore.from_url(pg_url, migrate=False)
    layout = staging_of(kind, spec)
    stage(store, layout, DAY)
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    procs = [
        ctx.Process(
            target=_racing_commit, args=(kind, spec, "overwrite", pg_url, str(layout.root), barrier, out)
        )
        for _ in range(2)
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(60)
    assert all(r[0] == "ok" and r[1] == "COMMITTED" for r in results), results
    assert sum(r[2] for r in results) == 2  # the attempt's two files were added by exactly one of them
    assert table_rows(kind, spec) == sorted(DAY)
    assert table_commits(kind, spec) == 1
    assert to_states(store).count("COMMITTED") == 1


def test_a_commit_killed_after_the_table_commit_is_reconciled_and_rows_stay_once(kind, spec, url):
    store = CommitterStore.from_url(url, migrate=False)
    layout = staging_of(kind, spec)
    first = stage(store, layout, DAY)
    proc = multiprocessing.get_context("spawn").Process(
        target=_killed_commit, args=(kind, spec, "overwrite", url, str(layout.root))
    )
    proc.start()
    proc.join(300)
    assert proc.exitcode == -signal.SIGKILL
    assert table_rows(kind, spec) == sorted(DAY) and table_commits(kind, spec) == 1
    assert store.require("events", KEY).state is S.DURABLE  # the table holds it; the row does not know

    summary = committer(store, layout, kind, spec).commit("events", KEY, actor=ACTOR)
    assert summary.state == "COMMITTED" and summary.published == 0 and summary.already_published == 2
    assert store.require("events", KEY).sealed_attempt_id == first.attempt_id
    assert table_rows(kind, spec) == sorted(DAY) and table_commits(kind, spec) == 1

    # Retention deletes the committer rows; the interval is written again (new data) and committed:
    # the table holds the first attempt of this version, so the new one is never published.
    forget_checkpoint(store, "events", KEY)
    second = stage(store, layout, DAY_NEW)
    summary = committer(store, layout, kind, spec).commit("events", KEY, actor=ACTOR)
    assert summary.state == "COMMITTED" and summary.already_committed
    record = store.require("events", KEY)
    assert record.sealed_attempt_id == first.attempt_id != second.attempt_id
    assert record.sealed_attempt == 1
    last = store.history("events", KEY)[-1]
    assert last.to_state == "COMMITTED" and "reconciled from the table" in last.detail
    assert table_rows(kind, spec) == sorted(DAY) and table_commits(kind, spec) == 1
    assert not layout.attempt_dir("events", KEY, second.attempt, second.attempt_id).exists()


def test_a_crash_then_a_new_write_attempt_is_reconciled_to_the_published_one(kind, spec, sqlite_store):
    """The row moved on (a cleared write task started attempt 2) after attempt 1 was published by
    a commit that died before recording it: the table is the truth, attempt 1 is COMMITTED."""
    store = sqlite_store
    layout = staging_of(kind, spec)
    first = stage(store, layout, DAY)
    publisher = make_publisher(kind, spec, "overwrite")
    from airflow_provider_walsink.core.commit.tablefence import TableFenceContext

    manifest_dir = layout.attempt_dir("events", KEY, first.attempt, first.attempt_id)
    publisher.publish(
        first,
        manifest_dir,
        TableFenceContext(
            "events", KEY, attempt_id=first.attempt_id, epoch=int(time.time() * 1000), supersedes=None
        ),
    )
    stage(store, layout, DAY_NEW)  # attempt 2, DURABLE
    summary = committer(store, layout, kind, spec).commit("events", KEY, actor=ACTOR)
    assert summary.state == "COMMITTED"
    assert store.require("events", KEY).sealed_attempt_id == first.attempt_id
    assert table_rows(kind, spec) == sorted(DAY) and table_commits(kind, spec) == 1


@pytest.mark.parametrize("mode", ["overwrite", "append"])
def test_abort_tombstone_lands_before_a_stopped_committer_which_then_changes_nothing(
    kind, spec, pg_url, mode
):
    store = CommitterStore.from_url(pg_url, migrate=False)
    layout = staging_of(kind, spec)
    first = stage(store, layout, DAY, mode=mode)
    zombie = start_stopped_committer(kind, spec, mode, pg_url, str(layout.root), "table.before_table_commit")
    try:
        assert table_commits(kind, spec) <= 1 and table_rows(kind, spec) == []
        outcome = CheckpointAborter(store, layout, make_publisher(kind, spec, mode)).abort(
            "events", KEY, reason=REASON, actor=ACTOR
        )
        assert outcome.state == "ABORTED" and outcome.previous_state == "DURABLE"
        commits_after_abort = table_commits(kind, spec)
        history_after_abort = store.history("events", KEY)
        record_after_abort = store.require("events", KEY)
    finally:
        code, out, err = resume(zombie)
    assert code != 0 and "AbortedInTableError" in err, err
    assert table_rows(kind, spec) == []  # the aborted attempt never appeared
    assert table_commits(kind, spec) == commits_after_abort
    assert store.history("events", KEY) == history_after_abort  # not even a history row
    assert store.require("events", KEY) == record_after_abort
    with pytest.raises(AbortedInTableError):  # and it never will
        make_publisher(kind, spec, mode).publish(
            first,
            layout.attempt_dir("events", KEY, first.attempt, first.attempt_id),
            __import__("airflow_provider_walsink.core.commit.tablefence", fromlist=["x"]).TableFenceContext(
                "events", KEY, attempt_id=first.attempt_id, epoch=int(time.time() * 1000), supersedes=None
            ),
        )

    # The next run: a fresh attempt commits once.
    stage(store, layout, DAY_NEW, mode=mode)
    summary = committer(store, layout, kind, spec, mode).commit("events", KEY, actor=ACTOR)
    assert summary.state == "COMMITTED" and summary.published == 2
    assert table_rows(kind, spec) == sorted(DAY_NEW)


def test_abort_of_a_checkpoint_a_stopped_committer_published_is_refused(kind, spec, pg_url):
    store = CommitterStore.from_url(pg_url, migrate=False)
    layout = staging_of(kind, spec)
    stage(store, layout, DAY)
    zombie = start_stopped_committer(
        kind, spec, "overwrite", pg_url, str(layout.root), "table.after_table_commit"
    )
    try:
        assert table_rows(kind, spec) == sorted(DAY)
        with pytest.raises(AbortRefusedError, match="is published"):
            CheckpointAborter(store, layout, make_publisher(kind, spec, "overwrite")).abort(
                "events", KEY, reason=REASON, actor=ACTOR
            )
        assert store.require("events", KEY).state is S.DURABLE
    finally:
        code, out, err = resume(zombie)
    assert code == 0, err  # the committer goes on and records COMMITTED: it is the truth
    assert store.require("events", KEY).state is S.COMMITTED
    assert table_rows(kind, spec) == sorted(DAY) and table_commits(kind, spec) == 1


def test_a_stale_committer_of_an_older_attempt_is_refused_after_an_abort(kind, spec, sqlite_store):
    """Attempt 1 sealed and read by a committer that stalls; attempt 2 is written; the abort
    tombstones every staged attempt, so attempt 1's late publish is refused too."""
    store = sqlite_store
    layout = staging_of(kind, spec)
    first = stage(store, layout, DAY)
    stage(store, layout, DAY_NEW)
    CheckpointAborter(store, layout, make_publisher(kind, spec, "overwrite"), sleep=lambda s: None).abort(
        "events", KEY, reason=REASON, actor=ACTOR
    )
    from airflow_provider_walsink.core.commit.tablefence import TableFenceContext

    with pytest.raises(FencedError):
        make_publisher(kind, spec, "overwrite").publish(
            first,
            Path(layout.root) / "events" / KEY / f"attempt-1-{first.attempt_id}",
            TableFenceContext("events", KEY, attempt_id=first.attempt_id, epoch=2**50, supersedes=None),
        )
    assert table_rows(kind, spec) == []


def test_a_reprocess_under_table_fencing_replaces_the_version_once(kind, spec, sqlite_store):
    store = sqlite_store
    layout = staging_of(kind, spec)
    first = stage(store, layout, DAY)
    committer(store, layout, kind, spec).commit("events", KEY, actor=ACTOR)
    store.begin_version("events", KEY, token="dag/run2#1", actor=ACTOR, reason="fix")
    second = stage(store, layout, DAY_NEW)
    summary = committer(store, layout, kind, spec).commit("events", KEY, actor=ACTOR)
    assert summary.state == "COMMITTED" and summary.attempt_id == second.attempt_id
    assert table_rows(kind, spec) == sorted(DAY_NEW)
    versions = store.versions("events", KEY)
    assert [(v.state, v.attempt_id) for v in versions] == [("SUPERSEDED", first.attempt_id)]
    # A v1 committer waking up now publishes nothing: the table holds version 2.
    from airflow_provider_walsink.core.commit.tablefence import TableFenceContext

    with pytest.raises(FencedError):
        make_publisher(kind, spec, "overwrite").publish(
            first,
            layout.attempt_dir("events", KEY, first.attempt, first.attempt_id),
            TableFenceContext("events", KEY, attempt_id=first.attempt_id, epoch=2**50, supersedes=None),
        )
    assert table_rows(kind, spec) == sorted(DAY_NEW)


# ----------------------------------------------------------------------------- issue 22


def test_an_abort_is_refused_while_the_table_holds_an_earlier_attempt_of_the_version(kind, spec, pg_url):
    """Issue 22, symptom 5. An append commit SIGKILLed after its table commit (attempt 1 in the
    table, the row DURABLE), then a write retry (attempt 2 sealed), then an abort: the table holds
    an attempt of this checkpoint version, so the checkpoint is published and the abort is
    refused (naming attempt 1) in the tombstone's own commit. Granting it (the table holds an
    attempt other than the sealed one) would let the next interval re-read the offsets and
    publish the rows twice. The re-run commit records attempt 1; the rows are there once."""
    store = CommitterStore.from_url(pg_url, migrate=False)
    layout = staging_of(kind, spec)
    first = stage(store, layout, DAY, mode="append")
    proc = multiprocessing.get_context("spawn").Process(
        target=_killed_commit, args=(kind, spec, "append", pg_url, str(layout.root))
    )
    proc.start()
    proc.join(300)
    assert proc.exitcode == -signal.SIGKILL
    assert table_rows(kind, spec) == sorted(DAY) and store.require("events", KEY).state is S.DURABLE
    second = stage(store, layout, DAY_NEW, mode="append")  # the write task re-run: attempt 2 sealed
    assert store.require("events", KEY).sealed_attempt_id == second.attempt_id
    commits = table_commits(kind, spec)

    with pytest.raises(AbortRefusedError, match=f"attempt 1 \\({first.attempt_id}\\)") as refused:
        CheckpointAborter(store, layout, make_publisher(kind, spec, "append")).abort(
            "events", KEY, reason=REASON, actor=ACTOR
        )
    assert "re-run" in str(refused.value).lower()
    assert store.require("events", KEY).state is S.DURABLE
    assert table_commits(kind, spec) == commits  # no tombstone written over published data
    assert table_rows(kind, spec) == sorted(DAY)

    summary = committer(store, layout, kind, spec, "append").commit("events", KEY, actor=ACTOR)
    assert summary.state == "COMMITTED" and summary.attempt_id == first.attempt_id
    assert table_rows(kind, spec) == sorted(DAY)  # once


@pytest.mark.parametrize("fencing", ["table", "lease"])
def test_a_committer_paused_in_its_clean_up_never_deletes_what_a_reprocess_committed(
    kind, spec, pg_url, fencing
):
    """Issue 22, symptom 6. A committer SIGSTOPped inside its post-commit clean-up (it has read
    the table: version 1 is ours) while a reprocess commits version 2, whose files the table
    references in place in staging; SIGCONT. The clean-up is fenced (the row moved on) and asks
    the table what it references now: version 2's files stay and the table reads back."""
    store = CommitterStore.from_url(pg_url, migrate=False)
    layout = staging_of(kind, spec)
    first = stage(store, layout, DAY)
    if fencing == "table":
        paused = start_stopped_committer(kind, spec, "overwrite", pg_url, str(layout.root), "cleanup.started")
    else:
        paused = start_stopped_lease_committer(kind, spec, pg_url, str(layout.root), "cleanup.started")
    try:
        assert store.require("events", KEY).state is S.COMMITTED
        assert table_rows(kind, spec) == sorted(DAY)
        store.begin_version("events", KEY, token="dag/run2#1", actor=ACTOR, reason="reprocess")
        second = stage(store, layout, DAY_NEW)
        reprocess = CheckpointCommitter(
            store, layout, make_publisher(kind, spec, "overwrite"), mode="overwrite", fencing=fencing
        )
        assert reprocess.commit("events", KEY, actor=ACTOR).attempt_id == second.attempt_id
        assert table_rows(kind, spec) == sorted(DAY_NEW)
    finally:
        code, out, err = resume(paused)
    assert code == 0, err  # its commit was recorded; the clean-up stopped, it did not fail the task
    assert store.require("events", KEY).sealed_attempt_id == second.attempt_id
    assert layout.attempt_dir("events", KEY, second.attempt, second.attempt_id).is_dir()
    assert table_rows(kind, spec) == sorted(DAY_NEW)  # every file the table references is there
    assert first.attempt_id != second.attempt_id


LEASE_COMMITTER = STOPPED_COMMITTER.replace('fencing="table"', 'fencing="lease"')


def start_stopped_lease_committer(kind, spec, url, staging, point) -> subprocess.Popen:
    import json

    env = {**os.environ, faults.ENV: point, faults.SIGNAL_ENV: "STOP"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    script = LEASE_COMMITTER.format(repo=str(REPO), key=KEY)
    args = [sys.executable, "-c", script, kind, json.dumps(spec), "overwrite", url, staging]
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO
    )
    deadline = time.monotonic() + 120
    while _state_of(proc.pid) != "T":
        if proc.poll() is not None:
            raise AssertionError(proc.stderr.read())
        assert time.monotonic() < deadline, "the committer never reached its stop"
        time.sleep(0.05)
    return proc


# ----------------------------------------------------------------------------- append offsets (issue 22, symptom 1)

#: The source: row ``i`` sits at offset ``i``; an interval reads ``SOURCE[start:end]``.
SOURCE = [(f"2026-01-0{1 + i % 2}", i, f"r{i}") for i in range(40)]


def stage_interval(store: CommitterStore, layout: StagingLayout, key: str, start: int, end: int):
    """An ``append`` interval that read source offsets ``start`` to ``end``: staged, sealed, DURABLE."""
    store.register("events", key, mode="append", actor=ACTOR, target="table")
    writer = CheckpointWriter(store, layout, "events", key, actor=ACTOR, partition_columns=("dt",))
    attempt_dir = writer.begin(start_offsets={"src": start})
    files, counts = {}, {}
    for dt in sorted({r[0] for r in SOURCE[start:end]}):
        part = [r for r in SOURCE[start:end] if r[0] == dt]
        buf = io.BytesIO()
        pq.write_table(
            pa.table({"id": pa.array([r[1] for r in part], pa.int64()), "name": [r[2] for r in part]}), buf
        )
        rel = f"dt={dt}/part-{uuid.uuid4().hex[:8]}.parquet"
        (attempt_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (attempt_dir / rel).write_bytes(buf.getvalue())
        files[rel], counts[rel] = buf.getvalue(), len(part)
    writer.add_files(files, rows=counts)
    manifest, _ = writer.seal(start_offsets={"src": start}, end_offsets={"src": end})
    store.mark_durable("events", key, attempt=writer.attempt, actor=ACTOR)
    return manifest


def test_an_append_rerun_after_retention_is_refused_not_recorded_with_the_reruns_offsets(kind, spec, url):
    """Table fencing reconciles a re-run to the attempt the table holds; it must never record that
    commit with the re-run's offsets (they would jump past rows nobody published)."""
    from datetime import timedelta

    from airflow_provider_walsink.core.commit.gc import trim_committer_table
    from airflow_provider_walsink.core.store.errors import OrderingError
    from airflow_provider_walsink.core.store.records import utcnow

    store = CommitterStore.from_url(url, migrate=False)
    layout = staging_of(kind, spec)
    for key, start, end in (("k1", 0, 10), ("k2", 10, 20), ("k3", 20, 30)):
        stage_interval(store, layout, key, start, end)
        committer(store, layout, kind, spec, "append").commit("events", key, actor=ACTOR)
    assert table_rows(kind, spec) == sorted(SOURCE[:30])

    # Retention removes k1's and k2's committer rows (k3, the latest committed, is kept); k1 is re-run:
    # it reads on from the last committed offsets (30), but the table already holds k1 (0 to 10).
    trim_committer_table(store, retention=timedelta(0), clock=lambda: utcnow() + timedelta(days=1))
    assert store.get("events", "k1") is None and store.last_committed_offsets("events") == {"src": 30}
    stage_interval(store, layout, "k1", 30, 40)
    with pytest.raises(OrderingError, match="offsets"):
        committer(store, layout, kind, spec, "append").commit("events", "k1", actor=ACTOR)
    record = store.require("events", "k1")
    assert record.state is not S.COMMITTED and record.error and "table holds attempt" in record.error
    assert store.last_committed_offsets("events") == {"src": 30}  # offsets never jumped past 30..40
    assert table_rows(kind, spec) == sorted(SOURCE[:30])

    # The way out the error names: abort the re-run; the next interval reads 30..40, every row once.
    aborter = CheckpointAborter(store, layout, make_publisher(kind, spec, "append"), sleep=lambda s: None)
    aborter.abort("events", "k1", reason="re-run of a trimmed interval", actor=ACTOR)
    stage_interval(store, layout, "k4", 30, 40)
    committer(store, layout, kind, spec, "append").commit("events", "k4", actor=ACTOR)
    assert table_rows(kind, spec) == sorted(SOURCE)
    assert store.last_committed_offsets("events") == {"src": 40}


def forget_offsets_in_table(kind: str, spec: dict) -> None:
    """Make the table unable to say which offsets its attempts read: an Iceberg marker as an earlier
    walsink wrote it (no offsets), a Delta log whose commits were cleaned up (log retention)."""
    import json

    table = make_publisher(kind, spec, "append").load_table()
    if kind == "iceberg":
        props = {
            k: json.dumps({f: v for f, v in json.loads(raw).items() if f != "offsets"})
            for k, raw in table.metadata.properties.items()
            if k.startswith("walsink.marker.")
        }
        tx = table.transaction()
        tx.set_properties(props)
        tx.commit_transaction()
        return
    from deltalake import DeltaTable

    table.alter.set_table_properties({"delta.logRetentionDuration": "interval 0 seconds"})
    table = DeltaTable(spec["uri"])
    table.create_checkpoint()
    time.sleep(1.1)
    table.cleanup_metadata()
    assert not [h for h in DeltaTable(spec["uri"]).history() if "walsink.offsets" in h]


def test_an_append_rerun_is_refused_when_the_table_cannot_say_which_offsets_it_holds(
    kind, spec, sqlite_store
):
    from datetime import timedelta

    from airflow_provider_walsink.core.commit.gc import trim_committer_table
    from airflow_provider_walsink.core.store.errors import OrderingError
    from airflow_provider_walsink.core.store.records import utcnow

    store = sqlite_store
    layout = staging_of(kind, spec)
    for key, start, end in (("k1", 0, 10), ("k2", 10, 20)):
        stage_interval(store, layout, key, start, end)
        committer(store, layout, kind, spec, "append").commit("events", key, actor=ACTOR)
    trim_committer_table(store, retention=timedelta(0), clock=lambda: utcnow() + timedelta(days=1))
    forget_offsets_in_table(kind, spec)
    stage_interval(store, layout, "k1", 20, 30)
    with pytest.raises(OrderingError, match="unknown offsets"):
        committer(store, layout, kind, spec, "append").commit("events", "k1", actor=ACTOR)
    record = store.require("events", "k1")
    assert record.state is not S.COMMITTED and "cannot be known" in (record.error or "")
    assert store.last_committed_offsets("events") == {"src": 20}
    assert table_rows(kind, spec) == sorted(SOURCE[:20])


def test_a_commit_whose_row_moved_on_records_the_offsets_of_the_attempt_it_published(kind, spec, pg_url):
    """A table-fenced committer publishes attempt 1 (offsets 0..10) and is stopped before COMMITTED;
    a cleared write task seals attempt 2, which read further (0..15). Resumed, the committer finds
    the row moved on and reconciles: COMMITTED as attempt 1 with attempt 1's offsets, never 0..15."""
    store = CommitterStore.from_url(pg_url, migrate=False)
    layout = staging_of(kind, spec)
    first = stage_interval(store, layout, KEY, 0, 10)
    proc = start_stopped_committer(kind, spec, "append", pg_url, str(layout.root), "commit.after_publish")
    stage_interval(store, layout, KEY, 0, 15)
    code, _out, err = resume(proc)
    assert code == 0, err
    record = store.require("events", KEY)
    assert record.state is S.COMMITTED and record.sealed_attempt_id == first.attempt_id
    assert (record.start_offsets, record.end_offsets) == ({"src": 0}, {"src": 10})
    assert store.last_committed_offsets("events") == {"src": 10}
    assert table_rows(kind, spec) == sorted(SOURCE[:10])


def test_an_aborted_append_interval_taken_over_by_a_later_commit_is_refused_under_table_fencing(
    kind, spec, sqlite_store
):
    """Issue 22, symptom 8, on a table target: abort k2, k3 reads on from k1's end and commits
    (table-fenced), the re-run of k2 is refused before it writes, with the reason recorded."""
    from airflow_provider_walsink.core.store.errors import OrderingError

    store = sqlite_store
    layout = staging_of(kind, spec)
    stage_interval(store, layout, "k1", 0, 10)
    committer(store, layout, kind, spec, "append").commit("events", "k1", actor=ACTOR)
    stage_interval(store, layout, "k2", 10, 20)
    aborter = CheckpointAborter(store, layout, make_publisher(kind, spec, "append"), sleep=lambda s: None)
    aborter.abort("events", "k2", reason="INC-1: bad input", actor=ACTOR)
    stage_interval(store, layout, "k3", 10, 25)
    committer(store, layout, kind, spec, "append").commit("events", "k3", actor=ACTOR)

    with pytest.raises(OrderingError, match="later checkpoint k3 .* took over"):
        stage_interval(store, layout, "k2", 25, 30)  # the write task's start: the last committed end
    record = store.require("events", "k2")
    assert record.state is S.ABORTED and "k3" in (record.error or "")
    assert table_rows(kind, spec) == sorted(SOURCE[:25])
    assert store.last_committed_offsets("events") == {"src": 25}
