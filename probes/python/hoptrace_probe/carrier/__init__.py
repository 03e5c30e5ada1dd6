"""Carriers move a :class:`~hoptrace_probe.context.TraceContext` with a message.

- :mod:`.mqtt_property`: MQTT v5 user property ``hoptrace``, text form (paho-mqtt);
- :mod:`.kafka_header`: Kafka record header ``hoptrace``, binary form (confluent-kafka);
- :mod:`.envelope`: the binary form in front of the payload (MQTT 3.1.1, raw bytes).

Extraction never raises anything but a :class:`CarrierError`: :class:`NotTraced` for a
message without a context, :class:`BadContext` for one that does not decode. The probe's
:meth:`~hoptrace_probe.probe.Probe.counted` counts both. None of these modules imports a
client library: they work on the plain values the clients hand over.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Union

from .. import traceparent as _tp
from ..context import DecodeError, TraceContext

HEADER = "hoptrace"
"""Header and user-property name of the trace context."""


class CarrierError(Exception):
    """No context could be taken from a message."""


class NotTraced(CarrierError):
    """The message carries no hoptrace context (sent by something else, or not sampled)."""

    def __init__(self) -> None:
        super().__init__("message carries no hoptrace context")


class BadContext(CarrierError):
    """A context is present but does not decode; ``error`` says why."""

    def __init__(self, error: DecodeError) -> None:
        self.error = error
        super().__init__(f"bad hoptrace context: {error}")


class Extracted(NamedTuple):
    """A context taken from a message."""

    context: TraceContext
    """The context, with the trace id of a valid ``traceparent`` when it had none."""
    bad_traceparent: Optional[_tp.TraceparentError] = None
    """Set when a ``traceparent`` was present but ignored."""


Value = Union[str, bytes, bytearray, None]


def combine(context: Optional[TraceContext], error: Optional[DecodeError],
            traceparent: Value, has_traceparent: bool) -> Extracted:
    """Builds the extraction of the last ``hoptrace`` value and the last ``traceparent``.

    ``context``/``error`` are the decoding of the last ``hoptrace`` value (both ``None``
    when there was none).
    """
    if error is not None:
        raise BadContext(error)
    if context is None:
        raise NotTraced()
    bad = None
    if has_traceparent:
        try:
            trace_id = _tp.parse(traceparent)
        except _tp.TraceparentError as e:
            bad = e
        else:
            if context.otel_trace_id is None:
                context.otel_trace_id = trace_id
    return Extracted(context, bad)
