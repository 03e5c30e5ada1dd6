#!/usr/bin/env bash
# Local Apache Kafka (KRaft mode, no ZooKeeper) for hoptrace development and tests.
#
#   kafka.sh fetch [--quiet]               download the broker and tool jars into the cache
#   kafka.sh start  [--nodes 1|3]          start the single node (default) or the 3-node cluster
#   kafka.sh stop   [--nodes 1|3]          stop one deployment (default: every running node)
#   kafka.sh status [--nodes 1|3]          show what is running
#   kafka.sh create-topic NAME [--partitions N] [--replication R] [--log-append-time]
#                          [--bootstrap HOST:PORT]
#   kafka.sh topics ARGS...                run TopicCommand with ARGS (add --bootstrap-server)
#   kafka.sh run CLASS ARGS...             run any class from the Kafka classpath, e.g.
#                                          kafka.tools.ConsoleProducer,
#                                          org.apache.kafka.tools.consumer.ConsoleConsumer,
#                                          kafka.admin.ConfigCommand
#   kafka.sh wipe [--nodes 1|3]            delete a stopped deployment's data and logs
#
# Ports (all bound to 127.0.0.1):
#   single node   client 19092, controller 19093
#   cluster       clients 29092 29093 29094, controllers 29192 29193 29194 (node ids 1, 2, 3)
#
# Jars live in ${HOPTRACE_CACHE:-$HOME/.cache/hoptrace}/kafka-3.9.1/lib, never in the work tree.
# Runtime state lives in ${HOPTRACE_RUN:-/tmp/hoptrace-infra}/kafka-{single,cluster}/node-N/:
#   server.properties  generated broker configuration
#   data/              KRaft metadata log and topic partitions
#   logs/server.log    broker log (INFO, see log4j.properties)
#   stdout.log         JVM stdout/stderr
#   kafka.pid          process id
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

KAFKA_VERSION=3.9.1
CACHE=${HOPTRACE_CACHE:-$HOME/.cache/hoptrace}
KAFKA_HOME=$CACHE/kafka-$KAFKA_VERSION
LIB=$KAFKA_HOME/lib
MARKER=$KAFKA_HOME/.fetched
RUN=${HOPTRACE_RUN:-/tmp/hoptrace-infra}
# Seconds a start may take: three brokers' JVMs starting at once on two busy cores need
# more than one does.
SINGLE_READY_TIMEOUT=${HOPTRACE_KAFKA_READY_TIMEOUT:-90}
CLUSTER_READY_TIMEOUT=${HOPTRACE_KAFKA_READY_TIMEOUT:-240}
STOP_TIMEOUT=${HOPTRACE_KAFKA_STOP_TIMEOUT:-60}

HOST=127.0.0.1
SINGLE_CLIENT_PORT=19092
SINGLE_CONTROLLER_PORT=19093
CLUSTER_CLIENT_PORTS=(29092 29093 29094)
CLUSTER_CONTROLLER_PORTS=(29192 29193 29194)
DEFAULT_BOOTSTRAP=$HOST:$SINGLE_CLIENT_PORT

SINGLE_HEAP=512m
CLUSTER_HEAP=384m
BROKER_JVM_OPTS=(-XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35
    -XX:+ExplicitGCInvokesConcurrent -Djava.awt.headless=true)
TOOL_JVM_OPTS=(-Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Djava.awt.headless=true
    "-Dlog4j.configuration=file:$HERE/tools-log4j.properties")

log() { printf 'kafka: %s\n' "$*"; }
warn() { printf 'kafka: warning: %s\n' "$*" >&2; }
die() { printf 'kafka: error: %s\n' "$*" >&2; exit 1; }

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//' >&2
    exit 2
}

# ---------------------------------------------------------------------------------------------
# Jars

pom_digest() { sha256sum "$HERE/pom.xml" | cut -d' ' -f1; }

fetched() {
    [[ -f $MARKER && -f $LIB/kafka_2.13-$KAFKA_VERSION.jar ]] && [[ $(cat "$MARKER") == "$(pom_digest)" ]]
}

cmd_fetch() {
    local quiet=0
    [[ ${1:-} == --quiet ]] && quiet=1
    if fetched; then
        ((quiet)) || log "jars already in $LIB"
        return 0
    fi
    command -v mvn >/dev/null || die "mvn not found; Maven is needed to fetch the Kafka jars"
    command -v java >/dev/null || die "java not found; a JDK 17 is needed to run Kafka"
    mkdir -p "$KAFKA_HOME"
    local tmp=$LIB.partial.$$ started=$SECONDS
    rm -rf "$tmp"
    log "fetching Kafka $KAFKA_VERSION jars from Maven into $LIB"
    # Maven's output is kept for the error message only.
    if ! mvn -q -B -Dstyle.color=never -f "$HERE/pom.xml" dependency:copy-dependencies \
        -DoutputDirectory="$tmp" >"$KAFKA_HOME/fetch.log" 2>&1; then
        rm -rf "$tmp"
        tail -n 30 "$KAFKA_HOME/fetch.log" >&2
        die "mvn dependency:copy-dependencies failed for $HERE/pom.xml (full output: $KAFKA_HOME/fetch.log)"
    fi
    [[ -f $tmp/kafka_2.13-$KAFKA_VERSION.jar ]] || {
        rm -rf "$tmp"
        die "Maven finished but kafka_2.13-$KAFKA_VERSION.jar is missing from the download"
    }
    rm -rf "$LIB"
    mv "$tmp" "$LIB"
    pom_digest >"$MARKER"
    log "fetched $(find "$LIB" -name '*.jar' | wc -l) jars in $((SECONDS - started))s"
}

need_jars() {
    fetched || cmd_fetch
}

# Runs a Kafka command-line class with the tool JVM settings.
kafka_tool() {
    need_jars
    java "${TOOL_JVM_OPTS[@]}" -cp "$LIB/*" "$@"
}

# ---------------------------------------------------------------------------------------------
# Deployments and nodes

# parse_nodes VALUE -> "single" or "cluster"
deployment_for() {
    case $1 in
    1) echo single ;;
    3) echo cluster ;;
    *) die "--nodes takes 1 or 3, not '$1'" ;;
    esac
}

node_ids() {
    case $1 in
    single) echo 1 ;;
    cluster) echo 1 2 3 ;;
    esac
}

deploy_dir() { echo "$RUN/kafka-$1"; }
node_dir() { echo "$RUN/kafka-$1/node-$2"; }

client_port() {
    if [[ $1 == single ]]; then echo "$SINGLE_CLIENT_PORT"; else echo "${CLUSTER_CLIENT_PORTS[$2 - 1]}"; fi
}

controller_port() {
    if [[ $1 == single ]]; then echo "$SINGLE_CONTROLLER_PORT"; else echo "${CLUSTER_CONTROLLER_PORTS[$2 - 1]}"; fi
}

bootstrap_of() {
    local d=$1 id out=""
    for id in $(node_ids "$d"); do
        out+="${out:+,}$HOST:$(client_port "$d" "$id")"
    done
    echo "$out"
}

quorum_voters() {
    local d=$1 id out=""
    for id in $(node_ids "$d"); do
        out+="${out:+,}$id@$HOST:$(controller_port "$d" "$id")"
    done
    echo "$out"
}

# node_pid DEPLOYMENT ID: prints the pid of a live broker for that node, or fails.
node_pid() {
    local dir pid
    dir=$(node_dir "$1" "$2")
    [[ -f $dir/kafka.pid ]] || return 1
    pid=$(<"$dir/kafka.pid")
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    [[ -r /proc/$pid/cmdline ]] || return 1
    # Guard against pid reuse: the process must be our broker for this node.
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF "kafka.Kafka $dir/server.properties" || return 1
    echo "$pid"
}

# port_open PORT [HOST]: something accepts TCP connections there.
port_open() {
    # shellcheck disable=SC2016 # expanded by the inner bash
    timeout 1 bash -c 'exec 3<>"/dev/tcp/$0/$1"' "${2:-$HOST}" "$1" 2>/dev/null
}

# require_reachable HOST:PORT[,HOST:PORT...]: fail fast when no bootstrap address answers.
require_reachable() {
    local addr
    for addr in ${1//,/ }; do
        port_open "${addr##*:}" "${addr%:*}" && return 0
    done
    die "no Kafka broker listening at $1 (start one with: infra/kafka/kafka.sh start)"
}

# topic_command ARGS...: TopicCommand with short admin timeouts.
topic_command() {
    kafka_tool org.apache.kafka.tools.TopicCommand --command-config "$HERE/admin.properties" "$@"
}

write_properties() {
    local d=$1 id=$2 dir rf isr
    dir=$(node_dir "$d" "$id")
    if [[ $d == single ]]; then rf=1 isr=1; else rf=3 isr=2; fi
    cat >"$dir/server.properties" <<EOF
# Generated by infra/kafka/kafka.sh on every start; edit the script, not this file.
process.roles=broker,controller
node.id=$id
controller.quorum.voters=$(quorum_voters "$d")
listeners=PLAINTEXT://$HOST:$(client_port "$d" "$id"),CONTROLLER://$HOST:$(controller_port "$d" "$id")
advertised.listeners=PLAINTEXT://$HOST:$(client_port "$d" "$id")
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
log.dirs=$dir/data

# Topics are created explicitly (kafka.sh create-topic); a typo must not create one.
auto.create.topics.enable=false
num.partitions=1
default.replication.factor=$rf
min.insync.replicas=$isr

# Internal topics sized for this deployment.
offsets.topic.replication.factor=$rf
offsets.topic.num.partitions=10
transaction.state.log.replication.factor=$rf
transaction.state.log.min.isr=$isr
transaction.state.log.num.partitions=10

# Consumers in tests join a group and expect partitions right away.
group.initial.rebalance.delay.ms=0

# Small, disposable test data: a day, and at most 1 GiB per partition, so a 30-minute soak
# at tens of MB/s stays within the disk (checked every 30 s, in 64 MiB segments).
log.retention.hours=24
log.retention.bytes=1073741824
log.retention.check.interval.ms=30000
log.segment.bytes=67108864
num.network.threads=2
num.io.threads=4
num.recovery.threads.per.data.dir=1
EOF
}

format_storage() {
    local d=$1 id=$2 dir cid_file cid
    dir=$(node_dir "$d" "$id")
    [[ -f $dir/data/meta.properties ]] && return 0
    cid_file=$(deploy_dir "$d")/cluster.id
    if [[ ! -s $cid_file ]]; then
        kafka_tool kafka.tools.StorageTool random-uuid >"$cid_file.tmp" 2>"$dir/format.log" ||
            die "kafka.tools.StorageTool random-uuid failed: $(cat "$dir/format.log")"
        mv "$cid_file.tmp" "$cid_file"
    fi
    cid=$(<"$cid_file")
    if ! kafka_tool kafka.tools.StorageTool format --ignore-formatted -t "$cid" \
        -c "$dir/server.properties" >"$dir/format.log" 2>&1; then
        die "formatting storage of $d node $id failed:
$(cat "$dir/format.log")"
    fi
}

launch_node() {
    local d=$1 id=$2 dir heap
    dir=$(node_dir "$d" "$id")
    if [[ $d == single ]]; then heap=$SINGLE_HEAP; else heap=$CLUSTER_HEAP; fi
    mkdir -p "$dir/logs"
    if [[ -f $dir/logs/server.log ]]; then
        stat -c %s "$dir/logs/server.log" >"$dir/log.offset"
    else
        echo 0 >"$dir/log.offset"
    fi
    {
        echo
        echo "=== $(date -Is) starting $d node $id"
    } >>"$dir/stdout.log"
    # setsid: the broker must outlive the shell (and process group) that started it.
    setsid java "-Xms$heap" "-Xmx$heap" "${BROKER_JVM_OPTS[@]}" \
        "-Dkafka.logs.dir=$dir/logs" "-Dlog4j.configuration=file:$HERE/log4j.properties" \
        -cp "$LIB/*" kafka.Kafka "$dir/server.properties" \
        </dev/null >>"$dir/stdout.log" 2>&1 9>&- &
    local pid=$! deadline=$((SECONDS + 10)) found
    # setsid forks when it starts as a process group leader (a shell with job control):
    # then $! is a parent that exits at once. Record the broker's own pid.
    while ((SECONDS < deadline)); do
        found=$(pgrep -f -n "kafka.Kafka $dir/server.properties" || true)
        if [[ -n $found ]]; then
            pid=$found
            break
        fi
        sleep 0.1
    done
    echo "$pid" >"$dir/kafka.pid"
}

show_logs() {
    local d=$1 id dir
    for id in $(node_ids "$d"); do
        dir=$(node_dir "$d" "$id")
        if [[ -f $dir/logs/server.log ]]; then
            printf '\n--- tail of %s\n' "$dir/logs/server.log" >&2
            tail -n 25 "$dir/logs/server.log" >&2
        fi
        if [[ -s $dir/stdout.log ]]; then
            printf '\n--- tail of %s\n' "$dir/stdout.log" >&2
            tail -n 15 "$dir/stdout.log" >&2
        fi
    done
}

# node_started DEPLOYMENT ID: the broker accepts connections and has logged the end of its
# startup since the last launch (server.log is appended to across restarts).
node_started() {
    local dir log offset=0
    dir=$(node_dir "$1" "$2")
    log=$dir/logs/server.log
    port_open "$(client_port "$1" "$2")" && [[ -f $log ]] || return 1
    [[ -f $dir/log.offset ]] && offset=$(<"$dir/log.offset")
    # grep -c reads to the end: with grep -q, tail would die of SIGPIPE once more than a pipe
    # buffer of log follows the line, and under pipefail the check would fail forever.
    if (($(stat -c %s "$log") >= offset)); then
        tail -c "+$((offset + 1))" "$log" | grep -c 'Kafka Server started' >/dev/null
    else
        # Rolled over since the launch (log4j.properties: 32 MB): the launch's part is now
        # server.log.1 from the offset on, and the rest is the new server.log.
        { [[ -f $log.1 ]] && tail -c "+$((offset + 1))" "$log.1"; cat "$log"; } |
            grep -c 'Kafka Server started' >/dev/null
    fi
}

# brokers_registered DEPLOYMENT: every node of the deployment answers requests and is in
# the cluster's metadata (unfenced), seen through the admin API rather than the logs.
brokers_registered() {
    local d=$1 out id
    out=$(timeout 60 java "${TOOL_JVM_OPTS[@]}" -cp "$LIB/*" kafka.admin.BrokerApiVersionsCommand \
        --command-config "$HERE/admin.properties" --bootstrap-server "$(bootstrap_of "$d")" 2>&1) || {
        printf '%s' "$out"
        return 1
    }
    for id in $(node_ids "$d"); do
        grep -q "(id: $id rack" <<<"$out" || {
            printf 'node %s is not in the metadata yet' "$id"
            return 1
        }
    done
}

# fail_start DEPLOYMENT MESSAGE: show the logs, stop what was started, and exit.
fail_start() {
    show_logs "$1"
    stop_deployment "$1" >&2
    die "$2"
}

wait_ready() {
    local d=$1 deadline id all pending timeout=$SINGLE_READY_TIMEOUT
    [[ $d == single ]] || timeout=$CLUSTER_READY_TIMEOUT
    deadline=$((SECONDS + timeout))
    while :; do
        all=1
        pending=""
        for id in $(node_ids "$d"); do
            if ! node_pid "$d" "$id" >/dev/null; then
                fail_start "$d" "$d node $id exited during startup (logs above, under $(node_dir "$d" "$id"))"
            fi
            node_started "$d" "$id" || { all=0; pending+=" $id"; }
        done
        ((all)) && break
        if ((SECONDS >= deadline)); then
            fail_start "$d" "$d Kafka not ready after ${timeout}s (waiting for node(s)$pending; logs above)"
        fi
        sleep 1
    done
    # Final check through the admin API: every node answers and is registered.
    local out
    while ! out=$(brokers_registered "$d"); do
        if ((SECONDS >= deadline)); then
            fail_start "$d" "$d Kafka is up but not every broker is registered after ${timeout}s: $(tail -n 3 <<<"$out")"
        fi
        sleep 1
    done
}

cmd_start() {
    local nodes=1
    while (($#)); do
        case $1 in
        --nodes) nodes=${2:?--nodes needs a value}; shift 2 ;;
        --nodes=*) nodes=${1#*=}; shift ;;
        *) die "start: unknown argument '$1'" ;;
        esac
    done
    local d id running=0 stale=0 started=$SECONDS
    d=$(deployment_for "$nodes")
    for id in $(node_ids "$d"); do
        if node_pid "$d" "$id" >/dev/null; then running=$((running + 1)); else stale=$((stale + 1)); fi
    done
    if ((stale == 0)); then
        log "$d already running ($(bootstrap_of "$d"))"
        return 0
    fi
    command -v java >/dev/null || die "java not found; a JDK 17 is needed to run Kafka"
    need_jars
    for id in $(node_ids "$d"); do
        local port
        node_pid "$d" "$id" >/dev/null && continue
        for port in "$(client_port "$d" "$id")" "$(controller_port "$d" "$id")"; do
            port_open "$port" && die "port $HOST:$port is taken by another process; cannot start $d node $id"
        done
    done
    ((running > 0)) && log "$d: $running node(s) already running, starting the rest"
    log "starting $d ($(bootstrap_of "$d")), data in $(deploy_dir "$d")"
    for id in $(node_ids "$d"); do
        node_pid "$d" "$id" >/dev/null && continue
        mkdir -p "$(node_dir "$d" "$id")/data"
        write_properties "$d" "$id"
        format_storage "$d" "$id"
    done
    for id in $(node_ids "$d"); do
        node_pid "$d" "$id" >/dev/null || launch_node "$d" "$id"
    done
    wait_ready "$d"
    log "$d ready in $((SECONDS - started))s: bootstrap $(bootstrap_of "$d")"
}

stop_deployment() {
    local d=$1 id pid pids=() deadline
    for id in $(node_ids "$d"); do
        if pid=$(node_pid "$d" "$id"); then
            pids+=("$pid")
        else
            rm -f "$(node_dir "$d" "$id")/kafka.pid"
        fi
    done
    if ((${#pids[@]} == 0)); then
        log "$d not running"
        return 0
    fi
    log "stopping $d (pid ${pids[*]})"
    # All nodes at once: stopping them one by one leaves the last ones without a controller
    # quorum, and they then wait out their controlled-shutdown timeout.
    kill -TERM "${pids[@]}" 2>/dev/null || true
    deadline=$((SECONDS + STOP_TIMEOUT))
    while :; do
        local alive=()
        for pid in "${pids[@]}"; do
            kill -0 "$pid" 2>/dev/null && alive+=("$pid")
        done
        ((${#alive[@]} == 0)) && break
        if ((SECONDS >= deadline)); then
            warn "$d pid ${alive[*]} still running after ${STOP_TIMEOUT}s; sending SIGKILL"
            kill -KILL "${alive[@]}" 2>/dev/null || true
            sleep 1
            break
        fi
        sleep 0.5
    done
    for id in $(node_ids "$d"); do
        rm -f "$(node_dir "$d" "$id")/kafka.pid"
    done
    log "$d stopped"
}

cmd_stop() {
    local ds=(single cluster)
    while (($#)); do
        case $1 in
        --nodes) ds=("$(deployment_for "${2:?--nodes needs a value}")"); shift 2 ;;
        --nodes=*) ds=("$(deployment_for "${1#*=}")"); shift ;;
        --all) ds=(single cluster); shift ;;
        *) die "stop: unknown argument '$1'" ;;
        esac
    done
    local d
    for d in "${ds[@]}"; do
        stop_deployment "$d"
    done
}

cmd_status() {
    local ds=(single cluster) explicit=0
    while (($#)); do
        case $1 in
        --nodes) ds=("$(deployment_for "${2:?--nodes needs a value}")") explicit=1; shift 2 ;;
        --nodes=*) ds=("$(deployment_for "${1#*=}")") explicit=1; shift ;;
        *) die "status: unknown argument '$1'" ;;
        esac
    done
    local d id pid down=0
    if fetched; then log "jars: $LIB"; else log "jars: not fetched (kafka.sh fetch)"; fi
    for d in "${ds[@]}"; do
        for id in $(node_ids "$d"); do
            if pid=$(node_pid "$d" "$id"); then
                log "$d node $id: running, pid $pid, client $HOST:$(client_port "$d" "$id"), controller $HOST:$(controller_port "$d" "$id")"
            else
                log "$d node $id: stopped"
                down=1
            fi
        done
    done
    # With an explicit --nodes the exit status says whether that deployment is fully up.
    if ((explicit && down)); then return 3; fi
    return 0
}

cmd_create_topic() {
    local name="" partitions="" replication="" log_append=0 bootstrap=$DEFAULT_BOOTSTRAP
    while (($#)); do
        case $1 in
        --partitions) partitions=${2:?--partitions needs a value}; shift 2 ;;
        --replication | --replication-factor) replication=${2:?--replication needs a value}; shift 2 ;;
        --log-append-time) log_append=1; shift ;;
        --bootstrap | --bootstrap-server) bootstrap=${2:?--bootstrap needs a value}; shift 2 ;;
        -*) die "create-topic: unknown option '$1'" ;;
        *)
            [[ -z $name ]] || die "create-topic: only one topic name, got '$name' and '$1'"
            name=$1; shift ;;
        esac
    done
    [[ -n $name ]] || die "create-topic: topic name missing"
    [[ -z $partitions || $partitions =~ ^[1-9][0-9]*$ ]] || die "create-topic: bad --partitions '$partitions'"
    [[ -z $replication || $replication =~ ^[1-9][0-9]*$ ]] || die "create-topic: bad --replication '$replication'"

    require_reachable "$bootstrap"
    local desc
    desc=$(topic_command --bootstrap-server "$bootstrap" \
        --describe --if-exists --topic "$name" 2>&1) ||
        die "cannot describe topic '$name' on $bootstrap: $(tail -n 3 <<<"$desc")"
    if [[ -z $desc ]]; then
        local args=(--bootstrap-server "$bootstrap" --create --if-not-exists --topic "$name")
        [[ -n $partitions ]] && args+=(--partitions "$partitions")
        [[ -n $replication ]] && args+=(--replication-factor "$replication")
        ((log_append)) && args+=(--config message.timestamp.type=LogAppendTime)
        local out
        out=$(topic_command "${args[@]}" 2>&1) ||
            die "creating topic '$name' on $bootstrap failed: $(tail -n 3 <<<"$out")"
        local ts=""
        ((log_append)) && ts=", LogAppendTime"
        log "created topic $name on $bootstrap${partitions:+, $partitions partition(s)}${replication:+, replication $replication}$ts"
        return 0
    fi

    # The topic exists: check that it matches what was asked for.
    local have_parts have_rf
    have_parts=$(sed -n 's/.*PartitionCount: *\([0-9]*\).*/\1/p' <<<"$desc" | head -n1)
    have_rf=$(sed -n 's/.*ReplicationFactor: *\([0-9]*\).*/\1/p' <<<"$desc" | head -n1)
    if [[ -n $partitions && $have_parts != "$partitions" ]]; then
        warn "topic $name exists with $have_parts partition(s), not $partitions; left as is"
    fi
    if [[ -n $replication && $have_rf != "$replication" ]]; then
        warn "topic $name exists with replication $have_rf, not $replication; left as is"
    fi
    if ((log_append)) && ! grep -q 'message.timestamp.type=LogAppendTime' <<<"$desc"; then
        local out
        out=$(kafka_tool kafka.admin.ConfigCommand --command-config "$HERE/admin.properties" \
            --bootstrap-server "$bootstrap" --alter \
            --entity-type topics --entity-name "$name" \
            --add-config message.timestamp.type=LogAppendTime 2>&1) ||
            die "setting LogAppendTime on existing topic '$name' failed: $(tail -n 3 <<<"$out")"
        log "topic $name existed; switched it to LogAppendTime"
        return 0
    fi
    log "topic $name already exists ($have_parts partition(s), replication $have_rf)"
}

cmd_wipe() {
    local ds=()
    while (($#)); do
        case $1 in
        --nodes) ds+=("$(deployment_for "${2:?--nodes needs a value}")"); shift 2 ;;
        --nodes=*) ds+=("$(deployment_for "${1#*=}")"); shift ;;
        *) die "wipe: unknown argument '$1'" ;;
        esac
    done
    ((${#ds[@]})) || ds=(single cluster)
    local d id
    for d in "${ds[@]}"; do
        for id in $(node_ids "$d"); do
            node_pid "$d" "$id" >/dev/null && die "$d node $id is running; stop it before wiping"
        done
        rm -rf "$(deploy_dir "$d")"
        log "wiped $(deploy_dir "$d")"
    done
}

# lock: one start, stop or wipe at a time (two test suites starting the cluster at once
# would otherwise both launch its nodes). The brokers themselves do not hold the lock.
lock() {
    mkdir -p "$RUN"
    exec 9>"$RUN/kafka.lock"
    flock 9
}

main() {
    (($#)) || usage
    local cmd=$1
    shift
    case $cmd in start | stop | wipe) lock ;; esac
    case $cmd in
    fetch) cmd_fetch "$@" ;;
    start) cmd_start "$@" ;;
    stop) cmd_stop "$@" ;;
    status) cmd_status "$@" ;;
    create-topic) cmd_create_topic "$@" ;;
    topics) kafka_tool org.apache.kafka.tools.TopicCommand "$@" ;;
    run)
        (($#)) || die "run: class name missing"
        kafka_tool "$@"
        ;;
    wipe) cmd_wipe "$@" ;;
    -h | --help | help) usage ;;
    *) die "unknown command '$cmd' (fetch, start, stop, status, create-topic, topics, run, wipe)" ;;
    esac
}

main "$@"
