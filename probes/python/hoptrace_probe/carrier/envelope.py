"""The envelope form: the binary context in front of an opaque payload, for MQTT 3.1.1
and transports without headers. Layout in ``docs/trace-format.md``."""

from __future__ import annotations

from typing import Tuple

from ..context import DecodeError, TraceContext
from . import BadContext, Extracted, NotTraced

MAGIC = b"\xffHT1"
"""The four bytes every envelope starts with: ``0xFF`` then ASCII ``HT1``."""
PREFIX_LEN = len(MAGIC) + 1
"""Bytes in front of the binary context (magic and length byte)."""


def wrap(ctx: TraceContext, payload: bytes = b"") -> bytes:
    """The envelope of ``ctx`` around ``payload``."""
    binary = ctx.encode()
    return b"".join((MAGIC, bytes((len(binary),)), binary, payload))


def decode(message: bytes) -> Tuple[TraceContext, bytes]:
    """Splits an envelope into its context and the original payload.

    Raises :class:`~hoptrace_probe.context.DecodeError`: ``not_enveloped`` when the message
    does not start with :data:`MAGIC`, else the first rule of the document that fails.
    """
    message = bytes(message)
    if not message.startswith(MAGIC):
        raise DecodeError("not_enveloped")
    if len(message) < PREFIX_LEN:
        raise DecodeError("truncated", "no length byte after the magic")
    end = PREFIX_LEN + message[len(MAGIC)]
    if len(message) < end:
        raise DecodeError("truncated", f"{len(message)} bytes, the length byte needs {end}")
    return TraceContext.decode(message[PREFIX_LEN:end]), message[end:]


def unwrap(message: bytes) -> Tuple[Extracted, bytes]:
    """As :func:`decode`, with carrier errors: :class:`~hoptrace_probe.carrier.NotTraced`
    when the message is not enveloped (use it as the payload unchanged),
    :class:`~hoptrace_probe.carrier.BadContext` when the envelope is broken."""
    try:
        ctx, payload = decode(message)
    except DecodeError as e:
        if e.name == "not_enveloped":
            raise NotTraced() from None
        raise BadContext(e) from None
    return Extracted(ctx), payload
