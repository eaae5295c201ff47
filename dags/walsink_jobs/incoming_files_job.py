"""PySpark job of the ``walsink_incremental_append`` example: new input files → appended rows.

The source offset is the name of the last input file a committed checkpoint
consumed (``{"incoming": "<file name>"}``); files sort in arrival order. The
job reads every landed file after the start offset, stages their records,
and records the last file as the end offset. Offsets advance only when the
checkpoint commits, so a failed or retried attempt re-reads exactly the same
files and the next checkpoint starts exactly after them.

Started with the walsink protocol arguments, then ``--incoming <dir>``.
Setting ``WALSINK_EXAMPLE_FAIL_AFTER_STAGING`` to a checkpoint key (or ``*``)
makes the first attempt of that checkpoint fail after its data is staged: a
demonstration (and test) of a write task retried after a partial write.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the dags folder: shared helpers

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from pyspark.sql.types import IntegerType, StringType, StructField, StructType  # noqa: E402
from walsink_example_common import files_after  # noqa: E402

from airflow_provider_walsink.core.spark import CheckpointJob, hadoop_uri  # noqa: E402

SCHEMA = StructType(
    [
        StructField("file", StringType(), False),
        StructField("line", IntegerType(), False),
        StructField("user_id", IntegerType(), False),
        StructField("value", IntegerType(), False),
    ]
)


def main() -> None:
    spark = SparkSession.builder.appName("walsink-incoming-files").getOrCreate()
    with CheckpointJob.from_argv(spark) as job:
        parser = argparse.ArgumentParser()
        parser.add_argument("--incoming", required=True)
        options = parser.parse_args(job.args)
        last = (job.start_offsets or {}).get("incoming")
        names = files_after(options.incoming, last)
        until = (job.until_offsets or {}).get("incoming")
        if until is not None:  # a reprocess re-reads exactly the input of the version it replaces
            names = [n for n in names if n <= until]
        print(f"walsink example: start offset {last!r}, {len(names)} new file(s): {names}", flush=True)
        if names:
            paths = [hadoop_uri(Path(options.incoming) / n) for n in names]
            records = (
                spark.read.schema(SCHEMA)
                .json(paths)
                # events-20260101T000000-00.jsonl -> dt=2026-01-01
                .withColumn("dt", F.to_date(F.substring("file", 8, 8), "yyyyMMdd").cast("string"))
            )
            job.stage(records.coalesce(1), partition_by=["dt"])
        job.end_offsets = {"incoming": names[-1] if names else (until or last)}
        injected = os.environ.get("WALSINK_EXAMPLE_FAIL_AFTER_STAGING")
        if injected in ("*", job.checkpoint_key) and job.attempt == 1:
            raise RuntimeError(f"injected failure after staging attempt {job.attempt} (demonstration)")
    spark.stop()


if __name__ == "__main__":
    main()
