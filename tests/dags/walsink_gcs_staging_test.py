"""Shape of the DAG that tests/test_gcs_staging_airflow.py runs with dag.test().

dag.test() schedules from this serialized copy but runs the tasks of the
in-memory DAG the test builds (with its own job script and connections).
"""

from datetime import UTC, datetime

from airflow.sdk import DAG

from airflow_provider_walsink.operators.write import WalWriteOperator
from airflow_provider_walsink.sensors.durable import CheckpointDurableSensor

with DAG(
    "walsink_gcs_staging_test",
    schedule="@daily",
    start_date=datetime(2026, 4, 1, tzinfo=UTC),
    catchup=False,
    tags=["walsink-tests"],
):
    WalWriteOperator(task_id="write", application="/nonexistent.py", pipeline="gcsevents") >> (
        CheckpointDurableSensor(task_id="durable", pipeline="gcsevents")
    )
