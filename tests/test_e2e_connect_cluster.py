"""Issue 36, Must show: the S3 example and the Kafka example through the real scheduler with
the Spark Connect job runner, against a Connect server whose application runs on the session's
two-worker standalone cluster (each worker its own loopback host, ``tests/spark_cluster.py``).

The server is started once for this module (``connect_on_cluster``) with the cluster as its
master; the DAGs are the examples' own builders under test ids whose write tasks name the
``spark_connect`` connection ``spark_connect_cluster`` (``tests/dags/walsink_s3_connect_test.py``,
``tests/dags/walsink_kafka_connect_test.py``). Each job file runs unchanged as a Connect client
in its write task; its Spark jobs run on the cluster's executors, which get walsink shipped with
the session.

* **S3** (issue 23's scenario, now through Connect): no shared file system between the parts
  that move data. The executors write the day's Parquet files straight into moto's S3 server
  (loopback) and the job seals the manifest there; the durability sensor (deferred, in the
  triggerer) checks the objects by listing; the commit tasks add the staged objects by
  reference to a Delta table (``delta+s3://``, credentials from the ``aws_default``
  connection) and an Iceberg table (catalog on PostgreSQL, warehouse on the bucket, from the
  connection ``walsink_s3_lake``). The committer table is on PostgreSQL. Checked, reading each
  table with its own library (deltalake, pyiceberg): every source event of the day once, the
  data files are the staged objects (nothing copied), each checkpoint recorded its ``s3://``
  staging root and was COMMITTED once.
* **Kafka** (issue 28's scenario, now through Connect): librdkafka's mock cluster in a child
  process, reached through an Airflow connection ``kafka_default`` of the official ``kafka``
  type. Two intervals run one after another: the first while a producer thread appends to the
  topic (its end, the second's start, planned under appends), then the producer stops and the
  second one drains the topic. Then the Delta table (read with deltalake) holds every produced
  record exactly once, each checkpoint started where the previous one ended, and the group's
  committed offsets (read with a plain consumer) equal the last committed checkpoint's end
  offsets.

The same examples through spark-submit: ``tests/test_example_dags.py`` (``dag.test()``), the
cluster through spark-submit: ``tests/test_cluster_e2e.py``.
"""

from __future__ import annotations

import json
import sys
import threading
import uuid
from collections import Counter
from datetime import date
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from airflow_provider_walsink.core.store.store import CommitterStore
from tests.table_fixtures import ACCESS_KEY, REGION, SECRET_KEY, s3_server  # noqa: F401

pytestmark = [pytest.mark.e2e, pytest.mark.spark, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent
DAG_ID = "walsink_s3_connect_e2e"  # tests/dags/walsink_s3_connect_test.py
#: One day (two write jobs, one per table): the claim here is the S3 path end to end on a
#: cluster; a multi-day backfill on the cluster is tests/test_cluster_e2e.py's.
DAYS = [date(2026, 5, 1)]
PIPELINES = ("s3_delta_events", "s3_iceberg_events")


def _key(day: date) -> str:
    return f"{day:%Y%m%d}T000000Z"


def _daily_events(day: date) -> list[dict]:
    sys.path.insert(0, str(REPO / "dags"))
    try:
        import walsink_example_common
    finally:
        sys.path.remove(str(REPO / "dags"))
    return walsink_example_common.daily_events(day)


def _add_connection(stack, conn_id: str, conn: dict) -> None:
    """As ``airflow connections add`` (through the REST API); the stack is shared, so an existing
    one is replaced."""
    stack.set_connection(conn_id, conn)


def _check_days(rows: list[dict], days: list[date]) -> None:
    """The table holds exactly the days' source events, each once."""
    counts = Counter((str(r["dt"]), r["event_id"]) for r in rows)
    assert not [k for k, n in counts.items() if n > 1], "an event is in the table twice"
    want = {(d.isoformat(), e["event_id"]): e for d in days for e in _daily_events(d)}
    assert set(counts) == set(want), (
        f"{len(set(want) - set(counts))} missing, {len(set(counts) - set(want))} extra"
    )
    for r in rows:
        e = want[(str(r["dt"]), r["event_id"])]
        assert (r["user_id"], r["country"], r["event_type"], r["amount_cents"]) == (
            e["user_id"], e["country"], e["event_type"], e["amount_cents"]
        ), r["event_id"]  # fmt: skip


@pytest.fixture(scope="module")
def connect_on_cluster(spark_cluster, tmp_path_factory):
    """A Spark Connect server whose Spark application runs on the session's cluster (this
    module only: it holds the cluster's cores while it lives)."""
    from spark_connect_server import ConnectServer

    server = ConnectServer(
        tmp_path_factory.mktemp("connect-on-cluster"),
        master=spark_cluster.master_url,
        conf={
            "spark.executor.memory": "512m",
            "spark.cores.max": "2",
            # As the cluster test's executors (tests/dags/walsink_cluster_test.py): C1 and the
            # serial GC start a short executor JVM with about half the CPU. Test runs only.
            "spark.executor.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
        },
    ).launch()
    with server:
        yield server


def _use_connect(stack, server) -> None:
    server.wait_ready()
    _add_connection(stack, "spark_connect_cluster", {"conn_type": "spark_connect", "host": "127.0.0.1",
                                                     "port": server.port})  # fmt: skip


def test_the_s3_example_through_spark_connect_on_a_cluster_commits_each_day_once(
    airflow_stack,
    spark_cluster,
    connect_on_cluster,
    s3_server,  # noqa: F811
    pg_url,
    capsys,
):
    from deltalake import DeltaTable
    from pyiceberg.catalog import load_catalog

    stack, cluster = airflow_stack, spark_cluster
    root = f"s3://{s3_server.bucket}/s3-example-{uuid.uuid4().hex[:8]}"
    committer = make_url(pg_url).render_as_string(hide_password=False)
    catalog = {
        "type": "sql",
        "uri": committer,
        "warehouse": f"{root}/warehouse",
        **s3_server.iceberg_properties(),
    }
    # As a user sets them up (docs/production.md, "Object storage"); the DAG names only their ids.
    _add_connection(stack, "aws_default", {
        "conn_type": "aws", "login": ACCESS_KEY, "password": SECRET_KEY,
        "extra": {"region_name": REGION, "endpoint_url": s3_server.endpoint,
                  # deltalake's commit on S3 by conditional put (the store supports it)
                  "storage_options": {"aws_conditional_put": "etag"}},
    })  # fmt: skip
    _add_connection(stack, "walsink_s3_lake", {"conn_type": "generic", "extra": catalog})
    _add_connection(stack, "walsink_s3_e2e", {"conn_type": "walsink", "extra": {"url": committer}})
    _use_connect(stack, connect_on_cluster)
    stack.set_variable("walsink_s3_example_root", root)

    store = CommitterStore.from_url(pg_url)
    try:
        stack.wait_for_dag(DAG_ID)
        stack.unpause(DAG_ID)
        backfill = stack.backfill(DAG_ID, DAYS[0].isoformat(), DAYS[-1].isoformat())
        runs = stack.wait_for_backfill(backfill, timeout=1200)
        assert {r["state"] for r in runs} == {"success"}, [(r["dag_run_id"], r["state"]) for r in runs]

        # The committer table: each pipeline's day COMMITTED once, staged on the bucket.
        for pipeline in PIPELINES:
            records = {c.checkpoint_key: c for c in store.checkpoints(pipeline, descending=False)}
            assert sorted(records) == [_key(d) for d in DAYS], (pipeline, sorted(records))
            for key, record in records.items():
                assert record.state.value == "COMMITTED", (pipeline, key, record.state)
                assert record.staging_root.startswith(f"{root}/"), record.staging_root
                assert record.staging_root.endswith("/_walsink_staging"), record.staging_root
                history = [e.to_state for e in store.history(pipeline, key)]
                assert history.count("COMMITTED") == 1, history
                assert record.write_job["runner"] == "spark_connect", record.write_job  # a Connect client
        delta_root = store.require("s3_delta_events", _key(DAYS[0])).staging_root

        # Read back with each table's own library.
        delta = DeltaTable(f"{root}/delta_events", storage_options=s3_server.delta_options())
        _check_days(delta.to_pyarrow_table().to_pylist(), DAYS)
        delta_files = list(delta.file_uris())
        assert delta_files and all(f.startswith(f"{delta_root}/") for f in delta_files), delta_files
        iceberg = load_catalog("walsink_s3_lake", **catalog).load_table("examples.s3_events")
        _check_days(iceberg.scan().to_arrow().to_pylist(), DAYS)
        iceberg_files = [t.file.file_path for t in iceberg.scan().plan_files()]
        iceberg_root = store.require("s3_iceberg_events", _key(DAYS[0])).staging_root
        assert iceberg_files and all(f.startswith(f"{iceberg_root}/") for f in iceberg_files), iceberg_files

        # Who wrote the committables: the Connect server's application on the cluster.
        _ran_on_the_cluster(cluster, connect_on_cluster)
        with capsys.disabled():
            print(f"\nS3 example through Spark Connect on {cluster.master_url}: {len(delta_files)} Delta "
                  f"and {len(iceberg_files)} Iceberg data files")  # fmt: skip

    finally:
        store.dispose()


def _ran_on_the_cluster(cluster, server) -> None:
    """The server's Spark application runs on the cluster's master, with executors on its workers."""
    (app,) = [a for a in cluster.master_status()["activeapps"] if a["name"] == "walsink-tests-connect"]
    log = server.log_path.read_text(errors="replace")
    assert cluster.master_url in log and "Granted executor ID" in log, server.log_tail()
    assert app["cores"] >= 1


# ---------------------------------------------------------------------------------------- Kafka

KAFKA_DAG_ID, PIPELINE, TOPIC, GROUP = (
    "walsink_kafka_connect_e2e",  # tests/dags/walsink_kafka_connect_test.py
    "kafka_events",
    "walsink_events",
    "walsink_kafka_append",
)


class Producer(threading.Thread):
    """Appends small batches of JSON events until stopped; remembers every acknowledged offset."""

    def __init__(self, kafka) -> None:
        super().__init__(daemon=True)
        self.kafka, self.stopped, self.acked = kafka, threading.Event(), []
        self.sent = 0

    def batch(self, n: int) -> None:
        records = [
            {"key": f"user-{(self.sent + i) % 7}".encode(), "partition": (self.sent + i) % 4,
             "value": json.dumps({"event_id": self.sent + i, "user_id": (self.sent + i) % 7,
                                  "amount_cents": 100 + i}).encode()}
            for i in range(n)
        ]  # fmt: skip
        self.acked += [(TOPIC, p, o) for p, o in self.kafka.produce(TOPIC, records)]
        self.sent += n

    def run(self) -> None:
        while not self.stopped.wait(0.5):
            self.batch(25)


@pytest.fixture(scope="module")
def kafka():
    try:
        import confluent_kafka  # noqa: F401
    except ImportError:  # the kafka extra; CI installs it, so there a missing one fails the run
        from tests.helpers import missing_prerequisite

        missing_prerequisite('confluent-kafka is not installed (pip install ".[kafka]")')
    from tests.kafka_mock import MockKafka

    cluster = MockKafka()
    yield cluster
    cluster.stop()


def test_the_kafka_example_through_spark_connect_on_a_cluster_while_a_producer_appends(
    airflow_stack, spark_cluster, connect_on_cluster, kafka
):
    from deltalake import DeltaTable

    stack = airflow_stack
    stack.set_connection("kafka_default", {"conn_type": "kafka", "extra": kafka.config})
    _use_connect(stack, connect_on_cluster)
    producer = Producer(kafka)
    producer.batch(100)  # the topic exists (4 partitions) before the first run plans
    stack.wait_for_dag(KAFKA_DAG_ID)
    stack.unpause(KAFKA_DAG_ID)
    producer.start()
    try:
        run_id = stack.trigger(KAFKA_DAG_ID, "2026-03-01T01:00:00Z")
        run = stack.wait_for_runs(KAFKA_DAG_ID, [run_id], timeout=900)[run_id]
        assert run["state"] == "success", stack.task_states(KAFKA_DAG_ID, run_id)
    finally:
        producer.stopped.set()
        producer.join()
    # The last interval drains what the producer appended meanwhile.
    run_id = stack.trigger(KAFKA_DAG_ID, "2026-03-01T02:00:00Z")
    run = stack.wait_for_runs(KAFKA_DAG_ID, [run_id], timeout=900)[run_id]
    assert run["state"] == "success", stack.task_states(KAFKA_DAG_ID, run_id)
    stack.pause(KAFKA_DAG_ID)

    store = CommitterStore.from_url(f"sqlite:///{stack.home}/walsink/committer.db", migrate=False)
    try:
        checkpoints = sorted(store.checkpoints(PIPELINE), key=lambda c: c.sequence)
        assert [c.state.value for c in checkpoints] == ["COMMITTED"] * 2
        for earlier, later in zip(checkpoints, checkpoints[1:], strict=False):
            assert later.start_offsets == earlier.end_offsets  # contiguous: nothing skipped, nothing twice
        last = checkpoints[-1].end_offsets
        # Each attempt ran as a Connect client (its session recorded on the row), not spark-submit.
        assert all(c.write_job and c.write_job["runner"] == "spark_connect" for c in checkpoints)
    finally:
        store.dispose()

    table = DeltaTable(str(stack.home / "walsink" / "examples" / "target" / "kafka_events"))
    rows = table.to_pyarrow_table(columns=["topic", "partition", "offset", "event_id"]).to_pylist()
    seen = Counter((r["topic"], r["partition"], r["offset"]) for r in rows)
    assert max(seen.values()) == 1  # nothing doubled
    assert set(seen) == set(producer.acked)  # nothing lost: every produced record, once
    assert sorted(r["event_id"] for r in rows) == list(range(producer.sent))
    assert last == {TOPIC: {str(p): high for p, (_, high) in kafka.watermarks(TOPIC).items()}}
    assert kafka.committed(GROUP, TOPIC) == {int(p): o for p, o in last[TOPIC].items()}
    _ran_on_the_cluster(spark_cluster, connect_on_cluster)
