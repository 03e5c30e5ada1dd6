#!/usr/bin/env bash
# shellcheck shell=bash
# Addresses and test credentials of the local hoptrace services started by infra/services.sh.
#
#   source infra/env.sh
#
# Meant to be sourced, so it sets no shell options (no set -euo pipefail) and only exports.
# Run directly, it prints the values.

# Kafka single node (KRaft, combined broker+controller); controller listener on 19093.
export HOPTRACE_KAFKA=127.0.0.1:19092
# Kafka 3-node cluster (infra/kafka/kafka.sh start --nodes 3); controllers on 29192-29194.
export HOPTRACE_KAFKA_CLUSTER=127.0.0.1:29092,127.0.0.1:29093,127.0.0.1:29094
# Mosquitto: anonymous listener, and the listener that requires a username and password.
export HOPTRACE_MQTT=127.0.0.1:11883
export HOPTRACE_MQTT_AUTH=127.0.0.1:11884
# Test credential for HOPTRACE_MQTT_AUTH; it only exists on the local test broker.
export HOPTRACE_MQTT_USER=hoptrace
export HOPTRACE_MQTT_PASSWORD=hoptrace-test
# Stores for the store taps (infra/stores/stores.sh up) and Node-RED (infra/nodered/nodered.sh).
export HOPTRACE_INFLUXDB=http://127.0.0.1:18086
export HOPTRACE_POSTGRES=postgresql://hoptrace:hoptrace-test@127.0.0.1:15432/hoptrace
export HOPTRACE_CLICKHOUSE=http://127.0.0.1:18123
export HOPTRACE_VICTORIAMETRICS=http://127.0.0.1:18428
export HOPTRACE_NODERED=http://127.0.0.1:11880

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
    env | grep '^HOPTRACE_' | sort
fi
