"""The DAG of ``tests/test_e2e_downstream.py``'s lost-event test: a commit task whose first try
is SIGKILLed right after it records COMMITTED (crash point ``commit.after_committed``), before
Airflow records its success and with it the try's asset event.

``stage`` writes, seals and verifies a one-file checkpoint through the core API (the claim is
about the commit task, so no Spark job); manual runs only.
"""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, get_current_context, task

DAGS = Path(__file__).resolve().parents[2] / "dags"
sys.path.insert(0, str(DAGS))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the test tooling

from checkpoints import stage_csv_checkpoint  # noqa: E402
from walsink_example_common import home_template  # noqa: E402

from airflow_provider_walsink.core.faults import ENV as CRASH_AT  # noqa: E402
from airflow_provider_walsink.hooks.context import actor_from_context, checkpoint_key_from_context  # noqa: E402
from airflow_provider_walsink.hooks.walsink import WalsinkHook  # noqa: E402
from airflow_provider_walsink.operators.commit import WalCommitOperator  # noqa: E402

PIPELINE = "lost_event"


class CommitKilledOnItsFirstTry(WalCommitOperator):
    """The commit task, SIGKILLed on its first try after COMMITTED is recorded."""

    def execute(self, context: Any) -> dict[str, Any]:
        if context["ti"].try_number == 1:
            os.environ[CRASH_AT] = "commit.after_committed"
        return super().execute(context)


with DAG(
    dag_id="walsink_lost_event_test",
    schedule=None,
    start_date=datetime(2026, 7, 1, tzinfo=UTC),
    catchup=False,
    default_args={"retries": 2, "retry_delay": timedelta(seconds=2)},
    tags=["walsink-tests"],
):

    @task
    def stage() -> str:
        context = get_current_context()
        hook = WalsinkHook()
        store, layout = hook.get_store(), hook.get_layout()
        key = checkpoint_key_from_context(context)
        stage_csv_checkpoint(
            store, layout, PIPELINE, key, f"dt={key[:8]}/part-0.csv",
            actor=actor_from_context(context), partition_column="dt",
        )  # fmt: skip
        return key

    stage() >> CommitKilledOnItsFirstTry(
        task_id="commit",
        pipeline=PIPELINE,
        target=f"{home_template()}/target/{PIPELINE}",
        mode="overwrite",
        partition_by=["dt"],
    )
