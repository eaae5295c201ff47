"""Append offsets after an abort (issue 22, symptom 8): an aborted interval whose source range a
later interval already took over is refused at its write task, with the reason on its row.

Abort interval 2, let interval 3 read on from interval 1's end offsets and commit, then re-run
interval 2: before the fix its write task read from interval 3's end offsets, the commit's order
check (interval 1's end offsets) refused it, and it sat DURABLE forever with no error. Now the
write task refuses it before any attempt starts, naming interval 3, and records why; a row left
stuck by an earlier version is refused by its commit with the same reason, recorded. Every source
row stays in the target exactly once. Files target (lease) and Delta (table fencing); the
committer table on PostgreSQL.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from airflow_provider_walsink.core.commit import CheckpointCommitter
from airflow_provider_walsink.core.commit.abort import CheckpointAborter
from airflow_provider_walsink.core.protocol import CheckpointState as S
from airflow_provider_walsink.core.staging.layout import StagingLayout
from airflow_provider_walsink.core.store import CommitterStore, OrderingError
from airflow_provider_walsink.core.targets import FilePublisher
from airflow_provider_walsink.operators.write import WalWriteOperator
from tests.helpers import ACTOR, stage_checkpoint, target_files

PIPELINE = "events"


def rows(start: int, end: int) -> bytes:
    """The source: line ``i`` is at offset ``i``."""
    return b"".join(b"%d\n" % i for i in range(start, end))


@pytest.fixture
def env(monkeypatch, pg_url, tmp_path):
    staging, target = tmp_path / "staging", tmp_path / "target"
    monkeypatch.setenv(
        "AIRFLOW_CONN_WALSINK_DEFAULT",
        json.dumps({"conn_type": "walsink", "extra": {"url": pg_url, "staging_root": str(staging)}}),
    )
    layout = StagingLayout(staging)
    publisher = FilePublisher(target, "append", layout=layout)
    return SimpleNamespace(
        store=CommitterStore.from_url(pg_url),
        layout=layout,
        target=target,
        committer=CheckpointCommitter(CommitterStore.from_url(pg_url), layout, publisher, mode="append"),
        aborter=CheckpointAborter(CommitterStore.from_url(pg_url), layout, publisher, sleep=lambda s: None),
    )


def interval(env, key: str, start: int, end: int) -> None:
    stage_checkpoint(
        env.store,
        env.layout,
        PIPELINE,
        key,
        {f"part-{key}-{start}.txt": rows(start, end)},
        mode="append",
        start_offsets={"src": start},
        end_offsets={"src": end},
    )


def source_rows(env) -> list[int]:
    return sorted(int(line) for data in target_files(env.target).values() for line in data.splitlines())


def rerun_write_task(key: str) -> None:
    op = WalWriteOperator(
        task_id="write", application="/nonexistent.py", pipeline=PIPELINE, mode="append", checkpoint_key=key
    )
    op.execute(
        {"ti": SimpleNamespace(dag_id=ACTOR.dag_id, task_id="write", run_id="r", try_number=1, map_index=-1)}
    )


def test_an_aborted_append_interval_taken_over_by_a_later_commit_is_refused_at_its_write_task(env):
    store = env.store
    interval(env, "k1", 0, 10)
    env.committer.commit(PIPELINE, "k1", actor=ACTOR)
    interval(env, "k2", 10, 20)
    env.aborter.abort(PIPELINE, "k2", reason="INC-1: bad input", actor=ACTOR)
    interval(env, "k3", 10, 25)  # reads on from k1's end: k2's range is k3's now
    env.committer.commit(PIPELINE, "k3", actor=ACTOR)
    assert source_rows(env) == list(range(25))

    with pytest.raises(OrderingError, match="k3"):
        rerun_write_task("k2")
    record = store.require(PIPELINE, "k2")
    assert record.state is S.ABORTED and record.attempt == 1  # no attempt started
    assert record.error and "k3" in record.error and "took over" in record.error  # CLI status and UI show it
    assert store.history(PIPELINE, "k2")[-1].detail == record.error

    # The next interval reads on from k3's end; every source row once.
    interval(env, "k4", 25, 30)
    env.committer.commit(PIPELINE, "k4", actor=ACTOR)
    assert source_rows(env) == list(range(30))


def test_an_append_interval_left_stuck_behind_a_later_commit_is_refused_by_its_commit_with_the_reason(env):
    """A row that reached DURABLE before the write task refused it (an earlier walsink): the commit
    refuses it with the same reason and records it, instead of an unrecorded ordering error."""
    store = env.store
    interval(env, "k1", 0, 10)
    env.committer.commit(PIPELINE, "k1", actor=ACTOR)
    interval(env, "k2", 10, 20)
    env.aborter.abort(PIPELINE, "k2", reason="INC-1: bad input", actor=ACTOR)
    interval(env, "k3", 10, 25)
    env.committer.commit(PIPELINE, "k3", actor=ACTOR)
    # What the write task did before: a new attempt of k2 from the last committed offsets (k3's end),
    # staged with the store's own calls (the write task no longer starts it) and given those offsets.
    stage_checkpoint(
        store,
        env.layout,
        PIPELINE,
        "k2",
        {"part-k2-25.txt": rows(25, 30)},
        mode="append",
        end_offsets={"src": 30},
    )
    from sqlalchemy import update

    from airflow_provider_walsink.core.store.models import checkpoint_table as ckpt

    with store.engine.begin() as conn:  # the start offsets that write task gave it
        conn.execute(
            update(ckpt)
            .where(ckpt.c.pipeline == PIPELINE, ckpt.c.checkpoint_key == "k2")
            .values(start_offsets=json.dumps({"src": 25}))
        )
    assert store.require(PIPELINE, "k2").state is S.DURABLE

    with pytest.raises(OrderingError, match="k3"):
        env.committer.commit(PIPELINE, "k2", actor=ACTOR)
    record = store.require(PIPELINE, "k2")
    assert record.state is not S.COMMITTED
    assert record.error and "k3" in record.error and "took over" in record.error
    assert source_rows(env) == list(range(25))
