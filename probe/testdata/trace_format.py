"""Reference implementation of the hoptrace trace context, version 1.

Written from docs/trace-format.md alone, as an independent cross-check of the
Rust probe: make_vectors.py uses it to produce trace-vectors.json, and
test_trace_format.py checks it against those vectors.

Standard library only.

Readings
--------
The document settles every case this module decides; the points most easily
missed by another implementation:

* The rejection table is applied top to bottom and the first row that applies
  is reported (invalid vectors named ``order_*`` pin this).
* Envelope: a prefix of the magic is ``not_enveloped``; the L bytes are one
  binary form, so L above the context's length is ``trailing_bytes`` and L
  below it ``truncated``.
* Text: the encoding must be canonical (unused low bits of the last character
  zero), else ``bad_base64``.
* ``metric_count`` 0 is valid.
* Encoders raise ValueError for contexts the binary form cannot carry (values
  out of range, more than 16 stamps, a trace id that is not 16 bytes or is all
  zeros).
* traceparent: exactly four dash-separated fields, no surrounding whitespace,
  any flags value; a context that already has a trace id keeps it.
"""

from __future__ import annotations

import base64
import struct
from dataclasses import dataclass, field, replace

VERSION = 0x01
HEADER_LEN = 28
TRACE_ID_LEN = 16
STAMP_LEN = 9
MAX_STAMPS = 16
MAX_LEN = HEADER_LEN + TRACE_ID_LEN + STAMP_LEN * MAX_STAMPS  # 188

INFO_COUNT_MASK = 0x1F  # bits 0-4
INFO_RESERVED_MASK = 0x60  # bits 5-6
INFO_TRACE_ID_BIT = 0x80  # bit 7

TEXT_PREFIX = "ht1."
BASE64URL_ALPHABET = frozenset(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
)

ENVELOPE_MAGIC = b"\xffHT1"
ENVELOPE_HEADER_LEN = len(ENVELOPE_MAGIC) + 1  # magic + L

# version, info, publisher, stream, sequence, metric_count, intended_ns
_HEADER = struct.Struct("<BBHIQIq")
_STAMP = struct.Struct("<Bq")
assert _HEADER.size == HEADER_LEN and _STAMP.size == STAMP_LEN

U16_MAX = (1 << 16) - 1
U32_MAX = (1 << 32) - 1
U64_MAX = (1 << 64) - 1
I64_MIN = -(1 << 63)
I64_MAX = (1 << 63) - 1

ERROR_NAMES = (
    "truncated",
    "unsupported_version",
    "too_many_stamps",
    "reserved_bits",
    "trailing_bytes",
    "invalid_trace_id",
    "bad_text_prefix",
    "bad_base64",
    "not_enveloped",
)


class TraceFormatError(ValueError):
    """A context that a v1 reader must reject; ``name`` is the error name of the spec."""

    def __init__(self, name: str, detail: str = ""):
        if name not in ERROR_NAMES and name not in ("bad_traceparent", "stamps_full"):
            raise AssertionError(f"unknown error name {name!r}")
        self.name = name
        self.detail = detail
        super().__init__(f"{name}: {detail}" if detail else name)


@dataclass
class TraceContext:
    publisher: int
    stream: int
    sequence: int
    metric_count: int
    intended_ns: int
    otel_trace_id: bytes | None = None
    stamps: list[tuple[int, int]] = field(default_factory=list)

    def validate(self) -> None:
        """Raise ValueError when the context cannot be represented in the v1 binary form."""
        _check_range("publisher", self.publisher, 0, U16_MAX)
        _check_range("stream", self.stream, 0, U32_MAX)
        _check_range("sequence", self.sequence, 0, U64_MAX)
        _check_range("metric_count", self.metric_count, 0, U32_MAX)
        _check_range("intended_ns", self.intended_ns, I64_MIN, I64_MAX)
        if self.otel_trace_id is not None:
            if not isinstance(self.otel_trace_id, (bytes, bytearray)):
                raise ValueError("otel_trace_id must be bytes or None")
            if len(self.otel_trace_id) != TRACE_ID_LEN:
                raise ValueError("otel_trace_id must be 16 bytes")
            if not any(self.otel_trace_id):
                raise ValueError("otel_trace_id must not be all zeros")
        if len(self.stamps) > MAX_STAMPS:
            raise ValueError(f"at most {MAX_STAMPS} stamps")
        for hop, ns in self.stamps:
            _check_range("stamp hop", hop, 0, 255)
            _check_range("stamp ns", ns, I64_MIN, I64_MAX)

    @property
    def binary_len(self) -> int:
        t = 1 if self.otel_trace_id is not None else 0
        return HEADER_LEN + TRACE_ID_LEN * t + STAMP_LEN * len(self.stamps)


def _check_range(what: str, value: int, lo: int, hi: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ValueError(f"{what} must be an integer in [{lo}, {hi}], got {value!r}")


def expected_len(info: int) -> int:
    """Length of the binary form announced by an ``info`` byte: 28 + 16*T + 9*N."""
    t = 1 if info & INFO_TRACE_ID_BIT else 0
    return HEADER_LEN + TRACE_ID_LEN * t + STAMP_LEN * (info & INFO_COUNT_MASK)


# --------------------------------------------------------------------------- binary


def encode_binary(ctx: TraceContext) -> bytes:
    ctx.validate()
    info = len(ctx.stamps)
    if ctx.otel_trace_id is not None:
        info |= INFO_TRACE_ID_BIT
    out = bytearray(
        _HEADER.pack(
            VERSION,
            info,
            ctx.publisher,
            ctx.stream,
            ctx.sequence,
            ctx.metric_count,
            ctx.intended_ns,
        )
    )
    if ctx.otel_trace_id is not None:
        out += bytes(ctx.otel_trace_id)
    for hop, ns in ctx.stamps:
        out += _STAMP.pack(hop, ns)
    return bytes(out)


def decode_binary(data: bytes) -> TraceContext:
    """Decode the binary form; the checks run in the order of the spec's table."""
    data = bytes(data)
    if len(data) < HEADER_LEN:
        raise TraceFormatError("truncated", f"{len(data)} bytes, header needs {HEADER_LEN}")
    version, info, publisher, stream, sequence, metric_count, intended_ns = _HEADER.unpack_from(
        data, 0
    )
    if version != VERSION:
        raise TraceFormatError("unsupported_version", f"version byte 0x{version:02x}")
    n = info & INFO_COUNT_MASK
    if n > MAX_STAMPS:
        raise TraceFormatError("too_many_stamps", f"N = {n}")
    if info & INFO_RESERVED_MASK:
        raise TraceFormatError("reserved_bits", f"info byte 0x{info:02x}")
    want = expected_len(info)
    if len(data) < want:
        raise TraceFormatError("truncated", f"{len(data)} bytes, context needs {want}")
    if len(data) > want:
        raise TraceFormatError("trailing_bytes", f"{len(data)} bytes, context needs {want}")
    offset = HEADER_LEN
    trace_id = None
    if info & INFO_TRACE_ID_BIT:
        trace_id = data[offset : offset + TRACE_ID_LEN]
        offset += TRACE_ID_LEN
        if not any(trace_id):
            raise TraceFormatError("invalid_trace_id", "trace id is 16 zero bytes")
    stamps = []
    for _ in range(n):
        hop, ns = _STAMP.unpack_from(data, offset)
        stamps.append((hop, ns))
        offset += STAMP_LEN
    return TraceContext(
        publisher=publisher,
        stream=stream,
        sequence=sequence,
        metric_count=metric_count,
        intended_ns=intended_ns,
        otel_trace_id=trace_id,
        stamps=stamps,
    )


def append_stamp_binary(data: bytes, hop: int, ns: int) -> bytes:
    """Append a stamp in place of re-encoding: add 9 bytes at the end and increment N.

    Raises TraceFormatError("stamps_full") when the context already holds 16 stamps
    (the caller keeps the context unchanged and reports stamps_full).
    """
    ctx = decode_binary(data)  # only well-formed contexts are stamped
    if len(ctx.stamps) >= MAX_STAMPS:
        raise TraceFormatError("stamps_full", f"{MAX_STAMPS} stamps already")
    _check_range("stamp hop", hop, 0, 255)
    _check_range("stamp ns", ns, I64_MIN, I64_MAX)
    out = bytearray(data)
    out[1] += 1
    out += _STAMP.pack(hop, ns)
    return bytes(out)


# --------------------------------------------------------------------------- text


def encode_text(ctx: TraceContext) -> str:
    raw = base64.urlsafe_b64encode(encode_binary(ctx)).decode("ascii")
    return TEXT_PREFIX + raw.rstrip("=")


def decode_base64url(s: str) -> bytes:
    """Strict base64url without padding, as the text form requires."""
    for ch in s:
        if ch not in BASE64URL_ALPHABET:
            # '=' (padding), '+', '/', whitespace and non-ASCII all land here.
            raise TraceFormatError("bad_base64", f"character {ch!r} outside base64url")
    if len(s) % 4 == 1:
        raise TraceFormatError("bad_base64", f"length {len(s)} is 1 modulo 4")
    # The alphabet check above already excluded '+' and '/', which
    # urlsafe_b64decode would otherwise accept.
    raw = base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))
    # Canonical encoding: the unused low bits of the last character must be zero,
    # i.e. re-encoding gives the same text.
    if base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=") != s:
        raise TraceFormatError("bad_base64", "non-zero unused bits in the last character")
    return raw


def decode_text(value: str) -> TraceContext:
    if not isinstance(value, str):
        raise TypeError("the text form is a str")
    if not value.startswith(TEXT_PREFIX):
        raise TraceFormatError("bad_text_prefix", "value does not start with 'ht1.'")
    return decode_binary(decode_base64url(value[len(TEXT_PREFIX) :]))


# --------------------------------------------------------------------------- envelope


def wrap_envelope(ctx: TraceContext, payload: bytes) -> bytes:
    binary = encode_binary(ctx)
    return ENVELOPE_MAGIC + bytes([len(binary)]) + binary + bytes(payload)


def unwrap_envelope(msg: bytes) -> tuple[TraceContext, bytes]:
    """Split an enveloped message into its context and the original payload.

    Raises TraceFormatError("not_enveloped") when the message does not start
    with the magic; the caller then keeps the message as the payload.
    """
    msg = bytes(msg)
    if not msg.startswith(ENVELOPE_MAGIC):
        raise TraceFormatError("not_enveloped", "no FF 48 54 31 magic")
    if len(msg) < ENVELOPE_HEADER_LEN:
        raise TraceFormatError("truncated", "magic without a length byte")
    length = msg[len(ENVELOPE_MAGIC)]
    end = ENVELOPE_HEADER_LEN + length
    if len(msg) < end:
        raise TraceFormatError("truncated", f"L = {length}, {len(msg) - ENVELOPE_HEADER_LEN} bytes follow")
    ctx = decode_binary(msg[ENVELOPE_HEADER_LEN:end])
    return ctx, msg[end:]


# --------------------------------------------------------------------------- traceparent

_LOWER_HEX = frozenset("0123456789abcdef")


def _is_lower_hex(s: str, length: int) -> bool:
    return len(s) == length and all(c in _LOWER_HEX for c in s)


def parse_traceparent(value: str) -> bytes:
    """Return the 16-byte trace id of a W3C traceparent value.

    Raises TraceFormatError("bad_traceparent") for a value the spec says to
    ignore and count: version other than 00, fields that are not lower-case hex
    of lengths 2-32-16-2, or an all-zero trace id or parent id.
    """
    parts = value.split("-")
    if len(parts) != 4:
        raise TraceFormatError("bad_traceparent", "expected 4 dash-separated fields")
    version, trace_id, parent_id, flags = parts
    if version != "00":
        raise TraceFormatError("bad_traceparent", f"version {version!r}")
    if not (
        _is_lower_hex(trace_id, 32) and _is_lower_hex(parent_id, 16) and _is_lower_hex(flags, 2)
    ):
        raise TraceFormatError("bad_traceparent", "fields are not lower-case hex 32-16-2")
    if set(trace_id) == {"0"} or set(parent_id) == {"0"}:
        raise TraceFormatError("bad_traceparent", "all-zero trace id or parent id")
    return bytes.fromhex(trace_id)


def lend_trace_id(ctx: TraceContext, traceparent: str) -> TraceContext:
    """Return ``ctx`` with the traceparent's trace id when it has none of its own.

    A context that already carries a trace id keeps it (the traceparent is not
    parsed).  A bad traceparent raises TraceFormatError("bad_traceparent").
    """
    if ctx.otel_trace_id is not None:
        return ctx
    return replace(ctx, otel_trace_id=parse_traceparent(traceparent))


# --------------------------------------------------------------------------- JSON helpers


def context_to_json(ctx: TraceContext) -> dict:
    return {
        "publisher": ctx.publisher,
        "stream": ctx.stream,
        "sequence": ctx.sequence,
        "metric_count": ctx.metric_count,
        "intended_ns": ctx.intended_ns,
        "otel_trace_id": None if ctx.otel_trace_id is None else ctx.otel_trace_id.hex(),
        "stamps": [{"hop": hop, "ns": ns} for hop, ns in ctx.stamps],
    }


def context_from_json(obj: dict) -> TraceContext:
    tid = obj["otel_trace_id"]
    return TraceContext(
        publisher=obj["publisher"],
        stream=obj["stream"],
        sequence=obj["sequence"],
        metric_count=obj["metric_count"],
        intended_ns=obj["intended_ns"],
        otel_trace_id=None if tid is None else bytes.fromhex(tid),
        stamps=[(s["hop"], s["ns"]) for s in obj["stamps"]],
    )
