"""PySpark job of the ``walsink_daily_overwrite`` example: one day of raw events → one partition.

Started by WalWriteOperator with the walsink protocol arguments, then
``--raw <raw root>``. Reads the day's raw CSV (generating it on first use),
types the columns, and stages the day as partition ``dt=<day>`` of a Parquet
table; the commit replaces that partition, so re-running a day never
duplicates it. The day is the run's data interval start, or, for a partitioned
run (``walsink_partitioned_example``: keys ``%Y-%m-%d``), its partition key.
"""

from __future__ import annotations

import argparse
import sys
from datetime import date, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the dags folder: shared helpers

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


def main() -> None:
    spark = SparkSession.builder.appName("walsink-daily-events").getOrCreate()
    with CheckpointJob.from_argv(spark) as job:
        parser = argparse.ArgumentParser()
        parser.add_argument("--raw", required=True)
        options = parser.parse_args(job.args)
        if job.protocol.partition_key is not None:
            day = date.fromisoformat(job.protocol.partition_key)  # the pipeline declares "%Y-%m-%d"
        elif job.protocol.interval_start is not None:
            day = datetime.fromisoformat(job.protocol.interval_start).date()
        else:
            raise SystemExit(
                "this job needs the run's data interval or partition (a scheduled or backfill run)"
            )
        raw = ensure_daily_events(options.raw, day)
        events = (
            spark.read.schema(RAW_SCHEMA)
            .option("header", "true")
            .csv(hadoop_uri(raw))
            .withColumn("ts", F.to_timestamp("ts"))
            .withColumn("dt", F.lit(day.isoformat()))
        )
        # A few thousand rows: one file per day is the right size.
        job.stage(events.coalesce(1), partition_by=["dt"], replace_partitions=[f"dt={day.isoformat()}"])
    spark.stop()


if __name__ == "__main__":
    main()
