package dev.hoptrace.kafka;

import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicLongArray;

/**
 * A bounded lock-free queue of hop records: many producers (the Kafka clients' threads),
 * one consumer (the exporter thread). Records are stored as primitives in preallocated
 * arrays, so {@link #offer} never allocates, never locks and never waits: when the queue is
 * full it returns false at once and the caller counts the loss.
 *
 * <p>Each slot has a sequence number: a producer claims position {@code p} by advancing the
 * tail with compare-and-set when slot {@code p % capacity} shows sequence {@code p}, writes the
 * fields, then publishes sequence {@code p + 1} with release ordering; the consumer takes the
 * slot when it sees {@code p + 1} (acquire) and hands it back with {@code p + capacity}.
 */
final class RecordQueue {
    /** Longs per slot: meta, stream and metric count, sequence, stamp, intended, trace id x2. */
    private static final int STRIDE = 8;

    private final int capacity;
    private final int mask;
    private final long[] data;
    private final AtomicLongArray seq;
    private final AtomicLong tail = new AtomicLong();
    private final AtomicLong head = new AtomicLong();

    /** A queue of at least {@code capacity} slots (rounded up to a power of two). */
    RecordQueue(int capacity) {
        int c = Integer.highestOneBit(Math.max(2, capacity) - 1) << 1;
        if (c <= 0 || c > (1 << 26)) {
            throw new IllegalArgumentException("queue capacity " + capacity + " out of range (2 to 2^26)");
        }
        this.capacity = c;
        this.mask = c - 1;
        this.data = new long[c * STRIDE];
        this.seq = new AtomicLongArray(c);
        for (int i = 0; i < c; i++) {
            seq.set(i, i);
        }
    }

    int capacity() {
        return capacity;
    }

    /**
     * Records waiting (claimed slots included): at most the capacity, as the tail is read
     * before the head.
     */
    long size() {
        long t = tail.get();
        return Math.max(0, t - head.get());
    }

    /**
     * Queues the record of {@code hop} stamping {@code ctx} at {@code stampNs}.
     *
     * @return false when the queue is full (nothing was queued)
     */
    boolean offer(TraceContext ctx, int hop, long stampNs) {
        long pos = tail.get();
        int slot;
        for (;;) {
            slot = (int) (pos & mask);
            long s = seq.getAcquire(slot);
            long dif = s - pos;
            if (dif == 0) {
                if (tail.compareAndSet(pos, pos + 1)) {
                    break;
                }
                pos = tail.get();
            } else if (dif < 0) {
                return false;
            } else {
                pos = tail.get();
            }
        }
        int d = slot * STRIDE;
        byte[] id = ctx.otelTraceId;
        data[d] = (hop & 0xFFL) | (id != null ? 1L << 8 : 0) | ((long) ctx.publisher & 0xFFFF) << 16;
        data[d + 1] = (ctx.stream & 0xFFFFFFFFL) | ((long) ctx.metricCount) << 32;
        data[d + 2] = ctx.sequence;
        data[d + 3] = stampNs;
        data[d + 4] = ctx.intendedNs;
        if (id != null) {
            data[d + 5] = Bytes.getI64(id, 0);
            data[d + 6] = Bytes.getI64(id, 8);
        }
        seq.setRelease(slot, pos + 1);
        return true;
    }

    /**
     * Takes up to {@code max} records (one consumer thread only), appending each as a record
     * of a Records frame ({@code docs/collector-protocol.md}: 36 bytes, or 52 with a trace id)
     * to {@code out}.
     *
     * <p>Draining stops before the first record whose hop is not set in {@code hops} (a
     * 256-bit set: bit {@code h % 64} of {@code hops[h / 64]}), which stays queued; {@link
     * #blockedHop()} then names that hop.
     *
     * @return the number of records taken
     */
    int drainInto(Protocol.Buffer out, int max, long[] hops) {
        long pos = head.get();
        int n = 0;
        blockedHop = -1;
        while (n < max) {
            int slot = (int) (pos & mask);
            if (seq.getAcquire(slot) != pos + 1) {
                break;
            }
            int d = slot * STRIDE;
            long meta = data[d];
            int hop = (int) (meta & 0xFF);
            if ((hops[hop >>> 6] & (1L << (hop & 63))) == 0) {
                blockedHop = hop;
                break;
            }
            boolean hasId = (meta & (1L << 8)) != 0;
            out.u8(hasId ? 1 : 0);
            out.u8((int) (meta & 0xFF));
            out.u16((int) (meta >>> 16) & 0xFFFF);
            out.i32((int) data[d + 1]);
            out.i64(data[d + 2]);
            out.i64(data[d + 3]);
            out.i32((int) (data[d + 1] >>> 32));
            out.i64(data[d + 4]);
            if (hasId) {
                out.i64(data[d + 5]);
                out.i64(data[d + 6]);
            }
            pos++;
            // The head moves before the slot is handed back, record by record: a producer can
            // claim a slot only once the head has passed it, so tail - head never exceeds the
            // capacity ({@link #size()} is what is held).
            head.setRelease(pos);
            seq.setRelease(slot, pos - 1 + capacity);
            n++;
        }
        return n;
    }

    private int blockedHop = -1;

    /** The hop that stopped the last {@link #drainInto}, or -1. */
    int blockedHop() {
        return blockedHop;
    }

    /** Takes every waiting record without keeping it; returns how many. */
    long discardAll() {
        long pos = head.get();
        long n = 0;
        for (;;) {
            int slot = (int) (pos & mask);
            if (seq.getAcquire(slot) != pos + 1) {
                break;
            }
            pos++;
            head.setRelease(pos);
            seq.setRelease(slot, pos - 1 + capacity);
            n++;
        }
        return n;
    }
}
