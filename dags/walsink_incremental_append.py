"""Example: incremental ``append`` of newly arrived files, with Kafka-offset semantics.

Every run lands the interval's input files (standing in for an upstream
producer), then stages every file that arrived after the last *committed*
source offset, waits until the checkpoint is durable and appends it to the
target. Offsets advance only when a checkpoint commits, and checkpoints
commit in order (``max_active_runs=1``; the committer table also refuses an
out-of-order or non-contiguous commit), so no input file is read twice or
skipped, even when a write attempt fails after staging and is retried.

Copy this file, ``walsink_example_common.py`` and ``walsink_jobs/`` into any
dags folder; locations are described in ``walsink_example_common``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from airflow.sdk import DAG, task
from walsink_example_common import JOBS_DIR, home_template, land_arrivals, spark_conn_id

from airflow_provider_walsink.operators.pipeline import walsink_pipeline

HOME = home_template()

with DAG(
    dag_id="walsink_incremental_append",
    description="Newly arrived files → appended Parquet rows, exactly once (walsink, append mode)",
    schedule="@daily",
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": timedelta(seconds=10)},
    tags=["walsink", "example"],
    doc_md=__doc__,
) as dag:

    @task(templates_dict={"incoming": f"{HOME}/raw/incoming"})
    def land_files(data_interval_start=None, templates_dict=None) -> list[str]:
        """Land this interval's input files (idempotent: existing files are left alone)."""
        return land_arrivals(templates_dict["incoming"], data_interval_start)

    land_files() >> walsink_pipeline(
        "incoming_events",
        pipeline="incoming_events",
        application=str(JOBS_DIR / "incoming_files_job.py"),
        target=f"{HOME}/target/incoming_events",
        mode="append",
        partition_by=["dt"],
        write={
            "application_args": ["--incoming", f"{HOME}/raw/incoming"],
            "conf": {"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"},
            "spark_conn_id": spark_conn_id(),
        },
        durable={"poke_interval": 2},
    )
