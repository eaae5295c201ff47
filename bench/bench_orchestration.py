"""Benchmark 4: orchestration overhead of one example DAG run under a real scheduler.

Starts the real Airflow stack the end-to-end tests use (``tests/airflow_stack.py``:
scheduler with LocalExecutor, dag-processor, triggerer, api-server, private
PostgreSQL metadata database) on the repo's ``dags/``, and runs
``walsink_daily_overwrite`` (write → deferrable durability sensor → commit)
one day at a time, each day a one-run backfill, so runs never overlap.

* **run wall time**: the DAG run's ``start_date`` → ``end_date``.
* **Spark job time**: from the write task's ``Spark-Submit cmd`` log line
  (spark-submit starts) to its ``Sealed`` line (the job has exited and its seal
  is recorded): the JVM start, the Spark application and its write.
* **overhead** = run wall time − Spark job time: task start-up, scheduling
  gaps between tasks, the durability check and the commit.

The last run passes ``walsink_check_before_defer: false`` so its sensor hands
the wait to the triggerer at once; the benchmark polls the sensor's state and
reports whether it was seen ``deferred`` (a deferred task holds no worker
slot: its process has exited and the triggerer does the waiting).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

from .common import PG_ADMIN_URL, REPO, Table, fmt_s, median

DAG_ID = "walsink_daily_overwrite"
WRITE_OP, DURABLE_OP, COMMIT_OP = "WalWriteOperator", "CheckpointDurableSensor", "WalCommitOperator"
FIRST_DAY = date(2026, 1, 1)


def _ts(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None


def _log_events(stack: Any, run_id: str, task_id: str, try_number: int) -> list[tuple[datetime, str]]:
    """(timestamp, message) of every line of one task try's log (Airflow 3 writes JSON lines)."""
    path = stack.logs_dir / f"dag_id={DAG_ID}" / f"run_id={run_id}" / f"task_id={task_id}"
    path = path / f"attempt={try_number}.log"
    events = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and obj.get("timestamp"):
            events.append((_ts(obj["timestamp"]), str(obj.get("event", ""))))
    return events


def _why_failed(stack: Any, runs: list[dict[str, Any]]) -> str:
    """Each run's state, and for each task try that did not succeed its state and last log lines."""
    out = []
    for run in runs:
        out.append(f"run {run['dag_run_id']}: {run['state']}")
        for ti in stack.task_instances(DAG_ID, run["dag_run_id"]):
            if ti["state"] == "success":
                continue
            out.append(f"  {ti['task_id']} try {ti['try_number']}: {ti['state']}")
            try:
                events = _log_events(stack, run["dag_run_id"], ti["task_id"], ti["try_number"])
                out.extend(f"    {e[:300]}" for _, e in events[-15:])
            except OSError as exc:
                out.append(f"    (no log: {exc})")
    return "\n".join(out)


def _spark_seconds(stack: Any, run_id: str, write_ti: dict[str, Any]) -> tuple[float, bool]:
    """Spark job time from the write task's log; falls back to the task's duration (flag False)."""
    try:
        events = _log_events(stack, run_id, write_ti["task_id"], write_ti["try_number"])
        start = next(t for t, e in events if "Spark-Submit cmd" in e)
        end = next(t for t, e in events if e.startswith("Sealed ") and t >= start)
        return (end - start).total_seconds(), True
    except (OSError, StopIteration, KeyError):
        return float(write_ti.get("duration") or 0.0), False


def _one_run(stack: Any, day: date, conf: dict[str, Any] | None) -> dict[str, Any]:
    seen_states: set[str] = set()
    stop = threading.Event()

    def watch_sensor() -> None:
        # Poll the sensor's state while the run goes on (a deferred state is brief).
        while not stop.is_set():
            try:
                for run in stack.dag_runs(DAG_ID):
                    if run["logical_date"] and run["logical_date"].startswith(day.isoformat()):
                        for ti in stack.task_instances(DAG_ID, run["dag_run_id"]):
                            if ti["operator"] == DURABLE_OP and ti["state"]:
                                seen_states.add(ti["state"])
            except Exception:  # noqa: BLE001 - polling only; the run's outcome is checked below
                pass
            stop.wait(0.5)

    watcher = threading.Thread(target=watch_sensor, daemon=True)
    backfill = stack.backfill(DAG_ID, day.isoformat(), day.isoformat(), conf=conf)
    watcher.start()
    try:
        runs = stack.wait_for_backfill(backfill, timeout=900)
    finally:
        stop.set()
        watcher.join()
    if len(runs) != 1 or runs[0]["state"] != "success":
        raise RuntimeError(f"bench: the run of {day} did not succeed: {_why_failed(stack, runs)}")
    run = runs[0]
    tis = {ti["operator"]: ti for ti in stack.task_instances(DAG_ID, run["dag_run_id"])}
    wall = (_ts(run["end_date"]) - _ts(run["start_date"])).total_seconds()
    spark, from_log = _spark_seconds(stack, run["dag_run_id"], tis[WRITE_OP])
    steps = {}
    previous = _ts(run["start_date"])
    for label, op in (("write", WRITE_OP), ("sensor", DURABLE_OP), ("commit", COMMIT_OP)):
        ti = tis[op]
        steps[f"wait before {label}"] = (_ts(ti["start_date"]) - previous).total_seconds()
        steps[label] = (_ts(ti["end_date"]) - _ts(ti["start_date"])).total_seconds()
        previous = _ts(ti["end_date"])
    steps["wait after commit"] = (_ts(run["end_date"]) - previous).total_seconds()
    return {
        "day": day,
        "wall": wall,
        "spark": spark,
        "spark_from_log": from_log,
        "overhead": wall - spark,
        "steps": steps,
        "sensor_states": seen_states,
        "deferred": "deferred" in seen_states,
        "conf": conf,
    }


def run(size: Any, scratch: Path, runs: int = 3) -> Table:
    sys.path.insert(0, str(REPO / "tests"))
    from airflow_stack import AirflowStack  # the e2e tests' stack

    results = []
    started = time.monotonic()
    with AirflowStack.create(scratch, postgres_admin_url=PG_ADMIN_URL) as stack:
        startup = time.monotonic() - started
        stack.wait_for_dag(DAG_ID)
        stack.unpause(DAG_ID)
        if runs > 1:  # warm-up run (first spark-submit, first parse of the job): not counted
            _one_run(stack, FIRST_DAY, None)
        for i in range(runs):
            results.append(_one_run(stack, FIRST_DAY + timedelta(days=1 + i), None))
        deferred = _one_run(
            stack, FIRST_DAY + timedelta(days=1 + runs), {"walsink_check_before_defer": False}
        )
    t = Table(
        "Benchmark 4: orchestration overhead of one walsink_daily_overwrite run (goal < 15 s, "
        "no worker slot held while the sensor waits)",
        ["run", "run wall time", "Spark job time", "overhead (wall − Spark)", "sensor deferred"],
    )
    for r in [*results, deferred]:
        label = r["day"].isoformat() + (" (defer at once)" if r["conf"] else "")
        t.rows.append(
            [
                label,
                fmt_s(r["wall"]),
                fmt_s(r["spark"]) + ("" if r["spark_from_log"] else " *"),
                fmt_s(r["overhead"]),
                "yes" if r["deferred"] else "no",
            ]
        )
    t.rows.append(
        [
            "median (default runs)",
            fmt_s(median([r["wall"] for r in results])),
            fmt_s(median([r["spark"] for r in results])),
            fmt_s(median([r["overhead"] for r in results])),
            "",
        ]
    )
    names = list(results[0]["steps"])
    t.notes.append(
        "Where the time goes (medians of the default runs): "
        + ", ".join(f"{n} {fmt_s(median([r['steps'][n] for r in results]))}" for n in names)
        + "."
    )
    t.notes.append(
        "Deferral run: "
        + ", ".join(f"{n} {fmt_s(v)}" for n, v in deferred["steps"].items())
        + " (the sensor's time includes its trip through the triggerer and a second task start)."
    )
    t.notes.append(
        f"Deferral run: sensor states seen {sorted(deferred['sensor_states'])}; a deferred sensor's "
        "worker process has exited (the triggerer waits), so no worker slot is held while it waits. "
        "In default runs the sensor's first check in the worker usually finds the checkpoint durable "
        "and never waits."
    )
    t.notes.append(
        f"Stack: scheduler (LocalExecutor, parallelism 4), dag-processor, triggerer, api-server, "
        f"PostgreSQL metadata DB; started in {startup:.0f} s; {'one warm-up run not counted' if runs > 1 else 'no warm-up run'}; runs one at "
        "a time (one-day backfills). * = Spark time not found in the task log: the write task's duration."
    )
    return t
