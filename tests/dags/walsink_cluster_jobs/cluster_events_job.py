"""PySpark job of the cluster end-to-end test (``tests/test_cluster_e2e.py``).

The example's daily events (``dags/walsink_example_common.daily_events``), staged as
partition ``dt=<day>`` in ``--files`` Parquet files, so that the write stage has
several tasks and the executors of both workers write some of them.

``--stall-key KEY --stall-marker-dir DIR``: in the first attempt of checkpoint KEY,
the write task of partition 0 writes half of its rows, records its process id in
``DIR/stalled-<pid>`` and sleeps, so the test can kill that executor's JVM mid-write.

``--evidence-dir DIR``: after the manifest is sealed, a copy of it goes to
``DIR/<checkpoint>-a<attempt>.manifest.json``. The commit deletes the staged
manifest; the copy keeps each committable's ``writer`` lineage (``<app id>/task-<n>``)
for the test, which checks the copy's digest against the committer table.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from datetime import datetime
from pathlib import Path

# The example's shared helpers (raw data) live in the repository's dags folder.
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "dags"))

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType  # noqa: E402
from walsink_example_common import ensure_daily_events  # noqa: E402

from airflow_provider_walsink.core.spark import CheckpointJob, hadoop_uri  # noqa: E402

RAW_SCHEMA = StructType(
    [
        StructField("event_id", StringType(), False),
        StructField("ts", StringType(), False),
        StructField("user_id", IntegerType(), False),
        StructField("country", StringType(), False),
        StructField("event_type", StringType(), False),
        StructField("amount_cents", LongType(), False),
    ]
)
STALL_SECONDS = 600  # far longer than the test waits: only a kill ends it


def stall_partition_zero(marker_dir: str):
    """An Arrow map that, in partition 0's first task attempt, yields half its rows and stalls."""

    def run(batches):
        from pyspark import TaskContext

        ctx = TaskContext.get()
        stall = ctx.partitionId() == 0 and ctx.attemptNumber() == 0
        for i, batch in enumerate(batches):
            if stall and i == 0:
                half = batch.num_rows // 2
                yield batch.slice(0, half)
                marker = Path(marker_dir) / f"stalled-{os.getpid()}"
                tmp = marker.with_name(marker.name + ".tmp")
                tmp.write_text(str(os.getpid()))
                os.replace(tmp, marker)
                time.sleep(STALL_SECONDS)
                yield batch.slice(half)
            else:
                yield batch

    return run


def main() -> None:
    spark = SparkSession.builder.appName("walsink-cluster-events").getOrCreate()
    with CheckpointJob.from_argv(spark) as job:
        parser = argparse.ArgumentParser()
        parser.add_argument("--raw", required=True)
        parser.add_argument("--files", type=int, default=4)
        parser.add_argument("--stall-key", default="")
        parser.add_argument("--stall-marker-dir", default="")
        parser.add_argument("--evidence-dir", default="")
        options = parser.parse_args(job.args)
        day = datetime.fromisoformat(job.protocol.interval_start).date()
        raw = ensure_daily_events(options.raw, day)
        events = (
            spark.read.schema(RAW_SCHEMA)
            .option("header", "true")
            .csv(hadoop_uri(raw))
            .withColumn("ts", F.to_timestamp("ts"))
            .withColumn("dt", F.lit(day.isoformat()))
            .repartition(options.files)
        )
        if options.stall_key == job.checkpoint_key and job.attempt == 1:
            events = events.mapInArrow(stall_partition_zero(options.stall_marker_dir), events.schema)
        job.stage(events, partition_by=["dt"], replace_partitions=[f"dt={day.isoformat()}"])
    if options.evidence_dir:
        sealed = job.layout.manifest_path(job.pipeline, job.checkpoint_key, job.attempt)
        evidence = Path(options.evidence_dir) / f"{job.checkpoint_key}-a{job.attempt}.manifest.json"
        evidence.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(sealed, evidence)
    spark.stop()


if __name__ == "__main__":
    main()
