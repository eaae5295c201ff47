"""Smoke run of bench/bench_large.py (benchmark 9) at a small size, for correctness only (never a timing).

The benchmark checks its own results (file target: every file in the target,
staging removed; Iceberg: the snapshot's file and row totals) and fails loudly
otherwise; this test asserts that it ran every cell and printed a figure for each.
"""

from __future__ import annotations

from bench import bench_large


def test_bench_large_runs_a_small_size(tmp_path, capsys):
    tables = bench_large.main(["--files", "20,50", "--repeats", "1", "--work-dir", str(tmp_path)])
    assert [t.title.split(":")[0] for t in tables] == ["Machine", "Benchmark 9"]
    rows = tables[1].rows
    assert [(r[0], r[1], r[2]) for r in rows] == [
        ("file", "20", "os.rename loop"),
        ("file", "50", "os.rename loop"),
        ("iceberg", "20", "pyiceberg add_files"),
        ("iceberg", "50", "pyiceberg add_files"),
    ]
    for row in rows:
        assert row[5].endswith("x") and row[9].endswith("MiB") and row[10].endswith("MiB"), row
    assert "iceberg-walsink" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []  # scratch removed
