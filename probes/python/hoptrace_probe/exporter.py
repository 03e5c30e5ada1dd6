"""The :class:`Exporter`: one background thread per process that drains the probes' queue
into records frames over TCP to the collector (``docs/collector-protocol.md``), sends the
host's clock status, the counters and what publishers sent, reconnects with backoff, and
flushes on :meth:`Exporter.shutdown`.

With a version 2 collector (``hoptrace collect`` with its log, the default) records frames
are numbered (SeqRecords) and kept in a bounded retention buffer until the collector
acknowledges them as durable; after a reconnection (a collector killed and restarted with
the same ``--run-id``) the exporter re-sends what the collector does not hold, so a
collector restart loses nothing. While no collector is reachable the records go on into
the buffer; beyond its bound the oldest are dropped and counted (``evicted``, and
``lost_unacked`` for those the collector never stored). With a version 1 collector
(``--no-log``) it speaks version 1: nothing is kept once written.
"""

from __future__ import annotations

import atexit
import logging
import os
import select
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple, Union

from . import protocol
from ._version import __version__
from .clock import ClockStatusSource, UnknownClockStatus, now_ns, source_named, this_host
from .control import ControlFootprint, ControlFrames
from .counters import CounterSnapshot
from .probe import Probe, Shared
from .protocol import Frame
from .retention import Retained, Retention

log = logging.getLogger("hoptrace_probe")

# Version 2: how often, at most, the exporter reads the collector's Acks while busy.
# How long a connection must have lasted for its loss to look like a collector restart.
_HEALTHY_CONNECTION_S = 1.0
_ACK_READ_INTERVAL_S = 0.05


@dataclass
class ExporterConfig:
    """How an exporter reaches the collector and paces itself. Times in seconds."""

    collector: str
    """Collector address, ``host:port`` (``[v6addr]:port`` for IPv6)."""
    process: str
    """Process or component name sent in Hello."""
    token: Optional[str] = None
    """Token the collector requires on non-loopback listeners."""
    tls_ca: Optional[str] = None
    """Speak TLS (1.2 or 1.3) to the collector, trusting the CA certificates of this PEM
    file (``hoptrace collect --tls-cert``; the probes' ``--collector-ca``)."""
    tls_server_name: Optional[str] = None
    """The name the collector's certificate must carry (default: the host of ``collector``)."""
    host: str = field(default_factory=socket.gethostname)
    """Host name sent in Hello."""
    queue_capacity: int = 1 << 20
    """Records the queue holds before ``report()`` starts dropping (and counting)."""
    max_batch: int = 8192
    """Most records per Records frame (at most 20,000)."""
    idle_wait_s: float = 0.001
    """Sleep when the queue is empty."""
    clock_interval_s: float = 5.0
    """How often the clock status is sent."""
    counters_interval_s: float = 1.0
    """How often the counters (and publishers' Sent frames) are sent."""
    connect_timeout_s: float = 2.0
    """Timeout of one connection attempt, including waiting for Welcome."""
    write_timeout_s: float = 10.0
    """A write blocked longer than this (collector stalled) drops the connection."""
    backoff_min_s: float = 0.05
    """First retry delay after a failed connection; doubles up to ``backoff_max_s``."""
    backoff_max_s: float = 5.0
    """Longest retry delay."""
    shutdown_timeout_s: float = 5.0
    """How long :meth:`Exporter.shutdown` keeps trying to deliver what is queued (and to
    have it acknowledged, in version 2)."""
    retention_bytes: int = 64 << 20
    """Version 2: bytes of records frames kept until the collector acknowledges them; when
    full the oldest are dropped and counted as ``evicted`` (64 MiB, as the Rust probe:
    about 18 s of 100,000 records/s while the collector is away)."""
    max_evicted_frames: int = 65536
    """Version 2: frames evicted after they were written whose fate the exporter keeps
    track of (a small entry each) until the collector acknowledges or, after a reconnection,
    says what it holds. A collector that acknowledges nothing while the buffer overflows
    would make these grow: past this many the exporter drops the connection and connects
    again, and the new Welcome settles them (those it does not hold are ``lost_unacked``)."""
    max_control_frames: int = 64
    """Records frames given to :meth:`Exporter.send_frame` that wait for the collector at
    most; beyond it such a frame is refused and its records counted as ``queue_full``. Sent,
    Counters and Clock frames need no bound of their own: a newer one replaces what it
    supersedes (one entry per publisher and stream, one value per counter id, one clock
    status)."""
    protocol_version: int = protocol.PROTOCOL_VERSION
    """The highest collector protocol version to offer: 2 (a version 1 collector is then
    spoken to in version 1), or 1."""
    clock_status: Union[str, ClockStatusSource, None] = None
    """``"auto"`` (the default, also ``None``): chronyd, else ptp4l, else the kernel, found
    once per process (:func:`hoptrace_probe.clock.this_host`); or one source by name,
    ``"chrony"``, ``"ptp"``, ``"kernel"``, ``"unknown"``; or a callable returning a
    :class:`~hoptrace_probe.protocol.Clock`."""


class ExportSummary(NamedTuple):
    """What happened to everything reported, after :meth:`Exporter.shutdown`."""

    counters: CounterSnapshot
    """Final counters."""
    clean: bool
    """Whether the collector received the final Counters and Goodbye."""
    run_id: Optional[str]
    """The run id the collector announced, if it was ever reached."""
    rejected: int = 0
    """Connections the collector refused with a Reject (a wrong or missing token, a hop
    its pipeline does not declare, ...): counted here, since no Counters frame reaches a
    collector that refuses the probe."""
    unacknowledged: int = 0
    """Version 2: records written that the collector had not acknowledged as durable when
    the exporter stopped (it may hold them; 0 after a clean shutdown)."""


class ExporterFootprint(NamedTuple):
    """What an exporter holds in memory (:meth:`Exporter.footprint`)."""

    queued: int
    """Records in the queue (at most ``queue_capacity``, plus one per thread reporting at
    that moment)."""
    retained_bytes: int
    """Bytes of records frames kept for the collector's Ack (at most ``retention_bytes``,
    beyond that only while one frame larger than the whole buffer is being written)."""
    evicted_entries: int
    """Entries kept about frames evicted after they were written, until the collector says
    whether it holds them (at most ``max_evicted_frames``)."""
    control: ControlFootprint
    """Control frames waiting (see :class:`~hoptrace_probe.control.ControlFrames`)."""


class _ConnectError(Exception):
    def __init__(self, message: str, reject_code: Optional[int] = None) -> None:
        super().__init__(message)
        self.reject_code = reject_code


def _split_address(address: str) -> Tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"collector address {address!r} is not host:port")
    return host.strip("[]"), int(port)


class Exporter:
    """Runs the exporter thread and hands out :class:`~hoptrace_probe.probe.Probe`\\ s
    that feed it.

    ``hops`` are ``(hop id, hop name)`` pairs as in the collector's pipeline spec (1 to 16,
    ids unique). The connection is made in the background: probes work at once and queue
    until the collector is reachable.

    >>> exporter = Exporter(ExporterConfig("127.0.0.1:7400", "my-processor"),
    ...                     [(1, "flow_in"), (2, "flow_out")])  # doctest: +SKIP
    """

    def __init__(self, config: ExporterConfig, hops: Iterable[Tuple[int, str]]) -> None:
        hops = [(int(h), str(n)) for h, n in hops]
        if not 1 <= len(hops) <= protocol.MAX_HOPS:
            raise ValueError(f"{len(hops)} hops given, 1 to {protocol.MAX_HOPS} allowed")
        ids = [h for h, _ in hops]
        if len(set(ids)) != len(ids):
            raise ValueError("a hop id appears twice")
        if any(not 0 <= h <= 255 for h in ids):
            raise ValueError("hop ids are 0 to 255")
        self._address = _split_address(config.collector)
        self._tls: Optional[ssl.SSLContext] = None
        if config.tls_ca:
            self._tls = ssl.create_default_context(cafile=config.tls_ca)
            self._tls.minimum_version = ssl.TLSVersion.TLSv1_2
        self.config = config
        self.hops: List[Tuple[int, str]] = hops
        # "auto" is resolved on the exporter thread, at the first Clock frame: detection
        # runs chronyc and pmc, which must not hold up the constructor.
        self._clock_status: Optional[ClockStatusSource] = (
            config.clock_status if callable(config.clock_status)
            else None if config.clock_status in (None, "", "auto")
            else source_named(config.clock_status))
        self._shared = Shared(config.queue_capacity)
        self._control = ControlFrames(config.max_control_frames)
        self._frame_sources: List[Callable[[], List[Frame]]] = []
        # Version 2: numbered records frames kept until acknowledged.
        self._retention = Retention(config.retention_bytes)
        self._durable = False
        self._next_seq = 1
        self._resume_seq = 0
        self._inbox = b""
        self._unacknowledged = 0
        # When shutdown must be over (monotonic), once it has begun: blocking socket calls
        # are cut to it.
        self._stop_deadline: Optional[float] = None
        # The socket of the connection (or attempt) under way: shutdown() shuts it from its
        # own thread when a blocking call on it outlasts the shutdown's time.
        self._sock: Optional[socket.socket] = None
        if config.protocol_version not in protocol.VERSIONS:
            raise ValueError(f"protocol_version {config.protocol_version}: 1 or 2")
        self._hello = protocol.Hello(
            instance_id=int.from_bytes(os.urandom(8), "little"),
            host=config.host,
            process=config.process,
            software=f"hoptrace-probe-python {__version__}",
            token=config.token or "",
            hops=hops,
            version=config.protocol_version,
        )
        self._connected = False
        self._rejects: Dict[int, int] = {}
        self._reject_reasons: set = set()
        self._run_id: Optional[str] = None
        self._last_error: Optional[str] = None
        self._clean = False
        self._summary: Optional[ExportSummary] = None
        self._stop_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="hoptrace-exporter", daemon=True)
        self._thread.start()
        atexit.register(self._at_exit)

    # ------------------------------------------------------------------- public API

    def probe(self, hop: Union[int, str], clock: Optional[Callable[[], int]] = None) -> Probe:
        """A probe for ``hop``, given by id or by name; ``clock`` (a callable returning ns)
        replaces CLOCK_REALTIME (tests inject a skewed or manual clock).

        Raises ``ValueError`` when the hop was not declared at start.
        """
        for h, name in self.hops:
            if hop == name or (isinstance(hop, int) and not isinstance(hop, bool) and hop == h):
                return Probe(h, self._shared, clock)
        raise ValueError(f"hop {hop!r} was not declared when the exporter started "
                         f"(declared: {', '.join(n for _, n in self.hops)})")

    def send_frame(self, frame: Frame) -> bool:
        """Queues a Sent, Counters, Clock or Records frame for the collector; frames queued
        before :meth:`shutdown` are sent before Goodbye. Never waits.

        What waits is bounded however long the collector is away: a Sent entry replaces the
        one of the same publisher and stream, a counter's value the one of the same id, a
        Clock status the one before (all cumulative, so nothing is lost). Records frames wait
        up to ``max_control_frames``; beyond it the frame is refused, its records counted as
        ``queue_full``, and ``False`` returned. Other kinds raise ``ValueError``. The records
        of Records frames count as records handed to the exporter (``reported``), and as
        ``sent`` or ``send_failed`` as their write goes.
        """
        if self._control.push(frame):
            return True
        self._shared.counters.cell().queue_full += len(frame.records)  # type: ignore[union-attr]
        if self._control.refused == 1:
            log.warning("%d Records frames given to send_frame wait for the collector %s already: "
                        "refusing more (their records are counted as queue_full)",
                        self.config.max_control_frames, self.config.collector)
        return False

    def add_frame_source(self, source: Callable[[], List[Frame]]) -> None:
        """Registers a callable whose frames are sent with every Counters frame and once
        more at shutdown, before Goodbye (a publisher's cumulative Sent frames)."""
        self._frame_sources.append(source)

    def counters(self) -> CounterSnapshot:
        """Current counters."""
        return self._shared.counters.snapshot(len(self._shared.queue)
                                              + self._control.waiting_records())

    def footprint(self) -> "ExporterFootprint":
        """What the exporter holds in memory now, each within its configured bound."""
        retained, evicted = self._retention.footprint()
        return ExporterFootprint(len(self._shared.queue), retained, evicted,
                                 self._control.footprint())

    @property
    def is_connected(self) -> bool:
        """Whether the exporter is connected to the collector."""
        return self._connected

    @property
    def run_id(self) -> Optional[str]:
        """The run id the collector announced in Welcome."""
        return self._run_id

    @property
    def last_error(self) -> Optional[str]:
        """The last connection error, if any."""
        return self._last_error

    def wait_connected(self, timeout_s: float) -> bool:
        """Waits up to ``timeout_s`` for the first connection; returns whether connected."""
        deadline = time.monotonic() + timeout_s
        while not self._connected and time.monotonic() < deadline:
            time.sleep(0.005)
        return self._connected

    def shutdown(self, timeout_s: Optional[float] = None) -> ExportSummary:
        """Flushes everything queued, sends the final counters and Goodbye, and stops.

        Records that cannot be delivered within ``timeout_s`` (default
        ``config.shutdown_timeout_s``) are counted as ``send_failed`` and logged as an
        error. Calling it again returns the same summary.
        """
        with self._stop_lock:
            if self._summary is None:
                if timeout_s is not None:
                    self.config.shutdown_timeout_s = timeout_s
                self._shared.stopping = True
                # A write or a wait for Welcome already under way may block for longer than
                # the shutdown's time (write_timeout_s, connect_timeout_s): past it, shutting
                # the socket from here ends that call at once.
                self._thread.join(self.config.shutdown_timeout_s + 0.5)
                if self._thread.is_alive():
                    sock = self._sock
                    if sock is not None:
                        try:
                            sock.shutdown(socket.SHUT_RDWR)
                        except OSError:
                            pass
                    self._thread.join()
                atexit.unregister(self._at_exit)
                self._summary = ExportSummary(self.counters(), self._clean, self._run_id,
                                              self.rejected, self._unacknowledged)
            return self._summary

    def __enter__(self) -> "Exporter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def _at_exit(self) -> None:
        summary = self.shutdown()
        if summary.counters.lost():
            log.error("hoptrace exporter lost %d records (%s)", summary.counters.lost(),
                      summary.counters.by_name())

    # ------------------------------------------------------------------- exporter thread

    def _run(self) -> None:
        cfg = self.config
        counters = self._shared.counters
        queue = self._shared.queue
        max_batch = min(max(1, cfg.max_batch), protocol.MAX_RECORDS_PER_FRAME)
        conn: Optional[socket.socket] = None
        backoff = cfg.backoff_min_s
        next_attempt = time.monotonic()
        connected_once = False
        connected_at = 0.0

        def lost() -> None:
            # A connection that lasted looks like a collector restart: at once, and the
            # delay starts over. One lost soon after Welcome counts as a failed attempt,
            # so a collector that welcomes and then fails is not reconnected to (and sent
            # the whole retention buffer again) in a tight loop.
            nonlocal next_attempt, backoff
            now = time.monotonic()
            if now - connected_at >= _HEALTHY_CONNECTION_S:
                backoff, next_attempt = cfg.backoff_min_s, now
            else:
                next_attempt = now + backoff
                backoff = min(backoff * 2, cfg.backoff_max_s)
        last_clock: Optional[float] = None
        last_counters: Optional[float] = None
        last_ack_read = time.monotonic()
        deadline: Optional[float] = None
        clean = False
        while True:
            now = time.monotonic()
            stopping = self._shared.stopping
            if stopping and deadline is None:
                deadline = self._stop_deadline = now + cfg.shutdown_timeout_s
            past_deadline = deadline is not None and now >= deadline
            if conn is None:
                if past_deadline:
                    break
                if now >= next_attempt:
                    try:
                        conn = self._connect()
                        self._resume(conn)
                    except _ConnectError as e:
                        if conn is not None:
                            self._drop(conn, None)
                            conn = None
                        self._connected, self._last_error = False, str(e)
                        if e.reject_code is not None:
                            self._count_reject(e)
                        else:
                            log.warning("cannot reach the collector %s: %s; retrying in %.2fs",
                                        cfg.collector, e, backoff)
                        next_attempt = now + backoff
                        backoff = min(backoff * 2, cfg.backoff_max_s)
                    else:
                        if connected_once:
                            counters.reconnects += 1
                        connected_once = True
                        connected_at = time.monotonic()
                        last_clock = last_counters = None
                        continue
                if self._durable:
                    # The collector is away: the records wait in the retention buffer,
                    # numbered, for the next connection (the queue stays free for the
                    # probes); beyond its bound the oldest go, counted.
                    self._retain_queued(max_batch)
                time.sleep(max(0.0, min(next_attempt - time.monotonic(), 0.01)))
                continue

            parts: List[bytes] = []
            if last_clock is None or now - last_clock >= cfg.clock_interval_s:
                parts.append(protocol.encode(self._clock_frame()))
                last_clock = now
            control = self._control.take()
            parts.extend(protocol.encode(f) for f in control)
            # Records frames a host gave send_frame count as records handed to the exporter.
            control_records = _records_in(control)
            counters.dequeued += control_records
            # Only this thread pops, so at least len(queue) entries are there to take.
            pop = queue.popleft
            batch = [pop() for _ in range(min(len(queue), max_batch))]
            n = len(batch)
            seq = None
            if n:
                if self._durable:
                    seq = self._next_seq
                    self._next_seq += 1
                    data = protocol.encode_records(batch, seq)
                    # Kept before it is written: a write that fails leaves it to send again.
                    self._count_evicted(self._retention.push(Retained(seq, n, data)))
                else:
                    data = protocol.encode_records(batch)
                parts.append(data)
                counters.dequeued += n
            finishing = stopping and n == 0 and not queue and not self._control
            if finishing or last_counters is None or now - last_counters >= cfg.counters_interval_s:
                for source in self._frame_sources:
                    parts.extend(protocol.encode(f) for f in source())
                # Counted as if this frame's records were already sent, which they are once
                # the write below succeeds; on failure the connection is dropped.
                snap = counters.snapshot(len(queue) + self._control.waiting_records())._replace(
                    sent=counters.sent + n + control_records)
                parts.append(protocol.encode(protocol.Counters(now_ns(), snap.to_wire())))
                last_counters = now
            if finishing:
                parts.append(protocol.encode(protocol.Goodbye()))
            if parts:
                try:
                    conn.settimeout(self._write_timeout())
                    conn.sendall(b"".join(parts))
                except OSError as e:
                    # The cumulative frames go again on the next connection.
                    self._control.restore(control)
                    counters.send_failed += control_records
                    if not self._durable:
                        counters.send_failed += n
                        if n:
                            log.error("lost a records frame of %d records: write to the collector "
                                      "failed: %s", n, e)
                    self._drop(conn, f"write failed: {e}")
                    conn = None
                    lost()
                    continue
                counters.sent += n + control_records
                if seq is not None:
                    self._retention.mark_written(seq)
                    evicted_entries = self._retention.footprint()[1]
                    if evicted_entries > cfg.max_evicted_frames:
                        # Only a new Welcome tells what became of them: connect again.
                        self._drop(conn, f"the collector acknowledged none of the {evicted_entries} "
                                         "frames evicted since they were written: connecting again "
                                         "to learn which it holds")
                        # Asked for, not a failure: at once.
                        conn, next_attempt = None, time.monotonic()
                        continue
            # What the collector says after Welcome: Acks (version 2), or a Reject before
            # it closes.
            if not self._durable or finishing or n == 0 or now - last_ack_read >= _ACK_READ_INTERVAL_S:
                last_ack_read = now
                try:
                    self._read_incoming(conn)
                except (OSError, EOFError, protocol.ProtocolError) as e:
                    # After Goodbye the collector closes: that is the end, not a failure.
                    if not finishing:
                        self._drop(conn, f"collector connection ended: {e}")
                        conn = None
                        lost()
                        continue
            if finishing:
                # The collector acknowledges once more after Goodbye: wait for it (up to the
                # deadline) so that what it holds is known.
                while (self._durable and self._retention.unacked_records() > 0
                       and deadline is not None and time.monotonic() < deadline):
                    try:
                        self._read_incoming(conn)
                    except (OSError, EOFError, protocol.ProtocolError):
                        break
                    time.sleep(0.005)
                self._finish(conn)
                conn, clean = None, True
                break
            if past_deadline:
                break
            if n == 0:
                time.sleep(cfg.idle_wait_s)
        if conn is not None:
            self._drop(conn, None)
        # Whatever is still queued cannot be delivered any more: count it, say so.
        left = _records_in(self._control.take())
        try:
            while True:
                queue.popleft()
                left += 1
        except IndexError:
            pass
        if left:
            counters.dequeued += left
            counters.send_failed += left
            log.error("exporter stopped with %d undelivered records (collector %s); they are "
                      "counted as send_failed", left, cfg.collector)
        # Frames numbered while the collector was away and never written: undelivered.
        unwritten = self._retention.unwritten_records()
        if unwritten:
            counters.send_failed += unwritten
            log.error("exporter stopped with %d records it could never send (collector %s); they "
                      "are counted as send_failed", unwritten, cfg.collector)
        evicted_written, evicted_unwritten = self._retention.evicted_unresolved()
        counters.lost_unacked += evicted_unwritten
        self._unacknowledged = self._retention.unacked_records() - unwritten + evicted_written
        if self._unacknowledged:
            log.warning("exporter stopped with %d records the collector %s had not acknowledged "
                        "as durable", self._unacknowledged, cfg.collector)
        self._connected = False
        self._clean = clean

    def _write_timeout(self) -> float:
        """How long one write may block: ``write_timeout_s``, cut to what is left of the
        shutdown's time once shutdown has begun."""
        if self._stop_deadline is None:
            return self.config.write_timeout_s
        return max(0.01, min(self.config.write_timeout_s, self._stop_deadline - time.monotonic()))

    def _count_evicted(self, evicted: int) -> None:
        if evicted:
            first = self._shared.counters.evicted == 0
            self._shared.counters.evicted += evicted
            if first:
                log.warning("the retention buffer (%d bytes) is full: dropped the oldest "
                            "unacknowledged records (counted as evicted; lost if the collector "
                            "never stored them)", self.config.retention_bytes)

    def _retain_queued(self, max_batch: int) -> None:
        """Moves what is queued into numbered frames in the retention buffer, unwritten."""
        queue = self._shared.queue
        while queue:
            batch = [queue.popleft() for _ in range(min(len(queue), max_batch))]
            seq = self._next_seq
            self._next_seq += 1
            self._count_evicted(self._retention.push(
                Retained(seq, len(batch), protocol.encode_records(batch, seq))))
            self._shared.counters.dequeued += len(batch)

    def _resume(self, conn: socket.socket) -> None:
        """On a version 2 connection: forgets what the collector holds, counts what it lost
        of the evicted frames, and sends the kept frames again, in order."""
        if not self._durable:
            return
        counters = self._shared.counters
        lost = self._retention.resume(self._resume_seq)
        if lost:
            counters.lost_unacked += lost
            log.error("%d records evicted before the collector acknowledged them were not stored "
                      "by it: lost, counted as lost_unacked", lost)
        resent = first = 0
        try:
            for f in self._retention.frames():
                conn.settimeout(self._write_timeout())
                conn.sendall(f.data)
                if f.written:
                    resent += f.records
                else:
                    first += f.records
                    f.written = True
        except OSError as e:
            raise _ConnectError(f"sending unacknowledged records again: {e}") from None
        finally:
            counters.sent += first
            counters.resent += resent
        if resent:
            log.info("sent %d records the collector had not acknowledged again", resent)

    def _count_reject(self, e: _ConnectError) -> None:
        """Counts a Reject; the first of each reason is an error in the log: until the
        cause is fixed nothing reaches the collector, and what is queued is lost."""
        code = e.reject_code
        first = str(e) not in self._reject_reasons
        self._reject_reasons.add(str(e))
        self._rejects[code] = self._rejects.get(code, 0) + 1
        if first:
            hint = {protocol.RejectCode.TOKEN: " (set ExporterConfig(token=...) to the collector's "
                                               "--token)",
                    protocol.RejectCode.UNKNOWN_HOP: " (the collector's pipeline spec must declare "
                                                     "every hop with the same id and name)"}
            log.error("%s%s; nothing is delivered until it accepts this probe: records wait in "
                      "the queue, beyond it they are counted as queue_full, and at shutdown as "
                      "send_failed; retrying with backoff", e, hint.get(code, ""))

    @property
    def rejected(self) -> int:
        """Connections the collector refused with a Reject, any code."""
        return sum(self._rejects.values())

    def rejections(self) -> Dict[int, int]:
        """Connections the collector refused, by Reject code (2: wrong or missing token)."""
        return dict(self._rejects)

    def _clock_frame(self) -> protocol.Clock:
        try:
            if self._clock_status is None:
                self._clock_status = this_host().source
            return self._clock_status()
        except Exception as e:  # a broken custom source must not stop the exporter
            return UnknownClockStatus(f"clock status source failed: {e}"[:1024])()

    def _connect(self) -> socket.socket:
        """Connects and says Hello; on Welcome, the connection (``self._durable`` and
        ``self._resume_seq`` set from it). A version 1 collector, refusing a version 2
        Hello, is asked again in version 1."""
        try:
            return self._connect_once()
        except _ConnectError as e:
            if e.reject_code != protocol.RejectCode.VERSION or self._hello.version <= 1:
                raise
            log.warning("the collector %s speaks only protocol version 1 (%s): connecting again "
                        "without durable acknowledgements", self.config.collector, e)
            self._hello.version = 1
            self._durable = False
            return self._connect_once()

    def _connect_once(self) -> socket.socket:
        cfg = self.config
        self._inbox = b""
        # The whole attempt, Welcome included, is bounded: a collector that trickles bytes
        # does not hold the exporter longer.
        deadline = time.monotonic() + cfg.connect_timeout_s
        if self._stop_deadline is not None:
            deadline = min(deadline, max(self._stop_deadline, time.monotonic() + 0.05))
        try:
            sock = socket.create_connection(self._address,
                                            timeout=max(0.01, deadline - time.monotonic()))
        except OSError as e:
            raise _ConnectError(f"connect to {cfg.collector}: {e}") from None
        self._sock = sock
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:
                sock = self._sock = self._tls.wrap_socket(
                    sock, server_hostname=cfg.tls_server_name or self._address[0])
            sock.sendall(protocol.encode(self._hello))
            frame = protocol.read_frame(lambda n: _recv_exactly(sock, n, deadline))
        except ssl.SSLError as e:
            sock.close()
            raise _ConnectError(f"TLS with {cfg.collector} failed: {e}") from None
        except (OSError, EOFError, protocol.ProtocolError) as e:
            sock.close()
            raise _ConnectError(f"no welcome from {cfg.collector}: {e}") from None
        if isinstance(frame, protocol.Reject):
            sock.close()
            raise _ConnectError(f"collector {cfg.collector} rejected this probe "
                                f"(code {frame.code}): {frame.reason}", frame.code)
        if not isinstance(frame, protocol.Welcome) or frame.version > self._hello.version:
            sock.close()
            raise _ConnectError(f"collector {cfg.collector} answered hello with {frame!r}")
        sock.settimeout(cfg.write_timeout_s)
        self._durable = frame.version >= 2
        self._resume_seq = frame.resume_seq
        self._connected, self._run_id = True, frame.run_id
        log.info("connected to the collector %s, run %s, protocol version %d", cfg.collector,
                 frame.run_id, frame.version)
        return sock

    def _read_incoming(self, conn: socket.socket) -> None:
        """Reads what the collector sent, if anything, and acts on complete frames: Acks
        release retained frames; a Reject ends the connection. Reads at most 1 MiB per
        call, so that a collector that sends without end does not hold the exporter here."""
        for _ in range(16):
            if not ((isinstance(conn, ssl.SSLSocket) and conn.pending())
                    or select.select([conn], [], [], 0)[0]):
                return
            chunk = conn.recv(65536)
            if not chunk:
                raise EOFError("the collector closed the connection")
            self._inbox += chunk
            while True:
                got = protocol.split_frame(self._inbox)
                if got is None:
                    break
                ty, body, used = got
                self._inbox = self._inbox[used:]
                frame = protocol.decode(ty, body)
                if isinstance(frame, protocol.Ack):
                    self._retention.ack(frame.seq)
                elif isinstance(frame, protocol.Reject):
                    raise EOFError(f"rejected (code {frame.code}): {frame.reason}")
                else:
                    # Nothing else may come after Welcome: a peer that sends it is not a
                    # collector to trust (and one warning per frame could flood the log).
                    raise protocol.ProtocolError("unexpected_frame", type(frame).__name__)

    def _finish(self, conn: socket.socket) -> None:
        """Closes the write side after Goodbye and waits briefly for the collector to close."""
        try:
            conn.settimeout(1.0)
            if isinstance(conn, ssl.SSLSocket):
                conn = conn.unwrap()  # close_notify; then the plain socket
            conn.shutdown(socket.SHUT_WR)
            while conn.recv(65536):
                pass
        except (OSError, ValueError):
            pass
        conn.close()
        self._connected = False

    def _drop(self, conn: socket.socket, error: Optional[str]) -> None:
        try:
            conn.close()
        except OSError:
            pass
        self._connected = False
        if error:
            self._last_error = error
            log.warning("%s", error)


def _records_in(frames: List[Frame]) -> int:
    return sum(len(f.records) for f in frames if isinstance(f, protocol.Records))


def _recv_exactly(sock: socket.socket, n: int, deadline: float) -> bytes:
    """``n`` bytes from ``sock``, all by ``deadline`` (monotonic), else ``socket.timeout``."""
    buf = bytearray()
    while len(buf) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout(f"timed out with {len(buf)} of {n} bytes")
        sock.settimeout(left)
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError(f"connection closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)
