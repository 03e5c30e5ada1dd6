package dev.hoptrace.kafka;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.lang.management.GarbageCollectorMXBean;
import java.lang.management.ManagementFactory;
import java.net.ServerSocket;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.UUID;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.locks.LockSupport;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.record.TimestampType;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;
import org.junit.jupiter.params.provider.ValueSource;

/**
 * The interceptors never hold up their client, whatever the collector does. Against
 * collectors that refuse connections, never accept, accept and never answer, answer Hello with
 * garbage, close after Hello, trickle Welcome, stop reading after Welcome, send garbage after
 * Welcome, answer Welcome 2.5 s late, restart every 200 ms, or never answer anything after
 * Welcome (these hosts' exporters speak version 1, {@code hoptrace.retention.bytes=0}: no
 * collector acknowledges, nothing is kept once written; {@link DurableTest} runs the version 2
 * cases, with a retention buffer), a client's {@code onSend} and {@code onConsume} calls (100,000 and more per test,
 * real loopback TCP) all return at once; everything the exporter holds stays within its bound
 * ({@link Exporter#footprint()}); and once a collector that behaves comes up on the same port,
 * what was dropped is counted and reaches it: reported = sent + send_failed + queue_full.
 *
 * <p>The time asserted ({@link #MAX_CALL_NS}, 50 ms) bounds blocking, not speed: a call that
 * waited for the network, for a lock held across I/O or for room in the queue would take the
 * connect or write timeouts (300 ms here) or more, not milliseconds. On this shared 2-core
 * machine a call can also take long because its thread waited for a CPU or the JVM stopped
 * for a garbage collection: where the slowest call of a batch of 400 passes half the bound
 * (25 ms), the time the calling thread waited for a CPU during that batch (its run delay,
 * the second field of Linux's {@code /proc/thread-self/schedstat}) and the JVM's collection
 * time during it are taken off that call, and the test prints how much was taken off. The
 * calls themselves are never retried or dropped from the measure.
 */
@Timeout(value = 90, unit = TimeUnit.SECONDS)
class HostileTest {
    static final long MAX_CALL_NS = TimeUnit.MILLISECONDS.toNanos(50);
    static final long HALF_NS = MAX_CALL_NS / 2;
    static final int MIN_CALLS = 100_000;
    static final int QUEUE = 2000;
    static final int BATCH = 200; // iterations of a batch: 2 calls each
    static final long CONNECT_TIMEOUT_MS = 300;

    // ------------------------------------------------------------------------------------
    // The host: a producer and a consumer interceptor sharing one exporter

    /** A client pair whose interceptors report to {@code address}. */
    static final class Host implements AutoCloseable {
        final HoptraceProducerInterceptor<byte[], byte[]> producer = new HoptraceProducerInterceptor<>();
        final HoptraceConsumerInterceptor<byte[], byte[]> consumer = new HoptraceConsumerInterceptor<>();
        final Exporter exporter;
        private boolean closed;

        Host(String address, Map<String, Object> extra) {
            Map<String, Object> p = new HashMap<>();
            p.put("hoptrace.collector", address);
            p.put("hoptrace.hops", "publish:0,flow_in:1,flow_out:2");
            // Its own exporter: no other test shares it.
            p.put("hoptrace.process", "hostile-" + UUID.randomUUID());
            p.put("hoptrace.queue.capacity", String.valueOf(QUEUE));
            p.put("hoptrace.connect.timeout.ms", String.valueOf(CONNECT_TIMEOUT_MS));
            p.put("hoptrace.write.timeout.ms", "300");
            p.put("hoptrace.backoff.min.ms", "10");
            p.put("hoptrace.backoff.max.ms", "100");
            p.put("hoptrace.counters.interval.ms", "50");
            p.put("hoptrace.close.timeout.ms", "5000");
            p.put("hoptrace.retention.bytes", "0");
            p.putAll(extra);
            Map<String, Object> c = new HashMap<>(p);
            c.put("hoptrace.hop", "flow_in");
            p.put("hoptrace.hop", "flow_out");
            consumer.configure(c);
            producer.configure(p);
            exporter = producer.probeForBench().exporter;
        }

        /** Closes both clients' interceptors: the last one flushes and stops the exporter. */
        void closeClients() {
            if (!closed) {
                closed = true;
                consumer.close();
                producer.close();
            }
        }

        @Override
        public void close() {
            closeClients();
        }
    }

    /** What a load did and the most the exporter held meanwhile. */
    record Load(long calls, long records, long notTraced, long slowestNs, long takenOffNs,
                long peakQueued, int peakWriteBuffer, int peakReaders, int peakRejectCodes, int peakHops) {}

    /** Nanoseconds this thread has waited for a CPU (0 where Linux does not tell). */
    static long runDelayNs() {
        try {
            return Long.parseLong(Files.readString(Path.of("/proc/thread-self/schedstat")).trim().split("\\s+")[1]);
        } catch (IOException | RuntimeException e) {
            return 0;
        }
    }

    /** Milliseconds the JVM has spent collecting garbage. */
    static long gcMs() {
        long ms = 0;
        for (GarbageCollectorMXBean b : ManagementFactory.getGarbageCollectorMXBeans()) {
            ms += Math.max(0, b.getCollectionTime());
        }
        return ms;
    }

    static byte[] traced(long seq) {
        TraceContext c = new TraceContext(9, (int) (seq % 3), seq, 1, 1000);
        c.pushStamp(0, 2000);
        return c.encode();
    }

    /**
     * What a client does on its message path for at least {@code minMs} and {@link #MIN_CALLS}
     * calls: sends traced records ({@code onSend}) and polls batches of four records, three
     * traced and one not ({@code onConsume}); every call timed, the exporter's footprint sampled
     * after every batch.
     */
    static Load hostLoad(Host h, long minMs) {
        long end = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(minMs);
        long calls = 0;
        long records = 0;
        long notTraced = 0;
        long slowest = 0;
        long takenOff = 0;
        long peakQueued = 0;
        int peakWrite = 0;
        int peakReaders = 0;
        int peakReject = 0;
        int peakHops = 0;
        long seq = 0;
        TopicPartition tp = new TopicPartition("in", 0);
        List<ProducerRecord<byte[], byte[]>> sends = new ArrayList<>(BATCH);
        List<ConsumerRecords<byte[], byte[]>> polls = new ArrayList<>(BATCH);
        while (System.nanoTime() - end < 0 || calls < MIN_CALLS) {
            sends.clear();
            polls.clear();
            for (int i = 0; i < BATCH; i++) {
                RecordHeaders sh = new RecordHeaders();
                sh.add("hoptrace", traced(seq++));
                sends.add(new ProducerRecord<>("out", null, null, null, new byte[8], sh));
                List<ConsumerRecord<byte[], byte[]>> got = new ArrayList<>(4);
                for (int r = 0; r < 4; r++) {
                    RecordHeaders ch = new RecordHeaders();
                    if (r < 3) {
                        ch.add("hoptrace", traced(seq++));
                    }
                    got.add(new ConsumerRecord<>("in", 0, seq, 0L, TimestampType.CREATE_TIME, 0, 8, null, new byte[8],
                            ch, java.util.Optional.empty()));
                }
                polls.add(new ConsumerRecords<>(Map.of(tp, got)));
            }
            long waited0 = runDelayNs();
            long gc0 = gcMs();
            long batchSlowest = 0;
            for (int i = 0; i < BATCH; i++) {
                long t0 = System.nanoTime();
                h.producer.onSend(sends.get(i));
                long t1 = System.nanoTime();
                h.consumer.onConsume(polls.get(i));
                long t2 = System.nanoTime();
                batchSlowest = Math.max(batchSlowest, Math.max(t1 - t0, t2 - t1));
            }
            calls += 2L * BATCH;
            records += 4L * BATCH;
            notTraced += BATCH;
            if (batchSlowest > HALF_NS) {
                long off = Math.min(batchSlowest,
                        (runDelayNs() - waited0) + TimeUnit.MILLISECONDS.toNanos(gcMs() - gc0));
                takenOff += off;
                batchSlowest -= off;
            }
            slowest = Math.max(slowest, batchSlowest);
            Exporter.Footprint f = h.exporter.footprint();
            peakQueued = Math.max(peakQueued, f.queuedRecords());
            peakWrite = Math.max(peakWrite, f.writeBufferBytes());
            peakReaders = Math.max(peakReaders, f.readerThreads());
            peakReject = Math.max(peakReject, f.rejectCodes());
            peakHops = Math.max(peakHops, f.hops());
            // Pacing: a client does other work between calls (this is its workload, not a
            // wait for a condition); it gives the exporter thread its turns, as a real one does.
            LockSupport.parkNanos(TimeUnit.MILLISECONDS.toNanos(1));
        }
        Load l = new Load(calls, records, notTraced, slowest, takenOff, peakQueued, peakWrite, peakReaders,
                peakReject, peakHops);
        System.out.printf("hostile load: %,d calls, slowest %.2f ms (%.1f ms of waiting for a CPU or a collection "
                + "taken off slow batches), peak queued %d, write buffer %d bytes%n", l.calls(), l.slowestNs() / 1e6,
                l.takenOffNs() / 1e6, l.peakQueued(), l.peakWriteBuffer());
        return l;
    }

    static void assertBounded(Load load, Host h) {
        assertTrue(load.slowestNs() < MAX_CALL_NS, "a client's call took " + load.slowestNs() / 1e6 + " ms");
        assertTrue(load.calls() >= MIN_CALLS, "calls: " + load.calls());
        Exporter.Footprint f = h.exporter.footprint();
        assertEquals(2048, f.queueSlots(), "2000 rounded up to a power of two");
        assertTrue(load.peakQueued() <= f.queueSlots(), "queued " + load.peakQueued());
        assertTrue(load.peakWriteBuffer() <= f.writeBufferLimit(),
                "write buffer " + load.peakWriteBuffer() + " > " + f.writeBufferLimit());
        assertEquals(8192 * 52 + 9 + Exporter.CONTROL_BYTES, f.writeBufferLimit());
        assertTrue(load.peakReaders() <= 2, "reader threads: " + load.peakReaders());
        assertTrue(load.peakRejectCodes() <= Exporter.MAX_REJECT_CODES);
        assertEquals(2, load.peakHops());
    }

    static int freePort() throws IOException {
        try (ServerSocket s = new ServerSocket(0)) {
            return s.getLocalPort();
        }
    }

    /** Waits up to {@code ms} for {@code cond}. */
    static void await(java.util.function.BooleanSupplier cond, long ms, String what) throws InterruptedException {
        FakeCollector.await(cond, ms, what);
    }

    /** Where a collector that behaves comes up: the exporter's sent count before it did. */
    record Recovery(FakeCollector collector, long sentBefore) {}

    /**
     * Ends the hostile collector ({@code hostile}, may be null) and brings up one that behaves
     * on the same port: the exporter connects, and the counts reach it in its next Counters
     * frame.
     */
    static Recovery recover(Host h, AutoCloseable hostile, int port, javax.net.ssl.SSLContext tls) throws Exception {
        if (hostile != null) {
            hostile.close();
        }
        await(() -> !h.exporter.isConnected(), 5000, "the hostile connection to end");
        long sentBefore = h.exporter.counters().sent();
        FakeCollector fc = new FakeCollector(port, tls);
        await(h.exporter::isConnected, 10_000, "a connection to the collector that behaves");
        Counters.Snapshot local = h.exporter.counters();
        await(() -> {
            Protocol.CountersFrame c = fc.lastCounters();
            return c != null && c.get(Protocol.QUEUE_FULL) >= local.queueFull()
                    && c.get(Protocol.REPORTED) >= local.reported();
        }, 5000, "the counts in a Counters frame");
        return new Recovery(fc, sentBefore);
    }

    /**
     * Closes the clients (flush, final Counters, Goodbye) and checks that the collector that
     * behaves got the counts, that they add up, and that it got every record counted as sent
     * since it came up.
     */
    static Counters.Snapshot checkDelivered(Host h, Recovery r, Load load) throws Exception {
        h.closeClients();
        FakeCollector fc = r.collector();
        try {
            Counters.Snapshot s = h.exporter.counters();
            await(() -> fc.connections.get(fc.connections.size() - 1).closed, 5000, "goodbye read");
            FakeCollector.Connection last = fc.connections.get(fc.connections.size() - 1);
            assertTrue(last.saidGoodbye(), "a clean end");
            Protocol.CountersFrame fin = assertInstanceOf(Protocol.CountersFrame.class,
                    last.frames.get(last.frames.size() - 2), "final counters before goodbye");
            assertEquals(s.reported(), fin.get(Protocol.REPORTED));
            assertEquals(s.queueFull(), fin.get(Protocol.QUEUE_FULL));
            assertEquals(s.sent(), fin.get(Protocol.SENT_RECORDS));
            assertEquals(s.sendFailed(), fin.get(Protocol.SEND_FAILED));
            assertEquals(s.reconnects(), fin.get(Protocol.RECONNECTS));
            assertEquals(load.notTraced(), fin.get(Protocol.NOT_TRACED));
            // Version 1 retains nothing, so nothing is evicted (11) or lost unacknowledged (12).
            assertEquals(0, fin.get(11));
            assertEquals(0, fin.get(12));
            assertEquals(load.records(), s.reported(), "every record a client handed over is reported");
            assertEquals(s.reported(), s.sent() + s.sendFailed() + s.queueFull(), "the counts add up: " + s);
            assertEquals(s.sent() - r.sentBefore(), fc.records().size(),
                    "the collector that behaves got every record counted as sent since it came up");
            return s;
        } finally {
            fc.close();
        }
    }

    // ------------------------------------------------------------------------------------
    // Collectors that never welcome

    @Test
    void aRefusedPortCostsTheClientNothing() throws Exception {
        int port = freePort();
        try (Host h = new Host("127.0.0.1:" + port, Map.of())) {
            Load load = hostLoad(h, 1500);
            assertBounded(load, h);
            assertFalse(h.exporter.isConnected());
            assertNotNull(h.exporter.lastError());
            Counters.Snapshot c = h.exporter.counters();
            assertEquals(load.records(), c.reported());
            assertTrue(c.queueFull() >= load.records() - 2048, "beyond the queue every record is counted");
            checkDelivered(h, recover(h, null, port, null), load);
        }
    }

    @ParameterizedTest
    @EnumSource(value = HostileCollector.Mode.class, names = {"NEVER_ACCEPT", "SILENT", "GARBAGE", "CLOSE_AFTER_HELLO"})
    void aCollectorThatNeverWelcomesCostsTheClientNothing(HostileCollector.Mode mode) throws Exception {
        HostileCollector hc = new HostileCollector(mode);
        try (Host h = new Host(hc.address(), Map.of())) {
            Load load = hostLoad(h, 1500);
            assertBounded(load, h);
            assertFalse(h.exporter.isConnected());
            assertNotNull(h.exporter.lastError());
            assertEquals(0, h.exporter.counters().sent());
            if (mode == HostileCollector.Mode.NEVER_ACCEPT) {
                assertEquals(0, hc.accepted.get());
            } else {
                assertTrue(hc.accepted.get() >= 2, "attempts were made again: " + hc.accepted.get());
            }
            if (mode == HostileCollector.Mode.SILENT) {
                assertTrue(h.exporter.lastError().contains("no Welcome within 300 ms"), h.exporter.lastError());
            }
            checkDelivered(h, recover(h, hc, hc.port(), null), load);
        }
    }

    @Test
    void aWelcomeTrickledAByteAtATimeIsGivenTheConnectTimeoutInAll() throws Exception {
        // Each byte comes within any read timeout; the Welcome as a whole would take 2 s.
        HostileCollector hc = new HostileCollector(HostileCollector.Mode.TRICKLE_WELCOME, 100, 0, null);
        try (Host h = new Host(hc.address(), Map.of())) {
            Load load = hostLoad(h, 1500);
            assertBounded(load, h);
            assertFalse(h.exporter.isConnected(), "never welcomed");
            assertTrue(hc.hellos.get() >= 2, "attempts ended and were made again: " + hc.hellos.get());
            assertTrue(h.exporter.lastError().contains("no Welcome within 300 ms"), h.exporter.lastError());
            // This side sees an attempt end at its next write after the probe closed: one
            // byte period (100 ms) and the RST later, at most.
            for (long ms : hc.connectionMs) {
                assertTrue(ms < CONNECT_TIMEOUT_MS + 500, "an attempt lasted " + ms + " ms");
            }
            checkDelivered(h, recover(h, hc, hc.port(), null), load);
        }
    }

    // ------------------------------------------------------------------------------------
    // Collectors that welcome, then misbehave

    @ParameterizedTest
    @EnumSource(value = HostileCollector.Mode.class, names = {"WELCOME_THEN_DEAF", "WELCOME_THEN_GARBAGE"})
    void aCollectorThatWelcomesThenMisbehavesCostsTheClientNothing(HostileCollector.Mode mode) throws Exception {
        HostileCollector hc = new HostileCollector(mode);
        try (Host h = new Host(hc.address(), Map.of())) {
            Load load = hostLoad(h, 2000);
            assertBounded(load, h);
            assertTrue(hc.hellos.get() >= 2, "the exporter gave up on the connection and tried again");
            Counters.Snapshot c = h.exporter.counters();
            assertEquals(load.records(), c.reported());
            assertTrue(c.queueFull() > 0);
            if (mode == HostileCollector.Mode.WELCOME_THEN_DEAF) {
                // Writes block until the write timeout drops the connection with its frame.
                assertTrue(c.sendFailed() > 0, "the blocked frame is counted: " + c);
            } else {
                // A connection that ends right after Welcome is retried with backoff, not in a loop.
                assertTrue(hc.hellos.get() < 60, "connections: " + hc.hellos.get());
            }
            checkDelivered(h, recover(h, hc, hc.port(), null), load);
        }
    }

    @Test
    void aWelcomeTwoAndAHalfSecondsLateCostsTheClientNothing() throws Exception {
        HostileCollector hc = new HostileCollector(HostileCollector.Mode.SLOW_WELCOME, 2500, 0, null);
        try (Host h = new Host(hc.address(), Map.of("hoptrace.connect.timeout.ms", "5000"))) {
            long t0 = System.nanoTime();
            Load load = hostLoad(h, 3500);
            assertBounded(load, h);
            await(h.exporter::isConnected, 5000, "the late Welcome");
            assertTrue(System.nanoTime() - t0 >= TimeUnit.MILLISECONDS.toNanos(2500));
            assertEquals(1, hc.hellos.get(), "one attempt waited for the late Welcome");
            h.closeClients();
            Counters.Snapshot s = h.exporter.counters();
            assertEquals(load.records(), s.reported());
            assertEquals(s.reported(), s.sent() + s.sendFailed() + s.queueFull(), s.toString());
            assertTrue(s.sent() > 0);
        } finally {
            hc.close();
        }
    }

    /**
     * A thread that drops every connection of {@code fc} every 200 ms, as a collector that
     * restarts, until {@code stop}; counts in {@code drops} the times it dropped any.
     */
    static Thread restarter(FakeCollector fc, AtomicBoolean stop, AtomicInteger drops) {
        return new Thread(() -> {
            while (!stop.get()) {
                LockSupport.parkNanos(TimeUnit.MILLISECONDS.toNanos(200));
                try {
                    drops.addAndGet(fc.dropConnections() > 0 ? 1 : 0);
                } catch (IOException e) {
                    return;
                }
            }
        }, "restarter");
    }

    @Test
    void aCollectorThatRestartsEvery200MsCostsTheClientNothing() throws Exception {
        FakeCollector fc = new FakeCollector();
        AtomicBoolean stop = new AtomicBoolean();
        AtomicInteger drops = new AtomicInteger();
        Thread restarter = restarter(fc, stop, drops);
        try (Host h = new Host(fc.address(), Map.of())) {
            restarter.start();
            Load load = hostLoad(h, 2000);
            stop.set(true);
            restarter.join();
            assertTrue(drops.get() >= 5, "restarts: " + drops.get());
            assertBounded(load, h);
            // The restarter may have closed a connection just before it stopped, and the
            // exporter may not have noticed yet: wait for a connection the collector accepted
            // after the last restart, so that Goodbye has an open connection to go over.
            await(() -> h.exporter.isConnected() && !fc.connections.isEmpty()
                    && !fc.connections.get(fc.connections.size() - 1).closed
                    && !fc.connections.get(fc.connections.size() - 1).socket.isClosed(),
                    5000, "a connection accepted after the last restart");
            h.closeClients();
            await(() -> fc.connections.get(fc.connections.size() - 1).closed, 5000, "goodbye read");
            Counters.Snapshot s = h.exporter.counters();
            assertTrue(s.reconnects() >= 3, s.toString());
            assertEquals(load.records(), s.reported());
            assertEquals(s.reported(), s.sent() + s.sendFailed() + s.queueFull(), s.toString());
            // Version 1: what was written into a connection that broke before the collector
            // read it counts as sent and is gone; nothing arrives twice.
            List<Protocol.Record> got = fc.records();
            Set<Long> keys = new HashSet<>();
            for (Protocol.Record r : got) {
                assertTrue(keys.add(r.hop() * 1_000_000_000L + r.sequence()), "a duplicate: " + r);
            }
            assertTrue(got.size() <= s.sent());
            FakeCollector.Connection last = fc.connections.get(fc.connections.size() - 1);
            assertTrue(last.saidGoodbye());
            Protocol.CountersFrame fin = (Protocol.CountersFrame) last.frames.get(last.frames.size() - 2);
            assertEquals(s.queueFull(), fin.get(Protocol.QUEUE_FULL));
            assertEquals(s.sendFailed(), fin.get(Protocol.SEND_FAILED));
            assertEquals(s.reconnects(), fin.get(Protocol.RECONNECTS));
        } finally {
            stop.set(true);
            fc.close();
        }
    }

    @Test
    void aCollectorThatNeverAnswersAfterWelcomeMakesNothingGrow() throws Exception {
        // Version 1 has no acknowledgements: a collector that reads everything and never sends
        // a byte after Welcome is what "never acknowledges" is here. Nothing is kept once it is
        // written, so nothing can pile up waiting for an answer.
        try (FakeCollector fc = new FakeCollector(); Host h = new Host(fc.address(), Map.of())) {
            Load load = hostLoad(h, 1500);
            assertBounded(load, h);
            assertTrue(load.peakReaders() <= 1, "one connection, one reader");
            h.closeClients();
            Counters.Snapshot s = h.exporter.counters();
            assertEquals(load.records(), s.reported());
            assertEquals(s.reported(), s.sent() + s.sendFailed() + s.queueFull(), s.toString());
            assertEquals(0, s.sendFailed());
            assertEquals(0, s.reconnects());
            await(() -> fc.connections.get(0).closed, 5000, "goodbye read");
            assertEquals(s.sent(), fc.records().size());
            assertEquals(0, h.exporter.footprint().queuedRecords());
        }
    }

    @Test
    void controlFramesAreBuiltWhenWrittenSoAnOutageQueuesNone() throws Exception {
        // Counters and Clock every 50 ms, a 1.5 s outage: 30 of each fell due. A collector that
        // comes up afterwards gets one Clock (the status now) and one Counters frame (one value
        // per counter id, the values now) with the first records, not a backlog.
        int port = freePort();
        try (Host h = new Host("127.0.0.1:" + port, Map.of("hoptrace.clock.interval.ms", "50"))) {
            Load load = hostLoad(h, 1500);
            assertBounded(load, h);
            long upNs = Clocks.realtimeNs();
            Counters.Snapshot before = h.exporter.counters();
            try (FakeCollector fc = new FakeCollector(port)) {
                await(() -> !fc.connections.isEmpty() && fc.connections.get(0).frames.size() >= 4, 10_000,
                        "the first frames");
                List<Protocol.Frame> f = fc.connections.get(0).frames;
                assertInstanceOf(Protocol.HelloFrame.class, f.get(0));
                Protocol.ClockFrame clock = assertInstanceOf(Protocol.ClockFrame.class, f.get(1));
                assertTrue(clock.status().atNs() >= upNs, "the status read when written, not a stale one");
                Protocol.RecordsFrame rs = assertInstanceOf(Protocol.RecordsFrame.class, f.get(2));
                assertEquals(before.reported() - before.queueFull(), rs.records().size(), "the queue, in one frame");
                Protocol.CountersFrame c = assertInstanceOf(Protocol.CountersFrame.class, f.get(3));
                Set<Long> ids = new HashSet<>();
                for (long[] v : c.values()) {
                    assertTrue(ids.add(v[0]), "one value per counter id");
                }
                assertEquals(12, ids.size());
                assertEquals(before.reported(), c.get(Protocol.REPORTED));
                assertEquals(before.queueFull(), c.get(Protocol.QUEUE_FULL));
                assertEquals(rs.records().size(), c.get(Protocol.SENT_RECORDS));
                h.closeClients();
                await(() -> fc.connections.get(0).closed, 5000, "goodbye read");
                Counters.Snapshot s = h.exporter.counters();
                assertEquals(s.reported(), s.sent() + s.sendFailed() + s.queueFull(), s.toString());
                assertEquals(s.sent(), fc.records().size());
            }
        }
    }

    // ------------------------------------------------------------------------------------
    // Shutdown, and TLS

    /**
     * Fills the socket buffers of a collector that stopped reading until the exporter's write
     * blocks (a write timeout of 10 s keeps it blocked), then closes the clients.
     */
    @ParameterizedTest(name = "tls={0}")
    @ValueSource(booleans = {false, true})
    void closeReturnsWithinItsTimeoutWhileAWriteIsBlocked(boolean tls, @TempDir Path dir) throws Exception {
        TestTls t = tls ? new TestTls(dir) : null;
        HostileCollector hc = new HostileCollector(HostileCollector.Mode.WELCOME_THEN_DEAF, 0, 0,
                t == null ? null : t.server);
        Map<String, Object> extra = new HashMap<>();
        extra.put("hoptrace.write.timeout.ms", "10000");
        extra.put("hoptrace.close.timeout.ms", "500");
        if (t != null) {
            extra.put("hoptrace.tls.ca", t.caPem.toString());
        }
        try (Host h = new Host(hc.address(), extra)) {
            await(h.exporter::isConnected, 5000, "welcome");
            Load load = hostLoad(h, 1000);
            assertBounded(load, h);
            // A still moment: records wait and the exporter wrote nothing for 0.3 s, so it is
            // blocked in a write.
            long sent = h.exporter.counters().sent();
            Thread.sleep(300);
            assertEquals(sent, h.exporter.counters().sent(), "the exporter's write is blocked");
            assertTrue(h.exporter.isConnected());
            assertTrue(h.exporter.footprint().queuedRecords() > 0);
            long t0 = System.nanoTime();
            h.closeClients();
            long tookMs = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - t0);
            // Cut at the close timeout (500 ms) plus the margin, not at the 10 s write timeout.
            assertTrue(tookMs < 500 + Exporter.SHUTDOWN_MARGIN_MS + 250, "close took " + tookMs + " ms");
            await(() -> h.exporter.footprint().readerThreads() == 0, 5000, "the reader to end");
            Counters.Snapshot s = h.exporter.counters();
            assertEquals(load.records(), s.reported());
            assertEquals(s.reported(), s.sent() + s.sendFailed() + s.queueFull(), s.toString());
            assertTrue(s.sendFailed() > 0, "the blocked frame and the queue are counted: " + s);
        } finally {
            hc.close();
        }
    }

    @Test
    void overTlsACollectorThatStopsReadingCostsTheClientNothing(@TempDir Path dir) throws Exception {
        TestTls t = new TestTls(dir);
        HostileCollector hc = new HostileCollector(HostileCollector.Mode.WELCOME_THEN_DEAF, 0, 0, t.server);
        try (Host h = new Host(hc.address(), Map.of("hoptrace.tls.ca", t.caPem.toString()))) {
            Load load = hostLoad(h, 2000);
            assertBounded(load, h);
            assertTrue(hc.hellos.get() >= 2, "the exporter gave up on the connection and tried again");
            assertTrue(h.exporter.counters().sendFailed() > 0);
            checkDelivered(h, recover(h, hc, hc.port(), t.server), load);
        }
    }
}
