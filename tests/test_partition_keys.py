"""Asset partitions as checkpoint keys (issue 37): the mapping from a run's partition key to its
checkpoint key and target partition, and the refusal of a key that cannot name them, before
anything is recorded or the job starts.

The pure mapping is checked directly; the write task runs as in tests/test_run_interval.py:
runs created by Airflow's own code (``airflow.api.common.trigger_dag`` with ``partition_key``,
what ``airflow dags trigger --partition-key`` and the REST API call), the task run by the task
SDK (its real context), only spark-submit a stand-in that starts the job with Python, and the
job records what it was given, so no Spark starts. Through the real scheduler (a partitioned
backfill into Delta, downstream runs per partition): tests/test_e2e_partitions.py.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from datetime import UTC, datetime

import pytest

from airflow_provider_walsink.core.protocol.partition_keys import (
    PartitionKeyError,
    PartitionSpec,
    checkpoint_key_for_partition,
    partition_key_of_checkpoint,
)
from tests.helpers import python_spark_submit

DAG_ID = "walsink_partition_keys_test"

#: partition key -> checkpoint key (docs/backfill.md, "Partitioned runs").
MAPPING = [
    ("2026-03-01", "pk=2026-03-01"),
    ("2026-03-01T00:00:00", "pk=2026-03-01T00+3A00+3A00"),  # CronPartitionTimetable's default format
    ("eu|2026-03-01", "pk=eu+7C2026-03-01"),  # a composite key (ProductMapper)
    ("a+b=c", "pk=a+2Bb+3Dc"),  # '+' and '=' escaped too: one to one
    ("us", "pk=us"),
    ("zürich", "pk=z+C3+BCrich"),
]

#: partition key -> what the refusal names.
BAD_KEYS = [
    ("", "it is empty"),
    ("   ", "it is empty"),
    (" 2026-03-01", "white space"),
    ("eu/2026", "a path separator"),
    ("eu\\2026", "a path separator"),
    ("..", "'..'"),
    ("a..b", "'..'"),
    ("day\x01", "a control character"),
    ("x" * 130, "over 128"),
]


@pytest.mark.parametrize(("partition_key", "checkpoint_key"), MAPPING)
def test_a_partition_key_maps_to_one_checkpoint_key_and_back(partition_key, checkpoint_key):
    assert checkpoint_key_for_partition(partition_key) == checkpoint_key
    assert partition_key_of_checkpoint(checkpoint_key) == partition_key
    # A data-interval key is never read as a partition's.
    assert partition_key_of_checkpoint("20260301T000000Z") is None


@pytest.mark.parametrize(("partition_key", "why"), BAD_KEYS)
def test_a_key_that_cannot_name_a_checkpoint_is_refused_naming_why(partition_key, why):
    with pytest.raises(PartitionKeyError, match="cannot be a walsink checkpoint") as caught:
        checkpoint_key_for_partition(partition_key)
    assert why in str(caught.value)


def test_the_declared_column_and_format_map_a_key_to_its_target_partition_and_refuse_others():
    spec = PartitionSpec(column="dt", key_format="%Y-%m-%d")
    assert spec.checkpoint_key("2026-03-01") == "pk=2026-03-01"
    assert spec.target_partition("2026-03-01") == "dt=2026-03-01"
    # Escaped as Spark names the directory (a ':' is %3A on disk).
    assert PartitionSpec(column="hour").target_partition("2026-03-01T05:00") == "hour=2026-03-01T05%3A00"
    assert PartitionSpec().target_partition("2026-03-01") is None
    for key, why in (
        ("2026-3-1", "writes that date as '2026-03-01'"),
        ("2026-13-01", "does not match the pipeline's partition_key_format '%Y-%m-%d'"),
        ("march", "does not match"),
    ):
        with pytest.raises(PartitionKeyError, match="cannot be a walsink checkpoint") as caught:
            spec.checkpoint_key(key)
        assert why in str(caught.value)
    with pytest.raises(PartitionKeyError, match="NULL partition"):
        PartitionSpec(column="dt").checkpoint_key("__HIVE_DEFAULT_PARTITION__")
    # A declaration no key could satisfy fails when the DAG is parsed.
    with pytest.raises(ValueError, match="must be one of the pipeline's partition_by"):
        PartitionSpec(column="day").check_declaration(["dt"])
    with pytest.raises(ValueError, match="not a strftime format"):
        PartitionSpec(key_format="YYYY-MM-DD").check_declaration(["dt"])


def test_a_sealed_attempt_outside_its_target_partition_is_refused():
    from airflow_provider_walsink.core.commit.write_phase import check_target_partition
    from airflow_provider_walsink.core.protocol.errors import ManifestError

    check_target_partition(["dt=2026-03-01"], "dt=2026-03-01", "m.json")
    check_target_partition(["dt=2026-03-01/country=FR"], "dt=2026-03-01", "m.json")
    check_target_partition(["dt=2026-03-02"], None, "m.json")  # no partition declared: unchecked
    with pytest.raises(ManifestError, match=r"stages into partition\(s\) \['dt=2026-03-02'\]"):
        check_target_partition(["dt=2026-03-01", "dt=2026-03-02"], "dt=2026-03-01", "m.json")


def test_runs_without_a_partition_keep_their_data_interval_key():
    from airflow_provider_walsink.hooks.context import run_interval

    class TI:
        dag_id, run_id, task_id = "d", "r", "t"

    day = datetime(2026, 3, 1, tzinfo=UTC)
    context = {"ti": TI(), "logical_date": day, "data_interval_start": day, "data_interval_end": day}
    for partition_key in (None,):  # Airflow < 3.2 has no key at all; 3.2+ has None
        interval = run_interval({**context, "partition_key": partition_key}, None, PartitionSpec("dt"))
        assert (interval.key, interval.partition_key, interval.target_partition) == (
            "20260301T000000Z",
            None,
            None,
        )
    assert run_interval(context).key == "20260301T000000Z"
    # With a partition key, the partition wins over the data interval; an explicit key over both.
    assert run_interval({**context, "partition_key": "2026-03-02"}).key == "pk=2026-03-02"
    assert run_interval({**context, "partition_key": "2026-03-02"}, "explicit").key == "explicit"


# --- The write task, on runs Airflow creates ------------------------------------------------

JOB = textwrap.dedent(
    """
    import json, os, sys
    from airflow_provider_walsink.core.protocol.manifest import Committable, build_manifest
    from airflow_provider_walsink.core.spark import ProtocolArgs
    from airflow_provider_walsink.core.staging.object_store import StagingStore

    protocol, args = ProtocolArgs.from_argv(sys.argv[1:])
    with open(args[0], "a") as f:
        f.write(json.dumps({"key": protocol.checkpoint_key, "partition_key": protocol.partition_key,
                            "target_partition": protocol.target_partition,
                            "start": protocol.interval_start}) + "\\n")
    if len(args) > 1:  # stage one two-row CSV file under partition args[1] and seal, as CheckpointJob does
        store = StagingStore.open(protocol.staging_root)
        location = store.attempt(protocol.pipeline, protocol.checkpoint_key, protocol.attempt, protocol.attempt_id)
        relative = f"{args[1]}/part-0.csv"
        path = store.committable(location, relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(b"a\\nb\\n")
        store.seal(location, build_manifest(
            pipeline=protocol.pipeline, checkpoint_key=protocol.checkpoint_key, sequence=protocol.sequence,
            attempt=protocol.attempt, attempt_id=protocol.attempt_id, file_format="csv",
            partition_columns=protocol.partition_by, partitions=[protocol.target_partition],
            committables=[Committable(path=relative, size=4, rows=2)]))
    """
)


@pytest.fixture
def setup(airflow_db, monkeypatch, sqlite_store, database_urls, tmp_path):
    from airflow.sdk import DAG, PartitionedAtRuntime

    from airflow_provider_walsink.operators.write import WalWriteOperator

    url = database_urls("sqlite")
    monkeypatch.setenv(
        "AIRFLOW_CONN_WALSINK_PK_TEST",
        json.dumps(
            {"conn_type": "walsink", "extra": {"url": url, "staging_root": str(tmp_path / "staging")}}
        ),
    )
    job = tmp_path / "job.py"
    job.write_text(JOB)
    submit = python_spark_submit(tmp_path, job)
    received = tmp_path / "received.jsonl"
    # Partitioned at run time: runs "triggered with a partition_key", which the timetable does not
    # check (a CronPartitionTimetable refuses a key off its own format before walsink sees it).
    with DAG(
        DAG_ID, schedule=PartitionedAtRuntime(), start_date=datetime(2026, 1, 1, tzinfo=UTC), catchup=False
    ) as dag:
        WalWriteOperator(
            task_id="write",
            application=str(job),
            application_args=[str(received)],
            pipeline="events",
            partition_by=["dt"],
            partition_column="dt",
            partition_key_format="%Y-%m-%d",
            walsink_conn_id="walsink_pk_test",
            spark_binary=str(submit),
            env_vars={"PYTHONPATH": os.pathsep.join(sys.path)},
        )
    dag.test(logical_date=None, mark_success_pattern="write")  # puts the DAG in the metadata DB
    return dag, sqlite_store, received


def _received(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _trigger_and_run_write(dag, run_id: str, partition_key: str, stage_into: str | None = None) -> str:
    """``airflow dags trigger --partition-key`` (Airflow's trigger_dag), then the write task as
    dag.test() runs a task; returns its state."""
    from airflow import settings
    from airflow.api.common.trigger_dag import trigger_dag
    from airflow.models.dagrun import DagRun
    from airflow.sdk.definitions.dag import _run_task
    from airflow.utils.state import DagRunState, TaskInstanceState
    from airflow.utils.types import DagRunTriggeredByType

    trigger_dag(DAG_ID, triggered_by=DagRunTriggeredByType.CLI, run_id=run_id, partition_key=partition_key)
    session = settings.Session()
    dr = session.query(DagRun).filter_by(dag_id=DAG_ID, run_id=run_id).one()
    assert dr.partition_key == partition_key  # as Airflow stored it
    dr.state = DagRunState.RUNNING
    task = dag.task_dict["write"]
    task.application_args = [*task.application_args[:1], *([stage_into] if stage_into else [])]
    ti = dr.get_task_instance("write", session=session)
    ti.try_number += 1
    ti.state = TaskInstanceState.SCHEDULED
    session.commit()
    try:
        _run_task(ti=ti, task=task)
    except Exception:  # noqa: BLE001 - the state says how it ended
        pass
    session.expire_all()
    return dr.get_task_instance("write", session=session).state


def test_a_sealed_attempt_is_recorded_only_inside_its_runs_target_partition(setup):
    """The write task records the seal of an attempt staged in its key's partition (dt=2026-03-05),
    and refuses one staged in another day's (dt=2026-03-04): that checkpoint is FAILED, never
    SEALED, so nothing of it can be published."""
    dag, store, received = setup
    assert (
        _trigger_and_run_write(dag, "partition_inside", "2026-03-05", stage_into="dt=2026-03-05") == "success"
    )
    inside = store.require("events", "pk=2026-03-05")
    assert inside.state.value == "SEALED" and inside.rows == 2
    assert (
        _trigger_and_run_write(dag, "partition_outside", "2026-03-06", stage_into="dt=2026-03-04")
        != "success"
    )
    outside = store.require("events", "pk=2026-03-06")
    assert outside.state.value == "FAILED" and outside.sealed_attempt is None
    assert "stages into partition(s) ['dt=2026-03-04']" in outside.error
    assert "names target partition dt=2026-03-06" in outside.error


def test_a_run_triggered_with_a_partition_key_writes_that_partitions_checkpoint(setup):
    dag, store, received = setup
    assert _trigger_and_run_write(dag, "partition_good", "2026-03-01") == "failed"  # no manifest
    assert _received(received) == [
        {
            "key": "pk=2026-03-01",
            "partition_key": "2026-03-01",
            "target_partition": "dt=2026-03-01",
            "start": None,
        }
    ]
    assert store.require("events", "pk=2026-03-01").state.value == "FAILED"  # the stand-in job sealed nothing


def test_each_bad_partition_key_is_refused_before_anything_is_recorded_or_the_job_starts(setup, capfd):
    """(An empty or blank key never reaches walsink: Airflow's trigger refuses it,
    ``InvalidPartitionKeyError``; walsink's own refusal of it is the pure test above.)"""
    dag, store, received = setup
    bad = {
        "bad_slash": ("eu/2026-03-01", "holds '/', a path separator"),
        "bad_dots": ("2026..03", "holds '..'"),
        "bad_control": ("2026-03-01\x07", "holds a control character"),
        "bad_format": ("2026-3-1", "partition_key_format '%Y-%m-%d' writes that date as '2026-03-01'"),
        "bad_null": ("__HIVE_DEFAULT_PARTITION__", "does not match"),  # off the format before NULL's check
        "bad_long": ("2026-03-01" + "x" * 140, "does not match"),
    }
    capfd.readouterr()
    for run_id, (key, _) in bad.items():
        assert _trigger_and_run_write(dag, run_id, key) == "failed", run_id
    assert _received(received) == []  # the job never started
    assert store.get_pipeline("events") is None  # nothing recorded
    log = capfd.readouterr().out
    for run_id, (key, why) in bad.items():
        assert (
            f"run {run_id} (manual run of DAG {DAG_ID}): partition key {key!r} cannot be a walsink checkpoint"
            in log
        ), run_id
        assert why in log, run_id


def test_on_an_airflow_without_partitions_a_pipeline_keeps_interval_keys_with_one_log_line(monkeypatch):
    """Airflow before 3.2 has no ``CronPartitionTimetable`` and gives no run a partition key.
    Its absence is simulated (this venv has 3.3): the pipeline's partition settings are dropped
    with one warning, never an import error, and its runs keep their data-interval keys."""
    import logging

    from airflow.sdk import DAG

    from airflow_provider_walsink.operators import partitioned
    from airflow_provider_walsink.operators.pipeline import walsink_pipeline

    assert partitioned.airflow_has_partitions()  # the installed Airflow has them
    monkeypatch.setattr(partitioned, "airflow_has_partitions", lambda: False)
    # A handler on the module's logger itself: Airflow's logging setup may or may not propagate
    # to the root (where caplog listens), so caplog could see the line zero or two times.
    seen: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = seen.append  # type: ignore[method-assign]
    partitioned.log.addHandler(handler)
    monkeypatch.setattr(partitioned.log, "level", logging.WARNING)
    try:
        with DAG(
            "walsink_old_airflow_test", schedule="@daily", start_date=datetime(2026, 1, 1, tzinfo=UTC)
        ) as dag:
            walsink_pipeline(
                "events",
                pipeline="events",
                application="/opt/job.py",
                target="/data/events",
                partition_by=["dt"],
                partition_column="dt",
                partition_key_format="%Y-%m-%d",
            )
    finally:
        partitioned.log.removeHandler(handler)
    lines = [r.getMessage() for r in seen]
    assert len(lines) == 1 and "has no asset partitions (they need Airflow 3.2+)" in lines[0], lines
    assert dag.get_task("events.write").partitions == PartitionSpec()
