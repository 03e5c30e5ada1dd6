//! What a summary holds (`summary.json`, serialized): the runs, the method, the totals,
//! each stage, the accounting, the environment, the throughput, and the histograms behind
//! the charts.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use hoptrace_format::run::HostInfo;
use serde::{Deserialize, Serialize};

use crate::figures::{Figures, Percentile};
use crate::polled::{PollBracket, StoreTapCost};

/// Version of the `summary.json` layout.
pub const SCHEMA_VERSION: u32 = 1;

/// Most time buckets in the throughput series and heatmaps.
pub const MAX_TIME_BUCKETS: i64 = 240;

/// What a report says about one or more runs read together.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Summary {
    /// Layout version ([`SCHEMA_VERSION`]).
    pub schema_version: u32,
    /// The program that computed it.
    pub generated_by: String,
    /// The runs.
    pub runs: Vec<RunInfo>,
    /// Pipeline name.
    pub pipeline: String,
    /// How percentiles were computed.
    pub method: Method,
    /// Data read.
    pub data: DataRead,
    /// Totals and rates.
    pub totals: Totals,
    /// One per stage of the pipeline, in its order.
    pub stages: Vec<StageSummary>,
    /// Where every sent message ended up.
    pub accounting: AccountingSummary,
    /// Hosts, their hops and clocks.
    pub environment: Environment,
    /// Messages and metrics per time bucket.
    pub throughput: Throughput,
    /// Things a reader must know (clock bounds large against latencies, counts that do not
    /// add up, ...). Empty when all is well.
    pub warnings: Vec<String>,
    /// What every store tap of the runs cost (polls, query time, the store's own query
    /// duration); empty for runs without store taps.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub store_taps: Vec<StoreTapCost>,
    /// Why each headline stage's tail is slow: its components' shares at its P99, P99.9
    /// (and P99.99) and its slowest messages ([`crate::tail`]); empty when no headline
    /// stage splits into components.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tails: Vec<crate::tail::TailAttribution>,
    /// What the runs know happened, in time order ([`crate::events`]): lost and renewed
    /// probe connections, collector restarts, clock changes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<crate::events::RunEvent>,
}

/// One run's identity.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunInfo {
    /// Run id.
    pub run_id: String,
    /// Directory it was read from.
    pub dir: String,
    /// Collector start, Unix ns.
    pub started_unix_ns: i64,
    /// Collector end, Unix ns.
    pub ended_unix_ns: i64,
    /// The run was cut short (Ctrl-C): its figures cover less load than was planned.
    #[serde(default)]
    pub interrupted: bool,
    /// Every time its collector was killed and started again, continuing the run from
    /// its log (run.json `restarts`).
    #[serde(default)]
    pub restarts: Vec<hoptrace_format::run::Restart>,
}

/// How percentiles were computed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Method {
    /// The histogram implementation.
    pub histogram: String,
    /// Significant digits (3).
    pub significant_digits: u8,
    /// Largest relative error of a percentile (half a bucket: 0.05 % at 3 digits).
    pub max_relative_error: f64,
    /// Largest value a histogram holds, ns; larger ones are clamped and counted.
    pub highest_trackable_ns: u64,
    /// How the rank of a quantile is defined.
    pub rank: String,
    /// Which deltas the statistics cover: every known one, negative ones included.
    #[serde(default)]
    pub signs: String,
}

/// The data read.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DataRead {
    /// Parquet part files.
    pub files: u64,
    /// Bytes in them.
    pub bytes: u64,
    /// Rows (traces) in them.
    pub rows: u64,
}

/// Totals over the run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Totals {
    /// Messages traced (rows).
    pub messages: u64,
    /// Metrics carried by them.
    pub metrics: u64,
    /// First to last publish stamp (or intended time), seconds.
    pub duration_s: f64,
    /// Messages per second over that span.
    pub messages_per_s: f64,
    /// Metrics per second over that span.
    pub metrics_per_s: f64,
    /// Distinct streams.
    pub streams: u64,
    /// Distinct publishers.
    pub publishers: u64,
}

/// One stage over the run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StageSummary {
    /// Name as declared.
    pub name: String,
    /// Its column in `traces`.
    pub column: String,
    /// From hop.
    pub from: String,
    /// To hop.
    pub to: String,
    /// Definition printed by the report.
    pub definition: String,
    /// Shown in the highlights.
    pub headline: bool,
    /// Its figures over every known delta (traces with both hops), with HDR
    /// percentiles.
    #[serde(flatten)]
    pub figures: Figures,
    /// Bound on the error clocks add to this stage's deltas, ns: 0 when both hops read
    /// one host's clock, the two hosts' largest error bounds summed otherwise; `None`
    /// when a host sent no clock status.
    pub clock_uncertainty_ns: Option<u64>,
    /// How the uncertainty was found.
    pub clock_note: String,
    /// The uncertainty is not small against P50 (above 10 %), or unknown.
    pub clock_warning: bool,
    /// The measurement uncertainty of a polled hop at one end of the stage (a store tap's
    /// `queryable`): its stamp is late by at most the poll bracket. Absent for stages
    /// without a polled hop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poll_bracket: Option<PollBracket>,
    /// The stage per metric: every trace weighted by the metrics its message carried
    /// (`hdr_percentile(<stage>_ns, q, metric_count)`). Absent in summaries written before
    /// it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_metric: Option<PerMetric>,
    /// Where the stage's true figures lie when a hop at one of its ends is polled (its
    /// spec names an `earliest` hop): the figures over the smallest and the largest
    /// deltas the polled stamps allow. Absent for exact stages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bounds: Option<crate::bounds::StageBounds>,
}

/// A stage's percentiles over metrics rather than messages: each trace's delta counted
/// once per metric its message carried. Equal to the per-message figures when every
/// message carries one metric.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PerMetric {
    /// Metrics carried by the traces with both hops (the sum of their `metric_count`).
    pub count: u64,
    /// Mean over those metrics (exact weighted sum over the weight); absent in summaries
    /// written before it was kept.
    #[serde(default)]
    pub mean_ns: Option<f64>,
    /// Population standard deviation over those metrics.
    #[serde(default)]
    pub stddev_ns: Option<f64>,
    /// HDR percentiles over those metrics, at the quantiles of `percentiles`.
    pub percentiles: Vec<Percentile>,
}

impl StageSummary {
    /// The percentile of `label` (`P50`, `P99.99`, ...).
    #[must_use]
    pub fn percentile(&self, label: &str) -> Option<&Percentile> {
        self.figures.percentile(label)
    }

    /// The count and percentiles per metric when `per_metric` and the stage has them,
    /// else per message.
    #[must_use]
    pub fn counted(&self, per_metric: bool) -> (u64, &[Percentile]) {
        match (&self.per_metric, per_metric) {
            (Some(m), true) => (m.count, &m.percentiles),
            _ => (self.figures.count, &self.figures.percentiles),
        }
    }
}

impl Summary {
    /// Whether the report counts metrics rather than messages: when messages carried
    /// batches (more metrics than messages) and every stage has its per-metric figures,
    /// as a reference report whose Count is metrics does.
    #[must_use]
    pub fn per_metric(&self) -> bool {
        self.totals.metrics > self.totals.messages
            && self.stages.iter().all(|s| s.per_metric.is_some())
    }
}

/// Where every sent message ended up.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AccountingSummary {
    /// Messages the publishers said they sent (Sent frames); 0 when no publisher reported.
    pub sent: u64,
    /// Metrics in them.
    pub sent_metrics: u64,
    /// Traces with every expected hop.
    pub complete: u64,
    /// Traces missing an expected hop.
    pub incomplete: u64,
    /// Incomplete traces by the hop they miss.
    pub missing_by_hop: BTreeMap<String, u64>,
    /// Sent messages of which no stamp reached the collector (dropped on the way).
    pub unseen: u64,
    /// Records the probes could not deliver (queue full, send failed).
    pub records_lost_by_probes: u64,
    /// Traces with a duplicate stamp.
    pub duplicates: u64,
    /// Traces with a negative stage delta.
    pub negative_deltas: u64,
    /// Records arriving after their trace was written.
    pub late_records: u64,
    /// Records of hops the spec does not declare.
    pub unknown_hop_records: u64,
    /// Traces whose keys lie outside what their publisher reported sending.
    #[serde(default)]
    pub not_sent: u64,
    /// Records of hops their connection did not announce (dropped, counted).
    #[serde(default)]
    pub unannounced_hop_records: u64,
    /// Records whose stamp was implausible (dropped, counted).
    #[serde(default)]
    pub implausible_records: u64,
    /// Records probes sent again after a collector restart that the run already held
    /// (dropped, never a duplicate of the pipeline).
    #[serde(default)]
    pub resent_records_dropped: u64,
    /// Records the probes sent again because a collector restarted before acknowledging
    /// them (their `resent` counters): what the run held of them is in
    /// `resent_records_dropped`, the rest joined once.
    #[serde(default)]
    pub records_resent_by_probes: u64,
    /// Traces whose intended time was implausible (kept out of the run's span).
    #[serde(default)]
    pub implausible_traces: u64,
    /// sent = complete + incomplete + unseen per publisher from independent counts (as the
    /// collector found), and the Parquet holds exactly the rows its run.json accounts for.
    pub adds_up: bool,
    /// Why not, one line per finding; empty when the counts add up.
    #[serde(default)]
    pub discrepancies: Vec<String>,
}

/// One host.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HostSummary {
    /// Host name.
    pub host: String,
    /// The addresses its probes connected from.
    #[serde(default)]
    pub addresses: Vec<String>,
    /// Hops stamped on it.
    pub hops: Vec<String>,
    /// Processes that reported from it.
    pub processes: Vec<String>,
    /// Clock source(s) reported.
    pub clock_sources: Vec<String>,
    /// Clock statuses received.
    pub clock_samples: u64,
    /// Every status said synchronised.
    pub synced: bool,
    /// Largest error bound reported, ns.
    pub max_error_bound_ns: Option<u64>,
    /// Largest |offset| reported, ns.
    pub max_abs_offset_ns: Option<i64>,
    /// A leap second its clock source announced (`insert` or `delete`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leap_pending: Option<String>,
}

/// Hosts and topology.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Environment {
    /// The collector's host (CPU, memory, kernel).
    pub collector: HostInfo,
    /// Probe hosts: the hosts whose probes stamped something the run used.
    pub hosts: Vec<HostSummary>,
    /// Probe connections that stamped nothing the run used (`host/process`, with the
    /// hops they announced): not hosts of any stage, so their clocks do not enter any
    /// stage's uncertainty.
    #[serde(default)]
    pub idle_probes: Vec<String>,
    /// One line: hops and where they ran.
    pub topology: String,
    /// One line on clocks.
    pub clocking: String,
}

/// Messages per time bucket.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Throughput {
    /// Bucket width, seconds.
    pub bucket_s: f64,
    /// Start of the first bucket, Unix ns.
    pub start_unix_ns: i64,
    /// Buckets in time order (empty buckets included).
    pub buckets: Vec<ThroughputBucket>,
}

/// One time bucket.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ThroughputBucket {
    /// Seconds from the start.
    pub t_s: f64,
    /// Messages published in it.
    pub messages: u64,
    /// Metrics published in it, per second.
    pub metrics_per_s: f64,
}

/// Histograms behind the charts (not serialized).
#[derive(Debug, Clone)]
pub struct StageHistograms {
    /// Stage name.
    pub name: String,
    /// Over the whole run.
    pub whole: Histogram<u64>,
    /// The exact largest value over the whole run (ns; 0 without values): charts drawn
    /// from `whole` keep their percentiles at or below it.
    pub max_ns: i64,
    /// Per time bucket (same buckets as [`Throughput`]).
    pub by_time: Vec<Histogram<u64>>,
}
