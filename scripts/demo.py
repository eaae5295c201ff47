"""README's main command (``bash scripts/demo.sh``): the example pipelines on a real Airflow.

From a checkout, with everything local and on the embedded defaults:

1. a fresh Airflow home under ``var/demo/airflow`` (git-ignored): SQLite metadata
   database, LocalExecutor, the checkout's ``dags/`` folder, the ``walsink_default``
   connection to an SQLite committer table (schema created with ``walsink db upgrade``),
   ``walsink_iceberg`` for the Iceberg example's catalog (an SQL catalog on SQLite under
   the home) and, when PostgreSQL answers on 127.0.0.1, ``walsink_sql_target`` for the
   SQL example (a fresh database ``walsink_demo``; see ``WALSINK_DEMO_PG_URL`` below);
2. the real scheduler, dag-processor, triggerer and api-server, started in the
   background (own process groups, output in ``var/demo/airflow/logs/*.out``) and
   stopped at the end, also on Ctrl-C or an error;
3. the file examples run for three daily intervals (triggered runs of
   ``walsink_daily_overwrite`` and ``walsink_incremental_append``) and, at the same time,
   the table examples for one (``walsink_iceberg_example``, ``walsink_delta_example``,
   and ``walsink_sql_example`` when PostgreSQL is reachable; the demo says when it is
   skipped); then a backfill of the daily one over five intervals with
   ``--reprocess-behavior completed``: the three committed days end skipped
   (reprocess policy "skip"), two are new;
4. ``walsink status`` prints every checkpoint, and the Iceberg, Delta and PostgreSQL
   tables are read back with their own libraries and summed per day with DuckDB,
   beside the source's counts; the command fails unless every checkpoint is COMMITTED
   and every table holds each source row once.

Progress is printed as each task changes state. The stack is the one the end-to-end
tests use (``tests/airflow_stack.py``), so this demo runs what CI tests;
its components die with the demo, even when it is killed.

Environment: ``WALSINK_DEMO_HOME`` (default ``var/demo``); ``WALSINK_DEMO_PG_URL``, the
PostgreSQL server for the SQL example as an SQLAlchemy URL of a database to connect to
for ``CREATE DATABASE`` (default ``postgresql+psycopg2://postgres@127.0.0.1:5432/postgres``);
``WALSINK_DEMO_PG_DATABASE``, the database the demo drops and creates there (default
``walsink_demo``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy.engine import make_url as sa_url

from airflow_provider_walsink.core.store.store import CommitterStore

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the stack runner the e2e tests use

from airflow_stack import AirflowStack, StackError, StackUser  # noqa: E402
from guard import interrupt_on_sigterm  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DAILY = "walsink_daily_overwrite"
INCREMENTAL = "walsink_incremental_append"
ICEBERG = "walsink_iceberg_example"
DELTA = "walsink_delta_example"
SQL = "walsink_sql_example"
PG_ADMIN_URL = "postgresql+psycopg2://postgres@127.0.0.1:5432/postgres"
PG_DATABASE = "walsink_demo"
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

    def wait(self, dag_ids: list[str], run_ids: set[tuple[str, str]], timeout: float = LIMIT_S) -> None:
        """Print progress until every run in ``run_ids`` (``(dag_id, run_id)``: several DAGs' runs share
        a run id) has finished; fail if one failed."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                runs = {
                    (r["dag_id"], r["dag_run_id"]): r
                    for r in self.poll(dag_ids)
                    if (r["dag_id"], r["dag_run_id"]) in run_ids
                }
            except (StackError, httpx.HTTPError) as exc:  # a busy api-server: ask again
                print(f"  (api-server: {str(exc).splitlines()[0][:120]}; asking again)", flush=True)
                time.sleep(5)
                continue
            if len(runs) == len(run_ids) and all(r["state"] in ("success", "failed") for r in runs.values()):
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"runs still not finished after {timeout:.0f}s" + self.stack.log_tail())
            time.sleep(2)
        failed = sorted(f"{r['dag_id']}/{r['dag_run_id']}" for r in runs.values() if r["state"] != "success")
        if failed:
            raise SystemExit(
                f"runs failed: {failed}; task logs are under {self.stack.logs_dir}" + self.stack.log_tail()
            )


def trigger(stack: Any, dag_id: str, day: date) -> str:
    """A run of ``dag_id`` for the interval starting at ``day`` (as ``airflow dags trigger -l``)."""
    try:
        return stack.trigger(dag_id, f"{day.isoformat()}T00:00:00Z", run_id=f"demo__{day.isoformat()}")
    except StackError as exc:
        raise SystemExit(str(exc)) from None


def sql_target_database(admin_url: str, database: str) -> tuple[str | None, str]:
    """A fresh PostgreSQL database for the SQL example: (its URL, what was done) or (None, why not)."""
    import sqlalchemy as sa

    if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", database):
        raise SystemExit(f"WALSINK_DEMO_PG_DATABASE must be a plain lower-case name, got {database!r}")
    try:
        url = sa_url(admin_url)
        if not url.drivername.startswith("postgresql"):
            return (
                None,
                f"{url.drivername}://... is not a PostgreSQL URL (the SQL example loads into PostgreSQL)",
            )
        admin = sa.create_engine(url, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 5})
    except Exception as exc:  # noqa: BLE001 - a bad URL or a missing driver: skip, saying why
        return None, f"cannot use {admin_url!r}: {exc}"
    where = f"PostgreSQL on {url.host}:{url.port or 5432}"
    try:
        with admin.connect() as conn:
            conn.execute(
                sa.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :d"),
                {"d": database},
            )
            # Checked above to be a plain name: DDL cannot bind it.
            conn.execute(sa.text(f"DROP DATABASE IF EXISTS {database}"))
            conn.execute(sa.text(f"CREATE DATABASE {database}"))
    except Exception as exc:  # noqa: BLE001 - unreachable, refused, no rights: skip, saying why
        return None, f"{where} is not usable ({str(exc).strip().splitlines()[0][:160]})"
    finally:
        admin.dispose()
    target = url.set(database=database).render_as_string(hide_password=False)
    return target, f"{where}, database {database} (created afresh)"


def add_connection(stack: Any, conn_id: str, conn: dict[str, Any]) -> None:
    stack.airflow("connections", "add", conn_id, "--conn-json", json.dumps(conn))


def _examples_module() -> Any:
    sys.path.insert(0, str(REPO / "dags"))
    try:
        import walsink_example_common
    finally:
        sys.path.remove(str(REPO / "dags"))
    return walsink_example_common


def read_back_tables(
    days: list[date], iceberg_catalog: dict[str, str], delta_path: Path, sql_url: str | None
) -> list[str]:
    """Print each table target's rows per day (read with its library, summed with DuckDB) beside
    the source's; return the problems found (a row missing or twice, an unexpected day)."""
    import duckdb
    import sqlalchemy as sa
    from deltalake import DeltaTable
    from pyiceberg.catalog import load_catalog

    examples = _examples_module()
    source = {d.isoformat(): examples.daily_events(d) for d in days}
    problems: list[str] = []
    con = duckdb.connect()

    def events_table(label: str, arrow: Any, detail: str) -> None:
        con.register("t", arrow)
        per_day = con.execute(
            "SELECT CAST(dt AS VARCHAR), count(*), count(DISTINCT event_id), sum(amount_cents) "
            "FROM t GROUP BY 1 ORDER BY 1"
        ).fetchall()
        con.unregister("t")
        print(f"  {label} ({detail})")
        if {d for d, *_ in per_day} != set(source):
            problems.append(f"{label}: days {sorted(d for d, *_ in per_day)}, expected {sorted(source)}")
        for dt, rows, distinct, amount in per_day:
            want = source.get(dt, [])
            want_amount = sum(e["amount_cents"] for e in want)
            print(
                f"    dt={dt}  {rows:>6,} rows  {distinct:>6,} distinct event ids  amount {amount:>12,}"
                f"    source: {len(want):>6,} rows, amount {want_amount:>12,}"
            )
            if not (rows == distinct == len(want) and amount == want_amount):
                problems.append(f"{label} dt={dt}: {rows} rows ({distinct} distinct), source {len(want)}")

    catalog = load_catalog("walsink_iceberg", **iceberg_catalog)
    table = catalog.load_table("examples.daily_events")
    events_table(
        "iceberg examples.daily_events",
        table.scan().to_arrow(),
        f"pyiceberg, {len(table.snapshots())} snapshot(s), {table.location()}",
    )
    delta = DeltaTable(str(delta_path))
    events_table(
        "delta delta_daily_events", delta.to_pyarrow_table(), f"deltalake, version {delta.version()}"
    )

    if sql_url is None:
        return problems
    engine = sa.create_engine(sql_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT dt, country, event_type, events, users, amount_cents "
                    "FROM public.daily_country_totals ORDER BY dt, country, event_type"
                )
            ).all()
    finally:
        engine.dispose()
    con.execute(
        "CREATE TABLE totals (dt VARCHAR, country VARCHAR, event_type VARCHAR, events BIGINT, users BIGINT,"
        " amount_cents BIGINT)"
    )
    con.executemany("INSERT INTO totals VALUES (?, ?, ?, ?, ?, ?)", [tuple(r) for r in rows])
    per_day = con.execute(
        "SELECT dt, count(*), count(DISTINCT (country, event_type)), sum(events), sum(amount_cents) "
        "FROM totals GROUP BY dt ORDER BY dt"
    ).fetchall()
    print("  postgresql public.daily_country_totals (SQLAlchemy; per country and event type)")
    if {d for d, *_ in per_day} != set(source):
        problems.append(f"sql: days {sorted(d for d, *_ in per_day)}, expected {sorted(source)}")
    for dt, groups, distinct, events, amount in per_day:
        want = source.get(dt, [])
        want_groups = len({(e["country"], e["event_type"]) for e in want})
        want_amount = sum(e["amount_cents"] for e in want)
        print(
            f"    dt={dt}  {groups:>3} rows ({distinct} distinct groups)  {events:>6,} events  amount {amount:>12,}"
            f"    source: {want_groups} groups, {len(want):>6,} events, amount {want_amount:>12,}"
        )
        if not (groups == distinct == want_groups and events == len(want) and amount == want_amount):
            problems.append(
                f"sql dt={dt}: {groups} rows ({distinct} distinct), {events} events, source {len(want)}"
            )
    print("      dt | country | event_type | events | users | amount_cents")
    for row in rows[:4]:
        print(f"      {' | '.join(str(v) for v in row)}")
    if len(rows) > 4:
        print(f"      ... {len(rows) - 4} more")
    con.close()
    return problems


def write_env_sh(path: Path, env: dict[str, str]) -> None:
    """``env.sh``: the stack's Airflow settings, and this interpreter's bin directory first on
    the PATH, so `airflow` and `walsink` after `source env.sh` are the ones the demo ran (the
    venv is not activated by scripts/demo.sh, so neither was on the PATH)."""
    bin_dir = Path(sys.executable).parent  # not resolved: the venv's bin, not the base interpreter's
    lines = [f"export {k}={shlex.quote(v)}\n" for k, v in sorted(env.items()) if k.startswith("AIRFLOW")]
    lines.append(f'export PATH={shlex.quote(str(bin_dir))}:"$PATH"\n')
    path.write_text("".join(lines))


def demo_stack(airflow_home: Path) -> AirflowStack:
    """The demo's Airflow: SQLite metadata database, the checkout's ``dags/``, one admin user."""
    users = (StackUser("admin", "admin", "admin"),)
    # Two task slots: on SQLite every writer queues on one file lock, and a busy laptop
    # gains nothing from a third Spark JVM.
    return AirflowStack(airflow_home, users=users, dags_folder=REPO / "dags", parallelism=2)


def follow_up_command(airflow_home: Path) -> str:
    """What the demo tells its user to run next, in a new shell (a test runs it as printed)."""
    return f"source {shlex.quote(str(airflow_home / 'env.sh'))} && airflow dags list"


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=int, default=3, help="intervals run first (default 3)")
    parser.add_argument("--backfill-days", type=int, default=5, help="intervals of the backfill (default 5)")
    parser.add_argument(
        "--table-days",
        type=int,
        default=1,
        help="intervals of the Iceberg, Delta and SQL examples (default 1)",
    )
    args = parser.parse_args(argv)

    home = Path(os.environ.get("WALSINK_DEMO_HOME", REPO / "var" / "demo")).resolve()
    if home.exists():
        shutil.rmtree(home)  # every demo starts from nothing, as on a fresh clone
    airflow_home = home / "airflow"
    if not (REPO / "dags").is_dir():
        raise SystemExit(f"the demo runs from a walsink checkout; {REPO / 'dags'} is missing")
    stack = demo_stack(airflow_home)
    committer_db = airflow_home / "walsink" / "committer.db"
    staging = airflow_home / "walsink" / "staging"
    iceberg_home = airflow_home / "walsink" / "iceberg"
    iceberg_catalog = {
        "type": "sql",
        "uri": f"sqlite:///{iceberg_home / 'catalog.db'}",
        "warehouse": iceberg_home.joinpath("warehouse").as_uri(),
    }
    delta_path = airflow_home / "walsink" / "examples" / "target" / "delta_daily_events"

    quiet_env = {**stack.env, "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING"}  # for the walsink CLI

    say(f"Airflow home {airflow_home} (SQLite metadata database, LocalExecutor, dags folder {REPO / 'dags'})")
    # Everything Airflow needs is in this environment; `source env.sh` to use the CLI afterwards.
    write_env_sh(airflow_home / "env.sh", stack.env)
    # SIGTERM (a CI job cancelled, `kill`) stops the components, as Ctrl-C does.
    interrupt_on_sigterm()
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
            [sys.executable, "-m", "airflow_provider_walsink.cli.commands", "db", "upgrade"],
            env=quiet_env,
            capture_output=True,
            text=True,
        )
        if result.returncode:
            raise SystemExit(f"walsink db upgrade failed:\n{result.stdout}{result.stderr}")
        print("  walsink db upgrade: " + result.stdout.strip().splitlines()[-1])
        iceberg_home.mkdir(parents=True, exist_ok=True)
        add_connection(stack, "walsink_iceberg", {"conn_type": "generic", "extra": iceberg_catalog})
        print(f"  connection walsink_iceberg: Iceberg SQL catalog {iceberg_catalog['uri']}")
        sql_url, sql_where = sql_target_database(
            os.environ.get("WALSINK_DEMO_PG_URL", PG_ADMIN_URL),
            os.environ.get("WALSINK_DEMO_PG_DATABASE", PG_DATABASE),
        )
        if sql_url:
            target = sa_url(sql_url)
            add_connection(
                stack,
                "walsink_sql_target",
                {
                    "conn_type": "postgres",
                    "host": target.host,
                    "port": target.port,
                    "login": target.username,
                    "password": target.password,
                    "schema": target.database,
                },
            )
            print(f"  connection walsink_sql_target: {sql_where}")
        else:
            print(f"  SQL example skipped: {sql_where}")
        table_dags = [ICEBERG, DELTA] + ([SQL] if sql_url else [])

        say("Starting the scheduler, dag-processor, triggerer and api-server in the background")
        stack.start(timeout=LIMIT_S)
        print(f"  Airflow UI: {stack.base_url}  (user admin, password admin; while the demo runs)")
        print(f"  component output: {stack.logs_dir}/*.out")
        for dag_id in (DAILY, INCREMENTAL, *table_dags):
            stack.wait_for_dag(dag_id, timeout=LIMIT_S)
            stack.unpause(dag_id)
            print(f"  {dag_id}: parsed and unpaused")

        progress = Progress(stack)
        days = [FIRST_DAY + timedelta(days=i) for i in range(args.days)]
        table_days = [FIRST_DAY + timedelta(days=i) for i in range(args.table_days)]
        say(
            f"Running both file example pipelines for {len(days)} daily intervals ({days[0]} .. {days[-1]}), "
            f"and {', '.join(table_dags)} for {len(table_days)} at the same time"
        )
        # Table runs first: their commits are the slower ones, the file runs fill the slots after.
        run_ids = {(dag_id, trigger(stack, dag_id, day)) for dag_id in table_dags for day in table_days}
        run_ids |= {(dag_id, trigger(stack, dag_id, day)) for dag_id in (DAILY, INCREMENTAL) for day in days}
        progress.wait([DAILY, INCREMENTAL, *table_dags], run_ids)

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
    status = subprocess.run(
        [sys.executable, "-m", "airflow_provider_walsink.cli.commands", "status"], env=quiet_env
    )
    store = CommitterStore.from_url(f"sqlite:///{committer_db}", migrate=False)
    states = [
        c.state.value for p in store.pipelines() for c in store.checkpoints(p["name"], descending=False)
    ]
    store.dispose()
    if status.returncode or not states or set(states) != {"COMMITTED"}:
        print(f"\nNot every checkpoint is COMMITTED: {states}", file=sys.stderr)
        return 1

    say("The table targets, read back (each with its own library, summed per day with DuckDB)")
    problems = read_back_tables(table_days, iceberg_catalog, delta_path, sql_url)
    if not sql_url:
        print(f"  postgresql: the SQL example was skipped ({sql_where})")
    if problems:
        print("\nA table does not hold each source row once:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    print(
        f"\nAll {len(states)} checkpoints COMMITTED; every table holds each source row once. "
        f"File targets: {airflow_home / 'walsink/examples/target'}"
    )
    print(f"Use the CLI on this Airflow home: {follow_up_command(airflow_home)}")
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
