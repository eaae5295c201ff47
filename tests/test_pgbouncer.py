"""The committer behind PgBouncer in transaction pooling mode (issue 46; docs/production.md,
"PgBouncer"): no session state relied on across transactions, no lock held across them,
no server-side prepared statements.

Real parts: PgBouncer (Debian package) in front of the test PostgreSQL (``pgbouncer`` fixture,
pool of 20). The concurrent commits and group commits through it are
``tests/test_concurrency.py`` and ``tests/test_group_commit.py``, parametrised onto it.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import make_url

from airflow_provider_walsink.core.store import CommitterStore
from airflow_provider_walsink.core.store.engine import create_committer_engine
from airflow_provider_walsink.core.store.migrate import head_revision, upgrade
from tests.helpers import ACTOR

pytestmark = pytest.mark.slow


def test_migrations_through_pgbouncer_run_in_one_transaction_and_leave_no_lock(pgbouncer):
    """``walsink db upgrade`` (the store's migrate) through PgBouncer while another client takes a
    server connection the moment the migration lock is held: the schema ends at head and the lock
    is given back with the transaction. A session-level advisory lock stays on whichever server
    connection took it when the unlock runs on another, and the next migration anywhere waits
    for it forever."""
    from tests.conftest import PG_ADMIN_URL, _server_database

    direct, drop = _server_database(PG_ADMIN_URL, "postgresql")  # a fresh database, no schema yet
    name = make_url(direct).database
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    engine = create_committer_engine(pgbouncer.url(direct))
    other = create_engine(pgbouncer.url(direct))
    held: list = []

    def another_client_takes_a_server(_conn, _cursor, statement, *_args) -> None:
        if held and len(held) == 1:
            busy = other.connect()
            busy.execute(text("SELECT 1"))  # an open transaction: it keeps its server connection
            held.append(busy)
        if "advisory" in statement and not held:
            held.append(statement)

    event.listen(engine, "before_cursor_execute", another_client_takes_a_server)
    try:
        upgrade(engine)
        assert len(held) == 2  # the lock was taken, and another client took a server after it
        held[1].close()
        with admin.connect() as conn:
            locks = conn.execute(
                text(
                    "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
                    "WHERE l.locktype = 'advisory' AND d.datname = :d"
                ),
                {"d": name},
            ).scalar_one()
        assert locks == 0
        with create_engine(direct).connect() as conn:
            assert (
                conn.execute(text("SELECT version_num FROM walsink_alembic_version")).scalar()
                == head_revision()
            )
    finally:
        engine.dispose()
        other.dispose()
        admin.dispose()
        drop()


def test_psycopg3_through_pgbouncer_prepares_no_statement_on_the_server(pgbouncer, pg_url):
    """psycopg 3 prepares a statement on the server after its fifth run on one connection (with no
    rollback between: a group leader taking its members' leases one after another); through
    PgBouncer the next transaction may get another server connection, which has no such
    statement ("prepared statement _pg3_0 does not exist"). Here it does get another one (a
    second client holds the first in an open transaction), and the lease takes go on."""
    from tests.test_store import to_durable

    url = make_url(pgbouncer.url(pg_url)).set(drivername="postgresql+psycopg").render_as_string(False)
    store = CommitterStore.from_url(url, migrate=False)
    keys = [f"k{i}" for i in range(9)]
    for key in keys:
        to_durable(store, key)
    lease = dict(owner="group:leader", ttl=timedelta(minutes=5), actor=ACTOR, mode="overwrite")
    for key in keys[:6]:  # one statement each, the same one, committed six times
        store.acquire_lease("p", key, **lease)
    other = create_engine(pgbouncer.url(pg_url))
    with other.connect() as busy:
        busy.execute(text("SELECT 1"))  # its transaction holds a server connection: the last one used
        for key in keys[6:]:
            store.acquire_lease("p", key, **lease)
    assert {store.require("p", k).lease_owner for k in keys} == {"group:leader"}
    other.dispose()
    store.dispose()
