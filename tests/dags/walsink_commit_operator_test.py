"""Shape of the DAG that tests/test_commit_operator.py runs with dag.test().

dag.test() schedules from this serialized copy but runs the tasks of the
in-memory DAG the test builds (with its own target and connection).
"""

from datetime import UTC, datetime

from airflow.sdk import DAG

from airflow_provider_walsink.operators.commit import WalCommitOperator

with DAG(
    "walsink_commit_operator_test",
    schedule="@daily",
    start_date=datetime(2026, 3, 1, tzinfo=UTC),
    catchup=False,
    tags=["walsink-tests"],
):
    WalCommitOperator(
        task_id="commit", pipeline="events", target="/nonexistent", walsink_conn_id="walsink_test"
    )

# test_every_member_of_a_group_commit_announces_its_own_files_and_the_group: four commit tasks, one
# after another (the first leads a group commit of the four checkpoints).
with DAG(
    "walsink_group_events_test",
    schedule="@daily",
    start_date=datetime(2026, 3, 1, tzinfo=UTC),
    catchup=False,
    tags=["walsink-tests"],
):
    previous = None
    for day in range(1, 5):
        task = WalCommitOperator(
            task_id=f"commit_2026030{day}",
            pipeline="events",
            target="/nonexistent",
            walsink_conn_id="walsink_test",
        )
        if previous is not None:
            previous >> task
        previous = task
