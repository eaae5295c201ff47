"""``dag.test()`` of the Iceberg and Delta example DAGs with real Spark (spark-submit), committer on SQLite.

Same set-up as tests/test_example_dags.py; each test reads the table back
with its library and checks every source row is there once, then runs the
day again and checks the table did not change.
"""

from __future__ import annotations

from datetime import date

import pytest

from airflow_provider_walsink.core.staging.layout import StagingLayout
from tests.test_example_dags import committer_url, examples, load_dag, run_dag, walsink_env  # noqa: F401

pytestmark = [pytest.mark.spark, pytest.mark.airflow, pytest.mark.slow]


def _check_rows(rows: list[dict], day: date) -> None:
    expected = examples.daily_events(day)
    got = {r["event_id"]: r for r in rows}
    assert len(rows) == len(expected) == len(got)  # each source row once
    assert sum(r["amount_cents"] for r in rows) == sum(w["amount_cents"] for w in expected)
    assert {str(r["dt"]) for r in rows} == {day.isoformat()}


@pytest.mark.parametrize("committer_url", ["sqlite"], indirect=True)
def test_iceberg_example_dag(airflow_db, walsink_env, committer_url, monkeypatch, tmp_path):  # noqa: F811
    import json

    from airflow_provider_walsink.core.targets.iceberg import IcebergPublisher

    # The example's catalog is the connection walsink_iceberg (a name with none is refused).
    catalog = {
        "type": "sql",
        "uri": f"sqlite:///{tmp_path / 'iceberg-catalog.db'}",
        "warehouse": f"file://{tmp_path / 'warehouse'}",
    }
    monkeypatch.setenv("AIRFLOW_CONN_WALSINK_ICEBERG", json.dumps({"conn_type": "generic", "extra": catalog}))
    day = date(2026, 3, 3)
    dag = load_dag(airflow_db, "walsink_iceberg_example")
    run_dag(dag, day)
    key = f"{day:%Y%m%d}T000000Z"
    record = walsink_env["store"].require("iceberg_daily_events", key)
    assert record.state.value == "COMMITTED"
    publisher = IcebergPublisher(
        "examples.daily_events",
        "overwrite",
        catalog_name="walsink_iceberg",  # the SQL catalog keeps each catalog name's tables apart
        catalog_properties=catalog,
    )
    table = publisher.load_table()
    # Issue 23: the write task recorded where it staged: inside the table, not the connection's root.
    assert record.staging_root == str(StagingLayout(f"{table.location()}/_walsink_staging").root)
    _check_rows(table.scan().to_arrow().to_pylist(), day)
    snapshots = list(table.snapshots())
    assert [s.summary["walsink.checkpoint"] for s in snapshots] == [key]

    run_dag(dag, day)  # the committed day again: nothing changes
    assert list(publisher.load_table().snapshots()) == snapshots


@pytest.mark.parametrize("committer_url", ["sqlite"], indirect=True)
def test_delta_example_dag(airflow_db, walsink_env, committer_url):  # noqa: F811
    from deltalake import DeltaTable

    day = date(2026, 3, 4)
    dag = load_dag(airflow_db, "walsink_delta_example")
    run_dag(dag, day)
    key = f"{day:%Y%m%d}T000000Z"
    record = walsink_env["store"].require("delta_daily_events", key)
    assert record.state.value == "COMMITTED"
    path = walsink_env["home"] / "target" / "delta_daily_events"
    # Issue 23: the write task recorded where it staged: inside the table, not the connection's root.
    assert record.staging_root == str(path / "_walsink_staging")
    table = DeltaTable(str(path))
    _check_rows(table.to_pyarrow_table().to_pylist(), day)
    assert table.version() == 1  # version 0: the empty table created before the first commit

    run_dag(dag, day)
    assert DeltaTable(str(path)).version() == 1
