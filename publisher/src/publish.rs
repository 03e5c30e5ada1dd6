//! The publisher: sends traced messages on an open-loop schedule (generated load, or a
//! replayed capture), stamps each one at egress, reports the stamps and what it sent to
//! the collector, and measures how late each message left against its schedule.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hoptrace_probe::clock::realtime_ns;
use hoptrace_probe::traceparent::TRACEPARENT;
use hoptrace_probe::{
    CounterSnapshot, Exporter, ExporterConfig, ExporterError, HopId, OtelTraceId, Probe, Stamp,
    TraceContext, TraceKey,
};

use crate::accounting::{LagHistogram, LagSummary, OwnCounters, SentLedger};
use crate::capture::{CaptureError, CapturedMessage};
use crate::payload::PayloadFormat;
use crate::schedule::{LoadShape, Schedule, ShapeError};
use crate::uns::TopicScheme;
use hoptrace_broker::target::{self, Outgoing, SendError, Target, TargetError, TargetStats};
use hoptrace_broker::url::{Carrier, Endpoint, UrlError};
use hoptrace_protocol::counter_id;

/// Why a publish run could not start or finish. Each variant says what to fix.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// An option is invalid or options contradict each other: see the message.
    #[error("{0}")]
    Config(String),
    /// The load shape is invalid: fix the rate, streams or timing options.
    #[error("load shape: {0}")]
    Shape(#[from] ShapeError),
    /// The broker address is invalid: fix `--to`.
    #[error("broker address: {0}")]
    Url(#[from] UrlError),
    /// The broker cannot be used: see the message (unreachable, credentials, topic).
    #[error(transparent)]
    Target(#[from] TargetError),
    /// The exporter to the collector could not start (fix the hop list or the TLS
    /// setting), or the collector did not welcome this publisher (is `hoptrace collect`
    /// running at that address, with a pipeline that declares the publish hop, name and
    /// id, and the same token?).
    #[error("exporter: {0}")]
    Exporter(#[from] ExporterError),
    /// The capture to replay cannot be read: check the file.
    #[error(transparent)]
    Capture(#[from] CaptureError),
}

/// A capture to replay instead of generated load: [`ReplayConfig::new`], then set what
/// differs from its defaults.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ReplayConfig {
    /// The capture file (`hoptrace record`).
    pub path: PathBuf,
    /// Time scale: 2 replays twice as fast as captured.
    pub speed: f64,
    /// Copies of every message; with more than 1, copy `n` goes to `<topic>/f<n>` (for
    /// Kafka: key `<key>/f<n>`).
    pub fanout: u32,
}

impl ReplayConfig {
    /// Replays the capture at `path` once, at the speed it was captured.
    #[must_use]
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            speed: 1.0,
            fanout: 1,
        }
    }
}

/// `headers` and a `traceparent` for `id` into `out`, reusing its allocations: version
/// `00`, the message's trace id, a span id derived from it (never zero), sampled.
fn with_traceparent(
    headers: &[(String, Vec<u8>)],
    id: &OtelTraceId,
    out: &mut Vec<(String, Vec<u8>)>,
) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let keep = headers.iter().filter(|(k, _)| k != TRACEPARENT);
    let n = keep.clone().count();
    out.truncate(n + 1);
    while out.len() < n + 1 {
        out.push((String::new(), Vec::with_capacity(55)));
    }
    for ((k, v), (ok, ov)) in keep.zip(out.iter_mut()) {
        k.clone_into(ok);
        ov.clear();
        ov.extend_from_slice(v);
    }
    let (k, v) = &mut out[n];
    if k != TRACEPARENT {
        TRACEPARENT.clone_into(k);
    }
    let span = id.0[2..].iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    }) | 1;
    v.clear();
    v.extend_from_slice(b"00-");
    for b in id.0.iter().chain(span.to_be_bytes().iter()) {
        if v.len() == 35 {
            v.push(b'-');
        }
        v.push(HEX[usize::from(b >> 4)]);
        v.push(HEX[usize::from(b & 15)]);
    }
    v.extend_from_slice(b"-01");
}

/// What to publish, where, and how fast.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PublishConfig {
    /// The broker.
    pub target: Endpoint,
    /// The carrier, overriding the address's and the transport's default.
    pub carrier: Option<Carrier>,
    /// The load shape (ignored by a replay except for `duration`, `max_messages` and
    /// `metrics_per_message`).
    pub shape: LoadShape,
    /// Stream topic names.
    pub topics: TopicScheme,
    /// Payload format; `None` picks JSON for one metric and a JSON batch for more.
    pub payload: Option<PayloadFormat>,
    /// Also put the trace context into the (JSON) payload as the field `"hoptrace"`, its
    /// text form as it leaves the publisher, so that pipelines that keep a payload's
    /// fields carry it into the store (see [`crate::payload::put_context_field`]).
    pub context_in_payload: bool,
    /// Publisher id in the trace key; unique per publisher within a run.
    pub publisher_id: u16,
    /// The collector and how to reach it, if stamps are to be reported: the publisher
    /// connects at start and waits for the Welcome (up to its `welcome_timeout`), and
    /// announces its `process` name.
    pub collector: Option<ExporterConfig>,
    /// The hop the egress stamps are reported as: its id and name as the collector's
    /// pipeline declares them (default: 0 `publish`, as the default pipeline's).
    pub hop: (HopId, String),
    /// Publish without tracing: no probe stamp, no trace context in the message, no
    /// collector; the same client, settings, payloads, schedule (its clock read for the
    /// lag included) and accounting. The baseline a traced publisher's speed is compared
    /// with (`hoptrace bench publisher --bare`).
    pub bare: bool,
    /// Replay a capture instead of generating load.
    pub replay: Option<ReplayConfig>,
    /// How long to wait at the end for the broker to confirm what was sent.
    pub flush_timeout: Duration,
    /// How often the cumulative Sent frames go to the collector during the run.
    pub sent_interval: Duration,
    /// Pacing granularity: the sender wakes at most once per tick and then sends every
    /// message due by the end of it. Zero wakes for each message's own time. A tick
    /// trades up to one tick of schedule lag (measured and reported) for far fewer
    /// wake-ups and writes at high rates; stages are measured from the egress stamp.
    pub tick: Duration,
    /// Give every message a W3C trace id that names it (`OtelTraceId::of_key`), in its
    /// trace context and as a `traceparent` Kafka header or MQTT 5 user property, so
    /// OpenTelemetry instrumentation downstream continues the message's trace and the
    /// collector joins the spans it receives over OTLP to the message.
    pub traceparent: bool,
}

impl PublishConfig {
    /// Generated load described by `shape` to `target`, with every other setting at its
    /// default (UNS topics with seed 1, a random publisher id, no collector).
    #[must_use]
    pub fn new(target: Endpoint, shape: LoadShape) -> Self {
        use std::hash::{BuildHasher, Hasher};
        let id = (std::hash::RandomState::new().build_hasher().finish() as u16).max(1);
        Self {
            target,
            carrier: None,
            shape,
            topics: TopicScheme::default(),
            payload: None,
            context_in_payload: false,
            publisher_id: id,
            collector: None,
            hop: (HopId(0), "publish".into()),
            bare: false,
            replay: None,
            flush_timeout: Duration::from_secs(10),
            sent_interval: Duration::from_secs(1),
            tick: Duration::ZERO,
            traceparent: false,
        }
    }
}

/// Live figures of a running publisher, for a progress line.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LiveSnapshot {
    /// Time since the schedule started, ns (monotonic).
    pub elapsed_ns: u64,
    /// Messages handed to the broker client.
    pub messages: u64,
    /// Metrics in them.
    pub metrics: u64,
    /// Target rate now, metrics per second (`None` for a replay).
    pub target_metrics_per_s: Option<f64>,
    /// Messages that had to wait for the broker client (back-pressure).
    pub backpressure_waits: u64,
    /// Send errors.
    pub errors: u64,
    /// Schedule lag p99 over the last interval, ns.
    pub lag_p99_ns: u64,
    /// Largest schedule lag so far, ns.
    pub lag_max_ns: u64,
    /// Planned length of the run, ns (from `duration`).
    pub planned_ns: Option<u64>,
    /// Planned number of messages (`max_messages`, or the capture's size).
    pub planned_messages: Option<u64>,
    /// The run has ended.
    pub done: bool,
}

/// What a publish run did.
#[derive(Debug, Clone)]
pub struct PublishSummary {
    /// Publisher id.
    pub publisher_id: u16,
    /// The broker, without credentials.
    pub target: String,
    /// The carrier used.
    pub carrier: Carrier,
    /// Run id the collector announced.
    pub run_id: Option<String>,
    /// When the schedule started, CLOCK_REALTIME ns.
    pub started_unix_ns: i64,
    /// From the schedule's start to the last message handed over, ns (monotonic).
    pub elapsed_ns: u64,
    /// Intended send time of the last message sent, ns after the start: the span the
    /// schedule covered. `schedule_span_ns / elapsed_ns` near 1 means the publisher kept
    /// up with its schedule.
    pub schedule_span_ns: u64,
    /// Messages handed to the broker client (and reported as sent).
    pub messages: u64,
    /// Metrics in them.
    pub metrics: u64,
    /// From the start until the broker client had confirmed every message (Kafka:
    /// delivery reports; MQTT: acknowledged or written) or the flush timed out, ns: a
    /// client that buffers hands messages off faster than the broker takes them.
    pub confirmed_ns: u64,
    /// Payload bytes of those messages as handed to the client (without what the carrier
    /// adds: a header, user property or envelope).
    pub payload_bytes: u64,
    /// Streams that sent at least one message.
    pub streams: usize,
    /// Target rate at full speed, metrics per second (`None` for a replay).
    pub target_metrics_per_s: Option<f64>,
    /// Messages whose send waited for the broker client at least once.
    pub backpressure_waits: u64,
    /// Time spent waiting for the broker client, ns.
    pub backpressure_wait_ns: u64,
    /// Send errors (the run stops at the first one).
    pub errors: u64,
    /// The run was stopped (shutdown) before its schedule ended.
    pub stopped_early: bool,
    /// Schedule lag: egress stamp minus intended send time.
    pub lag: LagSummary,
    /// What the broker client did with the messages.
    pub broker: TargetStats,
    /// The exporter's final counters, when a collector was given.
    pub exporter: Option<CounterSnapshot>,
    /// Whether the collector got everything (final counters and Goodbye).
    pub exporter_clean: Option<bool>,
    /// The collector refused the publisher's probe for good during the run (its reason):
    /// the run stopped there.
    pub collector_refused: Option<String>,
}

impl PublishSummary {
    /// Achieved rate, metrics per second.
    #[must_use]
    pub fn metrics_per_s(&self) -> f64 {
        self.metrics as f64 / (self.elapsed_ns.max(1) as f64 / 1e9)
    }

    /// How well the publisher kept up with its schedule: the schedule's span over the
    /// time it took (1.0 when every message left on time; below when it fell behind).
    #[must_use]
    pub fn keep_up_ratio(&self) -> f64 {
        if self.elapsed_ns == 0 {
            1.0
        } else {
            self.schedule_span_ns as f64 / self.elapsed_ns as f64
        }
    }

    /// Delivered rate, metrics per second: over the time until the client had confirmed
    /// every message, so what a client's buffer absorbed does not count as sent faster.
    #[must_use]
    pub fn delivered_metrics_per_s(&self) -> f64 {
        self.metrics as f64 / (self.confirmed_ns.max(self.elapsed_ns).max(1) as f64 / 1e9)
    }

    /// Achieved rate, messages per second.
    #[must_use]
    pub fn messages_per_s(&self) -> f64 {
        self.messages as f64 / (self.elapsed_ns.max(1) as f64 / 1e9)
    }

    /// The time the achieved rates are measured over, seconds. A generated schedule
    /// (`planned`: its duration; `None` for a replay) that ran to its end is measured over
    /// its whole planned duration: at a low rate its last message leaves long before the
    /// end. A run stopped early, by an error, or by reaching `max_messages` is measured
    /// until its last message.
    #[must_use]
    pub fn rate_window_s(&self, planned: Option<Duration>, max_messages: Option<u64>) -> f64 {
        let ran_to_end = !self.stopped_early
            && self.errors == 0
            && max_messages.is_none_or(|m| self.messages < m);
        let planned_s = planned
            .filter(|_| ran_to_end)
            .map_or(0.0, |d| d.as_secs_f64());
        (self.elapsed_ns as f64 / 1e9).max(planned_s)
    }
}

/// The next message of a plan.
#[derive(Debug, Clone, Copy)]
struct Next {
    stream: u32,
    sequence: u64,
    offset_ns: u64,
    item: usize,
}

/// Where messages come from: the schedule of a load shape, or a capture.
enum Plan {
    Generated {
        schedule: Schedule,
        format: PayloadFormat,
        metrics: u32,
    },
    Replay {
        messages: Vec<CapturedMessage>,
        /// Stream of copy 0 of each message.
        base_stream: Vec<u32>,
        fanout: u32,
        speed: f64,
        next: usize,
        copy: u32,
        seqs: Vec<u64>,
        metrics: u32,
        end_ns: Option<u64>,
        max_messages: Option<u64>,
        emitted: u64,
    },
}

impl Plan {
    fn next(&mut self) -> Option<Next> {
        match self {
            Self::Generated { schedule, .. } => schedule.next_slot().map(|s| Next {
                stream: s.stream,
                sequence: s.sequence,
                offset_ns: s.offset_ns,
                item: 0,
            }),
            Self::Replay {
                messages,
                base_stream,
                fanout,
                speed,
                next,
                copy,
                seqs,
                end_ns,
                max_messages,
                emitted,
                ..
            } => {
                if max_messages.is_some_and(|m| *emitted >= m) {
                    return None;
                }
                let m = messages.get(*next)?;
                let t0 = messages[0].arrival_ns;
                let offset_ns = ((m.arrival_ns - t0).max(0) as f64 / *speed).round() as u64;
                if end_ns.is_some_and(|e| offset_ns >= e) {
                    return None;
                }
                let stream = base_stream[*next] + *copy;
                let sequence = seqs[stream as usize];
                seqs[stream as usize] += 1;
                let item = *next;
                *copy += 1;
                if *copy == *fanout {
                    *copy = 0;
                    *next += 1;
                }
                *emitted += 1;
                Some(Next {
                    stream,
                    sequence,
                    offset_ns,
                    item,
                })
            }
        }
    }

    /// Writes the payload of `n` into `buf`; returns its metric count.
    fn fill(&self, n: &Next, intended_ns: i64, buf: &mut Vec<u8>) -> u32 {
        match self {
            Self::Generated {
                format, metrics, ..
            } => {
                format.write(
                    buf,
                    n.stream,
                    n.sequence,
                    *metrics,
                    intended_ns.div_euclid(1_000_000),
                );
                *metrics
            }
            Self::Replay {
                messages, metrics, ..
            } => {
                buf.clear();
                let p = &messages[n.item].payload;
                match hoptrace_probe::carrier::envelope::unwrap(p) {
                    Ok((_, inner)) => buf.extend_from_slice(inner),
                    Err(_) => buf.extend_from_slice(p),
                }
                *metrics
            }
        }
    }

    fn headers(&self, n: &Next) -> &[(String, Vec<u8>)] {
        match self {
            Self::Generated { .. } => &[],
            Self::Replay { messages, .. } => &messages[n.item].headers,
        }
    }

    fn target_metrics_per_s(&self, offset_ns: u64) -> Option<f64> {
        match self {
            Self::Generated {
                schedule, metrics, ..
            } => Some(schedule.target_message_rate_at(offset_ns) * f64::from(*metrics)),
            Self::Replay { .. } => None,
        }
    }
}

/// A publisher, connected and ready to run.
pub struct Publisher {
    config: PublishConfig,
    plan: Plan,
    topics: Vec<String>,
    target: Box<dyn Target>,
    exporter: Option<Exporter>,
    probe: Option<Probe>,
    hop: HopId,
    live: Arc<Mutex<LiveSnapshot>>,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("publisher_id", &self.config.publisher_id)
            .field("target", &self.target.describe())
            .field("streams", &self.topics.len())
            .finish_non_exhaustive()
    }
}

/// When a message due at `offset_ns` is sent under a pacing tick of `tick_ns`: at the end
/// of the tick it falls in (at once when it falls on a boundary; its own time for no tick).
fn tick_end(offset_ns: u64, tick_ns: u64) -> u64 {
    if tick_ns <= 1 {
        offset_ns
    } else {
        offset_ns.div_ceil(tick_ns).saturating_mul(tick_ns)
    }
}

/// Waits until `due` by sleeping; returns early (false) when `shutdown` is set.
///
/// It never spins: with the kernel's default timer slack a sleep wakes up to ~50 µs
/// late, and every message due by then is sent at once. Spinning through the gaps
/// between messages would cost a core at any rate (measured: 1.3 cores at 25k msg/s),
/// and on a small machine that core belongs to the pipeline under test. A late wake-up
/// shows in the schedule lag, which is measured and reported; the stages are measured
/// from the egress stamp, taken when the message is handed to the client.
fn wait_until(due: Instant, shutdown: &AtomicBool) -> bool {
    loop {
        let now = Instant::now();
        if now >= due {
            return true;
        }
        if shutdown.load(Relaxed) {
            return false;
        }
        std::thread::sleep((due - now).min(Duration::from_millis(50)));
    }
}

impl Publisher {
    /// Validates the configuration, connects to the broker and (when configured) to the
    /// collector, waiting until the collector welcomed this publisher.
    ///
    /// # Errors
    /// [`PublishError`]: invalid options, unreachable broker or collector, refused
    /// credentials, missing topic, unreadable capture.
    pub fn new(config: PublishConfig) -> Result<Self, PublishError> {
        if config.bare && (config.collector.is_some() || config.context_in_payload) {
            return Err(PublishError::Config(
                "a bare publisher traces nothing: it takes no collector and puts no context into payloads".into(),
            ));
        }
        let carrier = config.target.carrier(config.carrier)?;
        let prefix = match &config.target {
            Endpoint::Mqtt(m) => m.prefix.clone(),
            Endpoint::Kafka(_) => None,
        };
        let (plan, topics) = match &config.replay {
            None => {
                let schedule = Schedule::new(&config.shape)?;
                let metrics = config.shape.metrics_per_message;
                let format = config
                    .payload
                    .unwrap_or_else(|| PayloadFormat::default_for(metrics));
                format.check(metrics).map_err(PublishError::Config)?;
                if config.context_in_payload && !format.is_json() {
                    return Err(PublishError::Config(
                        "the trace context goes into JSON payloads only: use --payload json or json-batch".into(),
                    ));
                }
                let topics = config
                    .topics
                    .topics(prefix.as_deref(), config.shape.streams);
                (
                    Plan::Generated {
                        schedule,
                        format,
                        metrics,
                    },
                    topics,
                )
            }
            Some(r) => {
                if config.context_in_payload {
                    return Err(PublishError::Config(
                        "a replay sends the captured payloads as they were: the trace context cannot be put into them".into(),
                    ));
                }
                if !(r.speed.is_finite() && r.speed > 0.0) {
                    return Err(PublishError::Config(
                        "--speed must be a positive number".into(),
                    ));
                }
                if r.fanout == 0 {
                    return Err(PublishError::Config("--fanout must be at least 1".into()));
                }
                let mut messages = crate::capture::read_capture(&r.path)?;
                messages.sort_by_key(|m| m.arrival_ns);
                if messages.is_empty() {
                    return Err(PublishError::Config(format!(
                        "{} holds no messages to replay",
                        r.path.display()
                    )));
                }
                let is_kafka = matches!(config.target, Endpoint::Kafka(_));
                let mut names: Vec<String> = Vec::new();
                let mut index = std::collections::HashMap::new();
                let mut base_stream = Vec::with_capacity(messages.len());
                for m in &messages {
                    let name = if is_kafka {
                        m.key.as_deref().map_or_else(
                            || m.topic.clone(),
                            |k| String::from_utf8_lossy(k).into_owned(),
                        )
                    } else {
                        m.topic.clone()
                    };
                    let next = index.len() as u32;
                    let i = *index.entry(name.clone()).or_insert_with(|| {
                        names.push(name);
                        next
                    });
                    base_stream.push(i * r.fanout);
                }
                let mut topics = Vec::with_capacity(names.len() * r.fanout as usize);
                for n in &names {
                    for k in 0..r.fanout {
                        topics.push(if r.fanout == 1 {
                            n.clone()
                        } else {
                            format!("{n}/f{k}")
                        });
                    }
                }
                let seqs = vec![0; topics.len()];
                (
                    Plan::Replay {
                        messages,
                        base_stream,
                        fanout: r.fanout,
                        speed: r.speed,
                        next: 0,
                        copy: 0,
                        seqs,
                        metrics: config.shape.metrics_per_message,
                        end_ns: config
                            .shape
                            .duration
                            .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
                        max_messages: config.shape.max_messages,
                        emitted: 0,
                    },
                    topics,
                )
            }
        };
        if u32::try_from(topics.len()).is_err() {
            return Err(PublishError::Config("too many streams".into()));
        }
        if let Endpoint::Mqtt(_) = &config.target
            && let Some(bad) = topics
                .iter()
                .find(|t| !rumqttc::valid_topic(t) || t.is_empty())
        {
            return Err(PublishError::Config(format!(
                "{bad:?} is not a valid MQTT topic name"
            )));
        }
        let target = target::open_target(&config.target, carrier, "pub")?;
        let (exporter, probe, hop) = match &config.collector {
            None => (None, None, HopId(0)),
            Some(exporter) => {
                let (id, name) = &config.hop;
                let exporter = Exporter::connect(exporter.clone(), &[(*id, name.as_str())])?;
                let probe = exporter.probe(*id)?;
                (Some(exporter), Some(probe), *id)
            }
        };
        let planned_messages = match &plan {
            Plan::Generated { .. } => config.shape.max_messages,
            Plan::Replay {
                messages, fanout, ..
            } => Some(
                (messages.len() as u64 * u64::from(*fanout))
                    .min(config.shape.max_messages.unwrap_or(u64::MAX)),
            ),
        };
        let live = Arc::new(Mutex::new(LiveSnapshot {
            planned_ns: config
                .shape
                .duration
                .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
            planned_messages,
            ..LiveSnapshot::default()
        }));
        Ok(Self {
            config,
            plan,
            topics,
            target,
            exporter,
            probe,
            hop,
            live,
        })
    }

    /// Live figures, updated by the running publisher four times a second.
    #[must_use]
    pub fn live(&self) -> Arc<Mutex<LiveSnapshot>> {
        Arc::clone(&self.live)
    }

    /// One line naming the publisher, the broker and the load.
    #[must_use]
    pub fn describe(&self) -> String {
        format!(
            "publisher {} -> {} ({} carrier), {} streams",
            self.config.publisher_id,
            self.target.describe(),
            self.target.carrier(),
            self.topics.len()
        )
    }

    /// Topic names of the streams (for Kafka: record keys).
    #[must_use]
    pub fn topics(&self) -> &[String] {
        &self.topics
    }

    /// Runs the schedule until it ends or `shutdown` is set, then waits for the broker
    /// to confirm, sends the final Sent frames and closes the exporter.
    ///
    /// # Errors
    /// [`PublishError::Target`] when the broker client fails during the run; what was
    /// sent until then is still reported to the collector.
    pub fn run(mut self, shutdown: &AtomicBool) -> Result<PublishSummary, PublishError> {
        let streams = self.topics.len() as u32;
        let publisher = self.config.publisher_id;
        let mut ledger = SentLedger::new(publisher, streams);
        let mut lag = LagHistogram::new();
        let mut interval_lag = LagHistogram::new();
        // Late sends and broker reconnections, sent to the collector as they happen: the
        // first late send after a frame and each reconnection at once, further late sends
        // with the Sent frames.
        let mut own = OwnCounters::default();
        let (mut late_sends, mut lag_max_ns, mut reconnects) = (0u64, 0u64, 0u64);
        let mut late_since_frame = false;
        let mut buf: Vec<u8> = Vec::with_capacity(4096);
        let mut traced_headers: Vec<(String, Vec<u8>)> = Vec::new();
        let mut backpressure_waits = 0u64;
        let mut backpressure_wait_ns = 0u64;
        let mut payload_bytes = 0u64;
        let mut errors = 0u64;
        let mut failure: Option<TargetError> = None;
        let mut stopped_early = false;
        let mut refused: Option<String> = None;
        let tick = Duration::from_millis(250);
        let start = Instant::now();
        let start_ns = realtime_ns();
        let mut next_tick = start + tick;
        let mut next_sent = start + self.config.sent_interval;
        let mut last_egress = start;
        let mut schedule_span_ns = 0u64;
        let tick_ns = u64::try_from(self.config.tick.as_nanos()).unwrap_or(u64::MAX);
        'run: while let Some(n) = self.plan.next() {
            let due = start + Duration::from_nanos(tick_end(n.offset_ns, tick_ns));
            if !wait_until(due, shutdown) || shutdown.load(Relaxed) {
                stopped_early = true;
                break;
            }
            let intended_ns = start_ns + n.offset_ns as i64;
            let metrics = self.plan.fill(&n, intended_ns, &mut buf);
            let base_len = buf.len();
            let key = TraceKey {
                publisher,
                stream: n.stream,
                sequence: n.sequence,
            };
            let trace_id = self.config.traceparent.then(|| OtelTraceId::of_key(&key));
            let headers = match &trace_id {
                Some(id) => {
                    with_traceparent(self.plan.headers(&n), id, &mut traced_headers);
                    &traced_headers[..]
                }
                None => self.plan.headers(&n),
            };
            let mut waited_since: Option<Instant> = None;
            loop {
                let mut ctx = TraceContext::new(key, metrics, intended_ns);
                ctx.otel_trace_id = trace_id;
                let stamp = match &self.probe {
                    // Bare: the clock read the schedule lag needs, and nothing else.
                    _ if self.config.bare => Stamp {
                        hop: self.hop,
                        ns: realtime_ns(),
                    },
                    Some(p) => p.stamp(&mut ctx),
                    None => {
                        let s = Stamp {
                            hop: self.hop,
                            ns: realtime_ns(),
                        };
                        let _ = ctx.push_stamp(s);
                        s
                    }
                };
                if self.config.context_in_payload {
                    crate::payload::put_context_field(&mut buf, base_len, &ctx);
                }
                let msg = Outgoing {
                    stream: n.stream,
                    topic: &self.topics[n.stream as usize],
                    payload: &buf,
                    context: (!self.config.bare).then_some(&ctx),
                    headers,
                };
                match self.target.try_send(&msg) {
                    Ok(()) => {
                        if let Some(p) = &self.probe {
                            // A full exporter queue is counted by the probe (queue_full)
                            // and reported to the collector; nothing more to do here.
                            p.report_stamp(&ctx, stamp.ns);
                        }
                        ledger.record(n.stream, n.sequence, metrics);
                        payload_bytes += buf.len() as u64;
                        let l = stamp.ns - intended_ns;
                        lag.record(l);
                        interval_lag.record(l);
                        if l > counter_id::LATE_SEND_NS {
                            late_sends += 1;
                            lag_max_ns = lag_max_ns.max(l.unsigned_abs());
                            own.set(counter_id::LATE_SENDS, late_sends);
                            own.set(counter_id::LAG_MAX_NS, lag_max_ns);
                            if !late_since_frame {
                                late_since_frame = true;
                                own.send_if_changed(self.exporter.as_ref());
                            }
                        }
                        if let Some(w) = waited_since {
                            backpressure_wait_ns += w.elapsed().as_nanos() as u64;
                        }
                        break;
                    }
                    Err(SendError::Full) => {
                        if waited_since.is_none() {
                            waited_since = Some(Instant::now());
                            backpressure_waits += 1;
                        }
                        if shutdown.load(Relaxed) {
                            stopped_early = true;
                            break 'run;
                        }
                        self.target.wait_for_capacity(Duration::from_millis(1));
                    }
                    Err(SendError::Failed(e)) => {
                        errors += 1;
                        tracing::error!("publishing stopped: {e}");
                        failure = Some(e);
                        break 'run;
                    }
                }
            }
            let now = Instant::now();
            last_egress = now;
            schedule_span_ns = n.offset_ns;
            if now >= next_tick {
                next_tick = now + tick;
                if let Some(r) = self.exporter.as_ref().and_then(Exporter::rejected) {
                    tracing::error!(
                        "publishing stopped: the collector refused the probe for good: {r}"
                    );
                    refused = Some(r);
                    stopped_early = true;
                    break 'run;
                }
                let now_reconnects = self.target.stats().reconnects;
                if now_reconnects != reconnects {
                    reconnects = now_reconnects;
                    own.set(counter_id::BROKER_RECONNECTS, reconnects);
                    own.send_if_changed(self.exporter.as_ref());
                }
                self.update_live(
                    start,
                    &ledger,
                    &lag,
                    &mut interval_lag,
                    n.offset_ns,
                    backpressure_waits,
                    errors,
                    false,
                );
            }
            if now >= next_sent {
                next_sent = now + self.config.sent_interval;
                if let Some(e) = &self.exporter {
                    for f in ledger.frames() {
                        e.send_sent_frame(f)
                            .expect("the ledger splits sent entries into frames that fit");
                    }
                }
                own.send_if_changed(self.exporter.as_ref());
                late_since_frame = false;
            }
        }
        let elapsed_ns = last_egress.duration_since(start).as_nanos() as u64;
        let broker = self.target.close(self.config.flush_timeout);
        if broker.reconnects != reconnects {
            own.set(counter_id::BROKER_RECONNECTS, broker.reconnects);
        }
        own.send_if_changed(self.exporter.as_ref());
        let confirmed_ns = start.elapsed().as_nanos() as u64;
        let (exporter, exporter_clean, run_id) = match self.exporter.take() {
            Some(e) => {
                for f in ledger.frames() {
                    e.send_sent_frame(f)
                        .expect("the ledger splits sent entries into frames that fit");
                }
                let run_id = e.run_id();
                let s = e.shutdown_promptly(hoptrace_probe::AWAY_AT_STOP);
                if !s.clean || s.counters.lost() > 0 {
                    tracing::error!(
                        lost = s.counters.lost(),
                        clean = s.clean,
                        "not every publish stamp reached the collector; the counts are in its accounting"
                    );
                }
                (Some(s.counters), Some(s.clean), run_id)
            }
            None => (None, None, None),
        };
        let offset = elapsed_ns;
        self.update_live(
            start,
            &ledger,
            &lag,
            &mut interval_lag,
            offset,
            backpressure_waits,
            errors,
            true,
        );
        if let Some(e) = failure {
            return Err(PublishError::Target(e));
        }
        Ok(PublishSummary {
            publisher_id: publisher,
            target: self.target.describe(),
            carrier: self.target.carrier(),
            run_id,
            started_unix_ns: start_ns,
            elapsed_ns,
            confirmed_ns,
            schedule_span_ns,
            messages: ledger.messages(),
            metrics: ledger.metrics(),
            payload_bytes,
            streams: ledger.streams_used(),
            target_metrics_per_s: match &self.plan {
                Plan::Generated { .. } => Some(self.config.shape.rate_metrics_per_s),
                Plan::Replay { .. } => None,
            },
            backpressure_waits,
            backpressure_wait_ns,
            errors,
            stopped_early,
            lag: lag.summary(),
            broker,
            exporter,
            exporter_clean,
            collector_refused: refused,
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn update_live(
        &self,
        start: Instant,
        ledger: &SentLedger,
        lag: &LagHistogram,
        interval_lag: &mut LagHistogram,
        offset_ns: u64,
        backpressure_waits: u64,
        errors: u64,
        done: bool,
    ) {
        let mut l = self.live.lock().expect("live stats poisoned");
        l.elapsed_ns = start.elapsed().as_nanos() as u64;
        l.messages = ledger.messages();
        l.metrics = ledger.metrics();
        l.target_metrics_per_s = self.plan.target_metrics_per_s(offset_ns);
        l.backpressure_waits = backpressure_waits;
        l.errors = errors;
        l.lag_p99_ns = interval_lag.value_at(0.99);
        l.lag_max_ns = lag.summary().max_ns;
        l.done = done;
        interval_lag.reset();
    }
}

/// Connects, runs the schedule until it ends or `shutdown` is set, and returns what was
/// sent: [`Publisher::new`] then [`Publisher::run`].
///
/// # Errors
/// As [`Publisher::new`] and [`Publisher::run`].
pub fn run(
    config: PublishConfig,
    shutdown: Arc<AtomicBool>,
) -> Result<PublishSummary, PublishError> {
    Publisher::new(config)?.run(&shutdown)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceparent_names_the_message_and_keeps_the_messages_own_headers() {
        let key = TraceKey {
            publisher: 3,
            stream: 9,
            sequence: 1_000_001,
        };
        let id = OtelTraceId::of_key(&key);
        let own = vec![
            ("source".to_owned(), b"line-4".to_vec()),
            (TRACEPARENT.to_owned(), b"stale".to_vec()),
        ];
        let mut out = Vec::new();
        for _ in 0..2 {
            with_traceparent(&own, &id, &mut out);
            assert_eq!(out.len(), 2);
            assert_eq!(out[0], own[0]);
            assert_eq!(out[1].0, TRACEPARENT);
            let parsed =
                hoptrace_probe::traceparent::parse(&out[1].1).expect("a valid traceparent");
            assert_eq!(parsed.key(), Some(key));
        }
        with_traceparent(&[], &id, &mut out);
        assert_eq!(out.len(), 1);
        let text = String::from_utf8(out[0].1.clone()).unwrap();
        assert!(text.starts_with(&format!("00-{}-", id.to_hex())), "{text}");
        assert!(
            text.ends_with("-01") && !text.contains("-0000000000000000-"),
            "{text}"
        );
    }

    #[test]
    fn a_tick_sends_each_message_at_the_end_of_its_tick() {
        assert_eq!(tick_end(0, 500_000), 0);
        assert_eq!(tick_end(1, 500_000), 500_000);
        assert_eq!(tick_end(499_999, 500_000), 500_000);
        assert_eq!(tick_end(500_000, 500_000), 500_000);
        assert_eq!(tick_end(500_001, 500_000), 1_000_000);
        assert_eq!(tick_end(123_456, 0), 123_456);
        assert_eq!(tick_end(123_456, 1), 123_456);
        assert_eq!(tick_end(u64::MAX - 1, 1_000), u64::MAX);
    }
}
