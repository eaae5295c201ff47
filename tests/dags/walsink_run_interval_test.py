"""Shape of the DAG that tests/test_run_interval.py runs: real runs of every type, one write task.

The runs are created by Airflow's own code (the CLI's trigger, the scheduler's
timetable, a backfill); the test runs the tasks of the in-memory DAG it builds
(with its own job, stand-in spark-submit and connection).
"""

from datetime import UTC, datetime

from airflow.sdk import DAG

from airflow_provider_walsink.operators.write import WalWriteOperator

with DAG(
    "walsink_run_interval_test",
    schedule="@daily",
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    tags=["walsink-tests"],
):
    WalWriteOperator(
        task_id="write", application="/nonexistent.py", pipeline="events", walsink_conn_id="walsink_ri_test"
    )
