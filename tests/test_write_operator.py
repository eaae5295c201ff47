"""WalWriteOperator: explicit Spark master, a real spark-submit in a real Airflow run, retries, a skipped re-run."""

from __future__ import annotations

import json
import textwrap
import threading
from datetime import UTC, datetime, timedelta

import pytest

from airflow_provider_walsink.core.commit import CheckpointCommitter
from airflow_provider_walsink.core.protocol import CheckpointState as S
from airflow_provider_walsink.core.protocol import read_manifest
from airflow_provider_walsink.core.protocol.manifest import digest_of
from airflow_provider_walsink.core.staging import StagingLayout
from airflow_provider_walsink.core.store import Actor, CommitterStore
from airflow_provider_walsink.core.targets import FilePublisher
from airflow_provider_walsink.operators.write import WalWriteOperator
from tests.helpers import ACTOR

INTERVAL_START = datetime(2026, 4, 1, tzinfo=UTC)
KEY = "20260401T000000Z"

# Attempt 1 exits without sealing (a job that forgot to, or died between its
# last write and the manifest), before even starting Spark: it keeps the test
# to one Spark start. Attempt 2 stages 42 rows and seals.
JOB = textwrap.dedent(
    """
    import sys
    from airflow_provider_walsink.core.spark import CheckpointJob, ProtocolArgs

    protocol, args = ProtocolArgs.from_argv(sys.argv[1:])
    assert args == ["--rows", "42"], args
    if protocol.attempt == 1:
        sys.exit(0)

    from pyspark.sql import SparkSession

    spark = SparkSession.builder.getOrCreate()
    with CheckpointJob(spark, protocol, args) as job:
        df = spark.range(int(job.args[1])).selectExpr("id", "'2026-04-01' AS dt")
        job.stage(df, replace_partitions=["dt=2026-04-01"])
    spark.stop()
    """
)


@pytest.fixture
def env(monkeypatch, sqlite_store, database_urls, tmp_path):
    staging = tmp_path / "staging"
    url = database_urls("sqlite")
    monkeypatch.setenv(
        "AIRFLOW_CONN_WALSINK_DEFAULT",
        json.dumps({"conn_type": "walsink", "extra": {"url": url, "staging_root": str(staging)}}),
    )
    return CommitterStore.from_url(url), StagingLayout(staging)


def test_default_master_is_local_and_chosen_explicitly(monkeypatch):
    # A spark_default pointing at YARN exists: walsink's default must not use it.
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", "yarn://")
    op = WalWriteOperator(task_id="w", application="job.py", pipeline="p")
    hook = op.get_runner().build_hook(["--x"], {})
    cmd = hook._build_spark_submit_command("job.py")
    assert cmd[cmd.index("--master") + 1] == "local[*]"
    assert "spark.driver.bindAddress=127.0.0.1" in cmd
    assert cmd[0].endswith("spark-submit")
    assert hook._env["PYSPARK_PYTHON"]

    op = WalWriteOperator(task_id="w", application="job.py", pipeline="p", master="local[2]")
    cmd = op.get_runner().build_hook([], {})._build_spark_submit_command("job.py")
    assert cmd[cmd.index("--master") + 1] == "local[2]"


def test_a_named_spark_connection_is_used_and_a_missing_one_is_an_error(monkeypatch):
    from airflow.sdk.exceptions import AirflowNotFoundException

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_LOCAL", json.dumps({"conn_type": "spark", "host": "local[3]"}))
    op = WalWriteOperator(task_id="w", application="job.py", pipeline="p", spark_conn_id="spark_local")
    cmd = op.get_runner().build_hook([], {})._build_spark_submit_command("job.py")
    assert cmd[cmd.index("--master") + 1] == "local[3]"

    op = WalWriteOperator(task_id="w", application="job.py", pipeline="p", spark_conn_id="no_such_spark")
    with pytest.raises(AirflowNotFoundException, match="no_such_spark"):
        op.get_runner().build_hook([], {})  # never a silent fallback to yarn


def build_dag(application: str):
    from airflow.sdk import DAG, task

    with DAG(
        "walsink_write_operator_test", schedule="@daily", start_date=INTERVAL_START, catchup=False
    ) as dag:
        write = WalWriteOperator(
            task_id="write",
            application=application,
            application_args=["--rows", "{{ 40 + 2 }}"],
            pipeline="events",
            partition_by=["dt"],
            master="local[1]",
            retries=1,
            retry_delay=timedelta(0),
        )

        @task
        def xcoms(ti=None) -> dict:
            return {
                "uri": ti.xcom_pull(task_ids="write", key="manifest_uri"),
                "digest": ti.xcom_pull(task_ids="write", key="manifest_digest"),
                "summary": ti.xcom_pull(task_ids="write"),
            }

        write >> xcoms()
    return dag


def run(dag):
    dr = dag.test(logical_date=INTERVAL_START)
    tis = {ti.task_id: ti for ti in dr.get_task_instances()}
    return {t: ti.state for t, ti in tis.items()}, tis


def xcom_value(ti, key: str = "return_value") -> dict:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        value = (
            session.query(XComModel.value)
            .filter_by(dag_id=ti.dag_id, run_id=ti.run_id, task_id=ti.task_id, key=key)
            .scalar()
        )
    return json.loads(value) if isinstance(value, str) else value


@pytest.mark.spark
@pytest.mark.airflow
@pytest.mark.slow
def test_write_task_retries_into_a_new_attempt_then_skips_when_committed(airflow_db, env, tmp_path):
    store, layout = env
    job = tmp_path / "job.py"
    job.write_text(JOB)

    states, tis = run(build_dag(str(job)))
    assert states == {"write": "success", "xcoms": "success"}
    assert tis["write"].try_number == 2

    record = store.require("events", KEY)
    assert (record.state, record.attempt, record.sealed_attempt) == (S.SEALED, 2, 2)
    assert record.rows == 42
    history = store.history("events", KEY)
    failed = [h for h in history if h.to_state == "FAILED"]
    assert len(failed) == 1 and failed[0].attempt == 1
    assert "sealed no manifest" in failed[0].detail
    assert [h.try_number for h in history if h.to_state == "WRITING"] == [1, 2]
    # Attempt 1 is garbage: no manifest, never counted.
    assert not layout.manifest_path("events", KEY, 1).exists()

    manifest_path = layout.manifest_path("events", KEY, 2)
    manifest = read_manifest(manifest_path, expected_digest=record.manifest_digest)
    assert manifest.partitions == ("dt=2026-04-01",)
    pushed = xcom_value(tis["xcoms"])
    assert pushed["uri"] == manifest_path.as_uri() == record.manifest_uri
    assert pushed["digest"] == digest_of(manifest_path.read_bytes())
    assert pushed["summary"]["attempt"] == 2 and pushed["summary"]["skipped_committed"] is False

    # Commit it; a re-run (backfill re-run, cleared task) must not submit the job
    # again: the application no longer exists, so only a skip can end it without failing.
    store.mark_durable("events", KEY, attempt=2, actor=ACTOR)
    target = tmp_path / "target"
    publisher = FilePublisher(target, "overwrite", layout=layout)
    CheckpointCommitter(store, layout, publisher, mode="overwrite").commit("events", KEY, actor=ACTOR)
    states, tis = run(build_dag(str(tmp_path / "gone.py")))
    # Skipped, and says so: the downstream task is skipped with it (reprocess policy "skip").
    assert states == {"write": "skipped", "xcoms": "skipped"}
    assert tis["write"].try_number == 1
    pushed = xcom_value(tis["write"], key="reprocess")
    assert pushed["skipped_committed"] is True and pushed["decision"] == "skip"
    assert pushed["manifest_digest"] == record.manifest_digest
    assert store.require("events", KEY).state is S.COMMITTED


@pytest.mark.spark
def test_on_kill_stops_spark_submit(tmp_path):
    job = tmp_path / "sleepy.py"
    job.write_text("import time\ntime.sleep(600)\n")
    op = WalWriteOperator(task_id="w", application=str(job), pipeline="p", master="local[1]")
    runner = op._runner = op.get_runner()
    errors: list[BaseException] = []

    def submit() -> None:
        try:
            runner.submit(str(job), [], {})
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    thread = threading.Thread(target=submit)
    thread.start()
    while (runner.hook is None or runner.hook._submit_sp is None) and thread.is_alive():
        thread.join(0.05)
    op.on_kill()
    thread.join(120)
    assert not thread.is_alive()
    assert runner.hook._submit_sp.returncode not in (0, None)
    assert errors and "Cannot execute" in str(errors[0])


@pytest.mark.spark
def test_openlineage_facets_of_an_executed_write_name_inputs_target_and_checkpoint(env, tmp_path):
    """Issue 15: the lineage the OpenLineage provider asks the write operator for, after a real
    spark-submit: the declared input, the target with the staged rows, the checkpoint."""
    from types import SimpleNamespace

    store, _ = env
    job = tmp_path / "job.py"
    job.write_text(JOB)
    pushed = {}
    op = WalWriteOperator(
        task_id="write",
        application=str(job),
        application_args=["--rows", "42"],
        pipeline="events",
        partition_by=["dt"],
        master="local[1]",
        target=str(tmp_path / "target"),
        lineage_inputs=[str(tmp_path / "raw")],
    )
    ti = SimpleNamespace(dag_id="d", task_id="write", run_id="manual", try_number=1, map_index=-1, id=None,
                         xcom_push=lambda key, value: pushed.__setitem__(key, value))  # fmt: skip
    # Attempt 1 of the job exits unsealed (see JOB): a retry, as Airflow would make it.
    context = {"ti": ti, "logical_date": INTERVAL_START, "data_interval_start": INTERVAL_START,
               "data_interval_end": INTERVAL_START}  # fmt: skip
    with pytest.raises(Exception, match="sealed no manifest"):
        op.execute(context)
    op.execute(context)

    lineage = op.get_openlineage_facets_on_complete(None)
    assert [(d.namespace, d.name) for d in lineage.inputs] == [("file", str(tmp_path / "raw"))]
    assert [(d.namespace, d.name) for d in lineage.outputs] == [("file", str(tmp_path / "target"))]
    assert lineage.outputs[0].outputFacets["outputStatistics"].rowCount == 42
    facet = lineage.run_facets["walsink"]
    record = store.require("events", KEY)
    assert (facet.pipeline, facet.checkpointKey, facet.state, facet.attemptId) == (
        "events",
        KEY,
        "SEALED",
        record.sealed_attempt_id,
    )


@pytest.mark.airflow
def test_a_second_dag_declaring_an_owned_pipeline_is_refused_at_its_first_run(airflow_db, env, capfd):
    """The write task fails at once (no retry, no Spark job), naming both DAGs; nothing is recorded."""
    store, _ = env
    owner = Actor(name="w", dag_id="the_first_dag", run_id="r", task_id="write", try_number=1)
    store.register("events", "20260101T000000Z", mode="overwrite", actor=owner)
    states, tis = run(build_dag("/nonexistent/job.py"))
    assert states["write"] == "failed" and tis["write"].try_number == 1, states
    logged = "".join(capfd.readouterr())
    assert "belongs to DAG 'the_first_dag'; DAG 'walsink_write_operator_test' declares it" in logged
    assert [r.checkpoint_key for r in store.checkpoints("events")] == ["20260101T000000Z"]
    assert store.require("events", "20260101T000000Z").attempt == 0  # no attempt started


def test_the_write_task_registers_its_targets_connection_references_never_its_secrets(tmp_path, monkeypatch):
    """Issue 35: an abort opens the pipeline's target with the connections its write task named;
    the write phase is given the references of ``target_options`` (``conn_id``), not its secrets."""
    from types import SimpleNamespace

    op = WalWriteOperator(
        task_id="write",
        application="job.py",
        pipeline="events",
        master="local[1]",
        target="delta+s3://bucket/events",
        target_options={"conn_id": "lake", "storage_options": {"AWS_SECRET_ACCESS_KEY": "s3cr3t"}},
    )
    monkeypatch.setattr(op, "_configured_root", lambda hook: "s3://bucket/events/_walsink_staging")
    monkeypatch.setattr(op, "get_runner", lambda: None)
    hook = SimpleNamespace(get_source=lambda source: None, get_write_phase=lambda **kwargs: kwargs)
    from airflow_provider_walsink.hooks.context import RunInterval

    interval = RunInterval(key="2026-01-01", start=None, end=None)
    phase = op._write_phase({}, hook, interval)
    assert phase["target_connections"] == {"conn_id": "lake"}
