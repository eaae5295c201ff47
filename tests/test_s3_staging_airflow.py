"""Issue 23, the Airflow side: a staging root on ``s3://`` used from a DAG.

* The amazon provider's ``aws`` connection (login, password, extra
  ``region_name``, ``endpoint_url``, ``aws_session_token``) becomes the
  :class:`StagingStore` options, and no secret appears in a log line or a
  ``repr``; the walsink connection names it (``staging_conn_id``).
* The write task runs for real (``WalWriteOperator.execute``) with a REAL
  spark-submit of a job using ``CheckpointJob.from_argv``: its executors write
  Parquet to moto's S3 server, the seal is a conditional put there, the row
  records the ``s3://`` root, and the secret is on no command line: not in the
  argv spark-submit was started with, not in its logged command, and not in
  any process's ``/proc/<pid>/cmdline`` while the job runs (the job checks).
* The durability sensor (poke) and the deferrable trigger's ``run()`` read the
  store through the connection: a missing object is reported, and once it is
  back the checkpoint is marked DURABLE. The trigger's kwargs hold no secret.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import pickle
import subprocess
import textwrap
import uuid
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_provider_walsink.core.protocol import CheckpointState as S
from airflow_provider_walsink.core.protocol.manifest import MANIFEST_NAME
from airflow_provider_walsink.core.spark.args import storage_env, storage_options_from_env
from airflow_provider_walsink.hooks.staging import StagingConnectionError, s3_options_from_connection
from airflow_provider_walsink.hooks.walsink import WalsinkHook
from airflow_provider_walsink.operators.write import WalWriteOperator
from airflow_provider_walsink.sensors.durable import CheckpointDurableSensor
from airflow_provider_walsink.triggers.durable import CheckpointDurableTrigger
from tests.table_fixtures import ACCESS_KEY, REGION, SECRET_KEY, s3_server  # noqa: F401

INTERVAL_START = datetime(2026, 4, 1, tzinfo=UTC)
KEY = "20260401T000000Z"
TOKEN = "walsink-test-session-token"


def aws_conn(monkeypatch, conn_id: str, *, login=ACCESS_KEY, password=SECRET_KEY, **extra: Any) -> None:
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{conn_id.upper()}",
        json.dumps({"conn_type": "aws", "login": login, "password": password, "extra": extra}),
    )


def walsink_conn(monkeypatch, url: str, root: str, **extra: Any) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_WALSINK_DEFAULT",
        json.dumps({"conn_type": "walsink", "extra": {"url": url, "staging_root": root, **extra}}),
    )


def logged(caplog, capfd) -> str:
    """Everything logged so far: standard logging, and Airflow's task logging (written to the output)."""
    out, err = capfd.readouterr()
    return caplog.text + out + err


def secrets_in(text: str) -> list[str]:
    return [s for s in (SECRET_KEY, TOKEN) if s in text]


# ------------------------------------------------------------------ the aws connection


def test_an_aws_connection_with_an_endpoint_becomes_the_stores_options(
    monkeypatch, caplog, capfd, database_urls
):
    caplog.set_level(logging.DEBUG)
    aws_conn(
        monkeypatch,
        "minio",
        region_name="eu-west-1",
        endpoint_url="http://127.0.0.1:9000",
        aws_session_token=TOKEN,
    )
    walsink_conn(monkeypatch, database_urls("sqlite"), "s3://bucket/staging", staging_conn_id="minio")
    hook = WalsinkHook()
    credentials = hook.get_staging_credentials()
    assert credentials.conn_id == "minio"
    assert credentials.options == {
        "access_key": ACCESS_KEY,
        "secret_key": SECRET_KEY,
        "session_token": TOKEN,
        "region": "eu-west-1",
        "endpoint_url": "http://127.0.0.1:9000",
    }
    store = hook.get_staging_store()
    assert (store.kind, store.base) == ("s3", "bucket/staging")
    # The pyarrow file system holds the endpoint and the keys, and keeps them when pickled: that
    # is how executors on other hosts (which do not inherit spark-submit's environment) get them.
    shipped = repr(pickle.loads(pickle.dumps(store.filesystem)).__reduce__())
    assert "127.0.0.1:9000" in shipped and SECRET_KEY in shipped and TOKEN in shipped
    # Secrets are in no log record and no repr; the log names the source once.
    said = logged(caplog, capfd)
    shown = repr(credentials) + repr(store) + credentials.describe() + said
    assert not secrets_in(shown), shown
    assert (
        "credentials from connection 'minio' (keys, region eu-west-1, endpoint_url http://127.0.0.1:9000)"
        in said
    )
    # The environment that carries them to the job, and the job's reading of it.
    env = storage_env("s3://bucket/staging", credentials.options)
    assert env["AWS_SECRET_ACCESS_KEY"] == SECRET_KEY and env["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9000"
    assert storage_options_from_env("s3://bucket/staging", env) == credentials.options
    assert storage_options_from_env("/local/root", env) == {}


def test_the_amazon_providers_other_spellings_and_refusals():
    def conn(login=None, password=None, conn_type="aws", **extra):
        return SimpleNamespace(
            conn_id="c", conn_type=conn_type, login=login, password=password, extra_dejson=extra
        )

    # Keys in the extra; service_config.s3.endpoint_url wins over endpoint_url, as in the provider.
    options = s3_options_from_connection(
        conn(
            aws_access_key_id="k",
            aws_secret_access_key="s",
            endpoint_url="http://a:1",
            service_config={"s3": {"endpoint_url": "https://b"}},
        )
    )
    assert options == {"access_key": "k", "secret_key": "s", "endpoint_url": "https://b"}
    # No keys: the default credential chain, with the region still applied.
    assert s3_options_from_connection(conn(region_name="us-west-2")) == {"region": "us-west-2"}
    for bad, match in (
        (conn(login="k"), "half an access key pair"),
        (conn(aws_access_key_id="k"), "half an access key pair"),
        (conn(aws_session_token="t"), "session token but no access key pair"),
        (conn("k", "s", role_arn="arn:aws:iam::1:role/x"), "assume-role is not supported"),
        (conn("k", "s", profile_name="dev"), "profile is not supported"),
        (conn("k", "s", host="http://minio:9000"), "set endpoint_url in the extra"),
        (conn("k", "s", endpoint_url="minio:9000"), "endpoint_url must look like"),
        (conn("k", "s", conn_type="postgres"), "needs a connection of type 'aws'"),
    ):
        with pytest.raises(StagingConnectionError, match=match) as info:
            s3_options_from_connection(bad)
        assert SECRET_KEY not in str(info.value)


def test_extra_fields_staging_does_not_read_are_said_once_and_a_delta_targets_not_at_all():
    """Issue 47: "staging ignores the extra fields ['storage_options']" was logged four times per
    write. A field another part of walsink reads (a Delta target's ``storage_options``) is not
    "ignored"; one nothing reads is said once per process, however often the connection is read."""
    from tests.test_target_configuration import module_log

    conn = SimpleNamespace(
        conn_id=f"lake_{uuid.uuid4().hex[:6]}",
        conn_type="aws",
        login="k",
        password=SECRET_KEY,
        extra_dejson={"storage_options": {"AWS_ALLOW_HTTP": "true"}, "colour": "blue"},
    )
    with module_log("airflow_provider_walsink.hooks.staging") as records:
        for _ in range(4):
            assert s3_options_from_connection(conn) == {"access_key": "k", "secret_key": SECRET_KEY}
    said = [r.getMessage() for r in records]
    assert said == [f"Connection {conn.conn_id!r}: staging ignores the extra fields ['colour']"], said


def test_which_connection_a_root_uses(monkeypatch, caplog, capfd, database_urls):
    caplog.set_level(logging.INFO)
    url = database_urls("sqlite")
    monkeypatch.delenv("AIRFLOW_CONN_AWS_DEFAULT", raising=False)
    walsink_conn(monkeypatch, url, "s3://bucket/staging")
    # No staging_conn_id and no aws_default: the default credential chain, said once.
    hook = WalsinkHook()
    assert hook.get_staging_credentials().conn_id is None
    hook.get_staging_credentials()
    said = logged(caplog, capfd)
    assert said.count("credentials from the default credential chain") == 1, said
    # aws_default exists: it is used for s3:// roots.
    aws_conn(monkeypatch, "aws_default")
    assert WalsinkHook().get_staging_credentials().conn_id == "aws_default"
    # "" chooses the default chain explicitly, even with aws_default present.
    walsink_conn(monkeypatch, url, "s3://bucket/staging", staging_conn_id="")
    assert WalsinkHook().get_staging_credentials().options == {}
    # A named connection that does not exist is an error naming it.
    walsink_conn(monkeypatch, url, "s3://bucket/staging", staging_conn_id="nope")
    with pytest.raises(StagingConnectionError, match="connection 'nope'.*does not exist"):
        WalsinkHook().get_staging_store()
    # Local roots take no credentials, whatever is configured.
    walsink_conn(monkeypatch, url, "/tmp/staging", staging_conn_id="nope")
    assert WalsinkHook().get_staging_store().layout is not None
    assert not secrets_in(logged(caplog, capfd))


def test_credentials_are_never_put_on_a_yarn_or_kubernetes_command_line(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_YARN", json.dumps({"conn_type": "spark", "host": "yarn"}))
    op = WalWriteOperator(task_id="w", application="job.py", pipeline="p", spark_conn_id="spark_yarn")
    staging_env = storage_env("s3://b/p", {"access_key": ACCESS_KEY, "secret_key": SECRET_KEY})
    with pytest.raises(ValueError, match="would put AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY.*command line"):
        op.get_runner().build_hook([], staging_env)
    # A source's client settings (its job_env) are secrets too, whatever the source; no credential
    # (a region, an endpoint) is not.
    with pytest.raises(ValueError, match="would put WALSINK_KAFKA_CONFIG on the spark-submit command line"):
        op.get_runner().build_hook([], {"WALSINK_KAFKA_CONFIG": "{}", "AWS_DEFAULT_REGION": "eu-west-1"})
    op.get_runner().build_hook([], storage_env("s3://b/p", {"region": "eu-west-1"}))
    # The same variable set differently in env_vars and by the connection: one place only.
    op = WalWriteOperator(
        task_id="w", application="job.py", pipeline="p", env_vars={"AWS_SECRET_ACCESS_KEY": "other"}
    )
    staging_env = storage_env("s3://b/p", {"access_key": ACCESS_KEY, "secret_key": SECRET_KEY})
    with pytest.raises(ValueError, match="give the staging credentials in one place"):
        op.get_runner().build_hook([], staging_env)


def test_a_file_target_is_refused_with_an_object_store_root_before_anything_runs(
    monkeypatch, sqlite_store, database_urls, tmp_path
):
    walsink_conn(monkeypatch, database_urls("sqlite"), "s3://bucket/staging", staging_conn_id="")
    op = WalWriteOperator(
        task_id="w", application="job.py", pipeline="events", checkpoint_key=KEY, target=str(tmp_path / "t")
    )
    op.get_runner = lambda: pytest.fail("submitted")  # type: ignore[method-assign]
    with pytest.raises(ValueError, match="is a directory of files.*local or mounted staging root"):
        op.execute(context("write"))
    assert sqlite_store.get("events", KEY) is None  # nothing recorded


def test_the_test_button_lists_an_s3_root_with_its_connection(monkeypatch, s3_server, database_urls):  # noqa: F811
    from tests.conftest import _migrated_store

    url = database_urls("sqlite")
    _migrated_store(url)
    aws_conn(monkeypatch, "s3_stage", region_name=REGION, endpoint_url=s3_server.endpoint)
    walsink_conn(monkeypatch, url, "s3://walsink/test-button", staging_conn_id="s3_stage")
    ok, message = WalsinkHook().test_connection()
    assert ok, message
    assert "Staging root s3://walsink/test-button can be listed with connection 's3_stage'" in message
    walsink_conn(monkeypatch, url, "s3://no-such-bucket/x", staging_conn_id="s3_stage")
    ok, message = WalsinkHook().test_connection()
    assert not ok and "cannot be listed" in message and SECRET_KEY not in message, message


# ------------------------------------------------------------------ a real write phase on S3

# Stages 42 rows with the executors' writer into the s3:// root the operator chose, reading
# the credentials from the environment (CheckpointJob.from_argv). While Spark runs (the JVM
# and this Python driver are alive), no process's command line may hold the secret.
JOB = textwrap.dedent(
    """
    import hashlib
    import os
    import sys

    from pyspark.sql import SparkSession

    from airflow_provider_walsink.core.spark import CheckpointJob

    spark = SparkSession.builder.getOrCreate()
    with CheckpointJob.from_argv(spark) as job:
        assert job.store.kind == "s3", job.store
        secret = os.environ["AWS_SECRET_ACCESS_KEY"]
        assert hashlib.sha256(secret.encode()).hexdigest() == job.args[0], "not the connection's secret"
        assert os.environ["AWS_ENDPOINT_URL"] and os.environ["AWS_REGION"]
        df = spark.range(42).selectExpr("id", "'2026-04-01' AS dt")
        job.stage(df, replace_partitions=["dt=2026-04-01"])
        exposed = []
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        if secret.encode() in f.read():
                            exposed.append(pid)
                except OSError:
                    pass
        assert not exposed, f"the secret is on the command line of processes {exposed}"
        print(f"walsink-test: checked the command lines of every process, none holds the secret")
    spark.stop()
    """
)


def context(task_id: str, pushed: dict[str, Any] | None = None) -> dict[str, Any]:
    ti = SimpleNamespace(dag_id="s3_staging_test", task_id=task_id, run_id="manual", try_number=1,
                         map_index=-1, id=None,
                         xcom_push=lambda key, value: (pushed if pushed is not None else {}).__setitem__(key, value))  # fmt: skip
    return {"ti": ti, "logical_date": INTERVAL_START, "data_interval_start": INTERVAL_START,
            "data_interval_end": INTERVAL_START + timedelta(days=1)}  # fmt: skip


def first_event(trigger: CheckpointDurableTrigger) -> dict:
    async def one():
        async for event in trigger.run():
            return event.payload

    return asyncio.run(one())


@pytest.mark.spark
def test_a_write_task_stages_on_s3_through_spark_submit_and_the_sensor_and_trigger_read_it(
    monkeypatch,
    caplog,
    capfd,
    sqlite_store,
    database_urls,
    s3_server,  # noqa: F811
    tmp_path,
):
    import airflow.providers.apache.spark.hooks.spark_submit as spark_submit
    import boto3

    caplog.set_level(logging.INFO)
    root = f"s3://walsink/{uuid.uuid4().hex[:8]}/staging"
    # A secret of this test's own: the job looks for it on every process's command line, and the
    # session's shared test secret may be on another test's (moto takes any key).
    secret = f"{SECRET_KEY}-{uuid.uuid4().hex}"
    aws_conn(monkeypatch, "s3_stage", password=secret, region_name=REGION, endpoint_url=s3_server.endpoint)
    walsink_conn(monkeypatch, database_urls("sqlite"), root, staging_conn_id="s3_stage")
    job = tmp_path / "job.py"
    job.write_text(JOB)

    started: list[tuple[list[str], dict[str, str]]] = []
    real_popen = subprocess.Popen

    def recording_popen(args, **kwargs):
        started.append((list(args), dict(kwargs.get("env") or {})))
        return real_popen(args, **kwargs)

    monkeypatch.setattr(spark_submit.subprocess, "Popen", recording_popen)
    pushed: dict[str, Any] = {}
    op = WalWriteOperator(
        task_id="write",
        application=str(job),
        application_args=[hashlib.sha256(secret.encode()).hexdigest()],
        pipeline="events",
        checkpoint_key=KEY,
        partition_by=["dt"],
        master="local[2]",
    )
    summary = op.execute(context("write", pushed))

    # Sealed on S3, the s3:// root recorded, the manifest's URI on the store.
    record = sqlite_store.require("events", KEY)
    assert (record.state, record.rows, record.staging_root) == (S.SEALED, 42, root)
    attempt_prefix = f"{root}/events/{KEY}/attempt-1-{record.attempt_id}"
    assert record.manifest_uri == f"{attempt_prefix}/{MANIFEST_NAME}"
    assert summary["rows"] == 42 and pushed["staging_root"] == root
    keys = s3_server.list(attempt_prefix[len("s3://walsink/") :])
    assert f"{attempt_prefix[len('s3://walsink/') :]}/{MANIFEST_NAME}" in keys
    assert len(keys) == record.committables + 1
    assert not (tmp_path / "s3:").exists()  # no local directory was made of the URI

    # The credentials travelled in spark-submit's environment, never on its command line.
    ((argv, env),) = started
    assert env["AWS_SECRET_ACCESS_KEY"] == secret and env["AWS_ACCESS_KEY_ID"] == ACCESS_KEY
    assert env["AWS_ENDPOINT_URL"] == s3_server.endpoint
    assert not secrets_in(" ".join(argv)) and ACCESS_KEY not in " ".join(argv)
    said = logged(caplog, capfd)
    assert "Spark-Submit cmd:" in said  # the provider logged its command...
    assert not secrets_in(said)  # ...and nothing in the task log holds the secret
    assert "none holds the secret" in said  # the job's own check of every process ran

    # Durability through the store: a missing object is found, by the sensor and by the trigger.
    s3 = boto3.client("s3", endpoint_url=s3_server.endpoint, aws_access_key_id=ACCESS_KEY,
                      aws_secret_access_key=SECRET_KEY, region_name=REGION)  # fmt: skip
    data_key = next(k for k in keys if k.endswith(".parquet"))
    s3.copy_object(
        Bucket="walsink", Key=data_key + ".aside", CopySource={"Bucket": "walsink", "Key": data_key}
    )
    s3.delete_object(Bucket="walsink", Key=data_key)
    sensor = CheckpointDurableSensor(
        task_id="durable", pipeline="events", checkpoint_key=KEY, staging_root=""
    )
    assert sensor.poke(context("durable")) is False
    assert "1 missing" in sensor._last.message, sensor._last.message

    trigger = CheckpointDurableTrigger(pipeline="events", checkpoint_key=KEY, timeout_at=0.0)
    _, kwargs = trigger.serialize()
    assert not secrets_in(json.dumps(kwargs)) and ACCESS_KEY not in json.dumps(kwargs)
    event = first_event(CheckpointDurableTrigger(**kwargs))
    assert event["status"] == "timeout" and "1 missing" in event["message"], event

    s3.copy_object(
        Bucket="walsink", Key=data_key, CopySource={"Bucket": "walsink", "Key": data_key + ".aside"}
    )
    assert sensor.poke(context("durable")) is True  # read from the store, then marked
    assert sqlite_store.require("events", KEY).state is S.DURABLE
    assert (
        "all 1 committables present" in sensor._last.message or "committables present" in sensor._last.message
    )
    event = first_event(CheckpointDurableTrigger(**kwargs))
    assert event["status"] == "durable", event
    assert not secrets_in(logged(caplog, capfd))


@pytest.mark.spark
@pytest.mark.airflow
@pytest.mark.slow
def test_a_dag_run_stages_on_s3_and_its_sensor_finds_the_root_the_write_task_pushed(
    airflow_db,
    monkeypatch,
    capfd,
    sqlite_store,
    database_urls,
    s3_server,  # noqa: F811
    tmp_path,
):
    """dag.test(): the write task (a real task run, connections from the environment) stages on
    S3 through spark-submit; the sensor renders the root the write task pushed (as
    ``walsink_pipeline`` wires it) and marks the checkpoint DURABLE reading the store."""
    from airflow.sdk import DAG

    root = f"s3://walsink/{uuid.uuid4().hex[:8]}/staging"
    # A secret of this test's own: the job looks for it on every process's command line, and the
    # session's shared test secret may be on another test's (moto takes any key).
    secret = f"{SECRET_KEY}-{uuid.uuid4().hex}"
    aws_conn(monkeypatch, "s3_stage", password=secret, region_name=REGION, endpoint_url=s3_server.endpoint)
    walsink_conn(monkeypatch, database_urls("sqlite"), root, staging_conn_id="s3_stage")
    job = tmp_path / "job.py"
    job.write_text(JOB)
    with DAG("walsink_s3_staging_test", schedule="@daily", start_date=INTERVAL_START, catchup=False) as dag:
        write = WalWriteOperator(
            task_id="write",
            application=str(job),
            application_args=[hashlib.sha256(secret.encode()).hexdigest()],
            pipeline="s3events",
            partition_by=["dt"],
            master="local[2]",
        )
        durable = CheckpointDurableSensor(
            task_id="durable",
            pipeline="s3events",
            staging_root="{{ ti.xcom_pull(task_ids='write', key='staging_root') or '' }}",
            poke_interval=1,
            timeout=120,
        )
        write >> durable
    dr = dag.test(logical_date=INTERVAL_START)
    states = {ti.task_id: ti.state for ti in dr.get_task_instances()}
    assert states == {"write": "success", "durable": "success"}, states
    record = sqlite_store.require("s3events", KEY)
    assert (record.state, record.rows, record.staging_root) == (S.DURABLE, 42, root)
    assert record.manifest_uri.startswith(f"{root}/s3events/{KEY}/attempt-1-")
    out, err = capfd.readouterr()
    assert "none holds the secret" in out + err
    assert not secrets_in(out + err)


def test_a_local_root_is_still_recorded_as_an_absolute_path(
    monkeypatch, sqlite_store, database_urls, tmp_path
):
    """A ``file://`` root (as table libraries write locations) is recorded as the path it names."""
    from tests.test_staging_root import context as write_context
    from tests.test_staging_root import write_task

    walsink_conn(monkeypatch, database_urls("sqlite"), f"file://{tmp_path}/root")
    write_task().execute(write_context("write"))
    record = sqlite_store.require("events", KEY)
    assert (record.state, record.staging_root) == (S.SEALED, str(tmp_path / "root"))
