"""MQTT v5 user properties: the text form under the property ``hoptrace``.

Works with paho-mqtt: a received message's ``msg.properties`` (``None`` or a
``Properties`` object whose ``UserProperty`` is a list of ``(key, value)`` pairs), and
a ``Properties(PacketTypes.PUBLISH)`` to publish with. Plain lists of pairs work too.
"""

from __future__ import annotations

from typing import Any, Iterable, List, Optional, Tuple

from ..context import DecodeError, TraceContext
from ..traceparent import TRACEPARENT
from . import HEADER, Extracted, combine

UserProperty = Tuple[str, str]


def inject(ctx: TraceContext, props: Any) -> Any:
    """Sets the user property ``hoptrace`` of ``props`` (e.g. paho's ``Properties``) to the
    context's text form, replacing any ``hoptrace`` property already there; returns
    ``props``. Other user properties (and a ``traceparent``) are kept in order.
    """
    kept = inject_user_properties(ctx, getattr(props, "UserProperty", None))
    if hasattr(props, "UserProperty"):
        # paho's Properties appends on assignment: remove the old list first.
        delattr(props, "UserProperty")
    props.UserProperty = kept
    return props


def inject_user_properties(ctx: TraceContext,
                           user_properties: Optional[Iterable[UserProperty]]) -> List[UserProperty]:
    """As :func:`inject`, on a bare list of pairs; returns a new list."""
    out = [(k, v) for k, v in (user_properties or ()) if k != HEADER]
    out.append((HEADER, ctx.to_text()))
    return out


def extract(props: Any) -> Extracted:
    """Takes the context (the last ``hoptrace`` property) and a ``traceparent`` from a
    message's properties (``None``, a publish without properties, is not traced).

    Raises :class:`~hoptrace_probe.carrier.NotTraced` without a ``hoptrace`` property,
    :class:`~hoptrace_probe.carrier.BadContext` when the last one does not decode.
    """
    return extract_user_properties(getattr(props, "UserProperty", None) if props is not None
                                   else None)


def extract_user_properties(user_properties: Optional[Iterable[UserProperty]]) -> Extracted:
    """As :func:`extract`, on a bare list of pairs."""
    value: Optional[str] = None
    tp: Optional[str] = None
    has_tp = False
    for key, v in user_properties or ():
        if key == HEADER:
            value = v if isinstance(v, str) else ""
        elif key == TRACEPARENT:
            tp, has_tp = v, True
    context = error = None
    if value is not None:
        try:
            context = TraceContext.decode_text(value)
        except DecodeError as e:
            error = e
    return combine(context, error, tp, has_tp)
