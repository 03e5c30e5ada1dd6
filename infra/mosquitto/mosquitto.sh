#!/usr/bin/env bash
# Local Mosquitto MQTT broker for hoptrace development and tests.
#
#   mosquitto.sh start    generate the config and password file, start the broker, and check
#                         a publish/subscribe round trip on both listeners
#   mosquitto.sh stop     stop it
#   mosquitto.sh status   show whether it runs (exit 3 when it does not)
#
# Listeners (see mosquitto.conf beside this script):
#   127.0.0.1:11883  anonymous
#   127.0.0.1:11884  authenticated; test credential user "hoptrace", password "hoptrace-test"
#
# Files under ${HOPTRACE_RUN:-/tmp/hoptrace-infra}/mosquitto/: mosquitto.conf (generated),
# passwd, mosquitto.pid, mosquitto.log (broker log), stderr.log (startup errors).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

MOSQUITTO=/usr/sbin/mosquitto
RUN_DIR=${HOPTRACE_RUN:-/tmp/hoptrace-infra}/mosquitto
CONF=$RUN_DIR/mosquitto.conf
PID_FILE=$RUN_DIR/mosquitto.pid
LOG_FILE=$RUN_DIR/mosquitto.log
PASSWD_FILE=$RUN_DIR/passwd
READY_TIMEOUT=${HOPTRACE_MQTT_READY_TIMEOUT:-20}

HOST=127.0.0.1
ANON_PORT=11883
AUTH_PORT=11884
# Test credential for the authenticated listener; not a secret.
MQTT_USER=hoptrace
MQTT_PASSWORD=hoptrace-test

log() { printf 'mosquitto: %s\n' "$*"; }
die() { printf 'mosquitto: error: %s\n' "$*" >&2; exit 1; }

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//' >&2
    exit 2
}

# broker_pid: prints the pid of our running broker, or fails.
broker_pid() {
    local pid
    [[ -f $PID_FILE ]] || return 1
    pid=$(<"$PID_FILE")
    [[ $pid =~ ^[0-9]+$ && -r /proc/$pid/cmdline ]] || return 1
    # Guard against pid reuse: it must be mosquitto running our generated config.
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "-c $CONF" || return 1
    echo "$pid"
}

port_open() {
    # shellcheck disable=SC2016 # expanded by the inner bash
    timeout 1 bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$HOST" "$1" 2>/dev/null
}

show_log() {
    local f
    for f in "$LOG_FILE" "$RUN_DIR/stderr.log"; do
        if [[ -s $f ]]; then
            printf '\n--- tail of %s\n' "$f" >&2
            tail -n 20 "$f" >&2
        fi
    done
}

fail() {
    show_log
    die "$*"
}

# round_trip PORT [mosquitto client auth args...]: publish a retained message and read it back.
round_trip() {
    local port=$1 topic token got
    shift
    topic=_infra/selftest/$$-$port
    token=ping-$RANDOM$RANDOM
    mosquitto_pub -h "$HOST" -p "$port" "$@" -q 1 -r -t "$topic" -m "$token" 2>&1 || return 1
    got=$(mosquitto_sub -h "$HOST" -p "$port" "$@" -q 1 -t "$topic" -C 1 -W 5 2>&1) || {
        echo "$got"
        return 1
    }
    # Clear the retained message again.
    mosquitto_pub -h "$HOST" -p "$port" "$@" -q 1 -r -n -t "$topic" 2>&1 || return 1
    [[ $got == "$token" ]] || {
        echo "expected '$token', received '$got'"
        return 1
    }
}

wait_ready() {
    local deadline=$((SECONDS + READY_TIMEOUT)) out
    until port_open "$ANON_PORT" && port_open "$AUTH_PORT"; do
        broker_pid >/dev/null || fail "mosquitto exited during startup (log above)"
        ((SECONDS < deadline)) || fail "mosquitto not listening on $HOST:$ANON_PORT and $HOST:$AUTH_PORT after ${READY_TIMEOUT}s"
        sleep 0.2
    done
    out=$(round_trip "$ANON_PORT") ||
        fail "publish/subscribe round trip on anonymous listener $HOST:$ANON_PORT failed: $out"
    out=$(round_trip "$AUTH_PORT" -u "$MQTT_USER" -P "$MQTT_PASSWORD") ||
        fail "publish/subscribe round trip as '$MQTT_USER' on $HOST:$AUTH_PORT failed: $out"
    if mosquitto_pub -h "$HOST" -p "$AUTH_PORT" -t _infra/selftest/anon -m x >/dev/null 2>&1; then
        fail "listener $HOST:$AUTH_PORT accepted an anonymous client; check $CONF"
    fi
}

cmd_start() {
    local pid started=$SECONDS
    if pid=$(broker_pid); then
        log "already running (pid $pid, $HOST:$ANON_PORT anonymous, $HOST:$AUTH_PORT authenticated)"
        return 0
    fi
    [[ -x $MOSQUITTO ]] || die "$MOSQUITTO not found; run infra/setup.sh to install mosquitto"
    local tool
    for tool in mosquitto_pub mosquitto_sub mosquitto_passwd; do
        command -v "$tool" >/dev/null || die "$tool not found; run infra/setup.sh to install mosquitto-clients"
    done
    local port
    for port in "$ANON_PORT" "$AUTH_PORT"; do
        port_open "$port" && die "port $HOST:$port is taken by another process; cannot start mosquitto"
    done

    mkdir -p "$RUN_DIR"
    rm -f "$PID_FILE"
    # A fresh password file each start, so the credential always matches this script.
    rm -f "$PASSWD_FILE"
    (umask 077 && mosquitto_passwd -c -b "$PASSWD_FILE" "$MQTT_USER" "$MQTT_PASSWORD") ||
        die "mosquitto_passwd could not create $PASSWD_FILE"
    sed "s|@RUN_DIR@|$RUN_DIR|g" "$HERE/mosquitto.conf" >"$CONF"

    printf '=== %s starting\n' "$(date -Is)" >>"$LOG_FILE"
    if ! "$MOSQUITTO" -c "$CONF" -d 2>"$RUN_DIR/stderr.log"; then
        fail "$MOSQUITTO -c $CONF -d failed"
    fi
    # -d returns once the daemon has forked; its pid file may lag slightly behind.
    local deadline=$((SECONDS + 5))
    until broker_pid >/dev/null; do
        ((SECONDS < deadline)) || fail "mosquitto did not stay up (no live process for $PID_FILE)"
        sleep 0.1
    done
    wait_ready
    log "ready in $((SECONDS - started))s: $HOST:$ANON_PORT anonymous, $HOST:$AUTH_PORT as $MQTT_USER (log $LOG_FILE)"
}

cmd_stop() {
    local pid
    if ! pid=$(broker_pid); then
        rm -f "$PID_FILE"
        log "not running"
        return 0
    fi
    kill -TERM "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + 10))
    while kill -0 "$pid" 2>/dev/null; do
        if ((SECONDS >= deadline)); then
            log "pid $pid ignored SIGTERM for 10s; sending SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
            break
        fi
        sleep 0.1
    done
    rm -f "$PID_FILE"
    log "stopped (pid $pid)"
}

cmd_status() {
    local pid
    if pid=$(broker_pid); then
        local a=closed b=closed
        port_open "$ANON_PORT" && a=open
        port_open "$AUTH_PORT" && b=open
        log "running, pid $pid, $HOST:$ANON_PORT ($a, anonymous), $HOST:$AUTH_PORT ($b, authenticated)"
        return 0
    fi
    log "stopped"
    return 3
}

main() {
    (($# == 1)) || usage
    case $1 in
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    -h | --help | help) usage ;;
    *) die "unknown command '$1' (start, stop, status)" ;;
    esac
}

main "$@"
