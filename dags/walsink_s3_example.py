"""Example: staging on S3 (or any S3-compatible store), committed into a Delta and an Iceberg table there.

No shared file system: each run (one day) submits two small Spark jobs whose
executors write the day's Parquet files straight into the bucket with pyarrow
(no Hadoop S3 connector, no rename) and seal a manifest there with a
conditional put; the durability sensor checks every staged object by a
listing (sizes; no download); the commit tasks add those same objects to the
tables **by reference**, one Delta version and one Iceberg snapshot per day,
each carrying the checkpoint's identity, so a re-run, a cleared task or a
backfill never adds a day twice.

Where things live (nothing secret in this file):

* **root**: the Airflow Variable ``walsink_s3_example_root`` (default
  ``s3://walsink-example/lake``); the Delta table is ``<root>/delta_events``
  and stages inside it (``<root>/delta_events/_walsink_staging``).
* **credentials**: the amazon provider's connection ``aws_default`` (type
  ``aws``: login = access key id, password = secret access key, extra
  ``region_name``, and ``endpoint_url`` for MinIO, Ceph or another
  S3-compatible store; no keys = the hosts' default credential chain). The
  staging root uses it because the walsink connection names no other
  (``staging_conn_id``), and the Delta target names it (``conn_id``).
* **Iceberg catalog**: the connection ``walsink_s3_lake`` whose extra holds the
  catalog properties, e.g. ``{"type": "sql", "uri": "postgresql+psycopg2://...",
  "warehouse": "s3://walsink-example/lake/warehouse", "s3.endpoint": ...,
  "s3.access-key-id": ..., "s3.secret-access-key": ...}``; the table stages
  inside its own location.
* **Spark**: as every example (``WALSINK_EXAMPLE_SPARK_CONN_ID``, else
  ``local[*]``); on a cluster the executors need pyarrow and walsink
  (``PYSPARK_PYTHON``). Credentials reach the job only in spark-submit's
  environment, never on its command line.

docs/production.md ("Object storage") lists the IAM permissions this needs.
``tests/test_e2e_connect_cluster.py`` runs this DAG's pipelines through the real
scheduler with the Spark Connect runner, on a Connect server over a two-worker
standalone cluster, against moto's S3 server, and
``bash scripts/cluster-demo.sh`` shows it.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk import DAG
from walsink_example_common import JOBS_DIR, spark_conn_id

from airflow_provider_walsink.operators.pipeline import walsink_pipeline

#: The amazon provider's default connection: staging and the Delta table use it.
AWS_CONN_ID = "aws_default"
#: The Iceberg catalog's connection (catalog properties in its extra).
CATALOG = "walsink_s3_lake"
ROOT = "{{ var.value.get('walsink_s3_example_root', 's3://walsink-example/lake') }}"
SPARK_CONF = {"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"}


def s3_example_dag(
    dag_id: str,
    *,
    spark_conn_id: str | None,
    walsink_conn_id: str = "walsink_default",
    conf: Mapping[str, str] | None = None,
    write_kwargs: Mapping[str, Any] | None = None,
) -> DAG:
    """The example's DAG; the cluster test builds the same DAG under its own id and Spark connection.

    Bind the result to a module-level name: the DAG is not auto-registered, so a DAG file that
    imports this builder defines only the DAG it builds, not this example's as well.
    """
    with DAG(
        dag_id=dag_id,
        description="Daily events staged on S3 → a Delta and an Iceberg table there, exactly once (walsink)",
        schedule="@daily",
        start_date=datetime(2026, 1, 1, tzinfo=UTC),
        catchup=False,
        max_active_runs=2,
        default_args={"retries": 2, "retry_delay": timedelta(seconds=10)},
        tags=["walsink", "example", "s3"],
        doc_md=__doc__,
        auto_register=False,
    ) as dag:
        common: dict[str, Any] = {
            "application": str(JOBS_DIR / "s3_events_job.py"),
            "mode": "overwrite",
            "partition_by": ["dt"],
            "walsink_conn_id": walsink_conn_id,
            "write": {
                "conf": {**SPARK_CONF, **(conf or {})},
                "spark_conn_id": spark_conn_id,
                **(write_kwargs or {}),
            },
            "durable": {"poke_interval": 2},
        }
        walsink_pipeline(
            "delta_events",
            pipeline="s3_delta_events",
            target=f"delta+{ROOT}/delta_events?create_table=true",
            target_options={"conn_id": AWS_CONN_ID},
            **common,
        )
        walsink_pipeline(
            "iceberg_events",
            pipeline="s3_iceberg_events",
            target=f"iceberg://{CATALOG}/examples.s3_events?create_table=true",
            **common,
        )
    return dag


dag = s3_example_dag("walsink_s3_example", spark_conn_id=spark_conn_id())
