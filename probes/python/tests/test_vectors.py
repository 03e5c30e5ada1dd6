"""Conformance with probe/testdata/trace-vectors.json: every valid vector encodes to its
bytes, text and envelope and decodes back; every invalid vector is rejected with its
error. Python's json keeps 64-bit integers exact."""

import json
from pathlib import Path

import pytest

from hoptrace_probe import DecodeError, TraceContext
from hoptrace_probe.carrier import envelope, kafka_header, mqtt_property

VECTORS = Path(__file__).resolve().parents[3] / "probe" / "testdata" / "trace-vectors.json"
DATA = json.loads(VECTORS.read_text())


def context_of(c):
    return TraceContext(
        publisher=c["publisher"], stream=c["stream"], sequence=c["sequence"],
        metric_count=c["metric_count"], intended_ns=c["intended_ns"],
        otel_trace_id=bytes.fromhex(c["otel_trace_id"]) if c["otel_trace_id"] else None,
        stamps=[(s["hop"], s["ns"]) for s in c["stamps"]],
    )


def test_the_file_has_both_lists_and_64_bit_values():
    assert len(DATA["valid"]) >= 10 and len(DATA["invalid"]) >= 40
    assert any(v["context"]["sequence"] >= 1 << 63 for v in DATA["valid"]), \
        "a vector with a sequence above i64::MAX keeps the u64 range honest"


@pytest.mark.parametrize("v", DATA["valid"], ids=lambda v: v["name"])
def test_valid_vector_encodes_exactly(v):
    ctx = context_of(v["context"])
    assert ctx.encode().hex() == v["binary_hex"]
    assert ctx.binary_len() == len(v["binary_hex"]) // 2
    assert ctx.to_text() == v["text"]
    payload = bytes.fromhex(v["envelope_payload_hex"])
    assert envelope.wrap(ctx, payload).hex() == v["envelope_hex"]


@pytest.mark.parametrize("v", DATA["valid"], ids=lambda v: v["name"])
def test_valid_vector_decodes_to_its_context(v):
    ctx = context_of(v["context"])
    assert TraceContext.decode(bytes.fromhex(v["binary_hex"])) == ctx
    assert TraceContext.decode_text(v["text"]) == ctx
    got, payload = envelope.decode(bytes.fromhex(v["envelope_hex"]))
    assert got == ctx and payload == bytes.fromhex(v["envelope_payload_hex"])
    # Through the carriers, which use the binary (Kafka) and text (MQTT) forms.
    assert kafka_header.extract([("hoptrace", bytes.fromhex(v["binary_hex"]))]).context == ctx
    assert mqtt_property.extract_user_properties([("hoptrace", v["text"])]).context == ctx


@pytest.mark.parametrize("v", DATA["invalid"], ids=lambda v: v["name"])
def test_invalid_vector_is_rejected_with_its_error(v):
    with pytest.raises(DecodeError) as e:
        if v["form"] == "binary":
            TraceContext.decode(bytes.fromhex(v["input_hex"]))
        elif v["form"] == "text":
            TraceContext.decode_text(v["input_text"])
        elif v["form"] == "envelope":
            envelope.decode(bytes.fromhex(v["input_hex"]))
        else:
            pytest.fail(f"unknown form {v['form']}")
    assert e.value.name == v["error"], v["description"]


def test_every_error_name_of_the_document_is_exercised():
    names = {v["error"] for v in DATA["invalid"]}
    assert names == {"truncated", "unsupported_version", "too_many_stamps", "reserved_bits",
                     "trailing_bytes", "invalid_trace_id", "bad_text_prefix", "bad_base64",
                     "not_enveloped"}


def test_doc_example_bytes():
    """The example of docs/trace-format.md, typed from the document."""
    ctx = TraceContext(1, 2, 3, 50, 1_700_000_000_000_000_000,
                       stamps=[(0, 1_700_000_000_000_001_000)])
    doc = "01 01 0100 02000000 0300000000000000 32000000 00002a36fe9c9717 00 e8032a36fe9c9717"
    assert ctx.encode() == bytes.fromhex(doc.replace(" ", ""))
    assert len(ctx.encode()) == 28 + 9


@pytest.mark.parametrize("bad", [
    dict(publisher=1 << 16), dict(publisher=-1), dict(stream=1 << 32), dict(sequence=1 << 64),
    dict(metric_count=1 << 32), dict(intended_ns=1 << 63), dict(intended_ns=-(1 << 63) - 1),
    dict(otel_trace_id=bytes(16)), dict(otel_trace_id=b"\x01" * 15),
    dict(stamps=[(0, 0)] * 17), dict(stamps=[(256, 0)]), dict(stamps=[(0, 1 << 63)]),
    dict(sequence=1.0), dict(stamps=[(0, 0.5)]), dict(otel_trace_id="0" * 16),
])
def test_encoder_refuses_what_the_form_cannot_carry(bad):
    fields = dict(publisher=1, stream=2, sequence=3, metric_count=4, intended_ns=5)
    fields.update(bad)
    with pytest.raises(ValueError):
        TraceContext(**fields).encode()


def test_extremes_round_trip():
    ctx = TraceContext((1 << 16) - 1, (1 << 32) - 1, (1 << 64) - 1, (1 << 32) - 1, -(1 << 63),
                       b"\xff" * 16, [(255, (1 << 63) - 1)] * 16)
    assert len(ctx.encode()) == 188
    assert TraceContext.decode(ctx.encode()) == ctx
    assert TraceContext.decode_text(ctx.to_text()) == ctx


def test_stamp_appends_nine_bytes_and_increments_n():
    ctx = TraceContext(1, 2, 3, 4, 5)
    before = ctx.encode()
    assert ctx.push_stamp(7, 123)
    after = ctx.encode()
    assert after[0] == before[0] and after[1] == before[1] + 1
    assert after[2:28] == before[2:28]
    assert after[28:] == bytes([7]) + (123).to_bytes(8, "little")
