"""librdkafka's mock Kafka cluster in a child process, for the Kafka source tests.

The mock cluster (``test.mock.num.brokers``) lives inside one librdkafka
client and speaks the Kafka protocol on loopback ports; it dies with that
client. So it runs here, in a process of its own that the tests start and
stop: every other process (the test, Spark's executors, Airflow tasks) uses
its address as a real broker's (``../shared/DESIGN.md``, "Kafka").

Run as ``python -m tests.kafka_mock``: prints ``bootstrap=HOST:PORT`` once the
cluster listens, and stops when its standard input closes (the parent's end
of the pipe: a test that dies takes the cluster with it).
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import threading
from collections.abc import Iterable, Mapping
from typing import Any

_ADDRESS = re.compile(r"replaced with ((?:127\.0\.0\.1:\d+,?)+)")


def _serve() -> None:
    from confluent_kafka import Producer

    found = threading.Event()
    address: list[str] = []

    class _Find(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            match = _ADDRESS.search(record.getMessage())
            if match and not found.is_set():
                address.append(match.group(1).rstrip(","))
                found.set()

    log = logging.getLogger("walsink.kafka_mock")
    log.setLevel(logging.DEBUG)
    log.propagate = False
    log.addHandler(_Find())
    client = Producer(
        {
            "test.mock.num.brokers": 1,
            "bootstrap.servers": "unused",
            "log_level": 7,
            "debug": "mock",
            "logger": log,
        }
    )
    client.poll(0)
    if not found.wait(30):
        print("error=the mock cluster printed no address", flush=True)
        sys.exit(1)
    print(f"bootstrap={address[0]}", flush=True)
    # Serve until the parent closes our stdin (or dies).
    while sys.stdin.buffer.read(1):
        pass
    client.flush(1)


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
