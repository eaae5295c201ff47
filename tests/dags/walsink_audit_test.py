"""The DAG of the audit tests (``tests/test_audit_pipeline.py``, ``tests/test_ui_browser.py``).

``walsink_pipeline(..., audit=[...])``: write (real Spark) >> durable >> audit >>
commit into a Parquet directory. The job stages 1,000 rows a day; on even days
three rows have no ``user_id``, so the audit rejects those days and nothing of
them is published. Data lives under the Variable ``walsink_audit_test_home``,
else ``$AIRFLOW_HOME/walsink/audit-test``; the committer is ``walsink_default``.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG

from airflow_provider_walsink.core.commit.audit import NotNullCheck, RowCountCheck, SqlPredicateCheck
from airflow_provider_walsink.operators.pipeline import walsink_pipeline

DAG_ID = "walsink_audit_test"
PIPELINE = "audited_events"
JOB = Path(__file__).resolve().parent / "walsink_audit_jobs" / "audited_events_job.py"
_DEFAULT_HOME = os.path.join(os.environ.get("AIRFLOW_HOME", "/tmp"), "walsink", "audit-test").replace("'", "")
HOME = "{{ var.value.get('walsink_audit_test_home', '" + _DEFAULT_HOME + "') }}"
AUDIT = [
    RowCountCheck(min_rows=1, max_rows=100_000),
    NotNullCheck("user_id"),
    SqlPredicateCheck("amount_cents BETWEEN 0 AND 499", name="amount_in_range"),
]

with DAG(
    dag_id=DAG_ID,
    schedule="@daily",
    start_date=datetime(2026, 5, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=2,
    # As the examples: a task that could not start (a busy api-server) is tried again.
    # The audit itself never retries a verdict (AirflowFailException).
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
        audit=AUDIT,
        write={
            "conf": {"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"},
        },
        durable={
            "poke_interval": 2,
        },
    )
