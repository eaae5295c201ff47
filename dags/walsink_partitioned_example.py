"""Example: a Delta Lake table written one **asset partition** at a time (Airflow 3.2+).

The DAG is scheduled by ``CronPartitionTimetable``: each run carries a partition key (a day,
``2026-01-05``, in the ``%Y-%m-%d`` format the timetable writes) and no data interval.
walsink keys the run's checkpoint by it (``pk=2026-01-05``) and the pipeline declares that a
key names the target partition ``dt=<key>``: the run's one Delta version replaces exactly that
partition, and a job staging rows of another day is refused before anything is published
(docs/backfill.md, "Partitioned runs"). A key the pipeline cannot name (``a/b``, ``..``, not
``%Y-%m-%d``) fails the write task before anything is recorded or Spark starts.

Backfill a range of partitions::

    airflow backfill create --dag-id walsink_partitioned_example \\
        --from-date 2026-03-01 --to-date 2026-03-03

Each partition commits once; running the range again changes nothing (reprocess ``skip``),
and ``--reprocess-behavior completed --dag-run-conf '{"walsink_reprocess": "replace"}'``
rewrites a partition as a new version. Each new commit's asset event carries the partition
key, so ``walsink_partitioned_downstream_example`` (``walsink_downstream_example.py``) runs
once per newly committed partition.

On an Airflow without partitions the DAG falls back to ``@daily`` (data-interval keys), with
one log line.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk import DAG
from walsink_example_common import JOBS_DIR, home_template

from airflow_provider_walsink.operators.pipeline import walsink_pipeline

HOME = home_template()
PIPELINE = "delta_partitioned_events"
#: The partition key format: one key per day, which is also the value of the target's ``dt``.
KEY_FORMAT = "%Y-%m-%d"

try:
    from airflow.sdk import CronPartitionTimetable

    schedule: Any = CronPartitionTimetable("0 0 * * *", timezone="UTC", key_format=KEY_FORMAT)
except ImportError:  # Airflow before 3.2: no partitions
    logging.getLogger(__name__).warning(
        "walsink_partitioned_example: this Airflow has no CronPartitionTimetable (3.2+); "
        "scheduling @daily with data-interval checkpoint keys instead"
    )
    schedule = "@daily"

with DAG(
    dag_id="walsink_partitioned_example",
    description="Daily partitions → Delta Lake table, one version per partition, exactly once (walsink)",
    schedule=schedule,
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=3,
    default_args={"retries": 2, "retry_delay": timedelta(seconds=10)},
    tags=["walsink", "example", "delta", "partitions"],
    doc_md=__doc__,
) as dag:
    walsink_pipeline(
        "events",
        pipeline=PIPELINE,
        application=str(JOBS_DIR / "daily_events_job.py"),
        target=f"delta://{HOME}/target/{PIPELINE}?create_table=true",
        staging_root=f"{HOME}/target/{PIPELINE}/_walsink_staging",
        mode="overwrite",
        partition_by=["dt"],
        # A partition key names the target partition dt=<key>, and must be a %Y-%m-%d day.
        partition_column="dt",
        partition_key_format=KEY_FORMAT,
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
