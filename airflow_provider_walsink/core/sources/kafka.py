"""A Kafka source for the write job: each checkpoint reads exactly ``[start, end)`` per partition.

Airflow-free (the write task plans with it, the PySpark job reads with it).
Offsets follow the **checkpoint**, never a consumer group (Flink's
``KafkaSource`` with its offsets in checkpoint state):

* a checkpoint's **start** is where the pipeline's last committed checkpoint
  ended (``job.start_offsets``, from the committer table); the first
  checkpoint starts at :attr:`KafkaSourceSpec.starting` (``earliest``,
  ``latest``, or explicit offsets per partition), resolved to concrete
  offsets once; a partition the start does not name (a new partition, a
  newly added topic) starts at its earliest offset;
* its **end** is each partition's high watermark, fixed **once** when the
  write task first plans the checkpoint and recorded on the checkpoint's row,
  so a retried write reads exactly the same records; a reprocess reads up to
  the end of the version it replaces (``job.until_offsets``);
* records the log no longer holds (retention deleted ``[start, low)``) are a
  :class:`RetentionGapError` naming topic, partition and range, unless the
  pipeline accepts data loss (:attr:`KafkaSourceSpec.accept_data_loss`): then
  the plan carries the :class:`Gap` and the write task records it on the
  checkpoint;
* offsets that went backwards (a start or recorded end beyond the log's end,
  a partition that vanished: the topic was deleted or recreated) are an
  :class:`OffsetsWentBackwardsError`; a topic the cluster does not know is a
  :class:`TopicNotFoundError`;
* each plan records the **topic id** of every topic it read (Kafka's topic UUID, where the
  cluster gives one): a topic deleted and recreated under the same name has a new id, and a plan
  whose id differs from the one the pipeline's last committed checkpoint read is a
  :class:`TopicRecreatedError`, even when the new topic already holds more records than were read;
* a consumer group (:attr:`KafkaSourceSpec.group_id`) belongs to the first pipeline that plans
  with it on its cluster (:func:`cluster_scope`); another pipeline naming it is refused.

Offsets travel as JSON: ``{"<topic>": {"<partition>": <offset>}}`` (Spark's
``startingOffsets`` shape), the next offset to read, so a checkpoint's end
offsets are the next one's start offsets.

In the job (a few lines; no Spark Kafka connector jar)::

    with CheckpointJob.from_argv(spark) as job:
        source = KafkaSource.from_job(job)            # the plan the write task fixed
        df = source.read(spark)                       # Spark's Kafka source columns
        job.stage(df.select(...), partition_by=["dt"])
        job.end_offsets = source.end_offsets

The executors read their ranges with ``confluent-kafka`` (``mapInArrow`` over
one row per split; a range longer than ``max_records_per_split`` is split, so
parallelism is not capped at the partition count). The client settings
(SASL/SSL secrets included) reach the job in spark-submit's environment
(:data:`CONFIG_ENV`), never its command line, and the executors inside the
tasks' closures, never a log line.

Consumer-group offsets are committed back only after the target commit, by
the commit task (:func:`commit_group_offsets`), for lag monitoring; walsink
never reads them back.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from airflow_provider_walsink.core.faults import crashpoint
from airflow_provider_walsink.core.protocol.errors import WalsinkError
from airflow_provider_walsink.core.sources.base import Source

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from airflow_provider_walsink.core.store.store import Actor, CheckpointRecord

log = logging.getLogger(__name__)

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


# ---------------------------------------------------------------------- the cluster boundary


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


# ---------------------------------------------------------------------- planning


@dataclass(frozen=True)
class OffsetPlan:
    """One checkpoint's ranges.

    :param start: the checkpoint's start offsets as recorded (the last committed end; the
        first checkpoint's resolved starting position).
    :param end: the end offsets (exclusive), one per partition read: ``job.end_offsets``.
    :param read_from: where the readers start, per partition of ``end``: ``start``, the
        earliest offset of a partition ``start`` does not name, or the end of an accepted gap.
    :param gaps: accepted retention gaps (only with ``accept_data_loss``).
    :param topic_ids: ``{topic: id}`` of the topics read, where the cluster gives ids: the
        identity of the topic the offsets belong to (a recreated topic has a new one).
    """

    start: Offsets
    end: Offsets
    read_from: Offsets
    gaps: tuple[Gap, ...] = field(default=())
    topic_ids: Mapping[str, str] = field(default_factory=dict)

    @property
    def records(self) -> int:
        """Offsets the ranges span (records, minus compacted ones and transaction markers)."""
        return sum(e - self.read_from[t][p] for t, parts in self.end.items() for p, e in parts.items())

    def ranges(self) -> Iterator[tuple[str, int, int, int]]:
        """``(topic, partition, from, end)`` of every partition read, empty ones included."""
        for topic in sorted(self.end):
            for p in sorted(self.end[topic], key=int):
                yield topic, int(p), self.read_from[topic][p], self.end[topic][p]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "start": self.start,
            "end": self.end,
            "read_from": self.read_from,
            "gaps": [g.to_dict() for g in self.gaps],
        }
        if self.topic_ids:
            out["topic_ids"] = dict(self.topic_ids)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OffsetPlan:
        return cls(
            start=normalize_offsets(data.get("start"), "start offsets"),
            end=normalize_offsets(data["end"], "end offsets"),
            read_from=normalize_offsets(data["read_from"], "read offsets"),
            gaps=tuple(Gap.from_dict(g) for g in data.get("gaps") or ()),
            topic_ids={str(t): str(i) for t, i in (data.get("topic_ids") or {}).items()},
        )


def plan_offsets(
    meta: KafkaMetadata,
    spec: KafkaSourceSpec,
    *,
    start: Mapping[str, Any] | None,
    end: Mapping[str, Any] | None = None,
    read_ids: Mapping[str, str] | None = None,
) -> OffsetPlan:
    """Plan one checkpoint's ranges against the cluster (driver side, before any read).

    :param start: the checkpoint's start offsets (the last committed end offsets), or
        ``None`` for the pipeline's first checkpoint (then ``spec.starting`` decides).
    :param end: end offsets fixed earlier (a retried write reuses what its first attempt
        recorded; a reprocess reads up to the end of the version it replaces), else ``None``:
        each partition's high watermark now.
    :param read_ids: ``{topic: id}`` the pipeline read before (its last committed
        checkpoint's plan, or the plan a retry reuses): a topic whose id is now another is a
        :class:`TopicRecreatedError`, whatever its offsets. The plan records the ids it found.

    Raises :class:`TopicNotFoundError`, :class:`TopicRecreatedError`,
    :class:`OffsetsWentBackwardsError` (a partition that
    vanished, a start or fixed end beyond the log's end) and :class:`RetentionGapError`
    (records of the range already deleted, unless ``spec.accept_data_loss``). Reads only.
    """
    first = start is None
    start_offsets = normalize_offsets(start, "start offsets")
    fixed_end = normalize_offsets(end, "end offsets") if end is not None else None
    partitions = {topic: meta.partitions(topic) for topic in spec.topics}
    topic_ids = topic_ids_of(meta, spec.topics)
    for topic in spec.topics:
        before, now = (read_ids or {}).get(topic), topic_ids.get(topic)
        if before is not None and now is not None and before != now:
            raise TopicRecreatedError(
                f"Kafka topic {topic!r} is not the topic this pipeline read: its topic id is {now!r}, the "
                f"pipeline read offsets of topic id {before!r} (the topic was deleted and recreated; its "
                "offsets start again and may already be past the ones recorded). walsink will not guess "
                "where to continue: abort the open checkpoint (walsink abort <pipeline> <checkpoint>) and "
                "read the new topic under a new pipeline id (its first checkpoint starts at `starting`)"
            )
    for topic, parts in {**start_offsets, **(fixed_end or {})}.items():
        missing = sorted((int(p) for p in parts if int(p) not in partitions.get(topic, [])), key=int)
        if topic in partitions and missing:
            raise OffsetsWentBackwardsError(
                f"Kafka topic {topic!r} has no partition {missing[0]} any more, but walsink already read "
                f"it (offsets {parts[str(missing[0])]}): was the topic deleted and recreated? walsink will "
                "not guess where to continue; abort the checkpoint and start a new pipeline, or reprocess"
            )
    recorded_start: Offsets = {}
    out_end: Offsets = {}
    read_from: Offsets = {}
    gaps: list[Gap] = []
    for topic in spec.topics:
        for partition in partitions[topic]:
            p = str(partition)
            if fixed_end is not None and p not in fixed_end.get(topic, {}):
                continue  # appeared after the end was fixed: the next checkpoint reads it
            low, high = meta.watermarks(topic, partition)
            if first and spec.starting_timestamp is not None:
                at = meta.offset_for_time(topic, partition, spec.starting_timestamp)
                s = high if at is None else at
                if not low <= s <= high:
                    raise KafkaSourceError(
                        f"Kafka topic {topic!r} partition {partition}: the offset of timestamp "
                        f"{spec.starting_timestamp} is {s}, outside the log [{low}, {high})"
                    )
                recorded_start.setdefault(topic, {})[p] = s
            elif first:
                s = _starting(spec, topic, p, low, high)
                recorded_start.setdefault(topic, {})[p] = s
            elif p in start_offsets.get(topic, {}):
                s = start_offsets[topic][p]
            else:
                s = low  # a partition (or topic) the last checkpoint did not read: from its start
            e = fixed_end[topic][p] if fixed_end is not None else high
            if s > high or e > high:
                raise OffsetsWentBackwardsError(
                    f"Kafka topic {topic!r} partition {partition}: the log ends at offset {high}, but this "
                    f"checkpoint {'starts' if s > high else 'was fixed to end'} at {max(s, e) if s > high else e} "
                    "(offsets went backwards: was the topic deleted and recreated?)"
                )
            if s > e:
                raise OffsetsWentBackwardsError(
                    f"Kafka topic {topic!r} partition {partition}: start offset {s} is after the end {e}"
                )
            begin = s
            if s < low and s < e:
                gap = Gap(topic, partition, s, min(low, e))
                if not spec.accept_data_loss:
                    raise RetentionGapError(
                        f"{gap.describe()} (retention deleted them before walsink read them); the checkpoint "
                        "would skip them. Re-read them from elsewhere, or set accept_data_loss=True on the "
                        "Kafka source to record the gap on the checkpoint and read on"
                    )
                gaps.append(gap)
                begin = gap.end
            read_from.setdefault(topic, {})[p] = begin
            out_end.setdefault(topic, {})[p] = e
    if not first:
        recorded_start = start_offsets
    return OffsetPlan(
        start=recorded_start, end=out_end, read_from=read_from, gaps=tuple(gaps), topic_ids=topic_ids
    )


def topic_ids_of(meta: KafkaMetadata, topics: Sequence[str]) -> dict[str, str]:
    """``{topic: id}`` of the topics whose id the cluster gives (none from a boundary that
    does not implement :meth:`KafkaMetadata.topic_id`)."""
    lookup = getattr(meta, "topic_id", None)
    if lookup is None:
        return {}
    return {topic: found for topic in topics if (found := lookup(topic)) is not None}


def cluster_scope(meta: KafkaMetadata, config: Mapping[str, Any]) -> str:
    """The Kafka cluster a consumer group id is scoped to: ``cluster:<id>`` from the cluster's
    metadata (Metadata's ``ClusterId``, every broker since Kafka 0.10.1), else
    ``bootstrap.servers:<as configured>`` (so two connections naming the same brokers
    differently count as two clusters); at most 255 characters (a longer bootstrap list is
    replaced by its SHA-256)."""
    lookup = getattr(meta, "cluster_id", None)
    found = lookup() if lookup is not None else None
    if found:
        scope = f"cluster:{found}"
    else:
        scope = f"bootstrap.servers:{config.get('bootstrap.servers', '')}"
    if len(scope) > 255:
        import hashlib

        scope = "bootstrap.servers-sha256:" + hashlib.sha256(scope.encode()).hexdigest()
    return scope


def _starting(spec: KafkaSourceSpec, topic: str, partition: str, low: int, high: int) -> int:
    if spec.starting == "earliest":
        return low
    if spec.starting == "latest":
        return high
    explicit = spec.starting.get(topic, {})  # type: ignore[union-attr]
    return int(explicit[partition]) if partition in explicit else low


def split_ranges(plan: OffsetPlan, max_records: int) -> list[tuple[str, int, int, int]]:
    """The plan's non-empty ranges cut into splits of at most ``max_records`` offsets."""
    splits = []
    for topic, partition, begin, end in plan.ranges():
        at = begin
        while at < end:
            stop = min(end, at + max_records)
            splits.append((topic, partition, at, stop))
            at = stop
    return splits


# ---------------------------------------------------------------------- reading (executors)


def arrow_schema() -> pa.Schema:
    """Spark's Kafka source columns (``includeHeaders``) as Arrow."""
    import pyarrow as pa

    header = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
    return pa.schema(
        [
            pa.field("key", pa.binary()),
            pa.field("value", pa.binary()),
            pa.field("topic", pa.string()),
            pa.field("partition", pa.int32()),
            pa.field("offset", pa.int64()),
            pa.field("timestamp", pa.timestamp("us", tz="UTC")),
            pa.field("timestampType", pa.int32()),
            pa.field("headers", pa.list_(header)),
        ]
    )


SPARK_SCHEMA_DDL = (
    "key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp, "
    "timestampType int, headers array<struct<key: string, value: binary>>"
)

#: Kafka's timestamp types as Spark's Kafka source numbers them (``-1``: none).
_TIMESTAMP_TYPE = {0: -1, 1: 0, 2: 1}


def read_range(
    config: Mapping[str, Any],
    topic: str,
    partition: int,
    begin: int,
    end: int,
    *,
    timeout: float = 120.0,
    batch_rows: int = 10_000,
    consumer_factory: Callable[[dict[str, Any]], Any] | None = None,
) -> Iterator[pa.RecordBatch]:
    """Yield the records of offsets ``[begin, end)`` of one partition as Arrow batches.

    Offsets the log skips (compaction, transaction markers) are simply absent;
    reading stops at the first offset ``>= end`` or when the log's end is at or
    past ``end``. Raises :class:`RetentionGapError` if ``begin`` is no longer in
    the log, :class:`OffsetsWentBackwardsError` if the log ends before ``end``,
    and :class:`KafkaSourceError` when no record arrives for ``timeout`` seconds.
    """
    import time

    from confluent_kafka import Consumer, KafkaError, TopicPartition

    schema = arrow_schema()
    if begin >= end:
        return
    consumer = (consumer_factory or Consumer)(consumer_config(config))
    where = f"Kafka topic {topic!r} partition {partition}"
    #: Messages of the next batch: one list append per record here, the columns built at once.
    pending: list[Any] = []

    def flush() -> pa.RecordBatch:
        batch = _record_batch(pending, topic, partition, schema)
        pending.clear()
        return batch

    try:
        consumer.assign([TopicPartition(topic, partition, begin)])
        next_offset = begin
        idle_since = time.monotonic()
        while next_offset < end:
            # Never more than the range still needs: consume() waits for as many as it is asked
            # (until its timeout), so asking 1,000 near a partition's end cost a second per split.
            messages = consumer.consume(max(1, min(batch_rows, 1000, end - next_offset)), 1.0)
            if not messages:
                if time.monotonic() - idle_since > timeout:
                    raise KafkaSourceError(
                        f"{where}: no record for {timeout:.0f}s while reading offsets [{next_offset}, {end}) "
                        "(below the high watermark when planned): is the cluster reachable from the executors?"
                    )
                continue
            idle_since = time.monotonic()
            for msg in messages:
                err = msg.error()
                if err is not None:
                    code = err.code()
                    if code == KafkaError._PARTITION_EOF:
                        if msg.offset() >= end:
                            next_offset = end
                            break
                        raise OffsetsWentBackwardsError(
                            f"{where}: the log ends at offset {msg.offset()}, before this checkpoint's end "
                            f"{end} (offsets went backwards: was the topic deleted and recreated?)"
                        )
                    if code in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                        low, high = consumer.get_watermark_offsets(
                            TopicPartition(topic, partition), timeout=30, cached=False
                        )
                        if low > next_offset:
                            raise RetentionGapError(
                                f"{Gap(topic, partition, next_offset, min(low, end)).describe()} (deleted by "
                                "retention after the write task planned the checkpoint); retry the write task: "
                                "it plans again and fails or, with accept_data_loss, records the gap"
                            )
                        raise OffsetsWentBackwardsError(
                            f"{where}: offset {next_offset} is out of range (log [{low}, {high})): offsets "
                            "went backwards; was the topic deleted and recreated?"
                        )
                    raise KafkaSourceError(f"{where}: {err.str()}")
                offset = msg.offset()
                if offset >= end:
                    next_offset = end
                    break
                if offset < next_offset:
                    continue  # a re-delivery after a reconnect: already read
                pending.append(msg)
                next_offset = offset + 1
            if len(pending) >= batch_rows:
                yield flush()
                crashpoint("kafka.read.after_batch")
        if pending:
            yield flush()
            crashpoint("kafka.read.after_batch")
    finally:
        consumer.close()


def _record_batch(messages: Sequence[Any], topic: str, partition: int, schema: pa.Schema) -> pa.RecordBatch:
    """Spark's Kafka columns of ``messages`` (one partition's, in offset order), built column by column."""
    import pyarrow as pa

    n = len(messages)
    stamps = [m.timestamp() for m in messages]
    headers = [m.headers() for m in messages]
    columns = [
        pa.array([m.key() for m in messages], pa.binary()),
        pa.array([m.value() for m in messages], pa.binary()),
        pa.array([topic] * n, pa.string()),
        pa.array([partition] * n, pa.int32()),
        pa.array([m.offset() for m in messages], pa.int64()),
        pa.array(
            [ts * 1000 if kind and ts >= 0 else None for kind, ts in stamps], schema.field("timestamp").type
        ),
        pa.array([_TIMESTAMP_TYPE.get(kind, -1) for kind, _ in stamps], pa.int32()),
        pa.array(
            [None if h is None else [{"key": k, "value": v} for k, v in h] for h in headers],
            schema.field("headers").type,
        ),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def executor_reader(
    config: Mapping[str, Any], splits: Sequence[tuple[str, int, int, int]], *, timeout: float = 120.0
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function: each input row is the index (``id``) of one split in ``splits``
    (topic, partition, begin, end), which it reads.

    ``config`` and ``splits`` travel inside the function (the task's closure), never on a command line.
    """
    settings = dict(config)
    ranges = [tuple(s) for s in splits]

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for index in batch.column("id").to_pylist():
                topic, partition, begin, end = ranges[index]
                yield from read_range(settings, topic, int(partition), int(begin), int(end), timeout=timeout)

    return read


def kafka_dataframe(
    spark: SparkSession,
    config: Mapping[str, Any],
    plan: OffsetPlan,
    *,
    max_records_per_split: int = 200_000,
    timeout: float = 120.0,
) -> DataFrame:
    """A DataFrame of exactly the plan's ranges, read by the executors, with Spark's Kafka columns."""
    splits = split_ranges(plan, max_records_per_split)
    # One split per Spark task: parallelism follows the splits, not the partition count. A range of
    # n ids in n partitions holds one id per partition, and needs no SparkContext (a Spark Connect
    # client has none).
    count = max(1, len(splits))
    ids = spark.range(0, len(splits), 1, count)
    return ids.mapInArrow(executor_reader(config, splits, timeout=timeout), SPARK_SCHEMA_DDL)


# ---------------------------------------------------------------------- the job's face


def config_from_env(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The client settings the write task put in the job's environment (:data:`CONFIG_ENV`)."""
    environ = os.environ if environ is None else environ
    text = environ.get(CONFIG_ENV)
    if not text:
        raise KafkaSourceError(
            f"no Kafka client settings: the write task passes them in {CONFIG_ENV} when it is given "
            "source={'kind': 'kafka', ...}; outside walsink_pipeline pass config= to KafkaSource"
        )
    try:
        config = json.loads(text)
    except ValueError:
        raise KafkaSourceError(f"{CONFIG_ENV} is not JSON") from None  # never echo: it holds secrets
    if not isinstance(config, dict):
        raise KafkaSourceError(f"{CONFIG_ENV} must be a JSON object")
    return config


class KafkaSource:
    """One checkpoint's Kafka input, as the job sees it.

    :param config: librdkafka client settings (``bootstrap.servers``, SASL/SSL...).
    :param spec: what is read (:class:`KafkaSourceSpec`).
    :param plan: the checkpoint's ranges (:func:`plan_offsets`).
    """

    def __init__(self, config: Mapping[str, Any], spec: KafkaSourceSpec, plan: OffsetPlan) -> None:
        self.config = dict(config)
        self.spec = spec
        self.plan = plan

    @classmethod
    def from_job(
        cls,
        job: Any,
        *,
        config: Mapping[str, Any] | None = None,
        spec: KafkaSourceSpec | None = None,
        meta: KafkaMetadata | None = None,
    ) -> KafkaSource:
        """The source of a :class:`~airflow_provider_walsink.core.spark.job.CheckpointJob`.

        Under a write task given ``source={"kind": "kafka", ...}`` the plan it fixed and recorded travels in
        the protocol arguments (``extra["kafka"]``) and the client settings in the
        environment: nothing is planned here, so every attempt reads the same records.
        Otherwise (a job run by hand) ``spec`` is required and the job plans from
        ``job.start_offsets`` / ``job.until_offsets`` itself; its end is then not fixed
        across attempts.
        """
        config = dict(config) if config is not None else config_from_env()
        carried = (getattr(job.protocol, "extra", None) or {}).get(PLAN_KEY)
        if carried:
            planned_spec = KafkaSourceSpec.from_dict(carried["spec"])
            plan = OffsetPlan.from_dict(carried["plan"])
            if plan.start != normalize_offsets(job.start_offsets or plan.start):
                raise KafkaSourceError(
                    f"the write task's plan starts at {plan.start}, the attempt at {job.start_offsets}"
                )
            return cls(config, spec or planned_spec, plan)
        if spec is None:
            raise KafkaSourceError(
                "this job was not given a plan by the write task (source={'kind': 'kafka', ...}): "
                "pass spec= to plan here"
            )
        if meta is None:
            with ConsumerMetadata(config) as real:
                plan = plan_offsets(real, spec, start=job.start_offsets, end=job.until_offsets)
        else:
            plan = plan_offsets(meta, spec, start=job.start_offsets, end=job.until_offsets)
        return cls(config, spec, plan)

    @property
    def start_offsets(self) -> Offsets:
        return self.plan.start

    @property
    def end_offsets(self) -> Offsets:
        """What the job sets as ``job.end_offsets``: the next checkpoint starts here."""
        return self.plan.end

    def read(self, spark: SparkSession) -> DataFrame:
        """The checkpoint's records, read by the executors (:func:`kafka_dataframe`)."""
        return kafka_dataframe(
            spark,
            self.config,
            self.plan,
            max_records_per_split=self.spec.max_records_per_split,
            timeout=self.spec.read_timeout,
        )


# ---------------------------------------------------------------------- after the commit


def commit_group_offsets(
    config: Mapping[str, Any], group_id: str, offsets: Mapping[str, Any], *, timeout: float = 30.0
) -> list[tuple[str, int, int]]:
    """Commit ``offsets`` (a committed checkpoint's end offsets) to consumer group ``group_id``.

    Only for lag tools: walsink never reads them back. Synchronous; raises
    :class:`KafkaSourceError` naming the partitions the cluster refused. Safe to
    repeat (committing the same offsets again changes nothing).
    """
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    wanted = normalize_offsets(offsets, "end offsets")
    partitions = [TopicPartition(t, int(p), o) for t, parts in wanted.items() for p, o in parts.items()]
    if not partitions:
        return []
    consumer = Consumer(consumer_config(config, group_id=group_id))
    try:
        try:
            result = consumer.commit(offsets=partitions, asynchronous=False)
        except KafkaException as e:
            raise KafkaSourceError(f"committing offsets of group {group_id!r} failed: {e}") from None
        refused = [tp for tp in result or [] if tp.error is not None]
        if refused:
            raise KafkaSourceError(
                f"group {group_id!r}: the cluster refused offsets of "
                + ", ".join(f"{tp.topic}[{tp.partition}] ({tp.error})" for tp in refused)
            )
        return [(tp.topic, tp.partition, tp.offset) for tp in partitions]
    finally:
        consumer.close()


def plan_summary(plan: OffsetPlan) -> str:
    """One log line: ranges per partition and gaps (no client settings)."""
    parts = [f"{t}[{p}] {b}..{e}" for t, p, b, e in plan.ranges()]
    gaps = f"; DATA LOSS accepted: {'; '.join(g.describe() for g in plan.gaps)}" if plan.gaps else ""
    return f"{plan.records} offsets: {', '.join(parts) or 'no partitions'}{gaps}"


# ---------------------------------------------------------------------- the write task's plan


def as_spec(source: KafkaSourceSpec | Mapping[str, Any]) -> KafkaSourceSpec:
    return source if isinstance(source, KafkaSourceSpec) else KafkaSourceSpec.from_dict(source)


class OffsetPlanner:
    """Plans of one write task, each asked of the cluster once (:func:`plan_offsets`, memoized).

    The write task checks its checkpoint's ranges *before* it records anything
    (:func:`check_before_recording`) and records the same plan afterwards
    (:func:`plan_attempt`): the memo makes both the same plan, with no window
    between them in which the log could move. The cluster connection opens on
    the first plan not in the memo; :meth:`close` closes it and keeps the memo.
    """

    def __init__(self, config: Mapping[str, Any], meta: KafkaMetadata | None = None) -> None:
        self.config = dict(config)
        self._meta = meta
        self._owned: ConsumerMetadata | None = None
        self._plans: dict[str, OffsetPlan] = {}

    @property
    def meta(self) -> KafkaMetadata:
        if self._meta is None:
            self._owned = ConsumerMetadata(self.config)
            self._meta = self._owned
        return self._meta

    def plan(
        self,
        spec: KafkaSourceSpec,
        *,
        start: Mapping[str, Any] | None,
        end: Mapping[str, Any] | None = None,
        read_ids: Mapping[str, str] | None = None,
    ) -> OffsetPlan:
        """:func:`plan_offsets` of these arguments (the memoized plan when asked before)."""
        memo = json.dumps([spec.to_dict(), start, end, read_ids], sort_keys=True)
        if memo not in self._plans:
            self._plans[memo] = plan_offsets(self.meta, spec, start=start, end=end, read_ids=read_ids)
        return self._plans[memo]

    def close(self) -> None:
        """Close the connection this planner opened (an injected ``meta`` is the caller's)."""
        if self._owned is not None:
            self._owned.close()
            self._owned = None
            self._meta = None


def check_before_recording(
    store: Any,
    pipeline: str,
    existing: CheckpointRecord | None,
    spec: KafkaSourceSpec,
    planner: OffsetPlanner,
    *,
    start_offsets: Mapping[str, Any] | None,
    until_offsets: Mapping[str, Any] | None,
) -> OffsetPlan:
    """Plan the next attempt of ``existing`` (``None``: a checkpoint not registered yet) as
    :func:`plan_attempt` will, recording nothing: a refusal (missing topic or partition,
    offsets gone backwards, a retention gap not accepted) is raised while the committer
    table is unchanged. Raises what :func:`plan_offsets` raises.
    """
    version = existing.version if existing is not None else 1
    key = existing.checkpoint_key if existing is not None else None
    plan, _ = _planned(
        store, pipeline, key, version, spec, planner, start_offsets=start_offsets, until_offsets=until_offsets
    )
    return plan


def _planned(
    store: Any,
    pipeline: str,
    checkpoint_key: str | None,
    version: int,
    spec: KafkaSourceSpec,
    planner: OffsetPlanner,
    *,
    start_offsets: Mapping[str, Any] | None,
    until_offsets: Mapping[str, Any] | None,
) -> tuple[OffsetPlan, str]:
    """The plan and how it is to be recorded: ``reprocess`` (only its gaps), ``fixed`` (the
    recorded plan, re-checked against the log) or ``new`` (recorded unless one is already).

    Topic ids are checked against what was read: a reprocess against the version it replaces
    (its plan is still on the row), a retry against its recorded plan, a new plan against the
    pipeline's last committed checkpoint's plan."""
    recorded = store.source_plan(pipeline, checkpoint_key) if checkpoint_key is not None else None
    if until_offsets is not None:
        read_ids = (recorded or {}).get("topic_ids")
        return planner.plan(spec, start=start_offsets, end=until_offsets, read_ids=read_ids), "reprocess"
    if (
        recorded is not None
        and recorded.get("version") == version
        and (start_offsets is None or _same(recorded.get("start"), start_offsets))
    ):
        fixed = OffsetPlan.from_dict(recorded)
        # Re-checked against the log now (retention may have moved on), never re-planned.
        plan = planner.plan(spec, start=fixed.start, end=fixed.end, read_ids=fixed.topic_ids)
        ids = {**plan.topic_ids, **fixed.topic_ids}
        known = set(fixed.gaps)
        if set(plan.gaps) - known:
            gaps = tuple(sorted(known | set(plan.gaps), key=_gap_key))
            return OffsetPlan(plan.start, plan.end, plan.read_from, gaps, ids), "fixed"
        return OffsetPlan(fixed.start, fixed.end, fixed.read_from, fixed.gaps, ids), "fixed"
    committed = store.newest_committed_source_plan(pipeline)
    return planner.plan(spec, start=start_offsets, read_ids=(committed or {}).get("topic_ids")), "new"


def plan_attempt(
    store: Any,
    record: CheckpointRecord,
    spec: KafkaSourceSpec,
    config: Mapping[str, Any],
    *,
    start_offsets: Mapping[str, Any] | None,
    until_offsets: Mapping[str, Any] | None,
    actor: Actor,
    meta: KafkaMetadata | None = None,
    planner: OffsetPlanner | None = None,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The write task's plan of the next attempt: ``(start_offsets, until_offsets, extra)``.

    * a reprocess (``until_offsets`` given) re-reads ``[its start, until)``;
    * otherwise the plan recorded on the checkpoint wins when it starts at ``start_offsets``
      (a retried write reads the same records); else the ranges are planned now (end: the high
      watermarks; a first checkpoint's start: ``spec.starting``) and recorded.

    ``planner`` (the one :func:`check_before_recording` used) gives back the plan it checked.
    An accepted retention gap is recorded as a history row naming it (``walsink status``
    and the UI show it). Raises the :mod:`~airflow_provider_walsink.core.sources.kafka` errors
    (missing topic, retention gap, offsets gone backwards) before anything is recorded.
    """
    planner = planner or OffsetPlanner(config, meta)
    try:
        plan, how = _planned(
            store,
            record.pipeline,
            record.checkpoint_key,
            record.version,
            spec,
            planner,
            start_offsets=start_offsets,
            until_offsets=until_offsets,
        )
        if how == "reprocess":
            _record_gaps(store, record, plan, actor)
        elif how == "fixed":
            _store_plan(store, record, plan, actor, replace=True, why="a retry keeps the end fixed before")
        else:
            held = _store_plan(store, record, plan, actor, replace=False, why="fixed by the first attempt")
            plan = OffsetPlan.from_dict(held)
    finally:
        planner.close()
    log.info("Kafka source of %s/%s: %s", record.pipeline, record.checkpoint_key, plan_summary(plan))
    extra = {PLAN_KEY: {"spec": spec.to_dict(), "plan": plan.to_dict()}}
    return plan.start, plan.end, extra


def _gap_key(gap: Any) -> tuple[str, int, int]:
    return gap.topic, gap.partition, gap.start


def _same(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def _store_plan(
    store: Any, record: CheckpointRecord, plan: OffsetPlan, actor: Actor, *, replace: bool, why: str
) -> dict[str, Any]:
    detail = f"Kafka source ranges {why}: {plan_summary(plan)}"
    return store.fix_source_plan(
        record.pipeline, record.checkpoint_key, plan.to_dict(), actor=actor, detail=detail, replace=replace
    )


def _record_gaps(store: Any, record: CheckpointRecord, plan: OffsetPlan, actor: Actor) -> None:
    if plan.gaps:
        store.record_event(
            record.pipeline,
            record.checkpoint_key,
            actor=actor,
            detail="DATA LOSS accepted (accept_data_loss): " + "; ".join(g.describe() for g in plan.gaps),
        )


def commit_group(
    store: Any, pipeline: str, spec: KafkaSourceSpec, config: Mapping[str, Any]
) -> dict[str, Any] | None:
    """After the target commit: commit the pipeline's **last committed** end offsets to the group.

    Never ahead of the committer table (only COMMITTED end offsets are sent), and a re-run or
    the next commit sends the newest ones, so a crash between the target commit and this call
    is caught up. Returns the offsets sent (``None``: no group configured or nothing committed).

    The group must still belong to ``pipeline`` (claimed at its plan, :func:`cluster_scope`):
    one handed over to another pipeline since (``walsink reassign-group``) raises
    :class:`~airflow_provider_walsink.core.store.errors.ConsumerGroupMovedError` naming both,
    with nothing sent.
    """
    if not spec.group_id:
        return None
    with ConsumerMetadata(config) as meta:
        scope = cluster_scope(meta, config)
    # Read, check the group's owner and send under the pipeline's lock: a slow task that read
    # older offsets must not send them after a newer commit's task sent the newer ones (the group
    # would move back), nor after the group was handed over to another pipeline.
    with store.newest_committed_offsets_held(pipeline, consumer_group=(scope, spec.group_id)) as offsets:
        if not offsets:
            return None
        commit_group_offsets(config, spec.group_id, offsets)
    log.info("Kafka group %s now at the committed end offsets %s", spec.group_id, offsets)
    return offsets


class KafkaOffsetSource(Source):
    """The Kafka source's contract (:class:`~airflow_provider_walsink.core.sources.base.Source`).

    * plan: the ranges ``[start, high watermark)`` per partition, asked of the cluster once
      per write task (:class:`OffsetPlanner`'s memo: the plan checked before anything is
      recorded is the plan recorded); recorded on the checkpoint's row by the first attempt of
      a version, reused (re-checked against the log, never re-planned) by every retry;
    * read: :class:`KafkaSource` from the plan in the job's protocol arguments;
    * after the commit: the consumer group's offsets follow the committer table.

    :param spec: what is read (:class:`KafkaSourceSpec` or its dict).
    :param config: the librdkafka client settings.
    """

    name: ClassVar[str] = "kafka"
    plans_input: ClassVar[bool] = True

    def __init__(
        self, spec: KafkaSourceSpec | Mapping[str, Any], config: Mapping[str, Any] | None = None
    ) -> None:
        self._spec = spec
        self._config = None if config is None else dict(config)
        self._planner: OffsetPlanner | None = None

    @property
    def config(self) -> dict[str, Any]:
        if self._config is None:
            self._config = config_from_env()
        return self._config

    @property
    def spec(self) -> KafkaSourceSpec:
        return as_spec(self._spec)

    def plan(
        self,
        store: Any,
        pipeline: str,
        checkpoint: CheckpointRecord | None,
        offsets: tuple[Mapping[str, Any] | None, Mapping[str, Any] | None] | None,
    ) -> None:
        config, spec = self.config, self.spec
        planner = self._planner = OffsetPlanner(config)
        try:
            for topic in spec.topics:
                planner.meta.partitions(topic)
            if offsets is not None:
                check_before_recording(
                    store,
                    pipeline,
                    checkpoint,
                    spec,
                    planner,
                    start_offsets=offsets[0],
                    until_offsets=offsets[1],
                )
            if spec.group_id:
                # After every other check (a refused plan claims nothing), before the checkpoint
                # is registered: a pipeline refused the group leaves nothing recorded.
                store.claim_consumer_group(cluster_scope(planner.meta, config), spec.group_id, pipeline)
        finally:
            planner.close()  # the memo stays: the plan recorded later is the one checked here

    def record(
        self,
        store: Any,
        checkpoint: CheckpointRecord,
        *,
        start_offsets: Mapping[str, Any] | None,
        until_offsets: Mapping[str, Any] | None,
        actor: Actor,
    ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        return plan_attempt(
            store,
            checkpoint,
            self.spec,
            self.config,
            start_offsets=start_offsets,
            until_offsets=until_offsets,
            actor=actor,
            planner=self._planner,
        )

    def job_env(self) -> dict[str, str]:
        """The client settings (secrets included) as JSON in :data:`CONFIG_ENV`."""
        return {CONFIG_ENV: json.dumps(dict(self.config), sort_keys=True)}

    def read(self, job: Any) -> KafkaSource:
        return KafkaSource.from_job(job, config=self._config)

    def after_commit(self, store: Any, pipeline: str) -> dict[str, Any] | None:
        """The group follows the committer table: only after COMMITTED (Flink's
        ``notifyCheckpointComplete``), with the newest committed end offsets."""
        spec = self.spec
        if not spec.group_id:
            return None
        crashpoint("commit.before_group_offsets")
        return {"kafka_group_offsets": commit_group(store, pipeline, spec, self.config)}


__all__: Sequence[str] = (
    "CONFIG_ENV",
    "ConsumerMetadata",
    "Gap",
    "KafkaMetadata",
    "KafkaOffsetSource",
    "KafkaSource",
    "KafkaSourceError",
    "KafkaSourceSpec",
    "OffsetPlan",
    "OffsetPlanner",
    "OffsetsWentBackwardsError",
    "RetentionGapError",
    "TopicNotFoundError",
    "TopicRecreatedError",
    "as_spec",
    "check_before_recording",
    "cluster_scope",
    "commit_group",
    "commit_group_offsets",
    "kafka_dataframe",
    "plan_attempt",
    "plan_offsets",
    "read_range",
    "split_ranges",
    "topic_ids_of",
)
