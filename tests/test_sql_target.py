"""The transactional SQL target (core/targets/sql/publisher.py) on real PostgreSQL and MariaDB.

Each test stages Parquet with pyarrow under a real staging layout, seals a v2
manifest and publishes it through ``SqlPublisher`` into a private database
(``database_urls``), then reads the table back with SQLAlchemy. Kills are real
SIGKILLs of a child process at a named point of the publish; the concurrency
test observes the second publisher waiting on the database's lock before it
lets the first one commit.
"""

from __future__ import annotations

import datetime as dt
import decimal
import multiprocessing
import os
import signal
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa

from airflow_provider_walsink.core.protocol.errors import FencedError, LayoutError, WalsinkError
from airflow_provider_walsink.core.protocol.manifest import (
    Committable,
    Manifest,
    build_manifest,
    write_manifest,
)
from airflow_provider_walsink.core.staging.layout import StagingLayout
from airflow_provider_walsink.core.targets.base import PublishOutcome, StaticContext
from airflow_provider_walsink.core.targets.registry import TargetOptions, resolve_target
from airflow_provider_walsink.core.targets.sql import SchemaMismatchError, SqlPublisher, SqlTargetError

BACKENDS = ["postgresql", "mysql"]
DAY1, DAY2 = "2026-01-01", "2026-01-02"


@pytest.fixture(params=BACKENDS)
def url(request, database_urls) -> str:
    return database_urls(request.param)


@pytest.fixture
def names():
    """A table and a pipeline only this test uses (the database is shared by the session)."""
    suffix = uuid.uuid4().hex[:8]
    return f"t_{suffix}", f"p_{suffix}"


def events(day: str, n: int, offset: int = 0) -> pa.Table:
    """``n`` rows of one day, with the awkward values CSV must survive."""
    base = dt.datetime.fromisoformat(day)
    return pa.table(
        {
            "id": pa.array(range(offset, offset + n), pa.int64()),
            "name": pa.array(
                [
                    None
                    if i % 7 == 3
                    else f'n{i}, "q"\nline\\'
                    if i % 5 == 0
                    else ""
                    if i % 11 == 0
                    else f"n{i}"
                    for i in range(offset, offset + n)
                ],
                pa.string(),
            ),
            "amount": pa.array(
                [decimal.Decimal(i) / 100 for i in range(offset, offset + n)], pa.decimal128(12, 2)
            ),
            "ratio": pa.array([i / 3 for i in range(offset, offset + n)], pa.float64()),
            "flag": pa.array([i % 2 == 0 for i in range(offset, offset + n)], pa.bool_()),
            "at": pa.array(
                [base + dt.timedelta(seconds=i, microseconds=7) for i in range(n)], pa.timestamp("us")
            ),
            "day": pa.array([dt.date.fromisoformat(day)] * n, pa.date32()),
        }
    )


def stage(
    layout: StagingLayout,
    pipeline: str,
    key: str,
    files: dict[str, pa.Table],
    *,
    attempt: int = 1,
    partition_columns: tuple[str, ...] = ("dt",),
    partitions: tuple[str, ...] = (),
) -> tuple[Manifest, Path]:
    """Write Parquet files into a new attempt directory and seal its manifest."""
    attempt_dir = layout.attempt_dir(pipeline, key, attempt)
    committables = []
    for rel, table in files.items():
        path = attempt_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path)
        committables.append(Committable(rel, path.stat().st_size, table.num_rows, writer="test-0"))
    manifest = build_manifest(
        pipeline=pipeline,
        checkpoint_key=key,
        sequence=1,
        attempt=attempt,
        file_format="parquet",
        committables=committables,
        attempt_id=uuid.uuid4().hex,
        partition_columns=partition_columns,
        partitions=partitions,
    )
    attempt_dir.mkdir(parents=True, exist_ok=True)
    write_manifest(attempt_dir / "_manifest.json", manifest)
    return manifest, attempt_dir


def rows(url: str, table: str) -> list[tuple]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            t = sa.Table(table, sa.MetaData(), autoload_with=conn)
            return sorted(tuple(r) for r in conn.execute(sa.select(t)))
    finally:
        engine.dispose()


def markers(url: str, pipeline: str) -> list[tuple]:
    """The marker rows of one pipeline."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            t = sa.Table("walsink_markers", sa.MetaData(), autoload_with=conn)
            return sorted(
                tuple(r)
                for r in conn.execute(
                    sa.select(t.c.pipeline, t.c.checkpoint_key, t.c.attempt_id, t.c.epoch).where(
                        t.c.pipeline == pipeline
                    )
                )
            )
    finally:
        engine.dispose()


def publisher(url: str, table: str, layout: StagingLayout, mode: str = "append", **kw) -> SqlPublisher:
    return SqlPublisher(
        url, table, mode=mode, layout=layout, partition_by=kw.pop("partition_by", ("dt",)), **kw
    )


def publish(pub: SqlPublisher, manifest: Manifest, attempt_dir: Path, epoch: int = 1, **kw):
    try:
        return pub.publish(manifest, attempt_dir, StaticContext.for_manifest(manifest, epoch=epoch, **kw))
    finally:
        pub.close()


def day_manifest(layout, pipeline, key=DAY1, n=50, attempt=1, offset=0):
    return stage(layout, pipeline, key, {f"dt={key}/part-0.parquet": events(key, n, offset)}, attempt=attempt)


# --------------------------------------------------------------------------- publish, re-publish


def test_publish_loads_typed_rows_once_and_a_fresh_publisher_finds_the_marker(url, names, layout):
    table, pipeline = names
    manifest, attempt_dir = stage(
        layout,
        pipeline,
        DAY1,
        {
            f"dt={DAY1}/part-0.parquet": events(DAY1, 40),
            f"dt={DAY1}/part-1.parquet": events(DAY1, 35, offset=40),
        },
    )
    first = publish(publisher(url, table, layout), manifest, attempt_dir)
    assert first.outcome is PublishOutcome.PUBLISHED and first.rows == 75 and first.published == 2
    loaded = rows(url, table)
    assert len(loaded) == 75 and len({r[0] for r in loaded}) == 75
    # Values survive the CSV trip: quotes, commas, newlines, backslashes, NULL vs '', decimals, timestamps.
    expected = pa.concat_tables([events(DAY1, 40), events(DAY1, 35, offset=40)]).to_pylist()
    by_id = {r[0]: r for r in loaded}
    for e in expected:
        got = by_id[e["id"]]
        assert got[1] == e["name"]
        assert decimal.Decimal(got[2]) == e["amount"]
        assert float(got[3]) == pytest.approx(e["ratio"])
        assert bool(got[4]) is e["flag"]
        assert got[5].replace(tzinfo=None) == e["at"] and got[6] == e["day"] and got[7] == DAY1

    # As after a kill between the load and COMMITTED: a new publisher, the same attempt.
    again = publisher(url, table, layout)
    assert again.published_attempt(manifest) == manifest.attempt_id
    second = publish(again, manifest, attempt_dir)
    assert second.outcome is PublishOutcome.ALREADY_PUBLISHED and second.already == 2
    assert rows(url, table) == loaded
    assert markers(url, pipeline) == [(pipeline, DAY1, manifest.attempt_id, 1)]


def test_a_published_checkpoint_needs_no_staging_to_be_recognised(url, names, layout):
    """The marker alone decides: staging removed (finish), no committer table at all."""
    table, pipeline = names
    manifest, attempt_dir = day_manifest(layout, pipeline)
    pub = publisher(url, table, layout)
    publish(pub, manifest, attempt_dir)
    pub.finish(manifest, layout)
    assert not layout.checkpoint_dir(pipeline, DAY1).exists()
    result = publish(publisher(url, table, layout), manifest, attempt_dir)
    assert result.outcome is PublishOutcome.ALREADY_PUBLISHED
    assert len(rows(url, table)) == 50


def test_append_refuses_another_attempt_of_a_published_checkpoint(url, names, layout):
    """A re-run after retention (new attempt id, same key) must not duplicate the interval."""
    table, pipeline = names
    m1, d1 = day_manifest(layout, pipeline)
    publish(publisher(url, table, layout), m1, d1)
    before = rows(url, table)
    m2, d2 = day_manifest(layout, pipeline, attempt=2)
    with pytest.raises(SqlTargetError, match=f"already appended .* by attempt {m1.attempt_id}"):
        publish(publisher(url, table, layout), m2, d2)
    assert rows(url, table) == before
    assert markers(url, pipeline) == [(pipeline, DAY1, m1.attempt_id, 1)]


def _child_publish(url, table, root, manifest_bytes, attempt_dir, mode, epoch, kill_at, loaded, go, results):
    """Publish in a child process; optionally SIGKILL itself, or pause, at a named point."""
    manifest = Manifest.from_bytes(manifest_bytes)

    def on_event(name: str) -> None:
        if name == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if name == "sql.loaded" and loaded is not None:
            loaded.set()
            go.wait(120)

    pub = publisher(url, table, StagingLayout(root), mode)
    result = publish(pub, manifest, Path(attempt_dir), epoch=epoch, on_event=on_event)
    results.put((os.getpid(), result.outcome.value, result.rows))


def _spawn(*args):
    ctx = multiprocessing.get_context("spawn")
    return ctx.Process(target=_child_publish, args=args)


@pytest.mark.parametrize("kill_at", ["sql.loaded", "sql.committed"])
def test_a_committer_killed_during_the_publish_leaves_each_row_once_after_the_rerun(
    url, names, layout, kill_at
):
    """SIGKILL before the SQL COMMIT: nothing visible; after it: the re-run finds the marker."""
    table, pipeline = names
    manifest, attempt_dir = day_manifest(layout, pipeline, n=500)
    results = multiprocessing.get_context("spawn").Queue()
    child = _spawn(
        url,
        table,
        str(layout.root),
        manifest.to_bytes(),
        str(attempt_dir),
        "append",
        1,
        kill_at,
        None,
        None,
        results,
    )
    child.start()
    child.join(120)
    assert child.exitcode == -signal.SIGKILL
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        visible = conn.execute(sa.text(f"SELECT COUNT(*) FROM {table}")).scalar()
    engine.dispose()
    assert visible == (0 if kill_at == "sql.loaded" else 500)
    rerun = publish(publisher(url, table, layout), manifest, attempt_dir)
    want = PublishOutcome.PUBLISHED if kill_at == "sql.loaded" else PublishOutcome.ALREADY_PUBLISHED
    assert rerun.outcome is want
    loaded = rows(url, table)
    assert len(loaded) == 500 and len({r[0] for r in loaded}) == 500


# --------------------------------------------------------------------------- replace


def test_replace_reruns_give_the_same_table_and_leave_other_intervals_alone(url, names, layout):
    table, pipeline = names
    m_day2, d_day2 = day_manifest(layout, pipeline, key=DAY2, n=30, offset=1000)
    publish(publisher(url, table, layout, "replace"), m_day2, d_day2)
    m1, d1 = day_manifest(layout, pipeline, n=60)
    result = publish(publisher(url, table, layout, "replace"), m1, d1)
    assert result.partitions_replaced == [f"dt={DAY1}"]
    first = rows(url, table)
    assert len(first) == 90
    # A reprocess: a new attempt of the same interval, same rows, replaces instead of appending.
    m2, d2 = day_manifest(layout, pipeline, n=60, attempt=2)
    publish(publisher(url, table, layout, "replace"), m2, d2)
    assert rows(url, table) == first
    # And once more with the same attempt: already there.
    assert (
        publish(publisher(url, table, layout, "replace"), m2, d2).outcome is PublishOutcome.ALREADY_PUBLISHED
    )
    assert rows(url, table) == first
    # A reprocess with fewer rows leaves exactly those for the interval.
    m3, d3 = day_manifest(layout, pipeline, n=10, attempt=3)
    publish(publisher(url, table, layout, "replace"), m3, d3)
    after = rows(url, table)
    assert [r for r in after if r[7] == DAY2] == [r for r in first if r[7] == DAY2]
    assert sorted(r[0] for r in after if r[7] == DAY1) == list(range(10))


def test_replace_by_a_data_key_column_and_by_a_predicate(url, names, layout):
    table, pipeline = names
    unpartitioned = {"part-0.parquet": events(DAY1, 20)}
    for attempt in (1, 2):
        m, d = stage(layout, pipeline, DAY1, unpartitioned, attempt=attempt, partition_columns=())
        publish(publisher(url, table, layout, "replace", replace_key="day", partition_by=()), m, d)
        assert len(rows(url, table)) == 20
    # The predicate names the interval with bound parameters (the key is the day here).
    for attempt in (3, 4):
        m, d = stage(layout, pipeline, DAY1, unpartitioned, attempt=attempt, partition_columns=())
        pub = publisher(
            url, table, layout, "replace", replace_predicate="day = :checkpoint_key", partition_by=()
        )
        publish(pub, m, d)
        assert len(rows(url, table)) == 20


# --------------------------------------------------------------------------- schema


def test_a_schema_mismatch_fails_naming_the_columns_and_writes_nothing(url, names, layout):
    table, pipeline = names
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                f"CREATE TABLE {table} (id BIGINT, name VARCHAR(50), amount VARCHAR(20), ratio FLOAT, "
                "flag BOOLEAN, at TIMESTAMP NULL, dt VARCHAR(20), owner VARCHAR(20) NOT NULL)"
            )
        )
        conn.execute(sa.text(f"INSERT INTO {table} (id, owner) VALUES (1, 'x')"))
    engine.dispose()
    before = rows(url, table)
    manifest, attempt_dir = day_manifest(layout, pipeline)
    with pytest.raises(SchemaMismatchError) as e:
        publish(publisher(url, table, layout), manifest, attempt_dir)
    message = str(e.value)
    assert "'amount' is decimal128(12, 2) in the staged Parquet but VARCHAR(20)" in message
    assert "'day' (date32[day]) is not in the table" in message
    assert "'owner' is NOT NULL without a default" in message
    assert "'id'" not in message and "'name'" not in message
    assert rows(url, table) == before
    assert markers(url, pipeline) == []


def test_bad_names_and_types_are_refused_before_anything_is_written(url, names, layout):
    table, pipeline = names
    with pytest.raises(SqlTargetError, match="invalid table name 'x; DROP TABLE y'"):
        SqlPublisher(url, "x; DROP TABLE y", layout=layout)
    odd = pa.table({"a b": [1]})
    m, d = stage(layout, pipeline, DAY1, {"part-0.parquet": odd}, partition_columns=())
    with pytest.raises(SqlTargetError, match="invalid column name 'a b'"):
        publish(publisher(url, table, layout, partition_by=()), m, d)
    nested = pa.table({"a": pa.array([[1, 2]], pa.list_(pa.int64()))})
    m, d = stage(layout, pipeline, DAY2, {"part-0.parquet": nested}, partition_columns=())
    with pytest.raises(SchemaMismatchError, match="column 'a' has Parquet type list<"):
        publish(publisher(url, table, layout, partition_by=()), m, d)
    assert not sa.inspect(sa.create_engine(url)).has_table(table)


def test_committables_partitioned_otherwise_than_declared_are_refused_as_every_target_refuses(
    url, names, layout
):
    """``partition_by`` means what it means for the other targets (issue 35): the committables'
    partition directories must be the declared columns, or nothing is written."""
    table, pipeline = names
    m, d = stage(layout, pipeline, DAY1, {"region=eu/part-0.parquet": events(DAY1, 3)},
                 partition_columns=("region",))  # fmt: skip
    with pytest.raises(LayoutError, match=r"partitioned by \['region'\], the pipeline declares \['dt'\]"):
        publish(publisher(url, table, layout, "replace"), m, d)
    m, d = stage(layout, pipeline, DAY2, {"part-0.parquet": events(DAY2, 3)}, partition_columns=())
    with pytest.raises(LayoutError, match=r"partitioned by nothing, the pipeline declares \['dt'\]"):
        publish(publisher(url, table, layout), m, d)
    assert not sa.inspect(sa.create_engine(url)).has_table(table)


# --------------------------------------------------------------------------- fencing


def test_a_zombie_with_a_lower_epoch_is_refused_inside_the_transaction(url, names, layout):
    table, pipeline = names
    zombie_manifest, zombie_dir = day_manifest(layout, pipeline, n=40)
    # The lease moved on: the newer holder (epoch 2) published a reprocessed attempt.
    newer_manifest, newer_dir = day_manifest(layout, pipeline, n=25, attempt=2, offset=500)
    publish(publisher(url, table, layout, "replace"), newer_manifest, newer_dir, epoch=2)
    before = rows(url, table)
    # The zombie (epoch 1) resumes; in replace mode it would otherwise swap its rows in.
    with pytest.raises(FencedError, match="epoch 2, newer than this committer's 1"):
        publish(publisher(url, table, layout, "replace"), zombie_manifest, zombie_dir, epoch=1)
    # Even re-publishing the very attempt the newer holder published is refused to the zombie.
    with pytest.raises(FencedError):
        publish(publisher(url, table, layout, "replace"), newer_manifest, newer_dir, epoch=1)
    assert rows(url, table) == before
    assert markers(url, pipeline) == [(pipeline, DAY1, newer_manifest.attempt_id, 2)]


class _LosesLeaseAt:
    """A context whose lease is taken over at a named point: ``fence()`` raises from then on."""

    def __init__(self, manifest: Manifest, point: str) -> None:
        self.pipeline, self.checkpoint_key, self.attempt_id = (
            manifest.pipeline,
            manifest.checkpoint_key,
            manifest.attempt_id,
        )
        self.epoch, self.point, self.lost = 1, point, False

    def fence(self) -> None:
        if self.lost:
            raise FencedError("lease taken over")

    def event(self, name: str) -> None:
        self.lost = self.lost or name == self.point


def test_a_committer_that_loses_its_lease_during_the_load_rolls_back(url, names, layout):
    table, pipeline = names
    manifest, attempt_dir = day_manifest(layout, pipeline)
    pub = publisher(url, table, layout)
    with pytest.raises(FencedError):
        pub.publish(manifest, attempt_dir, _LosesLeaseAt(manifest, "sql.loaded"))
    pub.close()
    assert rows(url, table) == [] and markers(url, pipeline) == []


# --------------------------------------------------------------------------- concurrency


def _lock_waiters(url: str) -> int:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            if engine.dialect.name == "postgresql":
                query = (
                    "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'"
                )
            else:
                query = "SELECT COUNT(*) FROM information_schema.innodb_trx WHERE trx_state = 'LOCK WAIT'"
            return int(conn.execute(sa.text(query)).scalar())
    finally:
        engine.dispose()


def test_two_processes_publishing_the_same_attempt_at_once_load_it_once(url, names, layout):
    table, pipeline = names
    manifest, attempt_dir = day_manifest(layout, pipeline, n=300)
    # Create the table first, so the only thing the two publishers contend for is the marker row.
    publisher(url, table, layout)._prepare_target(publisher(url, table, layout)._plan(manifest, attempt_dir))
    mp = multiprocessing.get_context("spawn")
    loaded, go, results = mp.Event(), mp.Event(), mp.Queue()
    args = (url, table, str(layout.root), manifest.to_bytes(), str(attempt_dir), "append", 1, None)
    first = mp.Process(target=_child_publish, args=(*args, loaded, go, results))
    second = mp.Process(target=_child_publish, args=(*args, None, None, results))
    first.start()
    try:
        assert loaded.wait(120), "the first publisher never loaded"
        # The first holds its transaction open, rows loaded; the second must wait on the marker row.
        second.start()
        waited = False
        for _ in range(1200):
            if _lock_waiters(url) >= 1:
                waited = True
                break
            if not second.is_alive():
                break
            multiprocessing.connection.wait([second.sentinel], timeout=0.1)
        assert waited, "the second publisher did not wait for the first one's marker lock"
    finally:
        go.set()
        first.join(120)
        second.join(120)
    outcomes = sorted(results.get(timeout=10)[1] for _ in range(2))
    assert outcomes == ["ALREADY_PUBLISHED", "PUBLISHED"]
    got = rows(url, table)
    assert len(got) == 300 and len({r[0] for r in got}) == 300


def test_a_free_race_of_three_publishers_loads_the_attempt_once(url, names, layout):
    table, pipeline = names
    manifest, attempt_dir = day_manifest(layout, pipeline, n=200)
    mp = multiprocessing.get_context("spawn")
    results = mp.Queue()
    args = (
        url,
        table,
        str(layout.root),
        manifest.to_bytes(),
        str(attempt_dir),
        "append",
        1,
        None,
        None,
        None,
        results,
    )
    procs = [mp.Process(target=_child_publish, args=args) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(180)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    outcomes = sorted(results.get(timeout=10)[1] for _ in range(3))
    assert outcomes == ["ALREADY_PUBLISHED", "ALREADY_PUBLISHED", "PUBLISHED"]
    assert len(rows(url, table)) == 200


# --------------------------------------------------------------------------- construction


def test_registry_builds_the_publisher_from_an_airflow_style_connection(database_urls, layout):
    pg = sa.engine.make_url(database_urls("postgresql"))
    seen = []

    def connections(conn_id: str) -> dict:
        seen.append(conn_id)
        return {
            "conn_type": "postgres",
            "host": pg.host,
            "port": pg.port,
            "login": pg.username,
            "password": pg.password,
            "schema": pg.database,
            "extra": {},
        }

    options = TargetOptions(mode="overwrite", layout=layout, partition_by=("dt",), connections=connections)
    pub = resolve_target("sql://analytics_db/public.daily_totals", options)
    assert isinstance(pub, SqlPublisher) and seen == ["analytics_db"]
    assert (pub.schema, pub.table, pub.mode, pub.url.drivername) == (
        "public",
        "daily_totals",
        "replace",
        "postgresql+psycopg2",
    )
    assert pub.describe() == "sql://analytics_db/public.daily_totals" and "password" not in pub.describe()
    with pytest.raises(WalsinkError, match="needs one of"):
        resolve_target(
            "sql://x/t",
            TargetOptions(mode="append", layout=layout, connections=lambda c: {"conn_type": "sqlite"}),
        )
    with pytest.raises(WalsinkError, match="must look like"):
        resolve_target("sql://x/a/b", options)
    with pytest.raises(WalsinkError, match="unknown option"):
        resolve_target("sql://x/t", TargetOptions(mode="append", layout=layout, extra={"urll": "x"}))
    # Built without partition columns (as the write task does to ask where to stage): fine until it
    # must publish, then the replace mode cannot name the interval's rows, and nothing is written.
    unnamed = resolve_target(
        "sql://x/t_unnamed", TargetOptions(mode="overwrite", layout=layout, connections=connections)
    )
    m, d = stage(layout, "p_unnamed", DAY1, {"part-0.parquet": events(DAY1, 3)}, partition_columns=())
    with pytest.raises(WalsinkError, match="replace mode needs"):
        publish(unnamed, m, d)
    assert not sa.inspect(sa.create_engine(database_urls("postgresql"))).has_table("t_unnamed")


def test_a_value_the_column_cannot_hold_rolls_the_whole_load_back(url, names, layout):
    """PostgreSQL's COPY fails; MySQL's LOAD DATA LOCAL only warns, which the target turns into an error."""
    table, pipeline = names
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text(f"CREATE TABLE {table} (id BIGINT, name VARCHAR(3), dt VARCHAR(20))"))
    engine.dispose()
    manifest, attempt_dir = stage(
        layout,
        pipeline,
        DAY1,
        {f"dt={DAY1}/part-0.parquet": pa.table({"id": [1, 2], "name": ["ok", "too long"]})},
    )
    with pytest.raises(Exception, match="(?i)too long|truncat"):
        publish(publisher(url, table, layout), manifest, attempt_dir)
    assert rows(url, table) == [] and markers(url, pipeline) == []


def test_a_conversion_error_in_a_worker_thread_reaches_the_load(tmp_path):
    """The CSV converter threads hand their errors to the consumer (the load then rolls back)."""
    from airflow_provider_walsink.core.targets.sql.load import csv_chunks
    from airflow_provider_walsink.core.targets.sql.plan import LoadPlan

    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"id": list(range(10))}), good)
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet at all")
    plan = LoadPlan(
        files=[(str(good), {}), (str(bad), {})],
        schema=pa.schema([("id", pa.int64())]),
        partition_columns=[],
        rows=20,
    )
    with pytest.raises(pa.ArrowInvalid):
        b"".join(csv_chunks(plan, mysql=False))
    ok = LoadPlan(
        files=[(str(good), {"dt": DAY1})] * 3,
        schema=pa.schema([("id", pa.int64())]),
        partition_columns=["dt"],
        rows=30,
    )
    text = b"".join(csv_chunks(ok, mysql=False)).decode()
    assert sorted(text.splitlines()) == sorted(f'{i},"{DAY1}"' for i in range(10) for _ in range(3))


def test_an_empty_interval_in_replace_mode_deletes_the_days_rows(url, names, layout):
    """A day reprocessed to no rows: its declared partition is replaced by nothing, other days stay."""
    table, pipeline = names
    # Before the table exists, an empty interval creates nothing and loads nothing.
    m0, d0 = stage(layout, pipeline, "2026-01-03", {}, partitions=("dt=2026-01-03",))
    assert publish(publisher(url, table, layout, "replace"), m0, d0).rows == 0
    assert not sa.inspect(sa.create_engine(url)).has_table(table)
    for key in (DAY1, DAY2):
        m, d = day_manifest(layout, pipeline, key=key, n=20)
        publish(publisher(url, table, layout, "replace"), m, d)
    before = rows(url, table)
    empty, empty_dir = stage(layout, pipeline, DAY1, {}, attempt=2, partitions=(f"dt={DAY1}",))
    result = publish(publisher(url, table, layout, "replace"), empty, empty_dir)
    assert result.outcome is PublishOutcome.PUBLISHED and result.rows == 0
    assert result.partitions_replaced == [f"dt={DAY1}"]
    assert rows(url, table) == [r for r in before if r[7] == DAY2]
    assert markers(url, pipeline)[0] == (pipeline, DAY1, empty.attempt_id, 1)


def test_psycopg3_urls_load_through_its_copy_api(database_urls, names, layout):
    url = sa.engine.make_url(database_urls("postgresql")).set(drivername="postgresql+psycopg")
    url = url.render_as_string(hide_password=False)
    table, pipeline = names
    manifest, attempt_dir = day_manifest(layout, pipeline, n=120)
    assert publish(publisher(url, table, layout), manifest, attempt_dir).rows == 120
    assert (
        publish(publisher(url, table, layout), manifest, attempt_dir).outcome
        is PublishOutcome.ALREADY_PUBLISHED
    )
    assert [r[0] for r in rows(url, table)] == list(range(120))


def test_a_staged_file_that_breaks_during_the_load_rolls_everything_back(url, names, layout):
    """Footer intact (the plan reads it), data pages corrupt: the error surfaces mid-load, nothing stays."""
    table, pipeline = names
    manifest, attempt_dir = stage(
        layout,
        pipeline,
        DAY1,
        {
            f"dt={DAY1}/part-0.parquet": events(DAY1, 3000),
            f"dt={DAY1}/part-1.parquet": events(DAY1, 3000, 3000),
        },
    )
    broken = attempt_dir / f"dt={DAY1}/part-1.parquet"
    data = bytearray(broken.read_bytes())
    data[8:-2000] = b"\xff" * (len(data) - 2008)  # same size, so only reading the rows finds it
    broken.write_bytes(bytes(data))
    events_seen = []
    with pytest.raises(Exception) as e:  # noqa: B017 - whichever error the Parquet reader raises
        publish(publisher(url, table, layout), manifest, attempt_dir, on_event=events_seen.append)
    assert "sql.before_load" in events_seen and "sql.loaded" not in events_seen, e.value
    assert rows(url, table) == [] and markers(url, pipeline) == []


def test_append_after_a_finished_commit_appends_a_new_attempt_of_the_key(url, names, layout):
    """After COMMITTED (finish() ran), another attempt of the key is a re-run after retention: new rows."""
    table, pipeline = names
    m1, d1 = day_manifest(layout, pipeline, n=30)
    pub = publisher(url, table, layout)
    publish(pub, m1, d1)
    pub.finish(m1, layout)
    pub.close()
    m2, d2 = day_manifest(layout, pipeline, n=20, attempt=2, offset=100)
    assert publish(publisher(url, table, layout), m2, d2).outcome is PublishOutcome.PUBLISHED
    assert [r[0] for r in rows(url, table)] == [*range(30), *range(100, 120)]
    assert markers(url, pipeline) == [(pipeline, DAY1, m2.attempt_id, 1)]
    # The new attempt's commit is not recorded yet: a third attempt is refused again.
    m3, d3 = day_manifest(layout, pipeline, n=5, attempt=3, offset=500)
    with pytest.raises(SqlTargetError, match="whose commit was never recorded"):
        publish(publisher(url, table, layout), m3, d3)


def test_a_publisher_holding_the_marker_row_blocks_another_only_up_to_the_lock_timeout(url, names, layout):
    """A paused committer inside its transaction (here: a connection holding the row lock)."""
    table, pipeline = names
    m1, d1 = day_manifest(layout, pipeline, n=10)
    publish(publisher(url, table, layout, "replace"), m1, d1)
    m2, d2 = day_manifest(layout, pipeline, n=30, attempt=2)
    engine = sa.create_engine(url)
    holder = engine.connect()
    try:
        with holder.begin():
            holder.execute(
                sa.text("SELECT attempt_id FROM walsink_markers WHERE pipeline = :p FOR UPDATE"),
                {"p": pipeline},
            )
            with pytest.raises(SqlTargetError, match="stayed locked by another publisher .* for 1 s"):
                publish(publisher(url, table, layout, "replace", lock_timeout=1), m2, d2)
    finally:
        holder.close()
        engine.dispose()
    assert len(rows(url, table)) == 10
    assert publish(publisher(url, table, layout, "replace", lock_timeout=1), m2, d2).rows == 30
    assert len(rows(url, table)) == 30


def test_a_missing_driver_names_the_extra_to_install(monkeypatch):
    """PyMySQL is installed here, so its absence is simulated (the one thing that cannot run)."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "pymysql" else real(name, *a)
    )
    with pytest.raises(
        SqlTargetError,
        match=r'driver .pymysql. is not installed: pip install "airflow-provider-walsink\[mysql\]"',
    ):
        SqlPublisher("mysql+pymysql://root@127.0.0.1/test", "t")


# --------------------------------------------------------------------------- reprocess (a new version)


def test_a_new_version_by_a_data_key_replaces_every_key_value_the_old_one_wrote(url, names, layout):
    """The marker row records v1's key values; v2 must cover them all, or nothing is written."""
    from airflow_provider_walsink.core.protocol.errors import SupersedeError

    table, pipeline = names
    pub = lambda: publisher(url, table, layout, "replace", replace_key="day", partition_by=())  # noqa: E731
    both_days = pa.concat_tables([events(DAY1, 5), events(DAY2, 4, offset=100)])
    v1, d1 = stage(layout, pipeline, "k1", {"part-0.parquet": both_days}, attempt=1, partition_columns=())
    publish(pub(), v1, d1, epoch=1)
    before = rows(url, table)
    one_day, d2 = stage(layout, pipeline, "k1", {"part-0.parquet": events(DAY1, 3, offset=500)}, attempt=2,
                        partition_columns=())  # fmt: skip
    with pytest.raises(SupersedeError, match=f"does not cover 1 key value.*day={DAY2}.*nothing written"):
        publish(pub(), one_day, d2, epoch=2, supersedes=v1.attempt_id)
    assert rows(url, table) == before

    v2_rows = pa.concat_tables([events(DAY1, 3, offset=500), events(DAY2, 2, offset=600)])
    v2, d3 = stage(layout, pipeline, "k1", {"part-0.parquet": v2_rows}, attempt=3, partition_columns=())
    result = publish(pub(), v2, d3, epoch=3, supersedes=v1.attempt_id)
    assert result.outcome is PublishOutcome.PUBLISHED
    assert sorted(r[0] for r in rows(url, table)) == [500, 501, 502, 600, 601]
    # Crash after the transaction, re-run: already there; v1's zombie: fenced by the marker row.
    again = publish(pub(), v2, d3, epoch=3, supersedes=v1.attempt_id)
    assert again.outcome is PublishOutcome.ALREADY_PUBLISHED
    with pytest.raises(FencedError):
        publish(pub(), v1, d1, epoch=1)
    assert sorted(r[0] for r in rows(url, table)) == [500, 501, 502, 600, 601]


def test_a_new_version_by_a_predicate_replaces_the_interval(url, names, layout):
    table, pipeline = names
    pub = lambda: publisher(  # noqa: E731
        url, table, layout, "replace", replace_predicate="day = :checkpoint_key", partition_by=()
    )
    v1, d1 = stage(
        layout, pipeline, DAY1, {"part-0.parquet": events(DAY1, 6)}, attempt=1, partition_columns=()
    )
    publish(pub(), v1, d1, epoch=1)
    v2, d2 = stage(layout, pipeline, DAY1, {"part-0.parquet": events(DAY1, 2, offset=70)}, attempt=2,
                   partition_columns=())  # fmt: skip
    publish(pub(), v2, d2, epoch=2, supersedes=v1.attempt_id)
    assert sorted(r[0] for r in rows(url, table)) == [70, 71]


def _old_marker_table(engine: sa.Engine, name: str) -> sa.Table:
    """The marker table as walsink 0.3 created it: no ``replaced_values``, default collation."""
    old = sa.Table(
        name,
        sa.MetaData(),
        sa.Column("pipeline", sa.String(128), primary_key=True),
        sa.Column("checkpoint_key", sa.String(128), primary_key=True),
        sa.Column("attempt_id", sa.String(40), nullable=False),
        sa.Column("epoch", sa.BigInteger, nullable=False),
        sa.Column("rows", sa.BigInteger, nullable=False),
        sa.Column("target_table", sa.String(255), nullable=False),
        sa.Column("published_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
    )
    old.create(engine)
    return old


def _fix_as_the_refusal_says(url: str, table: str, layout: StagingLayout, marker_table: str) -> None:
    """Publish into a marker table whose keys ignore case: refused naming it; run the fix it gives."""
    m, d = day_manifest(layout, f"fix_{table}", n=3)
    with pytest.raises(
        SqlTargetError, match=f"marker table `?{marker_table}`? compares its key columns"
    ) as err:
        publish(publisher(url, table, layout, marker_table=marker_table), m, d)
    assert "pipeline (" in str(err.value) and "_ci)" in str(err.value)
    fix = str(err.value).split("then run: ", 1)[1]
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(fix))
    finally:
        engine.dispose()
    assert not sa.inspect(sa.create_engine(url)).has_table(table)  # nothing was written


@pytest.mark.parametrize("by_hand", [False, True], ids=["created", "by_hand"])
def test_replace_keys_differing_only_in_case_are_different_rows(url, names, layout, by_hand):
    """Replacing the rows of ``us`` leaves those of ``US``, in a table walsink created and in one made
    by hand with the database's default (on MariaDB, case-insensitive) collation."""
    table, pipeline = names
    if by_hand:
        engine = sa.create_engine(url)
        try:
            with engine.begin() as conn:
                conn.execute(sa.text(f"CREATE TABLE {table} (id BIGINT, country VARCHAR(16))"))
        finally:
            engine.dispose()

    def country(key: str, value: str, ids: range, attempt: int = 1):
        data = pa.table({"id": pa.array(ids, pa.int64()), "country": [value] * len(ids)})
        m, d = stage(layout, pipeline, key, {"part-0.parquet": data}, attempt=attempt, partition_columns=())
        pub = publisher(url, table, layout, "replace", replace_key="country", partition_by=())
        publish(pub, m, d)

    country("upper", "US", range(0, 5))
    country("lower", "us", range(10, 13))
    country("lower", "us", range(20, 22), attempt=2)  # a re-run of "us" replaces its own rows only
    assert sorted(r[0] for r in rows(url, table)) == [0, 1, 2, 3, 4, 20, 21]


def test_a_marker_table_whose_keys_ignore_case_is_refused_naming_the_fix(database_urls, names, layout):
    """A MariaDB marker table of an older walsink (default, case-insensitive collation) is refused
    before anything is written, with the statement that fixes it; after it, the publish goes on."""
    url = database_urls("mysql")
    table, pipeline = names
    marker_table = f"m_{table}"
    engine = sa.create_engine(url)
    try:
        _old_marker_table(engine, marker_table)
        _fix_as_the_refusal_says(url, table, layout, marker_table)
        with engine.connect() as conn:
            collations = dict(
                conn.execute(
                    sa.text(
                        "SELECT COLUMN_NAME, COLLATION_NAME FROM information_schema.COLUMNS "
                        "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = :t"
                    ),
                    {"t": marker_table},
                ).all()
            )
        assert {collations[c] for c in ("pipeline", "checkpoint_key", "attempt_id")} == {"utf8mb4_bin"}
        m, d = day_manifest(layout, pipeline, n=4)
        publish(publisher(url, table, layout, marker_table=marker_table), m, d)
        assert len(rows(url, table)) == 4
    finally:
        engine.dispose()


def test_a_marker_table_of_an_older_walsink_gets_its_new_column(url, names, layout):
    """Marker tables created before reprocess existed lack ``replaced_values``: added on first use.

    Their rows record no key values, so a new version of such a checkpoint is refused, not guessed.
    """
    from airflow_provider_walsink.core.protocol.errors import SupersedeError

    table, pipeline = names
    marker_table = f"m_{table}"
    engine = sa.create_engine(url)
    try:
        old = _old_marker_table(engine, marker_table)
        if engine.dialect.name == "mysql":  # its keys ignore case: refused until the operator fixes them
            _fix_as_the_refusal_says(url, table, layout, marker_table)
        v1, d1 = day_manifest(layout, pipeline, n=5)
        with engine.begin() as conn:  # v1, published by the older walsink
            conn.execute(old.insert().values(
                pipeline=pipeline, checkpoint_key=DAY1, attempt_id=v1.attempt_id, epoch=1, rows=5,
                target_table=table, published_at=sa.func.now()))  # fmt: skip
        pub = lambda: publisher(url, table, layout, "replace", marker_table=marker_table)  # noqa: E731
        assert pub().published_attempt(v1) == v1.attempt_id
        columns = {c["name"] for c in sa.inspect(engine).get_columns(marker_table)}
        assert "replaced_values" in columns
        v2, d2 = day_manifest(layout, pipeline, n=3, attempt=2)
        with pytest.raises(SupersedeError, match="records no key values"):
            publish(pub(), v2, d2, epoch=2, supersedes=v1.attempt_id)
        # A first version through the upgraded table records them.
        other, d3 = day_manifest(layout, pipeline, key=DAY2, n=2)
        publish(pub(), other, d3)
        with engine.connect() as conn:
            recorded = conn.execute(
                sa.text(f"SELECT replaced_values FROM {marker_table} WHERE checkpoint_key = :k"), {"k": DAY2}
            ).scalar_one()  # noqa: S608 - test's own identifier
        assert recorded == f'[["{DAY2}"]]'
    finally:
        engine.dispose()
