//! A stage with every value counted `weight` times (the metrics its message carried):
//! `per_metric(ns, weight)` ([`per_metric_udaf`]) gives its weighted histograms and its
//! [`WeightedMoments`] (mean and population standard deviation) as a [`WeightedStage`],
//! in one pass over the rows; the report's per-metric percentiles, Mean and Std Dev come
//! from it.
//!
//! The weighted sum is exact (an `i128`); the second moment is summed per batch about the
//! batch's first value and batches are merged with the weighted form of Chan's update, so
//! values far from zero with a small spread lose no precision. Rows whose value or weight
//! is NULL, or whose weight is 0, count nothing; a negative weight is an error.
//!
//! ```
//! use hoptrace_analysis::weighted::WeightedMoments;
//! let mut m = WeightedMoments::default();
//! m.add(10, 3); // 10 ns, three metrics
//! m.add(20, 1);
//! assert_eq!(m.weight, 4);
//! assert_eq!(m.mean_ns(), Some(12.5));
//! // Values 10, 10, 10, 20: deviations -2.5 (three times) and 7.5.
//! let sd = ((3.0 * 2.5 * 2.5 + 7.5 * 7.5) / 4.0_f64).sqrt();
//! assert!((m.stddev_ns().unwrap() - sd).abs() < 1e-12);
//! assert_eq!(WeightedMoments::decode(&m.encode()), Some(m));
//! ```

use datafusion::arrow::array::{Array, ArrayRef, AsArray, BooleanArray, Int64Array};
use datafusion::arrow::datatypes::{DataType, Int64Type};
use datafusion::common::{Result, exec_err, plan_err};
use datafusion::logical_expr::AggregateUDF;

use hoptrace_format::hist::{HdrCounts, SignedStats};

use crate::binary_agg::corrupt;
use crate::binary_agg::{self, BinaryState};

/// First byte of an encoded [`WeightedMoments`].
const TAG: u8 = 0x57;
/// Bytes of an encoding: the tag, the weight, the sum, the second moment.
const ENCODED_LEN: usize = 1 + 8 + 16 + 8;

/// Total weight, exact weighted sum and weighted second moment about the mean.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct WeightedMoments {
    /// Sum of the weights (metrics).
    pub weight: u64,
    /// Sum of weight × value, exact.
    pub sum: i128,
    /// Sum of weight × (value − mean)².
    pub m2: f64,
}

impl WeightedMoments {
    /// Adds `value` counted `weight` times.
    pub fn add(&mut self, value: i64, weight: u64) {
        if weight == 0 {
            return;
        }
        self.merge(&Self {
            weight,
            sum: i128::from(value) * i128::from(weight),
            m2: 0.0,
        });
    }

    /// Adds the rows of `values` (each counted its `weights` entry times): the squares
    /// about the first value, then one merge.
    fn add_slice(&mut self, rows: impl Iterator<Item = (i64, u64)> + Clone) {
        let Some((shift, _)) = rows.clone().find(|&(_, w)| w > 0) else {
            return;
        };
        let (mut weight, mut sum, mut squares) = (0_u64, 0_i128, 0.0_f64);
        for (v, w) in rows.filter(|&(_, w)| w > 0) {
            weight += w;
            sum += i128::from(v) * i128::from(w);
            // In i64 unless the difference overflows it (values of opposite extreme
            // signs): converting an i128 to f64 is a slow library call.
            let d = match v.checked_sub(shift) {
                Some(d) => d as f64,
                None => (i128::from(v) - i128::from(shift)) as f64,
            };
            squares += w as f64 * d * d;
        }
        // sum(w (v - mean)^2) = sum(w (v - s)^2) - W (mean - s)^2
        let mean_from_shift = (sum - i128::from(shift) * i128::from(weight)) as f64 / weight as f64;
        let m2 = (squares - weight as f64 * mean_from_shift * mean_from_shift).max(0.0);
        self.merge(&Self { weight, sum, m2 });
    }

    /// Adds `other`'s values.
    pub fn merge(&mut self, other: &Self) {
        if other.weight == 0 {
            return;
        }
        if self.weight > 0 {
            let (wa, wb) = (self.weight as f64, other.weight as f64);
            // The difference of the means, from the exact sums.
            let delta = other.sum as f64 / wb - self.sum as f64 / wa;
            self.m2 += other.m2 + delta * delta * (wa * wb / (wa + wb));
        } else {
            self.m2 = other.m2;
        }
        self.weight += other.weight;
        self.sum += other.sum;
    }

    /// The weighted mean; `None` without weight.
    #[must_use]
    pub fn mean_ns(&self) -> Option<f64> {
        (self.weight > 0).then(|| self.sum as f64 / self.weight as f64)
    }

    /// The weighted population standard deviation; `None` without weight.
    #[must_use]
    pub fn stddev_ns(&self) -> Option<f64> {
        (self.weight > 0).then(|| (self.m2 / self.weight as f64).max(0.0).sqrt())
    }

    /// A fixed binary form, for aggregate states; not for storing.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(ENCODED_LEN);
        out.push(TAG);
        out.extend_from_slice(&self.weight.to_le_bytes());
        out.extend_from_slice(&self.sum.to_le_bytes());
        out.extend_from_slice(&self.m2.to_le_bytes());
        out
    }

    /// Reads [`Self::encode`]'s bytes; `None` for anything else.
    #[must_use]
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != ENCODED_LEN || bytes[0] != TAG {
            return None;
        }
        Some(Self {
            weight: u64::from_le_bytes(bytes[1..9].try_into().ok()?),
            sum: i128::from_le_bytes(bytes[9..25].try_into().ok()?),
            m2: f64::from_le_bytes(bytes[25..33].try_into().ok()?),
        })
    }
}

/// First byte of an encoded [`WeightedStage`].
const STAGE_TAG: u8 = 0x58;

/// A stage per metric: its histograms (values `>= 0`, and magnitudes of values `< 0`, each
/// clamped to the histogram's range) and its [`WeightedMoments`], every value counted
/// `weight` times. The report's per-metric percentiles, mean and standard deviation come
/// from it, through one aggregate, `per_metric(ns, weight)` ([`per_metric_udaf`]), that
/// reads each row once for both.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WeightedStage {
    /// Values `>= 0`, weighted.
    pub pos: HdrCounts,
    /// Magnitudes of values `< 0`, weighted.
    pub neg: HdrCounts,
    /// Weighted mean and second moment.
    pub moments: WeightedMoments,
}

impl WeightedStage {
    /// Adds `(row, value, weight)` rows (weights above 0).
    fn add_rows(&mut self, rows: &[(usize, i64, u64)]) {
        self.moments.add_slice(rows.iter().map(|&(_, v, w)| (v, w)));
        for &(_, v, w) in rows {
            crate::hdr::record_signed(&mut self.pos, &mut self.neg, v, w);
        }
    }

    /// The stage per metric when every message carried `metrics` metrics: the stage's
    /// figures over the same rows with each value counted `metrics` times, which is what
    /// `per_metric(ns, metric_count)` gives, without reading the rows again.
    #[must_use]
    pub fn scaled(stats: &SignedStats, metrics: u64) -> Self {
        if metrics == 0 || stats.count == 0 {
            return Self::default();
        }
        let scale = |h: &HdrCounts| {
            let mut out = HdrCounts::new();
            for (i, n) in h.non_zero() {
                out.add_at(i, n * metrics);
            }
            out
        };
        Self {
            pos: scale(&stats.pos),
            neg: scale(&stats.neg),
            moments: WeightedMoments {
                weight: stats.count * metrics,
                sum: stats.sum * i128::from(metrics),
                m2: stats.m2 * metrics as f64,
            },
        }
    }

    /// Adds `other`'s values.
    pub fn merge(&mut self, other: &Self) {
        self.pos.merge(&other.pos);
        self.neg.merge(&other.neg);
        self.moments.merge(&other.moments);
    }

    /// A binary form, for aggregate states; not for storing.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![STAGE_TAG];
        out.extend(self.moments.encode());
        out.extend(crate::hdr::serialize_signed(&self.pos, &self.neg));
        out
    }

    /// Reads [`Self::encode`]'s bytes; `None` for anything else.
    #[must_use]
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let rest = bytes.strip_prefix(&[STAGE_TAG])?;
        let (moments, hist) = rest.split_at_checked(ENCODED_LEN)?;
        let moments = WeightedMoments::decode(moments)?;
        let (pos, neg) = crate::hdr::deserialize_signed(hist).ok()?;
        Some(Self { pos, neg, moments })
    }
}

/// The rows of a batch as (value, weight) pairs, NULLs and rows outside `filter` left
/// out; an error for a negative weight.
fn rows<'a>(
    values: &'a ArrayRef,
    weights: &'a ArrayRef,
    filter: Option<&'a BooleanArray>,
) -> Result<Vec<(usize, i64, u64)>> {
    let v = values.as_primitive::<Int64Type>();
    let w: &Int64Array = weights.as_primitive::<Int64Type>();
    let mut out = Vec::with_capacity(v.len());
    for i in 0..v.len() {
        if v.is_null(i) || w.is_null(i) || filter.is_some_and(|f| !f.is_valid(i) || !f.value(i)) {
            continue;
        }
        let weight = w.value(i);
        if weight < 0 {
            return exec_err!("per_metric: a weight must not be negative, got {weight}");
        }
        out.push((i, v.value(i), weight as u64));
    }
    Ok(out)
}

/// The `per_metric(ns, weight)` aggregate (not registered in sessions: its result is
/// [`WeightedStage::encode`]'s form, read with [`WeightedStage::decode`]).
#[must_use]
pub fn per_metric_udaf() -> AggregateUDF {
    binary_agg::udaf::<WeightedStage>()
}

impl BinaryState for WeightedStage {
    const NAME: &'static str = "per_metric";
    const STATE: &'static str = "per_metric";
    const GROUPED: bool = true;

    fn coerce(arg_types: &[DataType]) -> Result<Vec<DataType>> {
        coerce_value_and_weight(Self::NAME, arg_types)
    }

    fn update(&mut self, values: &[ArrayRef]) -> Result<()> {
        if let [v, w] = values {
            self.add_rows(&rows(v, w, None)?);
        }
        Ok(())
    }

    fn update_groups(
        groups: &mut [Self],
        values: &[ArrayRef],
        group_indices: &[usize],
        filter: Option<&BooleanArray>,
    ) -> Result<()> {
        for_stretches(values, group_indices, filter, |g, rows| {
            groups[g].add_rows(rows);
        })
    }

    fn merge(&mut self, other: &Self) {
        WeightedStage::merge(self, other);
    }

    fn encode(&self) -> Vec<u8> {
        WeightedStage::encode(self)
    }

    fn decode(bytes: &[u8]) -> Result<Self> {
        WeightedStage::decode(bytes).ok_or_else(|| corrupt(Self::NAME))
    }

    fn allocated_bytes(&self) -> usize {
        self.pos.allocated_bytes() + self.neg.allocated_bytes()
    }
}

/// `(ns, integer weight)`: the value as a duration, the weight as Int64.
fn coerce_value_and_weight(name: &str, arg_types: &[DataType]) -> Result<Vec<DataType>> {
    match arg_types {
        [t, w] if w.is_integer() || *w == DataType::Null => {
            Ok(vec![crate::hdr::coerce_ns(name, t)?, DataType::Int64])
        }
        _ => plan_err!("{name} takes (ns, integer weight)"),
    }
}

/// Calls `add(group, rows)` for each stretch of consecutive counted rows of one group
/// (time buckets are contiguous in a run's files, so stretches are long).
fn for_stretches(
    values: &[ArrayRef],
    group_indices: &[usize],
    filter: Option<&BooleanArray>,
    mut add: impl FnMut(usize, &[(usize, i64, u64)]),
) -> Result<()> {
    let [v, w] = values else {
        return plan_err!("this aggregate takes (ns, integer weight)");
    };
    let r = rows(v, w, filter)?;
    let mut start = 0;
    while start < r.len() {
        let g = group_indices[r[start].0];
        let end = start
            + r[start..]
                .iter()
                .take_while(|&&(i, _, _)| group_indices[i] == g)
                .count();
        add(g, &r[start..end]);
        start = end;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use hoptrace_format::hist::{MAX_TRACKABLE_NS, hdr_index};

    use super::*;

    /// The textbook two-pass figures over the values repeated by their weights.
    fn direct(rows: &[(i64, u64)]) -> (f64, f64) {
        let w: f64 = rows.iter().map(|&(_, w)| w as f64).sum();
        let mean = rows.iter().map(|&(v, w)| v as f64 * w as f64).sum::<f64>() / w;
        let var = rows
            .iter()
            .map(|&(v, w)| w as f64 * (v as f64 - mean).powi(2))
            .sum::<f64>()
            / w;
        (mean, var.sqrt())
    }

    #[test]
    fn slices_and_merges_agree_with_the_direct_figures() {
        // Large values with a small spread, negative ones, zero weights.
        let rows: Vec<(i64, u64)> = (0..10_000_i64)
            .map(|i| {
                (
                    5_000_000_000 + (i * 7919) % 1_000 - 300,
                    u64::try_from(i % 5).unwrap(),
                )
            })
            .chain([(-1_200, 3), (0, 0), (17, 1)])
            .collect();
        let (mean, sd) = direct(&rows);
        let mut whole = WeightedMoments::default();
        whole.add_slice(rows.iter().copied());
        let mut pieces = WeightedMoments::default();
        for chunk in rows.chunks(777) {
            let mut p = WeightedMoments::default();
            p.add_slice(chunk.iter().copied());
            pieces.merge(&WeightedMoments::decode(&p.encode()).unwrap());
        }
        let mut one_by_one = WeightedMoments::default();
        for &(v, w) in &rows {
            one_by_one.add(v, w);
        }
        let weight: u64 = rows.iter().map(|&(_, w)| w).sum();
        for m in [whole, pieces, one_by_one] {
            assert_eq!(m.weight, weight);
            assert!((m.mean_ns().unwrap() - mean).abs() <= 1e-6, "{m:?} {mean}");
            assert!(
                (m.stddev_ns().unwrap() - sd).abs() <= 1e-6 * sd,
                "{m:?} {sd}"
            );
        }
        assert_eq!(whole.sum, pieces.sum);
        assert_eq!(WeightedMoments::default().mean_ns(), None);
        assert_eq!(WeightedMoments::decode(&[TAG, 1, 2]), None);
    }

    /// `per_metric` per group, through the groups accumulator and its partial states,
    /// equals the histograms and moments built row by row (NULLs, zero weights, negative
    /// and out-of-range values included).
    #[test]
    fn per_metric_groups_match_row_by_row() {
        use std::sync::Arc;

        use datafusion::logical_expr::EmitTo;

        let rows: Vec<(usize, Option<i64>, Option<i64>)> = (0..5_000_i64)
            .map(|i| {
                let v = match i % 7 {
                    0 => None,
                    1 => Some(-(i * 13)),
                    2 => Some(i64::MAX),
                    _ => Some(i * 1_009 % 3_000_000),
                };
                let w = if i % 11 == 0 { None } else { Some(i % 5) };
                ((i / 1_000) as usize % 3, v, w)
            })
            .collect();
        let mut want = vec![WeightedStage::default(); 3];
        for &(g, v, w) in &rows {
            if let (Some(v), Some(w)) = (v, w)
                && w > 0
            {
                let w = w as u64;
                want[g].moments.add(v, w);
                let (h, m) = if v >= 0 {
                    (&mut want[g].pos, v as u64)
                } else {
                    (&mut want[g].neg, v.unsigned_abs())
                };
                h.add_at(hdr_index(m.min(MAX_TRACKABLE_NS)), w);
            }
        }
        let mut acc = binary_agg::groups::<WeightedStage>();
        let mut fin = binary_agg::groups::<WeightedStage>();
        for chunk in rows.chunks(333) {
            let v: ArrayRef = Arc::new(Int64Array::from_iter(chunk.iter().map(|r| r.1)));
            let w: ArrayRef = Arc::new(Int64Array::from_iter(chunk.iter().map(|r| r.2)));
            let groups: Vec<usize> = chunk.iter().map(|r| r.0).collect();
            acc.update_batch(&[v, w], &groups, None, 3).unwrap();
        }
        let state = acc.state(EmitTo::All).unwrap();
        fin.merge_batch(&state, &[0, 1, 2], 3).unwrap();
        let got = fin.evaluate(EmitTo::All).unwrap();
        for (g, want) in want.iter().enumerate() {
            let got = WeightedStage::decode(got.as_binary::<i32>().value(g)).unwrap();
            assert_eq!((&got.pos, &got.neg), (&want.pos, &want.neg), "group {g}");
            assert_eq!(got.moments.weight, want.moments.weight);
            assert_eq!(got.moments.sum, want.moments.sum);
            let close = (got.moments.m2 - want.moments.m2).abs() <= 1e-9 * want.moments.m2;
            assert!(close, "{} vs {}", got.moments.m2, want.moments.m2);
        }
    }

    /// With one weight for every row, the stage's figures scaled give what `per_metric`
    /// computes row by row.
    #[test]
    fn scaled_stage_figures_equal_per_metric_with_a_constant_weight() {
        let values: Vec<i64> = (0..20_000_i64)
            .map(|i| match i % 9 {
                0 => -(i * 7),
                1 => 5_000_000_000_000 + i,
                _ => (i * 7_919) % 40_000_000,
            })
            .collect();
        let mut stats = SignedStats::default();
        stats.add_values(&values);
        for metrics in [0_u64, 1, 20, 1_000] {
            let mut want = WeightedStage::default();
            let rows: Vec<(usize, i64, u64)> = values.iter().map(|&v| (0, v, metrics)).collect();
            want.add_rows(&rows);
            let got = WeightedStage::scaled(&stats, metrics);
            assert_eq!((&got.pos, &got.neg), (&want.pos, &want.neg), "{metrics}");
            assert_eq!(
                (got.moments.weight, got.moments.sum),
                (want.moments.weight, want.moments.sum)
            );
            let tolerance = 1e-9 * want.moments.m2.abs();
            assert!((got.moments.m2 - want.moments.m2).abs() <= tolerance);
        }
    }

    /// A negative weight is an error naming the aggregate, not a silent skip.
    #[test]
    fn per_metric_refuses_a_negative_weight() {
        use std::sync::Arc;

        let v: ArrayRef = Arc::new(Int64Array::from(vec![5, 6]));
        let w: ArrayRef = Arc::new(Int64Array::from(vec![1, -1]));
        let e = BinaryState::update(&mut WeightedStage::default(), &[v, w])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("per_metric") && e.contains("must not be negative"),
            "{e}"
        );
    }
}
