"""The probe's hot path: in-band stamp, out-of-band record, a bounded queue whose
overflow is counted (never silent), also from many threads at once."""

import threading

import pytest

from hoptrace_probe import LocalQueue, NoStamp, TraceContext
from hoptrace_probe.context import MAX_STAMPS
from hoptrace_probe.protocol import Record


def ctx(seq=42, trace_id=None):
    return TraceContext(1, 7, seq, 10, 100, trace_id)


def test_record_stamps_in_band_and_reports_out_of_band():
    q = LocalQueue(4)
    p = q.probe(3, clock=lambda: 1_000)
    c = ctx(trace_id=b"\x01" * 16)
    assert p.record(c) == 1_000
    assert c.stamps == [(3, 1_000)]
    (r,) = q.drain()
    assert r == Record(3, 1, 7, 42, 1_000, 10, 100, b"\x01" * 16)


def test_the_record_is_a_copy_of_the_key_not_a_reference():
    q = LocalQueue(4)
    p = q.probe(0, clock=lambda: 5)
    c = ctx(seq=1)
    p.record(c)
    c.sequence = 2  # a caller that reuses its context object
    assert q.drain()[0].sequence == 1


def test_full_queue_is_counted_never_silent():
    q = LocalQueue(2)
    p = q.probe(0)
    c = ctx()
    p.stamp(c)
    assert p.report(c) and p.report(c)
    assert p.report(c) is False
    p.record(c)
    s = q.counters()
    assert (s.reported, s.queue_full, s.sent, s.lost()) == (4, 2, 0, 2)
    q.drain()
    s = q.counters()
    assert (s.reported, s.queue_full, s.sent) == (4, 2, 2)


def test_report_without_stamp_is_an_error():
    with pytest.raises(NoStamp):
        LocalQueue(2).probe(0).report(ctx())


def test_report_uses_the_most_recent_stamp_of_the_hop():
    q = LocalQueue(4)
    p = q.probe(1)
    c = TraceContext(1, 1, 1, stamps=[(1, 10), (2, 20), (1, 30)])
    p.report(c)
    assert q.drain()[0].stamp_ns == 30


def test_stamps_full_is_counted_and_stamp_still_reportable():
    q = LocalQueue(64)
    p = q.probe(1)
    c = ctx()
    for _ in range(MAX_STAMPS):
        p.stamp(c)
    before = list(c.stamps)
    extra = p.stamp(c)
    assert c.stamps == before and q.counters().stamps_full == 1
    assert p.report_stamp(c, extra)
    p.record(c)
    p.record_at(c, 5)
    assert q.counters().stamps_full == 3
    assert [r.stamp_ns for r in q.drain()][-1] == 5


def test_counts_from_many_threads_add_up_exactly():
    q = LocalQueue(1000)
    p = q.probe(0)
    threads, per_thread = 8, 20_000

    def work():
        c = ctx()
        for _ in range(per_thread):
            p.record(c) if len(c.stamps) < MAX_STAMPS else p.report_stamp(c, 1)

    ts = [threading.Thread(target=work) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    s = q.counters()
    assert s.reported == threads * per_thread
    queued = len(q.shared.queue)
    assert queued <= 1000 + threads, "bounded (a racing append may pass the bound by one per thread)"
    assert s.queue_full + queued == threads * per_thread
