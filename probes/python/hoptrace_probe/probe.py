"""The :class:`Probe`: stamps contexts at one hop and reports the stamps to the collector.

The hot path (:meth:`Probe.stamp`, :meth:`Probe.report`, :meth:`Probe.record`) reads the
clock, appends to the caller's context and appends one tuple to a bounded queue. It takes
no lock and never waits: when the queue is full the record is dropped and counted
(``queue_full``), and the count reaches the collector.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any, Callable, Deque, List, Optional, Tuple, TypeVar

from .carrier import CarrierError
from .clock import now_ns as _realtime_ns
from .context import MAX_STAMPS, TraceContext
from .counters import CounterSnapshot, Counters
from .protocol import Record, from_queued

log = logging.getLogger("hoptrace_probe")

T = TypeVar("T")


class NoStamp(LookupError):
    """The context holds no stamp of this probe's hop: call :meth:`Probe.stamp` first,
    or use :meth:`Probe.record`."""


class Shared:
    """State shared by an exporter (or a :class:`LocalQueue`) and all its probes."""

    def __init__(self, capacity: int) -> None:
        self.queue: Deque[Tuple[Any, ...]] = deque()
        self.capacity = max(1, int(capacity))
        self.counters = Counters()
        self.stopping = False


class Probe:
    """A probe for one hop. Probes of one exporter share its queue and counters; a probe
    may be used from any number of threads."""

    __slots__ = ("hop", "_now", "_queue", "_capacity", "_counters", "_shared")

    def __init__(self, hop: int, shared: Shared, clock: Optional[Callable[[], int]] = None) -> None:
        if not 0 <= hop <= 255:
            raise ValueError(f"hop id {hop} is not in 0..255")
        self.hop = hop
        self._now = clock or _realtime_ns
        self._shared = shared
        self._queue = shared.queue
        self._capacity = shared.capacity
        self._counters = shared.counters

    def now_ns(self) -> int:
        """This probe's clock, now (CLOCK_REALTIME ns unless a clock was injected)."""
        return self._now()

    def stamp(self, ctx: TraceContext) -> int:
        """Appends this hop's stamp to ``ctx`` (in-band) and returns its ns.

        A context that already holds 16 stamps is left unchanged and ``stamps_full`` is
        counted; the returned stamp can still be reported with :meth:`report_stamp`.
        """
        ns = self._now()
        stamps = ctx.stamps
        if len(stamps) < MAX_STAMPS:
            stamps.append((self.hop, ns))
        else:
            self._counters.cell().stamps_full += 1
        return ns

    def report(self, ctx: TraceContext) -> bool:
        """Hands this hop's most recent stamp in ``ctx`` to the collector (out of band).

        Returns ``False`` when the queue is full (the record is dropped and counted as
        ``queue_full``). Raises :class:`NoStamp` when ``ctx`` holds no stamp of this hop.
        """
        ns = ctx.stamp_of(self.hop)
        if ns is None:
            raise NoStamp(f"context {ctx.key} holds no stamp of hop {self.hop}")
        return self.report_stamp(ctx, ns)

    def report_stamp(self, ctx: TraceContext, stamp_ns: int) -> bool:
        """Hands a stamp of this hop taken at ``stamp_ns`` for ``ctx`` to the collector,
        whether or not it is in the context (a tap, or a context that was full).

        Returns ``False`` when the queue is full (dropped, counted as ``queue_full``).
        """
        q = self._queue
        if len(q) < self._capacity:
            tid = ctx.otel_trace_id
            if tid is None:
                q.append((0, self.hop, ctx.publisher, ctx.stream, ctx.sequence, stamp_ns,
                          ctx.metric_count, ctx.intended_ns))
            else:
                q.append((1, self.hop, ctx.publisher, ctx.stream, ctx.sequence, stamp_ns,
                          ctx.metric_count, ctx.intended_ns, tid))
            return True
        self._counters.cell().queue_full += 1
        return False

    def record(self, ctx: TraceContext) -> int:
        """Stamps ``ctx`` and reports the stamp: the usual call at a hop. Returns the ns.

        A full queue is counted (``queue_full``); the context is stamped either way.
        """
        ns = self._now()
        hop = self.hop
        stamps = ctx.stamps
        if len(stamps) < MAX_STAMPS:
            stamps.append((hop, ns))
        else:
            self._counters.cell().stamps_full += 1
        q = self._queue
        if len(q) < self._capacity:
            tid = ctx.otel_trace_id
            if tid is None:
                q.append((0, hop, ctx.publisher, ctx.stream, ctx.sequence, ns,
                          ctx.metric_count, ctx.intended_ns))
            else:
                q.append((1, hop, ctx.publisher, ctx.stream, ctx.sequence, ns,
                          ctx.metric_count, ctx.intended_ns, tid))
        else:
            self._counters.cell().queue_full += 1
        return ns

    def record_at(self, ctx: TraceContext, stamp_ns: int) -> int:
        """Stamps ``ctx`` with a time read earlier (one reading for a batch of messages)
        and reports it; returns ``stamp_ns``."""
        if not ctx.push_stamp(self.hop, stamp_ns):
            self._counters.cell().stamps_full += 1
        self.report_stamp(ctx, stamp_ns)
        return stamp_ns

    def counted(self, extract: Callable[..., T], *args: Any, **kwargs: Any) -> Optional[T]:
        """Calls a carrier's ``extract``/``unwrap`` and counts its outcome.

        Returns what it returned, or ``None`` for a message without a context
        (``not_traced``) or with one that does not decode (``bad_context``). An ignored
        ``traceparent`` is counted as ``bad_traceparent``.
        """
        try:
            got = extract(*args, **kwargs)
        except CarrierError as e:
            self._counters.count_extract(e)
            log.debug("hop %d: %s", self.hop, e)
            return None
        self._counters.count_extract(got)
        return got

    @property
    def counters(self) -> Counters:
        """The exporter's counters."""
        return self._counters

    def is_shutting_down(self) -> bool:
        """Whether the exporter is shutting down (reports may no longer be sent)."""
        return self._shared.stopping


class LocalQueue:
    """Probes whose records stay in this process: the caller pops them itself (tests, and
    measuring the probe without a network)."""

    def __init__(self, capacity: int) -> None:
        self.shared = Shared(capacity)

    def probe(self, hop: int, clock: Optional[Callable[[], int]] = None) -> Probe:
        """A probe for ``hop``."""
        return Probe(hop, self.shared, clock)

    def drain(self, max_records: int = 1 << 62) -> List[Record]:
        """Pops up to ``max_records`` records."""
        q = self.shared.queue
        pop = q.popleft
        out = [from_queued(pop()) for _ in range(min(len(q), max_records))]
        self.shared.counters.dequeued += len(out)
        return out

    def counters(self) -> CounterSnapshot:
        """The counters; records popped by :meth:`drain` count as sent."""
        s = self.shared.counters.snapshot(len(self.shared.queue))
        return s._replace(sent=self.shared.counters.dequeued)
