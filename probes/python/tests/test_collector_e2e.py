"""End to end against the real collector (`$HOPTRACE_BIN collect`): a Python publisher
stamps `publish` and sends Sent frames, a Python processor stamps `flow_in` and
`flow_out`; run.json's accounting must be exact and the Parquet must hold exactly the
stamps Python took. Skipped unless HOPTRACE_INTEGRATION=1."""

import subprocess
import time
from pathlib import Path

import pytest

from hoptrace_run import Collector, free_port, read_traces, require_integration, write_pipeline
from hoptrace_probe import Exporter, ExporterConfig, Publisher
from hoptrace_probe.carrier import envelope, mqtt_property
from hoptrace_probe.clock import this_host

STREAMS, PER_STREAM = 4, 500
N = STREAMS * PER_STREAM
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture
def collector(tmp_path):
    require_integration()
    c = Collector(tmp_path, "py-e2e", write_pipeline(tmp_path / "pipeline.toml"))
    yield c
    if c.proc.poll() is None:
        c.stop()


def test_publisher_and_processor_through_the_real_collector(collector):
    pub_ex = Exporter(ExporterConfig(collector.address, "py-publisher"), [(0, "publish")])
    proc_ex = Exporter(ExporterConfig(collector.address, "py-processor"),
                       [(1, "flow_in"), (2, "flow_out")])
    publisher = Publisher(pub_ex, publisher=7)
    flow_in, flow_out = proc_ex.probe("flow_in"), proc_ex.probe("flow_out")

    # The publisher: contexts travel as MQTT user properties (text form), every tenth
    # with a traceparent beside it; odd streams through the envelope instead.
    wire = []
    for seq in range(PER_STREAM):
        for stream in range(STREAMS):
            ctx = publisher.context(stream, metric_count=stream + 1)
            publisher.published(ctx)
            if stream % 2:
                wire.append(("envelope", envelope.wrap(ctx, b"payload")))
            else:
                props = [("traceparent", TRACEPARENT)] if seq % 10 == 0 else []
                wire.append(("property", mqtt_property.inject_user_properties(ctx, props)))
    # Untraced and garbage messages are counted, not stamped.
    wire += [("property", [("other", "x")]), ("property", [("hoptrace", "ht1.AAAA")]),
             ("envelope", b"plain payload")]

    # The processor.
    stamps = {}
    for carrier, message in wire:
        if carrier == "property":
            got = flow_in.counted(mqtt_property.extract_user_properties, message)
        else:
            got = flow_in.counted(envelope.unwrap, message)
            got = got[0] if got else None
        if got is None:
            continue
        ctx = got.context
        flow_in.record(ctx)
        flow_out.record(ctx)
        stamps[ctx.key] = (dict(ctx.stamps), ctx.otel_trace_id, ctx.metric_count)

    pub_summary = pub_ex.shutdown()
    proc_summary = proc_ex.shutdown()
    assert pub_summary.clean and proc_summary.clean
    assert pub_summary.run_id == "py-e2e"
    assert pub_summary.counters.sent == N and pub_summary.counters.lost() == 0
    assert proc_summary.counters.sent == 2 * N and proc_summary.counters.lost() == 0
    assert (proc_summary.counters.not_traced, proc_summary.counters.bad_context) == (2, 1)
    assert len(stamps) == N

    run = collector.stop()
    acc = run["accounting"]
    assert acc["adds_up"] is True
    (p,) = acc["publishers"]
    assert (p["publisher"], p["sent"], p["complete"], p["incomplete"], p["unseen"]) == (7, N, N, 0, 0)
    assert p["sent_metrics"] == PER_STREAM * sum(s + 1 for s in range(STREAMS))
    assert acc["records_by_hop"] == {"publish": N, "flow_in": N, "flow_out": N}
    assert acc["records_lost_by_probes"] == 0
    assert (acc["duplicate_traces"], acc["late_records"], acc["in_flight"]) == (0, 0, 0)
    probes = {pr["process"]: pr for pr in run["probes"]}
    assert set(probes) == {"py-publisher", "py-processor"}
    assert all(pr["clean_close"] for pr in probes.values())
    assert probes["py-publisher"]["software"].startswith("hoptrace-probe-python")
    assert probes["py-publisher"]["counters"]["reported"] == N
    assert probes["py-processor"]["counters"] == {
        "reported": 2 * N, "queue_full": 0, "sent": 2 * N, "send_failed": 0, "reconnects": 0,
        "not_traced": 2, "bad_context": 1, "stamps_full": 0, "bad_traceparent": 0, "resent": 0,
        "evicted": 0, "lost_unacked": 0}
    # The clock status the exporters detected (chronyd, ptp4l, else the kernel) reached run.json.
    detected = this_host()
    status = detected.source()
    assert run["clock"] and all(c["source"] == detected.name and c["synced"] == status.synced
                                for c in run["clock"]), (run["clock"], detected.passed_over)

    # The Parquet holds exactly what Python stamped (pyarrow reading it).
    rows = read_traces(collector.run_dir)
    assert len(rows) == N
    for key, (by_hop, trace_id, metric_count) in stamps.items():
        row = rows[key]
        assert (row["publish_ns"], row["flow_in_ns"], row["flow_out_ns"]) == \
            (by_hop[0], by_hop[1], by_hop[2]), key
        assert row["status"] == "complete" and row["missing_mask"] == 0
        assert row["metric_count"] == metric_count
        got_id = row["otel_trace_id"]
        assert (bytes(got_id) if got_id is not None else None) == trace_id, key
    with_id = [k for k, (_, trace_id, _) in stamps.items() if trace_id is not None]
    assert len(with_id) == (STREAMS // 2) * (PER_STREAM // 10)

    # And through hoptrace's own SQL.
    (row,) = collector.sql("SELECT count(*) AS n, min(flow_in_ns - publish_ns) AS lo, "
                           "sum(CASE WHEN status = 'complete' THEN 1 ELSE 0 END) AS complete "
                           "FROM traces_raw")
    assert int(row["n"]) == N and int(row["complete"]) == N


def test_queue_full_while_the_collector_is_away_is_counted_in_the_run(tmp_path):
    """The collector is not there yet: the publisher's queue (100) fills and 900 records
    are dropped and counted; once the collector starts, the exporter connects (backoff)
    and delivers the rest; the run's accounting shows the loss instead of hiding it."""
    require_integration()
    port = free_port()
    ex = Exporter(ExporterConfig(f"127.0.0.1:{port}", "py-publisher", queue_capacity=100,
                                 backoff_min_s=0.05, backoff_max_s=0.2), [(0, "publish")])
    publisher = Publisher(ex, publisher=8)
    for i in range(1000):
        publisher.published(publisher.context(i % 2))
    assert ex.counters().queue_full == 900
    collector = Collector(tmp_path, "py-queue-full", write_pipeline(tmp_path / "pipeline.toml"),
                          port=port)
    assert ex.wait_connected(10), ex.last_error
    summary = ex.shutdown()
    assert summary.clean
    s = summary.counters
    assert (s.reported, s.queue_full, s.sent, s.send_failed) == (1000, 900, 100, 0)
    run = collector.stop()
    acc = run["accounting"]
    (p,) = acc["publishers"]
    assert (p["sent"], p["complete"], p["incomplete"], p["unseen"]) == (1000, 0, 100, 900)
    assert acc["adds_up"] is True
    assert acc["records_lost_by_probes"] == 900
    assert acc["records_by_hop"]["publish"] == 100
    (probe,) = run["probes"]
    assert probe["counters"]["queue_full"] == 900 and probe["clean_close"]
    assert acc["missing_by_hop"] == {"flow_in": 100, "flow_out": 100}


def test_tls_to_the_real_collector(tmp_path):
    """With --tls-cert the collector speaks only TLS: an exporter with the CA delivers
    (the certificate is checked against 127.0.0.1); one without TLS, or trusting another
    CA, is never welcomed and says why."""
    require_integration()
    make_certs = Path(__file__).resolve().parents[3] / "infra" / "tls" / "make-certs.sh"
    for d in ("pki", "other"):
        subprocess.run([str(make_certs), str(tmp_path / d), "127.0.0.1"], check=True,
                       capture_output=True, timeout=60)
    pki = tmp_path / "pki"
    c = Collector(tmp_path, "py-tls", write_pipeline(tmp_path / "pipeline.toml"),
                  extra=["--tls-cert", pki / "collector.pem", "--tls-key", pki / "collector-key.pem"])
    good = Exporter(ExporterConfig(c.address, "py-tls", tls_ca=str(pki / "ca.pem")), [(0, "publish")])
    plain = Exporter(ExporterConfig(c.address, "py-plain", backoff_min_s=0.05), [(0, "publish")])
    wrong_ca = Exporter(ExporterConfig(c.address, "py-wrong-ca", backoff_min_s=0.05,
                                       tls_ca=str(tmp_path / "other" / "ca.pem")), [(0, "publish")])
    publisher = Publisher(good, publisher=9)
    for i in range(100):
        publisher.published(publisher.context(0))
    summary = good.shutdown()
    assert summary.clean and summary.counters.sent == 100, good.last_error
    time.sleep(0.5)
    assert not plain.is_connected and not wrong_ca.is_connected
    assert "TLS" in wrong_ca.last_error and "certificate" in wrong_ca.last_error, wrong_ca.last_error
    assert plain.last_error is not None
    plain.shutdown(timeout_s=0.1)
    wrong_ca.shutdown(timeout_s=0.1)
    run = c.stop()
    assert [p["process"] for p in run["probes"]] == ["py-tls"]
    (p,) = run["accounting"]["publishers"]
    assert (p["sent"], p["incomplete"], p["unseen"]) == (100, 100, 0)
    assert run["connections"].get("tls_failed", 0) >= 2, run["connections"]


def test_token_right_delivers_wrong_or_missing_is_refused_and_counted(tmp_path, caplog):
    """`hoptrace collect --token`: an exporter with the token delivers; one with a wrong
    token, or none, is refused (Reject code 2) on every attempt: the collector counts it
    (`bad_token`) and lists no such probe, the exporter counts the rejections, logs the
    reason once as an error, and at shutdown counts what it held as send_failed."""
    require_integration()
    c = Collector(tmp_path, "py-token", write_pipeline(tmp_path / "pipeline.toml"),
                  extra=["--token", "s3cret-token"])
    good = Exporter(ExporterConfig(c.address, "py-token-good", token="s3cret-token"), [(0, "publish")])
    wrong = Exporter(ExporterConfig(c.address, "py-token-wrong", token="guess", backoff_min_s=0.05,
                                    backoff_max_s=0.1), [(0, "publish")])
    missing = Exporter(ExporterConfig(c.address, "py-token-missing", backoff_min_s=0.05,
                                      backoff_max_s=0.1), [(0, "publish")])
    publisher = Publisher(good, publisher=12)
    for i in range(200):
        publisher.published(publisher.context(i % 2))
    for ex in (wrong, missing):
        pub = Publisher(ex, publisher=13 if ex is wrong else 14)
        for _ in range(50):
            pub.published(pub.context(0))
    assert good.wait_connected(10), good.last_error
    deadline = time.time() + 10
    while (wrong.rejected < 3 or missing.rejected < 3) and time.time() < deadline:
        time.sleep(0.02)
    assert not wrong.is_connected and not missing.is_connected
    for ex in (wrong, missing):
        assert ex.rejected >= 3 and set(ex.rejections()) == {2}, ex.rejections()
        assert "rejected this probe (code 2)" in ex.last_error, ex.last_error
        assert "token" in ex.last_error, ex.last_error
    # One error per reason in the log, not one per attempt.
    token_errors = [r for r in caplog.records if r.levelname == "ERROR" and "code 2" in r.getMessage()]
    assert len(token_errors) == 2, [r.getMessage() for r in token_errors]
    assert "ExporterConfig(token=...)" in token_errors[0].getMessage()
    summary = good.shutdown()
    assert summary.clean and summary.counters.sent == 200 and summary.rejected == 0
    for ex in (wrong, missing):
        s = ex.shutdown(timeout_s=0.2)
        assert not s.clean and s.run_id is None and s.rejected >= 3
        assert (s.counters.reported, s.counters.sent, s.counters.send_failed) == (50, 0, 50)
    run = c.stop()
    assert [p["process"] for p in run["probes"]] == ["py-token-good"]
    assert run["connections"]["bad_token"] >= 6, run["connections"]
    (p,) = run["accounting"]["publishers"]
    assert (p["publisher"], p["sent"], p["incomplete"], p["unseen"]) == (12, 200, 200, 0)
    assert run["accounting"]["records_by_hop"]["publish"] == 200


def test_a_collector_killed_and_restarted_mid_run_loses_nothing_and_stores_each_record_once(tmp_path):
    """Protocol version 2 end to end: a publisher and a processor report 4000 messages
    (12,000 records) while `hoptrace collect` is killed with SIGKILL twice and started
    again with the same command (same --listen, same --run-id). The exporters keep stamping
    into their retention buffers while it is away, learn from Welcome what its log holds,
    and send the rest again: the run's accounting is exact, every record is in the Parquet
    exactly once, and what was sent again beyond the log was dropped as re-sent, never
    counted as the pipeline's duplicates."""
    require_integration()
    port = free_port()
    c = Collector(tmp_path, "py-crash", write_pipeline(tmp_path / "pipeline.toml"), port=port)
    fast = dict(backoff_min_s=0.02, backoff_max_s=0.2, shutdown_timeout_s=15)
    pub_ex = Exporter(ExporterConfig(c.address, "py-crash-publisher", **fast), [(0, "publish")])
    proc_ex = Exporter(ExporterConfig(c.address, "py-crash-processor", **fast),
                       [(1, "flow_in"), (2, "flow_out")])
    assert pub_ex.wait_connected(10) and proc_ex.wait_connected(10)
    publisher = Publisher(pub_ex, publisher=15)
    flow_in, flow_out = proc_ex.probe("flow_in"), proc_ex.probe("flow_out")
    total, kills_at, away = 4000, (1200, 2600), 200
    stamps = {}

    def one():
        ctx = publisher.context(len(stamps) % 4)
        publisher.published(ctx)
        flow_in.record(ctx)
        flow_out.record(ctx)
        stamps[ctx.key] = dict(ctx.stamps)

    kills = 0
    while len(stamps) < total:
        n = len(stamps)
        if n in kills_at:
            c.kill()
            kills += 1
            # Away for a while: the exporters retain what they stamp meanwhile.
            for _ in range(away):
                one()
                time.sleep(0.001)
            c.restart()
            continue
        one()
        if n % 50 == 0:
            time.sleep(0.002)  # traffic spread over about a second, so each kill falls mid-run
    assert kills == 2 and len(stamps) == total
    pub_summary, proc_summary = pub_ex.shutdown(), proc_ex.shutdown()
    for summary, n in ((pub_summary, total), (proc_summary, 2 * total)):
        s = summary.counters
        assert summary.clean and summary.unacknowledged == 0, summary
        assert (s.reported, s.sent, s.queue_full, s.send_failed, s.evicted, s.lost_unacked) == \
            (n, n, 0, 0, 0, 0), s
        assert s.reconnects == 2, s
    resent = pub_summary.counters.resent + proc_summary.counters.resent
    run = c.stop()
    acc = run["accounting"]
    assert acc["adds_up"] is True, acc
    (p,) = acc["publishers"]
    assert (p["sent"], p["complete"], p["incomplete"], p["unseen"]) == (total, total, 0, 0), acc
    assert acc["records_by_hop"] == {"publish": total, "flow_in": total, "flow_out": total}, acc
    assert (acc["duplicate_traces"], acc["late_records"], acc["records_lost_by_probes"]) == (0, 0, 0), acc
    restarts = run["restarts"]
    assert len(restarts) == 2, restarts
    assert sum(r["resent_records_dropped"] for r in restarts) <= resent
    # Every record in the Parquet once, with the stamps Python took.
    rows = read_traces(c.run_dir)
    assert len(rows) == total
    for key, by_hop in stamps.items():
        row = rows[key]
        assert (row["publish_ns"], row["flow_in_ns"], row["flow_out_ns"]) == (by_hop[0], by_hop[1], by_hop[2])
        assert row["status"] == "complete"


def test_a_collector_without_its_log_is_spoken_to_in_version_1(tmp_path):
    """`hoptrace collect --no-log` welcomes a version 2 Hello in version 1: the exporter
    sends plain Records frames, keeps nothing and waits for no Ack."""
    require_integration()
    c = Collector(tmp_path, "py-nolog", write_pipeline(tmp_path / "pipeline.toml"), extra=["--no-log"])
    ex = Exporter(ExporterConfig(c.address, "py-nolog"), [(0, "publish")])
    publisher = Publisher(ex, publisher=16)
    for i in range(300):
        publisher.published(publisher.context(i % 3))
    summary = ex.shutdown()
    s = summary.counters
    assert summary.clean and summary.unacknowledged == 0 and not ex._durable
    assert (s.sent, s.resent, s.evicted, s.lost_unacked) == (300, 0, 0, 0)
    run = c.stop()
    assert run["accounting"]["records_by_hop"]["publish"] == 300
    assert not run.get("restarts"), "nothing to replay without a log"
