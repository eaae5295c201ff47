#!/usr/bin/env bash
# README's test command: install (idempotent), lint (ruff, import-linter), then the whole test suite.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh tests/test_store.py -x`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/lint-imports --no-cache  # the core never imports Airflow; no import circle (setup.cfg)
set +e
# Four workers (pytest-xdist) on two cores: every test that uses the running stack (Airflow
# components, the Spark cluster) on one of them (tests/conftest.py: the "stack" group), the rest
# spread over the other three. Most of a test is waiting (on the scheduler, a lease, a retry's
# delay): with three workers the cores were busy about 80% of the run (process accounting), and
# the whole run took 1,122-1,173 s; with four, 1,057-1,103 s (2026-11-30, bench/README.md "CI time").
.venv/bin/python -m pytest -n 4 --dist loadgroup "$@"
status=$?
set -e
exit $status
