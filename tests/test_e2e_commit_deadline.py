"""A pipeline's commit deadline through the real scheduler and triggerer (issue 37).

Two manual runs of ``tests/dags/walsink_deadline_test.py`` (deadline 60 s after each run is
queued): one whose checkpoint is held back (sealed, the durability sensor waiting in the
triggerer) and one that commits at once. Airflow's scheduler finds the held-back run's deadline
missed and queues walsink's callback, the triggerer runs it: it reads the committer table and
calls the user's notifier once with the pipeline, the checkpoint, its state and the on-call
reason, and records the miss (history, ``commit_due_at``). The run that committed in time
finished before its deadline, so Airflow deleted it: nothing fires. The held-back checkpoint is
then let through; its run commits late, and still exactly one notification exists. Before that,
the triggerer is restarted while the notifier is still sending: the restarted triggerer runs the
callback again for the same deadline, and it finds the first run's claim and does nothing
(issue 46).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from airflow_provider_walsink.core.protocol.states import CheckpointState
from airflow_provider_walsink.core.staging.layout import StagingLayout
from airflow_provider_walsink.core.store.deadlines import is_overdue
from airflow_provider_walsink.core.store.store import CommitterStore, utcnow

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

DAG_ID = "walsink_deadline_test"
PIPELINE = "commit_deadline"
HELD_KEY, ON_TIME_KEY = "20260801T000000Z", "20260802T000000Z"


def _calls(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_checkpoint_held_back_past_its_deadline_notifies_once_and_one_committed_in_time_never(
    airflow_stack,
):
    stack = airflow_stack
    calls = stack.home / "deadline-calls.jsonl"
    stack.wait_for_dag(DAG_ID)
    stack.unpause(DAG_ID)
    held = stack.trigger(DAG_ID, "2026-08-01T00:00:00+00:00", run_id=f"deadline__{HELD_KEY}")
    on_time = stack.trigger(DAG_ID, "2026-08-02T00:00:00+00:00", run_id=f"deadline__{ON_TIME_KEY}")

    # The run committed in time ends before its deadline; the held-back one is still waiting.
    runs = stack.wait_for_runs(DAG_ID, [on_time], timeout=300)
    assert runs[on_time]["state"] == "success", stack.task_instances(DAG_ID, on_time)
    first = stack.wait_until("the deadline callback of the held-back run", lambda: _calls(calls), timeout=300)
    assert stack.task_states(DAG_ID, held)["durable"] == "deferred"  # still held back when it fired

    (call,) = first
    report = call["walsink"]
    assert call["run_id"] == held
    assert (report["pipeline"], report["checkpoint_key"], report["state"]) == (PIPELINE, HELD_KEY, "SEALED")
    assert report["reason"].startswith("sealed; waiting to be durable"), report
    # The notifier's template rendered from walsink's fields.
    assert call["message"] == f"{PIPELINE}/{HELD_KEY} is SEALED: {report['reason']}"
    assert report["link"].endswith(f"dag_id={DAG_ID}&run_id=deadline__{HELD_KEY}&pipeline={PIPELINE}")

    # The notifier is still sending (it holds until released) when the triggerer restarts: the
    # new triggerer runs the callback again for the same deadline, which finds the first run's
    # claim and neither notifies nor records again (issue 46).
    stack.stop_component("triggerer")
    stack.start_component("triggerer")
    try:
        callback = stack.wait_until(
            "the deadline callback run again by the restarted triggerer",
            lambda: _callback_done(stack, held),
            timeout=300,
        )
    finally:
        (stack.home / "deadline-release").touch()
    assert callback.output.startswith("not notified again (commit deadline "), callback.output
    assert len(_calls(calls)) == 1

    store = CommitterStore.from_url(f"sqlite:///{stack.home}/walsink/committer.db")
    try:
        record = store.require(PIPELINE, HELD_KEY)
        assert record.commit_due_at is not None and is_overdue(record, utcnow())
        missed = [
            h for h in store.history(PIPELINE, HELD_KEY) if "commit deadline missed" in (h.detail or "")
        ]
        assert [(h.run_id, h.to_state) for h in missed] == [(held, "SEALED")]
        # Claimed, and the claimer stopped while its notifier ran: "claimed" says it may have sent.
        (notice,) = [n for n in _notices(store) if n["run_id"] == held]
        assert notice["outcome"] == "claimed" and notice["checkpoint_key"] == HELD_KEY
        assert store.require(PIPELINE, ON_TIME_KEY).state is CheckpointState.COMMITTED

        # Let the held-back checkpoint through: its run commits (late), nothing fires again.
        attempt = stack_attempt_dir(store, stack, HELD_KEY)
        os.rename(attempt / "dt=20260801" / ".held-back", attempt / "dt=20260801" / "part-0.csv")
        runs = stack.wait_for_runs(DAG_ID, [held], timeout=300)
        assert runs[held]["state"] == "success", stack.task_instances(DAG_ID, held)
        record = store.require(PIPELINE, HELD_KEY)
        assert record.state is CheckpointState.COMMITTED and not is_overdue(record, utcnow())
    finally:
        store.dispose()

    # Airflow's own record: one deadline per run; the held-back one missed (its callback ran in
    # the triggerer and succeeded), the on-time one deleted when its run succeeded in time.
    engine = create_engine(stack.metadata_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT dr.run_id, d.missed, c.state, c.output FROM deadline d JOIN dag_run dr ON d.dagrun_id = dr.id "
                    "JOIN callback c ON d.callback_id = c.id WHERE dr.dag_id = :dag"
                ),
                {"dag": DAG_ID},
            ).all()
    finally:
        engine.dispose()
    assert [(r.run_id, r.missed, r.state) for r in rows] == [(held, True, "success")]
    # The second run's answer (the first run was stopped with its triggerer).
    assert (
        rows[0].output.startswith("not notified again") and f"{PIPELINE}/{HELD_KEY} SEALED" in rows[0].output
    )
    assert len(_calls(calls)) == 1  # once, although the run went on (and committed) after it


def _callback_done(stack: Any, run_id: str) -> Any:
    """Airflow's callback row of the run's deadline once it ended (success or failed), else ``None``."""
    engine = create_engine(stack.metadata_url)
    try:
        with engine.connect() as conn:
            return conn.execute(
                text(
                    "SELECT c.state, c.output FROM deadline d JOIN dag_run dr ON d.dagrun_id = dr.id "
                    "JOIN callback c ON d.callback_id = c.id WHERE dr.dag_id = :dag AND dr.run_id = :run "
                    "AND c.state IN ('success', 'failed')"
                ),
                {"dag": DAG_ID, "run": run_id},
            ).first()
    finally:
        engine.dispose()


def _notices(store: CommitterStore) -> list[dict]:
    from sqlalchemy import select

    from airflow_provider_walsink.core.store.models import deadline_notice_table

    with store.engine.connect() as conn:
        return [dict(r) for r in conn.execute(select(deadline_notice_table)).mappings()]


def stack_attempt_dir(store: CommitterStore, stack: Any, key: str) -> Path:
    """The staged attempt directory of the pipeline's checkpoint ``key`` (under the stack's default
    staging root: the DAG stages through the core API, which records none)."""
    record = store.require(PIPELINE, key)
    layout = record.layout(StagingLayout(stack.home / "walsink" / "staging"))
    return layout.attempt_dir(PIPELINE, key, record.attempt, record.attempt_id)
