"""The cluster boundary: what planning asks the cluster (:class:`KafkaMetadata`), and its
consumer-backed implementation (:class:`ConsumerMetadata`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from airflow_provider_walsink.core.sources.kafka.spec import (
    _NOT_FOR_CONSUMER,
    READER_OVERRIDES,
    KafkaSourceError,
    TopicNotFoundError,
)


class KafkaMetadata(Protocol):
    """What planning asks the cluster: the boundary tests inject faults at (retention, new
    partitions), which librdkafka's mock cluster cannot produce."""

    def partitions(self, topic: str) -> list[int]:
        """The topic's partition ids; raises :class:`TopicNotFoundError` if it does not exist."""

    def watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        """``(low, high)``: the first offset the log holds and the next offset it will write."""

    def offset_for_time(self, topic: str, partition: int, timestamp: int) -> int | None:
        """The first offset whose record's timestamp is at or after ``timestamp`` (ms), or
        ``None`` when the partition holds no such record. Asked only for ``starting_timestamp``."""

    def topic_id(self, topic: str) -> str | None:
        """The topic's id (Kafka's topic UUID, base64 as Kafka's tools print it), or ``None``
        when the cluster gives none (brokers before Kafka 2.8). Optional: a boundary without
        it records and checks no topic ids."""

    def cluster_id(self) -> str | None:
        """The cluster's id (Metadata's ``ClusterId``), or ``None``. Optional, as :meth:`topic_id`."""


def consumer_config(config: Mapping[str, Any], *, group_id: str | None = None) -> dict[str, Any]:
    """The client settings of a walsink reader (or group committer) built from a connection's."""
    out = {k: v for k, v in config.items() if k not in _NOT_FOR_CONSUMER}
    out.update(READER_OVERRIDES)
    # librdkafka wants a group id even for assign(); the reader never joins or commits it.
    out["group.id"] = group_id or "walsink-reader"
    return out


class ConsumerMetadata:
    """:class:`KafkaMetadata` of a real cluster, through one ``confluent_kafka.Consumer``."""

    def __init__(self, config: Mapping[str, Any], *, timeout: float = 30.0) -> None:
        from confluent_kafka import Consumer

        self.timeout = timeout
        self._config = dict(config)
        self._consumer = Consumer(consumer_config(config))
        self._admin: Any = None

    def partitions(self, topic: str) -> list[int]:
        meta = self._consumer.list_topics(topic, timeout=self.timeout)
        found = meta.topics.get(topic)
        if found is None or found.error is not None or not found.partitions:
            reason = f" ({found.error.str()})" if found is not None and found.error is not None else ""
            raise TopicNotFoundError(f"Kafka topic {topic!r} does not exist on the cluster{reason}")
        return sorted(found.partitions)

    def watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        from confluent_kafka import TopicPartition

        low, high = self._consumer.get_watermark_offsets(
            TopicPartition(topic, partition), timeout=self.timeout, cached=False
        )
        return int(low), int(high)

    def offset_for_time(self, topic: str, partition: int, timestamp: int) -> int | None:
        from confluent_kafka import TopicPartition

        found = self._consumer.offsets_for_times(
            [TopicPartition(topic, partition, timestamp)], timeout=self.timeout
        )
        if found[0].error is not None:
            raise KafkaSourceError(
                f"Kafka topic {topic!r} partition {partition}: looking up the offset of timestamp {timestamp} "
                f"failed: {found[0].error}"
            )
        return int(found[0].offset) if found[0].offset >= 0 else None

    def topic_id(self, topic: str) -> str | None:
        from confluent_kafka import KafkaException, TopicCollection
        from confluent_kafka.admin import AdminClient

        if self._admin is None:
            self._admin = AdminClient({k: v for k, v in self._config.items() if k not in _NOT_FOR_CONSUMER})
        futures = self._admin.describe_topics(TopicCollection([topic]), request_timeout=self.timeout)
        try:
            found = futures[topic].result()
        except KafkaException as e:
            raise KafkaSourceError(f"Kafka topic {topic!r}: looking up its topic id failed: {e}") from None
        uuid = found.topic_id
        if uuid is None or (uuid.get_most_significant_bits() == 0 and uuid.get_least_significant_bits() == 0):
            return None  # a broker without topic ids answers the zero UUID
        return str(uuid)

    def cluster_id(self) -> str | None:
        return self._consumer.list_topics(timeout=self.timeout).cluster_id or None

    def close(self) -> None:
        self._consumer.close()
        self._admin = None

    def __enter__(self) -> ConsumerMetadata:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
