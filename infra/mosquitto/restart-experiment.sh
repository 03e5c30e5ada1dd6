#!/usr/bin/env bash
# A broker crash in the middle of a QoS 1 publish, measured end to end with hoptrace.
#
#   HOPTRACE_BIN=path/to/hoptrace infra/mosquitto/restart-experiment.sh RUN_ID
#
# Starts a private Mosquitto (mosquitto.conf beside this script, on port $PORT instead of
# the shared 11883; the shared broker is never touched), `hoptrace collect` (hops publish
# and broker), `hoptrace tap` (hop broker, QoS 1) and `hoptrace publish` (QoS 1, $RATE msg/s
# for $DURATION). $KILL_AT seconds into the publish the broker is killed with SIGKILL
# (after hanging $FREEZE seconds under SIGSTOP, if set) and started again $DOWN_FOR seconds
# later on the same port. Prints the publisher's, the tap's and the collector's summaries
# and the traces that stayed incomplete.
#
# Environment (defaults): PORT (11893), DIR (/tmp/hoptrace-infra/qos: state, logs, runs),
# COLLECTOR (127.0.0.1:17493), RATE (5k), DURATION (20s), KILL_AT (7), DOWN_FOR (3),
# FREEZE (unset), PERSIST (0; 1: persistence true, autosave_interval 1),
# TAP_SESSION (clean; persistent: clean=false with a fixed client id).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RUN=${1:?usage: restart-experiment.sh RUN_ID}
BIN=${HOPTRACE_BIN:?set HOPTRACE_BIN to the hoptrace binary}
PORT=${PORT:-11893}
DIR=${DIR:-/tmp/hoptrace-infra/qos}
COLLECTOR=${COLLECTOR:-127.0.0.1:17493}
RATE=${RATE:-5k}
DURATION=${DURATION:-20s}
KILL_AT=${KILL_AT:-7}
DOWN_FOR=${DOWN_FOR:-3}
PERSIST=${PERSIST:-0}
TAP_SESSION=${TAP_SESSION:-clean}
[[ $PORT != 11883 && $PORT != 11884 ]] || { echo "PORT must not be the shared broker's" >&2; exit 2; }

OUT=$DIR/runs/$RUN
mkdir -p "$OUT"
rm -rf "${OUT:?}/$RUN" "$DIR/db"
mkdir -p "$DIR/db"
CONF=$OUT/mosquitto.conf
# The shared configuration with this run's directory, port, and persistence; only the
# anonymous listener.
sed -e "s#@RUN_DIR@#$OUT#g" -e "s/^listener 11883 /listener $PORT /" "$HERE/mosquitto.conf" |
    awk '/^listener 11884/ { exit } { print }' >"$CONF"
if [[ $PERSIST == 1 ]]; then
    sed -i -e "s#^persistence false#persistence true\npersistence_location $DIR/db/\nautosave_interval 1#" "$CONF"
fi
TAP_URL="mqtt://127.0.0.1:$PORT?qos=1"
[[ $TAP_SESSION == persistent ]] && TAP_URL+="&clean=false&client_id=hoptrace-experiment-tap"
PIPELINE=$OUT/pipeline.toml
cat >"$PIPELINE" <<'EOF'
name = "broker-restart"
expected = ["publish", "broker"]
[[hops]]
name = "publish"
id = 0
description = "Publisher egress."
[[hops]]
name = "broker"
id = 1
description = "Arrival in a tap subscribed to the broker."
[[stages]]
name = "Broker Time"
from = "publish"
to = "broker"
definition = "From the publish stamp to the arrival in the tap."
EOF

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; }
start_broker() {
    /usr/sbin/mosquitto -c "$CONF" >>"$OUT/mosquitto.stderr" 2>&1 &
    BROKER=$!
    pids+=("$BROKER")
    until listening; do sleep 0.05; done
}
stamp() { echo "$(date +%T.%N) $*" >>"$OUT/events"; }

start_broker
"$BIN" collect --listen "$COLLECTOR" --pipeline "$PIPELINE" --out "$OUT" --run-id "$RUN" \
    >"$OUT/collect.out" 2>"$OUT/collect.err" &
COLLECT=$!
pids+=("$COLLECT")
sleep 1
"$BIN" tap --from "$TAP_URL" --topics 'hoptrace-experiment/#' --hop broker \
    --collector "$COLLECTOR" --pipeline "$PIPELINE" >"$OUT/tap.out" 2>"$OUT/tap.err" &
TAP=$!
pids+=("$TAP")
sleep 2 # with PERSIST=1, the broker has saved the tap's session by now
"$BIN" publish --to "mqtt://127.0.0.1:$PORT/hoptrace-experiment?qos=1" --rate "$RATE" \
    --duration "$DURATION" --publisher-id 7 --collector "$COLLECTOR" --pipeline "$PIPELINE" \
    --summary-json "$OUT/publish.json" >"$OUT/publish.out" 2>"$OUT/publish.err" &
PUBLISH=$!
sleep "$KILL_AT"
if [[ -n ${FREEZE:-} ]]; then
    kill -STOP "$BROKER"
    stamp "broker stopped (SIGSTOP)"
    sleep "$FREEZE"
fi
kill -KILL "$BROKER"
stamp "broker killed (SIGKILL)"
sleep "$DOWN_FOR"
start_broker
stamp "broker restarted"
wait "$PUBLISH" || true
sleep 3
kill -INT "$TAP"
wait "$TAP" || true
kill -INT "$COLLECT"
wait "$COLLECT" || true

echo "--- events"; cat "$OUT/events"
echo "--- publish"; cat "$OUT/publish.out"
echo "--- tap"; cat "$OUT/tap.out"
echo "--- collect"; cat "$OUT/collect.out"
echo "--- incomplete traces"
"$BIN" sql "$OUT/$RUN" "SELECT publisher, stream, sequence, status, publish_ns FROM traces WHERE status <> 'complete' ORDER BY publish_ns LIMIT 30"
