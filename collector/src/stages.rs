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
    moments: Moments,
    min: i64,
    max: i64,
    log: BufWriter<File>,
    log_path: PathBuf,
    rel: String,
    tag: String,
}

/// Records every written trace into its stages.
/// Sums for an exact mean and a stable population standard deviation without a division
/// per value: values are shifted by the first one (`shift`), the shifted sum is exact in
/// `i128`, and the variance is `E[(x-K)^2] - E[x-K]^2`, which does not cancel badly
/// while the shift is within a few standard deviations of the mean (latencies are).
#[derive(Debug, Default, Clone, Copy)]
struct Moments {
    shift: Option<i64>,
    sum: i128,
    sum_sq: f64,
}

impl Moments {
    #[inline]
    fn add(&mut self, x: i64) {
        let k = *self.shift.get_or_insert(x);
        let d = i128::from(x) - i128::from(k);
        self.sum += d;
        let f = d as f64;
        self.sum_sq += f * f;
    }

    fn mean(&self, n: u64) -> f64 {
        let k = self.shift.unwrap_or(0);
        (i128::from(k) * i128::from(n) + self.sum) as f64 / n as f64
    }

    fn stddev(&self, n: u64) -> f64 {
        let n = n as f64;
        let m = self.sum as f64 / n;
        (self.sum_sq / n - m * m).max(0.0).sqrt()
    }
}

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
                moments: Moments::default(),
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
            // Into the interval only; `end_interval` adds each interval to the total.
            a.interval.saturating_record(v);
            a.n += 1;
            a.moments.add(d);
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
            a.total
                .add(&a.interval)
                .expect("histograms of the same bounds add");
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
                    mean_ns: any.then(|| a.moments.mean(a.n)),
                    stddev_ns: any.then(|| a.moments.stddev(a.n)),
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

    /// Two-pass mean and population standard deviation, on values shifted by the
    /// smallest in integers first (f64 cannot hold every integer near 2^53).
    fn two_pass(xs: &[i64]) -> (f64, f64) {
        let lo = *xs.iter().min().unwrap();
        let n = xs.len() as f64;
        let shifted: Vec<f64> = xs.iter().map(|&x| (x - lo) as f64).collect();
        let m = shifted.iter().sum::<f64>() / n;
        let var = shifted.iter().map(|d| (d - m).powi(2)).sum::<f64>() / n;
        (lo as f64 + m, var.sqrt())
    }

    #[test]
    fn moments_match_a_two_pass_computation() {
        let mut seed = 7u64;
        let mut next = move || {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            seed >> 33
        };
        // Latencies around 1 ms with 50 µs of spread, a far-off first value, and large
        // values near 2^53 where f64 loses integers.
        let sets: Vec<Vec<i64>> = vec![
            (0..10_000)
                .map(|_| 1_000_000 + (next() % 100_000) as i64)
                .collect(),
            std::iter::once(3_000_000_000)
                .chain((0..10_000).map(|_| 20_000 + (next() % 1_000) as i64))
                .collect(),
            (0..1_000)
                .map(|_| (1i64 << 53) + (next() % 4_096) as i64)
                .collect(),
        ];
        for xs in sets {
            let mut m = Moments::default();
            for &x in &xs {
                m.add(x);
            }
            let n = xs.len() as u64;
            let (mean, sd) = two_pass(&xs);
            let exact_mean = xs.iter().map(|&x| i128::from(x)).sum::<i128>() as f64 / n as f64;
            assert_eq!(m.mean(n), exact_mean);
            assert!(
                (m.mean(n) - mean).abs() <= mean.abs() * 1e-12,
                "{} vs {mean}",
                m.mean(n)
            );
            assert!(
                (m.stddev(n) - sd).abs() <= sd * 1e-9,
                "{} vs {sd}",
                m.stddev(n)
            );
        }
        let mut c = Moments::default();
        for _ in 0..5 {
            c.add(42);
        }
        assert_eq!((c.mean(5), c.stddev(5)), (42.0, 0.0));
    }

    #[test]
    fn the_total_holds_every_interval() {
        use crate::spec::PipelineSpec;
        let spec = PipelineSpec::default_pipeline().resolve().unwrap();
        let dir = std::env::temp_dir().join(format!("hoptrace-stages-{}", std::process::id()));
        let mut r = StageRecorder::new(&spec, &dir, 0).unwrap();
        let stage = &spec.stages()[0];
        let mut t = JoinedTrace {
            key: hoptrace_probe::TraceKey {
                publisher: 1,
                stream: 1,
                sequence: 1,
            },
            metric_count: 1,
            intended_ns: 0,
            otel_trace_id: None,
            present_mask: (1 << stage.from_index) | (1 << stage.to_index),
            stamps_ns: [0; hoptrace_probe::protocol::MAX_HOPS],
            complete: true,
            missing_mask: 0,
            flags: 0,
        };
        // Three intervals of 1000 values each: 1..=1000 µs, then 1001..=2000, ...
        for interval in 0..3i64 {
            for i in 1..=1_000i64 {
                t.stamps_ns[stage.to_index] = (interval * 1_000 + i) * 1_000;
                r.record(&t);
            }
            r.end_interval((interval + 1) * 1_000_000_000).unwrap();
        }
        let stats = r.finish(4_000_000_000).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let s = &stats[0];
        assert_eq!(s.count, 3_000);
        assert_eq!(s.min_ns, Some(1_000));
        assert_eq!(s.max_ns, Some(3_000_000));
        assert_eq!(s.mean_ns, Some(1_500_500.0));
        let median = s.percentiles.iter().find(|p| p.quantile == 0.5).unwrap();
        assert!(median.value_ns.abs_diff(1_500_000) <= median.precision_ns + 1_000);
        let p99 = s.percentiles.iter().find(|p| p.quantile == 0.99).unwrap();
        assert!(p99.value_ns.abs_diff(2_970_000) <= p99.precision_ns + 1_000);
    }

    #[test]
    fn slugs() {
        assert_eq!(slug("Broker Time"), "broker_time");
        assert_eq!(slug("Total Ingestion (p->q)"), "total_ingestion_p_q");
        assert_eq!(slug("publish -> broker"), "publish_broker");
    }
}
