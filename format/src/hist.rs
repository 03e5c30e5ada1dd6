//! Histogram conventions of every hoptrace figure.
//!
//! - **Layout.** One HdrHistogram layout: values 1 ns to [`MAX_TRACKABLE_NS`] (one hour)
//!   at [`SIGNIFICANT_DIGITS`] significant digits, the layout of [`new_histogram`]. A
//!   value above the range is clamped into its last bucket and counted (`clamped`).
//!   [`HdrCounts`] holds such a histogram's counts in a flat vector.
//! - **Rank.** The quantile `q` of `n` values is the value of rank [`rank`]`(q, n)` =
//!   `max(1, ceil(q · n))` in ascending order, as HdrHistogram and DuckDB's
//!   `quantile_disc` compute it.
//! - **Reported value.** A [`Percentile`] is the middle of the bucket that holds the value
//!   of that rank, with half the bucket's width as its precision: the exact value is
//!   within `value ± precision`.
//! - **Signs.** Stage deltas can be negative (a stamp of a later hop read from a clock that
//!   is behind). [`SignedStats`] keeps every known delta: values `>= 0` in one histogram,
//!   the magnitudes of values `< 0` in a second one of the same layout, so ranks,
//!   percentiles, the minimum, mean and standard deviation run over all of them. The
//!   count of negative values is kept beside (`negative`) so a report can flag it.
//! - **Moments.** Count, exact minimum, maximum and sum (in `i128`), and the second moment
//!   about the mean, merged with Chan's parallel formula; the standard deviation is the
//!   population one (divided by `n`).

use crate::varint::{Reader, put, put_zigzag};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Significant digits of every histogram.
pub const SIGNIFICANT_DIGITS: u8 = 3;
/// Largest latency a histogram holds (1 hour); larger values are clamped and counted.
pub const MAX_TRACKABLE_NS: u64 = 3_600_000_000_000;
/// Quantiles every stage reports.
pub const QUANTILES: [f64; 6] = [0.5, 0.9, 0.95, 0.99, 0.999, 0.9999];

/// A new histogram of the project's layout.
#[must_use]
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_TRACKABLE_NS, SIGNIFICANT_DIGITS).expect("valid bounds")
}

/// log2 of the sub-buckets per bucket: the smallest power of two holding every integer
/// below 2 × 10^digits (single-unit resolution up to there).
const SUB_BUCKET_MAGNITUDE: u32 = (2 * 10_u64.pow(SIGNIFICANT_DIGITS as u32) - 1).ilog2() + 1;
/// log2 of half the sub-buckets: every bucket but the first uses its upper half only.
const HALF_MAGNITUDE: u32 = SUB_BUCKET_MAGNITUDE - 1;
/// Values below this share bucket 0, one index per value.
const SUB_BUCKET_MASK: u64 = (1 << SUB_BUCKET_MAGNITUDE) - 1;
/// Leading zeros of the largest value of bucket 0, subtracted to find a value's bucket.
const LEADING_ZERO_BASE: u32 = 64 - SUB_BUCKET_MAGNITUDE;
/// Length of the counts of a full histogram (up to [`MAX_TRACKABLE_NS`]).
pub const HDR_LEN: usize = hdr_index(MAX_TRACKABLE_NS) + 1;

/// The index of `value` in the counts of a histogram of the project's layout: the same
/// bucket the `hdrhistogram` crate records it in. `value` must not exceed
/// [`MAX_TRACKABLE_NS`].
#[inline]
#[must_use]
pub const fn hdr_index(value: u64) -> usize {
    let bucket = LEADING_ZERO_BASE - (value | SUB_BUCKET_MASK).leading_zeros();
    ((bucket as usize) << HALF_MAGNITUDE) + (value >> bucket) as usize
}

/// The lowest value of the bucket at `index` (the inverse of [`hdr_index`]).
#[inline]
#[must_use]
pub const fn hdr_value(index: usize) -> u64 {
    let half = 1_usize << HALF_MAGNITUDE;
    let bucket = index >> HALF_MAGNITUDE;
    if bucket == 0 {
        index as u64
    } else {
        (((index & (half - 1)) + half) as u64) << (bucket - 1)
    }
}

/// The number of distinct values the bucket at `index` holds.
#[inline]
#[must_use]
pub const fn hdr_width(index: usize) -> u64 {
    let bucket = index >> HALF_MAGNITUDE;
    if bucket <= 1 { 1 } else { 1 << (bucket - 1) }
}

/// Adds each of `values` (>= 0, clamped to [`MAX_TRACKABLE_NS`]) to its bucket of `counts`,
/// which must reach the largest one's.
///
/// Equal neighbours are added as one run: every hop after a processor batch stamps the
/// batch's messages alike, so their deltas repeat row after row, and adding them one by
/// one would increment one counter back to back, each increment waiting for the last.
#[inline(always)]
fn count_into_portable(counts: &mut [u64], values: &[i64]) {
    let Some((&first, rest)) = values.split_first() else {
        return;
    };
    let (mut run_value, mut run) = (first, 1_u64);
    for &v in rest {
        if v == run_value {
            run += 1;
        } else {
            counts[hdr_index((run_value as u64).min(MAX_TRACKABLE_NS))] += run;
            (run_value, run) = (v, 1);
        }
    }
    counts[hdr_index((run_value as u64).min(MAX_TRACKABLE_NS))] += run;
}

/// [`count_into_portable`] compiled for CPUs with LZCNT: the bucket of a value is found
/// from its leading zeros, which LZCNT counts several times faster than the BSR the
/// portable build falls back to.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "lzcnt")]
fn count_into_lzcnt(counts: &mut [u64], values: &[i64]) {
    count_into_portable(counts, values);
}

fn count_into(counts: &mut [u64], values: &[i64]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("lzcnt") {
        // SAFETY: this CPU has LZCNT, checked just above.
        unsafe { count_into_lzcnt(counts, values) };
        return;
    }
    count_into_portable(counts, values);
}

/// The rank of quantile `q` among `n` values: `max(1, ceil(q · n))`, at most `n`
/// (`q` is clamped to 0..=1).
#[inline]
#[must_use]
pub fn rank(q: f64, n: u64) -> u64 {
    ((q.clamp(0.0, 1.0) * n as f64).ceil() as u64).clamp(1, n.max(1))
}

/// A histogram's counts alone, in a flat vector with exactly the bucket layout of
/// [`new_histogram`], grown only as far as the largest value seen. Recording is an index
/// computation and an increment; [`HdrCounts::to_histogram`] gives the equivalent
/// `hdrhistogram::Histogram` (same buckets, same counts, so the same percentiles).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HdrCounts {
    counts: Vec<u64>,
}

impl HdrCounts {
    /// No values.
    #[must_use]
    pub const fn new() -> Self {
        Self { counts: Vec::new() }
    }

    /// The counts, by bucket index; buckets past the last one used are not stored.
    #[must_use]
    pub fn counts(&self) -> &[u64] {
        &self.counts
    }

    /// Values recorded.
    #[must_use]
    pub fn len(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Nothing recorded.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.counts.iter().all(|&c| c == 0)
    }

    /// Bytes held.
    #[must_use]
    pub fn allocated_bytes(&self) -> usize {
        self.counts.capacity() * std::mem::size_of::<u64>()
    }

    /// Forgets every value, keeping the memory.
    pub fn clear(&mut self) {
        self.counts.fill(0);
    }

    /// Makes room for indices below `len`.
    #[inline]
    fn reserve_to(&mut self, len: usize) {
        if self.counts.len() < len {
            self.counts.resize(len, 0);
        }
    }

    /// Records `value`, clamped to [`MAX_TRACKABLE_NS`] as `Histogram::saturating_record`
    /// of a value clamped by the caller would.
    #[inline]
    pub fn record(&mut self, value: u64) {
        self.add_at(hdr_index(value.min(MAX_TRACKABLE_NS)), 1);
    }

    /// Records every value of `values`, each clamped to [`MAX_TRACKABLE_NS`]. Every value
    /// must be >= 0, and `max` their largest (so the counts grow once).
    #[inline]
    pub fn record_non_negative(&mut self, values: &[i64], max: i64) {
        debug_assert!(values.iter().all(|&v| (0..=max).contains(&v)));
        self.reserve_to(hdr_index((max as u64).min(MAX_TRACKABLE_NS)) + 1);
        count_into(self.counts.as_mut_slice(), values);
    }

    /// Adds `n` to the bucket at `index` (below [`HDR_LEN`]).
    #[inline]
    pub fn add_at(&mut self, index: usize, n: u64) {
        self.reserve_to(index + 1);
        self.counts[index] += n;
    }

    /// Adds the counts of `other`.
    pub fn merge(&mut self, other: &Self) {
        self.reserve_to(other.counts.len());
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
    }

    /// Adds the counts of a histogram of the project's layout.
    pub fn add_histogram(&mut self, h: &Histogram<u64>) {
        for v in h.iter_recorded() {
            let value = v.value_iterated_to().min(MAX_TRACKABLE_NS);
            self.add_at(hdr_index(value), v.count_at_value());
        }
    }

    /// The non-empty buckets: (index, count), in ascending order.
    pub fn non_zero(&self) -> impl Iterator<Item = (usize, u64)> + '_ {
        self.counts
            .iter()
            .enumerate()
            .filter(|&(_, &c)| c > 0)
            .map(|(i, &c)| (i, c))
    }

    /// The equivalent histogram ([`new_histogram`]): each bucket's count recorded at a
    /// value of that bucket.
    #[must_use]
    pub fn to_histogram(&self) -> Histogram<u64> {
        let mut h = new_histogram();
        for (i, c) in self.non_zero() {
            h.record_n(hdr_value(i), c)
                .expect("every index below HDR_LEN is within the histogram's range");
        }
        h
    }

    /// The index of the bucket holding the value of rank `r` (1-based, ascending), or
    /// `None` when fewer than `r` values are recorded.
    #[must_use]
    pub fn index_of_rank(&self, r: u64) -> Option<usize> {
        let mut seen = 0_u64;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= r && c > 0 {
                return Some(i);
            }
        }
        None
    }
}

/// One percentile with its precision. Written with its label (`"label": "P99.9"`),
/// which a reader may ignore: it follows from the quantile.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(into = "Labelled")]
pub struct Percentile {
    /// The quantile, e.g. 0.99.
    pub quantile: f64,
    /// The value: the middle of the histogram bucket holding the value of the quantile's
    /// rank, ns; negative when that value is (clock error).
    pub value_ns: i64,
    /// Half the bucket's width: the exact value is within ± this, ns.
    pub precision_ns: u64,
}

/// A [`Percentile`] as JSON writes it: with its label first.
#[derive(Serialize)]
struct Labelled {
    label: String,
    quantile: f64,
    value_ns: i64,
    precision_ns: u64,
}

impl From<Percentile> for Labelled {
    fn from(p: Percentile) -> Self {
        Self {
            label: p.label(),
            quantile: p.quantile,
            value_ns: p.value_ns,
            precision_ns: p.precision_ns,
        }
    }
}

/// The label of a quantile: 0.999 → `P99.9`.
///
/// ```
/// assert_eq!(hoptrace_format::hist::quantile_label(0.9999), "P99.99");
/// ```
#[must_use]
pub fn quantile_label(q: f64) -> String {
    let pct = format!("{:.4}", q * 100.0);
    let pct = pct.trim_end_matches('0').trim_end_matches('.');
    format!("P{pct}")
}

impl Percentile {
    /// Its label, e.g. `P99.9`.
    #[must_use]
    pub fn label(&self) -> String {
        quantile_label(self.quantile)
    }

    /// Its value and precision as a reader reads them: `1.2ms ±512ns`.
    ///
    /// ```
    /// let p = hoptrace_format::hist::Percentile { quantile: 0.5, value_ns: 1_200_000, precision_ns: 512 };
    /// assert_eq!(p.shown(), "1.2ms ±512ns");
    /// ```
    #[must_use]
    pub fn shown(&self) -> String {
        format!(
            "{} ±{}",
            crate::units::duration_f64(self.value_ns as f64),
            crate::units::duration_f64(self.precision_ns as f64)
        )
    }

    /// Whether its label is `label`, in any case (`p99.9` is `P99.9`).
    #[must_use]
    pub fn is(&self, label: &str) -> bool {
        self.label().eq_ignore_ascii_case(label)
    }

    /// The percentile of the value in bucket `index` of a histogram of the project's
    /// layout, negated when `negative` (the bucket then holds magnitudes).
    #[must_use]
    pub fn of_bucket(quantile: f64, index: usize, negative: bool) -> Self {
        let half = hdr_width(index) / 2;
        let middle = i64::try_from(hdr_value(index) + half).unwrap_or(i64::MAX);
        Self {
            quantile,
            value_ns: if negative { -middle } else { middle },
            precision_ns: half,
        }
    }

    /// The percentile with its value moved into `[min_ns, max_ns]`, the exact extremes of
    /// the values it ranks. The middle of the bucket holding the lowest or the highest
    /// value can lie below the exact minimum or above the exact maximum (a P99.99 above
    /// the Max); the exact value is in both the bucket and the range, so the clamped value
    /// is still within the precision of it, and never outside what was measured.
    #[must_use]
    pub fn within(self, min_ns: i64, max_ns: i64) -> Self {
        if min_ns > max_ns {
            return self;
        }
        Self {
            value_ns: self.value_ns.clamp(min_ns, max_ns),
            ..self
        }
    }
}

/// The percentile `q` of the values of two histograms: `pos` of the values `>= 0`, `neg`
/// of the magnitudes of the values `< 0`. The value of rank `max(1, ceil(q · n))` over all
/// `n` of them in ascending order, as the middle of its bucket with its precision; `None`
/// when both are empty.
#[must_use]
pub fn signed_percentile(pos: &HdrCounts, neg: &HdrCounts, q: f64) -> Option<Percentile> {
    let negatives = neg.len();
    let n = negatives + pos.len();
    if n == 0 {
        return None;
    }
    let r = rank(q, n);
    if r <= negatives {
        // Ascending order runs through the negatives from the largest magnitude.
        let index = neg.index_of_rank(negatives - r + 1)?;
        Some(Percentile::of_bucket(q, index, true))
    } else {
        let index = pos.index_of_rank(r - negatives)?;
        Some(Percentile::of_bucket(q, index, false))
    }
}

/// Why [`SignedStats::decode`] failed.
pub use crate::varint::DecodeError;

/// A stage's figures over a group of deltas, every sign included.
///
/// `count` counts every value; `negative` how many of them are below zero (clock error
/// between hosts, flagged by reports). Minimum, maximum and sum are exact; `m2` is the
/// second moment about the mean (for the population standard deviation). `pos` holds
/// the values `>= 0`, `neg` the magnitudes of the values `< 0`, each clamped to
/// [`MAX_TRACKABLE_NS`] (`clamped` counts those beyond it, of either sign).
///
/// ```
/// use hoptrace_format::hist::SignedStats;
/// let mut s = SignedStats::default();
/// s.add_values(&[5, 7, -2, 9]);
/// assert_eq!((s.count, s.negative, s.min_ns(), s.max_ns()), (4, 1, Some(-2), Some(9)));
/// assert_eq!(s.mean_ns(), Some(4.75));
/// let back = SignedStats::decode(&s.encode()).unwrap();
/// assert_eq!(back, s);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct SignedStats {
    /// Values.
    pub count: u64,
    /// Values < 0.
    pub negative: u64,
    /// Values whose magnitude is above [`MAX_TRACKABLE_NS`].
    pub clamped: u64,
    /// Smallest value (meaningless when `count` is 0).
    pub min: i64,
    /// Largest value (meaningless when `count` is 0).
    pub max: i64,
    /// Exact sum.
    pub sum: i128,
    /// Sum of squared differences from the mean.
    pub m2: f64,
    /// Histogram of the values >= 0.
    pub pos: HdrCounts,
    /// Histogram of the magnitudes of the values < 0.
    pub neg: HdrCounts,
}

impl Default for SignedStats {
    fn default() -> Self {
        Self {
            count: 0,
            negative: 0,
            clamped: 0,
            min: i64::MAX,
            max: i64::MIN,
            sum: 0,
            m2: 0.0,
            pos: HdrCounts::new(),
            neg: HdrCounts::new(),
        }
    }
}

/// 2^52 as an f64's bits: ORed into an integer below 2^52, it gives 2^52 + that integer.
const TWO_52_BITS: u64 = 0x4330_0000_0000_0000;

/// `v` (0 <= v < 2^52) as an f64, exactly, with integer and float operations that
/// vectorize (no scalar conversion instruction).
#[inline(always)]
fn small_to_f64(v: i64) -> f64 {
    f64::from_bits(v as u64 | TWO_52_BITS) - f64::from_bits(TWO_52_BITS)
}

/// Figures of a slice of values from one pass: minimum, maximum, sum, and the sum of
/// squared differences from `shift`.
struct SlicePass {
    min: i64,
    max: i64,
    sum: i128,
    squares: f64,
}

/// One pass over `values`. Exact while every value is in 0..2^51 (the sum of 4096 of them
/// fits an i64; each converts exactly); [`SlicePass::exact`] otherwise, and only `min` is
/// meaningful when a value is negative.
#[inline]
fn one_pass(values: &[i64], shift: f64) -> SlicePass {
    let mut out = SlicePass {
        min: i64::MAX,
        max: 0,
        sum: 0,
        squares: 0.0,
    };
    let mut lanes = [0.0_f64; 4];
    for chunk in values.chunks(4096) {
        let (mut min, mut max, mut sum) = (i64::MAX, 0_i64, 0_i64);
        let quads = chunk.chunks_exact(4);
        for &v in quads.remainder() {
            let d = small_to_f64(v) - shift;
            lanes[0] += d * d;
        }
        for q in quads {
            for (l, &v) in lanes.iter_mut().zip(q) {
                let d = small_to_f64(v) - shift;
                *l += d * d;
            }
        }
        for &v in chunk {
            min = min.min(v);
            max = max.max(v);
            sum = sum.wrapping_add(v);
        }
        out.min = out.min.min(min);
        out.max = out.max.max(max);
        out.sum += i128::from(sum);
    }
    out.squares = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
    out
}

impl SlicePass {
    /// The pass for values of any size and sign: exact sum, and squares with each value
    /// converted to the nearest f64.
    fn exact(values: &[i64], shift: f64) -> Self {
        let sq = |v: i64| {
            let d = v as f64 - shift;
            d * d
        };
        Self {
            min: values.iter().copied().min().unwrap_or(i64::MAX),
            max: values.iter().copied().max().unwrap_or(i64::MIN),
            sum: values.iter().map(|&v| i128::from(v)).sum(),
            squares: values.iter().map(|&v| sq(v)).sum(),
        }
    }
}

/// A histogram written by [`put_counts`].
fn read_counts(r: &mut Reader<'_>) -> Result<HdrCounts, DecodeError> {
    let mut h = HdrCounts::new();
    let buckets = r.varint()?;
    let mut next = 0_usize;
    for _ in 0..buckets {
        let skip = usize::try_from(r.varint()?).map_err(|_| DecodeError)?;
        let index = next.checked_add(skip).ok_or(DecodeError)?;
        if index >= HDR_LEN {
            return Err(DecodeError);
        }
        h.add_at(index, r.varint()?);
        next = index + 1;
    }
    Ok(h)
}
/// Non-empty buckets as their number, then (zeros skipped, count) pairs.
fn put_counts(out: &mut Vec<u8>, h: &HdrCounts) {
    put(out, h.non_zero().count() as u64);
    let mut next = 0;
    for (i, c) in h.non_zero() {
        put(out, (i - next) as u64);
        put(out, c);
        next = i + 1;
    }
}

/// What a set of deltas measured, as `run.json` and `summary.json` state it for a stage:
/// every figure is over every value, negative ones included.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Figures {
    /// Values (for a stage: traces with both hops).
    pub count: u64,
    /// Of those, values < 0 (clock error between hosts): in every figure, and flagged.
    pub negative: u64,
    /// Values whose magnitude is above the histogram's range (clamped into it).
    pub clamped: u64,
    /// Exact minimum, ns.
    pub min_ns: Option<i64>,
    /// Exact maximum, ns.
    pub max_ns: Option<i64>,
    /// Exact mean, ns.
    pub mean_ns: Option<f64>,
    /// Exact population standard deviation, ns.
    pub stddev_ns: Option<f64>,
    /// HDR percentiles (3 significant digits) at [`QUANTILES`], within
    /// `[min_ns, max_ns]`.
    pub percentiles: Vec<Percentile>,
}

impl Figures {
    /// The percentile of `label` (`P50`, `p99.99`, ...).
    #[must_use]
    pub fn percentile(&self, label: &str) -> Option<&Percentile> {
        self.percentiles.iter().find(|p| p.is(label))
    }
}

/// First byte of an encoded [`SignedStats`].
const STATS_TAG: u8 = 0x55;

impl SignedStats {
    /// Exact minimum.
    #[must_use]
    pub fn min_ns(&self) -> Option<i64> {
        (self.count > 0).then_some(self.min)
    }

    /// Exact maximum.
    #[must_use]
    pub fn max_ns(&self) -> Option<i64> {
        (self.count > 0).then_some(self.max)
    }

    /// Mean (the exact sum over the count).
    #[must_use]
    pub fn mean_ns(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum as f64 / self.count as f64)
    }

    /// Population standard deviation.
    #[must_use]
    pub fn stddev_ns(&self) -> Option<f64> {
        (self.count > 0).then(|| (self.m2 / self.count as f64).max(0.0).sqrt())
    }

    /// The value of rank `max(1, ceil(q · count))`, as the middle of its bucket with its
    /// precision, kept within the exact minimum and maximum ([`Percentile::within`]);
    /// `None` without values.
    #[must_use]
    pub fn percentile(&self, q: f64) -> Option<Percentile> {
        signed_percentile(&self.pos, &self.neg, q).map(|p| p.within(self.min, self.max))
    }

    /// The percentiles of [`QUANTILES`] (empty without values).
    #[must_use]
    pub fn percentiles(&self) -> Vec<Percentile> {
        QUANTILES
            .iter()
            .filter_map(|&q| self.percentile(q))
            .collect()
    }

    /// Every figure of the values.
    #[must_use]
    pub fn figures(&self) -> Figures {
        Figures {
            count: self.count,
            negative: self.negative,
            clamped: self.clamped,
            min_ns: self.min_ns(),
            max_ns: self.max_ns(),
            mean_ns: self.mean_ns(),
            stddev_ns: self.stddev_ns(),
            percentiles: self.percentiles(),
        }
    }

    /// Adds one value. Prefer [`Self::add_values`] for many.
    pub fn add(&mut self, value: i64) {
        self.add_values(&[value]);
    }

    /// Adds every value of `values`.
    pub fn add_values(&mut self, values: &[i64]) {
        let Some(&first) = values.first() else {
            return;
        };
        // Squares are summed about the first value (close to the others), and the second
        // moment about their mean follows: sum((v - mean)^2) = sum((v - s)^2) - n (mean - s)^2.
        let shift = first as f64;
        let mut pass = one_pass(values, shift);
        if pass.min < 0 {
            // Negative deltas (clock error) are rare: the exact pass, and each sign into
            // its own histogram.
            pass = SlicePass::exact(values, shift);
            for &v in values {
                let magnitude = v.unsigned_abs();
                self.clamped += u64::from(magnitude > MAX_TRACKABLE_NS);
                if v < 0 {
                    self.negative += 1;
                    self.neg.record(magnitude);
                } else {
                    self.pos.record(magnitude);
                }
            }
        } else {
            if pass.max >= 1 << 51 {
                pass = SlicePass::exact(values, shift);
            }
            self.pos.record_non_negative(values, pass.max);
            if pass.max as u64 > MAX_TRACKABLE_NS {
                self.clamped += values
                    .iter()
                    .filter(|&&v| v as u64 > MAX_TRACKABLE_NS)
                    .count() as u64;
            }
        }
        let n = values.len() as u64;
        let mean = pass.sum as f64 / n as f64;
        let m2 = (pass.squares - n as f64 * (mean - shift) * (mean - shift)).max(0.0);
        self.merge_moments(n, pass.sum, m2);
        self.min = self.min.min(pass.min);
        self.max = self.max.max(pass.max);
    }

    /// Merges a count, sum and second moment of other values into these.
    fn merge_moments(&mut self, n: u64, sum: i128, m2: f64) {
        if n == 0 {
            return;
        }
        if self.count > 0 {
            let (na, nb) = (self.count as f64, n as f64);
            let delta = sum as f64 / nb - self.sum as f64 / na;
            self.m2 += m2 + delta * delta * (na * nb / (na + nb));
        } else {
            self.m2 = m2;
        }
        self.count += n;
        self.sum += sum;
    }

    /// Adds `other`'s values.
    pub fn merge(&mut self, other: &Self) {
        self.merge_moments(other.count, other.sum, other.m2);
        self.negative += other.negative;
        self.clamped += other.clamped;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
        self.pos.merge(&other.pos);
        self.neg.merge(&other.neg);
    }

    /// Bytes the histograms hold.
    #[must_use]
    pub fn allocated_bytes(&self) -> usize {
        self.pos.allocated_bytes() + self.neg.allocated_bytes()
    }

    /// Forgets every value, keeping the histograms' memory.
    pub fn clear(&mut self) {
        let (mut pos, mut neg) = (std::mem::take(&mut self.pos), std::mem::take(&mut self.neg));
        pos.clear();
        neg.clear();
        *self = Self {
            pos,
            neg,
            ..Self::default()
        };
    }

    /// A compact binary form, for aggregate states; not for storing (it may change
    /// between versions).
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        out.push(STATS_TAG);
        put(&mut out, self.count);
        put(&mut out, self.negative);
        put(&mut out, self.clamped);
        put_zigzag(&mut out, self.min);
        put_zigzag(&mut out, self.max);
        out.extend_from_slice(&self.sum.to_le_bytes());
        out.extend_from_slice(&self.m2.to_le_bytes());
        put_counts(&mut out, &self.pos);
        put_counts(&mut out, &self.neg);
        out
    }

    /// Reads [`Self::encode`]'s bytes.
    ///
    /// # Errors
    /// When `bytes` are not such an encoding.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(bytes);
        if r.byte()? != STATS_TAG {
            return Err(DecodeError);
        }
        let s = Self {
            count: r.varint()?,
            negative: r.varint()?,
            clamped: r.varint()?,
            min: r.zigzag()?,
            max: r.zigzag()?,
            sum: i128::from_le_bytes(r.fixed()?),
            m2: f64::from_le_bytes(r.fixed()?),
            pos: read_counts(&mut r)?,
            neg: read_counts(&mut r)?,
        };
        r.finish()?;
        if s.pos.len() + s.neg.len() != s.count {
            return Err(DecodeError);
        }
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn layout_matches_the_hdrhistogram_crate() {
        let h = new_histogram();
        for v in (0..100_000_u64)
            .chain((0..64).map(|s| 1_u64 << s))
            .chain([MAX_TRACKABLE_NS, MAX_TRACKABLE_NS - 1, 999_999, 1_000_001])
            .filter(|&v| v <= MAX_TRACKABLE_NS)
        {
            let i = hdr_index(v);
            assert_eq!(hdr_value(i), h.lowest_equivalent(v), "value {v}");
            assert_eq!(hdr_width(i), h.equivalent_range(v), "value {v}");
            assert_eq!(
                hdr_value(i) + hdr_width(i) / 2,
                h.median_equivalent(v),
                "value {v}"
            );
        }
    }

    #[test]
    fn percentile_precision_matches_three_digits() {
        let mut s = SignedStats::default();
        s.add(1_100_000);
        let p = s.percentile(0.5).unwrap();
        // 1.1 ms lies in a bucket 1024 ns wide: ±512 ns.
        assert_eq!(p.precision_ns, 512);
        assert!(p.value_ns.abs_diff(1_100_000) <= 512);
        let mut n = SignedStats::default();
        n.add(-1_100_000);
        let q = n.percentile(0.5).unwrap();
        assert_eq!((q.value_ns, q.precision_ns), (-p.value_ns, 512));
    }

    #[test]
    fn percentiles_never_leave_the_exact_min_and_max() {
        // The demo's Query Duration: its largest value lies low in a bucket 1,024 ns wide,
        // whose middle (1,191,424) is above it.
        let mut s = SignedStats::default();
        s.add_values(&[400_000, 900_000, 1_190_968]);
        assert_eq!(hdr_value(hdr_index(1_190_968)) + 512, 1_191_424);
        let top = s.percentile(0.9999).unwrap();
        assert_eq!((top.value_ns, top.precision_ns), (1_190_968, 512));
        // And the same below the minimum, on both signs.
        let mut n = SignedStats::default();
        n.add_values(&[-1_190_968, -900_000]);
        assert_eq!(n.percentile(0.0).unwrap().value_ns, -1_190_968);
        // Both values low in one bucket: every percentile is the exact maximum, within
        // the precision of the exact value of its rank.
        let mut low = SignedStats::default();
        low.add_values(&[1_190_001, 1_190_002]);
        let p50 = low.percentile(0.5).unwrap();
        assert_eq!(p50.value_ns, 1_190_002);
        assert!(p50.value_ns.abs_diff(1_190_001) <= p50.precision_ns);
        assert_eq!(low.percentile(1.0).unwrap().value_ns, 1_190_002);
    }

    #[test]
    fn non_negative_percentiles_equal_the_hdrhistogram_crate() {
        let mut s = SignedStats::default();
        let mut h = new_histogram();
        let mut x = 12_345_u64;
        for _ in 0..50_000 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let v = (x >> 40) % 20_000_000;
            s.add(v as i64);
            h.record(v).unwrap();
        }
        for q in QUANTILES.into_iter().chain([0.0001, 0.25, 1.0]) {
            let p = s.percentile(q).unwrap();
            let v = h.value_at_quantile(q);
            // The crate's bucket middle, kept within the exact extremes.
            let (min, max) = (s.min_ns().unwrap(), s.max_ns().unwrap());
            assert_eq!(
                p.value_ns,
                (h.median_equivalent(v) as i64).clamp(min, max),
                "q {q}"
            );
            assert_eq!(p.precision_ns, h.equivalent_range(v) / 2, "q {q}");
        }
    }

    /// The exact value of rank `max(1, ceil(q n))`, as DuckDB's `quantile_disc`.
    fn exact(sorted: &[i64], q: f64) -> i64 {
        sorted[(rank(q, sorted.len() as u64) - 1) as usize]
    }

    proptest! {
        #[test]
        fn signed_figures_match_an_exact_oracle(
            values in prop::collection::vec(
                prop_oneof![
                    6 => -2_000_000_i64..50_000_000,
                    1 => -5_000_i64..0,
                    1 => Just(0_i64),
                ],
                1..400,
            ),
            split in 0_usize..400,
        ) {
            let mut s = SignedStats::default();
            let split = split.min(values.len());
            // Two batches merged, as aggregates see them.
            let mut other = SignedStats::default();
            s.add_values(&values[..split]);
            other.add_values(&values[split..]);
            s.merge(&other);
            let mut sorted = values.clone();
            sorted.sort_unstable();
            let n = values.len() as u64;
            prop_assert_eq!(s.count, n);
            prop_assert_eq!(s.negative, values.iter().filter(|&&v| v < 0).count() as u64);
            prop_assert_eq!(s.min_ns(), sorted.first().copied());
            prop_assert_eq!(s.max_ns(), sorted.last().copied());
            let sum: i128 = values.iter().map(|&v| i128::from(v)).sum();
            prop_assert_eq!(s.sum, sum);
            let mean = sum as f64 / n as f64;
            let var = values.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n as f64;
            let sd = s.stddev_ns().unwrap();
            prop_assert!((sd - var.sqrt()).abs() <= 1e-6 * var.sqrt().max(1.0), "{} vs {}", sd, var.sqrt());
            for q in QUANTILES.into_iter().chain([0.0, 0.01, 0.1, 0.3, 1.0]) {
                let p = s.percentile(q).unwrap();
                let want = exact(&sorted, q);
                prop_assert!(
                    p.value_ns.abs_diff(want) <= p.precision_ns,
                    "q {}: {} ± {} vs exact {}", q, p.value_ns, p.precision_ns, want
                );
                prop_assert!(
                    (s.min..=s.max).contains(&p.value_ns),
                    "q {}: {} outside [{}, {}]", q, p.value_ns, s.min, s.max
                );
            }
            prop_assert_eq!(SignedStats::decode(&s.encode()).unwrap(), s);
        }

        #[test]
        fn runs_of_equal_values_count_as_one_by_one(
            runs in prop::collection::vec((0_i64..50_000_000, 1_usize..30), 1..60),
        ) {
            // As a batch's stamps give them: each value repeated for a run of rows.
            let values: Vec<i64> = runs
                .iter()
                .flat_map(|&(v, n)| std::iter::repeat_n(v, n))
                .collect();
            let mut s = SignedStats::default();
            s.add_values(&values);
            let mut one_by_one = HdrCounts::new();
            for &v in &values {
                one_by_one.record(v as u64);
            }
            prop_assert_eq!(&s.pos, &one_by_one);
            prop_assert_eq!(s.count, values.len() as u64);
        }
    }

    #[test]
    fn extremes_are_clamped_and_counted() {
        let mut s = SignedStats::default();
        s.add_values(&[i64::MIN, i64::MAX, 5]);
        assert_eq!((s.count, s.negative, s.clamped), (3, 1, 2));
        assert_eq!((s.min_ns(), s.max_ns()), (Some(i64::MIN), Some(i64::MAX)));
        assert_eq!(s.sum, i128::from(i64::MIN) + i128::from(i64::MAX) + 5);
        assert!(s.percentile(0.01).unwrap().value_ns < 0);
        assert_eq!(s.percentile(0.5).unwrap().value_ns, 5);
    }

    #[test]
    fn decode_refuses_garbage() {
        assert_eq!(SignedStats::decode(&[]), Err(DecodeError));
        assert_eq!(SignedStats::decode(&[0x53, 1]), Err(DecodeError));
        let mut bytes = SignedStats::default().encode();
        bytes.push(0);
        assert_eq!(SignedStats::decode(&bytes), Err(DecodeError));
        let mut s = SignedStats::default();
        s.add(3);
        let mut bytes = s.encode();
        // The count no longer matches the histograms.
        bytes[1] = 2;
        assert_eq!(SignedStats::decode(&bytes), Err(DecodeError));
    }

    #[test]
    fn clear_forgets_everything() {
        let mut s = SignedStats::default();
        s.add_values(&[-3, 4]);
        s.clear();
        assert_eq!(s.count, 0);
        assert!(s.pos.is_empty() && s.neg.is_empty());
        assert_eq!(s.percentile(0.5), None);
    }
}
