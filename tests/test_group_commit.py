"""Group commit (issue 24): a committer publishes the durable checkpoints of its pipeline in one
Iceberg snapshot / Delta version, each with its own marker, checkpoint by checkpoint exactly once.

Real parts: Iceberg (pyiceberg SQL catalog) and Delta tables on local disk, the committer
table on PostgreSQL (and SQLite where only one process runs), real OS processes for the
races and the crash (SIGKILL at the fault point after the table commit).
"""

from __future__ import annotations

import io
import json
import multiprocessing
import os
import subprocess
import sys
import textwrap
import time
import traceback
import uuid
from collections import Counter
from datetime import timedelta

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_walsink.core import faults
from airflow_provider_walsink.core.commit import CheckpointCommitter, CheckpointWriter
from airflow_provider_walsink.core.commit.group import (
    commit_waiting_for_group,
    committed_by_group,
    is_group_owner,
)
from airflow_provider_walsink.core.protocol import CheckpointState as S
from airflow_provider_walsink.core.staging.layout import StagingLayout
from airflow_provider_walsink.core.store import Actor, CommitterStore
from airflow_provider_walsink.core.store.errors import LeaseHeldError
from airflow_provider_walsink.core.store.group_lead import GroupWait
from tests.helpers import ACTOR, REPO
from tests.table_fixtures import local_table_spec

pytestmark = pytest.mark.slow

PIPELINE = "events"


def make_publisher(kind: str, spec: dict, mode: str = "overwrite"):
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


def key_of(i: int) -> str:
    return f"202601{i + 1:02d}T000000Z"


def rows_of(i: int, n: int = 3) -> list[tuple[str, int, str]]:
    return [(f"2026-01-{i + 1:02d}", i * 100 + j, f"k{i}-{j}") for j in range(n)]


def stage(store: CommitterStore, layout: StagingLayout, key: str, rows: list[tuple]) -> None:
    """Register, write one attempt of Parquet files partitioned by dt, seal, DURABLE."""
    store.register(PIPELINE, key, mode="overwrite", actor=ACTOR, target="table")
    writer = CheckpointWriter(store, layout, PIPELINE, key, actor=ACTOR, partition_columns=("dt",))
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
    writer.seal()
    store.mark_durable(PIPELINE, key, attempt=writer.attempt, actor=ACTOR)


def table_rows(kind: str, spec: dict) -> Counter:
    table = make_publisher(kind, spec).load_table()
    if table is None:
        return Counter()
    arrow = table.scan().to_arrow() if kind == "iceberg" else table.to_pyarrow_table()
    return Counter((r["dt"], r["id"], r["name"]) for r in arrow.to_pylist())


def table_commits(kind: str, spec: dict) -> int:
    table = make_publisher(kind, spec).load_table()
    if kind == "iceberg":
        return len(table.snapshots())
    return sum(1 for h in table.history() if "walsink.pipeline" in h)


def group_commits(store: CommitterStore, keys: list[str]) -> int:
    return sum(
        1
        for k in keys
        for h in store.history(PIPELINE, k)
        if h.to_state == "COMMITTED" and committed_by_group(h.detail)
    )


def committer(store, layout, kind, spec, group: int = 16, ttl: float = 600.0) -> CheckpointCommitter:
    return CheckpointCommitter(
        store,
        layout,
        make_publisher(kind, spec),
        mode="overwrite",
        group_commit=group,
        lease_ttl=timedelta(seconds=ttl),
    )


def fresh_store(url: str) -> CommitterStore:
    from tests.conftest import _empty, _migrated_store

    _empty(_migrated_store(url))
    return CommitterStore.from_url(url, migrate=False)


# ----------------------------------------------------------------------------- in one process


def test_one_commit_publishes_every_durable_checkpoint_in_one_table_commit(kind, tmp_path, sqlite_store):
    store = sqlite_store
    spec = local_table_spec(kind, tmp_path)
    layout = StagingLayout(make_publisher(kind, spec).staging_root())
    keys = [key_of(i) for i in range(4)]
    for i, key in enumerate(keys):
        stage(store, layout, key, rows_of(i))

    from airflow_provider_walsink.core.commit.sealed import read_sealed_attempt
    from airflow_provider_walsink.core.staging.resolve import as_store

    manifests = [read_sealed_attempt(as_store(layout), store.require(PIPELINE, k))[0] for k in keys]

    summary = committer(store, layout, kind, spec).commit(PIPELINE, keys[0], actor=ACTOR)

    assert sorted(summary.group) == keys and summary.group[0] == keys[0]
    assert [store.require(PIPELINE, k).state for k in keys] == [S.COMMITTED] * 4
    assert table_rows(kind, spec) == Counter(r for i in range(4) for r in rows_of(i))
    assert table_commits(kind, spec) == 1  # one snapshot / one log version for all four
    assert group_commits(store, keys) == 4
    # Each member's own commit (its own task) is an answered no-op: the marker of each is its own.
    again = committer(store, layout, kind, spec, group=0).commit(PIPELINE, keys[2], actor=ACTOR)
    assert again.already_committed and again.attempt_id == store.require(PIPELINE, keys[2]).sealed_attempt_id
    publisher = make_publisher(kind, spec)
    for manifest in manifests:
        assert publisher.published_attempt(manifest) == manifest.attempt_id
    assert table_commits(kind, spec) == 1


def test_a_member_failing_verification_is_left_out_and_the_others_commit(kind, tmp_path, sqlite_store):
    store = sqlite_store
    spec = local_table_spec(kind, tmp_path)
    layout = StagingLayout(make_publisher(kind, spec).staging_root())
    keys = [key_of(i) for i in range(3)]
    for i, key in enumerate(keys):
        stage(store, layout, key, rows_of(i))
    # The third checkpoint's staged file is damaged after it was found durable.
    bad = store.require(PIPELINE, keys[2])
    attempt = layout.attempt_dir(PIPELINE, keys[2], bad.sealed_attempt, bad.sealed_attempt_id)
    damaged = next(p for p in attempt.rglob("*.parquet"))
    damaged.write_bytes(damaged.read_bytes() + b"junk")

    summary = committer(store, layout, kind, spec).commit(PIPELINE, keys[0], actor=ACTOR)

    assert sorted(summary.group) == keys[:2]
    assert [store.require(PIPELINE, k).state for k in keys[:2]] == [S.COMMITTED] * 2
    failed = store.require(PIPELINE, keys[2])
    assert failed.state is S.FAILED and "bytes staged, the manifest records" in failed.error
    assert failed.lease_owner is None
    assert table_rows(kind, spec) == Counter(r for i in range(2) for r in rows_of(i))


def test_checkpoints_replacing_the_same_partition_are_not_grouped(kind, tmp_path, sqlite_store):
    store = sqlite_store
    spec = local_table_spec(kind, tmp_path)
    layout = StagingLayout(make_publisher(kind, spec).staging_root())
    # Two keys writing the same day: the later key must win, as two sequential commits leave it.
    stage(store, layout, key_of(0), rows_of(0))
    stage(store, layout, key_of(1), [("2026-01-01", 999, "newer")])

    summary = committer(store, layout, kind, spec).commit(PIPELINE, key_of(0), actor=ACTOR)
    assert summary.group == []
    assert store.require(PIPELINE, key_of(1)).state is S.DURABLE  # never taken, unchanged
    committer(store, layout, kind, spec).commit(PIPELINE, key_of(1), actor=ACTOR)
    assert table_rows(kind, spec) == Counter([("2026-01-01", 999, "newer")])


# ----------------------------------------------------------------------------- processes

KILLED_LEADER = textwrap.dedent("""
    import json, sys
    from datetime import timedelta
    sys.path.insert(0, {repo!r})
    from tests.test_group_commit import make_publisher, PIPELINE
    from airflow_provider_walsink.core.store import Actor, CommitterStore
    from airflow_provider_walsink.core.commit import CheckpointCommitter
    from airflow_provider_walsink.core.staging.layout import StagingLayout
    kind, spec, url, staging, key = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
    store = CommitterStore.from_url(url, migrate=False)
    committer = CheckpointCommitter(store, StagingLayout(staging), make_publisher(kind, spec), mode="overwrite",
                                    group_commit=16, lease_ttl=timedelta(seconds=3))
    actor = Actor(name="dag.commit@leader", dag_id="dag", run_id="leader", task_id="commit", try_number=1)
    committer.commit(PIPELINE, key, actor=actor)
    sys.exit(3)
""")


def test_a_leader_killed_after_the_table_commit_leaves_members_its_tasks_reconcile(kind, tmp_path, pg_url):
    store = fresh_store(pg_url)
    spec = local_table_spec(kind, tmp_path)
    staging = make_publisher(kind, spec).staging_root()
    layout = StagingLayout(staging)
    keys = [key_of(i) for i in range(3)]
    for i, key in enumerate(keys):
        stage(store, layout, key, rows_of(i))
    env = {**os.environ, faults.ENV: "table.after_group_commit"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            KILLED_LEADER.format(repo=str(REPO)),
            kind,
            json.dumps(spec),
            pg_url,
            staging,
            keys[0],
        ],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -9, proc.stderr  # SIGKILLed at the fault point
    # The table holds all three, the committer table none: every one COMMITTING under the group.
    assert table_rows(kind, spec) == Counter(r for i in range(3) for r in rows_of(i))
    records = [store.require(PIPELINE, k) for k in keys]
    assert [r.state for r in records] == [S.COMMITTING] * 3
    assert all(is_group_owner(r.lease_owner) for r in records[1:])
    commits_before = table_commits(kind, spec)
    # Each member's own task: held by the group until the dead leader's lease expires, then it
    # takes it over, finds its marker in the table, and records COMMITTED without publishing.
    for key in keys[1:] + keys[:1]:
        actor = Actor(name=f"dag.commit@{key}", dag_id="dag", run_id=key, task_id="commit", try_number=1)
        deadline = time.monotonic() + 60
        while True:
            try:
                summary = committer(store, layout, kind, spec, group=16).commit(PIPELINE, key, actor=actor)
                break
            except LeaseHeldError:
                assert time.monotonic() < deadline
                time.sleep(0.5)
        assert summary.published == 0 and summary.already_published > 0
    assert [store.require(PIPELINE, k).state for k in keys] == [S.COMMITTED] * 3
    assert table_rows(kind, spec) == Counter(r for i in range(3) for r in rows_of(i))
    assert table_commits(kind, spec) == commits_before
    store.dispose()


def _count_connections() -> dict[str, int]:
    """Count this process's open database connections, every engine's (pyiceberg's own too):
    ``{"open": now, "peak": most at once}``."""
    from sqlalchemy import event
    from sqlalchemy.pool import Pool

    counts = {"open": 0, "peak": 0}

    def opened(*_args) -> None:
        counts["open"] += 1
        counts["peak"] = max(counts["peak"], counts["open"])

    def closed(*_args) -> None:
        counts["open"] -= 1

    event.listen(Pool, "connect", opened)
    event.listen(Pool, "close", closed)
    event.listen(Pool, "close_detached", closed)
    return counts


def _commit_own(kind: str, spec: dict, url: str, staging: str, key: str, group: int, barrier, out) -> None:
    """One commit task in its own process: commit its own checkpoint, waiting while a group has it;
    the store as a task's (``CommitterStore.shared``, which an SQL catalog on its database shares)."""
    try:
        connections = _count_connections()
        store = CommitterStore.shared(url, migrate=False)
        c = committer(store, StagingLayout(staging), kind, spec, group=group, ttl=120)
        actor = Actor(name=f"dag.commit@{key}", dag_id="dag", run_id=key, task_id="commit", try_number=1)
        barrier.wait(120)  # released together, as a backfill's commit tasks whose writes finished at once
        summary = commit_waiting_for_group(c, PIPELINE, key, actor=actor, poll=0.2, patience=240)
        out.put((key, "ok", summary.already_committed, len(summary.group), connections["peak"]))
    except BaseException:  # noqa: BLE001 - reported to the test
        out.put((key, "error", traceback.format_exc(), 0, 0))


# Iceberg through PgBouncer (committer table and catalog: a pooler changes nothing but the
# transport, so it carries the direct case's claims too), Delta directly.
@pytest.mark.parametrize(("kind", "via"), [("iceberg", "pgbouncer"), ("delta", "direct")])
def test_commit_tasks_released_together_form_full_groups_and_commit_every_row_once(
    kind, via, tmp_path, pg_url, request
):
    """16 commit processes released at once, one per durable checkpoint, ``group_commit=7``: one
    leads at a time and the others leave their checkpoints to its group, so the table gets
    exactly ceil(16 / 8) = 2 commits, both by the first leader (before the group-commit lead, each
    task leased its own checkpoint first: groups of 2-8 formed and met at the table).

    Each task holds at most one database connection, the leader included, for the committer
    table and the Iceberg catalog on the same database together (before issue 46: a second for
    the catalog, and a leader's third for its wake-up lock). Through PgBouncer in transaction
    mode (``via="pgbouncer"``: committer and catalog both) the same."""
    store = fresh_store(pg_url)
    url = request.getfixturevalue("pgbouncer").url(pg_url) if via == "pgbouncer" else pg_url
    spec = local_table_spec(kind, tmp_path)
    if kind == "iceberg":
        spec["props"]["uri"] = url  # the catalog on the committer's database
    staging = make_publisher(kind, spec).staging_root()
    layout = StagingLayout(staging)
    keys = [key_of(i) for i in range(16)]
    for i, key in enumerate(keys):
        stage(store, layout, key, rows_of(i))
    # A fork server imports the table libraries once, not once per process.
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__, "pyiceberg.catalog.sql", "deltalake"])
    barrier, out = ctx.Barrier(16), ctx.Queue()
    procs = [
        ctx.Process(target=_commit_own, args=(kind, spec, url, staging, k, 7, barrier, out)) for k in keys
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=400) for _ in procs]
    for p in procs:
        p.join(60)
    errors = [r for r in results if r[1] != "ok"]
    assert not errors, errors[0][2]
    assert [p.exitcode for p in procs] == [0] * 16
    assert [store.require(PIPELINE, k).state for k in keys] == [S.COMMITTED] * 16
    assert table_rows(kind, spec) == Counter(r for i in range(16) for r in rows_of(i))  # each row once
    assert table_commits(kind, spec) == 2
    # One task led both groups of eight: the lead is not handed over while checkpoints wait for it.
    assert [n for _k, _ok, _already, n, _peak in results if n] == [8]
    assert group_commits(store, keys) == 16
    assert store.group_leader(PIPELINE) is None  # the last leader gave the lead up
    assert [peak for *_, peak in results] == [1] * 16  # one connection per task, never two
    store.dispose()


def test_a_commit_task_waits_while_a_group_holds_its_checkpoint_then_takes_it_over(tmp_path, sqlite_store):
    """The member's own commit task (``WalCommitOperator``) finds its checkpoint held by a group
    commit's leader (here one that died: its lease just runs out): it waits instead of failing,
    then takes the lease over and commits."""
    from airflow_provider_walsink.operators.commit import WalCommitOperator

    store = sqlite_store
    spec = local_table_spec("delta", tmp_path)
    layout = StagingLayout(make_publisher("delta", spec).staging_root())
    stage(store, layout, key_of(0), rows_of(0))
    store.acquire_lease(
        PIPELINE,
        key_of(0),
        owner="group:dead-leader",
        ttl=timedelta(seconds=2),
        actor=ACTOR,
        mode="overwrite",
    )
    op = WalCommitOperator(
        task_id="commit",
        pipeline=PIPELINE,
        target=f"delta://{spec['uri']}",
        group_commit=4,
        group_poll=timedelta(seconds=0.2),
        lease_ttl=timedelta(seconds=30),
        emit_asset_events=False,
    )
    actor = Actor(name="dag.commit@own", dag_id="dag", run_id="own", task_id="commit", try_number=1)
    summary = op._commit_waiting_for_group(committer(store, layout, "delta", spec), key_of(0), actor)
    assert summary.lease_taken_over_from == "group:dead-leader"
    assert store.require(PIPELINE, key_of(0)).state is S.COMMITTED
    assert table_rows("delta", spec) == Counter(rows_of(0))


def test_one_group_leader_at_a_time_and_a_waiter_sees_the_lead_in_one_read(store):
    """The pipeline's group-commit lead: one holder, a lead that ran out is taken over; a task
    waiting for it looks with one read (``group_wait``) and sees the lead end when it is given up
    or runs out, on the database's clock."""
    pipeline = f"lead_{uuid.uuid4().hex[:8]}"
    store.register(pipeline, key_of(0), mode="overwrite", actor=ACTOR, target="table")
    assert store.lead_group(pipeline, "a", ttl=timedelta(minutes=1)) == "a"
    assert store.lead_group(pipeline, "b", ttl=timedelta(minutes=1)) == "a"  # one leader
    assert store.group_leader(pipeline) == "a"
    look = store.group_wait(pipeline, key_of(0))
    assert look == GroupWait(S.REGISTERED, lease_owner=None, lease_live=False, lead_live=True)
    assert store.group_wait(pipeline, "unknown") is None

    store.release_group_lead(pipeline, "a")
    assert store.group_wait(pipeline, key_of(0)).lead_live is False
    assert store.group_leader(pipeline) is None

    assert store.lead_group(pipeline, "c", ttl=timedelta(milliseconds=1)) == "c"
    time.sleep(0.05)
    assert store.group_wait(pipeline, key_of(0)).lead_live is False  # ran out
    assert store.lead_group(pipeline, "b", ttl=timedelta(minutes=1)) == "b"  # c's lead ran out
    store.release_group_lead(pipeline, "c")  # no longer c's: changes nothing
    assert store.group_leader(pipeline) == "b"
    assert store.group_wait(pipeline, key_of(0)).lead_live is True
    store.release_group_lead(pipeline, "b")


def test_a_group_into_a_delta_table_that_expires_markers_is_refused_with_every_member_left_uncommitted(
    tmp_path, sqlite_store
):
    """A group commit reads and writes the same markers a single commit does: into a Delta table
    that sets ``delta.setTransactionRetentionDuration`` nothing is published, the leader records
    the refusal and the members are released, uncommitted, to their own tasks."""
    from airflow_provider_walsink.core.protocol.errors import TargetStateError

    store = sqlite_store
    spec = local_table_spec("delta", tmp_path)
    layout = StagingLayout(make_publisher("delta", spec).staging_root())
    stage(store, layout, key_of(0), rows_of(0))
    committer(store, layout, "delta", spec, group=0).commit(PIPELINE, key_of(0), actor=ACTOR)
    table = make_publisher("delta", spec).load_table()
    table.alter.set_table_properties({"delta.setTransactionRetentionDuration": "interval 30 days"})
    keys = [key_of(i) for i in range(1, 4)]
    for i, key in enumerate(keys, start=1):
        stage(store, layout, key, rows_of(i))
    from deltalake import DeltaTable

    version = DeltaTable(spec["uri"]).version()

    with pytest.raises(TargetStateError, match="delta.setTransactionRetentionDuration"):
        committer(store, layout, "delta", spec).commit(PIPELINE, keys[0], actor=ACTOR)

    assert DeltaTable(spec["uri"]).version() == version
    leader, *members = [store.require(PIPELINE, k) for k in keys]
    assert leader.state is S.FAILED and "delta.setTransactionRetentionDuration" in (leader.error or "")
    # The members go back unheld, to be committed by their own tasks (which are refused alike).
    assert [(m.state, m.lease_owner) for m in members] == [(S.COMMITTING, None)] * 2
    # The members were in the group (held, then released by it), not left out of it.
    for key in keys[1:]:
        assert any(
            f"group commit of {keys[0]} failed" in (h.detail or "") for h in store.history(PIPELINE, key)
        )
    with pytest.raises(TargetStateError, match="delta.setTransactionRetentionDuration"):
        committer(store, layout, "delta", spec, group=0).commit(PIPELINE, keys[1], actor=ACTOR)
    assert DeltaTable(spec["uri"]).version() == version
    read = DeltaTable(spec["uri"]).to_pyarrow_table().to_pylist()  # the publisher refuses to load it
    assert Counter((r["dt"], r["id"], r["name"]) for r in read) == Counter(rows_of(0))
