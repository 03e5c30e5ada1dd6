#!/usr/bin/env bash
# Several test hosts on one machine: one network namespace per host, each with its own
# address on a bridge, and its own host name (UTS namespace) for the processes run in it.
#
#   infra/netns/lab.sh up NAME...        # hosts NAME... at 10.231.0.11, .12, ...
#   infra/netns/lab.sh exec NAME CMD...  # CMD on host NAME (its network, host name NAME)
#   infra/netns/lab.sh addr NAME         # NAME's address
#   infra/netns/lab.sh down              # remove every host and the bridge
#
# The machine itself is 10.231.0.1 on the bridge `htlab0`: a collector there listens on
# 10.231.0.1:PORT (not loopback, so it requires a token). Needs root and iproute2.
set -euo pipefail

BRIDGE=htlab0
PREFIX=10.231.0
STATE=${HOPTRACE_RUN:-/tmp/hoptrace-infra}/netns
NS_PREFIX=htlab-

die() {
    echo "lab: $*" >&2
    exit 1
}

addr_of() {
    local f="$STATE/$1"
    [[ -f $f ]] || die "no host $1 (infra/netns/lab.sh up $1)"
    cat "$f"
}

up() {
    (($# > 0)) || die "usage: $0 up NAME..."
    command -v ip >/dev/null || die "iproute2 (ip) is not installed"
    mkdir -p "$STATE"
    if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
        ip link add "$BRIDGE" type bridge
        ip addr add "$PREFIX.1/24" dev "$BRIDGE"
        ip link set "$BRIDGE" up
    fi
    local i=$(($(find "$STATE" -type f | wc -l) + 11))
    for name in "$@"; do
        [[ $name =~ ^[a-z0-9][a-z0-9-]{0,9}$ ]] || die "host name $name: use 1-10 of a-z, 0-9, -"
        [[ -f $STATE/$name ]] && die "host $name is up already"
        ((i < 255)) || die "no address left on $PREFIX.0/24"
        local ns=$NS_PREFIX$name
        ip netns add "$ns"
        ip link add "hl-$name" type veth peer name eth0 netns "$ns"
        ip link set "hl-$name" master "$BRIDGE" up
        ip -n "$ns" addr add "$PREFIX.$i/24" dev eth0
        ip -n "$ns" link set eth0 up
        ip -n "$ns" link set lo up
        ip -n "$ns" route add default via "$PREFIX.1"
        echo "$PREFIX.$i" >"$STATE/$name"
        echo "lab: host $name at $PREFIX.$i (network namespace $ns)"
        i=$((i + 1))
    done
}

down() {
    local ns
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$NS_PREFIX" || true); do
        ip netns pids "$ns" 2>/dev/null | xargs -r kill 2>/dev/null || true
        ip netns del "$ns"
    done
    ip link del "$BRIDGE" 2>/dev/null || true
    rm -rf "$STATE"
}

case ${1:-} in
up)
    shift
    up "$@"
    ;;
down) down ;;
addr) addr_of "${2:?usage: $0 addr NAME}" ;;
exec)
    name=${2:?usage: $0 exec NAME CMD...}
    shift 2
    addr_of "$name" >/dev/null
    exec ip netns exec "$NS_PREFIX$name" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$name" "$@"
    ;;
*) die "usage: $0 up NAME... | exec NAME CMD... | addr NAME | down" ;;
esac
