"""Collectors as a Kafka consumer group, on a real 3-broker KRaft cluster
(infra/kafka/kafka.sh start --nodes 3), with one collector killed mid-run.

- `hoptrace relay` takes the probe connections of the reference pipeline (store and
  processor) and of the publisher, and writes their records to a topic of 6 partitions
  (replication 3), each record in the partition of its trace key;
- two `hoptrace collect --from kafka://...` members share the partitions; the first is
  killed with SIGKILL while messages flow, and the second takes its partitions over;
- after the publisher, the pipeline and the relay stop, the second member reads to the
  end and stops cleanly.

Checked: every message the publisher sent is exactly one row of the run as the analysis
reads it (no trace lost, none counted twice), all complete; every row of every file any
member wrote is one of those messages (pyarrow); the files hoptrace sets aside hold only
traces the survivor wrote too; the run's accounting adds up; the report reads the group
run as one run; records of one trace all went to one partition, the one Kafka's
partitioner picks for the trace key.

Needs Java, the Kafka jars (infra/setup.sh), Mosquitto (HOPTRACE_MQTT) and HOPTRACE_BIN.
"""

import csv
import io
import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from procs import start, stop, wait_ready

ROOT = Path(__file__).resolve().parents[2]
KAFKA = ROOT / "infra" / "kafka" / "kafka.sh"
CLUSTER = os.environ.get("HOPTRACE_KAFKA_CLUSTER",
                         "127.0.0.1:29092,127.0.0.1:29093,127.0.0.1:29094")
RELAY = "127.0.0.1:7441"
RATE = 1500  # messages per second
SECONDS = 24


def hoptrace_bin():
    path = os.environ.get("HOPTRACE_BIN")
    mqtt = os.environ.get("HOPTRACE_MQTT")
    if not path or not mqtt:
        if os.environ.get("HOPTRACE_INTEGRATION") == "1":
            pytest.fail("HOPTRACE_BIN and HOPTRACE_MQTT must be set (infra/test.sh sets them)")
        pytest.skip("HOPTRACE_BIN or HOPTRACE_MQTT not set")
    return path


def produce(topic, lines):
    """Writes `lines` ("key\tvalue") to `topic` with Kafka's own console producer."""
    subprocess.run(
        [str(KAFKA), "run", "kafka.tools.ConsoleProducer", "--bootstrap-server", CLUSTER,
         "--topic", topic, "--property", "parse.key=true", "--property", "key.separator=\t"],
        input="".join(f"{line}\n" for line in lines), text=True, check=True, timeout=120)


def garbage_keys(partitions):
    """One key per partition, by Kafka's partitioner."""
    keys, i = {}, 0
    while len(keys) < partitions:
        k = f"junk{i}"
        keys.setdefault((murmur2(k.encode()) & 0x7FFFFFFF) % partitions, k)
        i += 1
    return [keys[p] for p in range(partitions)]


GARBAGE_CONTROL = 2


def wait_log(p, log: Path, text, timeout=60):
    deadline = time.time() + timeout
    while text not in log.read_text():
        if p.poll() is not None or time.time() > deadline:
            pytest.fail(f"waiting for {text!r} in {log.name}: {log.read_text()[-3000:]}")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def cluster():
    bin_ = hoptrace_bin()
    # A cluster that runs already (infra/test.sh starts it once for every suite that needs
    # it) is left running; one this fixture starts, it stops.
    running = subprocess.run([str(KAFKA), "status", "--nodes", "3"],
                             capture_output=True).returncode == 0
    subprocess.run([str(KAFKA), "start", "--nodes", "3"], check=True, timeout=360)
    try:
        yield bin_
    finally:
        if not running:
            subprocess.run([str(KAFKA), "stop", "--nodes", "3"], timeout=120)


@pytest.fixture(scope="module")
def run(cluster, tmp_path_factory):
    bin_ = cluster
    tmp = tmp_path_factory.mktemp("kafka-group")
    runs = tmp / "runs"
    tag = uuid.uuid4().hex[:8]
    kafka = f"kafka://{CLUSTER}/ht-group-{tag}"
    group = f"ht-collectors-{tag}"
    procs = []
    try:
        relay = start([bin_, "relay", "--listen", RELAY, "--to", kafka, "--partitions", "6",
                       "--replication", "3", "--run-id", "group"], tmp / "relay.log")
        procs.append(relay)
        wait_log(relay, tmp / "relay.log", "relaying probes on")
        # Messages that are not hoptrace frames: one in every records partition, and two
        # on the control topic. Members must count and skip them.
        topic = kafka.rsplit("/", 1)[1]
        produce(topic, [f"{k}\tnot a frame" for k in garbage_keys(6)])
        produce(f"{topic}.control", [f"junk\tnot a frame {i}" for i in range(GARBAGE_CONTROL)])
        members = {}
        for name in ["c1", "c2"]:
            members[name] = start([bin_, "-v", "collect", "--from", kafka, "--group", group,
                                   "--member", name, "--run-id", "group", "--runs", runs,
                                   "--commit-interval-s", "2"], tmp / f"{name}.log")
            procs.append(members[name])
        for name in ["c1", "c2"]:
            wait_log(members[name], tmp / f"{name}.log", "assigned a partition")
        probe = ["--collector", RELAY]
        mqtt = f"mqtt://{os.environ['HOPTRACE_MQTT']}"
        store = start([bin_, "refpipe", "store", "--listen", "127.0.0.1:7541", *probe],
                      tmp / "store.log")
        procs.append(store)
        wait_ready(store, "store", tmp / "store.log")
        processor = start([bin_, "refpipe", "processor", "--from", mqtt, "--store",
                           "127.0.0.1:7541", "--topics", f"grp{tag}/#", *probe],
                          tmp / "processor.log")
        procs.append(processor)
        wait_ready(processor, "processor", tmp / "processor.log")
        publisher_json = tmp / "publisher.json"
        publisher = start([bin_, "publish", "--to", mqtt, "--rate", RATE, "--duration",
                           f"{SECONDS}s", "--streams", "30", "--topic-root", f"grp{tag}",
                           "--summary-json", publisher_json, *probe], tmp / "publisher.log")
        procs.append(publisher)
        # Kill c1 once it has committed checkpoints and while messages flow.
        time.sleep(SECONDS / 3)
        os.killpg(members["c1"].pid, signal.SIGKILL)
        members["c1"].wait()
        assert publisher.wait(timeout=SECONDS * 4) == 0, (tmp / "publisher.log").read_text()
        time.sleep(2)  # the last messages pass the processor and the store
        outs = {"processor": stop(processor), "store": stop(store), "relay": stop(relay)}
        assert relay.returncode == 0, (tmp / "relay.log").read_text()[-3000:]
        outs["c2"] = stop(members["c2"], timeout=180)
        assert members["c2"].returncode == 0, (tmp / "c2.log").read_text()[-3000:]
        yield {"dir": runs / "group", "tmp": tmp, "outs": outs, "bin": bin_,
               "publisher": json.loads(publisher_json.read_text()), "kafka": kafka}
    finally:
        for p in procs:
            stop(p, timeout=30)
        # This run's topics: left behind they slow every later start of the cluster.
        subprocess.run([str(KAFKA), "topics", "--bootstrap-server", CLUSTER.split(",")[0],
                        "--delete", "--topic", f"ht-group-{tag}.*"],
                       capture_output=True, timeout=120)


def sql(run, q):
    p = subprocess.run([run["bin"], "sql", run["dir"], q, "--format", "csv"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return list(csv.DictReader(io.StringIO(p.stdout)))


def test_both_members_owned_partitions_and_the_survivor_took_over(run):
    members = run["dir"] / "members"
    assert (members / "c2" / "run.json").exists()
    assert not (members / "c1" / "run.json").exists(), "c1 was killed"
    owners = {}
    for m in ["c1", "c2"]:
        for line in (members / m / "ownership.jsonl").read_text().splitlines():
            o = json.loads(line)
            owners.setdefault(o["partition"], []).append((o["start"], o["member"]))
    assert sorted(owners) == list(range(6)), owners
    c1_parts = {p for p, os_ in owners.items() if any(m == "c1" for _, m in os_)}
    assert c1_parts, owners
    for p in c1_parts:
        assert any(m == "c2" for _, m in owners[p]), f"nobody took partition {p} over"
    assert "assigned a partition" in (run["tmp"] / "c2.log").read_text()


def test_every_message_sent_is_exactly_one_row(run):
    sent = run["publisher"]["messages"]
    assert abs(sent - RATE * SECONDS) <= RATE, sent
    rows = sql(run, "SELECT count(*) AS n, count(DISTINCT publisher || '/' || stream || '/' || "
                    "sequence) AS keys, sum(CASE WHEN status = 'complete' THEN 1 ELSE 0 END) "
                    "AS complete FROM traces")
    assert rows == [{"n": str(sent), "keys": str(sent), "complete": str(sent)}], (rows, sent)


def test_every_file_any_member_wrote_holds_only_sent_messages(run):
    # Independent of hoptrace's choice of files: pyarrow reads every file of every member,
    # set aside or not. Each message appears, and a message in more than one file was
    # written by c1 after its last commit and repeated by c2.
    files = sorted((run["dir"] / "members").glob("*/traces/*/*.parquet"))
    assert files
    keys = {}
    for f in files:
        t = pq.read_table(f, columns=["publisher", "stream", "sequence", "status"])
        for p, s, q, st in zip(*(t.column(c).to_pylist() for c in
                                 ["publisher", "stream", "sequence", "status"])):
            keys.setdefault((p, s, q), []).append((f.parts[-4], st))
    sent = run["publisher"]["messages"]
    assert len(keys) == sent
    for k, seen in keys.items():
        assert {st for _, st in seen} == {"complete"}, (k, seen)
        if len(seen) > 1:
            assert {m for m, _ in seen} == {"c1", "c2"}, (k, seen)


def test_the_report_reads_the_group_as_one_run_whose_accounting_adds_up(run, tmp_path):
    p = subprocess.run([run["bin"], "report", run["dir"], "--out", tmp_path],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    s = json.loads((tmp_path / "summary.json").read_text())
    sent = run["publisher"]["messages"]
    assert s["accounting"]["sent"] == sent, s["accounting"]
    assert s["accounting"]["adds_up"] is True, s["accounting"]
    assert s["accounting"]["complete"] == sent, s["accounting"]
    c2 = json.loads((run["dir"] / "members" / "c2" / "run.json").read_text())
    assert c2["group"]["group"].startswith("ht-collectors-")
    assert {p["process"] for p in c2["probes"]} >= {"hoptrace relay"}, c2["probes"]


def test_records_of_a_trace_share_the_partition_kafka_would_pick(run):
    # The relay writes Records frames; every record's partition must be the one Kafka's
    # murmur2 partitioner gives its 14-byte trace key. c2's segments say which partition
    # each file came from; a file's rows all belong to that partition.
    seg_lines = (run["dir"] / "members" / "c2" / "segments.jsonl").read_text().splitlines()
    checked = 0
    for line in seg_lines:
        seg = json.loads(line)
        for f in seg["files"]:
            t = pq.read_table(run["dir"] / "members" / "c2" / f["name"],
                              columns=["publisher", "stream", "sequence"])
            for p, s, q in zip(*(t.column(c).to_pylist() for c in
                                 ["publisher", "stream", "sequence"])):
                key = p.to_bytes(2, "little") + s.to_bytes(4, "little") + q.to_bytes(8, "little")
                assert (murmur2(key) & 0x7FFFFFFF) % 6 == seg["partition"], (p, s, q)
                checked += 1
    assert checked > 0


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (org.apache.kafka.common.utils.Utils.murmur2), as a signed int."""
    m, mask = 0x5BD1E995, 0xFFFFFFFF
    h = (0x9747B28C ^ len(data)) & mask
    n4 = len(data) // 4
    for i in range(n4):
        k = int.from_bytes(data[4 * i:4 * i + 4], "little")
        k = (k * m) & mask
        k ^= k >> 24
        k = (k * m) & mask
        h = ((h * m) & mask) ^ k
    tail = data[4 * n4:]
    if len(tail) >= 3:
        h ^= tail[2] << 16
    if len(tail) >= 2:
        h ^= tail[1] << 8
    if len(tail) >= 1:
        h ^= tail[0]
        h = (h * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def test_messages_that_are_not_frames_are_counted_and_skipped(run):
    """Every garbage records message is skipped by whichever member read it (a partition's
    next owner may read it again); each member reads the whole control topic."""
    logs = {m: (run["tmp"] / f"{m}.log").read_text() for m in ["c1", "c2"]}
    skipped = {m: t.count("not a hoptrace records frame") for m, t in logs.items()}
    assert sum(skipped.values()) >= 6, skipped
    c2 = json.loads((run["dir"] / "members" / "c2" / "run.json").read_text())["group"]
    assert c2["bad_messages"] == skipped["c2"], (c2, skipped)
    assert c2["bad_control_messages"] == GARBAGE_CONTROL, c2
    assert "not a hoptrace frame" in logs["c2"]
