"""W3C ``traceparent`` values, so hoptrace results can be joined with OpenTelemetry traces.

Only version ``00`` is read: ``00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>``,
lower-case hex, exactly 55 characters (``docs/trace-format.md``, Carriers).
"""

from __future__ import annotations

from typing import Union

TRACEPARENT = "traceparent"
"""Header and user-property name of a W3C trace parent."""

_HEX = frozenset(b"0123456789abcdef")


class TraceparentError(ValueError):
    """A ``traceparent`` that is ignored (and counted as ``bad_traceparent``).

    ``reason`` is ``malformed``, ``unsupported_version`` or ``zero_id``.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"traceparent ignored: {reason}")


def parse(value: Union[str, bytes, bytearray, None]) -> bytes:
    """Returns the 16-byte trace id of a version-00 ``traceparent``.

    Raises :class:`TraceparentError` saying why the value is ignored.
    """
    if value is None:
        raise TraceparentError("malformed")
    raw = value.encode("utf-8", "replace") if isinstance(value, str) else bytes(value)
    if len(raw) != 55 or raw[2:3] != b"-" or raw[35:36] != b"-" or raw[52:53] != b"-":
        raise TraceparentError("malformed")
    fields = (raw[0:2], raw[3:35], raw[36:52], raw[53:55])
    if not all(_HEX.issuperset(f) for f in fields):
        raise TraceparentError("malformed")
    version, trace_id, parent_id, _flags = (bytes.fromhex(f.decode("ascii")) for f in fields)
    if version != b"\x00":
        raise TraceparentError("unsupported_version")
    if not any(trace_id) or not any(parent_id):
        raise TraceparentError("zero_id")
    return trace_id
