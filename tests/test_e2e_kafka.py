"""End to end on the shared Airflow stack: ``dags/walsink_kafka_append.py`` through the real
scheduler, LocalExecutor, triggerer and api-server, reading librdkafka's mock cluster while a
producer keeps appending (issue 28, Must show).

The cluster runs in a child process of this test (``tests/kafka_mock.py``) on loopback; the
stack's tasks reach it through an Airflow connection ``kafka_default`` of the official
``kafka`` type. Two intervals run one after another: the first while a producer thread appends
to the topic (its end, the second's start, planned under appends), then the producer stops and
the second one drains the topic. Then the Delta table
(read with deltalake) holds every produced record exactly once, each checkpoint started where
the previous one ended, and the group's committed offsets (read with a plain consumer) equal
the last committed checkpoint's end offsets.
"""

from __future__ import annotations

import json
import threading
from collections import Counter

import pytest

from airflow_provider_walsink.core.store.store import CommitterStore

try:
    import confluent_kafka  # noqa: F401
except ImportError:  # the kafka extra; CI installs it, so there a missing one fails the run
    from tests.helpers import missing_prerequisite

    missing_prerequisite('confluent-kafka is not installed (pip install ".[kafka]")')

from tests.kafka_mock import MockKafka  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.spark, pytest.mark.slow]

DAG_ID, PIPELINE, TOPIC, GROUP = (
    "walsink_kafka_append",
    "kafka_events",
    "walsink_events",
    "walsink_kafka_append",
)


class Producer(threading.Thread):
    """Appends small batches of JSON events until stopped; remembers every acknowledged offset."""

    def __init__(self, kafka: MockKafka) -> None:
        super().__init__(daemon=True)
        self.kafka, self.stopped, self.acked = kafka, threading.Event(), []
        self.sent = 0

    def batch(self, n: int) -> None:
        records = [
            {"key": f"user-{(self.sent + i) % 7}".encode(), "partition": (self.sent + i) % 4,
             "value": json.dumps({"event_id": self.sent + i, "user_id": (self.sent + i) % 7,
                                  "amount_cents": 100 + i}).encode()}
            for i in range(n)
        ]  # fmt: skip
        self.acked += [(TOPIC, p, o) for p, o in self.kafka.produce(TOPIC, records)]
        self.sent += n

    def run(self) -> None:
        while not self.stopped.wait(0.5):
            self.batch(25)


@pytest.fixture(scope="module")
def kafka():
    cluster = MockKafka()
    yield cluster
    cluster.stop()


def test_kafka_example_through_the_scheduler_while_a_producer_appends(airflow_stack, kafka):
    from deltalake import DeltaTable

    stack = airflow_stack
    stack.set_connection("kafka_default", {"conn_type": "kafka", "extra": kafka.config})
    producer = Producer(kafka)
    producer.batch(100)  # the topic exists (4 partitions) before the first run plans
    stack.wait_for_dag(DAG_ID)
    stack.unpause(DAG_ID)
    producer.start()
    run_ids = []
    try:
        for hour in (1,):
            run_id = stack.trigger(DAG_ID, f"2026-03-01T{hour:02d}:00:00Z")
            run = stack.wait_for_runs(DAG_ID, [run_id], timeout=900)[run_id]
            assert run["state"] == "success", stack.task_states(DAG_ID, run_id)
            run_ids.append(run_id)
    finally:
        producer.stopped.set()
        producer.join()
    # The last interval drains what the producer appended meanwhile.
    run_id = stack.trigger(DAG_ID, "2026-03-01T02:00:00Z")
    run = stack.wait_for_runs(DAG_ID, [run_id], timeout=900)[run_id]
    assert run["state"] == "success", stack.task_states(DAG_ID, run_id)
    stack.pause(DAG_ID)

    store = CommitterStore.from_url(f"sqlite:///{stack.home}/walsink/committer.db", migrate=False)
    try:
        checkpoints = sorted(store.checkpoints(PIPELINE), key=lambda c: c.sequence)
        assert [c.state.value for c in checkpoints] == ["COMMITTED"] * 2
        for earlier, later in zip(checkpoints, checkpoints[1:], strict=False):
            assert later.start_offsets == earlier.end_offsets  # contiguous: nothing skipped, nothing twice
        last = checkpoints[-1].end_offsets
    finally:
        store.dispose()

    table = DeltaTable(str(stack.home / "walsink" / "examples" / "target" / "kafka_events"))
    rows = table.to_pyarrow_table(columns=["topic", "partition", "offset", "event_id"]).to_pylist()
    seen = Counter((r["topic"], r["partition"], r["offset"]) for r in rows)
    assert max(seen.values()) == 1  # nothing doubled
    assert set(seen) == set(producer.acked)  # nothing lost: every produced record, once
    assert sorted(r["event_id"] for r in rows) == list(range(producer.sent))
    assert last == {TOPIC: {str(p): high for p, (_, high) in kafka.watermarks(TOPIC).items()}}
    assert kafka.committed(GROUP, TOPIC) == {int(p): o for p, o in last[TOPIC].items()}
