"""Smoke run of bench/bench_tables.py at its smallest size, for correctness only (never a timing).

The benchmark checks its own results (every staged row in the table, nothing
twice); this test asserts that it ran and printed both tables.
"""

from __future__ import annotations

from bench import bench_tables


def test_bench_tables_runs_its_smallest_size(tmp_path, capsys):
    tables = bench_tables.main(
        ["--files", "5", "--history", "1,3", "--repeats", "1", "--samples", "1", "--work-dir", str(tmp_path)]
    )
    titles = [t.title for t in tables]
    assert titles[1:] == [
        "Table targets: commit of N files vs the library alone",
        "Table targets: marker check as history grows",
        "Iceberg: marker properties after expire_snapshots",
    ]
    assert [row[0] for row in tables[1].rows] == ["iceberg", "delta"]
    # One row per target and history size; the third table: one row per size.
    assert [(row[0], row[1]) for row in tables[2].rows] == [
        ("iceberg", 1),
        ("iceberg", 3),
        ("delta", 1),
        ("delta", 3),
    ]
    assert [row[0] for row in tables[3].rows] == [1, 3]
    assert "marker check" in capsys.readouterr().out


def test_bench_history_runs_its_smallest_size(tmp_path):
    """bench_history (issue 45) at N = 10 and 20: histories built from the targets' marker functions and
    checked by walsink's lookups, one row per measure with its ratio and goal verdict."""
    from bench import bench_history

    tables = bench_history.main(
        ["--sizes", "10,20", "--samples", "1", "--checkpoint-samples", "0", "--work-dir", str(tmp_path)]
    )
    result, built = tables[1], tables[2]
    assert [(row[0], row[1]) for row in result.rows] == [
        ("iceberg", "walsink commit (1 file)"),
        ("iceberg", "reader's table load"),
        ("iceberg", "metadata JSON written"),
        ("delta", "walsink commit (1 file)"),
        ("delta", "reader's table load"),
        ("delta", "commit JSON written"),
    ]  # the commit writing a Delta checkpoint (99 commits of padding each) is left to the real run
    assert all(row[-1] in ("met", "missed") for row in result.rows)
    assert [(row[0], row[1]) for row in built.rows] == [
        ("iceberg", 10),
        ("iceberg", 20),
        ("delta", 10),
        ("delta", 20),
    ]
