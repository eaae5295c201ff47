#!/usr/bin/env bash
# Create .venv in the checkout and install walsink with everything its tests need,
# pinned by constraints.txt (the versions CI tested, as Airflow's own constraint files do).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/pip install -q --upgrade pip setuptools wheel
.venv/bin/pip install -q -c constraints.txt -e ".[test]"
# The Spark provider depends on pyspark-client, which shares the `pyspark` package
# directory with the full pyspark (needed for spark-submit and the JVM): make sure
# the full distribution's files are the ones on disk.
PYSPARK_PIN=$(grep -i '^pyspark==' constraints.txt)
.venv/bin/pip install -q --force-reinstall --no-deps "$PYSPARK_PIN"
# Headless Chromium for the UI tests (Playwright drives Debian's build, no browser download).
if [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null; then
  SUDO=$([ "$(id -u)" -eq 0 ] || echo sudo)
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq \
    && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null \
    || echo "warning: could not install chromium; the browser tests will be skipped (failed under CI)" >&2
fi
echo "walsink installed in .venv ($(.venv/bin/python -c 'import airflow; print("Airflow", airflow.__version__)'))"
