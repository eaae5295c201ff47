"""The Kafka source's executors reading a topic against one plain confluent-kafka consumer (issue 28).

Both sides read the same ranges (every partition of 10 topics, ``[low, high)``)
from librdkafka's mock cluster, started here in a child process
(``tests/kafka_mock.py``; it speaks the Kafka protocol on a loopback port and
keeps the log in memory), alternating in one run:

* baseline: one ``confluent_kafka.Consumer`` in this process, assigned every
  partition at its start offset, consuming until each range is complete and
  touching every value (its length summed): the least a reader can do;
* walsink: ``kafka_dataframe`` over the planned ranges in one ``local[2]``
  Spark session, split into tasks of at most ``--split`` offsets, each read by
  an executor with confluent-kafka into Arrow batches (Spark's Kafka columns),
  aggregated (count and the sum of value lengths) so every record crosses into
  Spark.

The mock cluster is one process on the same two cores, so the figures say what
walsink's executors add around the same fetches, not what a real cluster costs.

    .venv/bin/python -m bench.bench_kafka_read --records 1000000 --repeats 3
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile

from .bench_write import _session
from .common import Table, fmt_s, machine, median, ratio, spread, stopwatch

TOPIC = "bench_events"
#: The mock cluster keeps a few MiB per partition (older segments are deleted, as retention
#: would) and creates every topic with 4 partitions: 1M records are spread over several topics.
TOPICS = 10
PARTITIONS = 4


def topics() -> list[str]:
    return [f"{TOPIC}_{i:02d}" for i in range(TOPICS)]


def produce(kafka, records: int, value_bytes: int) -> None:
    from confluent_kafka import Producer

    producer = Producer({**kafka.config, "linger.ms": 50, "batch.num.messages": 10000,
                         "queue.buffering.max.messages": 2_000_000})  # fmt: skip
    value = b"v" * value_bytes
    names = topics()
    for i in range(records):
        while True:
            try:
                producer.produce(
                    names[i % TOPICS], key=str(i).encode(), value=value, partition=(i // TOPICS) % PARTITIONS
                )
                break
            except BufferError:
                producer.poll(0.1)
        if i % 10000 == 0:
            producer.poll(0)
    if producer.flush(300):
        raise RuntimeError("bench: records not acknowledged by the mock cluster")


def plain_once(config: dict, plan) -> tuple[float, int, int]:
    """One consumer reads every range of the plan; returns (seconds, records, value bytes)."""
    from confluent_kafka import Consumer, TopicPartition

    from airflow_provider_walsink.core.sources.kafka import consumer_config

    consumer = Consumer(consumer_config(config))
    ends = {(t, p): e for t, p, b, e in plan.ranges() if b < e}
    records = size = 0
    with stopwatch() as elapsed:
        consumer.assign([TopicPartition(t, p, b) for t, p, b, e in plan.ranges() if b < e])
        left = dict(ends)
        while left:
            for msg in consumer.consume(1000, 1.0):
                if msg.error() is not None:
                    continue  # partition EOF events
                tp = (msg.topic(), msg.partition())
                if tp not in left or msg.offset() >= left[tp]:
                    continue
                records += 1
                size += len(msg.value() or b"")
                if msg.offset() + 1 >= left[tp]:
                    del left[tp]
    consumer.close()
    return elapsed(), records, size


def walsink_once(spark, config: dict, plan, split: int) -> tuple[float, int, int]:
    from pyspark.sql import functions as F

    from airflow_provider_walsink.core.sources.kafka import kafka_dataframe

    with stopwatch() as elapsed:
        df = kafka_dataframe(spark, config, plan, max_records_per_split=split)
        row = df.agg(F.count(F.lit(1)).alias("n"), F.sum(F.length("value")).alias("bytes")).collect()[0]
    return elapsed(), int(row["n"]), int(row["bytes"] or 0)


def run(records: int, repeats: int, split: int, value_bytes: int) -> Table:
    from airflow_provider_walsink.core.sources.kafka import (
        ConsumerMetadata,
        KafkaSourceSpec,
        plan_offsets,
        split_ranges,
    )
    from tests.kafka_mock import MockKafka

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    logging.getLogger("airflow_provider_walsink").setLevel(logging.WARNING)
    kafka = MockKafka()
    spark = _session(None)
    t = Table(
        "Kafka source: Spark executors reading every partition's range vs one plain confluent-kafka consumer",
        ["records", "plain consumer (median)", "walsink executors (median)", "ratio", "plain range",
         "walsink range"],
    )  # fmt: skip
    try:
        with stopwatch() as produced:
            produce(kafka, records, value_bytes)
        with ConsumerMetadata(kafka.config) as meta:
            plan = plan_offsets(meta, KafkaSourceSpec(topics=topics()), start=None)
        if plan.records != records:
            raise RuntimeError(f"bench: the plan spans {plan.records} offsets, {records} were produced")
        walsink_once(spark, kafka.config, plan, split)  # Python workers started: not counted
        plain, ws = [], []
        for r in range(repeats):
            for step in ("plain", "walsink") if r % 2 == 0 else ("walsink", "plain"):
                seconds, n, size = (
                    plain_once(kafka.config, plan)
                    if step == "plain"
                    else walsink_once(spark, kafka.config, plan, split)
                )
                if n != records or size != records * value_bytes:
                    raise RuntimeError(f"bench: {step} read {n} records / {size} bytes, expected {records}")
                (plain if step == "plain" else ws).append(seconds)
        t.rows.append([f"{records:,}", fmt_s(median(plain)), fmt_s(median(ws)), ratio(median(ws), median(plain)),
                       spread(plain), spread(ws)])  # fmt: skip
    finally:
        spark.stop()
        kafka.stop()
    t.notes.append(
        f"{repeats} repeats, alternating; {TOPICS} topics x {PARTITIONS} partitions, {value_bytes}-byte values; "
        f"splits of at most {split:,} offsets ({len(split_ranges(plan, split))} Spark tasks) in one local[2] session; the mock "
        f"cluster in a child process on the same cores; producing the topic took {fmt_s(produced())}."
    )
    return t


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--split", type=int, default=12_500, help="max offsets per Spark task")
    p.add_argument("--value-bytes", type=int, default=100)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="walsink-bench-kafka-") as tmp:
        print(machine(tmp).render())
        print(run(args.records, args.repeats, args.split, args.value_bytes).render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
