"""A confluent-kafka consumer loop that hosts the Python probe for an outage soak.

usage: python outage_host.py --topic T [--bootstrap HOST:PORT] [--group G]
                             [--duration SECONDS] [--collector HOST:PORT]

Consumes the topic (traced records: a `hoptrace` header, as `hoptrace publish --carrier
header` writes them) and handles each record as a consumer would: with `--collector`, the
probe reads the context, stamps and reports `flow_in`, the record's value is summed (the
work), and `flow_out` is stamped and reported; without it, the same loop does the same work
and no probe call. The time of each record's handling (the host's message path) goes into a
histogram of fixed size. runner/bench/probe_outage.py starts one of each side by side and
reads the process's RSS; this program prints, one JSON object per line on stdout:

- `{"ready": true, "pid": P}` once the first record was handled;
- every second `{"t": S, "n": N, "max_ns": M, "h": [[idx, count], ...], "probe": {...}}`:
  records handled in that second, the longest handling, the non-empty buckets
  (`idx = floor(128 * log2(ns))`, each 0.54 % wide), and the exporter's counters and
  footprint (with the probe);
- `{"end": true, "handled": N, "probe": {...}}` after the exporter's shutdown.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

from confluent_kafka import Consumer

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hoptrace_probe import Exporter, ExporterConfig  # noqa: E402
from hoptrace_probe.carrier import kafka_header  # noqa: E402

BUCKETS_PER_OCTAVE = 128
BUCKETS = BUCKETS_PER_OCTAVE * 40


def emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def probe_state(exporter: Exporter | None) -> dict | None:
    if exporter is None:
        return None
    state = dict(exporter.counters().by_name())
    fp = exporter.footprint()
    state.update(queued=fp.queued, retained_bytes=fp.retained_bytes,
                 evicted_entries=fp.evicted_entries, connected=exporter.is_connected)
    return state


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap", default="127.0.0.1:19092")
    ap.add_argument("--topic", required=True)
    ap.add_argument("--group", default=f"outage-host-{os.getpid()}")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds")
    ap.add_argument("--collector", help="report to this collector (without it: no probe)")
    args = ap.parse_args()

    exporter = None
    if args.collector:
        exporter = Exporter(ExporterConfig(args.collector, "outage-host-python"),
                            [(1, "flow_in"), (2, "flow_out")])
        flow_in, flow_out = exporter.probe("flow_in"), exporter.probe("flow_out")
    consumer = Consumer({"bootstrap.servers": args.bootstrap, "group.id": args.group,
                         "auto.offset.reset": "latest", "enable.auto.commit": True})
    consumer.subscribe([args.topic])

    hist = [0] * BUCKETS
    touched: set = set()
    n = handled = 0
    max_ns = 0
    ready = False
    start = time.monotonic()
    next_line = start + 1.0
    end = start + args.duration
    log2 = math.log2
    clock = time.perf_counter_ns
    while True:
        now = time.monotonic()
        if now >= next_line:
            emit({"t": round(now - start, 3), "n": n, "max_ns": max_ns,
                  "h": [[i, hist[i]] for i in sorted(touched)],
                  "probe": probe_state(exporter)})
            for i in touched:
                hist[i] = 0
            touched.clear()
            n = max_ns = 0
            next_line += 1.0
        if now >= end:
            break
        for msg in consumer.consume(num_messages=500, timeout=0.05):
            if msg.error():
                continue
            t0 = clock()
            if exporter is not None:
                got = flow_in.counted(kafka_header.extract, msg.headers())
                if got is not None:
                    ctx = got.context
                    flow_in.record(ctx)
                    checksum = sum(msg.value() or b"")
                    flow_out.record(ctx)
                else:
                    checksum = 0
            else:
                headers = msg.headers()
                checksum = sum(msg.value() or b"") + len(headers or ())
            ns = clock() - t0
            i = int(BUCKETS_PER_OCTAVE * log2(ns)) if ns > 1 else 0
            hist[i] += 1
            touched.add(i)
            if ns > max_ns:
                max_ns = ns
            n += 1
            handled += 1 if checksum >= 0 else 0
            if not ready:
                ready = True
                emit({"ready": True, "pid": os.getpid()})
    consumer.close()
    final = None
    if exporter is not None:
        summary = exporter.shutdown()
        final = dict(summary.counters.by_name())
        final.update(clean=summary.clean, unacknowledged=summary.unacknowledged)
    emit({"end": True, "handled": handled, "probe": final})
    return 0


if __name__ == "__main__":
    sys.exit(main())
