//! Everything a report says about a run, computed with SQL over the run's Parquet.
//!
//! Exact figures (count, min, max, mean, standard deviation) come from SQL aggregates;
//! percentiles from `hdr_histogram` (3 significant digits), each with its precision (half
//! its HDR bucket). Negative stage deltas (clock error) are counted beside a stage and
//! kept out of its statistics, as the collector does. `summary.json` is a [`Summary`]
//! serialized; its JSON schema is `analysis/schema/summary.schema.json`.

use std::collections::{BTreeMap, BTreeSet};

use datafusion::arrow::array::{Array, RecordBatch};
use datafusion::common::ScalarValue;
use datafusion::prelude::SessionContext;
use hdrhistogram::Histogram;
use hoptrace_collector::run::HostInfo;
use hoptrace_collector::stages::{MAX_TRACKABLE_NS, QUANTILES, SIGNIFICANT_DIGITS};
use serde::{Deserialize, Serialize};

use crate::AnalysisError;
use crate::hdr;
use crate::session::{RunSet, quote_ident, stage_column};

/// Version of the `summary.json` layout.
pub const SCHEMA_VERSION: u32 = 1;
/// A stage's clock uncertainty above this fraction of its P50 is warned about.
pub const CLOCK_WARN_FRACTION: f64 = 0.1;
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

/// One percentile with its precision.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PercentileValue {
    /// Label, e.g. `P99.9`.
    pub label: String,
    /// Quantile, e.g. 0.999.
    pub quantile: f64,
    /// Middle of the HDR bucket holding it, ns.
    pub value_ns: u64,
    /// Half the bucket's width: the exact value is within ± this, ns.
    pub precision_ns: u64,
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
    /// Traces with both hops and a delta >= 0.
    pub count: u64,
    /// Traces with both hops and a delta < 0 (clock error), not in the statistics.
    pub negative: u64,
    /// Deltas above the histogram's range (clamped into it).
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
}

impl StageSummary {
    /// The percentile of `label` (`P50`, `P99.99`, ...).
    #[must_use]
    pub fn percentile(&self, label: &str) -> Option<&PercentileValue> {
        self.percentiles
            .iter()
            .find(|p| p.label.eq_ignore_ascii_case(label))
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
    /// sent = complete + incomplete + unseen (per publisher) and the Parquet rows equal
    /// complete + incomplete.
    pub adds_up: bool,
}

/// One host.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HostSummary {
    /// Host name.
    pub host: String,
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
}

/// Hosts and topology.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Environment {
    /// The collector's host (CPU, memory, kernel).
    pub collector: HostInfo,
    /// Probe hosts.
    pub hosts: Vec<HostSummary>,
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
    /// Per time bucket (same buckets as [`Throughput`]).
    pub by_time: Vec<Histogram<u64>>,
}

/// The label of a quantile: 0.999 → `P99.9`.
#[must_use]
pub fn quantile_label(q: f64) -> String {
    let pct = format!("{:.4}", q * 100.0);
    let pct = pct.trim_end_matches('0').trim_end_matches('.');
    format!("P{pct}")
}

fn scalar(batch: &RecordBatch, name: &str) -> Result<ScalarValue, AnalysisError> {
    let col = batch
        .column_by_name(name)
        .ok_or_else(|| AnalysisError::Render(format!("internal: result column {name} missing")))?;
    Ok(ScalarValue::try_from_array(col, 0)?)
}

fn as_i64(v: &ScalarValue) -> Option<i64> {
    match v {
        ScalarValue::Int64(x) => *x,
        ScalarValue::UInt64(x) => x.and_then(|x| i64::try_from(x).ok()),
        ScalarValue::Int32(x) => x.map(i64::from),
        ScalarValue::UInt32(x) => x.map(i64::from),
        ScalarValue::TimestampNanosecond(x, _) => *x,
        _ => None,
    }
}

fn as_u64(v: &ScalarValue) -> u64 {
    as_i64(v).and_then(|x| u64::try_from(x).ok()).unwrap_or(0)
}

fn as_f64(v: &ScalarValue) -> Option<f64> {
    match v {
        ScalarValue::Float64(x) => *x,
        other => as_i64(other).map(|x| x as f64),
    }
}

async fn one_row(ctx: &SessionContext, sql: &str) -> Result<RecordBatch, AnalysisError> {
    let batches = ctx.sql(sql).await?.collect().await?;
    let schema = batches
        .first()
        .map(RecordBatch::schema)
        .ok_or_else(|| AnalysisError::Render("internal: aggregate returned no batch".into()))?;
    Ok(datafusion::arrow::compute::concat_batches(
        &schema, &batches,
    )?)
}

/// Computes the summary (and the charts' histograms) of `runs` with `ctx` (from
/// [`RunSet::session`]).
///
/// # Errors
/// When a query fails (unreadable Parquet, a spec whose hops are not columns).
pub async fn compute(
    runs: &RunSet,
    ctx: &SessionContext,
) -> Result<(Summary, Vec<StageHistograms>), AnalysisError> {
    let pipeline = runs.pipeline();
    let hops: Vec<String> = pipeline.hops.iter().map(|h| h.name.clone()).collect();
    let time_col = format!(
        "CAST(coalesce({}, intended_ns) AS BIGINT)",
        quote_ident(&format!("{}_ns", hops[0]))
    );

    // Pass 1: exact figures, histograms and flags, in one scan.
    let mut sel = vec![
        "count(*) AS rows".to_owned(),
        "sum(CAST(metric_count AS BIGINT)) AS metrics".to_owned(),
        format!("min({time_col}) AS t_min"),
        format!("max({time_col}) AS t_max"),
        "count(DISTINCT stream) AS streams".to_owned(),
        "count(DISTINCT publisher) AS publishers".to_owned(),
        "sum(CASE WHEN status = 'complete' THEN 1 ELSE 0 END) AS complete".to_owned(),
        "sum(CASE WHEN (flags & 1) <> 0 THEN 1 ELSE 0 END) AS duplicates".to_owned(),
        "sum(CASE WHEN (flags & 2) <> 0 THEN 1 ELSE 0 END) AS negative_deltas".to_owned(),
    ];
    for (i, _) in hops.iter().enumerate() {
        sel.push(format!(
            "sum(CASE WHEN (CAST(missing_mask AS BIGINT) & {}) <> 0 THEN 1 ELSE 0 END) AS missing_{i}",
            1_i64 << i
        ));
    }
    for (i, st) in pipeline.stages.iter().enumerate() {
        let c = quote_ident(&stage_column(&st.name));
        sel.push(format!("count({c}) FILTER (WHERE {c} >= 0) AS n_{i}"));
        sel.push(format!("count({c}) FILTER (WHERE {c} < 0) AS neg_{i}"));
        sel.push(format!(
            "count({c}) FILTER (WHERE {c} > {MAX_TRACKABLE_NS}) AS clamped_{i}"
        ));
        sel.push(format!("min({c}) FILTER (WHERE {c} >= 0) AS min_{i}"));
        sel.push(format!("max({c}) FILTER (WHERE {c} >= 0) AS max_{i}"));
        sel.push(format!(
            "avg(CAST({c} AS DOUBLE)) FILTER (WHERE {c} >= 0) AS mean_{i}"
        ));
        sel.push(format!(
            "stddev_pop(CAST({c} AS DOUBLE)) FILTER (WHERE {c} >= 0) AS sd_{i}"
        ));
        sel.push(format!("hdr_histogram({c}) AS h_{i}"));
    }
    let row = one_row(ctx, &format!("SELECT {} FROM traces", sel.join(", "))).await?;
    let get = |n: &str| scalar(&row, n);

    let rows = as_u64(&get("rows")?);
    let t_min = as_i64(&get("t_min")?).unwrap_or(0);
    let t_max = as_i64(&get("t_max")?).unwrap_or(t_min);
    let duration_s = (t_max - t_min) as f64 / 1e9;
    let metrics = as_u64(&get("metrics")?);
    let rate = |n: u64| {
        if duration_s > 0.0 {
            n as f64 / duration_s
        } else {
            0.0
        }
    };

    let env = environment(runs);
    let mut stages = Vec::new();
    let mut hists = Vec::new();
    let mut warnings: Vec<String> = runs
        .runs
        .iter()
        .flat_map(|r| r.summary.clock_alerts.iter())
        .map(|a| format!("clock preflight failed: {a}"))
        .collect();
    for (i, st) in pipeline.stages.iter().enumerate() {
        let whole = hdr::from_scalar(&get(&format!("h_{i}"))?)?;
        let percentiles: Vec<PercentileValue> = QUANTILES
            .iter()
            .filter(|_| !whole.is_empty())
            .map(|&q| PercentileValue {
                label: quantile_label(q),
                quantile: q,
                value_ns: hdr::value_at(&whole, q),
                precision_ns: hdr::precision_at(&whole, q),
            })
            .collect();
        let (uncertainty, note) = clock_uncertainty(&env.hosts, &st.from, &st.to);
        let p50 = percentiles.first().map(|p| p.value_ns);
        let clock_warning = match (uncertainty, p50) {
            (None, _) => true,
            (Some(u), Some(p50)) => u as f64 > CLOCK_WARN_FRACTION * p50 as f64,
            (Some(_), None) => false,
        };
        if clock_warning {
            warnings.push(format!(
                "{}: clock uncertainty {} is not small against its P50 {}",
                st.name,
                uncertainty.map_or_else(|| "unknown".into(), crate::format::duration_ns),
                p50.map_or_else(|| "-".into(), crate::format::duration_ns)
            ));
        }
        let negative = as_u64(&get(&format!("neg_{i}"))?);
        if negative > 0 {
            warnings.push(format!(
                "{}: {negative} negative deltas (clock error between hosts); flagged, kept out of the statistics",
                st.name
            ));
        }
        stages.push(StageSummary {
            name: st.name.clone(),
            column: stage_column(&st.name),
            from: st.from.clone(),
            to: st.to.clone(),
            definition: st.definition.clone(),
            headline: st.headline,
            count: as_u64(&get(&format!("n_{i}"))?),
            negative,
            clamped: as_u64(&get(&format!("clamped_{i}"))?),
            min_ns: as_i64(&get(&format!("min_{i}"))?),
            max_ns: as_i64(&get(&format!("max_{i}"))?),
            mean_ns: as_f64(&get(&format!("mean_{i}"))?),
            stddev_ns: as_f64(&get(&format!("sd_{i}"))?),
            percentiles,
            clock_uncertainty_ns: uncertainty,
            clock_note: note,
            clock_warning,
        });
        hists.push(StageHistograms {
            name: st.name.clone(),
            whole,
            by_time: Vec::new(),
        });
    }

    // Pass 2: throughput and per-stage histograms per time bucket.
    let span_s = ((t_max - t_min) / 1_000_000_000 + 1).max(1);
    let bucket_s = (span_s + MAX_TIME_BUCKETS - 1) / MAX_TIME_BUCKETS;
    let bucket_ns = bucket_s * 1_000_000_000;
    let nbuckets = usize::try_from((t_max - t_min) / bucket_ns + 1).unwrap_or(1);
    let mut sel = vec![
        format!("CAST(({time_col} - {t_min}) / {bucket_ns} AS BIGINT) AS b"),
        "count(*) AS messages".to_owned(),
        "sum(CAST(metric_count AS BIGINT)) AS metrics".to_owned(),
    ];
    for (i, st) in pipeline.stages.iter().enumerate() {
        sel.push(format!(
            "hdr_histogram({}) AS h_{i}",
            quote_ident(&stage_column(&st.name))
        ));
    }
    let sql = format!(
        "SELECT {} FROM traces WHERE {time_col} IS NOT NULL GROUP BY b ORDER BY b",
        sel.join(", ")
    );
    let mut buckets: Vec<ThroughputBucket> = (0..nbuckets)
        .map(|b| ThroughputBucket {
            t_s: (b as i64 * bucket_s) as f64,
            messages: 0,
            metrics_per_s: 0.0,
        })
        .collect();
    for h in &mut hists {
        h.by_time = vec![hoptrace_collector::stages::new_histogram(); nbuckets];
    }
    if rows > 0 {
        for batch in ctx.sql(&sql).await?.collect().await? {
            for r in 0..batch.num_rows() {
                let at = |n: &str| -> Result<ScalarValue, AnalysisError> {
                    let col = batch.column_by_name(n).ok_or_else(|| {
                        AnalysisError::Render(format!("internal: column {n} missing"))
                    })?;
                    Ok(ScalarValue::try_from_array(col.as_ref() as &dyn Array, r)?)
                };
                let Some(b) = as_i64(&at("b")?).and_then(|b| usize::try_from(b).ok()) else {
                    continue;
                };
                let Some(slot) = buckets.get_mut(b) else {
                    continue;
                };
                slot.messages = as_u64(&at("messages")?);
                slot.metrics_per_s = as_u64(&at("metrics")?) as f64 / bucket_s as f64;
                for (i, h) in hists.iter_mut().enumerate() {
                    h.by_time[b] = hdr::from_scalar(&at(&format!("h_{i}"))?)?;
                }
            }
        }
    }

    let accounting = accounting(runs, rows, &get("complete")?, &hops, &row)?;
    if !accounting.adds_up {
        warnings.push(format!(
            "counts do not add up: sent {} vs complete {} + incomplete {} + unseen {} (Parquet rows {rows})",
            accounting.sent, accounting.complete, accounting.incomplete, accounting.unseen
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
            })
            .collect(),
        pipeline: pipeline.name.clone(),
        method: Method {
            histogram: "HdrHistogram (hdrhistogram v7, Rust)".into(),
            significant_digits: SIGNIFICANT_DIGITS,
            max_relative_error: 0.5 * 10f64.powi(-i32::from(SIGNIFICANT_DIGITS)),
            highest_trackable_ns: MAX_TRACKABLE_NS,
            rank: "value of rank max(1, ceil(q * n)) in ascending order, reported as the middle of its HDR bucket".into(),
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
            streams: as_u64(&get("streams")?),
            publishers: as_u64(&get("publishers")?),
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
    };
    Ok((summary, hists))
}

fn accounting(
    runs: &RunSet,
    rows: u64,
    complete: &ScalarValue,
    hops: &[String],
    row: &RecordBatch,
) -> Result<AccountingSummary, AnalysisError> {
    let complete = as_u64(complete);
    let incomplete = rows - complete.min(rows);
    let mut missing_by_hop = BTreeMap::new();
    for (i, hop) in hops.iter().enumerate() {
        let n = as_u64(&scalar(row, &format!("missing_{i}"))?);
        if n > 0 {
            missing_by_hop.insert(hop.clone(), n);
        }
    }
    let acc = runs.runs.iter().map(|r| &r.summary.accounting);
    let pubs = || acc.clone().flat_map(|a| a.publishers.iter());
    let sent: u64 = pubs().map(|p| p.sent).sum();
    let unseen: u64 = pubs().map(|p| p.unseen).sum();
    let per_publisher_ok = acc.clone().all(|a| a.adds_up);
    let run_complete: u64 = pubs().map(|p| p.complete).sum();
    let run_incomplete: u64 = pubs().map(|p| p.incomplete).sum();
    // Files an interrupted earlier collector left are read but are not in its accounting.
    let recovered: u64 = runs
        .runs
        .iter()
        .filter_map(|r| r.summary.recovered.as_ref())
        .map(|r| r.rows)
        .sum();
    let adds_up = per_publisher_ok && rows == run_complete + run_incomplete + recovered;
    Ok(AccountingSummary {
        sent,
        sent_metrics: pubs().map(|p| p.sent_metrics).sum(),
        complete,
        incomplete,
        missing_by_hop,
        unseen,
        records_lost_by_probes: acc.clone().map(|a| a.records_lost_by_probes).sum(),
        duplicates: as_u64(&scalar(row, "duplicates")?),
        negative_deltas: as_u64(&scalar(row, "negative_deltas")?),
        late_records: acc.clone().map(|a| a.late_records).sum(),
        unknown_hop_records: acc.clone().map(|a| a.unknown_hop_records).sum(),
        adds_up,
    })
}

fn environment(runs: &RunSet) -> Environment {
    let mut hosts: BTreeMap<String, HostSummary> = BTreeMap::new();
    let entry = |hosts: &mut BTreeMap<String, HostSummary>, h: &str| {
        hosts
            .entry(h.to_owned())
            .or_insert_with(|| HostSummary {
                host: h.to_owned(),
                hops: Vec::new(),
                processes: Vec::new(),
                clock_sources: Vec::new(),
                clock_samples: 0,
                synced: true,
                max_error_bound_ns: None,
                max_abs_offset_ns: None,
            })
            .clone()
    };
    for run in &runs.runs {
        for p in &run.summary.probes {
            let mut h = entry(&mut hosts, &p.host);
            for hop in &p.hops {
                if !h.hops.contains(hop) {
                    h.hops.push(hop.clone());
                }
            }
            if !h.processes.contains(&p.process) {
                h.processes.push(p.process.clone());
            }
            hosts.insert(p.host.clone(), h);
        }
        for c in &run.summary.clock {
            let mut h = entry(&mut hosts, &c.host);
            h.clock_samples += 1;
            h.synced &= c.synced;
            if !h.clock_sources.contains(&c.source) {
                h.clock_sources.push(c.source.clone());
            }
            h.max_error_bound_ns = Some(h.max_error_bound_ns.unwrap_or(0).max(c.error_bound_ns));
            h.max_abs_offset_ns = Some(h.max_abs_offset_ns.unwrap_or(0).max(c.offset_ns.abs()));
            hosts.insert(c.host.clone(), h);
        }
    }
    let hosts: Vec<HostSummary> = hosts.into_values().collect();
    let topology = if hosts.is_empty() {
        "no probe reported".to_owned()
    } else {
        format!(
            "{} host(s): {}",
            hosts.len(),
            hosts
                .iter()
                .map(|h| format!("{} ({})", h.host, h.hops.join(", ")))
                .collect::<Vec<_>>()
                .join("; ")
        )
    };
    let clocking = hosts
        .iter()
        .map(|h| {
            let bound = h.max_error_bound_ns.map_or_else(
                || "no clock status".into(),
                |b| format!("error bound ≤ {}", crate::format::duration_ns(b)),
            );
            format!(
                "{}: {} ({}, {})",
                h.host,
                if h.clock_sources.is_empty() {
                    "unknown".into()
                } else {
                    h.clock_sources.join("+")
                },
                if h.synced && h.clock_samples > 0 {
                    "synchronised"
                } else {
                    "NOT synchronised"
                },
                bound
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    Environment {
        collector: runs.runs[0].summary.collector_host.clone(),
        hosts,
        topology,
        clocking,
    }
}

/// The clock uncertainty of a stage from `from` to `to`: 0 when every probe of both hops
/// ran on one host (one clock), else the largest sum of two different hosts' error bounds.
#[must_use]
pub fn clock_uncertainty(hosts: &[HostSummary], from: &str, to: &str) -> (Option<u64>, String) {
    let on = |hop: &str| -> BTreeSet<&str> {
        hosts
            .iter()
            .filter(|h| h.hops.iter().any(|x| x == hop))
            .map(|h| h.host.as_str())
            .collect()
    };
    let (a, b) = (on(from), on(to));
    if a.is_empty() || b.is_empty() {
        return (
            None,
            format!(
                "no probe reported hop {}",
                if a.is_empty() { from } else { to }
            ),
        );
    }
    if a.len() == 1 && a == b {
        let host = a.first().copied().unwrap_or_default();
        return (Some(0), format!("one clock (both hops on {host})"));
    }
    let bound = |name: &str| {
        hosts
            .iter()
            .find(|h| h.host == name)
            .and_then(|h| h.max_error_bound_ns)
    };
    let mut worst: Option<u64> = Some(0);
    let mut pair = String::new();
    for x in &a {
        for y in &b {
            if x == y {
                continue;
            }
            match (bound(x), bound(y)) {
                (Some(bx), Some(by)) => {
                    if worst.is_some_and(|w| bx + by >= w) {
                        worst = Some(bx + by);
                        pair = format!("{x} + {y}");
                    }
                }
                _ => {
                    let missing = if bound(x).is_none() { x } else { y };
                    return (None, format!("no clock status from {missing}"));
                }
            }
        }
    }
    (worst, format!("error bounds of {pair} summed"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(name: &str, hops: &[&str], bound: Option<u64>) -> HostSummary {
        HostSummary {
            host: name.into(),
            hops: hops.iter().map(|s| (*s).to_owned()).collect(),
            processes: vec![],
            clock_sources: vec!["chrony".into()],
            clock_samples: 1,
            synced: true,
            max_error_bound_ns: bound,
            max_abs_offset_ns: Some(0),
        }
    }

    #[test]
    fn labels() {
        let l: Vec<String> = QUANTILES.iter().map(|&q| quantile_label(q)).collect();
        assert_eq!(l, ["P50", "P90", "P95", "P99", "P99.9", "P99.99"]);
    }

    #[test]
    fn one_host_has_no_clock_uncertainty() {
        let hosts = [host("a", &["publish", "flow_in"], Some(5_000))];
        assert_eq!(clock_uncertainty(&hosts, "publish", "flow_in").0, Some(0));
    }

    #[test]
    fn two_hosts_sum_their_bounds() {
        let hosts = [
            host("a", &["publish"], Some(5_000)),
            host("b", &["flow_in"], Some(7_000)),
        ];
        let (u, note) = clock_uncertainty(&hosts, "publish", "flow_in");
        assert_eq!(u, Some(12_000));
        assert!(note.contains("a + b"), "{note}");
    }

    #[test]
    fn a_host_without_clock_status_is_unknown() {
        let hosts = [
            host("a", &["publish"], Some(5_000)),
            host("b", &["flow_in"], None),
        ];
        let (u, note) = clock_uncertainty(&hosts, "publish", "flow_in");
        assert_eq!(u, None);
        assert!(note.contains('b'), "{note}");
    }
}
