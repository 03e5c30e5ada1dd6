package dev.hoptrace.kafka;

/** Little-endian integers in byte arrays, and hex for messages and tests. */
final class Bytes {
    private Bytes() {}

    static int putU8(byte[] b, int p, int v) {
        b[p] = (byte) v;
        return p + 1;
    }

    static int putU16(byte[] b, int p, int v) {
        b[p] = (byte) v;
        b[p + 1] = (byte) (v >>> 8);
        return p + 2;
    }

    static int putI32(byte[] b, int p, int v) {
        b[p] = (byte) v;
        b[p + 1] = (byte) (v >>> 8);
        b[p + 2] = (byte) (v >>> 16);
        b[p + 3] = (byte) (v >>> 24);
        return p + 4;
    }

    static int putI64(byte[] b, int p, long v) {
        for (int i = 0; i < 8; i++) {
            b[p + i] = (byte) (v >>> (8 * i));
        }
        return p + 8;
    }

    static int getU16(byte[] b, int p) {
        return (b[p] & 0xFF) | (b[p + 1] & 0xFF) << 8;
    }

    static int getI32(byte[] b, int p) {
        return (b[p] & 0xFF) | (b[p + 1] & 0xFF) << 8 | (b[p + 2] & 0xFF) << 16 | (b[p + 3] & 0xFF) << 24;
    }

    static long getI64(byte[] b, int p) {
        long v = 0;
        for (int i = 7; i >= 0; i--) {
            v = v << 8 | (b[p + i] & 0xFF);
        }
        return v;
    }

    private static final char[] HEX = "0123456789abcdef".toCharArray();

    /** Lower-case hex, no separators. */
    static String hex(byte[] b) {
        char[] out = new char[b.length * 2];
        for (int i = 0; i < b.length; i++) {
            out[2 * i] = HEX[(b[i] >>> 4) & 0xF];
            out[2 * i + 1] = HEX[b[i] & 0xF];
        }
        return new String(out);
    }

    /** Parses hex (either case); throws IllegalArgumentException on anything else. */
    static byte[] unhex(String s) {
        if (s.length() % 2 != 0) {
            throw new IllegalArgumentException("odd hex length");
        }
        byte[] out = new byte[s.length() / 2];
        for (int i = 0; i < out.length; i++) {
            int hi = Character.digit(s.charAt(2 * i), 16);
            int lo = Character.digit(s.charAt(2 * i + 1), 16);
            if (hi < 0 || lo < 0) {
                throw new IllegalArgumentException("not hex: " + s);
            }
            out[i] = (byte) (hi << 4 | lo);
        }
        return out;
    }
}
