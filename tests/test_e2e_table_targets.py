"""End to end on the shared Airflow stack: the Iceberg, Delta and SQL (PostgreSQL) example DAGs
run through the real scheduler, LocalExecutor, triggerer and api-server.

One interval of each, triggered together (their runs are concurrent); each table is read back
with its own library (pyiceberg, deltalake, SQLAlchemy on PostgreSQL) and checked against the
generated source: every source row once (the SQL target: every day's per-country totals once,
its marker row naming the sealed attempt). The Iceberg and Delta write tasks recorded where they
staged: inside the table (``<table>/_walsink_staging``), not the connection's root (issue 23).
Then every run is cleared from its write task, as a user re-runs a day in the UI: the write
task ends SKIPPED on the committed checkpoint (the pipelines' reprocess policy is "skip"), the
durability and commit tasks are skipped with it, and no table changes
(same snapshots, same Delta version, same SQL rows and marker).

Issue 48: the Azure example (``dags/walsink_azure_example.py``) runs with them, staging on Azurite
(``abfss://``) through its executors and committing into a Delta table on the same container, both
with the one ``wasb`` connection ``wasb_default``; that table is read back with deltalake and with
DuckDB (over deltalake's Arrow dataset: DuckDB's ``delta`` extension is not installed here and
cannot be downloaded), and its data files are the staged blobs themselves.

The stack is the session's one (``airflow_stack``); the targets are configured the way a user
would: an Airflow connection ``walsink_iceberg`` of the official Iceberg provider's type
``iceberg`` for the catalog (issue 45: an Iceberg REST catalog, the test server of
``tests/iceberg_rest.py`` on a loopback port, reached with its OAuth2 client id and secret and
nothing else) and ``walsink_sql_target`` for the PostgreSQL database (the session's private one);
the Delta table lives under the example home. The SQL catalog through a connection's extra is
what the demo and the examples' other tests run.
"""

from __future__ import annotations

import sys
import uuid
from collections import Counter, defaultdict
from datetime import date
from pathlib import Path

import pytest
import sqlalchemy as sa

from airflow_provider_walsink.core.store.store import CommitterStore
from tests.helpers import duckdb_iceberg_scan
from tests.iceberg_rest import CLIENT_ID, CLIENT_SECRET, rest_catalog  # noqa: F401

pytestmark = [pytest.mark.e2e, pytest.mark.spark, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent
DAY = date(2026, 2, 2)  # no other test on the shared stack runs these DAGs
KEY = f"{DAY:%Y%m%d}T000000Z"
ICEBERG, DELTA, SQL = "walsink_iceberg_example", "walsink_delta_example", "walsink_sql_example"
AZURE = "walsink_azure_example"
PIPELINES = {ICEBERG: "iceberg_daily_events", DELTA: "delta_daily_events", SQL: "daily_country_totals",
             AZURE: "azure_delta_events"}  # fmt: skip
WRITE_OP, COMMIT_OP = "WalWriteOperator", "WalCommitOperator"
SQL_TABLE = "daily_country_totals"


def _examples():
    sys.path.insert(0, str(REPO / "dags"))
    try:
        import walsink_example_common
    finally:
        sys.path.remove(str(REPO / "dags"))
    return walsink_example_common


def _add_connection(stack, conn_id: str, conn: dict) -> None:
    """As ``airflow connections add`` (JSON form, through the REST API); the stack is shared, so
    an existing one is replaced."""
    stack.set_connection(conn_id, conn)


def _check_events(rows: list[dict], day: date) -> None:
    """The table holds exactly the day's source events, each once."""
    want = {e["event_id"]: e for e in _examples().daily_events(day)}
    counts = Counter(r["event_id"] for r in rows)
    assert not [k for k, n in counts.items() if n > 1], "an event is in the table twice"
    assert set(counts) == set(want), (
        f"{len(set(want) - set(counts))} missing, {len(set(counts) - set(want))} extra"
    )
    for r in rows:
        e = want[r["event_id"]]
        assert (r["user_id"], r["country"], r["event_type"], r["amount_cents"]) == (
            e["user_id"],
            e["country"],
            e["event_type"],
            e["amount_cents"],
        ), r["event_id"]
        assert str(r["dt"]) == day.isoformat()


def _expected_totals(day: date) -> dict[tuple[str, str], tuple[int, int, int]]:
    events, users, amount = defaultdict(int), defaultdict(set), defaultdict(int)
    for e in _examples().daily_events(day):
        k = (e["country"], e["event_type"])
        events[k] += 1
        users[k].add(e["user_id"])
        amount[k] += e["amount_cents"]
    return {k: (events[k], len(users[k]), amount[k]) for k in events}


def _sql_rows(url: str) -> list[tuple]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return sorted(
                tuple(r)
                for r in conn.execute(
                    sa.text(
                        f"SELECT dt, country, event_type, events, users, amount_cents FROM public.{SQL_TABLE}"
                    )
                )
            )
    finally:
        engine.dispose()


def _sql_marker(url: str) -> tuple:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return tuple(
                conn.execute(
                    sa.text(
                        "SELECT attempt_id, epoch, rows, published_at FROM public.walsink_markers "
                        "WHERE pipeline = :p AND checkpoint_key = :k"
                    ),
                    {"p": PIPELINES[SQL], "k": KEY},
                ).one()
            )
    finally:
        engine.dispose()


def _azure_table(server, root: str):
    """The Azure example's Delta table, opened with deltalake's own Azure client (the account, its
    key and Azurite's endpoint: what the wasb connection holds)."""
    from deltalake import DeltaTable

    options = {"account_name": server.account, "account_key": server.key, "endpoint": server.endpoint,
               "allow_http": "true"}  # fmt: skip
    return DeltaTable(f"{root}/delta_events", storage_options=options)


def _duckdb_events(table) -> list[tuple]:
    """(event_id, amount_cents, dt) of every row, as DuckDB reads the Delta table: deltalake's Arrow
    dataset (the table's current files) scanned by DuckDB."""
    import duckdb

    with duckdb.connect() as con:
        con.register("events", table.to_pyarrow_dataset())
        return con.sql(
            "SELECT event_id, amount_cents, CAST(dt AS VARCHAR) FROM events ORDER BY event_id"
        ).fetchall()


def _duckdb_expected(day: date) -> list[tuple]:
    return sorted((e["event_id"], e["amount_cents"], day.isoformat()) for e in _examples().daily_events(day))


def _tasks_by_operator(stack, dag_id: str, run_id: str) -> dict[str, dict]:
    return {ti["operator"]: ti for ti in stack.task_instances(dag_id, run_id)}


def test_table_and_sql_examples_run_through_the_scheduler_stage_in_the_table_and_a_cleared_run_changes_nothing(
    airflow_stack,
    database_urls,
    rest_catalog,  # noqa: F811
    azurite_server,
    tmp_path,
):
    """Also what the examples' ``dag.test()`` runs proved (merged here: the same DAGs, the same
    checks, through the real scheduler): each source row once, the staging root inside the table,
    one Iceberg snapshot naming the checkpoint, Delta version 1, the SQL marker, and a committed
    day run again changing nothing."""
    from deltalake import DeltaTable

    from airflow_provider_walsink.core.targets.iceberg import IcebergPublisher

    stack = airflow_stack
    # The stack's metadata database is on PostgreSQL, so PostgreSQL is here for the SQL target too.
    target = sa.engine.make_url(database_urls("postgresql"))
    target_url = target.render_as_string(hide_password=False)
    # The Iceberg catalog: a REST catalog, configured only by an `iceberg` connection (host, client
    # id and secret), read as the Iceberg provider's IcebergHook reads it.
    rest = rest_catalog
    rest.clear()
    catalog = rest.properties()
    _add_connection(
        stack,
        "walsink_iceberg",
        {"conn_type": "iceberg", "host": rest.uri, "login": CLIENT_ID, "password": CLIENT_SECRET},
    )
    _add_connection(
        stack,
        "walsink_sql_target",
        {
            "conn_type": "postgres",
            "host": target.host,
            "port": target.port,
            "login": target.username,
            "schema": target.database,
        },
    )
    # The Azure example: its root on Azurite's container, and the one wasb connection it names.
    azure_root = azurite_server.root(f"azure-example-{uuid.uuid4().hex[:8]}")
    _add_connection(stack, "wasb_default", {"conn_type": "wasb", "host": azurite_server.endpoint,
                                            "login": azurite_server.account, "password": azurite_server.key})  # fmt: skip
    stack.set_variable("walsink_azure_example_root", azure_root)
    dag_ids = [ICEBERG, DELTA, SQL, AZURE]
    for dag_id in dag_ids:
        stack.wait_for_dag(dag_id)
        stack.unpause(dag_id)
    run_ids = {dag_id: stack.trigger(dag_id, f"{DAY.isoformat()}T00:00:00Z") for dag_id in dag_ids}
    for dag_id, run_id in run_ids.items():
        run = stack.wait_for_runs(dag_id, [run_id], timeout=900)[run_id]
        assert run["state"] == "success", (dag_id, stack.task_states(dag_id, run_id))

    store = CommitterStore.from_url(f"sqlite:///{stack.home}/walsink/committer.db", migrate=False)
    try:
        for dag_id, pipeline in PIPELINES.items():
            (checkpoint,) = store.checkpoints(pipeline)
            assert (checkpoint.checkpoint_key, checkpoint.state.value) == (KEY, "COMMITTED"), dag_id

        iceberg = IcebergPublisher(
            "examples.daily_events", "overwrite", catalog_name="walsink_iceberg", catalog_properties=catalog
        )
        table = iceberg.load_table()
        _check_events(table.scan().to_arrow().to_pylist(), DAY)
        read = duckdb_iceberg_scan(  # DuckDB's own Iceberg reader
            "SELECT event_id, amount_cents, CAST(dt AS VARCHAR) FROM iceberg_scan(?) ORDER BY event_id",
            [table.metadata_location],
        )
        assert read == [tuple(row) for row in _duckdb_expected(DAY)]
        snapshots = [(s.snapshot_id, s.summary["walsink.checkpoint"]) for s in table.snapshots()]
        assert [key for _, key in snapshots] == [KEY]  # one commit, one snapshot
        # A REST catalog names a new table's location only when it creates it (at the first
        # commit): the write task staged under the walsink connection's root, as documented, and
        # the snapshot references those files in place.
        iceberg_record = store.require(PIPELINES[ICEBERG], KEY)
        assert not iceberg_record.staging_root.startswith(table.location().removeprefix("file://"))
        assert all(t.file.file_path.startswith(Path(iceberg_record.staging_root).as_uri())
                   for t in table.scan().plan_files())  # fmt: skip
        assert not [e for e in rest.log if e.status and e.status >= 500], "the catalog answered an error"
        assert [e.status for e in rest.log if e.method == "POST" and "/tables/" in e.path] == [200]

        delta_path = stack.home / "walsink" / "examples" / "target" / "delta_daily_events"
        delta = DeltaTable(str(delta_path))
        _check_events(delta.to_pyarrow_table().to_pylist(), DAY)
        assert delta.version() == 1  # the day's one commit, after the empty table it created (version 0)
        assert store.require(PIPELINES[DELTA], KEY).staging_root == str(delta_path / "_walsink_staging")

        azure = _azure_table(azurite_server, azure_root)
        _check_events(azure.to_pyarrow_table().to_pylist(), DAY)
        assert azure.version() == 1
        azure_record = store.require(PIPELINES[AZURE], KEY)
        assert azure_record.staging_root == f"{azure_root}/delta_events/_walsink_staging"
        attempt = f"{azure_record.staging_root}/{PIPELINES[AZURE]}/{KEY}/attempt-1-{azure_record.sealed_attempt_id}/"
        assert azure.file_uris() and all(f.startswith(attempt) for f in azure.file_uris()), azure.file_uris()
        assert _duckdb_events(azure) == _duckdb_expected(DAY)

        sql_rows = _sql_rows(target_url)
        totals = {(c, t): (ev, us, am) for dt, c, t, ev, us, am in sql_rows}
        assert len(totals) == len(sql_rows), "a (country, event_type) row is in the table twice"
        assert {r[0] for r in sql_rows} == {DAY.isoformat()}
        assert totals == _expected_totals(DAY)
        marker = _sql_marker(target_url)
        assert marker[0] == store.require(PIPELINES[SQL], KEY).sealed_attempt_id

        # Re-run every day as a user would (Clear on the write task and downstream).
        for dag_id, run_id in run_ids.items():
            write = _tasks_by_operator(stack, dag_id, run_id)[WRITE_OP]
            stack.clear_task(dag_id, run_id, [write["task_id"]], include_downstream=True)
        for dag_id, run_id in run_ids.items():

            def second_tries_finished(dag_id=dag_id, run_id=run_id):
                run = next(r for r in stack.dag_runs(dag_id) if r["dag_run_id"] == run_id)
                tis = _tasks_by_operator(stack, dag_id, run_id)
                # Downstream tasks of a failed write keep try 1 (upstream_failed): the write's try decides.
                finished = run["state"] in ("success", "failed") and tis[WRITE_OP]["try_number"] >= 2
                return (run, tis) if finished else None

            run, tis = stack.wait_until(f"the cleared run of {dag_id}", second_tries_finished, timeout=900)
            assert run["state"] == "success", (dag_id, stack.task_states(dag_id, run_id))
            # The write ran once more (try 2, no retry) and ended SKIPPED: the checkpoint is committed
            # and the pipeline's reprocess policy is "skip"; the durability and commit tasks were
            # skipped with it, without running.
            assert tis[WRITE_OP]["try_number"] == 2, (dag_id, "the write needed a retry")
            assert {t["state"] for t in tis.values()} == {"skipped"}, (
                dag_id,
                stack.task_states(dag_id, run_id),
            )
            result = stack.xcom(dag_id, run_id, tis[WRITE_OP]["task_id"], key="reprocess")
            assert result["skipped_committed"] is True and result["state"] == "COMMITTED", dag_id
            assert result["decision"] == "skip", dag_id

        table = iceberg.load_table()
        assert [(s.snapshot_id, s.summary["walsink.checkpoint"]) for s in table.snapshots()] == snapshots
        _check_events(table.scan().to_arrow().to_pylist(), DAY)
        assert DeltaTable(str(delta_path)).version() == 1
        assert _azure_table(azurite_server, azure_root).version() == 1
        assert _sql_rows(target_url) == sql_rows
        assert _sql_marker(target_url) == marker
        for pipeline in PIPELINES.values():
            (checkpoint,) = store.checkpoints(pipeline)
            assert checkpoint.state.value == "COMMITTED"
    finally:
        store.dispose()
