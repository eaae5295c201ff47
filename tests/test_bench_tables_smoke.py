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
