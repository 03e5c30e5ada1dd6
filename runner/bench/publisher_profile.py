#!/usr/bin/env python3
"""Where the publisher's CPU goes, traced against bare, at one rate.

Runs `hoptrace bench publisher --max-steps 1` (one step at the given rate) under
`perf record` (software clock sampling, every thread of the process: the publisher's and
the client library's), once traced and once `--bare`, and sorts the samples into the
parts of a message's way out:

- schedule:   the open-loop schedule and pacing (sleeps included);
- payload:    writing the payload (JSON);
- context:    the trace context: building, stamping, encoding (traced only);
- accounting: what was sent and the schedule lag;
- client:     the broker client library (librdkafka or rumqttc), its threads included;
- headers:    the client's record headers (librdkafka's `rd_kafka_header*`);
- memory:     the allocator and memory copies, whoever called them;
- kernel:     system calls, wake-ups and the network stack on loopback;
- other:      everything else (the publisher's loop itself, inlined code, the runtime).

Release builds inline most of the publisher's own code into its loop, so the first four
parts are a lower bound and `other` holds the rest; the criterion benchmarks of
`publisher/benches/publish.rs` (`phase/...`) give each step's own cost. Prints one
Markdown table of the share of samples and the CPU per message (the step's CPU time over
the messages it sent) of each part.

Usage:
    runner/bench/publisher_profile.py --hoptrace target/release/hoptrace \
        --to 'kafka://127.0.0.1:19092/hoptrace-test?acks=all&linger_ms=5' \
        --rate 300k --metrics-per-message 1 [--step 10s]
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

PARTS = [
    ("headers", re.compile(r"rd_kafka_header|OwnedHeaders|kafka_header")),
    ("context", re.compile(r"hoptrace_probe::context|TraceContext|push_stamp|carrier::")),
    ("schedule", re.compile(r"schedule::|Schedule|wait_until|tick_end|zipf|Zipf")),
    ("payload", re.compile(r"payload::|PayloadFormat|itoa|ryu|uns::")),
    ("accounting", re.compile(r"accounting::|SentLedger|LagHistogram|hdrhistogram")),
    ("memory", re.compile(r"^(__)?(libc_)?(malloc|free|cfree|realloc|calloc)|_int_(malloc|free)|"
                          r"memcpy|memmove|memset|tcache|mi_|je_|sdallocx|mallocx")),
    ("client", re.compile(r"^rd_|rdkafka|librdkafka|rumqttc|mqttbytes|crc32|snappy|lz4|zstd|"
                          r"cnd_|mtx_|thrd_|rd_kafka")),
]


def part_of(dso, sym):
    if dso.startswith("[kernel") or sym.startswith("[k]"):
        return "kernel"
    for name, pat in PARTS:
        if pat.search(sym):
            return name
    if "librdkafka" in dso:
        return "client"
    return "other"


def profile(a, bare):
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "perf.data")
        cmd = ["perf", "record", "-F", str(a.frequency), "-o", data, "--",
               a.hoptrace, "bench", "publisher", "--to", a.to,
               "--metrics-per-message", str(a.metrics_per_message), "--start", a.rate,
               "--step", a.step, "--max-steps", "1"]
        if bare:
            cmd.append("--bare")
        print("$", " ".join(cmd), file=sys.stderr, flush=True)
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"bench publisher failed ({p.returncode}): {p.stderr[-2000:]}")
        result = json.loads(p.stdout[p.stdout.index("\n{") + 1:])
        step = result["steps"][0]
        rep = subprocess.run(["perf", "report", "-i", data, "--stdio", "--no-children",
                              "--sort", "dso,sym", "--percent-limit", "0", "-q"],
                             capture_output=True, text=True, check=True).stdout
    shares = {}
    for line in rep.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+(\S+)\s+\[(.)\]\s+(.*)$", line)
        if not m:
            continue
        pct, dso, kind, sym = float(m.group(1)), m.group(2), m.group(3), m.group(4).strip()
        part = "kernel" if kind == "k" else part_of(dso, sym)
        shares[part] = shares.get(part, 0.0) + pct
    return step, shares


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hoptrace", required=True)
    ap.add_argument("--to", required=True)
    ap.add_argument("--rate", required=True, help="metrics per second, e.g. 300k")
    ap.add_argument("--metrics-per-message", type=int, default=1)
    ap.add_argument("--step", default="10s")
    ap.add_argument("--frequency", type=int, default=999)
    a = ap.parse_args()
    rows = {}
    steps = {}
    for label, bare in [("traced", False), ("bare", True)]:
        step, shares = profile(a, bare)
        steps[label] = step
        rows[label] = shares
    names = ["schedule", "payload", "context", "accounting", "client", "headers", "memory",
             "kernel", "other"]
    print(f"\n{a.to}, {a.metrics_per_message} metric(s) per message, target {a.rate} metrics/s, "
          f"{a.step} step\n")
    for label in ("traced", "bare"):
        s = steps[label]
        ns = s["cpu_cores"] / s["messages_per_s"] * 1e9 if s["messages_per_s"] else float("nan")
        print(f"- {label}: {s['messages_per_s']:,.0f} messages/s achieved, "
              f"{s['cpu_cores']:.2f} cores, {ns:,.0f} ns CPU per message, "
              f"{'pass' if s['pass'] else 'FAIL'}")
    print("\n| part | traced, % of samples | traced, ns per message | bare, % of samples "
          "| bare, ns per message |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for n in names:
        cells = []
        for label in ("traced", "bare"):
            s = steps[label]
            per = s["cpu_cores"] / s["messages_per_s"] * 1e9 if s["messages_per_s"] else 0
            pct = rows[label].get(n, 0.0)
            cells += [f"{pct:.1f}", f"{pct / 100 * per:,.0f}"]
        print(f"| {n} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
