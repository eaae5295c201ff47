"""Reprocess as a new version: a committed checkpoint rewritten under the same key supersedes
its committed version in the target and in the committer table (files target, every backend).

The Airflow faces (the write task's policy, backfills through the scheduler) are tested in
tests/test_e2e_backfill.py and tests/test_write_operator.py.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from airflow_provider_walsink.core.commit import CheckpointCommitter
from airflow_provider_walsink.core.protocol import CheckpointState as S
from airflow_provider_walsink.core.store.errors import TransitionError
from airflow_provider_walsink.core.targets import FilePublisher
from airflow_provider_walsink.core.targets.base import StaticContext
from tests.helpers import ACTOR, stage_checkpoint, target_files

V1 = {
    "dt=2026-01-01/part-0.csv": b"2026-01-01,old-a\n" * 3,
    "dt=2026-01-02/part-0.csv": b"2026-01-02,old-b\n" * 2,
}
V2 = {"dt=2026-01-01/part-0.csv": b"2026-01-01,new\n" * 4}
OTHER = {"dt=2026-01-03/part-0.csv": b"2026-01-03,other\n"}


def rows(files: dict[str, bytes]) -> list[bytes]:
    return sorted(line for data in files.values() for line in data.splitlines())


def committer(store, layout, target, mode):
    return CheckpointCommitter(store, layout, FilePublisher(target, mode, layout=layout), mode=mode)


@pytest.mark.parametrize("mode", ["overwrite", "append"])
def test_new_version_supersedes_the_committed_one_everywhere(store, layout, tmp_path, mode):
    target = tmp_path / "target"
    c = committer(store, layout, target, mode)
    stage_checkpoint(store, layout, "p", "k0", OTHER, mode=mode)
    c.commit("p", "k0", actor=ACTOR)
    v1, _, _ = stage_checkpoint(store, layout, "p", "k1", V1, mode=mode)
    c.commit("p", "k1", actor=ACTOR)
    assert rows(target_files(target)) == rows({**OTHER, **V1})

    new = store.begin_version("p", "k1", token="dag/run#1", actor=ACTOR, reason="fixed a bug")
    assert (new.state, new.version, new.supersedes_attempt_id) == (S.REGISTERED, 2, v1.sealed_attempt_id)
    # Until the new version commits, the committed one is what readers see.
    [kept] = store.versions("p", "k1")
    assert (kept.state, kept.version, kept.attempt_id) == (S.COMMITTED, 1, v1.sealed_attempt_id)
    assert rows(target_files(target)) == rows({**OTHER, **V1})

    v2, _, _ = stage_checkpoint(store, layout, "p", "k1", V2, mode=mode)
    assert v2.sealed_attempt_id != v1.sealed_attempt_id
    summary = c.commit("p", "k1", actor=ACTOR)

    # The interval holds the new version only, once; v1's partition that v2 no longer
    # covers is gone too; the other checkpoint is untouched.
    assert rows(target_files(target)) == rows({**OTHER, **V2})
    assert not any(v1.sealed_attempt_id in name for name in target_files(target))
    assert summary.state == "COMMITTED" and summary.attempt_id == v2.sealed_attempt_id
    record = store.require("p", "k1")
    assert (record.state, record.version, record.sealed_attempt_id) == (S.COMMITTED, 2, v2.sealed_attempt_id)
    [old] = store.versions("p", "k1")
    assert old.state is S.SUPERSEDED and old.superseded_by_attempt_id == v2.sealed_attempt_id
    assert old.rows == v1.rows and old.committed_at is not None and old.superseded_at is not None
    details = [h.detail or "" for h in store.history("p", "k1")]
    assert any("SUPERSEDED by version 2" in d for d in details)
    assert any("reprocess: version 2 begins" in d and "fixed a bug" in d for d in details)

    # A re-run of the commit is a no-op; the same token asks for no third version.
    before = target_files(target)
    assert c.commit("p", "k1", actor=ACTOR).already_committed
    assert store.begin_version("p", "k1", token="dag/run#1", actor=ACTOR, reason="retry") is None
    assert target_files(target) == before and store.require("p", "k1").version == 2


@pytest.mark.parametrize("mode", ["overwrite", "append"])
def test_crash_after_publishing_a_new_version_is_finished_by_the_rerun(sqlite_store, layout, tmp_path, mode):
    """The new version was published (old one retracted) but COMMITTED never recorded."""
    store, target = sqlite_store, tmp_path / "target"
    c = committer(store, layout, target, mode)
    v1, _, _ = stage_checkpoint(store, layout, "p", "k1", V1, mode=mode)
    c.commit("p", "k1", actor=ACTOR)
    store.begin_version("p", "k1", token="dag/run#1", actor=ACTOR, reason="reprocess")
    v2, manifest, attempt_dir = stage_checkpoint(store, layout, "p", "k1", V2, mode=mode)
    # What a committer killed right after publishing left behind.
    FilePublisher(target, mode, layout=layout).publish(
        manifest, attempt_dir, StaticContext.for_manifest(manifest, supersedes=v1.sealed_attempt_id)
    )
    assert rows(target_files(target)) == rows(V2)
    assert store.require("p", "k1").state is S.DURABLE

    c.commit("p", "k1", actor=ACTOR)

    assert rows(target_files(target)) == rows(V2)
    assert store.require("p", "k1").state is S.COMMITTED
    assert [v.state for v in store.versions("p", "k1")] == [S.SUPERSEDED]


def test_only_a_committed_checkpoint_gets_a_new_version(sqlite_store, layout):
    stage_checkpoint(sqlite_store, layout, "p", "k1", V1)
    with pytest.raises(TransitionError, match="only a committed checkpoint can be reprocessed"):
        sqlite_store.begin_version("p", "k1", token="t", actor=ACTOR, reason="r")
    assert sqlite_store.require("p", "k1").version == 1 and sqlite_store.versions("p", "k1") == []


def test_a_failed_new_version_leaves_the_committed_one_published(sqlite_store, layout, tmp_path):
    store, target = sqlite_store, tmp_path / "target"
    c = committer(store, layout, target, "overwrite")
    stage_checkpoint(store, layout, "p", "k1", V1)
    c.commit("p", "k1", actor=ACTOR)
    store.begin_version("p", "k1", token="dag/run#1", actor=ACTOR, reason="reprocess")
    _, _, attempt_dir = stage_checkpoint(store, layout, "p", "k1", V2)
    (attempt_dir / "dt=2026-01-01/part-0.csv").write_bytes(b"truncated")  # a bad staged file
    with pytest.raises(Exception, match="staged file does not match"):
        c.commit("p", "k1", actor=ACTOR)
    assert rows(target_files(target)) == rows(V1)
    assert store.require("p", "k1").state is S.FAILED
    assert [v.state for v in store.versions("p", "k1")] == [S.COMMITTED]


@pytest.mark.parametrize("mode", ["overwrite", "append"])
def test_aborting_a_new_version_before_it_publishes_restores_the_committed_one(store, layout, tmp_path, mode):
    from airflow_provider_walsink.core.commit.abort import CheckpointAborter

    target = tmp_path / "target"
    c = committer(store, layout, target, mode)
    v1, _, _ = stage_checkpoint(store, layout, "p", "k1", V1, mode=mode)
    c.commit("p", "k1", actor=ACTOR)
    committed = store.require("p", "k1")
    before = target_files(target)
    store.begin_version("p", "k1", token="dag/run#1", actor=ACTOR, reason="reprocess")
    v2, _, attempt_dir = stage_checkpoint(store, layout, "p", "k1", V2, mode=mode)  # DURABLE

    aborter = CheckpointAborter(
        store, layout, FilePublisher(target, mode, layout=layout), sleep=lambda s: None
    )
    outcome = aborter.abort("p", "k1", reason="wrong fix", actor=ACTOR)

    # The committed version is the checkpoint again, untouched in the target; v2's staging is gone.
    assert outcome.state == "COMMITTED"
    record = store.require("p", "k1")
    assert (record.state, record.version, record.sealed_attempt_id) == (S.COMMITTED, 1, v1.sealed_attempt_id)
    assert (record.rows, record.committed_at, record.supersedes_attempt_id) == (
        committed.rows,
        committed.committed_at,
        None,
    )
    assert store.versions("p", "k1") == [] and target_files(target) == before
    assert not attempt_dir.exists()
    assert any("is the checkpoint again" in (h.detail or "") for h in store.history("p", "k1"))
    # A later reprocess starts version 2 again, and commits it.
    store.begin_version("p", "k1", token="dag/run#2", actor=ACTOR, reason="right fix")
    stage_checkpoint(store, layout, "p", "k1", V2, mode=mode)
    c.commit("p", "k1", actor=ACTOR)
    assert rows(target_files(target)) == rows(V2)


def test_a_new_version_that_began_publishing_cannot_be_aborted(sqlite_store, layout, tmp_path):
    from airflow_provider_walsink.core.commit.abort import CheckpointAborter

    store, target = sqlite_store, tmp_path / "target"
    c = committer(store, layout, target, "append")
    stage_checkpoint(store, layout, "p", "k1", V1, mode="append")
    c.commit("p", "k1", actor=ACTOR)
    store.begin_version("p", "k1", token="dag/run#1", actor=ACTOR, reason="reprocess")
    stage_checkpoint(store, layout, "p", "k1", V2, mode="append")
    lease = store.acquire_lease(
        "p", "k1", owner="committer", ttl=timedelta(minutes=5), actor=ACTOR, mode="append"
    )
    aborter = CheckpointAborter(
        store, layout, FilePublisher(target, "append", layout=layout), sleep=lambda s: None
    )
    with pytest.raises(TransitionError, match="cannot be aborted: re-run its commit task"):
        aborter.abort("p", "k1", reason="stop it", actor=ACTOR)
    assert (
        store.require("p", "k1").state is S.COMMITTING and store.require("p", "k1").lease_epoch == lease.epoch
    )
