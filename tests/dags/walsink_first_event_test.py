"""The DAG of ``tests/test_e2e_first_event.py``: the first commits of a new pipeline, finishing
at the same moment through the real scheduler and api-server.

``stage_<i>`` writes, seals and verifies a one-file checkpoint ``<ts>-<i>`` of pipeline
``first_event`` through the core API (the claim is about the commit tasks, so no Spark job).
The ``commit_<i>`` tasks commit them in parallel and then meet at a file barrier right before
they add their asset events, so their tasks finish together: the moment Airflow 3.3's
api-server fails one of two first events through an alias (``asset_alias_asset`` unique key).
Manual runs only; the target is templated, as in the examples, so the DAG registers no asset.
"""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, get_current_context, task

DAGS = Path(__file__).resolve().parents[2] / "dags"
sys.path.insert(0, str(DAGS))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the test tooling

from checkpoints import stage_csv_checkpoint  # noqa: E402
from walsink_example_common import home_template  # noqa: E402

from airflow_provider_walsink.hooks.context import actor_from_context  # noqa: E402
from airflow_provider_walsink.hooks.walsink import WalsinkHook  # noqa: E402
from airflow_provider_walsink.operators.commit import WalCommitOperator  # noqa: E402

PIPELINE = "first_event"
COMMITS = 3
#: Long enough for every commit task to get there on a loaded machine; past it, each goes on.
BARRIER_TIMEOUT = 120.0


class CommitMeetingAtABarrier(WalCommitOperator):
    """The commit task, waiting for its siblings' commits before it adds its asset event."""

    def _add_asset_event(self, context: Any, store: Any, extra: Any) -> None:
        barrier = Path(WalsinkHook().staging_root).parent / "first_event_barrier" / context["run_id"]
        barrier.mkdir(parents=True, exist_ok=True)
        (barrier / context["ti"].task_id).touch()
        deadline = time.monotonic() + BARRIER_TIMEOUT
        while len(list(barrier.iterdir())) < COMMITS and time.monotonic() < deadline:
            time.sleep(0.05)
        self.log.info("Barrier passed by %d commit tasks", len(list(barrier.iterdir())))
        super()._add_asset_event(context, store, extra)


with DAG(
    dag_id="walsink_first_event_test",
    schedule=None,
    start_date=datetime(2026, 8, 1, tzinfo=UTC),
    catchup=False,
    tags=["walsink-tests"],
):
    for i in range(COMMITS):

        @task(task_id=f"stage_{i}")
        def stage(i: int = i) -> str:
            context = get_current_context()
            hook = WalsinkHook()
            store, layout = hook.get_store(), hook.get_layout()
            key = f"{context['ts_nodash']}-{i}"
            stage_csv_checkpoint(
                store, layout, PIPELINE, key, f"part={i}/part-0.csv",
                actor=actor_from_context(context), partition_column="part",
            )  # fmt: skip
            return key

        stage() >> CommitMeetingAtABarrier(
            task_id=f"commit_{i}",
            pipeline=PIPELINE,
            checkpoint_key=f"{{{{ ts_nodash }}}}-{i}",
            target=f"{home_template()}/target/{PIPELINE}",
            mode="overwrite",
            partition_by=["part"],
        )
