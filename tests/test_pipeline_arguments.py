"""``walsink_pipeline``'s arguments: the pipeline's own, then one group per task (``write=``,
``durable=``, ``audit=``, ``commit=``); the spellings of the last release still build the same
tasks, each with a DeprecationWarning naming its new spelling."""

from __future__ import annotations

import warnings
from datetime import UTC, datetime

import pytest
from airflow.sdk import DAG

from airflow_provider_walsink.core.commit.audit import RowCountCheck
from airflow_provider_walsink.operators.commit import WalCommitOperator
from airflow_provider_walsink.operators.pipeline import DEPRECATED_ARGUMENTS, walsink_pipeline
from airflow_provider_walsink.operators.write import WalWriteOperator

START = datetime(2026, 1, 1, tzinfo=UTC)
REQUIRED = {"pipeline": "p", "application": "/jobs/job.py", "target": "/data/t"}


def _tasks(**kwargs):
    with DAG("d", schedule=None, start_date=START) as dag:
        walsink_pipeline("events", **REQUIRED, **kwargs)
    return {t.task_id.split(".", 1)[1]: t for t in dag.tasks}


def test_grouped_arguments_reach_their_tasks_and_shared_ones_reach_all():
    tasks = _tasks(
        mode="append",
        verify_checksums=True,
        write={"conf": {"spark.sql.shuffle.partitions": "2"}, "application_args": ["--a"], "retries": 3},
        durable={"poke_interval": 7, "deferrable": False},
        audit={"checks": [RowCountCheck(min_rows=1)], "retries": 4},
        commit={"group_commit": 0, "retries": 5},
    )
    assert sorted(tasks) == ["audit", "commit", "durable", "write"]
    write, durable, audit, commit = (tasks[k] for k in ("write", "durable", "audit", "commit"))
    assert write.conf == {"spark.sql.shuffle.partitions": "2"}
    assert write.application_args == ["--a"] and write.retries == 3
    assert durable.poke_interval == 7 and durable.deferrable is False and durable.verify_checksums is True
    assert audit.retries == 4 and len(audit.checks) == 1
    assert commit.group_commit == 0 and commit.retries == 5 and commit.require_audit is True
    assert {t.mode for t in (write, commit)} == {"append"} and commit.verify_checksums is True
    assert write.downstream_task_ids == {durable.task_id} and audit.downstream_task_ids == {commit.task_id}


def test_the_durability_sensor_defaults_to_waiting_in_the_triggerer():
    durable = _tasks()["durable"]
    assert durable.deferrable is True and durable.poke_interval == 5 and durable.timeout == 3600


@pytest.mark.parametrize("old", sorted(DEPRECATED_ARGUMENTS))
def test_each_old_spelling_builds_the_same_task_and_warns(old):
    values = {
        "application_args": ["--a"],
        "spark_conn_id": "spark_x",
        "conf": {"k": "v"},
        "file_format": "csv",
        "checksum": "sha256",
        "initial_offsets": {"n": 1},
        "lineage_inputs": ["/raw"],
        "write_kwargs": {"retries": 3},
        "deferrable": False,
        "poke_interval": 9,
        "durable_timeout": 120,
        "durable_kwargs": {"retries": 3},
        "audit_kwargs": {"retries": 3},
        "commit_kwargs": {"retries": 3},
    }
    task_name, name = DEPRECATED_ARGUMENTS[old]
    value = values[old]
    new_spelling = {task_name: value if name is None else {name: value}}
    audit = [RowCountCheck(min_rows=1)]
    if task_name == "audit":
        new_spelling = {"audit": {"checks": audit, **value}}
    extra = {"audit": audit} if task_name == "audit" else {}

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old_tasks = _tasks(**{old: value}, **extra)
    deprecations = [w for w in caught if issubclass(w.category, DeprecationWarning) and old in str(w.message)]
    assert len(deprecations) == 1 and f"{task_name}=" in str(deprecations[0].message)
    new_tasks = _tasks(**new_spelling)
    attribute = name or "retries"
    assert getattr(old_tasks[task_name], attribute) == getattr(new_tasks[task_name], attribute)
    assert getattr(new_tasks[task_name], attribute) != getattr(_tasks(**extra)[task_name], attribute)


def test_audit_settings_without_checks_are_refused():
    with pytest.raises(ValueError, match="checks"):
        _tasks(audit={"retries": 2})


def test_the_old_source_spelling_builds_the_same_source_and_warns():
    """``kafka_source=`` and ``kafka_conn_id=`` (the last release's) are ``source={"kind": "kafka", ...}``,
    on walsink_pipeline and on the write and commit operators alike."""
    spec = {"topics": ["events"], "group_id": "g"}
    new = {"kind": "kafka", "conn_id": "kafka_x", **spec}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old_tasks = _tasks(mode="append", kafka_source=spec, kafka_conn_id="kafka_x")
        write = WalWriteOperator(
            task_id="w",
            application="/j.py",
            pipeline="p",
            mode="append",
            kafka_source=spec,
            kafka_conn_id="kafka_x",
        )
        commit = WalCommitOperator(task_id="c", pipeline="p", target="/t", kafka_source=spec)
    messages = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    assert len(messages) == 5 and all("use source={'kind': 'kafka'" in m for m in messages)
    assert old_tasks["write"].source == old_tasks["commit"].source == write.source == new
    assert commit.source == {"kind": "kafka", **spec}
    assert _tasks(mode="append", source=new)["write"].source == new
    with pytest.warns(DeprecationWarning):  # a connection alone named no source, nor does it now
        assert _tasks(kafka_conn_id="kafka_x")["commit"].source is None
    with pytest.raises(ValueError, match="mode='append'"):
        WalWriteOperator(task_id="w", application="/j.py", pipeline="p", source=new)
