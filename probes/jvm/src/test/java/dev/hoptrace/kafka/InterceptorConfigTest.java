package dev.hoptrace.kafka;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.HashMap;
import java.util.Map;
import org.apache.kafka.common.config.ConfigDef;
import org.apache.kafka.common.config.ConfigException;
import org.junit.jupiter.api.Test;

/** The interceptor settings through Kafka's ConfigDef: defaults, every bound, bad values. */
class InterceptorConfigTest {
    static Map<String, Object> minimal() {
        Map<String, Object> p = new HashMap<>();
        p.put("bootstrap.servers", "127.0.0.1:9092"); // the client's own: left alone
        p.put("client.id", "c1");
        p.put("hoptrace.collector", "127.0.0.1:7400");
        p.put("hoptrace.hop", "flow_in");
        p.put("hoptrace.hop.id", "1");
        return p;
    }

    @Test
    void everySettingIsDefinedWithTypeDefaultImportanceAndDocumentation() {
        assertEquals(21, InterceptorConfig.CONFIG.names().size());
        for (ConfigDef.ConfigKey k : InterceptorConfig.CONFIG.configKeys().values()) {
            assertTrue(k.name.startsWith("hoptrace."), k.name);
            assertNotNull(k.type, k.name);
            assertNotNull(k.importance, k.name);
            assertTrue(k.documentation != null && k.documentation.length() > 20, k.name);
            boolean numeric = k.type == ConfigDef.Type.INT || k.type == ConfigDef.Type.LONG;
            assertTrue(!numeric || k.validator != null, "a number has a range: " + k.name);
        }
    }

    @Test
    void defaultsMatchTheExporterDefaults() {
        InterceptorConfig c = InterceptorConfig.consumer(minimal());
        ExporterConfig plain = new ExporterConfig("127.0.0.1:7400", null, null, null, "x");
        assertEquals(plain.tuning(), c.exporter.tuning());
        assertEquals(65536, c.exporter.queueCapacity);
        assertEquals(8192, c.exporter.maxBatch);
        assertEquals(ExporterConfig.defaultRetentionBytes(), c.exporter.retentionBytes);
        assertEquals(Math.min(64L << 20, Runtime.getRuntime().maxMemory() / 8), c.exporter.retentionBytes,
                "64 MiB, at most an eighth of the heap");
        assertEquals(2000, c.exporter.connectTimeoutMs);
        assertEquals(10_000, c.exporter.writeTimeoutMs);
        assertEquals(5000, c.exporter.closeTimeoutMs);
        assertTrue(c.inBand);
        assertEquals("flow_in", c.hop);
        assertEquals(1, c.hopId);
        assertNull(c.latHop);
        assertEquals("c1", c.clientId);
    }

    @Test
    void everyBoundAndTimeIsASetting() {
        Map<String, Object> p = minimal();
        p.put("hoptrace.queue.capacity", "1000");
        p.put("hoptrace.retention.bytes", "0");
        p.put("hoptrace.batch.records", 100); // a number given as a number
        p.put("hoptrace.connect.timeout.ms", "300");
        p.put("hoptrace.write.timeout.ms", "400");
        p.put("hoptrace.close.timeout.ms", "500");
        p.put("hoptrace.backoff.min.ms", "10");
        p.put("hoptrace.backoff.max.ms", "100");
        p.put("hoptrace.counters.interval.ms", "50");
        p.put("hoptrace.clock.interval.ms", "60");
        p.put("hoptrace.in.band", " FALSE ");
        p.put("hoptrace.token", "secret");
        p.put("hoptrace.process", "proc");
        p.put("hoptrace.tls.name", "collector.example");
        ExporterConfig e = InterceptorConfig.producer(p).exporter;
        assertEquals(1000, e.queueCapacity);
        assertEquals(0, e.retentionBytes, "0: version 1");
        assertEquals(100, e.maxBatch);
        assertEquals(300, e.connectTimeoutMs);
        assertEquals(400, e.writeTimeoutMs);
        assertEquals(500, e.closeTimeoutMs);
        assertEquals(10, e.backoffMinMs);
        assertEquals(100, e.backoffMaxMs);
        assertEquals(50, e.countersIntervalMs);
        assertEquals(60, e.clockIntervalMs);
        assertEquals("secret", e.token);
        assertEquals("proc", e.process);
        assertEquals("collector.example", e.tlsName);
        assertFalse(InterceptorConfig.producer(p).inBand);
    }

    @Test
    void blankValuesCountAsUnset() {
        Map<String, Object> p = minimal();
        p.put("hoptrace.hops", " ");
        p.put("hoptrace.queue.capacity", "");
        p.put("hoptrace.retention.bytes", " ");
        p.put("hoptrace.log.append.time.hop", "");
        InterceptorConfig c = InterceptorConfig.consumer(p);
        assertEquals(65536, c.exporter.queueCapacity);
        assertEquals(ExporterConfig.defaultRetentionBytes(), c.exporter.retentionBytes);
        assertNull(c.latHop);
        p.put("hoptrace.collector", "  ");
        ConfigException e = assertThrows(ConfigException.class, () -> InterceptorConfig.consumer(p));
        assertTrue(e.getMessage().contains("hoptrace.collector"), e.getMessage());
    }

    @Test
    void badValuesAndUnknownKeysAreRefusedNamingTheKey() {
        String[][] bad = {
            {"hoptrace.collector", null},
            {"hoptrace.collector", "no-port"},
            {"hoptrace.collector", "host:0"},
            {"hoptrace.collector", "host:http"},
            {"hoptrace.hop", null},
            {"hoptrace.hop", "Bad-Name"},
            {"hoptrace.hop.id", "256"},
            {"hoptrace.hop.id", "-1"},
            {"hoptrace.hop.id", "one"},
            {"hoptrace.hops", "flow_in:2"},
            {"hoptrace.hops", "a:4,b:4"},
            {"hoptrace.hops", "a:300"},
            {"hoptrace.hops", "a"},
            {"hoptrace.tls.ca", "/nonexistent/ca.pem"},
            {"hoptrace.log.append.time.hop", "Bad"},
            {"hoptrace.log.append.time.hop", "flow_in"},
            {"hoptrace.log.append.time.hop", "other"},
            {"hoptrace.log.append.time.hop.id", "999"},
            {"hoptrace.in.band", "maybe"},
            {"hoptrace.queue.capacity", "1"},
            {"hoptrace.queue.capacity", String.valueOf((1 << 26) + 1)},
            {"hoptrace.queue.capacity", "lots"},
            {"hoptrace.retention.bytes", "-1"},
            {"hoptrace.retention.bytes", "64MiB"},
            {"hoptrace.batch.records", "0"},
            {"hoptrace.batch.records", "20001"},
            {"hoptrace.connect.timeout.ms", "0"},
            {"hoptrace.write.timeout.ms", "0"},
            {"hoptrace.close.timeout.ms", "-1"},
            {"hoptrace.backoff.min.ms", "0"},
            {"hoptrace.backoff.max.ms", "20"}, // below the default minimum, 50
            {"hoptrace.counters.interval.ms", "1"},
            {"hoptrace.clock.interval.ms", "5s"},
            {"hoptrace.colector", "127.0.0.1:7400"}, // a typo
            {"hoptrace.queue_capacity", "10"},
        };
        for (String[] b : bad) {
            Map<String, Object> p = minimal();
            if (b[1] == null) {
                p.remove(b[0]);
            } else {
                p.put(b[0], b[1]);
            }
            ConfigException e = assertThrows(ConfigException.class, () -> InterceptorConfig.consumer(p),
                    b[0] + "=" + b[1]);
            String key = b[0].equals("hoptrace.hops") && "flow_in:2".equals(b[1]) ? "hoptrace.hop.id"
                    : b[0].equals("hoptrace.log.append.time.hop") && "other".equals(b[1])
                    ? "hoptrace.log.append.time.hop.id" : b[0];
            assertTrue(e.getMessage().contains(key), b[0] + "=" + b[1] + ": " + e.getMessage());
        }
        // Producer only: a producer does not see LogAppendTime.
        Map<String, Object> p = minimal();
        p.put("hoptrace.log.append.time.hop", "source_append");
        p.put("hoptrace.log.append.time.hop.id", "0");
        assertEquals(0, InterceptorConfig.consumer(p).latHopId);
        ConfigException e = assertThrows(ConfigException.class, () -> InterceptorConfig.producer(p));
        assertTrue(e.getMessage().contains("hoptrace.log.append.time.hop"), e.getMessage());
    }

    @Test
    void theSettingNamesOfEarlierVersionsKeepWorking() {
        Map<String, Object> p = new HashMap<>();
        p.put("hoptrace.collector", "[::1]:7400");
        p.put("hoptrace.hops", "publish:0, source_append=1,mm2_consume:2");
        p.put("hoptrace.hop", "mm2_consume");
        p.put("hoptrace.log.append.time.hop", "source_append");
        p.put("hoptrace.in.band", "true");
        p.put("hoptrace.queue.capacity", "16");
        p.put("hoptrace.close.timeout.ms", "15000");
        InterceptorConfig c = InterceptorConfig.consumer(p);
        assertEquals(2, c.hopId);
        assertEquals(1, c.latHopId);
        assertEquals("::1", c.exporter.collectorHost());
        assertEquals(16, c.exporter.queueCapacity);
        assertEquals(15000, c.exporter.closeTimeoutMs);
    }
}
