"""Example: a daily Delta Lake table, exactly once through the table's own commit.

Each run (one day) stages that day's events as Parquet files inside the table
directory (``<table>/_walsink_staging``, invisible to readers), waits until
they are durable, and commits them as **one Delta version** that replaces
partition ``dt=<day>``. The version carries an application transaction per
day and per write attempt, so a re-run, a racing committer or a zombie try
never adds the day twice, even if the committer table is lost.

The table lives under ``<example home>/target/delta_daily_events`` and is
created on the first commit (``?create_table=true``); for S3 use
``delta+s3://bucket/path`` and a connection (docs/targets.md). Read it back::

    from deltalake import DeltaTable
    DeltaTable(path).to_pyarrow_table()      # or DuckDB: SELECT * FROM delta_scan(path)
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from airflow.sdk import DAG
from walsink_example_common import JOBS_DIR, home_template

from airflow_provider_walsink.operators.pipeline import walsink_pipeline

HOME = home_template()

with DAG(
    dag_id="walsink_delta_example",
    description="Daily events → Delta Lake table, one version per day, exactly once (walsink)",
    schedule="@daily",
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=4,
    default_args={"retries": 2, "retry_delay": timedelta(seconds=10)},
    tags=["walsink", "example", "delta"],
    doc_md=__doc__,
) as dag:
    walsink_pipeline(
        "daily_events",
        pipeline="delta_daily_events",
        application=str(JOBS_DIR / "daily_events_job.py"),
        target=f"delta://{HOME}/target/delta_daily_events?create_table=true",
        # Stage inside the table directory: Delta adds the files by path, never copies them.
        staging_root=f"{HOME}/target/delta_daily_events/_walsink_staging",
        mode="overwrite",
        partition_by=["dt"],
        write={
            "application_args": ["--raw", f"{HOME}/raw/daily_events"],
            "conf": {
                "spark.sql.shuffle.partitions": "2",
                "spark.default.parallelism": "2",
                "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
            },
        },
        durable={"poke_interval": 2},
    )
