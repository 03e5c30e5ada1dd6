"""`hoptrace sweep` on the 3-node Kafka cluster (infra/kafka/kafka.sh start --nodes 3)
with replicated topics, so that acks=all waits for followers.

- A one-cell sweep (acks=all, 2 partitions, `--replication 3 --min-insync-replicas 2`)
  creates its topic `<stem>-p2-r3`; Kafka's own TopicCommand describes it with
  replication factor 3 and min.insync.replicas=2, and the sweep report says so.
- A topic of that name that exists with another replication factor (made here by Kafka's
  own tool) is refused before the cell starts, naming what differs.

Needs Java, the Kafka jars (infra/setup.sh), Mosquitto (HOPTRACE_MQTT) and HOPTRACE_BIN.
"""

import json
import re
import subprocess
import uuid

from test_kafka_group import CLUSTER, KAFKA, cluster  # noqa: F401  (the fixture)

BOOTSTRAP = CLUSTER.split(",")[0]


def describe(topic):
    """TopicCommand --describe of `topic`: (replication factor, min.insync.replicas)."""
    out = subprocess.run(
        [str(KAFKA), "topics", "--bootstrap-server", CLUSTER, "--describe", "--topic", topic],
        capture_output=True, text=True, check=True, timeout=120).stdout
    rf = re.search(r"ReplicationFactor:\s*(\d+)", out)
    isr = re.search(r"min\.insync\.replicas=(\d+)", out)
    assert rf, out
    return int(rf.group(1)), int(isr.group(1)) if isr else None


def sweep(bin_, stem, out, *extra):
    return subprocess.run(
        [bin_, "sweep", "--broker", f"kafka://{BOOTSTRAP}/{stem}", "--rate", "2k",
         "--acks", "all", "--partitions", "2", "--replication", "3",
         "--min-insync-replicas", "2", "--warmup", "1s", "--window", "3s",
         "--streams", "10", "--out", str(out), *extra],
        capture_output=True, text=True, timeout=300)


def test_a_replicated_sweep_creates_and_states_its_topic_layout(cluster, tmp_path):
    stem = f"sweep-{uuid.uuid4().hex[:8]}"
    p = sweep(cluster, stem, tmp_path / "sweep")
    assert p.returncode == 0, p.stderr[-4000:]
    assert describe(f"{stem}-p2-r3") == (3, 2)
    report = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    assert report["info"]["topics"] == (
        "created by the sweep with replication factor 3 and min.insync.replicas 2, "
        "checked against the cluster before each cell")
    [cell] = report["cells"]
    assert cell["adds_up"] is True, cell
    md = (tmp_path / "sweep" / "sweep.md").read_text()
    assert "Topics: created by the sweep with replication factor 3" in md


def test_a_topic_of_another_layout_is_refused_before_the_cell(cluster, tmp_path):
    stem = f"sweep-{uuid.uuid4().hex[:8]}"
    subprocess.run(
        [str(KAFKA), "topics", "--bootstrap-server", CLUSTER, "--create", "--topic",
         f"{stem}-p2-r3", "--partitions", "2", "--replication-factor", "2"],
        check=True, capture_output=True, timeout=120)
    p = sweep(cluster, stem, tmp_path / "sweep")
    assert p.returncode != 0
    assert f"Kafka topic {stem}-p2-r3 has 2 replicas, not 3" in p.stderr, p.stderr[-4000:]
    assert not list((tmp_path / "sweep").glob("runs/*/part-*.parquet"))
