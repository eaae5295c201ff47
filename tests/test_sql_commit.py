"""The SQL target under the real committer (``CheckpointCommitter``), committer table on SQLite,
target tables on PostgreSQL and MariaDB.

A commit process is SIGKILLed (``WALSINK_CRASH_AT``) after the SQL transaction
committed but before COMMITTED is recorded; the re-run must find the marker and
write nothing, also when the committer rows are deleted in between (retention)
and the interval is written and committed again.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
import time
import uuid
from datetime import timedelta

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa

from airflow_provider_walsink.core.commit import CheckpointCommitter
from airflow_provider_walsink.core.protocol import CheckpointState as S
from airflow_provider_walsink.core.targets.sql import SqlPublisher, SqlTargetError
from tests.helpers import ACTOR, REPO, forget_checkpoint, stage_checkpoint

KEY = "20260101T000000Z"
TTL = timedelta(seconds=1)


def parquet(ids: range) -> bytes:
    sink = io.BytesIO()
    pq.write_table(pa.table({"id": pa.array(ids, pa.int64()), "v": [f"v{i}" for i in ids]}), sink)
    return sink.getvalue()


def day(ids: range) -> dict[str, bytes]:
    return {"dt=2026-01-01/part-0.parquet": parquet(ids)}


@pytest.fixture(params=["postgresql", "mysql"])
def target_url(request, database_urls) -> str:
    return database_urls(request.param)


def committer(store, layout, url, table, mode, *, lock_timeout: float = 60.0) -> CheckpointCommitter:
    publisher = SqlPublisher(
        url, table, mode=mode, layout=layout, partition_by=("dt",), lock_timeout=lock_timeout
    )
    return CheckpointCommitter(store, layout, publisher, mode=mode, lease_ttl=TTL)


def ids_in(url: str, table: str) -> list[int]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return sorted(conn.execute(sa.text(f"SELECT id FROM {table}")).scalars())
    finally:
        engine.dispose()


KILLED_COMMIT = textwrap.dedent("""
    import sys
    from datetime import timedelta
    sys.path.insert(0, {repo!r})
    from airflow_provider_walsink.core.commit import CheckpointCommitter
    from airflow_provider_walsink.core.store import CommitterStore
    from airflow_provider_walsink.core.staging.layout import StagingLayout
    from airflow_provider_walsink.core.targets.sql import SqlPublisher
    from tests.helpers import ACTOR
    store_url, staging, url, table, mode, key = sys.argv[1:7]
    layout = StagingLayout(staging)
    publisher = SqlPublisher(url, table, mode=mode, layout=layout, partition_by=("dt",))
    CheckpointCommitter(CommitterStore.from_url(store_url), layout, publisher, mode=mode,
                        lease_ttl=timedelta(seconds=1)).commit("p", key, actor=ACTOR)
""")


def kill_commit_after_publish(store, layout, url: str, table: str, mode: str) -> None:
    env = {**os.environ, "WALSINK_CRASH_AT": "commit.after_publish", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_COMMIT.format(repo=str(REPO))]
        + [
            str(store.engine.url.render_as_string(hide_password=False)),
            str(layout.root),
            url,
            table,
            mode,
            KEY,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -9, proc.stderr[-2000:]


@pytest.mark.parametrize("mode", ["append", "overwrite"])
def test_a_commit_killed_after_the_sql_load_is_finished_by_the_rerun_without_a_second_load(
    sqlite_store, layout, target_url, mode
):
    store, table = sqlite_store, f"t_{uuid.uuid4().hex[:8]}"
    stage_checkpoint(store, layout, "p", KEY, day(range(100)), mode=mode)
    kill_commit_after_publish(store, layout, target_url, table, mode)
    assert store.require("p", KEY).state is S.COMMITTING  # the rows are in, COMMITTED is not
    assert ids_in(target_url, table) == list(range(100))
    time.sleep(TTL.total_seconds() * 1.5)  # let the dead committer's lease expire
    summary = committer(store, layout, target_url, table, mode).commit("p", KEY, actor=ACTOR)
    assert summary.state == "COMMITTED" and summary.lease_taken_over_from
    assert summary.published == 0 and summary.already_published == 1
    assert ids_in(target_url, table) == list(range(100))
    assert not layout.checkpoint_dir("p", KEY).exists()  # finish() cleaned the staging


def test_a_killed_commit_whose_committer_rows_are_then_lost_never_loads_twice(
    sqlite_store, layout, target_url
):
    """Killed after the load, committer rows deleted, the interval written again: the target's
    marker alone decides. append: refused (the old rows were never confirmed); overwrite: replaced."""
    store, table = sqlite_store, f"t_{uuid.uuid4().hex[:8]}"
    stage_checkpoint(store, layout, "p", KEY, day(range(100)), mode="append")
    kill_commit_after_publish(store, layout, target_url, table, "append")
    forget_checkpoint(store, "p", KEY)
    stage_checkpoint(store, layout, "p", KEY, day(range(100)), mode="append")  # the same rows, a new attempt
    with pytest.raises(SqlTargetError, match="whose commit was never recorded"):
        committer(store, layout, target_url, table, "append").commit("p", KEY, actor=ACTOR)
    assert store.require("p", KEY).state is S.FAILED
    assert ids_in(target_url, table) == list(range(100))

    # The same story in overwrite mode: the re-run replaces the interval.
    table = f"t_{uuid.uuid4().hex[:8]}"
    forget_checkpoint(store, "p", KEY)
    stage_checkpoint(store, layout, "p", KEY, day(range(100)))
    kill_commit_after_publish(store, layout, target_url, table, "overwrite")
    forget_checkpoint(store, "p", KEY)
    stage_checkpoint(store, layout, "p", KEY, day(range(100)))
    summary = committer(store, layout, target_url, table, "overwrite").commit("p", KEY, actor=ACTOR)
    assert summary.state == "COMMITTED" and summary.partitions_replaced == ["dt=2026-01-01"]
    assert ids_in(target_url, table) == list(range(100))


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def _lock_waiters(url: str) -> int:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            if engine.dialect.name == "postgresql":
                query = (
                    "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'"
                )
            else:
                # Row-lock waits, and metadata-lock waits (DDL on a table an open transaction
                # touched), which innodb_trx does not list.
                query = (
                    "SELECT (SELECT COUNT(*) FROM information_schema.innodb_trx WHERE trx_state = 'LOCK WAIT')"
                    " + (SELECT COUNT(*) FROM information_schema.processlist WHERE state LIKE 'Waiting for%lock%')"
                )
            return int(conn.execute(sa.text(query)).scalar())
    finally:
        engine.dispose()


def test_a_zombie_committer_paused_inside_its_transaction_is_fenced_when_it_resumes(
    sqlite_store, layout, target_url
):
    """SIGSTOP with the rows loaded and the marker row held; the successor takes the lease over and
    waits on the row; SIGCONT: the zombie's fence before COMMIT refuses it, the successor commits."""
    import signal
    import threading

    store, table = sqlite_store, f"t_{uuid.uuid4().hex[:8]}"
    stage_checkpoint(store, layout, "p", KEY, day(range(100)))
    env = {
        **os.environ,
        "WALSINK_CRASH_AT": "sql.loaded",
        "WALSINK_CRASH_SIGNAL": "STOP",
        "PYTHONPATH": str(REPO),
    }
    zombie = subprocess.Popen(
        [sys.executable, "-c", KILLED_COMMIT.format(repo=str(REPO))]
        + [store.engine.url.render_as_string(hide_password=False), str(layout.root), target_url, table]
        + ["overwrite", KEY],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for _ in range(3000):
            if _state(zombie.pid) == "T" or zombie.poll() is not None:
                break
            time.sleep(0.05)
        assert _state(zombie.pid) == "T", "the zombie never reached sql.loaded"
        time.sleep(TTL.total_seconds() * 1.5)  # its lease runs out while it is paused
        outcome: dict = {}

        def successor() -> None:
            try:
                # A lock wait longer than the poll below: on a loaded machine the poll may not see
                # the wait in time (seen once on MariaDB, 60 s), and the successor must still be
                # waiting when the zombie resumes, which is the point of the test.
                outcome["summary"] = committer(
                    store, layout, target_url, table, "overwrite", lock_timeout=240.0
                ).commit("p", KEY, actor=ACTOR)
            except Exception as exc:  # noqa: BLE001 - reported by the assertion below
                outcome["error"] = exc

        thread = threading.Thread(target=successor)
        thread.start()
        for _ in range(3000):
            if _lock_waiters(target_url) or not thread.is_alive():
                break
            time.sleep(0.05)
        assert thread.is_alive(), f"the successor did not wait for the zombie's marker row: {outcome}"
        os.kill(zombie.pid, signal.SIGCONT)
        _, err = zombie.communicate(timeout=120)
        thread.join(120)
    finally:
        if zombie.poll() is None:
            zombie.kill()
            zombie.wait()
    # LeaseLostError is the committer's FencedError, raised by the fence just before the SQL COMMIT.
    assert zombie.returncode != 0 and "LeaseLostError" in err and "was taken over" in err, err[-2000:]
    assert "core/targets/sql/publisher.py" in err.rsplit("ctx.fence()", 1)[0], err[-2000:]
    assert "summary" in outcome, outcome
    assert outcome["summary"].state == "COMMITTED" and outcome["summary"].lease_taken_over_from
    assert ids_in(target_url, table) == list(range(100))
    engine = sa.create_engine(target_url)
    with engine.connect() as conn:
        epoch = conn.execute(sa.text("SELECT epoch FROM walsink_markers WHERE pipeline = 'p'")).scalar_one()
    engine.dispose()
    assert epoch >= 2  # the successor's token, not the zombie's 1


KILLED_PIPELINE_COMMIT = textwrap.dedent("""
    import sys
    from datetime import timedelta
    sys.path.insert(0, {repo!r})
    from airflow_provider_walsink.core.commit import CheckpointCommitter
    from airflow_provider_walsink.core.store import CommitterStore
    from airflow_provider_walsink.core.staging.layout import StagingLayout
    from airflow_provider_walsink.core.targets.sql import SqlPublisher
    from tests.helpers import ACTOR
    store_url, staging, url, table, markers, mode, pipeline, key = sys.argv[1:9]
    layout = StagingLayout(staging)
    publisher = SqlPublisher(url, table, mode=mode, layout=layout, partition_by=("dt",), marker_table=markers)
    CheckpointCommitter(CommitterStore.from_url(store_url), layout, publisher, mode=mode,
                        lease_ttl=timedelta(seconds=1)).commit(pipeline, key, actor=ACTOR)
""")


def test_pipelines_differing_only_in_case_never_share_a_marker_row(sqlite_store, layout, target_url):
    """``Sales`` (append into one table) is killed after its load; ``sales`` (overwrite into another
    table, the same marker table) commits the same checkpoint key; the retry of ``Sales`` must find
    its own marker row and load nothing twice. On MariaDB a case-insensitive key shared the row."""
    store = sqlite_store
    upper, lower = f"t_{uuid.uuid4().hex[:8]}", f"t_{uuid.uuid4().hex[:8]}"
    markers = f"m_{uuid.uuid4().hex[:8]}"

    def publisher(table: str, mode: str) -> SqlPublisher:
        return SqlPublisher(
            target_url, table, mode=mode, layout=layout, partition_by=("dt",), marker_table=markers
        )

    stage_checkpoint(store, layout, "Sales", KEY, day(range(100)), mode="append")
    env = {**os.environ, "WALSINK_CRASH_AT": "commit.after_publish", "PYTHONPATH": str(REPO)}
    args = [store.engine.url.render_as_string(hide_password=False), str(layout.root), target_url]
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_PIPELINE_COMMIT.format(repo=str(REPO))]
        + [*args, upper, markers, "append", "Sales", KEY],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert ids_in(target_url, upper) == list(range(100))

    stage_checkpoint(store, layout, "sales", KEY, day(range(500, 520)))
    other = CheckpointCommitter(store, layout, publisher(lower, "overwrite"), mode="overwrite", lease_ttl=TTL)
    assert other.commit("sales", KEY, actor=ACTOR).state == "COMMITTED"

    time.sleep(TTL.total_seconds() * 1.5)  # the killed committer's lease expires
    retry = CheckpointCommitter(store, layout, publisher(upper, "append"), mode="append", lease_ttl=TTL)
    summary = retry.commit("Sales", KEY, actor=ACTOR)
    assert ids_in(target_url, upper) == list(range(100))  # each row once
    assert summary.state == "COMMITTED" and summary.already_published == 1 and summary.published == 0
    assert ids_in(target_url, lower) == list(range(500, 520))
    engine = sa.create_engine(target_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.text(f"SELECT pipeline FROM {markers} ORDER BY pipeline")).scalars()
            assert sorted(rows) == ["Sales", "sales"]
    finally:
        engine.dispose()
