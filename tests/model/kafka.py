"""The model checker's Kafka mode (issue 28): the pipeline reads a real topic of librdkafka's mock cluster.

``Config(kafka="HOST:PORT")`` (``python -m tests.model --source kafka``; ``append`` only, as a
Kafka source is): the schedule's topic is ``model-<pipeline>`` on the mock cluster (a child
process, ``tests/kafka_mock.py``), and

* **producers append between steps**: before every step, ``len(log) % 3`` records (one in
  three a tombstone, null value), and a ``write`` or ``run`` step produces its ``n`` more before
  it plans; every record's ``(partition, offset)`` is kept as the cluster acknowledged it;
* **a write step reads through the real Kafka source path**: the write task's planning
  (:func:`~airflow_provider_walsink.core.commit.write_phase.attempt_range`,
  :func:`~airflow_provider_walsink.core.sources.kafka.check_before_recording` before anything is
  recorded, :func:`~airflow_provider_walsink.core.sources.kafka.plan_attempt` recording the plan once
  per version), then each split read by the executors' reader
  (:func:`~airflow_provider_walsink.core.sources.kafka.read_range`, in this process instead of a
  Spark task, two records per batch), staged and sealed with ``CheckpointWriter`` as the
  other sources of the checker are;
* **a commit step** commits as the commit task does, through the core's
  :func:`~airflow_provider_walsink.core.commit.aftercommit.commit_then_follow` (the operator's
  own sequence): the core commit, then the Kafka source's ``after_commit`` (crash point
  ``commit.before_group_offsets``, then the consumer group's offsets);
* **kills**: a commit SIGKILLed between the target commit and the group commit
  (``commit.before_group_offsets``), and a write SIGKILLed mid-read (``kafka.read.after_batch``,
  the whole write task in a child process, after its reader handed over its first batch), then
  retried after more records were produced.

Checked after every step, besides the checker's own checks: every record produced below the
committed checkpoints' end offsets is in the target exactly once and none at or beyond them
(from the produced records, not from what the writes read); committed checkpoints' ranges are
contiguous per partition from offset 0; the group's committed offsets are never ahead of the
newest committed end offsets and equal them after every completed commit; a retried write
reads exactly its recorded plan; a ``replace`` reprocess re-reads exactly the records of the
version it replaces.
"""

from __future__ import annotations

import io
import json
import os
import signal
import traceback
import uuid
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_walsink.core import faults
from airflow_provider_walsink.core.commit.writer import CheckpointWriter
from airflow_provider_walsink.core.store.store import CommitterStore

if TYPE_CHECKING:
    from .world import Config, World

#: Where a Kafka-mode schedule may SIGKILL besides the target's own points.
KAFKA_KILL_POINTS = ("commit.before_group_offsets", "kafka.read.after_batch")
#: The writes' crash point (the others are commits').
WRITE_POINT = "kafka.read.after_batch"
#: Records per Arrow batch of the reader: small, so a kill after the first batch is mid-range.
BATCH_ROWS = 2


def topic(cfg: Config) -> str:
    return f"model-{cfg.pipeline}"


def client_config(cfg: Config) -> dict[str, Any]:
    return {"bootstrap.servers": cfg.kafka}


def spec(cfg: Config) -> Any:
    from airflow_provider_walsink.core.sources.kafka import KafkaSourceSpec

    # Three offsets per split: a range of a partition is read by several readers.
    return KafkaSourceSpec(topics=[topic(cfg)], group_id=f"model-{cfg.pipeline}", max_records_per_split=3,
                           read_timeout=30)  # fmt: skip


def flat(offsets: dict[str, Any] | None, cfg: Config) -> dict[str, int]:
    """``{partition: offset}`` of the schedule's topic in ``offsets`` (``{topic: {partition: offset}}``)."""
    return {str(p): int(o) for p, o in ((offsets or {}).get(topic(cfg)) or {}).items()}


class Producer:
    """Appends records to the schedule's topic; keeps what the cluster acknowledged."""

    def __init__(self, cfg: Config) -> None:
        from confluent_kafka import Producer as KafkaProducer

        self.cfg = cfg
        self._producer = KafkaProducer({**client_config(cfg), "linger.ms": 0})
        self.serial = 0
        #: ``(partition, offset, id, tombstone)`` of every record acknowledged.
        self.records: list[tuple[int, int, str, bool]] = []

    def produce(self, n: int) -> int:
        acked: list[tuple[int, int, str, bool]] = []
        errors: list[str] = []
        for _ in range(n):
            self.serial += 1
            rid, tombstone = f"r{self.serial}", self.serial % 3 == 0

            def done(err: Any, msg: Any, rid: str = rid, tombstone: bool = tombstone) -> None:
                if err is not None:
                    errors.append(str(err))
                else:
                    acked.append((msg.partition(), msg.offset(), rid, tombstone))

            # Partitions 0-2 only: partition 3 stays empty (an empty range every checkpoint).
            self._producer.produce(topic(self.cfg), key=rid.encode(), value=None if tombstone else b"v",
                                   partition=self.serial % 3, on_delivery=done)  # fmt: skip
        left = self._producer.flush(60)
        if left or errors or len(acked) != n:
            raise RuntimeError(f"the model's producer: {left} unacknowledged, errors {errors[:3]}")
        self.records += acked
        return n

    def close(self) -> None:
        self._producer.flush(10)
        self._producer = None


def group_offsets(cfg: Config) -> dict[str, int]:
    """The consumer group's committed offsets (``{partition: offset}``), read by a plain consumer."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**client_config(cfg), "group.id": spec(cfg).group_id, "enable.auto.commit": False})
    try:
        meta = consumer.list_topics(topic(cfg), timeout=30).topics.get(topic(cfg))
        if meta is None or not meta.partitions:
            return {}
        found = consumer.committed([TopicPartition(topic(cfg), p) for p in meta.partitions], timeout=30)
        return {str(tp.partition): tp.offset for tp in found if tp.offset >= 0}
    finally:
        consumer.close()


def write(cfg: Config, store: CommitterStore, layout: Any, key: str, a: Any) -> dict[str, Any] | str:
    """One write task of ``key`` reading the topic; the sealed attempt (JSON-able), or why it was skipped.

    As ``WalWriteOperator.execute`` does it: the plan checked before anything is recorded, then
    recorded (once per version), then the attempt started; each split read by the reader the
    executors run; staged and sealed with the plan's start and end offsets.
    """
    from airflow_provider_walsink.core.commit.write_phase import attempt_range
    from airflow_provider_walsink.core.sources.kafka import (
        OffsetPlan,
        OffsetPlanner,
        check_before_recording,
        plan_attempt,
        read_range,
        split_ranges,
    )

    existing = store.require(cfg.pipeline, key)
    if existing.is_committed:
        return "skipped: COMMITTED (a reprocess starts a new version)"
    planner = OffsetPlanner(client_config(cfg))
    offsets = attempt_range(store, cfg.pipeline, existing, initial_offsets=None, replacing=False)
    if offsets is None:
        earlier = [r for r in store.pending(cfg.pipeline) if r.sequence < existing.sequence]
        return f"skipped: earlier {earlier[0].checkpoint_key} is {earlier[0].state}" if earlier else "skipped"
    try:
        check_before_recording(store, cfg.pipeline, existing, spec(cfg), planner, start_offsets=offsets[0],
                               until_offsets=offsets[1])  # fmt: skip
    finally:
        planner.close()
    recorded = store.source_plan(cfg.pipeline, key)
    start, _end, extra = plan_attempt(store, existing, spec(cfg), client_config(cfg), start_offsets=offsets[0],
                                      until_offsets=offsets[1], actor=a, planner=planner)  # fmt: skip
    plan = OffsetPlan.from_dict(extra["kafka"]["plan"])
    writer = CheckpointWriter(store, layout, cfg.pipeline, key, actor=a, partition_columns=("dt",))
    attempt_dir = writer.begin(start_offsets=start)
    record = store.require(cfg.pipeline, key)
    version = record.version
    dt = f"{key[:4]}-{key[4:6]}-{key[6:]}"
    rows: list[tuple[str, str, int | None]] = []
    for t, p, begin, end in split_ranges(plan, spec(cfg).max_records_per_split):
        for batch in read_range(client_config(cfg), t, p, begin, end, timeout=30, batch_rows=BATCH_ROWS):
            for k, v, o in zip(batch["key"].to_pylist(), batch["value"].to_pylist(), batch["offset"].to_pylist(),
                               strict=True):  # fmt: skip
                rows.append((dt, k.decode(), None if v is None else o * 10 + version))
    files: dict[str, int] = {}
    for i, chunk in enumerate((rows[: len(rows) // 2], rows[len(rows) // 2 :])):
        if not chunk:
            continue
        buf = io.BytesIO()
        pq.write_table(pa.table({"id": pa.array([r[1] for r in chunk], pa.string()),
                                 "v": pa.array([r[2] for r in chunk], pa.int64())}), buf)  # fmt: skip
        rel = f"dt={dt}/part-{uuid.uuid4().hex[:8]}-{i}.parquet"
        if isinstance(attempt_dir, Path):
            (attempt_dir / f"dt={dt}").mkdir(parents=True, exist_ok=True)
            (attempt_dir / rel).write_bytes(buf.getvalue())
        else:  # an object store: as the executors write, one object per file
            with writer.objects.filesystem.open_output_stream(
                writer.objects.committable(attempt_dir, rel)
            ) as out:
                out.write(buf.getvalue())
        files[rel] = len(chunk)
    if not files:
        writer.declare_partition(f"dt={dt}")
    writer.add_files(list(files), rows=files, checksum="crc32", writer="model")
    writer.seal(file_format="parquet", job="model", start_offsets=start, end_offsets=plan.end)
    rec = store.require(cfg.pipeline, key)
    return {"attempt_id": rec.sealed_attempt_id, "version": version, "rows": rows, "partitions": [dt],
            "start": plan.start, "end": plan.end, "recorded": recorded, "supersedes": rec.supersedes_attempt_id}  # fmt: skip


def _child_write(cfg: Config, key: str, n: int, out: str) -> None:
    """A write task SIGKILLed by its reader after the first batch (:data:`WRITE_POINT`)."""
    import logging

    from .world import actor

    logging.disable(logging.ERROR)
    os.environ[faults.ENV] = f"{WRITE_POINT}:1"
    os.environ[faults.SIGNAL_ENV] = "KILL"
    try:
        store = CommitterStore.from_url(cfg.db_url, migrate=False)
        result: Any = write(cfg, store, cfg.layout(), key, actor("write", key, n))
        result = {"ok": True, "result": result}
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        result = {"ok": False, "error": type(exc).__name__, "text": traceback.format_exc()[-1500:]}
    Path(out).write_text(json.dumps(result))
    os._exit(0)


# ----------------------------------------------------------------------------- the world's Kafka steps


def note_attempt(world: World, result: dict[str, Any]) -> str:
    """Add a sealed attempt to the model (and check a retry's or a reprocess's range)."""
    from .world import Attempt

    m, cfg = world.model, world.cfg
    aid = result["attempt_id"]
    rows = [tuple(r) for r in result["rows"]]
    att = Attempt(result["key"], aid, result["version"], rows,
                  result["partitions"], kstart=flat(result["start"], cfg), kend=flat(result["end"], cfg))  # fmt: skip
    recorded = result.get("recorded")
    if (
        recorded
        and recorded.get("version") == result["version"]
        and flat(recorded["start"], cfg) == att.kstart
    ):
        if flat(recorded["end"], cfg) != att.kend:
            world.notes.append(
                f"{att.key}: a retried write read up to {att.kend}, not its recorded plan's end {recorded['end']}"
            )
    old = m.attempts.get(result.get("supersedes") or "")
    if old is not None:
        ids = lambda a: sorted(r[1] for r in a.rows)  # noqa: E731
        if ids(old) != ids(att) or (old.kstart, old.kend) != (att.kstart, att.kend):
            world.notes.append(
                f"{att.key}: the replace reprocess read {len(att.rows)} records [{att.kstart}, {att.kend}), "
                f"not the {len(old.rows)} of the version it replaces [{old.kstart}, {old.kend})"
            )
    m.attempts[aid] = att
    return f"sealed {aid[:8]} v{att.version} ({len(rows)} records, offsets {att.kstart}..{att.kend})"


def op_write(world: World, key: str, n: int) -> str:
    from .world import actor

    world.kafka.produce(n)
    a = actor("write", key, world._next())
    world.store.register(world.cfg.pipeline, key, mode=world.cfg.mode, actor=a, target=world.cfg.uri())
    result = write(world.cfg, world.store, world.layout, key, a)
    if isinstance(result, str):
        return result
    return note_attempt(world, {**result, "key": key})


def op_crash_write(world: World, key: str, retry: bool) -> str:
    """A write task SIGKILLed mid-read (a child process), more records produced, then its retry."""
    from .world import _CHILDREN

    world.kafka.produce(2)
    out = f"{world.cfg.work}/{uuid.uuid4().hex}.out"
    proc = _CHILDREN.Process(target=_child_write, args=(world.cfg, key, world._next(), out))
    proc.start()
    proc.join(300)
    killed = proc.exitcode == -signal.SIGKILL
    first = json.loads(Path(out).read_text()) if os.path.exists(out) else {"ok": False, "error": "killed"}
    if killed:
        world.counts["kills"] += 1
        world.counts[f"kill@{WRITE_POINT}"] += 1
    elif first.get("ok") and isinstance(first.get("result"), dict):
        note_attempt(world, {**first["result"], "key": key})  # nothing to read: it sealed
    world.kafka.produce(3)  # the retry must not read these
    if not retry:
        return f"try 1 {'killed' if killed else json.dumps(first)[:200]}; no retry"
    again = world.op_write(key, 0)
    if again.startswith("skipped"):
        return f"try 1 {'killed' if killed else 'done'}; retry {again}"
    return f"try 1 {'killed' if killed else 'done'}; retry {again}; {world.op_durable(key)}; {world.op_commit(key)}"


def after_commit(world: World, sent: dict[str, Any] | None) -> None:
    """After a commit task in this process (``sent``: the group offsets its source step committed):
    the group must then be caught up."""
    want = flat(world.store.last_committed_offsets(world.cfg.pipeline), world.cfg)
    got = group_offsets(world.cfg)
    if sent is not None and got != want:
        world.notes.append(f"after a completed commit the group is at {got}, not the committed end {want}")


def check(world: World) -> list[str]:
    """The Kafka invariants (see the module docstring), against the produced records."""
    m, cfg, problems = world.model, world.cfg, []
    live = [m.attempts[a] for a in [*m.committed.values(), *m.retired]]
    at: dict[str, int] = {}
    for att in sorted(live, key=lambda a: (sum(a.kend.values()), a.key)):
        for p in sorted(set(att.kstart) | set(at)):
            if att.kstart.get(p, 0) != at.get(p, 0):
                problems.append(
                    f"offsets not contiguous: {att.key} starts partition {p} at {att.kstart.get(p, 0)}, "
                    f"the previous committed checkpoint ended at {at.get(p, 0)}"
                )
        at = {p: max(o, at.get(p, 0)) for p, o in att.kend.items()} | {
            p: o for p, o in at.items() if p not in att.kend
        }
    bound = at
    expected = {rid for p, o, rid, _ in world.kafka.records if o < bound.get(str(p), 0)}
    tolerated = {r[1] for a in m.in_flight.values() for r in m.attempts[a].rows}
    try:
        got = Counter(i for _, i, _ in world.rows())
    except Exception as exc:  # noqa: BLE001 - reported by the checker's own check
        return [f"the target cannot be read: {type(exc).__name__}"]
    missing = sorted(expected - set(got))
    beyond = sorted(set(got) - expected - tolerated)
    twice = sorted(i for i, n in got.items() if n > 1)
    if missing:
        problems.append(
            f"records below the committed end offsets {bound} missing from the target: {missing[:6]}"
        )
    if beyond:
        problems.append(f"records at or beyond the committed end offsets {bound} in the target: {beyond[:6]}")
    if twice:
        problems.append(f"records in the target more than once: {twice[:6]}")
    group = group_offsets(cfg)
    ahead = {p: o for p, o in group.items() if o > bound.get(p, 0)}
    if ahead:
        problems.append(
            f"the group's offsets {group} are ahead of the committed end offsets {bound} at {ahead}"
        )
    return problems
