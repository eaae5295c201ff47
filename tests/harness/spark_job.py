"""The harness's PySpark write job: stages one checkpoint's rows through ``CheckpointJob``.

Run by spark-submit with the walsink protocol arguments, then the path of a
JSON file ``{"rows": [[value, partition values...]], "partition_by": [...],
"declared": [...], "end_offsets": ...}``, optionally with ``"columns": [[name, Spark type]...]``
(default one string ``value`` and the partition columns) and ``"file_format"`` (default text). Crash points inside
``CheckpointJob.seal`` SIGKILL this Python driver when ``WALSINK_CRASH_AT`` says so.
"""

from __future__ import annotations

import json

from pyspark.sql import SparkSession

from airflow_provider_walsink.core.spark import CheckpointJob


def main() -> None:
    spark = SparkSession.builder.appName("walsink-harness").getOrCreate()
    with CheckpointJob.from_argv(spark) as job:
        with open(job.args[-1], encoding="utf-8") as f:
            data = json.load(f)
        columns = data.get("columns") or [["value", "string"], *([c, "string"] for c in data["partition_by"])]
        schema = ", ".join(f"{name} {kind}" for name, kind in columns)
        df = spark.createDataFrame([tuple(r) for r in data["rows"]], schema=schema).coalesce(1)
        job.stage(df, partition_by=data["partition_by"], file_format=data.get("file_format", "text"))
        for partition in data["declared"]:
            job.declare_partition(partition)
        job.end_offsets = data["end_offsets"]
    spark.stop()


if __name__ == "__main__":
    main()
