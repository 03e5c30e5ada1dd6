//! HdrHistogram aggregates for SQL.
//!
//! | function | returns |
//! | --- | --- |
//! | `hdr_histogram(ns)` | Binary: the values' histogram, serialized (HdrHistogram V2 format) |
//! | `hdr_merge(hist)` | Binary: the merge of serialized histograms (per run, per cell, ...) |
//! | `hdr_percentile(ns, q)` | Int64: the value at quantile `q`, the middle of its bucket |
//! | `hdr_precision(ns, q)` | Int64: half that bucket's width; the exact value is within ± this |
//! | `hdr_value_at(hist, q)` / `hdr_precision_at(hist, q)` / `hdr_count(hist)` | the same, of a serialized histogram (scalar) |
//!
//! Every histogram tracks 1 ns to 1 hour at 3 significant digits (the collector's
//! histograms, [`hoptrace_collector::stages::new_histogram`]). Values are nanoseconds.
//! Negative values (stage deltas below zero, from clock error) cannot be recorded: they
//! are left out, and a query counts them with `count(*) FILTER (WHERE d < 0)`. Values
//! above an hour are clamped to an hour. NULLs are ignored.
//!
//! The quantile of `n` values is the value of rank `max(1, ceil(q * n))` in ascending
//! order (as HdrHistogram computes it, and as DuckDB's `quantile_disc` does), reported as
//! the middle of the HDR bucket that holds it.

use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BinaryArray, BinaryBuilder, Float64Array, Int64Array, Int64Builder,
};
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Int64Type};
use datafusion::common::{DataFusionError, Result, ScalarValue, exec_err, plan_err};
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, ColumnarValue, ScalarFunctionArgs, ScalarUDF,
    ScalarUDFImpl, Signature, Volatility,
};
use datafusion::physical_expr::expressions::Literal;
use datafusion::prelude::SessionContext;
use hdrhistogram::Histogram;
use hdrhistogram::serialization::{Deserializer, Serializer as _, V2Serializer};
use hoptrace_collector::stages::{MAX_TRACKABLE_NS, new_histogram};

/// Significant digits of the layout [`HdrCounts`] shares with [`new_histogram`].
const DIGITS: u32 = hoptrace_collector::stages::SIGNIFICANT_DIGITS as u32;
/// log2 of the sub-buckets per bucket: the smallest power of two holding every integer
/// below 2 × 10^digits (single-unit resolution up to there).
const SUB_BUCKET_MAGNITUDE: u32 = (2 * 10_u64.pow(DIGITS) - 1).ilog2() + 1;
/// log2 of half the sub-buckets: every bucket but the first uses its upper half only.
const HALF_MAGNITUDE: u32 = SUB_BUCKET_MAGNITUDE - 1;
/// Values below this share bucket 0, one index per value.
const SUB_BUCKET_MASK: u64 = (1 << SUB_BUCKET_MAGNITUDE) - 1;
/// Leading zeros of the largest value of bucket 0, subtracted to find a value's bucket.
const LEADING_ZERO_BASE: u32 = 64 - SUB_BUCKET_MAGNITUDE;
/// Length of the counts of a full histogram (up to [`MAX_TRACKABLE_NS`]).
pub const HDR_LEN: usize = hdr_index(MAX_TRACKABLE_NS) + 1;

/// The index of `value` in the counts of a histogram of the project's layout (lowest
/// discernible value 1, [`MAX_TRACKABLE_NS`], 3 significant digits): the same bucket the
/// `hdrhistogram` crate records it in. `value` must not exceed [`MAX_TRACKABLE_NS`].
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

/// Adds each of `values` (>= 0, clamped to [`MAX_TRACKABLE_NS`]) to its bucket of `counts`,
/// which must reach the largest one's.
#[inline(always)]
fn count_into_portable(counts: &mut [u64], values: &[i64]) {
    for &v in values {
        counts[hdr_index((v as u64).min(MAX_TRACKABLE_NS))] += 1;
    }
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

    /// Adds the counts of a histogram of the project's layout (e.g. [`deserialize`]d).
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
}

/// Registers every HDR function of this module in `ctx`.
pub fn register(ctx: &SessionContext) {
    ctx.register_udaf(AggregateUDF::from(HdrAgg::new(Output::Histogram)));
    ctx.register_udaf(AggregateUDF::from(HdrAgg::new(Output::Merge)));
    ctx.register_udaf(AggregateUDF::from(HdrAgg::new(Output::Percentile)));
    ctx.register_udaf(AggregateUDF::from(HdrAgg::new(Output::Precision)));
    ctx.register_udf(ScalarUDF::from(HdrScalar::new(ScalarKind::ValueAt)));
    ctx.register_udf(ScalarUDF::from(HdrScalar::new(ScalarKind::PrecisionAt)));
    ctx.register_udf(ScalarUDF::from(HdrScalar::new(ScalarKind::Count)));
}

/// Serializes `h` in the HdrHistogram V2 format (uncompressed).
#[must_use]
pub fn serialize(h: &Histogram<u64>) -> Vec<u8> {
    let mut out = Vec::new();
    V2Serializer::new()
        .serialize(h, &mut out)
        .expect("serializing into a Vec cannot fail");
    out
}

/// Reads a histogram written by [`serialize`] (or any V2 / V2-deflate histogram).
///
/// # Errors
/// When `bytes` is not a serialized histogram.
pub fn deserialize(bytes: &[u8]) -> Result<Histogram<u64>> {
    let mut r = bytes;
    let h: Histogram<u64> = Deserializer::new()
        .deserialize(&mut r)
        .map_err(|e| DataFusionError::Execution(format!("not a serialized HdrHistogram: {e}")))?;
    // Widen to the project's range so merges of any inputs never fail.
    let mut wide = new_histogram();
    wide.add(&h)
        .map_err(|e| DataFusionError::Execution(format!("histogram out of range: {e:?}")))?;
    Ok(wide)
}

/// The value reported for quantile `q`: the middle of the bucket holding it.
#[must_use]
pub fn value_at(h: &Histogram<u64>, q: f64) -> u64 {
    h.median_equivalent(h.value_at_quantile(q))
}

/// Half the width of the bucket holding quantile `q`: the exact value is within ± this.
#[must_use]
pub fn precision_at(h: &Histogram<u64>, q: f64) -> u64 {
    h.equivalent_range(h.value_at_quantile(q)) / 2
}

/// Records every non-negative, non-null value of an Int64 array (each clamped to
/// [`MAX_TRACKABLE_NS`]).
fn record_all(counts: &mut HdrCounts, values: &Int64Array) {
    let mut add = |v: i64| {
        if let Ok(v) = u64::try_from(v) {
            counts.record(v);
        }
    };
    if values.null_count() == 0 {
        values.values().iter().copied().for_each(&mut add);
    } else {
        values.iter().flatten().for_each(add);
    }
}

fn merge_all(h: &mut Histogram<u64>, states: &BinaryArray) -> Result<()> {
    for bytes in states.iter().flatten() {
        let other = deserialize(bytes)?;
        h.add(&other)
            .map_err(|e| DataFusionError::Execution(format!("merging histograms: {e:?}")))?;
    }
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Output {
    Histogram,
    Merge,
    Percentile,
    Precision,
}

/// The four aggregate functions; they share one accumulator.
#[derive(Debug, PartialEq, Eq, Hash)]
struct HdrAgg {
    output: Output,
    signature: Signature,
}

impl HdrAgg {
    fn new(output: Output) -> Self {
        Self {
            output,
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

/// Types a latency argument may have: integers and durations, read as Int64 ns.
pub(crate) fn coerce_ns(name: &str, t: &DataType) -> Result<DataType> {
    match t {
        DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::UInt8
        | DataType::UInt16
        | DataType::UInt32
        | DataType::UInt64
        | DataType::Null => Ok(DataType::Int64),
        DataType::Duration(_) => Ok(DataType::Int64),
        other => plan_err!(
            "{name} takes nanoseconds as an integer or a duration, not {other} \
             (subtract two `<hop>_ns` columns, or use a `<stage>_ns` column)"
        ),
    }
}

fn coerce_q(name: &str, t: &DataType) -> Result<DataType> {
    if t.is_numeric() || *t == DataType::Null {
        Ok(DataType::Float64)
    } else {
        plan_err!("{name}: the quantile must be a number between 0 and 1, not {t}")
    }
}

/// The quantile argument of a call: a literal between 0 and 1.
fn literal_quantile(name: &str, args: &AccumulatorArgs) -> Result<f64> {
    let Some(expr) = args.exprs.get(1) else {
        return plan_err!("{name}(ns, q) needs a quantile");
    };
    let Some(lit) = expr.downcast_ref::<Literal>() else {
        return plan_err!("{name}: the quantile must be a constant, e.g. 0.99");
    };
    let q = match lit.value().clone() {
        ScalarValue::Float64(Some(q)) => q,
        ScalarValue::Float32(Some(q)) => f64::from(q),
        ScalarValue::Int64(Some(q)) => q as f64,
        other => return plan_err!("{name}: the quantile must be a number, not {other}"),
    };
    check_quantile(name, q)
}

fn check_quantile(name: &str, q: f64) -> Result<f64> {
    if (0.0..=1.0).contains(&q) {
        Ok(q)
    } else {
        plan_err!("{name}: quantile {q} is outside 0..=1")
    }
}

impl AggregateUDFImpl for HdrAgg {
    fn name(&self) -> &str {
        match self.output {
            Output::Histogram => "hdr_histogram",
            Output::Merge => "hdr_merge",
            Output::Percentile => "hdr_percentile",
            Output::Precision => "hdr_precision",
        }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        let name = self.name();
        match (self.output, arg_types) {
            (Output::Histogram, [t]) => Ok(vec![coerce_ns(name, t)?]),
            (Output::Merge, [DataType::Binary | DataType::LargeBinary | DataType::BinaryView]) => {
                Ok(vec![DataType::Binary])
            }
            (Output::Merge, [t]) => plan_err!("hdr_merge takes a serialized histogram, not {t}"),
            (Output::Percentile | Output::Precision, [t, q]) => {
                Ok(vec![coerce_ns(name, t)?, coerce_q(name, q)?])
            }
            (Output::Percentile | Output::Precision, _) => {
                plan_err!("{name} takes two arguments: (ns, quantile)")
            }
            _ => plan_err!("{name} takes one argument"),
        }
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(match self.output {
            Output::Histogram | Output::Merge => DataType::Binary,
            Output::Percentile | Output::Precision => DataType::Int64,
        })
    }

    fn accumulator(&self, acc_args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        let quantile = match self.output {
            Output::Percentile | Output::Precision => {
                Some(literal_quantile(self.name(), &acc_args)?)
            }
            Output::Histogram | Output::Merge => None,
        };
        Ok(Box::new(HdrAccumulator {
            h: new_histogram(),
            recorded: HdrCounts::new(),
            output: self.output,
            quantile,
        }))
    }

    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        Ok(vec![Arc::new(Field::new(
            format!("{}_hdr", args.name),
            DataType::Binary,
            true,
        ))])
    }
}

#[derive(Debug)]
struct HdrAccumulator {
    /// Histograms merged in, and values recorded so far once [`HdrAccumulator::flush`]ed.
    h: Histogram<u64>,
    /// Values recorded since the last flush.
    recorded: HdrCounts,
    output: Output,
    quantile: Option<f64>,
}

impl HdrAccumulator {
    /// Moves the recorded values into `h`.
    fn flush(&mut self) {
        for (i, n) in self.recorded.non_zero() {
            self.h
                .record_n(hdr_value(i), n)
                .expect("every index below HDR_LEN is within the histogram's range");
        }
        self.recorded = HdrCounts::new();
    }
}

impl Accumulator for HdrAccumulator {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        let Some(v) = values.first() else {
            return Ok(());
        };
        if self.output == Output::Merge {
            return merge_all(&mut self.h, v.as_binary::<i32>());
        }
        record_all(&mut self.recorded, v.as_primitive::<Int64Type>());
        Ok(())
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        self.flush();
        let q = self.quantile.unwrap_or(0.5);
        let value = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        Ok(match self.output {
            Output::Histogram | Output::Merge => ScalarValue::Binary(Some(serialize(&self.h))),
            _ if self.h.is_empty() => ScalarValue::Int64(None),
            Output::Percentile => ScalarValue::Int64(Some(value(value_at(&self.h, q)))),
            Output::Precision => ScalarValue::Int64(Some(value(precision_at(&self.h, q)))),
        })
    }

    fn size(&self) -> usize {
        std::mem::size_of_val(self) + self.h.distinct_values() * 8 + self.recorded.allocated_bytes()
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        self.flush();
        Ok(vec![ScalarValue::Binary(Some(serialize(&self.h)))])
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        match states.first() {
            Some(s) => merge_all(&mut self.h, s.as_binary::<i32>()),
            None => Ok(()),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum ScalarKind {
    ValueAt,
    PrecisionAt,
    Count,
}

/// Scalar functions over serialized histograms.
#[derive(Debug, PartialEq, Eq, Hash)]
struct HdrScalar {
    kind: ScalarKind,
    signature: Signature,
}

impl HdrScalar {
    fn new(kind: ScalarKind) -> Self {
        Self {
            kind,
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for HdrScalar {
    fn name(&self) -> &str {
        match self.kind {
            ScalarKind::ValueAt => "hdr_value_at",
            ScalarKind::PrecisionAt => "hdr_precision_at",
            ScalarKind::Count => "hdr_count",
        }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        let name = self.name();
        let bin = |t: &DataType| match t {
            DataType::Binary | DataType::LargeBinary | DataType::BinaryView | DataType::Null => {
                Ok(DataType::Binary)
            }
            other => plan_err!("{name} takes a serialized histogram (hdr_histogram), not {other}"),
        };
        match (self.kind, arg_types) {
            (ScalarKind::Count, [h]) => Ok(vec![bin(h)?]),
            (ScalarKind::ValueAt | ScalarKind::PrecisionAt, [h, q]) => {
                Ok(vec![bin(h)?, coerce_q(name, q)?])
            }
            _ => plan_err!("{name}: wrong number of arguments"),
        }
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Int64)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let rows = args.number_rows;
        let arrays = ColumnarValue::values_to_arrays(&args.args)?;
        let hists = arrays[0].as_binary::<i32>();
        let qs: Option<&Float64Array> = arrays.get(1).map(|a| a.as_primitive());
        let mut out = Int64Builder::with_capacity(rows);
        for i in 0..rows {
            if hists.is_null(i) || qs.is_some_and(|q| q.is_null(i)) {
                out.append_null();
                continue;
            }
            let h = deserialize(hists.value(i))?;
            let v = match self.kind {
                ScalarKind::Count => h.len(),
                _ if h.is_empty() => {
                    out.append_null();
                    continue;
                }
                kind => {
                    let q = check_quantile(self.name(), qs.map_or(0.5, |q| q.value(i)))?;
                    if kind == ScalarKind::ValueAt {
                        value_at(&h, q)
                    } else {
                        precision_at(&h, q)
                    }
                }
            };
            out.append_value(i64::try_from(v).unwrap_or(i64::MAX));
        }
        let array: ArrayRef = Arc::new(out.finish());
        if rows == 1
            && args
                .args
                .iter()
                .all(|a| matches!(a, ColumnarValue::Scalar(_)))
        {
            return Ok(ColumnarValue::Scalar(ScalarValue::try_from_array(
                &array, 0,
            )?));
        }
        Ok(ColumnarValue::Array(array))
    }
}

/// Builds a Binary array of serialized histograms (for tests and tables).
#[must_use]
pub fn binary_array(hists: &[Histogram<u64>]) -> BinaryArray {
    let mut b = BinaryBuilder::new();
    for h in hists {
        b.append_value(serialize(h));
    }
    b.finish()
}

/// The histogram in a Binary scalar (`hdr_histogram`'s result).
///
/// # Errors
/// When the value is not a serialized histogram.
pub fn from_scalar(v: &ScalarValue) -> Result<Histogram<u64>> {
    match v {
        ScalarValue::Binary(Some(b))
        | ScalarValue::LargeBinary(Some(b))
        | ScalarValue::BinaryView(Some(b)) => deserialize(b),
        ScalarValue::Binary(None) | ScalarValue::Null => Ok(new_histogram()),
        other => exec_err!("expected a serialized histogram, got {other}"),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Values across the whole range: every value up to 5000, then every power of two
    /// and its neighbours, then a geometric sweep with odd steps, up to the top.
    fn sweep() -> Vec<u64> {
        let mut v: Vec<u64> = (0..5_000).collect();
        for s in 0..42 {
            let p = 1_u64 << s;
            v.extend(
                [p - 1, p, p + 1]
                    .into_iter()
                    .filter(|&x| x <= MAX_TRACKABLE_NS),
            );
        }
        let mut x = 5_000_f64;
        while x < MAX_TRACKABLE_NS as f64 {
            v.push(x as u64);
            x *= 1.000_37;
        }
        v.extend([MAX_TRACKABLE_NS - 1, MAX_TRACKABLE_NS]);
        v
    }

    #[test]
    fn the_layout_is_the_hdrhistogram_crates() {
        let h = new_histogram();
        assert!(HDR_LEN <= h.distinct_values(), "{HDR_LEN}");
        for (n, v) in sweep().into_iter().enumerate() {
            let i = hdr_index(v);
            assert!(i < HDR_LEN, "{v}");
            assert_eq!(hdr_value(i), h.lowest_equivalent(v), "lowest of {v}");
            assert_eq!(
                hdr_value(i + 1) - 1,
                h.highest_equivalent(v),
                "highest of {v}"
            );
            // One value alone (some of them): the crate puts it in the same bucket.
            if n % 61 != 0 {
                continue;
            }
            let mut one = new_histogram();
            one.record(v).unwrap();
            let mut counts = HdrCounts::new();
            counts.record(v);
            assert_eq!(counts.to_histogram(), one, "{v}");
        }
    }

    #[test]
    fn indices_and_values_invert() {
        for i in 0..HDR_LEN {
            assert_eq!(hdr_index(hdr_value(i)), i);
        }
    }

    #[test]
    fn values_above_the_range_are_clamped_as_the_aggregate_did() {
        let mut h = new_histogram();
        let mut c = HdrCounts::new();
        for v in [MAX_TRACKABLE_NS + 1, u64::MAX, 7] {
            h.saturating_record(v.min(MAX_TRACKABLE_NS));
            c.record(v);
        }
        assert_eq!(c.to_histogram(), h);
        let mut batch = HdrCounts::new();
        batch.record_non_negative(&[i64::MAX, 7, MAX_TRACKABLE_NS as i64 + 1], i64::MAX);
        assert_eq!(batch, c);
    }

    proptest! {
        #[test]
        fn counts_convert_to_the_same_histogram(
            values in prop::collection::vec(
                prop_oneof![0_u64..3_000, 0_u64..10_000_000, 0_u64..=MAX_TRACKABLE_NS],
                1..400,
            ),
            split in 0_usize..400,
        ) {
            let mut h = new_histogram();
            let (mut a, mut b) = (HdrCounts::new(), HdrCounts::new());
            for (n, &v) in values.iter().enumerate() {
                h.record(v).unwrap();
                if n < split { a.record(v) } else { b.record(v) }
            }
            a.merge(&b);
            let converted = a.to_histogram();
            prop_assert_eq!(a.len(), values.len() as u64);
            for q in [0.0, 0.01, 0.25, 0.5, 0.9, 0.95, 0.99, 0.999, 0.9999, 1.0] {
                prop_assert_eq!(value_at(&converted, q), value_at(&h, q));
                prop_assert_eq!(precision_at(&converted, q), precision_at(&h, q));
            }
            prop_assert_eq!((converted.min(), converted.max()), (h.min(), h.max()));
            prop_assert_eq!(&converted, &h);
            // And back again, through the serialized form the SQL functions use.
            let mut back = HdrCounts::new();
            back.add_histogram(&deserialize(&serialize(&converted)).unwrap());
            prop_assert_eq!(back, a);
        }
    }
}
