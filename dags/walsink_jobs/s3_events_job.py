"""PySpark job of the ``walsink_s3_example`` and ``walsink_azure_example``: one day of events, staged
straight to object storage.

Started by WalWriteOperator with the walsink protocol arguments; no further
arguments. The day's events come from the examples' deterministic generator
(``walsink_example_common.daily_events``) in the driver, so nothing is read
from a shared file system: the only storage this job touches is the staging
root the operator gave it (``s3://...``, ``abfss://...``), written by the executors themselves
with pyarrow (the ``executors`` writer, the only one for an object store),
with the credentials the operator passed in spark-submit's environment.
"""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the dags folder: shared helpers

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from walsink_example_common import DAILY_EVENTS_DDL, daily_events  # noqa: E402

from airflow_provider_walsink.core.spark import CheckpointJob  # noqa: E402


def main() -> None:
    spark = SparkSession.builder.appName("walsink-s3-events").getOrCreate()
    with CheckpointJob.from_argv(spark) as job:
        if job.protocol.interval_start is None:
            raise SystemExit("this job needs the run's data interval (a scheduled or backfill run)")
        day = datetime.fromisoformat(job.protocol.interval_start).date()
        events = (
            spark.createDataFrame(daily_events(day), DAILY_EVENTS_DDL)
            .withColumn("ts", F.to_timestamp("ts"))
            .withColumn("dt", F.lit(day.isoformat()))
        )
        # Two tasks: on a cluster each executor writes its own share of the day to the store.
        job.stage(events.repartition(2), partition_by=["dt"], replace_partitions=[f"dt={day.isoformat()}"])
    spark.stop()


if __name__ == "__main__":
    main()
