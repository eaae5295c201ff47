"""Example: Kafka topic → Delta Lake table, exactly once, offsets following the checkpoints.

Every run is one checkpoint of the ``kafka_events`` pipeline. The write task
plans the checkpoint's ranges before the Spark job starts: for each partition
of the topic, from where the last *committed* checkpoint ended (the first run:
the earliest offset) up to the high watermark at that moment. It records them
on the checkpoint, so a retried write reads exactly the same records even
while producers keep appending. Spark's executors read those ranges with
``confluent-kafka`` (no Spark Kafka jar); the job stages them as Parquet
inside the table directory, the sensor waits until they are durable, and the
commit task adds them to the table as one Delta version (``append``; runs
commit in order, ``max_active_runs=1``). Only then are the end offsets
committed to the consumer group ``walsink_kafka_append``, so the usual lag
tools show how far the table is behind the topic (docs/kafka.md).

Set up: an Airflow connection ``kafka_default`` of type ``kafka`` whose extra
is the client configuration, e.g. ``{"bootstrap.servers": "broker:9092"}``
(plus ``security.protocol``, ``sasl.*``, ``ssl.*`` as your cluster needs), and
the topic ``walsink_events`` with JSON values ``{"event_id": ..., "user_id":
..., "amount_cents": ...}``. Copy this file, ``walsink_example_common.py`` and
``walsink_jobs/`` into any dags folder; locations are described in
``walsink_example_common``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk import DAG
from walsink_example_common import JOBS_DIR, home_template

from airflow_provider_walsink.operators.pipeline import walsink_pipeline

HOME = home_template()
TOPIC = "walsink_events"


def kafka_example_dag(
    dag_id: str, *, spark_conn_id: str | None = None, write_kwargs: Mapping[str, Any] | None = None
) -> DAG:
    """The example's DAG; the Connect cluster test builds the same DAG under its own id and Spark
    connection. Bind the result to a module-level name (the DAG is not auto-registered)."""
    with DAG(
        dag_id=dag_id,
        description="Kafka topic → Delta Lake table, each record exactly once (walsink, append mode)",
        schedule="@hourly",
        start_date=datetime(2026, 1, 1, tzinfo=UTC),
        catchup=False,
        max_active_runs=1,
        default_args={"retries": 2, "retry_delay": timedelta(seconds=10)},
        tags=["walsink", "example", "kafka", "delta"],
        doc_md=__doc__,
        auto_register=False,
    ) as dag:
        walsink_pipeline(
            "kafka_events",
            pipeline="kafka_events",
            application=str(JOBS_DIR / "kafka_events_job.py"),
            target=f"delta://{HOME}/target/kafka_events?create_table=true",
            # Stage inside the table directory: Delta adds the files by path, never copies them.
            staging_root=f"{HOME}/target/kafka_events/_walsink_staging",
            mode="append",
            partition_by=["dt"],
            source={
                "kind": "kafka",
                "conn_id": "kafka_default",  # a ``kafka`` connection: the client configuration in its extra
                "topics": [TOPIC],
                "starting": "earliest",  # the first checkpoint only; later ones start where the last ended
                "group_id": "walsink_kafka_append",  # committed after each target commit, for lag tools
                "accept_data_loss": False,  # a retention gap fails the write, naming the range
            },
            write={
                "conf": {
                    "spark.sql.shuffle.partitions": "2",
                    "spark.default.parallelism": "2",
                    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
                },
                "spark_conn_id": spark_conn_id,
                **(write_kwargs or {}),
            },
            durable={"poke_interval": 2},
        )
    return dag


dag = kafka_example_dag("walsink_kafka_append")
