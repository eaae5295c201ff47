"""Issue 23: one source of truth for where a checkpoint is staged.

The write task records the staging root it used on the checkpoint's row
(``walsink_checkpoint.staging_root``); every later attempt and version keeps
it, and every reader (durability sensor, commit, audit, GC, abort, UI, CLI)
looks there, even when the connection's ``staging_root`` says something else
by then. Rows written before the column existed have none: readers derive it
as they did before.

The write task runs for real (``WalWriteOperator.execute``) with its Spark
submission replaced by a stand-in that stages and seals as a job would (no
JVM): the recording is the operator's own code.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_provider_walsink.core.protocol import CheckpointState as S
from airflow_provider_walsink.core.protocol.manifest import (
    MANIFEST_NAME,
    Committable,
    build_manifest,
    write_manifest,
)
from airflow_provider_walsink.core.runners import JobRunner
from airflow_provider_walsink.core.spark.args import ProtocolArgs
from airflow_provider_walsink.core.staging import StagingLayout
from airflow_provider_walsink.core.store import CommitterStore
from airflow_provider_walsink.operators.write import WalWriteOperator
from tests.helpers import ACTOR, stage_checkpoint, target_files

INTERVAL_START = datetime(2026, 4, 1, tzinfo=UTC)
KEY = "20260401T000000Z"
DATA = b"1,2026-04-01\n2,2026-04-01\n"
REL = "dt=2026-04-01/part-0.csv"


def use_root(monkeypatch, url: str, root: Path) -> None:
    """Point the default walsink connection's ``staging_root`` at ``root``."""
    monkeypatch.setenv(
        "AIRFLOW_CONN_WALSINK_DEFAULT",
        json.dumps({"conn_type": "walsink", "extra": {"url": url, "staging_root": str(root)}}),
    )


def context(task_id: str, pushed: dict[str, Any] | None = None) -> dict[str, Any]:
    ti = SimpleNamespace(dag_id="staging_root_test", task_id=task_id, run_id="manual", try_number=1,
                         map_index=-1, id=None,
                         xcom_push=lambda key, value: (pushed if pushed is not None else {}).__setitem__(key, value))  # fmt: skip
    return {"ti": ti, "logical_date": INTERVAL_START, "data_interval_start": INTERVAL_START,
            "data_interval_end": INTERVAL_START + timedelta(days=1)}  # fmt: skip


class StandInJob(JobRunner):
    """What ``spark-submit`` of a CheckpointJob does, without Spark: stage one file under the
    protocol's staging root and seal the manifest (``seal=False``: exit without sealing)."""

    def __init__(self, seal: bool) -> None:
        self.seal = seal

    def submit(self, application: str, arguments: Any, env: Any) -> None:
        protocol, _ = ProtocolArgs.from_argv(list(arguments))
        layout = StagingLayout(protocol.staging_root)
        attempt_dir = layout.attempt_dir(
            protocol.pipeline, protocol.checkpoint_key, protocol.attempt, protocol.attempt_id
        )
        (attempt_dir / REL).parent.mkdir(parents=True, exist_ok=True)
        (attempt_dir / REL).write_bytes(DATA)
        if not self.seal:
            return
        manifest = build_manifest(
            pipeline=protocol.pipeline,
            checkpoint_key=protocol.checkpoint_key,
            sequence=protocol.sequence,
            attempt=protocol.attempt,
            attempt_id=protocol.attempt_id,
            file_format="csv",
            partition_columns=("dt",),
            committables=[Committable(path=REL, size=len(DATA), rows=2)],
            start_offsets=protocol.start_offsets,
        )
        write_manifest(attempt_dir / MANIFEST_NAME, manifest)

    def wait(self) -> None:
        pass

    def cancel(self) -> None:
        pass


def write_task(*, seal: bool = True, **kwargs: Any) -> WalWriteOperator:
    op = WalWriteOperator(
        task_id="write",
        application="job.py",
        pipeline="events",
        checkpoint_key=KEY,
        partition_by=["dt"],
        **kwargs,
    )
    op.get_runner = lambda: StandInJob(seal)  # type: ignore[method-assign]
    return op


@pytest.fixture
def roots(monkeypatch, sqlite_store, database_urls, tmp_path):
    """The committer store and two staging roots: A (the connection's at first) and B."""
    url = database_urls("sqlite")
    a, b = tmp_path / "root-a", tmp_path / "root-b"
    use_root(monkeypatch, url, a)
    return CommitterStore.from_url(url), StagingLayout(a), StagingLayout(b), url


# ------------------------------------------------------------------------------ the store's rule


def test_the_recorded_root_wins_for_later_attempts_and_versions(db_url):
    """Registered under A: an attempt asking for B stages under A (the record says so, and the
    history names both); a new version (reprocess) keeps A too. A row without a root gets the
    root of its next attempt."""
    store = CommitterStore.from_url(db_url)
    store.register("p", KEY, mode="overwrite", actor=ACTOR, staging_root="/data/a")
    first = store.start_attempt("p", KEY, actor=ACTOR, staging_root="/data/a")
    assert first.staging_root == "/data/a"
    second = store.start_attempt("p", KEY, actor=ACTOR, staging_root="/data/b")
    assert second.attempt == 2 and second.staging_root == "/data/a"
    said = store.history("p", KEY)[-1].detail
    assert "/data/b" in said and "/data/a" in said and "kept" in said

    store.register("p", KEY, mode="overwrite", actor=ACTOR, staging_root="/data/b")  # idempotent
    assert store.require("p", KEY).staging_root == "/data/a"

    # Commit it, then reprocess: the new version's attempts stay under A.
    store.seal("p", KEY, attempt=2, manifest_uri="file:///m", manifest_digest="sha256:x", committables=0,
               rows=0, bytes=0, actor=ACTOR, attempt_id=second.attempt_id)  # fmt: skip
    store.mark_durable("p", KEY, attempt=2, actor=ACTOR)
    lease = store.acquire_lease("p", KEY, owner="c", ttl=timedelta(minutes=1), actor=ACTOR)
    store.mark_committed(lease, actor=ACTOR)
    assert store.begin_version("p", KEY, token="d/r#1", actor=ACTOR, reason="fix") is not None
    assert store.start_attempt("p", KEY, actor=ACTOR, staging_root="/data/b").staging_root == "/data/a"

    # A row registered without a root (before walsink recorded it) gets its next attempt's.
    store.register("p", "20260402T000000Z", mode="overwrite", actor=ACTOR)
    assert store.require("p", "20260402T000000Z").staging_root is None
    got = store.start_attempt("p", "20260402T000000Z", actor=ACTOR, staging_root="/data/b")
    assert got.staging_root == "/data/b" and store.require("p", "20260402T000000Z").staging_root == "/data/b"
    store.dispose()


def test_layout_of_a_record_falls_back_only_without_a_root(sqlite_store, tmp_path):
    store = sqlite_store
    store.register("p", KEY, mode="overwrite", actor=ACTOR, staging_root=str(tmp_path / "a"))
    store.register("p", "20260402T000000Z", mode="overwrite", actor=ACTOR)
    asked = []

    def fallback() -> StagingLayout:
        asked.append(1)
        return StagingLayout(tmp_path / "b")

    assert store.require("p", KEY).layout(fallback).root == tmp_path / "a"
    assert asked == []  # not derived for a recorded row
    assert store.require("p", "20260402T000000Z").layout(fallback).root == tmp_path / "b"
    assert store.require("p", "20260402T000000Z").layout(StagingLayout(tmp_path / "c")).root == tmp_path / "c"


# ------------------------------------------------------------------------------ the write task


def test_the_write_task_records_its_root_and_a_retry_stays_there_after_the_connection_moved(
    roots, monkeypatch
):
    store, a, b, url = roots
    with pytest.raises(Exception, match="sealed no manifest"):
        write_task(seal=False).execute(context("write"))
    record = store.require("events", KEY)
    assert record.staging_root == str(a.root)
    assert a.attempt_dir("events", KEY, 1, record.attempt_id).is_dir()

    use_root(monkeypatch, url, b.root)  # the connection now names another staging root
    pushed: dict[str, Any] = {}
    summary = write_task().execute(context("write", pushed))
    record = store.require("events", KEY)
    assert (record.state, summary["attempt"]) == (S.SEALED, 2)
    assert record.staging_root == str(a.root) and pushed["staging_root"] == str(a.root)
    assert a.manifest_path("events", KEY, 2, record.attempt_id).is_file()
    assert record.manifest_uri == a.manifest_path("events", KEY, 2, record.attempt_id).as_uri()
    assert not b.root.exists()  # nothing staged under B


# ------------------------------------------------------------------------------ the readers


@pytest.fixture
def staged_under_a_then_moved(roots, monkeypatch):
    """Attempt 1 (unsealed, garbage) and attempt 2 (sealed) staged under A by the write task;
    then the connection's staging root moves to B."""
    store, a, b, url = roots
    with pytest.raises(Exception, match="sealed no manifest"):
        write_task(seal=False).execute(context("write"))
    write_task().execute(context("write"))
    b.root.mkdir(parents=True)
    use_root(monkeypatch, url, b.root)
    return roots


def test_the_sensor_reads_the_recorded_root(staged_under_a_then_moved):
    from airflow_provider_walsink.sensors.durable import CheckpointDurableSensor

    store, *_ = staged_under_a_then_moved
    sensor = CheckpointDurableSensor(task_id="durable", pipeline="events", checkpoint_key=KEY)
    assert sensor.poke(context("durable")), sensor._last
    assert store.require("events", KEY).state is S.DURABLE


def test_the_commit_task_reads_the_recorded_root(staged_under_a_then_moved, tmp_path):
    from airflow_provider_walsink.operators.commit import WalCommitOperator

    store, *_ = staged_under_a_then_moved
    store.mark_durable("events", KEY, attempt=2, actor=ACTOR)
    target = tmp_path / "target"
    commit = WalCommitOperator(task_id="commit", pipeline="events", target=str(target), checkpoint_key=KEY,
                               partition_by=["dt"], emit_asset_events=False)  # fmt: skip
    summary = commit.execute(context("commit"))
    assert summary["state"] == "COMMITTED" and summary["published"] == 1
    assert list(target_files(target).values()) == [DATA]
    assert store.require("events", KEY).state is S.COMMITTED


def test_the_deferrable_trigger_reads_the_recorded_root(staged_under_a_then_moved):
    from airflow_provider_walsink.triggers.durable import CheckpointDurableTrigger

    store, *_ = staged_under_a_then_moved
    trigger = CheckpointDurableTrigger(pipeline="events", checkpoint_key=KEY)
    status = trigger._check(*trigger._resolve())
    assert status.durable, status.message
    assert store.require("events", KEY).state is S.DURABLE


def test_gc_walks_the_recorded_root(staged_under_a_then_moved):
    from airflow_provider_walsink.core.commit.gc import collect_garbage

    store, a, b, _url = staged_under_a_then_moved
    record = store.require("events", KEY)
    garbage = [p for n, _i, p in a.staged_attempts("events", KEY) if n == 1]
    assert len(garbage) == 1
    report = collect_garbage(store, b, retention=timedelta(0))  # the connection's root: B
    assert report.attempts_removed == [f"events/{KEY}/{garbage[0].name}"]
    assert not garbage[0].exists()
    assert a.manifest_path("events", KEY, 2, record.attempt_id).is_file()  # the sealed attempt stays


def test_abort_reads_the_recorded_root(staged_under_a_then_moved):
    from airflow_provider_walsink.hooks.aborts import aborter_for

    store, a, b, _url = staged_under_a_then_moved
    aborter = aborter_for(store, "events", staging_root=str(b.root), checkpoint_key=KEY)
    assert aborter.staging.layout.root == a.root
    outcome = aborter.abort("events", KEY, reason="wrong input", actor=ACTOR)
    assert outcome.state == "ABORTED"
    assert outcome.staging_removed  # the staging under A, where the attempts are
    assert not a.staged_attempts("events", KEY)


def test_the_cli_abort_reads_the_recorded_root(staged_under_a_then_moved, capsys):
    from airflow_provider_walsink.cli.commands import main

    store, a, b, url = staged_under_a_then_moved
    code = main(["--url", url, "abort", "events", KEY, "--reason", "bad", "--staging-root", str(b.root)])
    assert code == 0, capsys.readouterr()
    assert store.require("events", KEY).state is S.ABORTED
    assert not a.staged_attempts("events", KEY)


def test_a_row_without_a_root_is_read_where_it_was_staged_before(sqlite_store, tmp_path):
    """Rows from before the column: the readers' old derivation (here the layout given)."""
    from airflow_provider_walsink.triggers.durable import evaluate_durability

    layout = StagingLayout(tmp_path / "staging")
    stage_checkpoint(sqlite_store, layout, "old", KEY, {REL: DATA}, durable=False)
    assert sqlite_store.require("old", KEY).staging_root is None
    status = evaluate_durability(sqlite_store, layout, "old", KEY, actor=ACTOR)
    assert status.durable, status.message


def test_the_audit_reads_the_recorded_root(staged_under_a_then_moved):
    from airflow_provider_walsink.core.commit.audit import as_checks, audit_checkpoint

    store, _a, b, _url = staged_under_a_then_moved
    store.mark_durable("events", KEY, attempt=2, actor=ACTOR)
    seen: list[int] = []

    def rows_staged(staged) -> bool:
        seen.append(staged.manifest.total_rows)
        return True

    outcome = audit_checkpoint(
        store, b, "events", KEY, as_checks([rows_staged]), actor=ACTOR
    )  # the connection's: B
    assert outcome.verdict == "AUDITED" and seen == [2]
