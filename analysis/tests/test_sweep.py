"""`hoptrace sweep` against the real brokers infra/test.sh starts, its figures checked by
an independent engine:
- through Kafka, a partition sweep (topics created by the sweep): every cell's window
  count, completion and percentiles must match what DuckDB computes over the cell's
  Parquet for the same window; the `cells` table must be queryable with the traces;
- through Mosquitto, a sweep interrupted after its first cell keeps that cell, and the
  same command resumes it without running it again.

Needs HOPTRACE_BIN, HOPTRACE_MQTT and HOPTRACE_KAFKA (infra/test.sh sets them).
"""

import csv
import io
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import duckdb
import pytest

BIN = os.environ.get("HOPTRACE_BIN")
MQTT = os.environ.get("HOPTRACE_MQTT")
KAFKA = os.environ.get("HOPTRACE_KAFKA")

pytestmark = pytest.mark.skipif(
    not (BIN and MQTT and KAFKA) and os.environ.get("HOPTRACE_INTEGRATION") != "1",
    reason="HOPTRACE_BIN or the brokers not set (run infra/test.sh)",
)


def sweep_cmd(out: Path, *args):
    assert BIN and MQTT and KAFKA, "HOPTRACE_BIN, HOPTRACE_MQTT and HOPTRACE_KAFKA must be set"
    return [BIN, "sweep", *map(str, args), "--streams", "50", "--warmup", "2s",
            "--window", "4s", "--sla", "Total Ingestion.p99 < 2s", "--out", str(out)]


def setting(cell, name):
    return next(s["value"] for s in cell["settings"] if s["name"] == name)


@pytest.fixture(scope="module")
def kafka_sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep") / "kafka-partitions"
    topic = f"hoptrace-sweep-{os.getpid()}"
    cmd = sweep_cmd(out, "--broker", f"kafka://{KAFKA}/{topic}", "--rate", "5k",
                    "--partitions", "1,2", "--acks", "all", "--metrics-per-message", "10",
                    "--capacity-target", "1M")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    return out


def test_every_cell_matches_duckdb_over_its_window(kafka_sweep):
    report = json.loads((kafka_sweep / "sweep.json").read_text())
    cells = report["cells"]
    assert [setting(c, "partitions") for c in cells] == ["1", "2"]
    con = duckdb.connect()
    for c in cells:
        run = kafka_sweep / "runs" / c["run_id"]
        assert json.loads((run / "cell.json").read_text())["run_id"] == c["run_id"]
        w = c["window"]
        files = str(run / "traces" / "*.parquet")
        where = f"epoch_ns(intended_ns) >= {w['from_unix_ns']} AND epoch_ns(intended_ns) < {w['to_unix_ns']}"
        n, complete, metrics = con.execute(
            f"SELECT count(*), count(*) FILTER (WHERE status = 'complete'), sum(metric_count) "
            f"FROM read_parquet('{files}') WHERE {where}").fetchone()
        assert (w["messages"], w["complete"], w["metrics"]) == (n, complete, metrics)
        # 5k metrics/s at 10 per message over a 4 s window: 2000 messages are due.
        assert abs(n - 2000) <= 50, n
        assert complete == n, "acks=all on loopback completes every message"
        for st in w["stages"]:
            d = f"epoch_ns(\"{st['to']}_ns\") - epoch_ns(\"{st['from']}_ns\")"
            row = con.execute(
                f"SELECT count(*), min(d), max(d), "
                + ", ".join(f"quantile_disc(d, {p['quantile']})" for p in st["percentiles"])
                + f" FROM (SELECT {d} AS d FROM read_parquet('{files}') WHERE {where}) WHERE d >= 0"
            ).fetchone()
            assert (st["count"], st["min_ns"], st["max_ns"]) == tuple(row[:3]), st["name"]
            for p, exact in zip(st["percentiles"], row[3:]):
                assert abs(p["value_ns"] - exact) <= p["precision_ns"], (st["name"], p, exact)
        # The cell held: it kept up, completed everything and met the service level.
        assert all(s["met"] for s in c["slos"]), c["slos"]
    knees = report["knees"]
    assert len(knees) == 2
    for k in knees:
        assert k["target_metrics_per_s"] == 5000, k
    md = (kafka_sweep / "sweep.md").read_text()
    for needle in ["## Throughput", "## Latency: Total Ingestion", "## Knee", "## Capacity planning",
                   "Hosts needed", "latency-vs-throughput"]:
        assert needle in md, needle
    assert (kafka_sweep / "sweep.html").is_file()


def test_the_cells_table_joins_the_traces(kafka_sweep):
    q = ("SELECT c.partitions, c.acks, count(*) AS n FROM traces t JOIN cells c USING (run_id) "
         "WHERE t.intended_ns >= c.window_from AND t.intended_ns < c.window_to "
         "GROUP BY c.partitions, c.acks ORDER BY c.partitions")
    p = subprocess.run([BIN, "sql", kafka_sweep / "runs", q, "--format", "csv"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    rows = list(csv.DictReader(io.StringIO(p.stdout)))
    report = json.loads((kafka_sweep / "sweep.json").read_text())
    assert [(r["partitions"], r["acks"], int(r["n"])) for r in rows] == [
        (setting(c, "partitions"), setting(c, "acks"), c["window"]["messages"])
        for c in report["cells"]
    ]


def test_an_interrupted_sweep_keeps_its_cells_and_resumes(tmp_path):
    out = tmp_path / "mqtt-qos"
    cmd = sweep_cmd(out, "--broker", f"mqtt://{MQTT}", "--rate", "2k,4k", "--qos", "1",
                    "--metrics-per-message", "10")
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = out / "cells" / "metrics_per_message-10_qos-1_rate-2k" / "cell.json"
    deadline = time.monotonic() + 300
    while not first.exists():
        assert p.poll() is None, p.communicate()
        assert time.monotonic() < deadline, "the first cell did not finish"
        time.sleep(0.2)
    time.sleep(3)  # into the second cell
    p.send_signal(signal.SIGINT)
    stdout, stderr = p.communicate(timeout=120)
    assert p.returncode != 0, stdout + stderr
    assert "interrupted: 1 of 2 cells done" in stderr, stderr
    kept = first.read_bytes()
    assert not (out / "cells" / "metrics_per_message-10_qos-1_rate-4k" / "cell.json").exists()
    assert len(json.loads((out / "sweep.json").read_text())["cells"]) == 1

    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "(1 already done)" in p.stderr, p.stderr
    assert first.read_bytes() == kept, "the finished cell was run again"
    report = json.loads((out / "sweep.json").read_text())
    assert [setting(c, "rate") for c in report["cells"]] == ["2k", "4k"]
    assert all(c["window"]["complete"] == c["window"]["messages"] > 0 for c in report["cells"])

    # Another matrix in the same directory is refused, not mixed in.
    other = sweep_cmd(out, "--broker", f"mqtt://{MQTT}", "--rate", "3k")
    p = subprocess.run(other, capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "holds another sweep" in p.stderr, p.stderr
