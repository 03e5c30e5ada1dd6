#!/usr/bin/env bash
# Private ClickHouse 18.16 server (Debian packages "clickhouse-server", "clickhouse-client")
# for hoptrace's store taps and the Kafka -> ClickHouse reference pipeline.
#
#   clickhouse.sh start     install the packages if missing, write the config, start the
#                           server, create the database "hoptrace", and check a real write and read
#   clickhouse.sh stop      stop it (data is kept)
#   clickhouse.sh status    show whether it runs (exit 3 when it does not)
#   clickhouse.sh wipe      delete the data of a stopped instance
#   clickhouse.sh url       print the HTTP address
#   clickhouse.sh install   only install the packages
#   clickhouse.sh kafka-pipeline TOPIC [GROUP]
#                           create the Kafka engine table, the MergeTree table and the
#                           materialized view of clickhouse-kafka.sql, consuming TOPIC from
#                           the single-node Kafka (127.0.0.1:19092) as consumer group GROUP
#                           (default: hoptrace-clickhouse-TOPIC); the topic must exist. Rows
#                           land in hoptrace.NAME (NAME: TOPIC with [^A-Za-z0-9_] -> "_");
#                           kafka_max_block_size from $HOPTRACE_CH_KAFKA_MAX_BLOCK (default 1)
#
# Listeners (see clickhouse-config.xml): HTTP 127.0.0.1:18123, native TCP 127.0.0.1:19900; no
# interserver port. User "default" without a password, from 127.0.0.1 only. The Kafka engine's
# flush interval (stream_flush_interval_ms=500) and the memory limits are in
# clickhouse-users.xml. The readiness check writes a row to hoptrace.selftest and reads it back.
#
# Files under ${HOPTRACE_RUN:-/tmp/hoptrace-infra}/clickhouse/: config.xml, users.xml
# (generated), data/, log/clickhouse-server.log and .err.log (server log), stdout.log,
# clickhouse.pid.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
NAME=clickhouse
PACKAGES=(clickhouse-server clickhouse-client curl)
SYSTEM_DAEMONS=("clickhouse-serv:/etc/clickhouse-server/")
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$HERE/common.sh"

SERVER=/usr/sbin/clickhouse-server
CONF=$RUN_DIR/config.xml
LOG_FILE=$RUN_DIR/stdout.log
SERVER_LOG=$RUN_DIR/log/clickhouse-server.log
ERR_LOG=$RUN_DIR/log/clickhouse-server.err.log
READY_TIMEOUT=${HOPTRACE_CLICKHOUSE_READY_TIMEOUT:-60}
# Shutting down waits for Kafka consumers to leave their groups.
STOP_TIMEOUT=${HOPTRACE_CLICKHOUSE_STOP_TIMEOUT:-60}
HTTP_PORT=18123
TCP_PORT=19900
URL=http://$HOST:$HTTP_PORT
DATABASE=hoptrace
KAFKA_BOOTSTRAP=${HOPTRACE_KAFKA:-127.0.0.1:19092}
KAFKA_MAX_BLOCK=${HOPTRACE_CH_KAFKA_MAX_BLOCK:-1}

server_pid() { pid_from "$PID_FILE" "--config-file=$CONF"; }

fail() {
    show_logs "$LOG_FILE" "$ERR_LOG"
    local pid
    if pid=$(server_pid); then
        stop_pid "$pid" "$STOP_TIMEOUT"
        rm -f "$PID_FILE"
    fi
    die "$*"
}

# ch_query SQL: run one statement over HTTP; prints the answer. ClickHouse reports errors with
# a non-2xx status and "Code: N, e.displayText() = ..." in the body.
ch_query() {
    curl -sS --fail-with-body --max-time 10 "$URL/" --data-binary "$1" 2>&1
}

wait_ready() {
    local deadline=$((SECONDS + READY_TIMEOUT)) out tok
    until [[ $(http_code "$URL/ping") == 200 ]]; do
        server_pid >/dev/null || fail "clickhouse-server exited during startup (logs above)"
        ((SECONDS < deadline)) || fail "clickhouse-server not answering $URL/ping after ${READY_TIMEOUT}s"
        sleep 0.1
    done
    out=$(ch_query "CREATE DATABASE IF NOT EXISTS $DATABASE") || fail "CREATE DATABASE failed: $out"
    out=$(ch_query "CREATE TABLE IF NOT EXISTS $DATABASE.selftest (token String, at DateTime DEFAULT now())
        ENGINE = MergeTree ORDER BY at") || fail "creating $DATABASE.selftest failed: $out"
    tok=$(token)
    out=$(ch_query "INSERT INTO $DATABASE.selftest (token) VALUES ('$tok')") ||
        fail "readiness write failed: $out"
    out=$(ch_query "SELECT token FROM $DATABASE.selftest WHERE token = '$tok'") ||
        fail "readiness query failed: $out"
    [[ $out == "$tok" ]] || fail "wrote token $tok but read back '$out'"
}

cmd_start() {
    local pid started
    started=$(now_ms)
    if pid=$(server_pid); then
        log "already running (pid $pid, $URL)"
        return 0
    fi
    ensure_packages "${PACKAGES[@]}"
    [[ -x $SERVER ]] || die "$SERVER not found although clickhouse-server is installed"
    require_ports_free "$HTTP_PORT" "$TCP_PORT"
    mkdir -p "$RUN_DIR/log" "$RUN_DIR/data"
    sed "s|@RUN_DIR@|$RUN_DIR|g" "$HERE/clickhouse-config.xml" >"$CONF"
    sed "s|@RUN_DIR@|$RUN_DIR|g" "$HERE/clickhouse-users.xml" >"$RUN_DIR/users.xml"
    launch "$LOG_FILE" "$SERVER" "--config-file=$CONF"
    wait_ready
    log "ready in $(elapsed "$started")s: $URL, native $HOST:$TCP_PORT, database $DATABASE (log $SERVER_LOG)"
}

cmd_stop() {
    local pid
    if ! pid=$(server_pid); then
        rm -f "$PID_FILE"
        log "not running"
        return 0
    fi
    stop_pid "$pid" "$STOP_TIMEOUT"
    rm -f "$PID_FILE"
    log "stopped (pid $pid)"
}

cmd_status() {
    local pid
    if pid=$(server_pid); then
        local state=closed
        [[ $(http_code "$URL/ping") == 200 ]] && state=answering
        log "running, pid $pid, $URL ($state), native $HOST:$TCP_PORT, rss $(rss_mib "$pid") MiB, data in $RUN_DIR/data"
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

cmd_kafka_pipeline() {
    local topic=${1:-} group=${2:-}
    [[ -n $topic ]] || die "kafka-pipeline: topic name missing"
    [[ $topic =~ ^[A-Za-z0-9._-]+$ ]] || die "kafka-pipeline: bad topic name '$topic'"
    [[ -n $group ]] || group=hoptrace-clickhouse-$topic
    [[ $group =~ ^[A-Za-z0-9._-]+$ ]] || die "kafka-pipeline: bad group name '$group'"
    [[ $KAFKA_MAX_BLOCK =~ ^[1-9][0-9]*$ ]] ||
        die "kafka-pipeline: HOPTRACE_CH_KAFKA_MAX_BLOCK must be a positive number, not '$KAFKA_MAX_BLOCK'"
    server_pid >/dev/null || die "not running; start it first"
    local name=${topic//[^A-Za-z0-9_]/_} sql stmt out n=0
    sql=$(sed -e "s|@TOPIC@|$topic|g" -e "s|@GROUP@|$group|g" -e "s|@KAFKA@|$KAFKA_BOOTSTRAP|g" \
        -e "s|@NAME@|$name|g" -e "s|@MAX_BLOCK@|$KAFKA_MAX_BLOCK|g" \
        "$HERE/clickhouse-kafka.sql" | sed 's/--.*$//')
    # One statement per HTTP request: split on the semicolons that end statements.
    while IFS= read -r -d ';' stmt; do
        [[ -n ${stmt//[[:space:]]/} ]] || continue
        out=$(ch_query "$stmt") || die "kafka-pipeline: statement failed: $out"
        n=$((n + 1))
    done <<<"$sql"
    log "kafka-pipeline: $n statements applied; topic $topic at $KAFKA_BOOTSTRAP (group $group) -> $DATABASE.$name"
}

main() {
    (($#)) || usage
    local cmd=$1
    shift
    case $cmd in
    start | stop | status | wipe | url | install | packages | daemons)
        (($# == 0)) || die "$cmd takes no arguments"
        ;;
    esac
    case $cmd in
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    wipe) cmd_wipe ;;
    url) echo "$URL" ;;
    install) ensure_packages "${PACKAGES[@]}" ;;
    packages) echo "${PACKAGES[*]}" ;;
    daemons) echo "${SYSTEM_DAEMONS[*]}" ;;
    kafka-pipeline) cmd_kafka_pipeline "$@" ;;
    -h | --help | help) usage ;;
    *) die "unknown command '$cmd' (start, stop, status, wipe, url, install, kafka-pipeline)" ;;
    esac
}

main "$@"
