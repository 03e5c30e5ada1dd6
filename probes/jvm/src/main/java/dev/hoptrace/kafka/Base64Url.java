package dev.hoptrace.kafka;

/**
 * Unpadded base64url (RFC 4648 section 5) with the canonical checks of the text form: only
 * the 64 alphabet characters, a length that is not 1 modulo 4, and zero unused low bits in
 * the last character, so each byte string has exactly one text.
 */
final class Base64Url {
    private Base64Url() {}

    private static final char[] ALPHABET =
            "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".toCharArray();
    private static final byte[] VALUE = new byte[128];

    static {
        java.util.Arrays.fill(VALUE, (byte) -1);
        for (int i = 0; i < ALPHABET.length; i++) {
            VALUE[ALPHABET[i]] = (byte) i;
        }
    }

    static String encode(byte[] in) {
        StringBuilder s = new StringBuilder((in.length * 4 + 2) / 3);
        int i = 0;
        for (; i + 3 <= in.length; i += 3) {
            int v = (in[i] & 0xFF) << 16 | (in[i + 1] & 0xFF) << 8 | (in[i + 2] & 0xFF);
            s.append(ALPHABET[v >>> 18]).append(ALPHABET[(v >>> 12) & 63])
                    .append(ALPHABET[(v >>> 6) & 63]).append(ALPHABET[v & 63]);
        }
        int rest = in.length - i;
        if (rest == 1) {
            int v = (in[i] & 0xFF) << 16;
            s.append(ALPHABET[v >>> 18]).append(ALPHABET[(v >>> 12) & 63]);
        } else if (rest == 2) {
            int v = (in[i] & 0xFF) << 16 | (in[i + 1] & 0xFF) << 8;
            s.append(ALPHABET[v >>> 18]).append(ALPHABET[(v >>> 12) & 63]).append(ALPHABET[(v >>> 6) & 63]);
        }
        return s.toString();
    }

    /** Decodes {@code s} from index {@code from}; null when it is not canonical base64url. */
    static byte[] decodeCanonical(String s, int from) {
        int n = s.length() - from;
        if (n % 4 == 1) {
            // Checked after the alphabet below would give the same answer; the order of the
            // two checks does not change the error name (both are bad_base64).
            return null;
        }
        int[] v = new int[n];
        for (int i = 0; i < n; i++) {
            char c = s.charAt(from + i);
            if (c >= 128 || VALUE[c] < 0) {
                return null;
            }
            v[i] = VALUE[c];
        }
        int full = n / 4;
        int rest = n % 4;
        byte[] out = new byte[full * 3 + (rest == 0 ? 0 : rest - 1)];
        int o = 0;
        int i = 0;
        for (int q = 0; q < full; q++, i += 4) {
            int x = v[i] << 18 | v[i + 1] << 12 | v[i + 2] << 6 | v[i + 3];
            out[o++] = (byte) (x >>> 16);
            out[o++] = (byte) (x >>> 8);
            out[o++] = (byte) x;
        }
        if (rest == 2) {
            if ((v[i + 1] & 0x0F) != 0) {
                return null;
            }
            out[o] = (byte) (v[i] << 2 | v[i + 1] >>> 4);
        } else if (rest == 3) {
            if ((v[i + 2] & 0x03) != 0) {
                return null;
            }
            int x = v[i] << 18 | v[i + 1] << 12 | v[i + 2] << 6;
            out[o++] = (byte) (x >>> 16);
            out[o] = (byte) (x >>> 8);
        }
        return out;
    }
}
