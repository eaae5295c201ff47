"""Example: staging on Azure Data Lake Storage Gen2 (``abfss://``), committed into a Delta table there.

The S3 example's shape on Azure: no shared file system; each run (one day) submits one small
Spark job whose executors write the day's Parquet files straight into the table's
``_walsink_staging`` prefix with pyarrow, and seal a manifest there with a create-only Put Blob;
the durability sensor checks every staged blob by a listing; the commit task adds those same
blobs to the Delta table **by reference**, one version per day carrying the checkpoint's
identity, so a re-run, a cleared task or a backfill never adds a day twice.

Where things live (nothing secret in this file):

* **root**: the Airflow Variable ``walsink_azure_example_root`` (default
  ``abfss://lake@walsinkexample.dfs.core.windows.net/walsink``); the Delta table is
  ``<root>/delta_events`` and stages inside it (``<root>/delta_events/_walsink_staging``).
* **credentials**: the Azure provider's connection ``wasb_default`` (type ``wasb``: login = the
  storage account, password = its key; host = the account's URL only for an emulator such as
  Azurite, ``http://host:port/<account>``), or an ``adls`` one. Staging uses it because the walsink
  connection names no other (``staging_conn_id``), and the Delta target names it (``conn_id``):
  one connection for both, nothing read from the environment.
* **Spark**: as every example (``WALSINK_EXAMPLE_SPARK_CONN_ID``, else ``local[*]``); on a cluster
  the executors need pyarrow and walsink. The account key reaches the job only in spark-submit's
  environment, never on its command line.

docs/production.md ("Object storage: Azure") says what the connection needs; the same shape on
Google Cloud Storage (``gs://``, a ``google_cloud_platform`` connection) is documented there too.
``tests/test_e2e_table_targets.py`` runs this DAG through the real scheduler against Azurite and
reads the table back with deltalake and DuckDB.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from airflow.sdk import DAG
from walsink_example_common import JOBS_DIR, spark_conn_id

from airflow_provider_walsink.operators.pipeline import walsink_pipeline

#: The Azure provider's default connection: staging and the Delta table use it.
AZURE_CONN_ID = "wasb_default"
ROOT = "{{ var.value.get('walsink_azure_example_root', 'abfss://lake@walsinkexample.dfs.core.windows.net/walsink') }}"

with DAG(
    dag_id="walsink_azure_example",
    description="Daily events staged on ADLS Gen2 → a Delta table there, exactly once (walsink)",
    schedule="@daily",
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=2,
    default_args={"retries": 2, "retry_delay": timedelta(seconds=10)},
    tags=["walsink", "example", "azure"],
    doc_md=__doc__,
) as dag:
    walsink_pipeline(
        "delta_events",
        pipeline="azure_delta_events",
        # The S3 example's job: it stages to whatever store the write task gives it.
        application=str(JOBS_DIR / "s3_events_job.py"),
        target=f"delta+{ROOT}/delta_events?create_table=true",
        target_options={"conn_id": AZURE_CONN_ID},
        mode="overwrite",
        partition_by=["dt"],
        write={
            "conf": {"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"},
            "spark_conn_id": spark_conn_id(),
        },
        durable={"poke_interval": 2},
    )
