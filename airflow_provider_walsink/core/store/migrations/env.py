"""Alembic environment for the walsink committer table.

Used by :func:`airflow_provider_walsink.core.store.migrate.upgrade` (which hands
in a connection) and by the ``alembic`` command line through the repository's
``alembic.ini`` (which takes the URL from ``WALSINK_DATABASE_URL``).
"""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import Connection

from airflow_provider_walsink.core.store.engine import create_committer_engine
from airflow_provider_walsink.core.store.models import Base

config = context.config
VERSION_TABLE = config.get_main_option("version_table") or "walsink_alembic_version"


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        version_table=VERSION_TABLE,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
        # Only walsink's own tables: the database may be shared with others.
        include_name=lambda name, type_, _parent: type_ != "table" or name.startswith("walsink_"),
    )


def run_offline() -> None:
    url = config.get_main_option("sqlalchemy.url") or os.environ["WALSINK_DATABASE_URL"]
    context.configure(url=url, target_metadata=Base.metadata, version_table=VERSION_TABLE, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    url = config.get_main_option("sqlalchemy.url") or os.environ.get("WALSINK_DATABASE_URL")
    if not url:
        raise SystemExit("set WALSINK_DATABASE_URL (or sqlalchemy.url) to the committer database")
    engine = create_committer_engine(url)
    try:
        with engine.connect() as conn:
            _configure(conn)
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
