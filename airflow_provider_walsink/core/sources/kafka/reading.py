"""Reading on the executors: one offset range as Arrow batches (:func:`read_range`), shipped
to Spark's executors inside ``mapInArrow`` (:func:`executor_reader`, :func:`kafka_dataframe`).

The executors unpickle :func:`executor_reader`'s closure by this module's path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow_provider_walsink.core.faults import crashpoint
from airflow_provider_walsink.core.sources.kafka.cluster import consumer_config
from airflow_provider_walsink.core.sources.kafka.planning import OffsetPlan, split_ranges
from airflow_provider_walsink.core.sources.kafka.spec import (
    Gap,
    KafkaSourceError,
    OffsetsWentBackwardsError,
    RetentionGapError,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession


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
