"""What a store tap costs the store, against how narrow it makes the bounds of a polled hop.

For each store and each tap setting (`--poll-interval` and `--pollers`, or `off`: no store
tap at all), one run of a real pipeline at a fixed rate:

- InfluxDB: hoptrace publish (MQTT v5, context in the JSON payload) -> Mosquitto ->
  Node-RED's plain flow (infra/nodered, no hoptrace code) -> InfluxDB 1.x, measurement
  `nodered`, which keeps the points of every earlier run (a store with history);
- PostgreSQL: hoptrace publish -> Mosquitto -> `mosquitto_sub | psql` (each message's
  topic and `hoptrace` field inserted as a row, autocommit) -> table `bench_mqtt_pg`, which
  keeps the rows of every earlier run;
- ClickHouse: hoptrace publish -> Mosquitto -> `mosquitto_sub` and one HTTP `INSERT ...
  FORMAT TabSeparated` per 100 ms of messages (ClickHouse makes a part of every insert and
  wants them batched) -> MergeTree table `hoptrace.bench_mqtt_ch`, `inserted DateTime
  DEFAULT now()` (1 s: no store_in stamp), which keeps the rows of every earlier run;
- VictoriaMetrics: hoptrace publish -> Mosquitto -> `mosquitto_sub` and one HTTP `/write`
  (InfluxDB line protocol, no timestamp, so the sample's time is the store's, ms: the
  store_in stamp) per message -> metric `bench_mqtt_value`, key and topic as labels.

The store tap polls only the run's own series: on InfluxDB `series=topic=~/^<run's topics>/`
(the matching tag values resolved once a second and polled by value; `--influx-select
where` polls with the same regular expression in `where=` instead, which InfluxDB matches
against every series of the measurement on every poll), on PostgreSQL and ClickHouse
`where=topic LIKE '<run's topics>%'`, on VictoriaMetrics `where=topic=~"<run's topics>.*"`. The Node-RED spec is used without its broker hop (no broker tap runs
here). Per run:

- the bound width of Total Ingestion (publish -> queryable) at P50 and P99: the upper
  bound's percentile minus the lower bound's, from `hoptrace report`'s summary.json;
- the store's CPU over the publishing window (utime + stime of influxd, or of every
  postgres process), as % of one core; the tap's share is the difference to `off`;
- the observer effect: publish -> the row's own store time, P50 and P99, read back from the
  store after the run for every message (exact percentiles, the same query whether a tap ran
  or not), so a tap that slows the store's writes shows here.

Needs Mosquitto (infra/services.sh up) and the stores asked for (infra/stores/stores.sh up
influxdb postgres clickhouse victoriametrics); starts Node-RED's plain flow when InfluxDB is
asked for and it is not running (and stops it again).

    python3 runner/bench/store_tap_tradeoff.py --bin target/release/hoptrace --out runs/tradeoff \\
        --seconds 30 --markdown tradeoff.md
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "infra" / "nodered"))
sys.path.insert(0, str(ROOT / "probes" / "python"))

from probed_pipeline import (PipelineError, Proc, fmt_ns, free_port, port_open,  # noqa: E402
                             sh, spawn, stage_value)
from hoptrace_probe.context import TraceContext  # noqa: E402

MQTT = os.environ.get("HOPTRACE_MQTT", "127.0.0.1:11883")
INFLUX = "127.0.0.1:18086"
PG = dict(host="127.0.0.1", port="15432", user="hoptrace", password="hoptrace-test", db="hoptrace")
PG_TABLE = "bench_mqtt_pg"
CLICKHOUSE = "127.0.0.1:18123"
CH_TABLE = "bench_mqtt_ch"
VM = "127.0.0.1:18428"
VM_METRIC = "bench_mqtt"
NODERED_SH = ROOT / "infra" / "nodered" / "nodered.sh"
SPECS = {"influxdb": ROOT / "tap" / "testdata" / "nodered-influxdb.toml",
         "postgres": ROOT / "tap" / "testdata" / "mqtt-postgres.toml"}
TOPIC_ROOTS = {"influxdb": "hoptrace/nr/in", "postgres": "hoptrace/pg/in",
               "clickhouse": "hoptrace/ch/in", "victoriametrics": "hoptrace/vm/in"}
# The store's server process, as /proc/PID/comm names it (15 characters at most).
SERVER_COMM = {"influxdb": "influxd", "postgres": "postgres", "clickhouse": "clickhouse-serv",
               "victoriametrics": "victoria-metric"}


@dataclass
class Setting:
    """A tap setting: `off`, or a poll interval and a number of pollers, and whether the
    tap also takes what the store says it accepted (`notify+`; PostgreSQL: a trigger on the
    table for the run's length, `notify=`; InfluxDB: a subscription the tap makes for its
    run, `subscribe=`, each write triggering a query for its points)."""

    interval: Optional[str]
    pollers: int = 1
    notify: bool = False

    @classmethod
    def parse(cls, text: str) -> "Setting":
        if text == "off":
            return cls(None)
        m = re.fullmatch(r"(notify\+)?(\d+(?:\.\d+)?(?:us|ms|s)):(\d+)", text)
        if not m:
            raise argparse.ArgumentTypeError(
                f"{text!r}: off, or [notify+]INTERVAL:POLLERS such as 10ms:1 or notify+1s:1")
        return cls(m.group(2), int(m.group(3)), m.group(1) is not None)

    def __str__(self) -> str:
        if self.interval is None:
            return "off"
        return f"{'notify + ' if self.notify else ''}{self.interval} × {self.pollers}"


@dataclass
class Result:
    store: str
    setting: Setting
    sent: int
    complete: int
    cpu_pct: float
    tap_cpu_pct: Optional[float]
    polls_per_s: Optional[float]
    total: Optional[dict]
    store_in: Tuple[float, float, int]
    commands: List[str]


# ---------------------------------------------------------------------------------------
# The stores: CPU, the run's rows read back


def cpu_ticks(store: str, only: Optional[List[str]] = None) -> int:
    """utime + stime of the store's processes (or of the pids `only`), clock ticks."""
    total = 0
    for pid in (only if only is not None else os.listdir("/proc")):
        if not pid.isdigit():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        if comm == SERVER_COMM[store]:
            fields = stat[stat.rindex(")") + 2:].split()
            total += int(fields[11]) + int(fields[12])
    return total


def tap_backends() -> List[str]:
    """The PostgreSQL backends serving the store tap's connections, its pollers' and its
    listener's (application_name)."""
    p = psql("-A", "-t", "-c", "SELECT pid FROM pg_stat_activity WHERE application_name IN ('hoptrace-tap', 'hoptrace-listen')",
             stdout=subprocess.PIPE)
    out, _ = p.communicate(timeout=60)
    return [line.strip() for line in out.splitlines() if line.strip().isdigit()]


def psql(*args: str, stdin=None, stdout=None) -> subprocess.Popen:
    env = dict(os.environ, PGPASSWORD=PG["password"])
    return subprocess.Popen(["psql", "-X", "-q", "-h", PG["host"], "-p", PG["port"], "-U", PG["user"],
                             "-d", PG["db"], *args], stdin=stdin, stdout=stdout,
                            stderr=subprocess.STDOUT, env=env, text=True)


def http_post(url: str, body: str) -> None:
    req = urllib.request.Request(url, data=body.encode(), method="POST")
    with urllib.request.urlopen(req, timeout=60) as r:
        r.read()


def ch_query(sql: str, body: Optional[str] = None) -> str:
    url = f"http://{CLICKHOUSE}/?" + urllib.parse.urlencode({"query": sql})
    req = urllib.request.Request(url, data=None if body is None else body.encode(),
                                 method="GET" if body is None else "POST")
    with urllib.request.urlopen(req, timeout=120) as r:
        return r.read().decode()


def rows_of_run(store: str, tag: str) -> List[Tuple[str, int]]:
    """(key, row time ns) of every row the run left in the store (ClickHouse: none, its
    row time is a 1 s DateTime)."""
    if store == "clickhouse":
        return []
    if store == "victoriametrics":
        sel = f'{VM_METRIC}_value{{topic=~"{TOPIC_ROOTS[store]}/{tag}/.*"}}'
        url = f"http://{VM}/api/v1/export?" + urllib.parse.urlencode({"match[]": sel})
        rows = []
        for line in urllib.request.urlopen(url, timeout=120).read().decode().splitlines():
            if line.strip():
                j = json.loads(line)
                rows += [(j["metric"]["hoptrace"], int(ms) * 1_000_000) for ms in j["timestamps"]]
        return rows
    if store == "influxdb":
        q = f'SELECT "hoptrace" FROM "nodered" WHERE "topic" =~ /^hoptrace\\/nr\\/in\\/{tag}\\//'
        url = f"http://{INFLUX}/query?" + urllib.parse.urlencode({"db": "hoptrace", "q": q, "epoch": "ns"})
        body = json.loads(urllib.request.urlopen(url, timeout=120).read())
        series = body["results"][0].get("series", [])
        return [(v[1], int(v[0])) for s in series for v in s["values"]]
    p = psql("-A", "-t", "-F", " ", "-c",
             f"SELECT hoptrace, (extract(epoch from at) * 1000000)::int8 FROM {PG_TABLE} "
             f"WHERE topic LIKE 'hoptrace/pg/in/{tag}/%'", stdout=subprocess.PIPE)
    out, _ = p.communicate(timeout=120)
    rows = []
    for line in out.splitlines():
        if " " in line:
            key, us = line.rsplit(" ", 1)
            rows.append((key, int(us) * 1000))
    return rows


def store_in_spread(store: str, tag: str) -> Tuple[float, float, int]:
    """publish -> row time over every row of the run: exact P50, P99 (ns), rows."""
    deltas = []
    for key, t in rows_of_run(store, tag):
        try:
            ctx = TraceContext.decode_text(key)
        except ValueError:
            continue
        publish = ctx.stamp_of(0)
        if publish is not None:
            deltas.append(t - publish)
    if not deltas:
        return (float("nan"), float("nan"), 0)
    deltas.sort()
    rank = lambda q: deltas[max(0, min(len(deltas) - 1, int(q * len(deltas) + 0.999999) - 1))]  # noqa: E731
    return (rank(0.5), rank(0.99), len(deltas))


def subscribe(topic_filter: str) -> subprocess.Popen:
    """mosquitto_sub on `topic_filter`, a line `topic payload` per message."""
    host, port = MQTT.rsplit(":", 1)
    return subprocess.Popen(["mosquitto_sub", "-h", host, "-p", port, "-V", "mqttv5", "-q", "0",
                             "-t", topic_filter, "-F", "%t %p"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)


def keyed_messages(sub: subprocess.Popen):
    """(topic, the payload's `hoptrace` field) of every message `sub` prints that has one."""
    assert sub.stdout is not None
    for line in sub.stdout:
        topic, _, payload = line.rstrip("\n").partition(" ")
        try:
            yield topic, json.loads(payload)["hoptrace"]
        except (ValueError, KeyError, TypeError):
            continue


class PgBridge:
    """mosquitto_sub | psql: each message on `topic_filter` becomes one INSERT, committed as
    it arrives."""

    def __init__(self, topic_filter: str, workdir: Path):
        self.sub = subscribe(topic_filter)
        self.log = open(workdir / "psql.log", "w")
        self.psql = psql(stdin=subprocess.PIPE, stdout=self.log)
        self.inserted = 0
        self.thread = threading.Thread(target=self._pump, daemon=True)
        self.thread.start()

    def _pump(self) -> None:
        assert self.psql.stdin is not None
        for topic, key in keyed_messages(self.sub):
            self.psql.stdin.write(f"INSERT INTO {PG_TABLE} (topic, hoptrace, value) "
                                  f"VALUES ($t${topic}$t$, $k${key}$k$, 1.5);\n")
            self.psql.stdin.flush()
            self.inserted += 1

    def stop(self) -> None:
        self.sub.terminate()
        self.sub.wait(timeout=10)
        self.thread.join(timeout=10)
        if self.psql.stdin is not None:
            self.psql.stdin.close()
        self.psql.wait(timeout=30)
        self.log.close()


class HttpBridge:
    """mosquitto_sub and HTTP writes: each message on `topic_filter` becomes a line of
    `line(topic, key)`, posted to `url` as it arrives or, with `batch_s`, every `batch_s`
    seconds with the lines gathered meanwhile."""

    def __init__(self, topic_filter: str, url: str, line, batch_s: float = 0.0):
        self.sub = subscribe(topic_filter)
        self.url, self.line, self.batch_s = url, line, batch_s
        self.pending: List[str] = []
        self.lock = threading.Lock()
        self.inserted = 0
        self.errors: List[str] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._pump, daemon=True)
        self.thread.start()
        self.flusher = threading.Thread(target=self._flush_every, daemon=True)
        if batch_s > 0:
            self.flusher.start()

    def _post(self, lines: List[str]) -> None:
        try:
            http_post(self.url, "\n".join(lines) + "\n")
            self.inserted += len(lines)
        except OSError as e:  # counted and said at the end; the run's accounting shows the loss
            self.errors.append(str(e))

    def _pump(self) -> None:
        for topic, key in keyed_messages(self.sub):
            if self.batch_s > 0:
                with self.lock:
                    self.pending.append(self.line(topic, key))
            else:
                self._post([self.line(topic, key)])

    def _flush(self) -> None:
        with self.lock:
            lines, self.pending = self.pending, []
        if lines:
            self._post(lines)

    def _flush_every(self) -> None:
        while not self.done.wait(self.batch_s):
            self._flush()

    def stop(self) -> None:
        self.sub.terminate()
        self.sub.wait(timeout=10)
        self.thread.join(timeout=10)
        self.done.set()
        if self.batch_s > 0:
            self.flusher.join(timeout=10)
            self._flush()
        if self.errors:
            print(f"    the bridge's writes failed {len(self.errors)} times: {self.errors[0]}", flush=True)


def bridge_for(store: str, topic_filter: str, workdir: Path):
    """The subscriber that writes the run's messages into `store` (InfluxDB: Node-RED's)."""
    if store == "postgres":
        return PgBridge(topic_filter, workdir)
    if store == "clickhouse":
        url = f"http://{CLICKHOUSE}/?" + urllib.parse.urlencode(
            {"query": f"INSERT INTO hoptrace.{CH_TABLE} (topic, hoptrace, value) FORMAT TabSeparated"})
        return HttpBridge(topic_filter, url, lambda topic, key: f"{topic}\t{key}\t1.5", batch_s=0.1)
    if store == "victoriametrics":
        return HttpBridge(topic_filter, f"http://{VM}/write",
                          lambda topic, key: f"{VM_METRIC},topic={topic},hoptrace={key} value=1.5")
    return None


def prepare(store: str) -> None:
    if store == "clickhouse":
        ch_query(f"CREATE TABLE IF NOT EXISTS hoptrace.{CH_TABLE} (topic String, hoptrace String, "
                 f"value Float64, inserted DateTime DEFAULT now()) ENGINE = MergeTree ORDER BY inserted", "")
    if store == "postgres":
        p = psql("-c", f"CREATE TABLE IF NOT EXISTS {PG_TABLE} (topic text, hoptrace text, value float8, "
                       f"at timestamptz NOT NULL DEFAULT clock_timestamp()); "
                       f"CREATE INDEX IF NOT EXISTS {PG_TABLE}_at ON {PG_TABLE} (at);",
                 stdout=subprocess.PIPE)
        out, _ = p.communicate(timeout=60)
        if p.returncode != 0:
            raise PipelineError(f"creating {PG_TABLE}: {out}")


def tap_url(store: str, tag: str, influx_select: str, notify: bool = False,
            vm_lookback: Optional[str] = None) -> str:
    if store == "influxdb":
        regex = f"^hoptrace\\/nr\\/in\\/{tag}\\/"
        select = (f'"topic" =~ /{regex}/' if influx_select == "where" else f"topic=~/{regex}/")
        return (f"influxdb://{INFLUX}/hoptrace?measurement=nodered"
                f"&{influx_select}={urllib.parse.quote(select, safe='')}"
                + ("&subscribe=127.0.0.1:0" if notify else ""))
    if store == "clickhouse":
        where = f"topic LIKE '{TOPIC_ROOTS[store]}/{tag}/%'"
        return (f"clickhouse://{CLICKHOUSE}/hoptrace?table={CH_TABLE}&time=inserted"
                f"&where={urllib.parse.quote(where, safe='')}")
    if store == "victoriametrics":
        where = f'topic=~"{TOPIC_ROOTS[store]}/{tag}/.*"'
        return (f"victoriametrics://{VM}/?metric={VM_METRIC}_value&where={urllib.parse.quote(where, safe='')}"
                + (f"&lookback={vm_lookback}" if vm_lookback else ""))
    where = f"topic LIKE 'hoptrace/pg/in/{tag}/%'"
    return (f"postgres://{PG['user']}:{PG['password']}@{PG['host']}:{PG['port']}/{PG['db']}"
            f"?table={PG_TABLE}&time=at&where={urllib.parse.quote(where, safe='')}"
            + (f"&notify={PG_TABLE}" if notify else ""))


# The trigger docs/dataset.md gives ("Polled hops"), on the bench's table.
NOTIFY_TRIGGER = f"""CREATE OR REPLACE FUNCTION {PG_TABLE}_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('{PG_TABLE}', NEW.hoptrace || ' ' || (extract(epoch FROM NEW.at) * 1000000)::int8);
  RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS {PG_TABLE}_notify ON {PG_TABLE};
CREATE TRIGGER {PG_TABLE}_notify AFTER INSERT ON {PG_TABLE} FOR EACH ROW EXECUTE FUNCTION {PG_TABLE}_notify();"""


def notify_trigger(on: bool) -> None:
    """Creates the table's notifying trigger, or drops it."""
    sql = NOTIFY_TRIGGER if on else f"DROP TRIGGER IF EXISTS {PG_TABLE}_notify ON {PG_TABLE};"
    p = psql("-v", "ON_ERROR_STOP=1", "-c", sql, stdout=subprocess.PIPE)
    out, _ = p.communicate(timeout=60)
    if p.returncode != 0:
        raise PipelineError(f"the notify trigger: {out}")


# ---------------------------------------------------------------------------------------
# One run


def collector_complete(collector: Proc, messages: int) -> bool:
    """Whether the collector's last progress line counts every message complete."""
    m = re.findall(r"\bcomplete ([\d,]+)", collector.text())
    return bool(m) and int(m[-1].replace(",", "")) >= messages


def cmd_line(cmd: List) -> str:
    return " ".join(str(c) if re.fullmatch(r"[\w@%+=:,./-]+", str(c)) else f"'{c}'" for c in cmd)


def spec_for(store: str, out: Path) -> Path:
    """The store's pipeline spec; Node-RED's without the broker hop (no broker tap here);
    ClickHouse's and VictoriaMetrics' that of PostgreSQL's pipeline with the store's name,
    ClickHouse's without store_in (its row time is a 1 s DateTime)."""
    if store in ("clickhouse", "victoriametrics"):
        name = {"clickhouse": "ClickHouse", "victoriametrics": "VictoriaMetrics"}[store]
        text = SPECS["postgres"].read_text().replace("PostgreSQL", name).replace(
            'name = "mosquitto-postgres"', f'name = "mosquitto-{store}"')
        if store == "clickhouse":
            blocks = text.split("\n[[")
            text = "\n[[".join(b for b in blocks if '"store_in"' not in b)
        path = out / f"mosquitto-{store}.toml"
        path.write_text(text)
        return path
    if store != "influxdb":
        return SPECS[store]
    blocks = SPECS[store].read_text().split("\n[[")
    kept = [b for b in blocks if 'name = "broker"' not in b and 'to = "broker"' not in b]
    path = out / "nodered-influxdb-no-broker.toml"
    path.write_text("\n[[".join(kept))
    return path


def one_run(bin_path: str, out: Path, store: str, setting: Setting, rate: float, seconds: int,
            influx_select: str, vm_lookback: Optional[str] = None) -> Result:
    publisher_id = random.randrange(1000, 60000)
    tag = f"tradeoff{publisher_id}"
    shape = "off" if setting.interval is None else f"{'notify-' if setting.notify else ''}{setting.interval}x{setting.pollers}"
    run_id = f"{store}-{shape}-{tag}"
    workdir = out / run_id
    workdir.mkdir(parents=True, exist_ok=True)
    spec = spec_for(store, out)
    messages = int(rate * seconds)
    collector_addr = f"127.0.0.1:{free_port()}"
    procs: List[Proc] = []
    commands: List[str] = []
    bridge: Optional[PgBridge] = None
    try:
        collect = [bin_path, "collect", "--listen", collector_addr, "--pipeline", spec, "--out", out,
                   "--run-id", run_id]
        collector = spawn("collector", collect, workdir)
        procs.append(collector)
        commands.append(cmd_line(collect) + " &")
        collector.wait_for(r"collecting on (\S+)", 60)
        bridge = bridge_for(store, f"{TOPIC_ROOTS[store]}/{tag}/#", workdir)
        if bridge is not None:
            into = {"postgres": f"(one INSERT INTO {PG_TABLE} per line) | psql",
                    "clickhouse": f"(one INSERT INTO hoptrace.{CH_TABLE} ... FORMAT TabSeparated per 100 ms, HTTP)",
                    "victoriametrics": f"(one POST /write of '{VM_METRIC},topic=T,hoptrace=K value=1.5' per line)"}
            commands.append(f"mosquitto_sub -V mqttv5 -t '{TOPIC_ROOTS[store]}/{tag}/#' -F '%t %p' | "
                            f"{into[store]} &")
        tap = None
        if setting.interval is not None:
            if setting.notify and store == "postgres":
                notify_trigger(True)
                commands.append(f"psql -c \"$NOTIFY_TRIGGER\"  # the trigger of docs/dataset.md on {PG_TABLE}")
            tap_cmd = [bin_path, "tap", "--from", tap_url(store, tag, influx_select, setting.notify, vm_lookback),
                       "--poll-interval", setting.interval,
                       "--pollers", str(setting.pollers), "--publishers", str(publisher_id),
                       "--duration", f"{seconds + 120}s",
                       "--collector", collector_addr, "--pipeline", spec]
            if store == "victoriametrics":
                tap_cmd += ["--store-in", "on"]  # written without a timestamp: the store's ms
            tap = spawn("tap-store", tap_cmd, workdir)
            procs.append(tap)
            commands.append(cmd_line(tap_cmd) + " &")
            tap.wait_for(r"polling", 60)
        time.sleep(1.0)  # mosquitto_sub subscribed
        publish_cmd = [bin_path, "publish", "--to", f"mqtt://{MQTT}/{TOPIC_ROOTS[store]}/{tag}?version=5",
                       "--topics", "flat", "--topic-root", "hoptrace", "--streams", "100",
                       "--rate", str(rate), "--messages", str(messages), "--duration", f"{seconds + 60}s",
                       "--payload-context", "--publisher-id", str(publisher_id),
                       "--collector", collector_addr, "--pipeline", spec]
        commands.append(cmd_line(publish_cmd))
        backends = tap_backends() if store == "postgres" and tap is not None else None
        ticks0, t0 = cpu_ticks(store), time.monotonic()
        tap0 = cpu_ticks(store, backends) if backends is not None else 0
        publish = spawn("publish", publish_cmd, workdir)
        procs.append(publish)
        publish.popen.wait(timeout=seconds + 120)
        ticks1, t1 = cpu_ticks(store), time.monotonic()
        tap1 = cpu_ticks(store, backends) if backends is not None else 0
        if publish.popen.returncode != 0:
            raise PipelineError(f"publish failed:\n{publish.text()[-3000:]}")
        polls_per_s = None
        if tap is not None:
            # Stopped once it found every message (or 60 s passed): it keeps its store
            # connections until then, so their CPU above was read while they were open.
            deadline = time.monotonic() + 60
            while (time.monotonic() < deadline and tap.popen.poll() is None
                   and not collector_complete(collector, messages)):
                time.sleep(0.5)
            tap.stop()
            m = re.search(r"\(([\d.]+)(k?) polls/s", tap.text())
            if m:
                polls_per_s = float(m.group(1)) * (1000 if m.group(2) else 1)
        else:
            time.sleep(3)  # the last rows land
        if bridge is not None:
            bridge.stop()
            bridge = None
        if collector.stop() != 0:
            raise PipelineError(f"collector failed:\n{collector.text()[-3000:]}")
        run_dir = out / run_id
        r = sh(bin_path, "report", run_dir, timeout=600)
        if r.returncode != 0:
            raise PipelineError(f"report failed: {r.stdout}{r.stderr}")
        summary = json.loads((run_dir / "report" / "summary.json").read_text())
        run_json = json.loads((run_dir / "run.json").read_text())
        acc = run_json["accounting"]
        stages = {s["name"]: s for s in summary["stages"]}
        hz = os.sysconf("SC_CLK_TCK")
        return Result(store=store, setting=setting, sent=sum(p["sent"] for p in acc["publishers"]),
                      complete=sum(p["complete"] for p in acc["publishers"]),
                      cpu_pct=100.0 * (ticks1 - ticks0) / hz / (t1 - t0),
                      tap_cpu_pct=(100.0 * (tap1 - tap0) / hz / (t1 - t0) if backends is not None else None),
                      polls_per_s=polls_per_s,
                      total=stages.get("Total Ingestion") if setting.interval is not None else None,
                      store_in=store_in_spread(store, tag), commands=commands)
    finally:
        if bridge is not None:
            bridge.stop()
        for p in reversed(procs):
            p.stop(timeout=30)
        if setting.notify and store == "postgres":
            notify_trigger(False)


# ---------------------------------------------------------------------------------------
# The table


def bound(stage: dict, side: str, label: str) -> float:
    for p in stage["bounds"][side]["percentiles"]:
        if p["label"] == label:
            return p["value_ns"]
    raise KeyError(label)


def table(results: List[Result]) -> str:
    lines = ["| store | tap | polls/s | store CPU (% of a core) | the tap's part | Total Ingestion P50 [bounds] | width P50 | P99 [bounds] | width P99 | publish → store_in P50 / P99 (exact) | complete / sent |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    base: Dict[str, float] = {r.store: r.cpu_pct for r in results if r.setting.interval is None}
    for r in results:
        if r.tap_cpu_pct is not None:
            share = f"{r.tap_cpu_pct:.1f} (its backends)"
        elif r.setting.interval is not None and r.store in base:
            share = f"{r.cpu_pct - base[r.store]:+.1f} (against off)"
        else:
            share = "–"
        cells = ["–"] * 4
        if r.total is not None and r.total.get("bounds"):
            t = r.total
            cells = []
            for label in ("P50", "P99"):
                lo, hi = bound(t, "lower", label), bound(t, "upper", label)
                cells += [f"{fmt_ns(stage_value(t, label))} [{fmt_ns(lo)}, {fmt_ns(hi)}]", fmt_ns(hi - lo)]
        p50, p99, n = r.store_in
        store_in = ("– (1 s DateTime)" if r.store == "clickhouse"
                    else f"{fmt_ns(p50)} / {fmt_ns(p99)} ({n:,} rows)")
        lines.append(f"| {r.store} | {r.setting} | {'–' if r.polls_per_s is None else f'{r.polls_per_s:,.0f}'} | "
                     f"{r.cpu_pct:.1f} | {share} | " + " | ".join(cells) +
                     f" | {store_in} | {r.complete:,} / {r.sent:,} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.environ.get("HOPTRACE_BIN", "hoptrace"))
    ap.add_argument("--out", type=Path, default=Path("runs/tradeoff"))
    ap.add_argument("--rate", type=float, default=200)
    ap.add_argument("--seconds", type=int, default=30)
    ap.add_argument("--stores", default="influxdb,postgres")
    ap.add_argument("--settings", default="off,20ms:1,10ms:1,5ms:1,2ms:1,1ms:1,1ms:2",
                    help="comma-separated: off, or [notify+]INTERVAL:POLLERS (notify+: a PostgreSQL "
                         "trigger, an InfluxDB subscription)")
    ap.add_argument("--influx-select", choices=["series", "where"], default="series",
                    help="how the InfluxDB tap restricts its polls to the run's series")
    ap.add_argument("--vm-lookback", help="the VictoriaMetrics tap's lookback= (default: the tap's, 30s)")
    ap.add_argument("--markdown", type=Path, help="also write the table and the commands here")
    a = ap.parse_args()
    settings = [Setting.parse(s) for s in a.settings.split(",")]
    stores = a.stores.split(",")
    unknown = [s for s in stores if s not in TOPIC_ROOTS]
    if unknown:
        raise SystemExit(f"--stores: {', '.join(unknown)}: not one of {', '.join(TOPIC_ROOTS)}")
    if not port_open(MQTT):
        raise SystemExit(f"no MQTT broker at {MQTT} (infra/services.sh up)")
    started_nodered = False
    if "influxdb" in stores and sh(NODERED_SH, "status").returncode != 0:
        r = sh(NODERED_SH, "start")
        if r.returncode != 0:
            raise SystemExit(f"nodered.sh start: {r.stdout}{r.stderr}")
        started_nodered = True
    results: List[Result] = []
    started = time.time()
    try:
        for store in stores:
            prepare(store)
            for i, s in enumerate(settings):
                print(f"[{len(results) + 1}/{len(stores) * len(settings)}] {store}, tap {s}: "
                      f"{a.rate:g} msg/s for {a.seconds} s ...", flush=True)
                r = one_run(a.bin, a.out.resolve(), store, s, a.rate, a.seconds, a.influx_select,
                            a.vm_lookback)
                results.append(r)
                print(f"    store CPU {r.cpu_pct:.1f} % of a core; {r.complete:,} of {r.sent:,} complete",
                      flush=True)
    finally:
        if started_nodered:
            sh(NODERED_SH, "stop")
    text = table(results)
    print(text)
    print(f"{len(results)} runs in {(time.time() - started) / 60:.1f} min")
    if a.markdown:
        cmds = "\n\n".join(f"{r.store}, tap {r.setting}:\n\n```sh\n" + "\n".join(r.commands) + "\n```"
                           for r in results)
        a.markdown.write_text(text + "\n\n" + cmds + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
