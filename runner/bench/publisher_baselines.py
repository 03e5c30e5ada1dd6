#!/usr/bin/env python3
"""The publisher against its client library, in one sitting.

For each broker and metrics-per-message asked for, runs one after the other:

- `hoptrace bench publisher` (traced: stamp, trace context in the message, accounting);
- `hoptrace bench publisher --bare` (the same client, settings, payloads and schedule,
  no tracing);
- for Kafka, Kafka's own `org.apache.kafka.tools.ProducerPerformance` with the same
  acks, linger, batch size (librdkafka's default of 1,000,000 bytes unless the address
  sets one) and compression, records of the mean payload size the traced search sent, as fast
  as it can (`--throughput -1`), for as many records as the traced search's best step
  sent; its CPU is the JVM's (user + system of the child, from `wait4`).

and prints one Markdown table: highest passing rate, messages/s, CPU cores and CPU per
message of each, and traced / bare. With `--repeat N` the traced and bare searches
alternate N times each (traced, bare, traced, bare, ...): one bad second fails a step, so a
single search of each on a shared machine can differ by 20 %; the table then gives the
median search of each (by highest passing rate), every search's rate beside it, and the
ratio of the medians. `bench publisher` runs no collector: the traced
publisher takes its stamps and carries the context, but reports nothing (the exporter's
share is `probe-bench`'s stamp+report, the collector's `hoptrace bench collector`).

Usage:
    runner/bench/publisher_baselines.py --hoptrace target/release/hoptrace \
        --kafka 127.0.0.1:19092/hoptrace-test --mqtt 127.0.0.1:11883 \
        --metrics-per-message 1,50 [--step 5s] [--json out.json]

Needs the brokers (infra/services.sh up) and, for Kafka, the jars infra/kafka/kafka.sh
downloads (found through `kafka.sh status`).
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KAFKA_SH = ROOT / "infra" / "kafka" / "kafka.sh"


def bench_publisher(hoptrace, to, mpm, step, bare, start):
    cmd = [hoptrace, "bench", "publisher", "--to", to, "--metrics-per-message", str(mpm),
           "--step", step, "--start", start]
    if bare:
        cmd.append("--bare")
    print("$", " ".join(cmd), file=sys.stderr, flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True)
    sys.stderr.write(p.stdout[: p.stdout.find("{")] if "{" in p.stdout else p.stdout)
    if p.returncode != 0:
        raise SystemExit(f"bench publisher failed ({p.returncode}): {p.stderr[-2000:]}")
    result = json.loads(p.stdout[p.stdout.index("\n{") + 1:])
    best = next((s for s in result["steps"]
                 if s["pass"] and s["target_metrics_per_s"]
                 == result["highest_passing_metrics_per_s"]), None)
    if best is None:
        raise SystemExit(f"no step passed for {to} at {mpm} metrics per message: lower --start")
    return best, result


def kafka_lib():
    out = subprocess.run([str(KAFKA_SH), "status"], capture_output=True, text=True).stdout
    m = re.search(r"jars: (\S+)", out)
    if not m:
        raise SystemExit("the Kafka jars are not installed: infra/setup.sh")
    return m.group(1)


def kafka_options(to):
    """bootstrap, topic and the producer settings of a kafka:// address's query."""
    address, _, query = to.partition("?")
    bootstrap, _, topic = address.removeprefix("kafka://").partition("/")
    opts = dict(kv.split("=", 1) for kv in query.split("&") if kv)
    # The Java producer's batch.size default is 16 KiB, librdkafka's (hoptrace's client)
    # 1,000,000 bytes: the same batching is asked of both, or the comparison is of
    # defaults, not of clients.
    props = {"acks": opts.get("acks", "all"), "linger.ms": opts.get("linger_ms", "5"),
             "batch.size": opts.get("batch_size", "1000000"),
             "compression.type": opts.get("compression", "none")}
    return bootstrap, topic, props


def producer_performance(to, records, record_size):
    bootstrap, topic, props = kafka_options(to)
    cmd = ["java", "-Xmx512m", "-cp", f"{kafka_lib()}/*",
           "org.apache.kafka.tools.ProducerPerformance", "--topic", topic,
           "--num-records", str(records), "--record-size", str(record_size),
           "--throughput", "-1", "--producer-props", f"bootstrap.servers={bootstrap}",
           *[f"{k}={v}" for k, v in props.items()]]
    print("$", " ".join(cmd), file=sys.stderr, flush=True)
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.monotonic() - t0
    out = p.stdout.read()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"ProducerPerformance failed: {p.stderr.read()[-2000:]}")
    last = [line for line in out.splitlines() if "records sent" in line][-1]
    m = re.match(r"(\d+) records sent, ([\d.]+) records/sec", last)
    sys.stderr.write(last + "\n")
    return {
        "records": int(m.group(1)),
        "records_per_s": float(m.group(2)),
        "cpu_cores": (usage.ru_utime + usage.ru_stime) / wall,
        "summary": last,
    }


def median_search(best_steps):
    """The search whose highest passing rate is the median (the lower middle one of an
    even count)."""
    ordered = sorted(best_steps, key=lambda s: s["target_metrics_per_s"])
    return ordered[(len(ordered) - 1) // 2]


def row(name, msgs_per_s, metrics_per_s, cores, delivered=None):
    ns = cores / msgs_per_s * 1e9 if msgs_per_s else float("nan")
    d = f"{delivered / 1e3:,.1f}k" if delivered is not None else "-"
    return (f"| {name} | {metrics_per_s / 1e3:,.1f}k | {d} | {msgs_per_s / 1e3:,.1f}k | "
            f"{cores:.2f} | {ns:,.0f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hoptrace", required=True)
    ap.add_argument("--kafka", help="host:port/topic[?acks=all&linger_ms=5]")
    ap.add_argument("--mqtt", help="host:port[?qos=0]")
    ap.add_argument("--metrics-per-message", default="1,50")
    ap.add_argument("--step", default="5s")
    ap.add_argument("--start", default="20k")
    ap.add_argument("--repeat", type=int, default=1,
                    help="alternate the traced and bare searches this many times each")
    ap.add_argument("--json")
    a = ap.parse_args()
    targets = []
    if a.kafka:
        k = a.kafka if "?" in a.kafka else a.kafka + "?acks=all&linger_ms=5"
        targets.append(("Kafka", f"kafka://{k}"))
    if a.mqtt:
        targets.append(("MQTT", f"mqtt://{a.mqtt}"))
    if not targets:
        ap.error("give --kafka and/or --mqtt")
    results, lines = [], []
    for name, to in targets:
        for mpm in [int(x) for x in a.metrics_per_message.split(",")]:
            runs = {"traced": [], "bare": []}
            for _ in range(max(1, a.repeat)):
                runs["traced"].append(bench_publisher(a.hoptrace, to, mpm, a.step, False, a.start)[0])
                runs["bare"].append(bench_publisher(a.hoptrace, to, mpm, a.step, True, a.start)[0])
            traced, bare = median_search(runs["traced"]), median_search(runs["bare"])
            entry = {"broker": name, "to": to, "metrics_per_message": mpm,
                     "traced": traced, "bare": bare, "searches": runs}
            lines.append(f"\n### {name} ({to}), {mpm} metric(s) per message, "
                         f"{traced['payload_bytes_per_message']:.0f} B payload\n")
            lines.append("| publisher | highest passing metrics/s | delivered metrics/s "
                         "| messages/s | CPU cores | CPU ns per message |")
            lines.append("| --- | --- | --- | --- | --- | --- |")
            for label, s in [("hoptrace publish, traced", traced),
                             ("hoptrace publish --bare", bare)]:
                lines.append(row(label, s["messages_per_s"], s["achieved_metrics_per_s"],
                                 s["cpu_cores"], s["delivered_metrics_per_s"]))
            if name == "Kafka":
                records = int(traced["messages_per_s"] * float(a.step.rstrip("s")))
                size = max(1, round(traced["payload_bytes_per_message"]))
                pp = producer_performance(to, records, size)
                entry["producer_performance"] = pp
                lines.append(row("Kafka ProducerPerformance (as fast as it can; CPU over "
                                 "its whole process, JVM start included)",
                                 pp["records_per_s"], pp["records_per_s"] * mpm,
                                 pp["cpu_cores"]))
            ratio = traced["target_metrics_per_s"] / bare["target_metrics_per_s"]
            entry["traced_over_bare"] = ratio
            if a.repeat > 1:
                for label in ("traced", "bare"):
                    rates = ", ".join(f"{s['target_metrics_per_s'] / 1e3:,.1f}k"
                                      for s in runs[label])
                    lines.append(f"\n{label}, highest passing metrics/s of each search in order: {rates}")
                lines.append(f"\ntraced / bare (medians of {a.repeat} alternating searches "
                             f"each): {ratio:.2f}")
            else:
                lines.append(f"\ntraced / bare (highest passing rates): {ratio:.2f}")
            results.append(entry)
    print("\n".join(lines))
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
