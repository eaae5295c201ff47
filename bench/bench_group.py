"""Benchmark 7 (issue 24): 16 concurrent commit tasks, 200 overwrite checkpoints, one table.

walsink: 16 processes (Airflow's worker slots), each committing its share of the 200 durable
checkpoints one after another with ``group_commit=16`` (the leader of a group publishes every
durable checkpoint it can take in one snapshot / log version; a task whose checkpoint a group
holds waits for it). The committer table and the Iceberg catalog are on PostgreSQL (a private
database, dropped at the end). Any error other than that wait counts as a failed task.

Baseline: the same library appending the same files (copies in the baseline table's own
directory) from one writer, one append commit per checkpoint, serially: pyiceberg
``Table.add_files``, deltalake ``create_write_transaction`` of add actions.

The figure is checkpoints per second (200 / wall time, staging excluded for both); the goal is
all 200 committed, 0 failures, >= 0.8x the baseline's rate. Both tables are read back: every
row exactly once. Run: ``python -m bench.bench_group [--checkpoints 200] [--tasks 16] [--kinds iceberg,delta] [--poll 0.5]``.
"""

from __future__ import annotations

import argparse
import io
import multiprocessing
import os
import shutil
import statistics
import tempfile
import time
import traceback
import uuid
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

PIPELINE = "backfill"
PG_ADMIN = os.environ.get("WALSINK_BENCH_PG_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432/test")


def pg_database(admin_url: str = PG_ADMIN) -> tuple[str, Any]:
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"walsink_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name}"))  # generated: hex digits only

    def drop() -> None:
        with admin.connect() as conn:
            conn.execute(
                text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :d"), {"d": name}
            )
            conn.execute(text(f"DROP DATABASE IF EXISTS {name}"))
        admin.dispose()

    return make_url(admin_url).set(database=name).render_as_string(hide_password=False), drop


def make_publisher(kind: str, spec: dict[str, Any]) -> Any:
    if kind == "iceberg":
        from airflow_provider_walsink.core.targets.iceberg import IcebergPublisher

        return IcebergPublisher(
            spec["identifier"],
            "overwrite",
            catalog_properties=spec["props"],
            partition_by=["dt"],
            create_table=True,
        )
    from airflow_provider_walsink.core.targets.delta import DeltaPublisher

    return DeltaPublisher(spec["uri"], "overwrite", partition_by=["dt"], create_table=True)


def key_of(i: int) -> str:
    return f"2025{1 + i // 28:02d}{1 + i % 28:02d}T000000Z"


def day_of(i: int) -> str:
    return f"2025-{1 + i // 28:02d}-{1 + i % 28:02d}"


def parquet(i: int, rows: int = 50) -> bytes:
    buf = io.BytesIO()
    pq.write_table(
        pa.table({"id": pa.array(range(i * rows, (i + 1) * rows), pa.int64()), "name": [f"r{i}"] * rows}), buf
    )
    return buf.getvalue()


def stage_all(store: Any, layout: Any, n: int, pipeline: str = PIPELINE) -> list[tuple[str, str]]:
    """Stage and mark DURABLE ``n`` one-file overwrite checkpoints; return (key, staged file) pairs."""
    from airflow_provider_walsink.core.commit import CheckpointWriter
    from airflow_provider_walsink.core.store import Actor

    actor = Actor(name="bench", dag_id="bench", run_id="stage", task_id="write", try_number=1)
    staged = []
    for i in range(n):
        key = key_of(i)
        store.register(pipeline, key, mode="overwrite", actor=actor, target="table")
        writer = CheckpointWriter(store, layout, pipeline, key, actor=actor, partition_columns=("dt",))
        attempt_dir = writer.begin()
        rel = f"dt={day_of(i)}/part-0.parquet"
        data = parquet(i)
        (attempt_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (attempt_dir / rel).write_bytes(data)
        writer.add_files({rel: data}, rows={rel: 50})
        writer.seal()
        store.mark_durable(pipeline, key, attempt=writer.attempt, actor=actor)
        staged.append((key, str(attempt_dir / rel)))
    return staged


def commit_task(
    kind: str,
    spec: dict,
    url: str,
    staging: str,
    keys: list[str],
    barrier: Any,
    out: Any,
    poll: float = 0.05,
    group: int = 16,
) -> None:
    """One worker slot: its commit tasks, one after another; a group's hold is waited out, anything else fails."""
    from airflow_provider_walsink.core.commit import CheckpointCommitter
    from airflow_provider_walsink.core.commit.group import commit_waiting_for_group
    from airflow_provider_walsink.core.staging.layout import StagingLayout
    from airflow_provider_walsink.core.store import Actor, CommitterStore

    # As a commit task's (hooks/walsink.py: store_for_url): the process's one engine for the URL,
    # which the Iceberg SQL catalog on the same database shares.
    store = CommitterStore.shared(url, migrate=False)
    layout = StagingLayout(staging)
    committer = CheckpointCommitter(
        store,
        layout,
        make_publisher(kind, spec),
        mode="overwrite",
        group_commit=group,
        lease_ttl=timedelta(minutes=2),
    )
    failures, grouped = [], 0
    warm_up(committer, keys[0])
    barrier.wait(900)  # 64 processes starting on 2 busy cores can take minutes
    for key in keys:
        actor = Actor(name=f"bench.commit@{key}", dag_id="bench", run_id=key, task_id="commit", try_number=1)
        try:
            # A group's hold or lead is waited out (as the commit operator does); anything else fails.
            grouped += len(commit_waiting_for_group(committer, PIPELINE, key, actor=actor, poll=poll).group)
        except Exception:  # noqa: BLE001 - a failed task, reported
            failures.append(f"{key}: {where_it_failed()}")
    out.put((time.time(), failures, grouped))
    store.dispose()


def warm_up(committer: Any, key: str) -> None:
    """What every commit process pays once before its first commit, paid before the clock in both
    arms alike: the committer database's connection and the table library's first load (deltalake
    starts its runtime, pyiceberg its catalog). A real commit task pays it at start-up, with its
    interpreter and Airflow's imports, whether its checkpoint commits in a group or alone."""
    committer.store.get(PIPELINE, key)
    committer.publisher.load_table()


def where_it_failed() -> str:
    """The current exception with walsink's frames (where in the sequence it failed), briefly."""
    lines = traceback.format_exc().splitlines()
    ours = [ln.strip() for ln in lines if "airflow_provider_walsink" in ln]
    return " <- ".join(reversed(ours[-4:])) + " | " + lines[-1][:300]


def walsink_run(
    kind: str,
    spec: dict,
    url: str,
    staging: str,
    keys: list[str],
    tasks: int,
    poll: float = 0.05,
    group: int = 16,
    direct_url: str | None = None,
) -> tuple[float, list, int, int]:
    """``tasks`` processes sharing ``keys``, released together; (wall, failures, grouped, peak server
    connections to the database, sampled at ``direct_url``, the database itself when ``url`` goes
    through a pooler)."""
    # A fork server imports the table libraries once, not once per process (64 spawned
    # interpreters would each import them on 2 cores before the clock starts).
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["bench.bench_group", "pyiceberg.catalog.sql", "deltalake", "sqlalchemy"])
    barrier, out = ctx.Barrier(tasks + 1), ctx.Queue()
    shares = [keys[i::tasks] for i in range(tasks)]
    procs = [
        ctx.Process(target=commit_task, args=(kind, spec, url, staging, s, barrier, out, poll, group))
        for s in shares
    ]
    for p in procs:
        p.start()
    sampler = ConnectionSampler(direct_url or url)
    barrier.wait(1200)  # every process imported and connected: the clock starts
    started = time.time()
    done = [out.get(timeout=3600) for _ in procs]
    peak = sampler.stop()
    for p in procs:
        p.join(60)
    failures = [f for _, fs, _ in done for f in fs]
    return max(t for t, _, _ in done) - started, failures, sum(g for _, _, g in done), peak


class ConnectionSampler:
    """The most server connections to the bench database seen at once (``pg_stat_activity``, every
    50 ms; the sampler's own excluded): the tasks' own, or a pooler's in front of them."""

    def __init__(self, url: str) -> None:
        import threading

        from sqlalchemy import create_engine, text
        from sqlalchemy.engine import make_url

        # Autocommit: pg_stat_activity is a snapshot taken once per transaction.
        self._engine = create_engine(url, pool_size=1, isolation_level="AUTOCOMMIT")
        self._query = text(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = :d AND pid <> pg_backend_pid()"
        )
        self._database = make_url(url).database
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with self._engine.connect() as conn:
            while not self._stop.is_set():
                self.peak = max(self.peak, conn.execute(self._query, {"d": self._database}).scalar_one())
                self._stop.wait(0.05)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(10)
        self._engine.dispose()
        return self.peak


def serial_run(kind: str, spec: dict, url: str, staging: str, keys: list[str], pipeline: str) -> float:
    """walsink committing ``keys`` one after another, each alone, from one process (the baseline
    of the released-together run: the same checkpoints, the same library, the same database)."""
    from airflow_provider_walsink.core.commit import CheckpointCommitter
    from airflow_provider_walsink.core.staging.layout import StagingLayout
    from airflow_provider_walsink.core.store import Actor, CommitterStore

    store = CommitterStore.from_url(url, migrate=False)
    committer = CheckpointCommitter(
        store, StagingLayout(staging), make_publisher(kind, spec), mode="overwrite", group_commit=0
    )
    warm_up(committer, keys[0])
    started = time.perf_counter()
    for key in keys:
        actor = Actor(name=f"bench.serial@{key}", dag_id="bench", run_id=key, task_id="commit", try_number=1)
        committer.commit(pipeline, key, actor=actor)
    wall = time.perf_counter() - started
    store.dispose()
    return wall


def table_commits(kind: str, spec: dict) -> int:
    table = make_publisher(kind, spec).load_table()
    if kind == "iceberg":
        return len(table.snapshots())
    return sum(1 for h in table.history() if "walsink.pipeline" in h)


def fresh_committer(url: str) -> Any:
    """The committer store on ``url``, its tables emptied (a fresh committer table per run)."""
    from sqlalchemy import text

    from airflow_provider_walsink.core.store import CommitterStore

    store = CommitterStore.from_url(url)
    with store.engine.begin() as conn:
        for t in (
            "walsink_transition",
            "walsink_checkpoint_version",
            "walsink_checkpoint",
            "walsink_pipeline",
        ):
            conn.execute(text(f"DELETE FROM {t}"))  # noqa: S608 - our own table names
    return store


def table_spec(kind: str, name: str, props: dict, work: Path) -> dict:
    if kind == "iceberg":
        return {"identifier": f"ns.{name}_{uuid.uuid4().hex[:6]}", "props": props}
    return {"uri": str(work / f"{name}_{uuid.uuid4().hex[:6]}")}


def together_main(
    kinds: list[str],
    counts: list[int],
    group: int,
    poll: float,
    repeats: int = 3,
    pgbouncer: int = 0,
    own_server: int = 0,
) -> None:
    """Issue 35's shape: K commit tasks released together, one per durable checkpoint.

    Each case runs ``repeats`` times, each time into fresh tables and a fresh committer table,
    the serial baseline first on even repeats and the released-together run first on odd ones
    (as every benchmark here); the figures are medians, the ratio the median of the repeats'
    ratios, with its range. With ``pgbouncer`` (a pool size), both arms reach the committer table
    and the Iceberg catalog through PgBouncer in transaction mode (``tests/pgbouncer.py``) with
    that many server connections (issue 46). With ``own_server`` (a ``max_connections``), the
    database is on a private PostgreSQL server started for the run (:mod:`bench.pg_server`), whose
    connection limit no one else spends."""
    import contextlib

    lines: list[str] = []
    with contextlib.ExitStack() as stack:
        work = Path(tempfile.mkdtemp(prefix="walsink-bench-together-"))
        stack.callback(shutil.rmtree, work, ignore_errors=True)
        if own_server:
            from bench.pg_server import private_postgres

            admin = stack.enter_context(private_postgres(max_connections=own_server))
        else:
            admin = PG_ADMIN
        url, drop = pg_database(admin)
        stack.callback(drop)
        if pgbouncer:
            from tests.pgbouncer import running_pgbouncer

            bouncer = stack.enter_context(running_pgbouncer(admin, pool_size=pgbouncer))
            task_url = bouncer.url(url)
            via = f"through PgBouncer (transaction mode, pool {pgbouncer})"
        else:
            task_url, via = url, "directly"
        server = "a private PostgreSQL server" if own_server else "PostgreSQL"
        print(
            f"committer table and Iceberg catalog on {server} (max_connections {max_connections(url)}), {via}",
            flush=True,
        )
        _together_cases(kinds, counts, group, poll, repeats, url, task_url, work, lines)
    print(
        f"| target | K tasks | walsink, K tasks released together (group_commit={group}), median | "
        f"walsink, the same checkpoints one after another, median | ratio, median of {repeats} (range) | "
        "COMMITTED (worst repeat) | failed tasks (all repeats) | table commits | rows once | "
        "peak server connections | load avg at the repeats' starts |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(lines))


def max_connections(url: str) -> int:
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    with engine.connect() as conn:
        found = int(conn.execute(text("SHOW max_connections")).scalar_one())
    engine.dispose()
    return found


def _together_cases(
    kinds: list[str],
    counts: list[int],
    group: int,
    poll: float,
    repeats: int,
    url: str,
    task_url: str,
    work: Path,
    lines: list[str],
) -> None:
    """The cases of :func:`together_main`: the bench database at ``url`` (setup, checks, the
    connection sampler), the tasks and the serial arm at ``task_url``."""
    from airflow_provider_walsink.core.staging.layout import StagingLayout
    from airflow_provider_walsink.core.store.engine import shared_engine

    for kind in kinds:
        for k in counts:
            walls, bases, ratios, peaks, fails, commits, once_all, loads = (
                [],
                [],
                [],
                [],
                0,
                set(),
                True,
                [],
            )
            committed = k
            for r in range(repeats):
                store = fresh_committer(url)
                props = {"type": "sql", "uri": task_url, "warehouse": f"file://{work}/warehouse"}
                together, serial = (table_spec(kind, n, props, work) for n in ("together", "serial"))
                staging_t = make_publisher(kind, together).staging_root()
                staging_s = make_publisher(kind, serial).staging_root()
                keys = [key for key, _ in stage_all(store, StagingLayout(staging_t), k)]
                stage_all(store, StagingLayout(staging_s), k, pipeline="serial")
                loads.append(os.getloadavg()[0])

                def run_serial(kind=kind, serial=serial, staging_s=staging_s, keys=keys):
                    return serial_run(kind, serial, task_url, staging_s, keys, "serial")

                def run_together(
                    kind=kind, together=together, staging_t=staging_t, keys=keys, k=k, store=store
                ):
                    # This process's own connections closed: the sampler counts the tasks' only.
                    store.engine.dispose()
                    shared_engine(task_url).dispose()
                    return walsink_run(
                        kind, together, task_url, staging_t, keys, k, poll, group, direct_url=url
                    )

                if r % 2 == 0:
                    base = run_serial()
                    wall, failures, _grouped, peak = run_together()
                else:
                    wall, failures, _grouped, peak = run_together()
                    base = run_serial()
                states = Counter(store.require(PIPELINE, key).state.value for key in keys)
                committed = min(committed, states.get("COMMITTED", 0))
                once_all = once_all and rows_once(kind, together, k) and rows_once(kind, serial, k)
                walls.append(wall)
                bases.append(base)
                ratios.append(base / wall)
                peaks.append(peak)
                fails += len(failures)
                commits.add(table_commits(kind, together))
                for f in failures[:5]:
                    print("  failure:", f)
                store.dispose()
            wall, base = statistics.median(walls), statistics.median(bases)
            lines.append(
                f"| {kind} | {k} | {k / wall:.1f}/s ({wall:.2f} s) | {k / base:.1f}/s ({base:.2f} s) | "
                f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) | "
                f"{committed}/{k} | {fails} | {'/'.join(map(str, sorted(commits)))} | "
                f"{'yes' if once_all else 'NO'} | {max(peaks)} | {min(loads):.1f}-{max(loads):.1f} |"
            )
            print(lines[-1], flush=True)


def baseline_run(kind: str, spec: dict, files: list[str]) -> float:
    """One writer appending each checkpoint's file (a copy inside its own table) in its own commit."""
    if kind == "iceberg":
        from pyiceberg.catalog import load_catalog
        from pyiceberg.partitioning import PartitionField, PartitionSpec
        from pyiceberg.transforms import IdentityTransform

        catalog = load_catalog("baseline", **spec["props"])
        catalog.create_namespace_if_not_exists("base")
        schema = pa.schema([("id", pa.int64()), ("name", pa.string())])
        table = catalog.create_table(f"base.t{uuid.uuid4().hex[:6]}", schema=schema)
        del PartitionField, PartitionSpec, IdentityTransform  # unpartitioned: add_files needs no path values
        started = time.perf_counter()
        for path in files:
            table.add_files([path])
        return time.perf_counter() - started
    from deltalake import DeltaTable, write_deltalake
    from deltalake.transaction import AddAction

    root = Path(spec["uri"])
    schema = pa.schema([("id", pa.int64()), ("name", pa.string())])
    write_deltalake(str(root), schema.empty_table(), mode="overwrite")
    dt = DeltaTable(str(root))
    rels = []
    for i, path in enumerate(files):
        rel = f"part-{i}.parquet"
        os.link(path, root / rel)
        rels.append((rel, os.path.getsize(root / rel)))
    started = time.perf_counter()
    for rel, size in rels:
        add = AddAction(rel, size, {}, int(time.time() * 1000), True, '{"numRecords": 50}')
        dt.create_write_transaction([add], "append", dt.schema(), partition_by=[])
    return time.perf_counter() - started


def rows_once(kind: str, spec: dict, n: int) -> bool:
    table = make_publisher(kind, spec).load_table()
    arrow = table.scan().to_arrow() if kind == "iceberg" else table.to_pyarrow_table()
    ids = Counter(arrow.column("id").to_pylist())
    return len(ids) == n * 50 and set(ids.values()) == {1}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoints", type=int, default=200)
    p.add_argument("--tasks", type=int, default=16)
    p.add_argument("--kinds", default="iceberg,delta")
    p.add_argument(
        "--poll", type=float, default=0.5, help="seconds between a waiting task's looks (operator: 2)"
    )
    p.add_argument(
        "--together",
        default="",
        help="K,K,...: issue 35's run instead: K commit tasks released together, one per durable "
        "checkpoint, against walsink committing the same checkpoints one after another",
    )
    p.add_argument("--group", type=int, default=16, help="group_commit of the --together run")
    p.add_argument("--repeats", type=int, default=3, help="repeats of each --together case (medians)")
    p.add_argument(
        "--pgbouncer",
        type=int,
        default=0,
        metavar="POOL",
        help="--together through PgBouncer (transaction mode, POOL server connections) started in front "
        "of the PostgreSQL server (Debian package pgbouncer)",
    )
    p.add_argument(
        "--own-server",
        type=int,
        default=0,
        metavar="MAX_CONNECTIONS",
        help="--together on a private PostgreSQL server started for the run with this max_connections "
        "(a shared server's limit is spent by others too)",
    )
    args = p.parse_args()
    if args.together:
        together_main(
            args.kinds.split(","),
            [int(k) for k in args.together.split(",")],
            args.group,
            args.poll,
            args.repeats,
            args.pgbouncer,
            args.own_server,
        )
        return
    from airflow_provider_walsink.core.staging.layout import StagingLayout

    work = Path(tempfile.mkdtemp(prefix="walsink-bench-group-"))
    url, drop = pg_database()
    lines = []
    try:
        for kind in args.kinds.split(","):
            store = fresh_committer(url)
            props = {"type": "sql", "uri": url, "warehouse": f"file://{work}/warehouse"}
            spec = (
                {"identifier": f"ns.group_{uuid.uuid4().hex[:6]}", "props": props}
                if kind == "iceberg"
                else {"uri": str(work / f"delta_{uuid.uuid4().hex[:6]}")}
            )
            staging = make_publisher(kind, spec).staging_root()
            staged = stage_all(store, StagingLayout(staging), args.checkpoints)
            keys = [k for k, _ in staged]
            load_before = os.getloadavg()[0]
            wall, failures, grouped, _peak = walsink_run(
                kind, spec, url, staging, keys, args.tasks, args.poll
            )
            states = Counter(store.require(PIPELINE, k).state.value for k in keys)
            once = rows_once(kind, spec, args.checkpoints)
            copies = work / f"base_{kind}"
            copies.mkdir()
            files = []
            for i, (_, path) in enumerate(staged):
                shutil.copyfile(path, copies / f"f{i}.parquet")
                files.append(str(copies / f"f{i}.parquet"))
            base_spec = (
                {"props": {**props, "warehouse": f"file://{work}/base_warehouse"}}
                if kind == "iceberg"
                else {"uri": str(work / f"base_delta_{uuid.uuid4().hex[:6]}")}
            )
            base = baseline_run(kind, base_spec, files)
            load_after = os.getloadavg()[0]
            n = args.checkpoints
            lines.append(
                f"| {kind} | {n} | {args.tasks} | {n / wall:.1f}/s ({wall:.1f} s) | {n / base:.1f}/s ({base:.1f} s) | "
                f"{(n / wall) / (n / base):.2f}x | {states.get('COMMITTED', 0)}/{n} | {len(failures)} | "
                f"{grouped} | {'yes' if once else 'NO'} | {load_before:.1f} / {load_after:.1f} |"
            )
            print(lines[-1], flush=True)
            for f in failures[:5]:
                print("  failure:", f)
            store.dispose()
    finally:
        drop()
        shutil.rmtree(work, ignore_errors=True)
    print(
        "| target | checkpoints | tasks | walsink (group commit) | library, one writer, serial | ratio | "
        "COMMITTED | failed tasks | checkpoints in groups (counted by leaders) | rows once | load avg before / after |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
