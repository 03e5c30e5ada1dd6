package dev.hoptrace.kafka;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Optional;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.record.TimestampType;

/**
 * Micro-benchmark of what the interceptors cost a client thread per record: a plain timed
 * loop, several runs, the median printed. The exporter runs as in production (its thread
 * drains the queue into frames over TCP to an in-process collector that reads and discards).
 *
 * <pre>probes/jvm/bench.sh   # builds, then runs this class with -Xmx256m</pre>
 */
public final class StampBench {
    private StampBench() {}

    static volatile long sink;

    /** Reads frames after answering Welcome, keeping nothing. */
    static final class DiscardCollector implements AutoCloseable {
        final ServerSocket server;

        DiscardCollector() throws IOException {
            server = new ServerSocket();
            server.bind(new InetSocketAddress(InetAddress.getLoopbackAddress(), 0));
            Thread t = new Thread(() -> {
                while (!server.isClosed()) {
                    try {
                        Socket s = server.accept();
                        Thread c = new Thread(() -> serve(s), "discard-conn");
                        c.setDaemon(true);
                        c.start();
                    } catch (IOException e) {
                        return;
                    }
                }
            }, "discard-accept");
            t.setDaemon(true);
            t.start();
        }

        private static void serve(Socket s) {
            try (s) {
                InputStream in = s.getInputStream();
                OutputStream out = s.getOutputStream();
                Protocol.read(in);
                Protocol.Buffer b = new Protocol.Buffer(32);
                int at = b.begin(Protocol.WELCOME);
                b.u16(1).str("bench");
                b.end(at);
                out.write(b.toByteArray());
                out.flush();
                byte[] buf = new byte[1 << 16];
                while (in.read(buf) >= 0) {
                    // discard
                }
            } catch (IOException e) {
                // closed
            }
        }

        String address() {
            return "127.0.0.1:" + server.getLocalPort();
        }

        @Override
        public void close() throws IOException {
            server.close();
        }
    }

    interface Body {
        /** Runs one batch; returns the records it handled. */
        int run();
    }

    /** Waits, untimed, until the exporter has drained its queue below a tenth of its capacity. */
    static Runnable drainedBelow(Exporter e) {
        return () -> {
            while (e.queue.size() > e.queue.capacity() / 10) {
                Thread.onSpinWait();
            }
        };
    }

    /**
     * ns per record: median of {@code runs} runs of {@code runMs} of timed batches each, after
     * a warm-up. {@code between} runs untimed between batches (lets the exporter keep up, so
     * that no report meets a full queue).
     */
    static double[] measure(String name, Body body, Runnable between, int runs, long runMs) {
        long warm = System.nanoTime() + 3_000_000_000L;
        while (System.nanoTime() < warm) {
            body.run();
            between.run();
        }
        double[] perRecord = new double[runs];
        for (int r = 0; r < runs; r++) {
            long n = 0;
            long timed = 0;
            long end = System.nanoTime() + runMs * 1_000_000L;
            while (System.nanoTime() < end) {
                long t0 = System.nanoTime();
                n += body.run();
                timed += System.nanoTime() - t0;
                between.run();
            }
            perRecord[r] = (double) timed / n;
        }
        double[] sorted = perRecord.clone();
        Arrays.sort(sorted);
        double median = sorted[runs / 2];
        System.out.printf(Locale.ROOT, "%-62s median %7.1f ns/record   runs %s%n", name, median,
                Arrays.toString(Arrays.stream(perRecord).map(v -> Math.round(v * 10) / 10.0).toArray()));
        return perRecord;
    }

    public static void main(String[] args) throws Exception {
        int runs = args.length > 0 ? Integer.parseInt(args[0]) : 7;
        long runMs = args.length > 1 ? Long.parseLong(args[1]) : 2000;
        System.out.printf(Locale.ROOT, "java %s, %s; %d runs of %d ms after 3 s warm-up; clock resolution %d ns%n",
                Runtime.version(), System.getProperty("java.vm.name"), runs, runMs, Clocks.resolutionNs());
        try (DiscardCollector dc = new DiscardCollector()) {
            TraceContext ctx = new TraceContext(21, 3, 12345, 1, 1_700_000_000_000_000_000L);
            ctx.pushStamp(0, 1_700_000_000_000_001_000L);
            byte[] header = ctx.encode();

            measure("Clocks.realtimeNs() (Instant.now, CLOCK_REALTIME)", () -> {
                long s = 0;
                for (int i = 0; i < 1000; i++) {
                    s += Clocks.realtimeNs();
                }
                sink = s;
                return 1000;
            }, () -> { }, runs, runMs);

            measure("decode the hoptrace header (64 B, 1 stamp)", () -> {
                long s = 0;
                for (int i = 0; i < 1000; i++) {
                    try {
                        s += TraceContext.decode(header).sequence();
                    } catch (DecodeException e) {
                        throw new AssertionError(e);
                    }
                }
                sink = s;
                return 1000;
            }, () -> { }, runs, runMs);

            Map<String, Object> p = new HashMap<>();
            p.put("hoptrace.collector", dc.address());
            p.put("hoptrace.hops", "publish:0,source_append:1,consume:2,produce:3");
            p.put("hoptrace.process", "bench");
            p.put("hoptrace.queue.capacity", String.valueOf(1 << 20));

            p.put("hoptrace.hop", "produce");
            HoptraceProducerInterceptor<byte[], byte[]> producer = new HoptraceProducerInterceptor<>();
            producer.configure(p);
            Exporter exporter = producer.probeForBench().exporter;
            FakeCollector.await(exporter::isConnected, 10_000, "exporter connected");

            measure("Exporter.report (queue offer; exporter thread drains it)", () -> {
                for (int i = 0; i < 1000; i++) {
                    exporter.report(ctx, 3, i);
                }
                return 1000;
            }, drainedBelow(exporter), runs, runMs);

            RecordHeaders ph = new RecordHeaders();
            ph.add("hoptrace", header);
            ProducerRecord<byte[], byte[]> rec = new ProducerRecord<>("t", null, null, new byte[8], new byte[100], ph);
            measure("producer onSend: read, stamp, report, copy record + header", () -> {
                long s = 0;
                for (int i = 0; i < 1000; i++) {
                    s += producer.onSend(rec).headers().lastHeader("hoptrace").value().length;
                }
                sink = s;
                return 1000;
            }, drainedBelow(exporter), runs, runMs);

            p.put("hoptrace.hop", "consume");
            p.put("hoptrace.log.append.time.hop", "source_append");
            HoptraceConsumerInterceptor<byte[], byte[]> consumer = new HoptraceConsumerInterceptor<>();
            consumer.configure(p);
            List<ConsumerRecord<byte[], byte[]>> list = new ArrayList<>();
            for (int i = 0; i < 500; i++) {
                RecordHeaders h = new RecordHeaders();
                h.add("hoptrace", header);
                list.add(new ConsumerRecord<>("t", 0, i, 1_700_000_000_000L, TimestampType.LOG_APPEND_TIME, 8, 100,
                        new byte[8], new byte[100], h, Optional.empty()));
            }
            ConsumerRecords<byte[], byte[]> batch = new ConsumerRecords<>(Map.of(new TopicPartition("t", 0), list));
            Runnable drained = drainedBelow(exporter);
            measure("consumer onConsume, polls of 500: read, stamp, report x2, rewrite header", () -> {
                consumer.onConsume(batch);
                return list.size();
            }, () -> {
                for (ConsumerRecord<byte[], byte[]> r : list) {
                    // Back to the context as it came from the broker (untimed).
                    r.headers().remove("hoptrace");
                    r.headers().add("hoptrace", header);
                }
                drained.run();
            }, runs, runMs);

            Counters.Snapshot s = exporter.counters();
            producer.close();
            consumer.close();
            System.out.printf(Locale.ROOT, "exporter: reported %d, sent %d, queue_full %d, send_failed %d%n",
                    s.reported(), s.sent(), s.queueFull(), s.sendFailed());
        }
    }
}
