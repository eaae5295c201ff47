"""Benchmark 8 (issue 24): a backfill of N daily intervals through the real scheduler.

The same small Spark job (the ``walsink_daily_overwrite`` example's day: ~2,300 rows
read from CSV, one Parquet file per day) backfilled over N days with
``airflow backfill create --max-active-runs M`` on the stack the end-to-end tests
use (scheduler with LocalExecutor, dag-processor, triggerer, api-server,
PostgreSQL metadata database), two DAGs in the same stack and the same run:

* **baseline**: ``bench_plain_daily``, one ``SparkSubmitOperator`` task per day running
  ``bench/plain_daily_job.py``, which writes the day straight into the table with
  Spark's ``mode("overwrite")`` (no exactly-once);
* **walsink**: ``bench_walsink_daily``, ``walsink_pipeline`` (write → deferrable
  durability sensor → commit) over the example's own job, committer table on
  PostgreSQL, its sensor starting in a worker (``start_from_trigger=False``).
  ``--start-from-trigger`` adds a third DAG whose sensor starts in the triggerer
  (``start_from_trigger=True``, the sensor's default).

Measured per backfill: wall time (first run's start to last run's end), runs
failed, task tries that failed, and what the sensors cost the workers: how many
sensor task instances ran in a worker at all (a hostname recorded) and the sum of
their durations (an upper bound on the worker-seconds they held; a deferred sensor
holds none while it waits). The variants alternate order across repeats. Both
tables are checked afterwards: every day's partition holds exactly that day's rows.
Goal: walsink wall time ≤ 1.10× the baseline; worker slots held by sensors: 0.

    .venv/bin/python -m bench.bench_backfill                       # 30 days, --max-active-runs 4
    .venv/bin/python -m bench.bench_backfill --days 4 --repeats 1  # a quick look (about 5 minutes)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import date, timedelta
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    __package__ = "bench"

from bench.bench_orchestration import _ts  # noqa: E402
from bench.common import PG_ADMIN_URL, REPO, Table, fmt_s, median, print_run, private_pg_database  # noqa: E402

FIRST_DAY = date(2026, 3, 1)
PLAIN, WALSINK, WALSINK_SFT = "bench_plain_daily", "bench_walsink_daily", "bench_walsink_daily_sft"
SPARK_CONF = {"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"}
LOCAL_CONF = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
}

_HEADER = """\
from datetime import UTC, datetime, timedelta
from airflow.sdk import DAG
ARGS = {{"retries": 2, "retry_delay": timedelta(seconds=10)}}
START = datetime({y}, {m}, {d}, tzinfo=UTC)
"""

_PLAIN_DAG = """\
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

with DAG(dag_id={dag_id!r}, schedule="@daily", start_date=START, catchup=False,
         max_active_runs={mar}, default_args=ARGS):
    SparkSubmitOperator(
        task_id="write",
        conn_id="bench_spark_local",
        application={job!r},
        application_args=["--raw", {raw!r}, "--target", {target!r}, "--day", "{{{{ ds }}}}"],
        conf={conf!r},
        env_vars={{"PYSPARK_PYTHON": {python!r}, "PYSPARK_DRIVER_PYTHON": {python!r}}},
        spark_binary={spark_submit!r},
        name="plain-daily-events",
    )
"""

_WALSINK_DAG = """\
from airflow_provider_walsink.operators.pipeline import walsink_pipeline

with DAG(dag_id={dag_id!r}, schedule="@daily", start_date=START, catchup=False,
         max_active_runs={mar}, default_args=ARGS):
    walsink_pipeline(
        "daily_events",
        pipeline={pipeline!r},
        application={job!r},
        target={target!r},
        mode="overwrite",
        partition_by=["dt"],
        write={{"application_args": ["--raw", {raw!r}], "conf": {conf!r}}},
        durable={{"poke_interval": 2, "start_from_trigger": {sft!r}}},
    )
"""


def write_dags(dags: Path, data: Path, max_active_runs: int, start_from_trigger: bool) -> list[str]:
    """The benchmark's DAG files in ``dags``; returns their ids in run order."""
    from airflow_provider_walsink.hooks.spark_submit_runner import default_spark_binary

    dags.mkdir(parents=True, exist_ok=True)
    header = _HEADER.format(y=FIRST_DAY.year, m=FIRST_DAY.month, d=FIRST_DAY.day)
    raw = str(data / "raw")
    (dags / f"{PLAIN}.py").write_text(
        header
        + _PLAIN_DAG.format(
            dag_id=PLAIN,
            mar=max_active_runs,
            job=str(REPO / "bench" / "plain_daily_job.py"),
            raw=raw,
            target=str(data / "plain"),
            conf={**LOCAL_CONF, **SPARK_CONF},
            python=sys.executable,
            spark_submit=default_spark_binary(),
        )
    )
    ids = [PLAIN, WALSINK]
    variants = [(WALSINK, False)] + ([(WALSINK_SFT, True)] if start_from_trigger else [])
    if start_from_trigger:
        ids.append(WALSINK_SFT)
    for dag_id, sft in variants:
        (dags / f"{dag_id}.py").write_text(
            header
            + _WALSINK_DAG.format(
                dag_id=dag_id,
                mar=max_active_runs,
                pipeline=dag_id,
                job=str(REPO / "dags" / "walsink_jobs" / "daily_events_job.py"),
                raw=raw,
                target=str(data / dag_id),
                conf=SPARK_CONF,
                sft=sft,
            )
        )
    return ids


def run_backfill(stack: Any, dag_id: str, days: list[date], max_active_runs: int) -> dict[str, Any]:
    """One backfill over ``days`` with ``max_active_runs``, waited for; its figures."""
    backfill = stack.backfill(
        dag_id, days[0].isoformat(), days[-1].isoformat(), max_active_runs=max_active_runs
    )
    runs = stack.wait_for_backfill(backfill, timeout=300 + 120 * len(days))
    tis = [ti for r in runs for ti in stack.task_instances(dag_id, r["dag_run_id"])]
    starts = [_ts(r["start_date"]) for r in runs if r["start_date"]]
    ends = [_ts(r["end_date"]) for r in runs if r["end_date"]]
    sensors = [ti for ti in tis if ti["operator"] == "CheckpointDurableSensor"]
    in_worker = [ti for ti in sensors if ti.get("hostname")]
    return {
        "runs": len(runs),
        "failed_runs": sum(r["state"] != "success" for r in runs),
        # A try that failed shows as a try number above 1 on a task that then succeeded.
        "failed_tries": sum(max(0, int(ti.get("try_number") or 1) - 1) for ti in tis)
        + sum(ti["state"] == "failed" for ti in tis),
        "wall": (max(ends) - min(starts)).total_seconds() if starts and ends else float("nan"),
        "sensors_in_worker": len(in_worker),
        "sensor_worker_s": sum(float(ti.get("duration") or 0.0) for ti in in_worker),
    }


def check_tables(data: Path, dag_ids: list[str], days: list[date]) -> None:
    """Every table holds exactly each day's source rows, once (what the benchmark compares must be equal)."""
    import duckdb

    sys.path.insert(0, str(REPO / "dags"))
    from walsink_example_common import daily_events

    for dag_id in dag_ids:
        table = data / ("plain" if dag_id == PLAIN else dag_id)
        con = duckdb.connect()
        got = dict(
            con.execute(
                "SELECT dt::VARCHAR, count(*) FROM read_parquet(?, hive_partitioning = true) GROUP BY dt",
                [str(table / "dt=*" / "*.parquet")],
            ).fetchall()
        )
        want = {d.isoformat(): len(daily_events(d)) for d in days}
        if got != want:
            raise RuntimeError(f"bench: table of {dag_id} holds {got}, expected {want}")


def run(days: int, max_active_runs: int, repeats: int, start_from_trigger: bool, scratch: Path) -> Table:
    sys.path.insert(0, str(REPO / "tests"))
    from airflow_stack import AirflowStack  # the e2e tests' stack

    intervals = [FIRST_DAY + timedelta(days=i) for i in range(days)]
    data = scratch / "data"
    dag_ids = write_dags(scratch / "dags", data, max_active_runs, start_from_trigger)
    sys.path.insert(0, str(REPO / "dags"))
    from walsink_example_common import ensure_daily_events

    for day in intervals:  # generated once, before any timing: neither side pays for it
        ensure_daily_events(data / "raw", day)
    results: dict[str, list[dict[str, Any]]] = {d: [] for d in dag_ids}
    with private_pg_database() as committer_url:
        from airflow_provider_walsink.core.store import CommitterStore

        CommitterStore.from_url(committer_url).dispose()  # migrated once, before tasks race to it
        env = {
            "AIRFLOW_CONN_BENCH_SPARK_LOCAL": json.dumps({"conn_type": "spark", "host": "local[*]"}),
            "AIRFLOW_CONN_WALSINK_DEFAULT": json.dumps(
                {
                    "conn_type": "walsink",
                    "extra": {"url": committer_url, "staging_root": str(scratch / "staging")},
                }
            ),
        }
        # The task and component logs outlive the scratch directory: a failed run can be read afterwards.
        artifacts = REPO / "test-artifacts" / f"bench-backfill-{time.strftime('%Y%m%dT%H%M%S')}"
        stack = AirflowStack.create(
            scratch / "stack",
            postgres_admin_url=PG_ADMIN_URL,
            dags_folder=scratch / "dags",
            env=env,
            artifacts_dir=artifacts,
        )
        with stack:
            for dag_id in dag_ids:
                stack.wait_for_dag(dag_id)
                stack.unpause(dag_id)
            for rep in range(repeats):
                order = dag_ids if rep % 2 == 0 else list(reversed(dag_ids))
                for dag_id in order:
                    # Each repeat backfills fresh days: a re-run of committed days would be skipped.
                    shifted = [d + timedelta(days=days * rep) for d in intervals]
                    for day in shifted:
                        ensure_daily_events(data / "raw", day)
                    results[dag_id].append(run_backfill(stack, dag_id, shifted, max_active_runs))
    all_days = [FIRST_DAY + timedelta(days=i) for i in range(days * repeats)]
    check_tables(data, dag_ids, all_days)

    base = median([r["wall"] for r in results[PLAIN]])
    t = Table(
        f"Benchmark 8: a {days}-day backfill through the real scheduler (--max-active-runs "
        f"{max_active_runs}), small Spark jobs (goal: wall ≤ 1.10× the baseline; worker slots held "
        "by sensors: 0)",
        [
            "DAG",
            "wall time (median)",
            "× baseline",
            "runs failed",
            "task tries failed",
            "sensors run in a worker",
            "their worker-seconds",
        ],
    )
    for dag_id in dag_ids:
        rs = results[dag_id]
        wall = median([r["wall"] for r in rs])
        sensor_n = sum(r["sensors_in_worker"] for r in rs)
        t.rows.append(
            [
                dag_id + (" (baseline)" if dag_id == PLAIN else ""),
                fmt_s(wall),
                "1.00×" if dag_id == PLAIN else f"{wall / base:.2f}×",
                str(sum(r["failed_runs"] for r in rs)),
                str(sum(r["failed_tries"] for r in rs)),
                "-" if dag_id == PLAIN else f"{sensor_n} of {sum(r['runs'] for r in rs)}",
                "-" if dag_id == PLAIN else fmt_s(sum(r["sensor_worker_s"] for r in rs)),
            ]
        )
    t.notes.append(f"Task and component logs kept in {artifacts}.")
    t.notes.append(
        f"{repeats} repeat(s), order alternating; every table checked afterwards: each day's partition "
        "holds exactly that day's source rows. Walsink's committer table on PostgreSQL; stack: "
        "LocalExecutor, parallelism 4, PostgreSQL metadata database."
    )
    return t


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--max-active-runs", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument(
        "--start-from-trigger", action="store_true", help="add the sensor-in-triggerer variant"
    )
    parser.add_argument("--work-dir", default=None)
    args = parser.parse_args(argv)
    return print_run(
        "walsink-bench-backfill-",
        args.work_dir,
        lambda scratch: [
            run(args.days, args.max_active_runs, args.repeats, args.start_from_trigger, scratch)
        ],
    )


if __name__ == "__main__":
    raise SystemExit(main())
