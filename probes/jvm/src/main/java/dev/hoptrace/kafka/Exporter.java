package dev.hoptrace.kafka;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.LockSupport;
import javax.net.ssl.SSLSocket;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Sends what the interceptors of a JVM report to one collector ({@code
 * docs/collector-protocol.md}, version 1): a bounded lock-free queue that the clients' threads
 * offer records to without ever waiting, and one daemon thread that drains it into Records
 * frames over TCP (or TLS), sends the host's clock status and the counters, reconnects with
 * backoff, and on close flushes, sends the final Counters and Goodbye.
 *
 * <p>One exporter per collector connection ({@link ExporterConfig#key()}) and JVM: {@link
 * #acquire} hands out the shared one and counts references; the last {@link #release} shuts it
 * down. A JVM shutdown hook waits (up to the close timeout) for the clients to close, then
 * flushes whatever exporter is left.
 *
 * <p>Hops are announced in Hello. A hop registered after the connection was made (a client
 * created later) is announced by a new Hello: the exporter finishes the connection cleanly
 * (Counters, Goodbye) and connects again; records of that hop wait in the queue meanwhile.
 *
 * <p>Delivery: in version 1 a Records frame counts as {@code sent} once written to the socket
 * and is forgotten ({@link Delivery}). A later version with durable acknowledgements replaces
 * {@link Delivery} with one that keeps written frames (bounded) until the collector
 * acknowledges their frame sequence, and re-sends the unacknowledged ones after Hello on a
 * new connection; the reader thread of each connection already reads every collector frame.
 */
public final class Exporter {
    private static final Logger LOG = LoggerFactory.getLogger(Exporter.class);
    /** Software name and version sent in Hello. */
    public static final String SOFTWARE = "hoptrace-kafka-interceptors 0.1.0 (Java " + Runtime.version() + ")";

    // ------------------------------------------------------------------------------------
    // Sharing

    private static final Map<String, Exporter> SHARED = new HashMap<>();
    private static boolean hookInstalled;
    private static final ScheduledExecutorService WATCHDOG = Executors.newSingleThreadScheduledExecutor(r -> {
        Thread t = new Thread(r, "hoptrace-watchdog");
        t.setDaemon(true);
        return t;
    });

    /** The JVM's exporter for {@code config}'s collector, started on first use. */
    public static Exporter acquire(ExporterConfig config) {
        synchronized (SHARED) {
            Exporter e = SHARED.get(config.key());
            if (e == null) {
                e = new Exporter(config);
                e.start();
                SHARED.put(config.key(), e);
                if (!hookInstalled) {
                    Runtime.getRuntime().addShutdownHook(new Thread(Exporter::atExit, "hoptrace-shutdown"));
                    hookInstalled = true;
                }
            }
            e.refs++;
            return e;
        }
    }

    /** Drops one reference; the last one flushes and stops the exporter (up to the close timeout). */
    public void release() {
        boolean last;
        synchronized (SHARED) {
            last = --refs == 0;
            if (last) {
                SHARED.remove(config.key(), this);
            }
        }
        if (last) {
            shutdown(config.closeTimeoutMs);
            synchronized (SHARED) {
                SHARED.notifyAll();
            }
        }
    }

    /** Exporters in use now (tests). */
    static int sharedCount() {
        synchronized (SHARED) {
            return SHARED.size();
        }
    }

    private static void atExit() {
        long waitMs;
        List<Exporter> left;
        synchronized (SHARED) {
            waitMs = SHARED.values().stream().mapToLong(e -> e.config.closeTimeoutMs).max().orElse(0);
            long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(waitMs);
            // Other shutdown hooks (Kafka Connect's, the application's) close the clients, whose
            // interceptors release their exporters: give them the close timeout to do so.
            while (!SHARED.isEmpty()) {
                long rest = deadline - System.nanoTime();
                if (rest <= 0) {
                    break;
                }
                try {
                    SHARED.wait(Math.max(1, TimeUnit.NANOSECONDS.toMillis(rest)));
                } catch (InterruptedException e) {
                    break;
                }
            }
            left = new ArrayList<>(SHARED.values());
            SHARED.clear();
        }
        for (Exporter e : left) {
            LOG.info("hoptrace: the JVM exits with clients still open; flushing the exporter to {}",
                    e.config.collector);
            e.shutdown(e.config.closeTimeoutMs);
        }
    }

    // ------------------------------------------------------------------------------------
    // State

    final ExporterConfig config;
    final RecordQueue queue;
    final Counters counters = new Counters();
    private final long instanceId = UUID.randomUUID().getMostSignificantBits();
    private final Tls tls;
    private ClockStatusSource clockStatus;
    private final Delivery delivery;
    private int refs;

    private final List<Protocol.Hop> hops = new ArrayList<>();
    private volatile int hopsVersion;
    private volatile long hopsChangedNs = System.nanoTime();

    private Thread worker;
    private volatile boolean stopping;
    private volatile long stopDeadlineNs;
    private volatile boolean clean;
    private volatile boolean connected;
    private volatile String runId;
    private volatile String lastError;
    private final java.util.concurrent.atomic.AtomicLong rejected = new java.util.concurrent.atomic.AtomicLong();
    private final java.util.Set<String> rejectReasons = java.util.concurrent.ConcurrentHashMap.newKeySet();

    /** A Reject from the collector (code 2: wrong or missing token). */
    static final class Rejected extends IOException {
        private static final long serialVersionUID = 1L;
        final int code;

        Rejected(int code, String message) {
            super(message);
            this.code = code;
        }
    }

    /** An exporter that is not shared: tests, benchmarks. Call {@link #start()} then {@link #shutdown}. */
    Exporter(ExporterConfig config) {
        this.config = config;
        this.queue = new RecordQueue(config.queueCapacity);
        this.tls = config.tlsCa == null ? null : new Tls(config.tlsCa);
        this.clockStatus = config.clockStatus;
        this.delivery = new Delivery.AtOnce(counters);
    }

    /** Starts the exporter thread. */
    void start() {
        worker = new Thread(this::run, "hoptrace-exporter " + config.collector);
        worker.setDaemon(true);
        worker.start();
    }

    /**
     * Announces hop {@code id} named {@code name} (idempotent).
     *
     * @throws IllegalArgumentException when the id or the name is already announced with
     *     another name or id, or when 16 hops are announced already
     */
    public void registerHop(int id, String name) {
        TraceContext.checkHop(id);
        synchronized (hops) {
            for (Protocol.Hop h : hops) {
                if (h.id() == id && h.name().equals(name)) {
                    return;
                }
                if (h.id() == id || h.name().equals(name)) {
                    throw new IllegalArgumentException("hop " + name + " (id " + id + ") conflicts with hop "
                            + h.name() + " (id " + h.id() + ") already reported to " + config.collector);
                }
            }
            if (hops.size() == Protocol.MAX_HOPS) {
                throw new IllegalArgumentException("an exporter announces at most 16 hops");
            }
            hops.add(new Protocol.Hop(id, name));
            hopsChangedNs = System.nanoTime();
            hopsVersion++;
        }
    }

    /** The hops announced. */
    public List<Protocol.Hop> hops() {
        synchronized (hops) {
            return List.copyOf(hops);
        }
    }

    /**
     * Queues the record of {@code hop} stamping {@code ctx} at {@code stampNs}. Never blocks:
     * when the queue is full the record is dropped and counted as {@code queue_full}.
     *
     * @return false when the record was dropped
     */
    public boolean report(TraceContext ctx, int hop, long stampNs) {
        if (queue.offer(ctx, hop, stampNs)) {
            return true;
        }
        counters.queueFull.increment();
        return false;
    }

    /** The counters now. */
    public Counters.Snapshot counters() {
        return counters.snapshot(queue.size());
    }

    /** The shared counters, for the interceptors' carrier outcomes. */
    Counters counterSet() {
        return counters;
    }

    /** Whether the exporter is connected to the collector now. */
    public boolean isConnected() {
        return connected;
    }

    /** The run id of the last Welcome, or null. */
    public String runId() {
        return runId;
    }

    /** The last connection error, or null. */
    public String lastError() {
        return lastError;
    }

    /**
     * Connections the collector refused with a Reject (a wrong or missing
     * {@code hoptrace.token}, a hop its pipeline does not declare, ...). A refused probe
     * reaches no collector, so this count stays in the process; the first refusal of each
     * reason is logged as an error.
     */
    public long rejected() {
        return rejected.get();
    }

    /**
     * Flushes what is queued, sends the final Counters and Goodbye, and stops, waiting at most
     * {@code timeoutMs}; what cannot be delivered by then is counted as {@code send_failed}.
     *
     * @return whether the collector got everything and Goodbye
     */
    public boolean shutdown(long timeoutMs) {
        stopDeadlineNs = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(Math.max(0, timeoutMs));
        stopping = true;
        Thread t = worker;
        if (t != null) {
            LockSupport.unpark(t);
            try {
                t.join(Math.max(1, timeoutMs) + 2000);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
        return clean;
    }

    // ------------------------------------------------------------------------------------
    // The exporter thread

    private void run() {
        if (clockStatus == null) {
            clockStatus = ClockStatusSource.detect();
        }
        Protocol.Buffer buf = new Protocol.Buffer(1 << 16);
        Conn conn = null;
        long backoffNs = TimeUnit.MILLISECONDS.toNanos(config.backoffMinMs);
        long nextAttemptNs = System.nanoTime();
        boolean connectedOnce = false;
        boolean planned = false;
        long lastClockNs = 0;
        long lastCountersNs = 0;
        boolean clockDue = true;
        boolean countersDue = true;
        int failures = 0;
        long lastWarnNs = 0;
        long frameSeq = 0;
        int maxBatch = Math.max(1, Math.min(config.maxBatch, Protocol.MAX_RECORDS_PER_FRAME));
        long clockNs = TimeUnit.MILLISECONDS.toNanos(config.clockIntervalMs);
        long countersNs = TimeUnit.MILLISECONDS.toNanos(config.countersIntervalMs);
        long settleNs = TimeUnit.MILLISECONDS.toNanos(config.settleMs);
        for (;;) {
            long now = System.nanoTime();
            boolean stop = stopping;
            boolean pastDeadline = stop && now - stopDeadlineNs >= 0;
            if (conn != null && conn.dead) {
                LOG.warn("hoptrace: the collector {} closed the connection{}", config.collector,
                        conn.rejectReason == null ? "" : ": " + conn.rejectReason);
                lastError = conn.rejectReason != null ? conn.rejectReason : "connection closed by the collector";
                conn.close();
                conn = null;
                connected = false;
            }
            if (conn == null) {
                if (pastDeadline) {
                    break;
                }
                if (stop && hops().isEmpty() && queue.size() == 0) {
                    clean = true; // no hop was ever announced: nothing to tell the collector
                    break;
                }
                boolean settling = !connectedOnce && !stop && now - hopsChangedNs < settleNs;
                if (!settling && now - nextAttemptNs >= 0 && !hops().isEmpty()) {
                    try {
                        conn = connect();
                        try {
                            for (byte[] frame : delivery.toResend()) {
                                Protocol.Buffer again = new Protocol.Buffer(frame.length);
                                again.bytes(frame);
                                conn.write(again);
                            }
                        } catch (IOException e) {
                            conn.close();
                            conn = null;
                            throw e;
                        }
                        if (connectedOnce) {
                            counters.reconnects.incrementAndGet();
                        }
                        if (failures > 0 || !planned) {
                            LOG.info("hoptrace: connected to the collector {} (run {}, hops {})", config.collector,
                                    runId, conn.hopNames);
                        }
                        connectedOnce = true;
                        planned = false;
                        failures = 0;
                        backoffNs = TimeUnit.MILLISECONDS.toNanos(config.backoffMinMs);
                        clockDue = true;
                        countersDue = true;
                        continue;
                    } catch (IOException | RuntimeException e) {
                        lastError = e.getMessage();
                        connected = false;
                        failures++;
                        if (e instanceof Rejected r) {
                            rejected.incrementAndGet();
                            if (rejectReasons.add(r.getMessage())) {
                                LOG.error("hoptrace: {}{}; nothing is delivered until the collector accepts this probe: "
                                        + "records wait in the queue, beyond it they are counted as queue_full, and at "
                                        + "shutdown as send_failed; retrying with backoff", r.getMessage(),
                                        r.code == 2 ? " (set hoptrace.token to the collector's --token)"
                                                : r.code == 3 ? " (the collector's pipeline spec must declare every hop "
                                                + "with the same id and name)" : "");
                            }
                            lastWarnNs = now;
                        } else if (failures == 1 || now - lastWarnNs > TimeUnit.SECONDS.toNanos(60)) {
                            LOG.warn("hoptrace: cannot reach the collector {}: {}; retrying with backoff",
                                    config.collector, e.getMessage());
                            lastWarnNs = now;
                        } else {
                            LOG.debug("hoptrace: cannot reach the collector {}: {}", config.collector, e.getMessage());
                        }
                        nextAttemptNs = now + backoffNs;
                        backoffNs = Math.min(backoffNs * 2, TimeUnit.MILLISECONDS.toNanos(config.backoffMaxMs));
                    }
                }
                LockSupport.parkNanos(Math.min(TimeUnit.MILLISECONDS.toNanos(10),
                        Math.max(TimeUnit.MILLISECONDS.toNanos(1), nextAttemptNs - System.nanoTime())));
                continue;
            }

            buf.clear();
            if (clockDue || now - lastClockNs >= clockNs) {
                Protocol.clock(buf, clockStatus.read());
                lastClockNs = now;
                clockDue = false;
            }
            int recordsAt = Protocol.beginRecords(buf);
            int n = queue.drainInto(buf, maxBatch, conn.hopMask);
            Protocol.endRecords(buf, recordsAt, n);
            int recordsLen = buf.length() - recordsAt;
            if (n > 0) {
                frameSeq++;
            }
            counters.dequeued.addAndGet(n);
            boolean blocked = n < maxBatch && queue.blockedHop() >= 0;
            boolean drained = n == 0 && !blocked && queue.size() == 0;
            boolean finishing = stop && drained;
            boolean rehello = blocked && !pastDeadline;
            if (finishing || rehello || countersDue || now - lastCountersNs >= countersNs) {
                // Counted as if this frame's records were sent, which they are once the write
                // below succeeds; when it fails the connection is dropped with this frame.
                Counters.Snapshot s = counters.snapshot(queue.size());
                Counters.Snapshot w = new Counters.Snapshot(s.reported(), s.queueFull(), s.sent() + n,
                        s.sendFailed(), s.reconnects(), s.notTraced(), s.badContext(), s.stampsFull(),
                        s.badTraceparent());
                Protocol.counters(buf, Clocks.realtimeNs(), w.toWire());
                lastCountersNs = now;
                countersDue = false;
            }
            if (finishing || rehello) {
                Protocol.goodbye(buf);
            }
            if (buf.length() > 0) {
                try {
                    conn.write(buf);
                    if (n > 0) {
                        delivery.written(frameSeq, buf.array(), recordsAt, recordsLen, n);
                    }
                } catch (IOException e) {
                    if (n > 0) {
                        delivery.failed(frameSeq, n);
                    }
                    if (n > 0) {
                        LOG.error("hoptrace: lost {} records: write to the collector {} failed: {}", n,
                                config.collector, e.getMessage());
                    }
                    lastError = "write failed: " + e.getMessage();
                    conn.close();
                    conn = null;
                    connected = false;
                    nextAttemptNs = System.nanoTime();
                    continue;
                }
            }
            if (finishing) {
                conn.finish();
                clean = true;
                break;
            }
            if (rehello) {
                LOG.info("hoptrace: hop {} was registered after connecting; announcing it with a new hello",
                        queue.blockedHop());
                conn.finish();
                conn = null;
                connected = false;
                planned = true;
                nextAttemptNs = System.nanoTime();
                continue;
            }
            if (pastDeadline) {
                break;
            }
            if (n == 0) {
                LockSupport.parkNanos(TimeUnit.MILLISECONDS.toNanos(config.idleWaitMs));
            }
        }
        if (conn != null) {
            conn.close();
        }
        connected = false;
        long left = queue.discardAll();
        if (left > 0) {
            counters.dequeued.addAndGet(left);
            counters.sendFailed.addAndGet(left);
            LOG.error("hoptrace: {} records were not delivered to the collector {} before the exporter stopped; "
                    + "counted as send_failed", left, config.collector);
        }
    }

    private Conn connect() throws IOException {
        List<Protocol.Hop> announced;
        int version;
        synchronized (hops) {
            announced = List.copyOf(hops);
            version = hopsVersion;
        }
        String host = config.collectorHost();
        int port = config.collectorPort();
        InetAddress[] addrs = InetAddress.getAllByName(host);
        IOException last = null;
        for (InetAddress addr : addrs) {
            Socket tcp = new Socket();
            try {
                tcp.setTcpNoDelay(true);
                tcp.connect(new InetSocketAddress(addr, port), (int) config.connectTimeoutMs);
                tcp.setSoTimeout((int) config.connectTimeoutMs);
                Socket s = tcp;
                if (tls != null) {
                    SSLSocket ss = tls.wrap(tcp, config.tlsName != null ? config.tlsName : host, port);
                    ss.startHandshake();
                    s = ss;
                }
                Protocol.Buffer hello = new Protocol.Buffer(256);
                Protocol.hello(hello, new Protocol.Hello(instanceId, config.host, config.process, SOFTWARE,
                        config.token, announced));
                OutputStream out = s.getOutputStream();
                out.write(hello.array(), 0, hello.length());
                out.flush();
                InputStream in = s.getInputStream();
                Protocol.Frame answer = Protocol.read(in);
                if (answer instanceof Protocol.RejectFrame r) {
                    throw new Rejected(r.code(), "collector " + addr.getHostAddress() + ":" + port
                            + " rejected this probe (code " + r.code() + "): " + r.reason());
                }
                if (!(answer instanceof Protocol.WelcomeFrame w)) {
                    throw new IOException("collector answered hello with " + answer);
                }
                s.setSoTimeout(0);
                runId = w.runId();
                connected = true;
                lastError = null;
                return new Conn(s, in, out, announced, version);
            } catch (Rejected e) {
                closeQuietly(tcp);
                throw e;
            } catch (IOException e) {
                closeQuietly(tcp);
                last = e instanceof Protocol.ProtocolException || e.getMessage() == null
                        ? new IOException("collector " + addr.getHostAddress() + ":" + port + ": " + e, e)
                        : e;
            }
        }
        throw last != null ? last : new IOException(host + " resolves to no address");
    }

    private static void closeQuietly(Socket s) {
        try {
            s.close();
        } catch (IOException e) {
            // closing anyway
        }
    }

    /** One connection: the socket, its reader thread and its write watchdog. */
    private final class Conn {
        final Socket socket;
        final InputStream in;
        final OutputStream out;
        final long[] hopMask = new long[4];
        final List<String> hopNames = new ArrayList<>();
        final int hopsVersion;
        volatile boolean dead;
        volatile String rejectReason;
        volatile long writeStartedNs;
        private volatile boolean finishing;
        private final ScheduledFuture<?> watch;

        Conn(Socket socket, InputStream in, OutputStream out, List<Protocol.Hop> hops, int hopsVersion) {
            this.socket = socket;
            this.in = in;
            this.out = out;
            this.hopsVersion = hopsVersion;
            for (Protocol.Hop h : hops) {
                hopMask[h.id() >>> 6] |= 1L << (h.id() & 63);
                hopNames.add(h.name() + "=" + h.id());
            }
            Thread reader = new Thread(this::read, "hoptrace-reader " + config.collector);
            reader.setDaemon(true);
            reader.start();
            watch = WATCHDOG.scheduleWithFixedDelay(this::watch, 100, 100, TimeUnit.MILLISECONDS);
        }

        /** Reads what the collector sends after Welcome (version 1: only Reject before it closes). */
        private void read() {
            try {
                for (;;) {
                    Protocol.Frame f = Protocol.read(in);
                    if (f instanceof Protocol.RejectFrame r) {
                        rejectReason = "rejected (code " + r.code() + "): " + r.reason();
                    } else {
                        LOG.warn("hoptrace: unexpected frame from the collector {}: {}", config.collector, f);
                    }
                }
            } catch (IOException e) {
                if (!finishing) {
                    dead = true;
                    LockSupport.unpark(worker);
                }
            }
        }

        /** Closes the socket under a write blocked past the write timeout or the stop deadline. */
        private void watch() {
            long started = writeStartedNs;
            if (started == 0) {
                return;
            }
            long now = System.nanoTime();
            boolean tooLong = now - started > TimeUnit.MILLISECONDS.toNanos(config.writeTimeoutMs);
            boolean stopPast = stopping && now - stopDeadlineNs >= 0;
            if (tooLong || stopPast) {
                LOG.warn("hoptrace: a write to the collector {} is blocked ({}); dropping the connection",
                        config.collector, tooLong ? "write timeout" : "stop deadline");
                closeQuietly(socket);
            }
        }

        void write(Protocol.Buffer buf) throws IOException {
            writeStartedNs = System.nanoTime() | 1;
            try {
                out.write(buf.array(), 0, buf.length());
                out.flush();
            } finally {
                writeStartedNs = 0;
            }
        }

        /** After Goodbye: the write side is done; close. */
        void finish() {
            finishing = true;
            close();
        }

        void close() {
            finishing = true;
            watch.cancel(false);
            closeQuietly(socket);
        }
    }

    /**
     * What becomes of a Records frame once the exporter has written it. Version 1 ({@link
     * AtOnce}): written is sent, a failed write is lost. A version with durable
     * acknowledgements keeps each written frame (its sequence number and bytes, bounded in
     * records) until the collector acknowledges that sequence, counts it as sent then, and
     * hands the unacknowledged frames back after the Hello of a new connection; the exporter
     * loop already numbers the frames, calls these hooks, and reads every collector frame on
     * the connection's reader thread.
     */
    interface Delivery {
        /**
         * Records frame number {@code frameSeq} of {@code records} records, at {@code
         * frame[off..off+len)}, was written to the socket (the array is reused afterwards).
         */
        void written(long frameSeq, byte[] frame, int off, int len, int records);

        /** Frame {@code frameSeq} of {@code records} records could not be written. */
        void failed(long frameSeq, int records);

        /** Frames to write again, in order, right after the Hello of a new connection. */
        List<byte[]> toResend();

        /** Version 1: written is sent, failed is lost (counted), nothing is re-sent. */
        final class AtOnce implements Delivery {
            private final Counters counters;

            AtOnce(Counters counters) {
                this.counters = counters;
            }

            @Override
            public void written(long frameSeq, byte[] frame, int off, int len, int records) {
                counters.sent.addAndGet(records);
            }

            @Override
            public void failed(long frameSeq, int records) {
                counters.sendFailed.addAndGet(records);
            }

            @Override
            public List<byte[]> toResend() {
                return List.of();
            }
        }
    }
}
