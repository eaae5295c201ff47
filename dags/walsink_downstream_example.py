"""Example: a DAG that runs once per new commit of ``walsink_daily_overwrite``.

The commit task of every walsink pipeline adds an Airflow asset event for its
target's asset (named ``walsink/<pipeline>``, URI the target's) **only when
it recorded a new commit**: a retry, a cleared task or a backfill re-run of a
committed interval adds none. Scheduled on that asset, this DAG therefore
runs exactly once per interval that landed in the target, never for a re-run
that changed nothing.

It reads what was committed from the triggering asset events' ``extra``
(``pipeline``, ``checkpoint_key``, ``attempt``, ``rows``, ``files``,
``published``), logs it and returns it (XCom), where a real pipeline would
refresh a report or notify a consumer.

The asset is the one ``walsink_daily_overwrite``'s commit task emits
(``lineage.target_asset``: name and URI), for the target under the example
home as the DAG file sees it when parsed (``WALSINK_EXAMPLE_HOME``, else
``$AIRFLOW_HOME/walsink/examples``). If you point the examples elsewhere with
the ``walsink_example_home`` Variable, set ``WALSINK_EXAMPLE_HOME`` to the same
place. (Airflow 3.3 hands a run scheduled on ``Asset.ref(name=...)`` no
triggering events, so this DAG names the asset itself.)
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from airflow.sdk import DAG, task
from walsink_example_common import default_example_home

from airflow_provider_walsink.operators.lineage import target_asset

PIPELINE = "daily_events"
#: What walsink_daily_overwrite commits into (its ``target``, with the example home resolved).
TARGET = f"{default_example_home()}/target/{PIPELINE}"
ASSET = target_asset(PIPELINE, TARGET)
log = logging.getLogger(__name__)

with DAG(
    dag_id="walsink_downstream_example",
    description="Runs once per new commit of the daily_events pipeline (an asset-scheduled DAG)",
    schedule=[ASSET],
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    tags=["walsink", "example"],
    doc_md=__doc__,
) as dag:

    @task
    def report_new_commits(triggering_asset_events: Any = None) -> list[dict[str, Any]]:
        """What each triggering commit published: one entry per asset event."""
        commits = []
        # The events of the target's asset (each also appears under the alias it came through).
        for event in (triggering_asset_events or {}).get(ASSET, []):
            extra = dict(event.extra or {})
            commits.append(
                {
                    "pipeline": extra.get("pipeline"),
                    "checkpoint_key": extra.get("checkpoint_key"),
                    "attempt": extra.get("attempt"),
                    "rows": extra.get("rows"),
                    "files": extra.get("files"),
                    "source_run_id": event.source_run_id,
                }
            )
            log.info(
                "new commit of %s: checkpoint %s (attempt %s), %s rows in %s files, from run %s",
                extra.get("pipeline"),
                extra.get("checkpoint_key"),
                extra.get("attempt"),
                extra.get("rows"),
                extra.get("files"),
                event.source_run_id,
            )
        return commits

    report_new_commits()


# --- Per partition: runs once per newly committed partition of walsink_partitioned_example ---
# The commit task's asset event carries the run's partition key (Airflow gives an event added
# through an alias the run's partition_key), so a DAG on a PartitionedAssetTimetable runs once
# per partition that landed, with that key as its own ``partition_key``, and never for a re-run
# that changed nothing (no event). A mapper rolls partitions up, e.g. days into months:
# ``default_partition_mapper=RollupMapper(upstream_mapper=StartOfMonthMapper(input_format="%Y-%m-%d"),
# window=MonthWindow())`` runs once per month, when every day of it has committed (WaitForAll).
PARTITIONED_PIPELINE = "delta_partitioned_events"
PARTITIONED_ASSET = target_asset(
    PARTITIONED_PIPELINE,
    f"delta://{default_example_home()}/target/{PARTITIONED_PIPELINE}?create_table=true",
)

try:
    from airflow.sdk import PartitionedAssetTimetable
except ImportError:  # Airflow before 3.2: no partitions, so no per-partition downstream DAG
    log.warning("walsink_partitioned_downstream_example needs Airflow 3.2+ (asset partitions); not defined")
    PartitionedAssetTimetable = None  # type: ignore[assignment,misc]

if PartitionedAssetTimetable is not None:
    with DAG(
        dag_id="walsink_partitioned_downstream_example",
        description="Runs once per newly committed partition of the delta_partitioned_events pipeline",
        schedule=PartitionedAssetTimetable(assets=PARTITIONED_ASSET),
        start_date=datetime(2026, 1, 1, tzinfo=UTC),
        catchup=False,
        tags=["walsink", "example", "partitions"],
    ) as partitioned_dag:

        @task
        def report_partition(dag_run: Any = None, triggering_asset_events: Any = None) -> dict[str, Any]:
            """The partition this run is for, and what its commit published."""
            commits = [
                dict(event.extra or {})
                for event in (triggering_asset_events or {}).get(PARTITIONED_ASSET, [])
            ]
            log.info("partition %s committed: %s", dag_run.partition_key, commits)
            return {"partition_key": dag_run.partition_key, "commits": commits}

        report_partition()
