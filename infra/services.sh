#!/usr/bin/env bash
# Starts and stops the local services hoptrace is tested against.
#
#   services.sh up       install what is missing (setup.sh), start the single-node Kafka,
#                        create the test topics, start Mosquitto; safe to repeat
#   services.sh down     stop Mosquitto and every Kafka node (single node and cluster)
#   services.sh status   show what runs; exit 3 unless Kafka (single node) and Mosquitto both do
#
# Topics on the single node: hoptrace-test (3 partitions), hoptrace-demo (3 partitions, the
# reference pipeline's), hoptrace-lat (1 partition, message.timestamp.type=LogAppendTime). Addresses and credentials: infra/env.sh.
# The 3-node Kafka cluster is not part of "up": infra/kafka/kafka.sh start --nodes 3.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=env.sh
source "$HERE/env.sh"

KAFKA=$HERE/kafka/kafka.sh
MOSQUITTO=$HERE/mosquitto/mosquitto.sh

die() { printf 'services: error: %s\n' "$*" >&2; exit 1; }

up() {
    local started=$SECONDS
    "$HERE/setup.sh" || die "infra/setup.sh failed"
    "$KAFKA" start --nodes 1 || die "starting Kafka failed"
    "$KAFKA" create-topic hoptrace-test --partitions 3 --bootstrap "$HOPTRACE_KAFKA" ||
        die "creating topic hoptrace-test failed"
    "$KAFKA" create-topic hoptrace-demo --partitions 3 --bootstrap "$HOPTRACE_KAFKA" ||
        die "creating topic hoptrace-demo failed"
    "$KAFKA" create-topic hoptrace-lat --partitions 1 --log-append-time --bootstrap "$HOPTRACE_KAFKA" ||
        die "creating topic hoptrace-lat failed"
    "$MOSQUITTO" start || die "starting Mosquitto failed"
    printf 'services: up in %ss: Kafka %s, MQTT %s (anonymous) and %s (user %s); source infra/env.sh\n' \
        "$((SECONDS - started))" "$HOPTRACE_KAFKA" "$HOPTRACE_MQTT" "$HOPTRACE_MQTT_AUTH" "$HOPTRACE_MQTT_USER"
}

down() {
    local rc=0
    "$MOSQUITTO" stop || rc=1
    "$KAFKA" stop || rc=1
    ((rc == 0)) || die "some services did not stop cleanly (see above)"
}

status() {
    local rc=0
    "$KAFKA" status || true
    "$KAFKA" status --nodes 1 >/dev/null || rc=3
    "$MOSQUITTO" status || rc=3
    return "$rc"
}

case ${1:-} in
up) up ;;
down) down ;;
status) status ;;
*)
    echo "usage: $0 {up|down|status}" >&2
    exit 2
    ;;
esac
