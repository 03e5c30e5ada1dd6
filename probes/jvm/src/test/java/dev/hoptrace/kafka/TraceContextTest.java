package dev.hoptrace.kafka;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.SplittableRandom;
import org.junit.jupiter.api.Test;

class TraceContextTest {
    @Test
    void theDocumentExampleEncodes() {
        TraceContext c = new TraceContext(1, 2, 3, 50, 1_700_000_000_000_000_000L);
        c.pushStamp(0, 1_700_000_000_000_001_000L);
        assertEquals("01010100020000000300000000000000320000000000" + "2a36fe9c9717"
                + "00e8032a36fe9c9717", Bytes.hex(c.encode()));
    }

    @Test
    void appendingAStampAdds9BytesAndIncrementsN() throws Exception {
        TraceContext c = new TraceContext(1, 2, 3, 1, 10);
        byte[] before = c.encode();
        c.pushStamp(9, 77);
        byte[] after = c.encode();
        assertEquals(before.length + 9, after.length);
        assertEquals(before[1] + 1, after[1]);
        assertArrayEquals(Arrays.copyOfRange(before, 2, before.length), Arrays.copyOfRange(after, 2, before.length));
        assertEquals(c, TraceContext.decode(after));
    }

    @Test
    void theSeventeenthStampIsRefused() {
        TraceContext c = new TraceContext(1, 2, 3, 1, 10);
        for (int i = 0; i < 16; i++) {
            assertTrue(c.pushStamp(i, i));
        }
        byte[] full = c.encode();
        assertEquals(TraceContext.HEADER_LEN + 16 * 9, full.length);
        assertFalse(c.pushStamp(200, 1));
        assertArrayEquals(full, c.encode(), "unchanged");
    }

    @Test
    void theEncoderRefusesWhatTheFormatCannotHold() {
        assertThrows(IllegalArgumentException.class, () -> new TraceContext(65536, 0, 0, 0, 0));
        assertThrows(IllegalArgumentException.class, () -> new TraceContext(-1, 0, 0, 0, 0));
        TraceContext c = new TraceContext(0, 0, 0, 0, 0);
        assertThrows(IllegalArgumentException.class, () -> c.setOtelTraceId(new byte[16]));
        assertThrows(IllegalArgumentException.class, () -> c.setOtelTraceId(new byte[15]));
        assertThrows(IllegalArgumentException.class, () -> c.pushStamp(256, 0));
        assertThrows(IllegalArgumentException.class, () -> c.pushStamp(-1, 0));
    }

    @Test
    void randomContextsRoundTripInEveryForm() throws Exception {
        SplittableRandom r = new SplittableRandom(7);
        for (int i = 0; i < 2000; i++) {
            TraceContext c = new TraceContext(r.nextInt(65536), r.nextInt(), r.nextLong(), r.nextInt(), r.nextLong());
            if (r.nextBoolean()) {
                byte[] id = new byte[16];
                id[r.nextInt(16)] = (byte) (1 + r.nextInt(255));
                c.setOtelTraceId(id);
            }
            int n = r.nextInt(17);
            for (int s = 0; s < n; s++) {
                c.pushStamp(r.nextInt(256), r.nextLong());
            }
            assertEquals(c, TraceContext.decode(c.encode()));
            assertEquals(c, TraceContext.fromText(c.toText()));
            byte[] payload = new byte[r.nextInt(5)];
            assertEquals(c, TraceContext.unwrap(c.wrap(payload)).context());
        }
    }

    @Test
    void garbageNeverThrowsAnythingButDecodeException() {
        SplittableRandom r = new SplittableRandom(11);
        for (int i = 0; i < 20000; i++) {
            byte[] b = new byte[r.nextInt(200)];
            for (int j = 0; j < b.length; j++) {
                b[j] = (byte) r.nextInt(256);
            }
            if (b.length > 1 && r.nextBoolean()) {
                b[0] = 1;
            }
            try {
                TraceContext.decode(b);
            } catch (DecodeException expected) {
                // named error
            }
            try {
                TraceContext.fromText("ht1." + new String(b, StandardCharsets.ISO_8859_1));
            } catch (DecodeException expected) {
                // named error
            }
        }
    }

    @Test
    void traceparentFollowsTheRulesOfTheDocument() {
        String good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assertEquals("4bf92f3577b34da6a3ce929d0e0e4736", Bytes.hex(Traceparent.traceId(bytes(good))));
        assertEquals("4bf92f3577b34da6a3ce929d0e0e4736",
                Bytes.hex(Traceparent.traceId(bytes(good.substring(0, 53) + "ff"))), "any flags");
        for (String bad : new String[] {
            "", good.toUpperCase(), good + " ", good.substring(1),
            "01" + good.substring(2),
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            good.replace('-', '_'),
            good.substring(0, 53) + "0g",
        }) {
            assertNull(Traceparent.traceId(bytes(bad)), bad);
        }
        assertNull(Traceparent.traceId(null));
    }

    private static byte[] bytes(String s) {
        return s.getBytes(StandardCharsets.US_ASCII);
    }
}
