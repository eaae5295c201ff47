"""librdkafka's mock Kafka cluster in a child process, for the Kafka source tests.

The mock cluster (librdkafka's mock API, what ``test.mock.num.brokers`` starts
inside a client; reached here through ctypes, see :func:`_serve`) lives inside
one librdkafka handle and speaks the Kafka protocol on loopback ports; it dies
with that handle. So it runs here, in a process of its own that the tests start and
stop: every other process (the test, Spark's executors, Airflow tasks) uses
its address as a real broker's (``../shared/DESIGN.md``, "Kafka").

Run as ``python -m tests.kafka_mock``: prints ``bootstrap=HOST:PORT`` once the
cluster listens, and stops when its standard input closes (the parent's end
of the pipe: a test that dies takes the cluster with it).
"""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping
from typing import Any


def _librdkafka() -> ctypes.CDLL:
    """The librdkafka that ships inside the confluent-kafka wheel (its mock API is exported)."""
    spec = importlib.util.find_spec("confluent_kafka")
    assert spec is not None and spec.origin is not None
    site = os.path.dirname(os.path.dirname(spec.origin))
    found = sorted(glob.glob(os.path.join(site, "confluent_kafka.libs", "librdkafka*.so*")))
    lib = ctypes.CDLL(found[0] if found else "librdkafka.so.1")
    vp, cp = ctypes.c_void_p, ctypes.c_char_p
    lib.rd_kafka_conf_new.restype = vp
    lib.rd_kafka_conf_set.argtypes = [vp, cp, cp, cp, ctypes.c_size_t]
    lib.rd_kafka_new.restype = vp
    lib.rd_kafka_new.argtypes = [ctypes.c_int, vp, cp, ctypes.c_size_t]
    lib.rd_kafka_mock_cluster_new.restype = vp
    lib.rd_kafka_mock_cluster_new.argtypes = [vp, ctypes.c_int]
    lib.rd_kafka_mock_cluster_bootstraps.restype = cp
    lib.rd_kafka_mock_cluster_bootstraps.argtypes = [vp]
    lib.rd_kafka_mock_set_controller_id.argtypes = [vp, ctypes.c_int32]
    lib.rd_kafka_mock_topic_delete.argtypes = [vp, cp]
    lib.rd_kafka_mock_topic_create.argtypes = [vp, cp, ctypes.c_int, ctypes.c_int]
    return lib


def _serve() -> None:
    """Start the cluster with librdkafka's mock API (``rd_kafka_mock_cluster_new``, what
    ``test.mock.num.brokers`` does inside a client) through ctypes, so the test can also:

    * name broker 1 the controller (``rd_kafka_mock_set_controller_id``): else the mock's
      Metadata answers controller 0, no broker has that id, and every admin request
      (``describe_topics``, which gives topic ids) times out "waiting for controller";
    * delete and recreate a topic (``rd_kafka_mock_topic_delete`` / ``_create``): the
      recreated topic gets a new topic id, as on a real cluster.

    Commands arrive one a line on stdin (``recreate TOPIC PARTITIONS``), answered ``ok`` or
    ``error=...``; the cluster stops when stdin closes.
    """
    lib = _librdkafka()
    errstr = ctypes.create_string_buffer(512)
    conf = lib.rd_kafka_conf_new()
    lib.rd_kafka_conf_set(conf, b"log_level", b"3", errstr, len(errstr))
    handle = lib.rd_kafka_new(0, conf, errstr, len(errstr))  # 0: RD_KAFKA_PRODUCER
    if not handle:
        print(f"error={errstr.value.decode()}", flush=True)
        sys.exit(1)
    cluster = lib.rd_kafka_mock_cluster_new(handle, 1)
    if not cluster:
        print("error=rd_kafka_mock_cluster_new failed", flush=True)
        sys.exit(1)
    lib.rd_kafka_mock_set_controller_id(cluster, 1)
    print(f"bootstrap={lib.rd_kafka_mock_cluster_bootstraps(cluster).decode()}", flush=True)
    for line in sys.stdin:
        words = line.split()
        if len(words) == 3 and words[0] == "recreate":
            topic = words[1].encode()
            err = lib.rd_kafka_mock_topic_delete(cluster, topic)
            if err == 0:
                err = lib.rd_kafka_mock_topic_create(cluster, topic, int(words[2]), 1)
            print("ok" if err == 0 else f"error=librdkafka error {err}", flush=True)
        else:
            print(f"error=unknown command {line.strip()!r}", flush=True)
    # The handle and the cluster die with the process.


class MockKafka:
    """A running mock cluster (child process) and the helpers tests use against it."""

    def __init__(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tests.kafka_mock"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline().strip()
        if not line.startswith("bootstrap="):
            self.stop()
            raise RuntimeError(f"the mock Kafka cluster did not start: {line!r}")
        self.bootstrap = line.split("=", 1)[1]
        assert all(a.startswith("127.0.0.1:") for a in self.bootstrap.split(","))

    @property
    def config(self) -> dict[str, Any]:
        """Client settings for this cluster (what a ``kafka`` connection's extra would hold)."""
        return {"bootstrap.servers": self.bootstrap}

    def recreate_topic(self, topic: str, partitions: int = 4) -> None:
        """Delete ``topic`` and create it again, empty (a new topic id, offsets from 0)."""
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(f"recreate {topic} {partitions}\n")
        self._proc.stdin.flush()
        answer = self._proc.stdout.readline().strip()
        if answer != "ok":
            raise RuntimeError(f"recreating topic {topic!r} failed: {answer!r}")

    def topic_id(self, topic: str) -> str:
        """The topic's id as the cluster's admin API gives it (``describe_topics``)."""
        from confluent_kafka import TopicCollection
        from confluent_kafka.admin import AdminClient

        admin = AdminClient(self.config)  # kept alive until the answer is in
        found = admin.describe_topics(TopicCollection([topic]), request_timeout=30)
        return str(found[topic].result().topic_id)

    def stop(self) -> None:
        """Stop the cluster: close its stdin and wait for the child to exit."""
        if self._proc.poll() is None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            try:
                self._proc.wait(30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()

    def produce(
        self,
        topic: str,
        records: Iterable[Mapping[str, Any]],
        *,
        producer_config: Mapping[str, Any] | None = None,
    ) -> list[tuple[int, int]]:
        """Produce records (``key``, ``value``, ``partition``, ``headers``, ``timestamp`` ms);
        return each one's ``(partition, offset)`` as the cluster acknowledged it."""
        from confluent_kafka import Producer

        producer = Producer({**self.config, "linger.ms": 5, **(producer_config or {})})
        acked: list[tuple[int, int] | None] = []

        def report(index: int):
            def done(err: Any, msg: Any) -> None:
                if err is not None:
                    raise RuntimeError(f"produce failed: {err}")
                acked[index] = (msg.partition(), msg.offset())

            return done

        for i, record in enumerate(records):
            acked.append(None)
            kwargs: dict[str, Any] = {"key": record.get("key"), "value": record.get("value")}
            for name in ("partition", "headers", "timestamp"):
                if record.get(name) is not None:
                    kwargs[name] = record[name]
            producer.produce(topic, on_delivery=report(i), **kwargs)
            producer.poll(0)
        left = producer.flush(60)
        if left or any(a is None for a in acked):
            raise RuntimeError(f"{left} record(s) to {topic} were not acknowledged")
        return [a for a in acked if a is not None]

    def watermarks(self, topic: str) -> dict[int, tuple[int, int]]:
        """``{partition: (low, high)}`` of a topic, from a plain consumer."""
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer({**self.config, "group.id": "walsink-test-watermarks"})
        try:
            meta = consumer.list_topics(topic, timeout=30)
            return {
                p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30, cached=False)
                for p in sorted(meta.topics[topic].partitions)
            }
        finally:
            consumer.close()

    def committed(self, group: str, topic: str) -> dict[int, int]:
        """The group's committed offsets of a topic (``{partition: offset}``; absent: none committed)."""
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer({**self.config, "group.id": group})
        try:
            partitions = sorted(consumer.list_topics(topic, timeout=30).topics[topic].partitions)
            found = consumer.committed([TopicPartition(topic, p) for p in partitions], timeout=30)
            return {tp.partition: tp.offset for tp in found if tp.offset >= 0}
        finally:
            consumer.close()


if __name__ == "__main__":
    _serve()
