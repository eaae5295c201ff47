#!/usr/bin/env bash
# README's test command: install (idempotent), lint (ruff, import-linter), then the whole test suite.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh tests/test_store.py -x`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/lint-imports --no-cache  # the core never imports Airflow; no import circle (setup.cfg)
set +e
.venv/bin/python -m pytest "$@"
status=$?
set -e
exit $status
