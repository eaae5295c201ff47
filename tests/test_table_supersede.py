"""Reprocess on the table targets (issue 15, item 1): a new version of a committed checkpoint
replaces the committed one in the table's own atomic commit (Iceberg snapshot, Delta commit,
SQL transaction), through the real committer and store (SQLite), real tables read back with
their own libraries. The files target's versions are tested in tests/test_reprocess.py.

v1 writes two partitions, v2 different rows in one of them: the interval must then hold v2's
rows exactly once and nothing of v1 (also in the partition v2 no longer covers), next to an
untouched checkpoint; the crash points and the zombie are those of tests/harness/targets.py.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
import uuid
from datetime import timedelta

import pytest

from airflow_provider_walsink.core.commit.gc import collect_staging
from airflow_provider_walsink.core.protocol import CheckpointState as S
from airflow_provider_walsink.core.protocol.errors import FencedError, SupersedeError
from airflow_provider_walsink.core.store.errors import LeaseHeldError
from airflow_provider_walsink.core.targets.base import StaticContext
from tests.harness.targets import LEASE_TTL, ZOMBIE_POINT, TargetEnv, _child, _commit, _state, _write
from tests.helpers import ACTOR

KINDS_AND_MODES = [
    ("iceberg", "append"),
    ("iceberg", "overwrite"),
    ("delta", "append"),
    ("delta", "overwrite"),
    ("sql", "overwrite"),
]
OTHER = {"2026-01-03": ["o1"]}
V1 = {"2026-01-01": ["v1-a", "v1-b"], "2026-01-02": ["v1-c"]}
V2 = {"2026-01-01": ["v2-a", "v2-b", "v2-c"]}
#: v2 declaring v1's other partition empty: how a SQL ``replace`` by key names the whole interval.
V2_DECLARED = {**V2, "2026-01-02": []}


def v2_for(env: TargetEnv) -> dict[str, list[str]]:
    """Table targets find v1's files wherever they are; SQL finds v1's rows by the key values v2 names."""
    return V2_DECLARED if env.kind == "sql" else V2


def expected(*versions: dict[str, list[str]]) -> list[tuple[str, str]]:
    return sorted((dt, i) for v in versions for dt, ids in v.items() for i in ids)


@pytest.fixture
def env(request, tmp_path, database_urls):
    kind = request.param
    return TargetEnv(kind, tmp_path, database_urls("postgresql") if kind == "sql" else None)


class Scenario:
    """One pipeline on one target: another checkpoint ``k0`` and the reprocessed ``k1``."""

    def __init__(self, store, env: TargetEnv, mode: str) -> None:
        self.store, self.env, self.mode = store, env, mode
        self.pipeline = f"sup_{mode[:3]}_{uuid.uuid4().hex[:6]}"

    def write(self, key, rows):
        return _write(self.store, self.env, self.pipeline, self.mode, key, rows)

    def commit(self, key, try_number=1):
        _commit(self.store, self.env, self.pipeline, self.mode, key, try_number)
        return self.store.require(self.pipeline, key)

    def commit_until_done(self, key):
        for try_number in range(2, 20):
            try:
                return self.commit(key, try_number)
            except LeaseHeldError:
                time.sleep(LEASE_TTL.total_seconds() / 2)
        raise AssertionError(f"{key} never committed")

    def rows(self):
        return self.env.rows(self.pipeline, self.mode)

    def reprocess(self, key, rows):
        self.store.begin_version(self.pipeline, key, token="tests/run#1", actor=ACTOR, reason="test")
        return self.write(key, rows)

    def publisher(self):
        return self.env.publisher(self.pipeline, self.mode, self.env.layout(self.pipeline, self.mode))

    def child(self, key, point, *, stop=False):
        """Commit try 1 in a fresh interpreter that SIGKILLs (or SIGSTOPs) itself at ``point``."""
        out = str(self.env.work / f"{uuid.uuid4().hex}.out")
        url = self.store.engine.url.render_as_string(hide_password=False)
        proc = multiprocessing.get_context("spawn").Process(
            target=_child, args=(self.env, url, self.pipeline, self.mode, key, point, stop, out)
        )
        proc.start()
        while proc.is_alive() and not (stop and _state(proc.pid) == "T"):
            time.sleep(0.01)
        return proc, out


@pytest.mark.parametrize(("env", "mode"), KINDS_AND_MODES, indirect=["env"])
def test_new_version_replaces_the_committed_one_in_one_table_commit(sqlite_store, env, mode):
    s = Scenario(sqlite_store, env, mode)
    s.write("k0", OTHER)
    s.commit("k0")
    v1 = s.write("k1", V1)
    s.commit("k1")
    v1_epoch = s.store.require(s.pipeline, "k1").lease_epoch
    assert s.rows() == expected(OTHER, V1)
    before = table_versions(s)

    v2 = s.reprocess("k1", v2_for(env))
    record = s.commit("k1")

    assert s.rows() == expected(OTHER, V2)
    assert (record.state, record.version, record.sealed_attempt_id) == (S.COMMITTED, 2, v2.attempt_id)
    [old] = s.store.versions(s.pipeline, "k1")
    assert (old.state, old.attempt_id, old.superseded_by_attempt_id) == (
        S.SUPERSEDED,
        v1.attempt_id,
        v2.attempt_id,
    )
    if before is not None:
        # One atomic step: exactly one new table version, holding the removal and the additions.
        assert table_versions(s) == before + 1
    assert s.publisher().published_attempt(v2) == v2.attempt_id

    # A re-run is a no-op; a zombie of v1's lease (no committer fence, only the table's) adds nothing.
    assert s.commit("k1").state is S.COMMITTED
    with pytest.raises(FencedError):
        s.publisher().publish(v1, s.env.layout(s.pipeline, mode).attempt_dir(
            s.pipeline, "k1", v1.attempt, v1.attempt_id), StaticContext.for_manifest(v1, epoch=v1_epoch))  # fmt: skip
    assert s.rows() == expected(OTHER, V2)
    if before is not None:
        assert table_versions(s) == before + 1

    if env.kind != "sql":
        # Time travel: older snapshots still reference the superseded version's files, so
        # neither the commit's cleanup nor staging GC (even with no retention) removes them.
        collect_staging(
            s.store, s.env.layout(s.pipeline, mode), retention=timedelta(0), pipelines=[s.pipeline]
        )
        assert rows_at(s, before) == expected(OTHER, V1)
        assert s.rows() == expected(OTHER, V2)


@pytest.mark.parametrize(("env", "mode"), KINDS_AND_MODES, indirect=["env"])
def test_crash_after_the_table_commit_of_a_new_version_then_rerun(sqlite_store, env, mode):
    s = Scenario(sqlite_store, env, mode)
    s.write("k1", V1)
    s.commit("k1")
    v2 = s.reprocess("k1", v2_for(env))
    point = "sql.committed" if env.kind == "sql" else "table.after_table_commit"
    proc, out = s.child("k1", point)
    proc.join(300)
    assert proc.exitcode == -signal.SIGKILL, open(out).read() if proc.exitcode else proc.exitcode
    # The table holds v2 (v1 retracted in the same commit); the committer never recorded it.
    assert s.rows() == expected(V2)
    assert s.store.require(s.pipeline, "k1").state is S.COMMITTING
    time.sleep(LEASE_TTL.total_seconds())

    record = s.commit_until_done("k1")

    assert s.rows() == expected(V2)
    assert (record.state, record.sealed_attempt_id) == (S.COMMITTED, v2.attempt_id)
    assert [v.state for v in s.store.versions(s.pipeline, "k1")] == [S.SUPERSEDED]


@pytest.mark.parametrize(("env", "mode"), [("iceberg", "append"), ("delta", "overwrite")], indirect=["env"])
def test_zombie_of_the_first_version_resumed_after_the_reprocess_adds_nothing(sqlite_store, env, mode):
    """v1's try 1 stops right before its table commit; try 2 commits v1, v2 supersedes it; try 1 resumes."""
    s = Scenario(sqlite_store, env, mode)
    s.write("k1", V1)
    proc, out = s.child("k1", ZOMBIE_POINT[env.kind], stop=True)
    try:
        assert proc.is_alive(), open(out).read()
        time.sleep(LEASE_TTL.total_seconds() * 1.2)
        s.commit_until_done("k1")
        s.reprocess("k1", V2)
        s.commit_until_done("k1")
        assert s.rows() == expected(V2)

        os.kill(proc.pid, signal.SIGCONT)
        proc.join(300)
    finally:
        if proc.is_alive():  # a failed step above: never leave a stopped child behind
            proc.kill()
            proc.join(30)
    assert proc.exitcode != 0
    # Refused by the table's own commit (its marker names v2 under a higher token), not by the
    # committer: the zombie asked the committer database before it stopped.
    text = open(out).read()
    assert "FencedError: checkpoint" in text and "already holds attempt" in text, text[-800:]
    assert s.rows() == expected(V2)
    assert s.store.require(s.pipeline, "k1").state is S.COMMITTED


def test_sql_replace_refuses_a_new_version_that_leaves_old_rows_behind(sqlite_store, tmp_path, database_urls):
    """v2 names only one of v1's partitions: v1's rows in the other one could not be told from another
    checkpoint's rows written there since, so nothing is written and v1 stays published."""
    s = Scenario(sqlite_store, TargetEnv("sql", tmp_path, database_urls("postgresql")), "overwrite")
    s.write("k1", V1)
    s.commit("k1")
    s.reprocess("k1", V2)
    with pytest.raises(SupersedeError, match=r"does not cover 1 key value\(s\).*dt=2026-01-02"):
        s.commit("k1")
    assert s.rows() == expected(V1)
    assert s.store.require(s.pipeline, "k1").state is S.FAILED
    assert [v.state for v in s.store.versions(s.pipeline, "k1")] == [S.COMMITTED]


def test_sql_append_refuses_a_new_version_and_changes_nothing(sqlite_store, tmp_path, database_urls):
    """Appended rows carry no attempt id: the old version's rows cannot be found, so nothing is written."""
    s = Scenario(sqlite_store, TargetEnv("sql", tmp_path, database_urls("postgresql")), "append")
    s.write("k1", V1)
    s.commit("k1")
    s.reprocess("k1", V2)
    with pytest.raises(SupersedeError, match="cannot replace committed attempt"):
        s.commit("k1")
    assert s.rows() == expected(V1)
    assert s.store.require(s.pipeline, "k1").state is S.FAILED
    assert [v.state for v in s.store.versions(s.pipeline, "k1")] == [S.COMMITTED]


# --------------------------------------------------------------------------- table versions


def table_versions(s: Scenario) -> int | None:
    """How many commits the table has seen (``None`` for SQL: one transaction, no versions)."""
    publisher = s.publisher()
    if s.env.kind == "iceberg":
        return len(publisher.load_table().snapshots())
    if s.env.kind == "delta":
        return publisher.load_table().version() + 1
    return None


def rows_at(s: Scenario, n: int) -> list[tuple[str, str]]:
    """The rows the table held after its ``n``-th commit (time travel)."""
    publisher = s.publisher()
    if s.env.kind == "iceberg":
        table = publisher.load_table()
        snapshot = table.snapshots()[n - 1]
        arrow = table.scan(snapshot_id=snapshot.snapshot_id).to_arrow()
    else:
        from deltalake import DeltaTable

        arrow = DeltaTable(publisher.table_uri, version=n - 1).to_pyarrow_table()
    return sorted(zip(arrow["dt"].to_pylist(), arrow["id"].to_pylist(), strict=True))
