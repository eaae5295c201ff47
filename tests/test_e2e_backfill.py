"""End to end on a real Airflow stack: a parallel backfill of the overwrite example with the
deferrable durability sensor, then two of its days re-run with ``--reprocess-behavior
completed`` and ``replace``; the target holds every interval's rows exactly once and the
committer table one COMMITTED checkpoint per interval.

How the sensor is seen waiting, honestly: the backfill's runs hand the durability wait to
the triggerer without the sensor's first check in the worker (run conf
``walsink_check_before_defer: false``), and the triggerer is stopped before the backfill,
so every sensor stays ``deferred`` (its checkpoint SEALED, not yet verified, the commit
task not started) until the triggerer is started again. Nothing in the DAG is slowed down.

Clearing tasks, as a user does in the UI (``POST /api/v2/dags/{dag_id}/clearTaskInstances``),
and what each clear does to the target (``docs/backfill.md``, "Clearing tasks"):

* clearing the write task **before** the checkpoint committed (sealed, its sensor waiting in
  the stopped triggerer; one run of the backfill above): the re-run write starts attempt 2,
  which is sealed, verified and published; attempt 1 is never published, and the target
  holds the interval's rows once;
* clearing tasks of a committed run changes nothing: the replace test below (a cleared
  commit task: already committed), tests/test_e2e_quickstart.py (a re-run: the write task
  and its downstream SKIPPED, the target byte-identical), tests/test_e2e_downstream.py (the
  commit task: no state change, no second asset event) and tests/test_e2e_table_targets.py.
"""

from __future__ import annotations

import hashlib
import sys
from datetime import date, datetime, timedelta
from pathlib import Path

import pytest

from airflow_provider_walsink.core.store.store import CommitterStore

pytestmark = [pytest.mark.e2e, pytest.mark.spark, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent
DAG_ID = "walsink_daily_overwrite"
PIPELINE = "daily_events"
FIRST_DAY = date(2026, 1, 1)
#: Three days, as many as the backfill runs at once (max_active_runs=3): enough to see the
#: sensors of two runs deferred together, and two Spark jobs fewer than five days.
DAYS = [FIRST_DAY + timedelta(days=i) for i in range(3)]
WRITE_OP, DURABLE_OP, COMMIT_OP = "WalWriteOperator", "CheckpointDurableSensor", "WalCommitOperator"


def _example_common():
    sys.path.insert(0, str(REPO / "dags"))
    try:
        import walsink_example_common
    finally:
        sys.path.remove(str(REPO / "dags"))
    return walsink_example_common


def _key(day: date) -> str:
    return f"{day:%Y%m%d}T000000Z"


def _run_day(run: dict) -> date:
    return datetime.fromisoformat(run["data_interval_start"].replace("Z", "+00:00")).date()


def _tasks_by_operator(stack, run_id: str) -> dict[str, dict]:
    return {ti["operator"]: ti for ti in stack.task_instances(DAG_ID, run_id)}


def _snapshot(root: Path) -> dict[str, str]:
    """Every file under the target (hidden bookkeeping included) → sha256."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _check_target_against_source(target: Path, days: list[date]) -> int:
    """Each day's partition holds exactly that day's source rows, once; returns the row total."""
    import pyarrow.parquet as pq

    common = _example_common()
    partitions = sorted(p.name for p in target.iterdir() if p.is_dir() and p.name.startswith("dt="))
    assert partitions == [f"dt={d.isoformat()}" for d in sorted(days)]
    total = 0
    for day in days:
        files = sorted((target / f"dt={day.isoformat()}").glob("*.parquet"))
        assert files, f"no data files in partition dt={day}"
        table = pq.ParquetDataset([str(f) for f in files]).read()
        got = sorted(
            (
                r["event_id"],
                r["ts"].strftime("%Y-%m-%d %H:%M:%S"),
                r["user_id"],
                r["country"],
                r["event_type"],
                r["amount_cents"],
            )
            for r in table.to_pylist()
        )
        want = sorted(
            (e["event_id"], e["ts"], e["user_id"], e["country"], e["event_type"], e["amount_cents"])
            for e in common.daily_events(day)
        )
        assert len(got) == len(want), f"dt={day}: {len(got)} rows in the target, {len(want)} in the source"
        assert got == want, f"dt={day}: target rows differ from the source"
        total += len(got)
    return total


def test_parallel_backfill_with_deferrable_sensor_a_write_cleared_before_commit(airflow_stack):
    """The backfill's sensors wait deferred; one run's write task is cleared meanwhile (attempt 2
    is the one published, attempt 1 never); every interval commits once, its staging cleaned.
    (With the SQLite committer, the checks of the example's former dag.test() run, merged here:
    rows against the source, the staging cleaned, one WRITING and one COMMITTED per interval.)
    A re-run of committed intervals with the default policy (the write task skips, nothing
    changes, one "write skipped" event) is proven through the scheduler by
    tests/test_e2e_quickstart.py; the ``replace`` re-run of these days is the next test."""
    stack = airflow_stack
    examples = stack.home / "walsink" / "examples"
    target = examples / "target" / PIPELINE
    store = CommitterStore.from_url(f"sqlite:///{stack.home}/walsink/committer.db")
    try:
        stack.wait_for_dag(DAG_ID)
        # Stopped triggerer: a deferred sensor can only wait (see the module docstring).
        stack.stop_component("triggerer")
        try:
            stack.unpause(DAG_ID)
            # The sensor's first check in the worker would usually find the checkpoint durable
            # already; this run option hands every wait straight to the triggerer.
            backfill = stack.backfill(
                DAG_ID,
                DAYS[0].isoformat(),
                DAYS[-1].isoformat(),
                max_active_runs=3,
                conf={"walsink_check_before_defer": False},
            )

            def deferred_sensors() -> list[tuple[str, dict]] | None:
                found = []
                for run in stack.dag_runs(DAG_ID):
                    if run["run_type"] != "backfill":
                        continue
                    tis = _tasks_by_operator(stack, run["dag_run_id"])
                    if tis[DURABLE_OP]["state"] == "deferred":
                        found.append((run, tis))
                return found if len(found) >= 2 else None

            waiting = stack.wait_until("two backfill runs' sensors to defer", deferred_sensors, timeout=600)
            for run, tis in waiting:
                run_id, day = run["dag_run_id"], _run_day(run)
                record = store.require(PIPELINE, _key(day))
                # The gate has not passed: staged and sealed, not verified, not published.
                assert record.state.value == "SEALED", (run_id, record.state)
                assert tis[WRITE_OP]["state"] == "success"
                assert tis[COMMIT_OP]["state"] in (None, "none"), (run_id, tis[COMMIT_OP]["state"])
                assert not (target / f"dt={day.isoformat()}").exists()

            # Clear one waiting run's write task (and downstream) while attempt 1 waits to be verified.
            cleared_run, cleared_tis = waiting[0]
            cleared_id, cleared_day = cleared_run["dag_run_id"], _run_day(cleared_run)
            stack.clear_task(DAG_ID, cleared_id, [cleared_tis[WRITE_OP]["task_id"]], include_downstream=True)

            def attempt_2_waiting() -> tuple[dict, object] | None:
                tis = _tasks_by_operator(stack, cleared_id)
                record = store.get(PIPELINE, _key(cleared_day))
                if tis[DURABLE_OP]["state"] == "deferred" and record and record.sealed_attempt == 2:
                    return tis, record
                return None

            tis, record = stack.wait_until(
                "the cleared write's attempt 2 sealed with its sensor deferred",
                attempt_2_waiting,
                timeout=600,
            )
            assert record.state.value == "SEALED" and record.attempt == 2
            assert tis[WRITE_OP]["try_number"] == 2
            assert not (target / f"dt={cleared_day.isoformat()}").exists()
        finally:
            stack.start_component("triggerer")

        runs = stack.wait_for_backfill(backfill, timeout=900)
        assert sorted(_run_day(r) for r in runs) == DAYS
        assert {r["state"] for r in runs} == {"success"}, [(r["dag_run_id"], r["state"]) for r in runs]
        # Any other run of the DAG in this session (tests share the stack) is checked like the rest.
        everything = stack.wait_for_runs(DAG_ID, [r["dag_run_id"] for r in stack.dag_runs(DAG_ID)])
        assert {r["state"] for r in everything.values()} == {"success"}
        days = sorted({_run_day(r) for r in everything.values()})

        checkpoints = store.checkpoints(PIPELINE, descending=False)
        assert sorted(c.checkpoint_key for c in checkpoints) == sorted(_key(d) for d in days)
        assert {c.state.value for c in checkpoints} == {"COMMITTED"}
        # The cleared run published its attempt 2 only; attempt 1 was sealed and never published.
        cleared = store.require(PIPELINE, _key(cleared_day))
        assert cleared.sealed_attempt == 2
        history = store.history(PIPELINE, _key(cleared_day))
        assert [t.attempt for t in history if t.to_state == "SEALED"] == [1, 2]
        assert [t.attempt for t in history if t.to_state == "COMMITTED"] == [2]
        # The interval's rows once (every day checked against its source just below).
        assert len(_partition_rows(target, cleared_day)) == cleared.rows
        rows = _check_target_against_source(target, days)
        for day in DAYS:
            key = _key(day)
            # Each commit cleaned its checkpoint's staging (the WAL), the cleared run's attempt 1 too.
            assert not (stack.home / "walsink" / "staging" / PIPELINE / key).exists(), key
            changes = [h.to_state for h in store.history(PIPELINE, key) if h.from_state != h.to_state]
            assert changes.count("COMMITTED") == 1, (key, changes)
            if day != cleared_day:  # (the cleared one wrote twice: its SEALED attempts [1, 2] above)
                assert changes.count("WRITING") == 1, (key, changes)
        assert rows == sum(c.rows for c in checkpoints)
    finally:
        store.dispose()


def _rewrite_csv(path: Path, keep: int) -> list[str]:
    """A "fixed" input for a day: its header and first ``keep`` rows; returns their event ids."""
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[: keep + 1]))
    return [line.split(",", 1)[0] for line in lines[1 : keep + 1]]


def _partition_rows(target: Path, day: date) -> list[str]:
    import pyarrow.parquet as pq

    files = sorted((target / f"dt={day.isoformat()}").glob("*.parquet"))
    return [r["event_id"] for f in files for r in pq.read_table(f).to_pylist()]


def test_replace_backfill_supersedes_committed_intervals(airflow_stack):
    """Reprocess with ``replace`` (asked by the backfill's run conf) over two committed days,
    one of whose input was fixed: a new version of each interval supersedes the committed one;
    a cleared commit task afterwards changes nothing. Runs after the test above (same days,
    already committed) or alone (it commits them first)."""
    stack = airflow_stack
    examples = stack.home / "walsink" / "examples"
    target = examples / "target" / PIPELINE
    store = CommitterStore.from_url(f"sqlite:///{stack.home}/walsink/committer.db")
    try:
        _replace_backfill_rewrites(stack, store, examples, target)
    finally:
        store.dispose()


def _replace_backfill_rewrites(stack, store, examples: Path, target: Path) -> None:
    fixed, same = DAYS[0], DAYS[1]
    stack.wait_for_dag(DAG_ID)
    stack.unpause(DAG_ID)
    if any((c := store.get(PIPELINE, _key(d))) is None or not c.is_committed for d in (fixed, same)):
        first = stack.backfill(DAG_ID, fixed.isoformat(), same.isoformat(), max_active_runs=2)
        assert {r["state"] for r in stack.wait_for_backfill(first, timeout=900)} == {"success"}
    common = _example_common()
    kept = _rewrite_csv(common.daily_events_path(examples / "raw" / "daily_events", fixed), keep=250)
    v1 = {d: store.require(PIPELINE, _key(d)) for d in (fixed, same)}
    untouched = {
        p.name: _snapshot(p)
        for p in target.iterdir()
        if p.is_dir() and p.name not in (f"dt={fixed.isoformat()}", f"dt={same.isoformat()}")
    }

    replace = stack.backfill(
        DAG_ID,
        fixed.isoformat(),
        same.isoformat(),
        reprocess_behavior="completed",
        max_active_runs=2,
        conf={"walsink_reprocess": "replace"},
    )
    runs = stack.wait_for_backfill(replace, timeout=900)
    assert sorted(_run_day(r) for r in runs) == [fixed, same]
    for run in runs:
        tis = _tasks_by_operator(stack, run["dag_run_id"])
        assert {op: ti["state"] for op, ti in tis.items()} == {
            WRITE_OP: "success",
            DURABLE_OP: "success",
            COMMIT_OP: "success",
        }, run["dag_run_id"]
    for day in (fixed, same):
        now = store.require(PIPELINE, _key(day))
        assert (now.state.value, now.version) == ("COMMITTED", 2), day
        assert now.sealed_attempt_id != v1[day].sealed_attempt_id
        [old] = store.versions(PIPELINE, _key(day))
        assert (old.state.value, old.attempt_id) == ("SUPERSEDED", v1[day].sealed_attempt_id)
        assert old.superseded_by_attempt_id == now.sealed_attempt_id
        # Only the new version's files are in the partition.
        names = [p.name for p in (target / f"dt={day.isoformat()}").glob("*.parquet")]
        assert names and all(now.sealed_attempt_id in n for n in names), names
    # The fixed day shows the new content, exactly once; the other day its source, once.
    got = _partition_rows(target, fixed)
    assert sorted(got) == sorted(kept) and len(got) == len(set(got)) == 250
    got = _partition_rows(target, same)
    assert sorted(got) == sorted(e["event_id"] for e in common.daily_events(same))
    assert {name: _snapshot(target / name) for name in untouched} == untouched

    # Clearing the commit task of a replaced run (its conf still asks for replace) changes nothing.
    run_id = next(r["dag_run_id"] for r in runs if _run_day(r) == fixed)
    before, record = _snapshot(target), store.require(PIPELINE, _key(fixed))
    commit_id = _tasks_by_operator(stack, run_id)[COMMIT_OP]["task_id"]
    stack.clear_task(DAG_ID, run_id, [commit_id])
    stack.wait_for_runs(DAG_ID, [run_id])
    assert _tasks_by_operator(stack, run_id)[COMMIT_OP]["state"] == "success"
    assert stack.xcom(DAG_ID, run_id, commit_id)["already_committed"] is True
    assert _snapshot(target) == before and store.require(PIPELINE, _key(fixed)) == record


APPEND_DAG = "walsink_reprocess_append_test"


def test_replace_backfill_of_an_append_pipeline_rereads_only_its_input(airflow_stack):
    """``append``: the new version of the first interval re-reads exactly that interval's input
    (its corrected file), its old rows leave, and the second interval's rows stay once."""
    stack = airflow_stack
    examples = stack.home / "walsink" / "examples"
    common = _example_common()
    store = CommitterStore.from_url(f"sqlite:///{stack.home}/walsink/committer.db")
    days = [date(2026, 6, 1), date(2026, 6, 2)]
    try:
        stack.wait_for_dag(APPEND_DAG)
        stack.unpause(APPEND_DAG)  # only the backfills below run it (see the DAG)
        # One run at a time, in interval order (a backfill does not follow the DAG's max_active_runs).
        first = stack.backfill(APPEND_DAG, days[0].isoformat(), days[1].isoformat(), max_active_runs=1)
        runs = stack.wait_for_backfill(first, timeout=900)
        assert sorted(_run_day(r) for r in runs) == days and {r["state"] for r in runs} == {"success"}
        names = {d: common.arrival_file_names(datetime(d.year, d.month, d.day)) for d in days}
        v1 = store.require("reprocess_append", _key(days[0]))

        # Correct the first interval's first file (its first record was bad), then reprocess.
        fixed = examples / "raw" / "reprocess_incoming" / names[days[0]][0]
        fixed.write_text("".join(fixed.read_text().splitlines(keepends=True)[1:]))
        replace = stack.backfill(
            APPEND_DAG,
            days[0].isoformat(),
            days[0].isoformat(),
            reprocess_behavior="completed",
            conf={"walsink_reprocess": "replace"},
        )
        [run] = stack.wait_for_backfill(replace, timeout=900)
        assert run["state"] == "success"

        v2 = store.require("reprocess_append", _key(days[0]))
        assert (v2.state.value, v2.version) == ("COMMITTED", 2)
        assert (v2.start_offsets, v2.end_offsets) == (v1.start_offsets, v1.end_offsets)
        assert [v.state.value for v in store.versions("reprocess_append", _key(days[0]))] == ["SUPERSEDED"]
        import pyarrow.dataset as ds

        table = ds.dataset(
            examples / "target" / "reprocess_append",
            format="parquet",
            partitioning="hive",
            ignore_prefixes=[".", "_"],
        ).to_table()
        got = [(r["file"], r["line"], r["value"]) for r in table.to_pylist()]
        expected = {
            (n, r["line"], r["value"])
            for d in days
            for n in names[d]
            for r in common.arrival_records(n)
            if not (n == names[days[0]][0] and r["line"] == 0)
        }
        assert len(got) == len(set(got)) == len(expected)
        assert set(got) == expected
    finally:
        store.dispose()
