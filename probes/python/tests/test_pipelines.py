"""Proof in real pipelines (HOPTRACE_INTEGRATION=1): the Python probe as the processor
between `hoptrace publish` and `hoptrace tap`, through the real Mosquitto (paho-mqtt,
MQTT v5 user properties) and the real Kafka (confluent-kafka, record headers). The run's
accounting must be exact: every message sent is complete, nothing lost or counted twice,
and the Parquet holds the stamps Python took."""

import os
import socket
import subprocess
import threading
import uuid
from pathlib import Path

import pytest

from hoptrace_run import (Collector, hoptrace_bin, read_traces, require_integration, start, stop,
                          wait_for_line, write_pipeline)
from hoptrace_probe import Exporter, ExporterConfig
from hoptrace_probe.carrier import kafka_header, mqtt_property

ROOT = Path(__file__).resolve().parents[3]
MQTT = os.environ.get("HOPTRACE_MQTT", "127.0.0.1:11883")
KAFKA = os.environ.get("HOPTRACE_KAFKA", "127.0.0.1:19092")
MESSAGES = 1000


def forwarded(ctx):
    """The context a processor sends on, with a trace id of its own (derived from the key)
    that its own records do not carry: if the collector's row has it, the tap read the
    context this processor injected (for Kafka: the last of two `hoptrace` headers)."""
    fwd = ctx.copy()
    fwd.otel_trace_id = trace_id_of(ctx.key)
    return fwd


def trace_id_of(key):
    return b"\x01" + b"".join(k.to_bytes(5, "little") for k in key)


def require_service(address: str, what: str) -> None:
    require_integration(what)
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
    except OSError as e:
        pytest.fail(f"{what} at {address} is not reachable ({e}): run infra/services.sh up")


def check_run(run: dict, rows: dict, publisher: int, python_stamps: dict) -> None:
    acc = run["accounting"]
    (p,) = acc["publishers"]
    assert (p["publisher"], p["sent"], p["complete"], p["incomplete"], p["unseen"]) == \
        (publisher, MESSAGES, MESSAGES, 0, 0), acc
    assert acc["adds_up"] is True
    assert acc["records_by_hop"] == {h: MESSAGES for h in ("publish", "flow_in", "flow_out", "sink")}
    assert acc["records_lost_by_probes"] == 0
    assert (acc["duplicate_traces"], acc["late_records"], acc["in_flight"]) == (0, 0, 0)
    assert all(pr["clean_close"] for pr in run["probes"]), run["probes"]
    assert len(rows) == MESSAGES and len(python_stamps) == MESSAGES
    for key, (flow_in_ns, flow_out_ns) in python_stamps.items():
        row = rows[key]
        assert (row["flow_in_ns"], row["flow_out_ns"]) == (flow_in_ns, flow_out_ns), key
        assert row["status"] == "complete"
        assert row["publish_ns"] <= flow_in_ns <= flow_out_ns <= row["sink_ns"], row
        assert bytes(row["otel_trace_id"]) == trace_id_of(key), row


def run_tap_and_publisher(tmp: Path, collector: Collector, tap_from: str, tap_topics: str,
                          publish_to: str, publisher: int) -> subprocess.Popen:
    """Starts the tap (hop `sink`) and, once it is subscribed, the publisher; returns the
    tap, which exits by itself after MESSAGES traced messages."""
    bin_ = hoptrace_bin()
    probe_args = ["--collector", collector.address, "--pipeline", collector.pipeline]
    tap = start([bin_, "tap", "--from", tap_from, "--topics", tap_topics, "--hop", "sink",
                 "--messages", MESSAGES, *probe_args], tmp / "tap.log")
    wait_for_line(tmp / "tap.log", r"tapping ", tap)
    pub = subprocess.run([bin_, "publish", "--to", publish_to, "--messages", str(MESSAGES),
                          "--rate", "500", "--duration", "60s", "--streams", "10",
                          "--publisher-id", str(publisher), *map(str, probe_args)],
                         capture_output=True, text=True, timeout=120)
    assert pub.returncode == 0, pub.stderr[-3000:]
    return tap


def wait_exit(p: subprocess.Popen, log: Path, timeout: float) -> str:
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        out = stop(p)
        pytest.fail(f"{p.args[:2]} did not finish: {out}\n{log.read_text()[-3000:]}")
    assert p.returncode == 0, (out, log.read_text()[-3000:])
    return out


def test_paho_mqtt_v5_processor_through_mosquitto(tmp_path):
    require_service(MQTT, "Mosquitto")
    import paho.mqtt.client as mqtt
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    uid = uuid.uuid4().hex[:8]
    root_in, root_out = f"python-probe/{uid}/in", f"python-probe/{uid}/out"
    collector = Collector(tmp_path, "py-mqtt", write_pipeline(tmp_path / "pipeline.toml", sink=True))
    exporter = Exporter(ExporterConfig(collector.address, "py-mqtt-processor"),
                        [(1, "flow_in"), (2, "flow_out")])
    flow_in, flow_out = exporter.probe("flow_in"), exporter.probe("flow_out")
    stamps = {}
    subscribed = threading.Event()

    def on_connect(client, userdata, flags, reason, properties):
        client.subscribe(f"{root_in}/#", qos=1)

    def on_subscribe(client, userdata, mid, reasons, properties):
        subscribed.set()

    def on_message(client, userdata, msg):
        got = flow_in.counted(mqtt_property.extract, msg.properties)
        if got is None:
            return
        ctx = got.context
        t_in = flow_in.record(ctx)
        payload = msg.payload.upper()  # the "processing"
        t_out = flow_out.record(ctx)
        props = Properties(PacketTypes.PUBLISH)
        props.UserProperty = ("processed-by", "python")
        mqtt_property.inject(forwarded(ctx), props)
        client.publish(root_out + msg.topic[len(root_in):], payload, qos=1, properties=props)
        stamps[ctx.key] = (t_in, t_out)

    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"py-probe-{uid}",
                         protocol=mqtt.MQTTv5)
    client.on_connect, client.on_subscribe, client.on_message = on_connect, on_subscribe, on_message
    host, port = MQTT.rsplit(":", 1)
    client.connect(host, int(port))
    client.loop_start()
    try:
        assert subscribed.wait(10), "no SUBACK from Mosquitto"
        tap = run_tap_and_publisher(
            tmp_path, collector, f"mqtt://{MQTT}?version=5&qos=1", f"{root_out}/#",
            f"mqtt://{MQTT}/{root_in}?qos=1", publisher=21)
        tap_out = wait_exit(tap, tmp_path / "tap.log", timeout=60)
    finally:
        client.loop_stop()
        client.disconnect()
    summary = exporter.shutdown()
    assert summary.clean and summary.counters.lost() == 0
    assert summary.counters.sent == 2 * MESSAGES
    assert "traced 1000" in tap_out, tap_out
    run = collector.stop()
    check_run(run, read_traces(collector.run_dir), 21, stamps)


def create_topic(name: str) -> None:
    out = subprocess.run([str(ROOT / "infra" / "kafka" / "kafka.sh"), "create-topic", name,
                          "--partitions", "1", "--bootstrap", KAFKA],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]


def test_confluent_kafka_processor_through_kafka(tmp_path):
    require_service(KAFKA, "Kafka")
    from confluent_kafka import Consumer, Producer

    uid = uuid.uuid4().hex[:8]
    topic_in, topic_out = f"python-probe-{uid}-in", f"python-probe-{uid}-out"
    create_topic(topic_in)
    create_topic(topic_out)
    collector = Collector(tmp_path, "py-kafka", write_pipeline(tmp_path / "pipeline.toml", sink=True))
    exporter = Exporter(ExporterConfig(collector.address, "py-kafka-processor"),
                        [(1, "flow_in"), (2, "flow_out")])
    flow_in, flow_out = exporter.probe("flow_in"), exporter.probe("flow_out")
    consumer = Consumer({"bootstrap.servers": KAFKA, "group.id": f"python-probe-{uid}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    producer = Producer({"bootstrap.servers": KAFKA, "linger.ms": 1, "acks": "all"})
    consumer.subscribe([topic_in])
    stamps = {}
    done = threading.Event()
    errors = []

    def process():
        try:
            while not done.is_set() and len(stamps) < MESSAGES:
                msg = consumer.poll(0.2)
                if msg is None:
                    continue
                if msg.error():
                    errors.append(str(msg.error()))
                    continue
                got = flow_in.counted(kafka_header.extract, msg.headers())
                if got is None:
                    continue
                ctx = got.context
                t_in = flow_in.record(ctx)
                value = msg.value()
                t_out = flow_out.record(ctx)
                # Forward the record's headers and append the new context: the tap must
                # take the last `hoptrace` header, this one.
                producer.produce(topic_out, value, key=msg.key(),
                                 headers=kafka_header.inject(forwarded(ctx), msg.headers()))
                producer.poll(0)
                stamps[ctx.key] = (t_in, t_out)
        except Exception as e:  # surfaced by the assertions below
            errors.append(repr(e))

    worker = threading.Thread(target=process)
    worker.start()
    try:
        tap = run_tap_and_publisher(
            tmp_path, collector, f"kafka://{KAFKA}?offset=beginning", topic_out,
            f"kafka://{KAFKA}/{topic_in}", publisher=22)
        tap_out = wait_exit(tap, tmp_path / "tap.log", timeout=90)
    finally:
        done.set()
        worker.join(30)
        assert producer.flush(30) == 0
        consumer.close()
    assert not errors, errors
    summary = exporter.shutdown()
    assert summary.clean and summary.counters.lost() == 0
    assert summary.counters.sent == 2 * MESSAGES
    assert "traced 1000" in tap_out, tap_out
    run = collector.stop()
    check_run(run, read_traces(collector.run_dir), 22, stamps)
