package dev.hoptrace.kafka;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * `hoptrace publish` stamps `publish` into a real Kafka topic; a plain KafkaConsumer with the
 * consumer interceptor stamps `consume`; the real `hoptrace collect` joins them. The run's
 * accounting must be exact: complete = sent. Once over TCP, once over TLS.
 */
class KafkaEndToEndTest {
    static final int MESSAGES = 2000;

    static final String PIPELINE = """
            name = "jvm-consumer"
            [[hops]]
            name = "publish"
            id = 0
            description = "hoptrace publish hands the record to its Kafka producer"
            [[hops]]
            name = "source_append"
            id = 1
            description = "Kafka LogAppendTime of the record"
            [[hops]]
            name = "consume"
            id = 2
            description = "a KafkaConsumer with the hoptrace interceptor receives it"
            [[stages]]
            name = "Publish to Append"
            from = "publish"
            to = "source_append"
            definition = "publish to the broker's LogAppendTime (ms resolution)"
            [[stages]]
            name = "Publish to Consume"
            from = "publish"
            to = "consume"
            definition = "publish to the consumer's poll"
            headline = true
            [join]
            window_ms = 10000
            """;

    @Test
    void aPlainConsumerWithTheInterceptorCompletesEveryTrace(@TempDir Path dir) throws Exception {
        endToEnd(dir, false);
    }

    @Test
    void theSameOverTlsToTheCollector(@TempDir Path dir) throws Exception {
        endToEnd(dir, true);
    }

    private void endToEnd(Path dir, boolean tls) throws Exception {
        Path bin = Integration.require();
        String runId = "jvm-e2e-" + (tls ? "tls-" : "") + System.currentTimeMillis();
        String topic = "jvm-probe-" + runId;
        Integration.createTopic(Integration.KAFKA, topic, 2, Map.of("message.timestamp.type", "LogAppendTime"));
        Path pipeline = dir.resolve("pipeline.toml");
        Files.writeString(pipeline, PIPELINE);
        String[] collectTls = {};
        Path ca = null;
        if (tls) {
            Path certs = dir.resolve("tls");
            ProcessBuilder pb = new ProcessBuilder("bash", TestPaths.repo().resolve("infra/tls/make-certs.sh").toString(),
                    certs.toString(), "127.0.0.1").redirectErrorStream(true);
            Process p = pb.start();
            assertEquals(0, p.waitFor(), new String(p.getInputStream().readAllBytes()));
            ca = certs.resolve("ca.pem");
            collectTls = new String[] {"--tls-cert", certs.resolve("collector.pem").toString(),
                "--tls-key", certs.resolve("collector-key.pem").toString()};
        }
        try (Integration.Collector collector = new Integration.Collector(bin, dir, pipeline, runId, collectTls)) {
            Properties props = new Properties();
            props.put("bootstrap.servers", Integration.KAFKA);
            props.put("group.id", runId);
            props.put("auto.offset.reset", "earliest");
            props.put("key.deserializer", ByteArrayDeserializer.class.getName());
            props.put("value.deserializer", ByteArrayDeserializer.class.getName());
            props.put("interceptor.classes", HoptraceConsumerInterceptor.class.getName());
            props.put("hoptrace.collector", collector.address);
            props.put("hoptrace.hop", "consume");
            props.put("hoptrace.hops", "publish:0,source_append:1,consume:2");
            props.put("hoptrace.log.append.time.hop", "source_append");
            props.put("hoptrace.process", "e2e-consumer");
            if (tls) {
                props.put("hoptrace.tls.ca", ca.toString());
            }
            AtomicLong seen = new AtomicLong();
            AtomicBoolean stop = new AtomicBoolean();
            AtomicBoolean assigned = new AtomicBoolean();
            Thread consumer = new Thread(() -> {
                try (KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(props)) {
                    c.subscribe(List.of(topic));
                    while (!stop.get()) {
                        ConsumerRecords<byte[], byte[]> recs = c.poll(Duration.ofMillis(100));
                        assigned.set(!c.assignment().isEmpty());
                        for (ConsumerRecord<byte[], byte[]> r : recs) {
                            // The interceptor appended the consumer's stamp in-band.
                            TraceContext ctx = TraceContext.decode(r.headers().lastHeader("hoptrace").value());
                            if (ctx.stampCount() == 2 && ctx.stampHop(1) == 2) {
                                seen.incrementAndGet();
                            }
                        }
                    }
                } catch (DecodeException e) {
                    throw new AssertionError(e);
                }
            }, "e2e-consumer");
            consumer.start();
            long t0 = System.nanoTime();
            while (!assigned.get() && System.nanoTime() - t0 < 30_000_000_000L) {
                Thread.sleep(50);
            }
            List<String> publish = new java.util.ArrayList<>(List.of("publish",
                    "--to", "kafka://" + Integration.KAFKA + "/" + topic,
                    "--rate", "1000", "--messages", String.valueOf(MESSAGES), "--duration", "30s",
                    "--streams", "10", "--publisher-id", "11",
                    "--collector", collector.address, "--pipeline", pipeline.toString()));
            if (tls) {
                publish.addAll(List.of("--collector-ca", ca.toString()));
            }
            String out = Integration.run(bin, dir, "publish", publish.toArray(String[]::new));
            long deadline = System.nanoTime() + 60_000_000_000L;
            while (seen.get() < MESSAGES && System.nanoTime() < deadline) {
                Thread.sleep(50);
            }
            stop.set(true);
            consumer.join(30_000);
            assertEquals(MESSAGES, seen.get(), "records consumed with both stamps in-band\n" + out);
            JsonNode run = collector.stop();
            Integration.assertExact(run, MESSAGES, "publish", "source_append", "consume");
            boolean found = false;
            for (JsonNode p : run.get("probes")) {
                if (p.get("process").textValue().equals("e2e-consumer")) {
                    found = true;
                    assertTrue(p.get("clean_close").booleanValue(), "consumer's exporter said goodbye: " + p);
                    assertEquals(MESSAGES * 2L, p.get("counters").get("sent").longValue(), p.toString());
                    assertEquals(0, p.get("counters").get("queue_full").longValue(), p.toString());
                    assertTrue(p.get("software").textValue().startsWith("hoptrace-kafka-interceptors"));
                }
            }
            assertTrue(found, "the consumer's exporter is in run.json: " + run.get("probes"));
            assertTrue(run.get("clock").size() > 0, "clock statuses received");
        }
    }
}
