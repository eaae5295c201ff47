"""The S3 example (``dags/walsink_s3_example.py``) built under its own id for ``tests/test_s3_cluster_e2e.py``.

The same builder, so the same pipelines, targets and jobs as the example; only
what a deployment sets differently: the Spark connection ``spark_cluster`` (the
test's local standalone master, two workers), the committer connection
``walsink_s3_e2e`` (PostgreSQL), and the Python of driver and executors (the
virtualenv's, which has pyarrow and walsink; in the compose image it is on PATH).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from airflow.sdk import DAG

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "dags"))  # the example and its helpers

from walsink_s3_example import s3_example_dag  # noqa: E402

DAG_ID = "walsink_s3_cluster_e2e"

dag: DAG = s3_example_dag(
    DAG_ID,
    spark_conn_id="spark_cluster",
    walsink_conn_id="walsink_s3_e2e",
    conf={
        "spark.executor.memory": "512m",
        "spark.cores.max": "2",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        # As the cluster test's executors (tests/dags/walsink_cluster_test.py): C1 and the serial
        # GC start a short executor JVM with about half the CPU. Test runs only.
        "spark.executor.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    },
    write_kwargs={
        "env_vars": {
            "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]),
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
        }
    },
)
