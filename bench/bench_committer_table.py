"""Benchmark 3: committer-table throughput on PostgreSQL vs ``pgbench`` simple-update.

walsink's figure: checkpoints committed per second by C concurrent committer
processes, each committing its own DURABLE checkpoints of one ``overwrite``
pipeline (as a parallel backfill does). One commit is exactly the database
work ``CheckpointCommitter.commit()`` does per checkpoint, with the same two
store calls: take the lease (one transaction: lock, check, update, history
row) and record COMMITTED (one transaction: the same). On PostgreSQL each is
one statement (see ``core/store/fastpath.py``). Publishing files is benchmark 2.

The baseline: ``pgbench -N`` (the built-in simple-update script: UPDATE,
SELECT, INSERT in one transaction) with C clients against the same server,
in the same run, in its own private database.

Between the two, the **protocol floor**: the same two statements walsink
sends per checkpoint (compiled from ``store._one_statement_transition``),
sent by a bare psycopg2 loop in C processes, with no walsink or SQLAlchemy
code per call. It is what this commit protocol costs the database and the
driver, so walsink / floor is the cost of walsink's own code, and floor /
pgbench the cost of a commit being two durable transactions instead of one.

**Table fencing** (``fencing="table"``, ``core/commit/tablefence.py``): the
same committer processes, doing the database work ``commit()`` does per
checkpoint in that mode: read the row (no lock), then one transaction that
records COMMITTED by compare-and-set on the sealed attempt (one statement on
PostgreSQL, with its history row). The table's own commit (the fence in that
mode) is the target publish, excluded as for the lease mode.

All four are measured in turns for the same duration; the ratios are walsink
checkpoints/s over pgbench TPS.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import re
import shutil
import subprocess
import time
from datetime import timedelta

from sqlalchemy.engine import make_url

from .common import Table, median, pg_server_version, private_pg_database

PIPELINE = "bench_table"
LEASE_TTL = timedelta(minutes=5)
#: Checkpoints prepared per second of a round, shared by its clients; well above any rate seen here.
PREPARED_PER_SECOND = 2_500


def _bulk_durable(url: str, keys: list[str]) -> None:
    """Insert DURABLE checkpoints directly (setup, not timed): far faster than four calls each."""
    from sqlalchemy import func, select, update

    from airflow_provider_walsink.core.store import Actor, CommitterStore
    from airflow_provider_walsink.core.store.models import checkpoint_table, pipeline_table
    from airflow_provider_walsink.core.store.store import utcnow

    store = CommitterStore.from_url(url)
    try:
        store.register(PIPELINE, "seed", mode="overwrite", actor=Actor(name="bench-setup"))
        now = utcnow()
        with store.engine.begin() as conn:
            base = conn.execute(
                select(func.max(checkpoint_table.c.sequence)).where(checkpoint_table.c.pipeline == PIPELINE)
            ).scalar_one()
            rows = [
                dict(
                    pipeline=PIPELINE,
                    checkpoint_key=key,
                    sequence=base + 1 + i,
                    state="DURABLE",
                    attempt=1,
                    sealed_attempt=1,
                    attempt_id=f"{i:032x}",
                    sealed_attempt_id=f"{i:032x}",
                    manifest_uri=f"file:///bench/{key}/attempt-1/_manifest.json",
                    manifest_digest="sha256:" + "0" * 64,
                    committables=1,
                    rows=1,
                    bytes=1,
                    created_at=now,
                    updated_at=now,
                    sealed_at=now,
                    durable_at=now,
                )
                for i, key in enumerate(keys)
            ]
            for start in range(0, len(rows), 5000):
                conn.execute(checkpoint_table.insert(), rows[start : start + 5000])
            conn.execute(
                update(pipeline_table)
                .where(pipeline_table.c.name == PIPELINE)
                .values(next_sequence=base + 1 + len(keys))
            )
    finally:
        store.dispose()


def _committer(url: str, keys: list[str], start: mp.Event, deadline_s: float, out: mp.Queue) -> None:
    """One committer process: commit its own checkpoints until the deadline (after ``start``)."""
    from airflow_provider_walsink.core.store import Actor, CommitterStore

    store = CommitterStore.from_url(url, migrate=False, pool_size=1)
    actor = Actor.local("bench-committer")
    store.require(PIPELINE, "seed")  # connect before the clock starts
    start.wait()
    begin = time.perf_counter()
    stop = begin + deadline_s
    done = 0
    for key in keys:
        if time.perf_counter() >= stop:
            break
        # The committer's database work for one checkpoint (see the module docstring).
        lease = store.acquire_lease(
            PIPELINE, key, owner=actor.name, ttl=LEASE_TTL, actor=actor, mode="overwrite"
        )
        store.mark_committed(lease, actor=actor, detail="published 1, already there 0")
        done += 1
    out.put((done, time.perf_counter() - begin, done == len(keys)))
    store.dispose()


def _table_committer(url: str, keys: list[str], start: mp.Event, deadline_s: float, out: mp.Queue) -> None:
    """One table-fenced committer process: ``commit()``'s database work with ``fencing="table"``."""
    from airflow_provider_walsink.core.commit.tablerecord import (
        committable,
        read_checkpoint,
        record_committed,
        table_token,
    )
    from airflow_provider_walsink.core.store import Actor, CommitterStore

    store = CommitterStore.from_url(url, migrate=False, pool_size=1)
    actor = Actor.local("bench-committer")
    store.require(PIPELINE, "seed")  # connect before the clock starts
    start.wait()
    begin = time.perf_counter()
    stop = begin + deadline_s
    done = 0
    for key in keys:
        if time.perf_counter() >= stop:
            break
        record = read_checkpoint(store, PIPELINE, key)  # the read: no lock, one round trip
        assert committable(record)
        # (the table's atomic commit, the fence, happens here: the target publish, excluded)
        committed = record_committed(
            store,
            record,
            token=table_token(record),
            actor=actor,
            end_offsets=None,
            publication=None,
            detail="table-fenced: published 1, already there 0",
        )
        if committed is None:
            raise RuntimeError(f"table-fenced: checkpoint {key} did not move")
        done += 1
    out.put((done, time.perf_counter() - begin, done == len(keys)))
    store.dispose()


def _floor_committer(url: str, keys: list[str], start: mp.Event, deadline_s: float, out: mp.Queue) -> None:
    """The protocol floor: walsink's two statements per checkpoint from a bare psycopg2 loop."""
    import psycopg2
    from sqlalchemy import create_engine

    from airflow_provider_walsink.core.protocol.states import CheckpointState as S
    from airflow_provider_walsink.core.store.fastpath import one_statement_transition

    engine = create_engine(url)  # for its dialect only: statements compile the way the store's do
    steps = []
    for to in (S.COMMITTING, S.COMMITTED):
        compiled = one_statement_transition(to).compile(dialect=engine.dialect)
        fixed = {k: v for k, v in compiled.params.items() if not k.startswith("p_")}
        steps.append((str(compiled), fixed))
    u = make_url(url)
    conn = psycopg2.connect(
        host=u.host or "127.0.0.1", port=u.port or 5432, user=u.username or "postgres", dbname=u.database
    )
    conn.autocommit = True
    cur = conn.cursor()
    history = dict(p_actor="bench-floor", p_dag_id=None, p_run_id=None, p_task_id=None, p_try_number=None)
    start.wait()
    begin = time.perf_counter()
    stop = begin + deadline_s
    done = 0
    for key in keys:
        now = time.perf_counter()
        if now >= stop:
            break
        params = dict(
            history,
            p_pipeline=PIPELINE,
            p_checkpoint_key=key,
            p_owner="bench-floor",
            p_ttl=LEASE_TTL,
            p_end_offsets=None,
            p_publication=None,
        )
        # The lease statement returns the new fencing token; COMMITTED is a compare-and-set on it.
        epoch = None
        for (sql, fixed), detail in zip(steps, ("lease", "published 1, already there 0"), strict=True):
            cur.execute(sql, {**fixed, **params, "p_detail": detail, "p_epoch": epoch})
            row = cur.fetchone()
            if row is None:
                raise RuntimeError(f"floor: checkpoint {key} did not move")
            epoch = row[[d.name for d in cur.description].index("lease_epoch")]
        done += 1
    out.put((done, time.perf_counter() - begin, done == len(keys)))
    conn.close()
    engine.dispose()


def walsink_rate(
    url: str, clients: int, seconds: float, round_id: str, *, floor: bool = False, table: bool = False
) -> float:
    """Checkpoints committed per second by ``clients`` processes over ``seconds``.

    ``floor``: the processes run :func:`_floor_committer` instead of walsink's store;
    ``table``: :func:`_table_committer` (table fencing).
    """
    ceiling = int(seconds * PREPARED_PER_SECOND / clients) + 500
    per_client = [[f"r{round_id}_c{c}_{i}" for i in range(ceiling)] for c in range(clients)]
    _bulk_durable(url, [k for keys in per_client for k in keys])
    ctx = mp.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    target = _floor_committer if floor else _table_committer if table else _committer
    procs = [ctx.Process(target=target, args=(url, keys, start, seconds, out)) for keys in per_client]
    for p in procs:
        p.start()
    # Every process connects before the clock starts (spawning 16 interpreters takes seconds).
    _wait_for_connections(url, clients)
    start.set()
    results = [out.get(timeout=seconds + 300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    if any(exhausted for _d, _t, exhausted in results):
        raise RuntimeError("a committer ran out of prepared checkpoints; raise PREPARED_PER_SECOND")
    total = sum(d for d, _t, _x in results)
    return total / max(t for _d, t, _x in results)


def _wait_for_connections(url: str, clients: int, timeout: float = 180.0) -> None:
    from sqlalchemy import create_engine, text

    name = make_url(url).database
    engine = create_engine(url)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            with engine.connect() as conn:
                n = conn.execute(
                    text(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = :d AND pid <> pg_backend_pid()"
                    ),
                    {"d": name},
                ).scalar_one()
            if n >= clients:
                time.sleep(0.5)  # let the last one finish its warm-up query
                return
            time.sleep(0.2)
    finally:
        engine.dispose()
    raise TimeoutError(f"only {n} of {clients} committers connected within {timeout:.0f}s")


def _pg_args(url: str) -> list[str]:
    u = make_url(url)
    return ["-h", u.host or "127.0.0.1", "-p", str(u.port or 5432), "-U", u.username or "postgres"]


def pgbench_init(url: str) -> None:
    subprocess.run(
        ["pgbench", *_pg_args(url), "-i", "-q", "-s", "10", make_url(url).database],
        check=True,
        capture_output=True,
        text=True,
    )


def pgbench_tps(url: str, clients: int, seconds: float) -> float:
    """TPS of ``pgbench -N`` (simple-update) with ``clients`` clients."""
    proc = subprocess.run(
        [
            "pgbench",
            *_pg_args(url),
            "-n",  # the tables were vacuumed by -i
            "-N",
            "-c",
            str(clients),
            "-j",
            str(min(clients, os.cpu_count() or 1)),
            "-T",
            str(max(1, round(seconds))),
            make_url(url).database,
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    match = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", proc.stdout)
    if match is None:
        raise RuntimeError(f"could not read TPS from pgbench output:\n{proc.stdout}\n{proc.stderr}")
    return float(match.group(1))


def run(clients: tuple[int, ...], seconds: float, repeats: int) -> Table:
    if shutil.which("pgbench") is None:
        raise RuntimeError("pgbench is not installed: apt-get install -y postgresql-contrib")
    pg: dict[int, list[float]] = {c: [] for c in clients}
    ws: dict[int, list[float]] = {c: [] for c in clients}
    fl: dict[int, list[float]] = {c: [] for c in clients}
    tf: dict[int, list[float]] = {c: [] for c in clients}
    with private_pg_database() as pg_url, private_pg_database() as ws_url:
        from airflow_provider_walsink.core.store import CommitterStore

        CommitterStore.from_url(ws_url).dispose()  # migrate once
        pgbench_init(pg_url)
        version = pg_server_version(pg_url)
        for r in range(repeats):
            for c in clients:
                kinds = ["pgbench", "floor", "walsink", "table"]
                shift = (r + c) % 4  # each kind goes first, second, third and fourth in turn
                for kind in kinds[shift:] + kinds[:shift]:
                    if kind == "pgbench":
                        pg[c].append(pgbench_tps(pg_url, c, seconds))
                    elif kind == "floor":
                        fl[c].append(walsink_rate(ws_url, c, seconds, f"f{r}_{c}", floor=True))
                    elif kind == "table":
                        tf[c].append(walsink_rate(ws_url, c, seconds, f"t{r}_{c}", table=True))
                    else:
                        ws[c].append(walsink_rate(ws_url, c, seconds, f"{r}_{c}"))
    t = Table(
        "Benchmark 3: committer-table throughput on PostgreSQL vs pgbench simple-update "
        "(goal at 16 committers: ≥ 50 %)",
        [
            "committers / clients",
            "pgbench -N TPS",
            "protocol floor, checkpoints/s",
            "walsink (lease) checkpoints/s",
            "walsink (table fencing) checkpoints/s",
            "lease / pgbench",
            "table fencing / pgbench",
            "lease / floor",
            "floor / pgbench",
            "table fencing range",
        ],
    )
    for c in clients:
        p, f, w, tb = median(pg[c]), median(fl[c]), median(ws[c]), median(tf[c])
        t.rows.append(
            [
                c,
                f"{p:,.0f}",
                f"{f:,.0f}",
                f"{w:,.0f}",
                f"{tb:,.0f}",
                f"{100 * w / p:.0f} %",
                f"{100 * tb / p:.0f} %",
                f"{100 * w / f:.0f} %",
                f"{100 * f / p:.0f} %",
                f"{min(tf[c]):,.0f} – {max(tf[c]):,.0f}",
            ]
        )
    t.notes.append(
        f"PostgreSQL {version} on 127.0.0.1 (TCP); medians of {repeats} rounds of {seconds:.0f} s per cell, "
        "pgbench, floor and walsink in rotating order; each committer is its own process with one connection."
    )
    t.notes.append(
        "One walsink checkpoint commit = lease transaction + COMMITTED transaction (each locks the row, "
        "updates it and appends a history row, in one statement on PostgreSQL); one pgbench -N "
        "transaction = UPDATE + SELECT + INSERT. The protocol floor sends walsink's two statements from a "
        "bare psycopg2 loop (see the module docstring). Table fencing: a read of the row, then one "
        "COMMITTED transaction (compare-and-set on the sealed attempt + history row, one statement); the "
        "table's own commit is the fence and is not counted."
    )
    return t
