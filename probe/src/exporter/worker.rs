//! The exporter's thread: connects, says Hello, writes records and control frames, reads
//! acknowledgements, and reconnects with backoff.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::clock::realtime_ns;
use crate::clock_feed::ClockFeed;
use crate::probe::Shared;
use crate::retention::{Retained, Retention};
use hoptrace_protocol::{
    self as protocol, CountersFrame, Frame, Hello, MAX_FRAME_LEN, MAX_RECORDS_PER_FRAME,
    RecordsWriter, reject_code,
};

use super::config::{ExporterConfig, permanent};
use super::conn::{Conn, Tls};
use super::control::PendingControl;
use super::{Status, lock};

/// How often a busy exporter reads the collector's acknowledgements (an idle one reads
/// them whenever its queue is empty).
pub(super) const ACK_READ_INTERVAL: Duration = Duration::from_millis(20);

pub(super) struct Worker {
    pub(super) config: ExporterConfig,
    pub(super) tls: Tls,
    pub(super) hello: Hello,
    /// Sent records frames not yet acknowledged (version 2 connections).
    pub(super) retention: Retention,
    /// The current connection speaks version 2: frames are numbered and retained.
    pub(super) durable: bool,
    /// The next records frame's number.
    pub(super) next_seq: u64,
    /// Bytes read from the collector not yet decoded (its Acks).
    pub(super) inbox: Vec<u8>,
    pub(super) shared: Arc<Shared>,
    pub(super) control: Arc<Mutex<PendingControl>>,
    pub(super) status: Arc<Mutex<Status>>,
    /// The clock status readings, taken on their own thread.
    pub(super) clock: ClockFeed,
    pub(super) shutdown_timeout_ns: Arc<AtomicU64>,
    /// Once stopping, how long a collector that is away is waited for
    /// ([`Exporter::shutdown_promptly`]); `u64::MAX`: the whole shutdown timeout.
    pub(super) away_at_stop_ns: Arc<AtomicU64>,
}

/// How long a connection must have lasted for its loss to look like a collector restart
/// (come back at once) rather than a collector that welcomes and then fails (back off).
pub(super) const HEALTHY_CONNECTION: Duration = Duration::from_secs(1);

/// When to try the collector again. A failed attempt waits the delay, which doubles up to
/// `backoff_max`. A lost connection that had lasted [`HEALTHY_CONNECTION`] is tried again
/// at once and resets the delay; one lost sooner counts as a failed attempt, so that a
/// collector that welcomes and then drops or garbles every connection is not reconnected
/// to (and sent the whole retention buffer again) in a tight loop.
#[derive(Debug)]
pub(super) struct Retry {
    pub(super) delay: Duration,
    pub(super) min: Duration,
    pub(super) max: Duration,
    pub(super) next: Instant,
    pub(super) connected_at: Option<Instant>,
}

impl Retry {
    pub(super) fn new(min: Duration, max: Duration) -> Self {
        Self {
            delay: min,
            min,
            max,
            next: Instant::now(),
            connected_at: None,
        }
    }

    pub(super) fn failed(&mut self, now: Instant) {
        self.next = now + self.delay;
        self.delay = (self.delay * 2).min(self.max);
    }

    pub(super) fn connected(&mut self, now: Instant) {
        self.connected_at = Some(now);
    }

    pub(super) fn at_once(&mut self, now: Instant) {
        self.connected_at = None;
        self.next = now;
    }

    pub(super) fn lost(&mut self, now: Instant) {
        let lasted = self
            .connected_at
            .take()
            .is_some_and(|t| now.duration_since(t) >= HEALTHY_CONNECTION);
        if lasted {
            self.delay = self.min;
            self.next = now;
        } else {
            self.failed(now);
        }
    }
}

/// A failed write to the collector, said plainly: a write that blocked past
/// `write_timeout` is a collector that stopped reading.
pub(super) fn write_failed(e: &std::io::Error, write_timeout: Duration) -> String {
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => format!(
            "write failed: the collector read nothing for {write_timeout:?} (write_timeout)"
        ),
        _ => format!("write failed: {e}"),
    }
}

impl Worker {
    /// The thread's body; returns whether the collector got Goodbye, and the records it
    /// had not acknowledged.
    pub(super) fn run(&mut self) -> (bool, u64) {
        let mut conn: Option<Conn> = None;
        let mut buf: Vec<u8> = Vec::with_capacity(1 << 20);
        let mut retry = Retry::new(self.config.backoff_min, self.config.backoff_max);
        let mut connected_once = false;
        // Failed attempts since the last connection (or the start): the first of an outage
        // is a warning, the rest are debug lines (a collector away for minutes would
        // otherwise fill the host's log).
        let mut failures = 0u64;
        let started = Instant::now();
        let mut told = false;
        let mut refused = false;
        // Clock readings sent on this connection: every new one, and the latest on each
        // new connection.
        let mut clock_seen = 0u64;
        let mut last_counters: Option<Instant> = None;
        let mut deadline: Option<Instant> = None;
        // When, once stopping, the collector was first found away.
        let mut away_since: Option<Instant> = None;
        let mut last_ack_read = Instant::now();
        let max_batch = self.config.max_batch.clamp(1, MAX_RECORDS_PER_FRAME);
        let clean = loop {
            let now = Instant::now();
            let stopping = self.shared.shutdown.load(Relaxed);
            if stopping && deadline.is_none() {
                deadline = Some(now + Duration::from_nanos(self.shutdown_timeout_ns.load(Relaxed)));
            }
            let past_deadline = deadline.is_some_and(|d| now >= d);
            let Some(stream) = conn.as_mut() else {
                if past_deadline {
                    break false;
                }
                let away = self.away_at_stop_ns.load(Relaxed);
                if stopping && away != u64::MAX {
                    let since = *away_since.get_or_insert(now);
                    if now.duration_since(since) >= Duration::from_nanos(away) {
                        break false;
                    }
                }
                if refused {
                    // Refused for good: nothing will ever be sent. What the probes give is
                    // counted as lost as it comes, so the queue never holds it.
                    let mut n = 0u64;
                    while self.shared.queue.pop().is_some() {
                        n += 1;
                    }
                    if n > 0 {
                        self.shared.counters.dequeued.fetch_add(n, Relaxed);
                        self.shared.counters.send_failed.fetch_add(n, Relaxed);
                    }
                    if stopping {
                        break false;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
                if now >= retry.next {
                    match self.connect().and_then(|(mut s, resume_seq)| {
                        self.resume(&mut s, resume_seq).map_err(|e| (None, e))?;
                        Ok(s)
                    }) {
                        Ok(s) => {
                            if connected_once {
                                self.shared.counters.reconnects.fetch_add(1, Relaxed);
                            }
                            if failures > 0 {
                                tracing::info!(collector = %self.config.collector, attempts = failures, "connected to the collector after {failures} failed attempt(s)");
                            }
                            failures = 0;
                            connected_once = true;
                            retry.connected(Instant::now());
                            clock_seen = 0;
                            last_counters = None;
                            conn = Some(s);
                            continue;
                        }
                        Err((code, e)) => {
                            self.set_status(false, None, Some(e.clone()));
                            if code.is_some_and(permanent) {
                                tracing::error!(collector = %self.config.collector, "the collector refused this probe for good ({e}): not trying again; what it holds and is given is counted as lost");
                                lock(&self.status).rejected = Some(e);
                                refused = true;
                                continue;
                            }
                            failures += 1;
                            // Before a first connection, whoever waits for it ([`Exporter::
                            // connect`]) reports the error; past that wait, it is news.
                            let news = if connected_once {
                                failures == 1
                            } else {
                                !told && started.elapsed() >= self.config.welcome_timeout
                            };
                            if news {
                                told = true;
                                tracing::warn!(collector = %self.config.collector, "cannot reach the collector: {e}; retrying with backoff up to {:?} (further failures are debug lines)", self.config.backoff_max);
                            } else {
                                tracing::debug!(collector = %self.config.collector, attempt = failures, "cannot reach the collector: {e}; retrying in {:?}", retry.delay);
                            }
                            retry.failed(now);
                        }
                    }
                }
                if self.durable {
                    // The collector is away: the records wait in the retention buffer,
                    // numbered, for the next connection (the queue stays free for the
                    // hot path); beyond its bound the oldest go, counted.
                    self.retain_queued(&mut buf, max_batch);
                }
                std::thread::sleep(
                    retry
                        .next
                        .saturating_duration_since(Instant::now())
                        .min(Duration::from_millis(10)),
                );
                continue;
            };

            buf.clear();
            if let Some(status) = self.clock.newer(&mut clock_seen) {
                Frame::Clock(status)
                    .encode(&mut buf)
                    .expect("the clock feed cuts the detail to the frame's limit");
            }
            // Taken, not copied: given back below if the write fails.
            let control = std::mem::take(&mut *lock(&self.control));
            control.encode(&mut buf);
            let frame_at = buf.len();
            let mut w = if self.durable {
                RecordsWriter::numbered(&mut buf, self.next_seq)
            } else {
                RecordsWriter::new(&mut buf)
            };
            fill(&mut w, &self.shared.queue, max_batch);
            let n = w.finish() as u64;
            if self.durable && n > 0 {
                // Kept before it is written: a write that fails leaves it to send again.
                let frame = Retained {
                    seq: self.next_seq,
                    records: n,
                    bytes: buf[frame_at..].to_vec(),
                    written: false,
                };
                self.next_seq += 1;
                let evicted = self.retention.push(frame);
                if evicted > 0 && self.shared.counters.evicted.fetch_add(evicted, Relaxed) == 0 {
                    tracing::warn!(
                        records = evicted,
                        "the retention buffer is full: dropped the oldest unacknowledged records (counted as evicted; lost if the collector never stored them)"
                    );
                }
            }
            self.shared.counters.dequeued.fetch_add(n, Relaxed);
            let drained = n == 0 && self.shared.queue.is_empty();
            let finishing = stopping && drained;
            if finishing
                || last_counters
                    .is_none_or(|t| now.duration_since(t) >= self.config.counters_interval)
            {
                // Counted as if this frame's records were already sent, which they are
                // once the write below succeeds; on failure the connection is dropped.
                let mut snap = self
                    .shared
                    .counters
                    .snapshot(self.shared.queue.len() as u64);
                snap.sent += n;
                Frame::Counters(CountersFrame {
                    at_ns: realtime_ns(),
                    values: snap.to_wire(),
                })
                .encode(&mut buf)
                .expect("the exporter's few counters encode");
                last_counters = Some(now);
            }
            if finishing {
                Frame::Goodbye.encode(&mut buf).expect("goodbye encodes");
            }
            if !buf.is_empty() {
                if let Err(e) = stream.write_all(&buf) {
                    lock(&self.control).restore(control);
                    if !self.durable {
                        self.shared.counters.send_failed.fetch_add(n, Relaxed);
                        if n > 0 {
                            tracing::error!(
                                records = n,
                                "lost a records frame: write to the collector failed: {e}"
                            );
                        }
                    }
                    self.set_status(
                        false,
                        None,
                        Some(write_failed(&e, self.config.write_timeout)),
                    );
                    conn = None;
                    retry.lost(Instant::now());
                    continue;
                }
                self.shared.counters.sent.fetch_add(n, Relaxed);
                if self.durable && n > 0 {
                    self.retention.mark_written(self.next_seq - 1);
                }
            }
            if self.durable && self.retention.stalled() && !finishing {
                // What it holds of the frames dropped unacknowledged is learnt only from
                // a Welcome: reconnect rather than remember ever more of them.
                tracing::warn!(
                    frames = crate::retention::MAX_UNRESOLVED,
                    "the collector acknowledged none of the records frames the retention buffer dropped since the last acknowledgement; reconnecting so that it says what it holds"
                );
                stream.finish();
                self.set_status(
                    false,
                    None,
                    Some("the collector does not acknowledge: reconnecting".into()),
                );
                conn = None;
                // Asked for, not a failure: at once.
                retry.at_once(Instant::now());
                continue;
            }
            if self.durable
                && (finishing || n == 0 || last_ack_read.elapsed() >= ACK_READ_INTERVAL)
                && let Err(e) = {
                    last_ack_read = Instant::now();
                    self.read_acks(stream)
                }
            {
                if finishing && self.retention.unacked_records() == 0 {
                    // The collector ended the connection after Goodbye, everything
                    // acknowledged: the end it signals, not a failure.
                    stream.finish();
                    break true;
                }
                self.set_status(false, None, Some(e));
                conn = None;
                retry.lost(Instant::now());
                continue;
            }
            if finishing {
                // The collector acknowledges once more after Goodbye and ends the
                // connection once its log holds everything this one sent, the last Sent
                // and Counters frames included (no Ack covers those): wait for that end
                // (up to the deadline), applying the Acks meanwhile.
                while self.durable && deadline.is_some_and(|d| Instant::now() < d) {
                    if self.read_acks(stream).is_err() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                stream.finish();
                break true;
            }
            if past_deadline {
                break false;
            }
            if n == 0 {
                std::thread::sleep(self.config.idle_wait);
            }
        };
        // Whatever is still queued cannot be delivered any more: count it, say so.
        let mut left = 0u64;
        while self.shared.queue.pop().is_some() {
            left += 1;
        }
        if left > 0 {
            self.shared.counters.dequeued.fetch_add(left, Relaxed);
            self.shared.counters.send_failed.fetch_add(left, Relaxed);
            tracing::error!(records = left, collector = %self.config.collector, "exporter stopped with undelivered records; they are counted as send_failed");
        }
        self.set_status(false, None, None);
        // Frames numbered while the collector was away and never written: undelivered.
        let unwritten = self.retention.unwritten_records();
        if unwritten > 0 {
            self.shared
                .counters
                .send_failed
                .fetch_add(unwritten, Relaxed);
            tracing::error!(records = unwritten, collector = %self.config.collector, "exporter stopped with records it could never send; they are counted as send_failed");
        }
        let (evicted_written, evicted_unwritten) = self.retention.evicted_unresolved();
        if evicted_unwritten > 0 {
            self.shared
                .counters
                .lost_unacked
                .fetch_add(evicted_unwritten, Relaxed);
        }
        let unacknowledged = self.retention.unacked_records() - unwritten + evicted_written;
        if unacknowledged > 0 {
            tracing::warn!(
                records = unacknowledged,
                collector = %self.config.collector,
                "exporter stopped with records the collector had not acknowledged as durable"
            );
        }
        (clean, unacknowledged)
    }

    /// On a new connection: forgets what the collector holds, counts what it lost of the
    /// evicted frames, and sends the kept frames again.
    pub(super) fn resume(
        &mut self,
        stream: &mut Conn,
        resume_seq: Option<u64>,
    ) -> Result<(), String> {
        let Some(resume_seq) = resume_seq else {
            return Ok(());
        };
        let lost = self.retention.resume(resume_seq);
        if lost > 0 {
            self.shared.counters.lost_unacked.fetch_add(lost, Relaxed);
            tracing::error!(
                records = lost,
                "records evicted before the collector acknowledged them were not stored by it: lost, counted as lost_unacked"
            );
        }
        let (mut resent, mut first) = (0, 0);
        for f in self.retention.frames_mut() {
            stream
                .write_all(&f.bytes)
                .map_err(|e| format!("sending unacknowledged records again: {e}"))?;
            if f.written {
                resent += f.records;
            } else {
                first += f.records;
                f.written = true;
            }
        }
        self.shared.counters.sent.fetch_add(first, Relaxed);
        if resent > 0 {
            self.shared.counters.resent.fetch_add(resent, Relaxed);
            tracing::info!(
                records = resent,
                "sent the records the collector had not acknowledged again"
            );
        }
        Ok(())
    }

    /// Moves what is queued into numbered frames in the retention buffer, unwritten.
    pub(super) fn retain_queued(&mut self, buf: &mut Vec<u8>, max_batch: usize) {
        loop {
            buf.clear();
            let mut w = RecordsWriter::numbered(buf, self.next_seq);
            fill(&mut w, &self.shared.queue, max_batch);
            let n = w.finish() as u64;
            if n == 0 {
                return;
            }
            let evicted = self.retention.push(Retained {
                seq: self.next_seq,
                records: n,
                bytes: buf.clone(),
                written: false,
            });
            self.next_seq += 1;
            self.shared.counters.dequeued.fetch_add(n, Relaxed);
            if evicted > 0 && self.shared.counters.evicted.fetch_add(evicted, Relaxed) == 0 {
                tracing::warn!(
                    records = evicted,
                    "the collector is unreachable and the retention buffer is full: dropped the oldest records (counted as evicted; lost if the collector never stored them)"
                );
            }
            if (n as usize) < max_batch {
                return;
            }
        }
    }

    /// Reads what the collector sent without waiting, and applies its Acks.
    pub(super) fn read_acks(&mut self, stream: &mut Conn) -> Result<(), String> {
        let mut chunk = [0u8; 4096];
        stream.set_nonblocking(true);
        let read = loop {
            match stream.read(&mut chunk) {
                Ok(0) => break Err("the collector closed the connection".to_owned()),
                Ok(n) => self.inbox.extend_from_slice(&chunk[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    break Ok(());
                }
                Err(e) => break Err(format!("reading from the collector: {e}")),
            }
        };
        stream.set_nonblocking(false);
        let mut acked = None;
        let mut rejected = None;
        let used = protocol::decode_frames(&self.inbox, MAX_FRAME_LEN, |f| match f {
            Frame::Ack { seq } => acked = Some(seq),
            Frame::Reject { code, reason } => rejected = Some(format!("code {code}: {reason}")),
            _ => {}
        })
        .map_err(|e| format!("bad frame from the collector: {e}"))?;
        self.inbox.drain(..used);
        if let Some(seq) = acked {
            self.retention.ack(seq);
        }
        if let Some(r) = rejected {
            return Err(format!("the collector closed the connection ({r})"));
        }
        read
    }

    /// Connects and says Hello; on Welcome, the connection and (version 2) the number
    /// to resume after. A version 1 collector is asked again with a version 1 Hello.
    pub(super) fn connect(&mut self) -> Result<(Conn, Option<u64>), (Option<u16>, String)> {
        match self.connect_once() {
            Err((Some(code), e)) if code == reject_code::VERSION && self.hello.version > 1 => {
                tracing::warn!(
                    collector = %self.config.collector,
                    "the collector speaks only protocol version 1 ({e}): connecting again without durable acknowledgements"
                );
                self.hello.version = 1;
                self.durable = false;
                self.connect_once()
            }
            other => other,
        }
    }

    /// One attempt; on failure, the Reject code if there was one.
    pub(super) fn connect_once(&mut self) -> Result<(Conn, Option<u64>), (Option<u16>, String)> {
        self.inbox.clear();
        let addrs = self.config.collector.to_socket_addrs().map_err(|e| {
            (
                None,
                format!("cannot resolve {}: {e}", self.config.collector),
            )
        })?;
        let mut last = format!("{} resolves to no address", self.config.collector);
        for addr in addrs {
            match TcpStream::connect_timeout(&addr, self.config.connect_timeout) {
                Ok(tcp) => {
                    let plain = |e: String| (None, e);
                    tcp.set_nodelay(true)
                        .map_err(|e| plain(format!("TCP_NODELAY: {e}")))?;
                    tcp.set_write_timeout(Some(self.config.write_timeout))
                        .and_then(|()| tcp.set_read_timeout(Some(self.config.connect_timeout)))
                        .map_err(|e| plain(format!("socket timeouts: {e}")))?;
                    let mut s = self
                        .tls
                        .wrap(tcp)
                        .map_err(|e| plain(format!("collector {addr}: {e}")))?;
                    let hello = Frame::Hello(self.hello.clone())
                        .to_bytes()
                        .map_err(|e| plain(format!("hello: {e}")))?;
                    s.write_all(&hello)
                        .map_err(|e| plain(format!("sending hello to {addr}: {e}")))?;
                    return match protocol::read_frame(&mut s, MAX_FRAME_LEN) {
                        Ok(Frame::Welcome {
                            version,
                            run_id,
                            resume_seq,
                        }) => {
                            self.durable = version >= 2;
                            if version < self.hello.version {
                                tracing::warn!(
                                    collector = %addr,
                                    "the collector runs protocol version {version} (it keeps no log: --no-log): records are not acknowledged or kept to send again; a collector restart loses what it had not written"
                                );
                            }
                            tracing::info!(collector = %addr, run_id, version, "connected to the collector");
                            self.set_status(true, Some(run_id), None);
                            Ok((s, self.durable.then_some(resume_seq)))
                        }
                        Ok(Frame::Reject { code, reason }) => Err((
                            Some(code),
                            format!("collector {addr} rejected this probe (code {code}): {reason}"),
                        )),
                        Ok(other) => Err(plain(format!(
                            "collector {addr} answered hello with {other:?}"
                        ))),
                        Err(protocol::ProtocolError::Io(
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut,
                        )) => Err(plain(format!(
                            "no welcome from {addr} within {:?} (connect_timeout)",
                            self.config.connect_timeout
                        ))),
                        Err(e) => Err(plain(format!("no welcome from {addr}: {e}"))),
                    };
                }
                Err(e) => last = format!("connect to {addr}: {e}"),
            }
        }
        Err((None, last))
    }

    pub(super) fn set_status(
        &self,
        connected: bool,
        run_id: Option<String>,
        error: Option<String>,
    ) {
        let mut s = lock(&self.status);
        s.connected = connected;
        if run_id.is_some() {
            s.run_id = run_id;
        }
        if error.is_some() {
            s.last_error = error;
        }
    }
}

/// Moves queued records into the frame until it holds `max_batch` (at most
/// [`MAX_RECORDS_PER_FRAME`]) or the queue is empty.
pub(super) fn fill(
    w: &mut RecordsWriter<'_>,
    queue: &crossbeam_queue::ArrayQueue<protocol::Record>,
    max_batch: usize,
) {
    while w.len() < max_batch {
        let Some(r) = queue.pop() else { break };
        // Below max_batch, so below the frame's limit: there is room.
        if w.push(&r).is_err() {
            unreachable!("max_batch is clamped to the frame's record limit");
        }
    }
}
