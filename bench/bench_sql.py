"""Benchmark 6: SQL target load rate vs a plain bulk load of the same rows from the same client.

    .venv/bin/python -m bench.bench_sql                      # 1M rows, PostgreSQL and MariaDB, 3 repeats
    .venv/bin/python -m bench.bench_sql --rows 10000 --repeats 1 --backends postgresql   # smoke

One checkpoint of N rows (the example's daily events: 7 typed columns plus the
partition column ``dt``) is staged as 4 Parquet files and published by
``SqlPublisher`` in ``append`` mode: marker row locked and written, schema
checked against the table, Parquet read and streamed as CSV, loaded, committed.

Baselines, same run, same client process, same table, interleaved:

* PostgreSQL: ``COPY ... FROM STDIN (FORMAT csv)`` of the same rows from a CSV
  already in memory (made before the clock starts), through psycopg2, committed;
* MariaDB/MySQL: ``LOAD DATA LOCAL INFILE`` of the same rows from a CSV file
  already written (before the clock starts), through PyMySQL, committed.

So the baseline pays nothing for producing its CSV; walsink pays for reading
Parquet, converting it and its own bookkeeping. Between measurements the table
is truncated and the marker row deleted (not timed). Each PostgreSQL and
MariaDB database is private to the run and dropped at the end.
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import os
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

if __package__ in (None, ""):  # `python bench/bench_sql.py` as well as `python -m bench.bench_sql`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    __package__ = "bench"

import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import pyarrow.csv as pa_csv  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import sqlalchemy as sa  # noqa: E402

from bench.common import (  # noqa: E402
    PG_ADMIN_URL,
    Table,
    Timer,
    fmt_s,
    machine,
    median,
    private_pg_database,
    remove,
    spread,
    work_dir,
)

MYSQL_ADMIN_URL = os.environ.get("WALSINK_BENCH_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/test")
FILES = 4
DAY = "2026-01-01"


@contextmanager
def private_mysql_database(admin_url: str = MYSQL_ADMIN_URL) -> Iterator[str]:
    """Create a MariaDB/MySQL database only this run uses; drop it afterwards. Yields its URL."""
    name = f"walsink_bench_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 5})
    with admin.connect() as conn:
        # The name is generated here from hex digits only; DDL cannot bind it.
        conn.execute(sa.text(f"CREATE DATABASE {name}"))
    try:
        yield sa.engine.make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f"DROP DATABASE IF EXISTS {name}"))
        admin.dispose()


def events(n: int, offset: int) -> pa.Table:
    """``n`` typed rows shaped like the example's daily events (vectorised: no Python loop per row)."""
    ids = pa.array(range(offset, offset + n), pa.int64())
    idx = ids
    countries = pa.array(["DE", "FR", "NL", "PL", "SE", "US", "BR", "JP"])
    types = pa.array(["view", "click", "cart", "purchase"])
    base = dt.datetime.fromisoformat(DAY)
    seconds = pc.cast(pc.remainder(idx, 86400), pa.int64())
    return pa.table(
        {
            "event_id": ids,
            "user_id": pc.cast(pc.remainder(pc.multiply(idx, 7919), 5000), pa.int32()),
            "country": countries.take(pc.remainder(idx, 8)),
            "event_type": types.take(pc.remainder(idx, 4)),
            "amount_cents": pc.remainder(pc.multiply(idx, 104729), 20000),
            "ts": pc.add(
                pa.scalar(base, pa.timestamp("us")),
                pc.cast(pc.multiply(seconds, 1_000_000), pa.duration("us")),
            ),
            "score": pc.divide(pc.cast(idx, pa.float64()), 3.0),
        }
    )


def stage(scratch: Path, rows: int):
    """Stage one checkpoint of ``rows`` rows as FILES Parquet files; return (layout, manifest, dir, csv)."""
    from airflow_provider_walsink.core.protocol.manifest import Committable, build_manifest
    from airflow_provider_walsink.core.staging.layout import StagingLayout

    layout = StagingLayout(scratch / "staging")
    attempt_dir = layout.attempt_dir("bench_sql", DAY, 1)
    committables, parts = [], []
    per_file = -(-rows // FILES)
    for i in range(FILES):
        n = min(per_file, rows - i * per_file)
        part = events(n, i * per_file)
        parts.append(part)
        rel = f"dt={DAY}/part-{i:05d}.parquet"
        path = attempt_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(part, path)
        committables.append(Committable(rel, path.stat().st_size, n))
    manifest = build_manifest(
        pipeline="bench_sql",
        checkpoint_key=DAY,
        sequence=1,
        attempt=1,
        file_format="parquet",
        committables=committables,
        attempt_id=uuid.uuid4().hex,
        partition_columns=("dt",),
    )
    whole = pa.concat_tables(parts)
    whole = whole.append_column("dt", pa.repeat(pa.scalar(DAY), whole.num_rows))
    return layout, manifest, attempt_dir, whole


def _csv(table: pa.Table, *, mysql: bool) -> bytes:
    sink = io.BytesIO()
    pa_csv.write_csv(
        table, sink, pa_csv.WriteOptions(include_header=False, null_string="NULL" if mysql else "")
    )
    return sink.getvalue()


def _reset(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM bench_events"))
        conn.execute(sa.text("DELETE FROM walsink_markers"))


def _count(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT COUNT(*) FROM bench_events")).scalar())


def _plain_pg(engine: sa.Engine, table: str, columns: list[str], csv: bytes) -> Timer:
    raw = engine.raw_connection()
    try:
        with Timer() as t:
            cur = raw.cursor()
            cur.copy_expert(
                f"COPY {table} ({', '.join(columns)}) FROM STDIN WITH (FORMAT csv)",
                io.BytesIO(csv),
                size=1 << 20,
            )
            raw.commit()
    finally:
        raw.close()
    return t


def _plain_mysql(url: str, table: str, columns: list[str], csv_path: str) -> Timer:
    engine = sa.create_engine(url, connect_args={"local_infile": True})
    raw = engine.raw_connection()
    try:
        with Timer() as t:
            cur = raw.cursor()
            cur.execute(
                f"LOAD DATA LOCAL INFILE %s INTO TABLE {table} CHARACTER SET utf8mb4 "
                "FIELDS TERMINATED BY ',' OPTIONALLY ENCLOSED BY '\"' ESCAPED BY '' "
                f"LINES TERMINATED BY '\\n' ({', '.join(columns)})",
                (csv_path,),
            )
            raw.commit()
    finally:
        raw.close()
        engine.dispose()
    return t


def _walsink(url: str, layout, manifest, attempt_dir: Path) -> Timer:
    from airflow_provider_walsink.core.targets.base import PublishOutcome, StaticContext
    from airflow_provider_walsink.core.targets.sql import SqlPublisher

    publisher = SqlPublisher(url, "bench_events", mode="append", layout=layout, partition_by=("dt",))
    try:
        with Timer() as t:
            result = publisher.publish(manifest, attempt_dir, StaticContext.for_manifest(manifest, epoch=1))
    finally:
        publisher.close()
    if result.outcome is not PublishOutcome.PUBLISHED or result.rows != manifest.total_rows:
        raise SystemExit(f"walsink publish did not load the checkpoint: {result}")
    return t


def run_backend(backend: str, url: str, rows: int, repeats: int, scratch: Path) -> list:
    layout, manifest, attempt_dir, whole = stage(scratch / backend, rows)
    mysql = backend == "mysql"
    engine = sa.create_engine(url)
    # One untimed publish creates the table (types from the Parquet schema) and warms the caches.
    _walsink(url, layout, manifest, attempt_dir)
    columns = whole.column_names
    csv = _csv(whole, mysql=mysql)
    csv_path = str(scratch / backend / "plain.csv")
    Path(csv_path).write_bytes(csv)
    plain, ours = [], []
    for i in range(repeats):
        for which in ("plain", "walsink") if i % 2 == 0 else ("walsink", "plain"):
            _reset(engine)
            if which == "plain":
                t = (
                    _plain_mysql(url, "bench_events", columns, csv_path)
                    if mysql
                    else _plain_pg(engine, "bench_events", columns, csv)
                )
                plain.append(t.wall)
            else:
                ours.append(_walsink(url, layout, manifest, attempt_dir).wall)
            loaded = _count(engine)
            if loaded != rows:
                raise SystemExit(f"{backend} {which}: {loaded} rows in the table, expected {rows}")
    engine.dispose()
    rate_plain, rate_ours = rows / median(plain), rows / median(ours)
    label = "PostgreSQL COPY FROM STDIN" if not mysql else "MariaDB LOAD DATA LOCAL INFILE"
    return [
        f"{rows:,}",
        label,
        fmt_s(median(plain)),
        fmt_s(median(ours)),
        f"{rate_plain:,.0f}",
        f"{rate_ours:,.0f}",
        f"{rate_ours / rate_plain:.0%}",
        spread(plain),
        spread(ours),
    ]


def run(rows: list[int], repeats: int, scratch: Path, backends: list[str]) -> Table:
    table = Table(
        "6. SQL target load vs a plain bulk load of the same rows (goal on PostgreSQL: ≥ 80 % of COPY's rate)",
        [
            "rows",
            "baseline",
            "plain (median)",
            "walsink publish (median)",
            "plain rows/s",
            "walsink rows/s",
            "walsink / plain rate",
            "plain range",
            "walsink range",
        ],
    )
    for backend in backends:
        databases = private_pg_database(PG_ADMIN_URL) if backend == "postgresql" else private_mysql_database()
        with databases as url:
            for n in rows:
                table.rows.append(run_backend(backend, url, n, repeats, scratch))
    table.notes.append(
        f"{repeats} repeats per cell, plain and walsink alternating; {FILES} staged Parquet files of 7 typed columns "
        "plus the partition column dt; the plain load reads a CSV made before its clock starts; walsink's "
        "time is the whole publish (marker row, schema check, Parquet → CSV, load, commit)."
    )
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", default="1000000", help="comma-separated checkpoint sizes in rows")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--backends", default="postgresql,mysql")
    parser.add_argument("--work-dir", help="where scratch files go (default: the system temp dir)")
    parser.add_argument("--markdown", help="also write the tables to this file")
    args = parser.parse_args(argv)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = set(backends) - {"postgresql", "mysql"}
    if unknown:
        parser.error(f"unknown backend(s) {sorted(unknown)}")
    scratch = work_dir(args.work_dir)
    command = "python -m bench.bench_sql " + " ".join(sys.argv[1:] if argv is None else argv)
    try:
        tables = [machine(str(scratch), {"command": command.strip()})]
        print(tables[0].render(), "\n", flush=True)
        tables.append(run([int(r) for r in args.rows.split(",")], args.repeats, scratch, backends))
        print(tables[1].render(), flush=True)
    finally:
        remove(scratch)
    if args.markdown:
        Path(args.markdown).write_text("\n\n".join(t.render() for t in tables) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
