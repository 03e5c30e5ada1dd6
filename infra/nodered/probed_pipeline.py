"""Runs the live-store pipeline Mosquitto -> Node-RED -> InfluxDB with the two hoptrace
nodes of probes/node-red in the flow (infra/nodered/flows-probed.json), measured end to
end by the real parts:

    hoptrace publish (MQTT v5; context in a user property and in the payload field "hoptrace")
      -> Mosquitto -> hoptrace tap (broker)
      -> Node-RED: mqtt in -> hoptrace nodered_in -> json -> function -> hoptrace nodered_out
         -> influxdb out
      -> InfluxDB -> hoptrace tap --from influxdb://... (store_in, query_start, queryable)

all reporting to one `hoptrace collect` with infra/nodered/pipeline-probed.toml. Node-RED
is started for the run (`HOPTRACE_NR_FLOW=probed infra/nodered/nodered.sh start`, which
installs the node package into Node-RED's userDir with `npm install <folder>`) with the
run's collector, and stopped at its end, so its probe says Goodbye with its final counters.

Used by test_nodered_probed.py (a few seconds of traffic), and run directly for the
measured run of reports/nodered-influxdb.md:

    python3 infra/nodered/probed_pipeline.py --bin target/release/hoptrace --out runs \\
        --rate 200 --messages 60000 --markdown section.md

which prints (and writes) the report section from the run's summary.json and run.json.
Needs Mosquitto (infra/services.sh up) and InfluxDB (infra/stores/influxdb.sh start).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
PIPELINE = HERE / "pipeline-probed.toml"
NODERED_SH = HERE / "nodered.sh"
INFLUXDB_SH = ROOT / "infra" / "stores" / "influxdb.sh"
MQTT = os.environ.get("HOPTRACE_MQTT", "127.0.0.1:11883")
INFLUX = "127.0.0.1:18086"
TOPIC_ROOT = "hoptrace/nrp/in"  # the probed flow subscribes to hoptrace/nrp/in/#
MEASUREMENT = "nodered_probed"


class PipelineError(RuntimeError):
    """A part of the pipeline did not start, or did not finish in time."""


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def port_open(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return True
    except OSError:
        return False


@dataclass
class Proc:
    """A child in its own process group, its output in a log file."""

    name: str
    popen: subprocess.Popen
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, pattern: str, timeout: float) -> re.Match:
        deadline = time.time() + timeout
        while time.time() < deadline:
            m = re.search(pattern, self.text())
            if m:
                return m
            if self.popen.poll() is not None:
                break
            time.sleep(0.05)
        raise PipelineError(f"{self.name}: no line matching {pattern!r} within {timeout} s "
                            f"(exit {self.popen.poll()}):\n{self.text()[-3000:]}")

    def stop(self, timeout: float = 60) -> Optional[int]:
        """SIGTERM to the group; SIGKILL if it hangs. Its exit status."""
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait()
        return self.popen.returncode


def spawn(name: str, cmd: List[str], workdir: Path, env: Optional[dict] = None) -> Proc:
    log = workdir / f"{name}.log"
    out = open(log, "w")
    p = subprocess.Popen([str(c) for c in cmd], stdout=out, stderr=subprocess.STDOUT,
                         cwd=workdir, start_new_session=True, env=env)
    out.close()
    return Proc(name, p, log)


def sh(*cmd, env: Optional[dict] = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout,
                          env=env)


def nodered_env(collector: str) -> dict:
    env = dict(os.environ)
    for var in ("HOPTRACE_NR_TOPIC", "HOPTRACE_NR_MEASUREMENT", "HOPTRACE_NR_INFLUX_DB",
                "HOPTRACE_NR_INFLUXDB", "HOPTRACE_NR_MQTT"):
        env.pop(var, None)
    env.update(HOPTRACE_NR_FLOW="probed", HOPTRACE_NR_COLLECTOR=collector, HOPTRACE_NR_QOS="1",
               HOPTRACE_NR_MQTT=MQTT)
    return env


@dataclass
class Run:
    """What a run left: its directory and files, and the parts' outputs."""

    run_dir: Path
    run_json: dict
    publish_summary: dict
    broker_tap: str
    store_tap: str
    nodered_log: str
    commands: List[str] = field(default_factory=list)
    versions: Dict[str, str] = field(default_factory=dict)


def versions(bin_path: str) -> Dict[str, str]:
    """The versions of the parts, as the programs and package files say them."""
    v: Dict[str, str] = {}
    v["hoptrace"] = sh(bin_path, "--version").stdout.strip()
    v["mosquitto"] = (sh("mosquitto", "-h").stdout.splitlines() or ["?"])[0].strip()
    v["node"] = sh("node", "--version").stdout.strip()
    cache = Path(os.environ.get("HOPTRACE_CACHE", Path.home() / ".cache" / "hoptrace")) / "nodered"
    for pkg in ("node-red", "node-red-contrib-influxdb"):
        try:
            v[pkg] = json.loads((cache / "node_modules" / pkg / "package.json").read_text())["version"]
        except OSError:
            v[pkg] = "?"
    v["node-red-contrib-hoptrace"] = json.loads(
        (ROOT / "probes" / "node-red" / "package.json").read_text())["version"]
    out = sh("influxd", "version").stdout.strip()
    v["influxdb"] = out or "?"
    return v


def run_pipeline(bin_path: str, workdir: Path, run_id: str, messages: int, rate: float,
                 streams: int = 4, poll_interval: str = "10ms", qos: int = 1) -> Run:
    """One measured run; every part started here is stopped here (Node-RED included).

    Raises :class:`PipelineError` when a part is missing or does not finish; assertions on
    the result are the caller's.
    """
    if not port_open(MQTT):
        raise PipelineError(f"no MQTT broker at {MQTT} (infra/services.sh up)")
    if sh(INFLUXDB_SH, "status").returncode != 0:
        raise PipelineError(f"InfluxDB is not running (infra/stores/influxdb.sh start)")
    workdir.mkdir(parents=True, exist_ok=True)
    publisher_id = random.randrange(1000, 60000)
    tag = f"{run_id}-{publisher_id}"
    procs: List[Proc] = []
    commands: List[str] = []
    port = free_port()
    collector_addr = f"127.0.0.1:{port}"

    def cmd_line(cmd: List) -> str:
        return " ".join(str(c) if re.fullmatch(r"[\w@%+=:,./-]+", str(c)) else f"'{c}'" for c in cmd)

    nr_env = nodered_env(collector_addr)
    started_nodered = False
    try:
        collect = [bin_path, "collect", "--listen", collector_addr, "--pipeline", PIPELINE,
                   "--out", workdir, "--run-id", run_id]
        collector = spawn("collector", collect, workdir)
        procs.append(collector)
        commands.append(cmd_line(collect) + " &")
        collector.wait_for(r"collecting on (\S+)", 30)

        # The probed flow, with this run's collector. A probed Node-RED left running (from an
        # interrupted run) reports elsewhere: stop it first.
        if sh(NODERED_SH, "status", env=nr_env).returncode == 0:
            r = sh(NODERED_SH, "stop", env=nr_env)
            if r.returncode != 0:
                raise PipelineError(f"nodered.sh stop: {r.stdout}{r.stderr}")
        commands.append(f"HOPTRACE_NR_FLOW=probed HOPTRACE_NR_COLLECTOR={collector_addr} "
                        f"HOPTRACE_NR_QOS={qos} infra/nodered/nodered.sh start")
        r = sh(NODERED_SH, "start", env=nr_env)
        if r.returncode != 0:
            raise PipelineError(f"nodered.sh start (probed): {r.stdout}{r.stderr}")
        started_nodered = True

        common = ["--publishers", str(publisher_id), "--messages", str(messages),
                  "--collector", collector_addr, "--pipeline", PIPELINE]
        broker_cmd = [bin_path, "tap", "--from", f"mqtt://{MQTT}?version=5&qos={qos}",
                      "--topics", f"{TOPIC_ROOT}/{tag}/#", "--hop", "broker",
                      "--duration", f"{int(messages / rate) + 120}s", *common]
        broker = spawn("tap-broker", broker_cmd, workdir)
        procs.append(broker)
        commands.append(cmd_line(broker_cmd) + " &")
        store_cmd = [bin_path, "tap", "--from",
                     f"influxdb://{INFLUX}/hoptrace?measurement={MEASUREMENT}",
                     "--poll-interval", poll_interval,
                     "--duration", f"{int(messages / rate) + 120}s", *common]
        store = spawn("tap-store", store_cmd, workdir)
        procs.append(store)
        commands.append(cmd_line(store_cmd) + " &")
        broker.wait_for(r"tapping", 30)
        store.wait_for(r"tapping|polling", 30)

        publish_cmd = [bin_path, "publish", "--to",
                       f"mqtt://{MQTT}/{TOPIC_ROOT}/{tag}?version=5&qos={qos}",
                       "--topics", "flat", "--topic-root", "hoptrace", "--streams", str(streams),
                       "--rate", str(rate), "--messages", str(messages),
                       "--duration", f"{int(messages / rate) + 60}s", "--payload-context",
                       "--publisher-id", str(publisher_id), "--summary-json", "publish.json",
                       "--collector", collector_addr, "--pipeline", PIPELINE]
        commands.append(cmd_line(publish_cmd))
        publish = spawn("publish", publish_cmd, workdir)
        procs.append(publish)
        try:
            publish.popen.wait(timeout=messages / rate + 120)
        except subprocess.TimeoutExpired:
            raise PipelineError(f"publish did not finish:\n{publish.text()[-3000:]}") from None
        if publish.popen.returncode != 0:
            raise PipelineError(f"publish failed:\n{publish.text()[-3000:]}")
        for tap in (broker, store):
            try:
                tap.popen.wait(timeout=90)
            except subprocess.TimeoutExpired:
                raise PipelineError(f"{tap.name} did not see all {messages} messages:\n"
                                    f"{tap.text()[-3000:]}") from None
            if tap.popen.returncode != 0:
                raise PipelineError(f"{tap.name} failed:\n{tap.text()[-3000:]}")
        # Stopping Node-RED closes the flow: the hoptrace nodes flush, send their final
        # counters and Goodbye.
        commands.append("infra/nodered/nodered.sh stop   # the hoptrace nodes say Goodbye")
        r = sh(NODERED_SH, "stop", env=nr_env)
        started_nodered = False
        if r.returncode != 0:
            raise PipelineError(f"nodered.sh stop: {r.stdout}{r.stderr}")
        commands.append("kill -INT %1   # the collector writes the run")
        if collector.stop() != 0:
            raise PipelineError(f"collector failed:\n{collector.text()[-3000:]}")
        run_dir = workdir / run_id
        nr_log = Path(os.environ.get("HOPTRACE_RUN", "/tmp/hoptrace-infra")) / "nodered-probed" / "nodered.log"
        run = Run(run_dir=run_dir, run_json=json.loads((run_dir / "run.json").read_text()),
                  publish_summary=json.loads((workdir / "publish.json").read_text()),
                  broker_tap=broker.text(), store_tap=store.text(),
                  nodered_log=nr_log.read_text(errors="replace") if nr_log.exists() else "",
                  commands=commands, versions=versions(bin_path))
        # What the report section needs beside the run's files, kept with the run.
        (run_dir / "pipeline-run.json").write_text(json.dumps(
            {"commands": commands, "versions": run.versions, "messages": messages, "rate": rate}, indent=1))
        return run
    finally:
        if started_nodered:
            sh(NODERED_SH, "stop", env=nr_env)
        for p in reversed(procs):
            p.stop(timeout=30)


# ---------------------------------------------------------------------------------------
# The report section


def fmt_ns(ns: float) -> str:
    ns = float(ns)
    if abs(ns) < 1e3:
        return f"{ns:.0f} ns"
    if abs(ns) < 1e6:
        return f"{ns / 1e3:.1f} µs"
    if abs(ns) < 1e9:
        return f"{ns / 1e6:.2f} ms"
    return f"{ns / 1e9:.2f} s"


def machine(summary: dict) -> str:
    """The collector host as summary.json describes it."""
    c = summary["environment"]["collector"]
    return (f"{c['cpus']} logical CPUs ({c['cpu_model']}), {c['memory_bytes'] / 2**30:.0f} GiB, "
            f"Linux {c['kernel']}, shared with other work")


def section(run: Run, summary: dict, messages: int, rate: float) -> str:
    """The Markdown of reports/nodered-influxdb.md's probed-flow section: every figure from
    the run's summary.json (stages) and run.json (accounting, probes)."""
    acc = run.run_json["accounting"]
    (pub,) = acc["publishers"]
    stages = {s["name"]: s for s in summary["stages"]}
    probe = next(p for p in run.run_json["probes"] if p["process"] == "nodered")
    lines = []
    lines.append("| Stage | Count | P50 | P90 | P99 | P99.9 | Max |")
    lines.append("| --- | --- | --- | --- | --- | --- | --- |")
    order = ["Broker Time", "To Node-RED", "Node-RED", "Write to InfluxDB", "Store Visibility",
             "Total Ingestion", "Query Duration"]
    for name in order:
        s = stages[name]
        lines.append(f"| {name} | {s['count']:,} | " + " | ".join(
            fmt_ns(stage_value(s, q)) for q in ("P50", "P90", "P99", "P99.9")) +
            f" | {fmt_ns(stage_value(s, 'max'))} |")
    table = "\n".join(lines)
    c = probe["counters"]
    v = run.versions
    r0 = summary["runs"][0]
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(r0["started_unix_ns"] / 1e9))
    minutes = (r0["ended_unix_ns"] - r0["started_unix_ns"]) / 60e9
    total = stages["Total Ingestion"]
    b = total.get("poll_bracket") or {}
    bracket = (f"The poll bracket of the stages ending at `queryable` (the store tap polled every "
               f"{fmt_ns(b['poll_interval_ns'])}, {b['polls']:,} polls, {b['poll_errors']} failed): mean "
               f"{fmt_ns(b['mean_ns'])}, P99 {fmt_ns(b['p99_ns'])}, max {fmt_ns(b['max_ns'])}; "
               f"{'not small against their P50, so the report warns' if b['warning'] else 'small against their P50'}. "
               f"The stages between the Node-RED nodes, the broker tap and InfluxDB's point time have no "
               f"such uncertainty.") if b else ""
    clock = (f"Clocks: {summary['environment']['clocking']}; every stage is on one host "
             f"({total['clock_note']}), so clock uncertainty is 0 for each.")
    return f"""## Node-RED's own time: the flow with the two hoptrace nodes

The same pipeline with `probes/node-red` installed into Node-RED's userDir (`npm install
<folder>`, as a Node-RED user installs a local node) and its two nodes added to the flow
(`infra/nodered/flows-probed.json`: mqtt in → **hoptrace nodered_in** → json → function →
**hoptrace nodered_out** → influxdb out), so that Node-RED's own time is a stage of its
own. The unprobed flow above stays the default: it shows what taps alone reach.

- Machine: {machine(summary)}; everything on 127.0.0.1 (one clock).
- Versions: {v['hoptrace']}; Mosquitto ({v['mosquitto']}); Node.js {v['node']}; Node-RED
  {v['node-red']} with node-red-contrib-influxdb {v['node-red-contrib-influxdb']} and
  node-red-contrib-hoptrace {v['node-red-contrib-hoptrace']}; InfluxDB ({v['influxdb']}).
- Pipeline spec: `infra/nodered/pipeline-probed.toml`; QoS 1 from the publisher through
  Node-RED's subscription.
- Run: `{run.run_json.get('run_id', run.run_dir.name)}`, {messages:,} messages at {rate:g} msg/s over
  {len(run.run_json['accounting']['publishers'])} publisher, started {when}, collector ran {minutes:.1f} min.

Commands (`infra/services.sh up` and `infra/stores/influxdb.sh start` first; this is what
`python3 infra/nodered/probed_pipeline.py` runs, and what wrote this section):

```sh
{chr(10).join(run.commands)}
hoptrace report {run.run_dir.name}
```

Accounting (`run.json`): {pub['sent']:,} sent, {pub['complete']:,} complete, {pub['incomplete']:,}
incomplete, {pub['unseen']:,} unseen; adds up: {str(acc['adds_up']).lower()}; records lost by probes
{acc['records_lost_by_probes']}, duplicate traces {acc['duplicate_traces']}, late records
{acc['late_records']}. The Node-RED probe (`nodered`, {probe['software']}): {c['reported']:,}
records reported, {c['sent']:,} sent, {c['queue_full']} dropped (queue full), {c['send_failed']} failed,
`not_traced` {c['not_traced']} (the message of `nodered.sh start`'s readiness check carries no
context: each node counts it); closed cleanly: {str(probe['clean_close']).lower()}.

Stages (`summary.json` of `hoptrace report`):

{table}

{bracket}

{clock}
"""


def stage_value(stage: dict, which: str) -> float:
    """A stage's figure from summary.json: `which` is a percentile label (P50) or max."""
    if which == "max":
        return stage["max_ns"]
    for p in stage["percentiles"]:
        if p["label"] == which:
            return p["value_ns"]
    raise KeyError(f"{which} of stage {stage['name']}: {[p['label'] for p in stage['percentiles']]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.environ.get("HOPTRACE_BIN", "hoptrace"))
    ap.add_argument("--out", type=Path, default=Path("runs"))
    ap.add_argument("--run-id", default=f"nodered-probed-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
    ap.add_argument("--messages", type=int, default=60000)
    ap.add_argument("--rate", type=float, default=200)
    ap.add_argument("--streams", type=int, default=100)
    ap.add_argument("--markdown", type=Path, help="also write the report section here")
    ap.add_argument("--render", type=Path, metavar="RUN_DIR",
                    help="no new run: write the section of this finished run (its report/ included)")
    a = ap.parse_args()
    if a.render:
        run_dir = a.render.resolve()
        kept = json.loads((run_dir / "pipeline-run.json").read_text())
        run = Run(run_dir=run_dir, run_json=json.loads((run_dir / "run.json").read_text()),
                  publish_summary=json.loads((run_dir.parent / "publish.json").read_text()),
                  broker_tap="", store_tap="", nodered_log="", commands=kept["commands"],
                  versions=kept["versions"])
        messages, rate = kept["messages"], kept["rate"]
    else:
        run = run_pipeline(a.bin, a.out.resolve(), a.run_id, a.messages, a.rate, streams=a.streams)
        messages, rate = a.messages, a.rate
    if not (run.run_dir / "report" / "summary.json").exists():
        r = sh(a.bin, "report", run.run_dir, timeout=1800)
        if r.returncode != 0:
            print(r.stdout, r.stderr, file=sys.stderr)
            return 1
    summary = json.loads((run.run_dir / "report" / "summary.json").read_text())
    text = section(run, summary, messages, rate)
    print(text)
    if a.markdown:
        a.markdown.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
