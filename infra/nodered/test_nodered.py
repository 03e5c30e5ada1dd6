"""Integration test of the reference pipeline Mosquitto -> Node-RED -> InfluxDB.

Starts InfluxDB (infra/stores/influxdb.sh) and Node-RED (infra/nodered/nodered.sh) unless they
already run, publishes JSON messages carrying a "hoptrace" field with `mosquitto_pub -V
mqttv5` to the shared Mosquitto (127.0.0.1:11883, infra/services.sh up), and checks that every
one shows up in InfluxDB with that field, printing the time from publish to visible.

Skipped unless HOPTRACE_INTEGRATION=1; with it set, anything that does not start is a failure.
What the test started is stopped again; what already ran is left running.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
STORES = HERE.parent / "stores"
INTEGRATION = os.environ.get("HOPTRACE_INTEGRATION") == "1"

pytestmark = pytest.mark.skipif(
    not INTEGRATION, reason="integration test: set HOPTRACE_INTEGRATION=1"
)

INFLUX = "http://127.0.0.1:18086"
MQTT_HOST, MQTT_PORT = "127.0.0.1", "11883"
# The topic the flow subscribes to by default is hoptrace/nr/in/#.
TOPIC_ROOT = "hoptrace/nr/in"
MEASUREMENT = "nodered"
VISIBLE_TIMEOUT_S = 10.0


def sh(path: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(path), *args], capture_output=True, text=True, timeout=timeout)


def ensure_started(path: Path) -> bool:
    """Starts the service unless it runs; True when this call started it."""
    r = sh(path, "status")
    assert r.returncode in (0, 3), f"{path.name} status: exit {r.returncode}\n{r.stdout}{r.stderr}"
    if r.returncode == 0:
        return False
    r = sh(path, "start")
    assert r.returncode == 0, f"{path.name} start failed:\n{r.stdout}{r.stderr}"
    return True


@pytest.fixture(scope="module")
def pipeline():
    for var in ("HOPTRACE_NR_TOPIC", "HOPTRACE_NR_INFLUX_DB", "HOPTRACE_NR_MEASUREMENT", "HOPTRACE_NR_INFLUXDB"):
        assert var not in os.environ, f"{var} is set; this test runs the flow with its defaults"
    started = []
    try:
        for path in (STORES / "influxdb.sh", HERE / "nodered.sh"):
            if ensure_started(path):
                started.append(path)
        status = sh(HERE / "nodered.sh", "status").stdout
        assert "topic=hoptrace/nr/in/#" in status and "measurement=nodered" in status, (
            f"Node-RED already runs with other settings: {status}")
        yield
    finally:
        for path in reversed(started):
            r = sh(path, "stop")
            assert r.returncode == 0, f"{path.name} stop failed:\n{r.stdout}{r.stderr}"


def influx_query(q: str) -> list[list]:
    url = f"{INFLUX}/query?" + urllib.parse.urlencode({"db": "hoptrace", "q": q})
    with urllib.request.urlopen(url, timeout=5) as resp:
        assert resp.status == 200
        res = json.loads(resp.read())["results"][0]
    # InfluxDB reports a failed statement inside the HTTP 200 answer.
    assert "error" not in res, res
    return res["series"][0]["values"] if "series" in res else []


def publish(topic: str, payload: str, *props: str) -> None:
    args = ["mosquitto_pub", "-V", "mqttv5", "-h", MQTT_HOST, "-p", MQTT_PORT, "-q", "1", "-t", topic, "-m", payload]
    for i in range(0, len(props), 2):
        args += ["-D", "publish", "user-property", props[i], props[i + 1]]
    r = subprocess.run(args, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, f"mosquitto_pub failed (is infra/services.sh up?): {r.stderr}"


def wait_visible(topic: str, key: str) -> tuple[float, list]:
    """Polls until the point with hoptrace == key is there; (time it was first seen, row)."""
    deadline = time.time() + VISIBLE_TIMEOUT_S
    while True:
        rows = influx_query(
            f"SELECT \"hoptrace\", \"value\", \"timestamp_ms\" FROM \"{MEASUREMENT}\" "
            f"WHERE \"topic\" = '{topic}' AND \"hoptrace\" = '{key}'")
        if rows:
            return time.time(), rows
        assert time.time() < deadline, f"{key} not in InfluxDB {VISIBLE_TIMEOUT_S} s after publishing"
        time.sleep(0.002)


def test_messages_reach_influxdb_with_their_hoptrace_field(pipeline):
    run = uuid.uuid4().hex[:10]
    topic = f"{TOPIC_ROOT}/test/{run}"
    delays_ms = []
    for i in range(5):
        key = f"{run}-{i}"
        now_ms = int(time.time() * 1000)
        payload = json.dumps({"timestamp_ms": now_ms, "value": i + 0.25, "hoptrace": key})
        # A user property as a pipeline with hoptrace probes would carry it; the flow ignores it.
        publish(topic, payload, "hoptrace", f"ctx-{key}")
        published = time.time()
        seen, rows = wait_visible(topic, key)
        assert len(rows) == 1, rows
        _, hoptrace, value, timestamp_ms = rows[0]
        assert (hoptrace, value, timestamp_ms) == (key, i + 0.25, now_ms)
        delays_ms.append((seen - published) * 1000)
    print(f"\nMosquitto -> Node-RED -> InfluxDB, publish (mosquitto_pub returned) to visible in /query: "
          f"{', '.join(f'{d:.1f}' for d in delays_ms)} ms (median {statistics.median(delays_ms):.1f} ms, "
          f"polling every ~2 ms)")
    # The trace key is a string FIELD, never a tag (one series per message would follow).
    fields = dict(influx_query(f"SHOW FIELD KEYS FROM \"{MEASUREMENT}\""))
    assert fields.get("hoptrace") == "string"
    tags = [r[0] for r in influx_query(f"SHOW TAG KEYS FROM \"{MEASUREMENT}\"")]
    assert "hoptrace" not in tags and "topic" in tags


def test_bad_message_does_not_stop_the_flow(pipeline):
    run = uuid.uuid4().hex[:10]
    topic = f"{TOPIC_ROOT}/test/{run}"
    publish(topic, "not json")
    publish(topic, json.dumps({"value": 1}))  # no hoptrace field: stored without one
    key = f"{run}-after"
    publish(topic, json.dumps({"value": 2, "hoptrace": key}))
    _, rows = wait_visible(topic, key)
    assert rows[0][2] == 2
    # influxdb-out writes each message with its own HTTP request; they may finish in any order.
    deadline = time.time() + VISIBLE_TIMEOUT_S
    while True:
        count = influx_query(f"SELECT count(\"value\") FROM \"{MEASUREMENT}\" WHERE \"topic\" = '{topic}'")
        if count[0][1] == 2 or time.time() > deadline:
            break
        time.sleep(0.05)
    assert count[0][1] == 2, count


def test_json_batch_becomes_one_point_per_metric(pipeline):
    run = uuid.uuid4().hex[:10]
    topic = f"{TOPIC_ROOT}/test/{run}"
    key = f"{run}-batch"
    publish(topic, json.dumps({"timestamp_ms": 1, "hoptrace": key,
                               "metrics": [{"name": "m0", "value": 1.5}, {"name": "m1", "value": 2.5}]}))
    wait_visible(topic, key)
    time.sleep(0.2)
    # The topic tag first: "hoptrace" is a field, and a field alone makes InfluxDB read the
    # whole measurement, which on a long-lived store takes seconds.
    rows = influx_query(f"SELECT \"value\", \"metric\" FROM \"{MEASUREMENT}\" "
                        f"WHERE \"topic\" = '{topic}' AND \"hoptrace\" = '{key}'")
    assert sorted((r[2], r[1]) for r in rows) == [("m0", 1.5), ("m1", 2.5)]
