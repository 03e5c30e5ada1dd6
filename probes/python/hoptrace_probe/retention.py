"""The records frames an exporter keeps until the collector acknowledges them as durable
(collector protocol version 2, ``docs/collector-protocol.md`` "0x07 SeqRecords"): bounded
in bytes, oldest dropped first, and every dropped record accounted for once the exporter
learns what the collector holds. The same bookkeeping as the Rust probe's
``probe/src/retention.rs``.
"""

from __future__ import annotations

from collections import deque
from typing import Deque, Iterator, List, Tuple


class Retained:
    """One numbered records frame."""

    __slots__ = ("seq", "records", "data", "written")

    def __init__(self, seq: int, records: int, data: bytes, written: bool = False) -> None:
        self.seq = seq
        """The frame's number."""
        self.records = records
        """Records in it."""
        self.data = data
        """The frame's bytes, length prefix included."""
        self.written = written
        """Written to a connection (else numbered while no collector was reachable)."""


class Retention:
    """Frames sent (or numbered) and not yet acknowledged, at most ``max_bytes`` of them."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._frames: Deque[Retained] = deque()
        self._bytes = 0
        # Frames dropped unacknowledged, (number, records, written), oldest first: whether a
        # written one is lost is known only when the collector says what it holds. Only
        # the newest may be unwritten here (it can still be marked written).
        self._evicted: Deque[List] = deque()
        # Records of older frames dropped before they were ever written: no collector holds
        # them. A sum, so that a long outage costs no memory beyond the bound.
        self._evicted_unwritten = 0
        self.acked = 0
        """Highest number acknowledged."""

    def push(self, frame: Retained) -> int:
        """Keeps a frame; returns the records of older frames dropped to make room (they
        are then ``evicted``)."""
        self._settle_evicted_unwritten()
        self._bytes += len(frame.data)
        self._frames.append(frame)
        dropped = 0
        while self._bytes > self.max_bytes and self._frames:
            old = self._frames.popleft()
            self._bytes -= len(old.data)
            dropped += old.records
            self._evicted.append([old.seq, old.records, old.written])
            # An unwritten frame that is not the newest will never be written.
            if self._frames and self._frames[-1].seq > old.seq:
                self._settle_evicted_unwritten()
        return dropped

    def _settle_evicted_unwritten(self) -> None:
        if self._evicted and not self._evicted[-1][2]:
            self._evicted_unwritten += self._evicted.pop()[1]

    def ack(self, seq: int) -> None:
        """The collector holds every frame up to ``seq`` durably."""
        if seq <= self.acked:
            return
        self.acked = seq
        while self._frames and self._frames[0].seq <= seq:
            self._bytes -= len(self._frames.popleft().data)
        while self._evicted and self._evicted[0][0] <= seq:
            self._evicted.popleft()

    def resume(self, resume_seq: int) -> int:
        """After a (re)connection the collector holds frames up to ``resume_seq``: forgets
        those and returns the records of evicted frames above it, which are lost. The
        frames still kept are then to be sent again (:meth:`frames`)."""
        self.ack(resume_seq)
        # A restarted collector may hold less than it acknowledged (a lost disk).
        self.acked = resume_seq
        lost = sum(e[1] for e in self._evicted) + self._evicted_unwritten
        self._evicted.clear()
        self._evicted_unwritten = 0
        return lost

    def frames(self) -> Iterator[Retained]:
        """The frames kept, oldest first."""
        return iter(self._frames)

    def mark_written(self, seq: int) -> None:
        """The newest frame, number ``seq``, was written to a connection (kept, or when
        larger than the whole buffer already evicted)."""
        if self._frames and self._frames[-1].seq == seq:
            self._frames[-1].written = True
        elif self._evicted and self._evicted[-1][0] == seq:
            self._evicted[-1][2] = True

    def evicted_unresolved(self) -> Tuple[int, int]:
        """Records of evicted frames whose fate no collector told: (written, so perhaps
        held; never written, so lost)."""
        written, unwritten = 0, self._evicted_unwritten
        for _, n, w in self._evicted:
            if w:
                written += n
            else:
                unwritten += n
        return written, unwritten

    def unwritten_records(self) -> int:
        """Records kept that were never written to a connection."""
        return sum(f.records for f in self._frames if not f.written)

    def unacked_records(self) -> int:
        """Records kept, not yet acknowledged."""
        return sum(f.records for f in self._frames)

    def footprint(self) -> Tuple[int, int]:
        """Bytes of frames kept, and entries kept about evicted frames."""
        return self._bytes, len(self._evicted)
