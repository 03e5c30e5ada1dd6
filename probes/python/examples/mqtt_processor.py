"""A paho-mqtt (MQTT v5) processor with hoptrace attached: it takes messages from one
topic tree, stamps `flow_in` and `flow_out` around its work, and republishes the data
with the trace context under another prefix.

    python mqtt_processor.py --collector 127.0.0.1:7400 --broker 127.0.0.1:1883 \\
        --source 'plant/#' --target processed --messages 1000
"""

import argparse
import threading

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from hoptrace_probe import Exporter, ExporterConfig
from hoptrace_probe.carrier import mqtt_property


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--collector", default="127.0.0.1:7400")
    ap.add_argument("--broker", default="127.0.0.1:1883")
    ap.add_argument("--source", default="plant/#", help="topic filter to process")
    ap.add_argument("--target", default="processed", help="prefix of the output topics")
    ap.add_argument("--messages", type=int, default=0, help="stop after this many (0: never)")
    ap.add_argument("--timeout-s", type=float, default=None)
    args = ap.parse_args()

    # One exporter per process; the hop ids and names of the collector's pipeline.toml.
    exporter = Exporter(ExporterConfig(args.collector, "mqtt-processor"),
                        [(1, "flow_in"), (2, "flow_out")])
    flow_in, flow_out = exporter.probe("flow_in"), exporter.probe("flow_out")
    done, processed = threading.Event(), [0]

    def on_message(client, userdata, msg):
        got = flow_in.counted(mqtt_property.extract, msg.properties)
        if got is None:  # no context, or one that does not decode: counted
            return
        ctx = got.context
        flow_in.record(ctx)                      # stamp in-band, report out of band
        payload = msg.payload.upper()            # ... the processing ...
        flow_out.record(ctx)
        props = Properties(PacketTypes.PUBLISH)
        mqtt_property.inject(ctx, props)         # the next hop sees every stamp
        client.publish(f"{args.target}/{msg.topic}", payload, qos=1, properties=props)
        processed[0] += 1
        if processed[0] == args.messages:
            done.set()

    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    client.on_connect = lambda c, u, f, rc, p: c.subscribe(args.source, qos=1)
    client.on_subscribe = lambda c, u, mid, rc, p: print("subscribed", flush=True)
    client.on_message = on_message
    host, port = args.broker.rsplit(":", 1)
    client.connect(host, int(port))
    client.loop_start()
    try:
        done.wait(args.timeout_s)
    except KeyboardInterrupt:
        pass
    client.loop_stop()
    client.disconnect()
    summary = exporter.shutdown()                # flush, final counters, goodbye
    print(f"processed {processed[0]}; counters {summary.counters.by_name()}; clean {summary.clean}")


if __name__ == "__main__":
    main()
