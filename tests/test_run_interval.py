"""The checkpoint key and the job's interval follow the run's logical date and data interval
as Airflow 3.3 sets them, for every kind of run; a run walsink cannot place is refused
before the job is submitted (issue 22, symptom 9).

Every run is created by Airflow's own code: ``dag.test()`` (a manual run with a logical
date, as the UI and the REST API make it), ``airflow.api.common.trigger_dag`` (what
``airflow dags trigger [-l]`` calls), the scheduler's timetable and ``create_dagrun``, a
backfill (``_create_backfill``) and an asset-triggered run as the scheduler creates it.
The write task then runs for real (the task SDK's context, the Spark provider's hook);
only spark-submit is a stand-in that starts the job with Python, and the job records
what it was given, so no Spark starts.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from datetime import UTC, datetime

import pytest

from tests.helpers import python_spark_submit

pytestmark = pytest.mark.airflow

DAG_ID = "walsink_run_interval_test"

JOB = textwrap.dedent(
    """
    import json, sys
    from airflow_provider_walsink.core.spark import ProtocolArgs

    protocol, args = ProtocolArgs.from_argv(sys.argv[1:])
    with open(args[0], "a") as f:
        f.write(json.dumps({"key": protocol.checkpoint_key, "start": protocol.interval_start,
                            "end": protocol.interval_end}) + "\\n")
    """
)


@pytest.fixture
def setup(airflow_db, monkeypatch, sqlite_store, database_urls, tmp_path):
    from airflow.sdk import DAG

    from airflow_provider_walsink.operators.write import WalWriteOperator

    url = database_urls("sqlite")
    monkeypatch.setenv(
        "AIRFLOW_CONN_WALSINK_RI_TEST",
        json.dumps(
            {"conn_type": "walsink", "extra": {"url": url, "staging_root": str(tmp_path / "staging")}}
        ),
    )
    job = tmp_path / "job.py"
    job.write_text(JOB)
    submit = python_spark_submit(tmp_path, job)
    received = tmp_path / "received.jsonl"
    with DAG(DAG_ID, schedule="@daily", start_date=datetime(2026, 1, 1, tzinfo=UTC), catchup=False) as dag:
        WalWriteOperator(
            task_id="write",
            application=str(job),
            application_args=[str(received)],
            pipeline="events",
            walsink_conn_id="walsink_ri_test",
            spark_binary=str(submit),
            env_vars={"PYTHONPATH": os.pathsep.join(sys.path)},
        )
    return dag, sqlite_store, received


def _received(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _run_write(dag, run_id: str) -> str:
    """Run the write task of an existing run the way dag.test() runs a task; return its state."""
    from airflow import settings
    from airflow.models.dagrun import DagRun
    from airflow.sdk.definitions.dag import _run_task
    from airflow.utils.state import DagRunState, TaskInstanceState

    session = settings.Session()
    dr = session.query(DagRun).filter_by(dag_id=DAG_ID, run_id=run_id).one()
    dr.state = DagRunState.RUNNING
    ti = dr.get_task_instance("write", session=session)
    ti.try_number += 1
    ti.state = TaskInstanceState.SCHEDULED
    session.commit()
    try:
        _run_task(ti=ti, task=dag.task_dict["write"])
    except Exception:  # noqa: BLE001 - the state says how it ended
        pass
    session.expire_all()
    return dr.get_task_instance("write", session=session).state


def _serialized(dag):
    from airflow.models.dagbag import DBDagBag
    from airflow.utils.session import create_session

    dag.test(logical_date=None, mark_success_pattern="write")  # puts the DAG in the metadata DB
    with create_session() as session:
        return DBDagBag().get_latest_version_of_dag(DAG_ID, session=session)


def test_a_manual_run_with_a_logical_date_writes_that_interval(setup):
    """``dag.test(logical_date=...)`` makes the run the UI and the REST API make: the interval
    is the timetable's for the logical date, and the key is its start."""
    dag, store, received = setup
    day = datetime(2026, 1, 6, tzinfo=UTC)
    dr = dag.test(logical_date=day)
    assert {ti.task_id: ti.state for ti in dr.get_task_instances()} == {"write": "failed"}  # no manifest
    assert _received(received) == [
        {"key": "20260106T000000Z", "start": day.isoformat(), "end": day.isoformat()}
    ]


def test_a_rest_api_trigger_with_a_logical_date_writes_that_interval(setup):
    """POST /api/v2/dags/{dag}/dagRuns with a logical date (the UI, ``airflowctl dags trigger``):
    the route's own body validation derives the interval from the logical date."""
    from airflow.api_fastapi.core_api.datamodels.dag_run import TriggerDAGRunPostBody
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState
    from airflow.utils.types import DagRunTriggeredByType, DagRunType

    dag, store, received = setup
    serdag = _serialized(dag)
    day = datetime(2026, 1, 7, tzinfo=UTC)
    params = TriggerDAGRunPostBody(logical_date=day, dag_run_id="manual_rest").validate_context(serdag)
    with create_session() as session:
        serdag.create_dagrun(
            run_id=params["run_id"],
            logical_date=params["logical_date"],
            data_interval=params["data_interval"],
            run_after=params["run_after"],
            conf=params["conf"],
            run_type=DagRunType.MANUAL,
            triggered_by=DagRunTriggeredByType.REST_API,
            state=DagRunState.QUEUED,
            session=session,
        )
    assert _run_write(dag, "manual_rest") == "failed"  # no manifest: the job only records
    assert _received(received) == [
        {"key": "20260107T000000Z", "start": day.isoformat(), "end": day.isoformat()}
    ]


def test_a_cli_trigger_with_a_logical_date_is_refused_not_written_at_the_trigger_time(setup, capfd):
    """``airflow dags trigger -l 2026-01-05``: Airflow 3.3's CLI gives the run logical date
    2026-01-05 but the data interval of the time of the trigger. walsink used to write the
    trigger time's interval under its key; it must refuse the run before the job starts."""
    from airflow.api.common.trigger_dag import trigger_dag
    from airflow.utils.types import DagRunTriggeredByType

    dag, store, received = setup
    _serialized(dag)
    dr = trigger_dag(
        DAG_ID,
        triggered_by=DagRunTriggeredByType.CLI,
        run_id="manual_cli_l",
        logical_date=datetime(2026, 1, 5, tzinfo=UTC),
    )
    assert dr.logical_date == datetime(2026, 1, 5, tzinfo=UTC)
    assert dr.data_interval_start != dr.logical_date  # Airflow's own behaviour, the cause

    capfd.readouterr()
    state = _run_write(dag, "manual_cli_l")
    assert _received(received) == []  # the job never ran
    assert state == "failed"
    assert store.get_pipeline("events") is None  # nothing recorded
    log = capfd.readouterr().out
    assert "RunIntervalError" in log and "has logical date 2026-01-05T00:00:00+00:00 but data interval" in log
    assert "airflow backfill create" in log


def test_runs_without_a_logical_date_are_refused(setup, capfd):
    """A manual run triggered without a logical date and an asset-triggered run have no
    logical date and no data interval: refused, never keyed by their run id or trigger time."""
    from airflow.api.common.trigger_dag import trigger_dag
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState
    from airflow.utils.types import DagRunTriggeredByType, DagRunType

    dag, store, received = setup
    serdag = _serialized(dag)
    trigger_dag(DAG_ID, triggered_by=DagRunTriggeredByType.CLI, run_id="manual_no_l")
    with create_session() as session:
        serdag.create_dagrun(
            run_id="asset_triggered_run",
            logical_date=None,
            data_interval=None,
            run_after=datetime.now(UTC),
            run_type=DagRunType.ASSET_TRIGGERED,
            triggered_by=DagRunTriggeredByType.ASSET,
            state=DagRunState.QUEUED,
            session=session,
        )
    capfd.readouterr()
    assert _run_write(dag, "manual_no_l") == "failed"
    assert _run_write(dag, "asset_triggered_run") == "failed"
    assert _received(received) == []
    assert store.get_pipeline("events") is None
    log = capfd.readouterr().out
    for run_id, run_type in (("manual_no_l", "manual"), ("asset_triggered_run", "asset_triggered")):
        assert f"run {run_id} ({run_type} run of DAG {DAG_ID}) has no logical date" in log


def test_scheduled_and_backfill_runs_write_their_interval(setup):
    """The scheduler's run (timetable's next run info → create_dagrun) and a backfill's run
    write the interval starting at their logical date, under its key."""
    from airflow.models.backfill import _create_backfill
    from airflow.models.dagrun import DagRun
    from airflow.timetables.base import DataInterval, TimeRestriction
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState
    from airflow.utils.types import DagRunTriggeredByType, DagRunType

    dag, store, received = setup
    serdag = _serialized(dag)
    previous = DataInterval(datetime(2026, 2, 9, tzinfo=UTC), datetime(2026, 2, 9, tzinfo=UTC))
    info = serdag.timetable.next_dagrun_info(
        last_automated_data_interval=previous,
        restriction=TimeRestriction(earliest=datetime(2026, 1, 1, tzinfo=UTC), latest=None, catchup=True),
    )
    with create_session() as session:
        serdag.create_dagrun(
            run_id="scheduled_run",
            logical_date=info.logical_date,
            data_interval=info.data_interval,
            run_after=info.run_after,
            run_type=DagRunType.SCHEDULED,
            triggered_by=DagRunTriggeredByType.TIMETABLE,
            state=DagRunState.QUEUED,
            session=session,
        )
    assert _run_write(dag, "scheduled_run") == "failed"  # no manifest: the job only records
    _create_backfill(
        dag_id=DAG_ID,
        from_date=datetime(2026, 3, 2, tzinfo=UTC),
        to_date=datetime(2026, 3, 2, tzinfo=UTC),
        max_active_runs=1,
        reverse=False,
        dag_run_conf=None,
        triggering_user_name="test",
    )
    with create_session() as session:
        backfill_run = session.query(DagRun).filter_by(dag_id=DAG_ID, run_type=DagRunType.BACKFILL_JOB).one()
        run_id = backfill_run.run_id
    assert _run_write(dag, run_id) == "failed"
    day10, day2 = datetime(2026, 2, 10, tzinfo=UTC), datetime(2026, 3, 2, tzinfo=UTC)
    assert _received(received) == [
        {"key": "20260210T000000Z", "start": day10.isoformat(), "end": day10.isoformat()},
        {"key": "20260302T000000Z", "start": day2.isoformat(), "end": day2.isoformat()},
    ]
    assert sorted(r.checkpoint_key for r in store.checkpoints("events")) == [
        "20260210T000000Z",
        "20260302T000000Z",
    ]
