"""README's main command (``bash scripts/demo.sh``): the example pipelines on a real Airflow.

From a checkout, with everything local and on the embedded defaults:

1. a fresh Airflow home under ``var/demo/airflow`` (git-ignored): SQLite metadata
   database, LocalExecutor, the checkout's ``dags/`` folder, and the ``walsink_default``
   connection to an SQLite committer table (schema created with ``walsink db upgrade``);
2. the real scheduler, dag-processor, triggerer and api-server, started in the
   background (own process groups, output in ``var/demo/airflow/logs/*.out``) and
   stopped at the end, also on Ctrl-C or an error;
3. the example pipelines run for three daily intervals (triggered runs of
   ``walsink_daily_overwrite`` and ``walsink_incremental_append``), then a backfill of
   the daily one over five intervals with ``--reprocess-behavior completed``: the three
   committed days end skipped (reprocess policy "skip"), two are new;
4. ``walsink status`` prints every checkpoint; the command fails unless all are
   COMMITTED.

Progress is printed as each task changes state. The stack is the one the end-to-end
tests use (``airflow_provider_walsink.testing.stack``), so this demo runs what CI tests;
its components die with the demo, even when it is killed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import httpx

from airflow_provider_walsink.committer.store import CommitterStore
from airflow_provider_walsink.testing.stack import AirflowStack, StackError, StackUser

REPO = Path(__file__).resolve().parent.parent
DAILY = "walsink_daily_overwrite"
INCREMENTAL = "walsink_incremental_append"
FIRST_DAY = date(2026, 1, 1)
# Bounds a hung stack, not a speed goal: a laptop busy with other work is slow, not broken.
LIMIT_S = 3600


def say(text: str) -> None:
    print(f"\n==> {text}", flush=True)


class Progress:
    """Prints each task instance's state changes (one line per change)."""

    def __init__(self, stack: Any) -> None:
        self.stack = stack
        self.seen: dict[tuple[str, str, str], str | None] = {}
        self.started = time.monotonic()

    def poll(self, dag_ids: list[str]) -> list[dict[str, Any]]:
        """Print what changed since the last poll; return every run of ``dag_ids``."""
        runs = []
        for dag_id in dag_ids:
            for run in self.stack.dag_runs(dag_id):
                runs.append(run)
                run_key = (dag_id, run["dag_run_id"], "")
                finished = run["state"] in ("success", "failed")
                if finished and self.seen.get(run_key) == run["state"]:
                    continue  # nothing can have changed in a run already seen finished
                self.seen[run_key] = run["state"]
                day = (run["logical_date"] or "")[:10]
                for ti in self.stack.task_instances(dag_id, run["dag_run_id"]):
                    key = (dag_id, run["dag_run_id"], ti["task_id"])
                    if self.seen.get(key, "unset") == ti["state"]:
                        continue
                    self.seen[key] = ti["state"]
                    if ti["state"]:
                        elapsed = time.monotonic() - self.started
                        tries = f" (try {ti['try_number']})" if ti["try_number"] > 1 else ""
                        print(
                            f"  [{elapsed:4.0f}s] {dag_id:<27} {day}  {ti['task_id']:<24} {ti['state']}{tries}",
                            flush=True,
                        )
        return runs

    def wait(self, dag_ids: list[str], run_ids: set[str], timeout: float = LIMIT_S) -> None:
        """Print progress until every run in ``run_ids`` has finished; fail if one failed."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                runs = {r["dag_run_id"]: r for r in self.poll(dag_ids) if r["dag_run_id"] in run_ids}
            except (StackError, httpx.HTTPError) as exc:  # a busy api-server: ask again
                print(f"  (api-server: {str(exc).splitlines()[0][:120]}; asking again)", flush=True)
                time.sleep(5)
                continue
            if len(runs) == len(run_ids) and all(r["state"] in ("success", "failed") for r in runs.values()):
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"runs still not finished after {timeout:.0f}s" + self.stack.log_tail())
            time.sleep(2)
        failed = sorted(r["dag_run_id"] for r in runs.values() if r["state"] != "success")
        if failed:
            raise SystemExit(
                f"runs failed: {failed}; task logs are under {self.stack.logs_dir}" + self.stack.log_tail()
            )


def trigger(stack: Any, dag_id: str, day: date) -> str:
    """A run of ``dag_id`` for the interval starting at ``day`` (as ``airflow dags trigger -l``)."""
    run_id = f"demo__{day.isoformat()}"
    for attempt in range(5):
        response = stack.client().post(
            f"/api/v2/dags/{dag_id}/dagRuns",
            json={"logical_date": f"{day.isoformat()}T00:00:00Z", "dag_run_id": run_id},
        )
        if response.status_code == 409 and attempt:
            return run_id  # an earlier try that answered 5xx did create it
        if response.status_code < 500:
            break
        time.sleep(2 + 3 * attempt)  # e.g. SQLite locked under load: the API answered 500
    if response.status_code >= 400:
        raise SystemExit(f"triggering {dag_id} for {day}: {response.status_code} {response.text}")
    return response.json()["dag_run_id"]


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=int, default=3, help="intervals run first (default 3)")
    parser.add_argument("--backfill-days", type=int, default=5, help="intervals of the backfill (default 5)")
    args = parser.parse_args(argv)

    home = Path(os.environ.get("WALSINK_DEMO_HOME", REPO / "var" / "demo")).resolve()
    if home.exists():
        shutil.rmtree(home)  # every demo starts from nothing, as on a fresh clone
    airflow_home = home / "airflow"
    if not (REPO / "dags").is_dir():
        raise SystemExit(f"the demo runs from a walsink checkout; {REPO / 'dags'} is missing")
    users = (StackUser("admin", "admin", "admin"),)
    # Two task slots: on SQLite every writer queues on one file lock, and a busy laptop
    # gains nothing from a third Spark JVM.
    stack = AirflowStack(airflow_home, users=users, dags_folder=REPO / "dags", parallelism=2)
    committer_db = airflow_home / "walsink" / "committer.db"
    staging = airflow_home / "walsink" / "staging"

    quiet_env = {**stack.env, "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING"}  # for the walsink CLI

    say(f"Airflow home {airflow_home} (SQLite metadata database, LocalExecutor, dags folder {REPO / 'dags'})")
    # Everything Airflow needs is in this environment; `source env.sh` to use the CLI afterwards.
    (airflow_home / "env.sh").write_text(
        "".join(f"export {k}='{v}'\n" for k, v in sorted(stack.env.items()) if k.startswith("AIRFLOW"))
    )
    try:
        stack.airflow("db", "migrate", timeout=600)
        print("  metadata database migrated")
        stack.airflow(
            "connections",
            "add",
            "walsink_default",
            "--conn-type",
            "walsink",
            "--conn-schema",
            str(committer_db),
            "--conn-extra",
            f'{{"backend": "sqlite", "staging_root": "{staging}"}}',
        )
        # walsink creates no directory for a database path it is given (a typo stays a typo).
        committer_db.parent.mkdir(parents=True, exist_ok=True)
        print(f"  connection walsink_default: committer table in {committer_db}")
        result = subprocess.run(
            [sys.executable, "-m", "airflow_provider_walsink.cli", "db", "upgrade"],
            env=quiet_env,
            capture_output=True,
            text=True,
        )
        if result.returncode:
            raise SystemExit(f"walsink db upgrade failed:\n{result.stdout}{result.stderr}")
        print("  walsink db upgrade: " + result.stdout.strip().splitlines()[-1])

        say("Starting the scheduler, dag-processor, triggerer and api-server in the background")
        stack.start(timeout=LIMIT_S)
        print(f"  Airflow UI: {stack.base_url}  (user admin, password admin; while the demo runs)")
        print(f"  component output: {stack.logs_dir}/*.out")
        for dag_id in (DAILY, INCREMENTAL):
            stack.wait_for_dag(dag_id, timeout=LIMIT_S)
            stack.unpause(dag_id)
            print(f"  {dag_id}: parsed and unpaused")

        progress = Progress(stack)
        days = [FIRST_DAY + timedelta(days=i) for i in range(args.days)]
        say(f"Running both example pipelines for {len(days)} daily intervals ({days[0]} .. {days[-1]})")
        run_ids = {trigger(stack, dag_id, day) for dag_id in (DAILY, INCREMENTAL) for day in days}
        progress.wait([DAILY, INCREMENTAL], run_ids)

        last = FIRST_DAY + timedelta(days=args.backfill_days - 1)
        say(
            f"airflow backfill create --dag-id {DAILY} --from-date {FIRST_DAY} --to-date {last} "
            "--reprocess-behavior completed"
        )
        print("  committed days are re-run and end skipped (reprocess policy: skip); new days are written")
        # On SQLite, `airflow backfill create` (it reads, then clears and creates runs in one
        # process) races the other components' writes for the one file lock, and a WAL
        # transaction whose snapshot went stale fails at once, whatever the busy timeout
        # (seen on a busy machine: "database is locked" from task_reschedule). Nothing
        # runs at this point, so the writers pause while the backfill is created.
        quiet = [c for c in ("scheduler", "triggerer", "dag-processor") if stack.is_sqlite]
        for component in quiet:
            stack.stop_component(component)
        try:
            backfill = stack.backfill(
                DAILY, FIRST_DAY.isoformat(), last.isoformat(), reprocess_behavior="completed"
            )
        finally:
            for component in quiet:
                stack.start_component(component)
        stack.wait_until(
            f"backfill {backfill}",
            lambda: progress.poll([DAILY]) and stack.get(f"/api/v2/backfills/{backfill}")["completed_at"],
            timeout=LIMIT_S,
            interval=2,
        )
        runs = stack.wait_for_backfill(backfill)
        failed = [r["dag_run_id"] for r in runs if r["state"] != "success"]
        if failed:
            raise SystemExit(f"backfill runs failed: {failed}; task logs are under {stack.logs_dir}")
    finally:
        say("Stopping the Airflow components")
        stack.stop()

    say("walsink status")
    status = subprocess.run([sys.executable, "-m", "airflow_provider_walsink.cli", "status"], env=quiet_env)
    store = CommitterStore.from_url(f"sqlite:///{committer_db}", migrate=False)
    states = [
        c.state.value for p in store.pipelines() for c in store.checkpoints(p["name"], descending=False)
    ]
    store.dispose()
    if status.returncode or not states or set(states) != {"COMMITTED"}:
        print(f"\nNot every checkpoint is COMMITTED: {states}", file=sys.stderr)
        return 1
    print(
        f"\nAll {len(states)} checkpoints COMMITTED. Target tables: {airflow_home / 'walsink/examples/target'}"
    )
    print(f"Use the CLI on this Airflow home: source {airflow_home / 'env.sh'} && airflow dags list")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``run`` with failures as one message, not a traceback (exit status 1)."""
    try:
        return run(argv)
    except StackError as exc:
        print(f"\ndemo failed: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
