"""Shape of the DAG that tests/test_gc.py runs with dag.test().

dag.test() schedules from this serialized copy but runs the tasks of the
in-memory DAG the test builds (with its own connection and retention).
"""

from datetime import UTC, datetime

from airflow.sdk import DAG

from airflow_provider_walsink.operators.gc import WalGarbageCollectOperator

with DAG(
    "walsink_gc_operator_test",
    schedule="@daily",
    start_date=datetime(2026, 3, 1, tzinfo=UTC),
    catchup=False,
    tags=["walsink-tests"],
):
    WalGarbageCollectOperator(task_id="gc", walsink_conn_id="walsink_gc_test")
