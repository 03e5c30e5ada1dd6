#!/usr/bin/env bash
# Node-RED for hoptrace's reference third-party pipeline: Mosquitto -> Node-RED -> InfluxDB,
# running the flow in flows.json beside this script (no hoptrace code in it).
#
#   nodered.sh install   npm ci of package.json + package-lock.json (Node-RED 4.1.8,
#                        node-red-contrib-influxdb 0.7.0) into the cache; only when missing
#                        or when the lock file changed
#   nodered.sh start     install if needed, copy flows.json and settings.js into the userDir,
#                        start Node-RED,
#                        and wait until a JSON message published to Mosquitto shows up in
#                        InfluxDB (the check's point is deleted again)
#   nodered.sh stop      stop it
#   nodered.sh status    show whether it runs (exit 3 when it does not)
#   nodered.sh url       print the editor / admin API address
#
# Needs: Node.js >= 18.5 (Node-RED 5 needs >= 22.9, hence 4.x), Mosquitto (infra/services.sh up)
# and InfluxDB (infra/stores/influxdb.sh start) running.
# Editor and admin HTTP API: http://127.0.0.1:11880 (no authentication, loopback only).
#
# Environment (read at start; a running Node-RED keeps what it was started with):
#   HOPTRACE_NR_TOPIC        subscription of the mqtt-in node (default hoptrace/nr/in/#)
#   HOPTRACE_NR_QOS          its QoS, 0, 1 or 2 (default 0)
#   HOPTRACE_NR_MQTT         broker HOST:PORT (default $HOPTRACE_MQTT or 127.0.0.1:11883)
#   HOPTRACE_NR_INFLUXDB     InfluxDB HOST:PORT (default 127.0.0.1:18086)
#   HOPTRACE_NR_INFLUX_DB    database (default hoptrace; created if missing)
#   HOPTRACE_NR_MEASUREMENT  measurement (default nodered)
#   HOPTRACE_NR_FLOW         plain (default): flows.json, no hoptrace code; or probed:
#                            flows-probed.json, the same flow with the two hoptrace nodes of
#                            probes/node-red, that package installed into the userDir with
#                            `npm install <folder>` as a Node-RED user installs a local node.
#                            The probed flow is a second instance beside the plain one: state
#                            in nodered-probed/, port 11881, defaults topic
#                            hoptrace/nrp/in/#, measurement nodered_probed
#   HOPTRACE_NR_COLLECTOR    (probed) the hoptrace collector the nodes report to
#                            (default 127.0.0.1:7400)
#
# Packages live in ${HOPTRACE_CACHE:-$HOME/.cache/hoptrace}/nodered, never in the work tree.
# Files under ${HOPTRACE_RUN:-/tmp/hoptrace-infra}/nodered/ (nodered-probed/ for the probed
# flow): userdir/ (Node-RED's userDir with copies of the flow and settings.js), nodered.log
# (Node-RED's output), nodered.env (the settings above as started), nodered.pid.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
FLOW=${HOPTRACE_NR_FLOW:-plain}
case $FLOW in
plain) NAME=nodered ;;
probed) NAME=nodered-probed ;;
*)
    echo "nodered: error: HOPTRACE_NR_FLOW must be plain or probed, not '$FLOW'" >&2
    exit 2
    ;;
esac
# shellcheck source-path=SCRIPTDIR source=../stores/common.sh
source "$HERE/../stores/common.sh"

CACHE=${HOPTRACE_CACHE:-$HOME/.cache/hoptrace}/nodered
MARKER=$CACHE/.installed
RED_JS=$CACHE/node_modules/node-red/red.js
USER_DIR=$RUN_DIR/userdir
LOG_FILE=$RUN_DIR/nodered.log
ENV_FILE=$RUN_DIR/nodered.env
READY_TIMEOUT=${HOPTRACE_NODERED_READY_TIMEOUT:-60}
# Node-RED's heap: the flow is small; the default would let V8 grow to a quarter of RAM.
HEAP_MB=256
# The hoptrace node package (probed flow only).
PROBE_PKG=$(cd "$HERE/../../probes/node-red" && pwd)

if [[ $FLOW == probed ]]; then
    FLOW_FILE=flows-probed.json
    PORT=11881
    export HOPTRACE_NR_TOPIC=${HOPTRACE_NR_TOPIC:-hoptrace/nrp/in/#}
    export HOPTRACE_NR_MEASUREMENT=${HOPTRACE_NR_MEASUREMENT:-nodered_probed}
    export HOPTRACE_NR_COLLECTOR=${HOPTRACE_NR_COLLECTOR:-127.0.0.1:7400}
else
    FLOW_FILE=flows.json
    PORT=11880
    export HOPTRACE_NR_TOPIC=${HOPTRACE_NR_TOPIC:-hoptrace/nr/in/#}
    export HOPTRACE_NR_MEASUREMENT=${HOPTRACE_NR_MEASUREMENT:-nodered}
fi
# settings.js reads the port from here.
export HOPTRACE_NR_PORT=$PORT
URL=http://$HOST:$PORT
export HOPTRACE_NR_QOS=${HOPTRACE_NR_QOS:-0}
HOPTRACE_NR_MQTT=${HOPTRACE_NR_MQTT:-${HOPTRACE_MQTT:-127.0.0.1:11883}}
HOPTRACE_NR_INFLUXDB=${HOPTRACE_NR_INFLUXDB:-127.0.0.1:18086}
export HOPTRACE_NR_INFLUX_DB=${HOPTRACE_NR_INFLUX_DB:-hoptrace}
# The flow reads host and port separately.
export HOPTRACE_NR_MQTT_HOST=${HOPTRACE_NR_MQTT%:*} HOPTRACE_NR_MQTT_PORT=${HOPTRACE_NR_MQTT##*:}
export HOPTRACE_NR_INFLUX_HOST=${HOPTRACE_NR_INFLUXDB%:*} HOPTRACE_NR_INFLUX_PORT=${HOPTRACE_NR_INFLUXDB##*:}
INFLUX_URL=http://$HOPTRACE_NR_INFLUXDB

# Node-RED replaces its command line with its --title, so that is what identifies it.
TITLE=hoptrace-$NAME
server_pid() { pid_from "$PID_FILE" "$TITLE"; }

lock_digest() { sha256sum "$HERE/package-lock.json" | cut -d' ' -f1; }

installed_ok() {
    [[ -f $MARKER && -f $RED_JS ]] && [[ $(cat "$MARKER") == "$(lock_digest)" ]]
}

cmd_install() {
    if installed_ok; then
        log "Node-RED already installed in $CACHE"
        return 0
    fi
    command -v npm >/dev/null || die "npm not found: install Node.js >= 18.5"
    local started
    started=$(now_ms)
    mkdir -p "$CACHE"
    cp "$HERE/package.json" "$HERE/package-lock.json" "$CACHE/"
    log "npm ci in $CACHE (Node-RED and node-red-contrib-influxdb, pinned by package-lock.json)"
    if ! npm ci --prefix "$CACHE" --no-audit --no-fund --loglevel=error >"$CACHE/install.log" 2>&1; then
        tail -n 20 "$CACHE/install.log" >&2
        die "npm ci in $CACHE failed (full output: $CACHE/install.log)"
    fi
    [[ -f $RED_JS ]] || die "npm ci finished but $RED_JS is missing"
    lock_digest >"$MARKER"
    log "installed in $(elapsed "$started")s"
}

check_node() {
    command -v node >/dev/null || die "node not found: install Node.js >= 18.5"
    node -e 'const [a, b] = process.versions.node.split(".").map(Number);
             process.exit(a > 18 || (a === 18 && b >= 5) ? 0 : 1)' ||
        die "Node.js $(node --version) is too old: Node-RED 4 needs >= 18.5"
}

# settings_line: the environment the flow is started with, one line.
settings_line() {
    printf 'topic=%s qos=%s mqtt=%s influxdb=%s database=%s measurement=%s' \
        "$HOPTRACE_NR_TOPIC" "$HOPTRACE_NR_QOS" "$HOPTRACE_NR_MQTT" "$HOPTRACE_NR_INFLUXDB" \
        "$HOPTRACE_NR_INFLUX_DB" "$HOPTRACE_NR_MEASUREMENT"
    if [[ $FLOW == probed ]]; then
        printf ' collector=%s' "$HOPTRACE_NR_COLLECTOR"
    fi
}

# install_probe: the hoptrace node package into the userDir, as a Node-RED user installs a
# local node (`cd ~/.node-red && npm install /path/to/folder`: npm links the folder into
# node_modules and records it in the userDir's package.json). It has no dependencies, so npm
# needs no registry (--offline).
install_probe() {
    local out
    [[ -f $USER_DIR/package.json ]] ||
        printf '{\n  "name": "hoptrace-nodered-probed-userdir",\n  "private": true\n}\n' >"$USER_DIR/package.json"
    out=$(cd "$USER_DIR" && npm install --offline --no-audit --no-fund --loglevel=error "$PROBE_PKG" 2>&1) ||
        die "npm install $PROBE_PKG into $USER_DIR failed: $out"
    [[ -f $USER_DIR/node_modules/node-red-contrib-hoptrace/package.json ]] ||
        die "npm install finished but $USER_DIR/node_modules/node-red-contrib-hoptrace is missing"
}

check_settings() {
    [[ $HOPTRACE_NR_QOS =~ ^[012]$ ]] || die "HOPTRACE_NR_QOS must be 0, 1 or 2, not '$HOPTRACE_NR_QOS'"
    [[ $HOPTRACE_NR_MQTT_PORT =~ ^[0-9]+$ ]] || die "HOPTRACE_NR_MQTT must be HOST:PORT, not '$HOPTRACE_NR_MQTT'"
    [[ $HOPTRACE_NR_INFLUX_PORT =~ ^[0-9]+$ ]] || die "HOPTRACE_NR_INFLUXDB must be HOST:PORT, not '$HOPTRACE_NR_INFLUXDB'"
    [[ $HOPTRACE_NR_MEASUREMENT =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] ||
        die "HOPTRACE_NR_MEASUREMENT must be an identifier, not '$HOPTRACE_NR_MEASUREMENT'"
    [[ $HOPTRACE_NR_INFLUX_DB =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] ||
        die "HOPTRACE_NR_INFLUX_DB must be an identifier, not '$HOPTRACE_NR_INFLUX_DB'"
    if [[ $FLOW == probed ]]; then
        [[ $HOPTRACE_NR_COLLECTOR =~ ^[^:[:space:]]+:[0-9]+$ ]] ||
            die "HOPTRACE_NR_COLLECTOR must be HOST:PORT, not '$HOPTRACE_NR_COLLECTOR'"
    fi
}

# influx_query STATEMENT: InfluxQL against the flow's database; fails on an error, including
# the ones InfluxDB reports inside an HTTP 200 answer.
influx_query() {
    local out
    out=$(curl -sS --fail-with-body --max-time 5 -XPOST "$INFLUX_URL/query" \
        --data-urlencode "db=$HOPTRACE_NR_INFLUX_DB" --data-urlencode "q=$1" 2>&1) || {
        echo "$out"
        return 1
    }
    echo "$out"
    [[ $out != *'"error"'* ]]
}

# selftest_topic: a topic the configured subscription matches ("#" and "+" levels are filled
# with "_selftest").
selftest_topic() {
    local t=$HOPTRACE_NR_TOPIC
    t=${t//+/_selftest}
    if [[ $t == "#" ]]; then
        t=_selftest
    elif [[ $t == */# ]]; then
        t=${t%#}_selftest
    fi
    echo "$t"
}

check_services() {
    port_open_at() {
        # shellcheck disable=SC2016 # expanded by the inner bash
        timeout 1 bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$1" "$2" 2>/dev/null
    }
    port_open_at "$HOPTRACE_NR_MQTT_HOST" "$HOPTRACE_NR_MQTT_PORT" ||
        die "no MQTT broker at $HOPTRACE_NR_MQTT (start Mosquitto: infra/services.sh up)"
    command -v mosquitto_pub >/dev/null || die "mosquitto_pub not found; run infra/setup.sh"
    [[ $(http_code "$INFLUX_URL/ping") == 204 ]] ||
        die "no InfluxDB at $INFLUX_URL (start it: infra/stores/influxdb.sh start)"
    local out
    out=$(influx_query "CREATE DATABASE $HOPTRACE_NR_INFLUX_DB") ||
        die "creating database $HOPTRACE_NR_INFLUX_DB in $INFLUX_URL failed: $out"
}

fail() {
    show_logs "$LOG_FILE"
    local pid
    if pid=$(server_pid); then
        stop_pid "$pid" 20
        rm -f "$PID_FILE"
    fi
    die "$*"
}

wait_ready() {
    local offset=$1 deadline=$((SECONDS + READY_TIMEOUT)) out
    # The editor and admin API answer, with our flow deployed.
    until out=$(curl -sS --max-time 2 "$URL/flows" 2>/dev/null) && [[ $out == *'"nr-influx-out"'* ]]; do
        server_pid >/dev/null || fail "Node-RED exited during startup (log above)"
        # A node type it cannot load (the hoptrace package not installed) stops the flow.
        tail -c "+$((offset + 1))" "$LOG_FILE" | grep -q 'Waiting for missing types' &&
            fail "Node-RED is missing node types of $FLOW_FILE (log above)"
        ((SECONDS < deadline)) || fail "Node-RED admin API $URL/flows did not return the flow within ${READY_TIMEOUT}s"
        sleep 0.2
    done
    # The broker config node has connected (logged once per connection).
    until tail -c "+$((offset + 1))" "$LOG_FILE" | grep -c 'Connected to broker' >/dev/null; do
        server_pid >/dev/null || fail "Node-RED exited during startup (log above)"
        ((SECONDS < deadline)) || fail "Node-RED did not connect to the MQTT broker at $HOPTRACE_NR_MQTT within ${READY_TIMEOUT}s"
        sleep 0.2
    done
    # End to end: publish with MQTT v5, read the point back from InfluxDB, delete it.
    local topic tok
    topic=$(selftest_topic)
    tok=$(token)
    while :; do
        out=$(mosquitto_pub -V mqttv5 -h "$HOPTRACE_NR_MQTT_HOST" -p "$HOPTRACE_NR_MQTT_PORT" \
            -q 1 -t "$topic" -m "{\"hoptrace\":\"$tok\",\"value\":0}" 2>&1) ||
            fail "mosquitto_pub to $HOPTRACE_NR_MQTT failed: $out"
        local until_next=$((SECONDS + 3))
        while ((SECONDS < until_next)); do
            out=$(influx_query "SELECT \"hoptrace\" FROM \"$HOPTRACE_NR_MEASUREMENT\" WHERE \"topic\" = '$topic' AND \"hoptrace\" = '$tok'") ||
                fail "querying $INFLUX_URL failed: $out"
            if [[ $out == *"$tok"* ]]; then
                out=$(influx_query "DELETE FROM \"$HOPTRACE_NR_MEASUREMENT\" WHERE \"topic\" = '$topic'") ||
                    warn "could not delete the readiness point: $out"
                return 0
            fi
            sleep 0.1
        done
        # A message published before the subscription was complete is not delivered: again.
        server_pid >/dev/null || fail "Node-RED exited during startup (log above)"
        ((SECONDS < deadline)) ||
            fail "a message published to $topic did not reach $INFLUX_URL ($HOPTRACE_NR_INFLUX_DB.$HOPTRACE_NR_MEASUREMENT) within ${READY_TIMEOUT}s"
    done
}

cmd_start() {
    local pid started
    started=$(now_ms)
    check_settings
    if pid=$(server_pid); then
        if [[ -f $ENV_FILE && $(<"$ENV_FILE") != "$(settings_line)" ]]; then
            warn "running with $(<"$ENV_FILE"); stop it to start with $(settings_line)"
        fi
        log "already running (pid $pid, $URL)"
        return 0
    fi
    check_node
    installed_ok || cmd_install
    require_ports_free "$PORT"
    check_services
    mkdir -p "$USER_DIR"
    # Both into the userDir, so that everything Node-RED writes (it resolves the flow file
    # relative to the settings file) stays out of the work tree. The flow is always named
    # flows.json there (settings.js says so).
    cp "$HERE/$FLOW_FILE" "$USER_DIR/flows.json"
    cp "$HERE/settings.js" "$USER_DIR/"
    if [[ $FLOW == probed ]]; then
        install_probe
    fi
    settings_line >"$ENV_FILE"
    touch "$LOG_FILE"
    local offset
    offset=$(stat -c %s "$LOG_FILE")
    launch "$LOG_FILE" node "--max-old-space-size=$HEAP_MB" "$RED_JS" --title "$TITLE" \
        --settings "$USER_DIR/settings.js" --userDir "$USER_DIR"
    wait_ready "$offset"
    log "ready in $(elapsed "$started")s: $URL; $(settings_line) (log $LOG_FILE)"
}

cmd_stop() {
    local pid
    if ! pid=$(server_pid); then
        rm -f "$PID_FILE"
        log "not running"
        return 0
    fi
    stop_pid "$pid" 20
    rm -f "$PID_FILE"
    log "stopped (pid $pid)"
}

cmd_status() {
    local pid
    if pid=$(server_pid); then
        local state=closed
        [[ $(http_code "$URL/flows") == 200 ]] && state=answering
        log "running, pid $pid, $URL ($state), rss $(rss_mib "$pid") MiB, $(cat "$ENV_FILE" 2>/dev/null)"
        return 0
    fi
    log "stopped"
    return 3
}

main() {
    (($# == 1)) || usage
    case $1 in
    install) cmd_install ;;
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    url) echo "$URL" ;;
    -h | --help | help) usage ;;
    *) die "unknown command '$1' (install, start, stop, status, url)" ;;
    esac
}

main "$@"
