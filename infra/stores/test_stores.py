"""Integration tests of the private stores started by infra/stores/*.sh.

For each store: start (the script's own readiness check writes and reads), write a row and
read it back through the store's query API, status, stop, status, start again and find the
row still there. The error format a store tap has to recognise is checked too, and the Kafka
-> ClickHouse pipeline of clickhouse-kafka.sql is run end to end.

Skipped unless HOPTRACE_INTEGRATION=1; with it set, a store that does not start is a
failure. A store that was already running is left running; one the test started is stopped.
The Kafka test needs the shared single-node Kafka (infra/services.sh up).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
INTEGRATION = os.environ.get("HOPTRACE_INTEGRATION") == "1"

pytestmark = pytest.mark.skipif(
    not INTEGRATION, reason="integration test: set HOPTRACE_INTEGRATION=1"
)

INFLUX = "http://127.0.0.1:18086"
CLICKHOUSE = "http://127.0.0.1:18123"
VICTORIA = "http://127.0.0.1:18428"
PG_URL = "postgresql://hoptrace:hoptrace-test@127.0.0.1:15432/hoptrace"
PSQL = "/usr/lib/postgresql/15/bin/psql"
KAFKA = os.environ.get("HOPTRACE_KAFKA", "127.0.0.1:19092")


def script(name: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(HERE / f"{name}.sh"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_ok(name: str, *args: str) -> str:
    r = script(name, *args)
    assert r.returncode == 0, f"{name}.sh {' '.join(args)} failed ({r.returncode}):\n{r.stdout}{r.stderr}"
    return r.stdout


def is_running(name: str) -> bool:
    r = script(name, "status")
    assert r.returncode in (0, 3), f"{name}.sh status: exit {r.returncode}\n{r.stdout}{r.stderr}"
    return r.returncode == 0


def http(method: str, url: str, body: bytes | None = None, timeout: float = 10) -> tuple[int, str]:
    """(status, body); a non-2xx answer is returned, not raised."""
    req = urllib.request.Request(url, data=body, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def uid() -> str:
    return uuid.uuid4().hex[:12]


@pytest.fixture
def store(request):
    """Starts the store named by the test's parameter; stops it afterwards unless it was
    already running before."""
    name = request.param
    was_running = is_running(name)
    run_ok(name, "start")
    yield name
    if was_running:
        run_ok(name, "start")
    else:
        run_ok(name, "stop")


def lifecycle(name: str, write, read) -> None:
    """write(); read() sees it; status; stop; status says stopped; start; read() again."""
    token = write()
    assert read(token), f"{name}: the row just written is not readable"
    out = run_ok(name, "status")
    assert "running" in out
    run_ok(name, "stop")
    r = script(name, "status")
    assert r.returncode == 3, f"{name}.sh status after stop: exit {r.returncode}\n{r.stdout}"
    assert "stopped" in r.stdout
    out = run_ok(name, "start")
    assert "ready in" in out
    assert read(token), f"{name}: the row written before the restart is gone"


# ---------------------------------------------------------------------------------------------
# InfluxDB


def influx_query(q: str, db: str = "hoptrace") -> dict:
    status, body = http("POST", f"{INFLUX}/query?" + urllib.parse.urlencode({"db": db, "q": q}))
    assert status == 200, f"InfluxDB /query: HTTP {status} {body}"
    return json.loads(body)


@pytest.mark.parametrize("store", ["influxdb"], indirect=True)
def test_influxdb_write_read_restart(store):
    measurement = f"t_{uid()}"

    def write():
        token = f"k-{uid()}"
        status, body = http(
            "POST",
            f"{INFLUX}/write?db=hoptrace&precision=ns",
            f'{measurement},topic=a hoptrace="{token}",value=1.5'.encode(),
        )
        assert status == 204, f"InfluxDB /write: HTTP {status} {body}"
        return token

    def read(token):
        res = influx_query(f"SELECT \"hoptrace\", \"value\" FROM \"{measurement}\" WHERE \"hoptrace\" = '{token}'")
        r = res["results"][0]
        assert "error" not in r, r
        rows = r.get("series", [{}])[0].get("values", [])
        return len(rows) == 1 and rows[0][1] == token and rows[0][2] == 1.5

    lifecycle("influxdb", write, read)
    assert script("influxdb", "url").stdout.strip() == INFLUX


@pytest.mark.parametrize("store", ["influxdb"], indirect=True)
def test_influxdb_reports_statement_errors_inside_http_200(store):
    # A tap must look inside the body: the status says nothing about a failed statement.
    status, body = http("POST", f"{INFLUX}/query?" + urllib.parse.urlencode({"db": "no_such_db", "q": "SELECT * FROM m"}))
    assert status == 200
    assert json.loads(body)["results"][0]["error"] == "database not found: no_such_db"
    # A parse error, e.g. the reserved word "key" unquoted, is an HTTP 400 with a top-level error.
    status, body = http("POST", f"{INFLUX}/query?" + urllib.parse.urlencode({"db": "hoptrace", "q": "SELECT key FROM m"}))
    assert status == 400
    assert "error parsing query" in json.loads(body)["error"]


# ---------------------------------------------------------------------------------------------
# PostgreSQL


def psql(*sql: str, check: bool = True) -> subprocess.CompletedProcess:
    args = [PSQL, "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", PG_URL]
    for s in sql:
        args += ["-c", s]
    r = subprocess.run(args, capture_output=True, text=True, timeout=30)
    if check:
        assert r.returncode == 0, f"psql failed: {r.stderr}"
    return r


@pytest.mark.parametrize("store", ["postgres"], indirect=True)
def test_postgres_write_read_restart(store):
    table = f"t_{uid()}"
    psql(f"CREATE TABLE {table} (hoptrace text NOT NULL, value double precision, at timestamptz NOT NULL DEFAULT clock_timestamp())")

    def write():
        token = f"k-{uid()}"
        psql(f"INSERT INTO {table} (hoptrace, value) VALUES ('{token}', 1.5)")
        return token

    def read(token):
        out = psql(f"SELECT hoptrace, value FROM {table} WHERE hoptrace = '{token}'").stdout.strip()
        return out == f"{token}|1.5"

    lifecycle("postgres", write, read)
    assert script("postgres", "url").stdout.strip() == PG_URL
    r = psql("SELECT * FROM no_such_table", check=False)
    assert r.returncode != 0 and 'relation "no_such_table" does not exist' in r.stderr


# ---------------------------------------------------------------------------------------------
# ClickHouse


def ch(sql: str) -> tuple[int, str]:
    return http("POST", f"{CLICKHOUSE}/", sql.encode())


def ch_ok(sql: str) -> str:
    status, body = ch(sql)
    assert status == 200, f"ClickHouse: HTTP {status} {body}"
    return body


@pytest.mark.parametrize("store", ["clickhouse"], indirect=True)
def test_clickhouse_write_read_restart(store):
    table = f"hoptrace.t_{uid()}"
    ch_ok(f"CREATE TABLE {table} (hoptrace String, value Float64, inserted DateTime DEFAULT now()) ENGINE = MergeTree ORDER BY inserted")

    def write():
        token = f"k-{uid()}"
        ch_ok(f"INSERT INTO {table} (hoptrace, value) VALUES ('{token}', 1.5)")
        return token

    def read(token):
        return ch_ok(f"SELECT hoptrace, value FROM {table} WHERE hoptrace = '{token}'").strip() == f"{token}\t1.5"

    lifecycle("clickhouse", write, read)
    assert script("clickhouse", "url").stdout.strip() == CLICKHOUSE
    # Errors: a non-2xx status and "Code: N, e.displayText() = ..." in the body.
    status, body = ch("SELECT * FROM hoptrace.no_such_table")
    assert status != 200 and body.startswith("Code: 60,"), (status, body)
    # FORMAT JSON carries the server's own query duration.
    stats = json.loads(ch_ok(f"SELECT count() FROM {table} FORMAT JSON"))["statistics"]
    assert stats["elapsed"] >= 0


def produce(topic: str, lines: list[str]) -> None:
    r = subprocess.run(
        [str(ROOT / "infra/kafka/kafka.sh"), "run", "kafka.tools.ConsoleProducer",
         "--bootstrap-server", KAFKA, "--topic", topic],
        input="".join(line + "\n" for line in lines),
        capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, f"ConsoleProducer failed: {r.stderr}"


@pytest.mark.parametrize("store", ["clickhouse"], indirect=True)
def test_clickhouse_consumes_kafka_through_materialized_view(store):
    topic = "stores-clickhouse-test"
    r = subprocess.run(
        [str(ROOT / "infra/kafka/kafka.sh"), "create-topic", topic, "--partitions", "1", "--bootstrap", KAFKA],
        capture_output=True, text=True, timeout=180,
    )
    assert r.returncode == 0, f"creating Kafka topic {topic} at {KAFKA} failed (is infra/services.sh up?):\n{r.stdout}{r.stderr}"
    run_ok("clickhouse", "kafka-pipeline", topic)
    table = "hoptrace." + topic.replace("-", "_")
    run = uid()
    keys = [f"{run}-{i}" for i in range(5)]
    sent = time.time()
    produce(topic, [json.dumps({"hoptrace": k, "value": i, "extra": "skipped"}) for i, k in enumerate(keys)])
    produced = time.time()
    deadline = produced + 60
    seen = []
    while time.time() < deadline:
        seen = ch_ok(f"SELECT hoptrace FROM {table} WHERE hoptrace LIKE '{run}-%' ORDER BY hoptrace").split()
        if len(seen) == len(keys):
            break
        time.sleep(0.05)
    visible = time.time()
    assert seen == keys, f"after 60 s {table} has {seen}, expected {keys}"
    print(f"\nKafka -> ClickHouse: {len(keys)} rows visible {visible - produced:.2f} s after the producer "
          f"exited ({visible - sent:.2f} s after it started)")


# ---------------------------------------------------------------------------------------------
# VictoriaMetrics


@pytest.mark.parametrize("store", ["victoriametrics"], indirect=True)
def test_victoriametrics_write_read_restart(store):
    series = f"hoptrace_test_{uid()}"
    ts_ms = int(time.time() * 1000)

    def write():
        line = {"metric": {"__name__": series, "hoptrace": "k1"}, "values": [1.5], "timestamps": [ts_ms]}
        status, body = http("POST", f"{VICTORIA}/api/v1/import", json.dumps(line).encode())
        assert status == 204, f"VictoriaMetrics /api/v1/import: HTTP {status} {body}"
        return series

    def export():
        status, body = http("GET", f"{VICTORIA}/api/v1/export?" + urllib.parse.urlencode({"match[]": series}))
        assert status == 200, f"VictoriaMetrics /api/v1/export: HTTP {status} {body}"
        return [json.loads(line) for line in body.splitlines() if line.strip()]

    def read(_):
        # A new series becomes searchable after up to ~10 s (see README.md).
        deadline = time.time() + 30
        while time.time() < deadline:
            rows = export()
            if rows:
                return rows[0]["values"] == [1.5] and rows[0]["timestamps"] == [ts_ms]
            time.sleep(0.2)
        return False

    lifecycle("victoriametrics", write, read)
    assert script("victoriametrics", "url").stdout.strip() == VICTORIA
    # The instant query a tap would use: nocache=1, and with -search.latencyOffset=1s a sample
    # one second old is returned.
    q = urllib.parse.urlencode({"query": series, "nocache": "1", "time": f"{ts_ms / 1000 + 2:.3f}"})
    status, body = http("GET", f"{VICTORIA}/api/v1/query?{q}")
    res = json.loads(body)
    assert status == 200 and res["status"] == "success", body
    assert [r["value"][1] for r in res["data"]["result"]] == ["1.5"]
    # Errors: HTTP 4xx with {"status":"error","errorType":...,"error":...}.
    status, body = http("GET", f"{VICTORIA}/api/v1/query?" + urllib.parse.urlencode({"query": "sum(("}))
    assert status == 422 and json.loads(body)["status"] == "error", (status, body)


def test_stores_sh_rejects_unknown_names():
    r = subprocess.run([str(HERE / "stores.sh"), "up", "no-such-store"], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "unknown store 'no-such-store'" in r.stderr
