"""The Kafka source's spec (what a pipeline reads), its offsets' JSON shape, its errors."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from airflow_provider_walsink.core.protocol.errors import WalsinkError

#: Offsets of a Kafka source: ``{topic: {partition (a string, as JSON keys are): next offset}}``.
Offsets = dict[str, dict[str, int]]

#: The environment variable carrying the client settings (JSON) from the write task to the job.
CONFIG_ENV = "WALSINK_KAFKA_CONFIG"
#: Where the write task puts the source's plan in the job's protocol arguments (``extra``).
PLAN_KEY = "kafka"
#: Client settings walsink's own readers set whatever the connection says: no group
#: membership, no offset commits, an error (never a silent reset) when an offset is gone.
READER_OVERRIDES: dict[str, Any] = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "enable.partition.eof": True,
    "auto.offset.reset": "error",
}
#: Settings that belong to a producer or to walsink, dropped from a consumer's configuration.
_NOT_FOR_CONSUMER = ("group.id", "client.id.prefix")

STARTING = ("earliest", "latest")


class KafkaSourceError(WalsinkError):
    """The Kafka source cannot read this checkpoint's range; the message says why."""


class TopicNotFoundError(KafkaSourceError):
    """A configured topic does not exist on the cluster."""


class RetentionGapError(KafkaSourceError):
    """Records of the range are no longer in the log (retention), and data loss is not accepted."""


class OffsetsWentBackwardsError(KafkaSourceError):
    """The log ends before offsets walsink already read or recorded (topic deleted or recreated)."""


class TopicRecreatedError(OffsetsWentBackwardsError):
    """The topic's id is not the one the pipeline read before: it was deleted and recreated."""


@dataclass(frozen=True)
class Gap:
    """Records ``[start, end)`` of one partition that retention removed before they were read."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def records(self) -> int:
        return self.end - self.start

    def describe(self) -> str:
        return (
            f"topic {self.topic!r} partition {self.partition}: offsets [{self.start}, {self.end}) "
            f"({self.records} records) are no longer in the log"
        )

    def to_dict(self) -> dict[str, Any]:
        return {"topic": self.topic, "partition": self.partition, "start": self.start, "end": self.end}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Gap:
        return cls(str(data["topic"]), int(data["partition"]), int(data["start"]), int(data["end"]))


@dataclass(frozen=True)
class KafkaSourceSpec:
    """What a pipeline reads from Kafka (JSON-able: it travels to the job and is recorded).

    :param topics: the topics read; each of their partitions is read.
    :param starting: where the **first** checkpoint starts: ``earliest``, ``latest``, or
        explicit offsets ``{topic: {partition: offset}}`` (partitions not named: earliest).
        Later checkpoints always start where the last committed one ended.
    :param accept_data_loss: record a retention gap on the checkpoint and read on from the
        log's start instead of failing (default ``False``: fail naming the range).
    :param group_id: consumer group the commit task commits the committed end offsets to,
        for lag monitoring (``None``: none). Never read back by walsink. It belongs to the
        first pipeline that plans with it on its cluster (:func:`cluster_scope`); another
        pipeline naming it is refused (``ConsumerGroupOwnedError``).
    :param max_records_per_split: longest offset range one Spark task reads.
    :param starting_timestamp: milliseconds since the epoch: the **first** checkpoint starts,
        in each partition, at the first record whose timestamp is at or after it (the
        cluster's ``ListOffsets`` by time, ``offsets_for_times``), or at the partition's end
        when it holds none. Takes precedence over ``starting`` (as Spark's
        ``startingTimestamp`` does over ``startingOffsets``); resolved once, recorded as that
        checkpoint's start.
    :param read_timeout: seconds a reader waits for the next record of its range before
        failing (the range is below the high watermark, so records are there).
    """

    topics: tuple[str, ...]
    starting: str | Mapping[str, Mapping[str, int]] = "earliest"
    accept_data_loss: bool = False
    group_id: str | None = None
    max_records_per_split: int = 200_000
    read_timeout: float = 120.0
    starting_timestamp: int | None = None

    def __post_init__(self) -> None:
        topics = (self.topics,) if isinstance(self.topics, str) else tuple(self.topics)
        object.__setattr__(self, "topics", topics)
        if not topics or not all(isinstance(t, str) and t for t in topics):
            raise KafkaSourceError(f"topics must be a non-empty list of topic names, got {self.topics!r}")
        if isinstance(self.starting, str):
            if self.starting not in STARTING:
                raise KafkaSourceError(
                    f"starting must be one of {', '.join(STARTING)} or explicit offsets, got {self.starting!r}"
                )
        else:
            object.__setattr__(self, "starting", normalize_offsets(self.starting, "starting"))
            unknown = sorted(set(self.starting) - set(topics))  # type: ignore[arg-type]
            if unknown:
                raise KafkaSourceError(f"starting offsets name topics {unknown} that are not read ({topics})")
        ts = self.starting_timestamp
        if ts is not None and (isinstance(ts, bool) or not isinstance(ts, int) or ts < 0):
            raise KafkaSourceError(
                f"starting_timestamp must be milliseconds since the epoch (a non-negative integer), got {ts!r}"
            )
        if int(self.max_records_per_split) < 1:
            raise KafkaSourceError(
                f"max_records_per_split must be positive, got {self.max_records_per_split}"
            )

    def to_dict(self) -> dict[str, Any]:
        return {
            "topics": list(self.topics),
            "starting": self.starting if isinstance(self.starting, str) else dict(self.starting),
            "accept_data_loss": self.accept_data_loss,
            "group_id": self.group_id,
            "max_records_per_split": self.max_records_per_split,
            "read_timeout": self.read_timeout,
            "starting_timestamp": self.starting_timestamp,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> KafkaSourceSpec:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def normalize_offsets(offsets: Mapping[str, Any] | None, what: str = "offsets") -> Offsets:
    """``offsets`` as :data:`Offsets` (string partitions, int offsets); raises on anything else."""
    if offsets is None:
        return {}
    if not isinstance(offsets, Mapping):
        raise KafkaSourceError(f"{what} must be {{topic: {{partition: offset}}}}, got {offsets!r}")
    out: Offsets = {}
    for topic, parts in offsets.items():
        if not isinstance(parts, Mapping):
            raise KafkaSourceError(f"{what} of topic {topic!r} must be {{partition: offset}}, got {parts!r}")
        out[str(topic)] = {}
        for partition, offset in parts.items():
            try:
                p, o = int(partition), int(offset)
            except (TypeError, ValueError):
                raise KafkaSourceError(
                    f"{what}: topic {topic!r} partition {partition!r} offset {offset!r} is not an integer"
                ) from None
            if p < 0 or o < 0 or isinstance(offset, bool):
                raise KafkaSourceError(f"{what}: topic {topic!r} partition {p} offset {o} is negative")
            out[str(topic)][str(p)] = o
    return out
