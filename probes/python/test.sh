#!/usr/bin/env bash
# Installs what the Python probe's tests need (only what is missing) and runs them.
#
#   probes/python/test.sh [PYTEST ARGS...]
#
# With HOPTRACE_INTEGRATION=1 (and HOPTRACE_BIN, the hoptrace binary) the end-to-end tests
# run against the real collector, Mosquitto and Kafka, and a missing one is a failure.
# PYTHON selects the interpreter (default: python3).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PY=${PYTHON:-python3}

need=()
"$PY" -c 'import pytest' 2>/dev/null || need+=(pytest)
"$PY" -c 'import pyarrow' 2>/dev/null || need+=(pyarrow)
"$PY" -c 'import paho.mqtt, sys; sys.exit(int(paho.mqtt.__version__.split(".")[0]) < 2)' 2>/dev/null ||
    need+=('paho-mqtt>=2')
"$PY" -c 'import confluent_kafka' 2>/dev/null || need+=(confluent-kafka)
if ((${#need[@]})); then
    echo "python-probe: installing ${need[*]}"
    "$PY" -m pip install --quiet --disable-pip-version-check "${need[@]}"
fi

# The package installs as documented (`pip install ./probes/python`) and imports from the
# installed copy; the tests themselves import the source tree (tests/conftest.py).
# It is built from a copy so that no build files land in the work tree.
build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT
cp -r "$HERE/pyproject.toml" "$HERE/README.md" "$HERE/LICENSE" "$HERE/hoptrace_probe" "$build/"
"$PY" -m pip install --quiet --disable-pip-version-check --no-deps --force-reinstall "$build"
(cd / && "$PY" -c 'import hoptrace_probe, sys; assert "site-packages" in hoptrace_probe.__file__, hoptrace_probe.__file__')

cd "$HERE"
"$PY" -m pytest -p no:cacheprovider "$@" tests
