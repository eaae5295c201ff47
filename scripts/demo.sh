#!/usr/bin/env bash
# README's main command: set up .venv, then run the example pipelines on a real
# Airflow (scheduler, dag-processor, triggerer, api-server started in the background
# and stopped at the end) with an Airflow home under var/demo, on the embedded
# defaults (local files, SQLite metadata and committer databases): three intervals,
# then a backfill, then `walsink status` (fails unless every checkpoint is COMMITTED).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export WALSINK_DEMO_HOME=${WALSINK_DEMO_HOME:-$PWD/var/demo}
exec .venv/bin/python scripts/demo.py "$@"
