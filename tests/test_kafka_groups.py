"""Issue 35, Kafka consumer groups and topic identity, on SQLite, PostgreSQL and MariaDB.

* A consumer group belongs to the first pipeline that plans with it on its cluster
  (``walsink_consumer_group``, migration 0009): a second pipeline naming it is refused at its
  write phase's plan, naming both pipelines and the group, with nothing recorded for it; two
  pipelines claiming at once cannot both win (the table's primary key).
* A plan records the topic id of each topic it reads; a topic deleted and recreated (a new id)
  is refused even when it already holds more records than were read, with nothing committed and
  the group's offsets unchanged.

Real parts: librdkafka's mock cluster in a child process (``tests/kafka_mock.py``; its admin
API gives topic ids once broker 1 is named the controller, and it deletes and recreates a
topic on request, giving the new topic a new id), the committer table on every backend, the
write phase (``WritePhase.run``) and the commit (``CheckpointCommitter``). The job is never
submitted: the refusals come first.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

try:
    import confluent_kafka  # noqa: F401
except ImportError:  # the kafka extra; CI installs it, so there a missing one fails the run
    from tests.helpers import missing_prerequisite

    missing_prerequisite('confluent-kafka is not installed (pip install ".[kafka]")')

from airflow_provider_walsink.core.commit import CheckpointCommitter  # noqa: E402
from airflow_provider_walsink.core.commit.write_phase import WritePhase  # noqa: E402
from airflow_provider_walsink.core.sources.kafka import (  # noqa: E402
    ConsumerMetadata,
    KafkaOffsetSource,
    TopicRecreatedError,
    cluster_scope,
)
from airflow_provider_walsink.core.staging.layout import StagingLayout  # noqa: E402
from airflow_provider_walsink.core.store import CommitterStore  # noqa: E402
from airflow_provider_walsink.core.store.errors import ConsumerGroupOwnedError  # noqa: E402
from airflow_provider_walsink.core.targets import FilePublisher  # noqa: E402
from tests.helpers import ACTOR, stage_checkpoint  # noqa: E402
from tests.kafka_mock import MockKafka  # noqa: E402


@pytest.fixture(scope="module")
def kafka():
    cluster = MockKafka()
    yield cluster
    cluster.stop()


class _NeverRun:
    """The job runner of a write phase refused before it submits anything."""

    def submit(self, *args: Any) -> None:
        raise AssertionError("the job must not be submitted: the plan is refused first")

    wait = submit


def write_phase(store: CommitterStore, pipeline: str, key: str, source: KafkaOffsetSource, tmp: Path):
    def never(*_: Any) -> Any:
        raise AssertionError("not reached: the source's plan is refused first")

    return WritePhase(store=store, runner=_NeverRun(), pipeline=pipeline, checkpoint_key=key, mode="append",
                      application="/nonexistent/job.py", staging_root=str(tmp / "staging"), staging=never,
                      credentials_env=never, check_placement=never, reprocess=never, version_token=never,
                      source=source)  # fmt: skip


def first_checkpoint(
    store: CommitterStore, pipeline: str, key: str, source: KafkaOffsetSource, tmp: Path
) -> dict:
    """Plan, register and record the source's plan as the write phase does, then stage and commit
    the checkpoint with the plan's end offsets (the job is replaced by ``stage_checkpoint``)."""
    source.plan(store, pipeline, None, (None, None))
    record = store.register(pipeline, key, mode="append", actor=ACTOR, target=str(tmp / "target"))
    start, end, _ = source.record(store, record, start_offsets=None, until_offsets=None, actor=ACTOR)
    layout = StagingLayout(tmp / "staging")
    stage_checkpoint(store, layout, pipeline, key, {"part-0.txt": b"r\n"}, mode="append",
                     start_offsets=start, end_offsets=end)  # fmt: skip
    CheckpointCommitter(
        store, layout, FilePublisher(tmp / "target", "append", layout=layout), mode="append"
    ).commit(pipeline, key, actor=ACTOR)
    return end


def rows(store: CommitterStore, pipeline: str) -> dict[str, tuple]:
    """Everything a refusal must leave alone: rows, versions, plans and history of each key."""
    out = {}
    for key in ("k1", "k2"):
        r = store.get(pipeline, key)
        if r is not None:
            out[key] = (r.state.value, r.version, r.attempt, r.start_offsets, r.end_offsets,
                        store.source_plan(pipeline, key), len(store.versions(pipeline, key)),
                        [h.detail for h in store.history(pipeline, key)])  # fmt: skip
    return out


def test_two_pipelines_naming_the_same_consumer_group_the_second_is_refused(
    store: CommitterStore, kafka: MockKafka, tmp_path: Path
):
    topic, group = f"shared-group-{store.engine.dialect.name}", f"lag-{store.engine.dialect.name}"
    kafka.produce(topic, [{"value": b"x", "partition": 0} for _ in range(3)])
    spec = {"topics": [topic], "group_id": group}

    first_checkpoint(store, "orders", "k1", KafkaOffsetSource(spec, kafka.config), tmp_path / "orders")
    with ConsumerMetadata(kafka.config) as meta:
        scope = cluster_scope(meta, kafka.config)
    assert scope.startswith("cluster:mockCluster")  # the cluster id from metadata, not the bootstrap list
    assert store.consumer_group_owner(scope, group) == "orders"

    other = write_phase(store, "refunds", "k1", KafkaOffsetSource(spec, kafka.config), tmp_path / "refunds")
    with pytest.raises(ConsumerGroupOwnedError) as refused:
        other.run(lambda: ACTOR)
    message = str(refused.value)
    assert f"consumer group {group!r}" in message
    assert "belongs to pipeline 'orders'" in message and "pipeline 'refunds' names it too" in message
    assert "its own group_id" in message
    # Nothing recorded for the refused checkpoint: no row, no pipeline, the group still the first's.
    assert store.get("refunds", "k1") is None and rows(store, "refunds") == {}
    assert "refunds" not in {p["name"] for p in store.pipelines(with_counts=False)}
    assert store.consumer_group_owner(scope, group) == "orders"
    # The owner plans with its group again (its next checkpoint), and another group is free.
    KafkaOffsetSource(spec, kafka.config).plan(store, "orders", None, None)
    KafkaOffsetSource({**spec, "group_id": f"{group}-refunds"}, kafka.config).plan(
        store, "refunds", None, None
    )
    assert store.consumer_group_owner(scope, f"{group}-refunds") == "refunds"


def test_two_pipelines_claiming_one_group_at_once_cannot_both_win(store: CommitterStore):
    """The primary key (cluster, group id) is the referee: of two claims at once, one inserts
    and the other reads the winner back and is refused."""

    def race(group: str) -> tuple[list[str], list[str]]:
        barrier, won, refused = threading.Barrier(2), [], []

        def claim(pipeline: str) -> None:
            barrier.wait()
            try:
                won.append(store.claim_consumer_group("cluster:c1", group, pipeline))
            except ConsumerGroupOwnedError as e:
                refused.append(str(e))

        threads = [threading.Thread(target=claim, args=(p,)) for p in ("alpha", "beta")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return won, refused

    for round_ in range(5):
        group = f"race-{round_}"
        won, refused = race(group)
        assert len(won) == 1 and len(refused) == 1, (won, refused)
        loser = "beta" if won == ["alpha"] else "alpha"
        assert f"belongs to pipeline {won[0]!r}" in refused[0]
        assert f"pipeline {loser!r} names it" in refused[0]
        assert store.consumer_group_owner("cluster:c1", group) == won[0]
    # Scoped per cluster: the same group id on another cluster is another group.
    assert store.claim_consumer_group("cluster:c2", "race-0", "gamma") == "gamma"


def test_a_group_handed_over_after_the_plan_gets_no_offsets_from_the_pipeline_that_planned_with_it(
    store: CommitterStore, kafka: MockKafka, tmp_path: Path
):
    """The after-commit step re-checks the group's owner under the pipeline's lock: ``orders``
    planned with the group and committed, then the group was handed over to ``refunds`` before
    ``orders``' commit task sent its offsets. The send is refused naming both pipelines, and the
    group's offsets are untouched; handed back, ``orders``' next after-commit sends them."""
    from sqlalchemy import update

    from airflow_provider_walsink.core.store.models import consumer_group_table as groups

    topic, group = f"moved-{store.engine.dialect.name}", f"moved-lag-{store.engine.dialect.name}"
    kafka.produce(topic, [{"value": b"x", "partition": 0} for _ in range(3)])
    source = KafkaOffsetSource({"topics": [topic], "group_id": group}, kafka.config)
    end = first_checkpoint(store, "orders", "k1", source, tmp_path)
    with ConsumerMetadata(kafka.config) as meta:
        scope = cluster_scope(meta, kafka.config)
    assert store.consumer_group_owner(scope, group) == "orders"
    # Handed over between orders' plan and its commit task's after-commit step (another process).
    with store.engine.begin() as conn:
        conn.execute(update(groups).where(groups.c.group_id == group).values(pipeline="refunds"))
    before = kafka.committed(group, topic)

    with pytest.raises(ConsumerGroupOwnedError) as refused:
        source.after_commit(store, "orders")
    message = str(refused.value)
    assert f"consumer group {group!r}" in message and scope in message
    assert "belongs to pipeline 'refunds' now, not to pipeline 'orders'" in message
    assert "no offsets of 'orders' were sent" in message and "walsink reassign-group" in message
    assert kafka.committed(group, topic) == before  # nothing sent
    assert store.consumer_group_owner(scope, group) == "refunds"
    assert store.require("orders", "k1").state.value == "COMMITTED"  # the commit itself stands

    # Handed back (walsink reassign-group): orders' committed end offsets reach the group.
    assert store.reassign_consumer_group(scope, group, "orders") == "refunds"
    assert source.after_commit(store, "orders") == {"kafka_group_offsets": end}
    assert kafka.committed(group, topic) == {0: 3, 1: 0, 2: 0, 3: 0}


def test_a_hand_over_waits_for_a_send_of_the_previous_owner_in_flight(store: CommitterStore):
    """``reassign_consumer_group`` takes the lock the after-commit send holds: a send in flight ends
    before the group changes hands, and every send after the hand-over is refused."""
    from airflow_provider_walsink.core.store.errors import ConsumerGroupMovedError

    store.register("orders", "k1", mode="append", actor=ACTOR)
    store.claim_consumer_group("cluster:c1", "g", "orders")
    inside, release, handed = threading.Event(), threading.Event(), []

    def send() -> None:
        with store.newest_committed_offsets_held("orders", consumer_group=("cluster:c1", "g")):
            inside.set()
            release.wait(15)

    sender = threading.Thread(target=send)
    sender.start()
    assert inside.wait(15)
    handover = threading.Thread(
        target=lambda: handed.append(store.reassign_consumer_group("cluster:c1", "g", "refunds"))
    )
    handover.start()
    handover.join(0.5)
    assert handed == [] and store.consumer_group_owner("cluster:c1", "g") == "orders"  # waits for the send
    release.set()
    sender.join(15)
    handover.join(15)
    assert handed == ["orders"] and store.consumer_group_owner("cluster:c1", "g") == "refunds"
    with pytest.raises(
        ConsumerGroupMovedError, match="belongs to pipeline 'refunds' now, not to pipeline 'orders'"
    ):
        with store.newest_committed_offsets_held("orders", consumer_group=("cluster:c1", "g")):
            pass


def test_the_commit_task_commits_and_announces_then_fails_without_sending_when_its_group_moved(
    sqlite_store: CommitterStore, kafka: MockKafka, tmp_path: Path, monkeypatch
):
    """The commit operator's after-commit step with a group handed over since its write task
    planned: the checkpoint is COMMITTED and its asset event added, no offsets are sent, and the
    task then fails without retrying, naming both pipelines."""
    import json
    from types import SimpleNamespace

    from airflow.sdk.exceptions import AirflowFailException
    from sqlalchemy import update

    from airflow_provider_walsink.core.store.models import consumer_group_table as groups
    from airflow_provider_walsink.operators.commit import WalCommitOperator

    store, target, layout = sqlite_store, tmp_path / "target", StagingLayout(tmp_path / "staging")
    topic, group = "moved-task", "moved-task-lag"
    kafka.produce(topic, [{"value": b"x", "partition": 0} for _ in range(2)])
    source = KafkaOffsetSource({"topics": [topic], "group_id": group}, kafka.config)
    source.plan(store, "orders", None, (None, None))  # the write task: plan (claims the group), record
    record = store.register("orders", "k1", mode="append", actor=ACTOR, target=str(target))
    start, end, _ = source.record(store, record, start_offsets=None, until_offsets=None, actor=ACTOR)
    stage_checkpoint(store, layout, "orders", "k1", {"part-0.txt": b"r\n"}, mode="append",
                     start_offsets=start, end_offsets=end)  # fmt: skip
    with store.engine.begin() as conn:  # handed over before the commit task ran
        conn.execute(update(groups).where(groups.c.group_id == group).values(pipeline="refunds"))
    monkeypatch.setenv("AIRFLOW_CONN_WALSINK_KAFKA_GROUPS", json.dumps(
        {"conn_type": "walsink", "extra": {"url": str(store.engine.url), "staging_root": str(layout.root)}}))  # fmt: skip
    task = WalCommitOperator(task_id="commit", pipeline="orders", target=str(target), mode="append",
                             checkpoint_key="k1", walsink_conn_id="walsink_kafka_groups", source=source)  # fmt: skip
    added = []

    class Accessor:
        def add(self, asset, extra=None):
            added.append((asset.uri, extra["checkpoint_key"]))

    ti = SimpleNamespace(
        dag_id="orders_dag", task_id="commit", run_id="manual", try_number=1, map_index=-1, id=None
    )
    before = kafka.committed(group, topic)
    with pytest.raises(AirflowFailException) as refused:
        task.execute({"ti": ti, "outlet_events": {task.asset_alias: Accessor()}})
    assert "belongs to pipeline 'refunds' now, not to pipeline 'orders'" in str(refused.value)
    assert store.require("orders", "k1").state.value == "COMMITTED"
    assert added == [(f"file://{target}", "k1")]  # announced before the task failed
    assert kafka.committed(group, topic) == before  # nothing sent


def test_a_topic_recreated_with_more_records_than_were_read_is_refused(
    store: CommitterStore, kafka: MockKafka, tmp_path: Path
):
    topic, group = f"recreated-{store.engine.dialect.name}", f"recreated-lag-{store.engine.dialect.name}"
    kafka.produce(topic, [{"value": b"old", "partition": 0} for _ in range(3)])
    old_id = kafka.topic_id(topic)
    source = KafkaOffsetSource({"topics": [topic], "group_id": group}, kafka.config)
    end = first_checkpoint(store, "events", "k1", source, tmp_path)
    assert end == {topic: {"0": 3, "1": 0, "2": 0, "3": 0}}
    # The plan (planned, then committed) records the identity of the topic its offsets came from.
    assert store.source_plan("events", "k1")["topic_ids"] == {topic: old_id}
    assert store.newest_committed_source_plan("events")["topic_ids"] == {topic: old_id}
    source.after_commit(store, "events")
    assert kafka.committed(group, topic) == {0: 3, 1: 0, 2: 0, 3: 0}

    kafka.recreate_topic(topic)  # deleted and recreated: a new id, offsets from 0 again
    kafka.produce(topic, [{"value": b"new", "partition": 0} for _ in range(5)])  # 5 > the 3 read
    new_id = kafka.topic_id(topic)
    assert new_id != old_id and kafka.watermarks(topic)[0] == (0, 5)
    before, group_before = rows(store, "events"), kafka.committed(group, topic)

    second = KafkaOffsetSource({"topics": [topic], "group_id": group}, kafka.config)
    with pytest.raises(TopicRecreatedError) as refused:
        write_phase(store, "events", "k2", second, tmp_path).run(lambda: ACTOR)
    message = str(refused.value)
    assert f"topic {topic!r}" in message and new_id in message and old_id in message
    assert "walsink abort" in message and "new pipeline id" in message
    # Nothing recorded, nothing committed, the group unchanged.
    assert store.get("events", "k2") is None
    assert rows(store, "events") == before
    assert store.last_committed_offsets("events") == end
    assert kafka.committed(group, topic) == group_before


def test_a_retry_whose_topic_was_recreated_since_its_first_attempt_is_refused(store: CommitterStore):
    """The plan a retry reuses carries the topic ids its first attempt read: a retry after the
    topic was recreated (more records than the fixed end, so no offset check notices) is
    refused, and the recorded plan stays as it was. The topic id is the one thing faked here
    (``Cluster``): the mock cluster's recreation is exercised above."""
    from airflow_provider_walsink.core.sources.kafka import KafkaSourceSpec, plan_attempt

    class Cluster:
        def __init__(self, topic_id: str):
            self.id = topic_id

        def partitions(self, topic):
            return [0]

        def watermarks(self, topic, partition):
            return 0, 10

        def topic_id(self, topic):
            return self.id

    spec = KafkaSourceSpec(topics=["events"])
    store.register("p", "k", mode="append", actor=ACTOR)
    record = store.require("p", "k")
    plan_attempt(store, record, spec, {}, start_offsets={"events": {"0": 2}}, until_offsets=None, actor=ACTOR,
                 meta=Cluster("first-id"))  # fmt: skip
    recorded = store.source_plan("p", "k")
    assert recorded["topic_ids"] == {"events": "first-id"} and recorded["end"] == {"events": {"0": 10}}
    with pytest.raises(TopicRecreatedError, match="topic id is 'second-id'.*topic id 'first-id'"):
        plan_attempt(store, record, spec, {}, start_offsets={"events": {"0": 2}}, until_offsets=None, actor=ACTOR,
                     meta=Cluster("second-id"))  # fmt: skip
    assert store.source_plan("p", "k") == recorded
    # The same topic: the retry reuses the recorded plan.
    start, until, _ = plan_attempt(store, record, spec, {}, start_offsets={"events": {"0": 2}}, until_offsets=None,
                                   actor=ACTOR, meta=Cluster("first-id"))  # fmt: skip
    assert (start, until) == ({"events": {"0": 2}}, {"events": {"0": 10}})
