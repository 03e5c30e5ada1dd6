package dev.hoptrace.kafka;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.net.SocketTimeoutException;
import java.net.UnknownHostException;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.LockSupport;
import javax.net.ssl.SSLSocket;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Sends what the interceptors of a JVM report to one collector ({@code
 * docs/collector-protocol.md}, version 2, or 1 when asked or when the collector speaks only
 * that): a bounded lock-free queue that the clients' threads offer records to without ever
 * waiting, and one daemon thread that drains it into records frames over TCP (or TLS), sends
 * the host's clock status and the counters, reconnects with backoff, and on close flushes,
 * sends the final Counters and Goodbye.
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
 * <p><b>Bounds.</b> Whatever the collector does, the clients' threads ({@link #report}) only
 * claim a slot of the queue (no allocation, lock or wait; a full queue is counted as {@code
 * queue_full}), and what the exporter holds is bounded ({@link #footprint()}): the queue's
 * preallocated slots; one write buffer of at most one Records frame ({@link
 * ExporterConfig#maxBatch} records) plus one Clock and one Counters frame, both built from the
 * current status and counters when they are written, so an outage piles up neither; frames
 * from the collector of at most {@link Protocol#MAX_COLLECTOR_FRAME_LEN} bytes, read one at a
 * time; one connection (socket, reader thread, write watchdog) at a time; at most 16 hops and
 * 16 refusal codes remembered for the log; in version 2 the retention buffer ({@link
 * Retention}: at most {@link ExporterConfig#retentionBytes} of frames, plus one entry per frame
 * dropped after it was written, at most {@link Retention#MAX_UNRESOLVED}). Version 1 keeps
 * nothing once it is written.
 *
 * <p>The exporter thread's waits are bounded too: a connection attempt (name resolution, TCP
 * connect, TLS handshake, Hello, Welcome) within {@link ExporterConfig#connectTimeoutMs} in
 * total, a write within {@link ExporterConfig#writeTimeoutMs}; a connection the collector ends
 * soon after Welcome is retried with backoff, not at once. {@link #shutdown} returns within
 * its timeout plus {@link #SHUTDOWN_MARGIN_MS}, closing the socket of a write still blocked
 * then from the calling thread.
 *
 * <p>Delivery: in version 1 a Records frame counts as {@code sent} once written to the socket
 * and is forgotten; a failed write loses it ({@code send_failed}), and what was written to a
 * collector that is then killed is lost without a count. In version 2 (the default, {@link
 * ExporterConfig#retentionBytes} above 0) records go in numbered SeqRecords frames, each kept
 * in the retention buffer until the collector acknowledges it as durable (its reader thread
 * takes the Acks); a new connection's Welcome says what the collector holds ({@code
 * resume_seq}), and the frames after it are written again, in order, before any new one
 * ({@code resent}). While no collector is connected the queue is drained into the same buffer,
 * numbered and unwritten, so an absence shorter than the buffer costs nothing. A full buffer
 * drops its oldest frames ({@code evicted}); those the collector turns out not to hold are
 * {@code lost_unacked}. Nothing is dropped without a count.
 */
public final class Exporter {
    private static final Logger LOG = LoggerFactory.getLogger(Exporter.class);
    /** The version of these interceptors (the jar's Implementation-Version, checked by JarIT). */
    public static final String VERSION = "0.1.0";
    /** Software name and version sent in Hello. */
    public static final String SOFTWARE = "hoptrace-kafka-interceptors " + VERSION + " (Java " + Runtime.version() + ")";
    /** How long {@link #shutdown} waits past its timeout for the exporter thread to finish, ms. */
    public static final long SHUTDOWN_MARGIN_MS = 500;
    /** Bytes of a write buffer beyond its Records frame: one Clock, one Counters, Goodbye. */
    static final int CONTROL_BYTES = 2048;
    /** Refusal codes remembered (the first refusal of each is logged as an error). */
    static final int MAX_REJECT_CODES = 16;
    /** A connection that ends sooner than this after Welcome counts as a failed attempt. */
    private static final long BRIEF_NS = TimeUnit.SECONDS.toNanos(1);
    /** Repeated warnings of one kind: at most one line per this long. */
    private static final long QUIET_NS = TimeUnit.SECONDS.toNanos(60);

    // ------------------------------------------------------------------------------------
    // Sharing

    private static final Map<String, Exporter> SHARED = new HashMap<>();
    private static boolean hookInstalled;
    private static final ScheduledThreadPoolExecutor WATCHDOG = new ScheduledThreadPoolExecutor(1, r -> {
        Thread t = new Thread(r, "hoptrace-watchdog");
        t.setDaemon(true);
        return t;
    });
    /** Name resolution, off the exporter thread so that it counts in the connect timeout. */
    private static final ExecutorService RESOLVER = Executors.newCachedThreadPool(r -> {
        Thread t = new Thread(r, "hoptrace-resolver");
        t.setDaemon(true);
        return t;
    });

    static {
        // Cancelled guards leave the queue at once instead of when they would have run.
        WATCHDOG.setRemoveOnCancelPolicy(true);
    }

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
            } else if (!e.config.tuning().equals(config.tuning())) {
                LOG.warn("hoptrace: clients sharing the exporter to {} ask for other settings ({}) than the "
                        + "first one ({}); the first one's apply", config.collector, config.tuning(),
                        e.config.tuning());
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

    /** The shared exporter to {@code collector} in use now, or null (tests). */
    static Exporter sharedFor(String collector) {
        synchronized (SHARED) {
            for (Exporter e : SHARED.values()) {
                if (e.config.collector.equals(collector)) {
                    return e;
                }
            }
            return null;
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
    private final int writeLimit;
    /** Version 2: numbered records frames kept until acknowledged (the exporter thread's). */
    private Retention retention;
    /** The version the next Hello asks for: 2 unless retention is 0 or the collector refused 2. */
    private int helloVersion;
    /** The number of the next SeqRecords frame (per instance, across connections). */
    private long nextSeq = 1;
    /**
     * Whether records go into the retention buffer while no collector is connected: in version
     * 2, until a collector answers with version 1 (then they wait in the queue, as in version 1).
     */
    private boolean keepWhileAway;
    /** Records written that the collector had not acknowledged when the exporter stopped. */
    private volatile long unacknowledged;
    /** The retention buffer's bytes and evicted entries, as of its last change (footprint). */
    private volatile long retainedBytes;
    private volatile int evictedEntries;
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
    private final AtomicLong rejected = new AtomicLong();
    private final Set<Integer> rejectCodes = ConcurrentHashMap.newKeySet();
    /** The connection in use, for {@link #shutdown} to abort a blocked write. */
    private volatile Conn current;
    /** The socket of a connection attempt under way, likewise. */
    private volatile Socket attempt;
    /** A name resolution still running from an earlier attempt (reused, never doubled). */
    private CompletableFuture<InetAddress[]> resolving;
    /** The write buffer's storage now (footprint). */
    private volatile int writeBufferBytes;
    private final AtomicInteger readers = new AtomicInteger();
    /** The first trace context that did not decode, set by a client's thread, logged by ours. */
    private volatile String badContextError;

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
        this.retention = new Retention(Math.max(0, config.retentionBytes));
        this.helloVersion = config.retentionBytes > 0 ? 2 : 1;
        this.keepWhileAway = helloVersion == 2;
        int batch = Math.max(1, Math.min(config.maxBatch, Protocol.MAX_RECORDS_PER_FRAME));
        this.writeLimit = 4 + 1 + 4 + batch * (Protocol.RECORD_LEN + 16) + CONTROL_BYTES;
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

    /**
     * Notes that a record's trace context did not decode ({@code error}, its wire name), for
     * the exporter thread to log once: the client's thread that finds it does no I/O.
     */
    void noteBadContext(String error) {
        if (badContextError == null) {
            badContextError = error;
        }
    }

    /** The counters now. */
    public Counters.Snapshot counters() {
        return counters.snapshot(queue.size());
    }

    /** The shared counters, for the interceptors' carrier outcomes. */
    Counters counterSet() {
        return counters;
    }

    /**
     * What the exporter holds now, beside its fixed queue.
     *
     * @param queuedRecords records waiting in the queue (at most {@code queueSlots})
     * @param queueSlots the queue's preallocated slots (72 bytes each)
     * @param writeBufferBytes storage of the write buffer (at most {@code writeBufferLimit})
     * @param writeBufferLimit the most it may hold: one Records frame of {@link
     *     ExporterConfig#maxBatch} records, one Clock and one Counters frame
     * @param readerThreads connection reader threads alive (one per connection; the one of a
     *     connection just closed may still be ending)
     * @param rejectCodes refusal codes remembered for the log (at most {@link #MAX_REJECT_CODES})
     * @param hops hops announced (at most 16)
     * @param retainedBytes bytes of records frames kept for the collector's Ack (version 2; at
     *     most {@code retentionLimit})
     * @param retentionLimit {@link ExporterConfig#retentionBytes}
     * @param evictedEntries entries kept about frames evicted after they were written, until the
     *     collector says whether it holds them (at most {@link Retention#MAX_UNRESOLVED})
     */
    public record Footprint(long queuedRecords, int queueSlots, int writeBufferBytes, int writeBufferLimit,
                            int readerThreads, int rejectCodes, int hops, long retainedBytes,
                            long retentionLimit, int evictedEntries) {}

    /** What the exporter holds now. */
    public Footprint footprint() {
        int h;
        synchronized (hops) {
            h = hops.size();
        }
        return new Footprint(queue.size(), queue.capacity(), writeBufferBytes, writeLimit, readers.get(),
                rejectCodes.size(), h, retainedBytes, Math.max(0, config.retentionBytes), evictedEntries);
    }

    /** Whether the exporter is connected to the collector now. */
    public boolean isConnected() {
        return connected;
    }

    /** The run id of the last Welcome, or null. */
    public String runId() {
        return runId;
    }

    /**
     * Version 2: records written that the collector had not acknowledged as durable when the
     * exporter stopped (it may hold them; 0 after a clean stop). Version 1 cannot tell.
     */
    public long unacknowledged() {
        return unacknowledged;
    }

    /** The last connection error, or null. */
    public String lastError() {
        return lastError;
    }

    /**
     * Connections the collector refused with a Reject (a wrong or missing
     * {@code hoptrace.token}, a hop its pipeline does not declare, ...). A refused probe
     * reaches no collector, so this count stays in the process; the first refusal of each
     * code is logged as an error.
     */
    public long rejected() {
        return rejected.get();
    }

    /**
     * Flushes what is queued, sends the final Counters and Goodbye, and stops, waiting at most
     * {@code timeoutMs}; what cannot be delivered by then is counted as {@code send_failed}.
     * Returns within {@code timeoutMs} + {@link #SHUTDOWN_MARGIN_MS} whatever the collector
     * does: at the timeout the socket of a write or connection attempt still under way is
     * closed from this thread.
     *
     * @return whether the collector got everything and Goodbye
     */
    public boolean shutdown(long timeoutMs) {
        long t = Math.max(0, timeoutMs);
        stopDeadlineNs = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(t);
        stopping = true;
        Thread w = worker;
        if (w == null) {
            return clean;
        }
        LockSupport.unpark(w);
        try {
            w.join(Math.max(1, t));
            if (w.isAlive()) {
                abortIo();
                LockSupport.unpark(w);
                w.join(SHUTDOWN_MARGIN_MS);
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        return clean;
    }

    /** Closes the sockets under the exporter thread's I/O (it then sees the failure). */
    private void abortIo() {
        Conn c = current;
        if (c != null) {
            c.abort();
        }
        Socket a = attempt;
        if (a != null) {
            closeQuietly(a);
        }
    }

    // ------------------------------------------------------------------------------------
    // The exporter thread

    /** Warnings of one kind: the first is logged, then at most one line a minute. */
    private static final class Quiet {
        private long lastNs;
        private long held;
        private boolean any;

        /** Whether to log now; {@link #held()} then tells how many were not logged since. */
        boolean due(long now) {
            if (!any || now - lastNs >= QUIET_NS) {
                any = true;
                lastNs = now;
                return true;
            }
            held++;
            return false;
        }

        String held() {
            long h = held;
            held = 0;
            return h == 0 ? "" : " (" + h + " more like it since the last such line)";
        }
    }

    private void run() {
        if (clockStatus == null) {
            clockStatus = ClockStatusSource.detect();
        }
        Protocol.Buffer buf = new Protocol.Buffer(1 << 16, writeLimit);
        writeBufferBytes = buf.capacity();
        Conn conn = null;
        long backoffMinNs = TimeUnit.MILLISECONDS.toNanos(config.backoffMinMs);
        long backoffMaxNs = TimeUnit.MILLISECONDS.toNanos(Math.max(config.backoffMinMs, config.backoffMaxMs));
        long backoffNs = backoffMinNs;
        long nextAttemptNs = System.nanoTime();
        boolean connectedOnce = false;
        boolean planned = false;
        long lastClockNs = 0;
        long lastCountersNs = 0;
        boolean clockDue = true;
        boolean countersDue = true;
        int failures = 0;
        boolean badContextLogged = false;
        Quiet connectWarnings = new Quiet();
        Quiet dropWarnings = new Quiet();
        Quiet connectedInfo = new Quiet();
        Quiet lossErrors = new Quiet();
        int maxBatch = Math.max(1, Math.min(config.maxBatch, Protocol.MAX_RECORDS_PER_FRAME));
        long clockNs = TimeUnit.MILLISECONDS.toNanos(config.clockIntervalMs);
        long countersNs = TimeUnit.MILLISECONDS.toNanos(config.countersIntervalMs);
        long settleNs = TimeUnit.MILLISECONDS.toNanos(config.settleMs);
        for (;;) {
            long now = System.nanoTime();
            boolean stop = stopping;
            boolean pastDeadline = stop && now - stopDeadlineNs >= 0;
            if (!badContextLogged && badContextError != null) {
                badContextLogged = true;
                LOG.warn("hoptrace: a record carries a hoptrace header that does not decode ({}); "
                        + "further ones are counted as bad_context", badContextError);
            }
            String ended = null;
            if (conn != null && conn.dead) {
                ended = conn.endReason != null ? conn.endReason : "connection closed by the collector";
            }
            if (ended != null) {
                if (dropWarnings.due(now)) {
                    LOG.warn("hoptrace: the collector {} ended the connection: {}{}", config.collector, ended,
                            dropWarnings.held());
                }
                lastError = ended;
                boolean brief = now - conn.openedNs < BRIEF_NS;
                conn.close();
                conn = null;
                current = null;
                connected = false;
                if (brief) {
                    // Ended right after Welcome: a collector that cannot keep a connection is
                    // retried with backoff, not in a loop.
                    nextAttemptNs = now + backoffNs;
                    backoffNs = Math.min(backoffNs * 2, backoffMaxNs);
                } else {
                    backoffNs = backoffMinNs;
                }
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
                        current = conn;
                        try {
                            resume(conn);
                        } catch (IOException e) {
                            conn.close();
                            conn = null;
                            current = null;
                            connected = false;
                            throw new IOException("sending unacknowledged records again: " + e.getMessage(), e);
                        }
                        if (connectedOnce) {
                            counters.reconnects.incrementAndGet();
                        }
                        if ((failures > 0 || !planned) && connectedInfo.due(now)) {
                            LOG.info("hoptrace: connected to the collector {} (run {}, hops {}){}", config.collector,
                                    runId, conn.hopNames, connectedInfo.held());
                        }
                        connectedOnce = true;
                        planned = false;
                        failures = 0;
                        clockDue = true;
                        countersDue = true;
                        continue;
                    } catch (IOException | RuntimeException e) {
                        lastError = e.getMessage();
                        connected = false;
                        if (e instanceof Rejected r && r.code == Protocol.REJECT_VERSION && helloVersion > 1) {
                            LOG.warn("hoptrace: the collector {} speaks only protocol version 1 ({}): connecting again "
                                    + "without durable acknowledgements; what a collector restart catches unwritten "
                                    + "is lost", config.collector, r.getMessage());
                            helloVersion = 1;
                            continue;
                        }
                        failures++;
                        if (e instanceof Rejected r) {
                            rejected.incrementAndGet();
                            boolean first = rejectCodes.size() < MAX_REJECT_CODES && rejectCodes.add(r.code);
                            if (first) {
                                LOG.error("hoptrace: {}{}; nothing is delivered until the collector accepts this probe: "
                                        + "records wait in the retention buffer (version 2) or the queue, beyond them they "
                                        + "are counted as evicted or queue_full, and at shutdown as send_failed; retrying "
                                        + "with backoff", r.getMessage(),
                                        r.code == 2 ? " (set hoptrace.token to the collector's --token)"
                                                : r.code == 3 ? " (the collector's pipeline spec must declare every hop "
                                                + "with the same id and name)" : "");
                            }
                        } else if (connectWarnings.due(now)) {
                            LOG.warn("hoptrace: cannot reach the collector {}: {}; retrying with backoff{}",
                                    config.collector, e.getMessage(), connectWarnings.held());
                        } else {
                            LOG.debug("hoptrace: cannot reach the collector {}: {}", config.collector, e.getMessage());
                        }
                        long after = System.nanoTime();
                        nextAttemptNs = after + backoffNs;
                        backoffNs = Math.min(backoffNs * 2, backoffMaxNs);
                    }
                }
                if (keepWhileAway) {
                    // The collector is away: the records wait in the retention buffer, numbered,
                    // for the next connection (the queue stays free for the clients); beyond its
                    // bound the oldest go, counted.
                    retainQueued(buf, maxBatch);
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
            boolean durable = conn.durable;
            long seq = nextSeq;
            int recordsAt = durable ? Protocol.beginSeqRecords(buf, seq) : Protocol.beginRecords(buf);
            int n = queue.drainInto(buf, maxBatch, conn.hopMask);
            Protocol.endRecords(buf, recordsAt, n);
            counters.dequeued.addAndGet(n);
            if (durable && n > 0) {
                // Kept before it is written: a write that fails leaves it to send again.
                nextSeq++;
                retain(new Retention.Frame(seq, n, Arrays.copyOfRange(buf.array(), recordsAt, buf.length())), false);
            }
            boolean blocked = n < maxBatch && queue.blockedHop() >= 0;
            boolean drained = n == 0 && !blocked && queue.size() == 0;
            boolean finishing = stop && drained;
            boolean rehello = blocked && !pastDeadline;
            if (finishing || rehello || countersDue || now - lastCountersNs >= countersNs) {
                // Counted as if this frame's records were sent, which they are once the write
                // below succeeds; when it fails the connection is dropped with this frame.
                Counters.Snapshot w = counters.snapshot(queue.size()).plusSent(n);
                Protocol.counters(buf, Clocks.realtimeNs(), w.toWire());
                lastCountersNs = now;
                countersDue = false;
            }
            if (finishing || rehello) {
                Protocol.goodbye(buf);
            }
            writeBufferBytes = buf.capacity();
            if (buf.length() > 0) {
                try {
                    conn.write(buf.array(), buf.length());
                    counters.sent.addAndGet(n);
                    if (durable && n > 0) {
                        retention.markWritten(seq);
                    }
                } catch (IOException e) {
                    // Version 2 keeps the frame: it is written again on the next connection.
                    if (n > 0 && !durable) {
                        counters.sendFailed.addAndGet(n);
                        if (lossErrors.due(now)) {
                            LOG.error("hoptrace: lost {} records (counted as send_failed): write to the collector {} "
                                    + "failed: {}{}", n, config.collector,
                                    conn.endReason != null ? conn.endReason : e.getMessage(), lossErrors.held());
                        }
                    }
                    lastError = conn.endReason != null ? conn.endReason : "write failed: " + e.getMessage();
                    boolean brief = System.nanoTime() - conn.openedNs < BRIEF_NS;
                    conn.close();
                    conn = null;
                    current = null;
                    connected = false;
                    if (brief) {
                        nextAttemptNs = System.nanoTime() + backoffNs;
                        backoffNs = Math.min(backoffNs * 2, backoffMaxNs);
                    } else {
                        nextAttemptNs = System.nanoTime();
                        backoffNs = backoffMinNs;
                    }
                    continue;
                }
            }
            if (durable) {
                retention.ack(conn.ackSeq);
                noteRetention();
                if (retention.stalled() && !finishing) {
                    // What the collector holds of the frames dropped unacknowledged is learnt only
                    // from a Welcome: reconnect rather than remember ever more of them.
                    LOG.warn("hoptrace: the collector {} acknowledged none of the last {} records frames the "
                            + "retention buffer dropped; reconnecting so that it says what it holds",
                            config.collector, Retention.MAX_UNRESOLVED);
                    lastError = "the collector does not acknowledge: reconnecting";
                    nextAttemptNs = reconnectNow(conn, false);
                    conn = null;
                    planned = true;
                    continue;
                }
            }
            if (finishing) {
                if (durable) {
                    awaitFinalAck(conn);
                    if (!retention.isEmpty() && conn.dead && System.nanoTime() - stopDeadlineNs < 0) {
                        // The connection broke before the collector acknowledged everything:
                        // connect again, send the rest and say Goodbye there.
                        lastError = conn.endReason != null ? conn.endReason : "connection closed before the last Ack";
                        nextAttemptNs = reconnectNow(conn, false);
                        conn = null;
                        continue;
                    }
                }
                conn.finish();
                current = null;
                clean = true;
                break;
            }
            if (rehello) {
                LOG.info("hoptrace: hop {} was registered after connecting; announcing it with a new hello",
                        queue.blockedHop());
                nextAttemptNs = reconnectNow(conn, true);
                conn = null;
                planned = true;
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
        current = null;
        connected = false;
        long left = queue.discardAll();
        if (left > 0) {
            counters.dequeued.addAndGet(left);
            counters.sendFailed.addAndGet(left);
            LOG.error("hoptrace: {} records were not delivered to the collector {} before the exporter stopped; "
                    + "counted as send_failed", left, config.collector);
        }
        // Version 2: frames numbered while the collector was away and never written are
        // undelivered; evicted ones never written are lost; written ones the collector did not
        // acknowledge it may hold.
        long unwritten = retention.unwrittenRecords();
        if (unwritten > 0) {
            counters.sendFailed.addAndGet(unwritten);
            LOG.error("hoptrace: {} records could never be sent to the collector {} before the exporter stopped; "
                    + "counted as send_failed", unwritten, config.collector);
        }
        counters.lostUnacked.addAndGet(retention.evictedUnwrittenUnresolved());
        long unacked = retention.unackedRecords() - unwritten + retention.evictedWrittenUnresolved();
        unacknowledged = unacked;
        if (unacked > 0) {
            LOG.warn("hoptrace: the exporter stopped with {} records the collector {} had not acknowledged as "
                    + "durable (it may hold them)", unacked, config.collector);
        }
        retention = new Retention(0);
        noteRetention();
    }

    /**
     * Leaves connection {@code c} after Goodbye ({@code finished}, a clean end) or drops it;
     * returns when to connect again: now.
     */
    private long reconnectNow(Conn c, boolean finished) {
        if (finished) {
            c.finish();
        } else {
            c.close();
        }
        current = null;
        connected = false;
        return System.nanoTime();
    }

    /**
     * On a new connection: forgets what the collector holds (Welcome's {@code resume_seq}),
     * counts what it lost of the evicted frames, and writes the kept frames again, in order.
     * On a version 1 connection (a collector that keeps no log) the kept frames go as plain
     * Records frames and nothing is kept any more.
     */
    private void resume(Conn c) throws IOException {
        long lost = c.durable ? retention.resume(c.resumeSeq) : retention.evictedUnwrittenUnresolved();
        if (lost > 0) {
            counters.lostUnacked.addAndGet(lost);
            LOG.error("hoptrace: {} records evicted from the retention buffer were not stored by the collector {}: "
                    + "lost, counted as lost_unacked", lost, config.collector);
        }
        long resent = 0;
        for (Iterator<Retention.Frame> it = retention.frames(); it.hasNext();) {
            Retention.Frame f = it.next();
            if (c.durable) {
                c.write(f.bytes, f.bytes.length);
            } else {
                byte[] plain = Protocol.plainRecords(f.bytes);
                c.write(plain, plain.length);
            }
            if (f.written) {
                resent += f.records;
                counters.resent.addAndGet(f.records);
            } else {
                f.written = true;
                counters.sent.addAndGet(f.records);
            }
        }
        if (resent > 0) {
            LOG.info("hoptrace: sent {} records again that the collector {} had not acknowledged", resent,
                    config.collector);
        }
        if (!c.durable) {
            long unknown = retention.evictedWrittenUnresolved();
            if (unknown > 0) {
                LOG.warn("hoptrace: {} records evicted unacknowledged may be lost: the collector {} now keeps no "
                        + "log and cannot say whether it held them", unknown, config.collector);
            }
            retention = new Retention(Math.max(0, config.retentionBytes));
        }
        noteRetention();
    }

    /** Keeps a numbered frame; counts and (the first time) logs what that evicts. */
    private void retain(Retention.Frame f, boolean away) {
        long evicted = retention.push(f);
        if (evicted > 0 && counters.evicted.getAndAdd(evicted) == 0) {
            LOG.warn("hoptrace: {}the retention buffer ({} bytes) is full: dropped the oldest unacknowledged records "
                    + "(counted as evicted; lost if the collector never stored them)",
                    away ? "the collector " + config.collector + " is away and " : "", config.retentionBytes);
        }
        noteRetention();
    }

    /** Moves what is queued into numbered frames in the retention buffer, unwritten. */
    private void retainQueued(Protocol.Buffer buf, int maxBatch) {
        long[] mask = new long[4];
        for (Protocol.Hop h : hops()) {
            mask[h.id() >>> 6] |= 1L << (h.id() & 63);
        }
        for (;;) {
            buf.clear();
            int at = Protocol.beginSeqRecords(buf, nextSeq);
            int n = queue.drainInto(buf, maxBatch, mask);
            Protocol.endRecords(buf, at, n);
            if (n == 0) {
                return;
            }
            counters.dequeued.addAndGet(n);
            retain(new Retention.Frame(nextSeq++, n, Arrays.copyOf(buf.array(), buf.length())), true);
            if (n < maxBatch) {
                return;
            }
        }
    }

    /**
     * After Goodbye the collector acknowledges once more and ends the connection once its log
     * holds everything this one sent, the last Counters frame included (no Ack covers control
     * frames): waits for that end (up to the stop deadline), so that what it holds is known.
     */
    private void awaitFinalAck(Conn c) {
        while (!c.dead && System.nanoTime() - stopDeadlineNs < 0) {
            LockSupport.parkNanos(TimeUnit.MILLISECONDS.toNanos(1));
        }
        retention.ack(c.ackSeq);
        noteRetention();
    }

    /** Publishes the retention buffer's size for {@link #footprint()}. */
    private void noteRetention() {
        retainedBytes = retention.bytes();
        evictedEntries = retention.evictedEntries();
    }

    /** Nanoseconds to milliseconds, rounded up, at least 0. */
    private static long ceilMs(long ns) {
        return ns <= 0 ? 0 : (ns + 999_999) / 1_000_000;
    }

    /** The connection attempt's deadline: the connect timeout, or the stop deadline if sooner. */
    private long attemptDeadline() {
        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(config.connectTimeoutMs);
        if (stopping && stopDeadlineNs - deadline < 0) {
            deadline = stopDeadlineNs;
        }
        return deadline;
    }

    private Conn connect() throws IOException {
        List<Protocol.Hop> announced;
        int version;
        synchronized (hops) {
            announced = List.copyOf(hops);
            version = hopsVersion;
        }
        long deadline = attemptDeadline();
        String host = config.collectorHost();
        int port = config.collectorPort();
        InetAddress[] addrs = resolve(host, deadline);
        IOException last = null;
        for (InetAddress addr : addrs) {
            long restMs = ceilMs(deadline - System.nanoTime());
            if (restMs <= 0) {
                break;
            }
            Socket tcp = new Socket();
            attempt = tcp;
            // The attempt's deadline in total: a collector that trickles its answer a byte at a
            // time resets every read's timeout, not this.
            ScheduledFuture<?> guard = WATCHDOG.schedule(() -> closeQuietly(tcp), restMs, TimeUnit.MILLISECONDS);
            String step = "TCP connect";
            try {
                tcp.setTcpNoDelay(true);
                tcp.connect(new InetSocketAddress(addr, port), (int) Math.min(Integer.MAX_VALUE, restMs));
                tcp.setSoTimeout((int) Math.max(1, Math.min(Integer.MAX_VALUE, ceilMs(deadline - System.nanoTime()))));
                Socket s = tcp;
                if (tls != null) {
                    step = "TLS handshake";
                    SSLSocket ss = tls.wrap(tcp, config.tlsName != null ? config.tlsName : host, port);
                    ss.startHandshake();
                    s = ss;
                }
                step = "Welcome";
                Protocol.Buffer hello = new Protocol.Buffer(256);
                Protocol.hello(hello, helloVersion, new Protocol.Hello(instanceId, config.host, config.process,
                        SOFTWARE, config.token, announced));
                OutputStream out = s.getOutputStream();
                out.write(hello.array(), 0, hello.length());
                out.flush();
                InputStream in = s.getInputStream();
                Protocol.Frame answer = Protocol.read(in, Protocol.MAX_COLLECTOR_FRAME_LEN);
                if (!guard.cancel(false)) {
                    throw new SocketTimeoutException("the attempt's deadline passed");
                }
                if (answer instanceof Protocol.RejectFrame r) {
                    throw new Rejected(r.code(), "collector " + addr.getHostAddress() + ":" + port
                            + " rejected this probe (code " + r.code() + "): " + r.reason());
                }
                if (!(answer instanceof Protocol.WelcomeFrame w)) {
                    throw new IOException("collector answered hello with " + answer);
                }
                s.setSoTimeout(0);
                boolean durable = w.version() >= 2 && helloVersion >= 2;
                if (w.version() < helloVersion) {
                    LOG.warn("hoptrace: the collector {} runs protocol version {} (it keeps no log: --no-log): "
                            + "records are not acknowledged or kept to send again; a collector restart loses what "
                            + "it had not written", config.collector, w.version());
                }
                keepWhileAway = durable;
                runId = w.runId();
                connected = true;
                lastError = null;
                return new Conn(s, tcp, in, out, announced, version, durable, w.resumeSeq());
            } catch (Rejected e) {
                guard.cancel(false);
                closeQuietly(tcp);
                throw e;
            } catch (IOException e) {
                guard.cancel(false);
                closeQuietly(tcp);
                String where = "collector " + addr.getHostAddress() + ":" + port;
                if (System.nanoTime() - deadline >= 0) {
                    last = new IOException(where + ": no " + step + " within " + config.connectTimeoutMs
                            + " ms (" + e.getMessage() + ")", e);
                } else if (e.getMessage() == null) {
                    last = new IOException(where + " during the " + step + ": " + e, e);
                } else {
                    last = new IOException(where + " during the " + step + ": " + e.getMessage(), e);
                }
            } finally {
                attempt = null;
            }
        }
        throw last != null ? last : new IOException("collector " + config.collector + ": no connection within "
                + config.connectTimeoutMs + " ms");
    }

    /** The addresses of {@code host}, waiting at most until {@code deadline} for a lookup. */
    private InetAddress[] resolve(String host, long deadline) throws IOException {
        if (host.indexOf(':') >= 0 || host.matches("[0-9.]+")) {
            return InetAddress.getAllByName(host); // a literal: no lookup
        }
        CompletableFuture<InetAddress[]> f = resolving;
        if (f == null) {
            f = CompletableFuture.supplyAsync(() -> {
                try {
                    return InetAddress.getAllByName(host);
                } catch (UnknownHostException e) {
                    throw new java.util.concurrent.CompletionException(e);
                }
            }, RESOLVER);
            resolving = f;
        }
        try {
            // In slices, so that a shutdown under way is seen.
            for (;;) {
                long rest = deadline - System.nanoTime();
                if (rest <= 0) {
                    throw new SocketTimeoutException("resolving " + host + " took longer than "
                            + config.connectTimeoutMs + " ms");
                }
                try {
                    InetAddress[] a = f.get(Math.min(rest, TimeUnit.MILLISECONDS.toNanos(50)), TimeUnit.NANOSECONDS);
                    resolving = null;
                    return a;
                } catch (TimeoutException e) {
                    if (stopping && System.nanoTime() - stopDeadlineNs >= 0) {
                        throw new SocketTimeoutException("stopping while resolving " + host);
                    }
                }
            }
        } catch (ExecutionException e) {
            resolving = null;
            Throwable c = e.getCause() instanceof java.util.concurrent.CompletionException ce ? ce.getCause()
                    : e.getCause();
            throw c instanceof IOException io ? io : new IOException("resolving " + host + ": " + c, c);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IOException("interrupted while resolving " + host);
        }
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
        /** The TCP socket under {@link #socket} (the same one without TLS). */
        final Socket raw;
        final InputStream in;
        final OutputStream out;
        final long[] hopMask = new long[4];
        final List<String> hopNames = new ArrayList<>();
        final int hopsVersion;
        /** Version 2: records go in SeqRecords frames, kept until acknowledged. */
        final boolean durable;
        /** Version 2: Welcome's {@code resume_seq}. */
        final long resumeSeq;
        /** Version 2: the highest Ack read (the reader thread's, read by the exporter thread). */
        volatile long ackSeq;
        final long openedNs = System.nanoTime();
        volatile boolean dead;
        volatile String endReason;
        volatile long writeStartedNs;
        private volatile boolean finishing;
        private final ScheduledFuture<?> watch;

        Conn(Socket socket, Socket raw, InputStream in, OutputStream out, List<Protocol.Hop> hops, int hopsVersion,
             boolean durable, long resumeSeq) {
            this.socket = socket;
            this.raw = raw;
            this.in = in;
            this.out = out;
            this.hopsVersion = hopsVersion;
            this.durable = durable;
            this.resumeSeq = resumeSeq;
            this.ackSeq = resumeSeq;
            for (Protocol.Hop h : hops) {
                hopMask[h.id() >>> 6] |= 1L << (h.id() & 63);
                hopNames.add(h.name() + "=" + h.id());
            }
            Thread reader = new Thread(this::read, "hoptrace-reader " + config.collector);
            reader.setDaemon(true);
            readers.incrementAndGet();
            reader.start();
            watch = WATCHDOG.scheduleWithFixedDelay(this::watch, 100, 100, TimeUnit.MILLISECONDS);
        }

        /**
         * Reads what the collector sends after Welcome: in version 2 its Acks (kept for the
         * exporter thread), else only a Reject before it closes. Anything else (another frame,
         * bytes that are no frame, a frame longer than a collector's longest) ends the
         * connection, at once: a write blocked meanwhile fails.
         */
        private void read() {
            try {
                Protocol.Frame f;
                for (;;) {
                    f = Protocol.read(in, Protocol.MAX_COLLECTOR_FRAME_LEN);
                    if (!(durable && f instanceof Protocol.AckFrame a)) {
                        break;
                    }
                    if (a.seq() > ackSeq) {
                        ackSeq = a.seq();
                    }
                }
                if (f instanceof Protocol.RejectFrame r) {
                    endReason = "rejected (code " + r.code() + "): " + r.reason();
                } else {
                    endReason = "unexpected frame from the collector: " + f;
                }
                end();
            } catch (IOException e) {
                if (!finishing) {
                    if (e instanceof Protocol.ProtocolException) {
                        endReason = "the collector sent bytes that are no frame (" + e.getMessage() + ")";
                    }
                    end();
                }
            } finally {
                readers.decrementAndGet();
            }
        }

        private void end() {
            if (!finishing) {
                dead = true;
                abort();
                LockSupport.unpark(worker);
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
                if (endReason == null) {
                    endReason = tooLong ? "a write was blocked longer than " + config.writeTimeoutMs + " ms"
                            : "a write was still blocked at the stop deadline";
                }
                abort();
            }
        }

        /** Writes {@code len} bytes of {@code b}, bounded by the write watchdog. */
        void write(byte[] b, int len) throws IOException {
            writeStartedNs = System.nanoTime() | 1;
            try {
                out.write(b, 0, len);
                out.flush();
            } finally {
                writeStartedNs = 0;
            }
        }

        /** Closes the TCP socket from any thread: whatever blocks on it fails at once. */
        void abort() {
            closeQuietly(raw);
        }

        /** After Goodbye: the write side is done; close (over TLS with close_notify). */
        void finish() {
            finishing = true;
            // Closing TLS writes close_notify, which a collector that stopped reading could
            // block: the watchdog bounds it like any write.
            writeStartedNs = System.nanoTime() | 1;
            try {
                closeQuietly(socket);
            } finally {
                writeStartedNs = 0;
            }
            closeQuietly(raw);
            watch.cancel(false);
        }

        /** Drops the connection: the TCP socket first, so that closing writes nothing. */
        void close() {
            finishing = true;
            closeQuietly(raw);
            closeQuietly(socket);
            watch.cancel(false);
        }
    }
}
