"""The probe never holds up the process it lives in, whatever the collector does: against
collectors that refuse, never accept, accept and never read, send garbage, close after
Hello, answer late, or restart again and again, every call a host makes on its message
path (``record``, ``published``, ``send_frame``) returns at once, everything the exporter
holds stays within its configured bounds, and what is dropped is counted and reaches the
collector once one behaves.

The time asserted (``MAX_CALL_S``) bounds blocking, not speed: a call that waited for the
network, a lock held across I/O or a full queue would take the connect, write or Welcome
timeouts (0.3 s and more here), not milliseconds. On a machine busy with other work a call
can also take long because the process waited for a CPU; where the slowest call of a batch
passes half the bound, the time the process's threads spent waiting for a CPU during that
batch (Linux's schedstat run delay) is taken off it, so that the test measures the probe,
not the machine's load."""

import os
import time
from typing import List, NamedTuple

import pytest

import hostile
from fake_collector import FakeCollector, free_port
from hostile import HostileCollector, Restarter, wait_for
from hoptrace_probe import Exporter, ExporterConfig, Publisher, TraceContext, protocol
from hoptrace_probe.clock import StaticClockStatus
from hoptrace_probe.control import ControlFrames
from hoptrace_probe.protocol import SentEntry

MAX_CALL_S = 0.05

QUEUE = 2000
RETENTION = 64 << 10
CONTROL = 8
STREAMS = 3
TAP_IDS = (64, 65)


def config(address, **kw):
    kw.setdefault("clock_status", StaticClockStatus(detail="test"))
    kw.setdefault("counters_interval_s", 0.05)
    kw.setdefault("backoff_min_s", 0.01)
    kw.setdefault("backoff_max_s", 0.1)
    kw.setdefault("connect_timeout_s", 0.3)
    kw.setdefault("write_timeout_s", 0.3)
    kw.setdefault("queue_capacity", QUEUE)
    kw.setdefault("retention_bytes", RETENTION)
    kw.setdefault("max_control_frames", CONTROL)
    return ExporterConfig(address, "hostile-test", host="test-host", **kw)


class Load(NamedTuple):
    calls: int
    records: int
    slowest_s: float
    peak_queued: int
    peak_retained: int
    peak_evicted_entries: int
    peak_control: tuple
    refused_frames: int
    frame_records: int
    last_sent: List[SentEntry]


def run_delay_s() -> float:
    """Seconds the threads of this process have waited for a CPU (0 where unknown)."""
    total = 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return 0.0
    for t in tasks:
        try:
            with open(f"/proc/self/task/{t}/schedstat") as f:
                total += int(f.read().split()[1])
        except (OSError, IndexError, ValueError):
            pass
    return total / 1e9


def host_load(ex: Exporter, seconds: float) -> Load:
    """What a host does on its message path for `seconds`: records at two hops, a
    publisher's messages, and now and then its own Sent, Counters, Clock and Records frames;
    every call timed, the exporter's footprint sampled."""
    flow_in, flow_out = ex.probe("flow_in"), ex.probe("flow_out")
    pub = Publisher(ex, publisher=7)
    calls = records = refused = frame_records = 0
    slowest = 0.0
    peak = [0, 0, 0, (0, 0, 0, 0)]
    sent = {s: (0, 0) for s in range(STREAMS)}
    seq = 0
    end = time.monotonic() + seconds
    clock = time.perf_counter
    while time.monotonic() < end:
        batch_slowest = 0.0
        waited0 = run_delay_s()
        for _ in range(200):
            ctx = TraceContext(1, seq % STREAMS, seq // STREAMS)
            seq += 1
            t0 = clock()
            flow_in.record(ctx)
            flow_out.record(ctx)
            t1 = clock()
            batch_slowest = max(batch_slowest, t1 - t0)
            records += 2
            calls += 2
            if seq % 50 == 0:
                ctx = pub.context(stream=1)
                t0 = clock()
                pub.published(ctx)
                batch_slowest = max(batch_slowest, clock() - t0)
                records += 1
                calls += 1
            if seq % 100 == 0:
                # A publisher of its own: cumulative Sent frames, tap-like counters, a
                # clock status; and a Records frame of its own now and then.
                s = (seq // 100) % STREAMS
                m, _ = sent[s]
                sent[s] = (m + 100, seq)
                frames = [protocol.Sent(9, [SentEntry(s, m + 100, m + 100, 0, m + 99)]),
                          protocol.Counters(time.time_ns(), [(i, seq) for i in TAP_IDS]),
                          protocol.Clock(time.time_ns(), 4, True, 0, 0, 1000, "host")]
                if seq % 1000 == 0:
                    # One record, handed over as a frame: counted as one reported.
                    frames.append(protocol.Records([protocol.from_queued(
                        (0, 1, 1, 0, 10 ** 9 + seq, 1, 1, 1))]))
                    records += 1
                    frame_records += 1
                for f in frames:
                    t0 = clock()
                    ok = ex.send_frame(f)
                    batch_slowest = max(batch_slowest, clock() - t0)
                    calls += 1
                    if not ok:
                        refused += 1
        if batch_slowest > MAX_CALL_S / 2:
            batch_slowest -= run_delay_s() - waited0
        slowest = max(slowest, batch_slowest)
        fp = ex.footprint()
        peak = [max(peak[0], fp.queued), max(peak[1], fp.retained_bytes),
                max(peak[2], fp.evicted_entries), tuple(map(max, peak[3], fp.control))]
        # Pacing: a host that also does other work (the sleep is the workload, not a wait
        # for a condition). It gives the exporter thread its turns, as a real host does.
        time.sleep(0.001)
    last_sent = [SentEntry(s, m, m, 0, m - 1) for s, (m, _) in sorted(sent.items()) if m]
    return Load(calls, records, slowest, peak[0], peak[1], peak[2], peak[3], refused,
                frame_records, last_sent)


def assert_bounded(load: Load, ex: Exporter) -> None:
    assert load.slowest_s < MAX_CALL_S, f"a host call took {load.slowest_s * 1e3:.1f} ms"
    assert load.calls > 5000, "thousands of calls measured"
    cfg = ex.config
    assert load.peak_queued <= cfg.queue_capacity
    # One frame larger than the rest may pass the bound while it is being written.
    assert load.peak_retained <= cfg.retention_bytes + protocol.MAX_FRAME_LEN
    assert load.peak_evicted_entries <= cfg.max_evicted_frames + 1
    sent_entries, counter_ids, clock, other = load.peak_control
    assert sent_entries <= STREAMS and counter_ids <= len(TAP_IDS) and clock <= 1
    assert other <= CONTROL


def recover(ex: Exporter, port: int) -> FakeCollector:
    """A collector that behaves, on the same port: what was counted reaches it."""
    fc = FakeCollector(port=port)
    wait_for(lambda: ex.is_connected, 10, "a connection to the collector that behaves")
    local = ex.counters()
    fc.wait(lambda: any(c.counters().get(protocol.CounterId.QUEUE_FULL, -1) >= local.queue_full
                        for c in fc.connections))
    return fc


def check_delivered_after_recovery(ex: Exporter, fc: FakeCollector, load: Load,
                                   send_again: bool = False) -> None:
    """What was counted reaches the collector that behaves; so does the newest of the host's
    own Sent entries: kept while no collector took them, or, where a collector took them
    and lost them (`send_again`), sent again as a publisher does every second."""
    if send_again:
        ex.send_frame(protocol.Sent(9, load.last_sent))
    summary = ex.shutdown(timeout_s=5)
    assert summary.clean
    final = fc.connections[-1].counters()
    s = summary.counters
    assert final.get(protocol.CounterId.QUEUE_FULL, 0) == s.queue_full
    assert final.get(protocol.CounterId.REPORTED, 0) == s.reported == load.records
    assert final.get(protocol.CounterId.EVICTED, 0) == s.evicted
    # Records frames that send_frame refused were counted as queue_full too.
    assert s.queue_full >= load.refused_frames
    # The host's own Sent frames: the newest entry of each stream arrived.
    got = {}
    for c in fc.connections:
        for f in c.of(protocol.Sent):
            if f.publisher == 9:
                for e in f.entries:
                    got[e.stream] = e
    assert sorted(got.values()) == load.last_sent
    fc.close()


@pytest.mark.parametrize("mode", ["refused", hostile.NEVER_ACCEPT, hostile.SILENT,
                                  hostile.GARBAGE, hostile.CLOSE_AFTER_HELLO])
def test_a_collector_that_never_welcomes_costs_the_host_nothing(mode):
    if mode == "refused":
        port, server = free_port(), None
    else:
        server = HostileCollector(mode)
        port = server.port
    ex = Exporter(config(f"127.0.0.1:{port}"), [(1, "flow_in"), (2, "flow_out"), (0, "publish")])
    load = host_load(ex, 1.5)
    assert not ex.is_connected and ex.last_error
    assert_bounded(load, ex)
    c = ex.counters()
    assert c.reported == load.records
    assert c.queue_full >= load.records - QUEUE - CONTROL, "beyond the queues every record is counted"
    assert load.refused_frames > 0, "Records frames beyond max_control_frames are refused"
    if server is not None:
        assert server.accepted or mode == hostile.NEVER_ACCEPT
        server.close()
    check_delivered_after_recovery(ex, recover(ex, port), load)


@pytest.mark.parametrize("mode", [hostile.WELCOME_THEN_DEAF, hostile.WELCOME_THEN_GARBAGE])
def test_a_collector_that_welcomes_then_misbehaves_costs_the_host_nothing(mode):
    server = HostileCollector(mode)
    ex = Exporter(config(server.address), [(1, "flow_in"), (2, "flow_out"), (0, "publish")])
    load = host_load(ex, 2.0)
    assert_bounded(load, ex)
    assert server.hellos >= 2, "the exporter gave up on the connection and tried again"
    c = ex.counters()
    assert c.reported == load.records
    if mode == hostile.WELCOME_THEN_DEAF:
        # Writes block, the queue fills; the retention buffer overflows.
        assert c.queue_full > 0 and c.evicted > 0
        assert "write failed" in (ex.last_error or "") or "timed out" in (ex.last_error or "")
    # A connection lost soon after its Welcome backs off like a failed attempt: no tight
    # loop of reconnections, each sending the retention buffer again.
    assert c.reconnects <= 30, c
    server.close()
    check_delivered_after_recovery(ex, recover(ex, server.port), load, send_again=True)


def test_a_late_welcome_costs_the_host_nothing():
    server = HostileCollector(hostile.SLOW_WELCOME, delay_s=2.5)
    ex = Exporter(config(server.address, connect_timeout_s=5.0), [(1, "flow_in"), (2, "flow_out"),
                                                                  (0, "publish")])
    t0 = time.monotonic()
    load = host_load(ex, 3.5)
    assert_bounded(load, ex)
    wait_for(lambda: ex.is_connected, 5, "the late Welcome")
    assert time.monotonic() - t0 >= 2.5
    assert server.hellos == 1, "one attempt waited for the late Welcome"
    ex.shutdown(timeout_s=0.5)
    server.close()


def test_a_collector_that_restarts_every_200_ms_costs_the_host_nothing():
    fc = FakeCollector()
    restarter = Restarter(fc, every_s=0.2)
    ex = Exporter(config(fc.address), [(1, "flow_in"), (2, "flow_out"), (0, "publish")])
    load = host_load(ex, 2.0)
    restarter.stop()
    assert restarter.drops >= 5
    assert_bounded(load, ex)
    wait_for(lambda: ex.is_connected, 5, "the connection after the last restart")
    summary = ex.shutdown(timeout_s=5)
    assert summary.clean
    s = summary.counters
    assert s.reconnects >= 3 and s.reported == load.records
    # The collector holds every frame it received (it restarts keeping its log): nothing
    # evicted is lost, and every record is delivered or counted.
    # (Records frames given to send_frame are not kept for re-sending: not counted here.)
    delivered = {(r.hop, r.stream, r.sequence, r.stamp_ns) for c in fc.connections
                 for r in c.records() if r.sequence < 10 ** 9}
    assert len(delivered) + s.queue_full + s.lost_unacked + s.send_failed \
        >= load.records - load.frame_records
    final = fc.connections[-1].counters()
    assert final.get(protocol.CounterId.QUEUE_FULL, 0) == s.queue_full
    fc.close()


def test_shutdown_is_bounded_with_a_collector_that_stopped_reading():
    server = HostileCollector(hostile.WELCOME_THEN_DEAF)
    ex = Exporter(config(server.address, write_timeout_s=10.0), [(1, "flow_in"), (2, "flow_out"),
                                                                 (0, "publish")])
    wait_for(lambda: ex.is_connected, 5, "welcome")
    p = ex.probe("flow_in")
    # Records until both socket buffers are full and the exporter's write blocks.
    deadline = time.monotonic() + 20
    i = 0
    while True:
        for _ in range(50_000):
            p.record(TraceContext(1, 1, i))
            i += 1
        sent = ex.counters().sent
        # A still moment is what is checked: records wait and the exporter wrote nothing
        # for 0.2 s, so it is blocked in a write.
        time.sleep(0.2)
        if ex.counters().sent == sent and ex._shared.queue:
            break
        assert time.monotonic() < deadline, "the exporter's writes never blocked"
    t0 = time.monotonic()
    summary = ex.shutdown(timeout_s=0.5)
    took = time.monotonic() - t0
    # Cut to the shutdown's time, not the 10 s write timeout.
    assert took < 2.5, f"shutdown took {took:.1f} s"
    s = summary.counters
    assert s.reported == i
    # Never acknowledged: what was written may be held, what was not is counted.
    assert summary.unacknowledged + s.queue_full + s.send_failed + s.lost_unacked > 0
    server.close()


def test_a_collector_that_never_acknowledges_cannot_grow_the_eviction_bookkeeping():
    fc = FakeCollector(ack=False)
    ex = Exporter(config(fc.address, retention_bytes=4096, max_evicted_frames=16, max_batch=10),
                  [(1, "flow_in"), (2, "flow_out"), (0, "publish")])
    wait_for(lambda: ex.is_connected, 5, "welcome")
    p = ex.probe("flow_in")
    peak = 0
    for i in range(3000):
        p.record(TraceContext(1, 1, i))
        if i % 10 == 9:
            wait_for(lambda: not ex._shared.queue, 5, "the exporter taking records")
            peak = max(peak, ex.footprint().evicted_entries)
    assert peak <= 17
    assert ex.counters().evicted > 0 and ex.counters().reconnects >= 1, \
        "past max_evicted_frames the exporter connected again to learn what the collector holds"
    fc.ack = True
    summary = ex.shutdown(timeout_s=5)
    s = summary.counters
    # The collector received (and holds) every frame: nothing evicted was lost.
    assert summary.clean and s.lost_unacked == 0 and s.evicted > 0
    assert {r.sequence for c in fc.connections for r in c.records()} == set(range(3000))
    fc.close()


def test_control_frames_keep_the_newest_of_what_supersedes_and_bound_the_rest():
    cf = ControlFrames(max_other=2)
    for n in range(1, 1001):
        cf.push(protocol.Sent(1, [SentEntry(0, n, n, 0, n - 1), SentEntry(5, 2 * n, n, 0, 2 * n - 1)]))
        cf.push(protocol.Sent(2, [SentEntry(0, 3 * n, n, 0, 3 * n - 1)]))
        cf.push(protocol.Counters(n, [(64, n), (65, 2 * n)]))
        cf.push(protocol.Counters(n, [(66, 3 * n)]))
        cf.push(protocol.Clock(n, 2, True, 0, n, 10, "chrony"))
    assert tuple(cf.footprint()) == (3, 3, 1, 0)
    rec = protocol.Records([protocol.Record(1, 1, 0, 1, 5, 1, 1)])
    assert cf.push(rec) and cf.push(rec) and not cf.push(rec)
    assert (cf.refused, cf.refused_records) == (1, 1)
    with pytest.raises(ValueError):
        cf.push(protocol.Goodbye())
    frames = cf.take()
    assert frames == [
        protocol.Clock(1000, 2, True, 0, 1000, 10, "chrony"),
        protocol.Sent(1, [SentEntry(0, 1000, 1000, 0, 999), SentEntry(5, 2000, 1000, 0, 1999)]),
        protocol.Sent(2, [SentEntry(0, 3000, 1000, 0, 2999)]),
        protocol.Counters(1000, [(64, 1000), (65, 2000), (66, 3000)]),
        rec, rec,
    ]
    assert not cf and cf.take() == []


def test_control_frames_split_what_one_frame_cannot_hold():
    cf = ControlFrames(max_other=0)
    streams = protocol.MAX_SENT_PER_FRAME + 3
    cf.push(protocol.Sent(4, [SentEntry(s, 1, 1, 0, 0) for s in range(streams)]))
    cf.push(protocol.Counters(1, [(i, i) for i in range(300)]))
    frames = cf.take()
    assert [type(f).__name__ for f in frames] == ["Sent", "Sent", "Counters", "Counters"]
    for f in frames:
        protocol.encode(f)  # each fits in a frame
    assert sum(len(f.entries) for f in frames[:2]) == streams
    assert sum(len(f.values) for f in frames[2:]) == 300
