#!/usr/bin/env bash
# Create .venv in the checkout and install walsink with everything its tests need,
# pinned by constraints.txt (the versions CI tested, as Airflow's own constraint files do).
# Prints one line per step; the tools' own output (pip's, setuptools' deprecation
# warnings) goes to var/setup.log, whose tail is printed if a step fails.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
mkdir -p var
LOG=$PWD/var/setup.log
: >"$LOG"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
# Build backends warn about their own deprecations (license classifiers, setup.cfg
# keys): useful to maintainers, noise to a newcomer; they stay in the log.
export PYTHONWARNINGS="ignore::DeprecationWarning"

step() {
  local what=$1
  shift
  printf '  %s ... ' "$what"
  local started=$SECONDS
  if "$@" >>"$LOG" 2>&1; then
    echo "done ($((SECONDS - started))s)"
  else
    echo "FAILED"
    echo "--- last 40 lines of $LOG ---" >&2
    tail -n 40 "$LOG" >&2
    exit 1
  fi
}

# Azurite, Microsoft's emulator of Azure Storage (npm), serves the abfss:// staging tests
# (tests/azurite_server.py) and the Delta tables on abfss://. Pinned: 3.37.0 is the first that
# honours List Blobs' startFrom, which deltalake's Azure client sends to read a table's log from a
# version (3.35.0 lists from the start, and every commit after a table's second fails "Invalid table
# version"). It declares Node >= 22; npm warns and installs it, and it runs on Node 20 (all the
# Azure tests pass there).
AZURITE_VERSION=3.37.0
azurite_ok() { [ "$(azurite-blob --version 2>/dev/null)" = "$AZURITE_VERSION" ]; }

# What was installed: a fingerprint of the files that decide it. An existing .venv with the
# same fingerprint is left as it is (the demos and the test command call this script first).
STAMP=.venv/.walsink-setup
FINGERPRINT=$(cat constraints.txt setup.cfg pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
# Debian packages the tests use, each installed only when missing: headless Chromium for the UI
# tests (Playwright drives Debian's build, no browser download) and PgBouncer, which the tests
# start in front of PostgreSQL (tests/pgbouncer.py).
missing_debian_packages() {
  [ -x /usr/bin/chromium ] || echo chromium chromium-driver
  [ -x /usr/sbin/pgbouncer ] || echo pgbouncer
}
if [ -x .venv/bin/python ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$FINGERPRINT" ] &&
  { [ -z "$(missing_debian_packages)" ] || ! command -v apt-get >/dev/null; } &&
  { azurite_ok || ! command -v npm >/dev/null; }; then
  echo "walsink is already set up in $PWD/.venv (constraints.txt and setup.cfg unchanged; remove .venv to reinstall)"
  exit 0
fi
echo "Setting up walsink in $PWD/.venv (details: $LOG)"
if [ ! -x .venv/bin/python ]; then
  step "creating the virtualenv with $PYTHON" "$PYTHON" -m venv .venv
fi
rm -f "$STAMP"
step "upgrading pip, setuptools and wheel" .venv/bin/pip install -q --upgrade pip setuptools wheel
step "installing walsink, Airflow, Spark and the test tools (a few minutes the first time)" \
  .venv/bin/pip install -q -c constraints.txt -e ".[test]"
# The Spark provider depends on pyspark-client, which shares the `pyspark` package
# directory with the full pyspark (needed for spark-submit and the JVM): make sure
# the full distribution's files are the ones on disk.
PYSPARK_PIN=$(grep -i '^pyspark==' constraints.txt)
step "restoring the full $PYSPARK_PIN over pyspark-client" \
  .venv/bin/pip install -q --force-reinstall --no-deps "$PYSPARK_PIN"
# DuckDB's own Iceberg reader, for the tests that read Iceberg tables back with it. Its offline
# extensions exist only for DuckDB 1.4.4, so it lives apart from the project's DuckDB, in
# .venv/duckdb-iceberg (tests/helpers.py: duckdb_iceberg_scan runs it in a subprocess).
DUCKDB_ICEBERG_PINS="duckdb==1.4.4 duckdb-ext-iceberg==1.4.4.20260205 duckdb-ext-avro==1.4.4.20260205"
if [ "$(cat .venv/duckdb-iceberg/.pins 2>/dev/null)" != "$DUCKDB_ICEBERG_PINS" ]; then
  rm -rf .venv/duckdb-iceberg
  # shellcheck disable=SC2086 # one word per pin
  step "installing DuckDB's Iceberg reader (DuckDB 1.4.4) for the tests" \
    .venv/bin/pip install -q --no-deps --target .venv/duckdb-iceberg $DUCKDB_ICEBERG_PINS
  echo "$DUCKDB_ICEBERG_PINS" >.venv/duckdb-iceberg/.pins
fi
MISSING=$(missing_debian_packages | xargs)
if [ -n "$MISSING" ] && command -v apt-get >/dev/null; then
  SUDO=$([ "$(id -u)" -eq 0 ] || echo sudo)
  install_debian_packages() {
    # shellcheck disable=SC2086 # one word per package
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
      $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $MISSING
  }
  if ! (step "installing $MISSING for the tests" install_debian_packages); then
    echo "warning: could not install $MISSING; the tests that need them will be skipped (failed under CI)" >&2
  fi
fi
if ! azurite_ok && command -v npm >/dev/null; then
  SUDO=$([ "$(id -u)" -eq 0 ] || echo sudo)
  if ! (step "installing Azurite $AZURITE_VERSION for the Azure staging tests" \
    $SUDO npm install --global --no-fund --no-audit --no-update-notifier --engine-strict=false "azurite@$AZURITE_VERSION"); then
    echo "warning: could not install Azurite; the Azure staging tests will be skipped (failed under CI)" >&2
  fi
fi
echo "walsink installed in .venv ($(.venv/bin/python -W ignore -c 'import airflow; print("Airflow", airflow.__version__)' 2>/dev/null))"
echo "$FINGERPRINT" >"$STAMP"
