"""One ordering rule and one retraction rule for the table targets (issue 22, symptoms 2 and 3).

Ordering (DESIGN.md invariant 10): in ``overwrite`` a partition never goes back to an older
checkpoint's data unless the user asks for it (``allow_older_overwrite``); a late retry of an
old key is refused, naming the newer checkpoint that holds the partition. Iceberg and Delta,
under the lease and under ``fencing="table"``, through the real committer, real tables read
back with their own libraries; the race (an older checkpoint's committer SIGSTOPped after its
check, right before its table commit, while a newer one commits) shows the check is part of
the table's own atomic commit.

Retraction by identity: a reprocess ``replace`` of an ``append`` checkpoint whose files real
table maintenance rewrote (Delta ``optimize.compact()``, an Iceberg rewrite of the same rows)
is refused before the table changes, never a silent duplicate; in ``overwrite`` the partitions
the superseded checkpoint holds are replaced whatever files maintenance put there.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
import time
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_walsink.core import faults
from airflow_provider_walsink.core.commit import CheckpointCommitter, CheckpointWriter
from airflow_provider_walsink.core.protocol import CheckpointState as S
from airflow_provider_walsink.core.protocol.errors import OrderError, SupersedeError
from airflow_provider_walsink.core.staging.layout import StagingLayout
from airflow_provider_walsink.core.store import CommitterStore
from tests.helpers import ACTOR, REPO
from tests.table_fixtures import local_table_spec
from tests.test_table_fence import _state_of, make_publisher, resume

pytestmark = pytest.mark.slow

OLD = "20260101T000000Z"
NEW = "20260102T000000Z"
#: Both checkpoints write partition dt=2026-01-01 (hourly keys into a daily partition, a backfill...).
OLD_ROWS = [("2026-01-01", 1, "old-a"), ("2026-01-01", 2, "old-b")]
NEW_ROWS = [("2026-01-01", 1, "new-a"), ("2026-01-01", 3, "new-c")]


@pytest.fixture(params=["iceberg", "delta"])
def kind(request) -> str:
    return request.param


@pytest.fixture(params=["lease", "table"])
def fencing(request) -> str:
    return request.param


@pytest.fixture
def spec(kind, tmp_path) -> dict:
    return local_table_spec(kind, tmp_path)


def layout_of(kind: str, spec: dict) -> StagingLayout:
    return StagingLayout(make_publisher(kind, spec, "overwrite").staging_root())


def stage(store: CommitterStore, layout: StagingLayout, key: str, rows: list[tuple], mode: str = "overwrite"):
    """Register (once), write a new attempt partitioned by dt (two files a partition), seal it, DURABLE."""
    store.register("events", key, mode=mode, actor=ACTOR, target="table")
    writer = CheckpointWriter(store, layout, "events", key, actor=ACTOR, partition_columns=("dt",))
    attempt_dir = writer.begin()
    files, counts = {}, {}
    for dt in sorted({r[0] for r in rows}):
        part = [r for r in rows if r[0] == dt]
        for chunk in (part[: len(part) // 2], part[len(part) // 2 :]):
            if not chunk:
                continue
            buf = io.BytesIO()
            ids = pa.array([r[1] for r in chunk], pa.int64())
            pq.write_table(pa.table({"id": ids, "name": [r[2] for r in chunk]}), buf)
            rel = f"dt={dt}/part-{uuid.uuid4().hex[:8]}.parquet"
            (attempt_dir / rel).parent.mkdir(parents=True, exist_ok=True)
            (attempt_dir / rel).write_bytes(buf.getvalue())
            files[rel], counts[rel] = buf.getvalue(), len(chunk)
    writer.add_files(files, rows=counts)
    manifest, _ = writer.seal()
    store.mark_durable("events", key, attempt=writer.attempt, actor=ACTOR)
    return manifest


def committer(store, layout, kind, spec, mode, fencing) -> CheckpointCommitter:
    return CheckpointCommitter(store, layout, make_publisher(kind, spec, mode), mode=mode, fencing=fencing)


def table_rows(kind: str, spec: dict) -> list[tuple]:
    table = make_publisher(kind, spec, "append").load_table()
    if table is None:
        return []
    arrow = table.scan().to_arrow() if kind == "iceberg" else table.to_pyarrow_table()
    return sorted((r["dt"], r["id"], r["name"]) for r in arrow.to_pylist())


def duckdb_count(kind: str, spec: dict) -> int:
    """The rows a reader outside walsink sees (DuckDB over the table's current files)."""
    import duckdb

    table = make_publisher(kind, spec, "append").load_table()
    if kind == "delta":
        files = table.file_uris()
    else:
        files = [t.file.file_path.removeprefix("file://") for t in table.scan().plan_files()]
    if not files:
        return 0
    return duckdb.read_parquet(files, union_by_name=True).aggregate("count(*)").fetchall()[0][0]


# ----------------------------------------------------------------------------- ordering


def test_a_late_commit_of_an_older_checkpoint_is_refused_naming_the_newer_one(
    sqlite_store, kind, spec, fencing
):
    layout = layout_of(kind, spec)
    stage(sqlite_store, layout, OLD, OLD_ROWS)
    stage(sqlite_store, layout, NEW, NEW_ROWS)
    committer(sqlite_store, layout, kind, spec, "overwrite", fencing).commit("events", NEW, actor=ACTOR)
    assert table_rows(kind, spec) == sorted(NEW_ROWS)

    with pytest.raises(OrderError) as refused:
        committer(sqlite_store, layout, kind, spec, "overwrite", fencing).commit("events", OLD, actor=ACTOR)

    message = str(refused.value)
    assert NEW in message and "dt=2026-01-01" in message and "allow_older_overwrite" in message
    assert table_rows(kind, spec) == sorted(NEW_ROWS)
    record = sqlite_store.require("events", OLD)
    assert record.state is not S.COMMITTED and NEW in (record.error or "")


def test_the_newer_checkpoint_may_replace_and_the_user_may_roll_back_on_purpose(
    sqlite_store, kind, spec, fencing
):
    layout = layout_of(kind, spec)
    stage(sqlite_store, layout, OLD, OLD_ROWS)
    stage(sqlite_store, layout, NEW, NEW_ROWS)
    committer(sqlite_store, layout, kind, spec, "overwrite", fencing).commit("events", OLD, actor=ACTOR)
    committer(sqlite_store, layout, kind, spec, "overwrite", fencing).commit("events", NEW, actor=ACTOR)
    assert table_rows(kind, spec) == sorted(NEW_ROWS)

    # Asked for on purpose: a reprocess of the older key with the explicit override.
    sqlite_store.begin_version("events", OLD, token="tests/run#1", actor=ACTOR, reason="roll back")
    stage(sqlite_store, layout, OLD, OLD_ROWS)
    publisher = make_publisher(kind, spec, "overwrite")
    publisher.allow_older_overwrite = True
    CheckpointCommitter(sqlite_store, layout, publisher, mode="overwrite", fencing=fencing).commit(
        "events", OLD, actor=ACTOR
    )
    assert table_rows(kind, spec) == sorted(OLD_ROWS)


ORDER_RACE = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {repo!r})
    from tests.test_table_fence import make_publisher
    from airflow_provider_walsink.core.store import Actor, CommitterStore
    from airflow_provider_walsink.core.commit import CheckpointCommitter
    from airflow_provider_walsink.core.staging.layout import StagingLayout
    kind, spec, url, staging, key, fencing = sys.argv[1], json.loads(sys.argv[2]), *sys.argv[3:]
    store = CommitterStore.from_url(url, migrate=False)
    committer = CheckpointCommitter(
        store, StagingLayout(staging), make_publisher(kind, spec, "overwrite"), mode="overwrite", fencing=fencing
    )
    actor = Actor(name="dag.commit@run1", dag_id="dag", run_id="run1", task_id="commit", try_number=1)
    print(json.dumps(committer.commit("events", key, actor=actor).to_dict()))
""")


def test_an_older_checkpoint_paused_after_its_check_cannot_commit_over_a_newer_one(
    sqlite_store, kind, spec, fencing
):
    layout = layout_of(kind, spec)
    stage(sqlite_store, layout, OLD, OLD_ROWS)
    stage(sqlite_store, layout, NEW, NEW_ROWS)
    env = {**os.environ, faults.ENV: "table.before_table_commit", faults.SIGNAL_ENV: "STOP"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    url = sqlite_store.engine.url.render_as_string(hide_password=False)
    args = [kind, json.dumps(spec), url, str(layout.root), OLD, fencing]
    proc = subprocess.Popen(
        [sys.executable, "-c", ORDER_RACE.format(repo=str(REPO)), *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while _state_of(proc.pid) != "T":
        if proc.poll() is not None:
            raise AssertionError(proc.stderr.read())
        assert time.monotonic() < deadline, "the committer never reached its stop"
        time.sleep(0.05)
    # The older checkpoint's committer has checked the table (empty: nothing holds dt=2026-01-01)
    # and is about to commit; the newer checkpoint commits now.
    committer(sqlite_store, layout, kind, spec, "overwrite", fencing).commit("events", NEW, actor=ACTOR)

    code, _out, err = resume(proc)

    assert code != 0 and "OrderError" in err and NEW in err, err[-2000:]
    assert table_rows(kind, spec) == sorted(NEW_ROWS)
    assert sqlite_store.require("events", NEW).state is S.COMMITTED
    assert sqlite_store.require("events", OLD).state is not S.COMMITTED


# ----------------------------------------------------------------------------- retraction after maintenance

V1 = [
    ("2026-01-01", 1, "v1-a"),
    ("2026-01-01", 2, "v1-b"),
    ("2026-01-02", 3, "v1-c"),
    ("2026-01-02", 4, "v1-d"),
]
V2 = [("2026-01-01", 1, "v2-a"), ("2026-01-01", 5, "v2-e")]
OTHER = [("2026-01-02", 9, "other")]


def rewrite_files(kind: str, spec: dict) -> None:
    """Real table maintenance: rewrite every data file into new ones holding the same rows."""
    table = make_publisher(kind, spec, "append").load_table()
    if kind == "delta":
        metrics = table.optimize.compact()
        assert metrics["numFilesRemoved"] > 0, metrics
        return
    # Iceberg: one overwrite snapshot replacing every data file with one holding the same rows
    # (what a rewrite-data-files action commits; pyiceberg writes it as an overwrite).
    before = {t.file.file_path for t in table.scan().plan_files()}
    table.overwrite(table.scan().to_arrow())
    table = make_publisher(kind, spec, "append").load_table()
    assert not before & {t.file.file_path for t in table.scan().plan_files()}


def test_reprocess_of_an_append_checkpoint_after_maintenance_is_refused_not_duplicated(
    sqlite_store, kind, spec
):
    layout = layout_of(kind, spec)
    stage(sqlite_store, layout, OLD, OTHER, mode="append")
    committer(sqlite_store, layout, kind, spec, "append", "lease").commit("events", OLD, actor=ACTOR)
    stage(sqlite_store, layout, NEW, V1, mode="append")
    committer(sqlite_store, layout, kind, spec, "append", "lease").commit("events", NEW, actor=ACTOR)
    rewrite_files(kind, spec)
    assert table_rows(kind, spec) == sorted(OTHER + V1)

    sqlite_store.begin_version("events", NEW, token="tests/run#1", actor=ACTOR, reason="test")
    stage(sqlite_store, layout, NEW, V2, mode="append")
    with pytest.raises(SupersedeError) as refused:
        committer(sqlite_store, layout, kind, spec, "append", "lease").commit("events", NEW, actor=ACTOR)

    assert "maintenance" in str(refused.value)
    assert table_rows(kind, spec) == sorted(OTHER + V1)
    assert duckdb_count(kind, spec) == len(OTHER + V1)
    record = sqlite_store.require("events", NEW)
    assert record.state is not S.COMMITTED and "maintenance" in (record.error or "")


def test_reprocess_of_an_append_checkpoint_without_maintenance_still_replaces(sqlite_store, kind, spec):
    layout = layout_of(kind, spec)
    stage(sqlite_store, layout, NEW, V1, mode="append")
    committer(sqlite_store, layout, kind, spec, "append", "lease").commit("events", NEW, actor=ACTOR)
    sqlite_store.begin_version("events", NEW, token="tests/run#1", actor=ACTOR, reason="test")
    stage(sqlite_store, layout, NEW, V2, mode="append")
    committer(sqlite_store, layout, kind, spec, "append", "lease").commit("events", NEW, actor=ACTOR)
    assert table_rows(kind, spec) == sorted(V2)


def test_reprocess_of_an_overwrite_checkpoint_after_maintenance_leaves_no_old_row(sqlite_store, kind, spec):
    """v1 wrote two partitions, v2 only one: after a rewrite, v1's rows in the other partition go too."""
    layout = layout_of(kind, spec)
    stage(sqlite_store, layout, NEW, V1)
    committer(sqlite_store, layout, kind, spec, "overwrite", "lease").commit("events", NEW, actor=ACTOR)
    rewrite_files(kind, spec)
    assert table_rows(kind, spec) == sorted(V1)

    sqlite_store.begin_version("events", NEW, token="tests/run#1", actor=ACTOR, reason="test")
    stage(sqlite_store, layout, NEW, V2)
    committer(sqlite_store, layout, kind, spec, "overwrite", "lease").commit("events", NEW, actor=ACTOR)

    assert table_rows(kind, spec) == sorted(V2)
    assert duckdb_count(kind, spec) == len(V2)


# ----------------------------------------------------------------------------- the SQL target


@pytest.mark.parametrize("backend", ["postgresql", "mysql"])
def test_sql_replace_of_an_older_checkpoint_is_refused_naming_the_newer_one(
    sqlite_store, tmp_path, database_urls, backend
):
    """``replace`` by key: the key values play the partitions' part; same rule, in the load's transaction."""
    from tests.harness.targets import TargetEnv, _commit, _write

    env = TargetEnv("sql", tmp_path, database_urls(backend))
    pipeline = f"ord_{uuid.uuid4().hex[:6]}"
    _write(sqlite_store, env, pipeline, "overwrite", OLD, {"2026-01-01": ["old-a", "old-b"]})
    _write(sqlite_store, env, pipeline, "overwrite", NEW, {"2026-01-01": ["new-a"], "2026-01-02": ["new-b"]})
    _commit(sqlite_store, env, pipeline, "overwrite", NEW, 1)
    assert env.rows(pipeline, "overwrite") == [("2026-01-01", "new-a"), ("2026-01-02", "new-b")]

    with pytest.raises(OrderError) as refused:
        _commit(sqlite_store, env, pipeline, "overwrite", OLD, 1)

    assert NEW in str(refused.value) and "dt=2026-01-01" in str(refused.value)
    assert env.rows(pipeline, "overwrite") == [("2026-01-01", "new-a"), ("2026-01-02", "new-b")]
    record = sqlite_store.require(pipeline, OLD)
    assert record.state is not S.COMMITTED and NEW in (record.error or "")
    # A key with values no newer checkpoint holds still commits.
    other = "20260103T000000Z"
    _write(sqlite_store, env, pipeline, "overwrite", other, {"2026-01-03": ["x"]})
    _commit(sqlite_store, env, pipeline, "overwrite", other, 1)
    assert ("2026-01-03", "x") in env.rows(pipeline, "overwrite")


def test_the_commit_tasks_override_reaches_every_target(tmp_path):
    """``allow_older_overwrite`` (the commit task's, via TargetOptions) is what each target's rule reads."""
    from airflow_provider_walsink.core.targets.registry import TargetOptions, resolve_target

    catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path}/c.db", "warehouse": f"file://{tmp_path}/w"}
    targets = {
        str(tmp_path / "files"): {},
        "iceberg://c/ns.t?create_table=true": {"catalog": catalog},
        f"delta://{tmp_path}/delta": {},
        "sql://x/t": {"url": "postgresql+psycopg2://u@127.0.0.1/db"},
    }
    for allow in (False, True):
        for uri, extra in targets.items():
            options = TargetOptions(
                mode="overwrite",
                layout=StagingLayout(tmp_path / "staging"),
                allow_older_overwrite=allow,
                extra=extra,
            )
            assert resolve_target(uri, options).allow_older_overwrite is allow, uri
