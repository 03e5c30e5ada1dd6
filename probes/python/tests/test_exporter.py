"""The exporter against an in-test collector: the conversation (Hello, Clock, Records,
Counters, Goodbye), Reject, reconnects with backoff, and counting what cannot be
delivered."""

import socket
import time

import pytest

from fake_collector import FakeCollector, free_port
from hoptrace_probe import Exporter, ExporterConfig, Publisher, TraceContext, protocol
from hoptrace_probe.clock import StaticClockStatus


def config(address, **kw):
    kw.setdefault("clock_status", StaticClockStatus(detail="test"))
    kw.setdefault("counters_interval_s", 0.05)
    return ExporterConfig(address, "unit-test", host="test-host", **kw)


def test_conversation_in_order():
    fc = FakeCollector()
    ex = Exporter(config(fc.address), [(1, "flow_in"), (2, "flow_out")])
    assert ex.wait_connected(5) and ex.run_id == "fake-run"
    flow_in, flow_out = ex.probe("flow_in"), ex.probe(2)
    contexts = [TraceContext(5, s, q, 3, 77) for s in range(3) for q in range(100)]
    for c in contexts:
        flow_in.record(c)
        flow_out.record(c)
    summary = ex.shutdown()
    assert summary.clean and summary.run_id == "fake-run"
    assert summary.counters.by_name() == dict(
        reported=600, queue_full=0, sent=600, send_failed=0, reconnects=0, not_traced=0,
        bad_context=0, stamps_full=0, bad_traceparent=0, resent=0, evicted=0, lost_unacked=0)
    assert summary.unacknowledged == 0
    (c,) = fc.connections
    assert c.hello.hops == [(1, "flow_in"), (2, "flow_out")] and c.hello.version == 2
    assert c.seqs() == list(range(1, len(c.seqs()) + 1)), "numbered from 1, in order"
    assert c.hello.host == "test-host" and c.hello.process == "unit-test"
    assert c.hello.software.startswith("hoptrace-probe-python ")
    assert isinstance(c.frames[0], protocol.Clock) and c.frames[0].detail == "test"
    assert isinstance(c.frames[-1], protocol.Goodbye)
    final = c.frames[-2]
    assert isinstance(final, protocol.Counters)
    assert final.get(1) == 600 and final.get(3) == 600 and final.get(2) == 0
    got = sorted((r.hop, r.stream, r.sequence, r.stamp_ns) for r in c.records())
    want = sorted([(1, x.stream, x.sequence, x.stamps[0][1]) for x in contexts]
                  + [(2, x.stream, x.sequence, x.stamps[1][1]) for x in contexts])
    assert got == want
    assert ex.shutdown() is summary, "shutdown twice returns the same summary"
    fc.close()


def test_publisher_sends_cumulative_sent_frames_before_goodbye():
    fc = FakeCollector()
    ex = Exporter(config(fc.address), [(0, "publish")])
    pub = Publisher(ex, publisher=9)
    for stream in (4, 2):
        for _ in range(5):
            c = pub.context(stream, metric_count=10)
            pub.published(c)
    assert c.sequence == 4 and c.stamps[0][0] == 0
    ex.shutdown()
    (conn,) = fc.connections
    sent = conn.of(protocol.Sent)
    assert sent, "Sent frames reach the collector"
    assert sent[-1] == protocol.Sent(9, [protocol.SentEntry(2, 5, 50, 0, 4),
                                         protocol.SentEntry(4, 5, 50, 0, 4)])
    assert conn.frames.index(sent[-1]) < len(conn.frames) - 1
    assert len(conn.records()) == 10
    fc.close()


def test_sent_frames_of_many_streams_each_fit_a_frame_the_collector_reads():
    fc = FakeCollector()
    ex = Exporter(config(fc.address), [(0, "publish")])
    pub = Publisher(ex, publisher=3)
    streams = protocol.MAX_SENT_PER_FRAME + 1
    for stream in range(streams):
        pub.count_sent(TraceContext(3, stream, 0, 1, 0))
    frames = pub.sent_frames()
    assert len(frames) == 2
    got = []
    for f in frames:
        ty, body, n = protocol.split_frame(protocol.encode(f))
        got += protocol.decode(ty, body).entries
    assert sorted(e.stream for e in got) == list(range(streams))
    ex.shutdown(timeout_s=0.5)
    fc.close()


def test_reject_is_not_a_connection_and_is_retried():
    fc = FakeCollector(reject=protocol.Reject(3, "hop 'x' is not declared"))
    ex = Exporter(config(fc.address, backoff_min_s=0.01, backoff_max_s=0.02), [(0, "publish")])
    fc.wait(lambda: len(fc.connections) >= 3)
    assert not ex.is_connected
    assert "rejected" in ex.last_error and "code 3" in ex.last_error
    summary = ex.shutdown(timeout_s=0.2)
    assert not summary.clean and summary.run_id is None
    fc.close()


def test_undeliverable_records_are_counted_send_failed_and_queue_full():
    port = free_port()  # nothing listens there
    ex = Exporter(config(f"127.0.0.1:{port}", queue_capacity=10, backoff_min_s=0.01),
                  [(0, "publish")])
    p = ex.probe("publish")
    for i in range(100):
        p.record(TraceContext(1, 1, i))
    summary = ex.shutdown(timeout_s=0.3)
    s = summary.counters
    assert not summary.clean
    assert (s.reported, s.queue_full, s.send_failed, s.sent, s.lost()) == (100, 90, 10, 0, 100)


def test_backoff_doubles_until_the_collector_appears_then_delivers():
    port = free_port()
    ex = Exporter(config(f"127.0.0.1:{port}", backoff_min_s=0.05, backoff_max_s=0.4),
                  [(0, "publish")])
    p = ex.probe(0)
    for i in range(20):
        p.record(TraceContext(1, 1, i))
    time.sleep(1.2)  # attempts at about 0, 0.05, 0.15, 0.35, 0.75 s: a few, not hundreds
    attempts_error = ex.last_error
    fc = FakeCollector(port=port)
    fc.wait(lambda: fc.connections and fc.connections[0].hello is not None, timeout=3)
    summary = ex.shutdown()
    assert "connect to" in attempts_error
    assert summary.clean and summary.counters.reconnects == 0
    assert len(fc.connections[0].records()) == 20
    fc.close()


def test_backoff_intervals_grow():
    """A listener that accepts and closes at once: every attempt fails after connecting
    (no Welcome); the gaps between attempts double up to the maximum."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    times = []
    import threading

    def accept():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            times.append(time.monotonic())
            conn.close()

    threading.Thread(target=accept, daemon=True).start()
    ex = Exporter(config("127.0.0.1:%d" % srv.getsockname()[1], backoff_min_s=0.05,
                         backoff_max_s=0.2), [(0, "publish")])
    deadline = time.monotonic() + 5
    while len(times) < 6 and time.monotonic() < deadline:
        time.sleep(0.01)
    ex.shutdown(timeout_s=0.1)
    srv.close()
    gaps = [b - a for a, b in zip(times, times[1:])][:5]
    assert len(gaps) == 5, times
    # 0.05, 0.1, 0.2, 0.2, 0.2 (plus scheduling noise)
    for gap, want in zip(gaps, [0.05, 0.1, 0.2, 0.2, 0.2]):
        assert want * 0.8 <= gap <= want + 0.15, gaps


def test_reconnects_after_the_collector_drops_the_connection():
    fc = FakeCollector(close_after=2)  # Clock and Counters, then it hangs up
    ex = Exporter(config(fc.address, backoff_min_s=0.01), [(0, "publish")])
    fc.wait(lambda: len(fc.connections) >= 2)
    fc.close_after = None
    fc.wait(lambda: ex.counters().reconnects >= 1 and ex.is_connected)
    p = ex.probe(0)
    for i in range(10):
        p.record(TraceContext(1, 1, i))
    summary = ex.shutdown()
    assert summary.clean and summary.counters.reconnects >= 1
    assert summary.counters.sent == 10 and summary.counters.lost() == 0
    assert sum(len(c.records()) for c in fc.connections) == 10
    fc.close()


def test_invalid_hop_lists_and_unknown_hops():
    with pytest.raises(ValueError):
        Exporter(config("127.0.0.1:1"), [])
    with pytest.raises(ValueError):
        Exporter(config("127.0.0.1:1"), [(1, "a"), (1, "b")])
    with pytest.raises(ValueError):
        Exporter(config("127.0.0.1:1"), [(i, f"h{i}") for i in range(17)])
    with pytest.raises(ValueError):
        Exporter(config("nohostport"), [(0, "publish")])
    ex = Exporter(config("127.0.0.1:1", backoff_min_s=0.01), [(0, "publish")])
    with pytest.raises(ValueError):
        ex.probe("flow_in")
    with pytest.raises(ValueError):
        ex.probe(1)
    ex.shutdown(timeout_s=0.05)
