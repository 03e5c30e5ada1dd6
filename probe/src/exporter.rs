//! The exporter: one background thread per process that drains the probes' queue into
//! Records frames over TCP to the collector (`docs/collector-protocol.md`), sends the
//! host's clock status (read on a thread of its own, [`ClockReporting`]) and the
//! counters, reconnects with backoff, and flushes on shutdown.

mod config;
mod conn;
mod control;
mod worker;

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{Relaxed, Release};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::clock::{Clock, SystemClock};
use crate::clock_feed::ClockFeed;
use crate::context::HopId;
use crate::counters::CounterSnapshot;
use crate::probe::{Probe, Shared};
use crate::retention::Retention;
use hoptrace_protocol::{
    CountersFrame, EncodeError, Frame, Hello, MAX_HOPS, MAX_SENT_PER_FRAME, PROTOCOL_VERSION,
    SentFrame,
};

pub use config::{ClockReporting, ClockStatusFn, ExporterConfig, ExporterError};
use conn::Tls;
use control::{MAX_COUNTERS_PER_FRAME, PendingControl};
use worker::Worker;

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

fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests;
