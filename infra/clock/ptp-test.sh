#!/usr/bin/env bash
# PTP between two network namespaces, for tests: ptp4l as grandmaster in one namespace and
# ptp4l as a slave in the other, joined by a veth pair, with software timestamping. The slave
# runs with free_running 1: it measures its offset from the master but never adjusts a clock
# (both namespaces share the host's one CLOCK_REALTIME, which must not be touched).
#
#   ptp-test.sh start DIR   create the namespaces and the veth pair, start both ptp4l
#   ptp-test.sh wait DIR [SECONDS]
#                           wait until the slave sees the grandmaster (pmc TIME_STATUS_NP
#                           gmPresent true) and has logged a master offset (default 20 s)
#   ptp-test.sh stop DIR    stop both ptp4l and delete the namespaces; safe to repeat
#   ptp-test.sh status DIR  pmc TIME_STATUS_NP and PORT_DATA_SET of both; exit 3 if down
#
# Names are derived from DIR's name so that concurrent runs do not collide; they are written
# to DIR/names. Each ptp4l has its own management socket: DIR/master.sock, DIR/slave.sock.
# Files under DIR: master.cfg, slave.cfg, master.log, slave.log, master.pid, slave.pid, names.
# Query the slave by hand:  pmc -u -b 0 -d 0 -s DIR/slave.sock 'GET TIME_STATUS_NP'
# Exit status 77 from start means network namespaces cannot be created here (no CAP_SYS_ADMIN
# or no veth support); tests skip on it. Both ptp4l exit by themselves after
# HOPTRACE_PTP_LIFETIME seconds (default 600).
set -euo pipefail

PTP4L=${PTP4L:-$(command -v ptp4l || echo /usr/sbin/ptp4l)}
PMC=${PMC:-$(command -v pmc || echo /usr/sbin/pmc)}
IP=${IP:-$(command -v ip || echo /usr/sbin/ip)}
LIFETIME=${HOPTRACE_PTP_LIFETIME:-600}
# Documentation addresses (RFC 5737); they only exist inside the two namespaces.
MASTER_ADDR=192.0.2.1/24
SLAVE_ADDR=192.0.2.2/24

log() { printf 'ptp-test: %s\n' "$*"; }
die() { printf 'ptp-test: error: %s\n' "$*" >&2; exit 1; }

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//' >&2
    exit 2
}

# names DIR: sets NS_M, NS_S (namespaces) and IF_M, IF_S (veth ends, at most 15 characters).
names() {
    local dir=$1 tag
    if [[ -f $dir/names ]]; then
        # shellcheck source=/dev/null
        source "$dir/names"
        return 0
    fi
    tag=$(printf '%s' "$(basename "$dir")" | cksum | cut -d' ' -f1)
    tag=$(printf '%08x' "$tag")
    NS_M=hoptrace-ptp-$tag-m
    NS_S=hoptrace-ptp-$tag-s
    IF_M=hpt${tag}m
    IF_S=hpt${tag}s
    printf 'NS_M=%s\nNS_S=%s\nIF_M=%s\nIF_S=%s\n' "$NS_M" "$NS_S" "$IF_M" "$IF_S" >"$dir/names"
}

# ptp_pid DIR NAME: the pid of our ptp4l NAME (master|slave), or fail.
ptp_pid() {
    local dir=$1 name=$2 pid
    [[ -f $dir/$name.pid ]] || return 1
    pid=$(<"$dir/$name.pid")
    [[ $pid =~ ^[0-9]+$ && -r /proc/$pid/cmdline ]] || return 1
    # Guard against pid reuse: it must be running our configuration.
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "-f $dir/$name.cfg" || return 1
    echo "$pid"
}

write_configs() {
    local dir=$1
    cat >"$dir/master.cfg" <<EOF
# hoptrace test grandmaster: software timestamps, fast message rates so a test is quick.
[global]
time_stamping           software
uds_address             $dir/master.sock
priority1               1
domainNumber            0
logSyncInterval         -3
logMinDelayReqInterval  -3
logAnnounceInterval     -2
EOF
    cat >"$dir/slave.cfg" <<EOF
# hoptrace test slave: measures its offset from the grandmaster and logs it once a second
# ("master offset ... s0 freq ... path delay ..."), but free_running 1 keeps it from
# adjusting any clock.
[global]
time_stamping           software
uds_address             $dir/slave.sock
slaveOnly               1
free_running            1
domainNumber            0
logSyncInterval         -3
logMinDelayReqInterval  -3
logAnnounceInterval     -2
# One log line per estimate: summary_interval equal to logSyncInterval.
summary_interval        -3
# Estimate over 2^0 = 1 s of Sync messages.
freq_est_interval       0
EOF
}

create_network() {
    local dir=$1
    names "$dir"
    if ! "$IP" netns list | grep -qw "$NS_M"; then
        "$IP" netns add "$NS_M" 2>"$dir/netns.err" || {
            cat "$dir/netns.err" >&2
            log "cannot create network namespaces here"
            exit 77
        }
    fi
    "$IP" netns list | grep -qw "$NS_S" || "$IP" netns add "$NS_S"
    if ! "$IP" -n "$NS_M" link show "$IF_M" >/dev/null 2>&1; then
        "$IP" link add "$IF_M" type veth peer name "$IF_S" 2>"$dir/netns.err" || {
            cat "$dir/netns.err" >&2
            log "cannot create a veth pair here"
            exit 77
        }
        "$IP" link set "$IF_M" netns "$NS_M"
        "$IP" link set "$IF_S" netns "$NS_S"
        "$IP" -n "$NS_M" addr add "$MASTER_ADDR" dev "$IF_M"
        "$IP" -n "$NS_S" addr add "$SLAVE_ADDR" dev "$IF_S"
    fi
    "$IP" -n "$NS_M" link set lo up
    "$IP" -n "$NS_S" link set lo up
    "$IP" -n "$NS_M" link set "$IF_M" up
    "$IP" -n "$NS_S" link set "$IF_S" up
}

start_ptp4l() {
    local dir=$1 name=$2 ns=$3 ifname=$4
    if ptp_pid "$dir" "$name" >/dev/null; then
        log "$name already runs"
        return 0
    fi
    rm -f "$dir/$name.sock"
    # `ip netns exec` enters the namespace and execs timeout, which runs ptp4l and stops it
    # after LIFETIME seconds even if nobody calls stop; $! is timeout, which passes a SIGTERM
    # on to ptp4l. -m: log to stdout.
    "$IP" netns exec "$ns" timeout "$LIFETIME" "$PTP4L" -f "$dir/$name.cfg" -i "$ifname" -S -m \
        </dev/null >"$dir/$name.log" 2>&1 &
    echo $! >"$dir/$name.pid"
    disown -a
}

start() {
    local dir=${1:?DIR missing} i
    [[ -x $PTP4L ]] || die "ptp4l not found (apt-get install linuxptp)"
    [[ -x $PMC ]] || die "pmc not found (apt-get install linuxptp)"
    [[ -x $IP ]] || die "ip not found (apt-get install iproute2)"
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    write_configs "$dir"
    create_network "$dir"
    start_ptp4l "$dir" master "$NS_M" "$IF_M"
    start_ptp4l "$dir" slave "$NS_S" "$IF_S"
    for ((i = 0; i < 50; i++)); do
        [[ -S $dir/master.sock && -S $dir/slave.sock ]] && break
        sleep 0.1
    done
    for name in master slave; do
        ptp_pid "$dir" "$name" >/dev/null || {
            tail -n 20 "$dir/$name.log" >&2
            die "ptp4l ($name) exited"
        }
    done
    log "master in $NS_M ($IF_M), slave in $NS_S ($IF_S), software timestamping"
    echo "HOPTRACE_PTP_SOCKET=$dir/slave.sock"
}

gm_seen() {
    local answer
    answer=$("$PMC" -u -b 0 -d 0 -s "$1/slave.sock" 'GET TIME_STATUS_NP' 2>/dev/null) || return 1
    [[ $answer =~ gmPresent[[:space:]]+true ]]
}

wait_ready() {
    local dir=${1:?DIR missing} timeout=${2:-20} deadline
    deadline=$((SECONDS + timeout))
    until gm_seen "$dir" && grep -q 'master offset' "$dir/slave.log"; do
        if ((SECONDS >= deadline)); then
            tail -n 20 "$dir/slave.log" >&2 || true
            die "the slave did not measure a master offset within ${timeout}s"
        fi
        sleep 0.2
    done
    log "slave measures its offset from the grandmaster"
}

stop() {
    local dir=${1:?DIR missing} name pid i
    [[ -d $dir ]] || return 0
    dir=$(cd "$dir" && pwd)
    for name in slave master; do
        pid=$(ptp_pid "$dir" "$name") || continue
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
    [[ -f $dir/names ]] || return 0
    names "$dir"
    # Deleting a namespace deletes the veth end in it, and with it the peer.
    for ns in "$NS_M" "$NS_S"; do
        if "$IP" netns list | grep -qw "$ns"; then
            "$IP" netns del "$ns" && log "deleted namespace $ns"
        fi
    done
}

status() {
    local dir=${1:?DIR missing} name rc=0
    for name in master slave; do
        if ptp_pid "$dir" "$name" >/dev/null; then
            echo "$name:"
            "$PMC" -u -b 0 -d 0 -s "$dir/$name.sock" 'GET TIME_STATUS_NP' 'GET PORT_DATA_SET' || rc=3
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
wait) wait_ready "$@" ;;
stop) stop "$@" ;;
status) status "$@" ;;
*) usage ;;
esac
