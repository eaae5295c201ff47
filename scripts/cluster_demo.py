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
5. unless ``--no-s3``: the S3 example (``dags/walsink_s3_example.py``) for the same
   intervals, staging on a local S3 server (moto on loopback, standing in for S3, MinIO
   or Ceph: nothing of it is on a shared file system) and committing into a Delta and
   an Iceberg table on the bucket, read back with deltalake and pyiceberg;
6. ``walsink status`` and, from the master's and workers' JSON status, how many Spark
   applications ran and how many executors each worker started. Fails unless every
   checkpoint is COMMITTED (and each S3 table holds each day's events once).

Home: ``WALSINK_CLUSTER_DEMO_HOME`` (default ``var/cluster-demo``), fresh on every run.
"""

from __future__ import annotations

import argparse
import json
import logging
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
from demo import Progress, say, trigger  # noqa: E402
from guard import interrupt_on_sigterm  # noqa: E402
from spark_cluster import SparkCluster  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

from airflow_provider_walsink.core.store.store import CommitterStore  # noqa: E402

DAILY = "walsink_daily_overwrite"
INCREMENTAL = "walsink_incremental_append"
S3_EXAMPLE = "walsink_s3_example"
#: moto's server accepts any key pair; a real store gets its own in the aws connection.
S3_KEYS = {"login": "walsink-demo", "password": "walsink-demo-secret"}
S3_BUCKET = "walsink-demo"
FIRST_DAY = date(2026, 1, 1)
DEFAULT_PG = "postgresql+psycopg2://postgres@127.0.0.1:5432/test"


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=int, default=3, help="intervals run first (default 3)")
    parser.add_argument("--backfill-days", type=int, default=5, help="intervals of the backfill (default 5)")
    parser.add_argument(
        "--no-s3", action="store_true", help="skip the S3 example (staging on a local S3 server)"
    )
    args = parser.parse_args(argv)

    home = Path(os.environ.get("WALSINK_CLUSTER_DEMO_HOME", REPO / "var" / "cluster-demo")).resolve()
    if home.exists():
        shutil.rmtree(home)
    shared = home / "shared"  # what the compose file's `shared` volume holds
    admin_url = os.environ.get("WALSINK_CLUSTER_DEMO_PG_URL", DEFAULT_PG)

    say(
        "Starting the Spark services of docker/compose.yaml: a master and two workers on loopback (each its own 127.0.0.x)"
    )
    cluster = SparkCluster.from_compose(home / "spark")
    # As the compose file's spark-master: one core per application unless it asks for more,
    # so the Spark jobs of a parallel backfill share the two workers.
    master_env = cluster.compose["services"]["spark-master"].get("environment", {})
    cluster.env["SPARK_MASTER_OPTS"] = master_env.get("SPARK_MASTER_OPTS", "-Dspark.deploy.defaultCores=1")
    # SIGTERM (a CI job cancelled, `kill`) stops everything the demo started, as Ctrl-C does.
    interrupt_on_sigterm()
    stack = None
    drop_committer = None
    s3 = None
    states: list[str] = []
    try:
        cluster.start()
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
        if not args.no_s3:
            s3 = S3Demo.start(committer_url)
            say(
                f"A local S3 server (moto) at {s3.endpoint}: bucket {S3_BUCKET}, the S3 example's root {s3.root}"
            )
            for conn_id, conn in s3.connections().items():
                stack.airflow("connections", "add", conn_id, "--conn-json", json.dumps(conn))
                print(f"  connection {conn_id}: {conn['conn_type']}")
            stack.airflow("variables", "set", "walsink_s3_example_root", s3.root)
        result = subprocess.run(
            [sys.executable, "-m", "airflow_provider_walsink.cli.commands", "db", "upgrade"],
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
        dag_ids = [DAILY, INCREMENTAL] + ([S3_EXAMPLE] if s3 else [])
        for dag_id in dag_ids:
            stack.wait_for_dag(dag_id)
            stack.unpause(dag_id)

        progress = Progress(stack)
        days = [FIRST_DAY + timedelta(days=i) for i in range(args.days)]
        say(f"The example pipelines ({', '.join(dag_ids)}) on the cluster for {len(days)} daily intervals")
        run_ids = {(dag_id, trigger(stack, dag_id, day)) for dag_id in dag_ids for day in days}
        progress.wait(dag_ids, run_ids)
        if s3:
            say("The S3 example's tables, read back with deltalake and pyiceberg")
            s3_problems = s3.check(days)

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
            [sys.executable, "-m", "airflow_provider_walsink.cli.commands", "status"],
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
        if s3 is not None:
            s3.stop()
        if drop_committer is not None:
            drop_committer()
    if not states or set(states) != {"COMMITTED"}:
        print(f"\nNot every checkpoint is COMMITTED: {states}", file=sys.stderr)
        return 1
    if s3 is not None and s3_problems:
        print(f"\nThe S3 example's tables are wrong: {s3_problems}", file=sys.stderr)
        return 1
    print(
        f"\nAll {len(states)} checkpoints COMMITTED on the cluster. Target tables: {shared / 'examples/target'}"
    )
    return 0


class S3Demo:
    """moto's S3 server on loopback, with the connections the S3 example names."""

    def __init__(self, server, committer_url: str) -> None:
        self.server = server
        host, port = server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        self.root = f"s3://{S3_BUCKET}/lake"
        self.catalog = {
            "type": "sql",
            "uri": committer_url,
            "warehouse": f"{self.root}/warehouse",
            "s3.endpoint": self.endpoint,
            "s3.access-key-id": S3_KEYS["login"],
            "s3.secret-access-key": S3_KEYS["password"],
            "s3.region": "us-east-1",
        }

    @classmethod
    def start(cls, committer_url: str) -> S3Demo:
        import boto3
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        demo = cls(server, committer_url)
        boto3.client(
            "s3", endpoint_url=demo.endpoint, region_name="us-east-1",
            aws_access_key_id=S3_KEYS["login"], aws_secret_access_key=S3_KEYS["password"],
        ).create_bucket(Bucket=S3_BUCKET)  # fmt: skip
        return demo

    def stop(self) -> None:
        self.server.stop()

    def connections(self) -> dict[str, dict]:
        return {
            # The amazon provider's default connection: staging and the Delta table use it.
            "aws_default": {
                "conn_type": "aws",
                **S3_KEYS,
                "extra": {
                    "region_name": "us-east-1",
                    "endpoint_url": self.endpoint,
                    "storage_options": {"aws_conditional_put": "etag"},
                },
            },  # fmt: skip
            "walsink_s3_lake": {"conn_type": "generic", "extra": self.catalog},
        }

    def check(self, days: list[date]) -> list[str]:
        """Each table holds each day's source events once; prints what it read, returns the problems."""
        from collections import Counter

        from deltalake import DeltaTable
        from pyiceberg.catalog import load_catalog

        sys.path.insert(0, str(REPO / "dags"))
        from walsink_example_common import daily_events

        want = Counter(e["event_id"] for d in days for e in daily_events(d))
        delta = DeltaTable(
            f"{self.root}/delta_events",
            storage_options={
                "AWS_ENDPOINT_URL": self.endpoint, "AWS_ALLOW_HTTP": "true", "AWS_REGION": "us-east-1",
                "AWS_ACCESS_KEY_ID": S3_KEYS["login"], "AWS_SECRET_ACCESS_KEY": S3_KEYS["password"],
            },
        )  # fmt: skip
        iceberg = load_catalog("walsink_s3_lake", **self.catalog).load_table("examples.s3_events")
        problems = []
        for name, rows, files in (
            (f"Delta {self.root}/delta_events (version {delta.version()})",
             delta.to_pyarrow_table(columns=["event_id"]), delta.file_uris()),
            ("Iceberg examples.s3_events", iceberg.scan(selected_fields=("event_id",)).to_arrow(),
             [t.file.file_path for t in iceberg.scan().plan_files()]),
        ):  # fmt: skip
            got = Counter(rows.column("event_id").to_pylist())
            ok = got == want
            print(f"  {name}: {rows.num_rows} rows in {len(files)} data files, each source event once: {ok}")
            if not ok:
                problems.append(name)
        return problems


if __name__ == "__main__":
    raise SystemExit(run())
