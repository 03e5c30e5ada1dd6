#!/usr/bin/env bash
# Private InfluxDB 1.6 (Debian package "influxdb") for hoptrace's store taps and the
# Node-RED reference pipeline.
#
#   influxdb.sh start     install the package if missing, write the config, start influxd, create
#                         the database "hoptrace", and check a real write and read
#                         (HOPTRACE_INFLUXDB_SUBSCRIBER=false: without the subscriber service)
#   influxdb.sh stop      stop it (data is kept)
#   influxdb.sh status    show whether it runs (exit 3 when it does not)
#   influxdb.sh wipe      delete the data of a stopped instance
#   influxdb.sh url       print the HTTP address
#   influxdb.sh install   only install the package
#
# Listeners (see influxdb.conf beside this script): HTTP API 127.0.0.1:18086 (no
# authentication), backup/restore RPC 127.0.0.1:18088.
# Databases: "hoptrace" (for tests and pipelines) and "selftest" (the readiness check writes
# a point to measurement "selftest" and reads it back).
#
# Files under ${HOPTRACE_RUN:-/tmp/hoptrace-infra}/influxdb/: influxdb.conf (generated), meta/,
# data/, wal/, influxdb.log (server output), influxdb.pid.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
NAME=influxdb
PACKAGES=(influxdb curl)
SYSTEM_DAEMONS=("influxd:/etc/influxdb/")
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$HERE/common.sh"

INFLUXD=/usr/bin/influxd
CONF=$RUN_DIR/influxdb.conf
LOG_FILE=$RUN_DIR/influxdb.log
READY_TIMEOUT=${HOPTRACE_INFLUXDB_READY_TIMEOUT:-30}
HTTP_PORT=18086
RPC_PORT=18088
URL=http://$HOST:$HTTP_PORT
DATABASE=hoptrace

server_pid() { pid_from "$PID_FILE" "-config $CONF"; }

fail() {
    show_logs "$LOG_FILE"
    local pid
    if pid=$(server_pid); then
        stop_pid "$pid" 10
        rm -f "$PID_FILE"
    fi
    die "$*"
}

# influx_query SQL: POST an InfluxQL statement; prints the JSON answer, fails on a transport
# error, a non-2xx status or an "error" inside the 200 answer (InfluxDB's way of reporting a
# bad statement).
influx_query() {
    local out
    out=$(curl -sS --fail-with-body --max-time 5 -XPOST "$URL/query" --data-urlencode "q=$1" 2>&1) || {
        echo "$out"
        return 1
    }
    if [[ $out == *'"error"'* ]]; then
        echo "$out"
        return 1
    fi
    echo "$out"
}

wait_ready() {
    local deadline=$((SECONDS + READY_TIMEOUT)) out tok
    until [[ $(http_code "$URL/ping") == 204 ]]; do
        server_pid >/dev/null || fail "influxd exited during startup (log above)"
        ((SECONDS < deadline)) || fail "influxd not answering $URL/ping after ${READY_TIMEOUT}s"
        sleep 0.1
    done
    out=$(influx_query "CREATE DATABASE $DATABASE; CREATE DATABASE selftest") ||
        fail "creating the databases failed: $out"
    tok=$(token)
    out=$(curl -sS --fail-with-body --max-time 5 -XPOST "$URL/write?db=selftest&precision=ns" \
        --data-binary "selftest token=\"$tok\"" 2>&1) || fail "readiness write to $URL/write failed: $out"
    out=$(influx_query "SELECT token FROM selftest.autogen.selftest WHERE token = '$tok'") ||
        fail "readiness query failed: $out"
    [[ $out == *"$tok"* ]] || fail "wrote token $tok but the query did not return it: $out"
}

cmd_start() {
    local pid started
    started=$(now_ms)
    if pid=$(server_pid); then
        log "already running (pid $pid, $URL)"
        return 0
    fi
    ensure_packages "${PACKAGES[@]}"
    [[ -x $INFLUXD ]] || die "$INFLUXD not found although package influxdb is installed"
    require_ports_free "$HTTP_PORT" "$RPC_PORT"
    mkdir -p "$RUN_DIR"
    case ${HOPTRACE_INFLUXDB_SUBSCRIBER:-true} in
        true | false) ;;
        *) die "HOPTRACE_INFLUXDB_SUBSCRIBER=${HOPTRACE_INFLUXDB_SUBSCRIBER}: true or false" ;;
    esac
    sed -e "s|@RUN_DIR@|$RUN_DIR|g" -e "s|@SUBSCRIBER@|${HOPTRACE_INFLUXDB_SUBSCRIBER:-true}|g" \
        "$HERE/influxdb.conf" >"$CONF"
    launch "$LOG_FILE" "$INFLUXD" -config "$CONF"
    wait_ready
    log "ready in $(elapsed "$started")s: $URL, database $DATABASE (log $LOG_FILE)"
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
        [[ $(http_code "$URL/ping") == 204 ]] && state=answering
        log "running, pid $pid, $URL ($state), rss $(rss_mib "$pid") MiB, data in $RUN_DIR"
        return 0
    fi
    log "stopped"
    return 3
}

cmd_wipe() {
    server_pid >/dev/null && die "running; stop it before wiping"
    rm -rf "$RUN_DIR"
    log "wiped $RUN_DIR"
}

main() {
    (($# == 1)) || usage
    case $1 in
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    wipe) cmd_wipe ;;
    url) echo "$URL" ;;
    install) ensure_packages "${PACKAGES[@]}" ;;
    packages) echo "${PACKAGES[*]}" ;;
    daemons) echo "${SYSTEM_DAEMONS[*]}" ;;
    -h | --help | help) usage ;;
    *) die "unknown command '$1' (start, stop, status, wipe, url, install)" ;;
    esac
}

main "$@"
