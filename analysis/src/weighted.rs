//! `weighted_moments(ns, weight)`: the mean and the population standard deviation of a
//! stage with every value counted `weight` times (the metrics its message carried), as a
//! [`WeightedMoments`] in a fixed binary form. The report's per-metric Mean and Std Dev
//! come from it, beside the per-metric percentiles of `hdr_histogram(ns, metric_count)`.
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

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, BinaryArray, BooleanArray, Int64Array};
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Int64Type};
use datafusion::common::{DataFusionError, Result, ScalarValue, exec_err, plan_err};
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, EmitTo, GroupsAccumulator, Signature, Volatility,
};

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
            let d = (i128::from(v) - i128::from(shift)) as f64;
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

fn corrupt() -> DataFusionError {
    DataFusionError::Execution("internal: malformed weighted_moments state".into())
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
            return exec_err!("weighted_moments: a weight must not be negative, got {weight}");
        }
        out.push((i, v.value(i), weight as u64));
    }
    Ok(out)
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct WeightedMomentsAgg {
    signature: Signature,
}

/// The `weighted_moments(ns, weight)` aggregate (not registered in sessions: its result
/// is this module's own encoding, read with [`WeightedMoments::decode`]).
#[must_use]
pub fn weighted_moments_udaf() -> AggregateUDF {
    AggregateUDF::from(WeightedMomentsAgg {
        signature: Signature::user_defined(Volatility::Immutable),
    })
}

impl AggregateUDFImpl for WeightedMomentsAgg {
    fn name(&self) -> &str {
        "weighted_moments"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        match arg_types {
            [t, w] if w.is_integer() || *w == DataType::Null => Ok(vec![
                crate::hdr::coerce_ns(self.name(), t)?,
                DataType::Int64,
            ]),
            _ => plan_err!("weighted_moments takes (ns, integer weight)"),
        }
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Binary)
    }

    fn accumulator(&self, _args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        Ok(Box::new(MomentsAccumulator::default()))
    }

    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        Ok(vec![Arc::new(Field::new(
            format!("{}_moments", args.name),
            DataType::Binary,
            true,
        ))])
    }

    fn groups_accumulator_supported(&self, _args: AccumulatorArgs) -> bool {
        true
    }

    fn create_groups_accumulator(
        &self,
        _args: AccumulatorArgs,
    ) -> Result<Box<dyn GroupsAccumulator>> {
        Ok(Box::new(MomentsGroups::default()))
    }
}

#[derive(Debug, Default)]
struct MomentsAccumulator {
    m: WeightedMoments,
}

impl Accumulator for MomentsAccumulator {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        if let [v, w] = values {
            let r = rows(v, w, None)?;
            self.m.add_slice(r.iter().map(|&(_, v, w)| (v, w)));
        }
        Ok(())
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        Ok(ScalarValue::Binary(Some(self.m.encode())))
    }

    fn size(&self) -> usize {
        std::mem::size_of_val(self)
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        Ok(vec![self.evaluate()?])
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        if let Some(s) = states.first() {
            for bytes in s.as_binary::<i32>().iter().flatten() {
                self.m
                    .merge(&WeightedMoments::decode(bytes).ok_or_else(corrupt)?);
            }
        }
        Ok(())
    }
}

/// `weighted_moments` of every group at once.
#[derive(Debug, Default)]
struct MomentsGroups {
    groups: Vec<WeightedMoments>,
}

impl MomentsGroups {
    fn emit(&mut self, emit_to: EmitTo) -> ArrayRef {
        let taken = emit_to.take_needed(&mut self.groups);
        Arc::new(BinaryArray::from_iter_values(
            taken.iter().map(WeightedMoments::encode),
        ))
    }
}

impl GroupsAccumulator for MomentsGroups {
    fn update_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        opt_filter: Option<&BooleanArray>,
        total_num_groups: usize,
    ) -> Result<()> {
        self.groups
            .resize_with(total_num_groups, WeightedMoments::default);
        let [v, w] = values else {
            return plan_err!("weighted_moments takes (ns, integer weight)");
        };
        let r = rows(v, w, opt_filter)?;
        // Rows of one group come in stretches (time buckets are contiguous in a run's
        // files): each stretch is one slice.
        let mut start = 0;
        while start < r.len() {
            let g = group_indices[r[start].0];
            let end = start
                + r[start..]
                    .iter()
                    .take_while(|&&(i, _, _)| group_indices[i] == g)
                    .count();
            self.groups[g].add_slice(r[start..end].iter().map(|&(_, v, w)| (v, w)));
            start = end;
        }
        Ok(())
    }

    fn evaluate(&mut self, emit_to: EmitTo) -> Result<ArrayRef> {
        Ok(self.emit(emit_to))
    }

    fn state(&mut self, emit_to: EmitTo) -> Result<Vec<ArrayRef>> {
        Ok(vec![self.emit(emit_to)])
    }

    fn merge_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        total_num_groups: usize,
    ) -> Result<()> {
        self.groups
            .resize_with(total_num_groups, WeightedMoments::default);
        let Some(states) = values.first() else {
            return Ok(());
        };
        for (bytes, &g) in states.as_binary::<i32>().iter().zip(group_indices) {
            if let Some(bytes) = bytes {
                self.groups[g].merge(&WeightedMoments::decode(bytes).ok_or_else(corrupt)?);
            }
        }
        Ok(())
    }

    fn convert_to_state(
        &self,
        values: &[ArrayRef],
        opt_filter: Option<&BooleanArray>,
    ) -> Result<Vec<ArrayRef>> {
        let [v, w] = values else {
            return plan_err!("weighted_moments takes (ns, integer weight)");
        };
        let mut states = vec![WeightedMoments::default(); v.len()];
        for (i, v, w) in rows(v, w, opt_filter)? {
            states[i].add(v, w);
        }
        Ok(vec![Arc::new(BinaryArray::from_iter_values(
            states.iter().map(WeightedMoments::encode),
        ))])
    }

    fn size(&self) -> usize {
        self.groups.capacity() * std::mem::size_of::<WeightedMoments>()
    }
}

#[cfg(test)]
mod tests {
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
}
