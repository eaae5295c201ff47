"""The DAG of ``tests/test_e2e_sensor_start.py``: a deferrable durability sensor that starts in the
triggerer (``start_from_trigger``) and waits there until a held-back staged file lands.

``stage`` writes and seals a one-file checkpoint through the core API (the claim is about the
sensor, so no Spark job) and moves its file aside, so the checkpoint is sealed but not durable;
``land`` puts the file back a few seconds later, in parallel with the sensor. ``commit`` publishes
into a file target once the sensor has found the checkpoint durable. Manual runs only.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from airflow.sdk import DAG, get_current_context, task

DAGS = Path(__file__).resolve().parents[2] / "dags"
sys.path.insert(0, str(DAGS))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the test tooling

from checkpoints import stage_csv_checkpoint  # noqa: E402
from walsink_example_common import home_template  # noqa: E402

from airflow_provider_walsink.hooks.context import actor_from_context, checkpoint_key_from_context  # noqa: E402
from airflow_provider_walsink.hooks.walsink import WalsinkHook  # noqa: E402
from airflow_provider_walsink.operators.commit import WalCommitOperator  # noqa: E402
from airflow_provider_walsink.sensors.durable import CheckpointDurableSensor  # noqa: E402

PIPELINE = "sensor_start"
HELD = ".held-back"


def _staged_file(key: str) -> Path:
    hook = WalsinkHook()
    record = hook.get_store().require(PIPELINE, key)
    attempt_dir = hook.get_layout().attempt_dir(PIPELINE, key, record.attempt, record.attempt_id)
    return attempt_dir / f"dt={key[:8]}" / "part-0.csv"


with DAG(
    dag_id="walsink_sensor_start_test",
    schedule=None,
    start_date=datetime(2026, 7, 1, tzinfo=UTC),
    catchup=False,
    tags=["walsink-tests"],
):

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
        os.rename(path, path.with_name(HELD))  # sealed, not durable: the sensor has to wait
        context["ti"].xcom_push(key="staging_root", value=str(layout.root))
        return key

    @task
    def land(key: str) -> None:
        time.sleep(8)  # the sensor is waiting in the triggerer by now (no assertion rests on it)
        path = _staged_file(key)
        os.rename(path.with_name(HELD), path)

    key = stage()
    durable = CheckpointDurableSensor(
        task_id="durable",
        pipeline=PIPELINE,
        deferrable=True,
        start_from_trigger=True,
        poke_interval=1,
        timeout=600,
        # Rendered in the triggerer (one XCom read), as walsink_pipeline passes the write task's root.
        staging_root="{{ ti.xcom_pull(task_ids='stage', key='staging_root', map_indexes=-1) or '' }}",
    )
    key >> durable
    land(key)
    durable >> WalCommitOperator(
        task_id="commit",
        pipeline=PIPELINE,
        target=f"{home_template()}/target/{PIPELINE}",
        mode="overwrite",
        partition_by=["dt"],
    )
