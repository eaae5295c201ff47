"""PySpark job of the ``walsink_sql_example`` DAG: one day of raw events → per-country totals.

Started by WalWriteOperator with the walsink protocol arguments, then
``--raw <raw root>``. Reads the day's raw CSV (the same generated events as
the ``walsink_daily_overwrite`` example), aggregates them per country and
event type, and stages the result as partition ``dt=<day>``. The commit loads
it into a PostgreSQL table in one transaction with its marker row, replacing
the day's rows, so re-running a day never duplicates it.
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the dags folder: shared helpers

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType  # noqa: E402
from walsink_example_common import ensure_daily_events  # noqa: E402

from airflow_provider_walsink.core.spark import CheckpointJob, hadoop_uri  # noqa: E402

#: The raw events' columns (walsink_example_common.DAILY_COLUMNS), typed.
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


def main() -> None:
    spark = SparkSession.builder.appName("walsink-daily-totals").getOrCreate()
    with CheckpointJob.from_argv(spark) as job:
        parser = argparse.ArgumentParser()
        parser.add_argument("--raw", required=True)
        options = parser.parse_args(job.args)
        if job.protocol.interval_start is None:
            raise SystemExit("this job needs the run's data interval (a scheduled or backfill run)")
        day = datetime.fromisoformat(job.protocol.interval_start).date()
        raw = ensure_daily_events(options.raw, day)
        totals = (
            spark.read.schema(RAW_SCHEMA)
            .option("header", "true")
            .csv(hadoop_uri(raw))
            .groupBy("country", "event_type")
            .agg(
                F.count(F.lit(1)).alias("events"),
                F.countDistinct("user_id").alias("users"),
                F.sum("amount_cents").alias("amount_cents"),
            )
            .withColumn("dt", F.lit(day.isoformat()))
        )
        # A few dozen rows: one file. An interval with no events still replaces its day.
        job.stage(totals.coalesce(1), partition_by=["dt"], replace_partitions=[f"dt={day.isoformat()}"])
    spark.stop()


if __name__ == "__main__":
    main()
