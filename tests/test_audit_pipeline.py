"""The audit task in Airflow: ``walsink_pipeline(..., audit=[...])`` run with ``dag.test()``
(real Spark, real Parquet, committer on SQLite), and WalAuditOperator's outcomes."""

from __future__ import annotations

import hashlib
import importlib
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from airflow_provider_walsink.core.commit.audit import NotNullCheck, RowCountCheck
from airflow_provider_walsink.core.protocol import CheckpointState as S
from airflow_provider_walsink.core.staging import StagingLayout
from airflow_provider_walsink.core.store import CommitterStore
from tests.helpers import ACTOR, stage_tables

REPO = Path(__file__).resolve().parent.parent
TEST_DAGS = REPO / "tests" / "dags"
KEY = "20260301T000000Z"


def audit_test_dag():
    """``tests/dags/walsink_audit_test.py`` (the file the stack parses too)."""
    sys.path.insert(0, str(TEST_DAGS))
    try:
        return importlib.import_module("walsink_audit_test")
    finally:
        sys.path.remove(str(TEST_DAGS))


def snapshot(root: Path) -> dict[str, str]:
    """Every file under ``root`` (hidden bookkeeping included) -> sha256."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_the_pipeline_inserts_the_audit_between_durable_and_commit():
    from airflow_provider_walsink.operators.audit import WalAuditOperator
    from airflow_provider_walsink.operators.commit import WalCommitOperator
    from airflow_provider_walsink.operators.pipeline import walsink_pipeline

    module = audit_test_dag()
    dag = module.dag
    durable, audit, commit = (dag.get_task(f"events.{t}") for t in ("durable", "audit", "commit"))
    assert isinstance(audit, WalAuditOperator) and isinstance(commit, WalCommitOperator)
    assert audit.upstream_task_ids == {durable.task_id} and commit.upstream_task_ids == {audit.task_id}
    assert commit.require_audit and [c.name for c in audit.checks] == [c.name for c in module.AUDIT]
    assert audit.pipeline == commit.pipeline == "audited_events"
    assert audit.staging_root == commit.staging_root  # where the write task staged

    from airflow.sdk import DAG

    with DAG("walsink_no_audit_shape", schedule=None, start_date=datetime(2026, 1, 1, tzinfo=UTC)) as plain:
        walsink_pipeline("p", pipeline="p", application="job.py", target="/t")
    assert "p.audit" not in plain.task_dict and not plain.get_task("p.commit").require_audit
    assert plain.get_task("p.commit").upstream_task_ids == {"p.durable"}
    with pytest.raises(TypeError, match="AuditCheck or a callable"):
        with DAG("walsink_bad_audit", schedule=None, start_date=datetime(2026, 1, 1, tzinfo=UTC)):
            walsink_pipeline("p", pipeline="p", application="job.py", target="/t", audit=["user_id"])


@pytest.fixture
def audit_env(monkeypatch, sqlite_store, database_urls, tmp_path):
    staging, home = tmp_path / "staging", tmp_path / "home"
    url = database_urls("sqlite")
    monkeypatch.setenv(
        "AIRFLOW_CONN_WALSINK_DEFAULT",
        json.dumps({"conn_type": "walsink", "extra": {"url": url, "staging_root": str(staging)}}),
    )
    monkeypatch.setenv("AIRFLOW_VAR_WALSINK_AUDIT_TEST_HOME", str(home))
    return SimpleNamespace(store=CommitterStore.from_url(url), layout=StagingLayout(staging), home=home)


@pytest.mark.spark
@pytest.mark.slow
def test_an_audit_that_passes_publishes_and_one_that_fails_leaves_the_target_untouched(airflow_db, audit_env):
    dag = audit_test_dag().dag
    store, target = audit_env.store, audit_env.home / "target"

    # May 1st (odd): clean data, audited, committed.
    run = dag.test(logical_date=datetime(2026, 5, 1, tzinfo=UTC))
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert set(states.values()) == {"success"}, states
    good = store.require("audited_events", "20260501T000000Z")
    assert good.state is S.COMMITTED and good.rows == 1000
    audited = [h for h in store.history("audited_events", good.checkpoint_key) if h.to_state == "AUDITED"]
    assert len(audited) == 1 and audited[0].task_id == "events.audit"
    assert '"passed": true' in audited[0].detail and "not_null(user_id)" in audited[0].detail
    rows = ds.dataset(target, format="parquet", partitioning="hive", ignore_prefixes=[".", "_"]).to_table()
    assert rows.num_rows == 1000 and pa.compute.all(pa.compute.is_valid(rows["user_id"])).as_py()
    published = snapshot(target)

    # May 2nd (even): three rows without a user id. REJECTED; the target is untouched.
    run = dag.test(logical_date=datetime(2026, 5, 2, tzinfo=UTC))
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert states == {
        "events.write": "success",
        "events.durable": "success",
        "events.audit": "failed",
        "events.commit": "upstream_failed",
    }, states
    assert run.state == "failed"
    bad = store.require("audited_events", "20260502T000000Z")
    assert bad.state is S.REJECTED
    assert bad.error == "not_null(user_id): 3 of 1,000 rows are NULL"
    assert snapshot(target) == published
    # The audit task did not retry (AirflowFailException): one verdict, one try.
    audit_ti = next(ti for ti in run.get_task_instances() if ti.task_id == "events.audit")
    assert audit_ti.try_number == 1
    # The rejected attempt's staging stays for inspection (the UI lists its committables).
    layout = audit_env.layout
    assert layout.manifest_path(
        bad.pipeline, bad.checkpoint_key, bad.sealed_attempt, bad.sealed_attempt_id
    ).exists()


# ------------------------------------------------------------------ the operator's outcomes


def _operator(checks):
    from airflow_provider_walsink.operators.audit import WalAuditOperator

    return WalAuditOperator(
        task_id="audit", pipeline="events", checks=checks, walsink_conn_id="walsink_default"
    )


def _context():
    ti = SimpleNamespace(dag_id="d", task_id="audit", run_id="manual", try_number=1, map_index=-1, id=None)
    day = datetime(2026, 3, 1, tzinfo=UTC)  # a run's context: logical date and data interval together
    return {"ti": ti, "logical_date": day, "data_interval_start": day, "data_interval_end": day}


def _good(n=10):
    return {"dt=2026-03-01/part-0.parquet": pa.table({"id": list(range(n)), "user_id": list(range(n))})}


def test_the_audit_task_passes_then_is_a_noop_then_skips_once_committed(audit_env, tmp_path):
    from airflow_provider_walsink.core.commit import CheckpointCommitter
    from airflow_provider_walsink.core.targets import FilePublisher
    from airflow_provider_walsink.operators.audit import AirflowSkipException  # as the operator raises it

    store, layout = audit_env.store, audit_env.layout
    stage_tables(store, layout, "events", KEY, _good(), partition_columns=("dt",))
    op = _operator([RowCountCheck(min_rows=1), NotNullCheck("user_id")])
    result = op.execute(_context())
    assert result["verdict"] == "AUDITED" and not result["already"]
    assert store.require("events", KEY).state is S.AUDITED
    history = store.history("events", KEY)
    assert op.execute(_context())["already"] and store.history("events", KEY) == history
    CheckpointCommitter(
        store,
        layout,
        FilePublisher(tmp_path / "t", "overwrite", layout=layout),
        mode="overwrite",
        require_audit=True,
    ).commit("events", KEY, actor=ACTOR)
    with pytest.raises(AirflowSkipException, match="COMMITTED: nothing left to audit"):
        op.execute(_context())


def test_the_audit_task_fails_without_retry_naming_the_failed_check(audit_env):
    from airflow_provider_walsink.operators.audit import AirflowFailException  # as the operator raises it

    store, layout = audit_env.store, audit_env.layout
    tables = {"dt=2026-03-01/part-0.parquet": pa.table({"id": [1, 2, 3], "user_id": [1, None, 3]})}
    stage_tables(store, layout, "events", KEY, tables, partition_columns=("dt",))
    op = _operator([NotNullCheck("user_id")])
    for _ in range(2):  # a re-run fails again with the recorded reason, changing nothing
        with pytest.raises(
            AirflowFailException, match=r"REJECTED.*not_null\(user_id\): 1 of 3 rows are NULL"
        ):
            op.execute(_context())
    assert [h.to_state for h in store.history("events", KEY)].count("REJECTED") == 1


def test_an_audit_that_cannot_run_fails_the_task_and_leaves_the_checkpoint_durable(audit_env):
    from airflow_provider_walsink.operators.audit import AirflowFailException  # as the operator raises it

    store, layout = audit_env.store, audit_env.layout
    stage_tables(store, layout, "events", KEY, {"part-0.orc": pa.table({"id": [1]})}, file_format="orc")
    with pytest.raises(AirflowFailException, match="could not run: audit checks cannot read orc files"):
        _operator([NotNullCheck("id")]).execute(_context())
    assert store.require("events", KEY).state is S.DURABLE
    assert "audit could not run" in store.history("events", KEY)[-1].detail


def test_the_durability_gate_passes_audited_and_rejected_checkpoints_at_once(audit_env):
    """A cleared durability sensor must not wait for a checkpoint the audit already judged."""
    from airflow_provider_walsink.core.commit.audit import audit_checkpoint
    from airflow_provider_walsink.triggers.durable import evaluate_durability

    store, layout = audit_env.store, audit_env.layout
    bad = {"dt=2026-03-02/part-0.parquet": pa.table({"id": [1, 2], "user_id": [None, 2]})}
    stage_tables(store, layout, "events", KEY, _good(), partition_columns=("dt",))
    stage_tables(store, layout, "events", "k-bad", bad, partition_columns=("dt",))
    for key in (KEY, "k-bad"):
        audit_checkpoint(store, layout, "events", key, [NotNullCheck("user_id")], actor=ACTOR)
    for key, state in ((KEY, "AUDITED"), ("k-bad", "REJECTED")):
        status = evaluate_durability(store, layout, "events", key, actor=ACTOR)
        assert (status.durable, status.state) == (True, state)
        assert store.require("events", key).state.value == state  # and nothing moved
