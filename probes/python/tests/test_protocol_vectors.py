"""probe/testdata/protocol-vectors.json, the example frames of collector protocol versions 1
and 2 that the Rust probe is checked against: every frame built from its fields encodes to
exactly the bytes listed, and the bytes decode to the same frame."""

import json
from pathlib import Path

import pytest

from hoptrace_probe import protocol as p

VECTORS = json.loads((Path(__file__).resolve().parents[3] / "probe" / "testdata"
                      / "protocol-vectors.json").read_text())["frames"]


def code(text) -> int:
    """"chrony (2)" -> 2 (the vectors name enumerations beside their code)."""
    return int(str(text).rsplit("(", 1)[1].rstrip(")")) if isinstance(text, str) else int(text)


def record(r: dict) -> p.Record:
    tid = r["otel_trace_id"]
    return p.Record(r["hop"], r["publisher"], r["stream"], r["sequence"], r["stamp_ns"],
                    r["metric_count"], r["intended_ns"], bytes.fromhex(tid) if tid else None)


def frame_of(v: dict) -> p.Frame:
    f, ty = v["fields"], int(v["type"], 16)
    if ty == p.HELLO:
        return p.Hello(int(f["instance_id"], 16), f["host"], f["process"], f["software"], f["token"],
                       [tuple(h) for h in f["hops"]], f["version"])
    if ty == p.RECORDS:
        return p.Records([record(r) for r in f["records"]])
    if ty == p.SEQ_RECORDS:
        return p.SeqRecords(f["seq"], [record(r) for r in f["records"]])
    if ty == p.CLOCK:
        return p.Clock(f["at_ns"], code(f["source"]), f["synced"], code(f["leap"]), f["offset_ns"],
                       f["error_bound_ns"], f["detail"])
    if ty == p.COUNTERS:
        for name, cid, _ in f["values"]:
            assert p.COUNTER_NAMES[cid] == name, (cid, name)
        return p.Counters(f["at_ns"], [(cid, value) for _, cid, value in f["values"]])
    if ty == p.SENT:
        return p.Sent(f["publisher"], [p.SentEntry(e["stream"], e["messages"], e["metrics"],
                                                   e["first_sequence"], e["last_sequence"])
                                       for e in f["entries"]])
    if ty == p.GOODBYE:
        return p.Goodbye()
    if ty == p.WELCOME:
        return p.Welcome(f["run_id"], f["version"], f.get("resume_seq", 0))
    if ty == p.ACK:
        return p.Ack(f["seq"])
    if ty == p.REJECT:
        return p.Reject(f["code"], f["reason"])
    raise AssertionError(f"a frame type this test does not know: {v['type']}")


def test_every_type_of_both_versions_is_covered():
    types = {int(v["type"], 16) for v in VECTORS}
    assert types == {p.HELLO, p.RECORDS, p.SEQ_RECORDS, p.CLOCK, p.COUNTERS, p.SENT, p.GOODBYE,
                     p.WELCOME, p.ACK, p.REJECT}
    assert {v["versions"] for v in VECTORS} == {"1", "2", "1, 2"}


@pytest.mark.parametrize("v", VECTORS, ids=[v["name"] for v in VECTORS])
def test_vector(v):
    want = bytes.fromhex(v["hex"])
    f = frame_of(v)
    assert p.encode(f) == want
    ty, body, used = p.split_frame(want)
    assert (ty, used) == (int(v["type"], 16), len(want))
    assert p.decode(ty, body) == f
