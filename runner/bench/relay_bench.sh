#!/usr/bin/env bash
# The scale-out path under load: `hoptrace publish` (MQTT, its probe reporting to the
# relay) -> `hoptrace relay` -> Kafka -> MEMBERS x `hoptrace collect --from`, for 30 s at
# RATE messages/s (one metric each). Prints the CPU seconds of every process (relay,
# members, publisher from GNU time; the Kafka broker and Mosquitto from /proc), how long
# the members took to finish after the relay stopped, and checks that the members'
# run.json files hold one publish record per message sent.
#
# PIPELINE=refpipe puts the reference pipeline's processor and store (processes of their
# own, `hoptrace refpipe`) behind the broker, their probes reporting to the relay too:
# every trace then has its 6 hops' records (publish, flow_in, flow_out, store_in,
# query_start, queryable), which the members join into complete traces; the check is
# then that every hop has one record per message sent and every trace is complete.
#
#   source infra/env.sh && infra/services.sh up     # Kafka and Mosquitto
#   runner/bench/relay_bench.sh 1 100k               # MEMBERS RATE
#   PIPELINE=refpipe runner/bench/relay_bench.sh 2 20k
#
# HOPTRACE: the binary (default target/release/hoptrace); OUT: where runs go;
# REPLICATION: the topics' replication factor (default 1; 3 with
# HOPTRACE_KAFKA=$HOPTRACE_KAFKA_CLUSTER after `infra/kafka/kafka.sh start --nodes 3`).
# The Kafka CPU is that of every Kafka broker process on the machine. RELAY_QUERY:
# librdkafka properties for the relay's producer (`rdkafka.NAME=VALUE&...`).
set -euo pipefail
members=${1:?usage: relay_bench.sh MEMBERS RATE}
rate=${2:?usage: relay_bench.sh MEMBERS RATE}
bin=${HOPTRACE:-target/release/hoptrace}
kafka=${HOPTRACE_KAFKA:?source infra/env.sh}
mqtt=${HOPTRACE_MQTT:?source infra/env.sh}
pipeline=${PIPELINE:-}
[[ -z $pipeline || $pipeline == refpipe ]] || { echo "PIPELINE: refpipe or nothing" >&2; exit 2; }
tag=relaybench-$members-$rate${pipeline:+-$pipeline}-$$
dir=${OUT:-/tmp/relay-bench}/$tag
listen=127.0.0.1:7510
store=127.0.0.1:7511
mkdir -p "$dir"

ticks() { local p t=0; for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo $t; }
# The process GNU time started for the command line matching $1.
child_of() {
  local pid
  for _ in $(seq 50); do
    pid=$(pgrep -f -- "$1" | while read -r p; do [[ $(ps -o comm= -p "$p") == time ]] || echo "$p"; done | tail -1)
    [[ -n $pid ]] && { echo "$pid"; return; }
    sleep 0.1
  done
  echo "no process for: $1" >&2
  exit 1
}
gone() { while kill -0 "$1" 2>/dev/null; do sleep 0.05; done; }

mapfile -t kafka_pids < <(pgrep -f 'kafka\.Kafka')
mqtt_pid=$(pgrep -x mosquitto | head -1)

/usr/bin/time -f "%U %S %M" -o "$dir/relay.time" "$bin" relay --listen $listen \
  --to "kafka://$kafka/$tag${RELAY_QUERY:+?$RELAY_QUERY}" --partitions 6 --replication "${REPLICATION:-1}" --run-id "$tag" >"$dir/relay.out" 2>"$dir/relay.err" &
relay=$(child_of "relay --listen $listen")
sleep 4 # the relay creates the topics
member_pids=()
for i in $(seq "$members"); do
  /usr/bin/time -f "%U %S %M" -o "$dir/m$i.time" "$bin" collect --from "kafka://$kafka/$tag" \
    --group "g-$tag" --member "m$i" --run-id "$tag" --runs "$dir/runs" >"$dir/m$i.out" 2>"$dir/m$i.err" &
  member_pids+=("$(child_of "member m$i --run-id $tag")")
done
sleep 6 # the group's first assignment
parts=()
if [[ $pipeline == refpipe ]]; then
  /usr/bin/time -f "%U %S %M" -o "$dir/store.time" "$bin" refpipe store --listen $store \
    --collector $listen >"$dir/store.out" 2>"$dir/store.err" &
  parts+=("$(child_of "refpipe store --listen $store")")
  sleep 2
  /usr/bin/time -f "%U %S %M" -o "$dir/processor.time" "$bin" refpipe processor \
    --from "mqtt://$mqtt" --topics "$tag/#" --store $store --collector $listen \
    >"$dir/processor.out" 2>"$dir/processor.err" &
  parts=("$(child_of "refpipe processor --from mqtt://$mqtt --topics $tag/")" "${parts[@]}")
  sleep 2
fi

k0=$(ticks "${kafka_pids[@]}")
q0=$(ticks "$mqtt_pid")
/usr/bin/time -f "%U %S %M" -o "$dir/publisher.time" "$bin" publish --to "mqtt://$mqtt" \
  --topic-root "$tag" --rate "$rate" --streams 1000 --duration 30s --collector $listen \
  >"$dir/publisher.out" 2>"$dir/publisher.err"
t_published=$(date +%s.%N)
if ((${#parts[@]})); then
  sleep 3 # what is still in the processor's batches and the store's queries
  for p in "${parts[@]}"; do kill -INT "$p"; gone "$p"; done
fi
kill -INT "$relay"
gone "$relay"
t_relay=$(date +%s.%N)
for p in "${member_pids[@]}"; do kill -INT "$p"; done
for p in "${member_pids[@]}"; do gone "$p"; done
t_members=$(date +%s.%N)
wait
k1=$(ticks "${kafka_pids[@]}")
q1=$(ticks "$mqtt_pid")

echo "== $members member(s), target $rate messages/s: $dir"
grep -h '^sent ' "$dir/publisher.out"
printf 'relay stopped %.2f s after the publisher; members finished %.2f s after the relay\n' \
  "$(echo "$t_relay - $t_published" | bc)" "$(echo "$t_members - $t_relay" | bc)"
printf '%-12s %8s %8s %10s\n' process user_s sys_s maxrss_MiB
for f in "$dir"/*.time; do
  read -r u s m <"$f"
  printf '%-12s %8s %8s %10d\n' "$(basename "$f" .time)" "$u" "$s" $((m / 1024))
done
printf '%-12s %17.2f\n' kafka "$(echo "($k1 - $k0) / 100" | bc -l)" mosquitto "$(echo "($q1 - $q0) / 100" | bc -l)"
python3 - "$dir" "$pipeline" <<'EOF'
import glob, json, sys
hops = ["publish"] + (["flow_in", "flow_out", "store_in", "query_start", "queryable"]
                      if sys.argv[2] == "refpipe" else [])
records = dict.fromkeys(hops, 0)
sent = complete = 0
for f in glob.glob(f"{sys.argv[1]}/runs/*/members/*/run.json"):
    a = json.load(open(f))["accounting"]
    for h in hops:
        records[h] += a["records_by_hop"].get(h, 0)
    # Every member sees every Sent frame; each trace is joined by one member.
    sent = max(sent, sum(p["sent"] for p in a["publishers"]))
    complete += sum(p["complete"] for p in a["publishers"])
ok = all(n == sent for n in records.values()) and (len(hops) == 1 or complete == sent)
print(f"members' records by hop {records}, complete traces {complete}, messages sent {sent}: "
      f"{'all in' if ok else 'MISSING'}")
sys.exit(0 if ok else 1)
EOF
