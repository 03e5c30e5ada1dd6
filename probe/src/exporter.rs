//! The exporter: one background thread per process that drains the probes' queue into
//! Records frames over TCP to the collector (`docs/collector-protocol.md`), sends the
//! host's clock status (read on a thread of its own, [`ClockReporting`]) and the
//! counters, reconnects with backoff, and flushes on shutdown.

use std::hash::{BuildHasher, Hasher};
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{Relaxed, Release};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::clock::{Clock, ClockStatus, SystemClock, realtime_ns};
use crate::clock_feed::ClockFeed;
use crate::context::HopId;
use crate::counters::CounterSnapshot;
use crate::probe::{Probe, Shared};
use crate::retention::{Retained, Retention};
use hoptrace_protocol::{
    self as protocol, CountersFrame, EncodeError, Frame, Hello, MAX_FRAME_LEN, MAX_HOPS,
    MAX_RECORDS_PER_FRAME, MAX_SENT_PER_FRAME, PROTOCOL_VERSION, RecordsWriter, SentEntry,
    SentFrame, reject_code,
};

/// How an exporter reaches the collector and paces itself: the one configuration of a
/// link to the collector. [`ExporterConfig::new`] gives every setting its default; set
/// the fields that differ.
///
/// ```
/// use std::time::Duration;
/// use hoptrace_probe::{ClockReporting, ExporterConfig};
///
/// let mut config = ExporterConfig::new("collector.lab:7400", "my-processor");
/// config.token = Some("s3cret".into());
/// config.clock = ClockReporting::Detect; // ask chronyd or ptp4l
/// config.welcome_timeout = Duration::from_secs(10);
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ExporterConfig {
    /// Collector address, `host:port`.
    pub collector: String,
    /// Token the collector requires on non-loopback listeners.
    pub token: Option<String>,
    /// Speak TLS to the collector, trusting the CA certificates of this PEM file (needs
    /// the `tls` feature).
    pub tls_ca: Option<PathBuf>,
    /// The name the collector's certificate must carry (default: the host part of
    /// `collector`).
    pub tls_server_name: Option<String>,
    /// Host name sent in Hello (default: this host's name).
    pub host: String,
    /// Process or component name sent in Hello.
    pub process: String,
    /// Which clock status is reported to the collector (default: the kernel's, see
    /// [`ClockReporting`]).
    pub clock: ClockReporting,
    /// Records the queue holds before `report()` starts dropping (and counting).
    pub queue_capacity: usize,
    /// Most records per Records frame.
    pub max_batch: usize,
    /// Sleep when the queue is empty.
    pub idle_wait: Duration,
    /// How often the clock status is read and sent.
    pub clock_interval: Duration,
    /// How often the counters are sent.
    pub counters_interval: Duration,
    /// Timeout of one connection attempt (and of waiting for Welcome on it).
    pub connect_timeout: Duration,
    /// How long [`Exporter::connect`] waits for the collector's Welcome, over as many
    /// attempts as fit, before it gives up ([`Exporter::start`] does not wait).
    pub welcome_timeout: Duration,
    /// A write blocked longer than this (collector stalled) drops the connection.
    pub write_timeout: Duration,
    /// First retry delay after a failed connection; doubles up to `backoff_max`.
    pub backoff_min: Duration,
    /// Longest retry delay.
    pub backoff_max: Duration,
    /// Bytes of sent records frames kept until the collector acknowledges them as durable
    /// (collector protocol version 2), to send again after a reconnection; when full,
    /// the oldest are dropped and counted (`evicted`, and `lost_unacked` for those the
    /// collector turns out not to hold). 0: none; the exporter then speaks protocol
    /// version 1, sends each record once and keeps nothing (nothing is evicted; a
    /// collector killed loses what it had not written).
    pub retention_bytes: usize,
}

impl ExporterConfig {
    /// [`ExporterConfig::retention_bytes`] unless set: 64 MiB.
    pub const DEFAULT_RETENTION_BYTES: usize = 64 << 20;

    /// Defaults for a collector at `collector` (`host:port`).
    #[must_use]
    pub fn new(collector: impl Into<String>, process: impl Into<String>) -> Self {
        Self {
            collector: collector.into(),
            token: None,
            tls_ca: None,
            tls_server_name: None,
            host: hoptrace_clock::hostname(),
            process: process.into(),
            clock: ClockReporting::default(),
            queue_capacity: 1 << 20,
            max_batch: 8192,
            idle_wait: Duration::from_millis(1),
            clock_interval: Duration::from_secs(5),
            counters_interval: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(2),
            welcome_timeout: Duration::from_secs(5),
            write_timeout: Duration::from_secs(10),
            backoff_min: Duration::from_millis(50),
            backoff_max: Duration::from_secs(5),
            retention_bytes: Self::DEFAULT_RETENTION_BYTES,
        }
    }
}

/// Which clock status an exporter reports to the collector, read on a thread of the
/// exporter's own every [`ExporterConfig::clock_interval`] (never on the thread that
/// drains the probes' queue). The collector prints it per host beside the stages it
/// bounds, and warns where it is not small against them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ClockReporting {
    /// None: the collector shows this host's clock as unknown and cannot bound the clock
    /// error of stages that cross it.
    Off,
    /// The kernel's NTP state (`ntp_adjtime`: one system call, no other program asked).
    /// Its bound is the kernel's `maxerror`, which a sync daemon keeps current.
    #[default]
    Kernel,
    /// The daemon that keeps this host's clock: chronyd if `chronyc` answers, else ptp4l
    /// if `pmc` answers on its default socket, else the kernel. Found once per process;
    /// every reading runs `chronyc` or `pmc` as a child process of the embedding
    /// application (on the exporter's clock thread). The `hoptrace` command's own probes
    /// report this.
    Detect,
    /// A status known from elsewhere (or a simulated host's), stamped with the time of
    /// each reading.
    Fixed(ClockStatus),
}

/// Why an exporter could not start, or a probe could not be had from it. Each variant
/// says what to fix.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExporterError {
    /// No hops, more than 16, or a hop id used twice: fix the hop list.
    #[error("invalid hop list: {0}")]
    Hops(String),
    /// A probe was asked for a hop the exporter did not announce.
    #[error("hop {0:?} was not declared when the exporter started")]
    UnknownHop(HopId),
    /// The TLS setting cannot be used (unreadable CA file, bad server name, or a build
    /// without the `tls` feature).
    #[error("TLS: {0}")]
    Tls(String),
    /// A name is too long for the protocol (host, process, token or a hop name over
    /// 1024 bytes): shorten it.
    #[error("hello: {0}")]
    Hello(#[from] EncodeError),
    /// A background thread (the exporter's, or its clock reader's) could not be spawned:
    /// the process is out of threads or memory.
    #[error("cannot spawn the exporter thread: {0}")]
    Spawn(#[from] std::io::Error),
    /// [`Exporter::connect`]: the collector did not welcome the exporter in time. Is
    /// `hoptrace collect` running at that address, does its pipeline declare these hops
    /// with these ids, does it want the same token (and TLS)? `detail` is the last
    /// connection error.
    #[error(
        "collector {collector} did not accept {process} (hops {hops}) within {waited_ms} ms: {detail} (is hoptrace collect running there? does its pipeline declare these hops? same --token?)"
    )]
    NotWelcomed {
        /// The collector's address.
        collector: String,
        /// The process name announced.
        process: String,
        /// The hops announced, by name.
        hops: String,
        /// How long it was waited for, ms.
        waited_ms: u64,
        /// The last connection error (`no answer` when there was none).
        detail: String,
    },
    /// [`Exporter::connect`]: the collector refused the probe for good (a hop its
    /// pipeline does not declare, a wrong token, a protocol it does not speak): trying
    /// again cannot help. Start the collector with the probe's pipeline spec (or the probe
    /// with the collector's), give the same `--token`.
    #[error("collector {collector} refused {process} for good: {reason}")]
    Rejected {
        /// The collector's address.
        collector: String,
        /// The process name announced.
        process: String,
        /// The collector's code and reason.
        reason: String,
    },
}

/// Whether a Reject with `code` is for good: trying again sends the same Hello to the same
/// collector (a hop it does not declare, a wrong token, a protocol version it does not
/// speak, a Hello it cannot read). Only an overloaded collector may say yes later.
fn permanent(code: u16) -> bool {
    code != reject_code::OVERLOADED
}

/// How often a busy exporter reads the collector's acknowledgements (an idle one reads
/// them whenever its queue is empty).
const ACK_READ_INTERVAL: Duration = Duration::from_millis(20);

/// Counters a Counters frame holds.
const MAX_COUNTERS_PER_FRAME: usize = 255;

/// The caller's control frames not yet written to a collector, kept in a size that does
/// not grow with time, however long the collector is away: a Sent entry is a snapshot of
/// its stream's totals that the collector keeps only the newest of
/// (`docs/collector-protocol.md`), so only the newest per (publisher, stream) is kept; the
/// caller's counters are kept as their newest value per counter id. The memory is one
/// entry per stream the caller reports (40 bytes each) and one per counter id (at most
/// 65,536), whatever the outage. What a superseded frame said is never needed: nothing is
/// dropped that the collector would have kept.
#[derive(Debug, Default)]
struct PendingControl {
    /// The newest entry per (publisher, stream).
    sent: std::collections::BTreeMap<(u16, u32), SentEntry>,
    /// Publishers whose empty Sent frame is waiting (it changes nothing at the collector,
    /// but a caller may send one to say it is there).
    empty_sent: std::collections::BTreeSet<u16>,
    /// The newest value per counter id, and when the newest of those frames was read.
    counters: std::collections::BTreeMap<u16, u64>,
    counters_at_ns: Option<i64>,
}

impl PendingControl {
    fn add_sent(&mut self, frame: SentFrame) {
        if frame.entries.is_empty() {
            self.empty_sent.insert(frame.publisher);
        }
        for e in frame.entries {
            self.sent.insert((frame.publisher, e.stream), e);
        }
    }

    fn add_counters(&mut self, frame: CountersFrame) {
        self.counters.extend(frame.values);
        self.counters_at_ns = Some(
            self.counters_at_ns
                .map_or(frame.at_ns, |t| t.max(frame.at_ns)),
        );
    }

    /// Entries waiting (Sent entries and counter values).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.sent.len() + self.counters.len()
    }

    /// Encodes what is waiting into `buf`: Sent frames per publisher, as many as its
    /// entries need, then one Counters frame per 255 counters. The exporter takes what is
    /// waiting ([`std::mem::take`]), encodes it, and gives it back with
    /// [`PendingControl::restore`] when the write fails, so that a lost connection loses
    /// none of it.
    fn encode(&self, buf: &mut Vec<u8>) {
        let mut frame = SentFrame::default();
        let flush = |frame: &mut SentFrame, buf: &mut Vec<u8>| {
            Frame::Sent(std::mem::take(frame))
                .encode(buf)
                .expect("a Sent frame of at most MAX_SENT_PER_FRAME entries encodes");
        };
        for (&(publisher, _), entry) in &self.sent {
            if !frame.entries.is_empty()
                && (frame.publisher != publisher || frame.entries.len() == MAX_SENT_PER_FRAME)
            {
                flush(&mut frame, buf);
            }
            frame.publisher = publisher;
            frame.entries.push(*entry);
        }
        if !frame.entries.is_empty() {
            flush(&mut frame, buf);
        }
        for &publisher in &self.empty_sent {
            if self.sent.keys().any(|&(p, _)| p == publisher) {
                continue; // its entries said it is there
            }
            flush(
                &mut SentFrame {
                    publisher,
                    entries: Vec::new(),
                },
                buf,
            );
        }
        if let Some(at_ns) = self.counters_at_ns {
            let values: Vec<(u16, u64)> = self.counters.iter().map(|(&k, &v)| (k, v)).collect();
            for chunk in values.chunks(MAX_COUNTERS_PER_FRAME) {
                Frame::Counters(CountersFrame {
                    at_ns,
                    values: chunk.to_vec(),
                })
                .encode(buf)
                .expect("a Counters frame of at most 255 counters encodes");
            }
        }
    }

    /// Gives back what a failed write did not deliver. What the caller reported since it
    /// was taken is newer and wins; the rest waits again for the next connection.
    fn restore(&mut self, older: PendingControl) {
        for (key, entry) in older.sent {
            self.sent.entry(key).or_insert(entry);
        }
        self.empty_sent.extend(older.empty_sent);
        for (id, value) in older.counters {
            self.counters.entry(id).or_insert(value);
        }
        self.counters_at_ns = match (self.counters_at_ns, older.counters_at_ns) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }
}

/// Locks `m`, also when a thread panicked while holding it: the data behind these locks
/// (queued frame bytes, connection status) stays consistent at every step, so a panic
/// elsewhere must not turn into a panic in the embedding application's threads.
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// How long a host that stops at a person's request (the command-line taps and
/// publishers) waits for a collector that is away, with [`Exporter::shutdown_promptly`]:
/// short enough that the command ends and prints its summary well within a second.
pub const AWAY_AT_STOP: Duration = Duration::from_millis(300);

/// What happened to everything reported, after [`Exporter::shutdown`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ExportSummary {
    /// Final counters.
    pub counters: CounterSnapshot,
    /// Whether the collector received the final Counters and Goodbye.
    pub clean: bool,
    /// Records sent that the collector had not acknowledged as durable when the exporter
    /// stopped (protocol version 2; 0 with a version 1 collector, which acknowledges
    /// nothing). They reached the collector unless it failed before storing them.
    pub unacknowledged: u64,
}

/// Runs the exporter thread and hands out [`Probe`]s that feed it.
#[derive(Debug)]
pub struct Exporter {
    shared: Arc<Shared>,
    hops: Vec<(HopId, String)>,
    control: Arc<Mutex<PendingControl>>,
    status: Arc<Mutex<Status>>,
    shutdown_timeout_ns: Arc<AtomicU64>,
    /// Once stopping, how long a collector that is away is waited for
    /// ([`Exporter::shutdown_promptly`]); `u64::MAX`: the whole shutdown timeout.
    away_at_stop_ns: Arc<AtomicU64>,
    thread: Option<JoinHandle<(bool, u64)>>,
}

#[derive(Debug, Default, Clone)]
struct Status {
    connected: bool,
    run_id: Option<String>,
    last_error: Option<String>,
    /// The collector refused the probe for good: the exporter stopped trying.
    rejected: Option<String>,
}

impl Exporter {
    /// Starts an exporter announcing `hops`, reporting the clock status
    /// [`ExporterConfig::clock`] names.
    ///
    /// The connection is made in the background; `report()` works at once and queues
    /// until the collector is reachable.
    ///
    /// # Errors
    /// [`ExporterError::Hops`] for an invalid hop list, [`ExporterError::Tls`],
    /// [`ExporterError::Hello`], [`ExporterError::Spawn`].
    pub fn start(config: ExporterConfig, hops: &[(HopId, &str)]) -> Result<Self, ExporterError> {
        if hops.is_empty() || hops.len() > MAX_HOPS {
            return Err(ExporterError::Hops(format!(
                "{} hops given, 1 to {MAX_HOPS} allowed",
                hops.len()
            )));
        }
        let mut ids: Vec<u8> = hops.iter().map(|(h, _)| h.0).collect();
        ids.sort_unstable();
        ids.dedup();
        if ids.len() != hops.len() {
            return Err(ExporterError::Hops("a hop id appears twice".into()));
        }
        let tls = Tls::new(&config)?;
        let shared = Arc::new(Shared::new(config.queue_capacity));
        let hops: Vec<(HopId, String)> = hops.iter().map(|(h, n)| (*h, (*n).to_owned())).collect();
        let control = Arc::new(Mutex::new(PendingControl::default()));
        let status = Arc::new(Mutex::new(Status::default()));
        let shutdown_timeout_ns = Arc::new(AtomicU64::new(duration_ns(
            config.connect_timeout.max(Duration::from_secs(5)),
        )));
        let away_at_stop_ns = Arc::new(AtomicU64::new(u64::MAX));
        let hello = Hello {
            // Without retention there is nothing to send again: version 1 says so.
            version: if config.retention_bytes == 0 {
                1
            } else {
                PROTOCOL_VERSION
            },
            instance_id: std::hash::RandomState::new().build_hasher().finish(),
            host: config.host.clone(),
            process: config.process.clone(),
            software: concat!("hoptrace-probe ", env!("CARGO_PKG_VERSION")).to_owned(),
            token: config.token.clone().unwrap_or_default(),
            hops: hops.clone(),
        };
        Frame::Hello(hello.clone()).check()?;
        let clock = ClockFeed::start(&config.clock, config.clock_interval)?;
        let mut worker = Worker {
            hello,
            retention: Retention::new(config.retention_bytes),
            durable: false,
            next_seq: 1,
            inbox: Vec::new(),
            config,
            tls,
            shared: Arc::clone(&shared),
            control: Arc::clone(&control),
            status: Arc::clone(&status),
            clock,
            shutdown_timeout_ns: Arc::clone(&shutdown_timeout_ns),
            away_at_stop_ns: Arc::clone(&away_at_stop_ns),
        };
        let thread = std::thread::Builder::new()
            .name("hoptrace-exporter".into())
            .spawn(move || worker.run())?;
        Ok(Self {
            shared,
            hops,
            control,
            status,
            shutdown_timeout_ns,
            away_at_stop_ns,
            thread: Some(thread),
        })
    }

    /// Starts an exporter as [`Exporter::start`] does and waits until the collector
    /// welcomes it, at most [`ExporterConfig::welcome_timeout`]: for a process that should
    /// not run unmeasured. Reports made before the Welcome would have queued all the same.
    ///
    /// # Errors
    /// As [`Exporter::start`], and [`ExporterError::NotWelcomed`] with the last connection
    /// error when no Welcome came in time (the exporter is then stopped).
    pub fn connect(config: ExporterConfig, hops: &[(HopId, &str)]) -> Result<Self, ExporterError> {
        let wait = config.welcome_timeout;
        let (collector, process) = (config.collector.clone(), config.process.clone());
        let exporter = Self::start(config, hops)?;
        let started = Instant::now();
        while !exporter.is_connected() && exporter.rejected().is_none() && started.elapsed() < wait
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        if exporter.is_connected() {
            return Ok(exporter);
        }
        if let Some(reason) = exporter.rejected() {
            drop(exporter.with_shutdown_timeout(Duration::ZERO));
            return Err(ExporterError::Rejected {
                collector,
                process,
                reason,
            });
        }
        let detail = exporter
            .last_error()
            .unwrap_or_else(|| "no answer".to_owned());
        // Nothing was reported yet: let its thread go without trying any longer.
        drop(exporter.with_shutdown_timeout(Duration::ZERO));
        Err(ExporterError::NotWelcomed {
            collector,
            process,
            hops: hops.iter().map(|(_, n)| *n).collect::<Vec<_>>().join(", "),
            waited_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
            detail,
        })
    }

    /// A probe for `hop`, stamping with CLOCK_REALTIME.
    ///
    /// # Errors
    /// [`ExporterError::UnknownHop`] when `hop` was not declared at start.
    pub fn probe(&self, hop: HopId) -> Result<Probe, ExporterError> {
        self.probe_with_clock(hop, SystemClock)
    }

    /// A probe for the hop named `name`.
    ///
    /// # Errors
    /// [`ExporterError::Hops`] when no declared hop has that name.
    pub fn probe_named(&self, name: &str) -> Result<Probe, ExporterError> {
        let hop = self
            .hops
            .iter()
            .find(|(_, n)| n == name)
            .map(|(h, _)| *h)
            .ok_or_else(|| ExporterError::Hops(format!("no hop named {name:?} declared")))?;
        self.probe(hop)
    }

    /// A probe for `hop` reading `clock` (tests inject a skewed or manual clock).
    ///
    /// # Errors
    /// [`ExporterError::UnknownHop`] when `hop` was not declared at start.
    pub fn probe_with_clock<C: Clock>(
        &self,
        hop: HopId,
        clock: C,
    ) -> Result<Probe<C>, ExporterError> {
        if !self.hops.iter().any(|(h, _)| *h == hop) {
            return Err(ExporterError::UnknownHop(hop));
        }
        Ok(Probe::new(hop, clock, Arc::clone(&self.shared)))
    }

    /// Queues a publisher's accounting (a Sent frame: what it sent, per stream,
    /// cumulative) for the collector, which counts every message sent as complete,
    /// incomplete or unseen. Frames queued before [`Exporter::shutdown`] are sent before
    /// Goodbye.
    ///
    /// # Errors
    /// More entries than a frame holds ([`EncodeError::TooManySentEntries`]): split them
    /// over several frames; nothing is queued.
    pub fn send_sent_frame(&self, sent: SentFrame) -> Result<(), EncodeError> {
        if sent.entries.len() > MAX_SENT_PER_FRAME {
            return Err(EncodeError::TooManySentEntries(sent.entries.len()));
        }
        lock(&self.control).add_sent(sent);
        Ok(())
    }

    /// Queues counters of the caller's own (a tap's polls, for instance, with ids from 64
    /// up: `docs/collector-protocol.md`) for the collector, in a Counters frame beside the
    /// exporter's own.
    ///
    /// # Errors
    /// More than 255 counters ([`EncodeError::TooManyCounters`]); nothing is queued.
    pub fn send_counters_frame(&self, counters: CountersFrame) -> Result<(), EncodeError> {
        if counters.values.len() > MAX_COUNTERS_PER_FRAME {
            return Err(EncodeError::TooManyCounters(counters.values.len()));
        }
        lock(&self.control).add_counters(counters);
        Ok(())
    }

    /// Records in the probes' queue, not yet taken by the exporter's thread (which, while
    /// the collector is away, moves them into the retention buffer).
    #[must_use]
    pub fn queued(&self) -> usize {
        self.shared.queue.len()
    }

    /// Current counters.
    #[must_use]
    pub fn counters(&self) -> CounterSnapshot {
        self.shared
            .counters
            .snapshot(self.shared.queue.len() as u64)
    }

    /// Whether the exporter is connected to the collector.
    #[must_use]
    pub fn is_connected(&self) -> bool {
        lock(&self.status).connected
    }

    /// The run id the collector announced in Welcome.
    #[must_use]
    pub fn run_id(&self) -> Option<String> {
        lock(&self.status).run_id.clone()
    }

    /// The last connection error, if any.
    #[must_use]
    pub fn last_error(&self) -> Option<String> {
        lock(&self.status).last_error.clone()
    }

    /// Why the collector refused this exporter for good, if it did (a hop its pipeline
    /// does not declare, a wrong token, an unsupported protocol): the exporter has stopped
    /// trying, and what it held or is given is counted as lost. The host should stop and
    /// say why.
    #[must_use]
    pub fn rejected(&self) -> Option<String> {
        lock(&self.status).rejected.clone()
    }

    /// Sets how long [`Exporter::shutdown`] (or the exporter's thread after a drop) keeps
    /// trying to deliver what is queued (default: the connect timeout, at least 5 s).
    #[must_use]
    pub fn with_shutdown_timeout(self, timeout: Duration) -> Self {
        self.shutdown_timeout_ns
            .store(duration_ns(timeout), Relaxed);
        self
    }

    /// [`Exporter::shutdown`] for a host that was asked to stop (Ctrl-C, the end of its
    /// run): while connected it flushes as usual, within the shutdown timeout; a
    /// collector that is away (now, or once the flush has begun) is waited for at most
    /// `away`, not the whole timeout, so the host can print its summary promptly. What
    /// does not reach the collector is counted as `send_failed`, as always.
    pub fn shutdown_promptly(self, away: Duration) -> ExportSummary {
        self.away_at_stop_ns.store(duration_ns(away), Relaxed);
        self.shutdown()
    }

    /// Flushes everything queued, sends the final counters and Goodbye, stops, and
    /// returns what happened to everything reported. Waits for the exporter's thread: up
    /// to the shutdown timeout ([`Exporter::with_shutdown_timeout`]) when the collector
    /// is slow or away. Records that cannot be delivered within it are counted as
    /// `send_failed` and logged at ERROR.
    pub fn shutdown(mut self) -> ExportSummary {
        self.shared.shutdown.store(true, Release);
        let (clean, unacknowledged) = self
            .thread
            .take()
            .map_or((false, 0), |t| t.join().unwrap_or((false, 0)));
        ExportSummary {
            counters: self.counters(),
            clean,
            unacknowledged,
        }
    }
}

/// Dropping an exporter without [`Exporter::shutdown`] never blocks: it tells the
/// exporter's thread to stop and lets it go. The thread still flushes what is queued,
/// sends the final counters and Goodbye, within the shutdown timeout, and then ends on
/// its own (unless the process exits first). Call `shutdown` to wait for that and learn
/// the outcome.
impl Drop for Exporter {
    fn drop(&mut self) {
        if self.thread.take().is_some() {
            self.shared.shutdown.store(true, Release);
        }
    }
}

/// The TLS setting an exporter connects with, resolved once at start.
struct Tls {
    #[cfg(feature = "tls")]
    client: Option<(
        Arc<rustls::ClientConfig>,
        rustls::pki_types::ServerName<'static>,
    )>,
}

impl Tls {
    #[cfg(feature = "tls")]
    fn new(config: &ExporterConfig) -> Result<Self, ExporterError> {
        let client = match &config.tls_ca {
            Some(ca) => Some((
                crate::tls::client_config(ca).map_err(|e| ExporterError::Tls(e.to_string()))?,
                crate::tls::server_name(&config.collector, config.tls_server_name.as_deref())
                    .map_err(|e| ExporterError::Tls(e.to_string()))?,
            )),
            None => None,
        };
        Ok(Self { client })
    }

    #[cfg(not(feature = "tls"))]
    fn new(config: &ExporterConfig) -> Result<Self, ExporterError> {
        match &config.tls_ca {
            Some(ca) => Err(ExporterError::Tls(format!(
                "TLS to the collector (CA {}) needs hoptrace-probe built with the `tls` feature",
                ca.display()
            ))),
            None => Ok(Self {}),
        }
    }

    fn wrap(&self, tcp: TcpStream) -> Result<Conn, String> {
        #[cfg(feature = "tls")]
        if let Some((config, name)) = &self.client {
            return crate::tls::connect(config, name.clone(), tcp).map(|s| Conn::Tls(Box::new(s)));
        }
        Ok(Conn::Plain(tcp))
    }
}

/// The connection to the collector: plain TCP, or TLS over it.
enum Conn {
    Plain(TcpStream),
    #[cfg(feature = "tls")]
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Conn {
    /// Switches the socket between blocking and non-blocking.
    fn set_nonblocking(&self, on: bool) {
        let _ = match self {
            Self::Plain(s) => s.set_nonblocking(on),
            #[cfg(feature = "tls")]
            Self::Tls(s) => s.sock.set_nonblocking(on),
        };
    }

    /// Flushes, sends TLS close_notify when TLS, and shuts the write side.
    fn finish(&mut self) {
        let _ = self.flush();
        match self {
            Self::Plain(s) => {
                let _ = s.shutdown(std::net::Shutdown::Write);
            }
            #[cfg(feature = "tls")]
            Self::Tls(s) => {
                s.conn.send_close_notify();
                let _ = s.flush();
                let _ = s.sock.shutdown(std::net::Shutdown::Write);
            }
        }
    }
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Self::Plain(s) => s.read(buf),
            #[cfg(feature = "tls")]
            Self::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Self::Plain(s) => s.write(buf),
            #[cfg(feature = "tls")]
            Self::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Self::Plain(s) => s.flush(),
            #[cfg(feature = "tls")]
            Self::Tls(s) => s.flush(),
        }
    }
}

struct Worker {
    config: ExporterConfig,
    tls: Tls,
    hello: Hello,
    /// Sent records frames not yet acknowledged (version 2 connections).
    retention: Retention,
    /// The current connection speaks version 2: frames are numbered and retained.
    durable: bool,
    /// The next records frame's number.
    next_seq: u64,
    /// Bytes read from the collector not yet decoded (its Acks).
    inbox: Vec<u8>,
    shared: Arc<Shared>,
    control: Arc<Mutex<PendingControl>>,
    status: Arc<Mutex<Status>>,
    /// The clock status readings, taken on their own thread.
    clock: ClockFeed,
    shutdown_timeout_ns: Arc<AtomicU64>,
    /// Once stopping, how long a collector that is away is waited for
    /// ([`Exporter::shutdown_promptly`]); `u64::MAX`: the whole shutdown timeout.
    away_at_stop_ns: Arc<AtomicU64>,
}

/// How long a connection must have lasted for its loss to look like a collector restart
/// (come back at once) rather than a collector that welcomes and then fails (back off).
const HEALTHY_CONNECTION: Duration = Duration::from_secs(1);

/// When to try the collector again. A failed attempt waits the delay, which doubles up to
/// `backoff_max`. A lost connection that had lasted [`HEALTHY_CONNECTION`] is tried again
/// at once and resets the delay; one lost sooner counts as a failed attempt, so that a
/// collector that welcomes and then drops or garbles every connection is not reconnected
/// to (and sent the whole retention buffer again) in a tight loop.
#[derive(Debug)]
struct Retry {
    delay: Duration,
    min: Duration,
    max: Duration,
    next: Instant,
    connected_at: Option<Instant>,
}

impl Retry {
    fn new(min: Duration, max: Duration) -> Self {
        Self {
            delay: min,
            min,
            max,
            next: Instant::now(),
            connected_at: None,
        }
    }

    fn failed(&mut self, now: Instant) {
        self.next = now + self.delay;
        self.delay = (self.delay * 2).min(self.max);
    }

    fn connected(&mut self, now: Instant) {
        self.connected_at = Some(now);
    }

    fn at_once(&mut self, now: Instant) {
        self.connected_at = None;
        self.next = now;
    }

    fn lost(&mut self, now: Instant) {
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
fn write_failed(e: &std::io::Error, write_timeout: Duration) -> String {
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
    fn run(&mut self) -> (bool, u64) {
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
                self.set_status(false, None, Some(e));
                conn = None;
                retry.lost(Instant::now());
                continue;
            }
            if finishing {
                // The collector acknowledges once more after Goodbye: wait for it (up to
                // the deadline) so that what it holds is known.
                while self.durable
                    && self.retention.unacked_records() > 0
                    && deadline.is_some_and(|d| Instant::now() < d)
                {
                    if self.read_acks(stream).is_err() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(5));
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
    fn resume(&mut self, stream: &mut Conn, resume_seq: Option<u64>) -> Result<(), String> {
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
    fn retain_queued(&mut self, buf: &mut Vec<u8>, max_batch: usize) {
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
    fn read_acks(&mut self, stream: &mut Conn) -> Result<(), String> {
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
    fn connect(&mut self) -> Result<(Conn, Option<u64>), (Option<u16>, String)> {
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
    fn connect_once(&mut self) -> Result<(Conn, Option<u64>), (Option<u16>, String)> {
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

    fn set_status(&self, connected: bool, run_id: Option<String>, error: Option<String>) {
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
fn fill(
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

fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests;
