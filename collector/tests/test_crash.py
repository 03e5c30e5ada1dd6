"""A collector killed with SIGKILL in the middle of a run, and started again with the same
command, continues the run and loses nothing.

The pipeline is two hops: `hoptrace publish` (hop publish) → Mosquitto (private port,
QoS 1) → `hoptrace tap` (hop broker), 20,000 messages/s for 30 s. Both probes report to
`hoptrace collect`, which is killed 8 s and 19 s into the run and restarted each time, a
second later, with the same command line. Part files of 50,000 rows close every 2.5 s,
so the collector takes checkpoints (every 2 s at most) and each restart takes one up.

Checked, from files the collector wrote and with readers that are not hoptrace's (pyarrow,
DuckDB):
- run.json: two restarts, each taking up a checkpoint and replaying the log after it;
  every message sent is a complete trace; the accounting adds up; no record lost by the
  probes;
- one row per trace key (DuckDB count(*) = count(DISTINCT key) = messages sent) and no
  key the publisher did not send;
- the probes resent what the dead collector had not acknowledged (probes.parquet);
- `hoptrace report` reads the same accounting.

A second test keeps the collector down longer than a small retention buffer
(`--collector-retention`) lasts: the probes evict, and every stamp evicted is counted
lost, exactly: the stamps missing from the Parquet equal records_lost_by_probes, and the
accounting still adds up. The publisher's and the tap's peak RSS (VmHWM) grows by no
more than the retention bound and a little slack over what it was before the collector
went away.

Needs Mosquitto on 127.0.0.1:11883 (infra/services.sh up) and HOPTRACE_BIN (infra/test.sh
provides both).
"""

import json
import os
import signal
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from procs import start, stop

MQTT = os.environ.get("HOPTRACE_MQTT", "127.0.0.1:11883")
SPEC = """name = "crash"
[[hops]]
name = "publish"
id = 0
description = "hoptrace publish hands the message to its MQTT client."
[[hops]]
name = "broker"
id = 1
description = "hoptrace tap receives it from Mosquitto."
[[stages]]
name = "Broker Time"
from = "publish"
to = "broker"
definition = "From the publisher handing the message to its MQTT client to the tap receiving it."
[output]
roll_rows = 50000
row_group_rows = 50000
"""


def hoptrace_bin():
    path = os.environ.get("HOPTRACE_BIN")
    if not path:
        if os.environ.get("HOPTRACE_INTEGRATION") == "1":
            pytest.fail("HOPTRACE_BIN is not set (infra/test.sh sets it)")
        pytest.skip("HOPTRACE_BIN not set")
    host, port = MQTT.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
    except OSError:
        if os.environ.get("HOPTRACE_INTEGRATION") == "1":
            pytest.fail(f"nothing listens on {MQTT}: infra/services.sh up")
        pytest.skip(f"no MQTT broker on {MQTT}")
    return path


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port, p, log: Path, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            if p.poll() is not None:
                break
            time.sleep(0.05)
    pytest.fail(f"the collector does not listen on {port}: {log.read_text()[-2000:]}")


class Pipeline:
    """The collector, the tap and the publisher of one run, in `tmp`."""

    def __init__(self, tmp: Path, retention=None):
        self.bin = hoptrace_bin()
        self.tmp = tmp
        self.spec = tmp / "spec.toml"
        self.spec.write_text(SPEC)
        self.port = free_port()
        self.run_id = f"crash-{uuid.uuid4().hex[:8]}"
        self.topic = f"hoptrace-crash/{uuid.uuid4().hex[:8]}"
        self.collectors = []
        self.retention = [] if retention is None else ["--collector-retention", retention]

    def probe_args(self):
        return ["--collector", f"127.0.0.1:{self.port}", "--pipeline", self.spec,
                *self.retention]

    def start_collector(self):
        n = len(self.collectors)
        log = self.tmp / f"collect-{n}.log"
        p = start([self.bin, "collect", "--listen", f"127.0.0.1:{self.port}",
                   "--pipeline", self.spec, "--runs", self.tmp / "runs",
                   "--run-id", self.run_id, "--checkpoint-interval", "2s"], log)
        wait_listening(self.port, p, log)
        self.collectors.append((p, log))
        return p

    def kill_collector(self):
        p, _ = self.collectors[-1]
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=10)

    def start_probes(self, rate, seconds):
        self.tap = start([self.bin, "tap", "--from", f"mqtt://{MQTT}?qos=1",
                          "--topics", f"{self.topic}/#", "--hop", "broker",
                          *self.probe_args()], self.tmp / "tap.log")
        time.sleep(2)  # subscribed before the first message
        self.pub = start([self.bin, "publish", "--to", f"mqtt://{MQTT}?qos=1",
                          "--topic-root", self.topic, "--rate", str(rate),
                          "--duration", f"{seconds}s", "--streams", "100",
                          *self.probe_args()], self.tmp / "publish.log")
        self.pub_started = time.time()

    def finish(self):
        """Waits for the publisher, stops the tap, then the collector; returns run.json."""
        out = self.pub.communicate(timeout=300)[0]
        assert self.pub.returncode == 0, (self.tmp / "publish.log").read_text()[-3000:]
        self.publish_out = out
        self.tap_out = stop(self.tap, timeout=120)
        assert self.tap.returncode == 0, (self.tmp / "tap.log").read_text()[-3000:]
        p, log = self.collectors[-1]
        self.collect_out = stop(p, timeout=120)
        assert p.returncode == 0, log.read_text()[-3000:]
        self.dir = self.tmp / "runs" / self.run_id
        return json.loads((self.dir / "run.json").read_text())

    def parquet(self, run):
        files = [str(self.dir / "traces" / f["name"]) for f in run["files"]]
        assert files, run["files"]
        return files


def sent_by_publisher(out):
    for line in out.splitlines():
        if line.startswith("sent ") and " messages " in line:
            return int(line.split()[1])
    pytest.fail(f"no 'sent N messages' line in the publisher's output:\n{out}")


@pytest.fixture(scope="module")
def killed_twice(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("crash")
    pl = Pipeline(tmp)
    pl.start_collector()
    pl.start_probes(rate=20000, seconds=30)
    for at in (8, 19):  # seconds into the publisher's run
        time.sleep(max(0.0, at - (time.time() - pl.pub_started)))
        pl.kill_collector()
        time.sleep(1)
        pl.start_collector()
    return pl, pl.finish()


def test_the_run_continued_through_two_kills_and_adds_up(killed_twice):
    pl, run = killed_twice
    sent = sent_by_publisher(pl.publish_out)
    a = run["accounting"]
    assert len(run["restarts"]) == 2, run["restarts"]
    for r in run["restarts"]:
        assert r["records_replayed"] > 0, r
        # Killed after checkpoints: the restart took one up and replayed only the log
        # after it. That log may be empty: a kill within one log sync (100 ms) of the
        # checkpoint finds nothing written to the new segment yet (nothing of it was
        # acknowledged either, so the probes send it again).
        assert r.get("checkpoint_unix_ns"), r
        assert r["log_records"] < r["records_replayed"], r
        assert r["log_entries"] > 0 or r["log_records"] == 0, r
    [p] = a["publishers"]
    assert p["sent"] == sent, (p, sent)
    assert p["complete"] == sent, p
    assert p["incomplete"] == 0 and p["unseen"] == 0, p
    assert a["records_lost_by_probes"] == 0, a
    assert a["duplicate_traces"] == 0, a
    assert a["adds_up"] is True, a
    for _, log in pl.collectors[1:]:
        assert f"continuing run {pl.run_id} from its log" in log.read_text(), log.read_text()
    assert not (pl.dir / "wal").exists(), "the log outlived the clean stop"


def test_every_message_is_exactly_one_row(killed_twice):
    pl, run = killed_twice
    sent = sent_by_publisher(pl.publish_out)
    files = pl.parquet(run)
    con = duckdb.connect()
    rows, keys, full, bad_seq = con.execute(
        "SELECT count(*), count(DISTINCT (publisher, stream, sequence)), "
        "count(*) FILTER (WHERE publish_ns IS NOT NULL AND broker_ns IS NOT NULL), "
        "count(*) FILTER (WHERE broker_ns < publish_ns) "
        "FROM read_parquet(?)", [files]).fetchone()
    assert rows == keys == sent, (rows, keys, sent)
    assert full == sent, (full, sent)
    # The publisher numbers each stream's messages from 0: nothing it did not send is here.
    streams, max_total = con.execute(
        "SELECT count(DISTINCT stream), sum(m + 1) FROM "
        "(SELECT stream, max(sequence) AS m FROM read_parquet(?) GROUP BY stream)",
        [files]).fetchone()
    assert max_total == sent, (streams, max_total, sent)


def test_the_probes_resent_what_the_dead_collector_had_not_acknowledged(killed_twice):
    pl, run = killed_twice
    table = pq.read_table(str(pl.dir / "probes.parquet"))
    ints = [n for n, t in zip(table.column_names, table.schema.types) if pa.types.is_integer(t)]
    probes = table.select(ints).to_pylist()
    assert probes, "probes.parquet is empty"
    assert "resent" in probes[0], list(probes[0])
    # Each probe's last Counters frame holds its totals.
    last = {}
    for row in probes:
        last[row["instance_id"]] = row
    assert sum(r["resent"] or 0 for r in last.values()) > 0, last
    assert sum(r["lost_unacked"] or 0 for r in last.values() if "lost_unacked" in r) == 0, last


def test_the_report_reads_the_same_accounting(killed_twice, tmp_path):
    pl, run = killed_twice
    out = tmp_path / "report"
    subprocess.run([pl.bin, "report", pl.dir, "--out", out], check=True,
                   capture_output=True, text=True)
    summary = json.loads((out / "summary.json").read_text())
    acc = summary["accounting"]
    a = run["accounting"]
    assert acc["adds_up"] is True, acc
    sent = sum(p["sent"] for p in a["publishers"])
    assert acc["sent"] == sent, (acc, sent)
    assert acc["complete"] == sent, acc
    assert len(summary["runs"][0]["restarts"]) == 2, summary["runs"]


def peak_rss(pid):
    """VmHWM of a process, bytes; None once it has exited."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


class PeakWatch(threading.Thread):
    """The highest VmHWM read of each process (every 20 ms) until it exits: its peak RSS.
    (The kernel updates the high-water mark lazily, so one read may be a little lower than
    an earlier one.)"""

    def __init__(self, procs):
        super().__init__(daemon=True)
        self.procs = procs
        self.last = {name: 0 for name in procs}
        self.done = threading.Event()

    def run(self):
        while not self.done.is_set():
            for name, p in self.procs.items():
                v = peak_rss(p.pid)
                if v is not None:
                    self.last[name] = max(self.last[name], v)
            time.sleep(0.02)


RETENTION = 64 * 1024
# What a probe process may add beyond its retention bound while the collector is away:
# allocator and buffer noise (measured: under 0.1 MiB). Keeping every record would add
# about 36 bytes per record, 4 MB or more per probe over this absence (120,000 records
# each).
SLACK = 2 << 20


def test_a_longer_absence_than_the_retention_loses_exactly_what_it_counts(tmp_path):
    pl = Pipeline(tmp_path, retention="64KiB")
    pl.start_collector()
    pl.start_probes(rate=20000, seconds=12)
    watch = PeakWatch({"publish": pl.pub, "tap": pl.tap})
    watch.start()
    time.sleep(3)
    # The baseline: each probe process's peak so far, collector up, traffic flowing.
    baseline = {name: peak_rss(p.pid) for name, p in watch.procs.items()}
    assert all(baseline.values()), baseline
    pl.kill_collector()
    time.sleep(6)  # ~120,000 messages: far more than 64 KiB of records
    pl.start_collector()
    run = pl.finish()
    watch.done.set()
    watch.join()
    for name, base in baseline.items():
        grew = watch.last[name] - base
        print(f"{name}: peak RSS {base >> 10} KiB before the absence, "
              f"{watch.last[name] >> 10} KiB at the end (+{grew >> 10} KiB)")
        assert grew <= RETENTION + SLACK, (name, base, watch.last[name])
    a = run["accounting"]
    sent = sent_by_publisher(pl.publish_out)
    lost = a["records_lost_by_probes"]
    assert lost > 0, a
    assert a["adds_up"] is True, a
    con = duckdb.connect()
    stamps = con.execute(
        "SELECT count(publish_ns) + count(broker_ns) FROM read_parquet(?)",
        [pl.parquet(run)]).fetchone()[0]
    # Every message has two stamps; each one missing is one the probes counted lost.
    assert 2 * sent - stamps == lost, (sent, stamps, lost)
    assert "evict" in (pl.tmp / "publish.log").read_text() + (pl.tmp / "tap.log").read_text()
