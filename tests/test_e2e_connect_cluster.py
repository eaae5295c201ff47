"""Issue 23 end to end: the S3 example through the real scheduler on the Spark standalone cluster.

No shared file system between the parts that move data: the DAG is
``dags/walsink_s3_example.py``'s, built by its own builder under the id
``walsink_s3_cluster_e2e`` (``tests/dags/walsink_s3_cluster_test.py``) and
submitted to the session's two-worker standalone cluster (each worker its own
loopback host, ``tests/spark_cluster.py``). The executors write the day's
Parquet files straight into moto's S3 server (loopback) and the job seals the
manifest there; the durability sensor (deferred, in the triggerer) checks the
objects by listing; the commit tasks add the staged objects by reference to a
Delta table (``delta+s3://``, credentials from the ``aws_default`` connection)
and an Iceberg table (catalog on PostgreSQL, warehouse on the bucket, from the
connection ``walsink_s3_lake``). The committer table is on PostgreSQL.

Checked, reading each table with its own library (deltalake, pyiceberg): every
source event of each day once, the data files are the staged objects (nothing
copied), each checkpoint recorded its ``s3://`` staging root and was COMMITTED
once. (A re-run of committed intervals is skipped by the write task before it touches
S3: proven through the scheduler by the quickstart and backfill tests, not again here.)
"""

from __future__ import annotations

import sys
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
DAG_ID = "walsink_s3_cluster_e2e"  # tests/dags/walsink_s3_cluster_test.py
#: One day (two Spark applications on the cluster, one per table): the claim here is the S3
#: path end to end on a cluster; a multi-day backfill on the cluster is tests/test_cluster_e2e.py's.
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


def test_the_s3_example_on_a_spark_cluster_through_the_scheduler_commits_each_day_once(
    airflow_stack,
    spark_cluster,
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
    _add_connection(stack, "spark_cluster", cluster.connections()["spark_cluster"])
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

        # Who wrote the committables: the cluster's executors (a Spark app id, not a local one).
        apps = {a["id"] for a in cluster.master_status()["completedapps"]}
        with capsys.disabled():
            print(f"\nS3 example on {cluster.master_url}: {len(delta_files)} Delta and "
                  f"{len(iceberg_files)} Iceberg data files, {len(apps)} applications completed")  # fmt: skip

    finally:
        store.dispose()
