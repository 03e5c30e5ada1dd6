package dev.hoptrace.kafka;

import java.util.Map;
import org.apache.kafka.clients.producer.ProducerInterceptor;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.Headers;
import org.apache.kafka.common.header.internals.RecordHeaders;

/**
 * A producer interceptor that stamps the hop {@code hoptrace.hop} on every traced record a
 * producer sends and reports it to the hoptrace collector.
 *
 * <pre>
 * interceptor.classes=dev.hoptrace.kafka.HoptraceProducerInterceptor
 * hoptrace.collector=127.0.0.1:7400
 * hoptrace.hop=flow_out
 * hoptrace.hop.id=2
 * </pre>
 *
 * <p>The context arrives in the record's own headers: an application that copies the headers
 * of what it consumed (MirrorMaker 2, a Kafka Streams topology, a Connect source) hands the
 * context to its producer that way. In {@code send()} (before serialisation and
 * partitioning) the interceptor reads CLOCK_REALTIME (ns), reports the stamp, and returns a
 * copy of the record whose headers end with one {@code hoptrace} header holding the context
 * with the stamp appended (earlier {@code hoptrace} headers are dropped; the last one is the
 * one readers use). The caller's record object is not modified. Records without a context
 * are sent unchanged and counted as {@code not_traced}.
 *
 * <p>Never blocks the producer: reports go to a bounded queue; what does not fit is counted.
 */
public class HoptraceProducerInterceptor<K, V> implements ProducerInterceptor<K, V> {
    private HopProbe probe;

    /** Kafka creates interceptors with this constructor, then calls {@link #configure}. */
    public HoptraceProducerInterceptor() {}

    @Override
    public void configure(Map<String, ?> configs) {
        probe = new HopProbe(InterceptorConfig.producer(configs), "producer");
    }

    @Override
    public ProducerRecord<K, V> onSend(ProducerRecord<K, V> record) {
        HopProbe p = probe;
        if (p == null) {
            return record;
        }
        Headers headers = record.headers();
        TraceContext ctx = p.extract(headers);
        if (ctx == null) {
            return record;
        }
        long nowNs = Clocks.realtimeNs();
        if (!p.stamp(ctx, nowNs) || !p.config.inBand) {
            return record;
        }
        RecordHeaders out = new RecordHeaders();
        for (Header h : headers) {
            if (!HopProbe.HEADER.equals(h.key())) {
                out.add(h);
            }
        }
        out.add(HopProbe.HEADER, ctx.encode());
        return new ProducerRecord<>(record.topic(), record.partition(), record.timestamp(), record.key(),
                record.value(), out);
    }

    /** The probe behind this interceptor (benchmarks and tests in this package). */
    HopProbe probeForBench() {
        return probe;
    }

    @Override
    public void onAcknowledgement(RecordMetadata metadata, Exception exception) {}

    @Override
    public void close() {
        HopProbe p = probe;
        if (p != null) {
            p.close();
        }
    }
}
