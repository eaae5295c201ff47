"""One pipeline under test: its target, its committer table, the operations, the reference model.

A *schedule* is a JSON-serialisable list of steps (``{"op": ..., ...}``) run in
order against one :class:`World` (one target kind, one mode, one fencing mode,
one fresh pipeline). :meth:`World.run` executes one step with the real core
APIs (``CheckpointWriter``, ``evaluate_durability``, ``CheckpointCommitter``,
``CheckpointAborter``, ``begin_version``, GC, retention, table maintenance);
commits that are killed, paused or raced run in real child processes of a
fork server, so a kill is a real SIGKILL at a named crash point
(``WALSINK_CRASH_AT``) and a pause a real SIGSTOP.

:meth:`World.check` compares what the target holds (read back with its own
library) and what the committer table says with :class:`Model`, a reference
of what must be visible, and returns the violations found.

``Config(staging="s3")`` puts an Iceberg or Delta table and its staging in a
bucket of moto's S3 server: the same steps then stage, seal, check, commit,
abort and clean up through a :class:`StagingStore`, and the target is read back
on S3 (see :class:`Config`). ``staging="gs"`` and ``staging="abfss"`` do the same
with an Iceberg table on fake-gcs-server and on Azurite (:mod:`tests.model.stores`).

``Config(kafka="HOST:PORT")`` reads a topic of librdkafka's mock cluster through the
real Kafka source path, with producers appending between steps, SIGKILLs between the
target commit and the group commit and mid-read, and the Kafka invariants checked after
every step (:mod:`tests.model.kafka`).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import multiprocessing
import os
import signal
import time
import traceback
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_walsink.core import faults
from airflow_provider_walsink.core.commit.abort import CheckpointAborter
from airflow_provider_walsink.core.commit.aftercommit import commit_then_follow
from airflow_provider_walsink.core.commit.commit import CheckpointCommitter
from airflow_provider_walsink.core.commit.writer import CheckpointWriter
from airflow_provider_walsink.core.protocol.errors import WalsinkError
from airflow_provider_walsink.core.staging.layout import StagingLayout
from airflow_provider_walsink.core.staging.object_store import StagingStore
from airflow_provider_walsink.core.store.store import Actor, CommitterStore, LeaseHeldError
from airflow_provider_walsink.core.targets.registry import TargetOptions, resolve_target

from . import stores
from .people import People
from .storage_ops import StorageOps, resized

LEASE_TTL = timedelta(milliseconds=800)
#: An abort waits out a holder's trusted confirmation: min(TTL/3, 2 s) with this TTL, plus margin.
ABORT_GRACE = timedelta(milliseconds=500)
KEYS = ("20260101", "20260102", "20260103", "20260104", "20260105")
#: Overwrite checkpoints write into these partitions (shared by every key: the order matters).
#: Random writes use the first two; a group's members take one each of the others (disjoint).
PARTITIONS = ("2026-01-01", "2026-01-02", "2026-01-03", "2026-01-04", "2026-01-05")
KILL_POINTS = {
    "files": ("publish.after_k", "publish.after_swap", "commit.after_publish", "commit.after_committed"),
    "iceberg": ("table.before_table_commit", "table.after_table_commit", "commit.after_publish",
                "commit.after_committed"),
    "delta": ("table.before_table_commit", "table.after_table_commit", "commit.after_publish",
              "commit.after_committed"),
    "sql": ("sql.before_load", "sql.loaded", "sql.committed", "commit.after_publish", "commit.after_committed"),
}  # fmt: skip
#: Where a paused committer stops: mid-publish (before the target changes) and inside its clean-up.
PAUSE_POINTS = {
    "files": ("publish.after_k", "commit.after_committed"),
    "iceberg": ("table.before_table_commit", "commit.after_committed"),
    "delta": ("table.before_table_commit", "commit.after_committed"),
    "sql": ("sql.loaded", "commit.after_committed"),
}
MAX_TRIES = 12
#: Group commit (issue 24, table targets, ``overwrite``, lease fencing): where its leader is killed:
#: before and after its one table commit, before recording COMMITTED, after it (before clean-up).
GROUP_KILL_POINTS = (
    "table.before_group_commit",
    "table.after_group_commit",
    "group.before_committed",
    "group.after_committed",
)
#: The most other checkpoints a group commit's leader adds to its own.
GROUP_SIZE = 8


#: The bucket of the object-store staging dimension (moto's real S3 API server, fake-gcs-server,
#: Azurite, each on loopback).
BUCKET = stores.BUCKET
#: Target kinds that can take a checkpoint staged on S3 (they commit by reference); GCS and ADLS:
#: :data:`.stores.KINDS`.
S3_KINDS = stores.KINDS["s3"]


@dataclass(frozen=True)
class Config:
    """What one schedule runs against (picklable: the fork server's children rebuild from it).

    ``staging="s3"``: the table (Delta's log and data, Iceberg's warehouse; the catalog stays an
    SQLite file) and its staging live under a prefix of :data:`BUCKET` on the S3 server at
    ``s3_endpoint``; every step reaches staging through a :class:`StagingStore`, and the target is
    read back through its library on S3. ``staging="gs"`` or ``"abfss"``: the same on the emulator
    ``store`` (:class:`.stores.ObjectStore`), with the target kinds it takes (:data:`.stores.KINDS`).
    """

    kind: str  # files | iceberg | delta | sql
    mode: str  # append | overwrite
    fencing: str  # lease | table
    work: str
    db_url: str
    sql_url: str | None = None
    pipeline: str = "p"
    staging: str = "local"  # local | s3 | gs | abfss
    s3_endpoint: str | None = None
    #: The emulator of ``gs`` or ``abfss`` staging (S3's is ``s3_endpoint``).
    store: stores.ObjectStore | None = None
    #: The mock Kafka cluster's bootstrap address: the pipeline reads a topic (tests/model/kafka.py).
    kafka: str | None = None
    #: The widened data domain (``tests/data_domain.py``): five partitions of two columns ``(k, t)``,
    #: each named ``(STRINGS name, TEMPORAL name)``; ``None``: the one ``dt`` column of dates.
    domain: tuple[tuple[str, str], ...] | None = None
    #: The commit's ``verify_checksums`` (drawn per schedule): on, a staged committable changed
    #: after the durability gate is refused before anything is published; off, the commit does
    #: not re-read staged bytes, so a same-size change is published as it is (by design).
    verify_checksums: bool = True
    #: How write steps stage: ``None``, the model writes the Parquet files itself; ``"spark-submit"``
    #: or ``"connect:<conn id>"``, a real PySpark job does (``tests/model/spark_write.py``).
    spark_write: str | None = None
    #: The Iceberg catalog: ``"sql"`` (an SQLite file), or ``"rest"``: the REST catalog at
    #: ``rest_uri`` (``tests/model/rest.py``, in the checker's process), reached through an
    #: ``iceberg`` connection; then the ``unreported`` step injects a commit the catalog applied
    #: but did not report (5xx, a dropped connection, an answer past the time-out).
    catalog: str = "sql"
    rest_uri: str | None = None

    def __post_init__(self) -> None:
        if self.catalog not in ("sql", "rest"):
            raise ValueError(f"the Iceberg catalog is sql or rest, not {self.catalog!r}")
        if self.catalog == "rest" and (self.kind != "iceberg" or not self.rest_uri):
            raise ValueError("a REST catalog needs the iceberg target and the catalog's URI (rest_uri)")
        if self.spark_write and (self.staging != "local" or self.kafka or self.domain is not None):
            raise ValueError("Spark writes stage locally, from the files source, into the dt column")
        if self.staging == "s3" and (self.kind not in S3_KINDS or not self.s3_endpoint):
            raise ValueError(f"S3 staging needs an S3 endpoint and a target of {S3_KINDS}, not {self.kind}")
        if self.staging in ("gs", "abfss"):
            kinds = stores.KINDS[self.staging]
            if self.kind not in kinds or self.store is None or self.store.scheme != self.staging:
                raise ValueError(
                    f"{self.staging} staging needs its emulator and a target of {kinds}, not {self.kind}"
                )
            if self.catalog != "sql":
                raise ValueError("a REST catalog's tables are local or on S3 here")
        elif self.staging not in ("local", "s3"):
            raise ValueError(f"staging is local, s3, gs or abfss, not {self.staging!r}")
        if self.kafka and self.mode != "append":
            raise ValueError("a Kafka source reads in append mode only")
        if self.domain is not None:
            if self.kafka:
                raise ValueError("the widened data domain is for the files source (Kafka writes dt)")
            if len(self.domain) != len(KEYS) or len({d for _, d in self.partitions()}) != len(KEYS):
                raise ValueError(
                    f"the domain names {len(KEYS)} partitions of distinct directories: {self.domain}"
                )

    @property
    def columns(self) -> tuple[str, ...]:
        """The partition columns: ``(k, t)`` with the widened domain, else ``(dt,)``."""
        from tests import data_domain

        return data_domain.COLUMNS if self.domain is not None else ("dt",)

    def partitions(self) -> list[tuple[Any, str]]:
        """The schedule's five partitions as ``(what the target holds, the Hive directory)``: a
        ``(k, t)`` tuple of held values with the widened domain (NULL and ``''`` both NULL), else
        the ``dt`` text; the directory as the job's executors write it (the package's one escape)."""
        from airflow_provider_walsink.core.protocol.partitions import partition_dir

        if self.domain is None:
            return [(p, f"dt={p}") for p in PARTITIONS]
        from tests import data_domain as D

        out = []
        for k, t in self.domain:
            values = (D.STRINGS[k], D.TEMPORAL[t])
            out.append((tuple(D.expected(v) for v in values), partition_dir(D.COLUMNS, values)))
        return out

    @property
    def label(self) -> str:
        sql = f"-{self.sql_url.split(':', 1)[0].split('+')[0]}" if self.sql_url else ""
        return (f"{self.kind}{sql}{'-rest' if self.catalog == 'rest' else ''}/{self.mode}/{self.fencing}"
                + (f"/{self.staging}" if self.staging != "local" else "") + ("/kafka" if self.kafka else ""))  # fmt: skip

    @property
    def prefix(self) -> str:
        """This schedule's prefix in the bucket (the same in every child: derived, not drawn)."""
        return hashlib.sha256(f"{self.work}/{self.pipeline}".encode()).hexdigest()[:16]

    @property
    def objects(self) -> stores.ObjectStore:
        """The object store the schedule stages on (S3, GCS or ADLS)."""
        if self.staging == "s3":
            return stores.ObjectStore("s3", self.s3_endpoint or "")
        if self.store is None:
            raise ValueError(f"{self.label} stages locally")
        return self.store

    @property
    def bucket_root(self) -> str:
        """This schedule's prefix on its object store, as a URI."""
        return self.objects.root(self.prefix)

    def store_options(self) -> dict[str, Any]:
        """:meth:`StagingStore.open` options for the object store's emulator."""
        return self.objects.options()

    @property
    def table(self) -> str:
        if self.catalog == "rest":  # one catalog serves every schedule of a run (and a test module)
            return f"{self.pipeline.replace('-', '_')}_{self.prefix[:8]}"
        return self.pipeline.replace("-", "_")

    @property
    def sql_schema(self) -> str | None:
        return "public" if self.sql_url and self.sql_url.startswith("postgresql") else None

    def uri(self) -> str:
        if self.kind == "files":
            return f"{self.work}/target"
        if self.kind == "iceberg":
            return f"iceberg://model/m.{self.table}?create_table=true"
        if self.kind == "delta" and self.staging != "local":
            return f"delta+{self.bucket_root}/delta/{self.table}?create_table=true"
        if self.kind == "delta":
            return f"delta://{self.work}/delta/{self.table}?create_table=true"
        return f"sql://model_sql/{self.sql_schema + '.' if self.sql_schema else ''}{self.table}"

    def warehouse(self) -> str:
        """Where the schedule's Iceberg tables live: under ``<work>``, or its prefix in the bucket."""
        return f"{self.bucket_root}/warehouse" if self.staging != "local" else f"file://{self.work}/warehouse"

    def connections(self, conn_id: str) -> dict[str, Any]:
        if conn_id == "model" and self.catalog == "rest":
            from .rest import connection

            return connection(self)
        if conn_id == "model":
            extra = {"type": "sql", "uri": f"sqlite:///{self.work}/catalog.db", "warehouse": self.warehouse()}
            if self.staging != "local":
                extra |= self.objects.iceberg_properties()
            return {"conn_type": "iceberg", "extra": extra}
        raise KeyError(conn_id)

    def publisher(self, layout: StagingLayout | StagingStore | None = None) -> Any:
        extra: dict[str, Any] = {"url": self.sql_url, "lock_timeout": 2} if self.kind == "sql" else {}
        archive = None
        if self.kind in ("iceberg", "delta"):
            # A bound small enough that every schedule archives: its commits, crashes, races,
            # groups, aborts and reprocesses read old markers through the committer database
            # (Delta: walsink bounds the table at its first commit, and archives in every version).
            extra["table_markers"] = TABLE_MARKERS
            archive = _archive_store(self.db_url)
        if self.staging != "local":
            if self.kind == "delta":
                extra["storage_options"] = self.objects.delta_options()
            # As the commit operator builds it for a checkpoint staged on an object store: no local
            # layout; the publisher reads the attempt through the store the committer hands it.
            staged: Any = None
        else:
            staged = layout or StagingLayout(f"{self.work}/staging")
        options = TargetOptions(
            mode=self.mode,
            layout=staged,
            partition_by=self.columns,
            connections=self.connections,
            extra=extra,
            property_archive=archive,
        )
        return resolve_target(self.uri(), options)

    def layout(self) -> StagingLayout | StagingStore:
        """Where attempts are staged: the target's own staging root (tables), else ``<work>/staging``;
        on an object store the :class:`StagingStore` of the table's root in the bucket."""
        probe = self.publisher()
        own = getattr(probe, "staging_root", None)
        root = own() if callable(own) else None
        if self.staging != "local":
            if not root or not root.startswith(f"{self.bucket_root}/"):
                raise RuntimeError(
                    f"{self.label}: the target stages at {root!r}, not in the schedule's prefix"
                )
            return StagingStore.open(root, self.store_options())
        return StagingLayout((root or f"{self.work}/staging").removeprefix("file://"))


def delete_prefix(cfg: Config) -> int:
    """Delete every object under the schedule's prefix in the bucket; how many."""
    return cfg.objects.delete(cfg.prefix)


#: Markers and partition holders (Delta: application transactions) a schedule's pipeline keeps in
#: the table (batch 1): with three keys, the first one's marker is only in the committer database by
#: the third commit (Delta: by the second).
TABLE_MARKERS = 1
_ARCHIVES: dict[str, CommitterStore] = {}


def _archive_store(url: str) -> CommitterStore:
    """This process's store on the schedule's committer database, where table targets archive markers."""
    if url not in _ARCHIVES:
        _ARCHIVES[url] = CommitterStore.from_url(url, migrate=False)
    return _ARCHIVES[url]


def actor(step: str, key: str, n: int) -> Actor:
    return Actor(name=f"model.{step}@{key}#{n}", dag_id="model", run_id=key, task_id=step, try_number=n)


def commit_task(
    cfg: Config, store: CommitterStore, owner: str, key: str, a: Actor
) -> tuple[Any, dict[str, Any]]:
    """What the commit task runs (``operators/commit.py``): the core commit, then the source's step
    after COMMITTED (Kafka: the consumer group's offsets), in the order of the core's
    :func:`~airflow_provider_walsink.core.commit.aftercommit.commit_then_follow`, which the operator
    calls too (the checker tests that order, it does not copy it). (summary, the source's entries)."""
    follow = None
    if cfg.kafka:
        from airflow_provider_walsink.core.sources.kafka import KafkaOffsetSource

        from . import kafka

        source = KafkaOffsetSource(kafka.spec(cfg), kafka.client_config(cfg))

        def follow() -> Any:
            return source.after_commit(store, cfg.pipeline)

    c = committer(cfg, store, owner)
    return commit_then_follow(lambda: c.commit(cfg.pipeline, key, actor=a), follow)


def committer(cfg: Config, store: CommitterStore, owner: str) -> CheckpointCommitter:
    layout = cfg.layout()
    return CheckpointCommitter(
        store,
        layout,
        cfg.publisher(layout),
        mode=cfg.mode,
        owner=owner,
        lease_ttl=LEASE_TTL,
        fencing=cfg.fencing,
        # Drawn per schedule: on, a staged file changed after its durability check (``tamper``,
        # ``corrupt``) must be refused before anything is published (the commit re-reads the
        # staged bytes); off, a same-size change is published as staged (World.op_corrupt).
        verify_checksums=cfg.verify_checksums,
    )


# ----------------------------------------------------------------------------- child processes

#: Commit tries that are killed, paused or raced run in children of a fork server: the table
#: libraries' runtimes (threads) do not survive a fork of a process that used them.
_CHILDREN = multiprocessing.get_context("forkserver")
_CHILDREN.set_forkserver_preload(
    [__name__, "deltalake", "pyiceberg.catalog.sql", "pyiceberg.io.pyarrow", "psycopg2", "pymysql"]
)


def _child_commit(cfg: Config, key: str, n: int, point: str | None, stop: bool, out: str) -> None:
    """One commit try; writes ``{"ok": ..., "already": ..., "error": ...}`` to ``out``."""
    result: dict[str, Any] = {}
    logging.disable(logging.ERROR)  # the parent reports what matters
    # A stopped process in a process group that becomes orphaned gets SIGHUP then SIGCONT from
    # the kernel (POSIX job control): it must not die of the SIGHUP. Resumed early, it is just
    # another interleaving, and the checks after the step apply as to any other.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        if point:
            os.environ[faults.ENV] = f"{point}:1"
            os.environ[faults.SIGNAL_ENV] = "STOP" if stop else "KILL"
        store = CommitterStore.from_url(cfg.db_url, migrate=False)
        a = actor("commit", key, n)
        summary, _ = commit_task(cfg, store, a.name, key, a)  # Kafka: the group after (crash point before it)
        result = {"ok": True, "already": summary.already_committed, "attempt_id": summary.attempt_id}
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        result = {"ok": False, "error": type(exc).__name__, "text": traceback.format_exc()[-1500:]}
    Path(out).write_text(json.dumps(result))
    os._exit(0)


def _child_group_commit(cfg: Config, key: str, n: int, point: str | None, out: str) -> None:
    """One commit try leading a group commit; writes ``{"ok", "already", "group": {key: attempt id}}``."""
    result: dict[str, Any] = {}
    logging.disable(logging.ERROR)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        if point:
            os.environ[faults.ENV] = f"{point}:1"
            os.environ[faults.SIGNAL_ENV] = "KILL"
        store = CommitterStore.from_url(cfg.db_url, migrate=False)
        a = actor("group", key, n)
        c = committer(cfg, store, a.name)
        c.group_commit = GROUP_SIZE
        summary = c.commit(cfg.pipeline, key, actor=a)
        keys = summary.group or [key]
        group = {k: store.require(cfg.pipeline, k).sealed_attempt_id for k in keys}
        result = {
            "ok": True,
            "already": summary.already_committed,
            "attempt_id": summary.attempt_id,
            "group": group,
        }
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        result = {"ok": False, "error": type(exc).__name__, "text": traceback.format_exc()[-1500:]}
    Path(out).write_text(json.dumps(result))
    os._exit(0)


def resume(proc: Any) -> bool:
    """SIGCONT a child the checker stopped, then wait for it; ``False`` if it was already gone."""
    try:
        os.kill(proc.pid, signal.SIGCONT)
        resumed = True
    except ProcessLookupError:
        resumed = False
    proc.join(300)
    return resumed


def _proc_state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        # Gone before the open (ENOENT) or between the open and the read (ESRCH).
        return "X"


# ----------------------------------------------------------------------------- the model


@dataclass
class Attempt:
    key: str
    attempt_id: str
    version: int
    rows: list[tuple[str, str, int | None]]
    partitions: list[str]
    start: int | None = None
    end: int | None = None
    durable: bool = False
    poisoned: bool = False  # a staged file was swapped for a symlink or changed: must never be published
    #: How a staged file was changed after the seal (``tamper``): truncate, extend, same_size.
    tampered: set[str] = field(default_factory=set)
    #: Kafka mode: the start and end offsets per partition of the schedule's topic.
    kstart: dict[str, int] = field(default_factory=dict)
    kend: dict[str, int] = field(default_factory=dict)


@dataclass
class Model:
    """What must be visible: the committed attempt of every key (kept after retention trims rows)."""

    attempts: dict[str, Attempt] = field(default_factory=dict)
    committed: dict[str, str] = field(default_factory=dict)  # key -> attempt id
    aborted: set[str] = field(default_factory=set)
    superseded: set[str] = field(default_factory=set)
    #: key -> the committed attempts its reprocesses replace, oldest first: a chain when a
    #: version commits and is reprocessed again within one step (a paused committer's commit,
    #: then the reprocess run meanwhile), so the model never saw the middle one as committed.
    reprocessing: dict[str, list[str]] = field(default_factory=dict)
    owners: dict[str, str] = field(default_factory=dict)  # overwrite: partition -> attempt id
    new_commits: Counter = field(default_factory=Counter)  # attempt id -> commits that said "new"
    trimmed: set[str] = field(default_factory=set)
    #: A commit killed with no retry yet (key -> its attempt): the target may show that attempt's
    #: rows (each once, maybe not all) until the checkpoint is COMMITTED or ABORTED.
    in_flight: dict[str, str] = field(default_factory=dict)
    #: Append: attempts committed under a key whose row retention trimmed, before the key was
    #: re-run; their rows stay (a re-run reads new offsets, it does not replace them).
    retired: list[str] = field(default_factory=list)


class World(People, StorageOps):
    """One pipeline of one target: runs steps, checks them against :class:`Model`."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        Path(cfg.work).mkdir(parents=True, exist_ok=True)
        self.store = CommitterStore.from_url(cfg.db_url)
        if cfg.catalog == "rest":  # created first: its location is the catalog's to name (rest.py)
            from .rest import create_table

            create_table(cfg)
        self.layout = cfg.layout()
        self.model = Model()
        self.counts: Counter = Counter()
        self.notes: list[str] = []  # step-level violations
        self.log: list[str] = []
        self._n = 0
        self.kafka: Any = None
        if cfg.kafka:
            from .kafka import Producer

            self.kafka = Producer(cfg)
            self.kafka.produce(2)  # the topic exists from the first step on
        for key in KEYS:  # registered in key order: sequences follow the keys
            self.store.register(
                cfg.pipeline, key, mode=cfg.mode, actor=actor("register", key, 1), target=cfg.uri()
            )

    def close(self) -> None:
        self.store.dispose()
        if self.kafka is not None:
            self.kafka.close()
        if self.cfg.staging != "local":  # the schedule's prefix: the server keeps every object in memory
            try:
                delete_prefix(self.cfg)
            except Exception:  # noqa: BLE001,S110 - best effort; the prefix is this schedule's alone
                pass

    # ------------------------------------------------------------------ steps

    def run(self, step: dict[str, Any]) -> None:
        op = step["op"]
        self.counts[op] += 1
        if self.kafka is not None:
            self.kafka.produce(len(self.log) % 3)  # a producer keeps appending between steps
        before = self.rows() if op == "recommit" else None  # read back by check() after every step anyway
        try:
            outcome = getattr(self, f"op_{op}")(**{k: v for k, v in step.items() if k != "op"})
        except WalsinkError as exc:
            outcome = f"refused: {type(exc).__name__}: {str(exc)[:160]}"
            self.counts[f"{op}.refused"] += 1
        except Exception as exc:  # noqa: BLE001 - anything else the core raised is a finding
            outcome = f"error: {type(exc).__name__}: {exc}"
            self.notes.append(f"{op} {step} raised {type(exc).__name__}: {str(exc)[:400]}")
        self.log.append(f"{json.dumps(step)} -> {outcome}")
        if op in ("recommit",) and self.rows() != before:
            self.notes.append(f"a re-run commit of a COMMITTED checkpoint changed the target ({step})")

    def _next(self) -> int:
        self._n += 1
        return self._n

    def op_write(self, key: str, n: int, parts: list[int] | None = None, nulls: bool = True) -> str:
        """A write task: a new attempt, staged Parquet, sealed (not yet durable)."""
        cfg, store = self.cfg, self.store
        if cfg.kafka:
            from . import kafka

            return kafka.op_write(self, key, n)
        a = actor("write", key, self._next())
        # The write task registers its checkpoint (again, after retention trimmed its row).
        record = store.register(cfg.pipeline, key, mode=cfg.mode, actor=a, target=cfg.uri())
        if record.is_committed:
            return "skipped: COMMITTED (a reprocess starts a new version)"
        if (waits := earlier_open(store, cfg, record)) is not None:
            return waits
        start, end = (
            append_range(store, cfg.pipeline, key, record, n) if cfg.mode == "append" else (None, None)
        )
        writer = CheckpointWriter(
            store, self.layout, cfg.pipeline, key, actor=a, partition_columns=cfg.columns
        )
        attempt_dir = writer.begin(start_offsets={"src": start} if start is not None else None)
        version = store.require(cfg.pipeline, key).version
        rows, partitions, directories = self.draw_rows(key, n, parts, version, start, end, nulls=nulls)
        if cfg.spark_write:
            from . import spark_write

            spark_write.stage_and_seal(self, key, writer.record, a, rows, partitions, directories, start, end)
            return self._sealed(key, version, rows, partitions, start, end)
        files: dict[str, int] = {}
        for dt in partitions:
            mine = [r for r in rows if r[0] == dt]
            directory = directories[dt]
            if not mine:
                writer.declare_partition(directory)  # an empty partition (overwrite: replaced by nothing)
                continue
            # Two files per partition when there are two rows or more: compaction then rewrites them.
            for chunk in (mine[: len(mine) // 2], mine[len(mine) // 2 :]):
                if not chunk:
                    continue
                buf = io.BytesIO()
                # Uncompressed: a value's bytes are in the file as they are, so ``corrupt`` can change
                # one in place (same size) and the model know what a commit that does not re-read
                # the staged bytes publishes.
                pq.write_table(
                    pa.table({"id": pa.array([r[1] for r in chunk], pa.string()),
                              "v": pa.array([r[2] for r in chunk], pa.int64())}), buf, compression="none")  # fmt: skip
                rel = f"{directory}/part-{self._next():05d}.parquet"
                if isinstance(attempt_dir, Path):
                    (attempt_dir / directory).mkdir(parents=True, exist_ok=True)
                    (attempt_dir / rel).write_bytes(buf.getvalue())
                else:  # an object store: as the executors write, one object per file
                    objects = writer.objects
                    with objects.filesystem.open_output_stream(objects.committable(attempt_dir, rel)) as out:
                        out.write(buf.getvalue())
                files[rel] = len(chunk)
        writer.add_files(list(files), rows=files, checksum="crc32", writer="model")
        offsets = {"start_offsets": {"src": start}, "end_offsets": {"src": end}} if start is not None else {}
        writer.seal(file_format="parquet", job="model", **offsets)
        return self._sealed(key, version, rows, partitions, start, end)

    def draw_rows(
        self,
        key: str,
        n: int,
        parts: list[int] | None,
        version: int,
        start: int | None,
        end: int | None,
        *,
        nulls: bool = True,
    ) -> tuple[list[tuple[Any, str, int | None]], list[str], dict[str, str]]:
        """The rows (``(dt, id, v)``) of an attempt of ``key`` at ``version``, its partitions and their
        directories: in append one partition per key and a row per source offset in ``[start,
        end)``; in overwrite the ``parts`` chosen, ``n`` rows in the first and ``n - 1`` in the others."""
        cfg = self.cfg
        rows: list[tuple[Any, str, int | None]] = []
        every = cfg.partitions()
        if cfg.mode == "append":
            # One partition per key: its date, or (widened domain) the key's own domain partition.
            if cfg.domain is None:
                dt = f"{key[:4]}-{key[4:6]}-{key[6:]}"
                directories = {dt: f"dt={dt}"}
            else:
                dt, directory = every[KEYS.index(key)]
                directories = {dt: directory}
            for o in range(start or 0, end or 0):
                v = None if nulls and (o + version) % 3 == 0 else o * 10 + version
                rows.append((dt, f"o{o}", v))
            return rows, [dt], directories
        chosen = [every[i] for i in sorted(set(parts or [0]))]
        partitions = [held for held, _ in chosen]
        for i, dt in enumerate(partitions):
            for _j in range(n if i == 0 else max(0, n - 1)):
                serial = self._next()
                rows.append((dt, f"{key}.{serial}", None if nulls and serial % 3 == 0 else serial))
        return rows, partitions, dict(chosen)

    def _sealed(self, key: str, version: int, rows: list, partitions: list[str], start: Any, end: Any) -> str:
        """The model of the attempt just sealed for ``key``."""
        rec = self.store.require(self.cfg.pipeline, key)
        self.model.attempts[rec.sealed_attempt_id] = Attempt(key, rec.sealed_attempt_id, version, rows,
                                                             partitions, start, end)  # fmt: skip
        how = f", by {self.cfg.spark_write}" if self.cfg.spark_write else ""
        return (
            f"sealed {rec.sealed_attempt_id[:8]} v{version} ({len(rows)} rows, offsets {start}..{end}{how})"
        )

    def op_run(self, key: str, n: int, parts: list[int] | None = None, nulls: bool = True) -> str:
        """A whole DAG run of the interval: write, durability check, commit."""
        wrote = self.op_write(key, n, parts, nulls)
        if wrote.startswith("skipped"):
            return wrote
        return f"{wrote}; {self.op_durable(key)}; {self.op_commit(key)}"

    def op_cancel_write(self, key: str, by: str, n: int = 2, parts: list[int] | None = None) -> str:
        """A write through the write phase with the Spark Connect runner and its attempt watch, ended
        while its job runs by an abort or a newer attempt (``tests/model/spark_write.py``)."""
        from . import spark_write

        return spark_write.cancel_write(self, key, by, n, parts)

    def op_durable(self, key: str, verify: bool = True) -> str:
        """The durability gate; ``verify=False``: sizes only (the sensor's default, no checksums)."""
        from airflow_provider_walsink.triggers.durable import evaluate_durability

        status = evaluate_durability(self.store, self.layout, self.cfg.pipeline, key,
                                     actor=actor("durable", key, self._next()), verify_checksums=verify)  # fmt: skip
        rec = self.store.require(self.cfg.pipeline, key)
        att = self.model.attempts.get(rec.sealed_attempt_id or "")
        if status.durable and att is not None:
            changed = att.tampered if verify else att.tampered - {"same_size"}
            # Only a check that verified the attempt now (one DURABLE already is answered from its row).
            if changed and not rec.is_committed and not att.durable:
                self.notes.append(
                    f"{key}: attempt {att.attempt_id[:8]} verified durable (checksums {verify}) although a "
                    f"staged file was changed after the seal ({', '.join(sorted(changed))})"
                )
            att.durable = True
        return f"durable={status.durable}: {status.message[:120]}"

    def _note_commit(self, result: dict[str, Any]) -> None:
        if result.get("ok") and not result.get("already") and result.get("attempt_id"):
            self.model.new_commits[result["attempt_id"]] += 1

    def _commit_here(self, key: str) -> dict[str, Any]:
        a = actor("commit", key, self._next())
        try:
            s, extra = commit_task(self.cfg, self.store, a.name, key, a)
        except WalsinkError as exc:
            return {"ok": False, "error": type(exc).__name__, "text": str(exc)[:200]}
        result = {"ok": True, "already": s.already_committed, "attempt_id": s.attempt_id}
        self._note_commit(result)
        if self.cfg.kafka:
            from . import kafka

            kafka.after_commit(self, extra.get("kafka_group_offsets"))
        return result

    def _commit_until_done(self, key: str) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for _ in range(MAX_TRIES):
            result = self._commit_here(key)
            if result.get("error") not in ("LeaseHeldError", "TableCommitConflict"):
                return result
            time.sleep(LEASE_TTL.total_seconds() / 2)
        return result

    def op_commit(self, key: str) -> str:
        return json.dumps(self._commit_until_done(key))

    def op_recommit(self, key: str) -> str:
        """A re-run of the commit task (checked: changes nothing if COMMITTED)."""
        rec = self.store.require(self.cfg.pipeline, key)
        if not rec.is_committed:
            return "skipped: not committed"
        return json.dumps(self._commit_here(key))

    def _spawn(self, key: str, point: str | None, stop: bool) -> tuple[Any, str]:
        out = f"{self.cfg.work}/{uuid.uuid4().hex}.out"
        proc = _CHILDREN.Process(target=_child_commit, args=(self.cfg, key, self._next(), point, stop, out))
        proc.start()
        return proc, out

    @staticmethod
    def _result(out: str) -> dict[str, Any]:
        return json.loads(Path(out).read_text()) if os.path.exists(out) else {"ok": False, "error": "killed"}

    def _committed(self, key: str) -> bool:
        rec = self.store.get(self.cfg.pipeline, key)
        return rec is not None and rec.is_committed

    def _ensure_durable(self, key: str, parts: list[int] | None = None) -> str:
        """Write and verify a new attempt (of ``parts``, default both) first unless the checkpoint
        can be committed (or is COMMITTED)."""
        rec = self.store.get(self.cfg.pipeline, key)
        if rec is not None and (rec.state.value in ("DURABLE", "AUDITED", "COMMITTING", "COMMITTED")
                                or (rec.state.value == "FAILED" and rec.durable_at)):  # fmt: skip
            return ""
        wrote = self.op_write(key, 2, parts or [0, 1])
        return f"{wrote}; {self.op_durable(key)}; " if not wrote.startswith("skipped") else f"{wrote}; "

    def op_crash(self, key: str, point: str, retry: bool = True) -> str:
        """A commit try SIGKILLed at ``point`` (if it gets there), then Airflow's retries (unless
        ``retry`` is false: the task is left failed, others act before any retry)."""
        if self.cfg.kafka and point == "kafka.read.after_batch":
            from . import kafka

            return kafka.op_crash_write(self, key, retry)
        first_write = self._ensure_durable(key)
        rec = self.store.get(self.cfg.pipeline, key)
        proc, out = self._spawn(key, point, stop=False)
        proc.join(300)
        killed = proc.exitcode == -signal.SIGKILL
        if killed and not retry and rec is not None and rec.sealed_attempt_id and not rec.is_committed:
            self.model.in_flight[key] = rec.sealed_attempt_id
        first = self._result(out)
        self._note_commit(first)
        if killed:
            self.counts["kills"] += 1
            self.counts[f"kill@{point}"] += 1
            time.sleep(LEASE_TTL.total_seconds() * 1.1)
        retried = json.dumps(self._commit_until_done(key)) if retry else "no retry"
        return f"{first_write}try 1 {'killed' if killed else json.dumps(first)}; retry {retried}"

    def op_unreported(
        self, key: str, fault: str, down: bool = False, group: bool = False, also: list[str] | None = None
    ) -> str:
        """REST catalog (issue 45): the catalog applies the next commit of the table and does not
        report it: it answers 500, 502 or 504, closes the connection (``drop``) or holds the answer
        past the client's time-out (``slow``); with ``down`` it is then down (every request 503)
        until the commit try has ended. The commit runs as a commit step does (a commit task in a
        child process, then Airflow's retries; ``group``: a group commit's leader, as ``group``
        runs it, where the combination groups).

        Besides the checks after every step (each row once, one table commit per attempt, every
        file a snapshot references still on storage): when the fault hit, every checkpoint of the
        step whose attempt the table holds ends COMMITTED (a group's leader may have left itself
        out: a newer checkpoint holds its partition); a single commit, with the catalog up, by the
        try that met the fault (the marker decides); with it down, that try is left uncommitted
        with the unknown outcome recorded, nothing deleted."""
        cfg = self.cfg
        if cfg.catalog != "rest":
            return "skipped: a REST catalog's fault"
        from .rest import SLOW_DELAY, server_of

        server = server_of(cfg.rest_uri or "")
        table = f"m.{cfg.table}"
        grouping = group and cfg.mode == "overwrite" and cfg.fencing == "lease"
        down = down and not grouping  # a group's members are committed by their own tasks at once
        named = [k for k in dict.fromkeys([key, *(also or [])]) if not self._committed(k)]
        if not named or (not grouping and self._committed(key)):
            return "skipped: committed already"
        touched = named if grouping else [key]
        seen = len(server.log)
        server.inject(fault, table=table, delay=SLOW_DELAY, then_down=down)
        first: dict[str, Any] = {}
        try:
            if grouping:
                done = self.op_group(key, None, also, race=False)
            else:
                done = self._ensure_durable(key)
                proc, out = self._spawn(key, None, stop=False)
                proc.join(300)
                first = self._result(out)
                self._note_commit(first)
        finally:
            server.unavailable = False  # the catalog is back (``down``)
            with server.lock:  # a fault no commit met is not left for a later step
                server.faults[:] = [f for f in server.faults if f.table != table]
        hit = any(entry.fault == fault for entry in server.log[seen:])
        self.counts[f"unreported.{fault}" if hit else "unreported.missed"] += 1
        if not grouping:
            if hit and down:
                rec = self.store.require(cfg.pipeline, key)
                self.counts["unreported.undecided"] += 1
                if (
                    first.get("error") != "CommitOutcomeUnknownError"
                    or rec.is_committed
                    or ("Nothing was deleted" not in (rec.error or ""))
                ):
                    self.notes.append(
                        f"{key}: the catalog applied the commit, answered {fault} and went down: the try should be "
                        f"left uncommitted with the unknown outcome recorded, but it said {json.dumps(first)[:300]} "
                        f"and the row is {rec.state.value} ({(rec.error or '')[:200]!r})"
                    )
            elif hit and not first.get("ok"):
                self.notes.append(
                    f"{key}: the catalog applied the commit and answered {fault}: the try did not decide it "
                    f"from the table's marker ({json.dumps(first)[:400]})"
                )
            retried = "" if first.get("ok") else f"; retry {json.dumps(self._commit_until_done(key))}"
            done = f"{done}try {json.dumps({k: v for k, v in first.items() if k != 'text'})[:300]}{retried}"
        for k in touched if hit else []:
            rec = self.store.require(cfg.pipeline, k)
            if not rec.is_committed and self._held_by_target(rec):
                self.notes.append(
                    f"{k}: the catalog applied the commit of its attempt ({fault}{', then down' if down else ''}), "
                    f"but after the commit task and its retries it is {rec.state.value} ({(rec.error or '')[:200]!r})"
                )
        return f"{fault}{' then down' if down else ''} {'met' if hit else 'not met'}: {done}"

    def op_group(
        self, key: str, point: str | None = None, also: list[str] | None = None, race: bool = False
    ) -> str:
        """A committer leading a group commit over whatever checkpoints are durable (issue 24), in a
        child process, SIGKILLed at ``point`` if it gets there; then every checkpoint left COMMITTING
        is committed by its own task (after the dead leader's leases expire: takeover, reconcile).

        ``also``: other checkpoints made durable first, so the group has members (a random
        schedule seldom leaves several durable at once). ``race``: the first of them has its own
        commit task running at the same time as the leader (a real process), as in a parallel
        backfill whose commit tasks start together."""
        if (
            self.cfg.kind not in ("iceberg", "delta")
            or self.cfg.mode != "overwrite"
            or self.cfg.fencing != "lease"
        ):
            return "skipped: group commit is for table targets, overwrite, lease fencing"
        # Of the keys named, those not committed yet (a committed one would only be an answered
        # no-op): the first leads, the others are made durable to join it. Decided on the state,
        # so a replay does the same.
        named = list(dict.fromkeys([key, *(also or [])]))
        open_keys = [k for k in named if not self._committed(k)]
        if not open_keys:
            return f"skipped: {', '.join(named)} committed already"
        key, members = open_keys[0], open_keys[1:]
        # Each in a partition of its own (a group takes disjoint partitions only), so the leader groups
        # every member it can lease, whichever the rival commits. Checkpoints already durable keep
        # what they staged, overlapping or not.
        first_write = self._ensure_durable(key, [0]) + "".join(
            self._ensure_durable(k, [i + 1]) for i, k in enumerate(members)
        )
        out = f"{self.cfg.work}/{uuid.uuid4().hex}.out"
        proc = _CHILDREN.Process(target=_child_group_commit, args=(self.cfg, key, self._next(), point, out))
        proc.start()
        rival = self._spawn(members[0], None, stop=False) if race and members else None
        proc.join(300)
        rival_result: dict[str, Any] | None = None
        if rival is not None:
            rival[0].join(300)
            rival_result = self._result(rival[1])
            self._note_commit(rival_result)
            self.counts["group.rivals"] += 1
        killed = proc.exitcode == -signal.SIGKILL
        result = self._result(out)
        if result.get("ok") and not result.get("already"):
            for aid in result.get("group", {}).values():
                self.model.new_commits[aid] += 1
            self.counts["group.members"] += len(result.get("group", {}))
        if killed:
            self.counts["kills"] += 1
            self.counts[f"kill@{point}"] += 1
            time.sleep(LEASE_TTL.total_seconds() * 1.1)
        own = {}
        for k in KEYS:  # the members' own commit tasks
            rec = self.store.get(self.cfg.pipeline, k)
            if rec is not None and rec.state.value == "COMMITTING":
                own[k] = self._commit_until_done(k)
        told = "killed" if killed else json.dumps({k: v for k, v in result.items() if k != "text"})
        rival_told = f"; rival {json.dumps(rival_result)}" if rival_result is not None else ""
        return f"{first_write}leader {told}{rival_told}; own tasks {json.dumps(own)}"

    def op_race(self, key: str) -> str:
        """Two commit tasks of one checkpoint at once (real processes)."""
        first_write = self._ensure_durable(key)
        procs = [self._spawn(key, None, stop=False) for _ in range(2)]
        results = []
        for proc, out in procs:
            proc.join(300)
            results.append(self._result(out))
            self._note_commit(results[-1])
        return first_write + json.dumps(results)

    def op_pause(self, key: str, point: str, then: str) -> str:
        """A committer SIGSTOPped at ``point`` past its lease; meanwhile ``then`` runs; then SIGCONT."""
        first_write = self._ensure_durable(key)
        proc, out = self._spawn(key, point, stop=True)
        while proc.is_alive() and _proc_state(proc.pid) != "T":
            time.sleep(0.01)
        if not proc.is_alive():
            first = self._result(out)
            self._note_commit(first)
            return f"{first_write}never paused: {json.dumps(first)}"
        self.counts["pauses"] += 1
        time.sleep(LEASE_TTL.total_seconds() * 1.2)
        try:
            if then == "abort":
                meanwhile = self.op_abort(key)
            elif then == "rerun":
                # The next key commits (in a partition of its own), retention trims this row (COMMITTED
                # by the paused committer; retention keeps the newest committed one), and the key is
                # re-run up to its durability check: the paused clean-up must leave that attempt alone.
                later = ""
                for k in [k for k in KEYS if k > key][:1]:
                    later = f"run {k}: {self.op_run(k, 1, [2])}; "
                # The model sees what committed before retention trims it, and that retention trimmed
                # it (only once the paused committer recorded COMMITTED: mid-publish, its partial
                # publish is the step's to finish).
                observe = self._committed(key)
                if observe:
                    self._observe()
                trimmed = self.op_retention()
                if observe:
                    self._observe()
                rerun = self.op_write(key, 1, [0, 1])
                meanwhile = f"{later}retention: {trimmed}; re-run: {rerun}"
                if not rerun.startswith("skipped"):
                    meanwhile += "; " + self.op_durable(key)
            elif then == "paused_commit":
                # A second committer takes the lease over and stops at the same point; the first is
                # resumed while the second is still mid-publish, then the second.
                other, other_out = self._spawn(key, point, stop=True)
                while other.is_alive() and _proc_state(other.pid) != "T":
                    time.sleep(0.01)
                if other.is_alive():
                    self.counts["pauses.second"] += 1
                    os.kill(proc.pid, signal.SIGCONT)
                    proc.join(300)
                    time.sleep(LEASE_TTL.total_seconds() * 0.2)
                    try:
                        os.kill(other.pid, signal.SIGCONT)
                    except ProcessLookupError:
                        pass
                other.join(300)
                second = self._result(other_out)
                self._note_commit(second)
                meanwhile = f"second committer: {json.dumps(second)[:200]}"
            elif then == "reprocess":
                meanwhile = self.op_reprocess(key, n=2)
                if not meanwhile.startswith("skipped"):
                    self.op_durable(key)
                    meanwhile += "; " + json.dumps(self._commit_until_done(key))
            else:
                meanwhile = json.dumps(self._commit_until_done(key))
        except WalsinkError as exc:
            meanwhile = f"refused: {type(exc).__name__}: {str(exc)[:160]}"
        finally:
            if not resume(proc):
                self.counts["pauses.resumed_early"] += 1  # something else resumed it (see _child_commit)
        resumed = self._result(out)
        self._note_commit(resumed)
        after = ""
        if then == "rerun":
            gone = self._sealed_there(key, self.store.get(self.cfg.pipeline, key))
            rec = self.store.get(self.cfg.pipeline, key)
            if gone and rec is not None and not rec.is_committed:
                self.notes.append(
                    f"{key}: the re-run's sealed attempt {(rec.sealed_attempt_id or '')[:8]} lost its staging while a "
                    f"paused committer's clean-up resumed: {gone}"
                )
            after = "; then " + json.dumps(self._commit_until_done(key))
        return f"{first_write}meanwhile {then}: {meanwhile}; resumed: {json.dumps(resumed)[:300]}{after}"

    def op_abort_race(self, key: str) -> str:
        """An abort racing a commit task of the same checkpoint (a real process, started together)."""
        first_write = self._ensure_durable(key)
        proc, out = self._spawn(key, None, stop=False)
        try:
            aborted = self.op_abort(key)
        except WalsinkError as exc:
            aborted = f"refused: {type(exc).__name__}: {str(exc)[:160]}"
        finally:
            proc.join(300)
        committed = self._result(out)
        self._note_commit(committed)
        return f"{first_write}abort: {aborted}; commit: {json.dumps(committed)[:300]}"

    def op_abort(self, key: str) -> str:
        rec = self.store.require(self.cfg.pipeline, key)
        aborter = CheckpointAborter(self.store, self.layout, self.cfg.publisher(self.layout), grace=ABORT_GRACE,
                                    lease_ttl=LEASE_TTL)  # fmt: skip
        outcome = aborter.abort(
            self.cfg.pipeline, key, reason="model: abort", actor=actor("abort", key, self._next())
        )
        if outcome.state == "ABORTED" and rec.attempt_id:
            self.model.aborted.add(rec.attempt_id)
            if rec.sealed_attempt_id:
                self.model.aborted.add(rec.sealed_attempt_id)
        elif rec.supersedes_attempt_id and rec.attempt_id:  # an abandoned new version
            self.model.aborted.add(rec.attempt_id)
            chain = self.model.reprocessing.get(key)
            if chain:
                chain.pop()  # the version it would have replaced stays committed
                if not chain:
                    del self.model.reprocessing[key]
        self.counts["aborts.done"] += 1
        return f"{outcome.state}"

    def op_reprocess(self, key: str, n: int = 2) -> str:
        """``replace``: a new version of a committed checkpoint, written and sealed (durable and commit follow)."""
        rec = self.store.require(self.cfg.pipeline, key)
        if not rec.is_committed:
            return "skipped: not committed"
        self.store.begin_version(self.cfg.pipeline, key, token=f"model/{key}#{self._next()}",
                                 actor=actor("reprocess", key, self._next()), reason="model reprocess")  # fmt: skip
        self.model.reprocessing.setdefault(key, []).append(rec.sealed_attempt_id)
        self.counts["reprocesses.begun"] += 1
        return "new version; " + self.op_write(key, n, parts=[0, 1])

    def op_retention(self) -> str:
        from airflow_provider_walsink.core.commit.gc import trim_committer_table

        report = trim_committer_table(self.store, retention=timedelta(0))
        return f"rows deleted {report.rows_deleted}"

    def op_gc(self) -> str:
        from airflow_provider_walsink.core.commit.gc import collect_staging

        if isinstance(self.layout, StagingStore):
            # The connection's (local) root holds nothing; the checkpoints' recorded root on the
            # object store is walked through the store, opened with the emulator's options.
            options = self.cfg.store_options()
            report = collect_staging(self.store, StagingLayout(f"{self.cfg.work}/staging"), retention=timedelta(0),
                                     stores=lambda root: StagingStore.open(root, options))  # fmt: skip
        else:
            report = collect_staging(self.store, self.layout, retention=timedelta(0))
        return report.describe()[:200]

    def op_maintain(self, action: str) -> str:
        """Table maintenance between runs (Delta: compact/checkpoint/cleanup/vacuum; Iceberg: rewrite/expire)."""
        kind = self.cfg.kind
        if kind == "delta":
            table = self.cfg.publisher(self.layout).load_table()  # on S3: through its storage options
            if table is None:
                return "skipped: no table"
            if action == "compact":
                return str(table.optimize.compact())[:120]
            if action == "checkpoint":
                table.create_checkpoint()
                return "checkpoint"
            if action == "cleanup":
                table.cleanup_metadata()
                return "cleanup"
            return str(table.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False))[:120]
        if kind == "iceberg":
            table = self.cfg.publisher(self.layout).load_table()
            if table is None:
                return "skipped: no table"
            if action == "compact":  # a rewrite of the same rows into new files
                data = table.scan().to_arrow()
                if len(data) == 0:
                    return "skipped: empty"
                table.overwrite(data)
                return f"rewrote {len(data)} rows"
            from datetime import datetime

            current = table.current_snapshot()
            if current is None:
                return "skipped: no snapshot"
            # Every snapshot but the current one (expiry keeps the current snapshot).
            table.maintenance.expire_snapshots().older_than(
                datetime.fromtimestamp(current.timestamp_ms / 1000, tz=UTC)
            ).commit()
            return f"expired snapshots older than {current.snapshot_id}"
        return "skipped: no maintenance for this target"

    def op_symlink(self, key: str) -> str:
        """Hostile: a staged file of the sealed attempt becomes a symlink to a same-content file outside staging."""
        if self.cfg.staging != "local":
            return "skipped: an object store has no symlinks"  # not drawn for S3 (machine.py); replays
        rec = self.store.get(self.cfg.pipeline, key)
        if rec is None or not rec.is_committed:
            self._ensure_durable(key)  # a sealed, verified attempt to tamper with
        rec = self.store.require(self.cfg.pipeline, key)
        if rec.sealed_attempt is None or rec.is_committed:
            return "skipped: nothing staged"
        attempt_dir = self.layout.attempt_dir(
            self.cfg.pipeline, key, rec.sealed_attempt, rec.sealed_attempt_id
        )
        files = sorted(attempt_dir.rglob("*.parquet")) if attempt_dir.exists() else []
        if not files:
            return "skipped: no staged file"
        # A table that already references the file (a commit killed after its table commit) read it
        # in place and keeps reading it there, as it reads its own data files: changing it now is
        # tampering with the table, which no staging check can stop. Only a file not yet in the
        # target must never be published.
        published = self._in_table(files[0].parent, files[0].name)
        outside = Path(self.cfg.work) / "outside" / uuid.uuid4().hex
        outside.parent.mkdir(exist_ok=True)
        outside.write_bytes(files[0].read_bytes())
        files[0].unlink()
        files[0].symlink_to(outside)
        if published:
            self.counts["symlinks.after_table_commit"] += 1
            return f"swapped {files[0].name}, which the table already references"
        if rec.sealed_attempt_id in self.model.attempts:
            self.model.attempts[rec.sealed_attempt_id].poisoned = True
        self.counts["symlinks"] += 1
        return f"swapped {files[0].name}"

    def _staged_files(self, key: str) -> tuple[Any, list[Path]]:
        """The sealed, uncommitted attempt of ``key`` (written and sealed first if none) and its staged files."""
        rec = self.store.get(self.cfg.pipeline, key)
        if rec is None or not (rec.is_committed or rec.sealed_attempt is not None):
            self.op_write(key, 2, [0, 1])
        rec = self.store.require(self.cfg.pipeline, key)
        if rec.sealed_attempt is None or rec.is_committed or isinstance(self.layout, StagingStore):
            return rec, []  # an object store: no local files (op_reseal reads it through the store)
        attempt_dir = self.layout.attempt_dir(
            self.cfg.pipeline, key, rec.sealed_attempt, rec.sealed_attempt_id
        )
        return rec, sorted(attempt_dir.rglob("*.parquet")) if attempt_dir.exists() else []

    def op_tamper(self, key: str, how: str = "truncate") -> str:
        """Hostile: a staged file of the sealed attempt is changed after the seal: ``truncate``d,
        ``extend``ed, or rewritten with the ``same_size`` (other bytes); or its ``manifest`` rewritten. A durability check after it
        must refuse the attempt (sizes alone find the first two, checksums the third), and no commit
        may publish it (the model's commits verify checksums)."""
        if self.cfg.staging != "local":
            return "skipped: local staging only"
        rec, files = self._staged_files(key)
        if not files:
            return "skipped: nothing staged"
        if how == "manifest":
            return self._tamper_manifest(key, rec)
        target = files[-1]
        published = self._in_table(target.parent, target.name)
        if published:  # the table reads it in place already (see op_symlink): tampering with the table
            return "skipped: the table already references it"
        verified = self.cfg.verify_checksums
        if not verified and how != "same_size" and rec.state.value not in ("SEALED", "WRITING"):
            # Without verify_checksums the commit re-reads nothing the durability gate checked: a
            # staged file whose size changes after the gate is outside that contract (the model
            # does not draw it; ``corrupt`` is the same-size change it does expect published).
            return "skipped: a size change after durability with verify_checksums off"
        data = target.read_bytes()
        att = self.model.attempts.get(rec.sealed_attempt_id or "")
        flipped = None
        if how == "truncate":
            changed = data[: len(data) // 2]
        elif how == "extend":
            changed = data + b"\0" * 16
        else:  # same size, other bytes: a value's bytes changed in place (see flip_a_value)
            flipped = flip_a_value(data)
            if flipped is None and not verified:
                return "skipped: no value to change in place"
            if flipped is None:  # a byte of the data pages flipped
                i = len(data) // 2
                changed = data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1 :]
            else:
                changed = flipped[0]
        held = self._held_by_target(rec)
        target.write_bytes(changed)
        if att is not None and held:  # published already: the target holds the bytes as they were
            self.counts["tamper.held"] += 1
        elif att is not None:
            att.tampered.add(how)
            if flipped is not None and not verified:
                self._corrupted_rows(att, flipped[1], flipped[2])  # published as changed, if committed
            else:
                att.poisoned = True
        self.counts[f"tamper.{how}"] += 1
        if rec.state.value in ("SEALED", "WRITING"):
            # Before the durability gate: sizes alone must find a size change; checksums the rest.
            return f"{how} {target.name}; {self.op_durable(key, verify=how == 'same_size')}"
        return f"{how} {target.name} (attempt {rec.state.value})"

    def _in_table(self, where: Any, name: str) -> bool:
        """Whether the table (Iceberg, Delta) references the staged file ``name`` of the attempt
        whose directory (or object prefix) ``where`` names: by its attempt directory and file name,
        which the model makes unique (the table's URIs may be percent-encoded)."""
        if self.cfg.kind not in ("iceberg", "delta"):
            return False
        from urllib.parse import unquote

        attempt = next(p for p in reversed(str(where).split("/")) if p.startswith("attempt-"))
        file = name.rsplit("/", 1)[-1]
        return any(
            f"/{attempt}/" in unquote(f) and unquote(f).endswith(f"/{file}") for f in self.data_files()
        )

    def _held_by_target(self, rec: Any) -> bool:
        """Whether the target already holds ``rec``'s sealed attempt (a commit killed after its table
        commit or SQL transaction, not retried yet): a retry publishes nothing again, so a change to
        the staged bytes after that changes nothing the target shows (Iceberg, Delta, SQL record it)."""
        if self.cfg.kind not in ("iceberg", "delta", "sql") or rec.sealed_attempt is None:
            return False
        from airflow_provider_walsink.core.staging.resolve import as_store

        staging = as_store(self.layout)
        location = staging.attempt(
            self.cfg.pipeline, rec.checkpoint_key, rec.sealed_attempt, rec.sealed_attempt_id
        )
        manifest = staging.read_manifest(location, expected_digest=rec.manifest_digest)
        return self.cfg.publisher(self.layout).published_attempt(manifest) == rec.sealed_attempt_id

    def _corrupted_rows(self, att: Attempt, old: str, new: str) -> None:
        """The model of an attempt whose staged value ``old`` became ``new`` (verify_checksums off:
        what a commit publishes)."""
        att.rows = [(p, new if i == old else i, v) for p, i, v in att.rows]

    def op_corrupt(self, key: str, resize: bool = False) -> str:
        """Hostile: after the durability gate, a staged committable of the checkpoint's sealed attempt
        has a value's bytes changed in place with its size unchanged (:func:`flip_a_value`; a local
        file written in place, an object on S3 put again with as many bytes), which no size check
        can see; then the commit task runs.

        ``verify_checksums`` on: the commit must refuse it before anything is published
        (``ChecksumMismatchError``): the checkpoint stays uncommitted with that error recorded, the
        target unchanged; the attempt is never to be published (a later commit refuses it again).
        Off: by design nothing re-reads staged bytes after the gate, so the commit publishes the
        committable as it is, once: the model expects the changed value, exactly once, and every
        other invariant as usual. ``resize`` (``storage_ops.op_resize``): other bytes and another size."""
        cfg = self.cfg
        if cfg.kafka:
            return "skipped: the Kafka invariants compare rows with the topic's records"
        first = self._ensure_durable(key)
        rec = self.store.get(cfg.pipeline, key)
        if rec is None or rec.is_committed or rec.durable_at is None or rec.sealed_attempt is None:
            return f"{first}skipped: not durable"
        att = self.model.attempts.get(rec.sealed_attempt_id or "")
        if att is None:
            return f"{first}skipped: an attempt the model did not write"
        from airflow_provider_walsink.core.staging.resolve import as_store

        staging = as_store(self.layout)
        location = staging.attempt(cfg.pipeline, key, rec.sealed_attempt, rec.sealed_attempt_id)
        manifest = staging.read_manifest(location, expected_digest=rec.manifest_digest)
        # A commit killed after the target published the attempt (a table commit, an SQL transaction),
        # and the table compacted since (so its files are no longer the staged ones): the target
        # holds the attempt as it was; the retry must record that, whatever the staged bytes are now.
        held = self._held_by_target(rec)
        done = None
        for c in reversed(manifest.committables):
            try:
                path = str(staging.committable(location, c.path))
                if self._in_table(path, c.path):
                    continue  # the table reads it in place already (a commit killed after its table commit)
                with staging.filesystem.open_input_stream(path) as f:
                    data = f.read()
            except (OSError, WalsinkError):
                continue  # moved into the target already (the file target), or swapped for a symlink
            flipped = resized(data) if resize else flip_a_value(data)
            if flipped is None:
                continue
            changed, old, new = flipped
            if staging.layout is not None and resize:
                Path(path).write_bytes(changed)
            elif staging.layout is not None:  # in place: only the changed bytes are written
                with open(path, "r+b") as f:
                    for i, (a, b) in enumerate(zip(data, changed, strict=True)):
                        if a != b:
                            f.seek(i)
                            f.write(bytes([b]))
            else:
                with staging.filesystem.open_output_stream(path) as out:
                    out.write(changed)
            done = (c.path, old, new)
            break
        if done is None:
            return f"{first}skipped: no staged value to change"
        if held:
            self.counts["corrupt.held"] += 1
        elif cfg.verify_checksums:
            att.tampered.add("resized" if resize else "same_size")
            att.poisoned = True
        else:
            att.tampered.add("same_size")
            self._corrupted_rows(att, done[1], done[2])
        self.counts["corrupt.verified" if cfg.verify_checksums else "corrupt.unverified"] += 1
        result = self._commit_until_done(key)
        now = self.store.require(cfg.pipeline, key)
        if held and not now.is_committed:
            self.notes.append(
                f"{key}: the target holds attempt {att.attempt_id[:8]} (a commit killed after publishing it), "
                f"but the retry left it {now.state.value} ({json.dumps(result)[:300]}): it can never commit"
            )
        elif cfg.verify_checksums and result.get("error") == "ChecksumMismatchError":
            self.counts["corrupt.refused"] += 1
            if now.is_committed or not now.error or "staged bytes changed" not in now.error:
                self.notes.append(
                    f"{key}: a commit refused attempt {att.attempt_id[:8]} for its checksum, but the row is "
                    f"{now.state.value} with error {now.error!r} (uncommitted, the error recorded)"
                )
        elif cfg.verify_checksums and resize and result.get("error") == "CommittableError":
            self.notes.append(
                f"{key}: attempt {att.attempt_id[:8]}'s staged {done[0]} changed bytes and size after durability: "
                f"verify_checksums let it through to the publisher, which refused it ({json.dumps(result)[:300]})"
            )
        elif cfg.verify_checksums and result.get("ok") and not held:
            self.notes.append(
                f"{key}: attempt {att.attempt_id[:8]} committed with verify_checksums although {done[0]} "
                f"changed after the durability gate ({json.dumps(result)})"
            )
        changed_text = f"{done[1]}->{done[2]} in {done[0].rsplit('/', 1)[-1]}"
        return f"{first}changed {changed_text}; commit {json.dumps(result)[:300]}"

    def _tamper_manifest(self, key: str, rec: Any) -> str:
        """The sealed manifest rewritten in place with another (same committables, other partitions or
        offsets): every reader must refuse it (its digest is not the recorded one), so the attempt is
        never published."""
        from airflow_provider_walsink.core.protocol.manifest import (
            MANIFEST_NAME,
            read_manifest,
            write_manifest,
        )

        path = (
            self.layout.attempt_dir(self.cfg.pipeline, key, rec.sealed_attempt, rec.sealed_attempt_id)
            / MANIFEST_NAME
        )
        if not path.exists():
            return "skipped: no manifest"
        sealed = read_manifest(path)
        # Counts and totals stay (they are recorded on the row too); what it would publish changes:
        # overwrite replaces every partition of the schedule; append claims more source offsets.
        if self.cfg.mode == "overwrite":
            every = tuple(d for _, d in self.cfg.partitions())
            changed = replace(sealed, partitions=tuple(dict.fromkeys((*sealed.partitions, *every))))
        elif sealed.end_offsets:
            changed = replace(sealed, end_offsets=_offsets_moved_on(sealed.end_offsets))
        else:
            changed = replace(sealed, job="tampered")
        write_manifest(path, changed)
        att = self.model.attempts.get(rec.sealed_attempt_id or "")
        if att is not None:
            att.poisoned = True
            att.tampered.add("manifest")
        self.counts["tamper.manifest"] += 1
        if rec.state.value in ("SEALED", "WRITING"):
            return f"manifest rewritten; {self.op_durable(key, verify=False)}"
        return f"manifest rewritten (attempt {rec.state.value})"

    def op_reseal(self, key: str) -> str:
        """Hostile: a second seal of the sealed attempt with another manifest (a zombie or speculative
        driver of the same attempt, one committable fewer) through the job's seal and the committer
        table. Both must refuse it: the sealed manifest and the recorded digest stay."""
        from airflow_provider_walsink.core.protocol.manifest import MANIFEST_NAME
        from airflow_provider_walsink.core.staging.resolve import as_store

        rec, _ = self._staged_files(key)
        if rec.sealed_attempt is None or rec.is_committed or rec.manifest_digest is None:
            return "skipped: nothing sealed"
        staging = as_store(self.layout)
        location = staging.attempt(self.cfg.pipeline, key, rec.sealed_attempt, rec.sealed_attempt_id)
        if staging.describe(location, MANIFEST_NAME) is None:
            return "skipped: no manifest"
        sealed = staging.read_manifest(location, expected_digest=rec.manifest_digest)
        # The zombie's manifest: one committable fewer (or, with none, another job name).
        other = replace(sealed, committables=sealed.committables[:-1], job="zombie")
        told = []
        for name, call in (
            ("seal", lambda: staging.seal(location, other)),
            ("record", lambda: self.store.seal_manifest(other, manifest_uri=rec.manifest_uri or "",
                                                        manifest_digest="zombie-" + rec.manifest_digest,
                                                        actor=actor("reseal", key, self._next()))),
        ):  # fmt: skip
            try:
                call()
                told.append(f"{name} accepted")
            except (WalsinkError, OSError) as exc:
                told.append(f"{name} refused ({type(exc).__name__})")
        now = self.store.require(self.cfg.pipeline, key)
        if now.manifest_digest != rec.manifest_digest or now.sealed_attempt_id != rec.sealed_attempt_id:
            self.notes.append(
                f"{key}: a second seal of attempt {rec.sealed_attempt_id} changed its recorded seal"
            )
        try:
            staging.read_manifest(location, expected_digest=rec.manifest_digest)
        except (WalsinkError, OSError) as exc:
            self.notes.append(
                f"{key}: after a second seal of attempt {(rec.sealed_attempt_id or '')[:8]} its sealed manifest "
                f"no longer reads with the recorded digest: {type(exc).__name__}: {str(exc)[:160]}"
            )
        self.counts["reseals"] += 1
        return "; ".join(told) or "skipped: manifest not rebuildable"

    def op_compact_reprocess(self, key: str, n: int = 2) -> str:
        """Composite: table maintenance rewrites the table's files, then a ``replace`` reprocess of
        ``key`` is written, checked and committed (it must retract the old version once or refuse)."""
        if self.cfg.kind not in ("iceberg", "delta"):
            return "skipped: no compaction for this target"
        if not self._committed(key):
            return "skipped: not committed"
        compacted = self.op_maintain("compact")
        wrote = self.op_reprocess(key, n)
        if wrote.startswith("skipped"):
            return f"{compacted}; {wrote}"
        return f"{compacted}; {wrote}; {self.op_durable(key)}; {self.op_commit(key)}"

    def op_crash_rerun(self, key: str, point: str, n: int = 1) -> str:
        """Composite: a commit SIGKILLed at ``point`` and not retried, a run of the next key, retention,
        then a re-run of the key with other data (``n`` rows): a reconcile must record what the target holds."""
        crashed = self.op_crash(key, point, retry=False)
        # A later key commits first, so retention may trim this one's row (it keeps the newest committed).
        later = [k for k in KEYS if k > key][:1]
        then = "".join(f"; run {k}: {self.op_run(k, 1, [1])}" for k in later)
        self._observe()
        trimmed = self.op_retention()
        self._observe()
        return f"{crashed}{then}; retention: {trimmed}; re-run: {self.op_run(key, n, [0, 1])}"

    def _observe(self) -> None:
        """Check (and advance) the model in the middle of a composite step, as after a step: what
        committed so far is then known to the model before retention trims its row."""
        self.notes = self.check()

    def _sealed_there(self, key: str, rec: Any) -> str | None:
        """Why the sealed attempt of ``rec`` (uncommitted) is not in staging any more, or None."""
        from airflow_provider_walsink.core.protocol.manifest import MANIFEST_NAME

        if self.cfg.staging != "local" or rec is None or rec.sealed_attempt is None:
            return None
        attempt_dir = self.layout.attempt_dir(
            self.cfg.pipeline, key, rec.sealed_attempt, rec.sealed_attempt_id
        )
        if not (attempt_dir / MANIFEST_NAME).exists():
            return f"{attempt_dir.name}/{MANIFEST_NAME} is gone"
        return None

    # ------------------------------------------------------------------ reading back

    def rows(self) -> list[tuple[Any, str, int | None]]:
        """Every row the target holds, as (partition, id, v), sorted: the partition is the ``dt``
        text, or (widened domain) the ``(k, t)`` values read back, NULL as None."""
        cfg = self.cfg
        wide = cfg.domain is not None
        columns = cfg.columns
        if cfg.kind == "files":
            from airflow_provider_walsink.core.protocol.partitions import partition_value

            root = Path(cfg.work) / "target"
            found = []
            for path in sorted(root.rglob("*.parquet")) if root.exists() else []:
                rel = path.relative_to(root).parts
                if any(p.startswith(("_", ".")) for p in rel):
                    continue
                if wide:  # the Hive directories, unescaped as Spark reads them back
                    dt: Any = tuple(partition_value(p.split("=", 1)[1]) for p in rel[: len(columns)])
                else:
                    dt = rel[0].removeprefix("dt=")
                t = pq.read_table(path)
                found += [(dt, i, v) for i, v in zip(t["id"].to_pylist(), t["v"].to_pylist(), strict=True)]
            return sorted(found, key=repr)
        if cfg.kind == "sql":
            from sqlalchemy import column, create_engine, inspect, select, table

            engine = create_engine(cfg.sql_url)
            try:
                if not inspect(engine).has_table(cfg.table, schema=cfg.sql_schema):
                    return []
                with engine.connect() as conn:
                    got = conn.execute(
                        select(*(column(c) for c in columns), column("id"), column("v")).select_from(
                            table(cfg.table, schema=cfg.sql_schema)
                        )
                    ).all()
            finally:
                engine.dispose()
            n = len(columns)
            return sorted(
                ((tuple(None if x is None else str(x) for x in r[:n]) if wide else str(r[0]), str(r[n]),
                  None if r[n + 1] is None else int(r[n + 1])) for r in got),
                key=repr,
            )  # fmt: skip
        t = cfg.publisher(self.layout).load_table()
        if t is None:
            return []
        arrow = t.scan().to_arrow() if cfg.kind == "iceberg" else t.to_pyarrow_table()
        held = zip(*(arrow[c].to_pylist() for c in columns), strict=True) if wide else arrow["dt"].to_pylist()
        return sorted(zip(held, arrow["id"].to_pylist(), arrow["v"].to_pylist(), strict=True), key=repr)

    def data_files(self) -> list[str]:
        """The URIs of the data files the table's current state references."""
        t = self.cfg.publisher(self.layout).load_table()
        if t is None:
            return []
        if self.cfg.kind == "iceberg":
            return [task.file.file_path for task in t.scan().plan_files()]
        return list(t.file_uris())

    def _iceberg_history(self) -> list[str]:
        """Iceberg, over every snapshot the table keeps (not only the current one, which the rows
        are read from): each data file a snapshot references is still on storage (a clean-up after
        a commit whose outcome was unknown deletes what a snapshot references), and each attempt
        was added by one table commit at most (a retry that commits an attempt again adds its
        files twice; in ``overwrite`` that replaces them, so the rows alone would not show it)."""
        t = self.cfg.publisher(self.layout).load_table()
        if t is None:
            return []
        problems: list[str] = []
        commits: Counter = Counter()
        checked: set[str] = set()
        missing: list[str] = []
        for snapshot in t.snapshots():
            summary = snapshot.summary
            if summary is not None:
                if summary.get("walsink.attempt-id"):
                    commits[summary.get("walsink.attempt-id")] += 1
                for k, v in summary.additional_properties.items():
                    if k.startswith("walsink.group.") and v.startswith("{"):
                        commits[json.loads(v)["attempt_id"]] += 1
            for listed in snapshot.manifests(t.io):
                for entry in listed.fetch_manifest_entry(t.io, discard_deleted=False):
                    path = entry.data_file.file_path
                    if path not in checked:
                        checked.add(path)
                        if not t.io.new_input(path).exists():
                            missing.append(path)
        if missing:
            problems.append(f"data files a snapshot references are gone from storage: {sorted(missing)[:3]}")
        for aid, n in commits.items():
            if n > 1:
                key = self.model.attempts[aid].key if aid in self.model.attempts else "?"
                problems.append(f"attempt {aid[:8]} ({key}) was added by {n} table commits")
        return problems

    def _outside_the_prefix(self) -> list[str]:
        """An object store: a table committed by reference references only objects under the
        schedule's prefix."""
        inside = f"{self.cfg.bucket_root}/"
        outside = [f for f in self.data_files() if not f.startswith(inside)]
        return [f"the table references data files outside {inside}: {outside[:3]}"] if outside else []

    # ------------------------------------------------------------------ the check

    def check(self) -> list[str]:
        """Compare the target and the committer table with the model; update the model; the violations."""
        m, cfg, problems = self.model, self.cfg, list(self.notes)
        self.notes.clear()
        present = {k: self.store.get(cfg.pipeline, k) for k in KEYS}
        for key in KEYS:
            rec = present.get(key)
            if rec is None:
                if key in m.committed:
                    m.trimmed.add(key)
                continue
            aid = rec.sealed_attempt_id if rec.is_committed else None
            if aid is None and rec.supersedes_attempt_id:
                # A new version under way: the committed version (in the version table) is what
                # readers see; it may have committed within the same step that began the new one.
                aid = rec.supersedes_attempt_id
            if aid is None:
                continue
            old = m.committed.get(key)
            att = m.attempts.get(aid)
            if att is None:
                problems.append(f"{key} is COMMITTED with attempt {aid}, which the model never sealed")
                continue
            if cfg.mode == "append" and att.end is not None and rec.is_committed:
                want = rec.end_offsets.get("src") if rec.end_offsets else None
                if want != att.end:
                    problems.append(
                        f"{key}: the committer row says end offsets {rec.end_offsets}, but the committed "
                        f"attempt {aid[:8]} read up to {att.end}"
                    )
            if old == aid:
                m.trimmed.discard(key)
                continue
            if aid in m.aborted:
                problems.append(f"{key} is COMMITTED with attempt {aid[:8]}, which was ABORTED")
            if att.poisoned:
                problems.append(
                    f"{key} is COMMITTED with attempt {aid[:8]}, whose staged file is a symlink or was "
                    "changed after the seal"
                )
            if not att.durable:
                problems.append(f"{key} is COMMITTED with attempt {aid[:8]}, never verified durable")
            chain = m.reprocessing.get(key, [])
            superseding = old is not None and old in chain
            if old is not None and not superseding and key not in m.trimmed:
                problems.append(
                    f"{key}'s committed attempt changed from {old[:8]} to {aid[:8]} without a reprocess"
                )
            if superseding:
                # Every version the chain replaced, the ones committed and replaced within this step too.
                for between in chain[chain.index(old) :]:
                    if between == aid:
                        continue
                    if between != old and (between in m.aborted or not m.attempts[between].durable):
                        problems.append(
                            f"{key}: version attempt {between[:8]} was committed (a reprocess replaced it) "
                            "but was aborted or never verified durable"
                        )
                    m.superseded.add(between)
                m.reprocessing.pop(key, None)
            rerun_replaces = False
            if key in m.trimmed and old is not None and old != aid:
                # A re-run after retention committed a new attempt: in overwrite it replaces the old
                # one, all of it (the table's marker names it: core/targets/_tables.py, decide);
                # in append it read new offsets and the old rows stay.
                if cfg.mode == "append":
                    m.retired.append(old)
                else:
                    m.superseded.add(old)
                    rerun_replaces = True
            m.trimmed.discard(key)
            m.committed[key] = aid
            if cfg.mode == "overwrite":
                if superseding or rerun_replaces:
                    # A new version (or a re-run the table tells from the old attempt) holds the
                    # interval alone: the replaced attempt's partitions that the new one does not
                    # write are emptied (docs/backfill.md, targets.md).
                    for p, owner in list(m.owners.items()):
                        if owner == old and p not in att.partitions:
                            del m.owners[p]
                for p in att.partitions:
                    owner = m.owners.get(p)
                    if (owner is None or att.version > 1 or owner == old
                            or key >= m.attempts[owner].key):  # fmt: skip
                        m.owners[p] = aid
        for key in KEYS:
            rec = present.get(key)
            if rec is None or rec.state.value not in ("SEALED", "DURABLE"):
                continue
            att = m.attempts.get(rec.sealed_attempt_id or "")
            gone = self._sealed_there(key, rec) if att is not None and not att.poisoned else None
            if gone:
                problems.append(
                    f"{key} is {rec.state.value} with attempt {rec.sealed_attempt_id[:8]}, but {gone}"
                )
        for key, aid in list(m.in_flight.items()):
            rec = present.get(key)
            if rec is None or rec.is_committed or rec.state.value == "ABORTED" or aid in m.aborted:
                del m.in_flight[key]
        if cfg.kafka:
            from . import kafka

            problems += kafka.check(self)
        # Offsets contiguous: each committed append checkpoint starts where the previous one ended.
        elif cfg.mode == "append":
            live = [m.attempts[a] for a in [*m.committed.values(), *m.retired]]
            at = 0
            for att in sorted(live, key=lambda a: (a.start, a.end)):
                if att.start != at:
                    problems.append(
                        f"offsets not contiguous: {att.key} starts at {att.start}, previous ended at {at}"
                    )
                at = att.end
        # Asset events: one per new commit.
        for aid, n in m.new_commits.items():
            if n > 1:
                problems.append(
                    f"attempt {aid[:8]} ({m.attempts[aid].key}) reported as a new commit {n} times"
                )
        # What must be visible.
        if cfg.mode == "append":
            expected = [r for a in [*m.committed.values(), *m.retired] for r in m.attempts[a].rows]
        else:
            expected = [r for p, a in m.owners.items() for r in m.attempts[a].rows if r[0] == p]
        expected += self.people_check(problems)  # approvals, deadlines, partition keys (people.py)
        try:
            got = self.rows()
            if cfg.staging != "local":
                problems += self._outside_the_prefix()
            if cfg.kind == "iceberg":
                problems += self._iceberg_history()
        except Exception as exc:  # noqa: BLE001 - an unreadable target is a violation
            return [*problems, f"the target cannot be read: {type(exc).__name__}: {str(exc)[:300]}"]
        tolerated = Counter(r for a in m.in_flight.values() for r in m.attempts[a].rows)
        if sorted(expected, key=repr) != got:
            missing = Counter(expected) - Counter(got)
            # Overwrite: a killed publish may already have replaced the partitions it covers.
            swapped = {p for a in m.in_flight.values() for p in m.attempts[a].partitions}
            missing = Counter({r: n for r, n in missing.items() if r[0] not in swapped})
            extra = Counter(got) - Counter(expected) - tolerated
            origin = {}
            for aid, att in m.attempts.items():
                for r in att.rows:
                    origin[r] = aid
            if not missing and not extra:
                return problems  # only rows of a commit killed mid-flight, not yet retried
            for r, n in sorted(extra.items(), key=repr)[:6]:
                aid = origin.get(r)
                committed = aid in m.committed.values()
                what = ("ABORTED" if aid in m.aborted else "SUPERSEDED" if aid in m.superseded
                        else "committed, shown twice" if committed and n > 1 or r in expected
                        else "an older checkpoint's rows replaced a newer one's (invariant 10)"
                        if committed and cfg.mode == "overwrite"
                        else "not committed" if aid else "unknown")  # fmt: skip
                problems.append(f"visible {r} x{n}: {what} ({m.attempts[aid].key if aid else '?'})")
            for r, n in sorted(missing.items(), key=repr)[:6]:
                problems.append(f"missing committed row {r} x{n} ({m.attempts[origin[r]].key})")
        if cfg.mode == "append":
            ids = Counter(i for _, i, _ in got)
            dup = [i for i, n in ids.items() if n > 1]
            if dup:
                problems.append(f"source rows visible more than once: {sorted(dup)[:6]}")
        return problems


def flip_a_value(data: bytes) -> tuple[bytes, str, str] | None:
    """``data`` (an uncompressed Parquet file of the model) with one ``id`` changed in place, the
    file's size unchanged: its last digit becomes a letter (``o5`` -> ``of``: no other row has it)
    in every plain-encoded copy (a 4-byte length, then the bytes: the dictionary page, the data
    page). The result reads back with just that value changed (checked here); the footer's
    statistics keep the old value (nothing reads them for a whole scan). ``(bytes, old, new)``,
    or None when no value can be changed so."""
    try:
        ids = pq.read_table(io.BytesIO(data)).column("id").to_pylist()
    except Exception:  # noqa: BLE001 - not a Parquet file of the model
        return None
    for old in ids:
        if not old or not old[-1].isdigit() or ids.count(old) != 1:
            continue
        new = old[:-1] + "abcdefghij"[int(old[-1])]
        size = len(old.encode()).to_bytes(4, "little")
        if size + old.encode() not in data:
            continue
        changed = data.replace(size + old.encode(), size + new.encode())
        try:
            back = pq.read_table(io.BytesIO(changed)).column("id").to_pylist()
        except Exception:  # noqa: BLE001,S112 - that copy was not a value: try another
            continue
        if len(changed) == len(data) and back == [new if i == old else i for i in ids]:
            return changed, old, new
    return None


def schedule_text(cfg: Config, steps: list[dict[str, Any]]) -> str:
    """The replayable form of a schedule: ``python -m tests.model --replay FILE``."""
    c: dict[str, Any] = {k: v for k, v in asdict(cfg).items() if k in ("kind", "mode", "fencing")}
    if cfg.domain is not None:
        c["domain"] = [list(p) for p in cfg.domain]
    if not cfg.verify_checksums:
        c["verify_checksums"] = False
    if cfg.staging != "local":
        c["staging"] = cfg.staging
    if cfg.kafka:
        c["source"] = "kafka"
    if cfg.catalog != "sql":
        c["catalog"] = cfg.catalog
    if cfg.sql_url:
        c["sql"] = cfg.sql_url.split(":", 1)[0].split("+")[0]
    return json.dumps({"config": c, "steps": steps}, indent=None)


def append_range(store: Any, pipeline: str, key: str, record: Any, n: int) -> tuple[int, int]:
    """The source offsets ``[start, end)`` the next append attempt of ``record`` reads: a new version
    re-reads its own range; any other attempt the ``n`` records after the last committed end."""
    if record.supersedes_attempt_id is not None:
        start = (record.start_offsets or {}).get("src", 0)
        return start, store.versions(pipeline, key)[-1].end_offsets["src"]
    start = (store.last_committed_offsets(pipeline) or {"src": 0})["src"]
    return start, start + n


def earlier_open(store: Any, cfg: Config, record: Any) -> str | None:
    """Why an append write of ``record`` waits (an earlier checkpoint still open), as the write task
    refuses it; ``None``: it may write (overwrite, or a new version re-reading its own range)."""
    if cfg.mode != "append" or record.supersedes_attempt_id is not None:
        return None
    earlier = [r for r in store.pending(cfg.pipeline) if r.sequence < record.sequence]
    return f"skipped: earlier {earlier[0].checkpoint_key} is {earlier[0].state}" if earlier else None


def replay(cfg: Config, steps: list[dict[str, Any]], *, verbose: bool = True) -> list[str]:
    """Run ``steps`` and check after each; the violations (prefixed by the step that showed them)."""
    world = World(cfg)
    found: list[str] = []
    try:
        for i, step in enumerate(steps):
            world.run(step)
            if verbose:
                print(f"  {i:2d} {world.log[-1][:300]}")
            found += [f"after step {i} {step['op']}: {p}" for p in world.check()]
    finally:
        world.close()
    return found


__all__ = [
    "Config",
    "World",
    "Model",
    "KEYS",
    "KILL_POINTS",
    "PAUSE_POINTS",
    "S3_KINDS",
    "LeaseHeldError",
    "replay",
]


def _offsets_moved_on(offsets: Any) -> Any:
    """Every offset in ``offsets`` 5 further on: a file source's ``{name: offset}`` as a Kafka
    source's nested ``{topic: {partition: offset}}`` (what a tampered manifest would claim)."""
    if isinstance(offsets, dict):
        return {k: _offsets_moved_on(v) for k, v in offsets.items()}
    if isinstance(offsets, int) and not isinstance(offsets, bool):
        return offsets + 5
    return offsets
