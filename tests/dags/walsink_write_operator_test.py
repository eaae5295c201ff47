"""Shape of the DAG that tests/test_write_operator.py runs with dag.test().

dag.test() schedules from this serialized copy but runs the tasks of the
in-memory DAG the test builds (with its own job script and connection).
"""

from datetime import UTC, datetime

from airflow.sdk import DAG, task

from airflow_provider_walsink.operators.write import WalWriteOperator

with DAG(
    "walsink_write_operator_test",
    schedule="@daily",
    start_date=datetime(2026, 4, 1, tzinfo=UTC),
    catchup=False,
    tags=["walsink-tests"],
):

    @task
    def xcoms() -> None:
        pass

    WalWriteOperator(task_id="write", application="/nonexistent.py", pipeline="events", retries=1) >> xcoms()
