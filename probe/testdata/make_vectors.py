#!/usr/bin/env python3
"""Write trace-vectors.json, the test vectors of docs/trace-format.md.

    python3 probe/testdata/make_vectors.py

The output is deterministic: running the script twice gives the same file.
Every valid vector is produced by the reference implementation in
trace_format.py; every invalid vector is built by hand and checked to fail
with the error it names, and with that error only (see ``_one_condition``).
"""

from __future__ import annotations

import base64
import json
import struct
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import trace_format as tf  # noqa: E402
from trace_format import (  # noqa: E402
    I64_MAX,
    I64_MIN,
    U16_MAX,
    U32_MAX,
    U64_MAX,
    TraceContext,
    TraceFormatError,
)

OUT = HERE / "trace-vectors.json"

# The example of docs/trace-format.md, copied from the document byte for byte.
DOC_EXAMPLE_HEX = (
    "01 01 0100 02000000 0300000000000000 32000000 00002a36fe9c9717\n"
    "00 e8032a36fe9c9717"
)

T0 = 1_700_000_000_000_000_000  # 2023-11-14T22:13:20Z
TRACE_ID_A = bytes.fromhex("4bf92f3577b34da6a3ce929d0e0e4736")
TRACE_ID_B = bytes.fromhex("0af7651916cd43dd8448eb211c80319c")
TRACE_ID_ONE = bytes.fromhex("00000000000000000000000000000001")
TRACE_ID_FF = b"\xff" * 16

HOP_PUBLISH, HOP_BROKER, HOP_FLOW_IN, HOP_FLOW_OUT = 0, 1, 2, 3


def ctx(**kw) -> TraceContext:
    base = dict(
        publisher=1,
        stream=2,
        sequence=3,
        metric_count=50,
        intended_ns=T0,
        otel_trace_id=None,
        stamps=[],
    )
    base.update(kw)
    return TraceContext(**base)


def doc_example() -> TraceContext:
    return ctx(stamps=[(HOP_PUBLISH, T0 + 1000)])


# --------------------------------------------------------------------------- valid


def valid_vectors() -> list[dict]:
    cases = [
        (
            "doc_example",
            "The example of docs/trace-format.md: one stamp, no trace id, 37 bytes.",
            doc_example(),
            b'{"v":21.5}',
        ),
        (
            "zero_stamps",
            "Header only: N = 0, no trace id, 28 bytes (the smallest context).",
            ctx(sequence=0, metric_count=1),
            b"21.5",
        ),
        (
            "four_stamps",
            "Four stamps, no trace id: 64 bytes, the length the document quotes.",
            ctx(
                sequence=41,
                stamps=[
                    (HOP_PUBLISH, T0 + 1_000),
                    (HOP_BROKER, T0 + 250_000),
                    (HOP_FLOW_IN, T0 + 1_250_000),
                    (HOP_FLOW_OUT, T0 + 2_000_000),
                ],
            ),
            b"\x01\x02\x03",
        ),
        (
            "sixteen_stamps",
            "Sixteen stamps (the maximum N), no trace id: 172 bytes.",
            ctx(
                publisher=7,
                stream=100,
                sequence=1_000_000,
                metric_count=1,
                stamps=[(i, T0 + 1_000 * (i + 1)) for i in range(16)],
            ),
            b"payload",
        ),
        (
            "max_length",
            "Trace id and sixteen stamps: 188 bytes, the longest context; info byte 0x90.",
            ctx(
                otel_trace_id=TRACE_ID_FF,
                stamps=[(255 - i, T0 + 7 * i) for i in range(16)],
            ),
            b"x",
        ),
        (
            "trace_id_with_stamps",
            "W3C trace id present (info bit 7) followed by two stamps: 62 bytes.",
            ctx(
                sequence=12,
                otel_trace_id=TRACE_ID_A,
                stamps=[(HOP_PUBLISH, T0 + 10), (HOP_BROKER, T0 + 20)],
            ),
            b'{"temp":19.25,"unit":"C"}',
        ),
        (
            "trace_id_no_stamps",
            "Trace id present, no stamps: 44 bytes. Its text form has a length of 3 mod 4 "
            "after the prefix (contexts without trace id give 2 mod 4).",
            ctx(otel_trace_id=TRACE_ID_ONE),
            b"",
        ),
        (
            "negative_timestamps",
            "intended_ns and stamps before 1970 (negative, two's complement).",
            ctx(
                intended_ns=-1,
                stamps=[(HOP_PUBLISH, -1_000_000_000), (HOP_BROKER, -86_400_000_000_000)],
            ),
            b"neg",
        ),
        (
            "non_monotonic_stamps",
            "A stamp earlier than the one before it (clock step or another host); readers accept it.",
            ctx(
                stamps=[
                    (HOP_PUBLISH, T0 + 5_000_000),
                    (HOP_BROKER, T0 + 1_000),
                    (HOP_FLOW_IN, T0 - 3_000_000),
                ]
            ),
            b"late",
        ),
        (
            "extreme_max",
            "Every integer field at its maximum: u16, u32, u64, u32, i64; hop 255 and "
            "stamps at i64 max and i64 min.",
            ctx(
                publisher=U16_MAX,
                stream=U32_MAX,
                sequence=U64_MAX,
                metric_count=U32_MAX,
                intended_ns=I64_MAX,
                otel_trace_id=TRACE_ID_B,
                stamps=[(255, I64_MAX), (255, I64_MIN), (0, 0)],
            ),
            b"\xff" * 8,
        ),
        (
            "extreme_min",
            "publisher, stream and sequence 0, intended_ns i64 min, one stamp at i64 min.",
            ctx(
                publisher=0,
                stream=0,
                sequence=0,
                metric_count=1,
                intended_ns=I64_MIN,
                stamps=[(0, I64_MIN)],
            ),
            b"\x00",
        ),
        (
            "repeated_hop",
            "The same hop id twice in one context (a message that passed a hop twice); not an error.",
            ctx(
                stamps=[
                    (HOP_PUBLISH, T0 + 100),
                    (HOP_BROKER, T0 + 200),
                    (HOP_FLOW_IN, T0 + 300),
                    (HOP_BROKER, T0 + 400),
                ]
            ),
            b"republished",
        ),
        (
            "empty_envelope_payload",
            "An enveloped message whose original payload is empty: the envelope ends with the context.",
            ctx(sequence=99, stamps=[(HOP_PUBLISH, T0)]),
            b"",
        ),
        (
            "binary_envelope_payload",
            "A payload that is not UTF-8 (contains 0xFF, 0x00 and the envelope magic itself); "
            "it comes back unchanged.",
            ctx(sequence=100, stamps=[(HOP_PUBLISH, T0 + 1)]),
            bytes([0x00, 0xFF, 0xFE, 0x80]) + tf.ENVELOPE_MAGIC + bytes(range(0xF0, 0x100)),
        ),
        (
            "json_text_payload",
            "A JSON text payload carried in the envelope unchanged.",
            ctx(
                publisher=3,
                stream=17,
                sequence=5,
                metric_count=3,
                stamps=[(HOP_PUBLISH, T0 + 50), (HOP_BROKER, T0 + 90)],
            ),
            json.dumps(
                {"ts": "2023-11-14T22:13:20Z", "metrics": {"a": 1, "b": 2.5, "c": "ok"}},
                separators=(",", ":"),
            ).encode("utf-8"),
        ),
    ]
    out = []
    for name, description, c, payload in cases:
        binary = tf.encode_binary(c)
        assert len(binary) == c.binary_len
        out.append(
            {
                "name": name,
                "description": description,
                "context": tf.context_to_json(c),
                "binary_hex": binary.hex(),
                "text": tf.encode_text(c),
                "envelope_payload_hex": payload.hex(),
                "envelope_hex": tf.wrap_envelope(c, payload).hex(),
            }
        )
    return out


# --------------------------------------------------------------------------- invalid


def header(version=1, info=0, publisher=1, stream=2, sequence=3, metric_count=50, intended=T0):
    """A 28-byte header with arbitrary (possibly invalid) version and info bytes."""
    return struct.pack("<BBHIQIq", version, info, publisher, stream, sequence, metric_count, intended)


def stamps(n: int) -> bytes:
    return b"".join(struct.pack("<Bq", i % 256, T0 + i) for i in range(n))


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def envelope(binary: bytes, payload: bytes = b"", length: int | None = None) -> bytes:
    return tf.ENVELOPE_MAGIC + bytes([len(binary) if length is None else length]) + binary + payload


EXAMPLE = tf.encode_binary(doc_example())  # 37 bytes
EXAMPLE_TEXT = tf.encode_text(doc_example())
assert "_" in EXAMPLE_TEXT and "-" not in EXAMPLE_TEXT


B64URL = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


def invalid_vectors() -> list[dict]:
    b = "binary"
    t = "text"
    e = "envelope"
    # (name, description, form, input, error, single_condition)
    # single_condition is False for the vectors that deliberately meet several
    # conditions of the table, to pin the order in which they are checked.
    cases = [
        # ---- binary
        ("binary_empty", "No bytes at all.", b, b"", "truncated", True),
        ("binary_27_bytes", "One byte short of the 28-byte header.", b, header()[:27], "truncated", True),
        (
            "binary_version_0",
            "Version byte 0x00 on an otherwise well-formed 28-byte header.",
            b, header(version=0), "unsupported_version", True,
        ),
        (
            "binary_version_2",
            "Version byte 0x02 on an otherwise well-formed 28-byte header.",
            b, header(version=2), "unsupported_version", True,
        ),
        (
            "binary_17_stamps",
            "N = 17 with all 17 stamps present (181 bytes): only the stamp count is wrong.",
            b, header(info=17) + stamps(17), "too_many_stamps", True,
        ),
        (
            "binary_31_stamps",
            "N = 31 (all five count bits set) with all 31 stamps present (307 bytes).",
            b, header(info=31) + stamps(31), "too_many_stamps", True,
        ),
        (
            "binary_reserved_bit_5",
            "Info bit 5 set (0x21) on the document's example.",
            b, header(info=0x21) + EXAMPLE[28:], "reserved_bits", True,
        ),
        (
            "binary_reserved_bit_6",
            "Info bit 6 set (0x41) on the document's example.",
            b, header(info=0x41) + EXAMPLE[28:], "reserved_bits", True,
        ),
        (
            "binary_reserved_bits_5_and_6",
            "Info bits 5 and 6 set (0xE0) with a trace id present and no stamps.",
            b, header(info=0xE0) + TRACE_ID_A, "reserved_bits", True,
        ),
        (
            "binary_missing_last_stamp_byte",
            "The document's example without its last byte (36 of 37 bytes).",
            b, EXAMPLE[:-1], "truncated", True,
        ),
        (
            "binary_missing_trace_id",
            "Info bit 7 set but the 16-byte trace id is absent (28 bytes, 44 needed).",
            b, header(info=0x80), "truncated", True,
        ),
        (
            "binary_missing_stamps",
            "N = 4 but no stamp bytes follow the header.",
            b, header(info=4), "truncated", True,
        ),
        (
            "binary_one_trailing_byte",
            "The document's example followed by one extra byte (38 bytes, 37 announced).",
            b, EXAMPLE + b"\x00", "trailing_bytes", True,
        ),
        (
            "binary_trailing_stamp",
            "N = 0 but a whole 9-byte stamp follows the header.",
            b, header(info=0) + stamps(1), "trailing_bytes", True,
        ),
        (
            "binary_zero_trace_id",
            "Info bit 7 set and a trace id of 16 zero bytes, one stamp, correct length.",
            b, header(info=0x81) + bytes(16) + stamps(1), "invalid_trace_id", True,
        ),
        # ---- binary, several conditions at once: the first row of the table wins
        (
            "order_short_beats_version",
            "10 bytes with version 0x02: fewer than 28 bytes is checked before the version.",
            b, header(version=2)[:10], "truncated", False,
        ),
        (
            "order_version_beats_stamp_count",
            "Version 0x02 and N = 31 in a 28-byte header: the version is checked first.",
            b, header(version=2, info=0x7F), "unsupported_version", False,
        ),
        (
            "order_stamp_count_beats_reserved_bits",
            "N = 17 and reserved bits 5 and 6 set, 28 bytes: the stamp count is checked first.",
            b, header(info=0x71), "too_many_stamps", False,
        ),
        (
            "order_reserved_bits_beat_length",
            "Reserved bit 5 set, N = 2 but no stamps: reserved bits are checked before the length.",
            b, header(info=0x22), "reserved_bits", False,
        ),
        (
            "order_length_beats_zero_trace_id",
            "All-zero trace id followed by one trailing byte: the length is checked first.",
            b, header(info=0x80) + bytes(16) + b"\x00", "trailing_bytes", False,
        ),
        (
            "order_truncated_beats_zero_trace_id",
            "All-zero trace id, N = 1 but the stamp is missing: the length is checked first.",
            b, header(info=0x81) + bytes(16), "truncated", False,
        ),
        # ---- text
        ("text_empty", "The empty string has no prefix.", t, "", "bad_text_prefix", True),
        (
            "text_without_prefix",
            "The base64url of the document's example without the 'ht1.' prefix.",
            t, EXAMPLE_TEXT[4:], "bad_text_prefix", True,
        ),
        (
            "text_prefix_ht2",
            "Prefix 'ht2.' (a future version) in front of the document's example.",
            t, "ht2." + EXAMPLE_TEXT[4:], "bad_text_prefix", True,
        ),
        (
            "text_prefix_upper_case",
            "Prefix 'HT1.': the prefix is exactly the four characters 'ht1.'.",
            t, "HT1." + EXAMPLE_TEXT[4:], "bad_text_prefix", True,
        ),
        (
            "text_prefix_without_dot",
            "Prefix 'ht1' without the dot.",
            t, "ht1" + EXAMPLE_TEXT[4:], "bad_text_prefix", True,
        ),
        (
            "text_with_padding",
            "The document's example with the '==' padding of standard base64.",
            t, EXAMPLE_TEXT + "==", "bad_base64", True,
        ),
        (
            "text_with_slash",
            "The document's example in the standard alphabet ('/' for '_'), not base64url.",
            t, EXAMPLE_TEXT.replace("_", "/"), "bad_base64", True,
        ),
        (
            "text_with_plus",
            "A '+' in place of the first character after the prefix.",
            t, "ht1.+" + EXAMPLE_TEXT[5:], "bad_base64", True,
        ),
        (
            "text_with_space",
            "A space inside the base64url characters.",
            t, EXAMPLE_TEXT[:20] + " " + EXAMPLE_TEXT[20:], "bad_base64", True,
        ),
        (
            "text_length_1_mod_4",
            "The document's example with its last character removed: 49 characters, 1 mod 4.",
            t, EXAMPLE_TEXT[:-1], "bad_base64", True,
        ),
        (
            "text_prefix_only",
            "'ht1.' alone: valid base64url of zero bytes, which is a truncated binary form.",
            t, "ht1.", "truncated", True,
        ),
        (
            "text_version_2",
            "Valid base64url of a binary form with version 0x02: the binary rules apply.",
            t, "ht1." + b64url(header(version=2)), "unsupported_version", True,
        ),
        (
            "text_trailing_bytes",
            "Valid base64url of the document's example plus one byte.",
            t, "ht1." + b64url(EXAMPLE + b"\x00"), "trailing_bytes", True,
        ),
        (
            "text_zero_trace_id",
            "Valid base64url of a context whose trace id is 16 zero bytes.",
            t, "ht1." + b64url(header(info=0x80) + bytes(16)), "invalid_trace_id", True,
        ),
        (
            "text_non_canonical_last_char",
            "The example's text with a non-zero unused low bit in the last character.",
            t, EXAMPLE_TEXT[:-1] + B64URL[B64URL.index(EXAMPLE_TEXT[-1]) | 1], "bad_base64", True,
        ),
        (
            "order_prefix_beats_base64",
            "'ht2.' followed by padding: the prefix is checked first.",
            t, "ht2." + EXAMPLE_TEXT[4:] + "==", "bad_text_prefix", False,
        ),
        # ---- envelope
        ("envelope_empty", "An empty message has no magic.", e, b"", "not_enveloped", True),
        (
            "envelope_json_payload",
            "A JSON payload without an envelope.",
            e, b'{"v":21.5}', "not_enveloped", True,
        ),
        (
            "envelope_bare_binary_context",
            "The binary form of the document's example without magic and length.",
            e, EXAMPLE, "not_enveloped", True,
        ),
        (
            "envelope_magic_ht2",
            "Magic FF 48 54 32 ('HT2', a future version) in front of a context.",
            e, b"\xffHT2" + bytes([len(EXAMPLE)]) + EXAMPLE, "not_enveloped", True,
        ),
        (
            "envelope_magic_only",
            "The four magic bytes and nothing else: no length byte.",
            e, tf.ENVELOPE_MAGIC, "truncated", True,
        ),
        (
            "envelope_length_exceeds_bytes",
            "L = 37 but only 20 bytes of the context follow.",
            e, envelope(EXAMPLE)[: 5 + 20], "truncated", True,
        ),
        (
            "envelope_length_exceeds_bytes_by_one",
            "L = 37 but 36 bytes follow, no payload.",
            e, envelope(EXAMPLE)[:-1], "truncated", True,
        ),
        (
            "envelope_length_below_header",
            "L = 20 (below 28) with 20 bytes and a payload following: the embedded binary "
            "form is shorter than a header.",
            e, envelope(EXAMPLE[:20], b"payload"), "truncated", True,
        ),
        (
            "envelope_length_short_of_context",
            "L = 36 for a 37-byte context (the last stamp byte is counted as payload).",
            e, envelope(EXAMPLE, b"payload", length=36), "truncated", True,
        ),
        (
            "envelope_inner_version_2",
            "Well-formed envelope whose embedded context has version 0x02.",
            e, envelope(header(version=2), b"payload"), "unsupported_version", True,
        ),
        (
            "envelope_inner_too_many_stamps",
            "Embedded context with N = 17 (L = 181).",
            e, envelope(header(info=17) + stamps(17)), "too_many_stamps", True,
        ),
        (
            "envelope_inner_reserved_bits",
            "Embedded context with info bit 6 set.",
            e, envelope(header(info=0x41) + EXAMPLE[28:], b"p"), "reserved_bits", True,
        ),
        (
            "envelope_partial_magic",
            "Only the first two magic bytes: no magic at offset 0.",
            e, b"\xffH", "not_enveloped", True,
        ),
        (
            "envelope_length_beyond_context",
            "L = 38 for a 37-byte context: the L bytes hold one byte after the context.",
            e, envelope(EXAMPLE + b"\x00", b"payload"), "trailing_bytes", True,
        ),
        (
            "envelope_inner_zero_trace_id",
            "Embedded context whose trace id is 16 zero bytes.",
            e, envelope(header(info=0x80) + bytes(16), b"p"), "invalid_trace_id", True,
        ),
    ]
    out = []
    for name, description, form, data, error, single in cases:
        _check_invalid(name, form, data, error, single)
        vec = {"name": name, "description": description, "form": form}
        if form == "text":
            vec["input_text"] = data
        else:
            vec["input_hex"] = data.hex()
        vec["error"] = error
        out.append(vec)
    return out


DECODERS = {
    "binary": tf.decode_binary,
    "text": tf.decode_text,
    "envelope": tf.unwrap_envelope,
}


def _check_invalid(name, form, data, error, single) -> None:
    try:
        DECODERS[form](data)
    except TraceFormatError as exc:
        if exc.name != error:
            raise AssertionError(f"{name}: expected {error}, got {exc.name}") from exc
    else:
        raise AssertionError(f"{name}: decoded without error")
    if single:
        met = _conditions(form, data)
        if met != [error]:
            raise AssertionError(f"{name}: meets {met}, expected only {error}")


def _binary_conditions(data: bytes) -> list[str]:
    """Every row of the binary table that the input meets, in table order."""
    if len(data) < 28:
        return ["truncated"]  # nothing else can be read
    met = []
    if data[0] != 1:
        met.append("unsupported_version")
    info = data[1]
    if info & 0x1F > 16:
        met.append("too_many_stamps")
    if info & 0x60:
        met.append("reserved_bits")
    want = tf.expected_len(info)
    if len(data) < want:
        met.append("truncated")
    if len(data) > want:
        met.append("trailing_bytes")
    if info & 0x80 and len(data) >= 44 and not any(data[28:44]):
        met.append("invalid_trace_id")
    return met


def _conditions(form, data) -> list[str]:
    if form == "binary":
        return _binary_conditions(data)
    if form == "text":
        if not data.startswith("ht1."):
            return ["bad_text_prefix"]
        try:
            raw = tf.decode_base64url(data[4:])
        except TraceFormatError:
            return ["bad_base64"]
        return _binary_conditions(raw)
    # envelope
    if not data.startswith(tf.ENVELOPE_MAGIC):
        return ["not_enveloped"]
    if len(data) < 5 or len(data) < 5 + data[4]:
        return ["truncated"]
    return _binary_conditions(data[5 : 5 + data[4]])


# --------------------------------------------------------------------------- main


def build() -> dict:
    example = tf.encode_binary(doc_example())
    doc_bytes = bytes.fromhex("".join(DOC_EXAMPLE_HEX.split()))
    if example != doc_bytes:
        raise AssertionError(f"example differs from the document: {example.hex()} != {doc_bytes.hex()}")
    return {
        "format": "hoptrace trace context v1",
        "spec": "docs/trace-format.md",
        "valid": valid_vectors(),
        "invalid": invalid_vectors(),
    }


def render(doc: dict) -> str:
    return json.dumps(doc, indent=2) + "\n"


def main() -> None:
    doc = build()
    OUT.write_text(render(doc), encoding="utf-8")
    print(f"wrote {OUT.name}: {len(doc['valid'])} valid, {len(doc['invalid'])} invalid vectors")


if __name__ == "__main__":
    main()
