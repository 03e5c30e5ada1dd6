#!/usr/bin/env python3
"""Measures the private stores for infra/stores/README.md.

    python3 infra/stores/measure.py [--polls N] [--skip-kafka] [NAME...]

For each store (default: influxdb postgres clickhouse victoriametrics), in a state directory of
its own (HOPTRACE_RUN=/tmp/hoptrace-measure-stores, wiped first; the stores' ports must be
free, so stop the normal instances before): first start on an empty directory and three
restarts (the scripts' own "ready in" figure, which includes their write-and-read check),
memory and CPU after 20 s idle, and the server CPU of N empty incremental polls (default 2000)
with the query a store tap would use, read from /proc/<pid>/stat (utime + stime of the
server's whole process tree; 10 ms ticks) before and after. For ClickHouse also the Kafka
engine's visibility delay through clickhouse-kafka.sql (needs the shared Kafka at
127.0.0.1:19092 and the Python package confluent-kafka); for VictoriaMetrics also how long an
imported sample takes to show in /api/v1/export, for a new and for an existing series. Prints Markdown. Everything it
started is stopped and its state directory removed at the end.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
RUN = "/tmp/hoptrace-measure-stores"
ENV = dict(os.environ, HOPTRACE_RUN=RUN)
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
ROWS = 10_000
PSQL = "/usr/lib/postgresql/15/bin/psql"
PG_URL = "postgresql://hoptrace:hoptrace-test@127.0.0.1:15432/hoptrace"
KAFKA = os.environ.get("HOPTRACE_KAFKA", "127.0.0.1:19092")


def script(name: str, *args: str) -> str:
    r = subprocess.run([str(HERE / f"{name}.sh"), *args], env=ENV, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        sys.exit(f"{name}.sh {' '.join(args)} failed:\n{r.stdout}{r.stderr}")
    return r.stdout


def ready_s(out: str) -> float:
    m = re.search(r"ready in ([0-9.]+)s", out)
    assert m, out
    return float(m.group(1))


def main_pid(name: str) -> int:
    return int(Path(RUN, name, f"{name}.pid").read_text().split()[0])


def tree(pid: int) -> list[int]:
    """pid and all its descendants."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def cpu_s(pid: int) -> float:
    """utime + stime of the process tree, in seconds (exited children are not counted, so
    the tree is read while the same processes live)."""
    total = 0
    for p in tree(pid):
        try:
            f = Path(f"/proc/{p}/stat").read_text()
        except OSError:
            continue
        fields = f[f.rindex(")") + 2:].split()
        total += int(fields[11]) + int(fields[12])
    return total * TICK_S


def memory_mib(pid: int) -> tuple[float, float]:
    """(RSS of the main process, PSS summed over the tree) in MiB."""
    rss = pss = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1])
    for p in tree(pid):
        try:
            for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    pss += int(line.split()[1])
        except OSError:
            pass
    return rss / 1024, pss / 1024


# ---------------------------------------------------------------------------------------------
# Per store: fill with ROWS old rows, then one empty poll (nothing newer than the newest row).


class Http:
    """One keep-alive connection, as a tap would hold."""

    def __init__(self, port: int):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)

    def req(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        self.conn.request(method, path, body=body)
        r = self.conn.getresponse()
        return r.status, r.read()


def influx_setup() -> tuple[str, callable]:
    c = Http(18086)
    now_ns = time.time_ns()
    lines = [f'poll,topic=t{i % 10} hoptrace="k{i}",value={i} {now_ns - (ROWS - i) * 1_000_000}' for i in range(ROWS)]
    st, body = c.req("POST", "/write?db=hoptrace&precision=ns", "\n".join(lines).encode())
    assert st == 204, body
    q = f'SELECT "hoptrace" FROM "poll" WHERE time > {now_ns}'

    def poll():
        st, body = c.req("GET", "/query?" + urllib.parse.urlencode({"db": "hoptrace", "q": q, "epoch": "ns"}))
        res = json.loads(body)["results"][0]
        assert st == 200 and "error" not in res and "series" not in res, body

    return "`GET /query?db=hoptrace&epoch=ns&q=SELECT \"hoptrace\" FROM \"poll\" WHERE time > <last ns>`", poll


def clickhouse_setup() -> tuple[str, callable]:
    c = Http(18123)
    st, body = c.req("POST", "/", b"CREATE TABLE IF NOT EXISTS hoptrace.poll (hoptrace String, value Float64, "
                                  b"inserted DateTime) ENGINE = MergeTree PARTITION BY toDate(inserted) ORDER BY (inserted, hoptrace)")
    assert st == 200, body
    now_s = int(time.time())
    rows = "\n".join(f'{{"hoptrace":"k{i}","value":{i},"inserted":{now_s - 100 - (ROWS - i) // 100}}}' for i in range(ROWS))
    st, body = c.req("POST", "/?query=" + urllib.parse.quote("INSERT INTO hoptrace.poll FORMAT JSONEachRow"), rows.encode())
    assert st == 200, body
    q = f"SELECT hoptrace, inserted FROM hoptrace.poll WHERE inserted >= toDateTime({now_s}) FORMAT JSONCompact"

    def poll():
        st, body = c.req("POST", "/", q.encode())
        assert st == 200 and json.loads(body)["rows"] == 0, body

    return ("`POST / SELECT hoptrace, inserted FROM hoptrace.poll WHERE inserted >= toDateTime(<last s>) "
            "FORMAT JSONCompact`"), poll


def victoriametrics_setup() -> tuple[str, callable]:
    c = Http(18428)
    now_ms = int(time.time() * 1000)
    lines = [json.dumps({"metric": {"__name__": "poll", "topic": f"t{s}"},
                         "values": [float(i) for i in range(ROWS // 10)],
                         "timestamps": [now_ms - 60_000 - (ROWS // 10 - i) * 100 for i in range(ROWS // 10)]})
             for s in range(10)]
    st, body = c.req("POST", "/api/v1/import", "\n".join(lines).encode())
    assert st == 204, body
    c.req("GET", "/internal/force_flush")
    start = (now_ms - 30_000) / 1000

    def poll():
        path = "/api/v1/export?" + urllib.parse.urlencode({"match[]": 'poll{topic!=""}', "start": f"{start:.3f}"})
        st, body = c.req("GET", path)
        assert st == 200 and body.strip() == b"", body

    return "`GET /api/v1/export?match[]=poll{topic!=\"\"}&start=<last s>`", poll


def victoriametrics_visibility(n: int = 5) -> list[str]:
    """Import one sample, poll /api/v1/export (every 50 ms) until it is returned: for a series
    new to the index, and for a series that already exists."""
    c = Http(18428)
    out = []
    for label, fixed in (("new series (a label value never seen)", False), ("existing series", True)):
        delays = []
        for i in range(n + (1 if fixed else 0)):
            series = "vis_fixed" if fixed else f"vis_{time.time_ns()}"
            t0 = time.time()
            ts = int(t0 * 1000)
            body = json.dumps({"metric": {"__name__": "vis", "s": series}, "values": [i], "timestamps": [ts]})
            st, _ = c.req("POST", "/api/v1/import", body.encode())
            assert st == 204
            path = "/api/v1/export?" + urllib.parse.urlencode({"match[]": f'vis{{s="{series}"}}', "start": int(t0) - 5})
            while str(ts).encode() not in c.req("GET", path)[1]:
                assert time.time() - t0 < 60, "sample not visible after 60 s"
                time.sleep(0.05)
            if fixed and i == 0:
                continue  # the first sample creates the series
            delays.append((time.time() - t0) * 1000)
            time.sleep(0.3)
        out.append(f"| {label} | {n} | {min(delays):.0f} | {statistics.median(delays):.0f} | {max(delays):.0f} |")
    return out


def victoriametrics_query_setup() -> tuple[str, callable]:
    c = Http(18428)

    def poll():
        path = "/api/v1/query?" + urllib.parse.urlencode(
            {"query": 'last_over_time(poll{topic!=""}[2s])', "nocache": "1", "time": f"{time.time():.3f}"})
        st, body = c.req("GET", path)
        res = json.loads(body)
        assert st == 200 and res["status"] == "success" and res["data"]["result"] == [], body

    return "`GET /api/v1/query?query=last_over_time(poll{topic!=\"\"}[2s])&nocache=1&time=<now>`", poll


def postgres_polls(n: int, pid: int) -> tuple[str, float, list[float]]:
    """Postgres through one psql session (one backend, as a tap's one connection)."""
    setup = ("CREATE TABLE IF NOT EXISTS poll (hoptrace text NOT NULL, value double precision, "
             "at timestamptz NOT NULL DEFAULT clock_timestamp());"
             "CREATE INDEX IF NOT EXISTS poll_at ON poll (at);"
             f"INSERT INTO poll (hoptrace, value, at) SELECT 'k' || i, i, now() - interval '1 hour' + i * interval '1 ms' "
             f"FROM generate_series(1, {ROWS}) i; ANALYZE poll;")
    r = subprocess.run([PSQL, "-X", "-q", "-v", "ON_ERROR_STOP=1", PG_URL, "-c", setup], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    last = "now()"
    q = f"SELECT hoptrace, at FROM poll WHERE at > {last} ORDER BY at;"
    script_text = "\\timing on\n" + (q + "\n") * n
    p = subprocess.Popen([PSQL, "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", PG_URL], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # The backend exists once connected; its CPU is read while it lives.
    p.stdin.write("SELECT 1;\n")
    p.stdin.flush()
    assert p.stdout.readline().strip() == "1"
    c0 = cpu_s(pid)
    p.stdin.write(script_text + "SELECT 'done';\n")
    p.stdin.flush()
    lat = []
    while True:
        line = p.stdout.readline()
        if not line:
            break
        m = re.match(r"Time: ([0-9.]+) ms", line)
        if m:
            lat.append(float(m.group(1)))
        elif line.strip() == "done":
            break
    c1 = cpu_s(pid)
    p.stdin.close()
    p.wait()
    assert len(lat) >= n, (len(lat), p.stderr.read())
    return ("`SELECT hoptrace, at FROM poll WHERE at > $last ORDER BY at` (index on at), one session",
            (c1 - c0) / n * 1000, lat[:n])


def http_polls(pid: int, poll, n: int) -> tuple[float, list[float]]:
    for _ in range(20):
        poll()  # warm up the connection and caches
    lat = []
    c0 = cpu_s(pid)
    for _ in range(n):
        t = time.perf_counter()
        poll()
        lat.append((time.perf_counter() - t) * 1000)
    c1 = cpu_s(pid)
    return (c1 - c0) / n * 1000, lat


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


# ---------------------------------------------------------------------------------------------
# ClickHouse Kafka engine visibility


def kafka_visibility(max_block: str) -> list[str]:
    from confluent_kafka import Producer  # noqa: PLC0415 (only this part needs it)

    topic = f"stores-clickhouse-measure-{max_block}"
    r = subprocess.run([str(ROOT / "infra/kafka/kafka.sh"), "create-topic", topic, "--partitions", "1",
                        "--bootstrap", KAFKA], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    ENV["HOPTRACE_CH_KAFKA_MAX_BLOCK"] = max_block
    script("clickhouse", "kafka-pipeline", topic, f"measure-{int(time.time())}")
    table = "hoptrace." + topic.replace("-", "_")
    c = Http(18123)
    producer = Producer({"bootstrap.servers": KAFKA, "linger.ms": 0, "acks": "all"})
    producer.produce(topic, b'{"hoptrace":"warmup","value":0}')
    producer.flush(10)
    time.sleep(3)
    out = []
    for label, n, gap in (("one message every 1.5 s", 15, 1.5), ("20 msg/s for 10 s", 200, 0.05),
                          ("200 msg/s for 10 s", 2000, 0.005)):
        run = f"r{time.time_ns()}"
        sent: dict[str, float] = {}
        seen: dict[str, float] = {}

        def produce():
            t_next = time.time()
            for i in range(n):
                k = f"{run}-{i}"
                sent[k] = time.time()
                producer.produce(topic, json.dumps({"hoptrace": k, "value": i}).encode())
                producer.poll(0)
                t_next += gap
                time.sleep(max(0.0, t_next - time.time()))
            producer.flush(10)

        th = threading.Thread(target=produce)
        th.start()
        deadline = time.time() + n * gap + 60
        polls = 0
        while len(seen) < n and time.time() < deadline:
            st, body = c.req("POST", "/", f"SELECT hoptrace FROM {table} WHERE hoptrace LIKE '{run}-%'".encode())
            now = time.time()
            polls += 1
            assert st == 200, body
            for k in body.decode().split():
                seen.setdefault(k, now)
            time.sleep(0.01)
        th.join()
        d = [(seen[k] - sent[k]) * 1000 for k in seen]
        batches = len({round(v, 3) for v in seen.values()})
        out.append(f"| {max_block} | {label} | {len(seen)}/{n} | {min(d):.0f} | {statistics.median(d):.0f} | {pct(d, 0.99):.0f} | "
                   f"{max(d):.0f} | {batches} |")
    # One Kafka table at a time: each streams on a thread of the small background pool.
    for suffix in ("_mv", "_queue", ""):
        c.req("POST", "/", f"DROP TABLE IF EXISTS {table}{suffix}".encode())
    return out


# ---------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--polls", type=int, default=2000)
    ap.add_argument("--skip-kafka", action="store_true")
    ap.add_argument("--kafka-max-block", default="1,16,65536",
                    help="kafka_max_block_size values to measure, comma-separated")
    ap.add_argument("names", nargs="*", default=["influxdb", "postgres", "clickhouse", "victoriametrics"])
    args = ap.parse_args()
    shutil.rmtree(RUN, ignore_errors=True)
    print(f"Machine: {os.cpu_count()} cores ({Path('/proc/cpuinfo').read_text().split('model name')[1].split(':')[1].splitlines()[0].strip()}), "
          f"kernel {os.uname().release}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; polls per store: {args.polls}\n")
    starts, idle, polls, kafka, vis = [], [], [], [], []
    try:
        for name in args.names:
            first = ready_s(script(name, "start"))
            restarts = []
            for _ in range(3):
                script(name, "stop")
                restarts.append(ready_s(script(name, "start")))
            starts.append(f"| {name} | {first:.2f} | {statistics.median(restarts):.2f} ({', '.join(f'{x:.2f}' for x in restarts)}) |")
            pid = main_pid(name)
            time.sleep(5)
            c0 = cpu_s(pid)
            time.sleep(20)
            c1 = cpu_s(pid)
            rss, pss = memory_mib(pid)
            idle.append(f"| {name} | {rss:.0f} | {pss:.0f} | {(c1 - c0) / 20 * 100:.2f} |")
            setups = {"influxdb": [influx_setup], "clickhouse": [clickhouse_setup],
                      "victoriametrics": [victoriametrics_setup, victoriametrics_query_setup]}.get(name, [])
            if name == "postgres":
                q, cpu_ms, lat = postgres_polls(args.polls, pid)
                polls.append(f"| {name} | {q} | {cpu_ms:.3f} | {statistics.median(lat):.2f} | {pct(lat, 0.99):.2f} |")
            for setup in setups:
                q, poll = setup()
                cpu_ms, lat = http_polls(pid, poll, args.polls)
                polls.append(f"| {name} | {q} | {cpu_ms:.3f} | {statistics.median(lat):.2f} | {pct(lat, 0.99):.2f} |")
            if name == "victoriametrics":
                vis = victoriametrics_visibility()
            if name == "clickhouse" and not args.skip_kafka:
                for b in args.kafka_max_block.split(","):
                    kafka += kafka_visibility(b)
    finally:
        for name in args.names:
            subprocess.run([str(HERE / f"{name}.sh"), "stop"], env=ENV, capture_output=True, timeout=120)
        shutil.rmtree(RUN, ignore_errors=True)
    print("Start (s, from the script's \"ready in\", which includes its write-and-read check):\n")
    print("| store | first start (empty dir) | restart, median (3 runs) |\n| --- | --- | --- |")
    print("\n".join(starts))
    print("\nIdle, 5 s after the third start, CPU over the next 20 s:\n")
    print("| store | RSS main process (MiB) | PSS process tree (MiB) | idle CPU (% of a core) |\n| --- | --- | --- | --- |")
    print("\n".join(idle))
    print(f"\nEmpty incremental poll ({ROWS} older rows in the table), {args.polls} polls back to back on one connection:\n")
    print("| store | query | server CPU per poll (ms) | client latency p50 (ms) | p99 (ms) |\n| --- | --- | --- | --- | --- |")
    print("\n".join(polls))
    if vis:
        print("\nVictoriaMetrics, /api/v1/import of one sample to the first /api/v1/export (polled every 50 ms) that returns it:\n")
        print("| series | samples | min (ms) | median | max |\n| --- | --- | --- | --- | --- |")
        print("\n".join(vis))
    if kafka:
        print("\nKafka -> ClickHouse (clickhouse-kafka.sql), produce (confluent-kafka, acks=all) to first poll (every 10 ms) that sees the row:\n")
        print("| kafka_max_block_size | load | rows seen | min (ms) | p50 | p99 | max | distinct visibility instants |\n"
              "| --- | --- | --- | --- | --- | --- | --- | --- |")
        print("\n".join(kafka))


if __name__ == "__main__":
    main()
