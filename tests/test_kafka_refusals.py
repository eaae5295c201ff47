"""Issue 28: a Kafka plan the source refuses leaves the committer table unchanged.

Through the real write operator (``WalWriteOperator.execute``; the job is never submitted: the
refusal comes first) against librdkafka's mock cluster in a child process, the committer table
on PostgreSQL. The earlier checkpoints are staged and committed with the core
(``CheckpointWriter``, ``CheckpointCommitter``) into a files target, with end offsets the tests
choose. A committed end beyond the real log's end, or naming a partition the real topic does
not have, is what a topic deleted and recreated looks like to walsink: no fault injection.
The retention gap is a **fault injected at the planner's cluster boundary**
(``ConsumerMetadata.watermarks`` reports a raised low watermark; the mock cluster cannot
delete records on request).

Each refusal must leave no new checkpoint row, no new version, no source plan and no new
history row (before the fix, the write task registered the checkpoint, or began the
reprocess's new version, before it planned).
"""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

try:
    import confluent_kafka  # noqa: F401
except ImportError:  # the kafka extra; CI installs it, so there a missing one fails the run
    from tests.helpers import missing_prerequisite

    missing_prerequisite('confluent-kafka is not installed (pip install ".[kafka]")')

from airflow_provider_walsink.core.commit import CheckpointCommitter
from airflow_provider_walsink.core.sources.kafka import (  # noqa: E402
    ConsumerMetadata,
    OffsetsWentBackwardsError,
    RetentionGapError,
)
from airflow_provider_walsink.core.staging.layout import StagingLayout  # noqa: E402
from airflow_provider_walsink.core.store import CommitterStore  # noqa: E402
from airflow_provider_walsink.core.targets import FilePublisher  # noqa: E402
from airflow_provider_walsink.operators.write import WalWriteOperator  # noqa: E402
from tests.helpers import ACTOR, stage_checkpoint  # noqa: E402
from tests.kafka_mock import MockKafka  # noqa: E402


@pytest.fixture(scope="module")
def kafka():
    cluster = MockKafka()
    yield cluster
    cluster.stop()


#: The earlier checkpoints are written by the same DAG as the write operator's (a pipeline id
#: belongs to the DAG that first registered it: another DAG's write would be refused).
OWNER = dataclasses.replace(ACTOR, dag_id="kafka_refusals")


def key(day: int) -> str:
    return f"202606{day:02d}T000000Z"


def context(day: int, *, dag_run: Any = None, run: str = "scheduled") -> dict[str, Any]:
    start = datetime(2026, 6, day, tzinfo=UTC)
    ti = SimpleNamespace(dag_id="kafka_refusals", task_id="write", run_id=f"{run}__{day}", try_number=1,
                         map_index=-1, id=None, xcom_push=lambda key, value: None)  # fmt: skip
    return {"ti": ti, "logical_date": start, "data_interval_start": start,
            "data_interval_end": start + timedelta(days=1), "dag_run": dag_run}  # fmt: skip


class Pipeline:
    """A files-target append pipeline reading ``topic``; earlier checkpoints committed by the core."""

    def __init__(self, tmp_path: Path, url: str, kafka: MockKafka, monkeypatch, topic: str, **source: Any):
        self.topic = topic
        self.pipeline = topic.replace("-", "_")
        self.staging = tmp_path / "staging"
        self.target = tmp_path / "target"
        self.source = {"kind": "kafka", "topics": [topic], **source}
        monkeypatch.setenv("AIRFLOW_CONN_WALSINK_DEFAULT", json.dumps(
            {"conn_type": "walsink", "extra": {"url": url, "staging_root": str(self.staging)}}))  # fmt: skip
        monkeypatch.setenv(
            "AIRFLOW_CONN_KAFKA_DEFAULT", json.dumps({"conn_type": "kafka", "extra": kafka.config})
        )
        self.store = CommitterStore.from_url(url)
        self.layout = StagingLayout(self.staging)

    def commit(self, day: int, start: dict | None, end: dict) -> None:
        """Checkpoint ``day`` staged and committed with these offsets (as an earlier write task would)."""
        self.store.register(self.pipeline, key(day), mode="append", actor=OWNER, target=str(self.target))
        stage_checkpoint(self.store, self.layout, self.pipeline, key(day), {f"part-{day}.txt": b"r\n"}, mode="append",
                         start_offsets=start, end_offsets=end, actor=OWNER)  # fmt: skip
        publisher = FilePublisher(self.target, "append", layout=self.layout)
        CheckpointCommitter(self.store, self.layout, publisher, mode="append").commit(
            self.pipeline, key(day), actor=OWNER
        )

    def write(self, day: int, **kwargs: Any) -> dict:
        ctx = context(day, **{k: kwargs.pop(k) for k in ("dag_run", "run") if k in kwargs})
        op = WalWriteOperator(task_id="write", application="/nonexistent/job.py", pipeline=self.pipeline, mode="append",
                              target=str(self.target), source=self.source, **kwargs)  # fmt: skip
        return op.execute(ctx)

    def snapshot(self) -> dict[str, Any]:
        """Everything a refusal must leave alone: rows, versions, plans, history of every key."""
        out: dict[str, Any] = {}
        for day in range(1, 5):
            rec = self.store.get(self.pipeline, key(day))
            if rec is None:
                continue
            out[key(day)] = (
                rec.state, rec.version, rec.attempt, rec.start_offsets, rec.end_offsets,
                self.store.source_plan(self.pipeline, key(day)),
                [(h.detail, h.to_state) for h in self.store.history(self.pipeline, key(day))],
                len(self.store.versions(self.pipeline, key(day))),
            )  # fmt: skip
        return out


def produce(kafka: MockKafka, topic: str, n: int) -> dict[str, int]:
    kafka.produce(topic, [{"key": b"k", "value": b"v", "partition": i % 2} for i in range(n)])
    return {str(p): high for p, (_, high) in kafka.watermarks(topic).items()}


def test_offsets_that_went_backwards_are_refused_before_the_checkpoint_is_registered(
    kafka, pg_url, tmp_path, monkeypatch
):
    """Checkpoint 1 committed up to offset 500 of partition 0; the real log ends at 3 (the topic
    was deleted and recreated): checkpoint 2's write refuses, and no row of it exists."""
    p = Pipeline(tmp_path, pg_url, kafka, monkeypatch, "refuse-backwards")
    ends = produce(kafka, "refuse-backwards", 6)
    p.commit(1, None, {p.topic: {**ends, "0": 500}})
    before = p.snapshot()
    with pytest.raises(OffsetsWentBackwardsError, match=r"partition 0: the log ends at offset 3"):
        p.write(2)
    assert p.store.get(p.pipeline, key(2)) is None
    assert p.snapshot() == before


def test_a_partition_that_vanished_is_refused_before_the_checkpoint_is_registered(
    kafka, pg_url, tmp_path, monkeypatch
):
    """Checkpoint 1 read partition 9; the real topic has 4 partitions (recreated with fewer)."""
    p = Pipeline(tmp_path, pg_url, kafka, monkeypatch, "refuse-vanished")
    ends = produce(kafka, "refuse-vanished", 4)
    p.commit(1, None, {p.topic: {**ends, "9": 7}})
    before = p.snapshot()
    with pytest.raises(OffsetsWentBackwardsError, match=r"has no partition 9 any more"):
        p.write(2)
    assert p.store.get(p.pipeline, key(2)) is None
    assert p.snapshot() == before


def test_fault_injected_retention_gap_is_refused_before_the_checkpoint_is_registered(
    kafka, pg_url, tmp_path, monkeypatch
):
    """FAULT INJECTED at the planner's cluster boundary: partition 0's low watermark reported past
    checkpoint 1's end (retention deleted [2, 4)). Without accept_data_loss the write refuses,
    naming the range, with no row; with it, the checkpoint is registered and the gap recorded."""
    p = Pipeline(tmp_path, pg_url, kafka, monkeypatch, "refuse-retention")
    ends = produce(kafka, "refuse-retention", 10)  # 5 records in partitions 0 and 1
    p.commit(1, None, {p.topic: {**ends, "0": 2}})
    real = ConsumerMetadata.watermarks

    def retention(self, topic, partition):
        low, high = real(self, topic, partition)
        return (4, high) if (topic, partition) == (p.topic, 0) else (low, high)

    monkeypatch.setattr(ConsumerMetadata, "watermarks", retention)
    before = p.snapshot()
    with pytest.raises(RetentionGapError, match=r"partition 0: offsets \[2, 4\) \(2 records\)"):
        p.write(2)
    assert p.store.get(p.pipeline, key(2)) is None
    assert p.snapshot() == before

    # The same gap accepted: the checkpoint is registered and the gap is in its history (the job
    # itself is not there to run: the attempt then fails, after the plan was recorded).
    p.source["accept_data_loss"] = True
    with pytest.raises(Exception):  # noqa: B017 - spark-submit of a missing application
        p.write(2)
    plan = p.store.source_plan(p.pipeline, key(2))
    assert plan["gaps"] == [{"topic": p.topic, "partition": 0, "start": 2, "end": 4}]
    assert any("DATA LOSS" in (h.detail or "") or "[2, 4)" in (h.detail or "")
               for h in p.store.history(p.pipeline, key(2)))  # fmt: skip


def test_a_replace_reprocess_of_a_range_the_log_lost_is_refused_before_a_new_version_begins(
    kafka, pg_url, tmp_path, monkeypatch
):
    """Checkpoint 1 committed [0, 50) of partition 0, the log ends at 2 now: its ``replace``
    reprocess refuses before the new version is begun (no version row, no history row)."""
    p = Pipeline(tmp_path, pg_url, kafka, monkeypatch, "refuse-reprocess")
    ends = produce(kafka, "refuse-reprocess", 4)
    zero = {t: {q: 0 for q in parts} for t, parts in {p.topic: ends}.items()}
    p.commit(1, zero, {p.topic: {**ends, "0": 50}})
    before = p.snapshot()
    backfill = SimpleNamespace(conf={"walsink_reprocess": "replace"}, clear_number=0, run_type="backfill")
    with pytest.raises(OffsetsWentBackwardsError, match=r"partition 0: the log ends at offset 2"):
        p.write(1, run="backfill", dag_run=backfill)
    assert p.snapshot() == before
    assert p.store.require(p.pipeline, key(1)).is_committed
