#!/usr/bin/env bash
# Installs what the hoptrace test services need on a Debian 12 machine and fetches the Kafka
# jars. Safe to run again: it only does work that is missing.
#
#   Debian packages: mosquitto mosquitto-clients (MQTT broker and CLI clients),
#                    chrony linuxptp (clock sync tooling), iproute2 (ip, tc, ss; the
#                    multi-host lab of infra/netns), util-linux (unshare), openssl (the
#                    collector's TLS certificates, infra/tls), procps (pgrep: the Kafka
#                    brokers' pids), mold (a faster linker, used by infra/linker/cc)
#   Kafka jars:      infra/kafka/kafka.sh fetch (into ${HOPTRACE_CACHE:-$HOME/.cache/hoptrace})
#   Chart libraries: npm ci in analysis/web (vega, vega-lite, vega-embed, inlined into
#                    report.html and used to render report.md's SVG images)
#   Stores:          InfluxDB, PostgreSQL 15, ClickHouse, VictoriaMetrics (Debian packages,
#                    infra/stores/stores.sh install) and Node-RED with its InfluxDB node
#                    (npm, infra/nodered/nodered.sh install), for the store taps' tests
#   --browser:       also Debian's chromium, for the headless browser tests (report, live view)
#   --demo:          only what `hoptrace demo` needs (infra/demo.sh): mold and the chart
#                    libraries; no brokers, stores, Kafka jars or Node-RED
#   --web:           only the chart libraries (npm; no root needed), for the fast tier of
#                    the tests (infra/test-fast.sh)
#
# The packages' own system services are not wanted: the project runs its own broker instances
# on its own ports (infra/mosquitto/mosquitto.sh). If an install started the stock mosquitto or
# chronyd daemon, this script stops it again.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
PACKAGES=(mosquitto mosquitto-clients chrony linuxptp iproute2 util-linux openssl procps mold)
DEMO=0
WEB=0
for arg in "$@"; do
    case $arg in
    --browser) PACKAGES+=(chromium) ;;
    --demo) DEMO=1 ;;
    --web) WEB=1 ;;
    *) printf 'setup: unknown option %s (known: --browser, --demo, --web)\n' "$arg" >&2; exit 2 ;;
    esac
done
if ((DEMO)); then
    PACKAGES=(mold)
fi

log() { printf 'setup: %s\n' "$*"; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

installed() {
    [[ $(dpkg-query -W -f='${Status}' "$1" 2>/dev/null) == "install ok installed" ]]
}

# stop_system_daemon NAME: stop a daemon that a package's maintainer scripts started.
# Our own mosquitto runs with a configuration under $HOPTRACE_RUN and is left alone.
stop_system_daemon() {
    local name=$1 pids pid
    pids=$(pgrep -x "$name" || true)
    [[ -n $pids ]] || return 0
    for pid in $pids; do
        if tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q 'hoptrace'; then
            continue
        fi
        log "stopping the $name service started by the package install (pid $pid)"
        service "$name" stop >/dev/null 2>&1 || true
        if kill -0 "$pid" 2>/dev/null; then
            kill "$pid" 2>/dev/null || true
        fi
    done
}

install_packages() {
    local missing=() p store_missing=0
    for p in "${PACKAGES[@]}"; do
        installed "$p" || missing+=("$p")
    done
    if ((!DEMO)); then
        for p in $("$HERE/stores/stores.sh" packages); do
            installed "$p" || store_missing=1
        done
    fi
    if ((${#missing[@]} == 0 && store_missing == 0)); then
        return 0
    fi

    command -v apt-get >/dev/null || die "apt-get not found; install by hand: ${missing[*]}"
    ((EUID == 0)) || die "installing ${missing[*]} needs root (rerun as root or install them by hand)"
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    local aptlog
    aptlog=$(mktemp)
    if ! apt-get update -q >"$aptlog" 2>&1; then
        tail -n 20 "$aptlog" >&2
        die "apt-get update failed (full output: $aptlog)"
    fi
    # The stores' packages, with the same package lists (no second update).
    if ((store_missing)); then
        HOPTRACE_APT_UPDATED=1 "$HERE/stores/stores.sh" install || die "installing the stores' packages failed"
    fi
    ((${#missing[@]})) || { rm -f "$aptlog"; return 0; }
    if ! apt-get install -y -q --no-install-recommends "${missing[@]}" >>"$aptlog" 2>&1; then
        tail -n 20 "$aptlog" >&2
        die "apt-get install ${missing[*]} failed (full output: $aptlog)"
    fi
    rm -f "$aptlog"
    for p in "${missing[@]}"; do
        installed "$p" || die "package $p is still not installed after apt-get install"
    done

    # Debian's maintainer scripts start services unless a policy-rc.d forbids it.
    stop_system_daemon mosquitto
    stop_system_daemon chronyd
    log "installed ${missing[*]}"
}

# install_web: the chart libraries the reports inline, pinned by analysis/web/package-lock.json.
install_web() {
    local web=$ROOT/analysis/web
    [[ -f $web/node_modules/vega-embed/build/vega-embed.min.js ]] && return 0
    command -v npm >/dev/null || die "npm not found: install Node.js (the reports inline chart libraries from npm)"
    log "installing the chart libraries (npm ci in analysis/web)"
    npm ci --prefix "$web" --no-audit --no-fund --loglevel=error >/dev/null ||
        die "npm ci in $web failed"
}

if ((WEB)); then
    install_web
    exit 0
fi
install_packages
install_web
if ((DEMO)); then
    log "ok (what the demo needs is present)"
    exit 0
fi
"$HERE/kafka/kafka.sh" fetch --quiet
"$HERE/nodered/nodered.sh" install >/dev/null
log "ok (packages present, Kafka jars in ${HOPTRACE_CACHE:-$HOME/.cache/hoptrace})"
