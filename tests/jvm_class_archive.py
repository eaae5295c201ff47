"""A class-data-sharing archive of the classes a Spark driver loads, for the test session's JVMs.

Starting a Spark driver is the suite's largest cost: every test's spark-submit, the shared
session, the Airflow stack's write tasks and the Spark Connect servers each load about 20,000
classes from Spark's jars and verify them. A dynamic CDS archive (JDK 13+,
``-XX:ArchiveClassesAtExit``) made once from a small job lets every later driver map those
classes instead: measured on the 2-core machine, a small spark-submit went from 7.3 s to 3.9 s
of CPU (7.0 s to 3.5 s of wall). The archive is made once per virtual environment (about 20 s),
under ``<sys.prefix>/share/walsink-tests``, keyed by the JDK, Spark's jars and the JVM flags, so
a new JDK or Spark makes a new one.

Tests only, like the JIT flags beside it (``conftest.py``): a JVM refuses an archive that does not
match its class path and runs without it, and ``-Xlog:cds=off`` keeps it from saying so on the
output a test may read (a task log, a command's stdout).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

#: The job whose loaded classes go into the archive: what most test drivers do (a session, a
#: DataFrame written and read back as files, a SQL query).
_JOB = """
from pyspark.sql import SparkSession
spark = SparkSession.builder.master("local[2]").appName("walsink-class-archive").getOrCreate()
path = __import__("sys").argv[1]
df = spark.range(100).selectExpr("id", "cast(id as string) as s", "current_date() as d")
df.write.mode("overwrite").partitionBy("d").parquet(path + "/parquet")
df.write.mode("overwrite").csv(path + "/csv")
df.write.mode("overwrite").json(path + "/json")
spark.read.parquet(path + "/parquet").createOrReplaceTempView("t")
spark.sql("select d, count(*), max(s) from t group by d").collect()
spark.stop()
"""

#: Keeps a JVM that cannot use the archive (another class path) from printing a warning.
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def _key(spark_home: Path, java_opts: str) -> str:
    java = subprocess.run(["java", "-version"], capture_output=True, text=True, check=True).stderr
    jars = sorted((p.name, p.stat().st_size) for p in (spark_home / "jars").glob("*.jar"))
    return hashlib.sha256(repr((java, jars, java_opts)).encode()).hexdigest()[:16]


def class_archive_opts(java_opts: str) -> str:
    """``java_opts`` with a class archive added, made now if this environment has none; or
    ``java_opts`` unchanged (and why printed) if one cannot be made."""
    try:
        from pyspark.find_spark_home import _find_spark_home

        spark_home = Path(_find_spark_home())
        archive = Path(sys.prefix) / "share" / "walsink-tests" / f"spark-{_key(spark_home, java_opts)}.jsa"
        if not archive.exists():
            archive.parent.mkdir(parents=True, exist_ok=True)
            _make(archive, spark_home, java_opts)
    except Exception as exc:  # noqa: BLE001 - a slower session, never a failed one
        print(f"walsink tests: Spark drivers start without a class archive ({exc})", file=sys.stderr)
        return java_opts
    return f"{java_opts} -XX:SharedArchiveFile={archive} {QUIET}"


def _make(archive: Path, spark_home: Path, java_opts: str) -> None:
    print(f"walsink tests: making the Spark drivers' class archive once ({archive})", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="walsink-class-archive-") as tmp:
        job = Path(tmp) / "job.py"
        job.write_text(_JOB)
        # Made under a name of its own, then moved: two sessions may make one at once.
        made = archive.with_name(f"{archive.name}.{os.getpid()}.tmp")
        env = {
            **os.environ,
            "SPARK_SUBMIT_OPTS": f"{java_opts} -XX:ArchiveClassesAtExit={made} {QUIET}",
            "PYSPARK_PYTHON": sys.executable,
            "SPARK_LOCAL_IP": "127.0.0.1",
        }
        submit = spark_home / "bin" / "spark-submit"
        done = subprocess.run(
            [str(submit), "--conf", "spark.ui.enabled=false", str(job), f"{tmp}/out"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode != 0 or not made.exists():
            made.unlink(missing_ok=True)
            raise RuntimeError(f"spark-submit exited {done.returncode}: {done.stderr[-500:]}")
        os.replace(made, archive)
