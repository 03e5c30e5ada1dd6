package dev.hoptrace.kafka;

import java.util.ArrayDeque;
import java.util.Iterator;

/**
 * The records frames an exporter keeps until the collector acknowledges them as durable
 * (collector protocol version 2, {@code docs/collector-protocol.md} "0x07 SeqRecords"):
 * bounded in bytes, oldest dropped first, and every dropped record accounted for once the
 * exporter learns what the collector holds. Used by the exporter thread alone.
 *
 * <p>Memory: the frames' bytes (at most {@code maxBytes}, and one frame beyond it while it is
 * being pushed), one small entry per frame dropped after it was written (at most {@link
 * #MAX_UNRESOLVED}: {@link #stalled()} then tells the exporter to reconnect so that the next
 * Welcome settles them), and one count for every frame dropped before it was ever written.
 */
final class Retention {
    /**
     * Most frames dropped after they were written whose fate is remembered; beyond it the
     * exporter reconnects so that the collector's Welcome says what it holds.
     */
    static final int MAX_UNRESOLVED = 1 << 16;

    /** One numbered records frame, its bytes as written (length prefix included). */
    static final class Frame {
        final long seq;
        final int records;
        final byte[] bytes;
        /** Written to a connection (else numbered while no collector was reachable). */
        boolean written;

        Frame(long seq, int records, byte[] bytes) {
            this.seq = seq;
            this.records = records;
            this.bytes = bytes;
        }
    }

    /** A frame dropped unacknowledged: its number, records, and whether it was written. */
    private static final class Evicted {
        final long seq;
        final int records;
        boolean written;

        Evicted(long seq, int records, boolean written) {
            this.seq = seq;
            this.records = records;
            this.written = written;
        }
    }

    private final long maxBytes;
    private final ArrayDeque<Frame> frames = new ArrayDeque<>();
    private long bytes;
    /** Oldest first; only the newest may be unwritten (it can still be marked written). */
    private final ArrayDeque<Evicted> evicted = new ArrayDeque<>();
    /** Records of older frames dropped before they were ever written: no collector has them. */
    private long evictedUnwritten;
    private long acked;

    Retention(long maxBytes) {
        this.maxBytes = maxBytes;
    }

    /** Keeps {@code f}; returns the records of older frames dropped to make room (evicted). */
    long push(Frame f) {
        settleEvictedUnwritten();
        bytes += f.bytes.length;
        frames.addLast(f);
        long dropped = 0;
        while (bytes > maxBytes && !frames.isEmpty()) {
            Frame old = frames.removeFirst();
            bytes -= old.bytes.length;
            dropped += old.records;
            evicted.addLast(new Evicted(old.seq, old.records, old.written));
            // An unwritten frame that is not the newest will never be written.
            if (!frames.isEmpty()) {
                settleEvictedUnwritten();
            }
        }
        return dropped;
    }

    private void settleEvictedUnwritten() {
        Evicted last = evicted.peekLast();
        if (last != null && !last.written) {
            evictedUnwritten += evicted.removeLast().records;
        }
    }

    /** The collector holds every frame up to {@code seq} durably. */
    void ack(long seq) {
        if (seq <= acked) {
            return;
        }
        acked = seq;
        while (!frames.isEmpty() && frames.peekFirst().seq <= seq) {
            bytes -= frames.removeFirst().bytes.length;
        }
        while (!evicted.isEmpty() && evicted.peekFirst().seq <= seq) {
            evicted.removeFirst();
        }
    }

    /**
     * After a (re)connection the collector holds the frames up to {@code resumeSeq}: forgets
     * those and returns the records of evicted frames above it, which are lost. The frames
     * still kept are then to be written again ({@link #frames()}).
     */
    long resume(long resumeSeq) {
        ack(resumeSeq);
        // A collector started again may hold less than it acknowledged (a lost disk).
        acked = resumeSeq;
        long lost = evictedUnwritten;
        for (Evicted e : evicted) {
            lost += e.records;
        }
        evicted.clear();
        evictedUnwritten = 0;
        return lost;
    }

    /** The frames kept, oldest first. */
    Iterator<Frame> frames() {
        return frames.iterator();
    }

    /** The newest frame, number {@code seq}, was written (kept, or already evicted). */
    void markWritten(long seq) {
        Frame last = frames.peekLast();
        if (last != null && last.seq == seq) {
            last.written = true;
            return;
        }
        Evicted e = evicted.peekLast();
        if (e != null && e.seq == seq) {
            e.written = true;
        }
    }

    /** Records of evicted frames no collector has told about, written (perhaps held) ones. */
    long evictedWrittenUnresolved() {
        long n = 0;
        for (Evicted e : evicted) {
            if (e.written) {
                n += e.records;
            }
        }
        return n;
    }

    /** Records of evicted frames no collector has told about that were never written: lost. */
    long evictedUnwrittenUnresolved() {
        long n = evictedUnwritten;
        for (Evicted e : evicted) {
            if (!e.written) {
                n += e.records;
            }
        }
        return n;
    }

    /** Records kept that were never written to a connection. */
    long unwrittenRecords() {
        long n = 0;
        for (Frame f : frames) {
            if (!f.written) {
                n += f.records;
            }
        }
        return n;
    }

    /** Records kept, not yet acknowledged. */
    long unackedRecords() {
        long n = 0;
        for (Frame f : frames) {
            n += f.records;
        }
        return n;
    }

    /** Whether nothing is kept. */
    boolean isEmpty() {
        return frames.isEmpty();
    }

    /** The highest number acknowledged (or resumed after). */
    long acked() {
        return acked;
    }

    /** Bytes of frames kept. */
    long bytes() {
        return bytes;
    }

    /** Entries kept about frames evicted after they were written. */
    int evictedEntries() {
        return evicted.size();
    }

    /**
     * The collector acknowledged none of the last {@link #MAX_UNRESOLVED} frames dropped
     * after they were written: reconnect, so that its Welcome says what it holds.
     */
    boolean stalled() {
        return evicted.size() >= MAX_UNRESOLVED;
    }
}
