//! Everything a report says about a run, computed with SQL over the run's Parquet.
//!
//! Exact figures (count, min, max, mean, standard deviation) and HDR histograms (3
//! significant digits; each percentile with its precision, half its HDR bucket) come from
//! one grouped scan of the run with the `stage_stats` aggregate ([`crate::stats`]).
//! Negative stage deltas (clock error) are counted beside a stage and kept out of its
//! statistics, as the collector does. `summary.json` is a [`Summary`]
//! serialized; its JSON schema is `analysis/schema/summary.schema.json`.

use std::collections::BTreeMap;

use datafusion::common::ScalarValue;
use datafusion::prelude::SessionContext;
use hdrhistogram::Histogram;
use hoptrace_format::hist::{MAX_TRACKABLE_NS, SIGNIFICANT_DIGITS, SignedStats, new_histogram};
use hoptrace_format::run::HostInfo;
use hoptrace_format::schema::hop_column;
use hoptrace_format::spec::StageSpec;
use serde::{Deserialize, Serialize};

use crate::AnalysisError;
use crate::bounds::{BoundFigures, BoundStages};
pub use crate::polled::{
    CostSpread, PollBracket, PolledEnd, PolledHop, StoreTapCost, poll_bracket, polled_hops,
};
use crate::session::{RunSet, quote_ident, stage_column};
use crate::weighted::WeightedStage;

pub use crate::figures::{CLOCK_WARN_FRACTION, PercentileValue, quantile_label};

mod accounting;
mod environment;
mod scan;

use accounting::accounting;
pub use environment::clock_uncertainty;
use environment::environment;
use scan::{
    as_i64, as_u64, constant_metric_count, one_row, scalar, scan_buckets, scan_counts, time_span,
    trace_aggregates,
};

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
    /// Traces with both hops: every known delta, negative ones included.
    pub count: u64,
    /// Of those, deltas < 0 (clock error between hosts): in every figure, and flagged.
    pub negative: u64,
    /// Deltas whose magnitude is above the histogram's range (clamped into it).
    pub clamped: u64,
    /// Exact minimum, ns.
    pub min_ns: Option<i64>,
    /// Exact maximum, ns.
    pub max_ns: Option<i64>,
    /// Exact mean, ns.
    pub mean_ns: Option<f64>,
    /// Exact population standard deviation, ns.
    pub stddev_ns: Option<f64>,
    /// HDR percentiles.
    pub percentiles: Vec<PercentileValue>,
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
    pub percentiles: Vec<PercentileValue>,
}

/// The per-metric figures of one stage from its weighted histograms and moments; the
/// percentiles kept within `figures`' exact minimum and maximum (the weighted values are
/// some of those values).
fn per_metric(w: &WeightedStage, figures: &SignedStats) -> PerMetric {
    PerMetric {
        count: w.pos.len() + w.neg.len(),
        mean_ns: w.moments.mean_ns(),
        stddev_ns: w.moments.stddev_ns(),
        percentiles: crate::bounds::weighted_percentiles(w, figures),
    }
}

/// Stage `i`'s bounds from the figures of every scanned stage.
fn stage_bounds(
    bs: &BoundStages,
    i: usize,
    figures: &[SignedStats],
    weighted: &[WeightedStage],
    per_metric: bool,
    spec: &hoptrace_format::spec::PipelineSpec,
) -> Option<crate::bounds::StageBounds> {
    let (lo, hi) = bs.of.get(i).copied().flatten()?;
    let st = &spec.stages[i];
    let hops = |j: usize| (bs.scan[j].from.clone(), bs.scan[j].to.clone());
    Some(crate::bounds::StageBounds {
        polled: [&st.from, &st.to]
            .into_iter()
            .filter(|h| spec.earliest_of(h).is_some())
            .cloned()
            .collect(),
        lower_hops: hops(lo),
        upper_hops: hops(hi),
        lower: BoundFigures::of(&figures[lo], per_metric.then(|| &weighted[lo])),
        upper: BoundFigures::of(&figures[hi], per_metric.then(|| &weighted[hi])),
    })
}

/// A `per_metric` result: its stage, or an empty one for NULL.
fn weighted_stage(bytes: Option<&[u8]>) -> Result<WeightedStage, AnalysisError> {
    bytes.map_or(Ok(WeightedStage::default()), |b| {
        WeightedStage::decode(b)
            .ok_or_else(|| AnalysisError::Render("internal: malformed per-metric state".into()))
    })
}

impl StageSummary {
    /// The percentile of `label` (`P50`, `P99.99`, ...).
    #[must_use]
    pub fn percentile(&self, label: &str) -> Option<&PercentileValue> {
        self.percentiles
            .iter()
            .find(|p| p.label.eq_ignore_ascii_case(label))
    }

    /// The count and percentiles per metric when `per_metric` and the stage has them,
    /// else per message.
    #[must_use]
    pub fn counted(&self, per_metric: bool) -> (u64, &[PercentileValue]) {
        match (&self.per_metric, per_metric) {
            (Some(m), true) => (m.count, &m.percentiles),
            _ => (self.count, &self.percentiles),
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

/// Computes the summary (and the charts' histograms) of `runs` with `ctx` (from
/// [`RunSet::session`]).
///
/// The run is read by two scans side by side: one of the columns every stage needs
/// (stamps, metrics), in time buckets, each bucket holding every stage's exact figures
/// and histogram (the whole run is their merge); one of the small columns (status,
/// flags, missing hops, streams, publishers). Before both, the first and last stamps
/// (which place the time buckets) come from Parquet statistics, and so does whether
/// every message carried the same number of metrics: then the per-metric figures are
/// the per-message ones scaled, `metric_count` is not read, and one `bucket_stats`
/// aggregate over the raw stamps does the first scan; otherwise a `GROUP BY` of the
/// time bucket computes the per-metric figures too.
///
/// # Errors
/// When a query fails (unreadable Parquet, a spec whose hops are not columns).
pub async fn compute(
    runs: &RunSet,
    ctx: &SessionContext,
) -> Result<(Summary, Vec<StageHistograms>), AnalysisError> {
    let pipeline = runs.pipeline();
    let hops: Vec<String> = pipeline.hops.iter().map(|h| h.name.clone()).collect();
    let first_hop = quote_ident(&hop_column(&hops[0]));
    // A trace's time: its first hop's stamp, else its intended send time unless that was
    // implausible (flag 16), so one absurd record cannot stretch the run.
    let time_col = format!(
        "CAST(coalesce({first_hop}, CASE WHEN (flags & 16) = 0 THEN intended_ns END) AS BIGINT)"
    );

    let (t_min, t_max, every_row_stamped) = time_span(ctx, &first_hop, &time_col).await?;
    // Where every trace has its first hop, that is its time: the scan then reads
    // neither the intended times nor the flags for it.
    let time_col = if every_row_stamped {
        format!("CAST({first_hop} AS BIGINT)")
    } else {
        time_col
    };
    let duration_s = (t_max - t_min) as f64 / 1e9;
    let span_s = ((t_max - t_min) / 1_000_000_000 + 1).max(1);
    let bucket_s = (span_s + MAX_TIME_BUCKETS - 1) / MAX_TIME_BUCKETS;
    let bucket_ns = bucket_s * 1_000_000_000;
    let nbuckets = usize::try_from((t_max - t_min) / bucket_ns + 1).unwrap_or(1);

    let constant_metrics = constant_metric_count(ctx).await?;
    // The two scans read different columns of the same files: side by side, one's
    // reads warm the page cache for the other, and one's single-threaded end (merging
    // its partitions) overlaps the other's work.
    let bs = runs.bound_stages();
    let (scanned, counts) = tokio::try_join!(
        scan_buckets(&bs.scan, ctx, &time_col, t_min, bucket_ns, constant_metrics),
        scan_counts(ctx)
    )?;

    let rows: u64 = scanned.iter().map(|s| s.messages).sum();
    let metrics: u64 = scanned.iter().map(|s| s.metrics).sum();
    let rate = |n: u64| {
        if duration_s > 0.0 {
            n as f64 / duration_s
        } else {
            0.0
        }
    };

    let mut buckets: Vec<ThroughputBucket> = (0..nbuckets)
        .map(|b| ThroughputBucket {
            t_s: (b as i64 * bucket_s) as f64,
            messages: 0,
            metrics_per_s: 0.0,
        })
        .collect();
    let mut whole = vec![SignedStats::default(); bs.scan.len()];
    let mut whole_weighted = vec![WeightedStage::default(); bs.scan.len()];
    let mut by_time: Vec<Vec<Option<&SignedStats>>> =
        vec![vec![None; nbuckets]; pipeline.stages.len()];
    for s in &scanned {
        for (w, st) in whole.iter_mut().zip(&s.stages) {
            w.merge(st);
        }
        for (w, st) in whole_weighted.iter_mut().zip(&s.weighted) {
            w.merge(st);
        }
        let Some(b) = s.bucket.and_then(|b| usize::try_from(b).ok()) else {
            continue;
        };
        let Some(slot) = buckets.get_mut(b) else {
            continue;
        };
        slot.messages = s.messages;
        slot.metrics_per_s = s.metrics as f64 / bucket_s as f64;
        for (stage, st) in by_time.iter_mut().zip(&s.stages) {
            stage[b] = Some(st);
        }
    }

    let env = environment(runs);
    let polled = polled_hops(runs, ctx).await?;
    let mut stages = Vec::new();
    let mut hists = Vec::new();
    let mut warnings: Vec<String> = runs
        .runs
        .iter()
        .flat_map(|r| r.summary.clock_alerts.iter())
        .map(|a| format!("clock preflight failed: {a}"))
        .collect();
    for h in &env.hosts {
        if let Some(leap) = &h.leap_pending {
            warnings.push(format!(
                "{}: its clock announced a leap second ({leap}) at the end of the UTC day: stamps taken across it can be 1 s apart from those of other hosts",
                h.host
            ));
        }
    }
    warnings.extend(runs.runs.iter().filter(|r| r.summary.interrupted).map(|r| {
        format!(
            "run {} was interrupted (Ctrl-C): it covers less load than was planned",
            r.summary.run_id
        )
    }));
    let per_metric_run = metrics > rows;
    for (i, (((st, figures), weighted), cells)) in pipeline
        .stages
        .iter()
        .zip(&whole)
        .zip(&whole_weighted)
        .zip(&by_time)
        .enumerate()
    {
        let hist = figures.pos.to_histogram();
        let mut summary = stage_summary(st, figures, weighted, &env.hosts, &polled);
        summary.bounds = stage_bounds(&bs, i, &whole, &whole_weighted, per_metric_run, pipeline);
        if summary.count == 0 {
            // Said once; nothing else about it (no uncertainty against a P50 it has not).
            warnings.push(format!(
                "{}: no values: no trace had both {} and {} stamped",
                st.name, st.from, st.to
            ));
        }
        if let Some(b) = summary.poll_bracket.as_ref().filter(|b| b.warning) {
            warnings.push(format!(
                "{}: the poll bracket of {} (P99 {}, mean {}, max {}) is not small against its P50 {}: the {} stamp is late by up to that much (poll more often)",
                st.name,
                b.hop,
                hoptrace_format::units::duration_ns(b.p99_ns),
                hoptrace_format::units::duration_ns(b.mean_ns.round() as u64),
                hoptrace_format::units::duration_ns(b.max_ns),
                summary
                    .percentiles
                    .first()
                    .map_or_else(|| "-".into(), |p| hoptrace_format::units::signed_ns(p.value_ns)),
                b.hop
            ));
        }
        if summary.clock_warning {
            warnings.push(format!(
                "{}: clock uncertainty {} is not small against its P50 {}",
                st.name,
                summary
                    .clock_uncertainty_ns
                    .map_or_else(|| "unknown".into(), hoptrace_format::units::duration_ns),
                summary.percentiles.first().map_or_else(
                    || "-".into(),
                    |p| hoptrace_format::units::signed_ns(p.value_ns)
                )
            ));
        }
        if summary.negative > 0 {
            warnings.push(format!(
                "{}: {} negative deltas (clock error between hosts); flagged, and counted in every figure of the stage",
                st.name, summary.negative
            ));
        }
        stages.push(summary);
        hists.push(StageHistograms {
            name: st.name.clone(),
            whole: hist,
            max_ns: figures.max_ns().unwrap_or(0),
            by_time: cells
                .iter()
                .map(|c| c.map_or_else(new_histogram, |c| c.pos.to_histogram()))
                .collect(),
        });
    }

    let accounting = accounting(runs, rows, &counts, &hops);
    if !accounting.adds_up {
        warnings.push(format!(
            "counts do not add up: {}",
            accounting.discrepancies.join("; ")
        ));
    }
    let files = runs.part_files();
    let bytes = files
        .iter()
        .filter_map(|f| std::fs::metadata(f).ok())
        .map(|m| m.len())
        .sum();
    let summary = Summary {
        schema_version: SCHEMA_VERSION,
        generated_by: format!("hoptrace {}", env!("CARGO_PKG_VERSION")),
        runs: runs
            .runs
            .iter()
            .map(|r| RunInfo {
                run_id: r.summary.run_id.clone(),
                dir: r.dir.display().to_string(),
                started_unix_ns: r.summary.started_unix_ns,
                ended_unix_ns: r.summary.ended_unix_ns,
                interrupted: r.summary.interrupted,
                restarts: r.summary.restarts.clone(),
            })
            .collect(),
        pipeline: pipeline.name.clone(),
        method: Method {
            histogram: "HdrHistogram (hdrhistogram v7, Rust)".into(),
            significant_digits: SIGNIFICANT_DIGITS,
            max_relative_error: 0.5 * 10f64.powi(-i32::from(SIGNIFICANT_DIGITS)),
            highest_trackable_ns: MAX_TRACKABLE_NS,
            rank: "value of rank max(1, ceil(q * n)) in ascending order, reported as the middle of its HDR bucket".into(),
            signs: "every known delta, negative ones (clock error) included: values >= 0 in one HDR histogram, magnitudes of negative values in a second one of the same layout; count, min, max, mean, standard deviation and percentiles cover both".into(),
        },
        data: DataRead {
            files: files.len() as u64,
            bytes,
            rows,
        },
        totals: Totals {
            messages: rows,
            metrics,
            duration_s,
            messages_per_s: rate(rows),
            metrics_per_s: rate(metrics),
            streams: counts.streams(),
            publishers: counts.publishers(),
        },
        stages,
        accounting,
        environment: env,
        throughput: Throughput {
            bucket_s: bucket_s as f64,
            start_unix_ns: t_min,
            buckets,
        },
        warnings,
        store_taps: polled.iter().flat_map(|p| p.taps.iter().cloned()).collect(),
    };
    Ok((summary, hists))
}

/// Every stage over a measurement window of a run: the traces whose intended send time
/// lies in `[from_unix_ns, to_unix_ns)`. An open-loop load is judged by when messages
/// were due, not when they went out, so a stalled publisher cannot hide its backlog.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WindowSummary {
    /// Window start, Unix ns (inclusive).
    pub from_unix_ns: i64,
    /// Window end, Unix ns (exclusive).
    pub to_unix_ns: i64,
    /// Traces due in the window.
    pub messages: u64,
    /// Of those, complete.
    pub complete: u64,
    /// Metrics they carried.
    pub metrics: u64,
    /// One per stage of the pipeline, in its order, over the window's traces.
    pub stages: Vec<StageSummary>,
}

impl WindowSummary {
    /// Window length, seconds.
    #[must_use]
    pub fn length_s(&self) -> f64 {
        (self.to_unix_ns - self.from_unix_ns) as f64 / 1e9
    }

    /// A stage by name.
    #[must_use]
    pub fn stage(&self, name: &str) -> Option<&StageSummary> {
        self.stages.iter().find(|s| s.name == name)
    }
}

/// The figures of `runs` over a window that starts `skip_ns` after the first intended
/// send time and lasts `length_ns` (a warm-up left out, then a fixed measured window).
///
/// # Errors
/// When a query fails.
pub async fn window(
    runs: &RunSet,
    ctx: &SessionContext,
    skip_ns: i64,
    length_ns: i64,
) -> Result<WindowSummary, AnalysisError> {
    let pipeline = runs.pipeline();
    let first = one_row(
        ctx,
        "SELECT min(CAST(intended_ns AS BIGINT)) AS t0 FROM traces_raw",
    )
    .await?;
    let t0 = as_i64(&scalar(&first, "t0")?).unwrap_or(0);
    let (from, to) = (t0 + skip_ns, t0 + skip_ns + length_ns);
    let df = ctx.table("traces").await?;
    let due = df.parse_sql_expr(&format!(
        "CAST(intended_ns AS BIGINT) >= {from} AND CAST(intended_ns AS BIGINT) < {to}"
    ))?;
    let df = df.filter(due)?;
    let constant_metrics = constant_metric_count(ctx).await?;
    let bs = runs.bound_stages();
    let mut aggregates = trace_aggregates(&df, &bs.scan, constant_metrics)?;
    aggregates.push(
        df.parse_sql_expr("sum(CASE WHEN status = 'complete' THEN 1 ELSE 0 END)")?
            .alias("complete"),
    );
    let batches = df.aggregate(vec![], aggregates)?.collect().await?;
    let batch = batches.iter().find(|b| b.num_rows() > 0).ok_or_else(|| {
        AnalysisError::Render("internal: window aggregate returned nothing".into())
    })?;
    let env = environment(runs);
    let polled = polled_hops(runs, ctx).await?;
    let mut all_figures = Vec::with_capacity(bs.scan.len());
    let mut all_weighted = Vec::with_capacity(bs.scan.len());
    for i in 0..bs.scan.len() {
        let figures = scalar(batch, &format!("s_{i}"))?;
        let figures = match figures {
            ScalarValue::Binary(Some(b)) => SignedStats::decode(&b)
                .map_err(|e| AnalysisError::Render(format!("internal: {e}")))?,
            _ => SignedStats::default(),
        };
        let binary = |name: String| -> Result<Option<Vec<u8>>, AnalysisError> {
            Ok(match scalar(batch, &name)? {
                ScalarValue::Binary(b) => b,
                _ => None,
            })
        };
        let weighted = match constant_metrics {
            Some(m) => WeightedStage::scaled(&figures, m),
            None => weighted_stage(binary(format!("w_{i}"))?.as_deref())?,
        };
        all_figures.push(figures);
        all_weighted.push(weighted);
    }
    let mut stages = Vec::new();
    for (i, st) in pipeline.stages.iter().enumerate() {
        let mut summary = stage_summary(st, &all_figures[i], &all_weighted[i], &env.hosts, &polled);
        summary.bounds = stage_bounds(
            &bs,
            i,
            &all_figures,
            &all_weighted,
            constant_metrics.is_none_or(|m| m > 1),
            pipeline,
        );
        stages.push(summary);
    }
    let messages = as_u64(&scalar(batch, "messages")?);
    Ok(WindowSummary {
        from_unix_ns: from,
        to_unix_ns: to,
        messages,
        complete: as_u64(&scalar(batch, "complete")?),
        metrics: match constant_metrics {
            Some(m) => messages * m,
            None => as_u64(&scalar(batch, "metrics")?),
        },
        stages,
    })
}

/// A stage's summary from its figures over every known delta.
fn stage_summary(
    st: &StageSpec,
    figures: &SignedStats,
    weighted: &WeightedStage,
    hosts: &[HostSummary],
    polled: &[PolledHop],
) -> StageSummary {
    let percentiles: Vec<PercentileValue> = figures
        .percentiles()
        .into_iter()
        .map(PercentileValue::from)
        .collect();
    let (uncertainty, note) = clock_uncertainty(hosts, &st.from, &st.to);
    let p50 = percentiles.first().map(|p| p.value_ns);
    // A stage without values has nothing for an uncertainty to be large against.
    let clock_warning = match (uncertainty, p50) {
        (_, None) => false,
        (None, Some(_)) => true,
        (Some(u), Some(p50)) => u as f64 > CLOCK_WARN_FRACTION * p50.unsigned_abs() as f64,
    };
    StageSummary {
        name: st.name.clone(),
        column: stage_column(&st.name),
        from: st.from.clone(),
        to: st.to.clone(),
        definition: st.definition.clone(),
        headline: st.headline,
        count: figures.count,
        negative: figures.negative,
        clamped: figures.clamped,
        min_ns: figures.min_ns(),
        max_ns: figures.max_ns(),
        mean_ns: figures.mean_ns(),
        stddev_ns: figures.stddev_ns(),
        percentiles,
        clock_uncertainty_ns: uncertainty,
        clock_note: note,
        clock_warning,
        poll_bracket: poll_bracket(polled, &st.from, &st.to, p50),
        per_metric: Some(per_metric(weighted, figures)),
        bounds: None,
    }
}

/// A statistic of a stage, ns, its percentiles per metric when `per_metric` and the stage
/// has them.
#[must_use]
pub fn stat_counted(s: &StageSummary, name: &str, per_metric: bool) -> Option<f64> {
    match name {
        "min" => s.min_ns.map(|v| v as f64),
        "max" => s.max_ns.map(|v| v as f64),
        "mean" => s.mean_ns,
        p => s
            .counted(per_metric)
            .1
            .iter()
            .find(|q| q.label.eq_ignore_ascii_case(p))
            .map(|p| p.value_ns as f64),
    }
}

impl StageSummary {
    /// The interval a statistic of the stage (`p99`, `min`, `max`, `mean`) lies in, ns:
    /// its bounds where a hop of the stage is polled, its value otherwise, widened by the
    /// stage's clock uncertainty when known. `None` without values.
    #[must_use]
    pub fn stat_interval(&self, name: &str, per_metric: bool) -> Option<(f64, f64)> {
        let point = stat_counted(self, name, per_metric)?;
        let (lo, hi) = match &self.bounds {
            Some(b) => (
                b.lower.stat(name, per_metric).unwrap_or(point),
                b.upper.stat(name, per_metric).unwrap_or(point),
            ),
            None => (point, point),
        };
        let u = self.clock_uncertainty_ns.unwrap_or(0) as f64;
        Some((lo.min(point) - u, hi.max(point) + u))
    }
}

#[cfg(test)]
mod tests;
