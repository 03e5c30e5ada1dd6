//! Per-stage latency as traces are written: a cumulative HdrHistogram (3 significant
//! digits) per stage, exact count/min/max/mean/standard deviation, and one HdrHistogram
//! interval log per stage (`hdr/<stage>.hlog`, the standard format HdrHistogram's own
//! tools read; values in nanoseconds).
//!
//! A stage delta below zero (clock error between hosts) cannot go into a histogram; it is
//! counted as `negative` beside the stage and never dropped silently.

use std::fs::File;
use std::io::{BufWriter, Write as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;
use hdrhistogram::serialization::V2DeflateSerializer;
use hdrhistogram::serialization::interval_log::{IntervalLogWriterBuilder, Tag};
use serde::{Deserialize, Serialize};

use crate::join::JoinedTrace;
use crate::spec::{ResolvedSpec, ResolvedStage};

/// Significant digits of every histogram.
pub const SIGNIFICANT_DIGITS: u8 = 3;
/// Largest latency a histogram holds (1 hour); larger values are clamped and counted.
pub const MAX_TRACKABLE_NS: u64 = 3_600_000_000_000;
/// Quantiles every stage reports.
pub const QUANTILES: [f64; 6] = [0.5, 0.9, 0.95, 0.99, 0.999, 0.9999];

/// A new histogram of the project's precision.
#[must_use]
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_TRACKABLE_NS, SIGNIFICANT_DIGITS).expect("valid bounds")
}

/// One percentile with its precision.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Percentile {
    /// The quantile, e.g. 0.99.
    pub quantile: f64,
    /// The value: the middle of the histogram bucket holding that quantile, ns.
    pub value_ns: u64,
    /// Half the bucket's width: the true value is within ± this, ns.
    pub precision_ns: u64,
}

/// What a stage measured over a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageStats {
    /// Stage name.
    pub name: String,
    /// From hop name.
    pub from: String,
    /// To hop name.
    pub to: String,
    /// The definition the report prints.
    pub definition: String,
    /// Shown in the highlights.
    pub headline: bool,
    /// Traces with both hops and a delta >= 0.
    pub count: u64,
    /// Traces with both hops and a delta < 0 (clock error), not in the statistics.
    pub negative: u64,
    /// Deltas above the histogram's range (clamped into it), ns.
    pub clamped: u64,
    /// Exact minimum, ns.
    pub min_ns: Option<i64>,
    /// Exact maximum, ns.
    pub max_ns: Option<i64>,
    /// Exact mean, ns.
    pub mean_ns: Option<f64>,
    /// Exact population standard deviation, ns.
    pub stddev_ns: Option<f64>,
    /// HDR percentiles, 3 significant digits.
    pub percentiles: Vec<Percentile>,
    /// The interval log, relative to the run directory.
    pub hdr_log: String,
}

/// The percentile of `q` in `h`, as the middle of its bucket with ± half its width.
#[must_use]
pub fn percentile(h: &Histogram<u64>, q: f64) -> Percentile {
    let v = h.value_at_quantile(q);
    Percentile {
        quantile: q,
        value_ns: h.median_equivalent(v),
        precision_ns: h.equivalent_range(v) / 2,
    }
}

struct Acc {
    stage: ResolvedStage,
    from: String,
    to: String,
    total: Histogram<u64>,
    interval: Histogram<u64>,
    negative: u64,
    clamped: u64,
    n: u64,
    mean: f64,
    m2: f64,
    min: i64,
    max: i64,
    log: BufWriter<File>,
    log_path: PathBuf,
    rel: String,
    tag: String,
}

/// Records every written trace into its stages.
pub struct StageRecorder {
    stages: Vec<Acc>,
    base_unix_ns: i64,
    interval_start_unix_ns: i64,
    serializer: V2DeflateSerializer,
}

impl std::fmt::Debug for StageRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StageRecorder")
            .field("stages", &self.stages.len())
            .finish_non_exhaustive()
    }
}

/// A file-name- and tag-safe form of a stage name: `Broker Time` -> `broker_time`.
#[must_use]
pub fn slug(name: &str) -> String {
    let mut s = String::with_capacity(name.len());
    for c in name.chars() {
        if c.is_ascii_alphanumeric() {
            s.push(c.to_ascii_lowercase());
        } else if !s.ends_with('_') {
            s.push('_');
        }
    }
    s.trim_matches('_').to_owned()
}

impl StageRecorder {
    /// Opens `run_dir/hdr/<stage>.hlog` for every stage, headed by the start time.
    ///
    /// # Errors
    /// The directory or a log file cannot be created.
    pub fn new(spec: &ResolvedSpec, run_dir: &Path, base_unix_ns: i64) -> std::io::Result<Self> {
        let dir = run_dir.join("hdr");
        std::fs::create_dir_all(&dir)?;
        let base = UNIX_EPOCH + Duration::from_nanos(u64::try_from(base_unix_ns).unwrap_or(0));
        let mut serializer = V2DeflateSerializer::new();
        let mut stages = Vec::new();
        for s in spec.stages() {
            let tag = slug(&s.name);
            let rel = format!("hdr/{tag}.hlog");
            let log_path = run_dir.join(&rel);
            let mut log = BufWriter::new(File::create(&log_path)?);
            IntervalLogWriterBuilder::new()
                .add_comment(&format!(
                    "hoptrace stage \"{}\": {} -> {}; values in nanoseconds",
                    s.name,
                    spec.hop_names()[s.from_index],
                    spec.hop_names()[s.to_index]
                ))
                .add_comment(&s.definition)
                .with_start_time(base)
                .with_base_time(base)
                .begin_log_with(&mut log, &mut serializer)?;
            writeln!(
                log,
                "\"StartTimestamp\",\"Interval_Length\",\"Interval_Max\",\"Interval_Compressed_Histogram\""
            )?;
            stages.push(Acc {
                from: spec.hop_names()[s.from_index].clone(),
                to: spec.hop_names()[s.to_index].clone(),
                stage: s.clone(),
                total: new_histogram(),
                interval: new_histogram(),
                negative: 0,
                clamped: 0,
                n: 0,
                mean: 0.0,
                m2: 0.0,
                min: i64::MAX,
                max: i64::MIN,
                log,
                log_path,
                rel,
                tag,
            });
        }
        Ok(Self {
            stages,
            base_unix_ns,
            interval_start_unix_ns: base_unix_ns,
            serializer,
        })
    }

    /// Adds a trace's stage deltas.
    pub fn record(&mut self, t: &JoinedTrace) {
        for a in &mut self.stages {
            let Some(d) = t.stage_ns(&a.stage) else {
                continue;
            };
            if d < 0 {
                a.negative += 1;
                continue;
            }
            let v = d as u64;
            if v > MAX_TRACKABLE_NS {
                a.clamped += 1;
            }
            a.total.saturating_record(v);
            a.interval.saturating_record(v);
            a.n += 1;
            let x = d as f64;
            let delta = x - a.mean;
            a.mean += delta / a.n as f64;
            a.m2 += delta * (x - a.mean);
            a.min = a.min.min(d);
            a.max = a.max.max(d);
        }
    }

    /// The last interval's p50 and p99 per stage that saw traces (name, p50, p99), for
    /// progress lines.
    #[must_use]
    pub fn interval_p50_p99(&self) -> Vec<(String, u64, u64)> {
        self.stages
            .iter()
            .filter(|a| !a.interval.is_empty())
            .map(|a| {
                (
                    a.stage.name.clone(),
                    percentile(&a.interval, 0.5).value_ns,
                    percentile(&a.interval, 0.99).value_ns,
                )
            })
            .collect()
    }

    /// Appends every stage's interval histogram to its log and starts a new interval.
    ///
    /// # Errors
    /// A log cannot be written.
    pub fn end_interval(&mut self, now_unix_ns: i64) -> std::io::Result<()> {
        let start = Duration::from_nanos(
            u64::try_from(self.interval_start_unix_ns - self.base_unix_ns).unwrap_or(0),
        );
        let len = Duration::from_nanos(
            u64::try_from(now_unix_ns - self.interval_start_unix_ns).unwrap_or(0),
        );
        for a in &mut self.stages {
            let mut w =
                IntervalLogWriterBuilder::new().begin_log_with(&mut a.log, &mut self.serializer)?;
            w.write_histogram(&a.interval, start, len, Tag::new(&a.tag))
                .map_err(|e| std::io::Error::other(format!("{}: {e:?}", a.log_path.display())))?;
            a.log.flush()?;
            a.interval.reset();
        }
        self.interval_start_unix_ns = now_unix_ns;
        Ok(())
    }

    /// Ends the last interval and returns every stage's statistics.
    ///
    /// # Errors
    /// A log cannot be written.
    pub fn finish(mut self, now_unix_ns: i64) -> std::io::Result<Vec<StageStats>> {
        self.end_interval(now_unix_ns)?;
        Ok(self
            .stages
            .into_iter()
            .map(|a| {
                let any = a.n > 0;
                StageStats {
                    name: a.stage.name.clone(),
                    from: a.from,
                    to: a.to,
                    definition: a.stage.definition.clone(),
                    headline: a.stage.headline,
                    count: a.n,
                    negative: a.negative,
                    clamped: a.clamped,
                    min_ns: any.then_some(a.min),
                    max_ns: any.then_some(a.max),
                    mean_ns: any.then_some(a.mean),
                    stddev_ns: any.then(|| (a.m2 / a.n as f64).sqrt()),
                    percentiles: if any {
                        QUANTILES.iter().map(|q| percentile(&a.total, *q)).collect()
                    } else {
                        Vec::new()
                    },
                    hdr_log: a.rel,
                }
            })
            .collect())
    }
}

/// Seconds since the Unix epoch of a `SystemTime`, for logs.
#[must_use]
pub fn unix_ns(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_precision_matches_three_digits() {
        let mut h = new_histogram();
        h.record(1_100_000).unwrap();
        let p = percentile(&h, 0.5);
        // 1.1 ms lies in a bucket 1024 ns wide: ±512 ns, as the reference report states.
        assert_eq!(p.precision_ns, 512);
        assert!(p.value_ns.abs_diff(1_100_000) <= 512);
        assert!((p.precision_ns as f64) / (p.value_ns as f64) < 0.0005);
    }

    #[test]
    fn slugs() {
        assert_eq!(slug("Broker Time"), "broker_time");
        assert_eq!(slug("Total Ingestion (p->q)"), "total_ingestion_p_q");
        assert_eq!(slug("publish -> broker"), "publish_broker");
    }
}
