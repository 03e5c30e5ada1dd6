#!/usr/bin/env bash
# Integration tests of the private stores (infra/stores/test_stores.py), of the Node-RED
# reference pipeline (infra/nodered/test_nodered.py) and of the same pipeline with the
# hoptrace Node-RED nodes in its flow, measured end to end by the real collector and taps
# (infra/nodered/test_nodered_probed.py; needs HOPTRACE_BIN), in one command:
#
#   infra/stores/test.sh [PYTEST ARGS...]
#
# Starts what is needed: the shared Kafka and Mosquitto (infra/services.sh up, only when they
# are down; never stopped here, others use them), the four stores and Node-RED. Runs pytest
# with HOPTRACE_INTEGRATION=1, so anything missing is a failure. Stops the stores and Node-RED
# it started, and only those. Exit status: pytest's.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
STORES=(influxdb postgres clickhouse victoriametrics)
export HOPTRACE_INTEGRATION=1

log() { printf 'stores-test: %s\n' "$*"; }

# What this script started, to be stopped on exit: store names and "nodered".
started=()
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
    local n
    for n in "${started[@]}"; do
        if [[ $n == nodered ]]; then
            "$ROOT/infra/nodered/nodered.sh" stop || true
        else
            "$HERE/$n.sh" stop || true
        fi
    done
}
trap cleanup EXIT

if ! "$ROOT/infra/services.sh" status >/dev/null 2>&1; then
    log "shared Kafka/Mosquitto down: infra/services.sh up"
    "$ROOT/infra/services.sh" up
fi

to_start=()
for n in "${STORES[@]}"; do
    "$HERE/$n.sh" status >/dev/null 2>&1 || to_start+=("$n")
done
if ((${#to_start[@]})); then
    started+=("${to_start[@]}")
    "$HERE/stores.sh" up "${to_start[@]}"
fi
if ! "$ROOT/infra/nodered/nodered.sh" status >/dev/null 2>&1; then
    started+=(nodered)
    "$ROOT/infra/nodered/nodered.sh" start
fi

set +e
python3 -m pytest -q -p no:cacheprovider "$HERE/test_stores.py" "$ROOT/infra/nodered/test_nodered.py" \
    "$ROOT/infra/nodered/test_nodered_probed.py" "$@"
rc=$?
set -e
# Stopped in reverse order: Node-RED before the InfluxDB it writes to.
reversed=()
for ((i = ${#started[@]} - 1; i >= 0; i--)); do reversed+=("${started[i]}"); done
started=("${reversed[@]}")
exit "$rc"
