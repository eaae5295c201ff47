"""An asset-scheduled downstream DAG through the real scheduler (the session's shared stack):
``walsink_downstream_example`` runs exactly once per new commit of ``walsink_daily_overwrite``,
with what was committed in its triggering event, and not when a re-run of the commit task
changes nothing.

Holds whatever state a re-run leaves the upstream tasks in (success, or skipped): it counts
downstream runs and asset events, and reads the committer table.
"""

from __future__ import annotations

from datetime import date

import pytest

from airflow_provider_walsink.core.store.store import CommitterStore

pytestmark = [pytest.mark.e2e, pytest.mark.spark, pytest.mark.slow]

DAG_ID = "walsink_daily_overwrite"
DOWNSTREAM = "walsink_downstream_example"
PIPELINE = "daily_events"
#: A day no other test of the shared stack runs.
DAY = date(2026, 1, 22)
KEY = f"{DAY:%Y%m%d}T000000Z"
COMMIT_OP = "WalCommitOperator"
TERMINAL_TI = ("success", "skipped", "failed", "upstream_failed")


def _asset_events(stack, run_id: str) -> list[dict]:
    events = stack.get("/api/v2/assets/events", source_dag_id=DAG_ID, source_run_id=run_id, limit=100)
    return [e for e in events["asset_events"] if e["source_run_id"] == run_id]


def _downstream_runs(stack) -> dict[str, dict]:
    return {r["dag_run_id"]: r for r in stack.dag_runs(DOWNSTREAM)}


def test_downstream_dag_runs_once_per_new_commit_and_not_on_a_rerun(airflow_stack):
    """A commit, then a no-op re-run of its commit task; then the scheduler, allowed to create
    asset-triggered runs (the shared stack creates none by default, see
    ``AirflowStack.asset_scheduling``), creates one downstream run, which reports one commit.

    Had the re-run emitted an event too, the queued run would report two events (Airflow folds
    events queued for one DAG into one run), and the upstream run would show two asset events.
    """
    stack = airflow_stack
    store = CommitterStore.from_url(f"sqlite:///{stack.home}/walsink/committer.db")
    try:
        stack.wait_for_dag(DAG_ID)
        stack.wait_for_dag(DOWNSTREAM)
        stack.unpause(DAG_ID)
        stack.unpause(DOWNSTREAM)
        before = _downstream_runs(stack)

        # A new commit: one backfill day of the upstream DAG.
        (run,) = stack.wait_for_backfill(
            stack.backfill(DAG_ID, DAY.isoformat(), DAY.isoformat()), timeout=900
        )
        run_id = run["dag_run_id"]
        record = store.require(PIPELINE, KEY)
        assert record.state.value == "COMMITTED" and record.run_id == run_id
        [event] = _asset_events(stack, run_id)
        assert event["extra"]["checkpoint_key"] == KEY and event["extra"]["rows"] == record.rows
        queued = stack.get(f"/api/v2/dags/{DOWNSTREAM}/assets/queuedEvents")["queued_events"]
        assert len(queued) == 1, queued

        # A no-op re-run: the commit task cleared and run again finds the checkpoint committed.
        commit = next(ti for ti in stack.task_instances(DAG_ID, run_id) if ti["operator"] == COMMIT_OP)
        stack.clear_task(DAG_ID, run_id, [commit["task_id"]])
        stack.wait_until(
            "the cleared commit task to run again",
            lambda: [
                ti
                for ti in stack.task_instances(DAG_ID, run_id)
                if ti["task_id"] == commit["task_id"]
                and ti["try_number"] > commit["try_number"]
                and ti["state"] in TERMINAL_TI
            ],
            timeout=300,
        )
        stack.wait_for_runs(DAG_ID, [run_id])
        assert store.require(PIPELINE, KEY) == record  # nothing changed in the committer table
        assert len(_asset_events(stack, run_id)) == 1  # no second event for the re-run

        # The scheduler, now creating asset-triggered runs: one run, for the one commit.
        def one_new_run() -> dict | None:
            new = {k: v for k, v in _downstream_runs(stack).items() if k not in before}
            finished = [r for r in new.values() if r["state"] in ("success", "failed")]
            return finished[0] if len(new) == 1 and finished else None

        with stack.asset_scheduling(keep_unpaused=[DOWNSTREAM]):
            downstream = stack.wait_until(
                "the downstream run triggered by the commit", one_new_run, timeout=300
            )
            # No second run can come: Airflow creates an asset-triggered run from the DAG's queued
            # events and empties that queue in the same transaction, and nothing is queued now
            # (a re-run's event, had there been one, was queued before the block began).
            assert stack.get(f"/api/v2/dags/{DOWNSTREAM}/assets/queuedEvents")["queued_events"] == []
            new_runs = {k for k in _downstream_runs(stack) if k not in before}
        assert new_runs == {downstream["dag_run_id"]}
        assert downstream["state"] == "success" and downstream["run_type"] == "asset_triggered", downstream
        [task] = stack.task_instances(DOWNSTREAM, downstream["dag_run_id"])
        reported = stack.xcom(DOWNSTREAM, downstream["dag_run_id"], task["task_id"])
        # Airflow hands a DAG's first asset-triggered run every event of the asset since it was
        # created, so commits other tests made on the shared stack may be reported beside this
        # one; each commit is reported once, and this one (not its no-op re-run) exactly once. A
        # commit is its attempt: a replace backfill commits a day's second version under the same
        # run (and possibly the same row count), a new attempt.
        commits = [
            (c["pipeline"], c["checkpoint_key"], c["attempt"], c["rows"], c["source_run_id"])
            for c in reported
        ]
        assert commits.count((PIPELINE, KEY, record.sealed_attempt, record.rows, run_id)) == 1, commits
        assert len(commits) == len(set(commits)), commits
        mine = next(c for c in reported if (c["checkpoint_key"], c["source_run_id"]) == (KEY, run_id))
        assert mine["attempt"] == record.sealed_attempt and mine["files"] == record.committables
        assert stack.get(f"/api/v2/dags/{DOWNSTREAM}/assets/queuedEvents")["queued_events"] == []
    finally:
        stack.pause(DOWNSTREAM)  # later tests' commits need not queue runs of it
        store.dispose()


LOST_DAG = "walsink_lost_event_test"
LOST_PIPELINE = "lost_event"


def test_a_commit_killed_after_committed_delivers_its_asset_event_on_retry_and_only_once(airflow_stack):
    """Try 1 of the commit task records COMMITTED and is SIGKILLed before its success (so Airflow
    never takes its asset event); try 2 finds the checkpoint committed by try 1, sees no event
    naming its attempt, and adds the one event. A third try (the task cleared) finds that event
    and adds none: one event per new commit, whatever dies when.
    """
    stack = airflow_stack
    store = CommitterStore.from_url(f"sqlite:///{stack.home}/walsink/committer.db")
    try:
        stack.wait_for_dag(LOST_DAG)
        stack.unpause(LOST_DAG)
        run_id = stack.trigger(LOST_DAG, "2026-07-01T00:00:00+00:00")
        stack.wait_for_runs(LOST_DAG, [run_id], timeout=600)
        commit = next(ti for ti in stack.task_instances(LOST_DAG, run_id) if ti["task_id"] == "commit")
        assert (commit["state"], commit["try_number"]) == ("success", 2), commit

        [record] = [r for r in store.checkpoints(LOST_PIPELINE) if r.run_id == run_id]
        assert record.state.value == "COMMITTED"
        committed = [
            h for h in store.history(LOST_PIPELINE, record.checkpoint_key) if h.to_state == "COMMITTED"
        ]
        assert [(h.task_id, h.try_number) for h in committed] == [("commit", 1)]  # try 1 committed

        def events() -> list[dict]:
            found = stack.get(
                "/api/v2/assets/events", source_dag_id=LOST_DAG, source_run_id=run_id, limit=100
            )
            return [e for e in found["asset_events"] if e["source_run_id"] == run_id]

        [event] = events()
        assert event["extra"]["checkpoint_key"] == record.checkpoint_key
        assert event["extra"]["attempt"] == record.sealed_attempt and event["extra"]["rows"] == 2
        assert event["source_task_id"] == "commit"

        stack.clear_task(LOST_DAG, run_id, ["commit"])
        stack.wait_until(
            "the cleared commit task to run a third time",
            lambda: [
                ti
                for ti in stack.task_instances(LOST_DAG, run_id)
                if ti["task_id"] == "commit" and ti["try_number"] > 2 and ti["state"] in TERMINAL_TI
            ],
            timeout=300,
        )
        stack.wait_for_runs(LOST_DAG, [run_id])
        assert len(events()) == 1  # the third try found the event and added none
        assert store.require(LOST_PIPELINE, record.checkpoint_key) == record
    finally:
        stack.pause(LOST_DAG)
        store.dispose()
