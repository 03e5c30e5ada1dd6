"""The publisher side: new trace contexts, the ``publish`` stamp, and what was sent.

A :class:`Publisher` numbers each stream's messages from 0, stamps them at egress, and
tells the collector what it sent (cumulative Sent frames, sent with every Counters frame
and at shutdown), so the run's accounting can add up.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple, Union

from .context import TraceContext
from .exporter import Exporter
from .protocol import MAX_SENT_PER_FRAME, Frame, Sent, SentEntry


class Publisher:
    """Trace contexts and accounting of one publisher id. Use one per thread (sequence
    numbers are assigned without a lock)."""

    def __init__(self, exporter: Exporter, publisher: int, hop: Union[int, str] = "publish") -> None:
        if not 0 <= publisher <= 0xFFFF:
            raise ValueError(f"publisher id {publisher} is not a u16")
        self.publisher = publisher
        self.probe = exporter.probe(hop)
        self._next: Dict[int, int] = {}
        # stream -> (messages, metrics, first_sequence, last_sequence), replaced whole so
        # that the exporter thread never reads a half-updated entry.
        self._sent: Dict[int, Tuple[int, int, int, int]] = {}
        exporter.add_frame_source(self.sent_frames)

    def context(self, stream: int, metric_count: int = 1,
                intended_ns: Optional[int] = None) -> TraceContext:
        """A new context: the stream's next sequence; ``intended_ns`` is the time the
        schedule meant the message to go (default: now)."""
        seq = self._next.get(stream, 0)
        self._next[stream] = seq + 1
        if intended_ns is None:
            intended_ns = self.probe.now_ns()
        return TraceContext(self.publisher, stream, seq, metric_count, intended_ns)

    def published(self, ctx: TraceContext) -> int:
        """Stamps ``ctx`` with the publish hop, reports it, and counts the message as
        sent. Call it as the message is handed to the broker client; returns the stamp."""
        ns = self.probe.record(ctx)
        self.count_sent(ctx)
        return ns

    def count_sent(self, ctx: TraceContext) -> None:
        """Counts ``ctx``'s message as sent, without stamping it."""
        entry = self._sent.get(ctx.stream)
        if entry is None:
            self._sent[ctx.stream] = (1, ctx.metric_count, ctx.sequence, ctx.sequence)
        else:
            messages, metrics, first, last = entry
            self._sent[ctx.stream] = (messages + 1, metrics + ctx.metric_count,
                                      min(first, ctx.sequence), max(last, ctx.sequence))

    def sent_frames(self) -> List[Frame]:
        """The cumulative Sent frames, split at :data:`~hoptrace_probe.protocol.MAX_SENT_PER_FRAME`
        streams so that each fits in one frame."""
        entries = [SentEntry(s, *e) for s, e in sorted(list(self._sent.items()))]
        return [Sent(self.publisher, entries[i:i + MAX_SENT_PER_FRAME])
                for i in range(0, len(entries), MAX_SENT_PER_FRAME)]
