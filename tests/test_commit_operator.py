"""WalCommitOperator in a real Airflow run (``dag.test()``)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from airflow_provider_walsink.committer import CommitterStore
from airflow_provider_walsink.protocol import CheckpointState as S
from airflow_provider_walsink.protocol import StagingLayout
from tests.helpers import stage_checkpoint, target_files

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


def build_dag(target, *, key=None):
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
