package dev.hoptrace.kafka;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.nio.charset.StandardCharsets;
import java.util.List;
import org.junit.jupiter.api.Test;

/**
 * Frame encoding against the tables of docs/collector-protocol.md: each expected byte string
 * is written out field by field from the document, independently of the encoder.
 */
class ProtocolTest {
    /** Builds expected bytes field by field, little-endian. */
    static final class Expect {
        final ByteArrayOutputStream b = new ByteArrayOutputStream();

        Expect u8(int v) {
            b.write(v);
            return this;
        }

        Expect le(long v, int n) {
            for (int i = 0; i < n; i++) {
                b.write((int) (v >>> (8 * i)) & 0xFF);
            }
            return this;
        }

        Expect raw(String ascii) {
            b.writeBytes(ascii.getBytes(StandardCharsets.UTF_8));
            return this;
        }

        Expect str(String s) {
            byte[] u = s.getBytes(StandardCharsets.UTF_8);
            le(u.length, 2);
            b.writeBytes(u);
            return this;
        }

        /** The frame: u32 len (type included), type, body. */
        byte[] frame(int type) {
            byte[] body = b.toByteArray();
            Expect f = new Expect().le(body.length + 1, 4).u8(type);
            f.b.writeBytes(body);
            return f.b.toByteArray();
        }
    }

    @Test
    void helloFollowsTheTable() {
        Protocol.Buffer buf = new Protocol.Buffer(16);
        Protocol.hello(buf, new Protocol.Hello(0x0123456789ABCDEFL, "host-a", "MirrorMaker", "sw 1", "tok",
                List.of(new Protocol.Hop(2, "mm2_consume"), new Protocol.Hop(3, "mm2_produce"))));
        byte[] expected = new Expect().raw("HOPTRACE").le(2, 2).le(0x0123456789ABCDEFL, 8)
                .str("host-a").str("MirrorMaker").str("sw 1").str("tok")
                .u8(2).u8(2).str("mm2_consume").u8(3).str("mm2_produce").frame(0x01);
        assertEquals(Bytes.hex(expected), Bytes.hex(buf.toByteArray()), "version 2 by default");
        Protocol.Buffer v1 = new Protocol.Buffer(16);
        Protocol.hello(v1, 1, new Protocol.Hello(0x0123456789ABCDEFL, "host-a", "MirrorMaker", "sw 1", "tok",
                List.of(new Protocol.Hop(2, "mm2_consume"), new Protocol.Hop(3, "mm2_produce"))));
        expected[13] = 1; // the version's low byte: 4 length + 1 type + 8 magic
        assertEquals(Bytes.hex(expected), Bytes.hex(v1.toByteArray()));
        assertThrows(IllegalArgumentException.class, () -> Protocol.hello(new Protocol.Buffer(16), 3,
                new Protocol.Hello(1, "h", "p", "s", "", List.of(new Protocol.Hop(1, "a")))));
    }

    @Test
    void seqRecordsCarryTheirNumberBeforeTheCountAndBecomePlainRecordsForVersion1() throws Exception {
        TraceContext a = new TraceContext(7, 3, 11L, 50, 1_700_000_000_000_000_000L);
        RecordQueue q = new RecordQueue(8);
        q.offer(a, 4, 1_700_000_000_000_001_000L);
        Protocol.Buffer buf = new Protocol.Buffer(16);
        int at = Protocol.beginSeqRecords(buf, 0x0102030405L);
        int n = q.drainInto(buf, 100, allHops());
        Protocol.endRecords(buf, at, n);
        Expect e = new Expect().le(0x0102030405L, 8).le(1, 4);
        e.u8(0).u8(4).le(7, 2).le(3, 4).le(11L, 8).le(1_700_000_000_000_001_000L, 8).le(50, 4)
                .le(1_700_000_000_000_000_000L, 8);
        byte[] expected = e.frame(0x07);
        assertEquals(Bytes.hex(expected), Bytes.hex(buf.toByteArray()));
        Protocol.SeqRecordsFrame f = assertInstanceOf(Protocol.SeqRecordsFrame.class,
                Protocol.read(new ByteArrayInputStream(expected)));
        assertEquals(0x0102030405L, f.seq());
        assertEquals(1, f.records().size());
        assertEquals(11L, f.records().get(0).sequence());
        // The same records, unnumbered.
        Expect plain = new Expect().le(1, 4);
        plain.u8(0).u8(4).le(7, 2).le(3, 4).le(11L, 8).le(1_700_000_000_000_001_000L, 8).le(50, 4)
                .le(1_700_000_000_000_000_000L, 8);
        assertEquals(Bytes.hex(plain.frame(0x02)), Bytes.hex(Protocol.plainRecords(expected)));
        Protocol.Buffer empty = new Protocol.Buffer(16);
        int at2 = Protocol.beginSeqRecords(empty, 9);
        Protocol.endRecords(empty, at2, 0);
        assertEquals(0, empty.length(), "an empty numbered frame is not written");
    }

    @Test
    void recordsAre36BytesOr52WithATraceId() {
        TraceContext a = new TraceContext(7, 0xFFFFFFFE, -2L, 50, 1_700_000_000_000_000_000L);
        TraceContext b = a.copy();
        byte[] id = Bytes.unhex("4bf92f3577b34da6a3ce929d0e0e4736");
        b.setOtelTraceId(id);
        RecordQueue q = new RecordQueue(8);
        q.offer(a, 4, 1_700_000_000_000_001_000L);
        q.offer(b, 255, -5L);
        Protocol.Buffer buf = new Protocol.Buffer(16);
        int at = Protocol.beginRecords(buf);
        int n = q.drainInto(buf, 100, allHops());
        Protocol.endRecords(buf, at, n);
        Expect e = new Expect().le(2, 4);
        // record 1: flags 0, hop 4, publisher 7, stream, sequence, stamp, metric_count, intended
        e.u8(0).u8(4).le(7, 2).le(0xFFFFFFFEL, 4).le(-2L, 8).le(1_700_000_000_000_001_000L, 8).le(50, 4)
                .le(1_700_000_000_000_000_000L, 8);
        e.u8(1).u8(255).le(7, 2).le(0xFFFFFFFEL, 4).le(-2L, 8).le(-5L, 8).le(50, 4)
                .le(1_700_000_000_000_000_000L, 8);
        e.b.writeBytes(id);
        byte[] expected = e.frame(0x02);
        assertEquals(5 + 4 + 36 + 52, expected.length);
        assertEquals(Bytes.hex(expected), Bytes.hex(buf.toByteArray()));
    }

    @Test
    void anEmptyRecordsFrameIsNotWritten() {
        Protocol.Buffer buf = new Protocol.Buffer(16);
        Protocol.goodbye(buf);
        int at = Protocol.beginRecords(buf);
        Protocol.endRecords(buf, at, 0);
        assertEquals("0100000006", Bytes.hex(buf.toByteArray()));
    }

    @Test
    void clockFollowsTheTable() {
        Protocol.Buffer buf = new Protocol.Buffer(16);
        Protocol.clock(buf, new Protocol.ClockStatus(-1L, 2, true, 1, -2004L, 6918L, "ref=7F000001"));
        byte[] expected = new Expect().le(-1L, 8).u8(2).u8(1).u8(1).le(-2004L, 8).le(6918L, 8)
                .str("ref=7F000001").frame(0x03);
        assertEquals(Bytes.hex(expected), Bytes.hex(buf.toByteArray()));
    }

    @Test
    void countersCarryTheDocumentedIds() {
        Counters c = new Counters();
        c.queueFull.add(2);
        c.dequeued.set(10);
        c.sent.set(9);
        c.sendFailed.set(1);
        c.reconnects.set(3);
        c.notTraced.add(4);
        c.badContext.add(5);
        c.stampsFull.add(6);
        c.badTraceparent.add(7);
        c.resent.set(8);
        c.evicted.set(9);
        c.lostUnacked.set(4);
        Counters.Snapshot s = c.snapshot(1);
        assertEquals(13, s.reported(), "dequeued + queue_full + queued");
        Protocol.Buffer buf = new Protocol.Buffer(16);
        Protocol.counters(buf, 42L, s.toWire());
        Expect e = new Expect().le(42L, 8).u8(12);
        long[][] want = {{1, 13}, {2, 2}, {3, 9}, {4, 1}, {5, 3}, {6, 4}, {7, 5}, {8, 6}, {9, 7}, {10, 8}, {11, 9},
            {12, 4}};
        for (long[] w : want) {
            e.le(w[0], 2).le(w[1], 8);
        }
        assertEquals(Bytes.hex(e.frame(0x04)), Bytes.hex(buf.toByteArray()));
        assertEquals(2 + 1 + 4, s.lost(), "queue_full + send_failed + lost_unacked");
    }

    @Test
    void goodbyeIsAnEmptyBody() {
        Protocol.Buffer buf = new Protocol.Buffer(16);
        Protocol.goodbye(buf);
        assertArrayEquals(new byte[] {1, 0, 0, 0, 6}, buf.toByteArray());
    }

    @Test
    void welcomeAndRejectDecode() throws Exception {
        byte[] welcome = new Expect().le(1, 2).str("run-7").frame(0x81);
        Protocol.WelcomeFrame w = assertInstanceOf(Protocol.WelcomeFrame.class,
                Protocol.read(new ByteArrayInputStream(welcome)));
        assertEquals(new Protocol.WelcomeFrame(1, "run-7", 0), w);
        byte[] welcome2 = new Expect().le(2, 2).str("run-8").le(77L, 8).frame(0x81);
        assertEquals(new Protocol.WelcomeFrame(2, "run-8", 77),
                Protocol.read(new ByteArrayInputStream(welcome2)), "version 2 carries resume_seq");
        assertEquals(new Protocol.AckFrame(-2L), Protocol.read(new ByteArrayInputStream(new Expect().le(-2L, 8)
                .frame(0x83))), "Ack: a u64");
        byte[] reject = new Expect().le(3, 2).str("hop \"x\" is not declared").frame(0x82);
        assertEquals(new Protocol.RejectFrame(3, "hop \"x\" is not declared"),
                Protocol.read(new ByteArrayInputStream(reject)));
    }

    @Test
    void malformedFramesAreNamed() {
        assertEquals("empty_frame", readError(new byte[] {0, 0, 0, 0}));
        assertEquals("frame_too_large", readError(new Expect().le((1 << 20) + 1, 4).b.toByteArray()));
        assertEquals("unknown_type", readError(new Expect().frame(0x7F)));
        assertEquals("truncated", readError(new Expect().le(1, 2).frame(0x81)));
        assertEquals("trailing_bytes", readError(new Expect().le(1, 2).str("r").u8(0).frame(0x81)));
        assertEquals("bad_string", readError(new Expect().le(1, 2).le(1025, 2).frame(0x81)));
        assertEquals("bad_magic", readError(new Expect().raw("HOPTRACX").frame(0x01)));
        assertEquals("unsupported_version", readError(new Expect().raw("HOPTRACE").le(3, 2).frame(0x01)));
        assertEquals("unsupported_version", readError(new Expect().raw("HOPTRACE").le(0, 2).frame(0x01)));
        assertEquals("truncated", readError(new Expect().le(2, 2).str("r").le(1, 4).frame(0x81)),
                "a version 2 Welcome without its resume_seq");
        assertEquals("truncated", readError(new Expect().le(1, 4).frame(0x83)));
        assertEquals("bad_count", readError(new Expect().le(0, 4).frame(0x02)));
        assertEquals("reserved_bits", readError(new Expect().le(1, 4).u8(2).frame(0x02)));
    }

    private static String readError(byte[] frame) {
        return assertThrows(Protocol.ProtocolException.class,
                () -> Protocol.read(new ByteArrayInputStream(frame))).name();
    }

    @Test
    void aCollectorFrameLongerThanTheLongestRejectIsRefusedBeforeItsBodyIsRead() throws Exception {
        Protocol.Buffer b = new Protocol.Buffer(64);
        int at = b.begin(Protocol.REJECT);
        b.u16(4).str("x".repeat(1024));
        b.end(at);
        byte[] longest = b.toByteArray();
        assertEquals(4 + Protocol.MAX_COLLECTOR_FRAME_LEN - 8, longest.length, "a version 1 Reject");
        assertInstanceOf(Protocol.RejectFrame.class,
                Protocol.read(new ByteArrayInputStream(longest), Protocol.MAX_COLLECTOR_FRAME_LEN));
        // A length just past the bound, and no body at all: refused on the length alone.
        byte[] header = {(byte) (Protocol.MAX_COLLECTOR_FRAME_LEN + 1), (byte) ((Protocol.MAX_COLLECTOR_FRAME_LEN + 1) >> 8),
            0, 0};
        Protocol.ProtocolException e = assertThrows(Protocol.ProtocolException.class,
                () -> Protocol.read(new ByteArrayInputStream(header), Protocol.MAX_COLLECTOR_FRAME_LEN));
        assertEquals("frame_too_large", e.name());
    }

    @Test
    void aBufferNeverGrowsPastItsLimit() {
        Protocol.Buffer b = new Protocol.Buffer(16, 100);
        for (int i = 0; i < 12; i++) {
            b.i64(i);
        }
        assertEquals(96, b.length());
        assertTrue(b.capacity() <= 100, "capacity " + b.capacity());
        assertThrows(IllegalStateException.class, () -> b.i64(12));
        assertEquals(96, b.length(), "nothing written past the limit");
    }

    @Test
    void stringsAreCutAt1024BytesOnACharacterBoundary() {
        String s = "a" + "\u00e9".repeat(600); // 1 + 1200 bytes
        byte[] cut = Protocol.utf8Cut(s);
        assertEquals(1023, cut.length, "1024 would split a 2-byte character");
        assertEquals(1024, Protocol.utf8Cut("b".repeat(5000)).length);
    }

    static long[] allHops() {
        return new long[] {-1L, -1L, -1L, -1L};
    }
}
