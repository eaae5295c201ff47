"""Example: daily per-country totals loaded into a PostgreSQL table, exactly once.

Each run (one day) aggregates that day's raw events with Spark, stages the
totals as Parquet (partition ``dt=<day>``), waits until the staged checkpoint
is durable, and commits it with the SQL target: one transaction deletes the
day's rows, ``COPY``-loads the new ones and writes a marker row
``(pipeline, checkpoint, attempt id, epoch)`` in ``walsink_markers``. A
retried, cleared or zombie commit finds that marker (or a newer epoch) and
writes nothing; the table never holds a day twice.

The target is the Airflow connection ``walsink_sql_target`` (type
``postgres``: host, port, login, password, and the database in *schema*),
for example::

    export AIRFLOW_CONN_WALSINK_SQL_TARGET='postgresql://postgres@127.0.0.1:5432/analytics'

The table ``public.daily_country_totals`` is created on the first commit
(``dt``, ``country``, ``event_type``, ``events``, ``users``, ``amount_cents``).
Raw input lives where ``walsink_example_common`` says.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from airflow.sdk import DAG
from walsink_example_common import JOBS_DIR, home_template

from airflow_provider_walsink.operators.pipeline import walsink_pipeline

HOME = home_template()
TARGET_CONN_ID = "walsink_sql_target"

with DAG(
    dag_id="walsink_sql_example",
    description="Daily per-country totals → PostgreSQL table, exactly once (walsink SQL target)",
    schedule="@daily",
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=4,
    default_args={"retries": 2, "retry_delay": timedelta(seconds=10)},
    tags=["walsink", "example", "sql"],
    doc_md=__doc__,
) as dag:
    walsink_pipeline(
        "daily_totals",
        pipeline="daily_country_totals",
        application=str(JOBS_DIR / "daily_totals_job.py"),
        # Replace mode: the day's rows are named by the partition column dt.
        target=f"sql://{TARGET_CONN_ID}/public.daily_country_totals",
        mode="overwrite",
        partition_by=["dt"],
        write={
            "application_args": ["--raw", f"{HOME}/raw/daily_events"],
            "conf": {"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"},
        },
        durable={"poke_interval": 2},
    )
