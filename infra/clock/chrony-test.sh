#!/usr/bin/env bash
# A private pair of chronyd daemons on loopback, for tests: a server (local stratum 8) and a
# client that tracks it. Both run with -x, so neither ever touches the system clock; each has
# its own configuration, pidfile, log and command socket under DIR, and the server answers NTP
# on 127.0.0.1:PORT only. The host's own chronyd (if any) is not used and not disturbed.
#
#   chrony-test.sh start DIR [PORT]   write the configs and start both daemons (PORT: NTP port
#                                     of the server, default 11123); prints the client's
#                                     command socket as HOPTRACE_CHRONY_SOCKET=...
#   chrony-test.sh wait DIR [SECONDS] wait until the client is synchronised (default 30 s);
#                                     exit 1 on timeout, printing its tracking report
#   chrony-test.sh stop DIR           stop both daemons (by their pidfiles); safe to repeat
#   chrony-test.sh status DIR         tracking of both (chronyc -c tracking); exit 3 if down
#
# Files under DIR (created 0700): server.conf, client.conf, server.pid, client.pid,
# server.log, client.log, server.sock, client.sock.
# Query the client by hand:  chronyc -h DIR/client.sock tracking
# The daemons exit by themselves after HOPTRACE_CHRONY_LIFETIME seconds (default 600), so a
# test that dies without calling stop leaves nothing running for long.
set -euo pipefail

CHRONYD=${CHRONYD:-$(command -v chronyd || echo /usr/sbin/chronyd)}
CHRONYC=${CHRONYC:-$(command -v chronyc || echo /usr/bin/chronyc)}
LIFETIME=${HOPTRACE_CHRONY_LIFETIME:-600}

log() { printf 'chrony-test: %s\n' "$*"; }
die() { printf 'chrony-test: error: %s\n' "$*" >&2; exit 1; }

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//' >&2
    exit 2
}

# daemon_pid DIR NAME: the pid of our chronyd NAME (server|client), or fail.
daemon_pid() {
    local dir=$1 name=$2 pid
    [[ -f $dir/$name.pid ]] || return 1
    pid=$(<"$dir/$name.pid")
    [[ $pid =~ ^[0-9]+$ && -r /proc/$pid/cmdline ]] || return 1
    # Guard against pid reuse: it must be chronyd running our configuration.
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "-f $dir/$name.conf" || return 1
    echo "$pid"
}

write_configs() {
    local dir=$1 port=$2
    cat >"$dir/server.conf" <<EOF
# hoptrace test NTP server: serves its own clock as stratum 8 on 127.0.0.1:$port.
local stratum 8
allow 127.0.0.1
port $port
bindaddress 127.0.0.1
# No UDP command port; chronyc talks to the Unix socket below.
cmdport 0
bindcmdaddress $dir/server.sock
pidfile $dir/server.pid
EOF
    cat >"$dir/client.conf" <<EOF
# hoptrace test NTP client: tracks the test server every 1/64 s. Started with -x, so it
# measures and reports the offset but never adjusts the system clock.
server 127.0.0.1 port $port iburst minpoll -6 maxpoll -6
# Serve no NTP.
port 0
cmdport 0
bindcmdaddress $dir/client.sock
pidfile $dir/client.pid
EOF
}

start_daemon() {
    local dir=$1 name=$2 user_opt
    if daemon_pid "$dir" "$name" >/dev/null; then
        log "$name already runs"
        return 0
    fi
    rm -f "$dir/$name.sock" "$dir/$name.pid"
    # As root, stay root (the private socket directory belongs to root); otherwise skip
    # chronyd's root check. -x: never control the system clock.
    if ((EUID == 0)); then user_opt=(-u root); else user_opt=(-U); fi
    "$CHRONYD" -x "${user_opt[@]}" -t "$LIFETIME" -f "$dir/$name.conf" -l "$dir/$name.log" ||
        die "chronyd ($name) did not start; see $dir/$name.log"
}

# wait_for_socket DIR NAME: the daemon's command socket answers within 5 s.
wait_for_socket() {
    local dir=$1 name=$2 i
    for ((i = 0; i < 50; i++)); do
        if "$CHRONYC" -h "$dir/$name.sock" -c tracking >/dev/null 2>&1; then
            return 0
        fi
        sleep 0.1
    done
    [[ -s $dir/$name.log ]] && tail -n 20 "$dir/$name.log" >&2
    die "chronyd ($name) does not answer on $dir/$name.sock"
}

start() {
    local dir=${1:?DIR missing} port=${2:-11123}
    [[ -x $CHRONYD ]] || die "chronyd not found (apt-get install chrony)"
    [[ -x $CHRONYC ]] || die "chronyc not found (apt-get install chrony)"
    [[ $port =~ ^[0-9]+$ ]] || die "PORT must be a number, got $port"
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    # chronyd refuses a command socket directory that others can write to.
    chmod 0700 "$dir"
    write_configs "$dir" "$port"
    start_daemon "$dir" server
    wait_for_socket "$dir" server
    start_daemon "$dir" client
    wait_for_socket "$dir" client
    log "server on 127.0.0.1:$port, client tracking it (both -x)"
    echo "HOPTRACE_CHRONY_SOCKET=$dir/client.sock"
}

synced() {
    local line
    line=$("$CHRONYC" -h "$1/client.sock" -c tracking 2>/dev/null) || return 1
    # Fields: ref id, name, stratum, ..., leap status (last).
    [[ ${line%%,*} != 00000000 && ${line##*,} != "Not synchronised" ]]
}

wait_synced() {
    local dir=${1:?DIR missing} timeout=${2:-30} deadline
    deadline=$((SECONDS + timeout))
    until synced "$dir"; do
        if ((SECONDS >= deadline)); then
            "$CHRONYC" -h "$dir/client.sock" tracking >&2 || true
            die "client not synchronised after ${timeout}s"
        fi
        sleep 0.2
    done
    log "client synchronised"
}

stop() {
    local dir=${1:?DIR missing} name pid i
    for name in client server; do
        pid=$(daemon_pid "$dir" "$name") || continue
        kill "$pid" 2>/dev/null || true
        for ((i = 0; i < 50; i++)); do
            [[ -e /proc/$pid ]] || break
            sleep 0.1
        done
        if [[ -e /proc/$pid ]]; then
            kill -KILL "$pid" 2>/dev/null || true
        fi
        log "stopped $name (pid $pid)"
    done
}

status() {
    local dir=${1:?DIR missing} name rc=0
    for name in server client; do
        if daemon_pid "$dir" "$name" >/dev/null; then
            printf '%s: ' "$name"
            "$CHRONYC" -h "$dir/$name.sock" -c tracking || rc=3
        else
            echo "$name: not running"
            rc=3
        fi
    done
    return "$rc"
}

cmd=${1:-}
shift || true
case $cmd in
start) start "$@" ;;
wait) wait_synced "$@" ;;
stop) stop "$@" ;;
status) status "$@" ;;
*) usage ;;
esac
