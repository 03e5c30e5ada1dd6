#!/usr/bin/env bash
# The scale-out path under load: `hoptrace publish` (MQTT, its probe reporting to the
# relay) -> `hoptrace relay` -> Kafka -> MEMBERS x `hoptrace collect --from`, for 30 s at
# RATE messages/s (one metric each). Prints the CPU seconds of every process (relay,
# members, publisher from GNU time; the Kafka broker and Mosquitto from /proc), how long
# the members took to finish after the relay stopped, and checks that the members'
# run.json files hold one publish record per message sent.
#
#   source infra/env.sh && infra/services.sh up     # Kafka and Mosquitto
#   runner/bench/relay_bench.sh 1 100k               # MEMBERS RATE
#
# HOPTRACE: the binary (default target/release/hoptrace); OUT: where runs go.
set -euo pipefail
members=${1:?usage: relay_bench.sh MEMBERS RATE}
rate=${2:?usage: relay_bench.sh MEMBERS RATE}
bin=${HOPTRACE:-target/release/hoptrace}
kafka=${HOPTRACE_KAFKA:?source infra/env.sh}
mqtt=${HOPTRACE_MQTT:?source infra/env.sh}
tag=relaybench-$members-$rate-$$
dir=${OUT:-/tmp/relay-bench}/$tag
listen=127.0.0.1:7510
mkdir -p "$dir"

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
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

kafka_pid=$(pgrep -f 'kafka\.Kafka' | head -1)
mqtt_pid=$(pgrep -x mosquitto | head -1)

/usr/bin/time -f "%U %S %M" -o "$dir/relay.time" "$bin" relay --listen $listen \
  --to "kafka://$kafka/$tag" --partitions 6 --run-id "$tag" >"$dir/relay.out" 2>"$dir/relay.err" &
relay=$(child_of "relay --listen $listen")
sleep 4 # the relay creates the topics
member_pids=()
for i in $(seq "$members"); do
  /usr/bin/time -f "%U %S %M" -o "$dir/m$i.time" "$bin" collect --from "kafka://$kafka/$tag" \
    --group "g-$tag" --member "m$i" --run-id "$tag" --runs "$dir/runs" >"$dir/m$i.out" 2>"$dir/m$i.err" &
  member_pids+=("$(child_of "member m$i --run-id $tag")")
done
sleep 6 # the group's first assignment

k0=$(ticks "$kafka_pid")
q0=$(ticks "$mqtt_pid")
/usr/bin/time -f "%U %S %M" -o "$dir/publisher.time" "$bin" publish --to "mqtt://$mqtt" \
  --topic-root "$tag" --rate "$rate" --streams 1000 --duration 30s --collector $listen \
  >"$dir/publisher.out" 2>"$dir/publisher.err"
t_published=$(date +%s.%N)
kill -INT "$relay"
gone "$relay"
t_relay=$(date +%s.%N)
for p in "${member_pids[@]}"; do kill -INT "$p"; done
for p in "${member_pids[@]}"; do gone "$p"; done
t_members=$(date +%s.%N)
wait
k1=$(ticks "$kafka_pid")
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
python3 - "$dir" <<'EOF'
import glob, json, sys
records = sent = 0
for f in glob.glob(f"{sys.argv[1]}/runs/*/members/*/run.json"):
    a = json.load(open(f))["accounting"]
    records += a["records_by_hop"]["publish"]
    sent = max(sent, sum(p["sent"] for p in a["publishers"]))
print(f"members' publish records {records}, messages sent {sent}: {'all in' if records == sent else 'MISSING'}")
sys.exit(0 if records == sent else 1)
EOF
