"""Smoke test of the benchmark code (bench/), for correctness only.

Runs the smallest size of the non-Spark benchmarks through the same command
a user runs. The benchmarks check their own results (every file published,
staging cleaned, every checkpoint committed) and fail loudly otherwise; this
test asserts on that and on the tables, never on a timing.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import missing_prerequisite

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent


def test_bench_runs_its_smallest_size(tmp_path):
    if shutil.which("pgbench") is None:
        missing_prerequisite("pgbench is not installed (apt-get install -y postgresql-contrib)")
    out = tmp_path / "tables.md"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.run",
            "--size",
            "smoke",
            "--only",
            "commit,table,sql",
            "--work-dir",
            str(tmp_path),
            "--markdown",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    tables = out.read_text()
    assert "### Machine" in tables and "| cores" in tables
    # Commit benchmark: both modes at both sizes, each with a ratio.
    for files in ("10", "100"):
        for mode in ("append", "overwrite"):
            assert any(
                line.startswith(f"| {files:>7} | {mode}") and line.rstrip().endswith("|") and "x" in line
                for line in tables.splitlines()
            ), f"no commit row for {files} files, {mode}:\n{tables}"
    assert "pgbench -N TPS" in tables and "walsink (lease) checkpoints/s" in tables
    assert "walsink (table fencing) checkpoints/s" in tables and "table fencing / pgbench" in tables
    assert "protocol floor, checkpoints/s" in tables
    # SQL target benchmark (6): one row per backend, each with a rate ratio. The benchmark
    # itself checks every load left exactly the checkpoint's rows.
    cells = [
        [c.strip() for c in line.split("|")[1:-1]] for line in tables.splitlines() if line.startswith("|")
    ]
    for baseline in ("PostgreSQL COPY FROM STDIN", "MariaDB LOAD DATA LOCAL INFILE"):
        assert any(c[:2] == ["2,000", baseline] and c[6].endswith("%") for c in cells), tables
    # Scratch space is removed afterwards.
    assert [p.name for p in tmp_path.iterdir()] == ["tables.md"]
