"""A Kafka pipeline traced by OpenTelemetry, with no hoptrace code in the consumer:
`hoptrace publish --traceparent` -> Kafka (single node) -> a confluent-kafka consumer
under `opentelemetry-instrument` (OpenTelemetry's Python auto-instrumentation and its
confluent-kafka instrumentation, from PyPI: infra/otel/python.sh), which exports its spans
over OTLP/HTTP protobuf to `hoptrace collect --otlp`.

The instrumentation makes a "<topic> process" span per poll (or per consume() batch)
that links to each record's traceparent, from the poll's return to the next poll: the
pipeline's `consume` and `consumed` hops are its start and end.

Checked: every message published is complete (publish, consume, consumed) and the
accounting adds up; every span is accounted for (the instrumentation's "recv" spans match
no hop); the OTLP sender is a probe of the run; pyarrow reads every row's trace id as
the documented layout of its key; the report says the span host's clock is unknown.

Needs Kafka (HOPTRACE_KAFKA), HOPTRACE_BIN and PyPI (the first run installs the packages).
"""

import json
import os
import re
import subprocess
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from procs import start, stop

ROOT = Path(__file__).resolve().parents[2]
KAFKA_SH = ROOT / "infra" / "kafka" / "kafka.sh"
MESSAGES = 600

PIPELINE = """
name = "kafka-python-otel"
[[hops]]
name = "publish"
[[hops]]
name = "consume"
span = { service = "orders-consumer", kind = "consumer", name = "* process" }
[[hops]]
name = "consumed"
span = { service = "orders-consumer", kind = "consumer", name = "* process", stamp = "end" }
[[stages]]
name = "Broker Time"
from = "publish"
to = "consume"
definition = "Publish to the start of the consumer's process span."
[[stages]]
name = "Processing"
from = "consume"
to = "consumed"
definition = "The consumer's process span."
[[stages]]
name = "End to End"
from = "publish"
to = "consumed"
definition = "Publish to the end of the process span."
headline = true
"""


def needs():
    binary, kafka = os.environ.get("HOPTRACE_BIN"), os.environ.get("HOPTRACE_KAFKA")
    if not binary or not kafka:
        if os.environ.get("HOPTRACE_INTEGRATION") == "1":
            pytest.fail("HOPTRACE_BIN and HOPTRACE_KAFKA must be set (infra/test.sh sets them)")
        pytest.skip("HOPTRACE_BIN or HOPTRACE_KAFKA not set")
    return binary, kafka


def wait_for_line(log: Path, pattern: str, p, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        m = re.search(pattern, log.read_text())
        if m:
            return m
        if p.poll() is not None:
            break
        time.sleep(0.1)
    pytest.fail(f"no {pattern!r} in {log}: {log.read_text()[-2000:]}")


@pytest.mark.parametrize("mode", ["poll", "batch"])
def test_spans_of_an_instrumented_consumer_stamp_every_message(tmp_path, mode):
    binary, kafka = needs()
    bin_dir = Path(subprocess.run([str(ROOT / "infra" / "otel" / "python.sh")], check=True,
                                  capture_output=True, text=True).stdout.strip())
    topic = f"otel-{mode}-{uuid.uuid4().hex[:8]}"
    subprocess.run([str(KAFKA_SH), "create-topic", topic], check=True, capture_output=True)
    spec = tmp_path / "pipeline.toml"
    spec.write_text(PIPELINE)
    runs = tmp_path / "runs"

    clog = tmp_path / "collect.log"
    collector = start([binary, "collect", "--pipeline", spec, "--listen", "127.0.0.1:0",
                       "--otlp", "127.0.0.1:0", "--runs", runs, "--run-id", "otel"], clog)
    try:
        listen = wait_for_line(clog, r"collecting on (\S+)", collector).group(1)
        otlp = wait_for_line(clog, r"OTLP/HTTP spans at (http://\S+/v1/traces)", collector).group(1)
        env = dict(os.environ,
                   OTEL_SERVICE_NAME="orders-consumer",
                   OTEL_TRACES_EXPORTER="otlp",
                   OTEL_METRICS_EXPORTER="none",
                   OTEL_LOGS_EXPORTER="none",
                   OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="http/protobuf",
                   OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=otlp,
                   OTEL_BSP_SCHEDULE_DELAY="200")
        consumer = subprocess.Popen(
            [str(bin_dir / "opentelemetry-instrument"), str(bin_dir / "python"),
             str(ROOT / "infra" / "otel" / "consumer.py"), kafka, topic, f"g-{topic}",
             str(MESSAGES), "90", mode],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert consumer.stdout.readline().strip() == "subscribed"
        pub = subprocess.run(
            [binary, "publish", "--to", f"kafka://{kafka}/{topic}", "--traceparent",
             "--rate", "300", "--messages", str(MESSAGES), "--streams", "20",
             "--collector", listen, "--pipeline", spec],
            capture_output=True, text=True, timeout=120)
        assert pub.returncode == 0, pub.stderr[-2000:]
        out, _ = consumer.communicate(timeout=120)
        assert f"consumed {MESSAGES}" in out, out[-2000:]
    finally:
        stop(collector)

    run = json.loads((runs / "otel" / "run.json").read_text())
    acc = run["accounting"]
    assert acc["adds_up"], acc["discrepancies"]
    (p,) = acc["publishers"]
    assert (p["sent"], p["complete"], p["incomplete"]) == (MESSAGES, MESSAGES, 0)
    o = run["otlp"]
    assert o["spans_stamped"] + o["spans_unmatched"] == o["spans"], o
    assert o["stamps"] == 2 * MESSAGES, o
    assert o["spans_no_message"] == o["spans_bad_trace_id"] == o["spans_end_before_start"] == 0, o
    assert o["accepted"] == o["requests"] and o["throttled"] == 0, o
    if mode == "poll":
        assert o["spans_stamped"] == MESSAGES, o
    else:
        assert o["spans_stamped"] < MESSAGES, o
    senders = [pr for pr in run["probes"] if pr["software"].startswith("OTLP opentelemetry python")]
    assert len(senders) == 1 and senders[0]["process"] == "orders-consumer", run["probes"]

    t = pq.read_table(runs / "otel" / "traces", columns=[
        "publisher", "stream", "sequence", "otel_trace_id", "consume_ns", "consumed_ns"])
    for col in ("consume_ns", "consumed_ns"):
        t = t.set_column(t.schema.get_field_index(col), col, t[col].cast(pa.int64()))
    table = t.to_pydict()
    assert len(table["sequence"]) == MESSAGES
    for i in range(MESSAGES):
        tid = table["otel_trace_id"][i]
        assert tid[:2] == b"ht", tid
        assert int.from_bytes(tid[2:4], "little") == table["publisher"][i]
        assert int.from_bytes(tid[4:8], "little") == table["stream"][i]
        assert int.from_bytes(tid[8:16], "little") == table["sequence"][i]
        assert table["consume_ns"][i] is not None and table["consumed_ns"][i] >= table["consume_ns"][i]

    rep = subprocess.run([binary, "report", str(runs / "otel")], capture_output=True, text=True,
                         timeout=120)
    assert rep.returncode == 0, rep.stderr[-2000:]
    broker = next(line for line in rep.stdout.splitlines() if line.strip().startswith("Broker Time"))
    assert "clock ±unknown" in broker, rep.stdout
