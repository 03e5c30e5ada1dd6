"""Frames other than records that wait for the collector (:meth:`Exporter.send_frame
<hoptrace_probe.exporter.Exporter.send_frame>`), bounded however long the collector is away.

The cumulative kinds keep only what the collector would keep (``docs/collector-protocol.md``):

- **Sent**: one entry per (publisher, stream), the newest; an entry is a snapshot of the
  stream's totals, so a newer one replaces an older one and nothing is lost.
- **Counters**: one value per counter id, the newest (each value is cumulative and the
  collector keeps the latest value of each id); the frame's ``at_ns`` is the newest.
- **Clock**: the newest status only.

Any other kind a host may send (Records) waits in a first-in first-out list of at most
``max_other`` frames; beyond it the new frame is refused and counted. Frames that only the
exporter may send (Hello, SeqRecords, Goodbye) or that only a collector sends are refused
with ``ValueError``.

Pushing takes a lock held only while a few dictionary entries change, never across I/O;
taking swaps the held frames out under it and builds the frames to send after releasing it.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Deque, Dict, List, NamedTuple, Optional, Tuple

from . import protocol
from .protocol import MAX_SENT_PER_FRAME, Clock, Counters, Frame, Records, Sent, SentEntry

# Counters ids per Counters frame: the count is a u8.
_MAX_COUNTERS_PER_FRAME = 255


class ControlFootprint(NamedTuple):
    """What the control frames hold now."""

    sent_entries: int
    """Sent entries, one per (publisher, stream)."""
    counter_ids: int
    """Counter ids with a value waiting."""
    clock: int
    """1 when a Clock status waits, else 0."""
    other_frames: int
    """Frames of other kinds waiting (at most ``max_other``)."""


class ControlFrames:
    """The bounded store of control frames between host threads and the exporter thread."""

    def __init__(self, max_other: int) -> None:
        if max_other < 0:
            raise ValueError(f"max_other {max_other} must be 0 or more")
        self.max_other = max_other
        self._lock = threading.Lock()
        self._sent: Dict[Tuple[int, int], SentEntry] = {}
        self._counters: Dict[int, int] = {}
        self._counters_at = 0
        self._clock: Optional[Clock] = None
        self._other: Deque[Frame] = deque()
        self.refused = 0
        """Frames of other kinds refused because ``max_other`` were waiting."""
        self.refused_records = 0
        """Records in the Records frames among them."""

    def push(self, frame: Frame) -> bool:
        """Keeps ``frame`` until :meth:`take`; returns ``False`` when it was refused because
        ``max_other`` frames of other kinds wait already (counted in :attr:`refused`)."""
        if isinstance(frame, Sent):
            with self._lock:
                for e in frame.entries:
                    self._sent[(frame.publisher, e.stream)] = e
            return True
        if isinstance(frame, Counters):
            with self._lock:
                for i, v in frame.values:
                    self._counters[i] = v
                self._counters_at = max(self._counters_at, frame.at_ns)
            return True
        if isinstance(frame, Clock):
            with self._lock:
                self._clock = frame
            return True
        if isinstance(frame, Records):
            with self._lock:
                if len(self._other) < self.max_other:
                    self._other.append(frame)
                    return True
                self.refused += 1
                self.refused_records += len(frame.records)
            return False
        raise ValueError(f"{type(frame).__name__} frames are the exporter's own or the "
                         "collector's: send_frame takes Sent, Counters, Clock and Records")

    def take(self) -> List[Frame]:
        """Everything held, as frames to send in this order: Clock, Sent (per publisher, at
        most :data:`~hoptrace_probe.protocol.MAX_SENT_PER_FRAME` entries each), Counters,
        then the other frames in the order they came; the store is empty afterwards."""
        with self._lock:
            if not (self._sent or self._counters or self._clock or self._other):
                return []
            sent, self._sent = self._sent, {}
            counters, self._counters = self._counters, {}
            at, clock, self._clock = self._counters_at, self._clock, None
            other, self._other = self._other, deque()
        frames: List[Frame] = []
        if clock is not None:
            frames.append(clock)
        by_publisher: Dict[int, List[SentEntry]] = {}
        for (publisher, _), e in sent.items():
            by_publisher.setdefault(publisher, []).append(e)
        for publisher, entries in by_publisher.items():
            entries.sort(key=lambda e: e.stream)
            frames += [Sent(publisher, entries[i:i + MAX_SENT_PER_FRAME])
                       for i in range(0, len(entries), MAX_SENT_PER_FRAME)]
        values = sorted(counters.items())
        frames += [protocol.Counters(at, values[i:i + _MAX_COUNTERS_PER_FRAME])
                   for i in range(0, len(values), _MAX_COUNTERS_PER_FRAME)]
        frames += other
        return frames

    def waiting_records(self) -> int:
        """Records in the Records frames waiting (they are part of what is queued)."""
        with self._lock:
            return sum(len(f.records) for f in self._other)  # type: ignore[union-attr]

    def restore(self, frames: List[Frame]) -> None:
        """Puts back the Sent, Counters and Clock frames of a write that failed, where
        nothing newer took their place meanwhile (so they reach the next connection).
        Records frames are not put back: their write failed, and they are counted so."""
        with self._lock:
            for f in frames:
                if isinstance(f, Sent):
                    for e in f.entries:
                        self._sent.setdefault((f.publisher, e.stream), e)
                elif isinstance(f, Counters):
                    for i, v in f.values:
                        self._counters.setdefault(i, v)
                    self._counters_at = max(self._counters_at, f.at_ns)
                elif isinstance(f, Clock) and self._clock is None:
                    self._clock = f

    def footprint(self) -> ControlFootprint:
        """How much is held now."""
        with self._lock:
            return ControlFootprint(len(self._sent), len(self._counters),
                                    int(self._clock is not None), len(self._other))

    def __bool__(self) -> bool:
        return bool(self._sent or self._counters or self._clock is not None or self._other)
