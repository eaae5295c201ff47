"""The Kafka example (``dags/walsink_kafka_append.py``) built under its own id for
``tests/test_e2e_connect_cluster.py``: the same pipeline, source, target and job, run through
the Spark connection ``spark_connect_cluster`` (a Spark Connect server whose application runs
on the test's local standalone cluster, two workers)."""

from __future__ import annotations

import sys
from pathlib import Path

from airflow.sdk import DAG

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "dags"))  # the example and its helpers

from walsink_kafka_append import kafka_example_dag  # noqa: E402

DAG_ID = "walsink_kafka_connect_e2e"

dag: DAG = kafka_example_dag(DAG_ID, spark_conn_id="spark_connect_cluster")
