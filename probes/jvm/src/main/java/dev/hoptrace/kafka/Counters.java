package dev.hoptrace.kafka;

import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.LongAdder;

/**
 * The counters of one exporter, shared by every interceptor that reports through it, sent
 * cumulatively in Counters frames (ids of {@code docs/collector-protocol.md}).
 *
 * <p>Counters the clients' threads touch are {@link LongAdder}s (no contention between
 * threads); a successful report touches none: {@code reported} is derived as records taken
 * by the exporter + {@code queue_full} + records still queued.
 */
public final class Counters {
    final LongAdder queueFull = new LongAdder();
    final LongAdder stampsFull = new LongAdder();
    final LongAdder notTraced = new LongAdder();
    final LongAdder badContext = new LongAdder();
    final LongAdder badTraceparent = new LongAdder();
    final AtomicLong dequeued = new AtomicLong();
    final AtomicLong sent = new AtomicLong();
    final AtomicLong sendFailed = new AtomicLong();
    final AtomicLong reconnects = new AtomicLong();
    final AtomicLong resent = new AtomicLong();
    final AtomicLong evicted = new AtomicLong();
    final AtomicLong lostUnacked = new AtomicLong();

    /**
     * A point-in-time copy. {@code resent}, {@code evicted} and {@code lostUnacked} are those
     * of protocol version 2 (records sent again after a reconnection; dropped from the
     * retention buffer before an Ack; of those, the ones the collector turned out not to hold).
     */
    public record Snapshot(long reported, long queueFull, long sent, long sendFailed, long reconnects,
                           long notTraced, long badContext, long stampsFull, long badTraceparent,
                           long resent, long evicted, long lostUnacked) {
        /** The same counters with {@code more} records counted as sent. */
        Snapshot plusSent(long more) {
            return new Snapshot(reported, queueFull, sent + more, sendFailed, reconnects, notTraced, badContext,
                    stampsFull, badTraceparent, resent, evicted, lostUnacked);
        }

        /** (id, value) pairs for a Counters frame. */
        long[][] toWire() {
            return new long[][] {
                {Protocol.REPORTED, reported},
                {Protocol.QUEUE_FULL, queueFull},
                {Protocol.SENT_RECORDS, sent},
                {Protocol.SEND_FAILED, sendFailed},
                {Protocol.RECONNECTS, reconnects},
                {Protocol.NOT_TRACED, notTraced},
                {Protocol.BAD_CONTEXT, badContext},
                {Protocol.STAMPS_FULL, stampsFull},
                {Protocol.BAD_TRACEPARENT, badTraceparent},
                {Protocol.RESENT, resent},
                {Protocol.EVICTED, evicted},
                {Protocol.LOST_UNACKED, lostUnacked},
            };
        }

        /**
         * Records lost by this exporter: not queued, not delivered, or evicted from the
         * retention buffer and not held by the collector.
         */
        public long lost() {
            return queueFull + sendFailed + lostUnacked;
        }
    }

    /** Reads every counter; {@code queued} is the number of records still waiting. */
    Snapshot snapshot(long queued) {
        long qf = queueFull.sum();
        return new Snapshot(dequeued.get() + qf + queued, qf, sent.get(), sendFailed.get(), reconnects.get(),
                notTraced.sum(), badContext.sum(), stampsFull.sum(), badTraceparent.sum(), resent.get(),
                evicted.get(), lostUnacked.get());
    }
}
