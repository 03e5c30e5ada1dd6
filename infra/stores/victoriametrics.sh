#!/usr/bin/env bash
# Private VictoriaMetrics 1.79 single-node server (Debian package "victoria-metrics") for
# hoptrace's store taps.
#
#   victoriametrics.sh start     install the package if missing, start the server, and check a
#                                real write (/api/v1/import) and read (/api/v1/export)
#   victoriametrics.sh stop      stop it (data is kept)
#   victoriametrics.sh status    show whether it runs (exit 3 when it does not)
#   victoriametrics.sh wipe      delete the data of a stopped instance
#   victoriametrics.sh url       print the HTTP address
#   victoriametrics.sh install   only install the package
#
# Listener: HTTP 127.0.0.1:18428 (ingestion, PromQL/MetricsQL queries, export). No Graphite,
# InfluxDB or OpenTSDB listeners.
# Flags that differ from the defaults:
#   -search.latencyOffset=1s   queries hide samples newer than now-1s; the stock 30s would hide
#                              every fresh sample for half a minute from /api/v1/query
#   -memory.allowedBytes=256MiB  cache budget (stock: 60% of RAM)
# Independent of these flags: /api/v1/query* answers come from a cache unless the request has
# nocache=1, and a sample is searchable only after its in-memory buffer is flushed (about 1 s).
# The readiness check imports one sample of the series hoptrace_selftest and waits for
# /api/v1/export to return it.
#
# Files under ${HOPTRACE_RUN:-/tmp/hoptrace-infra}/victoriametrics/: data/,
# victoriametrics.log (server output), victoriametrics.pid.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
NAME=victoriametrics
PACKAGES=(victoria-metrics curl)
SYSTEM_DAEMONS=("victoria-metric:/var/lib/victoria-metrics")
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$HERE/common.sh"

SERVER=/usr/bin/victoria-metrics
DATA=$RUN_DIR/data
LOG_FILE=$RUN_DIR/victoriametrics.log
READY_TIMEOUT=${HOPTRACE_VICTORIAMETRICS_READY_TIMEOUT:-30}
PORT=18428
URL=http://$HOST:$PORT
LATENCY_OFFSET=1s
FLAGS=(
    "-httpListenAddr=$HOST:$PORT"
    "-storageDataPath=$DATA"
    "-search.latencyOffset=$LATENCY_OFFSET"
    "-memory.allowedBytes=256MiB"
    "-loggerLevel=INFO"
)

server_pid() { pid_from "$PID_FILE" "-storageDataPath=$DATA"; }

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
    local deadline=$((SECONDS + READY_TIMEOUT)) out ts
    until [[ $(http_code "$URL/health") == 200 ]]; do
        server_pid >/dev/null || fail "victoria-metrics exited during startup (log above)"
        ((SECONDS < deadline)) || fail "victoria-metrics not answering $URL/health after ${READY_TIMEOUT}s"
        sleep 0.1
    done
    # One fixed series; this start's sample is told apart by its timestamp (ms).
    ts=$(now_ms)
    out=$(curl -sS --fail-with-body --max-time 5 "$URL/api/v1/import" \
        --data-binary "{\"metric\":{\"__name__\":\"hoptrace_selftest\"},\"values\":[$RANDOM],\"timestamps\":[$ts]}" 2>&1) ||
        fail "readiness write to $URL/api/v1/import failed: $out"
    # A sample becomes searchable when its in-memory buffer is flushed (about 1 s); a series
    # new to the index only after up to ~10 s. /internal/force_flush shortens the first start.
    curl -sS -o /dev/null --max-time 5 "$URL/internal/force_flush" 2>/dev/null || true
    while :; do
        out=$(curl -sS --fail-with-body --max-time 5 "$URL/api/v1/export" \
            --data-urlencode "match[]=hoptrace_selftest" --data-urlencode "start=$((ts / 1000 - 60))" 2>&1) ||
            fail "readiness read from $URL/api/v1/export failed: $out"
        [[ $out == *"$ts"* ]] && break
        ((SECONDS < deadline)) || fail "imported a sample at $ts ms but /api/v1/export did not return it within ${READY_TIMEOUT}s"
        sleep 0.1
    done
}

cmd_start() {
    local pid started
    started=$(now_ms)
    if pid=$(server_pid); then
        log "already running (pid $pid, $URL)"
        return 0
    fi
    ensure_packages "${PACKAGES[@]}"
    [[ -x $SERVER ]] || die "$SERVER not found although victoria-metrics is installed"
    require_ports_free "$PORT"
    mkdir -p "$DATA"
    launch "$LOG_FILE" "$SERVER" "${FLAGS[@]}"
    wait_ready
    log "ready in $(elapsed "$started")s: $URL, -search.latencyOffset=$LATENCY_OFFSET (log $LOG_FILE)"
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
        [[ $(http_code "$URL/health") == 200 ]] && state=answering
        log "running, pid $pid, $URL ($state), rss $(rss_mib "$pid") MiB, data in $DATA"
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
