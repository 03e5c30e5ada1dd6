//! The options of `hoptrace publish` and `hoptrace record`, the publisher's configuration
//! they make, and the text of the publisher's live line and summary.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use hoptrace_broker::target::TargetStats;
use hoptrace_broker::url::{Carrier, Endpoint};
use hoptrace_format::units;
use hoptrace_publisher::accounting::LagSummary;
use hoptrace_publisher::capture::{RecordConfig, RecordSummary};
use hoptrace_publisher::payload::PayloadFormat;
use hoptrace_publisher::publish::{LiveSnapshot, PublishConfig, PublishSummary, ReplayConfig};
use hoptrace_publisher::schedule::{Burst, LoadShape};
use hoptrace_publisher::uns::TopicScheme;

use crate::argv::{Argv, ToArgs};
use crate::collector::{CollectorArgs, lost_line};
use crate::preflight::PreflightArgs;
use crate::tap::{HopArgs, parse_carrier};

/// Options of `hoptrace publish`.
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct PublishArgs {
    /// Broker: `mqtt://host:port[/prefix]?qos=1&version=5` or
    /// `kafka://host:port/topic?acks=all&linger_ms=5` (options: see the publisher docs).
    #[arg(long)]
    pub to: String,
    /// Target rate, metrics per second over all streams (`0.5`, `100k`, `1M`).
    #[arg(long, allow_negative_numbers = true, default_value = "10k", value_parser = units::parse_rate)]
    pub rate: f64,
    /// Streams (topics, series) the load is spread over.
    #[arg(long, allow_negative_numbers = true, default_value_t = 100)]
    pub streams: u32,
    /// Metrics per message (more than 1 sends JSON batches).
    #[arg(long, allow_negative_numbers = true, default_value_t = 1)]
    pub metrics_per_message: u32,
    /// How long to publish (`30s`, `30m`), ramp-up included.
    #[arg(long, default_value = "10s", value_parser = units::parse_duration)]
    pub duration: Duration,
    /// Stop after this many messages.
    #[arg(long, value_parser = units::parse_count)]
    pub messages: Option<u64>,
    /// Zipf exponent of the per-stream rates (0: uniform; 1.1: a few streams dominate).
    #[arg(long, allow_negative_numbers = true, default_value_t = 0.0)]
    pub zipf: f64,
    /// Time over which the rate rises linearly from 0 to --rate.
    #[arg(long, default_value = "0s", value_parser = units::parse_duration)]
    pub ramp_up: Duration,
    /// Rate multiplier during bursts (with --burst-every and --burst-length).
    #[arg(long, requires_all = ["burst_every", "burst_length"])]
    pub burst_factor: Option<f64>,
    /// Period of the bursts (`10s`).
    #[arg(long, value_parser = units::parse_duration)]
    pub burst_every: Option<Duration>,
    /// Length of each burst (`500ms`).
    #[arg(long, value_parser = units::parse_duration)]
    pub burst_length: Option<Duration>,
    /// MQTT QoS (overrides the address's `qos=`).
    #[arg(long)]
    pub qos: Option<u8>,
    /// Carrier of the trace context: property (MQTT 5), header (Kafka) or envelope.
    #[arg(long, value_parser = parse_carrier)]
    pub carrier: Option<Carrier>,
    /// Payload: text, json, json-batch or raw:<bytes> (default: json, or json-batch for
    /// several metrics per message).
    #[arg(long, value_parser = PayloadFormat::parse)]
    pub payload: Option<PayloadFormat>,
    /// Also put the trace context into the JSON payload, as the field "hoptrace" holding
    /// its text form (ht1.…) as it left the publisher, for store taps to find in the store.
    #[arg(long)]
    pub payload_context: bool,
    /// Give every message a W3C trace id that names it, in its context and as a
    /// `traceparent` header (Kafka) or user property (MQTT 5): OpenTelemetry
    /// instrumentation downstream continues the trace, and a collector started with
    /// `--otlp` joins the spans it receives to the message.
    #[arg(long)]
    pub traceparent: bool,
    /// Topic names: `uns` (enterprise/site/area/line/cell/tag) or `flat`.
    #[arg(long, default_value = "uns")]
    pub topics: String,
    /// First topic level (the UNS enterprise).
    #[arg(long)]
    pub topic_root: Option<String>,
    /// Seed of the UNS name shuffles.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Publisher id in the trace keys (default: random); unique per publisher in a run.
    #[arg(long)]
    pub publisher_id: Option<u16>,
    /// Replay a capture (`hoptrace record`) instead of generating load.
    #[arg(long)]
    pub replay: Option<PathBuf>,
    /// Replay speed: 2 sends twice as fast as captured.
    #[arg(long, allow_negative_numbers = true, default_value_t = 1.0)]
    pub speed: f64,
    /// Replay copies per captured message; copy n goes to `<topic>/f<n>`.
    #[arg(long, default_value_t = 1)]
    pub fanout: u32,
    /// The hop the publish stamps are reported as.
    #[arg(long, default_value = "publish")]
    pub hop: String,
    /// Also write the end summary as JSON to this file.
    #[arg(long)]
    pub summary_json: Option<PathBuf>,
    /// How long to wait at the end for the broker to confirm everything.
    #[arg(long, default_value = "10s", value_parser = units::parse_duration)]
    pub flush_timeout: Duration,
    /// Pacing granularity: wake at most once per tick and send every message due by its
    /// end (0: wake for each message). The extra schedule lag, up to one tick, is
    /// measured and reported; a tick of 100us-1ms saves a core's worth of wake-ups and
    /// writes at tens of thousands of messages per second. A unit is needed (`500us`,
    /// `1ms`): a bare number would be seconds.
    #[arg(long, default_value = "0s", value_parser = units::parse_short_duration)]
    pub tick: Duration,
    #[command(flatten)]
    pub collector: CollectorArgs,
    #[command(flatten)]
    pub hop_spec: HopArgs,
    #[command(flatten)]
    pub preflight: PreflightArgs,
}

/// Options of `hoptrace record`.
#[derive(Debug, clap::Args)]
pub struct RecordArgs {
    /// Broker: `mqtt://host:port` or `kafka://host:port/topic`.
    #[arg(long)]
    pub from: String,
    /// MQTT topic filters or Kafka topics, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub topics: Vec<String>,
    /// Where to write the capture (a Parquet file).
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
    /// Stop after this long (`90s`, `30m`; a bare number is seconds; default: until
    /// SIGINT/SIGTERM).
    #[arg(long, value_parser = crate::units::parse_run_length)]
    pub duration: Option<Duration>,
    /// Stop after this many messages.
    #[arg(long, value_parser = units::parse_count)]
    pub messages: Option<u64>,
}

impl PublishArgs {
    /// The publisher's configuration: the broker with `--qos` applied, the load shape,
    /// the topics, and the collector with the publish hop resolved from the spec.
    ///
    /// # Errors
    /// An address that does not parse, a QoS that does not apply, an unknown topic
    /// scheme, a hop the pipeline spec does not declare.
    pub fn config(&self) -> anyhow::Result<PublishConfig> {
        let mut target = Endpoint::parse(&self.to).context("--to")?;
        if let Some(q) = self.qos {
            match &mut target {
                Endpoint::Mqtt(m) if q <= 2 => m.qos = q,
                Endpoint::Mqtt(_) => bail!("--qos must be 0, 1 or 2"),
                Endpoint::Kafka(_) => {
                    bail!("--qos applies to MQTT; Kafka uses acks= in the address")
                }
            }
        }
        let mut shape = LoadShape::uniform(self.rate, self.streams);
        shape.metrics_per_message = self.metrics_per_message;
        shape.zipf_exponent = self.zipf;
        shape.ramp_up = self.ramp_up;
        shape.duration = Some(self.duration);
        shape.max_messages = self.messages;
        if let (Some(factor), Some(every), Some(length)) =
            (self.burst_factor, self.burst_every, self.burst_length)
        {
            shape.burst = Some(Burst {
                every,
                length,
                factor,
            });
        }
        let mut c = PublishConfig::new(target, shape);
        c.carrier = self.carrier;
        c.payload = self.payload;
        c.context_in_payload = self.payload_context;
        c.traceparent = self.traceparent;
        c.topics = match self.topics.as_str() {
            "uns" => TopicScheme::Uns {
                root: self.topic_root.clone(),
                seed: self.seed,
            },
            "flat" => TopicScheme::Flat {
                root: self.topic_root.clone(),
            },
            other => bail!("--topics {other:?}: expected uns or flat"),
        };
        if let Some(id) = self.publisher_id {
            c.publisher_id = id;
        }
        if let Some(exporter) = self.collector.exporter_config("hoptrace-publish") {
            c.hop = self.hop_spec.resolve(&self.hop)?;
            c.collector = Some(exporter);
        }
        c.replay = self.replay.as_ref().map(|path| {
            let mut r = ReplayConfig::new(path.clone());
            r.speed = self.speed;
            r.fanout = self.fanout;
            r
        });
        c.flush_timeout = self.flush_timeout;
        c.tick = self.tick;
        Ok(c)
    }

    /// A warning when the schedule has fewer messages than streams, so that most streams
    /// would send nothing.
    #[must_use]
    pub fn sparse_warning(&self) -> Option<String> {
        let planned_s = self.duration.as_secs_f64();
        let planned_messages = self.rate * planned_s / f64::from(self.metrics_per_message.max(1));
        (self.replay.is_none() && planned_messages < f64::from(self.streams)).then(|| {
            format!(
                "--rate {} metrics/s for {planned_s} s is {planned_messages:.1} message(s) of {} metric(s) over {} streams: most streams send nothing (lower --streams or raise --rate)",
                units::rate(self.rate),
                self.metrics_per_message,
                self.streams
            )
        })
    }

    /// The time the achieved rates of `s` are measured over, seconds
    /// ([`PublishSummary::rate_window_s`] of this schedule).
    #[must_use]
    pub fn rate_window_s(&self, s: &PublishSummary) -> f64 {
        s.rate_window_s(
            self.replay.is_none().then_some(self.duration),
            self.messages,
        )
    }
}

/// The publisher's live line: what it achieved since the last line, and its ETA.
#[derive(Debug)]
pub struct PublishLine {
    last: LiveSnapshot,
    planned_s: f64,
}

impl PublishLine {
    /// A line for a run of `planned` length, starting from `first`.
    #[must_use]
    pub fn new(first: LiveSnapshot, planned: Duration) -> Self {
        Self {
            last: first,
            planned_s: planned.as_secs_f64(),
        }
    }

    /// The line for `l`, `since` the last one.
    pub fn line(&mut self, l: LiveSnapshot, since: Duration) -> String {
        let achieved = l.metrics.saturating_sub(self.last.metrics) as f64 / since.as_secs_f64();
        let elapsed_s = l.elapsed_ns as f64 / 1e9;
        let eta = match (l.planned_messages, l.messages) {
            (Some(p), m) if m > 0 && elapsed_s > 0.0 => {
                let by_count = (p.saturating_sub(m)) as f64 / (m as f64 / elapsed_s);
                by_count.min((self.planned_s - elapsed_s).max(0.0))
            }
            _ => (self.planned_s - elapsed_s).max(0.0),
        };
        self.last = l;
        format!(
            "{elapsed_s:>6.0}s  target {}  achieved {}  sent {}  waits {}  errors {}  lag p99 {} max {}  ETA {:.0}s",
            l.target_metrics_per_s.map_or_else(
                || "replay".to_owned(),
                |t| format!("{} metrics/s", units::rate(t))
            ),
            format_args!("{} metrics/s", units::rate(achieved)),
            l.messages,
            l.backpressure_waits,
            l.errors,
            units::duration_f64(l.lag_p99_ns as f64),
            units::duration_f64(l.lag_max_ns as f64),
            eta
        )
    }
}

/// A schedule lag (or any [`LagSummary`]) on one line: its percentiles with their
/// precision, max, mean, and the messages counted as 0 because they left early.
#[must_use]
pub fn lag_line(l: &LagSummary) -> String {
    let q = |x: f64| l.at(x).map_or_else(|| "-".to_owned(), |q| q.shown());
    format!(
        "p50 {}  p90 {}  p99 {}  p99.9 {}  max {}  mean {}  ({} messages{})",
        q(0.5),
        q(0.9),
        q(0.99),
        q(0.999),
        units::duration_f64(l.max_ns as f64),
        units::duration_f64(l.mean_ns),
        l.count,
        if l.negative > 0 {
            format!(
                ", {} before their intended time (clock stepped back), counted as 0",
                l.negative
            )
        } else {
            String::new()
        }
    )
}

/// What became of every message an MQTT client took: at QoS 1 and 2 acknowledged (the
/// broker's promise to deliver it) or abandoned, at QoS 0 (no acknowledgement) written to
/// the broker's connection or never written; and why; and what was sent again after broken
/// connections. Each line's `=` is said of the figures it prints.
fn mqtt_accounting(b: &TargetStats) -> Vec<String> {
    let head = if b.mqtt_qos == Some(0) {
        // QoS 0 publishes are written once each (a break drops what was in flight).
        let holds = b.handed == b.written + b.unconfirmed;
        format!(
            "MQTT accounting (QoS 0: the broker acknowledges nothing, so delivery is not confirmed): handed {} {} written {} (to the broker's connection) + never written {} (still queued in the client at close)",
            b.handed,
            if holds { "=" } else { "!=" },
            b.written,
            b.unconfirmed
        )
    } else {
        let holds = b.handed == b.acked + b.unconfirmed;
        format!(
            "MQTT accounting: handed {} {} acknowledged {} (the broker promised to deliver them) + abandoned {} (never acknowledged)",
            b.handed,
            if holds { "=" } else { "!=" },
            b.acked,
            b.unconfirmed
        )
    };
    let mut lines = vec![head];
    if b.unconfirmed > 0 {
        let why = if b.down_at_close > 0 {
            format!(
                "{} connection(s) were down at close: the broker was unreachable until the flush timeout ended",
                b.down_at_close
            )
        } else {
            "the flush timeout (--flush-timeout) ended first".to_owned()
        };
        lines.push(format!(
            "  abandoned: {} written but never acknowledged, {} never written (still queued in the client); {why}",
            b.abandoned_unacked, b.abandoned_unwritten
        ));
    }
    if b.retransmitted + b.requeued > 0 || b.reconnects > 0 {
        lines.push(format!(
            "  after broken connections: {} publishes in flight at a break written again after the reconnection (a broker that already had one delivers it twice), {} queued in the client at a break written after it",
            b.retransmitted, b.requeued
        ));
    }
    lines
}

/// The publisher's end summary, its achieved rates measured over `window_s` seconds.
#[must_use]
pub fn publish_summary(s: &PublishSummary, window_s: f64) -> Vec<String> {
    let mut lines = Vec::new();
    lines.push(format!(
        "hoptrace publish: publisher {} -> {}, context in {}{}",
        s.publisher_id,
        s.target,
        s.carrier,
        s.run_id
            .as_ref()
            .map(|r| format!(", run {r}"))
            .unwrap_or_default()
    ));
    let secs = s.elapsed_ns as f64 / 1e9;
    let per_s = |n: u64| {
        if window_s > 0.0 {
            n as f64 / window_s
        } else {
            0.0
        }
    };
    lines.push(format!(
        "sent {} messages ({} metrics) over {} streams in {window_s:.2} s: {} metrics/s, {} messages/s{}{}",
        s.messages,
        s.metrics,
        s.streams,
        units::rate(per_s(s.metrics)),
        units::rate(per_s(s.messages)),
        s.target_metrics_per_s
            .map(|t| format!(" (target {} metrics/s at full rate)", units::rate(t)))
            .unwrap_or_default(),
        if s.stopped_early {
            "; stopped early"
        } else {
            ""
        }
    ));
    lines.push(format!(
        "kept up with the schedule: {:.4} (intended span {:.3} s / actual {secs:.3} s)",
        s.keep_up_ratio(),
        s.schedule_span_ns as f64 / 1e9
    ));
    let b = &s.broker;
    lines.push(format!(
        "broker: written {}, acknowledged {}, delivery failed {}, unconfirmed at close {}, reconnects {}, connection errors {}",
        b.written, b.acked, b.failed, b.unconfirmed, b.reconnects, b.connection_errors
    ));
    if s.target.starts_with("mqtt://") {
        lines.extend(mqtt_accounting(b));
    }
    lines.push(format!(
        "back-pressure: {} messages waited for the client ({} in total); send errors {}",
        s.backpressure_waits,
        units::duration_f64(s.backpressure_wait_ns as f64),
        s.errors
    ));
    lines.push(format!(
        "schedule lag (egress - intended, HDR 3 significant digits): {}",
        lag_line(&s.lag)
    ));
    match (&s.exporter, s.exporter_clean) {
        (Some(c), clean) => lines.push(format!(
            "collector: stamps reported {}, delivered {}, {}; Sent frames for {} streams; closed cleanly: {}",
            c.reported,
            c.sent,
            lost_line(c),
            s.streams,
            if clean == Some(true) { "yes" } else { "NO" }
        )),
        (None, _) => lines.push("collector: none (stamps only in-band)".to_owned()),
    }
    lines
}

impl RecordArgs {
    /// The capture's configuration.
    ///
    /// # Errors
    /// An address that does not parse.
    pub fn config(&self) -> anyhow::Result<RecordConfig> {
        let mut c = RecordConfig::new(
            Endpoint::parse(&self.from).context("--from")?,
            self.out.clone(),
        );
        c.topics.clone_from(&self.topics);
        c.duration = self.duration;
        c.max_messages = self.messages;
        Ok(c)
    }
}

/// The summary line of a capture.
#[must_use]
pub fn record_summary(s: &RecordSummary) -> String {
    format!(
        "hoptrace record: {} messages ({} payload bytes) from {} in {:.1} s into {}",
        s.messages,
        s.payload_bytes,
        s.source,
        s.elapsed_ns as f64 / 1e9,
        s.out.display()
    )
}

impl ToArgs for PublishArgs {
    fn write_args(&self, argv: &mut Argv) {
        let Self {
            to,
            rate,
            streams,
            metrics_per_message,
            duration,
            messages,
            zipf,
            ramp_up,
            burst_factor,
            burst_every,
            burst_length,
            qos,
            carrier,
            payload,
            payload_context,
            traceparent,
            topics,
            topic_root,
            seed,
            publisher_id,
            replay,
            speed,
            fanout,
            hop,
            summary_json,
            flush_timeout,
            tick,
            collector,
            hop_spec,
            preflight,
        } = self;
        argv.value("--to", to);
        argv.value("--rate", rate.to_string());
        argv.value("--streams", streams.to_string());
        argv.value("--metrics-per-message", metrics_per_message.to_string());
        argv.duration("--duration", *duration);
        argv.opt("--messages", messages.map(|n| n.to_string()));
        argv.value("--zipf", zipf.to_string());
        argv.duration("--ramp-up", *ramp_up);
        argv.opt("--burst-factor", burst_factor.map(|f| f.to_string()));
        argv.opt_duration("--burst-every", *burst_every);
        argv.opt_duration("--burst-length", *burst_length);
        argv.opt("--qos", qos.map(|q| q.to_string()));
        argv.opt("--carrier", carrier.map(Carrier::name));
        argv.opt("--payload", payload.map(PayloadFormat::spelling));
        argv.flag("--payload-context", *payload_context);
        argv.flag("--traceparent", *traceparent);
        argv.value("--topics", topics);
        argv.opt("--topic-root", topic_root.as_deref());
        argv.value("--seed", seed.to_string());
        argv.opt("--publisher-id", publisher_id.map(|id| id.to_string()));
        argv.path("--replay", replay.as_deref());
        argv.value("--speed", speed.to_string());
        argv.value("--fanout", fanout.to_string());
        argv.value("--hop", hop);
        argv.path("--summary-json", summary_json.as_deref());
        argv.duration("--flush-timeout", *flush_timeout);
        argv.duration("--tick", *tick);
        argv.group(collector);
        argv.group(hop_spec);
        argv.group(preflight);
    }
}

#[cfg(test)]
mod argv_tests {
    use super::*;
    use crate::argv::parse;
    use crate::collector::every_collector_option;

    #[test]
    fn a_publisher_with_every_option_set_is_written_back_as_itself() {
        let mut p: PublishArgs = parse(["--to", "mqtt://127.0.0.1:1883/plant?version=5"]).unwrap();
        p.rate = 2_500.5;
        p.streams = 17;
        p.metrics_per_message = 3;
        p.duration = Duration::from_millis(90_250);
        p.messages = Some(12_345);
        p.zipf = 1.1;
        p.ramp_up = Duration::from_secs(2);
        p.burst_factor = Some(3.5);
        p.burst_every = Some(Duration::from_secs(10));
        p.burst_length = Some(Duration::from_millis(500));
        p.qos = Some(1);
        p.carrier = Some(Carrier::Envelope);
        p.payload = Some(PayloadFormat::Raw { bytes: 64 });
        p.payload_context = true;
        p.traceparent = true;
        p.topics = "flat".into();
        p.topic_root = Some("plant/a".into());
        p.seed = 9;
        p.publisher_id = Some(77);
        p.replay = Some("capture.parquet".into());
        p.speed = 2.0;
        p.fanout = 3;
        p.hop = "egress".into();
        p.summary_json = Some("out/publisher.json".into());
        p.flush_timeout = Duration::from_secs(4);
        p.tick = Duration::from_micros(250);
        p.collector = every_collector_option();
        p.hop_spec = HopArgs {
            pipeline: Some("pipeline.toml".into()),
            hop_id: Some(3),
        };
        p.preflight = PreflightArgs {
            max_clock_error: Some(1_000_000),
            force_clock: true,
        };
        let back: PublishArgs = parse(p.to_args(&[])).unwrap();
        assert_eq!(back, p);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mqtt_accounting_at_qos_0_says_what_it_has_and_adds_up() {
        // 2,000 handed at QoS 0: written, none acknowledged (there is no acknowledgement).
        let b = TargetStats {
            handed: 2_000,
            written: 2_000,
            mqtt_qos: Some(0),
            ..TargetStats::default()
        };
        let head = &mqtt_accounting(&b)[0];
        assert!(head.contains("handed 2000 = written 2000"), "{head}");
        assert!(head.contains("+ never written 0"), "{head}");
        assert!(!head.contains("acknowledged 0"), "{head}");
        // Three never written at close.
        let b = TargetStats {
            written: 1_997,
            unconfirmed: 3,
            abandoned_unwritten: 3,
            ..b
        };
        assert!(
            mqtt_accounting(&b)[0].contains(
                "handed 2000 = written 1997 (to the broker's connection) + never written 3"
            )
        );
        // QoS 1: acknowledged or abandoned, and a sum that fails says so.
        let b = TargetStats {
            handed: 10,
            written: 10,
            acked: 9,
            unconfirmed: 1,
            abandoned_unacked: 1,
            mqtt_qos: Some(1),
            ..TargetStats::default()
        };
        assert!(mqtt_accounting(&b)[0].contains("handed 10 = acknowledged 9"));
        let b = TargetStats { acked: 7, ..b };
        assert!(mqtt_accounting(&b)[0].contains("handed 10 != acknowledged 7"));
    }
}
