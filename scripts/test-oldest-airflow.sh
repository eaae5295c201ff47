#!/usr/bin/env bash
# Run walsink's core and dag.test() tests against the OLDEST Airflow it supports (setup.cfg:
# apache-airflow>=3.1.1), in a venv of its own (.venv-oldest, git-ignored), beside the CI's
# Airflow 3.3 in .venv. Not part of CI (scripts/test.sh): run it before a release and after
# changing what walsink imports from Airflow. docs/production.md, "Supported Airflow versions".
#
#   scripts/test-oldest-airflow.sh                 # install (first time) and run the selection
#   scripts/test-oldest-airflow.sh -k store -x     # extra arguments go to pytest
#   REINSTALL=1 scripts/test-oldest-airflow.sh     # rebuild .venv-oldest
#
# The selection: the tests that need neither the real scheduler stack (e2e), nor a browser, nor
# the Spark cluster; the committer store and commit protocol (core), the operators, sensor, hook,
# CLI and provider metadata, and the dag.test() runs of the example and audit pipelines (local
# Spark). Tests of features the oldest Airflow lacks (commit deadlines: Airflow 3.3) are left out;
# tests/test_versions.py checks how walsink refuses or degrades them.
set -euo pipefail
cd "$(dirname "$0")/.."

# The oldest supported Airflow and the matching task SDK and providers (exact versions).
AIRFLOW_VERSION="${AIRFLOW_VERSION:-3.1.1}"
TASK_SDK_VERSION="${TASK_SDK_VERSION:-1.1.1}"
STANDARD_PROVIDER_VERSION="${STANDARD_PROVIDER_VERSION:-1.9.0}"
SPARK_PROVIDER_VERSION="${SPARK_PROVIDER_VERSION:-6.3.0}"
PYSPARK_VERSION="${PYSPARK_VERSION:-4.0.1}"
# Libraries released after Airflow 3.1 that break it (its constraint file is not reachable
# from every machine): structlog 26 drops dev.Styles; SQLAlchemy 2.1 is newer than anything
# Airflow 3.1 was tested with; fastapi below 0.118 as Airflow 3.1.1 itself requires.
ERA_PINS=("structlog==25.4.0" "fastapi<0.118" "sqlalchemy>=2.0,<2.1")
VENV="${VENV:-.venv-oldest}"
PYTHON="${PYTHON:-python3.11}"

TESTS=(
  # core: the committer store, manifest, commit protocol, fencing, staging (no Airflow)
  tests/test_manifest.py tests/test_store.py tests/test_commit.py tests/test_fencing.py
  tests/test_staging_store.py tests/test_audit_store.py tests/test_audit_approval.py
  tests/test_gc_store.py tests/test_migrations.py
  # Airflow without the scheduler: operators, sensor, hook, provider, CLI, version guards
  tests/test_provider.py tests/test_pipeline_arguments.py tests/test_commit_operator.py
  tests/test_sensor.py tests/test_hook_connection.py tests/test_run_interval.py tests/test_versions.py
  # dag.test() with local Spark
  tests/test_audit_pipeline.py tests/test_example_dags.py
)

export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PYTHONWARNINGS="ignore::DeprecationWarning"
STAMP="$VENV/.walsink-oldest"
WANT="$AIRFLOW_VERSION $TASK_SDK_VERSION $STANDARD_PROVIDER_VERSION $SPARK_PROVIDER_VERSION $PYSPARK_VERSION ${ERA_PINS[*]}"
if [ -n "${REINSTALL:-}" ] || [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
  echo "Installing Airflow $AIRFLOW_VERSION (task-sdk $TASK_SDK_VERSION, providers-standard" \
    "$STANDARD_PROVIDER_VERSION, providers-apache-spark $SPARK_PROVIDER_VERSION) and walsink in $VENV"
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  # One resolve, so nothing walsink or the test tools need may move Airflow off its pins.
  "$VENV/bin/pip" install -q \
    "apache-airflow==$AIRFLOW_VERSION" "apache-airflow-core==$AIRFLOW_VERSION" \
    "apache-airflow-task-sdk==$TASK_SDK_VERSION" \
    "apache-airflow-providers-standard==$STANDARD_PROVIDER_VERSION" \
    "apache-airflow-providers-apache-spark==$SPARK_PROVIDER_VERSION" \
    "pyspark==$PYSPARK_VERSION" \
    "${ERA_PINS[@]}" \
    -e ".[delta,audit,iceberg,psycopg]" \
    pytest pytest-timeout pytest-xdist hypothesis psycopg2-binary pymysql "moto[server]" boto3 \
    setuptools wheel
  echo "$WANT" >"$STAMP"
fi

"$VENV/bin/python" - <<'EOF'
from importlib import metadata
names = ["apache-airflow", "apache-airflow-core", "apache-airflow-task-sdk",
         "apache-airflow-providers-standard", "apache-airflow-providers-apache-spark", "pyspark",
         "sqlalchemy"]
print("Testing walsink on " + ", ".join(f"{n} {metadata.version(n)}" for n in names))
EOF
exec "$VENV/bin/python" -m pytest -p no:cacheprovider -m "not e2e and not browser" "${TESTS[@]}" "$@"
