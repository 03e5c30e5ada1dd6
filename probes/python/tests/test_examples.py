"""The README's examples (examples/*.py) run as they are, against the real collector,
Mosquitto and Kafka (HOPTRACE_INTEGRATION=1): a Python publisher and processor through
Mosquitto, and `hoptrace publish` into Kafka read by the Python consumer. Every message
sent must be complete in the run."""

import os
import subprocess
import sys
import uuid
from pathlib import Path

from hoptrace_run import Collector, hoptrace_bin, start, stop, write_pipeline
from test_pipelines import KAFKA, MQTT, create_topic, require_service

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
PY = Path(__file__).resolve().parents[1]
N = 300


def example(name, *args):
    return [sys.executable, str(EXAMPLES / name), *map(str, args)]


def env():
    return dict(os.environ, PYTHONPATH=str(PY))


def check_complete(run, publisher):
    acc = run["accounting"]
    (p,) = acc["publishers"]
    assert (p["publisher"], p["sent"], p["complete"], p["incomplete"], p["unseen"]) == \
        (publisher, N, N, 0, 0), acc
    assert acc["adds_up"] is True and acc["records_lost_by_probes"] == 0
    assert acc["records_by_hop"] == {"publish": N, "flow_in": N, "flow_out": N}
    assert all(pr["clean_close"] for pr in run["probes"])


def test_mqtt_publisher_and_processor_examples(tmp_path):
    require_service(MQTT, "Mosquitto")
    uid = uuid.uuid4().hex[:8]
    collector = Collector(tmp_path, "py-examples-mqtt", write_pipeline(tmp_path / "p.toml"))
    processor = start(example("mqtt_processor.py", "--collector", collector.address,
                              "--broker", MQTT, "--source", f"python-probe/{uid}/plant/#",
                              "--target", f"python-probe/{uid}/done", "--messages", N,
                              "--timeout-s", 60), tmp_path / "processor.log", env=env())
    try:
        assert processor.stdout.readline().strip() == "subscribed", \
            (tmp_path / "processor.log").read_text()
        out = subprocess.run(example("mqtt_publisher.py", "--collector", collector.address,
                                     "--broker", MQTT, "--topic", f"python-probe/{uid}/plant/l1",
                                     "--publisher-id", 31, "--messages", N, "--rate", 300),
                             capture_output=True, text=True, timeout=60, env=env())
        assert out.returncode == 0 and "clean True" in out.stdout, (out.stdout, out.stderr)
        rest, _ = processor.communicate(timeout=60)
        assert processor.returncode == 0 and f"processed {N};" in rest, rest
    finally:
        stop(processor)
    check_complete(collector.stop(), 31)


def test_kafka_consumer_example(tmp_path):
    require_service(KAFKA, "Kafka")
    topic = f"python-probe-{uuid.uuid4().hex[:8]}-example"
    create_topic(topic)
    collector = Collector(tmp_path, "py-examples-kafka", write_pipeline(tmp_path / "p.toml"))
    consumer = start(example("kafka_consumer.py", "--collector", collector.address,
                             "--bootstrap", KAFKA, "--topic", topic, "--group", topic,
                             "--messages", N, "--timeout-s", 90), tmp_path / "consumer.log",
                     env=env())
    try:
        pub = subprocess.run([hoptrace_bin(), "publish", "--to", f"kafka://{KAFKA}/{topic}",
                              "--messages", str(N), "--rate", "300", "--duration", "60s",
                              "--publisher-id", "32", "--collector", collector.address,
                              "--pipeline", str(collector.pipeline)],
                             capture_output=True, text=True, timeout=120)
        assert pub.returncode == 0, pub.stderr[-3000:]
        out, _ = consumer.communicate(timeout=90)
        assert consumer.returncode == 0 and f"processed {N};" in out, \
            (out, (tmp_path / "consumer.log").read_text())
    finally:
        stop(consumer)
    check_complete(collector.stop(), 32)
