"""The probe's counters: one place per event kind, sent to the collector in Counters
frames (ids in ``docs/collector-protocol.md``).

Application threads count in a cell of their own (no lock, no lost update: each cell has
one writer); the exporter thread owns the counters it alone changes. A snapshot sums the
cells. ``reported`` is derived (dequeued + queue_full + still queued), so a successful
``report()`` touches no counter at all.
"""

from __future__ import annotations

import threading
from typing import Dict, List, NamedTuple, Tuple

from .carrier import BadContext, CarrierError, Extracted, NotTraced
from .protocol import COUNTER_NAMES, CounterId


class CounterSnapshot(NamedTuple):
    """A point-in-time copy of the counters."""

    reported: int = 0
    """Records handed to ``report()``."""
    queue_full: int = 0
    """Records that could not be queued: lost, counted."""
    sent: int = 0
    """Records written to the collector."""
    send_failed: int = 0
    """Records of frames that failed to write (or could not be delivered): lost, counted."""
    reconnects: int = 0
    """Successful connections after the first."""
    not_traced: int = 0
    """Messages seen without a trace context."""
    bad_context: int = 0
    """Trace contexts that failed to decode."""
    stamps_full: int = 0
    """Stamps not appended in-band because the context held 16."""
    bad_traceparent: int = 0
    """``traceparent`` values ignored."""
    resent: int = 0
    """Records sent again after a reconnection because no Ack had covered them (version 2)."""
    evicted: int = 0
    """Records dropped from the retention buffer (full) before an Ack covered them
    (version 2)."""
    lost_unacked: int = 0
    """Of ``evicted``, the records the collector did not hold when the exporter reconnected,
    or that were never written: lost, counted (version 2)."""

    def to_wire(self) -> List[Tuple[int, int]]:
        """``(id, value)`` pairs for a Counters frame."""
        return [(CounterId.REPORTED, self.reported), (CounterId.QUEUE_FULL, self.queue_full),
                (CounterId.SENT, self.sent), (CounterId.SEND_FAILED, self.send_failed),
                (CounterId.RECONNECTS, self.reconnects), (CounterId.NOT_TRACED, self.not_traced),
                (CounterId.BAD_CONTEXT, self.bad_context),
                (CounterId.STAMPS_FULL, self.stamps_full),
                (CounterId.BAD_TRACEPARENT, self.bad_traceparent),
                (CounterId.RESENT, self.resent), (CounterId.EVICTED, self.evicted),
                (CounterId.LOST_UNACKED, self.lost_unacked)]

    def by_name(self) -> Dict[str, int]:
        """The counters by their names in the document."""
        return {COUNTER_NAMES[i]: v for i, v in self.to_wire()}

    def lost(self) -> int:
        """Records lost by this exporter (could not be queued or sent, or evicted unstored),
        as the collector adds them up in ``records_lost_by_probes``."""
        return self.queue_full + self.send_failed + self.lost_unacked


class _Cell:
    """The counts of one application thread."""

    __slots__ = ("queue_full", "stamps_full", "not_traced", "bad_context", "bad_traceparent")

    def __init__(self) -> None:
        self.queue_full = 0
        self.stamps_full = 0
        self.not_traced = 0
        self.bad_context = 0
        self.bad_traceparent = 0


class Counters:
    """Counters shared by an exporter and all its probes."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._cells: List[_Cell] = []
        self._register = threading.Lock()
        # Written by the exporter thread only.
        self.dequeued = 0
        self.sent = 0
        self.send_failed = 0
        self.reconnects = 0
        self.resent = 0
        self.evicted = 0
        self.lost_unacked = 0

    def cell(self) -> _Cell:
        """This thread's cell (made and registered on the thread's first count)."""
        try:
            return self._local.cell  # type: ignore[no-any-return]
        except AttributeError:
            c = _Cell()
            with self._register:  # once per thread
                self._cells.append(c)
            self._local.cell = c
            return c

    def count_extract(self, outcome: object) -> None:
        """Counts a carrier extraction's outcome: an :class:`Extracted` (or a tuple that
        starts with one) whose ``traceparent`` was ignored, or a :class:`CarrierError`."""
        if isinstance(outcome, tuple) and not isinstance(outcome, Extracted) and outcome:
            outcome = outcome[0]
        if isinstance(outcome, Extracted):
            if outcome.bad_traceparent is not None:
                self.cell().bad_traceparent += 1
        elif isinstance(outcome, NotTraced):
            self.cell().not_traced += 1
        elif isinstance(outcome, BadContext):
            self.cell().bad_context += 1
        elif isinstance(outcome, CarrierError):  # pragma: no cover - no other kinds yet
            self.cell().bad_context += 1

    def snapshot(self, queued: int) -> CounterSnapshot:
        """Reads every counter; ``queued`` is the number of records still in the queue."""
        cells = list(self._cells)
        queue_full = sum(c.queue_full for c in cells)
        return CounterSnapshot(
            reported=self.dequeued + queue_full + queued,
            queue_full=queue_full,
            sent=self.sent,
            send_failed=self.send_failed,
            reconnects=self.reconnects,
            not_traced=sum(c.not_traced for c in cells),
            bad_context=sum(c.bad_context for c in cells),
            stamps_full=sum(c.stamps_full for c in cells),
            bad_traceparent=sum(c.bad_traceparent for c in cells),
            resent=self.resent,
            evicted=self.evicted,
            lost_unacked=self.lost_unacked,
        )
