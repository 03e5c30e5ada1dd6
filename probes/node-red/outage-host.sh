#!/usr/bin/env bash
# A running Node-RED flow that hosts the hoptrace node, for a collector outage soak
# (runner/bench/probe_outage.py --lang nodered starts one with and one without the node).
#
#   outage-host.sh [--rate N] [--streams N] [--duration SECONDS] [--port P]
#                  [--collector HOST:PORT] [--userdir DIR] [--heap-mb N]
#   outage-host.sh --prepare
#
#   --rate N             messages per second the flow's generator sends, open-loop (10000)
#   --streams N          streams they are spread over, round robin (3000)
#   --duration SECONDS   how long the generator sends (600); once the flow has drained,
#                        Node-RED stops as on SIGTERM and the process exits
#   --port P             Node-RED's HTTP port on 127.0.0.1; 0, the default, takes a free one
#   --collector H:P      the flow has the hoptrace node (hop flow_in, id 1, mode in, MQTT v5
#                        user property carrier, every setting at its default but this
#                        collector address), installed into the userDir with
#                        `npm install <folder>`; without it the flow is the same minus that node
#   --userdir DIR        Node-RED's userDir (created if missing; flows.json written over);
#                        default: a new directory under ${TMPDIR:-/tmp}, removed when
#                        Node-RED exits (not after SIGKILL)
#   --heap-mb N          V8's old-space limit, as infra/nodered/nodered.sh sets it (256)
#   --prepare            only install Node-RED 4.1.8 into the cache (infra/nodered/nodered.sh
#                        install) and check Node.js, so that the timed start installs nothing
#
# The flow (outage/flow.js): inject (once, at deploy) -> generator (function) ->
# [hoptrace flow_in] -> sink (function); outage/host.js measures, outage/settings.js wires
# it in. The launcher execs Node-RED, so its pid is Node-RED's. Besides Node-RED's log, stdout
# carries one-line JSON objects starting with `{` (outage/host.js says which):
#   {"ready":true,"pid":P}                 the first message went through the flow
#   {"t":S,"n":N,"max_ns":M,"h":[[idx,count],...],"loop_p999_ns":L,...,"probe":{...}}
#                                          every second: messages at the sink, a histogram
#                                          of their generator-to-sink time (bucket
#                                          floor(128*log2(ns))), the event loop's P99.9
#                                          delay, the exporter's counters (with --collector)
#   {"end":true,"sent":G,"received":R,...,"probe":{...}}   at exit
#
# Node-RED 4.1.8 comes from infra/nodered's cache, ${HOPTRACE_CACHE:-$HOME/.cache/hoptrace}/nodered.
# Needs Node.js >= 18.5 and npm.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CACHE=${HOPTRACE_CACHE:-$HOME/.cache/hoptrace}/nodered
RED_JS=$CACHE/node_modules/node-red/red.js
PACKAGE_NAME=node-red-contrib-hoptrace

die() {
    printf 'outage-host: error: %s\n' "$*" >&2
    exit 1
}

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
    exit 2
}

RATE=10000
STREAMS=3000
DURATION=600
PORT=0
COLLECTOR=
USER_DIR=
HEAP_MB=256
PREPARE=0

while (($# > 0)); do
    case $1 in
    --rate | --streams | --duration | --port | --collector | --userdir | --heap-mb)
        (($# >= 2)) || die "$1 needs a value"
        case $1 in
        --rate) RATE=$2 ;;
        --streams) STREAMS=$2 ;;
        --duration) DURATION=$2 ;;
        --port) PORT=$2 ;;
        --collector) COLLECTOR=$2 ;;
        --userdir) USER_DIR=$2 ;;
        --heap-mb) HEAP_MB=$2 ;;
        esac
        shift 2
        ;;
    --prepare)
        PREPARE=1
        shift
        ;;
    -h | --help) usage ;;
    *) die "unknown argument '$1' (--help lists them)" ;;
    esac
done

[[ $RATE =~ ^[1-9][0-9]*$ ]] || die "--rate must be a positive integer, not '$RATE'"
[[ $STREAMS =~ ^[1-9][0-9]*$ ]] && ((STREAMS <= 4294967295)) ||
    die "--streams must be an integer 1..4294967295, not '$STREAMS'"
[[ $DURATION =~ ^[0-9]+(\.[0-9]+)?$ && ! $DURATION =~ ^0+(\.0+)?$ ]] ||
    die "--duration must be a positive number of seconds, not '$DURATION'"
[[ $PORT =~ ^[0-9]+$ ]] && ((PORT <= 65535)) || die "--port must be 0..65535, not '$PORT'"
[[ -z $COLLECTOR || $COLLECTOR =~ ^[^:[:space:]]+:[0-9]+$ ]] ||
    die "--collector must be HOST:PORT, not '$COLLECTOR'"
[[ $HEAP_MB =~ ^[1-9][0-9]*$ ]] || die "--heap-mb must be a positive integer, not '$HEAP_MB'"

command -v node >/dev/null || die "node not found: install Node.js >= 18.5"
node -e 'const [a, b] = process.versions.node.split(".").map(Number);
         process.exit(a > 18 || (a === 18 && b >= 5) ? 0 : 1)' ||
    die "Node.js $(node --version) is too old: Node-RED 4 needs >= 18.5"
# Installs only when missing or when infra/nodered's lock file changed; its log to stderr.
"$REPO/infra/nodered/nodered.sh" install >&2
[[ -f $RED_JS ]] || die "Node-RED is not at $RED_JS after infra/nodered/nodered.sh install"
if ((PREPARE)); then
    command -v npm >/dev/null || die "npm not found: install Node.js >= 18.5"
    exit 0
fi

remove_at_exit=
if [[ -n $USER_DIR ]]; then
    mkdir -p "$USER_DIR"
    USER_DIR=$(cd "$USER_DIR" && pwd)
    [[ -n $COLLECTOR || ! -e $USER_DIR/node_modules/$PACKAGE_NAME ]] ||
        die "$USER_DIR has $PACKAGE_NAME installed: the flow without the hoptrace node needs a userDir without it"
else
    USER_DIR=$(mktemp -d "${TMPDIR:-/tmp}/hoptrace-outage-nodered.XXXXXX")
    remove_at_exit=$USER_DIR
    # Until the exec; then outage/host.js removes it when Node-RED exits.
    trap 'rm -rf "$remove_at_exit"' EXIT
fi

if [[ -n $COLLECTOR ]]; then
    # As a Node-RED user installs a local node: npm links the folder into node_modules and
    # records it in the userDir's package.json. The package has no dependencies: no registry.
    [[ -f $USER_DIR/package.json ]] ||
        printf '{\n  "name": "hoptrace-outage-userdir",\n  "private": true\n}\n' >"$USER_DIR/package.json"
    command -v npm >/dev/null || die "npm not found: install Node.js >= 18.5"
    out=$(cd "$USER_DIR" && npm install --offline --no-audit --no-fund --loglevel=error "$HERE" 2>&1) ||
        die "npm install $HERE into $USER_DIR failed: $out"
    [[ -f $USER_DIR/node_modules/$PACKAGE_NAME/package.json ]] ||
        die "npm install finished but $USER_DIR/node_modules/$PACKAGE_NAME is missing"
    node "$HERE/outage/flow.js" --collector "$COLLECTOR" >"$USER_DIR/flows.json"
    export HOPTRACE_OUTAGE_PROBE_PKG=$USER_DIR/node_modules/$PACKAGE_NAME
    title=hoptrace-outage-probed
else
    node "$HERE/outage/flow.js" >"$USER_DIR/flows.json"
    unset HOPTRACE_OUTAGE_PROBE_PKG
    title=hoptrace-outage-plain
fi

# What outage/settings.js hands to outage/host.js.
export HOPTRACE_OUTAGE_RATE=$RATE HOPTRACE_OUTAGE_STREAMS=$STREAMS HOPTRACE_OUTAGE_DURATION=$DURATION
export HOPTRACE_OUTAGE_REMOVE_USERDIR=$remove_at_exit

trap - EXIT
exec node "--max-old-space-size=$HEAP_MB" "$RED_JS" --title "$title" \
    --settings "$HERE/outage/settings.js" --userDir "$USER_DIR" --port "$PORT"
