package dev.hoptrace.kafka;

import java.io.EOFException;
import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

/**
 * The collector protocol of {@code docs/collector-protocol.md}, versions 1 and 2: length-prefixed
 * frames, little-endian integers, u16-length UTF-8 strings of at most 1024 bytes. Version 2
 * adds numbered records frames (SeqRecords), the collector's Acks and Welcome's {@code
 * resume_seq}.
 *
 * <p>Probe frames are encoded into a {@link Buffer}; frames from either side are decoded by
 * {@link #decode(int, byte[])} (the exporter reads Welcome and Reject with it, tests read
 * everything).
 */
public final class Protocol {
    private Protocol() {}

    /** Highest protocol version spoken here. */
    public static final int VERSION = 2;
    /** Largest frame: type byte plus body. */
    public static final int MAX_FRAME_LEN = 1 << 20;
    /** Longest string, bytes. */
    public static final int MAX_STRING_LEN = 1024;
    /** Most records per Records frame. */
    public static final int MAX_RECORDS_PER_FRAME = 20_000;
    /** Most hops one exporter announces. */
    public static final int MAX_HOPS = 16;
    /** Magic at the start of Hello. */
    public static final byte[] HELLO_MAGIC = "HOPTRACE".getBytes(StandardCharsets.US_ASCII);

    /** Frame types. */
    public static final int HELLO = 0x01;
    /** Records. */
    public static final int RECORDS = 0x02;
    /** Clock. */
    public static final int CLOCK = 0x03;
    /** Counters. */
    public static final int COUNTERS = 0x04;
    /** Sent. */
    public static final int SENT = 0x05;
    /** Goodbye. */
    public static final int GOODBYE = 0x06;
    /** SeqRecords (version 2): a records frame with its number. */
    public static final int SEQ_RECORDS = 0x07;
    /** Welcome. */
    public static final int WELCOME = 0x81;
    /** Reject. */
    public static final int REJECT = 0x82;
    /** Ack (version 2). */
    public static final int ACK = 0x83;
    /** Reject code: bad magic or unsupported version. */
    public static final int REJECT_VERSION = 1;

    /** Counter ids of the Counters frame. */
    public static final int REPORTED = 1;
    /** Records that could not be queued. */
    public static final int QUEUE_FULL = 2;
    /** Records written to the socket. */
    public static final int SENT_RECORDS = 3;
    /** Records of frames that failed to write. */
    public static final int SEND_FAILED = 4;
    /** Successful connections after the first. */
    public static final int RECONNECTS = 5;
    /** Messages without a trace context. */
    public static final int NOT_TRACED = 6;
    /** Contexts that failed to decode. */
    public static final int BAD_CONTEXT = 7;
    /** Stamps not appended in-band (context full). */
    public static final int STAMPS_FULL = 8;
    /** traceparent values ignored. */
    public static final int BAD_TRACEPARENT = 9;
    /** Records sent again after a reconnection because no Ack had covered them (version 2). */
    public static final int RESENT = 10;
    /** Records dropped from the retention buffer (full) before an Ack covered them (version 2). */
    public static final int EVICTED = 11;
    /** Of {@link #EVICTED}, the records the collector did not hold: lost, counted (version 2). */
    public static final int LOST_UNACKED = 12;

    /** Length of a record without a trace id. */
    public static final int RECORD_LEN = 36;

    /** A growable little-endian byte buffer that frames are encoded into. */
    public static final class Buffer {
        byte[] b;
        int len;
        private final int limit;

        /** An empty buffer of {@code capacity} bytes to start with. */
        public Buffer(int capacity) {
            this(capacity, Integer.MAX_VALUE - 8);
        }

        /**
         * An empty buffer of {@code capacity} bytes to start with, that never grows past {@code
         * limit} bytes (its storage included): content beyond it is refused with
         * IllegalStateException.
         */
        public Buffer(int capacity, int limit) {
            this.limit = Math.max(16, limit);
            b = new byte[Math.min(Math.max(16, capacity), this.limit)];
        }

        private void ensure(int more) {
            int need = len + more;
            if (need > b.length) {
                if (need > limit || need < 0) {
                    throw new IllegalStateException("frame buffer limit of " + limit + " bytes reached");
                }
                b = Arrays.copyOf(b, (int) Math.min(limit, Math.max(2L * b.length, need)));
            }
        }

        /** Bytes written. */
        public int length() {
            return len;
        }

        /** Bytes of storage held (at most the limit). */
        public int capacity() {
            return b.length;
        }

        /** Forgets the content, keeping the storage. */
        public void clear() {
            len = 0;
        }

        /** Drops everything after {@code at}. */
        void truncate(int at) {
            len = at;
        }

        /** The backing array (valid up to {@link #length()}). */
        public byte[] array() {
            return b;
        }

        /** A copy of the content. */
        public byte[] toByteArray() {
            return Arrays.copyOf(b, len);
        }

        Buffer u8(int v) {
            ensure(1);
            b[len++] = (byte) v;
            return this;
        }

        Buffer u16(int v) {
            ensure(2);
            len = Bytes.putU16(b, len, v);
            return this;
        }

        Buffer i32(int v) {
            ensure(4);
            len = Bytes.putI32(b, len, v);
            return this;
        }

        Buffer i64(long v) {
            ensure(8);
            len = Bytes.putI64(b, len, v);
            return this;
        }

        Buffer bytes(byte[] v) {
            ensure(v.length);
            System.arraycopy(v, 0, b, len, v.length);
            len += v.length;
            return this;
        }

        /** A string: u16 length and UTF-8, cut at a character boundary to 1024 bytes. */
        Buffer str(String s) {
            byte[] u = utf8Cut(s);
            u16(u.length);
            return bytes(u);
        }

        /** Starts a frame of {@code type}; returns where its length goes. */
        int begin(int type) {
            int at = len;
            ensure(5);
            len += 4;
            b[len++] = (byte) type;
            return at;
        }

        /** Writes the length of the frame begun at {@code at}. */
        void end(int at) {
            int frameLen = len - at - 4;
            if (frameLen > MAX_FRAME_LEN) {
                throw new IllegalStateException("frame of " + frameLen + " bytes exceeds 1 MiB");
            }
            Bytes.putI32(b, at, frameLen);
        }
    }

    static byte[] utf8Cut(String s) {
        byte[] u = s.getBytes(StandardCharsets.UTF_8);
        if (u.length <= MAX_STRING_LEN) {
            return u;
        }
        int end = MAX_STRING_LEN;
        while (end > 0 && (u[end] & 0xC0) == 0x80) {
            end--;
        }
        return Arrays.copyOf(u, end);
    }

    // ------------------------------------------------------------------------------------
    // Probe frames

    /** Who an exporter is, sent first on every connection. */
    public record Hello(long instanceId, String host, String process, String software, String token,
                        List<Hop> hops) {}

    /** A hop announced in Hello. */
    public record Hop(int id, String name) {}

    /** Appends a Hello frame of the highest version, {@link #VERSION}. */
    public static void hello(Buffer out, Hello h) {
        hello(out, VERSION, h);
    }

    /** Appends a Hello frame asking for protocol {@code version} (1 or 2). */
    public static void hello(Buffer out, int version, Hello h) {
        if (h.hops().isEmpty() || h.hops().size() > MAX_HOPS) {
            throw new IllegalArgumentException("1 to 16 hops, not " + h.hops().size());
        }
        if (version < 1 || version > VERSION) {
            throw new IllegalArgumentException("protocol version 1 to " + VERSION + ", not " + version);
        }
        int at = out.begin(HELLO);
        out.bytes(HELLO_MAGIC).u16(version).i64(h.instanceId())
                .str(h.host()).str(h.process()).str(h.software()).str(h.token())
                .u8(h.hops().size());
        for (Hop hop : h.hops()) {
            out.u8(hop.id()).str(hop.name());
        }
        out.end(at);
    }

    /** Appends the start of a Records frame; returns its position for {@link #endRecords}. */
    static int beginRecords(Buffer out) {
        int at = out.begin(RECORDS);
        out.i32(0);
        return at;
    }

    /**
     * Appends the start of a SeqRecords frame numbered {@code seq} (version 2); returns its
     * position for {@link #endRecords}.
     */
    static int beginSeqRecords(Buffer out, long seq) {
        int at = out.begin(SEQ_RECORDS);
        out.i64(seq).i32(0);
        return at;
    }

    /**
     * Completes a Records or SeqRecords frame begun at {@code at} with {@code count} records;
     * an empty one is removed again.
     */
    static void endRecords(Buffer out, int at, int count) {
        if (count == 0) {
            out.truncate(at);
            return;
        }
        int countAt = at + 5 + ((out.b[at + 4] & 0xFF) == SEQ_RECORDS ? 8 : 0);
        Bytes.putI32(out.b, countAt, count);
        out.end(at);
    }

    /**
     * The same records as a plain Records frame, from a whole SeqRecords frame (length prefix
     * included): for a version 1 connection, which takes no numbered frames.
     */
    static byte[] plainRecords(byte[] seqFrame) {
        if (seqFrame.length < 17 || (seqFrame[4] & 0xFF) != SEQ_RECORDS) {
            throw new IllegalArgumentException("not a SeqRecords frame");
        }
        byte[] plain = new byte[seqFrame.length - 8];
        Bytes.putI32(plain, 0, Bytes.getI32(seqFrame, 0) - 8);
        plain[4] = (byte) RECORDS;
        System.arraycopy(seqFrame, 13, plain, 5, seqFrame.length - 13);
        return plain;
    }

    /** The host's clock status (Clock frame). */
    public record ClockStatus(long atNs, int source, boolean synced, int leap, long offsetNs,
                              long errorBoundNs, String detail) {
        /** Source codes. */
        public static final int UNKNOWN = 0;
        /** The kernel (adjtimex). */
        public static final int KERNEL = 1;
        /** chronyd. */
        public static final int CHRONY = 2;
        /** ptp4l / phc2sys. */
        public static final int PTP = 3;
        /** Injected by a test. */
        public static final int INJECTED = 4;
        /** Leap codes. */
        public static final int LEAP_NONE = 0;
        /** Insert pending. */
        public static final int LEAP_INSERT = 1;
        /** Delete pending. */
        public static final int LEAP_DELETE = 2;
        /** Unsynchronised. */
        public static final int LEAP_UNSYNCHRONISED = 3;
    }

    /** Appends a Clock frame. */
    public static void clock(Buffer out, ClockStatus c) {
        int at = out.begin(CLOCK);
        out.i64(c.atNs()).u8(c.source()).u8(c.synced() ? 1 : 0).u8(c.leap())
                .i64(c.offsetNs()).i64(c.errorBoundNs()).str(c.detail());
        out.end(at);
    }

    /** Appends a Counters frame of (id, value) pairs. */
    public static void counters(Buffer out, long atNs, long[][] values) {
        if (values.length > 255) {
            throw new IllegalArgumentException("at most 255 counters");
        }
        int at = out.begin(COUNTERS);
        out.i64(atNs).u8(values.length);
        for (long[] v : values) {
            out.u16((int) v[0]).i64(v[1]);
        }
        out.end(at);
    }

    /** Appends a Goodbye frame. */
    public static void goodbye(Buffer out) {
        out.end(out.begin(GOODBYE));
    }

    // ------------------------------------------------------------------------------------
    // Decoding

    /** A frame that does not decode; {@link #name} is the error name of the document. */
    public static final class ProtocolException extends IOException {
        private static final long serialVersionUID = 1L;
        private final String name;

        ProtocolException(String name, String detail) {
            super(name + ": " + detail);
            this.name = name;
        }

        /** {@code frame_too_large}, {@code truncated}, ... */
        public String name() {
            return name;
        }
    }

    /** A decoded frame: its type and what it holds. */
    public sealed interface Frame permits HelloFrame, RecordsFrame, SeqRecordsFrame, ClockFrame,
            CountersFrame, GoodbyeFrame, WelcomeFrame, RejectFrame, AckFrame {}

    /** Hello as received. */
    public record HelloFrame(int version, Hello hello) implements Frame {}

    /** One record of a Records frame. */
    public record Record(int hop, int publisher, int stream, long sequence, long stampNs,
                         int metricCount, long intendedNs, byte[] otelTraceId) {}

    /** Records. */
    public record RecordsFrame(List<Record> records) implements Frame {}

    /** SeqRecords (version 2): records frame number {@code seq} of the exporter instance. */
    public record SeqRecordsFrame(long seq, List<Record> records) implements Frame {}

    /** Clock. */
    public record ClockFrame(ClockStatus status) implements Frame {}

    /** Counters: id to value, in frame order. */
    public record CountersFrame(long atNs, long[][] values) implements Frame {
        /** The value of counter {@code id}, 0 when absent. */
        public long get(int id) {
            for (long[] v : values) {
                if (v[0] == id) {
                    return v[1];
                }
            }
            return 0;
        }
    }

    /** Goodbye. */
    public record GoodbyeFrame() implements Frame {}

    /**
     * Welcome: the connection's version, the run id and (version 2; 0 in version 1) the
     * highest SeqRecords number of this instance the collector holds durably.
     */
    public record WelcomeFrame(int version, String runId, long resumeSeq) implements Frame {}

    /** Reject: a code and a reason. */
    public record RejectFrame(int code, String reason) implements Frame {}

    /** Ack (version 2): every SeqRecords frame of the instance up to {@code seq} is durable. */
    public record AckFrame(long seq) implements Frame {}

    /** Reads one whole frame from {@code in}. */
    public static Frame read(InputStream in) throws IOException {
        return read(in, MAX_FRAME_LEN);
    }

    /**
     * The largest frame a collector sends: a version 2 Welcome with a run id of 1024 bytes
     * (type, version, string length, string, {@code resume_seq}); a Reject with a reason of
     * 1024 bytes, like a version 1 Welcome, is 8 bytes shorter.
     */
    public static final int MAX_COLLECTOR_FRAME_LEN = 1 + 2 + 2 + MAX_STRING_LEN + 8;

    /**
     * Reads one whole frame of at most {@code maxLen} bytes (type byte and body) from {@code
     * in}; a longer one is refused as {@code frame_too_large} before its body is read.
     */
    public static Frame read(InputStream in, int maxLen) throws IOException {
        byte[] lenBytes = readFully(in, 4);
        long len = Bytes.getI32(lenBytes, 0) & 0xFFFFFFFFL;
        if (len == 0) {
            throw new ProtocolException("empty_frame", "length 0");
        }
        if (len > Math.min(maxLen, MAX_FRAME_LEN)) {
            throw new ProtocolException("frame_too_large", len + " bytes");
        }
        byte[] frame = readFully(in, (int) len);
        return decode(frame[0] & 0xFF, Arrays.copyOfRange(frame, 1, frame.length));
    }

    private static byte[] readFully(InputStream in, int n) throws IOException {
        byte[] b = in.readNBytes(n);
        if (b.length < n) {
            throw new EOFException("connection closed after " + b.length + " of " + n + " bytes");
        }
        return b;
    }

    /** Decodes the body of a frame of {@code type}. */
    public static Frame decode(int type, byte[] body) throws ProtocolException {
        Reader r = new Reader(body);
        Frame f;
        switch (type) {
            case HELLO -> {
                byte[] magic = r.take(8);
                if (!Arrays.equals(magic, HELLO_MAGIC)) {
                    throw new ProtocolException("bad_magic", "hello magic");
                }
                int version = r.u16();
                if (version < 1 || version > VERSION) {
                    throw new ProtocolException("unsupported_version", "version " + version);
                }
                long id = r.i64();
                String host = r.str();
                String process = r.str();
                String software = r.str();
                String token = r.str();
                int n = r.u8();
                if (n < 1 || n > MAX_HOPS) {
                    throw new ProtocolException("bad_count", n + " hops");
                }
                List<Hop> hops = new ArrayList<>();
                for (int i = 0; i < n; i++) {
                    hops.add(new Hop(r.u8(), r.str()));
                }
                f = new HelloFrame(version, new Hello(id, host, process, software, token, hops));
            }
            case RECORDS -> f = new RecordsFrame(records(r));
            case SEQ_RECORDS -> {
                long seq = r.i64();
                f = new SeqRecordsFrame(seq, records(r));
            }
            case CLOCK -> f = new ClockFrame(new ClockStatus(r.i64(), r.u8(), r.u8() != 0, r.u8(), r.i64(),
                    r.i64(), r.str()));
            case COUNTERS -> {
                long at = r.i64();
                int n = r.u8();
                long[][] values = new long[n][];
                for (int i = 0; i < n; i++) {
                    values[i] = new long[] {r.u16(), r.i64()};
                }
                f = new CountersFrame(at, values);
            }
            case GOODBYE -> f = new GoodbyeFrame();
            case WELCOME -> {
                int version = r.u16();
                String run = r.str();
                f = new WelcomeFrame(version, run, version >= 2 ? r.i64() : 0);
            }
            case REJECT -> f = new RejectFrame(r.u16(), r.str());
            case ACK -> f = new AckFrame(r.i64());
            default -> throw new ProtocolException("unknown_type", String.format("type 0x%02x", type));
        }
        if (r.p != body.length) {
            throw new ProtocolException("trailing_bytes", (body.length - r.p) + " bytes left");
        }
        return f;
    }

    /** The count and records of a Records or SeqRecords body. */
    private static List<Record> records(Reader r) throws ProtocolException {
        long n = r.i32() & 0xFFFFFFFFL;
        if (n < 1 || n > MAX_RECORDS_PER_FRAME) {
            throw new ProtocolException("bad_count", n + " records");
        }
        List<Record> records = new ArrayList<>();
        for (long i = 0; i < n; i++) {
            int flags = r.u8();
            if ((flags & ~1) != 0) {
                throw new ProtocolException("reserved_bits", "record flags " + flags);
            }
            int hop = r.u8();
            int publisher = r.u16();
            int stream = r.i32();
            long sequence = r.i64();
            long stamp = r.i64();
            int metrics = r.i32();
            long intended = r.i64();
            byte[] id = (flags & 1) != 0 ? r.take(16) : null;
            records.add(new Record(hop, publisher, stream, sequence, stamp, metrics, intended, id));
        }
        return records;
    }

    private static final class Reader {
        final byte[] b;
        int p;

        Reader(byte[] b) {
            this.b = b;
        }

        byte[] take(int n) throws ProtocolException {
            if (b.length - p < n) {
                throw new ProtocolException("truncated", "body ends early");
            }
            byte[] out = Arrays.copyOfRange(b, p, p + n);
            p += n;
            return out;
        }

        int u8() throws ProtocolException {
            return take(1)[0] & 0xFF;
        }

        int u16() throws ProtocolException {
            return Bytes.getU16(take(2), 0);
        }

        int i32() throws ProtocolException {
            return Bytes.getI32(take(4), 0);
        }

        long i64() throws ProtocolException {
            return Bytes.getI64(take(8), 0);
        }

        String str() throws ProtocolException {
            int n = u16();
            if (n > MAX_STRING_LEN) {
                throw new ProtocolException("bad_string", n + " bytes");
            }
            byte[] u = take(n);
            var dec = StandardCharsets.UTF_8.newDecoder();
            try {
                return dec.decode(java.nio.ByteBuffer.wrap(u)).toString();
            } catch (java.nio.charset.CharacterCodingException e) {
                throw new ProtocolException("bad_string", "not UTF-8");
            }
        }
    }
}
