package dev.hoptrace.kafka;

/**
 * W3C {@code traceparent} values of version {@code 00}: {@code 00-<32 hex>-<16 hex>-<2 hex>},
 * lower-case hex, exactly 55 bytes. A valid one lends its trace id to a context that has
 * none ({@code docs/trace-format.md}, Carriers); an invalid one is ignored and counted.
 */
public final class Traceparent {
    /** Header name. */
    public static final String HEADER = "traceparent";

    private Traceparent() {}

    /** The trace id of a valid version-00 value, or null when the value is to be ignored. */
    public static byte[] traceId(byte[] v) {
        if (v == null || v.length != 55 || v[2] != '-' || v[35] != '-' || v[52] != '-') {
            return null;
        }
        int version = hexByte(v, 0);
        byte[] id = new byte[16];
        boolean idZero = true;
        for (int i = 0; i < 16; i++) {
            int b = hexByte(v, 3 + 2 * i);
            if (b < 0) {
                return null;
            }
            id[i] = (byte) b;
            idZero &= b == 0;
        }
        boolean parentZero = true;
        for (int i = 0; i < 8; i++) {
            int b = hexByte(v, 36 + 2 * i);
            if (b < 0) {
                return null;
            }
            parentZero &= b == 0;
        }
        if (version != 0 || hexByte(v, 53) < 0 || idZero || parentZero) {
            return null;
        }
        return id;
    }

    private static int hexByte(byte[] v, int at) {
        int hi = nibble(v[at]);
        int lo = nibble(v[at + 1]);
        return hi < 0 || lo < 0 ? -1 : hi << 4 | lo;
    }

    private static int nibble(byte c) {
        if (c >= '0' && c <= '9') {
            return c - '0';
        }
        if (c >= 'a' && c <= 'f') {
            return c - 'a' + 10;
        }
        return -1;
    }
}
