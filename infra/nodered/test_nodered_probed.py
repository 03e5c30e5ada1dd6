"""The live-store pipeline Mosquitto -> Node-RED -> InfluxDB with the two hoptrace nodes of
probes/node-red added to the flow (infra/nodered/flows-probed.json), measured end to end
by the real collector, `hoptrace publish`, a broker tap, the Node-RED nodes and a store tap
(infra/nodered/probed_pipeline.py runs it). A few seconds of traffic; the accounting must
be exact and Node-RED's own time (nodered_in -> nodered_out) a stage with plausible values.

Skipped unless HOPTRACE_INTEGRATION=1; with it set, a missing hoptrace binary
(HOPTRACE_BIN), Mosquitto or InfluxDB is a failure. InfluxDB is started when it is not
running, and stopped again; the probed Node-RED is started and stopped by the run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import probed_pipeline  # noqa: E402

INTEGRATION = os.environ.get("HOPTRACE_INTEGRATION") == "1"
pytestmark = pytest.mark.skipif(not INTEGRATION, reason="integration test: set HOPTRACE_INTEGRATION=1")

MESSAGES, RATE = 600, 200  # 3 s of traffic


@pytest.fixture(scope="module")
def influxdb():
    sh = probed_pipeline.INFLUXDB_SH
    r = subprocess.run([str(sh), "status"], capture_output=True, text=True, timeout=60)
    started = False
    if r.returncode != 0:
        r = subprocess.run([str(sh), "start"], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, f"influxdb.sh start failed:\n{r.stdout}{r.stderr}"
        started = True
    yield
    if started:
        r = subprocess.run([str(sh), "stop"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, f"influxdb.sh stop failed:\n{r.stdout}{r.stderr}"


def test_probed_flow_exact_accounting_and_node_red_stage(influxdb, tmp_path):
    bin_path = os.environ.get("HOPTRACE_BIN")
    if not bin_path or not os.access(bin_path, os.X_OK):
        pytest.fail(f"HOPTRACE_INTEGRATION=1 needs HOPTRACE_BIN, the hoptrace binary (got {bin_path!r})")
    run_id = f"nr-probed-{uuid.uuid4().hex[:8]}"
    try:
        run = probed_pipeline.run_pipeline(bin_path, tmp_path / "runs", run_id, MESSAGES, RATE)
    except probed_pipeline.PipelineError as e:
        pytest.fail(str(e))
    rj = run.run_json
    acc = rj["accounting"]
    assert acc["adds_up"] is True, acc
    (pub,) = acc["publishers"]
    assert (pub["sent"], pub["complete"], pub["incomplete"], pub["unseen"]) == (MESSAGES, MESSAGES, 0, 0), acc
    assert run.publish_summary["messages"] == MESSAGES
    hops = ["publish", "broker", "nodered_in", "nodered_out", "store_in", "query_start", "queryable"]
    assert acc["records_by_hop"] == {h: MESSAGES for h in hops}, acc
    assert (acc["records_lost_by_probes"], acc["duplicate_traces"], acc["late_records"], acc["in_flight"]) == \
        (0, 0, 0, 0), acc

    # The hoptrace nodes inside Node-RED: one connection, both hops, every message stamped
    # twice, nothing lost, Goodbye when Node-RED stopped, the clock status sent.
    probes = [p for p in rj["probes"] if p["process"] == "nodered"]
    assert len(probes) == 1, rj["probes"]
    (probe,) = probes
    assert sorted(probe["hops"]) == ["nodered_in", "nodered_out"]
    assert probe["software"].startswith("node-red-contrib-hoptrace ")
    assert probe["clean_close"] is True
    c = probe["counters"]
    assert (c["reported"], c["sent"], c["queue_full"], c["send_failed"], c["bad_context"]) == \
        (2 * MESSAGES, 2 * MESSAGES, 0, 0, 0), c
    assert any(cl["instance_id"] == probe["instance_id"] for cl in rj["clock"]), "clock status of the Node-RED probe"

    # Node-RED's own time is a stage, measured for every message, on one clock: never
    # negative, and far below the pipeline's total.
    stages = {s["name"]: s for s in rj["stages"]}
    nr = stages["Node-RED"]
    assert (nr["from"], nr["to"]) == ("nodered_in", "nodered_out")
    assert nr["count"] == MESSAGES and nr["negative"] == 0, nr
    assert 0 <= nr["min_ns"] <= nr["max_ns"] < 2_000_000_000, nr
    total = stages["Total Ingestion"]
    assert total["count"] == MESSAGES and total["negative"] == 0, total
    assert nr["max_ns"] <= total["max_ns"]
    for name in ("Broker Time", "To Node-RED", "Write to InfluxDB", "Store Visibility", "Query Duration"):
        assert stages[name]["count"] == MESSAGES and stages[name]["negative"] == 0, stages[name]

    # The nodes' stamps sit between the broker's delivery and the store's own time, for
    # every message (one host, one clock): checked row by row with hoptrace's SQL.
    out = subprocess.run([bin_path, "sql", str(run.run_dir),
                          "SELECT count(*) AS n FROM traces WHERE nodered_in_ns >= publish_ns "
                          "AND nodered_out_ns >= nodered_in_ns AND store_in_ns >= nodered_out_ns",
                          "--format", "csv"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == str(MESSAGES), out.stdout
