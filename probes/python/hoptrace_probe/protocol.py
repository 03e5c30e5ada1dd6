"""Collector protocol versions 1 and 2: length-prefixed frames between probes and the
collector.

The byte layout is ``docs/collector-protocol.md``; ``probe/testdata/protocol-vectors.json``
holds example frames of both versions, which the tests check byte for byte. Version 2
adds numbered records frames (SeqRecords), the collector's Ack and Welcome's
``resume_seq``. Every frame is ``len`` (u32 LE, type
byte included), ``type`` (u8), body. :func:`encode` turns a frame object into bytes;
:func:`decode` and :func:`split_frame` read them back, raising :class:`ProtocolError`
whose ``name`` is the error name of the document.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Callable, List, NamedTuple, Optional, Sequence, Tuple, Union

PROTOCOL_VERSION = 2
"""Highest protocol version spoken here (a version 1 peer is spoken to in version 1)."""
VERSIONS = (1, 2)
"""Protocol versions this implementation reads and writes."""
MAX_FRAME_LEN = 1 << 20
"""Largest ``len`` either side sends or accepts (1 MiB)."""
HELLO_MAGIC = b"HOPTRACE"
"""First bytes of a Hello body."""
MAX_STRING_LEN = 1024
"""Longest string field, in bytes of UTF-8."""
MAX_RECORDS_PER_FRAME = 20_000
"""Most records in one Records frame."""
SENT_ENTRY_LEN = 36
"""Bytes of one Sent entry on the wire."""
MAX_SENT_PER_FRAME = (MAX_FRAME_LEN - 7) // SENT_ENTRY_LEN
"""Most entries in one Sent frame: as many as fit in :data:`MAX_FRAME_LEN` after the type
byte, the publisher and the count (29,126)."""
MAX_HOPS = 16
"""Most hops one exporter announces."""
RECORD_LEN = 36
"""Bytes of a record without a trace id (52 with one)."""

HELLO, RECORDS, CLOCK, COUNTERS, SENT, GOODBYE, SEQ_RECORDS = 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07
WELCOME, REJECT, ACK = 0x81, 0x82, 0x83


class CounterId:
    """Counter ids of the Counters frame."""

    REPORTED = 1
    QUEUE_FULL = 2
    SENT = 3
    SEND_FAILED = 4
    RECONNECTS = 5
    NOT_TRACED = 6
    BAD_CONTEXT = 7
    STAMPS_FULL = 8
    BAD_TRACEPARENT = 9
    RESENT = 10
    EVICTED = 11
    LOST_UNACKED = 12


COUNTER_NAMES = {1: "reported", 2: "queue_full", 3: "sent", 4: "send_failed", 5: "reconnects",
                 6: "not_traced", 7: "bad_context", 8: "stamps_full", 9: "bad_traceparent",
                 10: "resent", 11: "evicted", 12: "lost_unacked"}
"""Counter id to its name in the document."""


class RejectCode:
    """Reasons a collector rejects a probe."""

    VERSION = 1
    TOKEN = 2
    UNKNOWN_HOP = 3
    MALFORMED = 4
    OVERLOADED = 5


class ProtocolError(ValueError):
    """Bytes that are not a valid frame; ``name`` is the error of the document."""

    def __init__(self, name: str, detail: str = "") -> None:
        self.name = name
        super().__init__(f"{name}: {detail}" if detail else name)


# ---------------------------------------------------------------------------------------
# Frames


class Record(NamedTuple):
    """One hop's stamp of one message (the probes queue it as a plain tuple in wire
    order, see :func:`queued`)."""

    hop: int
    publisher: int
    stream: int
    sequence: int
    stamp_ns: int
    metric_count: int
    intended_ns: int
    otel_trace_id: Optional[bytes] = None


@dataclass
class Hello:
    """0x01: who the probe is."""

    instance_id: int
    host: str
    process: str
    software: str
    token: str
    hops: List[Tuple[int, str]]
    version: int = PROTOCOL_VERSION


@dataclass
class Records:
    """0x02: a batch of records (1 to 20,000)."""

    records: Sequence[Record]


@dataclass
class SeqRecords:
    """0x07 (version 2): a numbered batch of records (numbers from 1, per exporter
    instance, across reconnections)."""

    seq: int
    records: Sequence[Record]


@dataclass
class Clock:
    """0x03: the host's clock status (see :mod:`hoptrace_probe.clock` for the codes)."""

    at_ns: int
    source: int
    synced: bool
    leap: int
    offset_ns: int
    error_bound_ns: int
    detail: str


@dataclass
class Counters:
    """0x04: cumulative counters, ``(id, value)`` pairs."""

    at_ns: int
    values: List[Tuple[int, int]]

    def get(self, counter_id: int) -> int:
        """The value of ``counter_id``, 0 when absent."""
        return next((v for i, v in self.values if i == counter_id), 0)


class SentEntry(NamedTuple):
    """What a publisher sent on one stream, cumulative."""

    stream: int
    messages: int
    metrics: int
    first_sequence: int
    last_sequence: int


@dataclass
class Sent:
    """0x05: a publisher's accounting, per stream (at most :data:`MAX_SENT_PER_FRAME` entries)."""

    publisher: int
    entries: List[SentEntry] = field(default_factory=list)


@dataclass
class Goodbye:
    """0x06: the probe has flushed everything and closes next."""


@dataclass
class Welcome:
    """0x81: the collector accepts the probe; ``version`` is the connection's, and in
    version 2 ``resume_seq`` the highest SeqRecords number of this instance the collector
    holds durably."""

    run_id: str
    version: int = PROTOCOL_VERSION
    resume_seq: int = 0


@dataclass
class Ack:
    """0x83 (version 2): every SeqRecords frame of the instance numbered up to ``seq`` is
    durable at the collector."""

    seq: int


@dataclass
class Reject:
    """0x82: the collector refuses the probe (then closes)."""

    code: int
    reason: str


Frame = Union[Hello, Records, SeqRecords, Clock, Counters, Sent, Goodbye, Welcome, Reject, Ack]

# ---------------------------------------------------------------------------------------
# Encoding

_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_LEN_TYPE = struct.Struct("<IB")
_RECORD = struct.Struct("<BBHIQqIq")
_HELLO_HEAD = struct.Struct("<8sHQ")
_CLOCK_HEAD = struct.Struct("<qBBBqQ")
_COUNTER = struct.Struct("<HQ")
_SENT_ENTRY = struct.Struct("<IQQQQ")
_I64 = struct.Struct("<q")
_U64 = struct.Struct("<Q")
assert _RECORD.size == RECORD_LEN
assert _SENT_ENTRY.size == SENT_ENTRY_LEN


def _string(s: str) -> bytes:
    """A u16 length and the UTF-8 bytes; longer than 1024 bytes is cut at a character."""
    b = s.encode("utf-8")
    if len(b) > MAX_STRING_LEN:
        b = b[:MAX_STRING_LEN].decode("utf-8", "ignore").encode("utf-8")
    return _U16.pack(len(b)) + b


def _frame(ty: int, body: bytes) -> bytes:
    return _LEN_TYPE.pack(len(body) + 1, ty) + body


def queued(r: Record) -> tuple:
    """A record as the probes queue it: wire order, ``flags`` first, the trace id last
    and only when present."""
    tid = r.otel_trace_id
    head = (r.hop, r.publisher, r.stream, r.sequence, r.stamp_ns, r.metric_count, r.intended_ns)
    return (0, *head) if tid is None else (1, *head, tid)


def from_queued(q: Sequence) -> Record:
    """The :class:`Record` of a queued tuple."""
    return Record(q[1], q[2], q[3], q[4], q[5], q[6], q[7], q[8] if q[0] else None)


def encode_records(queued_records: Sequence[Sequence], seq: Optional[int] = None) -> bytes:
    """A Records frame of records as the probes queue them (see :func:`queued`), or with
    ``seq`` a SeqRecords frame of that number (version 2)."""
    n = len(queued_records)
    if not 1 <= n <= MAX_RECORDS_PER_FRAME:
        raise ValueError(f"a Records frame holds 1 to {MAX_RECORDS_PER_FRAME} records, got {n}")
    pack = _RECORD.pack
    parts = [b"", _U32.pack(n) if seq is None else _U64.pack(seq) + _U32.pack(n)]
    with_id = 0
    for r in queued_records:
        if r[0]:
            parts.append(pack(*r[:8]))
            parts.append(r[8])
            with_id += 1
        else:
            parts.append(pack(*r))
    head = 4 if seq is None else 12
    parts[0] = _LEN_TYPE.pack(1 + head + RECORD_LEN * n + 16 * with_id,
                              RECORDS if seq is None else SEQ_RECORDS)
    return b"".join(parts)


def encode(frame: Frame) -> bytes:
    """The frame's bytes, length prefix included.

    Raises ``ValueError`` when a count is outside the protocol's limits.
    """
    if isinstance(frame, Records):
        return encode_records([queued(r) for r in frame.records])
    if isinstance(frame, SeqRecords):
        return encode_records([queued(r) for r in frame.records], frame.seq)
    if isinstance(frame, Hello):
        if not 1 <= len(frame.hops) <= MAX_HOPS:
            raise ValueError(f"Hello announces 1 to {MAX_HOPS} hops, got {len(frame.hops)}")
        parts = [_HELLO_HEAD.pack(HELLO_MAGIC, frame.version, frame.instance_id),
                 _string(frame.host), _string(frame.process), _string(frame.software),
                 _string(frame.token), _U8.pack(len(frame.hops))]
        for hop, name in frame.hops:
            parts += [_U8.pack(hop), _string(name)]
        return _frame(HELLO, b"".join(parts))
    if isinstance(frame, Clock):
        return _frame(CLOCK, _CLOCK_HEAD.pack(frame.at_ns, frame.source, int(bool(frame.synced)),
                                              frame.leap, frame.offset_ns, frame.error_bound_ns)
                      + _string(frame.detail))
    if isinstance(frame, Counters):
        if len(frame.values) > 255:
            raise ValueError("at most 255 counters in one frame")
        return _frame(COUNTERS, _I64.pack(frame.at_ns) + _U8.pack(len(frame.values))
                      + b"".join(_COUNTER.pack(i, v) for i, v in frame.values))
    if isinstance(frame, Sent):
        if len(frame.entries) > MAX_SENT_PER_FRAME:
            raise ValueError(f"a Sent frame holds at most {MAX_SENT_PER_FRAME} entries, got "
                             f"{len(frame.entries)}")
        return _frame(SENT, _U16.pack(frame.publisher) + _U32.pack(len(frame.entries))
                      + b"".join(_SENT_ENTRY.pack(*e) for e in frame.entries))
    if isinstance(frame, Goodbye):
        return _frame(GOODBYE, b"")
    if isinstance(frame, Welcome):
        body = _U16.pack(frame.version) + _string(frame.run_id)
        if frame.version >= 2:
            body += _U64.pack(frame.resume_seq)
        return _frame(WELCOME, body)
    if isinstance(frame, Ack):
        return _frame(ACK, _U64.pack(frame.seq))
    if isinstance(frame, Reject):
        return _frame(REJECT, _U16.pack(frame.code) + _string(frame.reason))
    raise TypeError(f"not a frame: {frame!r}")


# ---------------------------------------------------------------------------------------
# Decoding


class _Cursor:
    """Reads little-endian fields from a body; ``truncated`` at its end."""

    def __init__(self, body: bytes) -> None:
        self.b = body
        self.at = 0

    def take(self, n: int) -> bytes:
        if self.at + n > len(self.b):
            raise ProtocolError("truncated")
        out = self.b[self.at:self.at + n]
        self.at += n
        return out

    def unpack(self, st: struct.Struct) -> tuple:
        return st.unpack(self.take(st.size))

    def u8(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        return self.unpack(_U16)[0]

    def u32(self) -> int:
        return self.unpack(_U32)[0]

    def string(self) -> str:
        n = self.u16()
        if n > MAX_STRING_LEN:
            raise ProtocolError("bad_string", f"{n} bytes")
        try:
            return self.take(n).decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError("bad_string", "not UTF-8") from None

    def end(self) -> None:
        if self.at != len(self.b):
            raise ProtocolError("trailing_bytes", f"{len(self.b) - self.at} bytes")


def decode(ty: int, body: bytes) -> Frame:
    """Decodes a frame from its type byte and body; raises :class:`ProtocolError`."""
    c = _Cursor(bytes(body))
    frame: Frame
    if ty == HELLO:
        if len(c.b) < 8 or c.take(8) != HELLO_MAGIC:
            raise ProtocolError("bad_magic")
        version = c.u16()
        if version not in VERSIONS:
            raise ProtocolError("unsupported_version", str(version))
        instance_id = c.unpack(_U64)[0]
        host, process, software, token = c.string(), c.string(), c.string(), c.string()
        n = c.u8()
        if not 1 <= n <= MAX_HOPS:
            raise ProtocolError("bad_count", f"{n} hops")
        hops = [(c.u8(), c.string()) for _ in range(n)]
        frame = Hello(instance_id, host, process, software, token, hops, version)
    elif ty in (RECORDS, SEQ_RECORDS):
        seq = c.unpack(_U64)[0] if ty == SEQ_RECORDS else None
        n = c.u32()
        if not 1 <= n <= MAX_RECORDS_PER_FRAME:
            raise ProtocolError("bad_count", f"{n} records")
        records = []
        for _ in range(n):
            flags, hop, p, s, q, t, m, i = c.unpack(_RECORD)
            if flags & ~1:
                raise ProtocolError("reserved_bits", f"flags {flags:#04x}")
            tid = c.take(16) if flags & 1 else None
            records.append(Record(hop, p, s, q, t, m, i, tid))
        frame = Records(records) if seq is None else SeqRecords(seq, records)
    elif ty == CLOCK:
        at_ns, source, synced, leap, offset_ns, bound = c.unpack(_CLOCK_HEAD)
        frame = Clock(at_ns, source, synced != 0, leap, offset_ns, bound, c.string())
    elif ty == COUNTERS:
        at_ns = c.unpack(_I64)[0]
        frame = Counters(at_ns, [c.unpack(_COUNTER) for _ in range(c.u8())])
    elif ty == SENT:
        publisher = c.u16()
        n = c.u32()
        if n > MAX_SENT_PER_FRAME:  # 0 entries is valid and changes nothing
            raise ProtocolError("bad_count", f"{n} entries")
        frame = Sent(publisher, [SentEntry(*c.unpack(_SENT_ENTRY)) for _ in range(n)])
    elif ty == GOODBYE:
        frame = Goodbye()
    elif ty == WELCOME:
        version = c.u16()
        if version not in VERSIONS:
            raise ProtocolError("unsupported_version", str(version))
        run_id = c.string()
        frame = Welcome(run_id, version, c.unpack(_U64)[0] if version >= 2 else 0)
    elif ty == ACK:
        frame = Ack(c.unpack(_U64)[0])
    elif ty == REJECT:
        code = c.u16()
        frame = Reject(code, c.string())
    else:
        raise ProtocolError("unknown_type", f"{ty:#04x}")
    c.end()
    return frame


def split_frame(buf: bytes, max_frame_len: int = MAX_FRAME_LEN) -> Optional[Tuple[int, bytes, int]]:
    """The first complete frame of ``buf`` as ``(type, body, frame length)``, or ``None``
    when more bytes are needed. ``frame_too_large`` and ``empty_frame`` are raised as soon
    as the length prefix is read."""
    if len(buf) < 4:
        return None
    n = _U32.unpack_from(buf)[0]
    if n == 0:
        raise ProtocolError("empty_frame")
    if n > max_frame_len:
        raise ProtocolError("frame_too_large", f"{n} bytes")
    if len(buf) < 4 + n:
        return None
    return buf[4], bytes(buf[5:4 + n]), 4 + n


def decode_frames(buf: bytes) -> Tuple[List[Frame], int]:
    """Every complete frame at the start of ``buf`` and the bytes they take."""
    frames: List[Frame] = []
    at = 0
    while True:
        got = split_frame(buf[at:])
        if got is None:
            return frames, at
        ty, body, n = got
        frames.append(decode(ty, body))
        at += n


def read_frame(recv_exactly: Callable[[int], bytes]) -> Frame:
    """Reads one frame through ``recv_exactly(n)``, which returns exactly ``n`` bytes or
    raises (``OSError``, ``EOFError``)."""
    n = _U32.unpack(recv_exactly(4))[0]
    if n == 0:
        raise ProtocolError("empty_frame")
    if n > MAX_FRAME_LEN:
        raise ProtocolError("frame_too_large", f"{n} bytes")
    body = recv_exactly(n)
    return decode(body[0], body[1:])
