"""Example: a daily partitioned Parquet table, exactly once, in ``overwrite`` mode.

Each run (one day) stages that day's raw events as partition ``dt=<day>``,
waits until the staged checkpoint is durable (in the triggerer), and commits
it by replacing the partition. Days commit independently, so backfills run in
parallel (``max_active_runs`` > 1). Re-running a committed day is a no-op
(backfill policy "skip committed": the write task skips the Spark job).

Copy this file, ``walsink_example_common.py`` and ``walsink_jobs/`` into any
dags folder; locations are described in ``walsink_example_common``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from airflow.sdk import DAG
from walsink_example_common import JOBS_DIR, home_template, spark_conn_id

from airflow_provider_walsink.operators.pipeline import walsink_pipeline

HOME = home_template()

with DAG(
    dag_id="walsink_daily_overwrite",
    description="Daily events → partitioned Parquet, exactly once (walsink, overwrite mode)",
    schedule="@daily",
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=4,
    default_args={"retries": 2, "retry_delay": timedelta(seconds=10)},
    tags=["walsink", "example"],
    doc_md=__doc__,
) as dag:
    walsink_pipeline(
        "daily_events",
        pipeline="daily_events",
        application=str(JOBS_DIR / "daily_events_job.py"),
        target=f"{HOME}/target/daily_events",
        mode="overwrite",
        partition_by=["dt"],
        write={
            "application_args": ["--raw", f"{HOME}/raw/daily_events"],
            "lineage_inputs": [f"{HOME}/raw/daily_events"],
            "conf": {"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"},
            "spark_conn_id": spark_conn_id(),
        },
        durable={"poke_interval": 2},
    )
