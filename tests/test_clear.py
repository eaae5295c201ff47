"""Clearing tasks of the overwrite example on a real Airflow stack, as a user does in the UI
(``POST /api/v2/dags/{dag_id}/clearTaskInstances``), and what each clear does to the target.

* Clearing tasks of a committed run changes nothing: proven through the same scheduler by
  tests/test_e2e_downstream.py (the commit task: no state change, no second asset event),
  tests/test_e2e_table_targets.py and tests/test_e2e_backfill.py (the write task and its
  downstream: SKIPPED, targets byte-identical).
* Clearing the write task **before** the checkpoint committed (sealed, the durability
  sensor waiting in the stopped triggerer): the re-run write starts attempt 2, which is
  sealed, verified and published; attempt 1 is never published, and the target holds the
  interval's rows once.

See ``docs/backfill.md``.
"""

from __future__ import annotations

import hashlib
from datetime import date
from pathlib import Path

import pytest

from airflow_provider_walsink.core.store.store import CommitterStore

pytestmark = [pytest.mark.e2e, pytest.mark.spark, pytest.mark.slow]

DAG_ID = "walsink_daily_overwrite"
PIPELINE = "daily_events"
BEFORE_DAY = date(2026, 4, 2)
WRITE_OP, DURABLE_OP, COMMIT_OP = "WalWriteOperator", "CheckpointDurableSensor", "WalCommitOperator"
DEFER_AT_ONCE = {"walsink_check_before_defer": False}


def _key(day: date) -> str:
    return f"{day:%Y%m%d}T000000Z"


def _partition(stack, day: date) -> Path:
    return stack.home / "walsink" / "examples" / "target" / PIPELINE / f"dt={day.isoformat()}"


def _snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _source_rows(day: date) -> int:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "dags"))
    try:
        import walsink_example_common
    finally:
        sys.path.pop(0)
    return len(walsink_example_common.daily_events(day))


def _partition_rows(stack, day: date) -> int:
    import pyarrow.parquet as pq

    files = sorted(_partition(stack, day).glob("*.parquet"))
    return sum(pq.ParquetFile(f).metadata.num_rows for f in files)


def _tis(stack, run_id: str) -> dict[str, dict]:
    return {ti["operator"]: ti for ti in stack.task_instances(DAG_ID, run_id)}


def _run_day(stack, day: date, conf: dict | None = None) -> str:
    """Backfill one day and wait for its run; returns the run id."""
    backfill = stack.backfill(DAG_ID, day.isoformat(), day.isoformat(), conf=conf)
    (run,) = stack.wait_for_backfill(backfill, timeout=600)
    assert run["state"] == "success", _tis(stack, run["dag_run_id"])
    return run["dag_run_id"]


@pytest.fixture
def stack(airflow_stack):
    airflow_stack.wait_for_dag(DAG_ID)
    airflow_stack.unpause(DAG_ID)
    return airflow_stack


@pytest.fixture
def store(stack):
    store = CommitterStore.from_url(f"sqlite:///{stack.home}/walsink/committer.db")
    yield store
    store.dispose()


def test_clear_write_before_commit_publishes_only_the_new_attempt(stack, store):
    key = _key(BEFORE_DAY)
    stack.stop_component("triggerer")
    try:
        backfill = stack.backfill(DAG_ID, BEFORE_DAY.isoformat(), BEFORE_DAY.isoformat(), conf=DEFER_AT_ONCE)

        def sensor_waiting(attempt: int):
            runs = [r for r in stack.dag_runs(DAG_ID) if r["logical_date"].startswith(BEFORE_DAY.isoformat())]
            if not runs:
                return None
            tis = _tis(stack, runs[0]["dag_run_id"])
            record = store.get(PIPELINE, key)
            if tis[DURABLE_OP]["state"] == "deferred" and record and record.sealed_attempt == attempt:
                return runs[0]["dag_run_id"], tis, record
            return None

        run_id, tis, record = stack.wait_until(
            "attempt 1 sealed with its sensor deferred", lambda: sensor_waiting(1), timeout=600
        )
        assert record.state.value == "SEALED"
        assert tis[COMMIT_OP]["state"] is None
        assert not _partition(stack, BEFORE_DAY).exists()

        # Clear the write task (and downstream) while attempt 1 waits to be verified.
        stack.clear_task(DAG_ID, run_id, [tis[WRITE_OP]["task_id"]], include_downstream=True)
        run_id2, tis, record = stack.wait_until(
            "attempt 2 sealed with its sensor deferred", lambda: sensor_waiting(2), timeout=600
        )
        assert run_id2 == run_id
        assert record.state.value == "SEALED" and record.attempt == 2
        assert tis[WRITE_OP]["try_number"] == 2
        assert not _partition(stack, BEFORE_DAY).exists()
    finally:
        stack.start_component("triggerer")

    (run,) = stack.wait_for_backfill(backfill, timeout=600)
    assert run["state"] == "success", _tis(stack, run_id)
    final = store.require(PIPELINE, key)
    assert final.state.value == "COMMITTED"
    assert final.sealed_attempt == 2
    history = store.history(PIPELINE, key)
    assert [t.attempt for t in history if t.to_state == "SEALED"] == [1, 2]
    assert [t.attempt for t in history if t.to_state == "COMMITTED"] == [2]
    # The interval's rows, once: attempt 1 was never published.
    assert _partition_rows(stack, BEFORE_DAY) == _source_rows(BEFORE_DAY) == final.rows
