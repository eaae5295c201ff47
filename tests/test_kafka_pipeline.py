"""Issue 28 through the real operators: a Kafka source into a Delta table, exactly once.

Real parts: librdkafka's mock cluster in a child process (``tests/kafka_mock.py``) read as a
broker by a REAL spark-submit's executors; the write task's plan recorded in the committer
table (SQLite); the durability sensor; the commit task publishing into a Delta table (read
back with deltalake) and committing the consumer group's offsets, read back with a plain
consumer. Crashes are the repo's crash points (SIGKILL): a write attempt's executor killed
mid-read, and a commit task killed between the target commit and the group commit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

try:
    import confluent_kafka  # noqa: F401
except ImportError:  # the kafka extra; CI installs it, so there a missing one fails the run
    from tests.helpers import missing_prerequisite

    missing_prerequisite('confluent-kafka is not installed (pip install ".[kafka]")')

from airflow_provider_walsink.core.protocol import CheckpointState as S  # noqa: E402
from airflow_provider_walsink.core.sources.kafka import TopicNotFoundError  # noqa: E402
from airflow_provider_walsink.operators.commit import WalCommitOperator  # noqa: E402
from airflow_provider_walsink.operators.write import WalWriteOperator  # noqa: E402
from airflow_provider_walsink.sensors.durable import CheckpointDurableSensor  # noqa: E402
from tests.kafka_mock import MockKafka  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
PIPELINE = "kafka_events"
TOPIC = "events"
GROUP = "walsink-kafka-events"

#: A SASL password in the connection (unused by the PLAINTEXT mock, accepted by librdkafka): it must
#: reach the job only through the environment, never a command line or the task's log.
SECRET = "kafka-s3cr3t-sentinel"

JOB = textwrap.dedent(
    """
    import os

    from pyspark.sql import SparkSession

    from airflow_provider_walsink.core.sources.kafka import KafkaSource
    from airflow_provider_walsink.core.spark import CheckpointJob

    spark = SparkSession.builder.getOrCreate()
    with CheckpointJob.from_argv(spark) as job:
        source = KafkaSource.from_job(job)
        df = source.read(spark).selectExpr("topic", "partition", "offset", "CAST(key AS STRING) AS key", "value")
        job.stage(df.coalesce(1))
        job.end_offsets = source.end_offsets
        secret = source.config["sasl.password"].encode()
        exposed = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if secret in f.read():
                        exposed.append(pid)
            except OSError:
                pass
        assert not exposed, f"the Kafka secret is on the command line of processes {exposed}"
    spark.stop()
    """
)


@pytest.fixture(scope="module")
def kafka():
    cluster = MockKafka()
    yield cluster
    cluster.stop()


def context(task_id: str, day: int, *, run: str = "scheduled", try_number: int = 1, dag_run: Any = None):
    start = datetime(2026, 6, day, tzinfo=UTC)
    ti = SimpleNamespace(dag_id="kafka_test", task_id=task_id, run_id=f"{run}__{day}", try_number=try_number,
                         map_index=-1, id=None, xcom_push=lambda key, value: None)  # fmt: skip
    return {"ti": ti, "logical_date": start, "data_interval_start": start,
            "data_interval_end": start + timedelta(days=1), "dag_run": dag_run}  # fmt: skip


def key(day: int) -> str:
    return f"202606{day:02d}T000000Z"


class Tasks:
    def __init__(self, tmp_path: Path, url: str, kafka: MockKafka, monkeypatch, topics=(TOPIC,)) -> None:
        self.table = tmp_path / "table"
        self.target = f"delta://{self.table}?create_table=true"
        self.job = tmp_path / "job.py"
        self.job.write_text(JOB)
        self.source = {
            "kind": "kafka",
            "topics": list(topics),
            "group_id": GROUP,
            "max_records_per_split": 25,
        }
        self.env = {
            "AIRFLOW_CONN_WALSINK_DEFAULT": json.dumps({"conn_type": "walsink", "extra": {"url": url}}),
            "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps(
                {
                    "conn_type": "kafka",
                    "extra": {**kafka.config, "sasl.username": "walsink", "sasl.password": SECRET},
                }
            ),
        }
        for name, value in self.env.items():
            monkeypatch.setenv(name, value)

    def write_op(self, **kwargs: Any) -> WalWriteOperator:
        return WalWriteOperator(
            task_id="write", application=str(self.job), pipeline=PIPELINE, mode="append", target=self.target,
            master="local[2]", source=self.source, **kwargs,
        )  # fmt: skip

    def write(self, day: int, **kwargs: Any) -> dict:
        ctx_kwargs = {k: kwargs.pop(k) for k in ("try_number", "dag_run", "run") if k in kwargs}
        return self.write_op(**kwargs).execute(context("write", day, **ctx_kwargs))

    def durable(self, day: int) -> bool:
        return CheckpointDurableSensor(task_id="durable", pipeline=PIPELINE, checkpoint_key=key(day)).poke(
            context("durable", day)
        )

    def commit_op(self, day: int) -> WalCommitOperator:
        return WalCommitOperator(
            task_id="commit", pipeline=PIPELINE, target=self.target, mode="append", checkpoint_key=key(day),
            emit_asset_events=False, source=self.source,
        )  # fmt: skip

    def commit(self, day: int) -> dict:
        return self.commit_op(day).execute(context("commit", day))

    def commit_in_child(self, day: int, crash_at: str) -> int:
        """The commit task in its own process, SIGKILLed at ``crash_at``; returns its exit code."""
        # Rebuild the operator in the child from the same settings.
        code = textwrap.dedent(
            f"""
            import sys; sys.path.insert(0, {str(REPO)!r})
            from airflow_provider_walsink.operators.commit import WalCommitOperator
            from tests.test_kafka_pipeline import context
            WalCommitOperator(
                task_id="commit", pipeline={PIPELINE!r}, target={self.target!r}, mode="append",
                checkpoint_key={key(day)!r}, emit_asset_events=False, source={self.source!r},
            ).execute(context("commit", {day}))
            """
        )
        env = {**os.environ, **self.env, "WALSINK_CRASH_AT": crash_at}
        return subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, timeout=600).returncode

    def table_rows(self) -> list[tuple[str, int, int]]:
        from deltalake import DeltaTable

        rows = (
            DeltaTable(str(self.table)).to_pyarrow_table(columns=["topic", "partition", "offset"]).to_pylist()
        )
        return sorted((r["topic"], r["partition"], r["offset"]) for r in rows)


def produce(kafka: MockKafka, first: int, n: int, topic: str = TOPIC) -> list[tuple[str, int, int]]:
    acked = kafka.produce(topic, [{"key": f"k{first + i}".encode(), "value": b"v", "partition": (first + i) % 3}
                                   for i in range(n)])  # fmt: skip
    return [(topic, p, o) for p, o in acked]


def offsets_of(rows: list[tuple[str, int, int]]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for topic, p, o in rows:
        out.setdefault(topic, {})[str(p)] = max(out.get(topic, {}).get(str(p), 0), o + 1)
    return out


@pytest.mark.spark
@pytest.mark.slow
def test_killed_write_retry_and_killed_group_commit_lose_and_double_nothing(
    kafka, sqlite_store, database_urls, tmp_path, monkeypatch, capfd, caplog
):
    t = Tasks(tmp_path, database_urls("sqlite"), kafka, monkeypatch)
    batch1 = produce(kafka, 0, 60)

    # Checkpoint 1, attempt 1: an executor is SIGKILLed after handing Spark its first batch.
    crashes = tmp_path / "crashes.log"
    with pytest.raises(Exception) as killed:
        t.write(1, env_vars={"WALSINK_CRASH_AT": "kafka.read.after_batch", "WALSINK_CRASH_LOG": str(crashes)})
    assert "exited with code" in str(killed.value) or "Cannot execute" in str(killed.value), killed.value
    assert crashes.read_text().startswith("kafka.read.after_batch:1")  # the injected kill, not another death
    first = sqlite_store.require(PIPELINE, key(1))
    assert first.state is S.FAILED and first.attempt == 1
    plan = sqlite_store.source_plan(PIPELINE, key(1))
    assert plan["end"] == {TOPIC: {**offsets_of(batch1)[TOPIC], "3": 0}}

    # More records arrive before the retry: the retry still reads exactly the recorded range.
    batch2 = produce(kafka, 60, 30)
    t.write(1, try_number=2)
    sealed = sqlite_store.require(PIPELINE, key(1))
    assert sealed.state is S.SEALED and sealed.sealed_attempt == 2
    assert sealed.end_offsets == plan["end"]
    assert sealed.start_offsets == {TOPIC: {"0": 0, "1": 0, "2": 0, "3": 0}}  # earliest, resolved once
    assert t.durable(1)
    t.commit(1)
    assert sqlite_store.require(PIPELINE, key(1)).state is S.COMMITTED
    assert t.table_rows() == sorted(batch1)
    assert kafka.committed(GROUP, TOPIC) == {int(p): o for p, o in plan["end"][TOPIC].items()}

    # Checkpoint 2 reads from checkpoint 1's end; its commit task dies between the target
    # commit and the group commit.
    t.write(2)
    assert sqlite_store.require(PIPELINE, key(2)).start_offsets == plan["end"]
    assert t.durable(2)
    assert t.commit_in_child(2, "commit.before_group_offsets") == -9
    second = sqlite_store.require(PIPELINE, key(2))
    assert second.state is S.COMMITTED
    assert t.table_rows() == sorted(batch1 + batch2)  # in the table once ...
    assert kafka.committed(GROUP, TOPIC) == {
        int(p): o for p, o in plan["end"][TOPIC].items()
    }  # ... group behind

    # The re-run of the commit task changes nothing in the table and catches the group up.
    rerun = t.commit(2)
    assert rerun["already_committed"] is True
    assert t.table_rows() == sorted(batch1 + batch2)
    assert kafka.committed(GROUP, TOPIC) == {int(p): o for p, o in second.end_offsets[TOPIC].items()}
    assert second.end_offsets == {TOPIC: {**offsets_of(batch1 + batch2)[TOPIC], "3": 0}}

    # A replace reprocess of checkpoint 1 re-reads exactly [its start, its end): same records.
    backfill = SimpleNamespace(conf={"walsink_reprocess": "replace"}, clear_number=0, run_type="backfill")
    produce(kafka, 90, 10)
    t.write(1, run="backfill", dag_run=backfill)
    again = sqlite_store.require(PIPELINE, key(1))
    assert (
        again.version == 2
        and again.end_offsets == plan["end"]
        and again.start_offsets == sealed.start_offsets
    )
    assert t.durable(1)
    t.commit(1)
    assert t.table_rows() == sorted(batch1 + batch2)  # version 1's rows replaced by the same rows, once
    # The group is never moved behind the newest committed checkpoint by an older one's commit.
    assert kafka.committed(GROUP, TOPIC) == {int(p): o for p, o in second.end_offsets[TOPIC].items()}
    # Every job checked no command line held the connection's secret; no log line holds it either.
    out, err = capfd.readouterr()
    assert "walsink: sealed" in out + err + caplog.text  # the jobs' output was captured here
    assert SECRET not in out + err + caplog.text


def test_a_missing_topic_is_refused_before_the_committer_table_changes(
    kafka, sqlite_store, database_urls, tmp_path, monkeypatch
):
    t = Tasks(tmp_path, database_urls("sqlite"), kafka, monkeypatch, topics=("never-produced",))
    with pytest.raises(TopicNotFoundError, match="'never-produced' does not exist"):
        t.write(1)
    assert sqlite_store.get(PIPELINE, key(1)) is None
    assert not t.table.exists()
