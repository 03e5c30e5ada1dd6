package dev.hoptrace.kafka;

import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.PrintStream;
import java.lang.management.GarbageCollectorMXBean;
import java.lang.management.ManagementFactory;
import java.lang.management.MemoryUsage;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Optional;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.LongAdder;
import java.util.concurrent.locks.LockSupport;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.producer.Callback;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.errors.TopicExistsException;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * The host process of the JVM probe's outage soak: a Kafka producer that sends traced records
 * open-loop at a fixed rate over many streams, with or without the hoptrace producer
 * interceptor, and reports once a second how long its {@code send()} calls took, so that a
 * driver can kill and restart the collector and compare the two hosts' send times and memory.
 *
 * <pre>
 * probes/jvm/outage-host.sh --topic T [--rate 10000] [--streams 3000] [--duration 60]
 *                           [--collector 127.0.0.1:7400]   # with the interceptor
 * </pre>
 *
 * <p>Every record carries a fresh trace context (publisher, stream, sequence, the intended
 * send time of the schedule, no stamps) in its {@code hoptrace} header, with or without the
 * interceptor, so both hosts do the same work but the interceptor's. With {@code --collector}
 * the interceptor stamps the hop {@code --hop} (default {@code publish}, id 0) in {@code
 * send()}; every other {@code hoptrace.*} setting keeps its default.
 *
 * <p>stdout carries one JSON object a line and nothing else (logs go to stderr):
 * <pre>
 * {"ready":true,"pid":1234}
 * {"t":1.001,"n":10000,"max_ns":81234,"errors":0,"h":[[1530,12],...],"jvm":{...},"probe":{...}}
 * {"end":true,"sent":600000,"errors":0,"acked":600000,"jvm":{...},"probe":{...}}
 * </pre>
 * {@code h} holds the non-zero buckets of the send() times of that second (bucket {@code i}
 * holds times of {@code 2^(i/128)} ns up to the next bucket: {@code i = floor(128 log2 ns)});
 * {@code errors} counts the sends that failed so far; {@code jvm} the heap (used, committed)
 * and the garbage collections so far; {@code probe} the interceptor's exporter counters and
 * what it holds now (only with {@code --collector}).
 */
public final class OutageHost {
    private OutageHost() {}

    /** Sub-buckets per power of two. */
    static final int SUB_BUCKETS = 128;
    /** Buckets: times up to 2^40 ns (18 minutes); longer ones land in the last. */
    static final int BUCKETS = SUB_BUCKETS * 40;
    private static final double LN2 = Math.log(2);

    private static final LongAdder ACKED = new LongAdder();
    private static final LongAdder ERRORS = new LongAdder();
    private static final AtomicBoolean ERROR_LOGGED = new AtomicBoolean();
    /** One callback for every record: it counts, and logs the first failure. */
    private static final Callback ON_ACK = (metadata, e) -> {
        if (e == null) {
            ACKED.increment();
            return;
        }
        ERRORS.increment();
        if (ERROR_LOGGED.compareAndSet(false, true)) {
            System.err.println("outage-host: a send failed (only the first failure is logged): " + e);
        }
    };

    private static final String USAGE = String.join("\n",
            "usage: outage-host.sh --topic T [options]",
            "  --bootstrap HOST:PORT   Kafka (default 127.0.0.1:19092)",
            "  --topic T               topic to send to (created with the broker's defaults if missing)",
            "  --rate N                messages per second, open-loop (default 10000)",
            "  --streams N             streams; the record key is the stream number, cycling (default 3000)",
            "  --duration SECONDS      how long to send (default 60)",
            "  --collector HOST:PORT   send through HoptraceProducerInterceptor reporting there",
            "  --hop NAME              the interceptor's hop (default publish)",
            "  --hop-id ID             its id in the collector's pipeline (default 0)",
            "  --publisher ID          the trace contexts' publisher id, 0 to 65535 (default 1)",
            "  --client-id NAME        the producer's client.id (default hoptrace-outage-host)");

    /** The command line. */
    static final class Options {
        String bootstrap = "127.0.0.1:19092";
        String topic;
        long rate = 10_000;
        long streams = 3000;
        double durationS = 60;
        String collector;
        String hop = "publish";
        int hopId = 0;
        int publisher = 1;
        String clientId = "hoptrace-outage-host";

        static Options parse(String[] args) {
            Options o = new Options();
            for (int i = 0; i < args.length; i++) {
                String flag = args[i];
                if (flag.equals("-h") || flag.equals("--help")) {
                    System.err.println(USAGE);
                    System.exit(0);
                }
                if (i + 1 >= args.length) {
                    throw new IllegalArgumentException(flag + " needs a value");
                }
                String v = args[++i];
                switch (flag) {
                    case "--bootstrap" -> o.bootstrap = v;
                    case "--topic" -> o.topic = v;
                    case "--rate" -> o.rate = Long.parseLong(v);
                    case "--streams" -> o.streams = Long.parseLong(v);
                    case "--duration" -> o.durationS = Double.parseDouble(v);
                    case "--collector" -> o.collector = v;
                    case "--hop" -> o.hop = v;
                    case "--hop-id" -> o.hopId = Integer.parseInt(v);
                    case "--publisher" -> o.publisher = Integer.parseInt(v);
                    case "--client-id" -> o.clientId = v;
                    default -> throw new IllegalArgumentException("unknown option " + flag);
                }
            }
            if (o.topic == null || o.topic.isEmpty()) {
                throw new IllegalArgumentException("--topic is required");
            }
            if (o.rate <= 0 || o.rate > 10_000_000) {
                throw new IllegalArgumentException("--rate must be 1 to 10000000");
            }
            if (o.streams <= 0 || o.streams > 0xFFFF_FFFFL) {
                throw new IllegalArgumentException("--streams must be 1 to 4294967295");
            }
            if (!(o.durationS > 0)) {
                throw new IllegalArgumentException("--duration must be positive");
            }
            if (o.publisher < 0 || o.publisher > 0xFFFF) {
                throw new IllegalArgumentException("--publisher must be 0 to 65535");
            }
            return o;
        }
    }

    /** Bucket of a time: {@code floor(128 log2 max(ns, 1))}, at most the last one. */
    static int bucket(long ns) {
        long v = Math.max(ns, 1);
        int exp = 63 - Long.numberOfLeadingZeros(v);
        // log2 of the mantissa, in [0, 1); exactly 0 at a power of two.
        double frac = Math.log((double) v / (double) (1L << exp)) / LN2;
        int sub = Math.min(SUB_BUCKETS - 1, (int) (frac * SUB_BUCKETS));
        return Math.min(BUCKETS - 1, exp * SUB_BUCKETS + sub);
    }

    /** Set by SIGTERM/SIGINT: stop sending, close and print the end line. */
    private static volatile boolean stopRequested;

    public static void main(String[] args) throws Exception {
        // stdout is the protocol: logs, Kafka's included, go to stderr; so does anything a
        // library prints to System.out.
        setIfAbsent("org.slf4j.simpleLogger.logFile", "System.err");
        setIfAbsent("org.slf4j.simpleLogger.defaultLogLevel", "warn");
        setIfAbsent("org.slf4j.simpleLogger.log.dev.hoptrace", "info");
        setIfAbsent("org.slf4j.simpleLogger.showDateTime", "true");
        PrintStream out = new PrintStream(new FileOutputStream(FileDescriptor.out), false, StandardCharsets.UTF_8);
        System.setOut(System.err);

        Options o;
        try {
            o = Options.parse(args);
        } catch (IllegalArgumentException e) {
            System.err.println("outage-host: " + e.getMessage());
            System.err.println(USAGE);
            System.exit(2);
            return;
        }

        Thread mainThread = Thread.currentThread();
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            stopRequested = true;
            try {
                mainThread.join(30_000);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }, "outage-host-stop"));

        ensureTopic(o);

        Map<String, Object> props = new HashMap<>();
        props.put("bootstrap.servers", o.bootstrap);
        props.put("client.id", o.clientId);
        props.put("acks", "1");
        props.put("linger.ms", "5");
        props.put("key.serializer", StringSerializer.class.getName());
        props.put("value.serializer", ByteArraySerializer.class.getName());
        if (o.collector != null) {
            props.put("interceptor.classes", HoptraceProducerInterceptor.class.getName());
            props.put("hoptrace.collector", o.collector);
            props.put("hoptrace.hop", o.hop);
            props.put("hoptrace.hop.id", String.valueOf(o.hopId));
        }

        KafkaProducer<String, byte[]> producer = new KafkaProducer<>(props);
        // The interceptor's exporter, shared through Exporter.acquire under the key its
        // settings give: holding a reference reads its counters; released after the producer.
        Exporter exporter = null;
        if (o.collector != null) {
            exporter = Exporter.acquire(InterceptorConfig.producer(props).exporter);
            if (!exporter.hops().contains(new Protocol.Hop(o.hopId, o.hop))) {
                // Not the interceptor's exporter after all: do not hold a second one.
                exporter.release();
                exporter = null;
                System.err.println("outage-host: the interceptor's exporter is not reachable; no probe counters");
            }
        }
        // Topic metadata before the schedule starts, so that the first send does not wait for it.
        producer.partitionsFor(o.topic);

        String[] keys = new String[(int) Math.min(o.streams, 1 << 20)];
        for (int s = 0; s < keys.length; s++) {
            keys[s] = Long.toString(s);
        }
        byte[] value = new byte[100];
        Arrays.fill(value, (byte) 'x');

        int[] hist = new int[BUCKETS];
        StringBuilder line = new StringBuilder(4096);
        long total = (long) Math.floor(o.rate * o.durationS);
        double periodNs = 1e9 / o.rate;
        long sent = 0;
        long sentThisSecond = 0;
        long maxNs = 0;
        boolean ready = false;

        long t0 = System.nanoTime();
        long wallT0 = Clocks.realtimeNs();
        long nextReport = t0 + 1_000_000_000L;
        while (sent < total && !stopRequested) {
            long now = System.nanoTime();
            // Message i is due at t0 + i * period: send every one due by now.
            long due = Math.min(total, (long) ((now - t0) / periodNs) + 1);
            while (sent < due) {
                long stream = sent % o.streams;
                long seq = sent / o.streams;
                TraceContext ctx = new TraceContext(o.publisher, (int) stream, seq, 1,
                        wallT0 + (long) (sent * periodNs));
                RecordHeaders headers = new RecordHeaders();
                headers.add(HopProbe.HEADER, ctx.encode());
                String key = stream < keys.length ? keys[(int) stream] : Long.toString(stream);
                ProducerRecord<String, byte[]> rec = new ProducerRecord<>(o.topic, null, null, key, value, headers);
                long a = System.nanoTime();
                try {
                    producer.send(rec, ON_ACK);
                } catch (KafkaException e) {
                    ON_ACK.onCompletion(null, e);
                }
                long ns = System.nanoTime() - a;
                hist[bucket(ns)]++;
                if (ns > maxNs) {
                    maxNs = ns;
                }
                sent++;
                sentThisSecond++;
                if (!ready) {
                    ready = true;
                    line.setLength(0);
                    line.append("{\"ready\":true,\"pid\":").append(ProcessHandle.current().pid()).append('}');
                    emit(out, line);
                }
            }
            now = System.nanoTime();
            if (now >= nextReport) {
                second(line, now - t0, sentThisSecond, maxNs, hist, exporter);
                sentThisSecond = 0;
                maxNs = 0;
                while (nextReport <= now) {
                    nextReport += 1_000_000_000L;
                }
                if (!emit(out, line)) {
                    System.err.println("outage-host: stdout is closed; stopping");
                    break;
                }
            }
            // Sleep to the next millisecond tick of the schedule.
            long nextTick = t0 + ((now - t0) / 1_000_000L + 1) * 1_000_000L;
            long wait = nextTick - System.nanoTime();
            if (wait > 0) {
                LockSupport.parkNanos(wait);
            }
        }

        if (sentThisSecond > 0) {
            // The part of a second after the last full one.
            second(line, System.nanoTime() - t0, sentThisSecond, maxNs, hist, exporter);
            emit(out, line);
        }
        // Kafka stays up during the soak; the timeout only keeps a broken broker from hanging us.
        producer.close(Duration.ofSeconds(30));
        if (exporter != null) {
            // The last reference: flushes, sends the final Counters and Goodbye (close timeout).
            exporter.release();
        }
        line.setLength(0);
        line.append("{\"end\":true,\"sent\":").append(sent)
                .append(",\"errors\":").append(ERRORS.sum())
                .append(",\"acked\":").append(ACKED.sum());
        jvm(line);
        probe(line, exporter);
        line.append('}');
        emit(out, line);
    }

    /**
     * Writes the line of one second into {@code line} and clears the histogram: messages
     * sent, the longest send() and the non-zero buckets, then the probe's counters.
     */
    private static void second(StringBuilder line, long sinceStartNs, long n, long maxNs, int[] hist,
                               Exporter exporter) {
        line.setLength(0);
        line.append("{\"t\":").append(String.format(Locale.ROOT, "%.3f", sinceStartNs / 1e9))
                .append(",\"n\":").append(n)
                .append(",\"max_ns\":").append(maxNs)
                .append(",\"errors\":").append(ERRORS.sum())
                .append(",\"h\":[");
        boolean first = true;
        for (int i = 0; i < hist.length; i++) {
            if (hist[i] != 0) {
                line.append(first ? "" : ",").append('[').append(i).append(',').append(hist[i]).append(']');
                first = false;
            }
        }
        line.append(']');
        jvm(line);
        probe(line, exporter);
        line.append('}');
        Arrays.fill(hist, 0);
    }

    /**
     * Appends {@code ,"jvm":{...}}: the heap now (committed is what the heap adds to the RSS)
     * and the collections so far, cumulative (count and ms, all collectors).
     */
    private static void jvm(StringBuilder line) {
        MemoryUsage heap = ManagementFactory.getMemoryMXBean().getHeapMemoryUsage();
        long gcCount = 0;
        long gcMs = 0;
        for (GarbageCollectorMXBean gc : ManagementFactory.getGarbageCollectorMXBeans()) {
            gcCount += Math.max(0, gc.getCollectionCount());
            gcMs += Math.max(0, gc.getCollectionTime());
        }
        line.append(",\"jvm\":{\"heap_used\":").append(heap.getUsed())
                .append(",\"heap_committed\":").append(heap.getCommitted())
                .append(",\"gc_count\":").append(gcCount)
                .append(",\"gc_ms\":").append(gcMs)
                .append('}');
    }

    /** Appends {@code ,"probe":{...}} with the exporter's counters and what it holds now. */
    private static void probe(StringBuilder line, Exporter exporter) {
        if (exporter == null) {
            return;
        }
        Counters.Snapshot c = exporter.counters();
        Exporter.Footprint f = exporter.footprint();
        line.append(",\"probe\":{\"reported\":").append(c.reported())
                .append(",\"sent\":").append(c.sent())
                .append(",\"queue_full\":").append(c.queueFull())
                .append(",\"send_failed\":").append(c.sendFailed())
                .append(",\"reconnects\":").append(c.reconnects())
                .append(",\"not_traced\":").append(c.notTraced())
                .append(",\"bad_context\":").append(c.badContext())
                .append(",\"stamps_full\":").append(c.stampsFull())
                .append(",\"bad_traceparent\":").append(c.badTraceparent())
                .append(",\"resent\":").append(c.resent())
                .append(",\"evicted\":").append(c.evicted())
                .append(",\"lost_unacked\":").append(c.lostUnacked())
                .append(",\"rejected\":").append(exporter.rejected())
                .append(",\"connected\":").append(exporter.isConnected())
                .append(",\"queued\":").append(f.queuedRecords())
                .append(",\"queue_slots\":").append(f.queueSlots())
                .append(",\"write_buffer_bytes\":").append(f.writeBufferBytes())
                .append(",\"reader_threads\":").append(f.readerThreads())
                .append(",\"retained_bytes\":").append(f.retainedBytes())
                .append(",\"retention_limit\":").append(f.retentionLimit())
                .append('}');
    }

    /** Prints one line and flushes; false once stdout is closed. */
    private static boolean emit(PrintStream out, CharSequence line) {
        out.append(line).append('\n');
        out.flush();
        return !out.checkError();
    }

    /** Creates the topic with the broker's default partitions and replication, unless it exists. */
    private static void ensureTopic(Options o) throws Exception {
        Map<String, Object> p = new HashMap<>();
        p.put("bootstrap.servers", o.bootstrap);
        p.put("client.id", o.clientId + "-admin");
        try (Admin admin = Admin.create(p)) {
            admin.createTopics(List.of(new NewTopic(o.topic, Optional.empty(), Optional.empty()))).all()
                    .get(30, TimeUnit.SECONDS);
            System.err.println("outage-host: created topic " + o.topic);
        } catch (ExecutionException e) {
            if (!(e.getCause() instanceof TopicExistsException)) {
                throw e;
            }
        }
    }

    private static void setIfAbsent(String key, String value) {
        if (System.getProperty(key) == null) {
            System.setProperty(key, value);
        }
    }
}
