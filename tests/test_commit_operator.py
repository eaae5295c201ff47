"""WalCommitOperator in a real Airflow run (``dag.test()``)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from airflow_provider_walsink.core.protocol import CheckpointState as S
from airflow_provider_walsink.core.staging import StagingLayout
from airflow_provider_walsink.core.store import CommitterStore
from airflow_provider_walsink.hooks import versions
from tests.helpers import missing_prerequisite, stage_checkpoint, target_files

#: These claims rest on reading the alias's asset events, which Airflow 3.1 cannot (the commit task
#: then adds its event without reading; docs/production.md, "Supported Airflow versions").
needs_event_queries = pytest.mark.skipif(
    versions.missing("asset_event_queries") is not None,
    reason=f"asset event queries need Airflow 3.2+: {versions.missing('asset_event_queries')}",
)

FILES = {f"dt=2026-03-0{d}/part-0.csv": f"2026-03-0{d},x\n".encode() * d for d in (1,)}
INTERVAL_START = datetime(2026, 3, 1, tzinfo=UTC)
KEY = "20260301T000000Z"


@pytest.fixture
def walsink_conn(monkeypatch, db_url, tmp_path):
    staging = tmp_path / "staging"
    monkeypatch.setenv(
        "AIRFLOW_CONN_WALSINK_TEST",
        json.dumps({"conn_type": "walsink", "extra": {"url": db_url, "staging_root": str(staging)}}),
    )
    return CommitterStore.from_url(db_url), StagingLayout(staging)


class _Events:
    """``context["outlet_events"]`` with one alias's accessor, looked up by equality as Airflow's
    accessors are (a plain dict would need the alias to be hashable, which it is not on Airflow 3.1)."""

    def __init__(self, alias, accessor):
        self.alias, self.accessor = alias, accessor

    def __getitem__(self, key):
        assert key == self.alias
        return self.accessor


def build_dag(target, *, key=None, **operator_kwargs):
    from airflow.sdk import DAG

    from airflow_provider_walsink.operators.commit import WalCommitOperator

    with DAG(
        "walsink_commit_operator_test", schedule="@daily", start_date=INTERVAL_START, catchup=False
    ) as dag:
        WalCommitOperator(
            task_id="commit",
            pipeline="events",
            target=str(target),
            mode="overwrite",
            walsink_conn_id="walsink_test",
            checkpoint_key=key,
            **operator_kwargs,
        )
    return dag


def run(dag):
    dr = dag.test(logical_date=INTERVAL_START)
    return {ti.task_id: ti.state for ti in dr.get_task_instances()}, dr


def test_commit_task_publishes_a_durable_checkpoint_and_a_rerun_changes_nothing(
    airflow_db, walsink_conn, tmp_path
):
    store, layout = walsink_conn
    target = tmp_path / "target"
    stage_checkpoint(store, layout, "events", KEY, FILES)  # key defaults from the data interval
    states, _ = run(build_dag(target))
    assert states == {"commit": "success"}
    record = store.require("events", KEY)
    assert record.state is S.COMMITTED
    committing = [h for h in store.history("events", KEY) if h.to_state == "COMMITTED"][0]
    assert (committing.dag_id, committing.task_id) == ("walsink_commit_operator_test", "commit")
    published = target_files(target)
    assert sorted(published.values()) == sorted(FILES.values())

    states, _ = run(build_dag(target))
    assert states == {"commit": "success"}
    assert target_files(target) == published
    assert [h.to_state for h in store.history("events", KEY)].count("COMMITTED") == 1


def test_commit_task_fails_naming_what_is_missing_when_not_durable(airflow_db, walsink_conn, tmp_path):
    store, layout = walsink_conn
    stage_checkpoint(store, layout, "events", KEY, FILES, durable=False)
    states, _ = run(build_dag(tmp_path / "target"))
    assert states == {"commit": "failed"}
    assert store.require("events", KEY).state is S.SEALED
    assert not (tmp_path / "target").exists()


def asset_events(dag_run) -> list[dict]:
    """Asset events Airflow recorded for the walsink alias of pipeline ``events`` in one run."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.execute(
            select(AssetEvent.extra, AssetModel.uri)
            .join(AssetModel, AssetEvent.asset_id == AssetModel.id)
            .where(AssetEvent.source_run_id == dag_run.run_id, AssetModel.name == "walsink/events")
        ).all()
    return [{"uri": uri, **(extra or {})} for extra, uri in rows]


def test_asset_event_only_when_the_commit_is_new(airflow_db, walsink_conn, tmp_path):
    """Issue 15: an asset-scheduled downstream runs once per new commit, never on a no-op re-run."""
    store, layout = walsink_conn
    target = tmp_path / "target"
    stage_checkpoint(store, layout, "events", KEY, FILES)
    dag = build_dag(target)
    assert [o.name for o in dag.get_task("commit").outlets] == ["walsink-events"]
    states, first = run(dag)
    assert states == {"commit": "success"}
    events = asset_events(first)
    assert len(events) == 1, events
    assert events[0]["uri"] == f"file://{target}"
    assert events[0]["pipeline"] == "events" and events[0]["checkpoint_key"] == KEY
    assert events[0]["rows"] == 1 and events[0]["files"] == 1

    # dag.test() of the same interval again: the checkpoint is committed, nothing new, no event.
    with __import__("airflow.utils.session", fromlist=["create_session"]).create_session() as session:
        from airflow.models.asset import AssetEvent

        before = session.query(AssetEvent).count()
    states, _ = run(build_dag(target))
    assert states == {"commit": "success"}
    with __import__("airflow.utils.session", fromlist=["create_session"]).create_session() as session:
        assert session.query(AssetEvent).count() == before


@needs_event_queries
def test_a_table_commit_reconciled_by_the_retry_is_announced_once(airflow_db, walsink_conn, tmp_path):
    """``fencing="table"``: a try that made the table commit and died before COMMITTED delivered
    no asset event; the write task was then cleared (attempt 2 sealed). The next commit try
    reconciles attempt 1 from the table (it records COMMITTED, as already committed) and adds the
    event, once: a run of it again finds the event and adds none.
    """
    from airflow_provider_walsink.core.commit.tablefence import TableFenceContext
    from tests.test_table_fence import DAY, DAY_NEW, make_publisher, stage, staging_of, table_rows

    store, _ = walsink_conn
    spec = {"uri": str(tmp_path / "events_table")}
    layout = staging_of("delta", spec)
    manifest = stage(store, layout, DAY)
    # The dead try's table commit (the committer row stays DURABLE: it never recorded COMMITTED).
    make_publisher("delta", spec, "overwrite").publish(
        manifest,
        layout.attempt_dir("events", manifest.checkpoint_key, manifest.attempt, manifest.attempt_id),
        TableFenceContext(
            "events", manifest.checkpoint_key, attempt_id=manifest.attempt_id, epoch=1, supersedes=None
        ),
    )
    stage(store, layout, DAY_NEW)  # the cleared write task's attempt 2

    def dag():
        return build_dag(
            f"delta://{spec['uri']}", key=manifest.checkpoint_key, partition_by=["dt"], fencing="table"
        )

    states, first = run(dag())
    assert states == {"commit": "success"}
    assert "reconciled from the table" in store.history("events", manifest.checkpoint_key)[-1].detail
    [event] = asset_events(first)
    assert event["attempt"] == manifest.attempt
    # Issue 47: the event counts the files this version made visible (the dead try published them).
    assert event["published"] == event["files"] == manifest.expected_count == 2
    assert event["announced"] == "reconciled"
    assert table_rows("delta", spec) == sorted(DAY)

    from airflow.models.asset import AssetEvent
    from airflow.utils.session import create_session

    with create_session() as session:
        before = session.query(AssetEvent).count()
    states, _ = run(dag())  # the interval's commit task once more: nothing new, no event
    assert states == {"commit": "success"}
    with create_session() as session:
        assert session.query(AssetEvent).count() == before


@needs_event_queries
def test_a_checkpoint_committed_by_a_group_is_announced_once_by_its_own_task(
    airflow_db, walsink_conn, tmp_path
):
    """Issue 24: another task's group commit published this interval's checkpoint with its own. The
    interval's own commit task is an answered no-op that says so and adds the checkpoint's asset
    event (the leader announces only its own); a run of it again adds none."""
    from airflow.models.asset import AssetEvent
    from airflow.utils.session import create_session

    from airflow_provider_walsink.core.commit import CheckpointCommitter
    from airflow_provider_walsink.core.store import Actor
    from tests.test_group_commit import make_publisher, stage, table_rows

    store, _ = walsink_conn
    spec = {"uri": str(tmp_path / "events_table")}
    publisher = make_publisher("delta", spec)
    layout = StagingLayout(publisher.staging_root())
    other = "20260228T000000Z"
    stage(store, layout, other, [("2026-02-28", 1, "a")])
    stage(store, layout, KEY, [("2026-03-01", 2, "b"), ("2026-03-01", 3, "c")])
    leader = Actor(
        name="dag.commit@other", dag_id="other_dag", run_id="other", task_id="commit", try_number=1
    )
    summary = CheckpointCommitter(store, layout, publisher, mode="overwrite", group_commit=8).commit(
        "events", other, actor=leader
    )
    assert summary.group == [other, KEY]
    assert store.require("events", KEY).state is S.COMMITTED

    def dag():
        return build_dag(f"delta://{spec['uri']}", partition_by=["dt"], group_commit=8)

    states, first = run(dag())
    assert states == {"commit": "success"}
    [event] = asset_events(first)
    record = store.require("events", KEY)
    assert (event["checkpoint_key"], event["attempt_id"]) == (KEY, record.sealed_attempt_id)
    assert table_rows("delta", spec) == {
        ("2026-02-28", 1, "a"): 1,
        ("2026-03-01", 2, "b"): 1,
        ("2026-03-01", 3, "c"): 1,
    }

    with create_session() as session:
        before = session.query(AssetEvent).count()
    states, again = run(dag())  # the interval's commit task once more (a clear): no second event
    assert states == {"commit": "success"}
    assert asset_events(again) == []
    with create_session() as session:
        assert session.query(AssetEvent).count() == before


# The announcement does not depend on the committer database: one is enough.
@pytest.mark.parametrize("backend", ["postgresql"])
def test_every_member_of_a_group_commit_announces_its_own_files_and_the_group(
    airflow_db, walsink_conn, tmp_path
):
    """Issue 47: four partitions' commit tasks in one run; the first leads a group commit of all
    four, the other three find theirs committed by it. Each of the four asset events carries its
    own checkpoint's files (published > 0: a consumer filtering on it sees all four) and the same
    group identity (leader, size, table version)."""
    from airflow.sdk import DAG

    from airflow_provider_walsink.operators.commit import WalCommitOperator
    from tests.test_group_commit import make_publisher, stage, table_rows

    store, _ = walsink_conn
    spec = {"uri": str(tmp_path / "events_table")}
    layout = StagingLayout(make_publisher("delta", spec).staging_root())
    keys = [f"2026030{d}T000000Z" for d in range(1, 5)]
    for d, key in enumerate(keys, start=1):
        stage(store, layout, key, [(f"2026-03-0{d}", 10 * d + n, "x") for n in range(d)])
    with DAG("walsink_group_events_test", schedule="@daily", start_date=INTERVAL_START, catchup=False) as dag:
        previous = None
        for key in keys:
            task = WalCommitOperator(
                task_id=f"commit_{key[:8]}", pipeline="events", target=f"delta://{spec['uri']}?create_table=true",
                mode="overwrite", partition_by=["dt"], walsink_conn_id="walsink_test", checkpoint_key=key,
                group_commit=8,
            )  # fmt: skip
            if previous is not None:
                previous >> task
            previous = task
    states, dag_run = run(dag)
    assert set(states.values()) == {"success"}, states
    events = {e["checkpoint_key"]: e for e in asset_events(dag_run)}
    assert sorted(events) == keys
    groups = {json.dumps(e["group"], sort_keys=True) for e in events.values()}
    assert len(groups) == 1, groups
    group = events[keys[0]]["group"]
    assert (group["leader"], group["size"]) == (keys[0], 4) and group["snapshot"] is not None
    for key, event in events.items():
        record = store.require("events", key)
        assert event["files"] == record.committables == 1
        assert event["published"] == 1, (key, event)
        assert event["rows"] == record.rows
        assert event["announced"] == ("new commit" if key == keys[0] else "group member")
    assert [k for k, e in events.items() if e["published"] > 0] == keys
    assert sum(table_rows("delta", spec).values()) == 1 + 2 + 3 + 4


def test_openlineage_facets_of_an_executed_commit_name_the_target_and_the_checkpoint(walsink_conn, tmp_path):
    """Issue 15: the lineage the OpenLineage provider asks the commit operator for, after a real commit.

    (The provider's listener emitting these through a file transport was checked in a process of
    its own; inside this test session an earlier dag.test() has already decided it is off.)
    """
    from types import SimpleNamespace

    try:
        import airflow.providers.openlineage  # noqa: F401 - the provider this lineage is for
    except ImportError as exc:  # the oldest-Airflow venv has no OpenLineage provider; CI does
        missing_prerequisite(f"apache-airflow-providers-openlineage is not installed: {exc}")
    store, layout = walsink_conn
    target = tmp_path / "target"
    stage_checkpoint(store, layout, "events", KEY, FILES)
    task = build_dag(target).get_task("commit")
    added = []

    class Accessor:
        def add(self, asset, extra=None):
            added.append((asset.uri, extra))

    ti = SimpleNamespace(dag_id="walsink_commit_operator_test", task_id="commit", run_id="manual", try_number=1,
                         map_index=-1, id=None)  # fmt: skip
    context = {
        "ti": ti,
        "logical_date": INTERVAL_START,
        "data_interval_start": INTERVAL_START,
        "data_interval_end": INTERVAL_START,
        # Looked up by the alias, as Airflow's accessors are (an alias is not hashable on Airflow 3.1).
        "outlet_events": _Events(task.asset_alias, Accessor()),
    }
    summary = task.execute(context)
    assert summary["state"] == "COMMITTED" and added == [(f"file://{target}", added[0][1])]
    lineage = task.get_openlineage_facets_on_complete(None)
    assert [(d.namespace, d.name) for d in lineage.outputs] == [("file", str(target))]
    assert lineage.outputs[0].outputFacets["outputStatistics"].rowCount == 1
    facet = lineage.run_facets["walsink"]
    assert (facet.pipeline, facet.checkpointKey, facet.state) == ("events", KEY, "COMMITTED")
    assert facet.attemptId == store.require("events", KEY).sealed_attempt_id
    # A re-run changes nothing and adds no asset event.
    assert task.execute(context)["already_committed"] and len(added) == 1


@needs_event_queries
def test_a_first_event_claim_left_by_a_dead_commit_task_is_taken_over(
    airflow_db, walsink_conn, tmp_path, monkeypatch
):
    """A commit task that finds no event of its target through the alias yet, and the pipeline's
    first-event claim held by another task (one that died before its success), waits until the
    claim is stale, takes it over and adds its event (``core/store/first_event.py``)."""
    from datetime import timedelta

    from sqlalchemy import select

    from airflow_provider_walsink.core.store.models import pipeline_table as pipe
    from airflow_provider_walsink.operators.commit import WalCommitOperator

    store, layout = walsink_conn
    target = tmp_path / "target"  # a new asset: no event of it has gone through the alias
    stage_checkpoint(store, layout, "events", KEY, FILES)
    dead = "other_dag/manual__x/commit/-1"
    assert store.claim_first_event("events", dead, stale_after=timedelta(minutes=2))
    monkeypatch.setattr(WalCommitOperator, "first_event_stale_after", timedelta(seconds=2))
    monkeypatch.setattr(WalCommitOperator, "first_event_poll", 0.2)

    states, dag_run = run(build_dag(target))
    assert states == {"commit": "success"}
    [event] = asset_events(dag_run)
    assert event["uri"] == f"file://{target}" and event["checkpoint_key"] == KEY
    with store.engine.connect() as conn:
        holder = conn.execute(select(pipe.c.first_event_holder).where(pipe.c.name == "events")).scalar_one()
    assert (
        holder == f"walsink_commit_operator_test/{dag_run.run_id}/commit/-1"
    )  # taken over from the dead one


@needs_event_queries
def test_asset_events_that_cannot_be_read_do_not_hold_the_commit_back(
    airflow_db, walsink_conn, tmp_path, monkeypatch
):
    """When the alias's events cannot be read (an injected fault at the Task SDK's accessor), the
    commit task neither fails nor waits on a claim another task holds: it adds its event as before
    the claim existed, and leaves the claim alone."""
    from datetime import timedelta

    from airflow.sdk.execution_time.context import InletEventsAccessor
    from sqlalchemy import select

    from airflow_provider_walsink.core.store.models import pipeline_table as pipe

    def unreadable(self):
        raise RuntimeError("injected: the execution API is unreachable")

    store, layout = walsink_conn
    target = tmp_path / "target"
    stage_checkpoint(store, layout, "events", KEY, FILES)
    other = "other_dag/manual__x/commit/-1"
    assert store.claim_first_event("events", other, stale_after=timedelta(minutes=2))
    monkeypatch.setattr(InletEventsAccessor, "_asset_events", property(unreadable))

    states, dag_run = run(build_dag(target))
    assert states == {"commit": "success"}
    assert store.require("events", KEY).state is S.COMMITTED
    [event] = asset_events(dag_run)
    assert event["checkpoint_key"] == KEY
    with store.engine.connect() as conn:
        holder = conn.execute(select(pipe.c.first_event_holder).where(pipe.c.name == "events")).scalar_one()
    assert holder == other  # not taken: nothing could tell whether the first event was recorded
