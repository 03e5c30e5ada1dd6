package dev.hoptrace.kafka;

import java.util.Map;
import org.apache.kafka.clients.consumer.ConsumerInterceptor;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Headers;
import org.apache.kafka.common.record.TimestampType;

/**
 * A consumer interceptor that stamps the hop {@code hoptrace.hop} on every record a consumer
 * hands to its application and reports it to the hoptrace collector.
 *
 * <pre>
 * interceptor.classes=dev.hoptrace.kafka.HoptraceConsumerInterceptor
 * hoptrace.collector=127.0.0.1:7400
 * hoptrace.hop=flow_in
 * hoptrace.hop.id=1
 * </pre>
 *
 * <p>Per {@code poll()}, the clock (CLOCK_REALTIME, ns) is read once when the records are
 * handed over ({@code onConsume}); every traced record of the batch is stamped with that
 * reading. With {@code hoptrace.in.band=true} (default) the stamp is also appended to the
 * record's {@code hoptrace} header, so an application that forwards headers (MirrorMaker 2)
 * carries it on. With {@code hoptrace.log.append.time.hop} set, a record of a topic whose
 * timestamps are LogAppendTime also reports that time (the broker's own stamp, millisecond
 * resolution) as that hop.
 *
 * <p>Never blocks the consumer: reports go to a bounded queue; what does not fit is counted.
 */
public class HoptraceConsumerInterceptor<K, V> implements ConsumerInterceptor<K, V> {
    private HopProbe probe;

    /** Kafka creates interceptors with this constructor, then calls {@link #configure}. */
    public HoptraceConsumerInterceptor() {}

    @Override
    public void configure(Map<String, ?> configs) {
        probe = new HopProbe(InterceptorConfig.consumer(configs), "consumer");
    }

    @Override
    public ConsumerRecords<K, V> onConsume(ConsumerRecords<K, V> records) {
        HopProbe p = probe;
        if (p == null || records.isEmpty()) {
            return records;
        }
        long nowNs = Clocks.realtimeNs();
        boolean lat = p.config.latHop != null;
        boolean inBand = p.config.inBand;
        for (ConsumerRecord<K, V> r : records) {
            Headers headers = r.headers();
            TraceContext ctx = p.extract(headers);
            if (ctx == null) {
                continue;
            }
            if (lat && r.timestampType() == TimestampType.LOG_APPEND_TIME) {
                p.reportLogAppendTime(ctx, r.timestamp());
            }
            if (p.stamp(ctx, nowNs) && inBand) {
                try {
                    headers.remove(HopProbe.HEADER);
                    headers.add(HopProbe.HEADER, ctx.encode());
                } catch (IllegalStateException readOnly) {
                    // Headers a client made read-only keep the context as it came.
                }
            }
        }
        return records;
    }

    @Override
    public void onCommit(Map<TopicPartition, OffsetAndMetadata> offsets) {}

    @Override
    public void close() {
        HopProbe p = probe;
        if (p != null) {
            p.close();
        }
    }
}
