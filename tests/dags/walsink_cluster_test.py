"""The DAG of the cluster end-to-end test (``tests/test_cluster_e2e.py``).

Submitted through the Spark connection ``spark_cluster`` (the compose file's, mapped
to the test's local standalone master; client deploy mode) with the committer table
behind ``walsink_cluster_e2e`` (the compose file's ``walsink_default`` settings,
pointed at the test's PostgreSQL database and staging directory). Where data lives
and which checkpoint stalls come from the run's conf (``walsink_cluster``), which the
test passes to its backfill.

Spark settings, and why:
* ``cores.max=2`` and ``minRegisteredResourcesRatio=1``: a job starts once it has an
  executor on each worker (one core each), so its write tasks are spread over both;
* ``locality.wait=0s``: the workers are different hosts, and with Spark's default wait
  every short task whose shuffle input sits on one executor would queue for it, so the
  other worker would write nothing;
* ``task.maxFailures=1``: an executor killed mid-write fails the Spark job, so the
  write attempt fails and Airflow retries the task (a new attempt), which is the
  case the test is about;
* event logs in the test's directory: the test maps each committable to the executor
  and worker that wrote it from them.
"""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG

from airflow_provider_walsink.operators.pipeline import walsink_pipeline

DAG_ID = "walsink_cluster_e2e"
PIPELINE = "cluster_events"
SPARK_CONN_ID = "spark_cluster"
WALSINK_CONN_ID = "walsink_cluster_e2e"
JOB = Path(__file__).resolve().parent / "walsink_cluster_jobs" / "cluster_events_job.py"
CONF = "dag_run.conf['walsink_cluster']"
#: Test runs only (short executors, small data); a long production job wants the default JIT.
EXECUTOR_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

with DAG(
    dag_id=DAG_ID,
    schedule="@daily",
    start_date=datetime(2026, 3, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=2,
    default_args={"retries": 2, "retry_delay": timedelta(seconds=3)},
    tags=["walsink-tests"],
):
    walsink_pipeline(
        "events",
        pipeline=PIPELINE,
        application=str(JOB),
        target="{{ " + CONF + "['home'] }}/target",
        mode="overwrite",
        partition_by=["dt"],
        walsink_conn_id=WALSINK_CONN_ID,
        # spark-submit and the Python of the driver (client mode: it runs in the task) and of
        # the executors: this interpreter's, which has pyspark and the provider. (In the
        # image of docker/compose.yaml all three are on PATH.)
        write={
            "application_args": [
                "--raw",
                "{{ " + CONF + "['home'] }}/raw",
                "--stall-key",
                "{{ " + CONF + ".get('stall_key', '') }}",
                "--stall-marker-dir",
                "{{ " + CONF + "['home'] }}/stall",
                "--evidence-dir",
                "{{ " + CONF + "['home'] }}/evidence",
            ],
            "spark_conn_id": SPARK_CONN_ID,
            "conf": {
                "spark.executor.memory": "512m",
                # Standalone counts "expected" resources from spark.cores.max only.
                "spark.cores.max": "2",
                "spark.scheduler.minRegisteredResourcesRatio": "1.0",
                "spark.scheduler.maxRegisteredResourcesWaitingTime": "300s",
                "spark.task.maxFailures": "1",
                # Each worker is its own host: short tasks whose input sits on one executor (shuffle
                # output) would otherwise all wait for it (locality) and the other worker write nothing.
                "spark.locality.wait": "0s",
                "spark.sql.shuffle.partitions": "4",
                "spark.eventLog.enabled": "true",
                "spark.eventLog.dir": "{{ " + CONF + "['event_log_dir'] }}",
                # One plain JSON-lines file per application, as the test reads it.
                "spark.eventLog.rolling.enabled": "false",
                "spark.eventLog.compress": "false",
                "spark.ui.enabled": "false",
                "spark.ui.showConsoleProgress": "false",
                # The executors' JVMs as the session's drivers (SPARK_SUBMIT_OPTS, tests/conftest.py):
                # short JVMs on small data start with about half the CPU on C1 and the serial GC.
                "spark.executor.extraJavaOptions": EXECUTOR_JAVA_OPTIONS,
            },
            "env_vars": {
                "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]),
                "PYSPARK_PYTHON": sys.executable,
                "PYSPARK_DRIVER_PYTHON": sys.executable,
            },
        },
        durable={"poke_interval": 2},
    )
