"""End to end in production shape: a Spark standalone cluster, PostgreSQL everywhere.

* **Spark**: the ``spark-master`` and ``spark-worker`` services of ``docker/compose.yaml``,
  run as local processes (``tests/spark_cluster.py``): a master and two workers of one
  core each on 127.0.0.1, from the virtualenv's pyspark.
* **Airflow**: the session's real stack (scheduler, dag-processor, triggerer,
  api-server; metadata on PostgreSQL), with the compose file's connections registered:
  ``spark_cluster`` (the local master, client deploy mode) and its ``walsink_default``
  settings as ``walsink_cluster_e2e`` (the committer table on this session's PostgreSQL
  database; the session's other e2e tests keep the embedded default).
* **The pipeline**: ``tests/dags/walsink_cluster_test.py``, the example's daily events
  in four Parquet files per interval, submitted to ``spark://127.0.0.1:<port>``.

A backfill over two intervals; in the second one's first attempt, one write task
stalls halfway through its partition and the test kills that executor's JVM (SIGKILL),
so the Spark job fails, the write attempt fails and Airflow retries the task.

Checked: every interval COMMITTED exactly once in the committer table (the killed one
by attempt 2), the target holds each day's source rows exactly once, and, from the
Spark event logs and the workers' addresses in the master's ``/json/``, which worker's
executor wrote each committed committable (its sealed ``writer`` lineage
``<app id>/task-<n>``): both workers wrote some.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from collections import Counter
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from airflow_provider_walsink.core.protocol.manifest import digest_of
from airflow_provider_walsink.core.store.store import CommitterStore

pytestmark = [pytest.mark.e2e, pytest.mark.spark, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent
DAG_ID = "walsink_cluster_e2e"  # tests/dags/walsink_cluster_test.py
PIPELINE = "cluster_events"
SPARK_CONN_ID = "spark_cluster"
WALSINK_CONN_ID = "walsink_cluster_e2e"
COMPOSE_WALSINK_CONN = "walsink_default"
DAYS = [date(2026, 3, 1) + timedelta(days=i) for i in range(2)]  # the stalled day and one other
STALLED_DAY = DAYS[1]
FILES_PER_DAY = 4
EXECUTOR_MAIN = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


def _key(day: date) -> str:
    return f"{day:%Y%m%d}T000000Z"


# --------------------------------------------------------------------------- processes


def _parent(pid: int) -> int:
    # /proc/<pid>/stat: "pid (comm) state ppid ..."; comm may contain spaces.
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def _executor_jvm_of(pid: int) -> int:
    """The executor JVM above a Python worker (worker → pyspark daemon → executor JVM)."""
    current = pid
    for _ in range(6):
        cmdline = Path(f"/proc/{current}/cmdline").read_bytes().split(b"\0")
        if EXECUTOR_MAIN.encode() in cmdline:
            return current
        current = _parent(current)
    raise AssertionError(f"no {EXECUTOR_MAIN} process above pid {pid}")


# --------------------------------------------------------------------------- event logs


def _event_log(directory: Path, app_id: str) -> list[dict[str, Any]]:
    candidates = [p for p in directory.iterdir() if p.name.split(".")[0] == app_id]
    assert len(candidates) == 1, f"event log of {app_id}: {candidates}"
    return [json.loads(line) for line in candidates[0].read_text().splitlines() if line.strip()]


def _write_tasks(events: list[dict[str, Any]]) -> dict[int, str]:
    """``{partition index: executor id}`` of the successful tasks that wrote output."""
    out: dict[int, str] = {}
    for e in events:
        if e["Event"] != "SparkListenerTaskEnd" or e["Task End Reason"]["Reason"] != "Success":
            continue
        output = (e.get("Task Metrics") or {}).get("Output Metrics") or {}
        if output.get("Records Written", 0) > 0:
            info = e["Task Info"]
            assert info["Index"] not in out, f"two successful write tasks for partition {info['Index']}"
            out[info["Index"]] = info["Executor ID"]
    return out


def _executor_webuis(events: list[dict[str, Any]]) -> dict[str, str]:
    """``{executor id: its worker's web UI URL}`` (from the executor's log URLs)."""
    out = {}
    for e in events:
        if e["Event"] == "SparkListenerExecutorAdded":
            log_url = e["Executor Info"]["Log Urls"]["stdout"]
            out[e["Executor ID"]] = log_url.split("/logPage/")[0]
    return out


# --------------------------------------------------------------------------- target


def _check_target_against_source(target: Path, days: list[date]) -> int:
    """Each day's partition holds exactly that day's source rows, once; returns the row total."""
    import sys

    import pyarrow.parquet as pq

    sys.path.insert(0, str(REPO / "dags"))
    try:
        from walsink_example_common import daily_events
    finally:
        sys.path.remove(str(REPO / "dags"))
    partitions = sorted(p.name for p in target.iterdir() if p.is_dir() and p.name.startswith("dt="))
    assert partitions == [f"dt={d.isoformat()}" for d in days]
    total = 0
    for day in days:
        files = sorted((target / f"dt={day.isoformat()}").glob("*.parquet"))
        assert len(files) == FILES_PER_DAY, f"dt={day}: {len(files)} data files"
        rows = pq.ParquetDataset([str(f) for f in files]).read().to_pylist()
        got = sorted(
            (r["event_id"], r["ts"].strftime("%Y-%m-%d %H:%M:%S"), r["user_id"], r["amount_cents"])
            for r in rows
        )
        want = sorted((e["event_id"], e["ts"], e["user_id"], e["amount_cents"]) for e in daily_events(day))
        assert got == want, (
            f"dt={day}: {len(got)} rows in the target, {len(want)} in the source (or they differ)"
        )
        total += len(got)
    return total


# --------------------------------------------------------------------------- the test


def test_backfill_on_a_spark_cluster_with_an_executor_killed_mid_write(
    airflow_stack, spark_cluster, pg_url, tmp_path, capsys
):
    stack, cluster = airflow_stack, spark_cluster
    home = tmp_path / "cluster-home"
    event_logs = tmp_path / "spark-events"
    for d in (home / "stall", home / "evidence", event_logs):
        d.mkdir(parents=True)

    # The compose file's connections, mapped to this machine (see tests/spark_cluster.py).
    db = make_url(pg_url)
    connections = cluster.connections(
        host=db.host,
        port=db.port,
        login=db.username,
        password=db.password or "",
        schema=db.database,
        extra={"staging_root": str(home / "staging")},
    )
    assert set(connections) == {COMPOSE_WALSINK_CONN, SPARK_CONN_ID}
    assert connections[SPARK_CONN_ID]["extra"]["deploy-mode"] == "client"
    for conn_id, conn in (
        (WALSINK_CONN_ID, connections[COMPOSE_WALSINK_CONN]),
        (SPARK_CONN_ID, connections[SPARK_CONN_ID]),
    ):
        # The stack is shared (the S3 cluster test adds spark_cluster too): replaced, never a failure.
        stack.set_connection(conn_id, conn)

    store = CommitterStore.from_url(pg_url)
    try:
        stack.wait_for_dag(DAG_ID)
        stack.unpause(DAG_ID)
        backfill = stack.backfill(
            DAG_ID,
            DAYS[0].isoformat(),
            DAYS[-1].isoformat(),
            max_active_runs=2,
            conf={
                "walsink_cluster": {
                    "home": str(home),
                    "event_log_dir": str(event_logs),
                    "stall_key": _key(STALLED_DAY),
                }
            },
        )

        # One write task of the stalled day's first attempt waits halfway through its
        # partition: kill the JVM of the executor running it.
        def stalled() -> Path | None:
            found = next(iter((home / "stall").glob("stalled-*[0-9]")), None)
            if found is None and stack.get(f"/api/v2/backfills/{backfill}")["completed_at"]:
                raise AssertionError("the backfill finished and no write task ever stalled")
            return found

        marker = stack.wait_until("a write task to stall", stalled, timeout=600)
        executor = _executor_jvm_of(int(marker.read_text()))
        executor_dir = Path(os.readlink(f"/proc/{executor}/cwd"))  # <work dir>/<app id>/<executor id>
        killed_app, killed_executor = executor_dir.parent.name, executor_dir.name
        killed_on = next(w for w in cluster.workers if executor_dir.is_relative_to(w.work_dir))
        os.kill(executor, signal.SIGKILL)
        print(
            f"\nkilled executor {killed_executor} of {killed_app} (pid {executor}) on worker-{killed_on.index}"
        )

        runs = stack.wait_for_backfill(backfill, timeout=900)
        assert sorted(r["logical_date"][:10] for r in runs) == [d.isoformat() for d in DAYS]
        assert {r["state"] for r in runs} == {"success"}, [(r["dag_run_id"], r["state"]) for r in runs]

        # Each Airflow try of a write task is one write attempt; the stalled day's first one
        # failed because its executor was killed, and Airflow's retry wrote attempt 2. (Another
        # day may retry too on a starved machine: each of its tries is then one attempt.)
        write_tries = {}
        for run in runs:
            tries = {
                ti["task_id"]: ti["try_number"] for ti in stack.task_instances(DAG_ID, run["dag_run_id"])
            }
            write_tries[run["logical_date"][:10]] = tries["events.write"]
            assert tries["events.commit"] == 1, (run["dag_run_id"], tries)
        assert write_tries[STALLED_DAY.isoformat()] == 2, write_tries

        # The committer table (PostgreSQL): one COMMITTED checkpoint per interval, once.
        checkpoints = {c.checkpoint_key: c for c in store.checkpoints(PIPELINE, descending=False)}
        assert sorted(checkpoints) == [_key(d) for d in DAYS]
        assert {c.state.value for c in checkpoints.values()} == {"COMMITTED"}
        for day in DAYS:
            record = checkpoints[_key(day)]
            assert record.sealed_attempt == write_tries[day.isoformat()], (record, write_tries)
            history = store.history(PIPELINE, _key(day))
            assert [e.to_state for e in history].count("COMMITTED") == 1, history
            failures = [e.detail or "" for e in history if e.to_state == "FAILED"]
            assert len(failures) == record.sealed_attempt - 1, failures
            if day == STALLED_DAY:
                assert "write attempt 1" in failures[0], failures
        rows = _check_target_against_source(home / "target", DAYS)
        assert rows == sum(c.rows for c in checkpoints.values())

        # The killed executor belonged to the failed first attempt's application.
        killed_events = _event_log(event_logs, killed_app)
        removed = [e["Executor ID"] for e in killed_events if e["Event"] == "SparkListenerExecutorRemoved"]
        assert killed_executor in removed, f"{killed_app}: executor {killed_executor} not reported removed"

        # Who wrote what: each committed committable's writer (app id, task) → the executor
        # that ran that write task (event log) → its worker (web UI address in its log URLs,
        # the same address the master's /json/ lists for the worker).
        status = cluster.master_status()
        alive = {w["webuiaddress"]: w["id"] for w in status["workers"] if w["state"] == "ALIVE"}
        assert set(alive) == {w.webui_url for w in cluster.workers}
        finished_apps = {a["id"] for a in status["completedapps"]}
        per_worker: Counter[str] = Counter()
        for key, record in checkpoints.items():
            evidence = home / "evidence" / f"{key}-a{record.sealed_attempt}.manifest.json"
            data = evidence.read_bytes()
            assert digest_of(data) == record.manifest_digest, f"{evidence} is not the committed manifest"
            committables = json.loads(data)["committables"]
            assert len(committables) == FILES_PER_DAY
            for committable in committables:
                app_id, task = committable["writer"].split("/task-")
                assert app_id in finished_apps, f"{app_id} is not among the master's completed applications"
                events = _event_log(event_logs, app_id)
                executor_id = _write_tasks(events)[int(task)]
                worker_url = _executor_webuis(events)[executor_id]
                assert worker_url in alive, f"executor {executor_id} of {app_id} ran on an unknown worker"
                per_worker[alive[worker_url]] += 1
        with capsys.disabled():  # shown in CI's output even when the test passes
            print("\ncommittables written per worker:")
            for worker in cluster.workers:
                print(
                    f"  worker-{worker.index} {alive[worker.webui_url]}: {per_worker[alive[worker.webui_url]]}"
                )
        assert sum(per_worker.values()) == FILES_PER_DAY * len(DAYS)
        assert all(per_worker[worker_id] > 0 for worker_id in alive.values()), per_worker
    finally:
        store.dispose()
        if cluster.artifacts_dir:  # beside the master's and workers' logs
            shutil.copytree(event_logs, cluster.artifacts_dir / "spark-events", dirs_exist_ok=True)


def test_cluster_is_the_compose_files(spark_cluster):
    """The local processes run the compose file's commands; only addresses and paths are mapped."""
    from spark_cluster import load_compose

    services = load_compose()["services"]
    master = [str(a) for a in services["spark-master"]["command"]]
    expected = [spark_cluster.master_command[0], *master[1:]]
    expected[expected.index("--host") + 1] = "127.0.0.1"
    expected[expected.index("--port") + 1] = str(spark_cluster.port)
    expected[expected.index("--webui-port") + 1] = str(spark_cluster.webui_port)
    assert spark_cluster.master_command == expected

    worker = [str(a) for a in services["spark-worker"]["command"]]
    assert len(spark_cluster.workers) == services["spark-worker"]["deploy"]["replicas"] == 2
    for w, command in zip(spark_cluster.workers, spark_cluster.worker_commands, strict=True):
        expected = [command[0], *worker[1:]]
        expected[expected.index("--webui-port") + 1] = str(w.webui_port)
        expected[expected.index("--work-dir") + 1] = str(w.work_dir)
        expected[-1] = spark_cluster.master_url
        assert command == expected
    # What the master reports: both workers alive with the compose file's one core each.
    workers = spark_cluster.master_status()["workers"]
    assert sorted((w["state"], w["cores"]) for w in workers) == [("ALIVE", 1), ("ALIVE", 1)]


def test_a_port_taken_before_the_master_binds_it_is_replaced_by_a_free_one(tmp_path):
    """Another process binding the master's web UI port between ``free_port()`` and the master's
    start fails that start with a bind error (Spark moving to the next port would leave the tests
    asking the wrong process): the cluster stops it and comes up on new ports."""
    import socket

    from spark_cluster import SparkCluster

    from tests.helpers import missing_prerequisite

    if not shutil.which("java") and not os.environ.get("JAVA_HOME"):
        missing_prerequisite("Java (17) is not installed: the Spark cluster cannot start")
    cluster = SparkCluster.from_compose(tmp_path / "cluster")
    taken = cluster.webui_port
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        with cluster:
            assert cluster.webui_port != taken
            workers = cluster.master_status()["workers"]
            assert sorted(w["state"] for w in workers) == ["ALIVE", "ALIVE"]
    master_log = (cluster.logs_dir / "master.out").read_text(errors="replace")
    assert f"{taken}" in master_log and "BindException" in master_log
