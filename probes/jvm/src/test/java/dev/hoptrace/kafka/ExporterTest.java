package dev.hoptrace.kafka;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertNotSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;

class ExporterTest {
    static ExporterConfig config(String addr) {
        ExporterConfig c = new ExporterConfig(addr, "tok", null, null, "exporter-test");
        c.settleMs = 0;
        c.clockStatus = () -> new Protocol.ClockStatus(Clocks.realtimeNs(), Protocol.ClockStatus.INJECTED, true, 0, 0,
                1000, "test clock");
        return c;
    }

    static TraceContext ctx(long seq) {
        return new TraceContext(3, 4, seq, 1, 100);
    }

    @Test
    void helloRecordsClockCountersAndGoodbyeInThatOrder() throws Exception {
        try (FakeCollector fc = new FakeCollector()) {
            Exporter e = new Exporter(config(fc.address()));
            e.registerHop(2, "mm2_consume");
            e.start();
            for (int i = 0; i < 1000; i++) {
                assertTrue(e.report(ctx(i), 2, 5000 + i));
            }
            FakeCollector.await(() -> fc.records().size() == 1000, 5000, "records");
            assertTrue(e.shutdown(5000), "clean");
            FakeCollector.await(() -> fc.connections.get(0).closed, 5000, "close");
            FakeCollector.Connection c = fc.connections.get(0);
            Protocol.Hello h = c.hello();
            assertEquals("tok", h.token());
            assertEquals("exporter-test", h.process());
            assertEquals(List.of(new Protocol.Hop(2, "mm2_consume")), h.hops());
            assertInstanceOf(Protocol.ClockFrame.class, c.frames.get(1), "clock status on connect");
            assertTrue(c.saidGoodbye());
            Protocol.CountersFrame last = assertInstanceOf(Protocol.CountersFrame.class,
                    c.frames.get(c.frames.size() - 2), "final counters before goodbye");
            assertEquals(1000, last.get(Protocol.REPORTED));
            assertEquals(1000, last.get(Protocol.SENT_RECORDS));
            assertEquals(0, last.get(Protocol.QUEUE_FULL));
            List<Protocol.Record> rs = fc.records();
            for (int i = 0; i < rs.size(); i++) {
                Protocol.Record r = rs.get(i);
                assertEquals(i, r.sequence());
                assertEquals(5000 + i, r.stampNs());
                assertEquals(2, r.hop());
                assertEquals(3, r.publisher());
            }
        }
    }

    @Test
    void aFullQueueDropsAndCountsWithoutWaiting() throws Exception {
        {
            ExporterConfig cfg = config("127.0.0.1:1"); // nothing listens: records stay queued
            cfg.retentionBytes = 0; // version 1: nothing drains the queue while away
            cfg.queueCapacity = 64;
            cfg.backoffMinMs = 10_000;
            Exporter e = new Exporter(cfg);
            e.registerHop(0, "a");
            e.start();
            long t0 = System.nanoTime();
            int ok = 0;
            for (int i = 0; i < 1000; i++) {
                ok += e.report(ctx(i), 0, i) ? 1 : 0;
            }
            assertTrue(System.nanoTime() - t0 < 100_000_000L, "1000 reports never wait");
            assertEquals(64, ok);
            Counters.Snapshot s = e.counters();
            assertEquals(1000, s.reported());
            assertEquals(936, s.queueFull());
            assertFalse(e.shutdown(200), "not clean: nothing could be delivered");
            s = e.counters();
            assertEquals(64, s.sendFailed(), "what was queued at the stop is counted");
            assertEquals(1000, s.reported());
            assertEquals(1000, s.lost());
        }
    }

    @Test
    void reconnectsAfterTheCollectorRestartsAndCountsIt() throws Exception {
        FakeCollector first = new FakeCollector();
        int port = first.server.getLocalPort();
        ExporterConfig cfg = config(first.address());
        cfg.backoffMinMs = 20;
        cfg.backoffMaxMs = 100;
        Exporter e = new Exporter(cfg);
        e.registerHop(1, "b");
        e.start();
        e.report(ctx(0), 1, 1);
        FakeCollector.await(() -> first.records().size() == 1, 5000, "first record");
        first.close();
        FakeCollector.await(() -> !e.isConnected(), 5000, "disconnect seen");
        try (FakeCollector second = new FakeCollector(port)) {
            FakeCollector.await(e::isConnected, 5000, "reconnect");
            e.report(ctx(1), 1, 2);
            FakeCollector.await(() -> second.records().size() == 1, 5000, "record after reconnect");
            assertTrue(e.shutdown(5000));
            FakeCollector.await(() -> second.connections.get(0).closed, 5000, "goodbye read");
            assertEquals(1, e.counters().reconnects());
            assertEquals(1, second.lastCounters().get(Protocol.RECONNECTS));
            assertEquals(e.counters().sent(), second.lastCounters().get(Protocol.SENT_RECORDS));
        }
    }

    @Test
    void aHopRegisteredLaterIsAnnouncedByANewHelloBeforeItsRecords() throws Exception {
        try (FakeCollector fc = new FakeCollector()) {
            Exporter e = new Exporter(config(fc.address()));
            e.registerHop(0, "first");
            e.start();
            e.report(ctx(0), 0, 1);
            FakeCollector.await(() -> fc.records().size() == 1, 5000, "first record");
            e.registerHop(5, "later");
            e.report(ctx(1), 5, 2);
            e.report(ctx(2), 0, 3);
            FakeCollector.await(() -> fc.records().size() == 3, 5000, "all records");
            assertTrue(e.shutdown(5000));
            FakeCollector.await(() -> fc.connections.size() == 2 && fc.connections.get(1).closed, 5000, "goodbye read");
            FakeCollector.Connection a = fc.connections.get(0);
            FakeCollector.Connection b = fc.connections.get(1);
            assertTrue(a.saidGoodbye(), "the first connection ends cleanly");
            assertEquals(List.of(new Protocol.Hop(0, "first"), new Protocol.Hop(5, "later")), b.hello().hops());
            assertEquals(a.hello().instanceId(), b.hello().instanceId(), "same exporter");
            for (Protocol.Frame f : a.frames) {
                if (f instanceof Protocol.RecordsFrame r) {
                    assertTrue(r.records().stream().allMatch(x -> x.hop() == 0), "no unannounced hop");
                }
            }
        }
    }

    @Test
    void conflictingHopsAreRefused() {
        Exporter e = new Exporter(config("127.0.0.1:1"));
        e.registerHop(1, "x");
        e.registerHop(1, "x");
        assertThrows(IllegalArgumentException.class, () -> e.registerHop(1, "y"));
        assertThrows(IllegalArgumentException.class, () -> e.registerHop(2, "x"));
        for (int i = 2; i <= 16; i++) {
            e.registerHop(i, "h" + i);
        }
        assertThrows(IllegalArgumentException.class, () -> e.registerHop(17, "h17"));
    }

    @Test
    void aRejectIsReportedAndRetried() throws Exception {
        try (FakeCollector fc = new FakeCollector()) {
            fc.rejectCode = 3;
            ExporterConfig cfg = config(fc.address());
            cfg.backoffMinMs = 20;
            Exporter e = new Exporter(cfg);
            e.registerHop(0, "a");
            e.start();
            FakeCollector.await(() -> e.lastError() != null && e.lastError().contains("code 3"), 5000, "reject");
            assertFalse(e.isConnected());
            fc.rejectCode = 0;
            FakeCollector.await(e::isConnected, 5000, "accepted after the reject");
            assertTrue(e.shutdown(2000));
        }
    }

    @Test
    void aStalledCollectorCostsTheWriteTimeoutNotTheClients() throws Exception {
        try (FakeCollector fc = new FakeCollector()) {
            fc.stalled = true;
            ExporterConfig cfg = config(fc.address());
            cfg.connectTimeoutMs = 200;
            cfg.backoffMinMs = 10_000;
            Exporter e = new Exporter(cfg);
            e.registerHop(0, "a");
            e.start();
            e.report(ctx(0), 0, 1);
            long t0 = System.nanoTime();
            assertFalse(e.shutdown(300));
            assertTrue(System.nanoTime() - t0 < 3_000_000_000L, "shutdown bounded");
            assertEquals(1, e.counters().sendFailed());
            assertNotNull(e.lastError());
        }
    }

    @Test
    void shutdownCutsAConnectionAttemptThatWaitsForWelcome() throws Exception {
        try (HostileCollector hc = new HostileCollector(HostileCollector.Mode.SILENT)) {
            ExporterConfig cfg = config(hc.address());
            cfg.connectTimeoutMs = 60_000; // the attempt alone would wait a minute
            Exporter e = new Exporter(cfg);
            e.registerHop(0, "a");
            e.start();
            e.report(ctx(0), 0, 1);
            FakeCollector.await(() -> hc.accepted.get() == 1, 5000, "the attempt");
            long t0 = System.nanoTime();
            assertFalse(e.shutdown(200));
            long ms = (System.nanoTime() - t0) / 1_000_000;
            assertTrue(ms < 200 + Exporter.SHUTDOWN_MARGIN_MS, "shutdown took " + ms + " ms");
            FakeCollector.await(() -> e.counters().sendFailed() == 1, 5000, "the record counted");
            assertEquals(1, e.counters().reported());
        }
    }

    @Test
    void footprintTellsWhatIsHeld() throws Exception {
        ExporterConfig cfg = config("127.0.0.1:1");
        cfg.queueCapacity = 100;
        cfg.maxBatch = 10;
        Exporter e = new Exporter(cfg);
        e.registerHop(0, "a");
        for (int i = 0; i < 200; i++) {
            e.report(ctx(i), 0, i);
        }
        Exporter.Footprint f = e.footprint();
        assertEquals(128, f.queueSlots());
        assertEquals(128, f.queuedRecords());
        assertEquals(10 * 52 + 9 + Exporter.CONTROL_BYTES, f.writeBufferLimit());
        assertEquals(0, f.readerThreads());
        assertEquals(1, f.hops());
        assertEquals(72, e.counters().queueFull());
    }

    @Test
    void manyThreadsReportWithoutLosingOrDuplicatingRecords() throws Exception {
        try (FakeCollector fc = new FakeCollector()) {
            ExporterConfig cfg = config(fc.address());
            cfg.queueCapacity = 1 << 18;
            Exporter e = new Exporter(cfg);
            e.registerHop(0, "a");
            e.start();
            int threads = 4;
            int each = 20_000;
            CountDownLatch go = new CountDownLatch(1);
            AtomicInteger dropped = new AtomicInteger();
            Thread[] ts = new Thread[threads];
            for (int t = 0; t < threads; t++) {
                int id = t;
                ts[t] = new Thread(() -> {
                    try {
                        go.await();
                    } catch (InterruptedException ex) {
                        return;
                    }
                    for (int i = 0; i < each; i++) {
                        if (!e.report(new TraceContext(id, 0, i, 1, 0), 0, i)) {
                            dropped.incrementAndGet();
                        }
                    }
                });
                ts[t].start();
            }
            go.countDown();
            for (Thread t : ts) {
                t.join();
            }
            assertTrue(e.shutdown(10_000));
            FakeCollector.await(() -> fc.connections.get(0).closed, 5000, "goodbye read");
            assertEquals(0, dropped.get());
            List<Protocol.Record> rs = fc.records();
            assertEquals(threads * each, rs.size());
            boolean[][] seen = new boolean[threads][each];
            for (Protocol.Record r : rs) {
                assertFalse(seen[r.publisher()][(int) r.sequence()], "duplicate");
                seen[r.publisher()][(int) r.sequence()] = true;
                assertEquals(r.sequence(), r.stampNs());
            }
        }
    }

    @Test
    void exportersAreSharedPerCollectorAndStopWithTheLastReference() throws Exception {
        try (FakeCollector fc = new FakeCollector()) {
            int before = Exporter.sharedCount();
            Exporter a = Exporter.acquire(config(fc.address()));
            Exporter b = Exporter.acquire(config(fc.address()));
            Exporter other = Exporter.acquire(new ExporterConfig(fc.address(), "other-token", null, null, "x"));
            assertSame(a, b);
            assertNotSame(a, other);
            assertEquals(before + 2, Exporter.sharedCount());
            a.release();
            assertEquals(before + 2, Exporter.sharedCount(), "b still holds it");
            b.release();
            other.release();
            assertEquals(before, Exporter.sharedCount());
        }
    }
}
