package dev.hoptrace.kafka;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The interceptors against the real collector (`$HOPTRACE_BIN collect`) where things go
 * wrong: a collector that requires a token ({@code hoptrace.token} right, wrong, missing),
 * a queue too small for a burst while the collector is out of reach in version 1 (the drops
 * counted in the run's accounting as lost by probes), and a collector killed mid-run and
 * continued (version 2: nothing lost).
 */
class CollectorEndToEndTest {
    static final String PIPELINE = """
            name = "jvm-collector-e2e"
            [[hops]]
            name = "publish"
            id = 0
            description = "hoptrace publish hands the record to its Kafka producer"
            [[hops]]
            name = "consume"
            id = 2
            description = "a KafkaConsumer with the hoptrace interceptor receives it"
            [[hops]]
            name = "produce"
            id = 3
            description = "a KafkaProducer with the hoptrace interceptor sends it on"
            [[stages]]
            name = "Publish to Consume"
            from = "publish"
            to = "consume"
            definition = "publish to the consumer's poll"
            headline = true
            [join]
            window_ms = 10000
            """;

    /** The pipeline of the drops test: publish and consume only, both expected. */
    static final String CONSUME_PIPELINE = PIPELINE.replace("""
            [[hops]]
            name = "produce"
            id = 3
            description = "a KafkaProducer with the hoptrace interceptor sends it on"
            """, "");

    static Map<String, Object> producerProps(String collector, String token, String process) {
        Map<String, Object> p = new HashMap<>();
        p.put("client.id", process);
        p.put("hoptrace.collector", collector);
        p.put("hoptrace.hop", "produce");
        p.put("hoptrace.hops", "publish:0,consume:2,produce:3");
        p.put("hoptrace.process", process);
        p.put("hoptrace.close.timeout.ms", "300");
        if (token != null) {
            p.put("hoptrace.token", token);
        }
        return p;
    }

    static ProducerRecord<byte[], byte[]> traced(int publisher, long seq) {
        TraceContext c = new TraceContext(publisher, 0, seq, 1, Clocks.realtimeNs());
        c.pushStamp(0, Clocks.realtimeNs());
        RecordHeaders h = new RecordHeaders();
        h.add("hoptrace", c.encode());
        return new ProducerRecord<byte[], byte[]>("t", (Integer) null, (byte[]) null, new byte[0], h);
    }

    /**
     * {@code hoptrace collect --token}: the producer interceptor with the right
     * {@code hoptrace.token} delivers; with a wrong one, or none, the collector refuses it
     * (Reject code 2, counted as {@code bad_token}), and the exporter counts the refusals
     * ({@link Exporter#rejected()}) and, at close, what it held as {@code send_failed}.
     */
    @Test
    void theTokenIsRequiredAndARefusalIsCounted(@TempDir Path dir) throws Exception {
        Path bin = Integration.requireCollector();
        Path pipeline = dir.resolve("pipeline.toml");
        Files.writeString(pipeline, PIPELINE);
        String runId = "jvm-token-" + System.currentTimeMillis();
        try (Integration.Collector collector = new Integration.Collector(bin, dir, pipeline, runId,
                "--token", "s3cret-token")) {
            HoptraceProducerInterceptor<byte[], byte[]> good = new HoptraceProducerInterceptor<>();
            good.configure(producerProps(collector.address, "s3cret-token", "jvm-token-good"));
            HoptraceProducerInterceptor<byte[], byte[]> wrong = new HoptraceProducerInterceptor<>();
            wrong.configure(producerProps(collector.address, "guess", "jvm-token-wrong"));
            HoptraceProducerInterceptor<byte[], byte[]> missing = new HoptraceProducerInterceptor<>();
            missing.configure(producerProps(collector.address, null, "jvm-token-missing"));
            for (int i = 0; i < 100; i++) {
                good.onSend(traced(21, i));
                wrong.onSend(traced(22, i));
                missing.onSend(traced(23, i));
            }
            Exporter goodEx = good.probeForBench().exporter;
            Exporter wrongEx = wrong.probeForBench().exporter;
            Exporter missingEx = missing.probeForBench().exporter;
            long deadline = System.nanoTime() + 15_000_000_000L;
            while ((goodEx.counters().sent() < 100 || wrongEx.rejected() < 2 || missingEx.rejected() < 2)
                    && System.nanoTime() < deadline) {
                Thread.sleep(20);
            }
            assertEquals(100, goodEx.counters().sent(), "the right token delivers: " + goodEx.lastError());
            assertEquals(0, goodEx.rejected());
            for (Exporter e : List.of(wrongEx, missingEx)) {
                assertFalse(e.isConnected());
                assertTrue(e.rejected() >= 2, "refusals counted: " + e.rejected());
                assertTrue(e.lastError().contains("rejected this probe (code 2)"), e.lastError());
                assertTrue(e.lastError().contains("token"), e.lastError());
            }
            good.close();
            wrong.close();
            missing.close();
            for (Exporter e : List.of(wrongEx, missingEx)) {
                Counters.Snapshot c = e.counters();
                assertEquals(100, c.reported());
                assertEquals(0, c.sent());
                assertEquals(100, c.sendFailed(), "what a refused probe held is send_failed at close");
            }
            JsonNode run = collector.stop();
            List<String> processes = new ArrayList<>();
            run.get("probes").forEach(p -> processes.add(p.get("process").textValue()));
            assertEquals(List.of("jvm-token-good"), processes, "only the probe with the token is in the run");
            assertTrue(run.get("connections").get("bad_token").longValue() >= 4, run.get("connections").toString());
            assertEquals(100, run.get("accounting").get("records_by_hop").get("produce").longValue());
        }
    }

    /**
     * A gate in front of the collector: closed, it closes every connection at once (the
     * exporter cannot reach the collector and retries); open, it relays bytes both ways.
     */
    static final class Gate implements AutoCloseable {
        final ServerSocket server = new ServerSocket(0, 50, InetAddress.getLoopbackAddress());
        final String target;
        volatile boolean open;
        final AtomicLong refused = new AtomicLong();
        private final List<Socket> sockets = new ArrayList<>();
        private final Thread acceptor;

        Gate(String target) throws IOException {
            this.target = target;
            acceptor = new Thread(this::accept, "gate");
            acceptor.setDaemon(true);
            acceptor.start();
        }

        String address() {
            return "127.0.0.1:" + server.getLocalPort();
        }

        private void accept() {
            while (!server.isClosed()) {
                try {
                    Socket s = server.accept();
                    if (!open) {
                        refused.incrementAndGet();
                        s.close();
                        continue;
                    }
                    String[] hp = ExporterConfig.splitHostPort(target);
                    Socket c = new Socket(hp[0], Integer.parseInt(hp[1]));
                    s.setTcpNoDelay(true);
                    c.setTcpNoDelay(true);
                    synchronized (sockets) {
                        sockets.add(s);
                        sockets.add(c);
                    }
                    pump(s, c);
                    pump(c, s);
                } catch (IOException e) {
                    // closed
                }
            }
        }

        private static void pump(Socket from, Socket to) {
            Thread t = new Thread(() -> {
                try (InputStream in = from.getInputStream()) {
                    OutputStream out = to.getOutputStream();
                    byte[] b = new byte[8192];
                    int n;
                    while ((n = in.read(b)) > 0) {
                        out.write(b, 0, n);
                        out.flush();
                    }
                    to.shutdownOutput();
                } catch (IOException e) {
                    // the other side closed
                }
            }, "gate pump");
            t.setDaemon(true);
            t.start();
        }

        @Override
        public void close() throws IOException {
            server.close();
            synchronized (sockets) {
                for (Socket s : sockets) {
                    s.close();
                }
            }
        }
    }

    /**
     * `hoptrace publish` sends 2000 records into Kafka; a KafkaConsumer with the consumer
     * interceptor in version 1 ({@code hoptrace.queue.capacity} 16, {@code
     * hoptrace.retention.bytes} 0) polls them all while its collector
     * is out of reach, so all but 16 of its records are dropped and counted as
     * {@code queue_full}. Once the collector is reachable the 16 and the counters arrive, and
     * the run's accounting shows the drops as lost by probes: it adds up with exactly that
     * many messages incomplete (no consume stamp).
     */
    @Test
    void dropsOfATinyQueueAreLostByProbesInTheRun(@TempDir Path dir) throws Exception {
        Path bin = Integration.require();
        final int messages = 2000;
        final int capacity = 16;
        String runId = "jvm-drops-" + System.currentTimeMillis();
        String topic = "jvm-probe-" + runId;
        Integration.createTopic(Integration.KAFKA, topic, 1, Map.of());
        Path pipeline = dir.resolve("pipeline.toml");
        Files.writeString(pipeline, CONSUME_PIPELINE);
        assertFalse(CONSUME_PIPELINE.contains("name = \"produce\""), CONSUME_PIPELINE);
        try (Integration.Collector collector = new Integration.Collector(bin, dir, pipeline, runId);
                Gate gate = new Gate(collector.address)) {
            Integration.run(bin, dir, "publish", "publish", "--to", "kafka://" + Integration.KAFKA + "/" + topic,
                    "--rate", "5000", "--messages", String.valueOf(messages), "--duration", "30s", "--streams", "4",
                    "--publisher-id", "24", "--collector", collector.address, "--pipeline", pipeline.toString());
            Properties props = consumerProps(runId, String.valueOf(messages));
            props.put("hoptrace.collector", gate.address());
            props.put("hoptrace.hop", "consume");
            props.put("hoptrace.hops", "publish:0,consume:2");
            props.put("hoptrace.process", "jvm-drops-consumer");
            props.put("hoptrace.queue.capacity", String.valueOf(capacity));
            // Version 1: nothing drains the queue while the collector is away (in version 2 the
            // retention buffer would take what the queue cannot hold).
            props.put("hoptrace.retention.bytes", "0");
            // The exporter's retry delay has grown to its 5 s cap by the time the gate opens.
            props.put("hoptrace.close.timeout.ms", "15000");
            long consumed = 0;
            try (KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(props)) {
                c.subscribe(List.of(topic));
                long deadline = System.nanoTime() + 60_000_000_000L;
                while (consumed < messages && System.nanoTime() < deadline) {
                    ConsumerRecords<byte[], byte[]> recs = c.poll(Duration.ofMillis(200));
                    consumed += recs.count();
                }
                assertEquals(messages, consumed, "every record consumed");
                // The queue held 16 whatever the exporter did; the gate opens once it has
                // tried at least once (its first attempt waits for the clients' hops to settle).
                long tried = System.nanoTime() + 10_000_000_000L;
                while (gate.refused.get() == 0 && System.nanoTime() < tried) {
                    Thread.sleep(20);
                }
                assertTrue(gate.refused.get() >= 1, "the exporter tried to connect and was refused");
                gate.open = true;
                // close() releases the exporter: it connects, delivers what it held, the counters
                // and Goodbye (within hoptrace.close.timeout.ms).
            }
            JsonNode run = collector.stop();
            JsonNode a = run.get("accounting");
            JsonNode probe = null;
            for (JsonNode p : run.get("probes")) {
                if (p.get("process").textValue().equals("jvm-drops-consumer")) {
                    probe = p;
                }
            }
            assertTrue(probe != null, "the consumer's exporter is in run.json: " + run.get("probes"));
            JsonNode counters = probe.get("counters");
            assertTrue(probe.get("clean_close").booleanValue(), probe.toString());
            assertEquals(messages, counters.get("reported").longValue(), counters.toString());
            assertEquals(messages - capacity, counters.get("queue_full").longValue(), counters.toString());
            assertEquals(capacity, counters.get("sent").longValue(), counters.toString());
            assertEquals(0, counters.get("send_failed").longValue(), counters.toString());
            assertTrue(a.get("adds_up").booleanValue(), "adds_up: " + a);
            assertEquals(messages - capacity, a.get("records_lost_by_probes").longValue(), "lost: " + a);
            JsonNode pub = a.get("publishers").get(0);
            assertEquals(messages, pub.get("sent").longValue(), a.toString());
            assertEquals(capacity, pub.get("complete").longValue(), a.toString());
            assertEquals(messages - capacity, pub.get("incomplete").longValue(), a.toString());
            assertEquals(0, pub.get("unseen").longValue(), a.toString());
            assertEquals(messages, a.get("records_by_hop").get("publish").longValue(), a.toString());
            assertEquals(capacity, a.get("records_by_hop").get("consume").longValue(), a.toString());
            assertEquals(messages - capacity, a.get("missing_by_hop").get("consume").longValue(), a.toString());
            assertEquals(0, a.get("duplicate_traces").longValue(), a.toString());
            assertEquals(0, a.get("late_records").longValue(), a.toString());
        }
    }

    /**
     * `hoptrace publish` sends 4000 messages into Kafka; a KafkaConsumer with the consumer
     * interceptor (version 2, its defaults) polls them 100 at a time. After 1500 the collector
     * is killed (SIGKILL) and 1000 more are consumed while it is down; then it is started again
     * on the same run and port ({@code --run-id}), and the consumer takes the rest. The
     * frames the killed collector had not acknowledged, and those kept while it was away, are
     * sent again: the run adds up exactly, every message complete, nothing lost.
     */
    @Test
    void aKilledCollectorContinuedLosesNothingTheConsumerReported(@TempDir Path dir) throws Exception {
        Path bin = Integration.require();
        final int messages = 4000;
        String runId = "jvm-kill-" + System.currentTimeMillis();
        String topic = "jvm-probe-" + runId;
        Integration.createTopic(Integration.KAFKA, topic, 1, Map.of());
        Path pipeline = dir.resolve("pipeline.toml");
        Files.writeString(pipeline, CONSUME_PIPELINE);
        String listen = "127.0.0.1:" + HostileTest.freePort();
        // A long log sync: what the consumer's exporter wrote in the last second before the
        // kill is not yet acknowledged, so it is in its retention buffer to send again.
        Integration.Collector first = new Integration.Collector(bin, dir, pipeline, runId, listen, "collect-1.log",
                List.of("--log-sync", "1s"));
        Integration.Collector second = null;
        try {
            Integration.run(bin, dir, "publish", "publish", "--to", "kafka://" + Integration.KAFKA + "/" + topic,
                    "--rate", "5000", "--messages", String.valueOf(messages), "--duration", "30s", "--streams", "4",
                    "--publisher-id", "25", "--collector", listen, "--pipeline", pipeline.toString());
            Properties props = consumerProps(runId, "100");
            props.put("hoptrace.collector", listen);
            props.put("hoptrace.hop", "consume");
            props.put("hoptrace.hops", "publish:0,consume:2");
            props.put("hoptrace.process", "jvm-kill-consumer");
            props.put("hoptrace.backoff.max.ms", "500");
            props.put("hoptrace.close.timeout.ms", "15000");
            long consumed = 0;
            Exporter exporter;
            try (KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(props)) {
                c.subscribe(List.of(topic));
                long deadline = System.nanoTime() + 90_000_000_000L;
                while (consumed < messages && System.nanoTime() < deadline) {
                    ConsumerRecords<byte[], byte[]> recs = c.poll(Duration.ofMillis(200));
                    consumed += recs.count();
                    if (consumed >= 1500 && first.process.isAlive()) {
                        first.kill();
                    }
                    if (consumed >= 2500 && second == null) {
                        second = new Integration.Collector(bin, dir, pipeline, runId, listen, "collect-2.log",
                                List.of());
                    }
                    Thread.sleep(20); // the consumer's own work between polls
                }
                assertEquals(messages, consumed, "every record consumed");
                exporter = findExporter(listen);
            }
            assertTrue(second != null, "the collector was started again");
            Counters.Snapshot local = exporter.counters();
            JsonNode run = second.stop();
            try {
                Integration.assertExact(run, messages, "publish", "consume");
            } catch (AssertionError e) {
                throw new AssertionError(e.getMessage() + "\nrestarts: " + run.get("restarts") + "\n--- killed collector:\n"
                        + first.readLog() + "\n--- continued:\n" + second.readLog(), e);
            }
            assertEquals(1, run.get("restarts").size(), run.get("restarts").toString());
            JsonNode probe = null;
            for (JsonNode p : run.get("probes")) {
                if (p.get("process").textValue().equals("jvm-kill-consumer") && p.get("clean_close").booleanValue()) {
                    probe = p;
                }
            }
            assertTrue(probe != null, "the consumer's last connection, closed cleanly: " + run.get("probes"));
            assertEquals(2, probe.get("protocol_version").intValue(), probe.toString());
            assertTrue(probe.get("durable").booleanValue(), probe.toString());
            JsonNode counters = probe.get("counters");
            assertEquals(messages, counters.get("reported").longValue(), counters.toString());
            assertEquals(messages, counters.get("sent").longValue(), "each record counted sent once: " + counters);
            assertEquals(0, counters.get("lost_unacked").longValue(), counters.toString());
            assertEquals(0, counters.get("queue_full").longValue(), counters.toString());
            assertEquals(0, counters.get("send_failed").longValue(), counters.toString());
            assertEquals(local.resent(), counters.get("resent").longValue(), counters.toString());
            assertTrue(local.reconnects() >= 1, local.toString());
            assertEquals(0, exporter.unacknowledged());
            System.out.printf("killed collector: the consumer's exporter sent %d records again; the run dropped %d "
                    + "it already held%n", local.resent(), run.get("accounting").get("resent_records_dropped").longValue());
        } finally {
            first.close();
            if (second != null) {
                second.close();
            }
        }
    }

    /**
     * A KafkaConsumer of group {@code group} with the consumer interceptor, from the start of
     * its topic, {@code maxPoll} records a poll at most; the test adds the hoptrace settings.
     */
    static Properties consumerProps(String group, String maxPoll) {
        Properties props = new Properties();
        props.put("bootstrap.servers", Integration.KAFKA);
        props.put("group.id", group);
        props.put("auto.offset.reset", "earliest");
        props.put("max.poll.records", maxPoll);
        props.put("key.deserializer", ByteArrayDeserializer.class.getName());
        props.put("value.deserializer", ByteArrayDeserializer.class.getName());
        props.put("interceptor.classes", HoptraceConsumerInterceptor.class.getName());
        return props;
    }

    /** The exporter the interceptors of this JVM share for {@code collector}, or fails. */
    static Exporter findExporter(String collector) {
        Exporter e = Exporter.sharedFor(collector);
        assertTrue(e != null, "an exporter to " + collector);
        return e;
    }
}
