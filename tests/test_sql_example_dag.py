"""``dag.test()`` of the ``walsink_sql_example`` DAG: real Spark, committer on SQLite, target on PostgreSQL.

The DAG's target connection ``walsink_sql_target`` is given the way a user
would (``AIRFLOW_CONN_WALSINK_SQL_TARGET``, type ``postgres``) and points at a
private PostgreSQL database; the table is read back and compared with the
aggregate of the generated source rows.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections import defaultdict
from datetime import UTC, date, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa

from airflow_provider_walsink.core.store.store import CommitterStore

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "dags"))

import walsink_example_common as examples  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.airflow, pytest.mark.slow]


def expected_totals(day: date) -> dict[tuple[str, str], tuple[int, int, int]]:
    events, users, amount = defaultdict(int), defaultdict(set), defaultdict(int)
    for e in examples.daily_events(day):
        k = (e["country"], e["event_type"])
        events[k] += 1
        users[k].add(e["user_id"])
        amount[k] += e["amount_cents"]
    return {k: (events[k], len(users[k]), amount[k]) for k in events}


def table_totals(url: str, day: date) -> dict[tuple[str, str], tuple[int, int, int]]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT country, event_type, events, users, amount_cents FROM public.daily_country_totals "
                    "WHERE dt = :dt"
                ),
                {"dt": day.isoformat()},
            ).all()
    finally:
        engine.dispose()
    assert len(rows) == len({(r[0], r[1]) for r in rows}), "a (country, event_type) row appears twice"
    return {(r[0], r[1]): (int(r[2]), int(r[3]), int(r[4])) for r in rows}


def test_sql_example_dag_loads_each_days_totals_once(airflow_db, monkeypatch, tmp_path, database_urls):
    from airflow.utils.state import DagRunState

    committer = database_urls("sqlite")
    target = sa.engine.make_url(database_urls("postgresql"))
    monkeypatch.setenv(
        "AIRFLOW_CONN_WALSINK_DEFAULT",
        json.dumps(
            {"conn_type": "walsink", "extra": {"url": committer, "staging_root": str(tmp_path / "s")}}
        ),
    )
    monkeypatch.setenv(
        "AIRFLOW_CONN_WALSINK_SQL_TARGET",
        json.dumps(
            {
                "conn_type": "postgres",
                "host": target.host,
                "port": target.port,
                "login": target.username,
                "schema": target.database,
            }
        ),
    )
    monkeypatch.setenv("AIRFLOW_VAR_WALSINK_EXAMPLE_HOME", str(tmp_path / "examples"))
    dag = importlib.import_module("walsink_sql_example").dag
    url = target.render_as_string(hide_password=False)
    day = date(2026, 3, 3)

    for _ in range(2):  # the second run of a committed day changes nothing
        run = dag.test(logical_date=datetime(day.year, day.month, day.day, tzinfo=UTC))
        states = {ti.task_id: ti.state for ti in run.get_task_instances()}
        assert run.state == DagRunState.SUCCESS, states
        assert table_totals(url, day) == expected_totals(day)

    store = CommitterStore.from_url(committer)
    key = f"{day:%Y%m%d}T000000Z"
    record = store.require("daily_country_totals", key)
    assert record.state.value == "COMMITTED"
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        marker = conn.execute(
            sa.text(
                "SELECT attempt_id FROM public.walsink_markers WHERE pipeline = :p AND checkpoint_key = :k"
            ),
            {"p": "daily_country_totals", "k": key},
        ).scalar_one()
    engine.dispose()
    store.dispose()
    assert marker == record.sealed_attempt_id
