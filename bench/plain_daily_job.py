"""Benchmark 8's baseline job: the ``walsink_daily_overwrite`` example's day, written directly.

The same read and the same columns as ``dags/walsink_jobs/daily_events_job.py``,
but no walsink: the day is written straight into ``<target>/dt=<day>`` with
Spark's own ``mode("overwrite")`` (what a team without walsink runs from a plain
``SparkSubmitOperator``: no staging, no manifest, no commit, no exactly-once).

    spark-submit plain_daily_job.py --raw <raw root> --target <table dir> --day 2026-01-01
"""

from __future__ import annotations

import argparse
import sys
from datetime import date
from pathlib import Path

# The repo's dags folder: the raw data and its schema come from the example's own helpers.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "dags"))

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from walsink_example_common import DAILY_EVENTS_DDL, ensure_daily_events  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--raw", required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--day", required=True)
    options = parser.parse_args()
    day = date.fromisoformat(options.day)
    spark = SparkSession.builder.appName("plain-daily-events").getOrCreate()
    raw = ensure_daily_events(options.raw, day)
    events = (
        spark.read.schema(DAILY_EVENTS_DDL)
        .option("header", "true")
        .csv(f"file://{raw}")
        .withColumn("ts", F.to_timestamp("ts"))
    )
    events.coalesce(1).write.mode("overwrite").parquet(f"file://{options.target}/dt={day.isoformat()}")
    spark.stop()


if __name__ == "__main__":
    main()
