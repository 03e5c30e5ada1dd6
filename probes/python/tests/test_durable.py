"""Collector protocol version 2 in the exporter, against an in-test collector: numbered
frames, Acks, re-sending what the collector does not hold after a reconnection, the
bounded retention buffer while the collector is away (evictions counted), and speaking
version 1 to a version 1 collector. The end-to-end check against the real collector, killed
and restarted, is test_collector_e2e.py."""

import time

from fake_collector import FakeCollector, free_port
from hoptrace_probe import Exporter, ExporterConfig, TraceContext, protocol
from hoptrace_probe.clock import StaticClockStatus
from hoptrace_probe.retention import Retained, Retention


def config(address, **kw):
    kw.setdefault("clock_status", StaticClockStatus(detail="test"))
    kw.setdefault("counters_interval_s", 0.05)
    kw.setdefault("backoff_min_s", 0.01)
    kw.setdefault("backoff_max_s", 0.05)
    return ExporterConfig(address, "durable-test", host="test-host", **kw)


def report_in_frames(ex, frames, per_frame, start=0):
    """Reports `frames` batches of `per_frame` records, waiting for the exporter to take
    each batch before the next (so each is a frame of its own)."""
    p = ex.probe(0)
    seq = start
    for _ in range(frames):
        for _ in range(per_frame):
            p.record(TraceContext(1, 1, seq))
            seq += 1
        deadline = time.monotonic() + 5
        while ex._shared.queue and time.monotonic() < deadline:
            time.sleep(0.002)
        assert not ex._shared.queue, "the exporter took the batch"
    return seq


def all_records(fc):
    return [(r.sequence) for c in fc.connections for r in c.records()]


def test_a_version_1_collector_is_spoken_to_in_version_1():
    fc = FakeCollector(version=1)
    ex = Exporter(config(fc.address), [(0, "publish")])
    p = ex.probe(0)
    for i in range(50):
        p.record(TraceContext(1, 1, i))
    summary = ex.shutdown()
    assert summary.clean and summary.counters.sent == 50 and summary.rejected == 0
    assert [c.hello.version for c in fc.connections] == [2, 1], "refused in 2, welcomed in 1"
    assert summary.counters.reconnects == 0
    last = fc.connections[-1]
    assert not last.of(protocol.SeqRecords) and len(last.records()) == 50
    fc.close()


def test_offering_version_1_only():
    fc = FakeCollector()
    ex = Exporter(config(fc.address, protocol_version=1), [(0, "publish")])
    ex.probe(0).record(TraceContext(1, 1, 0))
    assert ex.shutdown().clean
    (c,) = fc.connections
    assert c.hello.version == 1 and len(c.of(protocol.Records)) == 1
    fc.close()


def test_frames_not_acknowledged_are_sent_again_after_a_reconnection():
    fc = FakeCollector(ack=False)
    ex = Exporter(config(fc.address), [(0, "publish")])
    assert ex.wait_connected(5)
    report_in_frames(ex, 3, 10)
    fc.wait(lambda: len(fc.connections[0].records()) == 30)
    assert fc.connections[0].seqs() == [1, 2, 3]
    # The collector dies having made frame 1 durable and lost 2 and 3; it comes back
    # acknowledging again.
    fc.held = {fc.connections[0].hello.instance_id: 1}
    fc.ack = True
    fc.drop_connections()
    fc.wait(lambda: len(fc.connections) == 2 and ex.is_connected)
    report_in_frames(ex, 1, 5, start=30)
    summary = ex.shutdown()
    s = summary.counters
    assert summary.clean and summary.unacknowledged == 0
    assert (s.reported, s.sent, s.resent, s.evicted, s.lost_unacked, s.send_failed) == (35, 35, 20, 0, 0, 0)
    second = fc.connections[1]
    assert second.seqs() == [2, 3, 4], "frames 2 and 3 again, in order, before any new one"
    # Across both connections the collector got every record, 2 and 3's twice.
    assert sorted(set(all_records(fc))) == list(range(35))
    fc.close()


def test_shutdown_reports_what_the_collector_has_not_acknowledged():
    fc = FakeCollector(ack=False)
    ex = Exporter(config(fc.address, shutdown_timeout_s=0.3), [(0, "publish")])
    for i in range(20):
        ex.probe(0).record(TraceContext(1, 1, i))
    summary = ex.shutdown()
    assert summary.clean, "Goodbye reached the collector"
    assert summary.unacknowledged == 20 and summary.counters.sent == 20
    assert summary.counters.lost() == 0, "not lost: the collector may hold them"
    fc.close()


def test_while_the_collector_is_away_records_wait_numbered_and_the_bound_evicts_the_oldest():
    port = free_port()
    fc = FakeCollector(port=port)
    # 10 records a frame: 4 + 1 + 8 + 4 + 360 = 377 bytes; the buffer holds two.
    ex = Exporter(config(fc.address, retention_bytes=800), [(0, "publish")])
    assert ex.wait_connected(5)
    fc.close()  # away: connections and listener gone
    deadline = time.monotonic() + 5
    while ex.is_connected and time.monotonic() < deadline:
        time.sleep(0.005)
    assert not ex.is_connected
    report_in_frames(ex, 6, 10)
    mid = ex.counters()
    assert (mid.evicted, mid.sent, mid.lost_unacked) == (40, 0, 0)
    assert ex._retention.footprint()[0] <= 800
    # A collector holding nothing of this instance: the evicted frames are lost, counted;
    # the two kept are sent.
    fc2 = FakeCollector(port=port)
    fc2.wait(lambda: ex.is_connected)
    summary = ex.shutdown()
    s = summary.counters
    assert summary.clean
    assert (s.reported, s.sent, s.resent, s.evicted, s.lost_unacked, s.send_failed) == (60, 20, 0, 40, 40, 0)
    assert s.lost() == 40
    assert fc2.connections[0].seqs() == [5, 6]
    assert sorted(all_records(fc2)) == list(range(40, 60))
    fc2.close()


def test_records_numbered_while_away_and_never_sent_are_send_failed():
    port = free_port()
    fc = FakeCollector(port=port)
    ex = Exporter(config(fc.address), [(0, "publish")])
    assert ex.wait_connected(5)
    fc.close()
    while ex.is_connected:
        time.sleep(0.005)
    report_in_frames(ex, 2, 10)
    summary = ex.shutdown(timeout_s=0.1)
    s = summary.counters
    assert not summary.clean
    assert (s.reported, s.sent, s.send_failed, s.lost_unacked) == (20, 0, 20, 0)


# ------------------------------------------------------------------ the retention buffer
# The Rust probe's tests of probe/src/retention.rs, case for case.

def frame(seq, records, size=100, written=True):
    return Retained(seq, records, bytes(size), written)


def test_acks_release_frames_and_the_bound_evicts_the_oldest():
    r = Retention(250)
    assert r.push(frame(1, 10)) == 0
    assert r.push(frame(2, 20)) == 0
    assert r.push(frame(3, 30)) == 10
    assert r.unacked_records() == 50
    r.ack(2)
    assert r.unacked_records() == 30
    assert [f.seq for f in r.frames()] == [3]
    assert r.resume(3) == 0, "frame 1 was acknowledged after all: not lost"
    assert r.unacked_records() == 0


def test_evicted_frames_the_collector_never_held_are_lost_exactly():
    r = Retention(250)
    for seq in range(1, 7):
        r.push(frame(seq, seq * 10))
    assert r.resume(2) == 30 + 40
    assert [f.seq for f in r.frames()] == [5, 6]
    assert r.acked == 2
    assert r.resume(2) == 0


def test_a_long_outage_stays_within_the_bound_and_counts_every_record():
    bound = 64 * 1024
    r = Retention(bound)
    dropped = pushed = most = 0
    for seq in range(1, 200_001):
        size = bound + 1 if seq % 1000 == 0 else 200
        dropped += r.push(frame(seq, 3, size, written=False))
        pushed += 3
        b, entries = r.footprint()
        assert b <= bound
        most = max(most, entries)
    assert most <= 1
    kept = r.unacked_records()
    assert dropped + kept == pushed
    assert r.evicted_unresolved() == (0, dropped)
    assert r.resume(0) == dropped
    assert r.evicted_unresolved() == (0, 0)
    assert r.unacked_records() == kept


def test_an_oversized_frame_written_after_eviction_is_not_lost_if_held():
    r = Retention(100)
    assert r.push(frame(1, 5, 500, written=False)) == 5
    r.mark_written(1)
    assert r.evicted_unresolved() == (5, 0)
    assert r.resume(1) == 0
    assert r.push(frame(2, 7, 500, written=False)) == 7
    assert r.push(frame(3, 1, 10, written=False)) == 0
    assert r.evicted_unresolved() == (0, 7)
    assert r.resume(1) == 7


def test_resume_below_what_was_acknowledged_keeps_the_lower_mark():
    r = Retention(1000)
    r.push(frame(1, 1))
    r.ack(1)
    r.push(frame(2, 2))
    assert r.resume(0) == 0
    assert [f.seq for f in r.frames()] == [2]
