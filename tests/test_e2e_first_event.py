"""The first commits of a new pipeline, finishing together through the real scheduler and
api-server (the session's shared stack), all succeed and each adds its asset event once.

Airflow 3.3 links an asset alias to an asset with the first event through the alias; two
first events recorded at once fail one task ("Error updating Task Instance state": a unique
key on ``asset_alias_asset``), its checkpoint COMMITTED but its run failed. The commit tasks
serialize the pipeline's first event through a claim in the committer table
(``core/store/first_event.py``). ``walsink_first_event_test`` makes the commit tasks of one run
meet at a barrier right before they add their events, so without the claim their tasks end
at the same moment.
"""

from __future__ import annotations

import pytest

from airflow_provider_walsink.core.store.store import CommitterStore
from airflow_provider_walsink.operators.lineage import asset_alias_name

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

DAG_ID = "walsink_first_event_test"
PIPELINE = "first_event"
COMMITS = 3


def test_first_commits_of_a_new_pipeline_ending_together_all_succeed_with_one_event_each(airflow_stack):
    stack = airflow_stack
    store = CommitterStore.from_url(f"sqlite:///{stack.home}/walsink/committer.db")
    try:
        stack.wait_for_dag(DAG_ID)
        stack.unpause(DAG_ID)
        run_id = stack.trigger(DAG_ID, "2026-08-01T00:00:00+00:00")
        [run] = stack.wait_for_runs(DAG_ID, [run_id], timeout=600).values()
        states = stack.task_states(DAG_ID, run_id)
        assert run["state"] == "success", (states, stack.log_tail())
        assert all(state == "success" for state in states.values()), states

        committed = [r for r in store.checkpoints(PIPELINE) if r.run_id == run_id]
        assert sorted(r.checkpoint_key for r in committed) == [f"20260801T000000-{i}" for i in range(COMMITS)]
        assert {r.state.value for r in committed} == {"COMMITTED"}

        found = stack.get("/api/v2/assets/events", source_dag_id=DAG_ID, source_run_id=run_id, limit=100)
        events = [e for e in found["asset_events"] if e["source_run_id"] == run_id]
        assert sorted(e["extra"]["checkpoint_key"] for e in events) == sorted(
            r.checkpoint_key for r in committed
        )  # one event per commit, none lost to a failed task
        assert {e["source_task_id"] for e in events} == {f"commit_{i}" for i in range(COMMITS)}
        # One asset, created once, and linked to the pipeline's alias.
        [asset_id] = {e["asset_id"] for e in events}
        asset = stack.get(f"/api/v2/assets/{asset_id}")
        assert [a["name"] for a in asset["aliases"]] == [asset_alias_name(PIPELINE)], asset
    finally:
        stack.pause(DAG_ID)
        store.dispose()
