"""A confluent-kafka consumer with hoptrace attached: it stamps `flow_in` when a record
arrives and `flow_out` when its work on it is done.

    python kafka_consumer.py --collector 127.0.0.1:7400 --bootstrap 127.0.0.1:9092 \\
        --topic metrics --group my-consumer --messages 1000
"""

import argparse
import time

from confluent_kafka import Consumer

from hoptrace_probe import Exporter, ExporterConfig
from hoptrace_probe.carrier import kafka_header


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--collector", default="127.0.0.1:7400")
    ap.add_argument("--bootstrap", default="127.0.0.1:9092")
    ap.add_argument("--topic", default="metrics")
    ap.add_argument("--group", default="hoptrace-example")
    ap.add_argument("--messages", type=int, default=0, help="stop after this many (0: never)")
    ap.add_argument("--timeout-s", type=float, default=float("inf"))
    args = ap.parse_args()

    exporter = Exporter(ExporterConfig(args.collector, "kafka-consumer"),
                        [(1, "flow_in"), (2, "flow_out")])
    flow_in, flow_out = exporter.probe("flow_in"), exporter.probe("flow_out")
    consumer = Consumer({"bootstrap.servers": args.bootstrap, "group.id": args.group,
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([args.topic])
    processed, deadline = 0, time.monotonic() + args.timeout_s
    try:
        while processed != args.messages and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            got = flow_in.counted(kafka_header.extract, msg.headers())
            if got is None:  # no `hoptrace` header, or one that does not decode: counted
                continue
            ctx = got.context
            flow_in.record(ctx)
            checksum = sum(msg.value() or b"")    # ... the work on the record ...
            flow_out.record(ctx)
            processed += 1 if checksum >= 0 else 0
    except KeyboardInterrupt:
        pass
    consumer.close()
    summary = exporter.shutdown()
    print(f"processed {processed}; counters {summary.counters.by_name()}; clean {summary.clean}")


if __name__ == "__main__":
    main()
