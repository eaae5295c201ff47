#!/usr/bin/env bash
# README's test command: install (idempotent), lint (ruff, import-linter), then the whole test suite.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh tests/test_store.py -x`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/lint-imports --no-cache  # the core never imports Airflow; no import circle (setup.cfg)
set +e
# Three workers (pytest-xdist) on two cores: every test that uses the running stack (Airflow
# components, the Spark cluster) on one of them (tests/conftest.py: the "stack" group), the rest
# spread over the other two. Most of a test is waiting (on the scheduler, a lease, a retry's delay):
# two heavy tests measured alone used about half a core each, so two workers left a core idle.
.venv/bin/python -m pytest -n 3 --dist loadgroup "$@"
status=$?
set -e
exit $status
