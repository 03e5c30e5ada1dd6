package dev.hoptrace.kafka;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.DeserializationFeature;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.math.BigInteger;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.stream.Stream;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestFactory;

/** Conformance with probe/testdata/trace-vectors.json: every valid and invalid vector. */
class TraceVectorsTest {
    static JsonNode vectors() throws IOException {
        ObjectMapper m = new ObjectMapper().enable(DeserializationFeature.USE_BIG_INTEGER_FOR_INTS);
        return m.readTree(TestPaths.repo().resolve("probe/testdata/trace-vectors.json").toFile());
    }

    /** A u64 or i64 JSON integer as the Java long with the same 64 bits; fails on anything wider. */
    static long bits64(JsonNode n) {
        assertTrue(n.isIntegralNumber(), "integer expected: " + n);
        BigInteger v = n.bigIntegerValue();
        assertTrue(v.bitLength() <= 64, "wider than 64 bits: " + v);
        return v.longValue();
    }

    static TraceContext context(JsonNode c) {
        TraceContext ctx = new TraceContext(c.get("publisher").intValue(), (int) bits64(c.get("stream")),
                bits64(c.get("sequence")), (int) bits64(c.get("metric_count")), bits64(c.get("intended_ns")));
        JsonNode id = c.get("otel_trace_id");
        if (!id.isNull()) {
            ctx.setOtelTraceId(Bytes.unhex(id.textValue()));
        }
        for (JsonNode s : c.get("stamps")) {
            assertTrue(ctx.pushStamp(s.get("hop").intValue(), bits64(s.get("ns"))));
        }
        return ctx;
    }

    @Test
    void theFileHasBothListsAndSixtyFourBitValuesSurviveExactly() throws IOException {
        JsonNode v = vectors();
        assertTrue(v.get("valid").size() >= 10, "valid vectors");
        assertTrue(v.get("invalid").size() >= 40, "invalid vectors");
        // A parser that goes through double would round these; the vectors use extremes.
        boolean sawHuge = false;
        for (JsonNode e : v.get("valid")) {
            BigInteger seq = e.get("context").get("sequence").bigIntegerValue();
            sawHuge |= seq.bitLength() > 53;
        }
        assertTrue(sawHuge, "some sequence needs more than 53 bits");
    }

    @TestFactory
    Stream<DynamicTest> validVectorsEncodeAndDecodeInEveryForm() throws IOException {
        List<DynamicTest> tests = new ArrayList<>();
        for (JsonNode e : vectors().get("valid")) {
            tests.add(DynamicTest.dynamicTest(e.get("name").textValue(), () -> {
                TraceContext ctx = context(e.get("context"));
                byte[] bin = Bytes.unhex(e.get("binary_hex").textValue());
                assertEquals(e.get("binary_hex").textValue(), Bytes.hex(ctx.encode()), "binary encoding");
                assertEquals(ctx, TraceContext.decode(bin), "binary decoding");
                assertEquals(bin.length, ctx.encodedLength());

                assertEquals(e.get("text").textValue(), ctx.toText(), "text encoding");
                assertEquals(ctx, TraceContext.fromText(e.get("text").textValue()), "text decoding");

                byte[] payload = Bytes.unhex(e.get("envelope_payload_hex").textValue());
                byte[] env = Bytes.unhex(e.get("envelope_hex").textValue());
                assertEquals(e.get("envelope_hex").textValue(), Bytes.hex(ctx.wrap(payload)), "envelope");
                TraceContext.Unwrapped u = TraceContext.unwrap(env);
                assertEquals(ctx, u.context());
                assertArrayEquals(payload, Arrays.copyOfRange(env, u.payloadOffset(), env.length));
            }));
        }
        return tests.stream();
    }

    @TestFactory
    Stream<DynamicTest> invalidVectorsFailWithTheNamedError() throws IOException {
        List<DynamicTest> tests = new ArrayList<>();
        for (JsonNode e : vectors().get("invalid")) {
            String form = e.get("form").textValue();
            String error = e.get("error").textValue();
            tests.add(DynamicTest.dynamicTest(form + ": " + e.get("name").textValue(), () -> {
                DecodeException ex = assertThrows(DecodeException.class, () -> {
                    switch (form) {
                        case "binary" -> TraceContext.decode(Bytes.unhex(e.get("input_hex").textValue()));
                        case "text" -> TraceContext.fromText(e.get("input_text").textValue());
                        case "envelope" -> TraceContext.unwrap(Bytes.unhex(e.get("input_hex").textValue()));
                        default -> throw new AssertionError("unknown form " + form);
                    }
                });
                assertEquals(error, ex.error().wireName(), e.get("description").textValue());
            }));
        }
        return tests.stream();
    }

    @Test
    void everyErrorNameOfTheDocumentIsExercised() throws IOException {
        List<String> seen = new ArrayList<>();
        for (JsonNode e : vectors().get("invalid")) {
            seen.add(e.get("error").textValue());
        }
        for (DecodeException.Error err : DecodeException.Error.values()) {
            assertTrue(seen.contains(err.wireName()), err.wireName() + " has a vector");
        }
    }
}
