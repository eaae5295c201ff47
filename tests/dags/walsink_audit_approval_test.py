"""The DAG of the audit-approval tests (``tests/test_e2e_audit_approval.py``, ``tests/test_ui_browser.py``).

``walsink_pipeline(..., audit=[...], audit_approval=True)``: write (real Spark) >> durable >>
audit >> approval (Airflow's human-in-the-loop operator) >> commit into a Parquet directory.
The job is the audit test's (``walsink_audit_jobs``): 1,000 rows a day; on even days three rows
have no ``user_id``, the audit rejects the day, and a person decides in the approval step.
Data lives under ``$AIRFLOW_HOME/walsink/audit-approval-test``; the committer is ``walsink_default``.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG

from airflow_provider_walsink.core.commit.audit import NotNullCheck, RowCountCheck
from airflow_provider_walsink.operators.pipeline import walsink_pipeline

DAG_ID = "walsink_audit_approval_test"
PIPELINE = "approved_events"
JOB = Path(__file__).resolve().parent / "walsink_audit_jobs" / "audited_events_job.py"
HOME = os.path.join(os.environ.get("AIRFLOW_HOME", "/tmp"), "walsink", "audit-approval-test").replace("'", "")

with DAG(
    dag_id=DAG_ID,
    schedule="@daily",
    start_date=datetime(2026, 5, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=3,
    # As the examples: a task that could not start (a busy api-server) is tried again.
    default_args={"retries": 2, "retry_delay": timedelta(seconds=5)},
    tags=["walsink-tests"],
) as dag:
    walsink_pipeline(
        "events",
        pipeline=PIPELINE,
        application=str(JOB),
        target=f"{HOME}/target",
        mode="overwrite",
        partition_by=["dt"],
        audit=[RowCountCheck(min_rows=1, max_rows=100_000), NotNullCheck("user_id")],
        audit_approval={"assigned_users": [{"id": "admin", "name": "admin"}]},
        write={"conf": {"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"}},
        durable={"poke_interval": 2},
    )
