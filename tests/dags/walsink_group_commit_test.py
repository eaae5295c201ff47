"""The DAGs of ``tests/test_e2e_partitions.py``'s group-commit test (issue 47): a group commit of
four partitions, and a partition-aware DAG downstream of it that keeps the events a user would.

``walsink_group_commit_test`` is scheduled by partitions (``%Y-%m-%d``) and has only its commit
task: the test stages the four partitions' checkpoints first (through the core API: the claim is
about the commit tasks and their events, so no Spark job), then backfills the four partitions
one run at a time. The first run's commit task leads a group commit of the four (one Delta
version); the other three find theirs committed by it and add their events.

``walsink_group_commit_downstream_test`` (a ``PartitionedAssetTimetable``) runs once per
committed partition and keeps its triggering events whose ``published`` is above 0, as
docs/ui.md ("Asset events") shows.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, CronPartitionTimetable, PartitionedAssetTimetable, task

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "dags"))

from walsink_example_common import default_example_home  # noqa: E402

from airflow_provider_walsink.operators.commit import WalCommitOperator  # noqa: E402
from airflow_provider_walsink.operators.lineage import target_asset  # noqa: E402

PIPELINE = "group_events"
TABLE = f"{default_example_home()}/target/{PIPELINE}"
TARGET = f"delta://{TABLE}?create_table=true"
STAGING = f"{TABLE}/_walsink_staging"
ASSET = target_asset(PIPELINE, TARGET)

with DAG(
    dag_id="walsink_group_commit_test",
    schedule=CronPartitionTimetable("0 0 * * *", timezone="UTC", key_format="%Y-%m-%d"),
    start_date=datetime(2026, 9, 1, tzinfo=UTC),
    catchup=False,
    # A loaded machine's api-server can time out a task's start; a commit task is safe to retry.
    default_args={"retries": 2, "retry_delay": timedelta(seconds=5)},
    tags=["walsink-tests"],
):
    WalCommitOperator(
        task_id="commit",
        pipeline=PIPELINE,
        target=TARGET,
        mode="overwrite",
        partition_by=["dt"],
        staging_root=STAGING,
    )

with DAG(
    dag_id="walsink_group_commit_downstream_test",
    schedule=PartitionedAssetTimetable(assets=ASSET),
    start_date=datetime(2026, 9, 1, tzinfo=UTC),
    catchup=False,
    tags=["walsink-tests"],
):

    @task
    def committed_partition(dag_run: Any = None, triggering_asset_events: Any = None) -> dict[str, Any]:
        """The commits of this run's partition that made files visible (docs/ui.md)."""
        seen = []
        for event in (triggering_asset_events or {}).get(ASSET, []):
            extra = event.extra or {}
            if extra.get("published", 0) > 0:
                seen.append(
                    {
                        "checkpoint_key": extra["checkpoint_key"],
                        "files": extra["files"],
                        "published": extra["published"],
                        "rows": extra["rows"],
                        "group": extra.get("group"),
                    }
                )
        return {"partition_key": dag_run.partition_key, "seen": seen}

    committed_partition()
