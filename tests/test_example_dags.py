"""``dag.test()`` of the example DAGs with real Spark (spark-submit), committer on PostgreSQL.

(On SQLite the same DAGs run through the real scheduler: the daily overwrite in
tests/test_e2e_backfill.py, the table and SQL examples in tests/test_e2e_table_targets.py;
the incremental append, on PostgreSQL with a failed-then-retried write, in tests/test_incremental.py.)

The DAGs are pointed at the test's committer database and directories the way
a user would: the ``walsink_default`` connection from ``AIRFLOW_CONN_WALSINK_DEFAULT``
(JSON) and the ``walsink_example_home`` Variable from ``AIRFLOW_VAR_WALSINK_EXAMPLE_HOME``.
Each test checks the target's content against the generated source.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import sys
from datetime import UTC, date, datetime
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from airflow_provider_walsink.core.store.store import CommitterStore
from tests.task_logs import noise, phase_lines, spark_info_loggers

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "dags"))

import walsink_example_common as examples  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.airflow, pytest.mark.slow]


@pytest.fixture
def committer_url(request, database_urls):
    """The committer database the DAG uses: an emptied SQLite file or PostgreSQL database."""
    if request.param == "sqlite":
        request.getfixturevalue("sqlite_store")  # migrated and emptied
        return database_urls("sqlite")
    return request.getfixturevalue("pg_url")


@pytest.fixture
def walsink_env(monkeypatch, tmp_path, committer_url):
    """Point the example DAGs at this test's committer database, staging root and example home."""
    home = tmp_path / "examples"
    staging = tmp_path / "staging"
    monkeypatch.setenv(
        "AIRFLOW_CONN_WALSINK_DEFAULT",
        json.dumps({"conn_type": "walsink", "extra": {"url": committer_url, "staging_root": str(staging)}}),
    )
    monkeypatch.setenv("AIRFLOW_VAR_WALSINK_EXAMPLE_HOME", str(home))
    return {"home": home, "staging": staging, "store": CommitterStore.from_url(committer_url)}


def load_dag(airflow_db, dag_id: str):
    """The DAG object of ``dags/<dag_id>.py`` (dag.test() also syncs the dags folder)."""
    module = importlib.import_module(dag_id)
    assert module.dag.dag_id == dag_id
    return module.dag


def run_dag(dag, day: date):
    from airflow.utils.state import DagRunState

    run = dag.test(logical_date=datetime(day.year, day.month, day.day, tzinfo=UTC))
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert run.state == DagRunState.SUCCESS, states
    return run


def read_target(root: Path) -> list[dict]:
    """Every row of a Hive-partitioned Parquet target (bookkeeping under ``_walsink`` ignored)."""
    dataset = ds.dataset(root, format="parquet", partitioning="hive", ignore_prefixes=[".", "_"])
    return dataset.to_table().to_pylist()


def test_example_dags_are_three_task_pipelines_built_by_the_helper():
    """Shape only (no Spark): what each example promises its users."""
    from airflow_provider_walsink.operators.commit import WalCommitOperator
    from airflow_provider_walsink.operators.write import WalWriteOperator
    from airflow_provider_walsink.sensors.durable import CheckpointDurableSensor

    for dag_id, group, mode, max_runs in (
        ("walsink_daily_overwrite", "daily_events", "overwrite", 4),
        ("walsink_incremental_append", "incoming_events", "append", 1),
    ):
        dag = importlib.import_module(dag_id).dag
        assert dag.max_active_runs == max_runs
        write, durable, commit = (dag.get_task(f"{group}.{t}") for t in ("write", "durable", "commit"))
        assert isinstance(write, WalWriteOperator) and write.mode == mode and write.partition_by == ["dt"]
        assert isinstance(durable, CheckpointDurableSensor) and durable.deferrable
        assert isinstance(commit, WalCommitOperator) and commit.mode == mode
        assert write.pipeline == durable.pipeline == commit.pipeline == group
        assert durable.upstream_task_ids == {write.task_id}
        assert commit.upstream_task_ids == {durable.task_id}
        assert write.spark_conn_id is None and write.master == "local[*]"
        assert "{{ var.value.get('walsink_example_home'" in write.application_args[1]
        assert write.target == commit.target and "walsink_example_home" in commit.target


def test_kafka_example_dag_reads_kafka_in_append_mode_into_delta():
    """Shape only (no Spark, no broker): the Kafka example (docs/kafka.md) gives both the write and
    the commit task the same source; its run through the scheduler (Spark Connect on the cluster) is tests/test_e2e_connect_cluster.py."""
    from airflow_provider_walsink.core.sources.kafka import KafkaSourceSpec

    dag = importlib.import_module("walsink_kafka_append").dag
    assert dag.max_active_runs == 1
    write, commit = dag.get_task("kafka_events.write"), dag.get_task("kafka_events.commit")
    assert write.mode == commit.mode == "append" and write.partition_by == ["dt"]
    assert write.source == commit.source and write.source["kind"] == "kafka"
    assert write.source["conn_id"] == "kafka_default"
    spec = KafkaSourceSpec.from_dict(write.source)
    assert spec.topics == ("walsink_events",) and spec.group_id and not spec.accept_data_loss
    assert write.target.startswith("delta://") and write.target == commit.target


# With the SQLite committer this DAG runs through the real scheduler in tests/test_e2e_backfill.py
# (the same checks and more: rows against the source, the staging cleaned, the re-run skipped).
def _captured(capfd, caplog) -> tuple[str, str]:
    """What the run printed so far, and what it logged through Python's logging. A module's
    logger reaches pytest's log capture, and the printed output too once Airflow has set its
    handlers up; which of the two holds a line depends on what ran before in the process (the
    commit's line was in the log capture only in a CI run under xdist). Phases are counted in
    each, and the larger count taken: a line said twice in either is still seen."""
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(Exception):  # a closed stream has nothing left to give
            stream.flush()
    printed = "".join(capfd.readouterr())
    logged = caplog.text
    caplog.clear()
    return printed, logged


def _phases(said: tuple[str, str], key: str, rows: int) -> dict[str, int]:
    printed, logged = (phase_lines(text, "daily_events", key, rows) for text in said)
    return {phase: max(printed[phase], logged[phase]) for phase in printed}


@pytest.mark.parametrize("committer_url", ["postgresql"], indirect=True)
def test_daily_overwrite_dag(airflow_db, walsink_env, committer_url, capfd, caplog):
    """The demo's daily pipeline (scripts/demo.py) through dag.test(): each source row once in the
    target, a re-run skipped; and its tasks' log at INFO says each phase once, without the noise
    of tests/task_logs.py's LOG_NOISE."""
    dag = load_dag(airflow_db, "walsink_daily_overwrite")
    # A dag.test() run's data interval starts at its logical date: the checkpoint of that day.
    day = date(2026, 2, 12)
    capfd.readouterr()
    caplog.clear()
    run_dag(dag, day)
    said = _captured(capfd, caplog)
    log = "\n".join(said)

    store = walsink_env["store"]
    key = f"{day:%Y%m%d}T000000Z"
    record = store.require("daily_events", key)
    assert record.state.value == "COMMITTED"
    expected = examples.daily_events(day)
    assert record.rows == len(expected)
    assert _phases(said, key, len(expected)) == {
        "register": 1,
        "seal": 1,
        "durable": 1,
        "publish": 1,
        "announce": 1,
        "skip": 0,
    }, log[-5000:]
    assert noise(log) == [], log[-5000:]
    # Spark's own INFO lines (138 in a small job at INFO) are left out: spark.log.level WARN.
    assert spark_info_loggers(log) <= {"SparkContext"}, log[-5000:]

    rows = read_target(walsink_env["home"] / "target/daily_events")
    assert len(rows) == len(expected)
    got = {r["event_id"]: r for r in rows}
    assert len(got) == len(expected)  # each source row once
    for want in expected[:: len(expected) // 50]:
        r = got[want["event_id"]]
        assert (r["user_id"], r["country"], r["event_type"], r["amount_cents"]) == (
            want["user_id"],
            want["country"],
            want["event_type"],
            want["amount_cents"],
        )
        assert r["ts"].strftime("%Y-%m-%d %H:%M:%S") == want["ts"]
        assert str(r["dt"]) == day.isoformat()
    assert sum(r["amount_cents"] for r in rows) == sum(w["amount_cents"] for w in expected)
    # The commit cleaned the staging area (the WAL) of this checkpoint.
    assert not (walsink_env["staging"] / "daily_events" / key).exists()

    # Running the committed day again changes nothing (reprocess policy "skip":
    # no Spark job; the write task ends skipped, and the sensor and commit task with it).
    published = {p: p.stat().st_mtime_ns for p in (walsink_env["home"] / "target/daily_events").rglob("*")}
    run = run_dag(dag, day)
    said = _captured(capfd, caplog)
    log = "\n".join(said)
    assert _phases(said, key, len(expected))["skip"] == 1, log[-5000:]
    assert noise(log) == [], log[-5000:]
    write = next(ti for ti in run.get_task_instances() if ti.task_id == "daily_events.write")
    assert write.try_number == 1 and write.state == "skipped"
    assert {
        p: p.stat().st_mtime_ns for p in (walsink_env["home"] / "target/daily_events").rglob("*")
    } == published
    history = store.history("daily_events", key)
    changes = [h.to_state for h in history if h.from_state != h.to_state]
    assert changes.count("WRITING") == 1
    assert changes.count("COMMITTED") == 1
    # The re-run is recorded as an event that changed no state.
    rerun = [h for h in history if h.from_state == h.to_state == "COMMITTED"]
    assert len(rerun) == 1 and "write skipped" in rerun[0].detail
