"""The walsink connection form and its "Test" button.

The form is declared once on the hook (``CONN_FIELDS``, ``UI_FIELD_BEHAVIOUR``);
provider info copies it and Airflow's own ProvidersManager reads it from there.
``WalsinkHook.test_connection`` is what the form's Test button calls (through
``POST /api/v2/connections/test``); it is checked against real SQLite,
PostgreSQL and MariaDB databases and real directories, for success and for
each failure it names.
"""

from __future__ import annotations

import json
import os
import uuid

import pytest
from sqlalchemy import create_engine, text

from airflow_provider_walsink.core.store.migrate import VERSION_TABLE, head_revision
from airflow_provider_walsink.get_provider_info import get_provider_info
from airflow_provider_walsink.hooks.form import CONN_FIELDS, UI_FIELD_BEHAVIOUR
from airflow_provider_walsink.hooks.versions import airflow_version
from airflow_provider_walsink.hooks.walsink import WalsinkHook

#: Every connection attribute and extra the hook reads (see WalsinkHook._load and staging_root).
FIELDS_THE_HOOK_READS = {"host", "port", "login", "password", "schema", "backend", "url", "staging_root"}


def hook_for(monkeypatch, *, extra: dict, **fields) -> WalsinkHook:
    """A hook on a real Airflow connection (from an ``AIRFLOW_CONN_*`` variable)."""
    conn_id = f"walsink_t_{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "walsink", **fields, "extra": extra})
    )
    return WalsinkHook(conn_id)


def test_the_form_shows_every_field_the_hook_reads_with_a_placeholder():
    placeholders = UI_FIELD_BEHAVIOUR["placeholders"]
    assert set(placeholders) >= FIELDS_THE_HOOK_READS
    assert all(placeholders[f].strip() for f in FIELDS_THE_HOOK_READS)
    assert "extra" in UI_FIELD_BEHAVIOUR["hidden_fields"]  # every extra has its own field instead
    assert set(CONN_FIELDS) == {"backend", "url", "staging_root", "staging_conn_id"}
    assert CONN_FIELDS["url"]["schema"]["format"] == "password"  # a URL may carry a password


def test_provider_info_is_derived_from_the_hook():
    conn = get_provider_info()["connection-types"][0]
    assert conn["conn-fields"] == CONN_FIELDS
    assert conn["ui-field-behaviour"] == {
        "hidden-fields": UI_FIELD_BEHAVIOUR["hidden_fields"],
        "relabeling": UI_FIELD_BEHAVIOUR["relabeling"],
        "placeholders": UI_FIELD_BEHAVIOUR["placeholders"],
    }
    assert conn["hook-class-name"] == f"{WalsinkHook.__module__}.{WalsinkHook.__qualname__}"
    assert (conn["connection-type"], conn["hook-name"]) == (WalsinkHook.conn_type, WalsinkHook.hook_name)
    assert WalsinkHook.get_ui_field_behaviour() == UI_FIELD_BEHAVIOUR


@pytest.mark.skipif(
    tuple(int(p) for p in airflow_version().split(".")[:2]) < (3, 2),
    reason="Airflow reads a connection form from provider info (conn-fields) since 3.2; on 3.1 the "
    "fields go in Extra as JSON (docs/production.md, 'Supported Airflow versions')",
)
def test_airflow_builds_the_form_from_provider_info():
    """Airflow's ProvidersManager (what the connection form's API serves) sees every field."""
    from airflow.providers_manager import ProvidersManager

    pm = ProvidersManager()
    behaviour = pm.field_behaviours["walsink"]
    for name in ("host", "port", "login", "password", "schema"):
        assert behaviour["placeholders"][name]
    for name in ("backend", "url", "staging_root", "staging_conn_id"):
        assert behaviour["placeholders"][f"extra__walsink__{name}"]
        assert f"extra__walsink__{name}" in pm.connection_form_widgets
    assert pm.connection_form_widgets["extra__walsink__url"].is_sensitive


def test_the_hook_reads_the_forms_fields(monkeypatch, tmp_path):
    hook = hook_for(monkeypatch, extra={"url": "sqlite:////x/y.db", "staging_root": str(tmp_path)})
    assert hook.sqlalchemy_url == "sqlite:////x/y.db" and hook.staging_root == str(tmp_path)
    # Older forms store custom fields prefixed.
    hook = hook_for(monkeypatch, extra={"extra__walsink__staging_root": str(tmp_path)}, schema="/x/z.db")
    assert hook.staging_root == str(tmp_path) and hook.sqlalchemy_url == "sqlite:////x/z.db"


# ---------------------------------------------------------------- the Test button


@pytest.mark.parametrize("backend", ["sqlite", "postgresql", "mysql"])
def test_test_connection_succeeds_on_a_migrated_database(monkeypatch, tmp_path, database_urls, backend):
    from tests.conftest import _migrated_store

    url = database_urls(backend)
    _migrated_store(url)
    hook = hook_for(monkeypatch, extra={"url": url, "staging_root": str(tmp_path / "staging")})
    ok, message = hook.test_connection()
    assert ok, message
    assert f"schema at head ({head_revision()})" in message
    assert "can be created" in message
    assert not (tmp_path / "staging").exists()  # the test changes nothing
    (tmp_path / "staging").mkdir()
    ok, message = hook.test_connection()
    assert ok and "exists and is writable" in message, message
    assert os.listdir(tmp_path / "staging") == []  # its write probe is gone


def test_test_connection_reports_an_unreachable_server(monkeypatch, tmp_path):
    # A loopback port nothing listens on.
    url = "postgresql+psycopg2://postgres@127.0.0.1:1/test"
    ok, message = hook_for(monkeypatch, extra={"url": url, "staging_root": str(tmp_path)}).test_connection()
    assert not ok and "is unreachable" in message and "127.0.0.1:1" in message, message
    assert "\n" not in message


def test_test_connection_reports_a_missing_sqlite_file_and_creates_nothing(monkeypatch, tmp_path):
    db = tmp_path / "nowhere" / "committer.db"
    ok, message = hook_for(
        monkeypatch, extra={"url": f"sqlite:///{db}", "staging_root": str(tmp_path)}
    ).test_connection()
    assert not ok and "does not exist" in message, message
    assert not db.parent.exists()


def test_test_connection_reports_a_database_without_the_schema(monkeypatch, tmp_path):
    db = tmp_path / "empty.db"
    create_engine(f"sqlite:///{db}").connect().close()  # an empty SQLite file
    ok, message = hook_for(
        monkeypatch, extra={"url": f"sqlite:///{db}", "staging_root": str(tmp_path)}
    ).test_connection()
    assert not ok and "has no walsink schema" in message, message


def test_test_connection_reports_a_schema_behind_head(monkeypatch, tmp_path):
    from tests.conftest import _migrated_store

    url = f"sqlite:///{tmp_path}/old.db"
    _migrated_store(url)
    engine = create_engine(url)
    with engine.begin() as conn:  # as if written by an older walsink
        conn.execute(text(f"UPDATE {VERSION_TABLE} SET version_num = 'older'"))
    engine.dispose()
    ok, message = hook_for(monkeypatch, extra={"url": url, "staging_root": str(tmp_path)}).test_connection()
    assert not ok and "revision older" in message and head_revision() in message, message


def test_test_connection_reports_a_missing_driver(monkeypatch, tmp_path):
    ok, message = hook_for(
        monkeypatch, extra={"url": "mssql+nosuchdriver://h/db", "staging_root": str(tmp_path)}
    ).test_connection()
    assert not ok and message.startswith("Committer database") and "nosuchdriver" in message, message


def test_test_connection_reports_a_bad_backend(monkeypatch):
    ok, message = hook_for(monkeypatch, extra={"backend": "oracle"}, host="h").test_connection()
    assert not ok and "backend must be one of" in message, message


@pytest.fixture
def migrated_sqlite(tmp_path) -> str:
    from tests.conftest import _migrated_store

    url = f"sqlite:///{tmp_path}/ok.db"
    _migrated_store(url)
    return url


def test_test_connection_reports_a_staging_root_under_a_file(monkeypatch, tmp_path, migrated_sqlite):
    (tmp_path / "file").write_text("x")
    root = tmp_path / "file" / "staging"
    ok, message = hook_for(
        monkeypatch, extra={"url": migrated_sqlite, "staging_root": str(root)}
    ).test_connection()
    assert not ok and message.startswith(f"Staging root {root}") and "is not a directory" in message, message


def test_test_connection_reports_an_unwritable_staging_root(monkeypatch, tmp_path, migrated_sqlite):
    if os.geteuid() == 0:
        root = "/proc/walsink-staging"  # not even root may create files in procfs
    else:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        root = str(locked / "staging")
    ok, message = hook_for(
        monkeypatch, extra={"url": migrated_sqlite, "staging_root": root}
    ).test_connection()
    assert not ok and "cannot be created" in message and "not writable" in message, message


@pytest.mark.parametrize("conn_type", ["postgres", "generic"])
def test_a_connection_of_another_type_is_refused_naming_it(monkeypatch, conn_type):
    """A target's postgres connection (or a generic one) named as the committer connection would
    put the committer table in the target database, or silently use the embedded default."""
    conn_id = f"walsink_t_{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{conn_id.upper()}",
        json.dumps({"conn_type": conn_type, "host": "127.0.0.1", "schema": "analytics"}),
    )
    with pytest.raises(ValueError, match=f"is of type '{conn_type}', not 'walsink'"):
        _ = WalsinkHook(conn_id).sqlalchemy_url


@pytest.mark.parametrize(
    ("scheme", "port", "user"), [("postgresql+psycopg2", 5432, "postgres"), ("mysql+pymysql", 3306, "root")]
)
def test_a_committer_database_that_does_not_exist_says_what_to_do(monkeypatch, tmp_path, scheme, port, user):
    """A task's first use of the store (hook.get_store) and the form's Test button name the
    fix: create the database, then `walsink db upgrade`; no driver exception chained."""
    from airflow_provider_walsink.core.store.errors import CommitterDatabaseError

    name = f"walsink_absent_{uuid.uuid4().hex[:8]}"
    url = f"{scheme}://{user}@127.0.0.1:{port}/{name}"
    hook = hook_for(monkeypatch, extra={"url": url, "staging_root": str(tmp_path)})
    with pytest.raises(CommitterDatabaseError) as caught:
        hook.get_store()
    message = str(caught.value)
    assert f"database {name!r} does not exist" in message and "CREATE DATABASE" in message, message
    assert f"walsink --conn-id {hook.walsink_conn_id} db upgrade" in message, message
    assert caught.value.__cause__ is None and caught.value.__suppress_context__  # no driver traceback
    ok, tested = hook.test_connection()
    assert not ok and f"database {name!r} does not exist" in tested and "db upgrade" in tested, tested


@pytest.mark.airflow
def test_a_task_on_a_committer_database_that_does_not_exist_logs_the_fix(
    airflow_db, monkeypatch, tmp_path, capfd
):
    """A real task try (dag.test): its log says what to do, not psycopg2's traceback."""
    from datetime import UTC, datetime, timedelta

    from airflow.sdk import DAG

    from airflow_provider_walsink.operators.gc import WalGarbageCollectOperator

    name = f"walsink_absent_{uuid.uuid4().hex[:8]}"
    hook = hook_for(
        monkeypatch,
        extra={"url": f"postgresql+psycopg2://postgres@127.0.0.1:5432/{name}", "staging_root": str(tmp_path)},
    )
    start = datetime(2026, 3, 1, tzinfo=UTC)
    # The DAG id of tests/dags/walsink_gc_operator_test.py: dag.test() runs DAGs a bundle holds.
    with DAG("walsink_gc_operator_test", schedule="@daily", start_date=start, catchup=False) as dag:
        WalGarbageCollectOperator(
            task_id="gc", walsink_conn_id=hook.walsink_conn_id, retention=timedelta(days=1)
        )
    capfd.readouterr()
    run = dag.test(logical_date=start)
    log = "".join(capfd.readouterr())
    assert {ti.task_id: ti.state for ti in run.get_task_instances()} == {"gc": "failed"}
    assert (
        f"database {name!r} does not exist" in log and f"--conn-id {hook.walsink_conn_id} db upgrade" in log
    )
    assert "OperationalError" not in log and "psycopg2" not in log.replace("postgresql+psycopg2", "")
