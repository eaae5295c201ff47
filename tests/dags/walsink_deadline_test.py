"""The DAG of ``tests/test_e2e_commit_deadline.py``: a pipeline's commit deadline through Airflow's
own deadline alert (the one ``walsink_pipeline(commit_deadline=...)`` adds, built by the same two
functions), missed by a checkpoint held back and not by one committed in time.

``stage`` writes and seals a one-file checkpoint through the core API (the claim is about the
deadline, so no Spark job). For the run at ``HELD_DATE`` it moves the file aside, so the
checkpoint is sealed but never durable: the durability sensor waits in the triggerer, past the
deadline, until the test puts the file back. Every other run commits at once. The notifier
(``tests/deadline_notifier.py``) appends each notification to ``$AIRFLOW_HOME/deadline-calls.jsonl``
and returns only once ``$AIRFLOW_HOME/deadline-release`` exists.
Manual runs only.
"""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG, AsyncCallback, get_current_context, task

DAGS = Path(__file__).resolve().parents[2] / "dags"
sys.path.insert(0, str(DAGS))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the test tooling

from checkpoints import stage_csv_checkpoint  # noqa: E402
from deadline_notifier import RecordingNotifier  # noqa: E402
from walsink_example_common import home_template  # noqa: E402

from airflow_provider_walsink.hooks.context import actor_from_context, checkpoint_key_from_context  # noqa: E402
from airflow_provider_walsink.hooks.walsink import WalsinkHook  # noqa: E402
from airflow_provider_walsink.operators.commit import WalCommitOperator  # noqa: E402
from airflow_provider_walsink.operators.commit_deadline import (  # noqa: E402
    add_commit_deadline,
    commit_deadline_alert,
)
from airflow_provider_walsink.sensors.durable import CheckpointDurableSensor  # noqa: E402

PIPELINE = "commit_deadline"
HELD_DATE = "20260801"  # the run whose checkpoint is held back
HELD = ".held-back"
#: Long enough for the run that is not held back to commit on a busy machine, short for a test.
DEADLINE = timedelta(seconds=60)
CALLS = Path(os.environ.get("AIRFLOW_HOME", ".")) / "deadline-calls.jsonl"
#: The notifier returns once this file exists: until then, the test restarts the triggerer.
RELEASE = Path(os.environ.get("AIRFLOW_HOME", ".")) / "deadline-release"

with DAG(
    dag_id="walsink_deadline_test",
    schedule=None,
    start_date=datetime(2026, 7, 1, tzinfo=UTC),
    catchup=False,
    tags=["walsink-tests"],
) as dag:

    @task
    def stage() -> str:
        context = get_current_context()
        hook = WalsinkHook()
        store, layout = hook.get_store(), hook.get_layout()
        key = checkpoint_key_from_context(context)
        path = stage_csv_checkpoint(
            store, layout, PIPELINE, key, f"dt={key[:8]}/part-0.csv",
            actor=actor_from_context(context), partition_column="dt", durable=False,
        )  # fmt: skip
        if key.startswith(HELD_DATE):
            os.rename(path, path.with_name(HELD))  # sealed, never durable until the test lands it
        context["ti"].xcom_push(key="staging_root", value=str(layout.root))
        return key

    (
        stage()
        >> CheckpointDurableSensor(
            task_id="durable",
            pipeline=PIPELINE,
            deferrable=True,
            poke_interval=1,
            timeout=600,
            staging_root="{{ ti.xcom_pull(task_ids='stage', key='staging_root', map_indexes=-1) or '' }}",
        )
        >> WalCommitOperator(
            task_id="commit",
            pipeline=PIPELINE,
            target=f"{home_template()}/target/{PIPELINE}",
            mode="overwrite",
            partition_by=["dt"],
        )
    )

    add_commit_deadline(
        dag,
        commit_deadline_alert(
            pipeline=PIPELINE,
            commit_deadline=DEADLINE,
            callback=AsyncCallback(
                RecordingNotifier,
                kwargs={
                    "path": str(CALLS),
                    "message": "{{ walsink.pipeline }}/{{ walsink.checkpoint_key }} is {{ walsink.state }}: "
                    "{{ walsink.reason }}",
                    "hold_until": str(RELEASE),
                },
            ),
            walsink_conn_id=WalsinkHook.default_conn_name,
            checkpoint_key=None,
        ),
        PIPELINE,
    )
