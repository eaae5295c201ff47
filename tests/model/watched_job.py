"""The write job of the model checker's ``cancel_write`` (``tests/model/spark_write.py``).

Run by the write phase's Spark Connect runner with the walsink protocol arguments, then the JSON
input of :func:`~tests.model.spark_write.stage_and_seal` and the path of a file to touch. It
stages its rows through ``CheckpointJob``, then runs a last stage that only a cancel ends (a
job still writing when its attempt stops counting); the file is touched once that stage's task
runs. Ended by an exception, the ``with`` block seals nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

from pyspark.sql import SparkSession

from airflow_provider_walsink.core.spark import CheckpointJob


def main() -> None:
    spark = SparkSession.builder.getOrCreate()
    with CheckpointJob.from_argv(spark) as job:
        data_path, running = job.args[-2:]
        data = json.loads(Path(data_path).read_text(encoding="utf-8"))
        schema = ", ".join(f"{name} {kind}" for name, kind in data["columns"])
        df = spark.createDataFrame([tuple(r) for r in data["rows"]], schema=schema).coalesce(1)
        job.stage(df, partition_by=data["partition_by"], file_format=data["file_format"])
        for partition in data["declared"]:
            job.declare_partition(partition)
        job.end_offsets = data["end_offsets"]

        def progress(stages: object = None, inflight_tasks: int = 0, **_: object) -> None:
            if inflight_tasks:
                Path(running).touch()

        spark.registerProgressHandler(progress)
        # One task: the server's other core stays free for a newer attempt's job meanwhile.
        spark.range(0, 10**13, 1, 1).selectExpr("sum(hash(id))").collect()


if __name__ == "__main__":
    main()
