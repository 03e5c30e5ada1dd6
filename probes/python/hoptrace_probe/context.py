"""The trace context and its binary and text forms (``docs/trace-format.md``, version 1).

A :class:`TraceContext` names a message (publisher, stream, sequence), says how many
metrics it carries and when the publisher meant to send it, and collects up to 16 stamps
``(hop id, CLOCK_REALTIME ns)``. Decoding rejects bad input with a :class:`DecodeError`
whose ``name`` is the error name of the document; encoding refuses, with ``ValueError``,
a context the binary form cannot carry.
"""

from __future__ import annotations

import base64
import binascii
import struct
from itertools import chain
from typing import Dict, List, Optional, Tuple

VERSION = 0x01
"""Byte 0 of the binary form."""
HEADER_LEN = 28
"""Bytes of the fixed header."""
TRACE_ID_LEN = 16
"""Bytes of an OpenTelemetry trace id."""
STAMP_LEN = 9
"""Bytes of one stamp (hop u8, ns i64)."""
MAX_STAMPS = 16
"""Most stamps one context holds."""
MAX_BINARY_LEN = HEADER_LEN + TRACE_ID_LEN + STAMP_LEN * MAX_STAMPS
"""Longest binary form: 188 bytes."""
TEXT_PREFIX = "ht1."
"""Prefix of the text form."""

_COUNT_MASK = 0x1F
_RESERVED_MASK = 0x60
_TRACE_ID_BIT = 0x80
_LAYOUTS: Dict[Tuple[bool, int], struct.Struct] = {}


def _layout(trace_id: bool, stamps: int) -> struct.Struct:
    """The whole binary form as one struct: header, trace id, ``stamps`` stamps."""
    key = (trace_id, stamps)
    st = _LAYOUTS.get(key)
    if st is None:
        st = _LAYOUTS[key] = struct.Struct("<BBHIQIq" + ("16s" if trace_id else "") + "Bq" * stamps)
    return st
_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
_B64_ALPHABET = frozenset(_B64)
_B64_VALUE = {c: i for i, c in enumerate(_B64)}

_U16 = 0xFFFF
_U32 = 0xFFFF_FFFF
_U64 = 0xFFFF_FFFF_FFFF_FFFF
_I64_MIN = -(1 << 63)
_I64_MAX = (1 << 63) - 1

Stamp = Tuple[int, int]
"""One stamp: ``(hop id, ns)``."""


class DecodeError(ValueError):
    """Bytes or text that a version 1 reader must reject.

    ``name`` is the error of ``docs/trace-format.md``: ``truncated``,
    ``unsupported_version``, ``too_many_stamps``, ``reserved_bits``, ``trailing_bytes``,
    ``invalid_trace_id``, ``bad_text_prefix``, ``bad_base64`` or ``not_enveloped``.
    """

    def __init__(self, name: str, detail: str = "") -> None:
        self.name = name
        super().__init__(f"{name}: {detail}" if detail else name)


class TraceContext:
    """What travels with a message: trace key, metric count, intended time, stamps.

    ``stamps`` is a list of ``(hop, ns)`` tuples in the order they were appended.
    ``otel_trace_id`` is 16 bytes (not all zero) or ``None``.
    """

    __slots__ = ("publisher", "stream", "sequence", "metric_count", "intended_ns",
                 "otel_trace_id", "stamps")

    def __init__(self, publisher: int, stream: int, sequence: int, metric_count: int = 1,
                 intended_ns: int = 0, otel_trace_id: Optional[bytes] = None,
                 stamps: Optional[List[Stamp]] = None) -> None:
        self.publisher = publisher
        self.stream = stream
        self.sequence = sequence
        self.metric_count = metric_count
        self.intended_ns = intended_ns
        self.otel_trace_id = otel_trace_id
        self.stamps: List[Stamp] = list(stamps) if stamps else []

    # ----------------------------------------------------------------------- stamps

    def push_stamp(self, hop: int, ns: int) -> bool:
        """Appends a stamp; returns ``False`` (context unchanged) when it holds 16."""
        if len(self.stamps) >= MAX_STAMPS:
            return False
        self.stamps.append((hop, ns))
        return True

    def stamp_of(self, hop: int) -> Optional[int]:
        """The ns of the most recent stamp of ``hop``, or ``None``."""
        for h, ns in reversed(self.stamps):
            if h == hop:
                return ns
        return None

    @property
    def key(self) -> Tuple[int, int, int]:
        """The trace key ``(publisher, stream, sequence)``."""
        return (self.publisher, self.stream, self.sequence)

    # ----------------------------------------------------------------------- binary

    def binary_len(self) -> int:
        """Length of the binary form: ``28 + 16*T + 9*N``."""
        t = TRACE_ID_LEN if self.otel_trace_id is not None else 0
        return HEADER_LEN + t + STAMP_LEN * len(self.stamps)

    def validate(self) -> None:
        """Raises ``ValueError`` when the binary form cannot carry this context."""
        _check("publisher", self.publisher, 0, _U16)
        _check("stream", self.stream, 0, _U32)
        _check("sequence", self.sequence, 0, _U64)
        _check("metric_count", self.metric_count, 0, _U32)
        _check("intended_ns", self.intended_ns, _I64_MIN, _I64_MAX)
        tid = self.otel_trace_id
        if tid is not None:
            if not isinstance(tid, (bytes, bytearray)) or len(tid) != TRACE_ID_LEN:
                raise ValueError("otel_trace_id must be 16 bytes or None")
            if not any(tid):
                raise ValueError("otel_trace_id must not be all zeros")
        if len(self.stamps) > MAX_STAMPS:
            raise ValueError(f"at most {MAX_STAMPS} stamps, got {len(self.stamps)}")
        for hop, ns in self.stamps:
            _check("stamp hop", hop, 0, 0xFF)
            _check("stamp ns", ns, _I64_MIN, _I64_MAX)

    def encode(self) -> bytes:
        """The binary form.

        Raises ``ValueError`` for a context it cannot carry (a programming error).
        """
        stamps = self.stamps
        tid = self.otel_trace_id
        n = len(stamps)
        if n > MAX_STAMPS or (tid is not None and (len(tid) != TRACE_ID_LEN or not any(tid))):
            self.validate()
        try:
            if tid is None:
                return _layout(False, n).pack(
                    VERSION, n, self.publisher, self.stream, self.sequence, self.metric_count,
                    self.intended_ns, *chain.from_iterable(stamps))
            return _layout(True, n).pack(
                VERSION, n | _TRACE_ID_BIT, self.publisher, self.stream, self.sequence,
                self.metric_count, self.intended_ns, bytes(tid), *chain.from_iterable(stamps))
        except (struct.error, TypeError) as e:
            self.validate()  # says which field
            raise ValueError(f"context cannot be encoded: {e}") from None

    @classmethod
    def decode(cls, data: bytes) -> "TraceContext":
        """Reads exactly one binary form; raises :class:`DecodeError`.

        The rules are checked in the order of the document's table.
        """
        if not isinstance(data, bytes):
            data = bytes(data)
        n = len(data)
        if n < HEADER_LEN:
            raise DecodeError("truncated", f"{n} bytes, the header needs {HEADER_LEN}")
        version, info = data[0], data[1]
        if version != VERSION:
            raise DecodeError("unsupported_version", f"version {version}")
        count = info & _COUNT_MASK
        if count > MAX_STAMPS:
            raise DecodeError("too_many_stamps", f"{count} stamps")
        if info & _RESERVED_MASK:
            raise DecodeError("reserved_bits", f"info byte {info:#04x}")
        has_id = bool(info & _TRACE_ID_BIT)
        expected = HEADER_LEN + (TRACE_ID_LEN if has_id else 0) + STAMP_LEN * count
        if n < expected:
            raise DecodeError("truncated", f"{n} bytes, the header declares {expected}")
        if n > expected:
            raise DecodeError("trailing_bytes", f"{n - expected} bytes after the context")
        v = _layout(has_id, count).unpack(data)
        at = 7
        tid = None
        if has_id:
            tid = v[7]
            if not any(tid):
                raise DecodeError("invalid_trace_id", "all-zero trace id")
            at = 8
        ctx = cls(v[2], v[3], v[4], v[5], v[6], tid)
        ctx.stamps = list(zip(v[at::2], v[at + 1::2]))
        return ctx

    # ----------------------------------------------------------------------- text

    def to_text(self) -> str:
        """The text form: ``ht1.`` + base64url without padding."""
        return TEXT_PREFIX + base64.urlsafe_b64encode(self.encode()).rstrip(b"=").decode("ascii")

    @classmethod
    def decode_text(cls, text: str) -> "TraceContext":
        """Reads the text form; raises :class:`DecodeError`."""
        if not isinstance(text, str) or not text.startswith(TEXT_PREFIX):
            raise DecodeError("bad_text_prefix")
        body = text[len(TEXT_PREFIX):]
        if not _B64_ALPHABET.issuperset(body) or len(body) % 4 == 1:
            raise DecodeError("bad_base64", "not base64url without padding")
        # Canonical: the unused low bits of the last character are zero (4 bits when the
        # length is 2 modulo 4, 2 bits when it is 3).
        unused = (0, 0, 0x0F, 0x03)[len(body) % 4]
        if unused and _B64_VALUE[body[-1]] & unused:
            raise DecodeError("bad_base64", "non-zero unused bits in the last character")
        try:
            raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        except (binascii.Error, ValueError) as e:  # pragma: no cover - alphabet checked
            raise DecodeError("bad_base64", str(e)) from None
        return cls.decode(raw)

    # ----------------------------------------------------------------------- misc

    def copy(self) -> "TraceContext":
        """An independent copy (the stamps list is copied)."""
        return TraceContext(self.publisher, self.stream, self.sequence, self.metric_count,
                            self.intended_ns, self.otel_trace_id, self.stamps)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TraceContext):
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in self.__slots__)

    def __repr__(self) -> str:
        tid = self.otel_trace_id.hex() if self.otel_trace_id is not None else None
        return (f"TraceContext(publisher={self.publisher}, stream={self.stream}, "
                f"sequence={self.sequence}, metric_count={self.metric_count}, "
                f"intended_ns={self.intended_ns}, otel_trace_id={tid!r}, "
                f"stamps={self.stamps!r})")

    __hash__ = None  # type: ignore[assignment]  # mutable


def _check(what: str, value: object, lo: int, hi: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ValueError(f"{what} must be an integer in [{lo}, {hi}], got {value!r}")
