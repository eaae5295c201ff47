"""End to end on the shared Airflow stack (issue 37): asset partitions as checkpoint keys.

``walsink_partitioned_example`` (``CronPartitionTimetable``, keys ``%Y-%m-%d``) writes a Delta
table one partition at a time; ``walsink_partitioned_downstream_example`` is scheduled on its
asset by a ``PartitionedAssetTimetable`` (identity mapper). Through the real scheduler:

1. a backfill over a partition range (``POST /api/v2/backfills``, as ``airflow backfill create``)
   commits each partition once, under its partition's checkpoint key (``pk=2026-03-01``), into
   exactly its Delta partition ``dt=<key>`` (read back with deltalake and the committer table);
   each commit adds one asset event carrying the partition key;
2. the downstream DAG runs once per newly committed partition, with that partition as its own
   ``partition_key``;
3. the range backfilled again (``--reprocess-behavior completed``, the pipeline's policy
   ``skip``) changes nothing and adds no asset event; a ``replace`` of one partition writes
   version 2 of that partition only, and the downstream DAG runs again for exactly that one.

The stack's scheduler creates no asset-triggered runs outside ``AirflowStack.asset_scheduling``
(which also pauses the upstream DAG, so it schedules nothing of its own): the downstream runs
are created inside the two blocks below, from what was queued before each.
"""

from __future__ import annotations

import sys
from collections import Counter
from datetime import date
from pathlib import Path

import pytest

from airflow_provider_walsink.core.staging.layout import StagingLayout
from airflow_provider_walsink.core.store.store import CommitterStore

pytestmark = [pytest.mark.e2e, pytest.mark.spark, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent
UPSTREAM = "walsink_partitioned_example"
DOWNSTREAM = "walsink_partitioned_downstream_example"
PIPELINE = "delta_partitioned_events"
#: Two partitions no other test of the shared stack writes.
DAYS = [date(2026, 3, 1), date(2026, 3, 2)]
KEYS = [d.isoformat() for d in DAYS]
WRITE_OP, COMMIT_OP = "WalWriteOperator", "WalCommitOperator"


def _examples():
    sys.path.insert(0, str(REPO / "dags"))
    try:
        import walsink_example_common
    finally:
        sys.path.remove(str(REPO / "dags"))
    return walsink_example_common


def _backfill_runs(stack, backfill_id: int, seen: set[str], dag_id: str = UPSTREAM) -> dict[str, dict]:
    """The runs of a finished backfill (the backfill runs not in ``seen``, which it then holds), by
    partition key (``wait_for_backfill`` matches logical dates, which partitioned runs lack)."""
    stack.wait_until(
        f"backfill {backfill_id} to complete",
        lambda: stack.get(f"/api/v2/backfills/{backfill_id}")["completed_at"],
        timeout=900,
    )
    runs = [r for r in stack.dag_runs(dag_id) if r["run_type"] == "backfill" and r["dag_run_id"] not in seen]
    seen.update(r["dag_run_id"] for r in runs)
    stack.wait_for_runs(dag_id, [r["dag_run_id"] for r in runs], timeout=900)
    finished = {r["dag_run_id"]: r for r in stack.dag_runs(dag_id)}
    return {r["partition_key"]: finished[r["dag_run_id"]] for r in runs}


def _events(stack, run_id: str, dag_id: str = UPSTREAM) -> list[dict]:
    found = stack.get("/api/v2/assets/events", source_dag_id=dag_id, source_run_id=run_id, limit=100)
    return [e for e in found["asset_events"] if e["source_run_id"] == run_id]


def _downstream_runs(stack, dag_id: str = DOWNSTREAM) -> dict[str, dict]:
    return {r["dag_run_id"]: r for r in stack.dag_runs(dag_id)}


def _new_downstream_runs(stack, before: set[str], count: int, dag_id: str = DOWNSTREAM) -> dict[str, dict]:
    """Inside an asset_scheduling block: wait until ``count`` new downstream runs have finished."""

    def finished() -> dict[str, dict] | None:
        new = {k: v for k, v in _downstream_runs(stack, dag_id).items() if k not in before}
        done = all(r["state"] in ("success", "failed") for r in new.values())
        return new if len(new) >= count and done else None

    return stack.wait_until(f"{count} downstream run(s)", finished, timeout=300)


def _check_table(table_rows: list[dict]) -> None:
    """The Delta table holds each partition's source events once, each in its own dt."""
    examples = _examples()
    by_day = Counter(str(r["dt"]) for r in table_rows)
    assert set(by_day) == set(KEYS), by_day
    for day in DAYS:
        want = {e["event_id"] for e in examples.daily_events(day)}
        got = [r["event_id"] for r in table_rows if str(r["dt"]) == day.isoformat()]
        assert len(got) == len(set(got)), f"an event of {day} is in the table twice"
        assert set(got) == want, f"dt={day}: {len(want - set(got))} missing, {len(set(got) - want)} extra"


def test_partitioned_backfill_commits_each_partition_once_and_runs_downstream_per_new_partition(
    airflow_stack,
):
    from deltalake import DeltaTable

    stack = airflow_stack
    store = CommitterStore.from_url(f"sqlite:///{stack.home}/walsink/committer.db", migrate=False)
    table_path = stack.home / "walsink" / "examples" / "target" / PIPELINE
    try:
        stack.wait_for_dag(UPSTREAM)
        stack.wait_for_dag(DOWNSTREAM)
        stack.unpause(UPSTREAM)
        stack.unpause(DOWNSTREAM)  # events queue runs only for an unpaused DAG
        before = set(_downstream_runs(stack))
        seen = {r["dag_run_id"] for r in stack.dag_runs(UPSTREAM)}

        # 1. A backfill over the partition range: each partition committed once.
        runs = _backfill_runs(stack, stack.backfill(UPSTREAM, KEYS[0], KEYS[-1], max_active_runs=2), seen)
        assert sorted(runs) == KEYS, runs
        for key, run in runs.items():
            assert run["state"] == "success", (key, stack.task_states(UPSTREAM, run["dag_run_id"]))
            assert run["logical_date"] is None  # a partitioned run: no data interval, only its key
            record = store.require(PIPELINE, f"pk={key}")
            assert (record.state.value, record.version, record.run_id) == ("COMMITTED", 1, run["dag_run_id"])
            [event] = _events(stack, run["dag_run_id"])
            assert event["partition_key"] == key  # Airflow's own partition key of the event
            assert event["extra"]["checkpoint_key"] == f"pk={key}" and event["extra"]["partition_key"] == key
            assert event["extra"]["rows"] == record.rows
        assert sorted(r.checkpoint_key for r in store.checkpoints(PIPELINE)) == [f"pk={k}" for k in KEYS]
        table = DeltaTable(str(table_path))
        _check_table(table.to_pyarrow_table().to_pylist())
        first_version = table.version()

        # 2. The downstream DAG: one run per newly committed partition, for that partition.
        with stack.asset_scheduling(keep_unpaused=[DOWNSTREAM]):
            first = _new_downstream_runs(stack, before, len(KEYS))
        assert sorted(r["partition_key"] for r in first.values()) == KEYS, first
        for run in first.values():
            assert run["state"] == "success", run
            [task] = stack.task_instances(DOWNSTREAM, run["dag_run_id"])
            reported = stack.xcom(DOWNSTREAM, run["dag_run_id"], task["task_id"])
            assert reported["partition_key"] == run["partition_key"]
        before |= set(first)

        # 3a. The same range again: the write tasks skip (reprocess "skip"), nothing changes and no
        # asset event is added, so nothing can queue a downstream run.
        again = _backfill_runs(
            stack,
            stack.backfill(UPSTREAM, KEYS[0], KEYS[-1], reprocess_behavior="completed", max_active_runs=2),
            seen,
        )
        assert sorted(again) == KEYS
        for key, run in again.items():
            tis = {ti["operator"]: ti for ti in stack.task_instances(UPSTREAM, run["dag_run_id"])}
            assert tis[WRITE_OP]["state"] == "skipped" and tis[COMMIT_OP]["state"] == "skipped", key
            assert _events(stack, run["dag_run_id"]) == [], key
            assert store.require(PIPELINE, f"pk={key}").version == 1
        assert DeltaTable(str(table_path)).version() == first_version

        # 3b. A replace of one partition: version 2 of that partition only, one new event for it.
        replaced = KEYS[0]
        [(key, run)] = _backfill_runs(
            stack,
            stack.backfill(
                UPSTREAM,
                replaced,
                replaced,
                reprocess_behavior="completed",
                conf={"walsink_reprocess": "replace"},
            ),
            seen,
        ).items()
        assert key == replaced and run["state"] == "success", stack.task_states(UPSTREAM, run["dag_run_id"])
        record = store.require(PIPELINE, f"pk={replaced}")
        assert (record.state.value, record.version, record.run_id) == ("COMMITTED", 2, run["dag_run_id"])
        assert store.require(PIPELINE, f"pk={KEYS[1]}").version == 1  # the other partition untouched
        [event] = _events(stack, run["dag_run_id"])
        assert event["partition_key"] == replaced
        table = DeltaTable(str(table_path))
        assert table.version() == first_version + 1  # one Delta version: the replaced partition
        _check_table(table.to_pyarrow_table().to_pylist())

        with stack.asset_scheduling(keep_unpaused=[DOWNSTREAM]):
            second = _new_downstream_runs(stack, before, 1)
            # Nothing else is pending: the skipped re-runs queued no partition.
            assert stack.get(f"/api/v2/dags/{DOWNSTREAM}/assets/queuedEvents")["queued_events"] == []
        [rerun] = second.values()
        assert (rerun["partition_key"], rerun["state"]) == (replaced, "success"), second
        # Over the whole test: partition 1 ran downstream twice (new, then replaced), partition 2 once.
        assert Counter(r["partition_key"] for r in [*first.values(), rerun]) == {KEYS[0]: 2, KEYS[1]: 1}
    finally:
        stack.pause(DOWNSTREAM)
        stack.pause(UPSTREAM)
        store.dispose()


GROUP_DAG = "walsink_group_commit_test"
GROUP_DOWNSTREAM = "walsink_group_commit_downstream_test"
GROUP_PIPELINE = "group_events"
#: Four partitions no other test writes, each staged with as many files as its day of the month.
GROUP_KEYS = [f"2026-09-0{d}" for d in range(1, 5)]


def test_a_partition_aware_downstream_filtering_on_published_sees_every_partition_of_a_group_commit(
    airflow_stack,
):
    """Issue 47: four partitions' checkpoints are durable before their commit tasks run, one run
    at a time; the first leads a group commit of the four (one Delta version), the other three
    find theirs committed by it and add their events. The downstream DAG keeps the triggering
    events whose ``published`` is above 0, as a user would: each of its four runs keeps its
    partition's event, with that partition's own files and the group's identity. (Before, a
    member's event said ``published: 0`` and named no group: three of the four kept nothing.)"""
    from deltalake import DeltaTable

    from tests.checkpoints import stage_parquet_checkpoint
    from tests.helpers import ACTOR

    stack = airflow_stack
    store = CommitterStore.from_url(f"sqlite:///{stack.home}/walsink/committer.db")
    table_path = stack.home / "walsink" / "examples" / "target" / GROUP_PIPELINE
    staging = table_path / "_walsink_staging"  # the DAG's staging_root
    try:
        for dag_id in (GROUP_DAG, GROUP_DOWNSTREAM):
            stack.wait_for_dag(dag_id)
            stack.unpause(dag_id)
        before = set(_downstream_runs(stack, GROUP_DOWNSTREAM))
        for day, key in enumerate(GROUP_KEYS, start=1):
            stage_parquet_checkpoint(
                store, StagingLayout(staging), GROUP_PIPELINE, f"pk={key}", key, [100 * day + n for n in range(day)],
                actor=ACTOR, staging_root=str(staging),
            )  # fmt: skip

        runs = _backfill_runs(
            stack,
            stack.backfill(GROUP_DAG, GROUP_KEYS[0], GROUP_KEYS[-1], max_active_runs=1),
            set(),
            GROUP_DAG,
        )
        assert sorted(runs) == GROUP_KEYS, runs
        records = {key: store.require(GROUP_PIPELINE, f"pk={key}") for key in GROUP_KEYS}
        events = {}
        for key, run in runs.items():
            assert run["state"] == "success", (key, stack.task_states(GROUP_DAG, run["dag_run_id"]))
            assert records[key].state.value == "COMMITTED"
            [event] = _events(stack, run["dag_run_id"], GROUP_DAG)
            assert event["partition_key"] == key
            events[key] = event["extra"]
        assert [records[k].committables for k in GROUP_KEYS] == [1, 2, 3, 4]
        table = DeltaTable(str(table_path))
        assert sum(1 for h in table.history() if "walsink.pipeline" in h) == 1  # one table commit
        assert table.to_pyarrow_table().num_rows == 1 + 2 + 3 + 4
        [leader] = [k for k in GROUP_KEYS if events[k]["announced"] == "new commit"]
        assert sorted(e["announced"] for e in events.values()).count("group member") == 3, events
        group = {"leader": f"pk={leader}", "size": 4, "snapshot": str(table.version())}  # as recorded

        with stack.asset_scheduling(keep_unpaused=[GROUP_DOWNSTREAM]):
            downstream = _new_downstream_runs(stack, before, len(GROUP_KEYS), GROUP_DOWNSTREAM)
        assert sorted(r["partition_key"] for r in downstream.values()) == GROUP_KEYS, downstream
        assert {r["state"] for r in downstream.values()} == {"success"}, downstream
        reported = {
            r["partition_key"]: stack.xcom(GROUP_DOWNSTREAM, r["dag_run_id"], "committed_partition")
            for r in downstream.values()
        }
        # The filter kept every partition of the group (before: the leader's only).
        assert sorted(k for k, r in reported.items() if r["seen"]) == GROUP_KEYS, reported
        for key, report in reported.items():
            # Its partition's event, with that checkpoint's own files and the group's identity.
            assert report == {
                "partition_key": key,
                "seen": [
                    {
                        "checkpoint_key": f"pk={key}",
                        "files": records[key].committables,
                        "published": records[key].committables,
                        "rows": records[key].rows,
                        "group": group,
                    }
                ],
            }, report
    finally:
        stack.pause(GROUP_DOWNSTREAM)
        stack.pause(GROUP_DAG)
        store.dispose()
