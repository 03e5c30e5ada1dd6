#!/usr/bin/env bash
# Starts and stops the private stores hoptrace's store taps are tested against.
#
#   stores.sh up     [NAME...]   install missing packages (one apt-get run), then start the
#                                named stores in parallel and report how long each took
#   stores.sh down   [NAME...]   stop them (data is kept)
#   stores.sh status [NAME...]   show what runs; exit 3 unless every named store does
#   stores.sh urls   [NAME...]   print NAME=ADDRESS lines
#   stores.sh install [NAME...]  only install the missing packages (one apt-get run)
#   stores.sh packages [NAME...] print the Debian packages they need
#
# NAME is one of: influxdb postgres clickhouse victoriametrics (default: all four). Each has
# its own script beside this one (influxdb.sh, postgres.sh, clickhouse.sh, victoriametrics.sh)
# with start, stop, status, wipe and url; see README.md for ports, files and measurements.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
NAME=stores
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$HERE/common.sh"

ALL=(influxdb postgres clickhouse victoriametrics)

# check_names NAME...: every name must be a known store.
check_names() {
    local n a ok
    for n in "$@"; do
        ok=0
        for a in "${ALL[@]}"; do [[ $n == "$a" ]] && ok=1; done
        ((ok)) || die "unknown store '$n' (known: ${ALL[*]})"
    done
}

install_all() {
    local n pkgs=() daemons=() p d
    for n in "$@"; do
        read -ra p <<<"$("$HERE/$n.sh" packages)"
        read -ra d <<<"$("$HERE/$n.sh" daemons)"
        pkgs+=("${p[@]}")
        daemons+=("${d[@]}")
    done
    # Read by stop_system_daemons in common.sh.
    SYSTEM_DAEMONS=("${daemons[@]}")
    ensure_packages "${pkgs[@]}"
}

up() {
    local started n rc=0 out
    started=$(now_ms)
    install_all "$@"
    out=$(mktemp -d)
    declare -A pids t0
    for n in "$@"; do
        t0[$n]=$(now_ms)
        "$HERE/$n.sh" start >"$out/$n.log" 2>&1 &
        pids[$n]=$!
    done
    for n in "$@"; do
        if wait "${pids[$n]}"; then
            printf '%s: ok, %ss\n' "$n" "$(elapsed "${t0[$n]}")"
            sed 's/^/    /' "$out/$n.log"
        else
            rc=1
            printf '%s: FAILED after %ss\n' "$n" "$(elapsed "${t0[$n]}")" >&2
            sed 's/^/    /' "$out/$n.log" >&2
        fi
    done
    rm -rf "$out"
    ((rc == 0)) || die "some stores did not start (output above)"
    log "up in $(elapsed "$started")s: $*"
}

down() {
    local n rc=0
    declare -A pids
    for n in "$@"; do
        "$HERE/$n.sh" stop &
        pids[$n]=$!
    done
    for n in "$@"; do
        wait "${pids[$n]}" || rc=1
    done
    ((rc == 0)) || die "some stores did not stop cleanly (see above)"
}

status() {
    local n rc=0
    for n in "$@"; do
        "$HERE/$n.sh" status || rc=3
    done
    return "$rc"
}

urls() {
    local n
    for n in "$@"; do
        printf '%s=%s\n' "$n" "$("$HERE/$n.sh" url)"
    done
}

main() {
    (($#)) || usage
    local cmd=$1
    shift
    (($#)) || set -- "${ALL[@]}"
    case $cmd in
    up | down | status | urls | install | packages) check_names "$@" ;;
    esac
    case $cmd in
    up) up "$@" ;;
    down) down "$@" ;;
    status) status "$@" ;;
    urls) urls "$@" ;;
    install) install_all "$@" ;;
    packages) for n in "$@"; do "$HERE/$n.sh" packages; done | tr ' ' '\n' | sort -u | tr '\n' ' ' ;;
    -h | --help | help) usage ;;
    *) die "unknown command '$cmd' (up, down, status, urls, install, packages)" ;;
    esac
}

main "$@"
