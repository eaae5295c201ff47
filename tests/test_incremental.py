"""The incremental append example: each input once, none read twice, none skipped, across a
failed-then-retried write.

Runs ``walsink_incremental_append`` with ``dag.test()``, real Spark and the
committer table on PostgreSQL. The first write attempt of the first interval
stages its data and then fails (the job's fault-injection switch); the task's
retry must read exactly the same files, and the next interval must start
exactly after them.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest

from airflow_provider_walsink.core.store import CommitterStore, OrderingError
from airflow_provider_walsink.operators.write import WalWriteOperator
from tests.helpers import ACTOR

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "dags"))

import walsink_example_common as examples  # noqa: E402

PIPELINE = "incoming_events"


@pytest.fixture
def env(monkeypatch, pg_url, tmp_path):
    home, staging = tmp_path / "examples", tmp_path / "staging"
    monkeypatch.setenv(
        "AIRFLOW_CONN_WALSINK_DEFAULT",
        json.dumps({"conn_type": "walsink", "extra": {"url": pg_url, "staging_root": str(staging)}}),
    )
    monkeypatch.setenv("AIRFLOW_VAR_WALSINK_EXAMPLE_HOME", str(home))
    return SimpleNamespace(home=home, staging=staging, store=CommitterStore.from_url(pg_url))


def run_day(day: date) -> dict:
    import walsink_incremental_append

    run = walsink_incremental_append.dag.test(logical_date=datetime(day.year, day.month, day.day, tzinfo=UTC))
    tis = {ti.task_id: ti for ti in run.get_task_instances()}
    assert run.state == "success", {t: ti.state for t, ti in tis.items()}
    return tis


def key_of(day: date) -> str:
    return f"{day:%Y%m%d}T000000Z"


def sources_by_checkpoint(target: Path) -> dict[str, Counter]:
    """(file, line) pairs in the target, per checkpoint key (target files are named after it)."""
    found: dict[str, Counter] = {}
    for path in target.rglob("*.parquet"):
        if any(part.startswith(("_", ".")) for part in path.relative_to(target).parts):
            continue
        checkpoint = path.name.split("-")[0]  # <key>-<attempt id>-<n>.parquet
        rows = pq.read_table(path, columns=["file", "line"]).to_pylist()
        found.setdefault(checkpoint, Counter()).update((r["file"], r["line"]) for r in rows)
    return found


@pytest.mark.spark
@pytest.mark.airflow
@pytest.mark.slow
def test_each_input_committed_once_none_read_twice_or_skipped_across_a_failed_write_retry(
    airflow_db, env, monkeypatch
):
    """Also the example's first-run checks (merged here from its plain dag.test() run): the first
    checkpoint records its end offset (no start offset), every row of its files once, as written."""
    day1, day2 = date(2026, 5, 1), date(2026, 5, 2)
    incoming = env.home / "raw/incoming"
    store = env.store

    # Interval 1: attempt 1 stages, then fails; the retry (attempt 2) commits. dag.test() waits
    # out the example's 10 s retry delay, a pause no assertion needs: the retry comes at once.
    import walsink_incremental_append

    write_task = walsink_incremental_append.dag.get_task("incoming_events.write")
    monkeypatch.setattr(write_task, "retry_delay", timedelta(0))
    monkeypatch.setenv("WALSINK_EXAMPLE_FAIL_AFTER_STAGING", key_of(day1))
    tis = run_day(day1)
    assert tis["incoming_events.write"].try_number == 2
    monkeypatch.delenv("WALSINK_EXAMPLE_FAIL_AFTER_STAGING")
    files1 = examples.arrival_file_names(datetime(2026, 5, 1))
    first = store.require(PIPELINE, key_of(day1))
    assert first.state.value == "COMMITTED"
    assert (first.sealed_attempt, first.start_offsets, first.end_offsets) == (
        2,
        None,
        {"incoming": files1[-1]},
    )
    assert store.last_committed_offsets(PIPELINE) == {"incoming": files1[-1]}
    # The first checkpoint's rows: every record of its files once, as the source has it.
    expected_rows = {
        (n, r["line"], r["user_id"], r["value"]) for n in files1 for r in examples.arrival_records(n)
    }
    target = env.home / "target/incoming_events"
    rows = [
        (r["file"], r["line"], r["user_id"], r["value"])
        for path in target.rglob(f"{key_of(day1)}-*.parquet")
        if not any(part.startswith(("_", ".")) for part in path.relative_to(target).parts)
        for r in pq.read_table(path, columns=["file", "line", "user_id", "value"]).to_pylist()
    ]
    assert len(rows) == len(set(rows)) == len(expected_rows)
    assert set(rows) == expected_rows
    history = store.history(PIPELINE, key_of(day1))
    failed = [h for h in history if h.to_state == "FAILED"]
    assert (
        len(failed) == 1 and failed[0].attempt == 1 and "injected failure after staging" in failed[0].detail
    )
    # Both attempts were given the same start offsets: nothing advanced before the commit.
    writing = [h for h in history if h.to_state == "WRITING"]
    assert [h.attempt for h in writing] == [1, 2]

    # Interval 2, with interval 3's files already landed early: it reads everything
    # that arrived after the committed offset, exactly once.
    files3 = examples.land_arrivals(incoming, datetime(2026, 5, 3))
    run_day(day2)
    files2 = examples.arrival_file_names(datetime(2026, 5, 2))
    second = store.require(PIPELINE, key_of(day2))
    assert second.state.value == "COMMITTED"
    assert second.start_offsets == first.end_offsets
    assert second.end_offsets == {"incoming": files3[-1]}
    assert store.last_committed_offsets(PIPELINE) == {"incoming": files3[-1]}

    by_checkpoint = sources_by_checkpoint(env.home / "target/incoming_events")
    expected = {
        key_of(day1): {(n, r["line"]) for n in files1 for r in examples.arrival_records(n)},
        key_of(day2): {(n, r["line"]) for n in files2 + files3 for r in examples.arrival_records(n)},
    }
    assert set(by_checkpoint) == set(expected)
    for key, pairs in expected.items():
        assert set(by_checkpoint[key]) == pairs, key  # nothing skipped, nothing foreign
        assert max(by_checkpoint[key].values()) == 1, key  # nothing read twice
    # Only the retried attempt's files were published for interval 1.
    target_files = [p.name for p in (env.home / "target/incoming_events").rglob("*.parquet")]
    retried = store.require(PIPELINE, key_of(day1))
    assert retried.sealed_attempt == 2
    day1_files = [n for n in target_files if n.startswith(f"{key_of(day1)}-")]
    assert day1_files and all(
        n.startswith(f"{key_of(day1)}-{retried.sealed_attempt_id}-") for n in day1_files
    )
    assert not (env.staging / PIPELINE / key_of(day1)).exists()  # attempt 1's staging is gone too

    # Interval 3's files were consumed early: its checkpoint reads nothing
    # (checked without Spark: the write task's start offsets are the committed ones).
    assert store.last_committed_offsets(PIPELINE) == {"incoming": files3[-1]}
    assert examples.files_after(incoming, files3[-1]) == []


def test_append_write_refuses_to_start_while_an_earlier_checkpoint_is_open(env):
    store = env.store
    store.register(PIPELINE, "k1", mode="append", actor=ACTOR)
    store.start_attempt(PIPELINE, "k1", actor=ACTOR)  # WRITING, never committed
    op = WalWriteOperator(
        task_id="write", application="/nonexistent.py", pipeline=PIPELINE, mode="append", checkpoint_key="k2"
    )
    ti = SimpleNamespace(dag_id=ACTOR.dag_id, task_id="write", run_id="r2", try_number=1, map_index=-1)
    with pytest.raises(OrderingError, match="earlier checkpoint k1 .* is WRITING"):
        op.execute({"ti": ti})
    assert store.require(PIPELINE, "k2").state.value == "REGISTERED"  # no attempt was started
