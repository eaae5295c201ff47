"""Shared test fixtures: committer databases (SQLite, PostgreSQL, MariaDB), one
migrated Airflow home and one Spark session per test session.

PostgreSQL and MariaDB are reached on 127.0.0.1 (database ``test``); each test
session works in its own freshly created database, dropped at the end, so
parallel sessions never see each other's rows. Outside CI an unreachable
server skips its tests; under ``CI=true`` it fails them.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from tests.azurite_server import azurite_server  # noqa: F401 - Azurite, one per session on first use
from tests.gcs_server import gcs_server  # noqa: F401 - fake-gcs-server, one per session on first use

REPO = Path(__file__).resolve().parent.parent

# This module may be imported twice in one session (as ``conftest`` by pytest and
# as ``tests.conftest`` by a test): the session's paths must not change on the
# second import, or Airflow would be pointed at a second, unmigrated home.
# Under pytest-xdist each worker is a session of its own (its own Airflow home, databases and
# Spark session): the variables are keyed by the worker, since workers inherit the controller's
# environment.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
_SESSION_ENV = f"WALSINK_TEST_SESSION_TMP{_WORKER}"
_CREATED_HERE = _SESSION_ENV not in os.environ
if _CREATED_HERE:
    os.environ[_SESSION_ENV] = tempfile.mkdtemp(prefix=f"walsink-tests-{_WORKER}")
    os.environ[f"WALSINK_TEST_SESSION_ID{_WORKER}"] = uuid.uuid4().hex[:8]
SESSION_TMP = Path(os.environ[_SESSION_ENV])
SESSION_ID = os.environ[f"WALSINK_TEST_SESSION_ID{_WORKER}"]
os.environ["WALSINK_TEST_SESSION_ID"] = SESSION_ID  # read by test modules and child processes

# Airflow reads its configuration at import: point it at a private home first.
AIRFLOW_HOME = SESSION_TMP / "airflow-home"
AIRFLOW_HOME.mkdir(exist_ok=True)
os.environ["AIRFLOW_HOME"] = str(AIRFLOW_HOME)
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
# Every Spark driver of the session (the shared session, each task's spark-submit, through the
# Airflow stack too) is a short JVM on small data: C1 only and the serial collector start it
# with about half the CPU (12-20 s of CPU per job measured on the 2-core machine), the suite's
# largest cost; a class archive halves what is left (tests/jvm_class_archive.py). Tests only: a
# long production job wants the default JIT. Made by the controller (or a session without
# workers): xdist's workers inherit its environment.
if "SPARK_SUBMIT_OPTS" not in os.environ:
    from jvm_class_archive import class_archive_opts

    os.environ["SPARK_SUBMIT_OPTS"] = class_archive_opts("-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
    os.environ["WALSINK_TEST_SPARK_OPTS_OURS"] = "1"  # tests/test_spark_class_archive.py
# Tests run durability checks in this process: no freeze of its heap (triggers/watch.py:
# settle_heap), which would keep the cycles of every fixture alive then. The Airflow stack's
# triggerer and the cold-triggerer test run with the default.
os.environ["WALSINK_TRIGGERER_GC_FREEZE"] = "0"
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(REPO / "dags")
# A second bundle holds DAGs that exist only for tests (dag.test() needs a DAG in a bundle).
os.environ["AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST"] = json.dumps(
    [
        {
            "name": "dags-folder",
            "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
            "kwargs": {"path": str(REPO / "dags")},
        },
        {
            "name": "walsink-test-dags",
            "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
            "kwargs": {"path": str(REPO / "tests" / "dags")},
        },
    ]
)
os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = f"sqlite:///{AIRFLOW_HOME}/airflow.db"
os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "False")

# A session ended by SIGTERM (a CI time-out, `timeout`) tears down as on Ctrl-C: the session
# fixtures stop the servers, clusters and stacks they started (tests/guard.py; issue 46).
from guard import interrupt_on_sigterm  # noqa: E402 - after the environment above

interrupt_on_sigterm()

PG_ADMIN_URL = os.environ.get("WALSINK_TEST_PG_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432/test")
MYSQL_ADMIN_URL = os.environ.get("WALSINK_TEST_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/test")
BACKENDS = ["sqlite", "postgresql", "mysql"]


def _unreachable(what: str, exc: BaseException):
    from tests.helpers import missing_prerequisite

    missing_prerequisite(f"{what} is unreachable: {exc}")


def _server_database(admin_url: str, backend: str):
    """Create a private database on a server; return (url, drop)."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"walsink_t_{SESSION_ID}_{uuid.uuid4().hex[:6]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 5})
    with admin.connect() as conn:
        # The name is generated here from hex digits only; DDL cannot bind it.
        conn.execute(text(f"CREATE DATABASE {name}"))

    def drop() -> None:
        with admin.connect() as conn:
            if backend == "postgresql":
                conn.execute(
                    text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :d"),
                    {"d": name},
                )
            conn.execute(text(f"DROP DATABASE IF EXISTS {name}"))
        admin.dispose()

    url = make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    return url, drop


@pytest.fixture(scope="session")
def database_urls():
    """Lazily created private databases, one per backend, for the whole session."""
    created: dict[str, str] = {}
    drops = []
    errors: dict[str, BaseException] = {}

    def get(backend: str) -> str:
        if backend in errors:
            _unreachable(backend, errors[backend])
        if backend not in created:
            if backend == "sqlite":
                created[backend] = f"sqlite:///{SESSION_TMP}/committer-{uuid.uuid4().hex[:6]}.db"
            else:
                admin = PG_ADMIN_URL if backend == "postgresql" else MYSQL_ADMIN_URL
                try:
                    url, drop = _server_database(admin, backend)
                except Exception as exc:  # noqa: BLE001 - any connect failure
                    errors[backend] = exc
                    _unreachable(backend, exc)
                created[backend] = url
                drops.append(drop)
        return created[backend]

    yield get
    for drop in drops:
        try:
            drop()
        except Exception as exc:  # noqa: BLE001
            print(f"warning: could not drop a test database: {exc}", file=sys.stderr)


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    return request.param


@pytest.fixture
def db_url(backend, database_urls) -> str:
    """A committer database URL on each backend, migrated and emptied for this test."""

    url = database_urls(backend)
    store = _migrated_store(url)
    _empty(store)
    return url


_STORES: dict = {}


def _migrated_store(url: str):
    from airflow_provider_walsink.core.store.store import CommitterStore

    if url not in _STORES:
        _STORES[url] = CommitterStore.from_url(url)
    return _STORES[url]


def _empty(store) -> None:
    from airflow_provider_walsink.core.store.models import (
        checkpoint_table,
        consumer_group_table,
        deadline_notice_table,
        pipeline_table,
        table_archive_table,
        transition_table,
        version_table,
    )

    with store.engine.begin() as conn:
        for table in (
            transition_table,
            version_table,
            checkpoint_table,
            pipeline_table,
            consumer_group_table,
            deadline_notice_table,
            table_archive_table,
        ):
            conn.execute(table.delete())


@pytest.fixture
def store(db_url):
    return _migrated_store(db_url)


@pytest.fixture
def sqlite_store(database_urls):
    store = _migrated_store(database_urls("sqlite"))
    _empty(store)
    return store


@pytest.fixture
def pg_url(database_urls) -> str:
    url = database_urls("postgresql")
    _empty(_migrated_store(url))
    return url


@pytest.fixture(scope="session")
def pgbouncer():
    """PgBouncer in transaction mode (pool of 20) in front of the test PostgreSQL, started once per
    session on first use (``tests/pgbouncer.py``); ``pgbouncer.url(pg_url)`` reaches a database
    through it."""
    from pgbouncer import running_pgbouncer

    from tests.helpers import missing_prerequisite

    try:
        with running_pgbouncer(PG_ADMIN_URL, pool_size=20) as bouncer:
            yield bouncer
    except FileNotFoundError as exc:
        missing_prerequisite(str(exc))


@pytest.fixture
def layout(tmp_path):
    from airflow_provider_walsink.core.staging.layout import StagingLayout

    return StagingLayout(tmp_path / "staging")


@pytest.fixture(autouse=True)
def _fresh_trigger_connections():
    """Triggers trust a connection lookup for a minute in their process (``triggers/shared.py``);
    tests change connections from one test to the next, so each test's triggers look them up."""
    yield
    shared = sys.modules.get("airflow_provider_walsink.triggers.shared")
    if shared is not None:
        shared.clear()


@pytest.fixture(scope="session")
def airflow_db():
    """One migrated Airflow metadata database (SQLite in the session's Airflow home)."""
    subprocess.run(
        [sys.executable, "-m", "airflow", "db", "migrate"],
        check=True,
        capture_output=True,
        env=os.environ.copy(),
    )
    return AIRFLOW_HOME


@pytest.fixture(scope="session")
def airflow_stack():
    """A real Airflow stack (scheduler, dag-processor, triggerer, api-server) on the repo's
    ``dags/`` and ``tests/dags/`` (two bundles), with a private PostgreSQL metadata database; started once per session on
    first use, stopped at the end, logs saved under ``test-artifacts/``. See
    ``tests/airflow_stack.py``.
    """
    from airflow_stack import AirflowStack

    artifacts = REPO / "test-artifacts" / f"airflow-stack-{SESSION_ID}"
    try:
        stack = AirflowStack.create(
            SESSION_TMP / "stack",
            postgres_admin_url=PG_ADMIN_URL,
            artifacts_dir=artifacts,
            # Backfills through the REST API (what `airflow backfill create` does, minus an
            # `airflow` process start per backfill); the quickstart test keeps the page's CLI.
            backfills_via_api=True,
            # Both bundles, as for dag.test(): e2e tests may run the DAGs under tests/dags too.
            env={
                "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": os.environ[
                    "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST"
                ],
                # No periodic re-parse of unchanged files: the tests never change a DAG without
                # changing its file, and Airflow parses a new or modified file at once whatever
                # this interval (file_parsing_sort_mode modified_time). Re-parsing the ~25 files
                # every 30 s took about a fifth of one core for as long as the stack ran
                # (25 s of CPU per idle 120 s measured, 1.6 s with this setting).
                "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "3600",
                # The test tooling importable by every component: the triggerer imports a deadline
                # alert's notifier by module path (tests/deadline_notifier.py).
                "PYTHONPATH": os.pathsep.join(
                    filter(None, [str(REPO / "tests"), os.environ.get("PYTHONPATH")])
                ),
            },
        )
    except Exception as exc:  # noqa: BLE001 - any connect failure
        _unreachable("postgresql (the Airflow stack's metadata database)", exc)
    with stack:
        yield stack


def _java_available() -> bool:
    java_home = os.environ.get("JAVA_HOME")
    return bool(shutil.which("java") or (java_home and os.access(Path(java_home) / "bin" / "java", os.X_OK)))


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory):
    """The compose file's Spark master and two workers as local processes (``tests/spark_cluster.py``),
    started once per session on first use and shared by every cluster scenario."""
    from spark_cluster import SparkCluster

    from tests.helpers import missing_prerequisite

    if not _java_available():
        missing_prerequisite("Java (17) is not installed: the Spark cluster cannot start")
    cluster = SparkCluster.from_compose(
        tmp_path_factory.mktemp("spark-cluster"),
        artifacts_dir=REPO / "test-artifacts" / f"spark-cluster-{SESSION_ID}",
    )
    with cluster:
        yield cluster


@pytest.fixture(scope="session")
def spark_connect_server(tmp_path_factory):
    """A Spark Connect server from the venv's pyspark on a free loopback port over ``local[2]``
    (``tests/spark_connect_server.py``), launched once per session on first use. It boots while
    the fixtures after it set up (``url`` and ``connection_env`` wait until it serves): request it
    before ``airflow_db``."""
    from spark_connect_server import ConnectServer

    from tests.helpers import missing_prerequisite

    if not _java_available():
        missing_prerequisite("Java (17) is not installed: the Spark Connect server cannot start")
    server = ConnectServer(tmp_path_factory.mktemp("spark-connect")).launch()
    with server:
        yield server
    artifacts = REPO / "test-artifacts" / f"spark-connect-{SESSION_ID}"
    artifacts.mkdir(parents=True, exist_ok=True)
    shutil.copy(server.log_path, artifacts / server.log_path.name)


@pytest.fixture(scope="session")
def spark():
    """One local Spark session shared by every test that needs Spark."""
    pytest.importorskip("pyspark")
    from pyspark.sql import SparkSession

    # Python workers must be this interpreter (the venv's): the executors' writer imports pyarrow
    # and walsink in them, and the system python3 has neither.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    session = (
        SparkSession.builder.master("local[2]")
        .appName("walsink-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    yield session
    session.stop()
    # py4j logs "Closing down clientserver connection" from __del__ at interpreter
    # exit, after pytest has closed the stream its handler writes to.
    for name in ("py4j", "py4j.clientserver"):
        logging.getLogger(name).setLevel(logging.WARNING)


#: Fixtures that start the session's one running stack (Airflow components, the Spark cluster):
#: under ``pytest -n 4 --dist loadgroup`` every test that uses one runs on the same worker, so
#: the stack starts once while the other workers take the rest of the suite. An end-to-end test
#: that starts Airflow components of its own (the quickstart's, the lifecycle test's) runs on any
#: worker: on the stack's, it made that worker the suite's longest by a few minutes.
STACK_FIXTURES = {"airflow_stack", "spark_cluster"}


def _xdist_group(item) -> str | None:
    fixtures = set(getattr(item, "fixturenames", ()))
    if STACK_FIXTURES & fixtures:
        return "stack"
    if "spark_connect_server" in fixtures:  # one Connect server, on whichever worker
        return "connect"
    if item.path.name == "test_model_checker.py":
        # One worker runs the whole file: its last test counts what the others exercised.
        return "model"
    return None


#: The (committer database, write mode) pairs a test parametrised by both runs: every database
#: and every mode, SQLite with both (pairwise). What differs by database (locking, transactions,
#: fencing) does not differ by mode, and the modes' publish paths are the same code on each
#: database; all six pairs cost CI about 75 s for no claim the four do not prove.
#: ``WALSINK_TEST_ALL_PAIRS=1`` runs all six.
BACKEND_MODE_PAIRS = {
    ("sqlite", "append"),
    ("sqlite", "overwrite"),
    ("postgresql", "overwrite"),
    ("mysql", "append"),
}


def _outside_the_pairs(item) -> bool:
    params = getattr(getattr(item, "callspec", None), "params", {})
    backend, mode = params.get("backend"), params.get("mode")
    if backend not in BACKENDS or mode not in ("append", "overwrite"):
        return False
    return (backend, mode) not in BACKEND_MODE_PAIRS


def pytest_collection_modifyitems(config, items):
    """Keep only ``BACKEND_MODE_PAIRS`` of the tests parametrised by database and mode. Then,
    under ``--dist loadgroup``, the group as xdist's own ``xdist_group`` marker would give it:
    a ``@group`` suffix on the node id, which xdist's scheduler reads. (pytest-xdist 3.8 sets that
    suffix on ``item._nodeid``, which pytest 9 no longer reads: its node ids live in ``_id``.)"""
    if os.environ.get("WALSINK_TEST_ALL_PAIRS") != "1":
        outside = [item for item in items if _outside_the_pairs(item)]
        if outside:
            config.hook.pytest_deselected(items=outside)
            items[:] = [item for item in items if not _outside_the_pairs(item)]
    if not getattr(config.option, "loadgroup", False):  # set in xdist's workers only
        return
    for item in items:
        if (group := _xdist_group(item)) is None:
            continue
        if hasattr(item, "_id"):  # pytest >= 9
            from _pytest.nodeid import coerce_node_id

            item._id = coerce_node_id(f"{item.nodeid}@{group}")
        else:
            item._nodeid = f"{item.nodeid}@{group}"


def pytest_sessionfinish(session, exitstatus):
    for store in _STORES.values():
        store.dispose()
    if _CREATED_HERE:
        shutil.rmtree(SESSION_TMP, ignore_errors=True)


#: Each test's wall time (setup + call + teardown), appended as the session goes: the suite's
#: budget is trimmed from this file, and it is there even for a run that was stopped early.
DURATIONS_LOG = REPO / "test-artifacts" / f"durations-{SESSION_ID}.tsv"


def pytest_runtest_logreport(report):
    if not _CREATED_HERE:
        return
    if report.when == "setup":
        _TEST_SECONDS[report.nodeid] = report.duration
        return
    _TEST_SECONDS[report.nodeid] = _TEST_SECONDS.get(report.nodeid, 0.0) + report.duration
    if report.when == "teardown":
        DURATIONS_LOG.parent.mkdir(exist_ok=True)
        with DURATIONS_LOG.open("a", encoding="utf-8") as f:
            f.write(f"{_TEST_SECONDS.pop(report.nodeid):.2f}\t{report.nodeid}\n")


_TEST_SECONDS: dict[str, float] = {}
