#!/usr/bin/env bash
# README's main command: set up .venv and run the example pipeline end to end on
# the embedded defaults (local files, SQLite committer table), then print the
# commit state of every checkpoint.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export WALSINK_DEMO_HOME=${WALSINK_DEMO_HOME:-$PWD/var/demo}
exec .venv/bin/python -m airflow_provider_walsink.demo "$@"
