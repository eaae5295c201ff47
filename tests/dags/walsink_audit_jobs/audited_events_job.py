"""PySpark job of the pipeline in ``walsink_audit_test.py``: one day of events as partition ``dt=<day>``.

1,000 rows a day. On even days of the month three rows (ids 10, 500 and 990)
carry no ``user_id``, which the pipeline's audit (``not_null(user_id)``)
rejects; odd days are clean. Deterministic, so a test knows what to expect.
"""

from __future__ import annotations

from datetime import datetime

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from airflow_provider_walsink.core.spark import CheckpointJob

ROWS = 1000
NULL_IDS = (10, 500, 990)


def main() -> None:
    spark = SparkSession.builder.appName("walsink-audited-events").getOrCreate()
    with CheckpointJob.from_argv(spark) as job:
        day = datetime.fromisoformat(job.protocol.interval_start).date()
        no_user = F.col("id").isin(*NULL_IDS) if day.day % 2 == 0 else F.lit(False)
        events = (
            spark.range(ROWS)
            .withColumn("user_id", F.when(no_user, F.lit(None)).otherwise(F.col("id") + 1000).cast("long"))
            .withColumn("amount_cents", (F.col("id") * 7) % 500)
            .withColumn("dt", F.lit(day.isoformat()))
        )
        job.stage(events.coalesce(1), partition_by=["dt"], replace_partitions=[f"dt={day.isoformat()}"])
    spark.stop()


if __name__ == "__main__":
    main()
