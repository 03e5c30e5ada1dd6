"""Carriers: the key, the form each carrier holds, "last one wins", and the traceparent
rules of docs/trace-format.md; and that the probe counts every outcome."""

import pytest

from hoptrace_probe import BadContext, LocalQueue, NotTraced, TraceContext
from hoptrace_probe.carrier import envelope, kafka_header, mqtt_property
from hoptrace_probe.traceparent import TraceparentError, parse

TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
TP_ID = bytes.fromhex("4bf92f3577b34da6a3ce929d0e0e4736")
OWN_ID = bytes.fromhex("0102030405060708090a0b0c0d0e0f10")


def ctx(seq=1, trace_id=None):
    return TraceContext(3, 4, seq, 10, 1_800_000_000_000_000_000, trace_id)


# --------------------------------------------------------------------------- traceparent

def test_traceparent_w3c_example():
    assert parse(TP) == TP_ID
    assert parse(TP.encode()) == TP_ID
    assert parse(TP[:-2] + "ff") == TP_ID, "any two lower-case hex flags"


@pytest.mark.parametrize("value,reason", [
    ("", "malformed"),
    (TP.upper(), "malformed"),
    (" " + TP[1:], "malformed"),
    (TP + " ", "malformed"),
    (TP[:-1], "malformed"),
    (TP.replace("-", "_", 1), "malformed"),
    ("00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01", "malformed"),
    ("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "unsupported_version"),
    ("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "unsupported_version"),
    ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", "zero_id"),
    ("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", "zero_id"),
    ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0é", "malformed"),
])
def test_traceparent_rejections(value, reason):
    with pytest.raises(TraceparentError) as e:
        parse(value)
    assert e.value.reason == reason


# --------------------------------------------------------------------------- Kafka

def test_kafka_header_holds_the_binary_form_and_last_wins():
    a, b = ctx(1), ctx(2)
    headers = kafka_header.inject(b, kafka_header.inject(a, [("other", b"x")]))
    assert [k for k, _ in headers] == ["other", "hoptrace", "hoptrace"]
    assert headers[-1][1] == b.encode()
    assert kafka_header.extract(headers).context == b


def test_kafka_last_header_that_fails_is_an_error_without_fallback():
    headers = kafka_header.inject(ctx(1), None) + [("hoptrace", b"garbage")]
    with pytest.raises(BadContext) as e:
        kafka_header.extract(headers)
    assert e.value.error.name == "truncated"


def test_kafka_header_with_text_form_or_null_fails_binary_rules():
    with pytest.raises(BadContext):
        kafka_header.extract([("hoptrace", ctx().to_text().encode())])
    with pytest.raises(BadContext):
        kafka_header.extract([("hoptrace", None)])


def test_kafka_keys_are_case_sensitive():
    for headers in (None, [], [("Hoptrace", ctx().encode())], [("traceparent", TP)]):
        with pytest.raises(NotTraced):
            kafka_header.extract(headers)


def test_kafka_traceparent_lends_its_trace_id():
    got = kafka_header.extract(kafka_header.inject(ctx(), [("traceparent", TP.encode())]))
    assert got.context.otel_trace_id == TP_ID and got.bad_traceparent is None
    # The lent id travels on: re-injected, bit 7 is set and 16 bytes more.
    again = kafka_header.inject(got.context)[-1][1]
    assert again[1] & 0x80 and len(again) == 28 + 16


def test_own_trace_id_is_kept_but_a_bad_traceparent_is_still_counted():
    got = kafka_header.extract(kafka_header.inject(ctx(trace_id=OWN_ID), [("traceparent", TP)]))
    assert got.context.otel_trace_id == OWN_ID and got.bad_traceparent is None
    got = kafka_header.extract(
        kafka_header.inject(ctx(trace_id=OWN_ID), [("traceparent", TP.upper())]))
    assert got.context.otel_trace_id == OWN_ID
    assert got.bad_traceparent is not None and got.bad_traceparent.reason == "malformed"


def test_the_last_traceparent_is_used():
    other = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-00"
    got = kafka_header.extract([("traceparent", "junk"), ("traceparent", other)]
                               + kafka_header.inject(ctx()))
    assert got.context.otel_trace_id == bytes.fromhex("ab" * 16) and got.bad_traceparent is None
    got = kafka_header.extract([("traceparent", other), ("traceparent", "junk")]
                               + kafka_header.inject(ctx()))
    assert got.context.otel_trace_id is None and got.bad_traceparent is not None


# --------------------------------------------------------------------------- MQTT

def test_mqtt_property_holds_the_text_form_and_inject_replaces():
    props = [("site", "plant-7"), ("hoptrace", ctx(1).to_text()), ("traceparent", TP)]
    out = mqtt_property.inject_user_properties(ctx(2), props)
    assert out == [("site", "plant-7"), ("traceparent", TP), ("hoptrace", ctx(2).to_text())]
    got = mqtt_property.extract_user_properties(out)
    assert got.context.sequence == 2 and got.context.otel_trace_id == TP_ID


def test_mqtt_last_property_wins_and_binary_form_fails():
    props = [("hoptrace", ctx(1).to_text()), ("hoptrace", ctx(2).to_text())]
    assert mqtt_property.extract_user_properties(props).context.sequence == 2
    with pytest.raises(BadContext) as e:
        mqtt_property.extract_user_properties(props + [("hoptrace", "ht2.AAAA")])
    assert e.value.error.name == "bad_text_prefix"
    with pytest.raises(NotTraced):
        mqtt_property.extract(None)


def test_mqtt_with_paho_properties():
    paho = pytest.importorskip("paho.mqtt.properties")
    from paho.mqtt.packettypes import PacketTypes
    props = paho.Properties(PacketTypes.PUBLISH)
    props.UserProperty = ("site", "plant-7")
    mqtt_property.inject(ctx(1), props)
    mqtt_property.inject(ctx(2), props)  # replaces, does not pile up
    assert props.UserProperty == [("site", "plant-7"), ("hoptrace", ctx(2).to_text())]
    # Through paho's own wire encoding and back.
    packed = props.pack()
    back = paho.Properties(PacketTypes.PUBLISH)
    back.unpack(packed)
    assert mqtt_property.extract(back).context == ctx(2)


# --------------------------------------------------------------------------- envelope

def test_envelope_round_trip_and_not_enveloped():
    msg = envelope.wrap(ctx(), b'{"v":1}')
    got, payload = envelope.unwrap(msg)
    assert got.context == ctx() and payload == b'{"v":1}'
    for m in (b'{"v":1}', b"", b"\xff", b"\xffHT"):
        with pytest.raises(NotTraced):
            envelope.unwrap(m)
    with pytest.raises(BadContext):
        envelope.unwrap(b"\xffHT1")


# --------------------------------------------------------------------------- counting

def test_probe_counts_every_outcome():
    q = LocalQueue(16)
    p = q.probe(1)
    assert p.counted(kafka_header.extract, [("x", b"")]) is None
    assert p.counted(kafka_header.extract, [("hoptrace", b"\x01")]) is None
    assert p.counted(envelope.unwrap, b"plain") is None
    got = p.counted(kafka_header.extract, kafka_header.inject(ctx(), [("traceparent", "bad")]))
    assert got is not None and got.context == ctx()
    got = p.counted(envelope.unwrap, envelope.wrap(ctx(), b"p"))
    assert got[1] == b"p"
    c = q.counters()
    assert (c.not_traced, c.bad_context, c.bad_traceparent) == (2, 1, 1)
