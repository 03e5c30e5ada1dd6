#!/usr/bin/env bash
# MirrorMaker 2 measured hop by hop with the hoptrace JVM interceptors.
#
#   probes/jvm/mm2/run.sh [--short | --long] [--plain | --otel] [--rate MSG_PER_S] [--messages N] [--out DIR]
#
#   --short      1,500 messages at 150/s (the integration test; about 30 s with start-up)
#   --long       300,000 messages at 1,000/s (5 minutes; for the report)
#   --plain      MirrorMaker 2 without the interceptors (the same run otherwise, with
#                pipeline-plain.toml: publish and target_arrival only), to measure what
#                the interceptors cost end to end and in MirrorMaker's CPU
#   --otel       MirrorMaker 2 without the interceptors, under the OpenTelemetry Java agent
#                (opentelemetry-javaagent 2.31.0 from Maven Central), exporting its spans
#                over OTLP/HTTP protobuf to `hoptrace collect --otlp`; the publisher gives
#                every message a trace id (--traceparent); pipeline-otel.toml takes
#                mm2_consume from the agent's consumer spans (its producer spans start
#                traces of their own). No hoptrace code in MirrorMaker.
#   --rate, --messages   override the mode's figures
#   --out DIR    where runs/<run-id>/ and the processes' logs go
#                (default ${HOPTRACE_RUN:-/tmp/hoptrace-infra}/jvm-mm2)
#
# Needs HOPTRACE_BIN (the hoptrace binary), Java 17 and Maven, the single-node Kafka on
# 127.0.0.1:19092 (infra/services.sh up); starts the 3-node cluster (127.0.0.1:29092-29094)
# when it is not running, and never stops it.
#
# What it does: fetches Apache Kafka's MirrorMaker 2 (connect-mirror 3.9.1) with Maven into
# ${HOPTRACE_CACHE:-$HOME/.cache/hoptrace}/mm2-3.9.1/lib; builds the interceptors; creates
# a source topic with LogAppendTime (2 partitions) and its replica src.<topic> on the cluster
# (replication 3); starts `hoptrace collect` with mm2/pipeline.toml, MirrorMaker 2 (dedicated
# mode, -Xmx256m) with the interceptors in its consumer and producer, and `hoptrace tap` on
# the target topic; publishes with `hoptrace publish`; waits for the tap to see every
# message; stops MirrorMaker, then the collector; writes `hoptrace report`; and exits 0 only
# when the accounting is exact: it adds up and every message sent is complete. It prints
# MirrorMaker's CPU time (utime + stime) from the first message published until the tap
# saw the last.
#
# The last line printed is "run: <run directory>".
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PROBE=$(cd "$HERE/.." && pwd)
REPO=$(cd "$PROBE/../.." && pwd)
KAFKA_SH=$REPO/infra/kafka/kafka.sh
CACHE=${HOPTRACE_CACHE:-$HOME/.cache/hoptrace}
MM2_LIB=$CACHE/mm2-3.9.1/lib
SOURCE=127.0.0.1:19092
TARGET=127.0.0.1:29092,127.0.0.1:29093,127.0.0.1:29094

mode=short
plain=0
otel=0
rate=
messages=
out=${HOPTRACE_RUN:-/tmp/hoptrace-infra}/jvm-mm2
while (($#)); do
    case $1 in
        --short) mode=short ;;
        --long) mode=long ;;
        --plain) plain=1 ;;
        --otel) otel=1 ;;
        --rate) rate=$2; shift ;;
        --messages) messages=$2; shift ;;
        --out) out=$2; shift ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "run.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
if [[ $mode == short ]]; then
    rate=${rate:-150}
    messages=${messages:-1500}
else
    rate=${rate:-1000}
    messages=${messages:-300000}
fi

log() { printf 'mm2-run: %s\n' "$*" >&2; }
die() { printf 'mm2-run: error: %s\n' "$*" >&2; exit 1; }

BIN=${HOPTRACE_BIN:-}
[[ -n $BIN && -x $BIN ]] || die "set HOPTRACE_BIN to the hoptrace binary"
command -v java >/dev/null || die "java (17) not found"
command -v mvn >/dev/null || die "mvn not found"
command -v python3 >/dev/null || die "python3 not found (reads run.json)"

listening() { (exec 3<>"/dev/tcp/${1%:*}/${1#*:}") 2>/dev/null; }

# --- Jars ---------------------------------------------------------------------------------
if [[ ! -f $MM2_LIB/connect-mirror-3.9.1.jar ]]; then
    log "fetching MirrorMaker 2 (connect-mirror 3.9.1) with Maven into $MM2_LIB"
    mkdir -p "$(dirname "$MM2_LIB")"
    tmp=$MM2_LIB.partial.$$
    rm -rf "$tmp"
    mvn -q -B -f "$HERE/pom.xml" dependency:copy-dependencies -DoutputDirectory="$tmp" \
        >"$CACHE/mm2-fetch.log" 2>&1 || { tail -20 "$CACHE/mm2-fetch.log" >&2; die "Maven could not fetch connect-mirror"; }
    rm -rf "$MM2_LIB"
    mv "$tmp" "$MM2_LIB"
fi
# The interceptors: the jar (or classes) HOPTRACE_JVM_PROBE_CLASSES names (MirrorMakerIT: the
# jar `mvn verify` built), else a fresh package; none with --plain.
probe_cp=${HOPTRACE_JVM_PROBE_CLASSES:-}
pipeline=$HERE/pipeline.toml
hops=publish,source_append,mm2_consume,mm2_produce,target_arrival
OTEL_AGENT_VERSION=2.31.0
otel_agent=$CACHE/otel-javaagent-$OTEL_AGENT_VERSION/opentelemetry-javaagent-$OTEL_AGENT_VERSION.jar
if ((plain && otel)); then
    die "--plain and --otel are two different runs: give one"
elif ((otel)); then
    probe_cp=
    pipeline=$HERE/pipeline-otel.toml
    hops=publish,mm2_consume,target_arrival
    if [[ ! -f $otel_agent ]]; then
        log "fetching the OpenTelemetry Java agent $OTEL_AGENT_VERSION with Maven into $(dirname "$otel_agent")"
        mvn -q -B dependency:copy -Dartifact="io.opentelemetry.javaagent:opentelemetry-javaagent:$OTEL_AGENT_VERSION" \
            -DoutputDirectory="$(dirname "$otel_agent")" >"$CACHE/otel-agent-fetch.log" 2>&1 ||
            { tail -20 "$CACHE/otel-agent-fetch.log" >&2; die "Maven could not fetch the OpenTelemetry Java agent"; }
    fi
elif ((plain)); then
    probe_cp=
    pipeline=$HERE/pipeline-plain.toml
    hops=publish,target_arrival
elif [[ -z $probe_cp ]]; then
    log "building the interceptors (mvn package)"
    mvn -q -B -f "$PROBE/pom.xml" package -DskipTests >/dev/null || die "mvn package failed"
    probe_cp=$PROBE/target/hoptrace-kafka-interceptors-0.1.0.jar
fi

# --- Brokers ------------------------------------------------------------------------------
listening "$SOURCE" || die "Kafka is not listening on $SOURCE: run infra/services.sh up"
# Starts what is missing of the 3-node cluster (all of it, or a node that died); a no-op
# when it runs (infra/test.sh starts it once for every suite that needs it).
"$KAFKA_SH" start --nodes 3 >&2 || die "starting the 3-node Kafka cluster failed"

run_id=mm2-$mode$( ((plain)) && echo -plain)$( ((otel)) && echo -otel)-$(date -u +%Y%m%dT%H%M%SZ)-$$
topic=jvm-probe-$run_id
work=$out/$run_id.work
mkdir -p "$work" "$out/runs"
log "run $run_id: $messages messages at $rate/s, topic $topic -> src.$topic, logs in $work"

pids=()
cleanup() {
    local pid
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
}
trap cleanup EXIT

# Stops a process we started: SIGTERM, then waits up to $2 seconds.
stop() {
    local pid=$1 wait_s=$2 i
    kill -TERM "$pid" 2>/dev/null || return 0
    for ((i = 0; i < wait_s * 10; i++)); do
        kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }
        sleep 0.1
    done
    log "pid $pid did not stop within ${wait_s}s; killing it"
    kill -KILL "$pid" 2>/dev/null || true
}

# Waits until file $1 contains the regex $2, up to $3 seconds, while pid $4 lives.
await_line() {
    local file=$1 re=$2 wait_s=$3 pid=$4 i
    for ((i = 0; i < wait_s * 10; i++)); do
        grep -qE "$re" "$file" 2>/dev/null && return 0
        kill -0 "$pid" 2>/dev/null || { tail -30 "$file" >&2; die "process $pid exited before: $re"; }
        sleep 0.1
    done
    tail -30 "$file" >&2
    die "timed out after ${wait_s}s waiting for: $re (in $file)"
}

# --- Topics -------------------------------------------------------------------------------
"$KAFKA_SH" create-topic "$topic" --partitions 2 --log-append-time --bootstrap "$SOURCE" >&2
"$KAFKA_SH" create-topic "src.$topic" --partitions 2 --replication 3 --bootstrap 127.0.0.1:29092 >&2

# --- Collector ----------------------------------------------------------------------------
otlp_args=()
((otel)) && otlp_args=(--otlp 127.0.0.1:0)
"$BIN" collect --listen 127.0.0.1:0 --pipeline "$pipeline" --runs "$out/runs" \
    --run-id "$run_id" "${otlp_args[@]}" >"$work/collect.log" 2>&1 &
collect_pid=$!
pids+=("$collect_pid")
await_line "$work/collect.log" 'collecting on 127\.0\.0\.1:[0-9]+' 30 "$collect_pid"
collector=$(grep -oE 'collecting on 127\.0\.0\.1:[0-9]+' "$work/collect.log" | head -1 | cut -d' ' -f3)
log "collector on $collector"
agent_args=()
if ((otel)); then
    await_line "$work/collect.log" 'OTLP/HTTP spans at http://' 30 "$collect_pid"
    otlp_url=$(grep -oE 'OTLP/HTTP spans at http://[^ ]+' "$work/collect.log" | head -1 | cut -d' ' -f4)
    log "collector takes OTLP spans at $otlp_url"
    agent_args=("-javaagent:$otel_agent")
    export OTEL_SERVICE_NAME=mirrormaker2 OTEL_TRACES_EXPORTER=otlp OTEL_METRICS_EXPORTER=none \
        OTEL_LOGS_EXPORTER=none OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf \
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=$otlp_url OTEL_BSP_SCHEDULE_DELAY=200 \
        OTEL_BSP_MAX_QUEUE_SIZE=65536
fi

# --- MirrorMaker 2 ------------------------------------------------------------------------
sed -e "s/@TOPIC@/$topic/g" -e "s/@COLLECTOR@/$collector/g" -e "s/@RUN@/$run_id/g" "$HERE/mm2.properties.in" |
    if ((plain || otel)); then grep -vE 'interceptor\.classes|\.hoptrace\.'; else cat; fi >"$work/mm2.properties"
java "${agent_args[@]}" -Xmx256m -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true \
    "-Dlog4j.configuration=file:$HERE/log4j.properties" \
    -cp "$MM2_LIB/*${probe_cp:+:$probe_cp}" org.apache.kafka.connect.mirror.MirrorMaker "$work/mm2.properties" \
    >"$work/mm2.log" 2>&1 &
mm2_pid=$!
pids+=("$mm2_pid")
# MirrorSourceTask creates its consumer (and our interceptor) when the task starts, and
# says which partitions it replicates.
if ((plain || otel)); then
    await_line "$work/mm2.log" 'replicating [0-9]+ topic-partitions' 180 "$mm2_pid"
else
    await_line "$work/mm2.log" 'consumer .*stamps hop mm2_consume' 180 "$mm2_pid"
fi
log "MirrorMaker 2 task started (pid $mm2_pid)"

# --- Tap on the target cluster --------------------------------------------------------------
tap_timeout=$((messages / rate + 120))
"$BIN" tap --from "kafka://$TARGET/src.$topic?offset=beginning" --hop target_arrival \
    --no-log-append-time --messages "$messages" --duration "${tap_timeout}s" \
    --collector "$collector" --pipeline "$pipeline" >"$work/tap.log" 2>&1 &
tap_pid=$!
pids+=("$tap_pid")

# MirrorMaker's CPU time so far, clock ticks (utime + stime).
mm2_ticks() { awk '{ print $14 + $15 }' "/proc/$mm2_pid/stat"; }

# --- Publish --------------------------------------------------------------------------------
log "publishing $messages messages at $rate/s"
ticks0=$(mm2_ticks)
t0=$(date +%s.%N)
traceparent=()
((otel)) && traceparent=(--traceparent)
"$BIN" publish --to "kafka://$SOURCE/$topic" "${traceparent[@]}" --rate "$rate" --messages "$messages" \
    --duration "$((messages / rate + 60))s" --streams 10 --publisher-id 21 \
    --collector "$collector" --pipeline "$pipeline" >"$work/publish.log" 2>&1 \
    || { tail -20 "$work/publish.log" >&2; die "hoptrace publish failed"; }
grep -E '^(sent|broker|collector):' "$work/publish.log" | sed 's/^/  publish: /' >&2 || true

# --- Wait for the tap, stop MirrorMaker, then the collector ----------------------------------
log "waiting for the tap to see all $messages messages (at most ${tap_timeout}s)"
tap_rc=0
wait "$tap_pid" || tap_rc=$?
grep -vE '^\s*$' "$work/tap.log" | tail -4 | sed 's/^/  tap: /' >&2 || true
((tap_rc == 0)) || log "tap exited with $tap_rc"
ticks1=$(mm2_ticks)
t1=$(date +%s.%N)
log "$(awk -v a="$ticks0" -v b="$ticks1" -v s="$t0" -v e="$t1" -v hz="$(getconf CLK_TCK)" \
    'BEGIN { c = (b - a) / hz; printf "MirrorMaker 2 CPU %.2f s over %.1f s (%.1f %% of a core), from the first message published until the tap saw the last", c, e - s, 100 * c / (e - s) }')"
log "stopping MirrorMaker 2 (its interceptors flush and say goodbye)"
stop "$mm2_pid" 60
log "stopping the collector"
stop "$collect_pid" 120
trap - EXIT
cleanup

# MirrorMaker's internal topics of this run (the data topics stay for inspection).
"$KAFKA_SH" topics --bootstrap-server 127.0.0.1:29092 --delete --topic "mm2-.*\\.$run_id" >"$work/delete-topics.log" 2>&1 ||
    log "could not delete MirrorMaker's internal topics of this run (see $work/delete-topics.log)"

run_dir=$out/runs/$run_id
[[ -f $run_dir/run.json ]] || die "no run.json in $run_dir (collector log: $work/collect.log)"
"$BIN" report "$run_dir" >"$work/report.log" 2>&1 || { tail -20 "$work/report.log" >&2; die "hoptrace report failed"; }
cp "$work/mm2.properties" "$run_dir/mm2.properties"

# --- Exact accounting -------------------------------------------------------------------------
python3 - "$run_dir/run.json" "$messages" "$hops" <<'EOF'
import json, sys
run = json.load(open(sys.argv[1]))
want = int(sys.argv[2])
hops = sys.argv[3].split(",")
a = run["accounting"]
pubs = a["publishers"]
sent = sum(p["sent"] for p in pubs)
complete = sum(p["complete"] for p in pubs)
by_hop = a["records_by_hop"]
print(f"mm2-run: sent {sent}, complete {complete}, incomplete {sum(p['incomplete'] for p in pubs)}, "
      f"unseen {sum(p['unseen'] for p in pubs)}, adds_up {a['adds_up']}, lost by probes {a['records_lost_by_probes']}, "
      f"records by hop {by_hop}", file=sys.stderr)
for s in run["stages"]:
    q = {p["quantile"]: p["value_ns"] / 1e6 for p in s.get("percentiles", [])}
    print(f"mm2-run:   {s['name']:<18} count {s['count']:>7}  negative {s['negative']:>4}  "
          f"p50 {q.get(0.5, float('nan')):9.3f} ms  p99 {q.get(0.99, float('nan')):9.3f} ms  "
          f"max {s['max_ns'] / 1e6:9.3f} ms", file=sys.stderr)
ok = (a["adds_up"] and sent == want and complete == sent and a["records_lost_by_probes"] == 0
      and all(by_hop.get(h) == sent for h in hops))
sys.exit(0 if ok else 1)
EOF
echo "run: $run_dir"
