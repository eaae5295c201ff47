"""The model checker's write step through a real Spark job (issue 36): ``Config.spark_write``.

The model draws the rows as always (``World.op_write``); instead of writing the Parquet files
itself, the attempt is staged and sealed by the harness's PySpark job (``tests/harness/spark_job.py``
through ``CheckpointJob``), run by spark-submit or as a Spark Connect client exactly as the fault
harness runs it, and the seal is recorded by the write operator's own ``record_seal``. Everything
after the seal (durability, commit, crashes, the checks) is the model's usual path, so a schedule
replayed with Spark writes must end as it does with the model's own.

Local staging, the one ``dt`` column, and no Kafka source (``Config`` refuses the rest).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import uuid
from pathlib import Path
from typing import Any

from airflow_provider_walsink.core import faults
from airflow_provider_walsink.core.commit.write_phase import record_seal
from airflow_provider_walsink.core.spark.args import ProtocolArgs
from airflow_provider_walsink.core.staging.resolve import as_store
from tests.harness.runner import run_spark_job

#: ``Config.spark_write`` values: spark-submit on local[1], or ``connect:<spark_connect conn id>``.
SPARK_SUBMIT = "spark-submit"
CONNECT_PREFIX = "connect:"


def stage_and_seal(
    world: Any,
    key: str,
    record: Any,
    actor: Any,
    rows: list[tuple[Any, str, int | None]],
    partitions: list[str],
    directories: dict[str, str],
    start: int | None,
    end: int | None,
) -> None:
    """Stage ``rows`` (``(dt, id, v)``) into the attempt ``record`` began, through Spark, and record
    its seal; a partition of ``partitions`` without rows is declared (replaced by nothing)."""
    cfg = world.cfg
    job_input = Path(cfg.work) / f"spark-write-{uuid.uuid4().hex}.json"
    job_input.write_text(
        json.dumps(
            {
                "rows": [[id_, v, dt] for dt, id_, v in rows],
                "columns": [["id", "string"], ["v", "bigint"], ["dt", "string"]],
                "partition_by": ["dt"],
                "file_format": "parquet",
                "declared": [directories[dt] for dt in partitions if not any(r[0] == dt for r in rows)],
                "end_offsets": {"src": end} if end is not None else None,
            }
        )
    )
    protocol = ProtocolArgs(
        pipeline=cfg.pipeline,
        checkpoint_key=key,
        sequence=record.sequence,
        attempt=record.attempt,
        attempt_id=record.attempt_id or "",
        staging_root=str(world.layout.root),
        mode=cfg.mode,
        file_format="parquet",
        partition_by=("dt",),
        start_offsets={"src": start} if start is not None else None,
    )
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    env.pop(faults.ENV, None)  # the model's crash points are for its own steps, not the job
    connect = cfg.spark_write[len(CONNECT_PREFIX) :] if cfg.spark_write.startswith(CONNECT_PREFIX) else None
    done = run_spark_job([*protocol.to_argv(), str(job_input)], connect, env)
    job_input.unlink()
    if done.returncode != 0:
        raise RuntimeError(f"the Spark write of {key} failed ({cfg.spark_write}): {done.stderr[-1500:]}")
    record_seal(world.store, as_store(world.layout), protocol, actor, log=logging.getLogger("model"))
