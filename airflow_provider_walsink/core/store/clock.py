"""The database's clock, as SQL: lease expiry is never judged by a client's clock.

A worker whose clock runs fast must not see a live lease as expired, nor one
whose clock runs slow keep a lease alive: every lease decision compares
against ``now`` read from the committer database inside the same
transaction (PostgreSQL ``now()``, MySQL/MariaDB ``UTC_TIMESTAMP(6)``; for
SQLite, which runs inside the client process, the host's clock as SQLite
reads it). All times are naive UTC.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import func
from sqlalchemy.sql.elements import ColumnElement

from airflow_provider_walsink.core.store.models import Timestamp


def db_now(dialect: str) -> ColumnElement[datetime]:
    """An SQL expression for the database's current time, naive UTC."""
    if dialect == "postgresql":
        return func.timezone("UTC", func.now(), type_=Timestamp)
    if dialect in ("mysql", "mariadb"):
        return func.utc_timestamp(6, type_=Timestamp)
    # SQLite: microseconds are not available; milliseconds sort correctly
    # against SQLAlchemy's stored 'YYYY-MM-DD HH:MM:SS.ffffff' strings.
    return func.strftime("%Y-%m-%d %H:%M:%f", "now", type_=Timestamp)


def as_datetime(value: Any) -> datetime:
    """A ``db_now`` value as fetched (a datetime, or SQLite's text) as a naive datetime."""
    if isinstance(value, datetime):
        return value.replace(tzinfo=None) if value.tzinfo else value
    return datetime.fromisoformat(str(value))
