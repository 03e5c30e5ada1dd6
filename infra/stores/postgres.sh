#!/usr/bin/env bash
# Private PostgreSQL 15 cluster (Debian package "postgresql-15") for hoptrace's store taps.
#
#   postgres.sh start     install the package if missing, initdb (first start only, as the OS
#                         user postgres), start the server, create the test role and database,
#                         and check a real write and read as that role over TCP
#   postgres.sh stop      stop it (fast shutdown; data is kept)
#   postgres.sh status    show whether it runs (exit 3 when it does not)
#   postgres.sh wipe      delete the cluster of a stopped instance
#   postgres.sh url       print the connection URL of the test role
#   postgres.sh install   only install the package
#
# Listeners (see postgresql.conf and pg_hba.conf beside this script): TCP 127.0.0.1:15432 with
# password authentication; a Unix socket in the state directory (superuser, peer).
# Test credential: role "hoptrace", password "hoptrace-test", database "hoptrace" owned by it;
# not a secret. The readiness check writes a row to table "selftest" and reads it back.
#
# Files under ${HOPTRACE_RUN:-/tmp/hoptrace-infra}/postgres/: postgresql.conf, pg_hba.conf
# (generated), data/ (the cluster, owned by postgres), socket/, postgres.log (server output),
# initdb.log, postgres.pid. The state directory and its parents must be reachable by the OS
# user postgres (the default /tmp/hoptrace-infra is).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
NAME=postgres
PACKAGES=(postgresql-15)
SYSTEM_DAEMONS=("postgres:/etc/postgresql/")
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$HERE/common.sh"

BIN=/usr/lib/postgresql/15/bin
DATA=$RUN_DIR/data
SOCKET_DIR=$RUN_DIR/socket
CONF=$RUN_DIR/postgresql.conf
LOG_FILE=$RUN_DIR/postgres.log
READY_TIMEOUT=${HOPTRACE_POSTGRES_READY_TIMEOUT:-30}
PORT=15432
# Test credential of the test role; it only exists in this private cluster.
PG_USER=hoptrace
PG_PASSWORD=hoptrace-test
PG_DATABASE=hoptrace
URL=postgresql://$PG_USER:$PG_PASSWORD@$HOST:$PORT/$PG_DATABASE

server_pid() { pid_from "$PID_FILE" "-D $DATA"; }

# as_postgres CMD...: run CMD as the OS user postgres (setpriv execs, it does not fork).
as_postgres() {
    (cd "$RUN_DIR" && HOME=$RUN_DIR setpriv --reuid=postgres --regid=postgres --init-groups -- "$@")
}

# sql_super: run the SQL on stdin as the superuser over the Unix socket.
sql_super() {
    as_postgres "$BIN/psql" -X -q -At -v ON_ERROR_STOP=1 -h "$SOCKET_DIR" -p "$PORT" -U postgres \
        -d postgres
}

# sql_test ARGS...: psql as the test role over TCP.
sql_test() {
    PGPASSWORD=$PG_PASSWORD PGCONNECT_TIMEOUT=5 PGOPTIONS='-c client_min_messages=warning' "$BIN/psql" -X -q -At -v ON_ERROR_STOP=1 \
        -h "$HOST" -p "$PORT" -U "$PG_USER" -d "$PG_DATABASE" "$@"
}

fail() {
    show_logs "$LOG_FILE"
    local pid
    if pid=$(server_pid); then
        stop_pid "$pid" 20 INT
        rm -f "$PID_FILE"
    fi
    die "$*"
}

init_cluster() {
    [[ -f $DATA/PG_VERSION ]] && return 0
    local t0
    t0=$(now_ms)
    rm -rf "$DATA"
    mkdir -p "$DATA"
    chown postgres:postgres "$DATA"
    chmod 700 "$DATA"
    as_postgres "$BIN/initdb" -D "$DATA" -U postgres --auth=peer -E UTF8 --locale=C.UTF-8 \
        >"$RUN_DIR/initdb.log" 2>&1 || {
        show_logs "$RUN_DIR/initdb.log"
        die "initdb failed (output above)"
    }
    log "initdb in $(elapsed "$t0")s"
}

create_role_and_database() {
    local out
    # The password is set on every start, so it always matches this script.
    out=$(sql_super 2>&1 <<SQL
DO \$\$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$PG_USER') THEN
        CREATE ROLE $PG_USER LOGIN;
    END IF;
END
\$\$;
ALTER ROLE $PG_USER WITH LOGIN PASSWORD '$PG_PASSWORD';
SELECT 'CREATE DATABASE $PG_DATABASE OWNER $PG_USER'
    WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = '$PG_DATABASE') \gexec
SQL
    ) || fail "creating role $PG_USER and database $PG_DATABASE failed: $out"
}

wait_ready() {
    local deadline=$((SECONDS + READY_TIMEOUT)) out tok
    until as_postgres "$BIN/pg_isready" -q -h "$SOCKET_DIR" -p "$PORT" -U postgres -d postgres -t 1; do
        server_pid >/dev/null || fail "postgres exited during startup (log above)"
        ((SECONDS < deadline)) || fail "postgres not accepting connections after ${READY_TIMEOUT}s"
        sleep 0.05
    done
    create_role_and_database
    tok=$(token)
    out=$(sql_test -c "CREATE TABLE IF NOT EXISTS selftest (token text NOT NULL, at timestamptz NOT NULL DEFAULT now())" \
        -c "INSERT INTO selftest (token) VALUES ('$tok')" \
        -c "SELECT token FROM selftest WHERE token = '$tok'" 2>&1) ||
        fail "readiness write and read as $PG_USER on $HOST:$PORT failed: $out"
    [[ $out == "$tok" ]] || fail "wrote token $tok but read back '$out'"
}

cmd_start() {
    local pid started
    started=$(now_ms)
    if pid=$(server_pid); then
        log "already running (pid $pid, $HOST:$PORT)"
        return 0
    fi
    ensure_packages "${PACKAGES[@]}"
    [[ -x $BIN/postgres ]] || die "$BIN/postgres not found although postgresql-15 is installed"
    require_ports_free "$PORT"
    mkdir -p "$RUN_DIR" "$SOCKET_DIR"
    chown postgres:postgres "$SOCKET_DIR"
    as_postgres test -x "$RUN_DIR" ||
        die "the OS user postgres cannot reach $RUN_DIR; set HOPTRACE_RUN to a directory it can reach"
    local f
    for f in postgresql.conf pg_hba.conf; do
        sed "s|@RUN_DIR@|$RUN_DIR|g" "$HERE/$f" >"$RUN_DIR/$f"
    done
    init_cluster
    touch "$LOG_FILE"
    # A postmaster.pid left by a crash is checked and removed by postgres itself.
    launch "$LOG_FILE" setpriv --reuid=postgres --regid=postgres --init-groups -- \
        "$BIN/postgres" -D "$DATA" -c "config_file=$CONF"
    wait_ready
    log "ready in $(elapsed "$started")s: $URL (log $LOG_FILE)"
}

cmd_stop() {
    local pid
    if ! pid=$(server_pid); then
        rm -f "$PID_FILE"
        log "not running"
        return 0
    fi
    # SIGINT is PostgreSQL's fast shutdown: sessions are ended, data is checkpointed.
    stop_pid "$pid" 30 INT
    rm -f "$PID_FILE"
    log "stopped (pid $pid)"
}

cmd_status() {
    local pid
    if pid=$(server_pid); then
        local state=closed
        as_postgres "$BIN/pg_isready" -q -h "$SOCKET_DIR" -p "$PORT" -U postgres -d postgres -t 1 &&
            state=accepting
        log "running, pid $pid, $HOST:$PORT ($state), rss $(rss_mib "$pid") MiB (postmaster), data in $DATA"
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
