"""The file target checks the staged schema against what the target holds, before it changes.

Day 1 writes ``amount`` as a long, day 2 as a string: without the check the
commit succeeded and readers broke (pyarrow refuses ``"12.50"`` as int64,
DuckDB silently reads it as 13). Now day 2 is refused, naming the column and
both types, the checkpoint stays uncommitted with its error recorded, the
target unchanged; ``schema_evolution`` changes the schema on purpose.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from airflow_provider_walsink.core.commit import CheckpointCommitter
from airflow_provider_walsink.core.protocol import CheckpointState as S
from airflow_provider_walsink.core.protocol.errors import LayoutError
from airflow_provider_walsink.core.targets.files import FilePublisher
from airflow_provider_walsink.core.targets.registry import TargetOptions, resolve_target
from tests.helpers import ACTOR, stage_tables

DAY1, DAY2, DAY3 = "20260101T000000Z", "20260102T000000Z", "20260103T000000Z"


def day(dt: str, **columns: pa.Array) -> dict[str, pa.Table]:
    return {f"dt={dt}/part-00000.snappy.parquet": pa.table(columns)}


def commit(store, layout, target: Path, key: str, tables: dict, *, mode: str = "append", **extra):
    stage_tables(store, layout, "p", key, tables, mode=mode, partition_columns=("dt",))
    publisher = resolve_target(
        str(target), TargetOptions(mode=mode, layout=layout, partition_by=("dt",), extra=extra)
    )
    return CheckpointCommitter(store, layout, publisher, mode=mode, lease_ttl=timedelta(seconds=30)).commit(
        "p", key, actor=ACTOR
    )


def files_in(target: Path) -> list[str]:
    return sorted(str(p.relative_to(target)) for p in target.rglob("*.parquet"))


def read_pyarrow(target: Path, *, union: bool = False) -> list[dict]:
    schema = None
    if union:
        schema = pa.unify_schemas([pq.read_schema(target / f) for f in files_in(target)])
    table = ds.dataset(target, format="parquet", partitioning="hive", schema=schema).to_table()
    return sorted(table.to_pylist(), key=lambda r: r["id"])


def read_duckdb(target: Path, *, union: bool = False) -> list[tuple]:
    glob = str(target / "*" / "*.parquet")
    query = (
        f"SELECT * FROM read_parquet('{glob}', hive_partitioning = true, union_by_name = {union}) ORDER BY id"
    )
    return duckdb.sql(query).fetchall()


AMOUNT_LONG = day("2026-01-01", id=pa.array([1, 2], pa.int64()), amount=pa.array([10, 20], pa.int64()))
AMOUNT_TEXT = day("2026-01-02", id=pa.array([3], pa.int64()), amount=pa.array(["12.50"], pa.string()))


def test_a_changed_column_type_is_refused_naming_the_column_and_both_types(sqlite_store, layout, tmp_path):
    target = tmp_path / "target"
    assert commit(sqlite_store, layout, target, DAY1, AMOUNT_LONG).state == "COMMITTED"
    before = files_in(target)
    with pytest.raises(LayoutError, match=r"column 'amount' is string, the target has int64") as err:
        commit(sqlite_store, layout, target, DAY2, AMOUNT_TEXT)
    assert "schema_evolution" in str(err.value)  # the way to change it on purpose
    record = sqlite_store.require("p", DAY2)
    assert record.state is S.FAILED and "'amount' is string, the target has int64" in (record.error or "")
    assert files_in(target) == before  # target unchanged
    # Readers still read the dataset, and read it right.
    assert [r["amount"] for r in read_pyarrow(target)] == [10, 20]
    assert [r[1] for r in read_duckdb(target)] == [10, 20]


def test_a_type_change_on_purpose_commits_with_schema_evolution_any(sqlite_store, layout, tmp_path):
    target = tmp_path / "target"
    commit(sqlite_store, layout, target, DAY1, AMOUNT_LONG)
    summary = commit(sqlite_store, layout, target, DAY2, AMOUNT_TEXT, schema_evolution="any")
    assert summary.state == "COMMITTED"


def test_columns_in_another_order_are_accepted_and_read_back_by_name(sqlite_store, layout, tmp_path):
    target = tmp_path / "target"
    commit(sqlite_store, layout, target, DAY1, AMOUNT_LONG)
    reordered = day("2026-01-02", amount=pa.array([30], pa.int64()), id=pa.array([3], pa.int64()))
    assert commit(sqlite_store, layout, target, DAY2, reordered).state == "COMMITTED"
    assert [(r["id"], r["amount"]) for r in read_pyarrow(target)] == [(1, 10), (2, 20), (3, 30)]
    assert [(r[0], r[1]) for r in read_duckdb(target)] == [(1, 10), (2, 20), (3, 30)]


def test_a_new_nullable_column_needs_schema_evolution_union_and_union_readers_see_it(
    sqlite_store, layout, tmp_path
):
    target = tmp_path / "target"
    commit(sqlite_store, layout, target, DAY1, AMOUNT_LONG)
    with_note = day(
        "2026-01-02", id=pa.array([3], pa.int64()), amount=pa.array([30], pa.int64()), note=pa.array(["x"])
    )
    with pytest.raises(LayoutError, match=r"columns not in the target \['note'\]"):
        commit(sqlite_store, layout, target, DAY2, with_note)
    # Written again (a new attempt of the failed checkpoint), with the evolution asked for.
    assert (
        commit(sqlite_store, layout, target, DAY2, with_note, schema_evolution="union").state == "COMMITTED"
    )
    # Readers that union the files' schemas by name see the new column, null where it was not written.
    assert [(r["id"], r["note"]) for r in read_pyarrow(target, union=True)] == [
        (1, None),
        (2, None),
        (3, "x"),
    ]
    assert [(r[0], r[2]) for r in read_duckdb(target, union=True)] == [(1, None), (2, None), (3, "x")]
    # A type change is still refused under "union", also of a column only the record knows.
    changed = day("2026-01-03", id=pa.array([4], pa.int64()), note=pa.array([1], pa.int64()))
    with pytest.raises(LayoutError, match=r"column 'note' is int64, the target has string"):
        commit(sqlite_store, layout, target, DAY3, changed, schema_evolution="union")


def test_a_target_written_before_the_schema_record_is_checked_against_one_of_its_files(
    sqlite_store, layout, tmp_path
):
    """A target with data but no schema record (an older walsink, another writer): the footer of one
    existing file is what it holds."""
    target = tmp_path / "target"
    (target / "dt=2025-12-31").mkdir(parents=True)
    pq.write_table(
        pa.table({"id": pa.array([0], pa.int64()), "amount": pa.array([5], pa.int64())}),
        target / "dt=2025-12-31" / "part-0.parquet",
    )
    with pytest.raises(LayoutError, match=r"column 'amount' is string, the target has int64"):
        commit(sqlite_store, layout, target, DAY2, AMOUNT_TEXT)
    assert files_in(target) == ["dt=2025-12-31/part-0.parquet"]


def test_schema_evolution_is_a_file_target_option_with_known_values(layout, tmp_path):
    with pytest.raises(LayoutError, match="schema_evolution"):
        FilePublisher.from_uri(
            str(tmp_path), TargetOptions(mode="append", layout=layout, extra={"schema_evolution": "yes"})
        )


def test_two_first_publishes_of_different_schemas_racing_on_an_empty_target_publish_one(
    sqlite_store, layout, tmp_path
):
    """A's check finds an empty target; before A records its schema, B publishes a long ``amount``
    (run from A's first fence, the last point before A changes anything). A must be checked again
    against what B recorded, and refused, not publish a string ``amount`` beside it."""
    from airflow_provider_walsink.core.targets.base import StaticContext

    target = tmp_path / "target"
    _, text_manifest, text_dir = stage_tables(
        sqlite_store, layout, "a", DAY2, AMOUNT_TEXT, mode="append", partition_columns=("dt",)
    )
    _, long_manifest, long_dir = stage_tables(
        sqlite_store, layout, "b", DAY1, AMOUNT_LONG, mode="append", partition_columns=("dt",)
    )

    def publisher() -> FilePublisher:
        return FilePublisher(target, "append", layout=layout, partition_by=("dt",))

    class RacedContext(StaticContext):
        raced = False

        def fence(self) -> None:
            if not self.raced:
                self.raced = True
                publisher().publish(long_manifest, long_dir, StaticContext.for_manifest(long_manifest))

    with pytest.raises(LayoutError, match=r"column 'amount' is string, the target has int64"):
        publisher().publish(text_manifest, text_dir, RacedContext.for_manifest(text_manifest))
    assert files_in(target) == [f"dt=2026-01-01/{DAY1}-{long_manifest.attempt_id}-00000.snappy.parquet"]
    assert [r["amount"] for r in read_pyarrow(target)] == [10, 20]
