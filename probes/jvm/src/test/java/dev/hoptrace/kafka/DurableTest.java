package dev.hoptrace.kafka;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * Protocol version 2 ({@code docs/collector-protocol.md} "0x07 SeqRecords"): records go in
 * numbered frames kept until the collector acknowledges them; a collector that comes back
 * says what it holds and gets the rest again; while it is away the frames wait in the
 * retention buffer; a full buffer drops the oldest and counts them; and nothing is dropped
 * without a count: reported = sent + queue_full + send_failed + lost_unacked.
 */
@Timeout(value = 120, unit = TimeUnit.SECONDS)
class DurableTest {
    // ------------------------------------------------------------------------------------
    // The retention buffer alone

    static Retention.Frame frame(long seq, int records, int bytes) {
        return new Retention.Frame(seq, records, new byte[bytes]);
    }

    @Test
    void theRetentionBufferKeepsUntilAckedAndAccountsForEveryEviction() {
        Retention r = new Retention(300);
        for (long s = 1; s <= 3; s++) {
            assertEquals(0, r.push(frame(s, 10, 100)));
            r.markWritten(s);
        }
        assertEquals(300, r.bytes());
        assertEquals(30, r.unackedRecords());
        // A fourth frame drops the oldest, which was written: its fate is the collector's to tell.
        assertEquals(10, r.push(frame(4, 10, 100)));
        r.markWritten(4);
        assertEquals(300, r.bytes());
        assertEquals(1, r.evictedEntries());
        assertEquals(10, r.evictedWrittenUnresolved());
        assertEquals(0, r.evictedUnwrittenUnresolved());
        r.ack(2);
        assertEquals(2, r.acked());
        assertEquals(0, r.evictedEntries(), "frame 1 is acknowledged with 2: not lost");
        assertEquals(20, r.unackedRecords());
        r.ack(1); // acks only grow
        assertEquals(2, r.acked());
        // Frames numbered while the collector is away, never written: an evicted one is lost
        // for certain, kept as a count only.
        for (long s = 5; s <= 9; s++) {
            r.push(frame(s, 10, 100));
        }
        assertEquals(300, r.bytes());
        assertEquals(30, r.unwrittenRecords(), "7, 8 and 9 kept unwritten");
        assertEquals(20, r.evictedUnwrittenUnresolved(), "5 and 6 dropped unwritten");
        assertEquals(20, r.evictedWrittenUnresolved(), "3 and 4 dropped after they were written");
        assertEquals(2, r.evictedEntries(), "one entry per written frame; the unwritten ones are a sum");
        // The collector held up to 3: 4 was written and lost, 5 and 6 were never written.
        assertEquals(10 + 20, r.resume(3));
        assertEquals(0, r.evictedEntries());
        assertEquals(0, r.evictedUnwrittenUnresolved());
        List<Long> kept = new ArrayList<>();
        for (Iterator<Retention.Frame> it = r.frames(); it.hasNext();) {
            kept.add(it.next().seq);
        }
        assertEquals(List.of(7L, 8L, 9L), kept, "to send again, in order");
        // A collector that lost its disk may hold less than it acknowledged.
        r.resume(1);
        assertEquals(1, r.acked());
    }

    @Test
    void aFrameLargerThanTheWholeBufferIsEvictedAtOnceAndCanStillBeMarkedWritten() {
        Retention r = new Retention(50);
        assertEquals(5, r.push(frame(1, 5, 100)));
        r.markWritten(1);
        assertEquals(0, r.bytes());
        assertEquals(5, r.evictedWrittenUnresolved());
        assertEquals(0, r.evictedUnwrittenUnresolved());
        assertEquals(0, r.resume(1), "the collector holds it");
    }

    @Test
    void theUnresolvedEntriesAreBoundedByAReconnection() {
        Retention r = new Retention(0);
        for (long s = 1; s <= Retention.MAX_UNRESOLVED; s++) {
            r.push(frame(s, 1, 10));
            r.markWritten(s);
            assertFalse(r.stalled() && s < Retention.MAX_UNRESOLVED);
        }
        assertTrue(r.stalled());
        assertEquals(Retention.MAX_UNRESOLVED, r.evictedEntries());
        assertEquals(Retention.MAX_UNRESOLVED - 1000, r.resume(1000), "held the first 1000");
        assertFalse(r.stalled());
    }

    // ------------------------------------------------------------------------------------
    // The exporter against an in-process version 2 collector

    static ExporterConfig config(String addr) {
        ExporterConfig c = ExporterTest.config(addr);
        c.backoffMinMs = 10;
        c.backoffMaxMs = 50;
        c.connectTimeoutMs = 500;
        return c;
    }

    static FakeCollector v2() throws IOException {
        return v2(0);
    }

    static FakeCollector v2(int port) throws IOException {
        FakeCollector fc = new FakeCollector(port);
        fc.version = 2;
        return fc;
    }

    /** Every record the collector holds is there once; returns how many. */
    static int assertEachOnce(FakeCollector fc) {
        Set<Long> keys = new HashSet<>();
        for (Protocol.Record r : fc.records()) {
            assertTrue(keys.add(r.hop() * 1_000_000_000L + r.sequence()), "a duplicate: " + r);
        }
        return keys.size();
    }

    /** What an exporter counted adds up to what it was given. */
    static void assertAddsUp(Counters.Snapshot s) {
        assertEquals(s.reported(), s.sent() + s.queueFull() + s.sendFailed() + s.lostUnacked(), s.toString());
    }

    @Test
    void recordsGoInNumberedFramesAndNothingIsKeptOnceAcknowledged() throws Exception {
        try (FakeCollector fc = v2()) {
            Exporter e = new Exporter(config(fc.address()));
            e.registerHop(2, "mm2_consume");
            e.start();
            for (int i = 0; i < 10_000; i++) {
                assertTrue(e.report(ExporterTest.ctx(i), 2, 5000 + i));
                if (i % 1000 == 999) {
                    Thread.sleep(5);
                }
            }
            FakeCollector.await(() -> fc.records().size() == 10_000, 10_000, "records");
            assertTrue(e.shutdown(5000), "clean");
            FakeCollector.Connection c = fc.connections.get(0);
            assertEquals(2, ((Protocol.HelloFrame) c.frames.get(0)).version());
            long seq = 0;
            for (Protocol.Frame f : c.frames) {
                assertFalse(f instanceof Protocol.RecordsFrame, "no plain Records frame in version 2");
                if (f instanceof Protocol.SeqRecordsFrame sr) {
                    assertEquals(++seq, sr.seq(), "numbered 1, 2, 3, ...");
                }
            }
            assertEquals(10_000, assertEachOnce(fc));
            Counters.Snapshot s = e.counters();
            assertEquals(10_000, s.sent());
            assertEquals(0, s.resent());
            assertEquals(0, s.evicted());
            assertAddsUp(s);
            assertEquals(0, e.unacknowledged(), "the final Ack covered everything");
            assertEquals(0, e.footprint().retainedBytes());
            Protocol.CountersFrame fin = assertInstanceOf(Protocol.CountersFrame.class,
                    c.frames.get(c.frames.size() - 2));
            assertEquals(0, fin.get(Protocol.RESENT));
            assertEquals(0, fin.get(Protocol.EVICTED));
            assertEquals(0, fin.get(Protocol.LOST_UNACKED));
        }
    }

    @Test
    void framesACollectorRestartLostAreSentAgainAndCountedAsResent() throws Exception {
        try (FakeCollector fc = v2()) {
            fc.acks = false; // nothing is acknowledged: everything stays retained
            Exporter e = new Exporter(config(fc.address()));
            e.registerHop(1, "b");
            e.start();
            for (int i = 0; i < 3000; i++) {
                e.report(ExporterTest.ctx(i), 1, i);
                if (i % 300 == 299) {
                    Thread.sleep(20); // ten frames or so
                }
            }
            FakeCollector.await(() -> fc.records().size() == 3000, 10_000, "records");
            long instance = fc.connections.get(0).hello().instanceId();
            long last = fc.held.get(instance);
            assertTrue(last >= 3, "several frames: " + last);
            assertTrue(e.footprint().retainedBytes() > 3000 * 36, "all of them kept: " + e.footprint());
            // Killed having made only the first frames durable: it comes back holding those.
            long keep = last / 2;
            long lostRecords = 0;
            for (Protocol.Frame f : fc.connections.get(0).frames) {
                if (f instanceof Protocol.SeqRecordsFrame sr && sr.seq() > keep) {
                    lostRecords += sr.records().size();
                }
            }
            fc.acks = true;
            fc.forgetAbove(instance, keep);
            fc.dropConnections();
            FakeCollector.await(() -> fc.connections.size() == 2 && fc.records().size() == 3000, 10_000,
                    "the frames the collector lost, again");
            FakeCollector.Connection second = fc.connections.get(1);
            // Right after Hello: the kept frames from keep + 1, in order.
            Protocol.SeqRecordsFrame first = assertInstanceOf(Protocol.SeqRecordsFrame.class, second.frames.get(1));
            assertEquals(keep + 1, first.seq());
            for (int i = 0; i < 100; i++) {
                e.report(ExporterTest.ctx(3000 + i), 1, 3000 + i);
            }
            assertTrue(e.shutdown(5000), "clean");
            assertEquals(3100, assertEachOnce(fc), "every record once");
            Counters.Snapshot s = e.counters();
            assertEquals(lostRecords, s.resent(), "what the collector lost was sent again");
            assertEquals(3100, s.sent(), "each counted sent once");
            assertEquals(1, s.reconnects());
            assertEquals(0, s.lost());
            assertAddsUp(s);
            assertEquals(0, fc.resentDropped.get(), "frames it held were not sent again");
            assertEquals(0, e.unacknowledged());
        }
    }

    @Test
    void whileTheCollectorIsAwayRecordsWaitNumberedAndWhatOverflowsIsCountedLost() throws Exception {
        int port = HostileTest.freePort();
        ExporterConfig cfg = config("127.0.0.1:" + port);
        cfg.retentionBytes = 20_000; // about 500 records of 36 bytes
        cfg.maxBatch = 100;
        Exporter e = new Exporter(cfg);
        e.registerHop(1, "b");
        e.start();
        for (int i = 0; i < 2000; i++) {
            assertTrue(e.report(ExporterTest.ctx(i), 1, i), "the queue never fills: it drains into the buffer");
            if (i % 100 == 99) {
                Thread.sleep(15);
            }
        }
        FakeCollector.await(() -> e.counters().evicted() > 0 && e.footprint().queuedRecords() == 0, 5000,
                "the queue drained into the full buffer");
        Exporter.Footprint f = e.footprint();
        assertTrue(f.retainedBytes() <= 20_000, f.toString());
        assertEquals(20_000, f.retentionLimit());
        assertEquals(0, f.evictedEntries(), "never written: kept as a count, not entries");
        assertEquals(0, e.counters().queueFull());
        try (FakeCollector fc = v2(port)) {
            FakeCollector.await(() -> fc.records().size() == 2000 - e.counters().evicted(), 10_000,
                    "what the buffer held");
            assertTrue(e.shutdown(5000));
            Counters.Snapshot s = e.counters();
            assertEquals(s.evicted(), s.lostUnacked(), "evicted before they were ever written: lost");
            assertEquals(2000 - s.evicted(), s.sent());
            assertEquals(2000 - s.evicted(), assertEachOnce(fc));
            assertAddsUp(s);
            // The newest records are the ones kept.
            long oldest = Long.MAX_VALUE;
            for (Protocol.Record r : fc.records()) {
                oldest = Math.min(oldest, r.sequence());
            }
            assertEquals(s.evicted(), oldest, "the oldest were dropped");
            Protocol.CountersFrame fin = fc.lastCounters();
            assertEquals(s.evicted(), fin.get(Protocol.EVICTED));
            assertEquals(s.lostUnacked(), fin.get(Protocol.LOST_UNACKED), "the loss reaches the collector");
        }
    }

    @Test
    void aCollectorThatSpeaksOnlyVersion1IsAskedAgainInVersion1() throws Exception {
        try (FakeCollector fc = v2()) {
            fc.refuseVersion2 = true;
            Exporter e = new Exporter(config(fc.address()));
            e.registerHop(1, "b");
            e.start();
            for (int i = 0; i < 500; i++) {
                e.report(ExporterTest.ctx(i), 1, i);
            }
            FakeCollector.await(() -> fc.records().size() == 500, 10_000, "records");
            assertTrue(e.shutdown(5000));
            assertEquals(0, e.rejected(), "not counted as a refusal");
            FakeCollector.Connection last = fc.connections.get(fc.connections.size() - 1);
            assertEquals(1, ((Protocol.HelloFrame) last.frames.get(0)).version());
            for (Protocol.Frame f : last.frames) {
                assertFalse(f instanceof Protocol.SeqRecordsFrame, "no numbered frame on version 1");
            }
            assertEquals(500, assertEachOnce(fc));
            assertAddsUp(e.counters());
        }
    }

    @Test
    void recordsKeptWhileAwayReachACollectorWithoutALogAsPlainRecords() throws Exception {
        int port = HostileTest.freePort();
        Exporter e = new Exporter(config("127.0.0.1:" + port));
        e.registerHop(1, "b");
        e.start();
        for (int i = 0; i < 500; i++) {
            e.report(ExporterTest.ctx(i), 1, i);
        }
        FakeCollector.await(() -> e.footprint().retainedBytes() > 0 && e.footprint().queuedRecords() == 0, 5000,
                "the records retained while away");
        try (FakeCollector fc = new FakeCollector(port)) { // answers Welcome version 1 (--no-log)
            FakeCollector.await(() -> fc.records().size() == 500, 10_000, "records");
            assertEquals(0, e.footprint().retainedBytes(), "version 1 keeps nothing");
            for (int i = 500; i < 600; i++) {
                e.report(ExporterTest.ctx(i), 1, i);
            }
            assertTrue(e.shutdown(5000));
            // Version 1: the exporter does not wait for the collector to have read it all.
            FakeCollector.await(() -> fc.connections.get(fc.connections.size() - 1).closed, 5000, "goodbye read");
            assertEquals(600, assertEachOnce(fc));
            Counters.Snapshot s = e.counters();
            assertEquals(600, s.sent());
            assertAddsUp(s);
        }
    }

    @Test
    void aCollectorThatNeverAcknowledgesIsLeftAndAskedWhatItHolds() throws Exception {
        // One record a frame and room for none: each frame is evicted as soon as it is kept,
        // after it was written. Once the exporter remembers MAX_UNRESOLVED of them it
        // reconnects, and the Welcome (it held them all) settles them: nothing lost.
        try (FakeCollector fc = v2()) {
            fc.acks = false;
            fc.keepFrames = false;
            ExporterConfig cfg = config(fc.address());
            cfg.retentionBytes = 1;
            cfg.maxBatch = 1;
            cfg.idleWaitMs = 1;
            Exporter e = new Exporter(cfg);
            e.registerHop(1, "b");
            e.start();
            int n = Retention.MAX_UNRESOLVED + 5000;
            for (int i = 0; i < n; i++) {
                while (!e.report(ExporterTest.ctx(i), 1, i)) {
                    Thread.sleep(1); // this test's own pacing: nothing must be dropped here
                }
            }
            FakeCollector.await(() -> fc.heldRecords.get() == n, 60_000, "records");
            assertTrue(e.footprint().evictedEntries() <= Retention.MAX_UNRESOLVED, e.footprint().toString());
            fc.acks = true;
            assertTrue(e.shutdown(5000));
            Counters.Snapshot s = e.counters();
            assertTrue(s.reconnects() >= 1, "reconnected to learn what the collector holds: " + s);
            assertTrue(s.evicted() >= Retention.MAX_UNRESOLVED, s.toString());
            assertEquals(0, s.lostUnacked(), "it held them all");
            assertEquals(n, fc.heldRecords.get(), "each once: frames are held in order, by number");
            assertEquals(0, fc.resentDropped.get());
            assertAddsUp(s);
        }
    }

    // ------------------------------------------------------------------------------------
    // A client's calls, whatever the collector does (HostileTest's load, in version 2)

    static HostileTest.Host v2Host(String address) {
        return new HostileTest.Host(address, Map.<String, Object>of("hoptrace.retention.bytes", String.valueOf(1 << 20)));
    }

    @Test
    void aCollectorAwayCostsTheClientNothingAndWhatItMissedArrivesOnce() throws Exception {
        int port = HostileTest.freePort();
        try (HostileTest.Host h = v2Host("127.0.0.1:" + port)) {
            HostileTest.Load load = HostileTest.hostLoad(h, 1500);
            HostileTest.assertBounded(load, h);
            Exporter.Footprint f = h.exporter.footprint();
            assertTrue(f.retainedBytes() <= f.retentionLimit(), f.toString());
            assertTrue(h.exporter.counters().evicted() > 0, "1 MiB holds less than the load");
            try (FakeCollector fc = v2(port)) {
                FakeCollector.await(h.exporter::isConnected, 10_000, "a connection");
                h.closeClients();
                Counters.Snapshot s = h.exporter.counters();
                assertEquals(load.records(), s.reported());
                assertAddsUp(s);
                assertEquals(s.evicted(), s.lostUnacked(), "never written, so lost, and counted");
                assertEquals(s.sent(), assertEachOnce(fc), "the rest arrived, each once");
                FakeCollector.Connection last = fc.connections.get(fc.connections.size() - 1);
                assertTrue(last.saidGoodbye());
                Protocol.CountersFrame fin = (Protocol.CountersFrame) last.frames.get(last.frames.size() - 2);
                assertEquals(s.lostUnacked(), fin.get(Protocol.LOST_UNACKED));
                assertEquals(s.queueFull(), fin.get(Protocol.QUEUE_FULL));
            }
        }
    }

    @Test
    void aCollectorThatRestartsEvery200MsLosesNothingAndGetsNothingTwice() throws Exception {
        FakeCollector fc = v2();
        AtomicBoolean stop = new AtomicBoolean();
        AtomicInteger drops = new AtomicInteger();
        Thread restarter = HostileTest.restarter(fc, stop, drops);
        try (HostileTest.Host h = v2Host(fc.address())) {
            restarter.start();
            HostileTest.Load load = HostileTest.hostLoad(h, 2000);
            stop.set(true);
            restarter.join();
            assertTrue(drops.get() >= 5, "restarts: " + drops.get());
            HostileTest.assertBounded(load, h);
            FakeCollector.await(() -> h.exporter.isConnected() && !fc.connections.get(fc.connections.size() - 1).closed,
                    5000, "a connection after the last restart");
            h.closeClients();
            Counters.Snapshot s = h.exporter.counters();
            assertTrue(s.reconnects() >= 3, s.toString());
            assertEquals(load.records(), s.reported());
            assertAddsUp(s);
            System.out.printf("restarts: %d, reconnects %d, evicted %d (of them lost: %d), queue_full %d%n",
                    drops.get(), s.reconnects(), s.evicted(), s.lostUnacked(), s.queueFull());
            assertEquals(0, s.sendFailed(), "version 2 loses no frame to a broken connection");
            assertEquals(s.sent(), assertEachOnce(fc), "every record sent arrived, once");
            assertEquals(0, h.exporter.unacknowledged());
        } finally {
            stop.set(true);
            fc.close();
        }
    }
}
