"""A plain Kafka consumer (confluent-kafka) with no hoptrace code, meant to run under
OpenTelemetry's auto-instrumentation (`opentelemetry-instrument python consumer.py ...`):
the instrumentation, not this script, makes a "<topic> process" span per poll that links
to the record's `traceparent`, and exports it.

    consumer.py BOOTSTRAP TOPIC GROUP COUNT [SECONDS] [poll|batch]

Reads COUNT records of TOPIC from the start (or until SECONDS pass), one per poll() (the
default) or up to 50 per consume() (one span linking every record of the batch),
"processes" each for about a millisecond, polls once more so the last span ends, and
prints "consumed N" on exit.
"""

import sys
import time

from confluent_kafka import Consumer


def main():
    bootstrap, topic, group, count = sys.argv[1:5]
    seconds = float(sys.argv[5]) if len(sys.argv) > 5 else 120.0
    batch = len(sys.argv) > 6 and sys.argv[6] == "batch"
    count = int(count)
    c = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    })
    c.subscribe([topic])
    print("subscribed", flush=True)
    got = 0
    deadline = time.monotonic() + seconds
    while got < count and time.monotonic() < deadline:
        msgs = c.consume(50, 0.2) if batch else [c.poll(0.2)]
        for msg in msgs:
            if msg is None or msg.error():
                continue
            got += 1
            time.sleep(0.001)
    # Ends the last record's process span.
    c.poll(0.1)
    c.close()
    print(f"consumed {got}", flush=True)


if __name__ == "__main__":
    main()
