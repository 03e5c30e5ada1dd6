"""Micro-benchmark of the Python probe's hot path: stamp + report per call.

usage: python bench.py [--bin HOPTRACE] [--calls 1000000] [--repeat 3]

Starts a real collector (`hoptrace collect` on 127.0.0.1:0, binary from --bin or
$HOPTRACE_BIN), connects an exporter to it, and times `probe.record(ctx)` (stamp in-band
+ report out of band) over --calls fresh contexts, while the exporter thread drains the
queue to the collector at the same time (it shares the interpreter lock, so its work is
part of what the caller sees). Also times `stamp` and `report_stamp` alone, and `record`
into a LocalQueue (no exporter thread), and checks that every record reached the
collector. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hoptrace_probe import Exporter, ExporterConfig, LocalQueue, TraceContext  # noqa: E402
from hoptrace_probe.carrier import envelope, kafka_header, mqtt_property  # noqa: E402

PIPELINE = """\
name = "python-probe-bench"
expected = ["publish"]

[[hops]]
name = "publish"
id = 0

[[hops]]
name = "flow_in"
id = 1

[[stages]]
name = "Broker Time"
from = "publish"
to = "flow_in"
definition = "unused"
"""


def contexts(n: int, base: int) -> list:
    return [TraceContext(1, 0, base + i, 1, 0) for i in range(n)]


def per_call(fn, items, drained=None) -> tuple:
    """(wall, caller-thread CPU, process CPU) ns per call of fn over items, each with the
    bare loop's own cost subtracted; `drained()` is waited for before the clocks stop
    (the exporter has written everything to the socket)."""
    w0, t0, p0 = time.perf_counter_ns(), time.thread_time_ns(), time.process_time_ns()
    for c in items:
        fn(c)
    w1, t1 = time.perf_counter_ns(), time.thread_time_ns()
    while drained is not None and not drained():
        time.sleep(0.0005)
    p1 = time.process_time_ns()
    w2, t2, p2 = time.perf_counter_ns(), time.thread_time_ns(), time.process_time_ns()
    for c in items:
        pass
    w3, t3, p3 = time.perf_counter_ns(), time.thread_time_ns(), time.process_time_ns()
    n = len(items)
    bare = (w3 - w2, t3 - t2, p3 - p2)
    return ((w1 - w0 - bare[0]) / n, (t1 - t0 - bare[1]) / n, (p1 - p0 - bare[2]) / n)


def machine() -> str:
    model = "unknown CPU"
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        m = re.search(r"Model name:\s*(.+)", out)
        model = m.group(1).strip() if m else model
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores, Python {platform.python_version()} ({platform.python_implementation()})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default=os.environ.get("HOPTRACE_BIN"))
    ap.add_argument("--calls", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    if not args.bin:
        ap.error("give --bin or set HOPTRACE_BIN")
    tmp = Path(tempfile.mkdtemp(prefix="hoptrace-pybench-"))
    (tmp / "pipeline.toml").write_text(PIPELINE)
    log = tmp / "collector.log"
    collector = subprocess.Popen(
        [args.bin, "collect", "--listen", "127.0.0.1:0", "--pipeline", str(tmp / "pipeline.toml"),
         "--out", str(tmp / "runs"), "--run-id", "bench"],
        stdout=subprocess.PIPE, stderr=open(log, "w"), text=True, start_new_session=True)
    try:
        deadline = time.time() + 30
        while not (m := re.search(r"collecting on (\S+)", log.read_text())):
            if collector.poll() is not None or time.time() > deadline:
                print(log.read_text(), file=sys.stderr)
                return 1
            time.sleep(0.05)
        ex = Exporter(ExporterConfig(m.group(1), "python-bench",
                                     queue_capacity=args.calls * (args.repeat + 1)),
                      [(0, "publish"), (1, "flow_in")])
        assert ex.wait_connected(10), ex.last_error
        probe = ex.probe("publish")
        results = {"record, exporter connected": [], "stamp": [], "report_stamp": [],
                   "record, LocalQueue (no exporter thread)": []}
        base = 0
        for _ in range(args.repeat):
            items = contexts(args.calls, base)
            base += args.calls
            results["record, exporter connected"].append(
                per_call(probe.record, items, lambda: ex.counters().sent >= base))
            # stamp alone (in-band only), report alone (queue only), record without exporter.
            local = LocalQueue(args.calls)
            lp = local.probe(1)
            spare = contexts(args.calls, 0)
            results["stamp"].append(per_call(lp.stamp, spare))
            results["report_stamp"].append(per_call(lambda c: lp.report_stamp(c, 1), spare))
            local = LocalQueue(args.calls)
            lp = local.probe(1)
            results["record, LocalQueue (no exporter thread)"].append(
                per_call(lp.record, contexts(args.calls, 0)))
            del items, spare, local
        # The carriers, on a context with two stamps (what a processor does per message).
        two = TraceContext(1, 2, 3, 50, time.time_ns(), stamps=[(0, 1), (1, 2)])
        n = max(1, args.calls // 5)
        props = mqtt_property.inject_user_properties(two, [])
        headers = kafka_header.inject(two)
        wrapped = envelope.wrap(two, b"x" * 100)
        carriers = {
            "mqtt_property.extract (text form)": lambda c: mqtt_property.extract_user_properties(props),
            "mqtt_property.inject (text form)": lambda c: mqtt_property.inject_user_properties(two, []),
            "kafka_header.extract (binary form)": lambda c: kafka_header.extract(headers),
            "kafka_header.inject (binary form)": lambda c: kafka_header.inject(two),
            "envelope.unwrap": lambda c: envelope.unwrap(wrapped),
            "envelope.wrap": lambda c: envelope.wrap(two, b"x" * 100),
        }
        for name, fn in carriers.items():
            results[name] = [per_call(fn, range(n)) for _ in range(args.repeat)]
        t0 = time.perf_counter()
        summary = ex.shutdown(timeout_s=120)
        flush_s = time.perf_counter() - t0
        os.killpg(collector.pid, signal.SIGTERM)
        collector.communicate(timeout=300)
        run = json.loads((tmp / "runs" / "bench" / "run.json").read_text())
    finally:
        if collector.poll() is None:
            os.killpg(collector.pid, signal.SIGKILL)
        shutil.rmtree(tmp, ignore_errors=True)
    c = summary.counters
    delivered = run["accounting"]["records_by_hop"]["publish"]
    print(f"machine: {machine()}")
    print(f"command: python {' '.join(sys.argv)}")
    print(f"calls per run: {args.calls:,}, runs: {args.repeat}; median (min-max) ns per call\n")
    print("| call | wall ns per call | caller thread CPU ns | process CPU ns (exporter "
          "thread included, until written to the socket) |")
    print("| --- | ---: | ---: | ---: |")

    def cell(v, i):
        xs = [r[i] for r in v]
        return f"{statistics.median(xs):.0f} ({min(xs):.0f}-{max(xs):.0f})"

    for name, v in results.items():
        print(f"| `{name}` | {cell(v, 0)} | {cell(v, 1)} | {cell(v, 2)} |")
    print(f"\nexporter: reported {c.reported:,}, sent {c.sent:,}, queue_full {c.queue_full}, "
          f"send_failed {c.send_failed}, clean {summary.clean}; the collector received "
          f"{delivered:,} publish records; shutdown (flush of what was still queued) "
          f"{flush_s:.2f} s")
    ok = summary.clean and c.lost() == 0 and delivered == args.calls * args.repeat
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
