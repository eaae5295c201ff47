"""Shape of the DAG that tests/test_partition_keys.py runs: runs triggered with partition keys,
one write task. The test runs the tasks of the in-memory DAG it builds (with its own job,
stand-in spark-submit and connection)."""

from datetime import UTC, datetime

from airflow.sdk import DAG, PartitionedAtRuntime

from airflow_provider_walsink.operators.write import WalWriteOperator

with DAG(
    "walsink_partition_keys_test",
    schedule=PartitionedAtRuntime(),
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    tags=["walsink-tests"],
):
    WalWriteOperator(
        task_id="write",
        application="/nonexistent.py",
        pipeline="events",
        partition_by=["dt"],
        partition_column="dt",
        partition_key_format="%Y-%m-%d",
        walsink_conn_id="walsink_pk_test",
    )
