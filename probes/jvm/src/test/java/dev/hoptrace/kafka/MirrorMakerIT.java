package dev.hoptrace.kafka;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.DeserializationFeature;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The proof: Apache Kafka's MirrorMaker 2 replicating a topic from the single-node Kafka to
 * the 3-node cluster, with the interceptors in its consumer and producer, measured hop by hop
 * by mm2/run.sh --short. The accounting must be exact, and every replicated record must carry
 * the context with the publish, mm2_consume and mm2_produce stamps in-band.
 *
 * <p>An integration test (Maven's failsafe, after {@code package}): MirrorMaker 2 runs with
 * the jar as built, put on its classpath unchanged.
 */
class MirrorMakerIT {
    @Test
    void mirrorMaker2ReplicatesAndEveryTraceIsComplete(@TempDir Path dir) throws Exception {
        Path runDir = runScript(dir, "--short");
        JsonNode run = runJson(runDir);
        long sent = run.get("accounting").get("publishers").get(0).get("sent").longValue();
        assertEquals(1500, sent);
        Integration.assertExact(run, sent, "publish", "source_append", "mm2_consume", "mm2_produce",
                "target_arrival");
        assertTrue(Files.isRegularFile(runDir.resolve("report/report.md")), "hoptrace report wrote report.md");

        long mm2Sent = 0;
        for (JsonNode probe : run.get("probes")) {
            if (probe.get("process").textValue().equals("mirrormaker2")) {
                assertTrue(probe.get("clean_close").booleanValue(), "MirrorMaker's exporter said goodbye: " + probe);
                assertEquals(0, probe.get("counters").get("queue_full").longValue(), probe.toString());
                assertEquals(0, probe.get("counters").get("send_failed").longValue(), probe.toString());
                assertEquals(0, probe.get("counters").get("bad_context").longValue(), probe.toString());
                mm2Sent += probe.get("counters").get("sent").longValue();
            }
        }
        assertEquals(3 * sent, mm2Sent, "MirrorMaker reported source_append, mm2_consume and mm2_produce");

        // In-band: the replicated records carry one hoptrace header with the three stamps.
        String runId = runDir.getFileName().toString();
        Properties props = new Properties();
        props.put("bootstrap.servers", "127.0.0.1:29092,127.0.0.1:29093,127.0.0.1:29094");
        props.put("group.id", runId + "-check");
        props.put("auto.offset.reset", "earliest");
        props.put("key.deserializer", ByteArrayDeserializer.class.getName());
        props.put("value.deserializer", ByteArrayDeserializer.class.getName());
        long checked = 0;
        try (KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(props)) {
            c.subscribe(List.of("src.jvm-probe-" + runId));
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
            while (checked < sent && System.nanoTime() < deadline) {
                for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(200))) {
                    int n = 0;
                    for (Header h : r.headers()) {
                        n += h.key().equals("hoptrace") ? 1 : 0;
                    }
                    assertEquals(1, n, "one hoptrace header");
                    TraceContext ctx = TraceContext.decode(r.headers().lastHeader("hoptrace").value());
                    assertEquals(3, ctx.stampCount(), ctx.toString());
                    assertEquals(List.of(0, 2, 3), List.of(ctx.stampHop(0), ctx.stampHop(1), ctx.stampHop(2)));
                    assertTrue(ctx.stampNs(0) <= ctx.stampNs(1) && ctx.stampNs(1) <= ctx.stampNs(2), ctx.toString());
                    checked++;
                }
            }
        }
        assertEquals(sent, checked, "replicated records checked");
    }

    /**
     * The same pipeline with no hoptrace jar in MirrorMaker: it runs under the OpenTelemetry
     * Java agent (run.sh --otel), whose consumer process spans, exported over OTLP/HTTP to
     * {@code hoptrace collect --otlp}, stamp mm2_consume for every message the publisher gave
     * a trace id. The agent's producer spans start new traces and match no hop of the
     * pipeline: counted as unmatched.
     */
    @Test
    void underTheOpenTelemetryAgentAloneEveryMessageIsStampedInMirrorMaker(@TempDir Path dir) throws Exception {
        JsonNode run = runJson(runScript(dir, "--short", "--otel"));
        long sent = run.get("accounting").get("publishers").get(0).get("sent").longValue();
        assertEquals(1500, sent);
        Integration.assertExact(run, sent, "publish", "mm2_consume", "target_arrival");
        JsonNode otlp = run.get("otlp");
        assertEquals(sent, otlp.get("spans_stamped").longValue(), otlp.toString());
        assertEquals(otlp.get("requests").longValue(), otlp.get("accepted").longValue(), otlp.toString());
        assertTrue(otlp.get("spans_unmatched").longValue() >= sent, "the replicas' producer spans: " + otlp);
        boolean agent = false;
        for (JsonNode probe : run.get("probes")) {
            agent |= probe.get("process").textValue().equals("mirrormaker2")
                    && probe.get("software").textValue().startsWith("OTLP opentelemetry java");
        }
        assertTrue(agent, "MirrorMaker's spans came from the agent: " + run.get("probes"));
    }

    /**
     * Runs mm2/run.sh with {@code args} (with the interceptors as built unless --otel or
     * --plain), requires exit 0 within 10 minutes, and returns the run directory it names.
     */
    private static Path runScript(Path dir, String... args) throws Exception {
        Path bin = Integration.require();
        Path script = TestPaths.repo().resolve("probes/jvm/mm2/run.sh");
        Path log = dir.resolve("run.log");
        List<String> cmd = new java.util.ArrayList<>(List.of("bash", script.toString()));
        cmd.addAll(List.of(args));
        cmd.addAll(List.of("--out", dir.toString()));
        ProcessBuilder pb = new ProcessBuilder(cmd).redirectErrorStream(true).redirectOutput(log.toFile());
        pb.environment().put("HOPTRACE_BIN", bin.toString());
        if (!List.of(args).contains("--otel") && !List.of(args).contains("--plain")) {
            pb.environment().put("HOPTRACE_JVM_PROBE_CLASSES", JarIT.builtJar().toString());
        }
        String what = "run.sh " + String.join(" ", args);
        Process p = pb.start();
        if (!p.waitFor(600, TimeUnit.SECONDS)) {
            p.destroy();
            throw new AssertionError(what + " did not finish in 10 minutes:\n" + Files.readString(log));
        }
        String out = Files.readString(log);
        assertEquals(0, p.exitValue(), what + " failed:\n" + out);
        List<String> lines = out.lines().toList();
        String last = lines.get(lines.size() - 1);
        assertTrue(last.startsWith("run: "), out);
        return Path.of(last.substring(5));
    }

    private static JsonNode runJson(Path runDir) throws Exception {
        return new ObjectMapper().enable(DeserializationFeature.USE_BIG_INTEGER_FOR_INTS)
                .readTree(runDir.resolve("run.json").toFile());
    }
}
