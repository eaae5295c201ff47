"""The audit checks on real staged files (Parquet written by pyarrow, read by DuckDB),
the audit gate's verdicts, and commits that refuse what the audit did not pass."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from airflow_provider_walsink.core.commit import CheckpointCommitter, CheckpointWriter
from airflow_provider_walsink.core.commit.audit import (
    AuditError,
    CallableCheck,
    CheckResult,
    NotNullCheck,
    RowCountCheck,
    SqlPredicateCheck,
    StagedData,
    as_checks,
    audit_checkpoint,
    run_checks,
)
from airflow_provider_walsink.core.commit.sealed import read_sealed_attempt
from airflow_provider_walsink.core.protocol import CheckpointState as S
from airflow_provider_walsink.core.protocol.errors import NotDurableError, PathEscapeError
from airflow_provider_walsink.core.staging.resolve import as_store
from airflow_provider_walsink.core.store import AuditRejectedError, NotAuditedError
from airflow_provider_walsink.core.targets import FilePublisher
from tests.helpers import ACTOR, stage_tables, target_files

NULL_ROWS = (10, 500, 990)


def events(ids: range, *, null_user_ids=(), negative=()) -> pa.Table:
    return pa.table(
        {
            "id": list(ids),
            "user_id": [None if i in null_user_ids else 1000 + i for i in ids],
            "amount_cents": [-5 if i in negative else i * 7 % 500 for i in ids],
        }
    )


def thousand_rows(**kw) -> dict[str, pa.Table]:
    """1,000 rows in three files over two partitions."""
    return {
        "dt=2026-01-01/part-0.parquet": events(range(0, 400), **kw),
        "dt=2026-01-01/part-1.parquet": events(range(400, 700), **kw),
        "dt=2026-01-02/part-0.parquet": events(range(700, 1000), **kw),
    }


def staged(store, layout, tables, *, key="k", file_format="parquet", partition_columns=("dt",)):
    record, manifest, attempt_dir = stage_tables(
        store, layout, "p", key, tables, file_format=file_format, partition_columns=partition_columns
    )
    return StagedData(layout, manifest, attempt_dir)


def judge(check, data) -> CheckResult:
    with data:
        (result,) = run_checks([check], data).results
    return result


# ------------------------------------------------------------------ row count


def test_row_count_bounds_come_from_the_manifest_without_reading_data(sqlite_store, layout):
    data = staged(sqlite_store, layout, thousand_rows())
    # The files' bytes are not read: garbage of the same size changes nothing.
    for path in data.files:
        size = os.path.getsize(path)
        with open(path, "wb") as f:
            f.write(b"\0" * size)
    assert judge(RowCountCheck(min_rows=1, max_rows=1000), data) == CheckResult(
        "row_count(min=1, max=1,000)", True, "1,000 rows, within bounds"
    )
    assert judge(RowCountCheck(min_rows=1001), data) == CheckResult(
        "row_count(min=1,001)", False, "1,000 rows, fewer than the minimum 1,001"
    )
    assert judge(RowCountCheck(max_rows=999), data) == CheckResult(
        "row_count(max=999)", False, "1,000 rows, more than the maximum 999"
    )


def test_row_count_refuses_to_guess_when_the_writer_did_not_count(sqlite_store, layout):
    sqlite_store.register("p", "k", mode="overwrite", actor=ACTOR)
    writer = CheckpointWriter(sqlite_store, layout, "p", "k", actor=ACTOR)
    (writer.begin() / "part-0.csv").write_bytes(b"a\n")
    writer.add_files(["part-0.csv"])  # no row counts
    manifest, _ = writer.seal(file_format="csv")
    with pytest.raises(AuditError, match=r"no row count for 1 committable\(s\) \(part-0.csv\)"):
        RowCountCheck(min_rows=1).run(StagedData(layout, manifest, writer.attempt_dir))


@pytest.mark.parametrize(
    "kwargs, problem",
    [({}, "needs min_rows, max_rows or both"), ({"min_rows": -1}, "non-negative"), ({"min_rows": 5, "max_rows": 4}, "above")],
)  # fmt: skip
def test_row_count_bounds_are_checked_when_built(kwargs, problem):
    with pytest.raises(ValueError, match=problem):
        RowCountCheck(**kwargs)


# ------------------------------------------------------------------ not null


def test_not_null_counts_null_rows_across_files_and_partitions(sqlite_store, layout):
    bad = staged(sqlite_store, layout, thousand_rows(null_user_ids=NULL_ROWS))
    assert judge(NotNullCheck("user_id"), bad) == CheckResult(
        "not_null(user_id)", False, "3 of 1,000 rows are NULL"
    )
    both = judge(NotNullCheck("id", "user_id", "dt"), bad)  # dt: the partition column, from the paths
    assert both == CheckResult("not_null(id, user_id, dt)", False, "user_id: 3 of 1,000 rows are NULL")
    good = staged(sqlite_store, layout, thousand_rows(), key="k2")
    assert judge(NotNullCheck("user_id", "dt"), good) == CheckResult(
        "not_null(user_id, dt)", True, "no NULL in 1,000 rows"
    )


def test_not_null_fails_on_a_missing_column_and_a_null_partition(sqlite_store, layout):
    tables = {
        "dt=2026-01-01/part-0.parquet": events(range(0, 5)),
        "dt=__HIVE_DEFAULT_PARTITION__/part-0.parquet": events(range(5, 7)),
    }
    data = staged(sqlite_store, layout, tables)
    assert judge(NotNullCheck("dt"), data).reason == "2 of 7 rows are NULL"
    missing = judge(NotNullCheck("user_id", "country"), data)
    assert not missing.passed
    assert missing.reason == "column country not in the staged data (columns: id, user_id, amount_cents, dt)"


def test_a_quote_in_a_column_name_stays_inside_the_identifier(sqlite_store, layout):
    tricky = 'a"b; DROP TABLE staged; --'
    table = pa.table({tricky: [1, None, 3], "id": [1, 2, 3]})
    data = staged(sqlite_store, layout, {"part-0.parquet": table}, partition_columns=())
    assert judge(NotNullCheck(tricky), data).reason == "1 of 3 rows are NULL"


@pytest.mark.parametrize("file_format", ["json", "csv"])
def test_not_null_reads_json_and_csv_staging(sqlite_store, layout, file_format):
    tables = {"dt=2026-01-01/part-0": events(range(0, 50), null_user_ids=(3, 4))}
    data = staged(sqlite_store, layout, tables, file_format=file_format)
    assert judge(NotNullCheck("user_id"), data).reason == "2 of 50 rows are NULL"


def test_a_format_duckdb_does_not_read_here_is_an_error_not_a_verdict(sqlite_store, layout):
    data = staged(
        sqlite_store, layout, {"part-0.orc": events(range(3))}, file_format="orc", partition_columns=()
    )
    with pytest.raises(AuditError, match="cannot read orc files"):
        judge(NotNullCheck("id"), data)


# ------------------------------------------------------------------ SQL predicate


def test_sql_predicate_must_hold_for_every_row(sqlite_store, layout):
    data = staged(sqlite_store, layout, thousand_rows(negative=(1, 2), null_user_ids=(7,)))
    assert judge(SqlPredicateCheck("amount_cents >= 0"), data) == CheckResult(
        "sql(amount_cents >= 0)", False, "2 of 1,000 rows do not satisfy it"
    )
    # NULL is not TRUE: the row fails, unless the predicate allows it.
    assert judge(SqlPredicateCheck("user_id > 0"), data).reason == "1 of 1,000 rows do not satisfy it"
    assert judge(SqlPredicateCheck("user_id IS NULL OR user_id > 0"), data).passed
    # Partition columns take part; a name replaces the predicate in results.
    named = SqlPredicateCheck("dt IN ('2026-01-01', '2026-01-02') AND id < 1000", name="in_interval")
    assert judge(named, data) == CheckResult(
        "in_interval", True, "all 1,000 rows satisfy `dt IN ('2026-01-01', '2026-01-02') AND id < 1000`"
    )


@pytest.mark.parametrize("predicate", ["x > 0; DROP TABLE staged", "x > 0) OR (1 = 1", "SELECT 1", ""])
def test_sql_predicate_is_one_expression_checked_when_built(predicate):
    with pytest.raises(ValueError, match="SQL"):
        SqlPredicateCheck(predicate)


def test_sql_predicate_cannot_read_any_file_but_the_staged_ones(sqlite_store, layout, tmp_path):
    secret = tmp_path / "secret.csv"
    secret.write_text("token\nhunter2\n")
    data = staged(sqlite_store, layout, thousand_rows())
    # A file in the attempt directory that the manifest does not list is out of reach too.
    (data.attempt_dir / "stray.csv").write_text("x\n1\n")
    for path in (secret, data.attempt_dir / "stray.csv"):
        sneaky = SqlPredicateCheck(f"(SELECT count(*) FROM read_csv('{path}')) = 0")
        with pytest.raises(Exception, match="disabled by configuration"):
            judge(sneaky, data)
    with data:
        conn = data.connection()
        with pytest.raises(Exception, match="disabled by configuration"):
            conn.sql(f"SELECT * FROM read_csv('{secret}')").fetchall()
        with pytest.raises(Exception, match="locked"):
            conn.execute("SET enable_external_access = true")


def test_a_manifest_cannot_make_the_audit_read_outside_the_staging_root(sqlite_store, layout, tmp_path):
    record, manifest, attempt_dir = stage_tables(
        sqlite_store, layout, "p", "k", {"part-0.parquet": events(range(3))}
    )
    outside = tmp_path / "outside.parquet"
    os.replace(attempt_dir / "part-0.parquet", outside)
    os.symlink(outside, attempt_dir / "part-0.parquet")  # the sealed path now leads outside
    with pytest.raises(PathEscapeError, match="symlink"):
        StagedData(layout, manifest, attempt_dir)


# ------------------------------------------------------------------ callables


def test_a_callable_check_judges_through_the_staged_data(sqlite_store, layout):
    data = staged(sqlite_store, layout, thousand_rows(negative=(5,)))

    def balance_is_positive(s: StagedData):
        ((total,),) = s.connection().sql("SELECT sum(amount_cents) FROM staged").fetchall()
        return total > 0, f"balance {total:,}"

    def at_most_two_partitions(s: StagedData) -> bool:
        return len({c.partition_path for c in s.manifest.committables}) <= 1

    checks = as_checks([balance_is_positive, CallableCheck(at_most_two_partitions, name="one_day")])
    with data:
        results = run_checks(checks, data).results
    assert results[0].check == "balance_is_positive" and results[0].passed
    assert results[0].reason.startswith("balance ")
    assert results[1] == CheckResult("one_day", False, "returned False")
    with pytest.raises(AuditError, match="returned int"):
        judge(CallableCheck(lambda s: 1, name="bad"), data)


def test_audit_lists_are_checked_when_the_dag_is_built():
    with pytest.raises(TypeError, match="AuditCheck or a callable"):
        as_checks(["user_id"])
    with pytest.raises(ValueError, match="at least one check"):
        as_checks([])
    with pytest.raises(ValueError, match=r"not_null\(a\) appear"):
        as_checks([NotNullCheck("a"), NotNullCheck("a")])


# ------------------------------------------------------------------ the gate and the commit


CHECKS = [RowCountCheck(min_rows=1), NotNullCheck("user_id"), SqlPredicateCheck("amount_cents >= 0")]


def test_a_failed_audit_rejects_and_nothing_is_published(store, layout, tmp_path):
    target = tmp_path / "target"
    stage_tables(store, layout, "p", "k", thousand_rows(null_user_ids=NULL_ROWS), partition_columns=("dt",))
    outcome = audit_checkpoint(store, layout, "p", "k", CHECKS, actor=ACTOR)
    assert outcome.rejected and not outcome.already
    assert [c["passed"] for c in outcome.checks] == [True, False, True]
    record = store.require("p", "k")
    assert record.state is S.REJECTED and record.error == "not_null(user_id): 3 of 1,000 rows are NULL"
    verdict = [h for h in store.history("p", "k") if h.to_state == "REJECTED"][0]
    assert '"check": "not_null(user_id)", "passed": false' in verdict.detail

    committer = CheckpointCommitter(
        store, layout, FilePublisher(target, "overwrite", layout=layout), mode="overwrite"
    )
    with pytest.raises(AuditRejectedError, match=r"not_null\(user_id\): 3 of 1,000 rows are NULL"):
        committer.commit("p", "k", actor=ACTOR)
    assert not target.exists()
    assert store.require("p", "k").state is S.REJECTED
    # Re-running the audit keeps the verdict and says so.
    again = audit_checkpoint(store, layout, "p", "k", CHECKS, actor=ACTOR)
    assert again.rejected and again.already and "3 of 1,000 rows are NULL" in again.message


def test_an_audited_pipeline_publishes_only_what_passed(store, layout, tmp_path):
    target = tmp_path / "target"
    record, manifest, _ = stage_tables(store, layout, "p", "k", thousand_rows(), partition_columns=("dt",))
    committer = CheckpointCommitter(
        store, layout, FilePublisher(target, "overwrite", layout=layout), mode="overwrite", require_audit=True
    )
    with pytest.raises(NotAuditedError):
        committer.commit("p", "k", actor=ACTOR)
    assert not target.exists()
    outcome = audit_checkpoint(store, layout, "p", "k", CHECKS, actor=ACTOR)
    assert outcome.verdict == "AUDITED" and outcome.state == "AUDITED"
    history = len(store.history("p", "k"))
    assert audit_checkpoint(store, layout, "p", "k", CHECKS, actor=ACTOR).already  # a no-op
    assert len(store.history("p", "k")) == history
    summary = committer.commit("p", "k", actor=ACTOR)
    assert summary.state == "COMMITTED" and summary.published == 3
    assert len(target_files(target)) == 3
    done = audit_checkpoint(store, layout, "p", "k", CHECKS, actor=ACTOR)
    assert done.verdict is None and "COMMITTED" in done.message  # nothing left to audit


def test_an_audit_that_cannot_run_records_nothing(sqlite_store, layout):
    stage_tables(sqlite_store, layout, "p", "k", {"part-0.orc": events(range(3))}, file_format="orc")
    before = sqlite_store.history("p", "k")
    with pytest.raises(AuditError):
        audit_checkpoint(sqlite_store, layout, "p", "k", [NotNullCheck("id")], actor=ACTOR)
    assert sqlite_store.require("p", "k").state is S.DURABLE
    assert sqlite_store.history("p", "k") == before


def test_only_a_durable_checkpoint_is_audited(sqlite_store, layout):
    stage_tables(sqlite_store, layout, "p", "k", thousand_rows(), durable=False, partition_columns=("dt",))
    with pytest.raises(NotDurableError, match="have not been verified"):
        audit_checkpoint(sqlite_store, layout, "p", "k", CHECKS, actor=ACTOR)


def test_the_audit_reads_the_sealed_manifest_the_commit_reads(sqlite_store, layout):
    record, manifest, attempt_dir = stage_tables(
        sqlite_store, layout, "p", "k", thousand_rows(), partition_columns=("dt",)
    )
    read, attempt = read_sealed_attempt(as_store(layout), sqlite_store.require("p", "k"))
    assert (read, attempt.location.path) == (manifest, str(attempt_dir))


def test_the_audit_core_does_not_import_airflow():
    """Like the committer, the audit runs outside Airflow (a script, a notebook, the CLI)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name == 'airflow' or name.startswith('airflow.'):\n"
        "            raise ImportError('blocked ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import airflow_provider_walsink.core.commit.audit\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
