//! `hoptrace publish`, `hoptrace tap` and `hoptrace record`: thin wrappers over
//! `hoptrace_publisher`.

use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use hoptrace_broker::target::TargetStats;
use hoptrace_broker::url::{Carrier, Endpoint};
use hoptrace_probe::HopId;
use hoptrace_publisher::accounting::LagSummary;
use hoptrace_publisher::capture::{self, RecordConfig};
use hoptrace_publisher::payload::PayloadFormat;
use hoptrace_publisher::publish::{PublishConfig, PublishSummary, Publisher, ReplayConfig};
use hoptrace_publisher::report::PublishReport;
use hoptrace_publisher::schedule::{Burst, LoadShape};
use hoptrace_publisher::tap::{Tap, TapConfig, TapSummary};
use hoptrace_publisher::uns::TopicScheme;

use crate::clock::Preflight as _;
use crate::collector_args::CollectorArgs;
use hoptrace_cli::tap::parse_carrier;
pub use hoptrace_cli::tap::{HopArgs, TapArgs};
use hoptrace_format::units;
use hoptrace_runner::interrupt::{interruptible, run_with_line};

/// The hop a command reports, resolved from its options.
pub trait ResolveHop {
    /// The id and name of the hop named `hop`.
    ///
    /// # Errors
    /// The hop is not in the pipeline spec, or the spec does not read.
    fn resolve(&self, hop: &str) -> anyhow::Result<(HopId, String)>;
}

impl ResolveHop for HopArgs {
    fn resolve(&self, hop: &str) -> anyhow::Result<(HopId, String)> {
        let id = match self.hop_id {
            Some(id) => id,
            None => {
                let spec = crate::collect::load_spec(self.pipeline.as_deref())?;
                let Some(HopId(id)) = spec.hop(hop) else {
                    bail!(
                        "{}: pass the collector's spec with --pipeline, or the hop's id with --hop-id",
                        spec.undeclared(hop)
                    );
                };
                id
            }
        };
        Ok((HopId(id), hop.to_owned()))
    }
}

/// Options of `hoptrace publish`.
#[derive(Debug, clap::Args)]
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
    pub preflight: crate::clock::PreflightArgs,
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

fn publish_config(args: &PublishArgs) -> anyhow::Result<PublishConfig> {
    let mut target = Endpoint::parse(&args.to).context("--to")?;
    if let Some(q) = args.qos {
        match &mut target {
            Endpoint::Mqtt(m) if q <= 2 => m.qos = q,
            Endpoint::Mqtt(_) => bail!("--qos must be 0, 1 or 2"),
            Endpoint::Kafka(_) => bail!("--qos applies to MQTT; Kafka uses acks= in the address"),
        }
    }
    let mut shape = LoadShape::uniform(args.rate, args.streams);
    shape.metrics_per_message = args.metrics_per_message;
    shape.zipf_exponent = args.zipf;
    shape.ramp_up = args.ramp_up;
    shape.duration = Some(args.duration);
    shape.max_messages = args.messages;
    if let (Some(factor), Some(every), Some(length)) =
        (args.burst_factor, args.burst_every, args.burst_length)
    {
        shape.burst = Some(Burst {
            every,
            length,
            factor,
        });
    }
    let mut c = PublishConfig::new(target, shape);
    c.carrier = args.carrier;
    c.payload = args.payload;
    c.context_in_payload = args.payload_context;
    c.topics = match args.topics.as_str() {
        "uns" => TopicScheme::Uns {
            root: args.topic_root.clone(),
            seed: args.seed,
        },
        "flat" => TopicScheme::Flat {
            root: args.topic_root.clone(),
        },
        other => bail!("--topics {other:?}: expected uns or flat"),
    };
    if let Some(id) = args.publisher_id {
        c.publisher_id = id;
    }
    if let Some(exporter) = args.collector.exporter_config("hoptrace-publish") {
        c.hop = args.hop_spec.resolve(&args.hop)?;
        c.collector = Some(exporter);
    }
    c.replay = args.replay.as_ref().map(|path| {
        let mut r = ReplayConfig::new(path.clone());
        r.speed = args.speed;
        r.fanout = args.fanout;
        r
    });
    c.flush_timeout = args.flush_timeout;
    c.tick = args.tick;
    Ok(c)
}

/// Runs `hoptrace publish`: a live line on a terminal, a summary always.
///
/// # Errors
/// Invalid options, an unusable broker or collector, a failure during the run.
pub fn publish(args: &PublishArgs) -> anyhow::Result<()> {
    let stop = crate::signals::shutdown_flag()?;
    args.preflight.check()?;
    let config = publish_config(args)?;
    let planned_s = args.duration.as_secs_f64();
    let planned_messages = args.rate * planned_s / f64::from(args.metrics_per_message.max(1));
    if args.replay.is_none() && planned_messages < f64::from(args.streams) {
        eprintln!(
            "warning: --rate {} metrics/s for {planned_s} s is {planned_messages:.1} message(s) of {} metric(s) over {} streams: most streams send nothing (lower --streams or raise --rate)",
            units::rate(args.rate),
            args.metrics_per_message,
            args.streams
        );
    }
    let publisher = interruptible(&stop, &format!("connecting to {}", args.to), move || {
        Publisher::new(config)
    })?
    .context("starting the publisher")?;
    eprintln!(
        "{} (SIGINT or SIGTERM stops, flushes and prints the summary)",
        publisher.describe()
    );
    let live = publisher.live();
    let mut last = *live.lock().expect("live stats poisoned");
    let summary = run_with_line(
        "publisher",
        &stop,
        &format!("publishing to {} (flushing)", args.to),
        move |stop| publisher.run(stop),
        |since| {
            let l = *live.lock().expect("live stats poisoned");
            let achieved = l.metrics.saturating_sub(last.metrics) as f64 / since.as_secs_f64();
            let elapsed_s = l.elapsed_ns as f64 / 1e9;
            let eta = match (l.planned_messages, l.messages) {
                (Some(p), m) if m > 0 && elapsed_s > 0.0 => {
                    let by_count = (p.saturating_sub(m)) as f64 / (m as f64 / elapsed_s);
                    by_count.min((planned_s - elapsed_s).max(0.0))
                }
                _ => (planned_s - elapsed_s).max(0.0),
            };
            last = l;
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
        },
    )??;
    // A schedule that ran to its end is measured over its whole planned duration: at a
    // low rate its last message leaves long before the end.
    let planned = (args.replay.is_none()
        && !summary.stopped_early
        && summary.errors == 0
        && args.messages.is_none_or(|m| summary.messages < m))
    .then_some(args.duration);
    let window_s = (summary.elapsed_ns as f64 / 1e9).max(planned.map_or(0.0, |d| d.as_secs_f64()));
    print_publish_summary(&summary, window_s);
    if let Some(path) = &args.summary_json {
        std::fs::write(
            path,
            serde_json::to_vec_pretty(&PublishReport::new(&summary, window_s))?,
        )
        .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(r) = &summary.collector_refused {
        bail!("the collector refused the publisher for good: {r}");
    }
    Ok(())
}

fn lag_line(l: &LagSummary) -> String {
    let q = |x: f64| {
        l.at(x).map_or_else(
            || "-".to_owned(),
            |q| {
                format!(
                    "{} ±{}",
                    units::duration_f64(q.value_ns as f64),
                    units::duration_f64(q.precision_ns as f64)
                )
            },
        )
    };
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

/// `window_s`: the time the achieved rates are measured over.
fn print_publish_summary(s: &PublishSummary, window_s: f64) {
    println!(
        "hoptrace publish: publisher {} -> {}, context in {}{}",
        s.publisher_id,
        s.target,
        s.carrier,
        s.run_id
            .as_ref()
            .map(|r| format!(", run {r}"))
            .unwrap_or_default()
    );
    let secs = s.elapsed_ns as f64 / 1e9;
    let per_s = |n: u64| {
        if window_s > 0.0 {
            n as f64 / window_s
        } else {
            0.0
        }
    };
    println!(
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
    );
    println!(
        "kept up with the schedule: {:.4} (intended span {:.3} s / actual {secs:.3} s)",
        s.keep_up_ratio(),
        s.schedule_span_ns as f64 / 1e9
    );
    let b = &s.broker;
    println!(
        "broker: written {}, acknowledged {}, delivery failed {}, unconfirmed at close {}, reconnects {}, connection errors {}",
        b.written, b.acked, b.failed, b.unconfirmed, b.reconnects, b.connection_errors
    );
    if s.target.starts_with("mqtt://") {
        for line in mqtt_accounting(b) {
            println!("{line}");
        }
    }
    println!(
        "back-pressure: {} messages waited for the client ({} in total); send errors {}",
        s.backpressure_waits,
        units::duration_f64(s.backpressure_wait_ns as f64),
        s.errors
    );
    println!(
        "schedule lag (egress - intended, HDR 3 significant digits): {}",
        lag_line(&s.lag)
    );
    match (&s.exporter, s.exporter_clean) {
        (Some(c), clean) => println!(
            "collector: stamps reported {}, delivered {}, {}; Sent frames for {} streams; closed cleanly: {}",
            c.reported,
            c.sent,
            crate::collector_args::lost_line(c),
            s.streams,
            if clean == Some(true) { "yes" } else { "NO" }
        ),
        (None, _) => println!("collector: none (stamps only in-band)"),
    }
}

/// Runs `hoptrace tap` until SIGINT/SIGTERM (or --duration / --messages).
///
/// # Errors
/// Invalid options, an unusable broker or collector.
pub fn tap(args: &TapArgs) -> anyhow::Result<()> {
    if crate::store_tap::is_store(&args.from) {
        return crate::store_tap::run(args);
    }
    let stop = crate::signals::shutdown_flag()?;
    args.preflight.check()?;
    let endpoint = match Endpoint::parse(&args.from) {
        Err(hoptrace_broker::url::UrlError::UnknownScheme(from)) => bail!(
            "--from {from:?}: the address must name a broker (mqtt://, kafka://) or a store ({})",
            hoptrace_tap::StoreKind::ALL
                .map(|k| format!("{}://", k.scheme()))
                .join(", ")
        ),
        other => other.context("--from")?,
    };
    let mut c = TapConfig::new(endpoint);
    c.topics.clone_from(&args.topics);
    c.carrier = args.carrier;
    if let Some(exporter) = args.collector.exporter_config("hoptrace-tap") {
        c.hop = args.hop_spec.resolve(&args.hop)?;
        c.collector = Some(exporter);
    }
    c.use_log_append_time = !args.no_log_append_time;
    c.publishers = (!args.publishers.is_empty()).then(|| args.publishers.clone());
    c.duration = args.duration;
    c.max_messages = args.messages;
    let tap = interruptible(&stop, &format!("connecting to {}", args.from), move || {
        Tap::start(c)
    })?
    .context("starting the tap")?;
    eprintln!("tapping {} (SIGINT or SIGTERM stops)", tap.describe());
    let live = tap.live();
    let started = Instant::now();
    let mut last = 0u64;
    let s = run_with_line(
        "tap",
        &stop,
        &format!("tapping {}", args.from),
        move |stop| tap.run(stop),
        |since| {
            let traced = live.traced.load(Relaxed);
            let rate = traced.saturating_sub(last) as f64 / since.as_secs_f64();
            last = traced;
            format!(
                "{:>6.0}s  {rate:>8.0} traced/s  received {}  traced {}  untraced {}  garbage {}  foreign {}",
                started.elapsed().as_secs_f64(),
                live.received.load(Relaxed),
                traced,
                live.not_traced.load(Relaxed),
                live.bad_context.load(Relaxed),
                live.foreign.load(Relaxed),
            )
        },
    )??;
    print_tap_summary(&s);
    if let Some(r) = &s.collector_refused {
        bail!("the collector refused the tap for good: {r}");
    }
    Ok(())
}

fn print_tap_summary(s: &TapSummary) {
    println!(
        "hoptrace tap: {} ({} carrier){}{} for {:.1} s",
        s.source,
        s.carrier,
        s.hop
            .as_ref()
            .map(|h| format!(", hop {h}"))
            .unwrap_or_default(),
        s.run_id
            .as_ref()
            .map(|r| format!(", run {r}"))
            .unwrap_or_default(),
        s.elapsed_ns as f64 / 1e9
    );
    println!(
        "received {}: traced {}, untraced {}, undecodable context {}, other publishers {}; reconnects {}",
        s.received, s.traced, s.not_traced, s.bad_context, s.foreign, s.reconnects
    );
    if s.new_sessions > 0 {
        println!(
            "note: {} reconnection(s) found no session kept by the broker (a clean session, or a broker restarted without persistence): messages published from the break until the tap subscribed again never reached it",
            s.new_sessions
        );
    }
    println!(
        "stamps: {} at arrival in the tap (CLOCK_REALTIME), {} from Kafka LogAppendTime",
        s.arrival_stamps, s.log_append_time_stamps
    );
    if let Some(r) = s.stamp_resolution_ns {
        println!(
            "note: LogAppendTime has {} resolution (truncated), so stages ending at this hop are up to {} short and may be negative",
            units::duration_f64(r as f64),
            units::duration_f64(r as f64)
        );
    }
    if s.publish_to_arrival.count > 0 {
        println!(
            "publish stamp -> arrival here: {}",
            lag_line(&s.publish_to_arrival)
        );
    }
    if let Some(c) = &s.exporter {
        println!(
            "collector: stamps reported {}, delivered {}, {}; closed cleanly: {}",
            c.reported,
            c.sent,
            crate::collector_args::lost_line(c),
            if s.exporter_clean == Some(true) {
                "yes"
            } else {
                "NO"
            }
        );
    }
}

/// Runs `hoptrace record` until SIGINT/SIGTERM (or --duration / --messages).
///
/// # Errors
/// Invalid options, an unusable broker, an unwritable file.
pub fn record(args: &RecordArgs) -> anyhow::Result<()> {
    let stop = crate::signals::shutdown_flag()?;
    let mut c = RecordConfig::new(
        Endpoint::parse(&args.from).context("--from")?,
        args.out.clone(),
    );
    c.topics.clone_from(&args.topics);
    c.duration = args.duration;
    c.max_messages = args.messages;
    eprintln!(
        "recording {} into {} (SIGINT or SIGTERM stops and closes the file)",
        c.source.display(),
        c.out.display()
    );
    let source = c.source.display();
    let s = run_with_line(
        "record",
        &stop,
        &format!("recording {source}"),
        move |stop| capture::record(&c, stop),
        |_| String::new(),
    )?
    .context("recording")?;
    println!(
        "hoptrace record: {} messages ({} payload bytes) from {} in {:.1} s into {}",
        s.messages,
        s.payload_bytes,
        s.source,
        s.elapsed_ns as f64 / 1e9,
        s.out.display()
    );
    Ok(())
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
