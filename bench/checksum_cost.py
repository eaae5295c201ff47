"""Where should a write phase compute committable checksums, and what does it cost?

Writes the same DataFrame with plain ``df.write.parquet`` (the baseline) and
through ``CheckpointJob.stage`` with ``checksum=None``, ``crc32`` and
``sha256`` (checksums computed in the driver right after the write, while the
files are in the page cache), and times CRC32/SHA-256 over the written files
alone. Prints figures only; never gates anything.

    .venv/bin/python bench/checksum_cost.py [rows]
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

from pyspark.sql import SparkSession

from airflow_provider_walsink.core.protocol.checksum import file_checksum
from airflow_provider_walsink.core.spark import CheckpointJob, ProtocolArgs


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 2_000_000
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    df = (
        spark.range(rows)
        .selectExpr("id", "sha2(cast(id AS string), 256) AS payload", "CAST(id % 4 AS string) AS part")
        .repartition(4)
        .cache()
    )
    df.count()
    root = Path(tempfile.mkdtemp(prefix="walsink-bench-"))
    try:
        plain = root / "plain"
        df.write.parquet(str(plain))  # warm-up: JIT, codecs
        shutil.rmtree(plain)
        baseline = timed(lambda: df.write.partitionBy("part").parquet(str(plain)))
        files = [p for p in plain.rglob("*.parquet")]
        size = sum(p.stat().st_size for p in files)
        crc = timed(lambda: [file_checksum(p, "crc32") for p in files])
        sha = timed(lambda: [file_checksum(p, "sha256") for p in files])
        print(f"{rows} rows, {len(files)} files, {size / 2**20:.1f} MiB")
        print(f"  plain df.write.parquet               {baseline:7.2f} s   (baseline)")
        print(
            f"  crc32 over the files alone           {crc:7.2f} s   {100 * crc / baseline:5.1f}% of the write"
        )
        print(
            f"  sha256 over the files alone          {sha:7.2f} s   {100 * sha / baseline:5.1f}% of the write"
        )
        for attempt, algorithm in enumerate((None, "crc32", "sha256"), start=1):
            protocol = ProtocolArgs(
                pipeline="bench", checkpoint_key="k", sequence=1, attempt=attempt,
                staging_root=str(root / "staging"), partition_by=("part",), checksum=algorithm,
            )  # fmt: skip
            job = CheckpointJob(spark, protocol)
            seconds = timed(lambda job=job: (job.stage(df), job.seal()))
            print(f"  CheckpointJob.stage+seal checksum={algorithm!s:6} {seconds:7.2f} s")
    finally:
        shutil.rmtree(root, ignore_errors=True)
        spark.stop()


if __name__ == "__main__":
    main()
