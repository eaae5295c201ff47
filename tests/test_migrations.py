"""Alembic creates the committer schema from empty, and models and migrations agree."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from airflow_provider_walsink.core.store.engine import create_committer_engine
from airflow_provider_walsink.core.store.migrate import (
    VERSION_TABLE,
    current_revision,
    head_revision,
    upgrade,
)
from airflow_provider_walsink.core.store.models import Base
from tests.helpers import REPO

TABLES = {
    "walsink_pipeline",
    "walsink_checkpoint",
    "walsink_transition",
    "walsink_consumer_group",
    "walsink_deadline_notice",
    VERSION_TABLE,
}


def _drop_all(engine) -> None:
    Base.metadata.drop_all(engine)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {VERSION_TABLE}")


def test_alembic_cli_upgrades_from_empty(db_url):
    engine = create_committer_engine(db_url)
    _drop_all(engine)
    assert not TABLES & set(inspect(engine).get_table_names())
    env = {**os.environ, "WALSINK_DATABASE_URL": db_url}
    subprocess.run(
        [sys.executable, "-m", "alembic", "-c", str(REPO / "alembic.ini"), "upgrade", "head"],
        cwd=REPO,
        env=env,
        check=True,
        capture_output=True,
    )
    assert TABLES <= set(inspect(engine).get_table_names())
    with engine.connect() as conn:
        assert current_revision(conn) == head_revision()
    engine.dispose()


def test_models_and_migrations_agree(db_url):
    engine = create_committer_engine(db_url)
    upgrade(engine)
    with engine.connect() as conn:
        ctx = MigrationContext.configure(
            conn,
            opts={
                "compare_type": True,
                # The committer's own tables: the shared test database also holds other
                # components' tables (the SQL target's walsink_markers, its example tables).
                "include_name": lambda name, type_, _p: type_ != "table" or name in Base.metadata.tables,
                "version_table": VERSION_TABLE,
            },
        )
        diff = compare_metadata(ctx, Base.metadata)
    engine.dispose()
    assert diff == []


def test_concurrent_upgrades_from_empty_are_safe(db_url):
    engine = create_committer_engine(db_url)
    _drop_all(engine)
    engine.dispose()

    def migrate(_):
        e = create_committer_engine(db_url)
        try:
            upgrade(e)
        finally:
            e.dispose()

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(migrate, range(4)))
    engine = create_committer_engine(db_url)
    with engine.connect() as conn:
        assert current_revision(conn) == head_revision()
        assert conn.exec_driver_sql(f"SELECT COUNT(*) FROM {VERSION_TABLE}").scalar() == 1
    engine.dispose()


def _downgrade(engine, revision: str) -> None:
    from alembic import command

    from airflow_provider_walsink.core.store.migrate import alembic_config

    cfg = alembic_config()
    with engine.connect() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, revision)
        conn.commit()


def _checkpoint_columns(engine) -> dict[str, dict]:
    return {c["name"]: c for c in inspect(engine).get_columns("walsink_checkpoint")}


def test_0005_adds_staging_root_to_existing_rows_and_downgrades_keeping_them(db_url):
    """Issue 23: rows from before 0005 get a NULL staging root (readers fall back for them);
    a downgrade drops only the column: the checkpoint, its history and its versions stay."""
    from datetime import datetime

    from sqlalchemy import func, insert, select

    from airflow_provider_walsink.core.store.models import checkpoint_table as ckpt
    from airflow_provider_walsink.core.store.models import pipeline_table as pipe
    from airflow_provider_walsink.core.store.models import transition_table as trans
    from airflow_provider_walsink.core.store.models import version_table as vers

    engine = create_committer_engine(db_url)
    _drop_all(engine)
    upgrade(engine, "0004")
    assert "staging_root" not in _checkpoint_columns(engine)
    now = datetime(2026, 11, 1)
    with engine.begin() as conn:  # a checkpoint as walsink before 0005 wrote it (no staging root)
        conn.execute(insert(pipe).values(name="p", mode="overwrite", next_sequence=2, created_at=now))
        cid = conn.execute(
            insert(ckpt).values(
                pipeline="p",
                checkpoint_key="k",
                sequence=1,
                state="COMMITTED",
                attempt=1,
                lease_epoch=1,
                version=2,
                created_at=now,
                updated_at=now,
            )  # fmt: skip
        ).inserted_primary_key[0]
        conn.execute(insert(trans).values(checkpoint_id=cid, to_state="REGISTERED", attempt=0, at=now))
        conn.execute(insert(vers).values(checkpoint_id=cid, version=1, state="SUPERSEDED"))

    upgrade(engine)
    column = _checkpoint_columns(engine)["staging_root"]
    assert column["nullable"] and column["type"].length == 2048
    with engine.connect() as conn:
        assert current_revision(conn) == head_revision()
        assert conn.execute(select(ckpt.c.staging_root).where(ckpt.c.id == cid)).scalar_one() is None
        conn.execute(ckpt.update().where(ckpt.c.id == cid).values(staging_root="s3://bucket/prefix"))
        conn.commit()

    _downgrade(engine, "0004")
    assert "staging_root" not in _checkpoint_columns(engine)
    with engine.connect() as conn:
        assert current_revision(conn) == "0004"
        for table in (ckpt, trans, vers):
            assert conn.execute(select(func.count()).select_from(table)).scalar_one() == 1, table.name

    upgrade(engine)  # and up again: the column is back, empty
    with engine.connect() as conn:
        assert conn.execute(select(ckpt.c.staging_root).where(ckpt.c.id == cid)).scalar_one() is None
    engine.dispose()


def test_0006_adds_source_plan_to_existing_rows_and_downgrades_keeping_them(db_url):
    """Issue 28: rows from before 0006 get a NULL source plan (their retries plan afresh, as
    before); a downgrade drops only the column: the checkpoint, its history and versions stay."""
    from datetime import datetime

    from sqlalchemy import func, insert, select

    from airflow_provider_walsink.core.store.models import checkpoint_table as ckpt
    from airflow_provider_walsink.core.store.models import pipeline_table as pipe
    from airflow_provider_walsink.core.store.models import transition_table as trans
    from airflow_provider_walsink.core.store.models import version_table as vers

    engine = create_committer_engine(db_url)
    _drop_all(engine)
    upgrade(engine, "0005")
    assert "source_plan" not in _checkpoint_columns(engine)
    now = datetime(2026, 11, 1)
    with engine.begin() as conn:  # a checkpoint as walsink before 0006 wrote it (no source plan)
        conn.execute(insert(pipe).values(name="p", mode="append", next_sequence=2, created_at=now))
        cid = conn.execute(
            insert(ckpt).values(
                pipeline="p",
                checkpoint_key="k",
                sequence=1,
                state="COMMITTED",
                attempt=1,
                lease_epoch=1,
                version=2,
                staging_root="/staging",
                end_offsets='{"events": {"0": 5}}',
                created_at=now,
                updated_at=now,
            )  # fmt: skip
        ).inserted_primary_key[0]
        conn.execute(insert(trans).values(checkpoint_id=cid, to_state="REGISTERED", attempt=0, at=now))
        conn.execute(insert(vers).values(checkpoint_id=cid, version=1, state="SUPERSEDED"))

    upgrade(engine)
    assert _checkpoint_columns(engine)["source_plan"]["nullable"]
    plan = '{"end": {"events": {"0": 9}}, "start": {"events": {"0": 5}}, "version": 2}'
    with engine.connect() as conn:
        assert current_revision(conn) == head_revision()
        row = conn.execute(select(ckpt.c.source_plan, ckpt.c.end_offsets).where(ckpt.c.id == cid)).one()
        assert row == (None, '{"events": {"0": 5}}')
        conn.execute(ckpt.update().where(ckpt.c.id == cid).values(source_plan=plan))
        conn.commit()
        assert conn.execute(select(ckpt.c.source_plan).where(ckpt.c.id == cid)).scalar_one() == plan

    _downgrade(engine, "0005")
    assert "source_plan" not in _checkpoint_columns(engine)
    with engine.connect() as conn:
        assert current_revision(conn) == "0005"
        for table in (ckpt, trans, vers):
            assert conn.execute(select(func.count()).select_from(table)).scalar_one() == 1, table.name
        assert conn.execute(select(ckpt.c.staging_root).where(ckpt.c.id == cid)).scalar_one() == "/staging"

    upgrade(engine)  # and up again: the column is back, empty
    with engine.connect() as conn:
        assert conn.execute(select(ckpt.c.source_plan).where(ckpt.c.id == cid)).scalar_one() is None
    engine.dispose()


def _checkpoint_indexes(engine) -> dict[str, list[str]]:
    return {ix["name"]: ix["column_names"] for ix in inspect(engine).get_indexes("walsink_checkpoint")}


def _one_pipeline_with_a_checkpoint(engine) -> None:
    """A pipeline row and one checkpoint row, naming only columns every revision since 0004 has
    (SQLAlchemy inserts only the values given and the Python-side defaults)."""
    from datetime import datetime

    from sqlalchemy import insert

    from airflow_provider_walsink.core.store.models import checkpoint_table as ckpt
    from airflow_provider_walsink.core.store.models import pipeline_table as pipe

    now = datetime(2026, 11, 1)
    with engine.begin() as conn:
        conn.execute(insert(pipe).values(name="p", mode="append", next_sequence=2, created_at=now))
        conn.execute(
            insert(ckpt).values(
                pipeline="p",
                checkpoint_key="k",
                sequence=1,
                state="WRITING",
                attempt=1,
                created_at=now,
                updated_at=now,
            )  # fmt: skip
        )


def test_0007_adds_the_open_state_index_and_downgrades_keeping_rows(db_url):
    """Issue 24: 0007 adds the (state, created_at) index that finds open checkpoints of every
    pipeline without reading the history; a downgrade drops only that index, rows stay."""

    from sqlalchemy import func, select

    from airflow_provider_walsink.core.store.models import checkpoint_table as ckpt

    name = "ix_walsink_checkpoint_state_created_at"
    engine = create_committer_engine(db_url)
    _drop_all(engine)
    upgrade(engine, "0006")
    assert name not in _checkpoint_indexes(engine)
    _one_pipeline_with_a_checkpoint(engine)

    upgrade(engine)
    assert _checkpoint_indexes(engine)[name] == ["state", "created_at"]
    with engine.connect() as conn:
        assert current_revision(conn) == head_revision()

    _downgrade(engine, "0006")
    assert name not in _checkpoint_indexes(engine)
    with engine.connect() as conn:
        assert current_revision(conn) == "0006"
        assert conn.execute(select(func.count()).select_from(ckpt)).scalar_one() == 1

    upgrade(engine)  # and up again
    assert _checkpoint_indexes(engine)[name] == ["state", "created_at"]
    engine.dispose()


def test_0008_adds_the_first_event_claim_and_downgrades_keeping_rows(db_url):
    """0008 adds the pipeline's first-event claim (two nullable columns); a downgrade drops only
    them: on SQLite the pipeline table is altered in place, so no checkpoint row cascades away."""

    from sqlalchemy import func, inspect, select

    from airflow_provider_walsink.core.store.models import checkpoint_table as ckpt
    from airflow_provider_walsink.core.store.models import pipeline_table as pipe

    def columns() -> set[str]:
        return {c["name"] for c in inspect(engine).get_columns("walsink_pipeline")}

    claim = {"first_event_holder", "first_event_claimed_at"}
    engine = create_committer_engine(db_url)
    _drop_all(engine)
    upgrade(engine, "0007")
    assert not claim & columns()
    _one_pipeline_with_a_checkpoint(engine)

    upgrade(engine)
    assert claim <= columns()
    with engine.connect() as conn:
        assert current_revision(conn) == head_revision()
        assert conn.execute(select(pipe.c.first_event_holder)).scalar_one() is None

    _downgrade(engine, "0007")
    assert not claim & columns()
    with engine.connect() as conn:
        assert current_revision(conn) == "0007"
        assert conn.execute(select(func.count()).select_from(ckpt)).scalar_one() == 1
        assert conn.execute(select(func.count()).select_from(pipe)).scalar_one() == 1
    upgrade(engine)
    assert claim <= columns()
    engine.dispose()


@pytest.mark.parametrize(
    ("revision", "table", "key"),
    [
        ("0009", "walsink_consumer_group", ["cluster", "group_id"]),
        ("0014", "walsink_deadline_notice", ["pipeline", "deadline"]),
    ],
)
def test_a_table_revision_adds_its_table_and_downgrades_keeping_rows(db_url, revision, table, key):
    """0009 adds ``walsink_consumer_group`` (which pipeline a Kafka consumer group belongs to,
    keyed by cluster and group id), 0014 ``walsink_deadline_notice`` (a commit deadline's claimed
    notification, keyed by pipeline and Airflow deadline); a downgrade drops only it."""
    from sqlalchemy import func, select

    from airflow_provider_walsink.core.store.models import checkpoint_table as ckpt

    before = f"{int(revision) - 1:04d}"
    engine = create_committer_engine(db_url)
    _drop_all(engine)
    upgrade(engine, before)
    assert table not in inspect(engine).get_table_names()
    _one_pipeline_with_a_checkpoint(engine)

    upgrade(engine, revision)
    assert inspect(engine).get_pk_constraint(table)["constrained_columns"] == key
    with engine.connect() as conn:
        assert current_revision(conn) == revision

    _downgrade(engine, before)
    assert table not in inspect(engine).get_table_names()
    with engine.connect() as conn:
        assert current_revision(conn) == before
        assert conn.execute(select(func.count()).select_from(ckpt)).scalar_one() == 1
    upgrade(engine)
    engine.dispose()


@pytest.mark.parametrize(
    ("revision", "table", "added"),
    [
        ("0010", "walsink_pipeline", ("target_connections",)),
        ("0011", "walsink_pipeline", ("group_leader", "group_leader_until")),
        ("0012", "walsink_checkpoint", ("write_job",)),
        ("0013", "walsink_checkpoint", ("commit_due_at",)),
    ],
)
def test_a_column_revision_adds_its_columns_and_downgrades_keeping_rows(db_url, revision, table, added):
    """0010 adds the pipeline's recorded target connection references, 0011 its group-commit
    lead, 0012 the checkpoint's write job, 0013 its missed commit deadline (nullable columns); a downgrade drops only them: no
    pipeline or checkpoint row cascades away."""
    from sqlalchemy import func, select

    from airflow_provider_walsink.core.store.models import checkpoint_table as ckpt
    from airflow_provider_walsink.core.store.models import pipeline_table as pipe

    def columns() -> set[str]:
        return {c["name"] for c in inspect(engine).get_columns(table)}

    before = f"{int(revision) - 1:04d}"
    engine = create_committer_engine(db_url)
    _drop_all(engine)
    upgrade(engine, before)
    assert not columns() & set(added)
    _one_pipeline_with_a_checkpoint(engine)

    upgrade(engine, revision)
    assert set(added) <= columns()
    with engine.connect() as conn:
        assert current_revision(conn) == revision
        for name in added:
            assert (
                conn.execute(select((pipe if table == "walsink_pipeline" else ckpt).c[name])).scalar_one()
                is None
            )

    _downgrade(engine, before)
    assert not columns() & set(added)
    with engine.connect() as conn:
        assert current_revision(conn) == before
        assert conn.execute(select(func.count()).select_from(ckpt)).scalar_one() == 1
        assert conn.execute(select(func.count()).select_from(pipe)).scalar_one() == 1
    upgrade(engine)
    engine.dispose()
