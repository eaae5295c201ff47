"""The S3 example (``dags/walsink_s3_example.py``) built under its own id for ``tests/test_e2e_connect_cluster.py``.

The same builder, so the same pipelines, targets and jobs as the example; only what a
deployment sets differently: the Spark connection ``spark_connect_cluster`` (a Spark Connect
server whose application runs on the test's local standalone cluster, two workers), the
committer connection ``walsink_s3_e2e`` (PostgreSQL), and the Python of the job (the
virtualenv's, which has pyarrow and walsink; the executors get walsink shipped with the session).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from airflow.sdk import DAG

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "dags"))  # the example and its helpers

from walsink_s3_example import s3_example_dag  # noqa: E402

DAG_ID = "walsink_s3_connect_e2e"

dag: DAG = s3_example_dag(
    DAG_ID,
    spark_conn_id="spark_connect_cluster",
    walsink_conn_id="walsink_s3_e2e",
    write_kwargs={
        "env_vars": {"PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])}
    },
)
