"""Example: a daily Apache Iceberg table, exactly once through the table's own commit.

Each run (one day) stages that day's events as Parquet files inside the
table location, waits until they are durable, and commits them as **one
Iceberg snapshot** that replaces partition ``dt=<day>``. The snapshot
summary and a table property name the pipeline, the day and the write
attempt, so a re-run, a racing committer or a zombie try never adds the day
twice, even if the committer table is lost.

The catalog is the Airflow connection ``walsink_iceberg`` (extra:
``{"type": "sql" | "rest", "uri": ..., "warehouse": ..., "s3.endpoint": ...}``;
the demo creates one). Without it the write task fails before Spark runs,
naming the connection to create; for a try on one machine, name the catalog
``walsink`` instead (``iceberg://walsink/examples.daily_events``): walsink's
embedded SQL catalog on SQLite under ``$WALSINK_ICEBERG_HOME`` (default
``~/.walsink/iceberg``). The table is created on the first commit
(``?create_table=true``). Read it back with pyiceberg or DuckDB::

    from pyiceberg.catalog import load_catalog
    load_catalog("walsink", **props).load_table("examples.daily_events").scan().to_arrow()

See docs/targets.md for the catalog and S3 settings.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from airflow.sdk import DAG
from walsink_example_common import JOBS_DIR, home_template

from airflow_provider_walsink.operators.pipeline import walsink_pipeline

HOME = home_template()

with DAG(
    dag_id="walsink_iceberg_example",
    description="Daily events → Apache Iceberg table, one snapshot per day, exactly once (walsink)",
    schedule="@daily",
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=4,
    default_args={"retries": 2, "retry_delay": timedelta(seconds=10)},
    tags=["walsink", "example", "iceberg"],
    doc_md=__doc__,
) as dag:
    walsink_pipeline(
        "daily_events",
        pipeline="iceberg_daily_events",
        application=str(JOBS_DIR / "daily_events_job.py"),
        target="iceberg://walsink_iceberg/examples.daily_events?create_table=true",
        mode="overwrite",
        partition_by=["dt"],
        write={
            "application_args": ["--raw", f"{HOME}/raw/daily_events"],
            "conf": {
                "spark.sql.shuffle.partitions": "2",
                "spark.default.parallelism": "2",
                # pyiceberg (and Iceberg's spec) reject Spark's default INT96 timestamps.
                "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
            },
        },
        durable={"poke_interval": 2},
    )
