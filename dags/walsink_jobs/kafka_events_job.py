"""PySpark job of the ``walsink_kafka_append`` example: one checkpoint's Kafka records → staged rows.

The write task fixed this checkpoint's offset ranges and passes them in the
protocol arguments (the client configuration in the environment):
``KafkaSource.from_job(job)`` reads exactly those ranges in the executors and
``job.end_offsets`` records where the next checkpoint starts. The DataFrame
has Spark's Kafka source columns (``key``, ``value``, ``topic``,
``partition``, ``offset``, ``timestamp``, ``timestampType``, ``headers``), so
a job written for ``spark.read.format("kafka")`` moves over unchanged.
"""

from __future__ import annotations

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, LongType, StructField, StructType

from airflow_provider_walsink.core.sources.kafka import KafkaSource
from airflow_provider_walsink.core.spark import CheckpointJob

EVENT = StructType(
    [
        StructField("event_id", LongType()),
        StructField("user_id", IntegerType()),
        StructField("amount_cents", LongType()),
    ]
)


def main() -> None:
    spark = SparkSession.builder.appName("walsink-kafka-events").getOrCreate()
    with CheckpointJob.from_argv(spark) as job:
        source = KafkaSource.from_job(job)
        print(
            f"walsink example: reading {source.plan.records} offsets, ending at {source.end_offsets}",
            flush=True,
        )
        records = source.read(spark)
        event = F.from_json(records["value"].cast("string"), EVENT)
        rows = records.select(
            "topic",
            "partition",
            "offset",
            F.col("key").cast("string").alias("key"),
            event["event_id"].alias("event_id"),
            event["user_id"].alias("user_id"),
            event["amount_cents"].alias("amount_cents"),
            F.col("timestamp").alias("kafka_timestamp"),
            F.date_format("timestamp", "yyyy-MM-dd").alias("dt"),
        )
        job.stage(rows, partition_by=["dt"])
        job.end_offsets = source.end_offsets
    spark.stop()


if __name__ == "__main__":
    main()
