"""Issue 23 end to end from Airflow: write -> durable -> commit (and abort) with staging on S3 and
the table on the same bucket.

Real parts: the operators themselves (``execute``/``poke`` with connections from ``AIRFLOW_CONN_*``:
an ``aws`` connection for moto's S3 server, named by the walsink connection's ``staging_conn_id``);
a REAL spark-submit whose executors stage Parquet to ``s3://`` and seal there; the durability
sensor reading the store; the commit task publishing by reference into a Delta table (deltalake)
or an Iceberg table (pyiceberg SQL catalog, warehouse on the bucket); the abort's staging opened as
the CLI and the UI open it (``aborter_for`` with the connection's ``stores`` opener), tombstoning
a Delta table. Tables are read back with their own libraries.
"""

from __future__ import annotations

import json
import textwrap
import uuid
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_provider_walsink.core.commit.abort import CheckpointAborter
from airflow_provider_walsink.core.protocol import CheckpointState as S
from airflow_provider_walsink.core.store import Actor
from airflow_provider_walsink.hooks.aborts import aborter_for
from airflow_provider_walsink.hooks.walsink import WalsinkHook
from airflow_provider_walsink.operators.commit import WalCommitOperator
from airflow_provider_walsink.operators.write import WalWriteOperator
from airflow_provider_walsink.sensors.durable import CheckpointDurableSensor
from tests.table_fixtures import ACCESS_KEY, REGION, SECRET_KEY, s3_server  # noqa: F401

INTERVAL_START = datetime(2026, 4, 1, tzinfo=UTC)
KEY = "20260401T000000Z"
ROWS = 42

JOB = textwrap.dedent(
    f"""
    from pyspark.sql import SparkSession

    from airflow_provider_walsink.core.spark import CheckpointJob

    spark = SparkSession.builder.getOrCreate()
    with CheckpointJob.from_argv(spark) as job:
        assert job.store.kind == "s3", job.store
        df = spark.range({ROWS}).selectExpr("id", "'2026-04-01' AS dt")
        job.stage(df, replace_partitions=["dt=2026-04-01"])
    spark.stop()
    """
)


def connections(monkeypatch, server, url: str) -> None:
    """The aws connection (moto) and a walsink connection naming it for staging."""
    monkeypatch.setenv(
        "AIRFLOW_CONN_S3_STAGE",
        json.dumps({"conn_type": "aws", "login": ACCESS_KEY, "password": SECRET_KEY,
                    "extra": {"region_name": REGION, "endpoint_url": server.endpoint}}),
    )  # fmt: skip
    monkeypatch.setenv(
        "AIRFLOW_CONN_WALSINK_DEFAULT",
        json.dumps({"conn_type": "walsink", "extra": {"url": url, "staging_conn_id": "s3_stage"}}),
    )


def context(task_id: str) -> dict[str, Any]:
    ti = SimpleNamespace(dag_id="s3_tables_test", task_id=task_id, run_id="manual", try_number=1,
                         map_index=-1, id=None, xcom_push=lambda key, value: None)  # fmt: skip
    return {"ti": ti, "logical_date": INTERVAL_START, "data_interval_start": INTERVAL_START,
            "data_interval_end": INTERVAL_START + timedelta(days=1)}  # fmt: skip


class Pipeline:
    """The three tasks of one pipeline into a Delta table (``delta+s3://walsink/<prefix>/events``) or
    an Iceberg table (SQL catalog, warehouse ``s3://walsink/<prefix>/warehouse``) on the bucket."""

    def __init__(self, server, tmp_path, kind: str = "delta") -> None:
        self.server, self.kind = server, kind
        prefix = f"s3://walsink/{uuid.uuid4().hex[:8]}"
        if kind == "delta":
            self.table = f"{prefix}/events"
            self.target = f"delta+{self.table}?create_table=true"
            self.options: dict[str, Any] = {"storage_options": server.delta_options()}
        else:
            self.table = f"{prefix}/warehouse"
            self.target = "iceberg://lake/ns.events?create_table=true"
            catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": self.table}
            self.options = {"catalog": {**catalog, **server.iceberg_properties()}}
        self.job = tmp_path / "job.py"
        self.job.write_text(JOB)

    def write(self) -> dict[str, Any]:
        return WalWriteOperator(
            task_id="write", application=str(self.job), pipeline="events", checkpoint_key=KEY,
            target=self.target, target_options=self.options, partition_by=["dt"], master="local[2]",
        ).execute(context("write"))  # fmt: skip

    def durable(self) -> bool:
        sensor = CheckpointDurableSensor(task_id="durable", pipeline="events", checkpoint_key=KEY)
        return sensor.poke(context("durable"))

    def commit_task(self) -> WalCommitOperator:
        return WalCommitOperator(
            task_id="commit", pipeline="events", target=self.target, target_options=self.options,
            partition_by=["dt"], checkpoint_key=KEY, emit_asset_events=False,
        )  # fmt: skip

    def delta(self):
        from deltalake import DeltaTable

        return DeltaTable(self.table, storage_options=self.server.delta_options())

    def read_back(self) -> tuple[Any, list[str], object]:
        """The table's rows, data files and version, read with its own library."""
        if self.kind == "delta":
            table = self.delta()
            return table.to_pyarrow_table(), list(table.file_uris()), table.version()
        table = self.commit_task().get_publisher(None).load_table()
        files = [task.file.file_path for task in table.scan().plan_files()]
        return table.scan().to_arrow(), files, table.current_snapshot().snapshot_id


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_write_durable_commit_on_s3_into_a_table_on_the_same_bucket(
    kind,
    monkeypatch,
    sqlite_store,
    database_urls,
    s3_server,  # noqa: F811
    tmp_path,
):
    connections(monkeypatch, s3_server, database_urls("sqlite"))
    p = Pipeline(s3_server, tmp_path, kind)
    p.write()
    record = sqlite_store.require("events", KEY)
    # The table target stages inside its own location, on the bucket.
    assert record.staging_root.startswith(f"{p.table}/") and record.state is S.SEALED, record.staging_root
    assert record.staging_root.endswith("/_walsink_staging")
    assert p.durable() is True
    assert sqlite_store.require("events", KEY).state is S.DURABLE

    summary = p.commit_task().execute(context("commit"))
    assert summary["state"] == "COMMITTED" and not summary["already_committed"], summary
    record = sqlite_store.require("events", KEY)
    assert record.state is S.COMMITTED
    rows, files, version = p.read_back()
    assert rows.num_rows == ROWS and sorted(rows.column("id").to_pylist()) == list(range(ROWS))
    # By reference: the data files are the staged objects themselves.
    attempt = (
        f"{record.staging_root}/events/{KEY}/attempt-{record.sealed_attempt}-{record.sealed_attempt_id}/"
    )
    assert files and all(f.startswith(attempt) for f in files), files

    again = p.commit_task().execute(context("commit"))  # a re-run: a no-op that says so
    assert again["already_committed"] and again["state"] == "COMMITTED", again
    rows, files_again, version_again = p.read_back()
    assert (rows.num_rows, sorted(files_again), version_again) == (ROWS, sorted(files), version)


@pytest.mark.spark
@pytest.mark.slow
def test_abort_of_a_durable_checkpoint_staged_on_s3_tombstones_the_delta_table_and_removes_its_staging(
    monkeypatch,
    sqlite_store,
    database_urls,
    s3_server,  # noqa: F811
    tmp_path,
):
    from airflow_provider_walsink.core.commit.sealed import read_sealed_attempt
    from airflow_provider_walsink.core.commit.tablefence import TableFenceContext
    from airflow_provider_walsink.core.targets._tables import AbortedInTableError
    from airflow_provider_walsink.core.targets.delta import app_id

    connections(monkeypatch, s3_server, database_urls("sqlite"))
    p = Pipeline(s3_server, tmp_path)
    p.write()
    assert p.durable() is True
    hook = WalsinkHook()
    record = sqlite_store.require("events", KEY)
    staging = hook.get_staging_store(record.staging_root)
    # A committer that read the sealed attempt before the abort (a zombie, resumed later).
    manifest, staged = read_sealed_attempt(staging, record)
    prefix = staged.location.path.split("/", 1)[1]
    assert s3_server.list(prefix)

    # As the UI and `walsink abort` build it: the recorded s3:// root, opened with the walsink
    # connection's staging credentials (no AWS_* variables here: the default chain has none).
    built = aborter_for(
        sqlite_store,
        "events",
        staging_root=hook.staging_root,
        checkpoint_key=KEY,
        stores=hook.get_staging_store,
    )
    assert built.staging.layout is None and built.staging.root_uri == record.staging_root
    assert built.staging._options["access_key"] == ACCESS_KEY
    # The registered target is a URI only (its target_options are not recorded), so the table's
    # credentials come from the task's target options here, as the commit task has them.
    aborter = CheckpointAborter(sqlite_store, built.staging, p.commit_task().get_publisher(None))
    outcome = aborter.abort("events", KEY, reason="INC-7: bad input", actor=Actor(name="tester"))
    assert (outcome.state, outcome.previous_state) == ("ABORTED", "DURABLE"), outcome
    assert not outcome.warnings, outcome.warnings
    assert sqlite_store.require("events", KEY).state is S.ABORTED
    # Its staged attempt is gone from the bucket, and the table carries the tombstone.
    assert outcome.staging_removed == [f"events/{KEY}/{staged.location.path.rsplit('/', 1)[1]}"]
    assert s3_server.list(prefix) == []
    table = p.delta()
    assert table.transaction_version(app_id(manifest, manifest.attempt_id)) == -1
    assert table.to_pyarrow_table().num_rows == 0

    # A later commit of that attempt publishes nothing: the commit task is refused...
    with pytest.raises(Exception, match="ABORTED"):
        p.commit_task().execute(context("commit"))
    # ...and so is the zombie's publish, by the table itself.
    publisher = p.commit_task().get_publisher(None)
    ctx = TableFenceContext("events", KEY, attempt_id=manifest.attempt_id, epoch=10**12, supersedes=None)
    with pytest.raises(AbortedInTableError):
        publisher.publish(manifest, staged, ctx)
    assert p.delta().to_pyarrow_table().num_rows == 0


@pytest.mark.spark
@pytest.mark.slow
def test_the_audit_task_reads_a_checkpoint_staged_on_s3_through_the_store(
    monkeypatch,
    sqlite_store,
    database_urls,
    s3_server,  # noqa: F811
    tmp_path,
):
    """The audit gate on object storage: WalAuditOperator opens the recorded s3:// root with the walsink
    connection's staging credentials and DuckDB reads the staged Parquet through the store (partition
    columns from the directories). Passing checks record AUDITED; the same data judged by a check it
    fails counts exactly the failing rows (the data really was read, not its manifest)."""
    from airflow_provider_walsink.core.commit.audit import (
        NotNullCheck,
        RowCountCheck,
        SqlPredicateCheck,
        StagedData,
        run_checks,
    )
    from airflow_provider_walsink.core.commit.sealed import read_sealed_attempt
    from airflow_provider_walsink.operators.audit import WalAuditOperator

    connections(monkeypatch, s3_server, database_urls("sqlite"))
    p = Pipeline(s3_server, tmp_path)
    p.write()
    assert p.durable() is True
    record = sqlite_store.require("events", KEY)
    assert record.staging_root.startswith("s3://")

    manifest, staged = read_sealed_attempt(WalsinkHook().get_staging_store(record.staging_root), record)
    with StagedData.on_store(staged.store, manifest, staged.location) as data:
        report = run_checks([SqlPredicateCheck("id < 10 AND dt = '2026-04-01'")], data)
    assert not report.passed and "32 of 42 rows" in report.reason, report.reason

    audit = WalAuditOperator(
        task_id="audit",
        pipeline="events",
        checkpoint_key=KEY,
        checks=[RowCountCheck(min_rows=ROWS, max_rows=ROWS), NotNullCheck("id", "dt"),
                SqlPredicateCheck("id >= 0 AND dt = '2026-04-01'")],
    )  # fmt: skip
    outcome = audit.execute(context("audit"))
    assert outcome["verdict"] == "AUDITED" and all(c["passed"] for c in outcome["checks"]), outcome
    assert sqlite_store.require("events", KEY).state is S.AUDITED


def test_the_audit_without_a_way_to_open_an_object_store_refuses_clearly(sqlite_store):
    """Called without ``stores=`` (outside the audit task), a recorded s3:// root is an AuditError naming
    it (the task fails without retrying, nothing recorded), not a ValueError about a path."""
    from airflow_provider_walsink.core.commit.audit import AuditError, RowCountCheck, audit_checkpoint
    from tests.helpers import ACTOR

    root = "s3://walsink/audit/staging"
    sqlite_store.register("events", KEY, mode="overwrite", actor=ACTOR)
    attempt = sqlite_store.start_attempt("events", KEY, actor=ACTOR, staging_root=root)
    sqlite_store.seal("events", KEY, attempt=attempt.attempt, manifest_uri=f"{root}/m", manifest_digest="sha256:" + "0" * 64,
                      committables=1, rows=1, bytes=1, actor=ACTOR)  # fmt: skip
    sqlite_store.mark_durable("events", KEY, attempt=attempt.attempt, actor=ACTOR)
    with pytest.raises(AuditError, match="staged on an object store .*s3://walsink/audit/staging"):
        audit_checkpoint(sqlite_store, lambda: None, "events", KEY, [RowCountCheck(min_rows=1)], actor=ACTOR)
    assert sqlite_store.require("events", KEY).state is S.DURABLE


@pytest.mark.parametrize("target", ["files", "sql"])
def test_the_commit_task_refuses_a_non_table_target_for_a_checkpoint_staged_on_s3(
    target,
    monkeypatch,
    sqlite_store,
    database_urls,
    s3_server,  # noqa: F811
    tmp_path,
):
    """A file or SQL target publishes from a local staging root only: the commit of a checkpoint
    recorded as staged on ``s3://`` fails without retrying, naming the root and the table targets,
    before any lease; the checkpoint stays DURABLE (no lease taken) and no file target is created."""
    from airflow.exceptions import AirflowFailException

    from tests.helpers import ACTOR

    connections(monkeypatch, s3_server, database_urls("sqlite"))
    root = f"s3://{s3_server.bucket}/{uuid.uuid4().hex[:8]}/staging"
    sqlite_store.register("events", KEY, mode="overwrite", actor=ACTOR)
    attempt = sqlite_store.start_attempt("events", KEY, actor=ACTOR, staging_root=root)
    sqlite_store.seal("events", KEY, attempt=attempt.attempt, manifest_uri=f"{root}/m",
                      manifest_digest="sha256:" + "0" * 64, committables=1, rows=1, bytes=1,
                      actor=ACTOR)  # fmt: skip
    sqlite_store.mark_durable("events", KEY, attempt=attempt.attempt, actor=ACTOR)
    before = sqlite_store.require("events", KEY)
    if target == "files":
        uri, options = str(tmp_path / "target"), {}
    else:
        monkeypatch.setenv(
            "AIRFLOW_CONN_SQL_TARGET",
            json.dumps(
                {
                    "conn_type": "postgres",
                    "host": "127.0.0.1",
                    "port": 5432,
                    "login": "postgres",
                    "schema": "test",
                }
            ),
        )
        uri, options = "sql://sql_target/events", {}
    task = WalCommitOperator(task_id="commit", pipeline="events", target=uri, target_options=options,
                             partition_by=["dt"], checkpoint_key=KEY, emit_asset_events=False)  # fmt: skip
    with pytest.raises(
        AirflowFailException, match=rf"staged on an object store \({root}\).*Iceberg or Delta"
    ):
        task.execute(context("commit"))
    after = sqlite_store.require("events", KEY)
    assert (after.state, after.lease_epoch, after.lease_owner) == (S.DURABLE, before.lease_epoch, None), after
    assert not (tmp_path / "target").exists()
