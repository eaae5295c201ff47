"""The second demo command (``bash scripts/cluster-demo.sh``): the example pipelines in
production shape, without Docker.

What ``docker/compose.yaml`` deploys, run as local processes on loopback:

1. the compose file's Spark services: a standalone master and two workers (one core
   each) started with the virtualenv's ``spark-class`` (``tests/spark_cluster.py``);
2. PostgreSQL for Airflow's metadata and, in a second database, the committer table
   (fresh databases on ``WALSINK_CLUSTER_DEMO_PG_URL``, default the local server's
   ``test`` database as administrator; both dropped at the end);
3. the compose file's connections: ``spark_cluster`` (the local master, client deploy
   mode) and ``walsink_default`` (the committer database; staging root under the demo
   home); the example DAGs submit through ``spark_cluster`` because
   ``WALSINK_EXAMPLE_SPARK_CONN_ID`` says so, as in the compose file;
4. the real scheduler, dag-processor, triggerer and api-server; both example DAGs for
   ``--days`` intervals, then a backfill of the daily one over ``--backfill-days``
   with ``--reprocess-behavior completed``;
5. ``walsink status`` and, from the master's and workers' JSON status, how many Spark
   applications ran and how many executors each worker started. Fails unless every
   checkpoint is COMMITTED.

Home: ``WALSINK_CLUSTER_DEMO_HOME`` (default ``var/cluster-demo``), fresh on every run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from datetime import date, timedelta
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the stack and cluster runners the e2e tests use
sys.path.insert(0, str(REPO))

from airflow_stack import AirflowStack, StackUser, create_postgres_database  # noqa: E402
from spark_cluster import SparkCluster  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

from airflow_provider_walsink.committer.store import CommitterStore  # noqa: E402
from airflow_provider_walsink.demo import Progress, say, trigger  # noqa: E402

DAILY = "walsink_daily_overwrite"
INCREMENTAL = "walsink_incremental_append"
FIRST_DAY = date(2026, 1, 1)
DEFAULT_PG = "postgresql+psycopg2://postgres@127.0.0.1:5432/test"


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=int, default=3, help="intervals run first (default 3)")
    parser.add_argument("--backfill-days", type=int, default=5, help="intervals of the backfill (default 5)")
    args = parser.parse_args(argv)

    home = Path(os.environ.get("WALSINK_CLUSTER_DEMO_HOME", REPO / "var" / "cluster-demo")).resolve()
    if home.exists():
        shutil.rmtree(home)
    shared = home / "shared"  # what the compose file's `shared` volume holds
    admin_url = os.environ.get("WALSINK_CLUSTER_DEMO_PG_URL", DEFAULT_PG)

    say("Starting the Spark services of docker/compose.yaml: a master and two workers on 127.0.0.1")
    cluster = SparkCluster.from_compose(home / "spark")
    cluster.start()
    stack = None
    drop_committer = None
    try:
        print(f"  master {cluster.master_url}, web UI {cluster.webui_url}")
        committer_url, drop_committer = create_postgres_database(admin_url, prefix="walsink_committer")
        db = make_url(committer_url)
        connections = cluster.connections(
            host=db.host,
            port=db.port,
            login=db.username,
            password=db.password or "",
            schema=db.database,
            extra={"staging_root": str(shared / "staging")},
        )
        stack = AirflowStack.create(
            home,
            postgres_admin_url=admin_url,
            users=(StackUser("admin", "admin", "admin"),),
            dags_folder=REPO / "dags",
            parallelism=3,
            env={
                # As the compose file's x-airflow-common environment, with local paths.
                "WALSINK_EXAMPLE_SPARK_CONN_ID": "spark_cluster",
                "WALSINK_EXAMPLE_HOME": str(shared / "examples"),
                "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
                "PYSPARK_PYTHON": sys.executable,
            },
        )
        say(f"Airflow home {stack.home}: metadata and committer table on PostgreSQL ({db.host}:{db.port})")
        stack.airflow("db", "migrate", timeout=600)
        for conn_id, conn in connections.items():
            stack.airflow("connections", "add", conn_id, "--conn-json", json.dumps(conn))
            print(f"  connection {conn_id}: {conn['conn_type']} {conn['host']}:{conn['port']}")
        result = subprocess.run(
            [sys.executable, "-m", "airflow_provider_walsink.cli", "db", "upgrade"],
            env={**stack.env, "WALSINK_DATABASE_URL": committer_url},
            capture_output=True,
            text=True,
        )
        if result.returncode:
            raise SystemExit(f"walsink db upgrade failed:\n{result.stdout}{result.stderr}")
        print("  walsink db upgrade: done")

        say("Starting the scheduler, dag-processor, triggerer and api-server")
        stack.start()
        print(f"  Airflow UI: {stack.base_url} (admin / admin, while the demo runs)")
        for dag_id in (DAILY, INCREMENTAL):
            stack.wait_for_dag(dag_id)
            stack.unpause(dag_id)

        progress = Progress(stack)
        days = [FIRST_DAY + timedelta(days=i) for i in range(args.days)]
        say(f"Both example pipelines on the cluster for {len(days)} daily intervals")
        run_ids = {trigger(stack, dag_id, day) for dag_id in (DAILY, INCREMENTAL) for day in days}
        progress.wait([DAILY, INCREMENTAL], run_ids)

        last = FIRST_DAY + timedelta(days=args.backfill_days - 1)
        say(
            f"airflow backfill create --dag-id {DAILY} --from-date {FIRST_DAY} --to-date {last} --reprocess-behavior completed"
        )
        backfill = stack.backfill(
            DAILY, FIRST_DAY.isoformat(), last.isoformat(), reprocess_behavior="completed"
        )
        stack.wait_until(
            f"backfill {backfill}",
            lambda: progress.poll([DAILY]) and stack.get(f"/api/v2/backfills/{backfill}")["completed_at"],
            timeout=1800,
            interval=2,
        )
        failed = [r["dag_run_id"] for r in stack.wait_for_backfill(backfill) if r["state"] != "success"]
        if failed:
            raise SystemExit(f"backfill runs failed: {failed}; task logs are under {stack.logs_dir}")

        say("Where the Spark work ran (the master's and workers' JSON status)")
        status = cluster.master_status()
        print(f"  applications completed on {cluster.master_url}: {len(status['completedapps'])}")
        for worker in cluster.workers:
            info = httpx.get(f"{worker.webui_url}/json/", timeout=10).json()
            print(f"  worker-{worker.index} {info['id']}: {len(info['finishedexecutors'])} executors ran")

        say("walsink status")
        subprocess.run(
            [sys.executable, "-m", "airflow_provider_walsink.cli", "status"],
            env={**stack.env, "WALSINK_DATABASE_URL": committer_url},
        )
        store = CommitterStore.from_url(committer_url, migrate=False)
        states = [
            c.state.value for p in store.pipelines() for c in store.checkpoints(p["name"], descending=False)
        ]
        store.dispose()
    finally:
        say("Stopping Airflow and the Spark cluster")
        if stack is not None:
            stack.stop()
        cluster.stop()
        if drop_committer is not None:
            drop_committer()
    if not states or set(states) != {"COMMITTED"}:
        print(f"\nNot every checkpoint is COMMITTED: {states}", file=sys.stderr)
        return 1
    print(
        f"\nAll {len(states)} checkpoints COMMITTED on the cluster. Target tables: {shared / 'examples/target'}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(run())
