package dev.hoptrace.kafka;

import java.util.Arrays;

/**
 * The hoptrace trace context of {@code docs/trace-format.md}, version 1: the trace key
 * (publisher, stream, sequence), the metric count, the intended send time, an optional
 * OpenTelemetry trace id and up to 16 hop stamps.
 *
 * <p>Unsigned wire fields are held in Java integers of the same width: {@code stream} and
 * {@code metricCount} are u32 in an {@code int}, {@code sequence} is u64 in a {@code long}
 * (read them with {@link Integer#toUnsignedLong} and {@link Long#toUnsignedString}); a hop id
 * is 0 to 255 in an {@code int}.
 *
 * <p>Forms: {@link #encode()} / {@link #decode(byte[])} (binary, the Kafka header value),
 * {@link #toText()} / {@link #fromText(String)} (MQTT v5 user property) and
 * {@link #wrap(byte[])} / {@link #unwrap(byte[])} (payload envelope).
 */
public final class TraceContext {
    /** Version byte of the binary form. */
    public static final int VERSION = 1;
    /** Most stamps one context holds. */
    public static final int MAX_STAMPS = 16;
    /** Length of the fixed header. */
    public static final int HEADER_LEN = 28;
    /** Length of one stamp. */
    public static final int STAMP_LEN = 9;
    /** Length of a trace id. */
    public static final int TRACE_ID_LEN = 16;
    /** Longest binary form: 28 + 16 + 16 * 9. */
    public static final int MAX_LEN = HEADER_LEN + TRACE_ID_LEN + MAX_STAMPS * STAMP_LEN;
    /** Prefix of the text form. */
    public static final String TEXT_PREFIX = "ht1.";

    private static final int INFO_COUNT_MASK = 0x1F;
    private static final int INFO_RESERVED_MASK = 0x60;
    private static final int INFO_TRACE_ID = 0x80;
    private static final byte[] MAGIC = {(byte) 0xFF, 'H', 'T', '1'};

    int publisher;
    int stream;
    long sequence;
    int metricCount;
    long intendedNs;
    /** The trace id, or null. */
    byte[] otelTraceId;
    final int[] stampHops = new int[MAX_STAMPS];
    final long[] stampNs = new long[MAX_STAMPS];
    int stampCount;

    private TraceContext() {}

    /**
     * A context without stamps nor trace id.
     *
     * @param publisher u16 publisher id
     * @param stream u32 stream id (bit pattern)
     * @param sequence u64 sequence (bit pattern)
     * @param metricCount u32 metric count (bit pattern)
     * @param intendedNs intended send time, CLOCK_REALTIME ns
     * @throws IllegalArgumentException when publisher is not a u16
     */
    public TraceContext(int publisher, int stream, long sequence, int metricCount, long intendedNs) {
        if (publisher < 0 || publisher > 0xFFFF) {
            throw new IllegalArgumentException("publisher " + publisher + " is not a u16");
        }
        this.publisher = publisher;
        this.stream = stream;
        this.sequence = sequence;
        this.metricCount = metricCount;
        this.intendedNs = intendedNs;
    }

    /** u16 publisher id. */
    public int publisher() {
        return publisher;
    }

    /** u32 stream id, as an int bit pattern. */
    public int stream() {
        return stream;
    }

    /** u64 sequence, as a long bit pattern. */
    public long sequence() {
        return sequence;
    }

    /** u32 metric count, as an int bit pattern. */
    public int metricCount() {
        return metricCount;
    }

    /** Intended send time, ns since the Unix epoch. */
    public long intendedNs() {
        return intendedNs;
    }

    /** A copy of the OpenTelemetry trace id, or null. */
    public byte[] otelTraceId() {
        return otelTraceId == null ? null : otelTraceId.clone();
    }

    /** Whether the context carries a trace id. */
    public boolean hasOtelTraceId() {
        return otelTraceId != null;
    }

    /**
     * Sets the trace id.
     *
     * @param id 16 bytes, not all zero, or null to remove it
     * @throws IllegalArgumentException for another length or an all-zero id
     */
    public void setOtelTraceId(byte[] id) {
        if (id != null && (id.length != TRACE_ID_LEN || allZero(id, 0, TRACE_ID_LEN))) {
            throw new IllegalArgumentException("a trace id is 16 bytes, not all zero");
        }
        otelTraceId = id == null ? null : id.clone();
    }

    /** Stamps held. */
    public int stampCount() {
        return stampCount;
    }

    /** Hop id (0 to 255) of stamp {@code i}. */
    public int stampHop(int i) {
        checkStamp(i);
        return stampHops[i];
    }

    /** Time (ns) of stamp {@code i}. */
    public long stampNs(int i) {
        checkStamp(i);
        return stampNs[i];
    }

    private void checkStamp(int i) {
        if (i < 0 || i >= stampCount) {
            throw new IndexOutOfBoundsException(i);
        }
    }

    /**
     * Appends a stamp (the in-band half of stamping a hop).
     *
     * @return false, leaving the context unchanged, when it already holds 16 stamps
     * @throws IllegalArgumentException when {@code hop} is not 0 to 255
     */
    public boolean pushStamp(int hop, long ns) {
        checkHop(hop);
        if (stampCount == MAX_STAMPS) {
            return false;
        }
        stampHops[stampCount] = hop;
        stampNs[stampCount] = ns;
        stampCount++;
        return true;
    }

    /** The index of the last stamp of {@code hop}, or -1. */
    public int lastStampOf(int hop) {
        for (int i = stampCount - 1; i >= 0; i--) {
            if (stampHops[i] == hop) {
                return i;
            }
        }
        return -1;
    }

    static void checkHop(int hop) {
        if (hop < 0 || hop > 255) {
            throw new IllegalArgumentException("hop id " + hop + " is not 0 to 255");
        }
    }

    // ------------------------------------------------------------------------------------
    // Binary form

    /** Length of the binary form. */
    public int encodedLength() {
        return HEADER_LEN + (otelTraceId != null ? TRACE_ID_LEN : 0) + STAMP_LEN * stampCount;
    }

    /** The binary form. */
    public byte[] encode() {
        byte[] out = new byte[encodedLength()];
        encodeInto(out, 0);
        return out;
    }

    /** Writes the binary form at {@code out[at]}; returns the length written. */
    public int encodeInto(byte[] out, int at) {
        int p = at;
        out[p++] = VERSION;
        out[p++] = (byte) (stampCount | (otelTraceId != null ? INFO_TRACE_ID : 0));
        p = Bytes.putU16(out, p, publisher);
        p = Bytes.putI32(out, p, stream);
        p = Bytes.putI64(out, p, sequence);
        p = Bytes.putI32(out, p, metricCount);
        p = Bytes.putI64(out, p, intendedNs);
        if (otelTraceId != null) {
            System.arraycopy(otelTraceId, 0, out, p, TRACE_ID_LEN);
            p += TRACE_ID_LEN;
        }
        for (int i = 0; i < stampCount; i++) {
            out[p++] = (byte) stampHops[i];
            p = Bytes.putI64(out, p, stampNs[i]);
        }
        return p - at;
    }

    /** Decodes a whole array as one binary form. */
    public static TraceContext decode(byte[] in) throws DecodeException {
        return decode(in, 0, in.length);
    }

    /**
     * Decodes {@code len} bytes at {@code in[off]} as exactly one binary form, checking the
     * rules of the document in its order.
     */
    public static TraceContext decode(byte[] in, int off, int len) throws DecodeException {
        if (len < HEADER_LEN) {
            throw new DecodeException(DecodeException.Error.TRUNCATED);
        }
        if (in[off] != VERSION) {
            throw new DecodeException(DecodeException.Error.UNSUPPORTED_VERSION);
        }
        int info = in[off + 1] & 0xFF;
        int n = info & INFO_COUNT_MASK;
        if (n > MAX_STAMPS) {
            throw new DecodeException(DecodeException.Error.TOO_MANY_STAMPS);
        }
        if ((info & INFO_RESERVED_MASK) != 0) {
            throw new DecodeException(DecodeException.Error.RESERVED_BITS);
        }
        boolean hasId = (info & INFO_TRACE_ID) != 0;
        int expected = HEADER_LEN + (hasId ? TRACE_ID_LEN : 0) + STAMP_LEN * n;
        if (len < expected) {
            throw new DecodeException(DecodeException.Error.TRUNCATED);
        }
        if (len > expected) {
            throw new DecodeException(DecodeException.Error.TRAILING_BYTES);
        }
        if (hasId && allZero(in, off + HEADER_LEN, TRACE_ID_LEN)) {
            throw new DecodeException(DecodeException.Error.INVALID_TRACE_ID);
        }
        TraceContext c = new TraceContext();
        int p = off + 2;
        c.publisher = Bytes.getU16(in, p);
        c.stream = Bytes.getI32(in, p + 2);
        c.sequence = Bytes.getI64(in, p + 6);
        c.metricCount = Bytes.getI32(in, p + 14);
        c.intendedNs = Bytes.getI64(in, p + 18);
        p = off + HEADER_LEN;
        if (hasId) {
            c.otelTraceId = Arrays.copyOfRange(in, p, p + TRACE_ID_LEN);
            p += TRACE_ID_LEN;
        }
        for (int i = 0; i < n; i++) {
            c.stampHops[i] = in[p] & 0xFF;
            c.stampNs[i] = Bytes.getI64(in, p + 1);
            p += STAMP_LEN;
        }
        c.stampCount = n;
        return c;
    }

    private static boolean allZero(byte[] b, int off, int len) {
        for (int i = off; i < off + len; i++) {
            if (b[i] != 0) {
                return false;
            }
        }
        return true;
    }

    // ------------------------------------------------------------------------------------
    // Text form

    /** The text form: {@code ht1.} and the binary form in unpadded base64url. */
    public String toText() {
        return TEXT_PREFIX + Base64Url.encode(encode());
    }

    /** Decodes a text form. */
    public static TraceContext fromText(String text) throws DecodeException {
        if (!text.startsWith(TEXT_PREFIX)) {
            throw new DecodeException(DecodeException.Error.BAD_TEXT_PREFIX);
        }
        byte[] bin = Base64Url.decodeCanonical(text, TEXT_PREFIX.length());
        if (bin == null) {
            throw new DecodeException(DecodeException.Error.BAD_BASE64);
        }
        return decode(bin);
    }

    // ------------------------------------------------------------------------------------
    // Envelope form

    /** The envelope: magic, length, binary form, then {@code payload} unchanged. */
    public byte[] wrap(byte[] payload) {
        int len = encodedLength();
        byte[] out = new byte[5 + len + payload.length];
        System.arraycopy(MAGIC, 0, out, 0, 4);
        out[4] = (byte) len;
        encodeInto(out, 5);
        System.arraycopy(payload, 0, out, 5 + len, payload.length);
        return out;
    }

    /** A context taken out of an envelope, and where the payload starts. */
    public record Unwrapped(TraceContext context, int payloadOffset) {}

    /** Reads the context in front of an enveloped message. */
    public static Unwrapped unwrap(byte[] message) throws DecodeException {
        if (message.length < 4
                || message[0] != MAGIC[0]
                || message[1] != MAGIC[1]
                || message[2] != MAGIC[2]
                || message[3] != MAGIC[3]) {
            throw new DecodeException(DecodeException.Error.NOT_ENVELOPED);
        }
        if (message.length < 5) {
            throw new DecodeException(DecodeException.Error.TRUNCATED);
        }
        int len = message[4] & 0xFF;
        if (message.length - 5 < len) {
            throw new DecodeException(DecodeException.Error.TRUNCATED);
        }
        return new Unwrapped(decode(message, 5, len), 5 + len);
    }

    // ------------------------------------------------------------------------------------

    /** A deep copy. */
    public TraceContext copy() {
        TraceContext c = new TraceContext();
        c.publisher = publisher;
        c.stream = stream;
        c.sequence = sequence;
        c.metricCount = metricCount;
        c.intendedNs = intendedNs;
        c.otelTraceId = otelTraceId == null ? null : otelTraceId.clone();
        System.arraycopy(stampHops, 0, c.stampHops, 0, stampCount);
        System.arraycopy(stampNs, 0, c.stampNs, 0, stampCount);
        c.stampCount = stampCount;
        return c;
    }

    @Override
    public boolean equals(Object o) {
        if (!(o instanceof TraceContext c)) {
            return false;
        }
        return publisher == c.publisher
                && stream == c.stream
                && sequence == c.sequence
                && metricCount == c.metricCount
                && intendedNs == c.intendedNs
                && Arrays.equals(otelTraceId, c.otelTraceId)
                && stampCount == c.stampCount
                && Arrays.equals(stampHops, 0, stampCount, c.stampHops, 0, stampCount)
                && Arrays.equals(stampNs, 0, stampCount, c.stampNs, 0, stampCount);
    }

    @Override
    public int hashCode() {
        return Long.hashCode(sequence) * 31 + stream * 17 + publisher;
    }

    @Override
    public String toString() {
        StringBuilder s = new StringBuilder("TraceContext{publisher=").append(publisher)
                .append(", stream=").append(Integer.toUnsignedString(stream))
                .append(", sequence=").append(Long.toUnsignedString(sequence))
                .append(", metric_count=").append(Integer.toUnsignedString(metricCount))
                .append(", intended_ns=").append(intendedNs);
        if (otelTraceId != null) {
            s.append(", otel_trace_id=").append(Bytes.hex(otelTraceId));
        }
        s.append(", stamps=[");
        for (int i = 0; i < stampCount; i++) {
            s.append(i == 0 ? "" : ", ").append(stampHops[i]).append('@').append(stampNs[i]);
        }
        return s.append("]}").toString();
    }
}
