"""A paho-mqtt (MQTT v5) publisher with hoptrace attached: every message gets a new trace
context, stamped `publish` as it is handed to the client, and the collector is told what
was sent, so the run's accounting adds up.

    python mqtt_publisher.py --collector 127.0.0.1:7400 --broker 127.0.0.1:1883 \\
        --topic plant/line-1 --messages 1000 --rate 500
"""

import argparse
import json
import time

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from hoptrace_probe import Exporter, ExporterConfig, Publisher
from hoptrace_probe.carrier import mqtt_property


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--collector", default="127.0.0.1:7400")
    ap.add_argument("--broker", default="127.0.0.1:1883")
    ap.add_argument("--topic", default="plant/line-1")
    ap.add_argument("--publisher-id", type=int, default=1)
    ap.add_argument("--messages", type=int, default=1000)
    ap.add_argument("--rate", type=float, default=500.0, help="messages per second")
    args = ap.parse_args()

    exporter = Exporter(ExporterConfig(args.collector, "mqtt-publisher"), [(0, "publish")])
    publisher = Publisher(exporter, publisher=args.publisher_id)  # hop "publish"
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    host, port = args.broker.rsplit(":", 1)
    client.connect(host, int(port))
    client.loop_start()
    start = time.time_ns()
    for i in range(args.messages):
        intended_ns = start + int(i * 1e9 / args.rate)   # the open-loop schedule
        time.sleep(max(0.0, (intended_ns - time.time_ns()) / 1e9))
        ctx = publisher.context(stream=0, metric_count=1, intended_ns=intended_ns)
        publisher.published(ctx)                  # stamp `publish`, count it as sent
        props = Properties(PacketTypes.PUBLISH)
        mqtt_property.inject(ctx, props)
        client.publish(args.topic, json.dumps({"v": i}), qos=1, properties=props).wait_for_publish()
    client.loop_stop()
    client.disconnect()
    summary = exporter.shutdown()                 # final Sent, counters, goodbye
    print(f"sent {args.messages}; counters {summary.counters.by_name()}; clean {summary.clean}")


if __name__ == "__main__":
    main()
