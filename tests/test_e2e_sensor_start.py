"""The durability sensor costs no worker (issue 24): through the real scheduler, a deferrable
sensor starts in the triggerer (``start_from_trigger``), waits there until its checkpoint is
durable, and ends there; the commit task then runs on a worker.

What Airflow 3.3 records for a task instance no worker ever ran: no ``hostname``, no ``pid``,
never queued to an executor (``queued_when`` empty); the commit task instance, run by the
LocalExecutor, has all three. The committer table records that the task marked the checkpoint
DURABLE (the triggerer did the check, in the task's name), and the task's log is the trigger's.
The staging root is an XCom pull rendered in the triggerer, as ``walsink_pipeline`` passes it.
"""

from __future__ import annotations

import json

import pytest

from airflow_provider_walsink.core.protocol.states import CheckpointState
from airflow_provider_walsink.core.store.store import CommitterStore

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

DAG_ID = "walsink_sensor_start_test"
PIPELINE = "sensor_start"
LOGICAL_DATE = "2026-07-03T00:00:00+00:00"
KEY = "20260703T000000Z"


def test_the_durability_sensor_never_runs_on_a_worker_and_the_commit_follows(airflow_stack):
    stack = airflow_stack
    stack.wait_for_dag(DAG_ID)
    stack.unpause(DAG_ID)
    run_id = stack.trigger(DAG_ID, LOGICAL_DATE, run_id=f"sensor_start__{KEY}")
    runs = stack.wait_for_runs(DAG_ID, [run_id], timeout=600)
    tis = {ti["task_id"]: ti for ti in stack.task_instances(DAG_ID, run_id)}
    assert runs[run_id]["state"] == "success", tis
    assert {t: ti["state"] for t, ti in tis.items()} == {
        "stage": "success", "land": "success", "durable": "success", "commit": "success"
    }  # fmt: skip

    sensor, commit = tis["durable"], tis["commit"]
    # Never handed to an executor, never run by a worker process.
    assert not sensor["hostname"], sensor
    assert sensor["pid"] is None, sensor
    assert sensor["queued_when"] is None, sensor
    # The same fields for a task a worker ran (so the assertions above can fail).
    assert commit["hostname"] and commit["pid"] is not None and commit["queued_when"] is not None, commit

    store = CommitterStore.from_url(f"sqlite:///{stack.home}/walsink/committer.db")
    try:
        assert store.require(PIPELINE, KEY).state is CheckpointState.COMMITTED
        durable = [h for h in store.history(PIPELINE, KEY) if h.to_state == "DURABLE"]
        assert [(h.task_id, h.run_id) for h in durable] == [("durable", run_id)]
    finally:
        store.dispose()

    # The task's log is the trigger's: it found the checkpoint durable there. (Whether its first check
    # came before the held-back file landed depends on the machine's load; not asserted.)
    log = json.dumps(
        stack.get(
            f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/durable/logs/{sensor['try_number']}",
            full_content=True,
        )
    )
    assert "triggerer_job_runner" in log, log[-3000:]
    assert f"checkpoint {PIPELINE}/{KEY} attempt 1: all 1 committables present and verified" in log, log[
        -3000:
    ]
