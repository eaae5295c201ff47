"""Issue 35, "Refuse before Spark runs": what can be checked up front is checked by the write task
before anything is recorded and before spark-submit, and each refusal names the connection to fix.

* a staging root on a bucket that does not exist (the staging store's ``check_writable()``: the
  bucket exists and a probe object can be put and deleted, with the staging connection);
* a Delta target whose ``aws`` connection holds no credentials (read from the connection, not from
  this process's environment), or whose bucket does not exist;
* an Iceberg catalog that does not answer (its URI on a closed loopback port);
* (issue 47) a ``spark_conn_id`` or ``walsink_conn_id`` naming no connection, and a Spark Connect
  server that does not answer (its connection on a closed loopback port).

The write task runs for real (``dag.test()``), with ``retries`` set: it fails at once (no retry:
a retry meets the same configuration), its spark-submit is a stand-in that would leave a mark if
the job ever started, and the committer table holds nothing.
"""

from __future__ import annotations

import json
import socket
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from airflow_provider_walsink.core.protocol.errors import PreflightError
from airflow_provider_walsink.core.staging.layout import StagingLayout
from airflow_provider_walsink.core.staging.object_store import StagingStore
from airflow_provider_walsink.core.staging.probe import StagingNotWritableError
from airflow_provider_walsink.core.targets.registry import (
    TargetOptions,
    TargetUnreachableError,
    resolve_target,
)
from airflow_provider_walsink.hooks.connections import airflow_connection_fields
from tests.table_fixtures import ACCESS_KEY, REGION, SECRET_KEY, s3_server  # noqa: F401
from tests.test_target_configuration import write_dag

DAY = datetime(2026, 5, 4, tzinfo=UTC)


def aws_conn(monkeypatch, conn_id: str, endpoint: str, *, login=ACCESS_KEY, password=SECRET_KEY, **extra):
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{conn_id.upper()}",
        json.dumps(
            {
                "conn_type": "aws",
                "login": login,
                "password": password,
                "extra": {"region_name": REGION, "endpoint_url": endpoint, **extra},
            }
        ),
    )


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _options(tmp_path, **extra) -> TargetOptions:
    return TargetOptions(
        mode="overwrite",
        layout=StagingLayout(tmp_path / "staging"),
        connections=airflow_connection_fields,
        extra=extra,
    )


# ------------------------------------------------------------------ the checks themselves


def test_the_object_store_probe_puts_and_deletes_one_object(s3_server):  # noqa: F811
    options = {
        "access_key": ACCESS_KEY,
        "secret_key": SECRET_KEY,
        "region": REGION,
        "endpoint_url": s3_server.endpoint,
    }
    prefix = f"preflight-{uuid.uuid4().hex[:8]}"
    StagingStore.open(f"s3://{s3_server.bucket}/{prefix}", options).check_writable()
    assert s3_server.list(prefix) == []  # nothing left behind, not even a "directory" marker
    with pytest.raises(StagingNotWritableError, match="bucket 'no-such-bucket' does not exist") as info:
        StagingStore.open("s3://no-such-bucket/staging", options).check_writable()
    assert "NoSuchBucket" in str(info.value)
    assert isinstance(info.value, PreflightError)


def test_a_local_staging_root_is_checked_by_the_same_probe_as_the_connection_test(tmp_path):
    StagingStore.open(str(tmp_path / "new" / "staging")).check_writable()  # can be created: fine
    blocker = tmp_path / "a-file"
    blocker.write_text("in the way\n")
    with pytest.raises(StagingNotWritableError, match="is not a directory"):
        StagingStore.open(str(blocker / "staging")).check_writable()


def test_delta_credentials_come_from_the_named_connection_not_the_environment(
    monkeypatch,
    tmp_path,
    s3_server,  # noqa: F811
):
    pytest.importorskip("deltalake")
    # The process environment has keys: they must not count for a connection that has none.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    aws_conn(monkeypatch, "lake_nokeys", s3_server.endpoint, login=None, password=None)
    publisher = resolve_target(f"delta+s3://{s3_server.bucket}/t", _options(tmp_path, conn_id="lake_nokeys"))
    with pytest.raises(TargetUnreachableError, match="connection 'lake_nokeys'.*no credentials"):
        publisher.check_writable()
    aws_conn(monkeypatch, "lake_half", s3_server.endpoint, password=None)
    publisher = resolve_target(f"delta+s3://{s3_server.bucket}/t", _options(tmp_path, conn_id="lake_half"))
    with pytest.raises(TargetUnreachableError, match="connection 'lake_half'.*half an access key pair"):
        publisher.check_writable()
    # Keys, but a bucket that does not exist: named, with the connection.
    aws_conn(monkeypatch, "lake", s3_server.endpoint)
    publisher = resolve_target("delta+s3://no-such-bucket/t", _options(tmp_path, conn_id="lake"))
    with pytest.raises(
        TargetUnreachableError, match="bucket 'no-such-bucket'.*NoSuchBucket.*connection 'lake'"
    ):
        publisher.check_writable()
    # Keys and the bucket: a new table's directory need not exist.
    resolve_target(
        f"delta+s3://{s3_server.bucket}/new-{uuid.uuid4().hex[:6]}", _options(tmp_path, conn_id="lake")
    ).check_writable()


def test_an_iceberg_catalog_that_does_not_answer_is_named_with_its_connection(monkeypatch, tmp_path):
    pytest.importorskip("pyiceberg")
    port = closed_port()
    monkeypatch.setenv(
        "AIRFLOW_CONN_LAKE_REST",
        json.dumps({"conn_type": "generic", "extra": {"type": "rest", "uri": f"http://127.0.0.1:{port}"}}),
    )
    publisher = resolve_target("iceberg://lake_rest/sales.orders", _options(tmp_path))
    with pytest.raises(TargetUnreachableError) as info:
        publisher.check_writable()
    message = str(info.value)
    assert "connection 'lake_rest'" in message and f"127.0.0.1:{port}" in message and "unreachable" in message
    # A catalog that answers: nothing refused.
    catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path}/c.db", "warehouse": f"file://{tmp_path}/w"}
    resolve_target("iceberg://other/sales.orders", _options(tmp_path, catalog=catalog)).check_writable()


def test_a_sql_target_whose_database_does_not_answer_is_named_with_its_connection(monkeypatch, tmp_path):
    pytest.importorskip("psycopg2")
    port = closed_port()
    monkeypatch.setenv(
        "AIRFLOW_CONN_WAREHOUSE_DOWN",
        json.dumps(
            {"conn_type": "postgres", "host": "127.0.0.1", "port": port, "login": "u", "password": "secret-pw",
             "schema": "db"}
        ),
    )  # fmt: skip
    publisher = resolve_target("sql://warehouse_down/public.totals", _options(tmp_path))
    with pytest.raises(TargetUnreachableError) as info:
        publisher.check_writable()
    message = str(info.value)
    assert "connection 'warehouse_down'" in message and f"127.0.0.1:{port}" in message
    assert "secret-pw" not in message


def test_a_check_that_does_not_answer_is_cut_off():
    import threading
    import time

    from airflow_provider_walsink.core.targets._reach import within

    release = threading.Event()
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="catalog 'x' at 10.0.0.1:8181 did not answer within 0.2s"):
        within(0.2, lambda: release.wait(30), what="catalog 'x' at 10.0.0.1:8181")
    assert time.monotonic() - started < 5
    release.set()
    assert within(5, lambda: 42, what="anything") == 42
    with pytest.raises(ValueError, match="its own error"):
        within(5, lambda: int("its own error"), what="anything")


# ------------------------------------------------------------------ the write task


@pytest.fixture
def committer(monkeypatch, sqlite_store, database_urls):
    return sqlite_store, database_urls("sqlite")


def walsink_conn(monkeypatch, url: str, root: str, **extra) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_WALSINK_PF_TEST",
        json.dumps({"conn_type": "walsink", "extra": {"url": url, "staging_root": root, **extra}}),
    )


def run_write_task(tmp_path, target: str | None, **kwargs):
    """One ``dag.test()`` run of a write task with two retries; returns its state."""
    dag = write_dag(tmp_path, target, walsink_conn_id="walsink_pf_test", retries=2, **kwargs)
    dr = dag.test(logical_date=DAY)
    return {ti.task_id: ti.state for ti in dr.get_task_instances()}


def assert_refused_before_spark(tmp_path, store, states, out: str) -> None:
    # Failed at once (a retry would wait for its delay and meet the same configuration).
    assert states == {"write": "failed"} and "AirflowFailException" in out
    assert not (tmp_path / "submitted").exists() and not (tmp_path / "ran").exists()
    assert store.get_pipeline("events") is None  # nothing recorded in the committer table


@pytest.mark.airflow
def test_the_write_task_refuses_a_staging_bucket_that_does_not_exist(
    airflow_db,
    committer,
    monkeypatch,
    tmp_path,
    capfd,
    s3_server,  # noqa: F811
):
    store, url = committer
    aws_conn(monkeypatch, "staging_s3", s3_server.endpoint)
    walsink_conn(monkeypatch, url, "s3://no-such-staging-bucket/staging", staging_conn_id="staging_s3")
    capfd.readouterr()
    states = run_write_task(tmp_path, None)
    out = capfd.readouterr().out
    assert_refused_before_spark(tmp_path, store, states, out)
    assert "bucket 'no-such-staging-bucket' does not exist (NoSuchBucket)" in out
    assert "connection 'staging_s3' (staging_conn_id of walsink connection 'walsink_pf_test'" in out
    assert SECRET_KEY not in out


@pytest.mark.airflow
def test_the_write_task_refuses_a_delta_target_whose_connection_has_no_credentials(
    airflow_db,
    committer,
    monkeypatch,
    tmp_path,
    capfd,
    s3_server,  # noqa: F811
):
    pytest.importorskip("deltalake")
    store, url = committer
    aws_conn(monkeypatch, "staging_s3", s3_server.endpoint)
    aws_conn(monkeypatch, "lake_nokeys", s3_server.endpoint, login=None, password=None)
    walsink_conn(monkeypatch, url, str(tmp_path / "staging"), staging_conn_id="staging_s3")
    capfd.readouterr()
    states = run_write_task(
        tmp_path, f"delta+s3://{s3_server.bucket}/events", target_options={"conn_id": "lake_nokeys"}
    )
    out = capfd.readouterr().out
    assert_refused_before_spark(tmp_path, store, states, out)
    assert "connection 'lake_nokeys' (the target's conn_id) has no credentials" in out


@pytest.mark.airflow
def test_the_write_task_refuses_an_iceberg_catalog_on_a_closed_port(
    airflow_db, committer, monkeypatch, tmp_path, capfd
):
    pytest.importorskip("pyiceberg")
    store, url = committer
    port = closed_port()
    monkeypatch.setenv(
        "AIRFLOW_CONN_LAKE_DOWN",
        json.dumps({"conn_type": "generic", "extra": {"type": "rest", "uri": f"http://127.0.0.1:{port}"}}),
    )
    walsink_conn(monkeypatch, url, str(tmp_path / "staging"))
    capfd.readouterr()
    states = run_write_task(tmp_path, "iceberg://lake_down/sales.orders?create_table=true")
    out = capfd.readouterr().out
    assert_refused_before_spark(tmp_path, store, states, out)
    assert f"catalog 'lake_down' (from connection 'lake_down') is unreachable at 127.0.0.1:{port}" in out


@pytest.mark.airflow
@pytest.mark.parametrize("wrong", ["spark_conn_id", "walsink_conn_id", "connect server down"])
def test_the_write_task_refuses_a_connection_it_names_that_cannot_serve(
    airflow_db, committer, monkeypatch, tmp_path, capfd, wrong
):
    """Issue 47: a typo in either connection id, or a Spark Connect server that does not answer,
    is refused naming the connection, before anything is recorded, without a retry (Airflow's
    bare ``AirflowNotFoundException`` and ``up_for_retry`` before; the Connect server found down
    only after the checkpoint was registered, then retried)."""
    store, url = committer
    walsink_conn(monkeypatch, url, str(tmp_path / "staging"))
    port = closed_port()
    token = "tok-never-logged-4Qz"
    monkeypatch.setenv(
        "AIRFLOW_CONN_SPARK_CONNECT_DOWN",
        json.dumps({"conn_type": "spark_connect", "host": "127.0.0.1", "port": port, "password": token}),
    )
    kwargs, refusal = {
        "spark_conn_id": (
            {"spark_conn_id": "spark_typo"},
            "connection 'spark_typo' (spark_conn_id of write task 'write') does not exist",
        ),
        "walsink_conn_id": (
            {"walsink_conn_id": "walsink_typo"},
            "connection 'walsink_typo' (walsink_conn_id) does not exist",
        ),
        "connect server down": (
            {"spark_conn_id": "spark_connect_down", "spark_binary": None},
            f"Spark Connect server 127.0.0.1:{port} (connection 'spark_connect_down') does not answer",
        ),
    }[wrong]
    capfd.readouterr()
    # No retry delay: a task that would be retried (as before) is, at once, and the test says so.
    dag = write_dag(
        tmp_path,
        None,
        retries=2,
        retry_delay=timedelta(0),
        **{"walsink_conn_id": "walsink_pf_test", **kwargs},
    )
    [ti] = dag.test(logical_date=DAY).get_task_instances()
    out = capfd.readouterr().out
    assert ti.try_number == 1, f"tried {ti.try_number} times"
    assert_refused_before_spark(tmp_path, store, {ti.task_id: ti.state}, out)
    assert refusal in out and "nothing was recorded and the Spark job was not started" in out, out[-3000:]
    assert "AirflowNotFoundException" not in out and token not in out
