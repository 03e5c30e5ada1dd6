"""A probe's host process through a collector outage: memory and message-path latency.

usage: python3 runner/bench/probe_outage.py --lang rust|python|jvm|nodered
           [--bin HOPTRACE] [--rate 10000] [--streams 3000]
           [--connected 600] [--outage 600] [--after 120] [--out DIR]
       python3 runner/bench/probe_outage.py --summary DIR/results.json...

Starts a collector (`hoptrace collect`, write-ahead log on, as by default) and two copies of
one language's host side by side, one with the hoptrace probe reporting to that collector
and one without any probe, at --rate messages/s over --streams streams:

- rust: `hoptrace publish` to Mosquitto (`$HOPTRACE_MQTT`, default 127.0.0.1:11883), with
  and without `--collector`, under `script` for a terminal; its message path is the
  schedule lag (egress stamp minus intended send time), read from its live line (p99 of
  each second) and end summary;
- python: probes/python/outage_host.py, a confluent-kafka consumer loop over a topic that
  `hoptrace publish --carrier header` (no probe) fills; the time to handle each record;
- jvm: probes/jvm/outage-host.sh, a Kafka producer with and without the hoptrace producer
  interceptor; the time of each `send()`;
- nodered: probes/node-red/outage-host.sh, a running Node-RED flow with and without the
  hoptrace node; each message's time from its generator to the flow's end, and the event
  loop's delay.

Timeline, from the moment both hosts handle messages: --connected seconds with the
collector up, then the collector is SIGKILLed, --outage seconds without it, then the same
collector command is started again (it continues the run from its log) for --after
seconds. The RSS of both host processes is read from /proc every second. At the end the
hosts stop (the probe's exporter flushes and reports its final counters), the collector
is stopped with SIGTERM, and its run.json is read.

Prints one Markdown table per measure (RSS by phase; latency quantiles by phase, from
histograms of 128 buckets per octave, each 0.54 % wide: a quantile is its bucket's upper
edge, never above the maximum) and the exporter's counters against what the collector
received; writes everything, with the per-second series, to DIR/results.json.
`--summary` prints one table over several such files: per language, the memory the probe
adds, its growth through the outage, the message-path P99.9 with and without the probe, and
whether every record the probe was handed is either at the collector or counted as lost.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUCKETS_PER_OCTAVE = 128

PIPELINE = """\
name = "probe-outage"
expected = ["{first}"]

[[hops]]
name = "publish"
id = 0
description = "Publisher egress."

[[hops]]
name = "flow_in"
id = 1
description = "Processor ingress."

[[hops]]
name = "flow_out"
id = 2
description = "Processor egress."

[[stages]]
name = "Broker Time"
from = "publish"
to = "flow_in"
definition = "From publish to the processor."

[[stages]]
name = "Flow Internal"
from = "flow_in"
to = "flow_out"
definition = "Inside the processor."
"""

# The hop each language's probe reports (the one the run's accounting starts from).
FIRST_HOP = {"rust": "publish", "python": "flow_in", "jvm": "publish", "nodered": "flow_in"}
PHASES = ("connected", "outage", "after")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def host_pid(pid: int) -> int:
    """The host process: `pid` itself (a launcher that execs keeps its pid), or, under
    `script` (the Rust publisher, given a terminal for its live line), its `hoptrace`
    descendant."""
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            if Path(f"/proc/{p}/comm").read_text().strip() == "hoptrace":
                return p
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return pid


def duration_ns(text: str) -> float | None:
    """A duration as hoptrace prints it (`850ns`, `12.3µs`, `1.20ms`, `2.5s`)."""
    m = re.fullmatch(r"([0-9.]+)\s*(ns|µs|us|ms|s|min)", text.strip())
    if not m:
        return None
    scale = {"ns": 1, "µs": 1e3, "us": 1e3, "ms": 1e6, "s": 1e9, "min": 60e9}[m.group(2)]
    return float(m.group(1)) * scale


class Histogram:
    """Counts per bucket `floor(128 * log2(ns))`, merged from the hosts' lines."""

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.n = 0
        self.max_ns = 0

    def add(self, buckets: list, max_ns: int) -> None:
        for i, c in buckets:
            self.counts[i] = self.counts.get(i, 0) + c
            self.n += c
        self.max_ns = max(self.max_ns, max_ns)

    def quantile(self, q: float) -> float | None:
        if self.n == 0:
            return None
        rank = max(1, math.ceil(q * self.n))
        seen = 0
        for i in sorted(self.counts):
            seen += self.counts[i]
            if seen >= rank:
                return min(2 ** ((i + 1) / BUCKETS_PER_OCTAVE), self.max_ns)
        return float(self.max_ns)


class Host:
    """One host process: its stdout lines (JSON) and stderr, timed by the driver."""

    def __init__(self, name: str, argv: list, log_dir: Path, env: dict | None = None) -> None:
        self.name = name
        self.lines: list = []  # (driver time, parsed JSON)
        self.progress: list = []  # (driver time, lag p99 ns) for the Rust publisher
        self.ready = threading.Event()
        self.err_path = log_dir / f"{name}.stderr"
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=env, start_new_session=True, cwd=REPO)
        self.pid = self.proc.pid
        threading.Thread(target=self._read_out, daemon=True).start()
        threading.Thread(target=self._read_err, daemon=True).start()

    def _read_out(self) -> None:
        for line in self.proc.stdout:
            self._lag(line)
            if not line.startswith("{"):
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            self.lines.append((time.monotonic(), obj))
            if obj.get("ready"):
                if obj.get("pid"):
                    self.pid = int(obj["pid"])
                self.ready.set()

    def _read_err(self) -> None:
        with open(self.err_path, "w") as err:
            for line in self.proc.stderr:
                err.write(line)
                self._lag(line)

    def _lag(self, line: str) -> None:
        """The Rust publisher's live line: the schedule lag's p99 over the last second."""
        m = re.search(r"lag p99 (\S+) max", line)
        if m and (ns := duration_ns(m.group(1))) is not None:
            self.progress.append((time.monotonic(), ns))
            self.ready.set()

    def end_line(self) -> dict | None:
        ends = [o for _, o in self.lines if o.get("end")]
        return ends[-1] if ends else None

    def stop(self, timeout: float) -> None:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)


def host_argv(args, lang: str, collector: str | None, topic: str, duration: float,
              out: Path, tag: str) -> list:
    if lang == "rust":
        argv = [args.bin, "publish", "--to", f"mqtt://{args.mqtt}/outage-{tag}",
                "--rate", str(args.rate), "--streams", str(args.streams),
                "--duration", f"{int(duration)}s", "--summary-json", str(out / f"{tag}.json")]
        argv += ["--collector", collector] if collector else []
        # A terminal, so that the live line (once a second) is written.
        return ["script", "-qfec", shlex.join(argv), "/dev/null"]
    if lang == "python":
        argv = [sys.executable, str(REPO / "probes/python/outage_host.py"), "--bootstrap",
                args.kafka, "--topic", topic, "--group", f"outage-{tag}-{os.getpid()}",
                "--duration", str(duration)]
        return argv + (["--collector", collector] if collector else [])
    if lang == "jvm":
        argv = [str(REPO / "probes/jvm/outage-host.sh"), "--bootstrap", args.kafka, "--topic",
                topic, "--rate", str(args.rate), "--streams", str(args.streams),
                "--duration", str(int(duration)), "--client-id", f"outage-{tag}"]
        return argv + (["--collector", collector] if collector else [])
    if lang == "nodered":
        argv = [str(REPO / "probes/node-red/outage-host.sh"), "--rate", str(args.rate),
                "--streams", str(args.streams), "--duration", str(int(duration)),
                "--port", str(free_port())]
        return argv + (["--collector", collector] if collector else [])
    raise ValueError(lang)


def prepare(lang: str) -> None:
    script = {"jvm": "probes/jvm/outage-host.sh", "nodered": "probes/node-red/outage-host.sh"}
    if lang in script:
        subprocess.run([str(REPO / script[lang]), "--prepare"], check=True, cwd=REPO)


def machine() -> str:
    model = "unknown CPU"
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        if m := re.search(r"Model name:\s*(.+)", out):
            model = m.group(1).strip()
    except OSError:
        pass
    mem = Path("/proc/meminfo").read_text().split()[1]
    return (f"{model}, {os.cpu_count()} cores, {int(mem) / 2**20:.0f} GiB, "
            f"Linux {platform.release()}")


def phase_of(t: float, bounds: dict) -> str | None:
    for name in PHASES:
        start, end = bounds[name]
        if start <= t < end:
            return name
    return None


def summarise(host: Host, rss: list, bounds: dict) -> dict:
    out: dict = {}
    for name in PHASES:
        start, end = bounds[name]
        series = [r for t, r in rss if start <= t < end and r is not None]
        hist = Histogram()
        loop_worst = 0
        messages = 0
        for t, obj in host.lines:
            if "h" in obj and phase_of(t, bounds) == name:
                hist.add(obj["h"], obj.get("max_ns", 0))
                messages += obj.get("n", 0)
                loop_worst = max(loop_worst, obj.get("loop_p999_ns") or 0)
        lag = [ns for t, ns in host.progress if start <= t < end]
        out[name] = {
            "seconds": end - start,
            "rss_first_kib": series[0] if series else None,
            "rss_last_kib": series[-1] if series else None,
            "rss_max_kib": max(series) if series else None,
            "messages": messages,
            "p50_ns": hist.quantile(0.5), "p99_ns": hist.quantile(0.99),
            "p999_ns": hist.quantile(0.999), "max_ns": hist.max_ns or None,
            "loop_p999_worst_second_ns": loop_worst or None,
            "lag_p99_worst_1s_ns": max(lag) if lag else None,
        }
    return out


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--summary":
        print_summary([json.loads(Path(f).read_text()) for f in sys.argv[2:]])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lang", required=True, choices=["rust", "python", "jvm", "nodered"])
    ap.add_argument("--bin", default=os.environ.get("HOPTRACE_BIN",
                                                    "/var/tmp/hoptrace-target/quick/hoptrace"))
    ap.add_argument("--rate", type=int, default=10_000)
    ap.add_argument("--streams", type=int, default=3_000)
    ap.add_argument("--connected", type=float, default=600)
    ap.add_argument("--outage", type=float, default=600)
    ap.add_argument("--after", type=float, default=120)
    ap.add_argument("--mqtt", default=os.environ.get("HOPTRACE_MQTT", "127.0.0.1:11883"))
    ap.add_argument("--kafka", default=os.environ.get("HOPTRACE_KAFKA", "127.0.0.1:19092"))
    ap.add_argument("--out", type=Path, default=Path(f"runs/probe-outage-{int(time.time())}"))
    args = ap.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    lang = args.lang
    prepare(lang)

    port = free_port()
    collector_addr = f"127.0.0.1:{port}"
    (out / "pipeline.toml").write_text(PIPELINE.format(first=FIRST_HOP[lang]))
    collect_argv = [args.bin, "collect", "--listen", collector_addr, "--pipeline",
                    str(out / "pipeline.toml"), "--out", str(out / "runs"),
                    "--run-id", f"outage-{lang}"]

    def start_collector(n: int) -> subprocess.Popen:
        return subprocess.Popen(collect_argv, stdout=subprocess.DEVNULL,
                                stderr=open(out / f"collector-{n}.log", "w"),
                                start_new_session=True)

    collector = start_collector(1)
    total = args.connected + args.outage + args.after
    topic = f"outage-{lang}-{int(time.time())}"
    source = None
    if lang in ("python", "jvm"):
        subprocess.run([str(REPO / "infra/kafka/kafka.sh"), "create-topic", topic, "--partitions",
                        "3"], check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    if lang == "python":
        # The records both consumers read; no probe of its own.
        source = subprocess.Popen(
            [args.bin, "publish", "--to", f"kafka://{args.kafka}/{topic}", "--carrier",
             "header", "--rate", str(args.rate), "--streams", str(args.streams),
             "--duration", f"{int(total + 120)}s"],
            stdout=subprocess.DEVNULL, stderr=open(out / "source.log", "w"),
            start_new_session=True)
    # The host's duration covers its own start-up and the wait for both to be ready.
    host_total = total + 60
    hosts = {
        "with probe": Host("with-probe", host_argv(args, lang, collector_addr, topic,
                                                   host_total, out, "with"), out),
        "without": Host("without", host_argv(args, lang, None, topic, host_total, out,
                                             "without"), out),
    }
    rss = {name: [] for name in hosts}
    stop_sampling = threading.Event()

    def sample() -> None:
        while not stop_sampling.wait(1.0):
            now = time.monotonic()
            for name, h in hosts.items():
                rss[name].append((now, rss_kib(host_pid(h.pid))))

    threading.Thread(target=sample, daemon=True).start()
    for h in hosts.values():
        if not h.ready.wait(120):
            print(f"{h.name} did not start handling messages; see {h.err_path}",
                  file=sys.stderr)
            for x in hosts.values():
                os.killpg(x.proc.pid, signal.SIGKILL)
            os.killpg(collector.pid, signal.SIGKILL)
            if source:
                os.killpg(source.pid, signal.SIGKILL)
            return 1
    t0 = time.monotonic()
    bounds = {"connected": (t0, t0 + args.connected),
              "outage": (t0 + args.connected, t0 + args.connected + args.outage),
              "after": (t0 + args.connected + args.outage, t0 + total)}

    def progress(what: str) -> None:
        line = "  ".join(f"{name} {(rss[name][-1][1] or 0) / 1024:.1f} MiB"
                         for name in hosts if rss[name])
        print(f"[{time.monotonic() - t0:6.0f}s] {what}  RSS: {line}", file=sys.stderr,
              flush=True)

    def wait_until(t: float, what: str) -> None:
        while (left := t - time.monotonic()) > 0:
            time.sleep(min(left, 30))
            progress(what)

    progress("both hosts handle messages; collector up")
    wait_until(bounds["connected"][1], "connected")
    os.killpg(collector.pid, signal.SIGKILL)
    collector.wait()
    progress("collector killed (SIGKILL)")
    wait_until(bounds["outage"][1], "outage")
    collector = start_collector(2)
    progress("collector started again")
    wait_until(bounds["after"][1], "after")
    for h in hosts.values():
        h.stop(timeout=host_total + 180 - (time.monotonic() - t0))
    stop_sampling.set()
    os.killpg(collector.pid, signal.SIGTERM)
    collector.wait(timeout=300)
    if source:
        os.killpg(source.pid, signal.SIGTERM)
        source.wait(timeout=60)
    progress("hosts ended; collector stopped")

    run_json = out / "runs" / f"outage-{lang}" / "run.json"
    run = json.loads(run_json.read_text()) if run_json.exists() else None
    results = {
        "lang": lang, "command": " ".join([Path(sys.executable).name] + sys.argv),
        "machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                                 capture_output=True, text=True).stdout.strip(),
        "rate": args.rate, "streams": args.streams,
        "hosts": {}, "accounting": run.get("accounting") if run else None,
    }
    for name, h in hosts.items():
        summary = None
        if lang == "rust":
            path = out / f"{'with' if name == 'with probe' else 'without'}.json"
            summary = json.loads(path.read_text()) if path.exists() else None
        results["hosts"][name] = {
            "phases": summarise(h, rss[name], bounds),
            "end": h.end_line() or summary,
            "rss_series": [[round(t - t0, 1), r] for t, r in rss[name]],
        }
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print_tables(results)
    return 0


def fmt_ns(ns) -> str:
    if ns is None:
        return "–"
    if ns >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.1f} µs"
    return f"{ns:.0f} ns"


def fmt_mib(kib) -> str:
    return "–" if kib is None else f"{kib / 1024:.1f}"


def print_tables(r: dict) -> None:
    print(f"{r['lang']}: {r['rate']:,} messages/s over {r['streams']:,} streams; "
          f"commit {r['commit']}; {r['date']}; {r['machine']}")
    print(f"command: {r['command']}\n")
    print("| host | phase | RSS first → last (max), MiB | messages | p50 | p99 | p99.9 | max |"
          " worst 1 s lag p99 | worst 1 s event-loop p99.9 |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, h in r["hosts"].items():
        for phase, p in h["phases"].items():
            print(f"| {name} | {phase} ({p['seconds']:.0f} s) | {fmt_mib(p['rss_first_kib'])} → "
                  f"{fmt_mib(p['rss_last_kib'])} ({fmt_mib(p['rss_max_kib'])}) | "
                  f"{p['messages']:,} | {fmt_ns(p['p50_ns'])} | {fmt_ns(p['p99_ns'])} | "
                  f"{fmt_ns(p['p999_ns'])} | {fmt_ns(p['max_ns'])} | "
                  f"{fmt_ns(p['lag_p99_worst_1s_ns'])} | "
                  f"{fmt_ns(p['loop_p999_worst_second_ns'])} |")
    for name, h in r["hosts"].items():
        print(f"\n{name}, end: {json.dumps(h['end'])}")
    acc = r.get("accounting")
    if acc:
        print(f"\ncollector accounting: {json.dumps(acc)}")


def probe_balance(r: dict) -> tuple:
    """(handed to the probe, at the collector, counted lost) for the host with the probe."""
    end = r["hosts"]["with probe"]["end"] or {}
    acc = r.get("accounting") or {}
    delivered = sum((acc.get("records_by_hop") or {}).values())
    if r["lang"] == "rust":
        return end.get("messages"), delivered, end.get("exporter_lost")
    c = end.get("probe") or {}
    lost = c.get("queue_full", 0) + c.get("send_failed", 0) + c.get("lost_unacked", 0)
    return c.get("reported"), delivered, lost


def print_summary(results: list) -> None:
    print("| probe (host) | RSS without probe, MiB | with probe, end of connected | "
          "end of outage (growth; most) | end of after | message path P99.9 connected, with / "
          "without | outage, with / without | handed to the probe = at the collector + "
          "counted lost |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in results:
        w, wo = r["hosts"]["with probe"]["phases"], r["hosts"]["without"]["phases"]
        growth = (w["outage"]["rss_last_kib"] or 0) - (w["connected"]["rss_last_kib"] or 0)

        def p999(phases: dict, phase: str) -> str:
            p = phases[phase]
            if p["p999_ns"] is not None:
                return fmt_ns(p["p999_ns"])
            # The Rust publisher: no per-message histogram, its live line's lag p99.
            return f"{fmt_ns(p['lag_p99_worst_1s_ns'])} (lag p99, worst second)"

        handed, delivered, lost = probe_balance(r)
        balance = (f"{handed:,} = {delivered:,} + {lost:,} "
                   f"({'holds' if handed == delivered + lost else 'off by ' + format(handed - delivered - lost, ',')})"
                   if None not in (handed, delivered, lost) else "–")
        minutes = "+".join(f"{w[p]['seconds'] / 60:g}" for p in PHASES)
        print(f"| {r['lang']} ({minutes} min) | {fmt_mib(wo['connected']['rss_last_kib'])} | "
              f"{fmt_mib(w['connected']['rss_last_kib'])} | "
              f"{fmt_mib(w['outage']['rss_last_kib'])} ({growth / 1024:+.1f}; "
              f"{fmt_mib(w['outage']['rss_max_kib'])}) | "
              f"{fmt_mib(w['after']['rss_last_kib'])} | {p999(w, 'connected')} / "
              f"{p999(wo, 'connected')} | {p999(w, 'outage')} / {p999(wo, 'outage')} | "
              f"{balance} |")


if __name__ == "__main__":
    sys.exit(main())
