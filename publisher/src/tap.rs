//! Taps: a probe for a hop you cannot modify. A tap subscribes to the broker, takes the
//! trace context out of every message it delivers and reports an arrival stamp for its
//! hop (`broker` by default) to the collector, without touching the broker.
//!
//! For Kafka topics whose record timestamps are `LogAppendTime`, the broker's own append
//! time is reported instead of the arrival time (unless disabled): it has millisecond
//! resolution, so it is truncated by up to 1 ms and the stage from `publish` to it can
//! be up to 1 ms short (even negative). The summary says which stamps were used.
//!
//! An MQTT tap subscribes with a clean session by default: when its connection breaks,
//! the broker keeps nothing for it, and messages published until it has subscribed again
//! never reach it (they show as traces missing this hop; the summary counts such
//! reconnections as `new_sessions`). With `?clean=false&client_id=<name>` (and `qos=1`)
//! the broker keeps the session and queues those messages for the tap, also across tap
//! restarts with the same id (MQTT 5: for `session_expiry_s`, 300 s by default). A broker
//! that restarts without persistence (Mosquitto's `persistence false`) forgets the session
//! and what it had queued all the same; with `persistence true` it restores what it saved
//! last (every `autosave_interval`), so a crash loses what changed since that save.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use hoptrace_probe::{CarrierError, CounterSnapshot, Exporter, ExporterConfig, HopId, Probe};

use crate::accounting::{LagHistogram, LagSummary, OwnCounters};
use hoptrace_broker::target::{self, BrokerTime, Source, TargetError};
use hoptrace_broker::url::{Carrier, Endpoint, UrlError};
use hoptrace_protocol::counter_id;

/// Resolution of Kafka's LogAppendTime, ns.
pub const LOG_APPEND_TIME_RESOLUTION_NS: u64 = 1_000_000;

/// Why a tap could not start or stopped. Each variant says what to fix.
#[derive(Debug, thiserror::Error)]
pub enum TapError {
    /// The broker address or carrier is invalid: fix `--from` or `--carrier`.
    #[error("broker address: {0}")]
    Url(#[from] UrlError),
    /// The broker cannot be used: see the message (unreachable, credentials, topic).
    #[error(transparent)]
    Target(#[from] TargetError),
    /// The exporter to the collector could not start (fix the hop or the TLS setting), or
    /// the collector did not welcome this tap (is `hoptrace collect` running there, with a
    /// pipeline that declares this hop, name and id, and the same token?).
    #[error("exporter: {0}")]
    Exporter(#[from] hoptrace_probe::ExporterError),
}

/// What to tap and where to report.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TapConfig {
    /// The broker.
    pub source: Endpoint,
    /// MQTT topic filters or Kafka topics (empty: `#`, or the address's Kafka topics).
    pub topics: Vec<String>,
    /// The carrier to read the context from; default per transport.
    pub carrier: Option<Carrier>,
    /// The collector and how to reach it, if stamps are to be reported: the tap connects
    /// at start and waits for the Welcome (up to its `welcome_timeout`), and announces its
    /// `process` name.
    pub collector: Option<ExporterConfig>,
    /// The hop the arrival stamps are reported as: its id and name as the collector's
    /// pipeline declares them (default: 1 `broker`, as the default pipeline's).
    pub hop: (HopId, String),
    /// Report Kafka's LogAppendTime as the stamp when the record carries it.
    pub use_log_append_time: bool,
    /// Only these publisher ids are reported; other traced messages count as foreign.
    pub publishers: Option<Vec<u16>>,
    /// Hop id of the publish stamp, for the local publish-to-arrival histogram.
    pub publish_hop: HopId,
    /// Stop after this long.
    pub duration: Option<Duration>,
    /// Stop after this many traced messages.
    pub max_messages: Option<u64>,
}

impl TapConfig {
    /// A tap of `source` with every other setting at its default.
    #[must_use]
    pub fn new(source: Endpoint) -> Self {
        Self {
            source,
            topics: Vec::new(),
            carrier: None,
            collector: None,
            hop: (HopId(1), "broker".into()),
            use_log_append_time: true,
            publishers: None,
            publish_hop: HopId(0),
            duration: None,
            max_messages: None,
        }
    }
}

/// Live counts of a running tap.
#[derive(Debug, Default)]
pub struct TapLive {
    /// Messages received.
    pub received: AtomicU64,
    /// Messages with a context, reported (or attempted) to the collector.
    pub traced: AtomicU64,
    /// Messages without a context in the configured carrier.
    pub not_traced: AtomicU64,
    /// Messages whose context did not decode (garbage).
    pub bad_context: AtomicU64,
    /// Traced messages of publishers not asked for.
    pub foreign: AtomicU64,
}

/// What a tap saw.
#[derive(Debug, Clone)]
pub struct TapSummary {
    /// The broker, without credentials.
    pub source: String,
    /// The carrier read.
    pub carrier: Carrier,
    /// The hop reported (name), if a collector was given.
    pub hop: Option<String>,
    /// Run id the collector announced.
    pub run_id: Option<String>,
    /// How long the tap ran, ns (monotonic).
    pub elapsed_ns: u64,
    /// Messages received.
    pub received: u64,
    /// Messages with a context (reported when a collector was given).
    pub traced: u64,
    /// Messages without a context.
    pub not_traced: u64,
    /// Messages whose context did not decode.
    pub bad_context: u64,
    /// Traced messages of other publishers.
    pub foreign: u64,
    /// Stamps taken from Kafka's LogAppendTime (millisecond resolution).
    pub log_append_time_stamps: u64,
    /// Stamps taken at arrival in the tap (CLOCK_REALTIME).
    pub arrival_stamps: u64,
    /// Resolution of the broker stamps when any came from LogAppendTime, ns.
    pub stamp_resolution_ns: Option<u64>,
    /// Arrival minus the context's publish stamp (this host's clock against the
    /// publisher's), for messages that carry one.
    pub publish_to_arrival: LagSummary,
    /// Reconnections to the broker.
    pub reconnects: u64,
    /// MQTT: reconnections to a new session (the broker had not kept this tap's session:
    /// a clean session, or a broker restarted without persistence). Messages published
    /// from the break until the tap subscribed again never reached it.
    pub new_sessions: u64,
    /// The exporter's final counters.
    pub exporter: Option<CounterSnapshot>,
    /// Whether the collector got everything.
    pub exporter_clean: Option<bool>,
    /// The collector refused the tap's probe for good during the run (its reason): the
    /// tap stopped there.
    pub collector_refused: Option<String>,
}

/// A tap, subscribed and ready.
pub struct Tap {
    config: TapConfig,
    carrier: Carrier,
    source: Box<dyn Source>,
    exporter: Option<Exporter>,
    probe: Option<Probe>,
    live: Arc<TapLive>,
}

impl std::fmt::Debug for Tap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tap")
            .field("source", &self.source.describe())
            .field("carrier", &self.carrier)
            .finish_non_exhaustive()
    }
}

impl Tap {
    /// Subscribes (every message published after this returns is seen) and connects to
    /// the collector.
    ///
    /// # Errors
    /// [`TapError`]: bad address or carrier, unreachable broker or collector, refused
    /// credentials, missing topic.
    pub fn start(config: TapConfig) -> Result<Self, TapError> {
        let carrier = config.source.carrier(config.carrier)?;
        let source = target::open_source(&config.source, &config.topics, "tap")?;
        let (exporter, probe) = match &config.collector {
            None => (None, None),
            Some(exporter) => {
                let (id, name) = &config.hop;
                let exporter = Exporter::connect(exporter.clone(), &[(*id, name.as_str())])?;
                let probe = exporter.probe(*id)?;
                (Some(exporter), Some(probe))
            }
        };
        Ok(Self {
            config,
            carrier,
            source,
            exporter,
            probe,
            live: Arc::new(TapLive::default()),
        })
    }

    /// One line naming the source, the carrier and the hop.
    #[must_use]
    pub fn describe(&self) -> String {
        format!(
            "{} ({} carrier){}",
            self.source.describe(),
            self.carrier,
            self.config
                .collector
                .as_ref()
                .map(|_| format!(
                    ", reporting hop {} (id {})",
                    self.config.hop.1, self.config.hop.0.0
                ))
                .unwrap_or_default()
        )
    }

    /// Live counts.
    #[must_use]
    pub fn live(&self) -> Arc<TapLive> {
        Arc::clone(&self.live)
    }

    /// Sends the collector the broker reconnections so far, when there are any and they
    /// changed since the last time.
    fn report_reconnects(&self, own: &mut OwnCounters) {
        if self.source.reconnects() > 0 {
            own.set(counter_id::BROKER_RECONNECTS, self.source.reconnects());
            own.set(counter_id::BROKER_NEW_SESSIONS, self.source.new_sessions());
            own.send_if_changed(self.exporter.as_ref());
        }
    }

    /// Receives and reports until `shutdown` is set, the duration passes or
    /// `max_messages` traced messages were seen; then flushes to the collector.
    ///
    /// # Errors
    /// [`TapError::Target`] when the broker connection is lost for good.
    pub fn run(mut self, shutdown: &AtomicBool) -> Result<TapSummary, TapError> {
        let started = Instant::now();
        let deadline = self.config.duration.map(|d| started + d);
        let mut lat = 0u64;
        let mut arrival = 0u64;
        let mut delivery = LagHistogram::new();
        let live = Arc::clone(&self.live);
        let mut failure = None;
        let mut refused: Option<String> = None;
        let mut next_check = Instant::now();
        // Broker reconnections, sent to the collector within 100 ms of each.
        let mut own = OwnCounters::default();
        while !shutdown.load(Relaxed)
            && deadline.is_none_or(|d| Instant::now() < d)
            && self
                .config
                .max_messages
                .is_none_or(|m| live.traced.load(Relaxed) < m)
        {
            if Instant::now() >= next_check {
                next_check = Instant::now() + Duration::from_millis(100);
                if let Some(r) = self.exporter.as_ref().and_then(Exporter::rejected) {
                    tracing::error!(
                        "tapping stopped: the collector refused the probe for good: {r}"
                    );
                    refused = Some(r);
                    break;
                }
                self.report_reconnects(&mut own);
            }
            let m = match self.source.recv(Duration::from_millis(100)) {
                Ok(Some(m)) => m,
                Ok(None) => continue,
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            };
            live.received.fetch_add(1, Relaxed);
            let outcome = m.extract(self.carrier);
            if let Some(p) = &self.probe {
                p.counters().count_extract(&outcome);
            }
            let ctx = match outcome {
                Ok(e) => e.context,
                Err(CarrierError::NotTraced) => {
                    live.not_traced.fetch_add(1, Relaxed);
                    continue;
                }
                Err(CarrierError::BadContext(e)) => {
                    if live.bad_context.fetch_add(1, Relaxed) == 0 {
                        tracing::warn!(topic = %m.topic, "a message carries a context that does not decode: {e} (further ones are counted)");
                    }
                    continue;
                }
            };
            if self
                .config
                .publishers
                .as_ref()
                .is_some_and(|p| !p.contains(&ctx.key.publisher))
            {
                live.foreign.fetch_add(1, Relaxed);
                continue;
            }
            let stamp_ns = match m.broker_time {
                Some(BrokerTime::LogAppendTimeMs(ms)) if self.config.use_log_append_time => {
                    lat += 1;
                    ms.saturating_mul(1_000_000)
                }
                _ => {
                    arrival += 1;
                    m.arrival_ns
                }
            };
            if let Some(p) = &self.probe {
                // A full queue is counted by the probe and reported to the collector.
                p.report_stamp(&ctx, stamp_ns);
            }
            if let Some(s) = ctx.stamp_of(self.config.publish_hop) {
                delivery.record(m.arrival_ns - s.ns);
            }
            live.traced.fetch_add(1, Relaxed);
        }
        self.report_reconnects(&mut own);
        self.source.close();
        let (exporter, exporter_clean, run_id) = match self.exporter.take() {
            Some(e) => {
                let run_id = e.run_id();
                let s = e.shutdown_promptly(hoptrace_probe::AWAY_AT_STOP);
                (Some(s.counters), Some(s.clean), run_id)
            }
            None => (None, None, None),
        };
        if let Some(e) = failure {
            return Err(TapError::Target(e));
        }
        if lat > 0 {
            tracing::info!(
                stamps = lat,
                "broker stamps taken from Kafka LogAppendTime: millisecond resolution, truncated"
            );
        }
        Ok(TapSummary {
            source: self.source.describe(),
            carrier: self.carrier,
            hop: self
                .config
                .collector
                .as_ref()
                .map(|_| self.config.hop.1.clone()),
            run_id,
            elapsed_ns: started.elapsed().as_nanos() as u64,
            received: live.received.load(Relaxed),
            traced: live.traced.load(Relaxed),
            not_traced: live.not_traced.load(Relaxed),
            bad_context: live.bad_context.load(Relaxed),
            foreign: live.foreign.load(Relaxed),
            log_append_time_stamps: lat,
            arrival_stamps: arrival,
            stamp_resolution_ns: (lat > 0).then_some(LOG_APPEND_TIME_RESOLUTION_NS),
            publish_to_arrival: delivery.summary(),
            reconnects: self.source.reconnects(),
            new_sessions: self.source.new_sessions(),
            exporter,
            exporter_clean,
            collector_refused: refused,
        })
    }
}

/// Subscribes, then taps until `shutdown` is set: [`Tap::start`] then [`Tap::run`].
///
/// # Errors
/// As [`Tap::start`] and [`Tap::run`].
pub fn run(config: TapConfig, shutdown: Arc<AtomicBool>) -> Result<TapSummary, TapError> {
    Tap::start(config)?.run(&shutdown)
}
