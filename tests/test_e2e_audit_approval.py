"""A person approves or aborts a REJECTED checkpoint in Airflow (issue 37), through the real
scheduler (the session's shared stack) and Airflow's own HITL REST API.

``tests/dags/walsink_audit_approval_test.py`` (``audit_approval=...``) runs three days at once:
an odd day whose audit passes (the approval step is skipped and the commit goes on as without
it), and two even days the audit rejects, whose approval tasks park in ``awaiting_input`` (no
worker slot) until the test answers as a person would, with ``PATCH .../hitlDetails`` as the
user ``admin``: "Publish anyway" on one, "Abort" on the other.

Why the stack and not ``dag.test()``: on Airflow 3.3 ``HITLOperator.execute`` raises
``TaskAwaitingInput`` (no trigger); only the api-server's response handler
(``update_hitl_detail`` -> ``handle_event_submit``) moves the task back to SCHEDULED, and
``dag.test()`` merely waits for that to happen from outside (``airflow/sdk/definitions/dag.py``,
"Human-in-the-loop tasks stay parked in AWAITING_INPUT: dag.test() never resolves them itself").
The stack gives that response handler, its authentication and its ``assigned_users`` check for
real.
"""

from __future__ import annotations

import re
from urllib.parse import quote

import pyarrow.compute as pc
import pyarrow.dataset as ds
import pytest

from airflow_provider_walsink.core.store.store import CommitterStore
from tests.test_cli import walsink

pytestmark = [pytest.mark.e2e, pytest.mark.spark, pytest.mark.slow]

DAG_ID = "walsink_audit_approval_test"
PIPELINE = "approved_events"
#: Days no other test runs: the audit rejects even days (three rows without a user id).
PASSED_DAY, APPROVED_DAY, ABORTED_DAY = "2026-05-09", "2026-05-08", "2026-05-10"
APPROVE_REASON = "the 3 rows without user_id are known test accounts; finance signed off (TICKET-4711)"
ABORT_REASON = "upstream export was truncated; re-export requested"
REJECTION = "not_null(user_id): 3 of 1,000 rows are NULL"
APPROVAL_TASK = "events.approval"
TERMINAL_TI = ("success", "skipped", "failed", "upstream_failed")


def key_of(day: str) -> str:
    return day.replace("-", "") + "T000000Z"


def _park_seen(stack, run_id: str) -> bool:
    """Whether the scheduler has processed the exit of the process that parked the approval task.

    Answering before that meets a race in Airflow 3.3.2: the response resumes the task (same try
    number, so the same executor key), the scheduler queues it, and then processes the parking
    process's exit as if the *resumed* task had been killed externally (``ti_requeued`` in
    ``SchedulerJobRunner._process_executor_events`` covers a resume only while the task is
    SCHEDULED, not QUEUED), marking it up_for_retry: the decision may be lost and asked again.
    A person never answers within that second; a script should wait as this test does.
    """
    log = (stack.logs_dir / "scheduler.out").read_text(errors="replace")
    return (
        re.search(
            rf"TaskInstance Finished: dag_id={DAG_ID}, task_id={re.escape(APPROVAL_TASK)}, "
            rf"run_id={re.escape(run_id)}, [^\n]*state=awaiting_input, [^\n]*executor_state=success",
            log,
        )
        is not None
    )


#: What :func:`approval_runs` saw, kept for the session (the browser test reuses its runs).
_SEEN: dict = {}


def _hitl_path(run_id: str) -> str:
    return f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{APPROVAL_TASK}/-1/hitlDetails"


def _checkpoint_path(day: str) -> str:
    return f"/walsink/api/pipelines/{PIPELINE}/checkpoints/{key_of(day)}"


@pytest.fixture(scope="module")
def approval_runs(airflow_stack) -> dict:
    return decided_runs(airflow_stack)


def decided_runs(stack) -> dict:
    """The three runs, answered and finished; what the test saw on the way (once per session:
    ``tests/test_ui_browser.py`` opens the same checkpoints)."""
    if _SEEN:
        return _SEEN
    store = CommitterStore.from_url(f"sqlite:///{stack.home}/walsink/committer.db")
    seen = _SEEN
    try:
        stack.wait_for_dag(DAG_ID)
        stack.unpause(DAG_ID)
        runs = {
            day: stack.trigger(DAG_ID, f"{day}T00:00:00+00:00")
            for day in (PASSED_DAY, APPROVED_DAY, ABORTED_DAY)
        }

        def parked() -> dict | None:
            states = {day: stack.task_states(DAG_ID, runs[day]).get(APPROVAL_TASK) for day in runs}
            return states if states[APPROVED_DAY] == states[ABORTED_DAY] == "awaiting_input" else None

        seen["waiting"] = stack.wait_until("both approval tasks to await a person", parked, timeout=900)
        for day in (APPROVED_DAY, ABORTED_DAY):
            stack.wait_until(
                f"the scheduler to see the approval task of {day} park",
                lambda run_id=runs[day]: _park_seen(stack, run_id),
            )
        seen["question"] = stack.get(_hitl_path(runs[APPROVED_DAY]))
        # While the person is asked, the checkpoint's page says so (issue 47).
        seen["asked"] = stack.get(_checkpoint_path(APPROVED_DAY))
        # The viewer may not answer (not an assigned user, nor allowed to edit the DAG).
        seen["viewer_answer"] = stack.client("viewer").patch(
            _hitl_path(runs[APPROVED_DAY]),
            json={"chosen_options": ["Publish anyway"], "params_input": {"reason": "me too"}},
        )
        for day, choice, reason in (
            (APPROVED_DAY, "Publish anyway", APPROVE_REASON),
            (ABORTED_DAY, "Abort", ABORT_REASON),
        ):
            answer = stack.client("admin").patch(
                _hitl_path(runs[day]), json={"chosen_options": [choice], "params_input": {"reason": reason}}
            )
            assert answer.status_code == 200, answer.text
        stack.wait_for_runs(DAG_ID, list(runs.values()), timeout=600)
        by_id = {r["dag_run_id"]: r for r in stack.dag_runs(DAG_ID)}
        seen["runs"] = {day: by_id[run_id] for day, run_id in runs.items()}
        seen["tasks"] = {day: stack.task_states(DAG_ID, run_id) for day, run_id in runs.items()}
        seen["records"] = {
            day: store.require(PIPELINE, key_of(day)) for day in (PASSED_DAY, APPROVED_DAY, ABORTED_DAY)
        }
        seen["history"] = {day: store.history(PIPELINE, key_of(day)) for day in (APPROVED_DAY, ABORTED_DAY)}
        seen["decided"] = stack.get(_checkpoint_path(APPROVED_DAY))
        seen["committer_url"] = store.engine.url.render_as_string(hide_password=False)
        seen["target"] = stack.home / "walsink" / "audit-approval-test" / "target"
    except BaseException:
        _SEEN.clear()
        raise
    finally:
        store.dispose()
    return seen


def test_a_rejected_audit_approved_in_airflow_commits_once_and_aborted_publishes_nothing(
    airflow_stack, approval_runs
):
    seen = approval_runs
    # While waiting: parked in awaiting_input (Airflow counts no worker or pool slot for it), and
    # the question a person sees names the failed check.
    question = seen["question"]
    assert question["options"] == ["Publish anyway", "Abort"] and not question["multiple"]
    assert REJECTION in question["body"] and "reason" in question["params"]
    assert seen["viewer_answer"].status_code == 403, seen["viewer_answer"].text
    # The checkpoint's page said a person is asked, by which task, and linked the run's
    # Required actions in Airflow's UI; once answered and committed, it says no more, and its
    # task log is the commit task's (not the audit's overruled REJECTED).
    asked, approved_run = seen["asked"], seen["runs"][APPROVED_DAY]["dag_run_id"]
    assert asked["checkpoint"]["state"] == "REJECTED"
    assert asked["decision"]["task_id"] == APPROVAL_TASK
    assert asked["decision"]["required_actions"] == (
        f"/dags/{DAG_ID}/runs/{quote(approved_run, safe='')}/required_actions"
    )
    decided = seen["decided"]
    assert decided["decision"] is None and decided["checkpoint"]["state"] == "COMMITTED"
    assert (decided["log"]["task_id"], decided["log"]["state"]) == ("events.commit", "COMMITTED")

    runs, tasks, records = seen["runs"], seen["tasks"], seen["records"]
    # The audit passed: the approval step skipped, the commit as without it.
    assert runs[PASSED_DAY]["state"] == "success"
    assert tasks[PASSED_DAY] == {
        "events.write": "success",
        "events.durable": "success",
        "events.audit": "success",
        APPROVAL_TASK: "skipped",
        "events.commit": "success",
    }, tasks[PASSED_DAY]
    assert records[PASSED_DAY].state.value == "COMMITTED"

    # Approved: REJECTED -> AUDITED by the person, with the reason, then committed once.
    assert runs[APPROVED_DAY]["state"] == "success"
    assert (
        tasks[APPROVED_DAY]["events.audit"] == "success" and tasks[APPROVED_DAY][APPROVAL_TASK] == "success"
    )
    assert tasks[APPROVED_DAY]["events.commit"] == "success"
    approved = records[APPROVED_DAY]
    assert approved.state.value == "COMMITTED" and approved.error is None
    history = seen["history"][APPROVED_DAY]
    steps = [(h.from_state, h.to_state) for h in history if h.from_state != h.to_state]
    assert steps[-4:] == [
        ("DURABLE", "REJECTED"),
        ("REJECTED", "AUDITED"),
        ("AUDITED", "COMMITTING"),
        ("COMMITTING", "COMMITTED"),
    ], steps
    assert [h.to_state for h in history].count("COMMITTED") == 1
    [approval] = [h for h in history if (h.from_state, h.to_state) == ("REJECTED", "AUDITED")]
    assert approval.detail.startswith(f"approved by admin (id admin): {APPROVE_REASON}")
    assert REJECTION in approval.detail
    assert approval.actor.startswith("admin (id admin) via ")
    assert (approval.dag_id, approval.task_id) == (DAG_ID, APPROVAL_TASK)
    # The data is in the target once: the day's 1,000 rows, three of them without a user id.
    table = ds.dataset(
        seen["target"], format="parquet", partitioning="hive", ignore_prefixes=[".", "_"]
    ).to_table(filter=pc.field("dt") == APPROVED_DAY)
    assert table.num_rows == 1000 and len(pc.unique(table["id"])) == 1000
    assert table["user_id"].null_count == 3

    # Aborted: ABORTED by the person with the reason; the commit skipped; nothing published.
    assert tasks[ABORTED_DAY][APPROVAL_TASK] == "success" and tasks[ABORTED_DAY]["events.commit"] == "skipped"
    aborted = records[ABORTED_DAY]
    assert aborted.state.value == "ABORTED"
    [abort] = [
        h for h in seen["history"][ABORTED_DAY] if h.to_state == "ABORTED" and h.from_state != "ABORTED"
    ]
    assert abort.actor.startswith("admin (id admin) via ") and ABORT_REASON in (abort.detail or "")
    assert "COMMITTED" not in [h.to_state for h in seen["history"][ABORTED_DAY]]
    assert not (seen["target"] / f"dt={ABORTED_DAY}").exists()

    # `walsink history` shows the decision: who and why.
    shown = walsink("--url", seen["committer_url"], "history", PIPELINE, key_of(APPROVED_DAY))
    assert shown.returncode == 0, shown.stderr
    line = next(x for x in shown.stdout.splitlines() if "approved by" in x)
    assert (
        "REJECTED" in line and "AUDITED" in line and f"approved by admin (id admin): {APPROVE_REASON}" in line
    )
    shown = walsink("--url", seen["committer_url"], "history", PIPELINE, key_of(ABORTED_DAY))
    assert shown.returncode == 0, shown.stderr
    assert ABORT_REASON in shown.stdout
