"""The crash campaign against the table and SQL targets (issues 12 and 14): 0 violations.

The SQL target runs it on PostgreSQL and on MariaDB (MySQL's dialect: ``LOAD DATA LOCAL``,
InnoDB row locks with ``innodb_lock_wait_timeout``).

See :mod:`tests.harness.targets`: SIGKILLs around each target's own commit,
zombie tries stopped right before it and resumed after a takeover, re-runs
after retention, a reprocessed checkpoint (a new version under the same
faults); every checkpoint's rows read back exactly once. Iceberg and Delta run it
a second time with the tables and their staging on moto's S3 server.
"""

from __future__ import annotations

import pytest

from tests.harness.targets import run_target_campaign
from tests.table_fixtures import s3_server  # noqa: F401 - moto's S3 API server, session-scoped

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("kind", "sql_backend"),
    [("iceberg", None), ("delta", None), ("sql", "postgresql"), ("sql", "mysql")],
    ids=["iceberg", "delta", "sql-postgresql", "sql-mariadb"],
)
def test_crash_schedules_against_each_table_target_have_no_violation(
    kind, sql_backend, database_urls, tmp_path
):
    sql_url = database_urls(sql_backend) if sql_backend else None
    result = run_target_campaign(
        kind, seed=5, schedules=4, workdir=tmp_path, db_url=database_urls("sqlite"), sql_url=sql_url
    )
    print(result.describe())
    assert result.schedules == 4
    assert sum(result.crashes.values()) + result.zombies >= 4, "too few injected faults to prove anything"
    assert result.reprocesses >= 1, "no schedule reprocessed a checkpoint"
    assert result.violations == []


@pytest.mark.parametrize("kind", ["iceberg", "delta"], ids=["iceberg-s3", "delta-s3"])
def test_crash_schedules_with_tables_and_staging_on_s3_have_no_violation(
    kind,
    database_urls,
    s3_server,  # noqa: F811
    tmp_path,
):
    """The same campaign with the table and its staging in a bucket of moto's S3 server (issue 23):
    attempts staged and sealed through the StagingStore, commits SIGKILLed or stopped around the
    table commit reference the staged objects; every row read back once through the library on S3."""
    result = run_target_campaign(
        kind,
        seed=1,  # one append and one overwrite schedule per kind (the re-run after retention)
        schedules=2,
        workdir=tmp_path,
        db_url=database_urls("sqlite"),
        s3_endpoint=s3_server.endpoint,
    )
    print(result.describe())
    assert result.schedules == 2
    assert sum(result.crashes.values()) + result.zombies >= 2, "too few injected faults to prove anything"
    assert result.reprocesses >= 1, "no schedule reprocessed a checkpoint"
    assert result.retention_reruns >= 1, "no overwrite schedule re-ran an interval after retention"
    assert result.violations == []
