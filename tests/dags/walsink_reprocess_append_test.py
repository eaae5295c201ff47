"""The DAG of the append reprocess end-to-end test (``tests/test_e2e_backfill.py``).

The incremental example's pipeline (new files → appended rows, source offsets), run only
by the test's backfills over 2026-06-01 and 2026-06-02 (the test stack's scheduler creates
no scheduled runs, and the ``end_date`` keeps any other scheduler from adding one that would
land files sorting after them). Its own input, target and pipeline id under the example
home, apart from the example DAG's.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG, task

DAGS = Path(__file__).resolve().parents[2] / "dags"
sys.path.insert(0, str(DAGS))

from walsink_example_common import home_template, land_arrivals  # noqa: E402

from airflow_provider_walsink.operators.pipeline import walsink_pipeline  # noqa: E402

HOME = home_template()
INCOMING = f"{HOME}/raw/reprocess_incoming"

with DAG(
    dag_id="walsink_reprocess_append_test",
    schedule="@daily",
    start_date=datetime(2026, 6, 1, tzinfo=UTC),
    end_date=datetime(2026, 6, 2, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 3, "retry_delay": timedelta(seconds=5)},
    tags=["walsink-tests"],
):

    @task(templates_dict={"incoming": INCOMING})
    def land_files(data_interval_start=None, templates_dict=None) -> list[str]:
        return land_arrivals(templates_dict["incoming"], data_interval_start)

    land_files() >> walsink_pipeline(
        "events",
        pipeline="reprocess_append",
        application=str(DAGS / "walsink_jobs" / "incoming_files_job.py"),
        target=f"{HOME}/target/reprocess_append",
        mode="append",
        partition_by=["dt"],
        write={
            "application_args": ["--incoming", INCOMING],
            "conf": {"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"},
        },
        durable={"poke_interval": 2},
    )
