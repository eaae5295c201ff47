"""Alembic creates the committer schema from empty, and models and migrations agree."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from airflow_provider_walsink.committer.engine import create_committer_engine
from airflow_provider_walsink.committer.migrate import VERSION_TABLE, current_revision, head_revision, upgrade
from airflow_provider_walsink.committer.models import Base
from tests.helpers import REPO

TABLES = {"walsink_pipeline", "walsink_checkpoint", "walsink_transition", VERSION_TABLE}


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
