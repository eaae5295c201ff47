"""Planning one checkpoint's ranges ``[start, end)`` per partition, asked of the cluster
(:func:`plan_offsets`), and splitting them into Spark tasks.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_walsink.core.sources.kafka.cluster import KafkaMetadata
from airflow_provider_walsink.core.sources.kafka.spec import (
    Gap,
    KafkaSourceError,
    KafkaSourceSpec,
    Offsets,
    OffsetsWentBackwardsError,
    RetentionGapError,
    TopicRecreatedError,
    normalize_offsets,
)


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


def plan_summary(plan: OffsetPlan) -> str:
    """One log line: ranges per partition and gaps (no client settings)."""
    parts = [f"{t}[{p}] {b}..{e}" for t, p, b, e in plan.ranges()]
    gaps = f"; DATA LOSS accepted: {'; '.join(g.describe() for g in plan.gaps)}" if plan.gaps else ""
    return f"{plan.records} offsets: {', '.join(parts) or 'no partitions'}{gaps}"
