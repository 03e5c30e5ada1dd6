package dev.hoptrace.kafka;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotSame;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.config.ConfigException;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.Headers;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.record.TimestampType;
import org.junit.jupiter.api.Test;

/** The interceptors on hand-made records, reporting to an in-process collector. */
class InterceptorTest {
    static final String TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    static Map<String, Object> props(FakeCollector fc, String hop, int id) {
        Map<String, Object> p = new HashMap<>();
        p.put("client.id", "test-client");
        p.put("hoptrace.collector", fc.address());
        p.put("hoptrace.hop", hop);
        p.put("hoptrace.hops", "publish:0,source_append:1," + hop + ":" + id);
        p.put("hoptrace.process", "interceptor-test-" + hop);
        return p;
    }

    static ConsumerRecord<byte[], byte[]> consumed(TimestampType type, long ts, Headers h) {
        return new ConsumerRecord<>("t", 0, 0, ts, type, 0, 0, null, new byte[0], h, Optional.empty());
    }

    static Headers headers(byte[]... contexts) {
        RecordHeaders h = new RecordHeaders();
        h.add("other", "x".getBytes(StandardCharsets.UTF_8));
        for (byte[] c : contexts) {
            h.add("hoptrace", c);
        }
        return h;
    }

    static TraceContext published(long seq) {
        TraceContext c = new TraceContext(9, 1, seq, 1, 1000);
        c.pushStamp(0, 2000);
        return c;
    }

    @Test
    void theConsumerStampsReportsAndCountsWhatItCannotRead() throws Exception {
        try (FakeCollector fc = new FakeCollector()) {
            Map<String, Object> p = props(fc, "mm2_consume", 2);
            p.put("hoptrace.log.append.time.hop", "source_append");
            HoptraceConsumerInterceptor<byte[], byte[]> ci = new HoptraceConsumerInterceptor<>();
            ci.configure(p);
            TraceContext stale = published(99);
            List<ConsumerRecord<byte[], byte[]>> list = new ArrayList<>();
            // 0: last header wins over a stale earlier one; LogAppendTime reported
            list.add(consumed(TimestampType.LOG_APPEND_TIME, 1_700_000_000_123L,
                    headers(stale.encode(), published(0).encode())));
            // 1: CreateTime: no LogAppendTime stamp; a traceparent lends its trace id
            Headers withTp = headers(published(1).encode());
            withTp.add("traceparent", TP.getBytes(StandardCharsets.US_ASCII));
            list.add(consumed(TimestampType.CREATE_TIME, 5, withTp));
            // 2: not traced
            list.add(consumed(TimestampType.CREATE_TIME, 5, headers()));
            // 3: a last header that does not decode: no fall back to the earlier good one
            list.add(consumed(TimestampType.CREATE_TIME, 5, headers(published(3).encode(), new byte[] {1, 2})));
            // 4: a bad traceparent beside a good context
            Headers badTp = headers(published(4).encode());
            badTp.add("traceparent", "garbage".getBytes(StandardCharsets.US_ASCII));
            list.add(consumed(TimestampType.CREATE_TIME, 5, badTp));
            ConsumerRecords<byte[], byte[]> recs = new ConsumerRecords<>(Map.of(new TopicPartition("t", 0), list));
            long before = Clocks.realtimeNs();
            assertSame(recs, ci.onConsume(recs));
            long after = Clocks.realtimeNs();

            // In-band: one hoptrace header, holding publish then this hop's stamp.
            Headers h0 = list.get(0).headers();
            assertEquals(1, count(h0, "hoptrace"));
            TraceContext c0 = TraceContext.decode(h0.lastHeader("hoptrace").value());
            assertEquals(0, c0.sequence());
            assertEquals(2, c0.stampCount());
            assertEquals(2, c0.stampHop(1));
            long stamp = c0.stampNs(1);
            assertTrue(stamp >= before && stamp <= after);
            assertTrue(TraceContext.decode(list.get(1).headers().lastHeader("hoptrace").value()).hasOtelTraceId());

            ci.close();
            FakeCollector.await(() -> fc.connections.size() == 1 && fc.connections.get(0).closed, 5000, "goodbye");
            FakeCollector.Connection c = fc.connections.get(0);
            assertEquals(List.of(new Protocol.Hop(2, "mm2_consume"), new Protocol.Hop(1, "source_append")),
                    c.hello().hops());
            List<Protocol.Record> rs = fc.records();
            assertEquals(4, rs.size(), "3 stamps of hop 2, 1 LogAppendTime stamp: " + rs);
            Protocol.Record lat = rs.stream().filter(r -> r.hop() == 1).findFirst().orElseThrow();
            assertEquals(0, lat.sequence());
            assertEquals(1_700_000_000_123_000_000L, lat.stampNs());
            assertTrue(rs.stream().filter(r -> r.hop() == 2).allMatch(r -> r.stampNs() == stamp), "one reading per poll");
            Protocol.Record r1 = rs.stream().filter(r -> r.sequence() == 1).findFirst().orElseThrow();
            assertEquals("4bf92f3577b34da6a3ce929d0e0e4736", Bytes.hex(r1.otelTraceId()));
            Protocol.CountersFrame last = fc.lastCounters();
            assertEquals(4, last.get(Protocol.REPORTED));
            assertEquals(4, last.get(Protocol.SENT_RECORDS));
            assertEquals(1, last.get(Protocol.NOT_TRACED));
            assertEquals(1, last.get(Protocol.BAD_CONTEXT));
            assertEquals(1, last.get(Protocol.BAD_TRACEPARENT));
        }
    }

    @Test
    void theProducerCarriesTheContextOnWithItsStampAndLeavesTheCallersRecordAlone() throws Exception {
        try (FakeCollector fc = new FakeCollector()) {
            HoptraceProducerInterceptor<byte[], byte[]> pi = new HoptraceProducerInterceptor<>();
            pi.configure(props(fc, "mm2_produce", 3));
            TraceContext in = published(7);
            in.pushStamp(2, 3000);
            Headers h = headers(published(6).encode(), in.encode());
            ProducerRecord<byte[], byte[]> rec = new ProducerRecord<>("out", 1, 77L, "k".getBytes(), "v".getBytes(), h);
            long before = Clocks.realtimeNs();
            ProducerRecord<byte[], byte[]> sent = pi.onSend(rec);
            assertNotSame(rec, sent);
            assertEquals(2, count(rec.headers(), "hoptrace"), "the caller's headers are unchanged");
            assertEquals("out", sent.topic());
            assertEquals(1, sent.partition());
            assertEquals(77L, sent.timestamp());
            assertArrayEquals("v".getBytes(), sent.value());
            assertEquals(1, count(sent.headers(), "hoptrace"));
            assertEquals("other", sent.headers().toArray()[0].key(), "other headers kept, in order");
            TraceContext out = TraceContext.decode(sent.headers().lastHeader("hoptrace").value());
            assertEquals(3, out.stampCount());
            assertEquals(3, out.stampHop(2));
            assertTrue(out.stampNs(2) >= before);

            ProducerRecord<byte[], byte[]> plain = new ProducerRecord<>("out", "v".getBytes());
            assertSame(plain, pi.onSend(plain), "untraced records pass unchanged");

            pi.close();
            FakeCollector.await(() -> fc.connections.size() == 1 && fc.connections.get(0).closed, 5000, "goodbye");
            List<Protocol.Record> rs = fc.records();
            assertEquals(1, rs.size());
            assertEquals(7, rs.get(0).sequence());
            assertEquals(out.stampNs(2), rs.get(0).stampNs());
            assertEquals(1, fc.lastCounters().get(Protocol.NOT_TRACED));
        }
    }

    @Test
    void aFullContextStillReportsButIsNotChanged() throws Exception {
        try (FakeCollector fc = new FakeCollector()) {
            HoptraceProducerInterceptor<byte[], byte[]> pi = new HoptraceProducerInterceptor<>();
            pi.configure(props(fc, "egress", 3));
            TraceContext full = published(1);
            while (full.pushStamp(5, 1)) {
                // fill to 16
            }
            ProducerRecord<byte[], byte[]> rec = new ProducerRecord<>("out", null, null, null, new byte[0],
                    headers(full.encode()));
            assertSame(rec, pi.onSend(rec));
            pi.close();
            FakeCollector.await(() -> fc.connections.size() == 1 && fc.connections.get(0).closed, 5000, "goodbye");
            assertEquals(1, fc.records().size());
            assertEquals(1, fc.lastCounters().get(Protocol.STAMPS_FULL));
        }
    }

    @Test
    void misconfigurationFailsTheClientLoudly() throws Exception {
        try (FakeCollector fc = new FakeCollector()) {
            Map<String, Object> ok = props(fc, "x", 4);
            for (String[] bad : new String[][] {
                {"hoptrace.collector", null},
                {"hoptrace.collector", "no-port"},
                {"hoptrace.hop", null},
                {"hoptrace.hop", "Bad-Name"},
                {"hoptrace.hops", "x:4,y:4"},
                {"hoptrace.hops", "x:300"},
                {"hoptrace.tls.ca", "/nonexistent/ca.pem"},
                {"hoptrace.in.band", "maybe"},
                {"hoptrace.queue.capacity", "1"},
            }) {
                Map<String, Object> p = new HashMap<>(ok);
                if (bad[1] == null) {
                    p.remove(bad[0]);
                } else {
                    p.put(bad[0], bad[1]);
                }
                assertThrows(ConfigException.class, () -> new HoptraceConsumerInterceptor<>().configure(p),
                        bad[0] + "=" + bad[1]);
            }
            Map<String, Object> noId = new HashMap<>(ok);
            noId.remove("hoptrace.hops");
            assertThrows(ConfigException.class, () -> new HoptraceConsumerInterceptor<>().configure(noId));
            noId.put("hoptrace.hop.id", "4");
            HoptraceConsumerInterceptor<Object, Object> ci = new HoptraceConsumerInterceptor<>();
            ci.configure(noId);
            // The same hop id under another name on the same exporter is a conflict.
            Map<String, Object> clash = new HashMap<>(noId);
            clash.put("hoptrace.hop", "y");
            assertThrows(ConfigException.class, () -> new HoptraceProducerInterceptor<>().configure(clash));
            Map<String, Object> latOnProducer = new HashMap<>(noId);
            latOnProducer.put("hoptrace.log.append.time.hop", "source_append");
            latOnProducer.put("hoptrace.log.append.time.hop.id", "1");
            assertThrows(ConfigException.class, () -> new HoptraceProducerInterceptor<>().configure(latOnProducer));
            ci.close();
        }
    }

    @Test
    void hopMappingsParse() {
        assertEquals(Map.of("a", 0, "b_2", 17), InterceptorConfig.parseHops(" a:0 , b_2=17 ,"));
        assertNull(InterceptorConfig.parseHops(null).get("a"));
    }

    private static int count(Headers h, String key) {
        int n = 0;
        for (Header x : h) {
            n += x.key().equals(key) ? 1 : 0;
        }
        return n;
    }
}
