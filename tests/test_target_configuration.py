"""A target that names something not configured is refused, never replaced by a default
(issue 22, symptom 10); the documented defaults that remain are named in the log.

The write task refuses before the job is submitted (a real ``dag.test()`` run whose
spark-submit is a stand-in that starts the job with Python, so no Spark starts and a job
that runs leaves a mark); the commit task refuses too; each kind's resolution is checked
with Airflow's own connection lookup (connections from ``AIRFLOW_CONN_*``).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import pytest

from airflow_provider_walsink.core.staging import StagingLayout
from airflow_provider_walsink.core.targets.registry import TargetError, TargetOptions, resolve_target
from airflow_provider_walsink.hooks.connections import airflow_connection_fields
from tests.helpers import REPO

DAY = datetime(2026, 5, 4, tzinfo=UTC)
KEY = "20260504T000000Z"

JOB = textwrap.dedent(
    """
    import sys
    open(sys.argv[-1], "w").write("the job ran")
    """
)
SPARK_SUBMIT = textwrap.dedent(
    """\
    #!{python}
    import os, sys
    open({mark!r}, "w").write("spark-submit ran")
    args = sys.argv[1:]
    os.execv(sys.executable, [sys.executable, *args[args.index({app!r}):]])
    """
)


@pytest.fixture
def home(monkeypatch, tmp_path):
    """The worker's home directory: where the embedded Iceberg catalog used to be created."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("WALSINK_ICEBERG_HOME", raising=False)
    return home


@pytest.fixture
def walsink_conn(monkeypatch, sqlite_store, database_urls, tmp_path):
    url = database_urls("sqlite")
    monkeypatch.setenv(
        "AIRFLOW_CONN_WALSINK_TC_TEST",
        json.dumps(
            {"conn_type": "walsink", "extra": {"url": url, "staging_root": str(tmp_path / "staging")}}
        ),
    )
    return sqlite_store


def write_dag(tmp_path, target: str | None, walsink_conn_id: str = "walsink_tc_test", **kwargs):
    """A write task whose stand-in spark-submit marks ``submitted`` and runs the job, which marks
    ``ran`` (both under ``tmp_path``), so a test sees whether anything was started."""
    from airflow.sdk import DAG

    from airflow_provider_walsink.operators.write import WalWriteOperator

    job = tmp_path / "job.py"
    job.write_text(JOB)
    submit = tmp_path / "spark-submit"
    submit.write_text(
        SPARK_SUBMIT.format(python=sys.executable, app=str(job), mark=str(tmp_path / "submitted"))
    )
    submit.chmod(submit.stat().st_mode | stat.S_IXUSR)
    with DAG("walsink_write_operator_test", schedule="@daily", start_date=DAY, catchup=False) as dag:
        WalWriteOperator(
            task_id="write",
            application=str(job),
            application_args=[str(tmp_path / "ran")],
            pipeline="events",
            target=target,
            walsink_conn_id=walsink_conn_id,
            env_vars={"PYTHONPATH": os.pathsep.join(sys.path)},
            **{"spark_binary": str(submit), **kwargs},  # spark_binary=None: a runner without one
        )
    return dag


@contextmanager
def module_log(name: str) -> Iterator[list[logging.LogRecord]]:
    """The INFO records of logger ``name``, captured on the logger itself: an earlier test's logging
    configuration (Airflow's dictConfig in dag.test or the CLI) may have disabled it or stopped its
    propagation to the root logger, where caplog listens."""
    logger = logging.getLogger(name)
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = records.append  # type: ignore[method-assign]
    saved = (logger.level, logger.disabled)
    logger.setLevel(logging.INFO)
    logger.disabled = False
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.disabled = saved[1]


@pytest.mark.airflow
@pytest.mark.parametrize(
    "target, missing",
    [
        ("iceberg://lake/sales.orders?create_table=true", "Iceberg catalog 'lake' is not configured"),
        ("sql://no_such_db/public.daily_totals", "connection 'no_such_db' does not exist"),
    ],
)
def test_the_write_task_refuses_an_unconfigured_target_before_the_job_runs(
    airflow_db, walsink_conn, home, tmp_path, capfd, target, missing
):
    dag = write_dag(tmp_path, target)
    capfd.readouterr()
    dr = dag.test(logical_date=DAY)
    states = {ti.task_id: ti.state for ti in dr.get_task_instances()}
    assert not (tmp_path / "ran").exists()  # the job was never submitted
    assert states == {"write": "failed"}
    assert missing in capfd.readouterr().out
    assert walsink_conn.get_pipeline("events") is None  # nothing recorded
    assert not (home / ".walsink").exists()  # no warehouse under the worker's home


@pytest.mark.airflow
def test_the_commit_task_refuses_an_unconfigured_catalog(airflow_db, walsink_conn, home, tmp_path, capfd):
    from airflow.sdk import DAG

    from airflow_provider_walsink.operators.commit import WalCommitOperator

    with DAG("walsink_commit_operator_test", schedule="@daily", start_date=DAY, catchup=False) as dag:
        WalCommitOperator(
            task_id="commit",
            pipeline="events",
            target="iceberg://lake/sales.orders?create_table=true",
            walsink_conn_id="walsink_tc_test",
        )
    capfd.readouterr()
    dr = dag.test(logical_date=DAY)
    assert {ti.task_id: ti.state for ti in dr.get_task_instances()} == {"commit": "failed"}
    out = capfd.readouterr().out
    assert "Iceberg catalog 'lake' is not configured" in out and "AIRFLOW_CONN_LAKE" in out
    assert not (home / ".walsink").exists()


def _options(tmp_path, **kwargs) -> TargetOptions:
    return TargetOptions(
        mode="overwrite",
        layout=StagingLayout(tmp_path / "staging"),
        connections=airflow_connection_fields,
        **kwargs,
    )


def test_iceberg_catalog_comes_only_from_what_is_configured(monkeypatch, home, tmp_path):
    pytest.importorskip("pyiceberg")
    # No connection: refused, naming every way to configure it.
    with pytest.raises(TargetError, match="Iceberg catalog 'lake' is not configured") as info:
        resolve_target("iceberg://lake/sales.orders", _options(tmp_path))
    for how in (
        "AIRFLOW_CONN_LAKE",
        'target_options={"catalog"',
        "PYICEBERG_CATALOG__LAKE__URI",
        "iceberg://walsink/",
    ):
        assert how in str(info.value)
    # A connection without the catalog's uri: refused, naming the property.
    monkeypatch.setenv("AIRFLOW_CONN_LAKE", json.dumps({"conn_type": "generic", "extra": {"type": "sql"}}))
    with pytest.raises(TargetError, match="'uri'"):
        resolve_target("iceberg://lake/sales.orders", _options(tmp_path))
    # pyiceberg's own configuration of the catalog is used as it is.
    monkeypatch.delenv("AIRFLOW_CONN_LAKE")
    monkeypatch.setenv("PYICEBERG_CATALOG__LAKE__URI", f"sqlite:///{tmp_path}/c.db")
    monkeypatch.setenv("PYICEBERG_CATALOG__LAKE__TYPE", "sql")
    publisher = resolve_target("iceberg://lake/sales.orders", _options(tmp_path))
    assert publisher.catalog_properties["uri"] == f"sqlite:///{tmp_path}/c.db"
    # The documented embedded catalog is chosen by its name only, and said so.
    with module_log("airflow_provider_walsink.core.targets.iceberg") as records:
        publisher = resolve_target("iceberg://walsink/sales.orders", _options(tmp_path))
    where = home / ".walsink" / "iceberg"
    assert publisher.catalog_properties["uri"] == f"sqlite:///{where / 'catalog.db'}"
    assert any("embedded" in r.getMessage() and str(where) in r.getMessage() for r in records)
    with pytest.raises(TargetError, match="catalog_properties"):
        from airflow_provider_walsink.core.targets.iceberg import IcebergPublisher

        IcebergPublisher("sales.orders", "append", catalog_name="lake")


def test_a_failing_connection_lookup_is_an_error_not_a_missing_connection(tmp_path, home):
    pytest.importorskip("pyiceberg")

    def broken(conn_id):
        raise RuntimeError("secrets backend unreachable")

    options = TargetOptions(mode="append", layout=StagingLayout(tmp_path), connections=broken)
    with pytest.raises(RuntimeError, match="secrets backend unreachable"):
        resolve_target("iceberg://lake/sales.orders", options)
    assert not (home / ".walsink").exists()


def test_delta_connection_must_exist_and_be_looked_up(tmp_path):
    pytest.importorskip("deltalake")
    with pytest.raises(TargetError, match="connection 'no_such_s3' does not exist"):
        resolve_target("delta+s3://bucket/t", _options(tmp_path, extra={"conn_id": "no_such_s3"}))
    no_lookup = TargetOptions(mode="overwrite", layout=StagingLayout(tmp_path), extra={"conn_id": "s3"})
    with pytest.raises(TargetError, match="no connection lookup"):
        resolve_target("delta+s3://bucket/t", no_lookup)
    # Nothing configured for S3: deltalake's own credential chain, named in the log.
    with module_log("airflow_provider_walsink.core.targets.delta") as records:
        resolve_target("delta+s3://bucket/t", _options(tmp_path))
    assert any("credentials from the environment" in r.getMessage() for r in records)


def test_sql_connection_must_exist(tmp_path):
    with pytest.raises(TargetError, match="connection 'no_such_db' does not exist"):
        resolve_target("sql://no_such_db/public.t", _options(tmp_path))


def test_the_committer_connections_documented_defaults_are_named_in_the_log(monkeypatch, tmp_path, capfd):
    """What stays a default (docs/targets.md) is said: the embedded committer database of a
    walsink connection naming no file, and the default staging root of one naming none.
    (A hook logs through Airflow's task logging, which writes to the output.)"""
    from airflow_provider_walsink.hooks.walsink import WalsinkHook, default_database_url, default_staging_root

    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "airflow"))
    monkeypatch.setenv("AIRFLOW_CONN_WALSINK_BARE", json.dumps({"conn_type": "walsink", "extra": {}}))
    hook = WalsinkHook("walsink_bare")
    capfd.readouterr()
    assert hook.sqlalchemy_url == default_database_url()
    assert hook.staging_root == default_staging_root()
    said = capfd.readouterr().out
    assert (
        f"Connection 'walsink_bare' names no SQLite database file: using the embedded default {default_database_url()}"
        in said
    )
    assert (
        f"Connection 'walsink_bare' sets no staging_root: staging under the default {default_staging_root()}"
        in said
    )


def test_the_pipeline_gives_the_write_task_the_commit_tasks_target_options():
    """The write task resolves the same target as the commit task: settings given to the
    commit task only (``commit_kwargs``) reach it too, and two different ones are refused."""
    from airflow.sdk import DAG

    from airflow_provider_walsink.operators.pipeline import walsink_pipeline

    catalog = {"catalog": {"type": "sql", "uri": "sqlite:///c.db", "warehouse": "file:///w"}}
    with DAG("walsink_pipeline_options", schedule=None, start_date=DAY) as dag:
        walsink_pipeline(
            "g",
            pipeline="p",
            application="job.py",
            target="iceberg://lake/a.b",
            commit_kwargs={"target_options": catalog},
        )
    assert dag.get_task("g.write").target_options == dag.get_task("g.commit").target_options == catalog
    with (
        DAG("walsink_pipeline_options_2", schedule=None, start_date=DAY),
        pytest.raises(ValueError, match="once"),
    ):
        walsink_pipeline(
            "g",
            pipeline="p",
            application="job.py",
            target="iceberg://lake/a.b",
            target_options={"catalog": {}},
            commit_kwargs={"target_options": catalog},
        )


def _unwritable_target(tmp_path, how: str):
    """A file target root the worker cannot create files in, and the directory to restore."""
    if how == "read-only directory":
        if os.geteuid() == 0:
            pytest.skip(
                "running as root: permission bits do not stop root's writes, so a 0555 directory is "
                "writable and nothing must be refused (test_check_writable_on_a_read_only_directory "
                "checks the refusal as an unprivileged user)"
            )
        parent = tmp_path / "readonly"
        parent.mkdir()
        parent.chmod(0o555)
        return parent / "table", parent
    blocker = tmp_path / "a-file"  # fails for root too: nothing can be created below a file
    blocker.write_text("not a directory\n")
    return blocker / "table", None


@pytest.mark.airflow
@pytest.mark.parametrize("how", ["read-only directory", "a regular file in the way"])
def test_the_write_task_refuses_an_unwritable_file_target_before_the_job_runs(
    airflow_db, walsink_conn, home, tmp_path, capfd, how
):
    """The commit would fail only after the whole Spark job ran (naming a relative partition);
    the write task refuses first, naming the target root."""
    target, restore = _unwritable_target(tmp_path, how)
    try:
        dag = write_dag(tmp_path, str(target))
        capfd.readouterr()
        dr = dag.test(logical_date=DAY)
        out = capfd.readouterr().out
    finally:
        if restore is not None:
            restore.chmod(0o755)
    assert {ti.task_id: ti.state for ti in dr.get_task_instances()} == {"write": "failed"}
    assert not (tmp_path / "ran").exists()  # the job was never submitted
    assert f"file target root {target}" in out and "nothing was written" in out
    assert walsink_conn.get_pipeline("events") is None  # nothing recorded


def test_check_writable_on_a_read_only_directory():
    """A chmod 0555 directory refuses a file target, checked as an unprivileged user (root
    writes through permission bits: as root the check runs in a child that drops to nobody)."""
    import subprocess
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="walsink-ro-"))  # not under tmp_path: nobody must reach it
    try:
        base.chmod(0o755)
        readonly = base / "readonly"
        readonly.mkdir()
        readonly.chmod(0o555)
        target = readonly / "table"
        # As root the child drops to nobody after its imports (the interpreter lives under
        # /root, which nobody cannot read), so the permission bits apply to the check.
        drop = "os.setgroups([]); os.setgid(65534); os.setuid(65534)" if os.geteuid() == 0 else "pass"
        code = textwrap.dedent(
            f"""
            import os, tempfile
            from airflow_provider_walsink.core.staging import StagingLayout
            from airflow_provider_walsink.core.targets.files import FilePublisher, TargetNotWritableError
            publisher = FilePublisher({str(target)!r}, "append", layout=StagingLayout({str(base / "staging")!r}))
            {{drop}}
            try:
                publisher.check_writable()
            except TargetNotWritableError as exc:
                print(exc)
            else:
                print("accepted")
            """
        )
        env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1", "HOME": str(base)}
        result = subprocess.run(
            [sys.executable, "-c", code.format(drop=drop)], capture_output=True, text=True, env=env, cwd=base
        )
        assert result.returncode == 0, result.stderr
        message = result.stdout.strip()
        assert message.startswith(f"file target root {target} cannot be created: {readonly} is not writable")
        assert "Permission denied" in message and "nothing was written" in message
        # A writable directory is accepted (the check leaves nothing behind).
        readonly.chmod(0o755)
        result = subprocess.run(
            [sys.executable, "-c", code.format(drop="pass")],
            capture_output=True,
            text=True,
            env=env,
            cwd=base,
        )
        assert result.stdout.strip() == "accepted" and os.listdir(readonly) == []
    finally:
        readonly.chmod(0o755)
        shutil.rmtree(base)
