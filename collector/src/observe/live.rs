//! The live view of a running collector (`hoptrace collect --ui`): the figures of
//! [`Live`], served as `/live.json`, and [`PAGE`], the self-contained HTML page served at
//! `/` that polls them every second (`docs/live-view.md`).
//!
//! Every figure is one the collector keeps anyway: the stages' figures over the last
//! interval are those of its HDR interval histograms (the ones its interval logs hold),
//! and over the whole run those of its cumulative histograms, into which each interval is
//! merged once as it ends; counts are its own counters. [`Live`] is taken as each interval
//! ends (once a second), off the per-record path.

use std::collections::BTreeMap;

use hoptrace_format::hist::{SIGNIFICANT_DIGITS, SignedStats};
use hoptrace_format::run::ClockRow;
use serde::{Deserialize, Serialize};

/// The page served at `/`: HTML with its CSS and JavaScript inline, no outside URL.
pub const PAGE: &str = include_str!("live.html");

/// The quantiles of [`Figures`], as (quantile, field name).
pub const LIVE_QUANTILES: [f64; 4] = [0.5, 0.9, 0.99, 0.999];

/// What a running collector shows live (`/live.json`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Live {
    /// The run's id.
    pub run_id: String,
    /// The collector is still running (false once it wrote `run.json`).
    pub running: bool,
    /// When the run started, `CLOCK_REALTIME` ns.
    pub started_unix_ns: i64,
    /// When these figures were taken (the end of the last interval, or of the run),
    /// `CLOCK_REALTIME` ns.
    pub updated_unix_ns: i64,
    /// `updated_unix_ns - started_unix_ns`, seconds.
    pub elapsed_s: f64,
    /// Intervals ended so far; it grows by one with each update.
    pub intervals: u64,
    /// The last interval, when one has ended.
    pub interval: Option<Interval>,
    /// Significant digits of every histogram (percentiles are within half a bucket).
    pub significant_digits: u8,
    /// Per stage, in the spec's order.
    pub stages: Vec<LiveStage>,
    /// Traces written over the last interval.
    pub throughput: Throughput,
    /// The run's counts so far.
    pub accounting: LiveAccounting,
    /// Probe connections open.
    pub connections: u64,
    /// Per probe host, its clock as its probes last reported it.
    pub clocks: Vec<HostClock>,
    /// The run's latest events (at most [`LIVE_EVENTS`]), in time order: what the report's
    /// "Events" section will list.
    pub events: Vec<hoptrace_format::events::RunEvent>,
}

/// Most events `/live.json` holds: the latest.
pub const LIVE_EVENTS: usize = 50;

/// One interval of the stages' histograms.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Interval {
    /// Start, `CLOCK_REALTIME` ns.
    pub start_unix_ns: i64,
    /// End, `CLOCK_REALTIME` ns.
    pub end_unix_ns: i64,
    /// Length, seconds.
    pub length_s: f64,
}

/// A stage's figures over the last interval and over the run so far.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LiveStage {
    /// The stage's name.
    pub name: String,
    /// Its first hop.
    pub from: String,
    /// Its last hop.
    pub to: String,
    /// A headline stage of the pipeline.
    pub headline: bool,
    /// Over the last interval.
    pub interval: Figures,
    /// Over every interval ended so far.
    pub run: Figures,
    /// Where the stage's true figures lie, when it starts or ends at a polled hop (a
    /// store tap's stamp, an interval in time); `null` for every other stage and for a
    /// stage between two stamps of one poll (exact).
    pub bounds: Option<LiveBounds>,
    /// The last interval's slowest message of a headline stage that splits into
    /// components (the stages that chain from its first hop to its last), with its
    /// timeline; `null` for other stages and for an interval without one.
    #[serde(default)]
    pub slowest: Option<LiveSlowest>,
}

/// One message of a stage and its components' deltas, one after the other.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveSlowest {
    /// Its key.
    pub publisher: u16,
    /// Its key.
    pub stream: u32,
    /// Its key.
    pub sequence: u64,
    /// The stage's delta, ns.
    pub delta_ns: i64,
    /// Its first hop's stamp, `CLOCK_REALTIME` ns.
    pub from_unix_ns: i64,
    /// Each component in chain order.
    pub components: Vec<LiveSegment>,
    /// The W3C trace id it carried, 32 hex digits.
    pub otel_trace_id: Option<String>,
}

/// One component of a [`LiveSlowest`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveSegment {
    /// The component: a stage of the spec, or `from → to` of two consecutive hops.
    pub name: String,
    /// Its delta, ns; `null` where one of its hops did not stamp.
    pub ns: Option<i64>,
}

/// A stage's figures over the smallest and over the largest deltas its polled stamps
/// allow, over the last interval and over the run so far. Every figure is monotone in the
/// deltas, so the true figure lies between the two (`docs/dataset.md`); clock
/// uncertainty comes on top (`clocks`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveBounds {
    /// The stage's polled hops.
    pub polled: Vec<String>,
    /// Over the last interval.
    pub interval: BoundFigures,
    /// Over every interval ended so far.
    pub run: BoundFigures,
}

/// The figures of a stage's smallest and largest possible deltas.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BoundFigures {
    /// Over the smallest possible deltas: a lower bound of each figure.
    pub lower: Figures,
    /// Over the largest possible deltas: an upper bound of each figure.
    pub upper: Figures,
}

impl BoundFigures {
    /// The figures of the smallest deltas `lower` and the largest `upper`.
    #[must_use]
    pub fn of(lower: &SignedStats, upper: &SignedStats) -> Self {
        Self {
            lower: Figures::of(lower),
            upper: Figures::of(upper),
        }
    }
}

/// A stage's deltas (signed: negative ones come from clock error between hosts), ns:
/// count, exact minimum and maximum, and HDR percentiles (the middle of the bucket holding
/// the value of rank `max(1, ceil(q n))`, within half a bucket of it). `None` without
/// values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Figures {
    /// Deltas.
    pub count: u64,
    /// Deltas below zero.
    pub negative: u64,
    /// Smallest delta (exact).
    pub min_ns: Option<i64>,
    /// Median.
    pub p50_ns: Option<i64>,
    /// 90th percentile.
    pub p90_ns: Option<i64>,
    /// 99th percentile.
    pub p99_ns: Option<i64>,
    /// 99.9th percentile.
    pub p999_ns: Option<i64>,
    /// Largest delta (exact).
    pub max_ns: Option<i64>,
}

impl Figures {
    /// The figures of `s`.
    #[must_use]
    pub fn of(s: &SignedStats) -> Self {
        let [p50, p90, p99, p999] = LIVE_QUANTILES.map(|q| s.percentile(q).map(|p| p.value_ns));
        Self {
            count: s.count,
            negative: s.negative,
            min_ns: s.min_ns(),
            p50_ns: p50,
            p90_ns: p90,
            p99_ns: p99,
            p999_ns: p999,
            max_ns: s.max_ns(),
        }
    }

    /// The figures of a finished stage (`run.json`'s), whose percentiles include
    /// [`LIVE_QUANTILES`].
    #[must_use]
    pub fn of_stage(s: &hoptrace_format::run::StageStats) -> Self {
        let at = |q: f64| {
            s.figures
                .percentiles
                .iter()
                .find(|p| p.quantile == q)
                .map(|p| p.value_ns)
        };
        Self {
            count: s.figures.count,
            negative: s.figures.negative,
            min_ns: s.figures.min_ns,
            p50_ns: at(0.5),
            p90_ns: at(0.9),
            p99_ns: at(0.99),
            p999_ns: at(0.999),
            max_ns: s.figures.max_ns,
        }
    }
}

/// Traces written over the last interval, per second.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Throughput {
    /// Traces (messages) written in the interval, complete or not.
    pub messages: u64,
    /// Metrics those traces carried.
    pub metrics: u64,
    /// `messages` over the interval's length.
    pub messages_per_s: f64,
    /// `metrics` over the interval's length.
    pub metrics_per_s: f64,
    /// The rate the run was started to publish, metrics per second, when the collector
    /// was told (`--target-rate`).
    pub target_metrics_per_s: Option<f64>,
    /// Hop records received in the interval. A trace is written once its last hop
    /// arrives or its join window ends, so records arrive before the first trace is
    /// written: with traces still waiting, a rate of written traces below the target is
    /// the join's delay, not the pipeline's.
    pub records: u64,
    /// `records` over the interval's length.
    pub records_per_s: f64,
    /// The join window, ms: how long a trace waits for its hops before it is written.
    pub join_window_ms: u64,
}

/// The run's counts so far: the collector's own counters, as `run.json` reports them at
/// the end.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveAccounting {
    /// Hop records received.
    pub records: u64,
    /// Traces written complete.
    pub complete: u64,
    /// Traces written incomplete.
    pub incomplete: u64,
    /// Traces waiting in the join for more hops.
    pub pending: u64,
    /// Messages publishers reported sending (their last Sent frames).
    pub published_messages: u64,
    /// Metrics publishers reported sending.
    pub published_metrics: u64,
    /// Records of a trace already written (dropped).
    pub late_records: u64,
    /// Records of a hop that had already stamped their trace.
    pub duplicate_records: u64,
    /// Traces written flagged duplicate.
    pub duplicate_traces: u64,
    /// Traces written with a negative stage delta.
    pub negative_delta_traces: u64,
    /// Records whose stamp lay outside the plausibility window (dropped).
    pub implausible_records: u64,
    /// Records of a hop the spec does not declare (dropped).
    pub unknown_hop_records: u64,
    /// Records of a hop their probe did not announce (dropped).
    pub unannounced_hop_records: u64,
    /// Records the probes could not deliver, from their counters.
    pub records_lost_by_probes: u64,
    /// Incomplete traces, per hop they miss (hops missing from none left out).
    pub missing_by_hop: BTreeMap<String, u64>,
    /// Times the join filled up and the collector pushed back on probes.
    pub backpressure_episodes: u64,
    /// Records of re-sent frames the log already held (dropped).
    pub resent_records_dropped: u64,
}

/// A probe host's clock, from the last Clock frame its probes sent. Every field but
/// `host` and `connections` is `None` (unknown) until one arrives.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostClock {
    /// Host name, as its probes' Hello said.
    pub host: String,
    /// Probe connections from it now open.
    pub connections: u64,
    /// What reported the clock's state: `kernel`, `chrony`, `ptp`, `injected` or `unknown`.
    pub source: Option<String>,
    /// Whether that source considers the clock synchronised.
    pub synced: Option<bool>,
    /// Leap second state.
    pub leap: Option<String>,
    /// Estimated offset from the reference, ns.
    pub offset_ns: Option<i64>,
    /// Bound on the error of a reading of the clock, ns.
    pub error_bound_ns: Option<u64>,
    /// When the host read this, `CLOCK_REALTIME` ns.
    pub at_unix_ns: Option<i64>,
    /// The source's detail (reference, stratum, ...).
    pub detail: Option<String>,
}

impl HostClock {
    /// A host with `connections` open, its clock as `row` says (unknown without one).
    #[must_use]
    pub fn new(host: &str, connections: u64, row: Option<&ClockRow>) -> Self {
        Self {
            host: host.to_owned(),
            connections,
            source: row.map(|r| r.source.clone()),
            synced: row.map(|r| r.synced),
            leap: row.map(|r| r.leap.clone()),
            offset_ns: row.map(|r| r.offset_ns),
            error_bound_ns: row.map(|r| r.error_bound_ns),
            at_unix_ns: row.map(|r| r.at_ns),
            detail: row.map(|r| r.detail.clone()),
        }
    }
}

impl Live {
    /// Nothing measured yet: the run's id, start and stages.
    #[must_use]
    pub fn starting(run_id: &str, started_unix_ns: i64, stages: Vec<LiveStage>) -> Self {
        Self {
            run_id: run_id.to_owned(),
            running: true,
            started_unix_ns,
            updated_unix_ns: started_unix_ns,
            significant_digits: SIGNIFICANT_DIGITS,
            stages,
            ..Self::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The page loads nothing: no URL in it but the SVG namespace (a name, never
    /// fetched), and it asks only for `live.json`, relative to where it was served.
    #[test]
    fn the_page_refers_to_nothing_outside() {
        let mut rest = PAGE;
        while let Some(i) = rest.find("//") {
            let before = &rest[..i];
            let after = &rest[i + 2..];
            // `//` opens a URL only after a scheme's colon; JavaScript comments are fine.
            if before.ends_with(':') {
                assert!(
                    after.starts_with("www.w3.org/2000/svg\""),
                    "a URL in the page: {}",
                    &rest[i.saturating_sub(20)..(i + 60).min(rest.len())]
                );
            }
            rest = after;
        }
        // The one link: an empty icon, so the browser does not ask for /favicon.ico.
        assert_eq!(PAGE.matches("href=").count(), 1);
        assert!(PAGE.contains(r#"<link rel="icon" href="data:,">"#));
        for attr in ["src=", "@import", "url("] {
            assert!(!PAGE.contains(attr), "the page loads something: {attr}");
        }
        assert_eq!(PAGE.matches("fetch(").count(), 1);
        assert!(PAGE.contains("fetch(\"live.json\""));
    }

    #[test]
    fn live_json_has_every_field_named_in_the_docs() {
        let mut live = Live::starting(
            "r",
            5,
            vec![LiveStage {
                name: "s".into(),
                bounds: Some(LiveBounds {
                    polled: vec!["queryable".into()],
                    ..LiveBounds::default()
                }),
                slowest: Some(LiveSlowest {
                    components: vec![LiveSegment::default()],
                    ..LiveSlowest::default()
                }),
                ..LiveStage::default()
            }],
        );
        live.clocks.push(HostClock::new("h", 1, None));
        live.events.push(hoptrace_format::events::RunEvent {
            at_unix_ns: 1,
            kind: hoptrace_format::events::EventKind::CollectorRestarted,
            subject: "collector".into(),
            detail: "d".into(),
        });
        live.interval = Some(Interval::default());
        live.accounting.missing_by_hop.insert("x".into(), 1);
        let v: serde_json::Value = serde_json::to_value(&live).unwrap();
        let doc = include_str!("../../../docs/live-view.md");
        let mut keys = Vec::new();
        fn walk(v: &serde_json::Value, keys: &mut Vec<String>) {
            match v {
                serde_json::Value::Object(m) => {
                    for (k, x) in m {
                        keys.push(k.clone());
                        // Keyed by hop name: its keys are data, not fields.
                        if k != "missing_by_hop" {
                            walk(x, keys);
                        }
                    }
                }
                serde_json::Value::Array(a) => a.iter().for_each(|x| walk(x, keys)),
                _ => {}
            }
        }
        walk(&v, &mut keys);
        for k in keys {
            assert!(
                doc.contains(&format!("`{k}`")),
                "docs/live-view.md does not describe `{k}`"
            );
        }
        // Unknown is null, never a made-up value.
        assert_eq!(v["clocks"][0]["synced"], serde_json::Value::Null);
        assert_eq!(v["stages"][0]["run"]["p50_ns"], serde_json::Value::Null);
        assert_eq!(v["significant_digits"], 3);
    }
}
