#!/usr/bin/env bash
# Tests of the Node-RED probe: installs the pinned development dependencies (Node-RED
# 4.1.15, node-red-node-test-helper, mqtt) with `npm ci`, then runs every test/*.test.js
# with node's test runner. The end-to-end test runs only with HOPTRACE_INTEGRATION=1, and
# then needs HOPTRACE_BIN and Mosquitto at HOPTRACE_MQTT (default 127.0.0.1:11883): a
# missing one is a failure.
#
# Ends with one line: "node-red: N passed, M failed, K skipped"; exits non-zero on failure.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

npm ci --no-audit --no-fund --loglevel=error
out=$(mktemp)
trap 'rm -f "$out"' EXIT
set +e
node --test --test-reporter=tap test/*.test.js 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
set -e
count() { sed -nE "s/^# $1 ([0-9]+)$/\1/p" "$out" | tail -1; }
passed=$(count pass)
failed=$(count fail)
skipped=$(count skipped)
echo "node-red: ${passed:-0} passed, ${failed:-0} failed, ${skipped:-0} skipped"
if ((rc != 0)) || [[ -z $passed ]]; then
    exit 1
fi
