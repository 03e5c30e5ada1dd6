"""Collector protocol frames, byte for byte against the tables of
docs/collector-protocol.md (expected bytes are written out field by field here), and the
decoder's named errors."""

import random
import re
from pathlib import Path

import pytest

from hoptrace_probe import protocol as p
from hoptrace_probe.protocol import ProtocolError


def h(s: str) -> bytes:
    """Hex with spaces and `|` field separators, for readable expectations."""
    return bytes.fromhex(s.replace("|", " ").replace(" ", ""))


def le(value: int, size: int, signed: bool = False) -> str:
    return value.to_bytes(size, "little", signed=signed).hex()


def string(s: str) -> str:
    b = s.encode()
    return le(len(b), 2) + b.hex()


def frame(ty: int, body_hex: str) -> bytes:
    body = h(body_hex)
    return h(le(len(body) + 1, 4)) + bytes([ty]) + body


def test_hello():
    hello = p.Hello(instance_id=0x1122334455667788, host="h1", process="proc",
                    software="hoptrace-probe-python 0.1.0", token="", hops=[(1, "flow_in"), (2, "flow_out")])
    body = ("|".join([b"HOPTRACE".hex(), "0200", "8877665544332211", string("h1"), string("proc"),
                      string("hoptrace-probe-python 0.1.0"), "0000", "02",
                      "01", string("flow_in"), "02", string("flow_out")]))
    assert p.encode(hello) == frame(0x01, body)
    assert p.decode(0x01, h(body)) == hello


def test_records_without_and_with_trace_id():
    r1 = p.Record(hop=2, publisher=7, stream=0x01020304, sequence=2**64 - 1,
                  stamp_ns=1_800_000_000_000_000_123, metric_count=50, intended_ns=-5)
    r2 = r1._replace(otel_trace_id=bytes(range(1, 17)), sequence=9)
    rec1 = "|".join(["00", "02", "0700", "04030201", "ffffffffffffffff",
                     le(1_800_000_000_000_000_123, 8, True), "32000000", le(-5, 8, True)])
    rec2 = "|".join(["01", "02", "0700", "04030201", le(9, 8), le(1_800_000_000_000_000_123, 8, True),
                     "32000000", le(-5, 8, True), bytes(range(1, 17)).hex()])
    assert len(h(rec1)) == 36 and len(h(rec2)) == 52
    want = frame(0x02, "02000000" + rec1 + rec2)
    assert p.encode(p.Records([r1, r2])) == want
    assert p.encode_records([p.queued(r1), p.queued(r2)]) == want
    assert p.from_queued(p.queued(r2)) == r2
    assert p.decode(0x02, want[5:]) == p.Records([r1, r2])
    # Version 2: the same records after the frame's number.
    numbered = frame(0x07, le(3, 8) + "02000000" + rec1 + rec2)
    assert p.encode(p.SeqRecords(3, [r1, r2])) == numbered
    assert p.encode_records([p.queued(r1), p.queued(r2)], 3) == numbered
    assert p.decode(0x07, numbered[5:]) == p.SeqRecords(3, [r1, r2])


def test_clock():
    c = p.Clock(at_ns=1_800_000_000_000_000_000, source=2, synced=True, leap=0,
                offset_ns=-2004, error_bound_ns=6248, detail="ref=7F000001")
    body = "|".join([le(1_800_000_000_000_000_000, 8, True), "02", "01", "00", le(-2004, 8, True),
                     le(6248, 8), string("ref=7F000001")])
    assert p.encode(c) == frame(0x03, body)
    assert p.decode(0x03, h(body)) == c


def test_counters():
    c = p.Counters(at_ns=5, values=[(1, 10), (2, 3), (9, 2**64 - 1)])
    body = "|".join([le(5, 8), "03", "0100", le(10, 8), "0200", le(3, 8), "0900", "ff" * 8])
    assert p.encode(c) == frame(0x04, body)
    assert p.decode(0x04, h(body)) == c
    assert c.get(2) == 3 and c.get(4) == 0


def test_sent():
    s = p.Sent(publisher=7, entries=[p.SentEntry(stream=3, messages=100, metrics=5000,
                                                 first_sequence=0, last_sequence=99)])
    body = "|".join(["0700", "01000000", "03000000", le(100, 8), le(5000, 8), le(0, 8), le(99, 8)])
    assert p.encode(s) == frame(0x05, body)
    assert p.decode(0x05, h(body)) == s
    # 0 to 29,126 entries; an empty Sent frame is valid and changes nothing.
    assert p.encode(p.Sent(7, [])) == frame(0x05, "0700|00000000")
    assert p.decode(0x05, h("0700|00000000")) == p.Sent(7, [])
    entries = [p.SentEntry(i, 1, 1, 0, 0) for i in range(p.MAX_SENT_PER_FRAME)]
    assert len(p.encode(p.Sent(7, entries))) - 4 <= p.MAX_FRAME_LEN
    with pytest.raises(ValueError):
        p.encode(p.Sent(7, entries + entries[:1]))


def test_goodbye_welcome_reject():
    assert p.encode(p.Goodbye()) == h("01000000 06")
    assert p.encode(p.Welcome("run-1", 1)) == frame(0x81, "0100" + string("run-1"))
    assert p.decode(0x81, h("0100" + string("run-1"))) == p.Welcome("run-1", 1)
    v2 = "0200" + string("run-1") + le(7, 8)
    assert p.encode(p.Welcome("run-1", 2, 7)) == frame(0x81, v2)
    assert p.decode(0x81, h(v2)) == p.Welcome("run-1", 2, 7)
    assert p.encode(p.Ack(2**64 - 1)) == frame(0x83, "ff" * 8)
    assert p.decode(0x83, h(le(5, 8))) == p.Ack(5)
    assert p.encode(p.Reject(3, "unknown hop")) == frame(0x82, "0300" + string("unknown hop"))
    assert p.decode(0x82, h("0300" + string("unknown hop"))) == p.Reject(3, "unknown hop")


def test_counter_ids_are_the_documented_ones():
    assert p.COUNTER_NAMES == {1: "reported", 2: "queue_full", 3: "sent", 4: "send_failed",
                               5: "reconnects", 6: "not_traced", 7: "bad_context",
                               8: "stamps_full", 9: "bad_traceparent", 10: "resent",
                               11: "evicted", 12: "lost_unacked"}


def test_long_strings_are_cut_at_a_character_boundary():
    hello = p.Hello(1, "é" * 600, "x", "y", "", [(0, "publish")])
    enc = p.encode(hello)
    got = p.decode(enc[4], enc[5:])
    assert got.host == "é" * 512 and len(got.host.encode()) == 1024


@pytest.mark.parametrize("ty,body,name", [
    (0x01, b"HOPTRACX" + bytes(20), "bad_magic"),
    (0x01, b"HOPT", "bad_magic"),
    (0x01, b"HOPTRACE" + h("0300") + bytes(8), "unsupported_version"),
    (0x01, b"HOPTRACE" + h("0000") + bytes(8), "unsupported_version"),
    (0x01, b"HOPTRACE" + h("0100") + bytes(8) + h("0000" * 4) + b"\x00", "bad_count"),
    (0x01, b"HOPTRACE" + h("0100") + bytes(8) + h("0000" * 4) + b"\x11", "bad_count"),
    (0x01, b"HOPTRACE" + h("0100") + bytes(8) + h("0104") + bytes(10), "bad_string"),
    (0x01, b"HOPTRACE" + h("0100") + bytes(8) + h("0200") + b"\xff\xfe", "bad_string"),
    (0x02, h("00000000"), "bad_count"),
    (0x02, h(le(20_001, 4)), "bad_count"),
    (0x02, h("01000000") + b"\x02" + bytes(35), "reserved_bits"),
    (0x02, h("01000000") + b"\x01" + bytes(35), "truncated"),
    (0x02, h("01000000") + bytes(37), "trailing_bytes"),
    (0x03, bytes(10), "truncated"),
    (0x04, bytes(8) + b"\x01" + bytes(9), "truncated"),
    (0x05, h("0000") + h(le(29_127, 4)), "bad_count"),
    (0x07, h(le(1, 8)) + h("00000000"), "bad_count"),
    (0x07, h(le(1, 8)) + h("010000"), "truncated"),
    (0x83, h(le(1, 8)) + b"\x00", "trailing_bytes"),
    (0x81, h("0200") + h(string("r")), "truncated"),
    (0x06, b"\x00", "trailing_bytes"),
    (0x81, h("0300") + h(string("r")), "unsupported_version"),
    (0x7F, b"", "unknown_type"),
])
def test_decoder_names_its_errors(ty, body, name):
    with pytest.raises(ProtocolError) as e:
        p.decode(ty, body)
    assert e.value.name == name


def test_length_prefix_errors_come_before_the_body():
    with pytest.raises(ProtocolError) as e:
        p.split_frame(h(le(p.MAX_FRAME_LEN + 1, 4)))
    assert e.value.name == "frame_too_large"
    with pytest.raises(ProtocolError) as e:
        p.split_frame(h("00000000"))
    assert e.value.name == "empty_frame"
    assert p.split_frame(h("05000000 06")) is None, "incomplete: more bytes needed"


def test_frames_survive_any_split_point():
    rnd = random.Random(7)
    frames = [
        p.Hello(rnd.getrandbits(64), "host", "proc", "sw", "tok", [(0, "publish")]),
        p.Clock(1, 4, True, 0, 2, 3, "d"),
        p.Records([p.Record(rnd.randrange(256), rnd.randrange(1 << 16), rnd.randrange(1 << 32),
                            rnd.getrandbits(64), rnd.getrandbits(63), rnd.randrange(1 << 32),
                            -rnd.getrandbits(63),
                            bytes(rnd.randrange(256) for _ in range(16)) if i % 3 == 0 else None)
                   for i in range(50)]),
        p.Counters(9, [(i, rnd.getrandbits(64)) for i in range(1, 10)]),
        p.Sent(3, [p.SentEntry(i, 1, 2, 3, 4) for i in range(5)]),
        p.Goodbye(),
    ]
    stream = b"".join(p.encode(f) for f in frames)
    for _ in range(100):
        cut = rnd.randrange(len(stream) + 1)
        first, used = p.decode_frames(stream[:cut])
        rest, used2 = p.decode_frames(stream[used:])
        assert used + used2 == len(stream)
        assert first + rest == frames


def test_records_frame_limits():
    r = (0, 0, 0, 0, 0, 0, 0, 0)
    assert len(p.encode_records([r] * 3)) == 4 + 1 + 4 + 3 * 36
    with pytest.raises(ValueError):
        p.encode_records([])
    with pytest.raises(ValueError):
        p.encode_records([r] * 20_001)
    full = p.encode_records([(1, 0, 0, 0, 0, 0, 0, 0, bytes(range(16)))] * 20_000)
    assert len(full) - 4 <= p.MAX_FRAME_LEN


def test_the_fullest_sent_frame_is_within_the_frame_limit():
    # The count the protocol document gives for a Sent frame is the one encoded here.
    doc = (Path(__file__).resolve().parents[3] / "docs" / "collector-protocol.md").read_text()
    stated = re.search(r"\| count S \| u32, \d+ to ([\d,]+) ", doc)
    assert stated, "docs/collector-protocol.md states the entries of a Sent frame"
    assert p.MAX_SENT_PER_FRAME == int(stated.group(1).replace(",", ""))
    entries = [p.SentEntry(i, 1, 1, 0, 0) for i in range(p.MAX_SENT_PER_FRAME)]
    full = p.encode(p.Sent(1, entries))
    # The collector reads it (split_frame applies the collector's frame limit) ...
    ty, body, n = p.split_frame(full)
    assert n == len(full) and p.decode(ty, body) == p.Sent(1, entries)
    # ... and one entry more would not fit in a frame.
    assert len(full) - 4 + p.SENT_ENTRY_LEN > p.MAX_FRAME_LEN
    with pytest.raises(ValueError, match="entries"):
        p.encode(p.Sent(1, entries + [p.SentEntry(0, 1, 1, 0, 0)]))
