"""A measurement across several hosts: each host a network namespace of its own (own
address on a bridge, own host name), made by infra/netns/lab.sh.

- host `broker` runs Mosquitto on its address;
- host `flow` runs the reference store and processor, reporting to the collector;
- host `pub` runs the publisher, reporting to the collector;
- the collector listens on the bridge address 10.231.0.1 (not loopback), so it requires a
  token, and serves TLS with a certificate from infra/tls/make-certs.sh.

Checked: the run lists both probe hosts with their processes, hops and clock statuses;
every message sent is a complete trace in the Parquet (read by pyarrow); the report's
environment names the hosts; a probe with the wrong token and one without TLS are refused
and counted; a collector on a non-loopback address without a token does not start.

Needs root, iproute2, Mosquitto and HOPTRACE_BIN (infra/test.sh provides them).
"""

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from procs import start, stop, wait_ready

ROOT = Path(__file__).resolve().parents[2]
LAB = ROOT / "infra" / "netns" / "lab.sh"
MAKE_CERTS = ROOT / "infra" / "tls" / "make-certs.sh"
MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
COLLECTOR = "10.231.0.1:7431"
TOKEN = "lab-token-7431"
RATE = 2000  # messages per second (one metric each)
SECONDS = 4


def hoptrace_bin():
    path = os.environ.get("HOPTRACE_BIN")
    if not path:
        if os.environ.get("HOPTRACE_INTEGRATION") == "1":
            pytest.fail("HOPTRACE_BIN is not set (infra/test.sh sets it)")
        pytest.skip("HOPTRACE_BIN not set")
    if os.geteuid() != 0 or not shutil.which("ip") or not os.path.exists(MOSQUITTO):
        if os.environ.get("HOPTRACE_INTEGRATION") == "1":
            pytest.fail("the multi-host test needs root, iproute2 and Mosquitto")
        pytest.skip("needs root, iproute2 and Mosquitto")
    return path


def on(host, *cmd):
    return [str(LAB), "exec", host, *map(str, cmd)]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    bin_ = hoptrace_bin()
    tmp = tmp_path_factory.mktemp("multihost")
    subprocess.run([str(LAB), "down"], check=True)
    subprocess.run([str(LAB), "up", "broker", "flow", "pub"], check=True)
    procs = []
    try:
        broker_ip = subprocess.run([str(LAB), "addr", "broker"], check=True,
                                   capture_output=True, text=True).stdout.strip()
        pki = tmp / "pki"
        subprocess.run([str(MAKE_CERTS), str(pki), COLLECTOR.split(":")[0]], check=True,
                       capture_output=True)
        conf = tmp / "mosquitto.conf"
        conf.write_text(
            f"user root\npersistence false\nset_tcp_nodelay true\nmax_queued_messages 100000\n"
            f"listener 1883 {broker_ip}\nallow_anonymous true\n")
        broker = start(on("broker", MOSQUITTO, "-c", conf), tmp / "mosquitto.log")
        procs.append(broker)
        yield {"bin": bin_, "tmp": tmp, "pki": pki, "broker": f"mqtt://{broker_ip}:1883",
               "procs": procs}
    finally:
        for p in procs:
            stop(p, timeout=10)
        subprocess.run([str(LAB), "down"], check=True)


def probe_args(lab, token=TOKEN, tls=True):
    args = ["--collector", COLLECTOR, "--token", token]
    if tls:
        args += ["--collector-ca", lab["pki"] / "ca.pem"]
    return args


@pytest.fixture(scope="module")
def run(lab):
    bin_, tmp, pki = lab["bin"], lab["tmp"], lab["pki"]
    runs = tmp / "runs"
    collector = start([bin_, "collect", "--listen", COLLECTOR, "--token", TOKEN,
                       "--tls-cert", pki / "collector.pem", "--tls-key", pki / "collector-key.pem",
                       "--run-id", "lab", "--runs", runs], tmp / "collector.log")
    deadline = time.time() + 20
    while "collecting on" not in (tmp / "collector.log").read_text():
        assert collector.poll() is None and time.time() < deadline, \
            (tmp / "collector.log").read_text()
        time.sleep(0.1)
    store = start(on("flow", bin_, "refpipe", "store", "--listen", "127.0.0.1:7500",
                     *probe_args(lab)), tmp / "store.log")
    wait_ready(store, "store", tmp / "store.log")
    processor = start(on("flow", bin_, "refpipe", "processor", "--from", lab["broker"],
                         "--store", "127.0.0.1:7500", "--topics", "lab/#", *probe_args(lab)),
                      tmp / "processor.log")
    wait_ready(processor, "processor", tmp / "processor.log")

    # Refused probes, from the publishing host: a wrong token, and plain text to TLS.
    refused = {}
    for name, args in [("token", probe_args(lab, token="wrong")),
                       ("plain", probe_args(lab, tls=False))]:
        p = subprocess.run(on("pub", bin_, "publish", "--to", lab["broker"], "--rate", "10",
                              "--duration", "1s", "--topic-root", "lab-refused", *args),
                           capture_output=True, text=True, timeout=60)
        refused[name] = p

    publisher_json = tmp / "publisher.json"
    p = subprocess.run(on("pub", bin_, "publish", "--to", lab["broker"], "--rate", RATE,
                          "--duration", f"{SECONDS}s", "--streams", "20", "--topic-root", "lab",
                          "--summary-json", publisher_json, *probe_args(lab)),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    time.sleep(2)  # the last messages pass the processor and the store
    outs = {"processor": stop(processor), "store": stop(store), "collector": stop(collector)}
    assert collector.returncode == 0, (tmp / "collector.log").read_text()[-3000:]
    return {"dir": runs / "lab", "refused": refused, "outs": outs,
            "publisher": json.loads(publisher_json.read_text())}


def test_the_run_lists_every_host_with_its_clock(run):
    summary = json.loads((run["dir"] / "run.json").read_text())
    by_host = {}
    for p in summary["probes"]:
        by_host.setdefault(p["host"], set()).update(p["hops"])
    assert set(by_host) == {"pub", "flow"}, summary["probes"]
    assert "publish" in by_host["pub"]
    assert {"flow_in", "flow_out", "store_in"} <= by_host["flow"], by_host
    for p in summary["probes"]:
        addr = subprocess.run([str(LAB), "addr", p["host"]], check=True, capture_output=True,
                              text=True).stdout.strip()
        assert p["peer"].split(":")[0] == addr, "each host connects from its own address"
    clock_hosts = {c["host"] for c in summary["clock"]}
    assert clock_hosts == {"pub", "flow"}, clock_hosts
    clock = pq.read_table(run["dir"] / "clock.parquet", columns=["host"]).to_pydict()
    assert set(clock["host"]) == {"pub", "flow"}


def test_every_message_sent_is_a_complete_trace(run):
    summary = json.loads((run["dir"] / "run.json").read_text())
    acc = summary["accounting"]
    assert acc["adds_up"], acc
    sent = sum(p["sent"] for p in acc["publishers"])
    assert sent == run["publisher"]["messages"], "the collector heard what the publisher sent"
    assert abs(sent - RATE * SECONDS) <= RATE // 10, sent
    table = pq.read_table(run["dir"] / "traces")
    assert table.num_rows == sent
    statuses = table.column("status").to_pylist()
    assert statuses.count("complete") == sent, {s: statuses.count(s) for s in set(statuses)}


def test_the_report_names_the_hosts(run, tmp_path):
    p = subprocess.run([os.environ["HOPTRACE_BIN"], "report", run["dir"], "--out", tmp_path],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    s = json.loads((tmp_path / "summary.json").read_text())
    hosts = {h["host"]: h for h in s["environment"]["hosts"]}
    assert set(hosts) == {"pub", "flow"}
    assert all(h["clock_samples"] > 0 for h in hosts.values())
    for name, h in hosts.items():
        addr = subprocess.run([str(LAB), "addr", name], check=True, capture_output=True,
                              text=True).stdout.strip()
        assert h["addresses"] == [addr], h
    md = (tmp_path / "report.md").read_text()
    assert "2 host(s)" in md


def test_wrong_token_and_plain_text_probes_are_refused_and_counted(run):
    token, plain = run["refused"]["token"], run["refused"]["plain"]
    assert token.returncode != 0 and "token" in token.stderr, token.stderr
    assert plain.returncode != 0 and "welcome" in plain.stderr, plain.stderr
    conns = json.loads((run["dir"] / "run.json").read_text())["connections"]
    assert conns["bad_token"] >= 1, conns
    assert conns["tls_failed"] >= 1, conns


def test_a_collector_off_loopback_without_a_token_does_not_start(lab):
    p = subprocess.run([lab["bin"], "collect", "--listen", "10.231.0.1:7432", "--runs",
                        lab["tmp"] / "no-token"], capture_output=True, text=True, timeout=30,
                       env={k: v for k, v in os.environ.items() if k != "HOPTRACE_TOKEN"})
    assert p.returncode != 0
    assert "requires a token" in p.stderr, p.stderr
