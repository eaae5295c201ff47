"""The crash campaign against the table and SQL targets (Iceberg, Delta, PostgreSQL, MariaDB/MySQL).

The file-target campaign (:mod:`.runner`) proves the protocol; this one proves
each target that records its own commits. One schedule is a pipeline of 2-3
daily checkpoints (Parquet staged where the target stages, as executors
write it) committed through the real :class:`CheckpointCommitter` and store.
The first commit try of a checkpoint runs in a forked process and is, at
random:

* **killed** (SIGKILL) at a point of the commit: the lease just taken, right
  before or right after the table commit / SQL load, or after everything was
  published and before COMMITTED; Airflow's retry (a new lease owner, after
  the lease expires) must finish the commit without adding anything twice;
* **a zombie**: stopped (SIGSTOP) right before its table commit, while a
  second try takes the lease over and commits; then resumed: the table's own
  commit (its marker and the epoch) must refuse it.

``overwrite`` schedules then lose one checkpoint's committer rows (as
retention does) and write its interval again: the partition must hold the new
rows once. Then one committed checkpoint is **reprocessed** (a new version
with other rows, committed under the same random kill or zombie): it must
hold the new version's rows once and none of the old (SQL ``append`` refuses
a reprocess, so its schedules skip this step). After each schedule the target is read back with its own library
and checked row by row: every checkpoint exactly once, nothing else.

With ``s3_endpoint`` (Iceberg and Delta) the tables and their staging live in a
bucket of that S3 server (moto's, on loopback): attempts are staged and sealed
through a :class:`StagingStore`, the committer reads and cleans them there, and
the tables are read back through their libraries on S3. The file campaign
(:mod:`.runner`) has no S3 dimension: a directory-of-files target publishes by
rename from a local or mounted staging root only, and refuses an object-store one.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import random
import signal
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from sqlalchemy import delete

from airflow_provider_walsink.core import faults
from airflow_provider_walsink.core.commit.commit import CheckpointCommitter
from airflow_provider_walsink.core.commit.writer import CheckpointWriter
from airflow_provider_walsink.core.protocol.manifest import Manifest
from airflow_provider_walsink.core.staging.layout import StagingLayout
from airflow_provider_walsink.core.staging.object_store import StagingStore
from airflow_provider_walsink.core.store.models import checkpoint_table, transition_table
from airflow_provider_walsink.core.store.store import Actor, CommitterStore, LeaseHeldError
from airflow_provider_walsink.core.targets.registry import TargetOptions, resolve_target

LEASE_TTL = timedelta(milliseconds=800)
KILL_POINTS = {
    "iceberg": ("lease.after_takeover", "table.before_table_commit", "table.after_table_commit",
                "commit.after_publish", "commit.after_committed"),
    "delta": ("lease.after_takeover", "table.before_table_commit", "table.after_table_commit",
              "commit.after_publish", "commit.after_committed"),
    "sql": ("lease.after_takeover", "sql.before_load", "sql.loaded", "sql.committed",
            "commit.after_publish", "commit.after_committed"),
}  # fmt: skip
ZOMBIE_POINT = {
    "iceberg": "table.before_table_commit",
    "delta": "table.before_table_commit",
    "sql": "sql.loaded",
}
MAX_TRIES = 20


@dataclass
class TargetResult:
    kind: str
    schedules: int = 0
    checkpoints: int = 0
    crashes: Counter = field(default_factory=Counter)
    zombies: int = 0
    retention_reruns: int = 0
    reprocesses: int = 0
    violations: list[str] = field(default_factory=list)

    def describe(self) -> str:
        points = ", ".join(f"{p} {n}" for p, n in sorted(self.crashes.items()))
        return (
            f"{self.kind}: {self.schedules} schedules, {self.checkpoints} checkpoints, SIGKILLs at [{points}], "
            f"{self.zombies} zombie tries resumed, {self.retention_reruns} re-runs after retention, "
            f"{self.reprocesses} reprocessed checkpoints, "
            f"violations: {len(self.violations)}" + "".join(f"\n  {v}" for v in self.violations[:20])
        )


@dataclass
class TargetEnv:
    """How to reach one target kind: its URI per pipeline, its connections, how to read it back.

    ``s3_endpoint`` (Iceberg and Delta): the tables and their staging live under ``prefix`` in the
    ``walsink`` bucket of that S3 server (moto's); staging is a :class:`StagingStore` there, each
    attempt sealed by conditional put, and the tables are read back through their libraries on S3.
    """

    kind: str
    work: Path
    sql_url: str | None = None
    s3_endpoint: str | None = None
    prefix: str = field(default_factory=lambda: uuid.uuid4().hex[:12])

    def __post_init__(self) -> None:
        if self.s3_endpoint and self.kind not in ("iceberg", "delta"):
            raise ValueError(f"S3 staging takes the iceberg and delta targets only, not {self.kind}")

    @property
    def s3(self) -> Any:
        from tests.table_fixtures import S3Server

        return S3Server(self.s3_endpoint or "", "walsink")

    def store_options(self) -> dict[str, str]:
        from tests.table_fixtures import ACCESS_KEY, REGION, SECRET_KEY

        return {"endpoint_url": self.s3.endpoint, "access_key": ACCESS_KEY, "secret_key": SECRET_KEY,
                "region": REGION}  # fmt: skip

    @property
    def sql_schema(self) -> str | None:
        """PostgreSQL: ``public``; MySQL/MariaDB: the URL's database (a schema is a database there)."""
        return "public" if self.sql_url and self.sql_url.startswith("postgresql") else None

    def uri(self, pipeline: str) -> str:
        table = pipeline.replace("-", "_")
        if self.kind == "iceberg":
            return f"iceberg://harness/h.{table}?create_table=true"
        if self.kind == "delta" and self.s3_endpoint:
            return f"delta+s3://walsink/{self.prefix}/delta/{table}?create_table=true"
        if self.kind == "delta":
            return f"delta://{self.work}/delta/{table}?create_table=true"
        return f"sql://harness_sql/{self.sql_schema + '.' if self.sql_schema else ''}{table}"

    def connections(self, conn_id: str) -> dict[str, Any]:
        if conn_id == "harness":
            extra = {"type": "sql", "uri": f"sqlite:///{self.work}/catalog.db"}
            if self.s3_endpoint:
                extra |= {
                    "warehouse": f"s3://walsink/{self.prefix}/warehouse",
                    **self.s3.iceberg_properties(),
                }
            else:
                extra["warehouse"] = f"file://{self.work}/warehouse"
            return {"conn_type": "iceberg", "extra": extra}
        raise KeyError(conn_id)

    def publisher(self, pipeline: str, mode: str, layout: StagingLayout | StagingStore | None) -> Any:
        # A stopped SQL committer holds the marker row's lock: others give up after 2 s, not 60.
        extra: dict[str, Any] = {"url": self.sql_url, "lock_timeout": 2} if self.kind == "sql" else {}
        if self.s3_endpoint:
            if self.kind == "delta":
                extra["storage_options"] = self.s3.delta_options()
            layout = None  # as the commit operator builds it for a checkpoint staged on an object store
        options = TargetOptions(
            mode=mode, layout=layout, partition_by=("dt",), connections=self.connections, extra=extra
        )
        return resolve_target(self.uri(pipeline), options)

    def layout(self, pipeline: str, mode: str) -> StagingLayout | StagingStore:
        probe = self.publisher(pipeline, mode, StagingLayout(self.work / "staging"))
        own = getattr(probe, "staging_root", None)
        root = own() if callable(own) else None
        if self.s3_endpoint:
            if not root or not root.startswith(f"s3://walsink/{self.prefix}/"):
                raise RuntimeError(f"{self.kind} on S3 stages at {root!r}, not under the campaign's prefix")
            return StagingStore.open(root, self.store_options())
        return StagingLayout((root or str(self.work / "staging")).removeprefix("file://"))

    def rows(self, pipeline: str, mode: str) -> list[tuple[str, str]]:
        publisher = self.publisher(pipeline, mode, StagingLayout(self.work / "staging"))
        if self.kind == "sql":
            from sqlalchemy import column, create_engine, inspect, select, table

            engine = create_engine(self.sql_url)
            name = pipeline.replace("-", "_")
            try:
                if not inspect(engine).has_table(name, schema=self.sql_schema):
                    return []  # nothing committed yet
                with engine.connect() as conn:  # the dialect quotes the name
                    found = conn.execute(
                        select(column("dt"), column("id")).select_from(table(name, schema=self.sql_schema))
                    ).all()
            finally:
                engine.dispose()
            return sorted((str(dt), str(i)) for dt, i in found)
        table = publisher.load_table()
        if table is None:
            return []
        arrow = table.scan().to_arrow() if self.kind == "iceberg" else table.to_pyarrow_table()
        return sorted(zip(arrow["dt"].to_pylist(), arrow["id"].to_pylist(), strict=True))


def _actor(step: str, key: str, try_number: int) -> Actor:
    return Actor(name=f"targets.{step}@{key}#try{try_number}", dag_id="targets", run_id=key, task_id=step,
                 try_number=try_number)  # fmt: skip


def _write(
    store: CommitterStore,
    env: TargetEnv,
    pipeline: str,
    mode: str,
    key: str,
    rows: list[str] | Mapping[str, list[str]],
) -> Manifest:
    """The write and durability tasks: Parquet files where the target stages, sealed and marked DURABLE.

    ``rows``: the ids of partition ``dt=<key>``, or ids per ``dt`` value (several partitions; a
    value without ids is declared: ``overwrite`` replaces it with nothing).
    """
    actor = _actor("write", key, 1)
    store.register(pipeline, key, mode=mode, actor=actor, target=env.uri(pipeline))
    layout = env.layout(pipeline, mode)
    writer = CheckpointWriter(store, layout, pipeline, key, actor=actor, partition_columns=("dt",))
    attempt_dir = writer.begin()
    files = {}
    for dt, ids in rows.items() if isinstance(rows, Mapping) else [(key, rows)]:
        if not ids:
            writer.declare_partition(f"dt={dt}")
        for i, chunk in enumerate((ids[: len(ids) // 2], ids[len(ids) // 2 :])):
            if not chunk:
                continue
            buf = io.BytesIO()
            pq.write_table(pa.table({"id": pa.array(chunk, pa.string())}), buf)  # dt is the directory
            rel = f"dt={dt}/part-{i:05d}.parquet"
            if isinstance(attempt_dir, Path):
                (attempt_dir / f"dt={dt}").mkdir(parents=True, exist_ok=True)
                (attempt_dir / rel).write_bytes(buf.getvalue())
            else:  # an object store: one object per file, as the executors write
                objects = writer.objects
                with objects.filesystem.open_output_stream(objects.committable(attempt_dir, rel)) as out:
                    out.write(buf.getvalue())
            files[rel] = len(chunk)
    writer.add_files(list(files), rows=files, checksum="crc32", writer="targets")
    manifest, _digest = writer.seal(file_format="parquet", job="targets")
    store.mark_durable(pipeline, key, attempt=writer.attempt, actor=actor)
    return manifest


def _commit(
    store: CommitterStore, env: TargetEnv, pipeline: str, mode: str, key: str, try_number: int
) -> None:
    layout = env.layout(pipeline, mode)
    actor = _actor("commit", key, try_number)
    committer = CheckpointCommitter(
        store, layout, env.publisher(pipeline, mode, layout), mode=mode, owner=actor.name, lease_ttl=LEASE_TTL
    )
    committer.commit(pipeline, key, actor=actor)


#: Commit tries run in children of a fork server: the table libraries' runtimes (threads) do
#: not survive a fork of a process that used them, and the server never uses them; it only
#: imports the modules (preloaded once, instead of ~2 s of imports per spawned child).
_CHILDREN = multiprocessing.get_context("forkserver")
_CHILDREN.set_forkserver_preload(
    [__name__, "deltalake", "pyiceberg.catalog.sql", "pyiceberg.io.pyarrow", "psycopg2", "pymysql"]
)


def _child(
    env: TargetEnv, db_url: str, pipeline: str, mode: str, key: str, point: str, stop: bool, out: str
) -> None:
    """Commit try 1 in a fresh child of the fork server (see ``_CHILDREN``)."""
    code = 1
    try:
        os.environ[faults.ENV] = f"{point}:1"
        os.environ[faults.SIGNAL_ENV] = "STOP" if stop else "KILL"
        store = CommitterStore.from_url(db_url, migrate=False)
        _commit(store, env, pipeline, mode, key, 1)
        code = 0
    except BaseException:  # noqa: BLE001 - reported to the parent
        Path(out).write_text(traceback.format_exc())
    os._exit(code)


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return "X"


def _commit_until_done(
    store: CommitterStore, env: TargetEnv, pipeline: str, mode: str, key: str
) -> str | None:
    for try_number in range(2, MAX_TRIES):
        try:
            _commit(store, env, pipeline, mode, key, try_number)
            return None
        except LeaseHeldError:
            time.sleep(LEASE_TTL.total_seconds() / 2)
        except Exception:  # noqa: BLE001 - a violation
            return traceback.format_exc()[-800:]
    return f"no commit after {MAX_TRIES} tries"


def _commit_with_fault(
    store: CommitterStore,
    env: TargetEnv,
    rng: random.Random,
    pipeline: str,
    mode: str,
    key: str,
    result: TargetResult,
    problems: list[str],
) -> str | None:
    """Commit try 1 in a child killed or stopped at a random point, then retries until done; the error."""
    zombie = rng.random() < 0.25
    point = ZOMBIE_POINT[env.kind] if zombie else rng.choice(KILL_POINTS[env.kind])
    out = str(env.work / f"{uuid.uuid4().hex}.out")
    proc = _CHILDREN.Process(
        target=_child, args=(env, str(store.engine.url.render_as_string(hide_password=False)), pipeline,
                             mode, key, point, zombie, out)
    )  # fmt: skip
    proc.start()
    while proc.is_alive() and not (zombie and _state(proc.pid) == "T"):
        time.sleep(0.01)
    if zombie and proc.is_alive():
        time.sleep(LEASE_TTL.total_seconds() * 1.2)  # the stopped try's lease runs out
        error = _commit_until_done(store, env, pipeline, mode, key)
        locked = bool(error and "stayed locked" in error)
        # A table commit is a compare-and-swap: try 2 commits while try 1 is stopped. A SQL
        # load holds the marker row's lock in an open transaction: try 2 must wait for it.
        before = env.rows(pipeline, mode)
        os.kill(proc.pid, signal.SIGCONT)
        proc.join(300)
        result.zombies += 1
        if env.rows(pipeline, mode) != before:
            problems.append(f"{key}: the resumed zombie try changed the target")
        text = Path(out).read_text() if os.path.exists(out) else ""
        if proc.exitcode != 0 and not any(s in text for s in ("FencedError", "LeaseLostError")):
            problems.append(f"{key}: the zombie failed with something else than fencing: {text[-500:]}")
        if locked:
            error = _commit_until_done(store, env, pipeline, mode, key)
        return error
    proc.join(300)
    if proc.exitcode == -signal.SIGKILL:
        result.crashes[point] += 1
        time.sleep(LEASE_TTL.total_seconds())
    return _commit_until_done(store, env, pipeline, mode, key)


def run_target_schedule(store: CommitterStore, env: TargetEnv, rng: random.Random, index: int,
                        result: TargetResult) -> None:  # fmt: skip
    mode = rng.choice(("append", "overwrite"))
    pipeline = f"t{index}-{mode[:3]}-{uuid.uuid4().hex[:4]}"
    expected: dict[str, list[str]] = {}
    problems: list[str] = []
    for ci in range(rng.randint(2, 3)):
        key = f"2026010{ci + 1}"
        rows = [f"{pipeline}-{key}-{j}" for j in range(rng.randint(1, 6))]
        _write(store, env, pipeline, mode, key, rows)
        expected[key] = rows
        error = _commit_with_fault(store, env, rng, pipeline, mode, key, result, problems)
        if error:
            problems.append(f"{key}: commit failed: {error}")
            break
    if not problems and mode == "overwrite":
        # Retention trims a committed checkpoint's rows; its interval is written and committed again.
        key = rng.choice(sorted(expected))
        record = store.require(pipeline, key)
        with store.engine.begin() as conn:
            conn.execute(delete(transition_table).where(transition_table.c.checkpoint_id == record.id))
            conn.execute(delete(checkpoint_table).where(checkpoint_table.c.id == record.id))
        expected[key] = [f"{r}-again" for r in expected[key]]
        _write(store, env, pipeline, mode, key, expected[key])
        error = _commit_until_done(store, env, pipeline, mode, key)
        result.retention_reruns += 1
        if error:
            problems.append(f"{key}: re-run after retention failed: {error}")
    if not problems and not (env.kind == "sql" and mode == "append"):  # SQL append refuses a reprocess
        # A reprocess: a new version of a committed checkpoint (other rows), under the same faults.
        key = rng.choice(sorted(expected))
        superseded = store.require(pipeline, key).sealed_attempt_id
        store.begin_version(pipeline, key, token=f"targets/{key}#reprocess", actor=_actor("write", key, 2),
                            reason="harness reprocess")  # fmt: skip
        expected[key] = [f"{pipeline}-{key}-v2-{j}" for j in range(rng.randint(1, 4))]
        _write(store, env, pipeline, mode, key, expected[key])
        error = _commit_with_fault(store, env, rng, pipeline, mode, key, result, problems)
        result.reprocesses += 1
        if error:
            problems.append(f"{key}: reprocess failed: {error}")
        elif [(v.attempt_id, v.state.value) for v in store.versions(pipeline, key)] != [
            (superseded, "SUPERSEDED")
        ]:
            problems.append(f"{key}: the replaced version is not recorded SUPERSEDED")
    if not problems:
        want = sorted((key, r) for key, rows in expected.items() for r in rows)
        got = env.rows(pipeline, mode)
        if got != want:
            missing, extra = Counter(want) - Counter(got), Counter(got) - Counter(want)
            problems.append(f"rows differ: missing {sorted(missing)[:5]}, extra {sorted(extra)[:5]}")
        for key in expected:
            record = store.require(pipeline, key)
            if not record.is_committed:
                problems.append(f"{key} is {record.state}: {record.error}")
    result.schedules += 1
    result.checkpoints += len(expected)
    result.violations += [f"#{index} {pipeline} ({mode}): {p}" for p in problems]


def run_target_campaign(kind: str, *, seed: int, schedules: int, workdir: Path, db_url: str,
                        sql_url: str | None = None, s3_endpoint: str | None = None) -> TargetResult:  # fmt: skip
    """Run ``schedules`` crash schedules against one target kind (see the module docstring);
    ``sql_url`` (PostgreSQL or MySQL/MariaDB) is the SQL target's database; ``s3_endpoint``
    (Iceberg, Delta): tables and staging in the ``walsink`` bucket of that S3 server."""
    env = TargetEnv(kind, Path(workdir), sql_url, s3_endpoint)
    store = CommitterStore.from_url(db_url)
    # The SQL target's label names its database (``sql (mysql)``): the campaign runs on both.
    label = f"{kind} ({sql_url.split(':', 1)[0].split('+')[0]})" if sql_url else kind
    result = TargetResult(f"{label} (S3 staging)" if s3_endpoint else label)
    rng = random.Random(f"{seed}:{kind}" + (":s3" if s3_endpoint else ""))
    try:
        for i in range(schedules):
            run_target_schedule(store, env, rng, i, result)
    finally:
        store.dispose()
    return result
