#!/usr/bin/env python3
"""What one store-tap query costs InfluxDB 1.x, by its shape and by how many series it asks
for: the server's CPU (utime + stime of influxd from /proc, over many back-to-back queries)
and the wall time per query.

The shapes are the ones the InfluxDB tap sends (`tap/src/store/influxdb.rs`):

- `by value`: a poll with `series=`, the run's series asked for by value,
  `("topic" = 'a' OR ...) GROUP BY "topic"`, for 1, 10, 30 and 100 series;
- `regex`: a poll with `where="topic" =~ /^prefix/`, the same series by pattern;
- `subscription`: the query a subscription's write triggers (`subscribe=`): one point's
  series by its tags and its time, and ten such points together.

Run it against the test store (`infra/stores/stores.sh up influxdb`) after a pipeline has
written to measurement `nodered` (the Node-RED flow's; e.g. `store_tap_tradeoff.py`): it
picks a run of that measurement with at least 100 series and asks for its series.

    python3 runner/bench/influx_poll_cost.py [--queries 200] [--markdown FILE]
"""

import argparse
import json
import os
import re
import sys
import time
import urllib.parse
import urllib.request
from collections import Counter
from pathlib import Path

URL = "http://127.0.0.1:18086"
DB = "hoptrace"
MEASUREMENT = "nodered"
PID_FILE = Path(os.environ.get("HOPTRACE_RUN", "/tmp/hoptrace-infra")) / "influxdb" / "influxdb.pid"


def query(q: str) -> dict:
    u = f"{URL}/query?" + urllib.parse.urlencode({"db": DB, "epoch": "ns", "q": q})
    body = json.loads(urllib.request.urlopen(u, timeout=60).read())
    for r in body.get("results", []):
        if "error" in r:
            raise SystemExit(f"{q[:120]}: {r['error']}")
    return body


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def lit(v: str) -> str:
    return "'" + v.replace("\\", "\\\\").replace("'", "\\'") + "'"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--queries", type=int, default=200, help="queries per shape")
    ap.add_argument("--markdown", type=Path)
    a = ap.parse_args()
    try:
        pid = int(PID_FILE.read_text().split()[0])
    except (OSError, ValueError):
        raise SystemExit(f"no InfluxDB pid in {PID_FILE} (infra/stores/stores.sh up influxdb)")
    card = query(f'SHOW SERIES CARDINALITY FROM "{MEASUREMENT}"')
    series_total = card["results"][0]["series"][0]["values"][0][0]
    tags = query(f'SHOW TAG VALUES FROM "{MEASUREMENT}" WITH KEY = "topic"')
    topics = [v[1] for v in tags["results"][0]["series"][0]["values"]]
    runs = Counter(t.split("/")[3] for t in topics if t.count("/") >= 4)
    run = next((r for r, n in runs.most_common() if n >= 100), None)
    if run is None:
        raise SystemExit(f"no run of {MEASUREMENT} with 100 series: write some first")
    mine = sorted(t for t in topics if t.split("/")[3] == run)[:100]
    prefix = "/".join(mine[0].split("/")[:4]) + "/"
    newest = query(f'SELECT "hoptrace" FROM "{MEASUREMENT}" WHERE "topic" = {lit(mine[0])} '
                   f'ORDER BY time DESC LIMIT 1')
    t_last = newest["results"][0]["series"][0]["values"][0][0]
    since = t_last - 200_000_000
    sel = f'SELECT "hoptrace" FROM "{MEASUREMENT}" WHERE time >= {since}'

    def by_value(n: int) -> str:
        return sel + " AND (" + " OR ".join(f'"topic" = {lit(t)}' for t in mine[:n]) + ') GROUP BY "topic"'

    def triggered(n: int) -> str:
        return (f'SELECT "hoptrace" FROM "{MEASUREMENT}" WHERE time >= {t_last - 1000} AND time <= {t_last}'
                + " AND (" + " OR ".join(f'("topic" = {lit(t)})' for t in mine[:n]) + ")")

    regex = re.escape(prefix).replace("/", "\\/")
    shapes = [(f"by value, {n} series", by_value(n)) for n in (1, 10, 30, 100)]
    shapes.append((f"regex, the same {len(mine)} series", sel + f' AND "topic" =~ /^{regex}/'))
    shapes += [("subscription, 1 point", triggered(1)), ("subscription, 10 points", triggered(10))]
    rows = []
    for name, q in shapes:
        query(q)
        c0, t0 = cpu_s(pid), time.perf_counter()
        for _ in range(a.queries):
            query(q)
        c1, t1 = cpu_s(pid), time.perf_counter()
        rows.append((name, (c1 - c0) / a.queries * 1e3, (t1 - t0) / a.queries * 1e3))
        print(f"{name:32} server CPU {rows[-1][1]:6.2f} ms/query  wall {rows[-1][2]:6.2f} ms/query",
              flush=True)
    head = (f"measurement `{MEASUREMENT}`: {series_total:,} series ({len(topics):,} topics), "
            f"the run's {len(mine)} series under `{prefix}`; {a.queries} queries per shape")
    table = ["| query | server CPU per query | wall time per query |", "| --- | --- | --- |"]
    table += [f"| {n} | {c:.2f} ms | {w:.2f} ms |" for n, c, w in rows]
    print(head)
    if a.markdown:
        a.markdown.write_text(head + "\n\n" + "\n".join(table) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
