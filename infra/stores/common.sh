# shellcheck shell=bash
# Helpers shared by the store scripts in infra/stores/ (sourced, not run).
#
# The sourcing script sets NAME (its log prefix and the name of its state directory) and may
# set PACKAGES (the Debian packages it needs) and SYSTEM_DAEMONS (process names and the
# command-line pattern of the stock service a package install may start, "name:pattern").
# It sets no shell options; the sourcing script has already set -euo pipefail.

HOST=127.0.0.1
RUN_ROOT=${HOPTRACE_RUN:-/tmp/hoptrace-infra}
# shellcheck disable=SC2153 # NAME is set by the sourcing script
RUN_DIR=$RUN_ROOT/$NAME
PID_FILE=$RUN_DIR/$NAME.pid

log() { printf '%s: %s\n' "$NAME" "$*"; }
warn() { printf '%s: warning: %s\n' "$NAME" "$*" >&2; }
die() { printf '%s: error: %s\n' "$NAME" "$*" >&2; exit 1; }

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
    exit 2
}

# now_ms: wall-clock milliseconds, for the "ready in" figures.
now_ms() {
    local t=${EPOCHREALTIME/./}
    echo $((t / 1000))
}

# elapsed SINCE_MS: seconds since SINCE_MS with two decimals.
elapsed() {
    local d=$(($(now_ms) - $1))
    printf '%d.%02d' $((d / 1000)) $((d % 1000 / 10))
}

port_open() {
    # shellcheck disable=SC2016 # expanded by the inner bash
    timeout 1 bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$HOST" "$1" 2>/dev/null
}

# require_ports_free PORT...: fail when another process already listens on one of them.
require_ports_free() {
    local port
    for port in "$@"; do
        port_open "$port" && die "port $HOST:$port is taken by another process; cannot start $NAME"
    done
    return 0
}

# pid_from FILE PATTERN: prints the pid in FILE (its first line) when that process is alive and
# its command line contains PATTERN (a guard against pid reuse), or fails.
pid_from() {
    local file=$1 pattern=$2 pid try
    [[ -f $file ]] || return 1
    pid=$(head -n 1 "$file")
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    # A process in the middle of exec (the launcher's shell becoming the server) can show an
    # empty command line for a moment, on a busy machine for longer: read it again before
    # calling the pid someone else's.
    for try in 1 2 3 4 5 6; do
        alive "$pid" || return 1
        if tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$pattern"; then
            echo "$pid"
            return 0
        fi
        ((try < 6)) && sleep 0.1
    done
    return 1
}

# rss_mib PID: resident memory of a process in MiB.
rss_mib() {
    local kb
    kb=$(awk '/^VmRSS:/ {print $2}' "/proc/$1/status" 2>/dev/null) || return 1
    [[ -n $kb ]] || return 1
    echo $((kb / 1024))
}

# launch LOG_FILE CMD ARGS...: start CMD in its own session, detached from this shell, with
# stdout and stderr appended to LOG_FILE; its pid goes to PID_FILE. The inner shell writes
# its own pid and then execs CMD, so the pid is right whether or not setsid had to fork.
launch() {
    local log_file=$1
    shift
    printf '\n=== %s starting\n' "$(date -Is)" >>"$log_file"
    rm -f "$PID_FILE"
    # shellcheck disable=SC2016 # expanded by the inner bash
    setsid bash -c 'echo $$ >"$0"; exec "$@"' "$PID_FILE" "$@" </dev/null >>"$log_file" 2>&1 &
    local deadline=$((SECONDS + 5))
    until [[ -s $PID_FILE ]]; do
        ((SECONDS < deadline)) || die "no pid file $PID_FILE 5 s after launching $1"
        sleep 0.05
    done
}

# show_logs FILE...: print the tail of each non-empty log to stderr.
show_logs() {
    local f
    for f in "$@"; do
        if [[ -s $f ]]; then
            printf '\n--- tail of %s\n' "$f" >&2
            tail -n 20 "$f" >&2
        fi
    done
}

# alive PID: the process exists and is not a zombie (a server started by a script that has
# since exited is reaped by pid 1, which may take a while).
alive() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    stat=${stat##*) }
    [[ ${stat:0:1} != Z ]]
}

# stop_pid PID TIMEOUT_S [SIGNAL]: signal the process (SIGTERM by default), wait for it to
# exit, and SIGKILL it after TIMEOUT_S seconds.
stop_pid() {
    local pid=$1 timeout=$2 sig=${3:-TERM}
    kill "-$sig" "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + timeout))
    while alive "$pid"; do
        if ((SECONDS >= deadline)); then
            warn "pid $pid ignored SIG$sig for ${timeout}s; sending SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
            sleep 0.5
            break
        fi
        sleep 0.1
    done
}

installed() {
    [[ $(dpkg-query -W -f='${Status}' "$1" 2>/dev/null) == "install ok installed" ]]
}

# stop_system_daemons: stop a stock service that a package's maintainer scripts started
# (Debian starts services on install unless a policy-rc.d forbids it). Only processes whose
# command line matches the stock configuration are touched; private instances, ours or
# anyone else's, are left alone.
stop_system_daemons() {
    local entry name pattern pid
    for entry in "${SYSTEM_DAEMONS[@]}"; do
        name=${entry%%:*}
        pattern=${entry#*:}
        for pid in $(pgrep -x "$name" || true); do
            tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$pattern" || continue
            log "stopping the $name service started by the package install (pid $pid)"
            service "$name" stop >/dev/null 2>&1 || true
            kill "$pid" 2>/dev/null || true
        done
    done
}

# ensure_packages PACKAGE...: install the missing ones (one apt-get update, then apt-get
# install --no-install-recommends), serialised by a lock so that parallel starts do not race
# for dpkg.
ensure_packages() {
    local missing=() p
    for p in "$@"; do
        installed "$p" || missing+=("$p")
    done
    ((${#missing[@]})) || return 0
    command -v apt-get >/dev/null || die "apt-get not found; install by hand: ${missing[*]}"
    ((EUID == 0)) || die "installing ${missing[*]} needs root (rerun as root or install them by hand)"
    mkdir -p "$RUN_ROOT"
    local aptlog rc=0
    aptlog=$(mktemp)
    # The lock is held by file descriptor 9 for the rest of this function's subshell.
    (
        flock -w 900 9 || die "waited 15 min for $RUN_ROOT/apt.lock"
        missing=()
        for p in "$@"; do
            installed "$p" || missing+=("$p")
        done
        ((${#missing[@]})) || exit 0
        log "installing ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        # infra/setup.sh updates the package lists once for everything it installs.
        if [[ ${HOPTRACE_APT_UPDATED:-} != 1 ]] && ! apt-get update -q >"$aptlog" 2>&1; then
            tail -n 20 "$aptlog" >&2
            die "apt-get update failed (full output: $aptlog)"
        fi
        if ! apt-get install -y -q --no-install-recommends -o DPkg::Lock::Timeout=300 \
            "${missing[@]}" >>"$aptlog" 2>&1; then
            tail -n 20 "$aptlog" >&2
            die "apt-get install ${missing[*]} failed (full output: $aptlog)"
        fi
        for p in "${missing[@]}"; do
            installed "$p" || die "package $p is still not installed after apt-get install"
        done
        stop_system_daemons
        log "installed ${missing[*]}"
    ) 9>"$RUN_ROOT/apt.lock" || rc=$?
    rm -f "$aptlog"
    return "$rc"
}

# http_code URL [curl args...]: prints the HTTP status code (000 when nothing answered).
http_code() {
    local url=$1
    shift
    curl -sS -o /dev/null -w '%{http_code}' --max-time 2 "$@" "$url" 2>/dev/null || true
}

# token: a fresh random marker for the readiness write and read.
token() { printf 'ready-%s-%s%s' "$$" "$RANDOM" "$RANDOM"; }
