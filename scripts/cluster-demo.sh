#!/usr/bin/env bash
# The second demo command: the same example pipelines in production shape, without
# Docker. The Spark services of docker/compose.yaml (a standalone master and two
# workers) run as local processes on 127.0.0.1, Airflow's metadata and the committer
# table live on PostgreSQL (WALSINK_CLUSTER_DEMO_PG_URL, default the local server's
# `test` database), and the example DAGs submit through the compose file's
# `spark_cluster` connection; the S3 example stages on a local S3 server (moto on
# loopback; --no-s3 skips it). Fails unless every checkpoint is COMMITTED.
# See scripts/cluster_demo.py; `bash scripts/demo.sh` stays on the embedded defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export WALSINK_CLUSTER_DEMO_HOME=${WALSINK_CLUSTER_DEMO_HOME:-$PWD/var/cluster-demo}
exec .venv/bin/python scripts/cluster_demo.py "$@"
