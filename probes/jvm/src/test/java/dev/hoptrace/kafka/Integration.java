package dev.hoptrace.kafka;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import com.fasterxml.jackson.databind.DeserializationFeature;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.TimeUnit;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.NewTopic;
import org.junit.jupiter.api.Assumptions;

/**
 * Helpers of the tests against the real collector (`$HOPTRACE_BIN collect`) and the real
 * Kafka. They run only with HOPTRACE_INTEGRATION=1; then a missing binary or broker fails.
 */
final class Integration {
    private Integration() {}

    static final String KAFKA = "127.0.0.1:19092";

    /** Skips unless HOPTRACE_INTEGRATION=1; then fails without the binary or the broker. */
    static Path require() {
        Path bin = requireCollector();
        requireListening(KAFKA, "Kafka (infra/services.sh up)");
        return bin;
    }

    /** Skips unless HOPTRACE_INTEGRATION=1; then fails without the binary. */
    static Path requireCollector() {
        Assumptions.assumeTrue("1".equals(System.getenv("HOPTRACE_INTEGRATION")),
                "integration test: set HOPTRACE_INTEGRATION=1 (and HOPTRACE_BIN) to run it");
        String bin = System.getenv("HOPTRACE_BIN");
        if (bin == null || !Files.isExecutable(Path.of(bin))) {
            fail("HOPTRACE_INTEGRATION=1 needs HOPTRACE_BIN, the hoptrace binary (got " + bin + ")");
        }
        return Path.of(bin);
    }

    static void requireListening(String addr, String what) {
        String[] hp = ExporterConfig.splitHostPort(addr);
        try (Socket s = new Socket()) {
            s.connect(new InetSocketAddress(hp[0], Integer.parseInt(hp[1])), 2000);
        } catch (IOException e) {
            fail(what + " is not listening on " + addr + ": " + e.getMessage());
        }
    }

    static void createTopic(String bootstrap, String topic, int partitions, Map<String, String> configs)
            throws Exception {
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        try (Admin admin = Admin.create(p)) {
            admin.createTopics(List.of(new NewTopic(topic, partitions, (short) 1).configs(configs))).all()
                    .get(30, TimeUnit.SECONDS);
        }
    }

    /** A `hoptrace collect` process. */
    static final class Collector implements AutoCloseable {
        final Process process;
        final String address;
        final Path runDir;
        final Path log;

        Collector(Path bin, Path dir, Path pipeline, String runId, String... extra) throws Exception {
            this(bin, dir, pipeline, runId, "127.0.0.1:0", "collect-" + runId + ".log", List.of(extra));
        }

        /** A collector listening on {@code listen}, its output in {@code logName} under {@code dir}. */
        Collector(Path bin, Path dir, Path pipeline, String runId, String listen, String logName, List<String> extra)
                throws Exception {
            log = dir.resolve(logName);
            List<String> cmd = new ArrayList<>(List.of(bin.toString(), "collect", "--listen", listen,
                    "--pipeline", pipeline.toString(), "--out", dir.resolve("runs").toString(), "--run-id", runId));
            cmd.addAll(extra);
            process = new ProcessBuilder(cmd).redirectErrorStream(true).redirectOutput(log.toFile()).start();
            runDir = dir.resolve("runs").resolve(runId);
            Pattern p = Pattern.compile("collecting on (\\S+)");
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
            String found = null;
            while (found == null) {
                if (!process.isAlive()) {
                    fail("hoptrace collect exited: " + Files.readString(log));
                }
                if (System.nanoTime() > deadline) {
                    process.destroyForcibly();
                    fail("hoptrace collect did not start: " + Files.readString(log));
                }
                Matcher m = p.matcher(Files.readString(log));
                if (m.find()) {
                    found = m.group(1);
                } else {
                    Thread.sleep(50);
                }
            }
            address = found;
        }

        /** SIGKILL, as a crash; waits for the process to end. */
        void kill() throws Exception {
            process.destroyForcibly();
            if (!process.waitFor(30, TimeUnit.SECONDS)) {
                fail("hoptrace collect did not end on SIGKILL");
            }
        }

        /** SIGTERM, wait for the flush, and the run's run.json. */
        JsonNode stop() throws Exception {
            process.destroy();
            if (!process.waitFor(60, TimeUnit.SECONDS)) {
                process.destroyForcibly();
                fail("hoptrace collect did not stop within 60 s");
            }
            assertEquals(0, process.exitValue(), () -> "collect failed: " + readLog());
            return new ObjectMapper().enable(DeserializationFeature.USE_BIG_INTEGER_FOR_INTS)
                    .readTree(runDir.resolve("run.json").toFile());
        }

        String readLog() {
            try {
                return Files.readString(log);
            } catch (IOException e) {
                return e.toString();
            }
        }

        @Override
        public void close() {
            if (process.isAlive()) {
                process.destroyForcibly();
            }
        }
    }

    /** Runs a hoptrace subcommand to completion; fails on a non-zero exit. Returns its output. */
    static String run(Path bin, Path dir, String name, String... args) throws Exception {
        Path log = dir.resolve(name + ".log");
        List<String> cmd = new ArrayList<>();
        cmd.add(bin.toString());
        cmd.addAll(List.of(args));
        Process p = new ProcessBuilder(cmd).redirectErrorStream(true).redirectOutput(log.toFile()).start();
        if (!p.waitFor(120, TimeUnit.SECONDS)) {
            p.destroyForcibly();
            fail(name + " did not finish: " + Files.readString(log));
        }
        String out = Files.readString(log);
        assertEquals(0, p.exitValue(), () -> name + " failed: " + out);
        return out;
    }

    /** The run's accounting must add up exactly: every message sent is complete. */
    static void assertExact(JsonNode run, long sent, String... hops) {
        JsonNode a = run.get("accounting");
        assertTrue(a.get("adds_up").booleanValue(), "adds_up: " + a);
        assertEquals(1, a.get("publishers").size(), "one publisher: " + a);
        JsonNode p = a.get("publishers").get(0);
        assertEquals(sent, p.get("sent").longValue(), "sent: " + a);
        assertEquals(sent, p.get("complete").longValue(), "complete = sent: " + a);
        assertEquals(0, p.get("incomplete").longValue(), "incomplete: " + a);
        assertEquals(0, p.get("unseen").longValue(), "unseen: " + a);
        assertEquals(0, a.get("records_lost_by_probes").longValue(), "lost: " + a);
        assertEquals(0, a.get("unknown_hop_records").longValue(), "unknown hops: " + a);
        assertEquals(0, a.get("in_flight").longValue(), "in flight: " + a);
        assertEquals(0, a.get("duplicate_traces").longValue(), "duplicates: " + a);
        assertEquals(0, a.get("late_records").longValue(), "late records: " + a);
        for (String hop : hops) {
            assertEquals(sent, a.get("records_by_hop").get(hop).longValue(), "records of " + hop + ": " + a);
        }
    }
}
