"""Kafka record headers: the binary form under the header ``hoptrace``.

Works with confluent-kafka's header lists: ``Message.headers()`` returns a list of
``(key, value)`` pairs (or ``None``), and ``Producer.produce(headers=...)`` takes one.
"""

from __future__ import annotations

from typing import Iterable, List, Optional, Tuple, Union

from ..context import DecodeError, TraceContext
from ..traceparent import TRACEPARENT
from . import HEADER, Extracted, combine

Header = Tuple[str, Union[bytes, str, None]]


def inject(ctx: TraceContext, headers: Optional[Iterable[Header]] = None) -> List[Header]:
    """Returns ``headers`` (a new list) with the context's binary form appended as ``hoptrace``.

    A ``hoptrace`` header already there is kept; the one added last wins on extraction.
    """
    out = list(headers) if headers else []
    out.append((HEADER, ctx.encode()))
    return out


def extract(headers: Optional[Iterable[Header]]) -> Extracted:
    """Takes the context (the last ``hoptrace`` header) and a ``traceparent``.

    Raises :class:`~hoptrace_probe.carrier.NotTraced` without a ``hoptrace`` header,
    :class:`~hoptrace_probe.carrier.BadContext` when the last one does not decode.
    """
    value: Optional[bytes] = None
    found = False
    tp: Union[bytes, str, None] = None
    has_tp = False
    for key, v in headers or ():
        if key == HEADER:
            found = True
            value = v.encode("utf-8") if isinstance(v, str) else (v or b"")
        elif key == TRACEPARENT:
            tp, has_tp = v, True
    context = error = None
    if found:
        try:
            context = TraceContext.decode(value or b"")
        except DecodeError as e:
            error = e
    return combine(context, error, tp, has_tp)
