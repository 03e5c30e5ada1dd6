//! HdrHistogram aggregates for SQL.
//!
//! | function | returns |
//! | --- | --- |
//! | `hdr_histogram(ns [, weight])` | Binary: the values' histogram, serialized (see below) |
//! | `hdr_merge(hist)` | Binary: the merge of serialized histograms (per run, per cell, ...) |
//! | `hdr_percentile(ns, q [, weight])` | Int64: the value at quantile `q`, the middle of its bucket |
//! | `hdr_precision(ns, q [, weight])` | Int64: half that bucket's width; the exact value is within ± this |
//! | `hdr_floor(ns, q [, weight])` | Int64: the lowest value of that bucket: the values at or above it are the tail the report attributes (every value the percentile can stand for) |
//! | `hdr_value_at(hist, q)` / `hdr_precision_at(hist, q)` / `hdr_count(hist)` | the same, of a serialized histogram (scalar) |
//!
//! Every histogram has the layout of [`hoptrace_format::hist`]: 1 ns to 1 hour at 3
//! significant digits; values are nanoseconds, magnitudes above an hour are clamped to an
//! hour, NULLs are ignored. **Negative values count**: a stage delta below zero (a later
//! hop's clock behind an earlier one's) is a value like any other, so `hdr_count(hdr_histogram(d))`
//! equals `count(d)` and the percentiles rank every value, as `quantile_disc` does.
//!
//! **Weighted.** With a `weight` (an integer column, e.g. `metric_count`), each value
//! counts `weight` times, as if its row were repeated: `hdr_percentile(total_ingestion_ns,
//! 0.99, metric_count)` is the P99 over metrics, every trace weighted by the metrics its
//! message carried, and `hdr_count(hdr_histogram(d, metric_count))` is `sum(metric_count)`
//! over the rows where `d` is not NULL. A row whose weight is NULL or 0 counts nothing; a
//! negative weight is an error.
//!
//! The quantile of `n` values is the value of rank `max(1, ceil(q * n))` in ascending
//! order (as HdrHistogram computes it, and as DuckDB's `quantile_disc` does), reported as
//! the middle of the HDR bucket that holds it (negated for a negative value).
//!
//! **Never outside what was measured.** The middle of the bucket holding the lowest or
//! the highest value can lie below the exact minimum or above the exact maximum. Every
//! percentile these functions return is kept within the exact minimum and maximum of the
//! values it ranks (the exact value lies in both, so it stays within its precision), as
//! every percentile hoptrace reports is (`docs/dataset.md`). A histogram read from
//! elsewhere, without hoptrace's trailer below, has no exact extremes: its percentiles
//! are the bucket middles.
//!
//! **Serialized form.** The histogram of the values `>= 0` in HdrHistogram's V2 encoding
//! (readable by HdrHistogram's own libraries), followed, only when some values were
//! negative, by a second V2 histogram of the *magnitudes* of the negative values, then,
//! when the exact extremes are known, a trailer: the 4 bytes `HTX1`, the exact minimum and
//! the exact maximum (i64 little-endian each). A reader that knows only V2 reads the first
//! histogram: the non-negative values.

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
pub use hoptrace_format::hist::{HDR_LEN, HdrCounts, hdr_index, hdr_value};
use hoptrace_format::hist::{MAX_TRACKABLE_NS, Percentile, new_histogram, signed_percentile};

/// Registers every HDR function of this module in `ctx`.
pub fn register(ctx: &SessionContext) {
    ctx.register_udaf(AggregateUDF::from(HdrAgg::new(Output::Histogram)));
    ctx.register_udaf(AggregateUDF::from(HdrAgg::new(Output::Merge)));
    ctx.register_udaf(AggregateUDF::from(HdrAgg::new(Output::Percentile)));
    ctx.register_udaf(AggregateUDF::from(HdrAgg::new(Output::Precision)));
    ctx.register_udaf(floor_udaf());
    ctx.register_udf(ScalarUDF::from(HdrScalar::new(ScalarKind::ValueAt)));
    ctx.register_udf(ScalarUDF::from(HdrScalar::new(ScalarKind::PrecisionAt)));
    ctx.register_udf(ScalarUDF::from(HdrScalar::new(ScalarKind::Count)));
}

/// `hdr_floor(ns, q)`: the lowest value of the HDR bucket of percentile `q`.
#[must_use]
pub fn floor_udaf() -> AggregateUDF {
    AggregateUDF::from(HdrAgg::new(Output::Floor))
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

/// The serialized form of the values of two histograms (`pos` of the values `>= 0`,
/// `neg` of the magnitudes of the values `< 0`): `pos` in V2, then `neg` in V2 when it
/// holds any value.
#[must_use]
pub fn serialize_signed(pos: &HdrCounts, neg: &HdrCounts) -> Vec<u8> {
    serialize_with(pos, neg, Extremes::None)
}

/// [`serialize_signed`]'s form with the exact extremes of the values as its trailer
/// when they are known.
#[must_use]
pub fn serialize_with(pos: &HdrCounts, neg: &HdrCounts, extremes: Extremes) -> Vec<u8> {
    let mut out = serialize(&pos.to_histogram());
    if !neg.is_empty() {
        out.extend(serialize(&neg.to_histogram()));
    }
    if let Extremes::Exact(min, max) = extremes {
        out.extend_from_slice(EXTREMES_TAG);
        out.extend_from_slice(&min.to_le_bytes());
        out.extend_from_slice(&max.to_le_bytes());
    }
    out
}

/// The first bytes of the serialized form's trailer (no V2 cookie starts so).
const EXTREMES_TAG: &[u8; 4] = b"HTX1";

/// What is known of the exact smallest and largest value a histogram counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Extremes {
    /// No value yet.
    None,
    /// The exact minimum and maximum.
    Exact(i64, i64),
    /// Values whose extremes were not kept (a histogram from elsewhere was merged in).
    Unknown,
}

impl Extremes {
    /// The extremes of these and of `other`'s values.
    #[must_use]
    pub fn merge(self, other: Self) -> Self {
        match (self, other) {
            (Self::None, x) | (x, Self::None) => x,
            (Self::Exact(a, b), Self::Exact(c, d)) => Self::Exact(a.min(c), b.max(d)),
            _ => Self::Unknown,
        }
    }

    /// These extremes and the value `v`.
    #[must_use]
    pub fn with(self, v: i64) -> Self {
        self.merge(Self::Exact(v, v))
    }

    /// The percentile kept within the exact extremes, when they are known.
    #[must_use]
    pub fn bound(self, p: Percentile) -> Percentile {
        match self {
            Self::Exact(min, max) => p.within(min, max),
            _ => p,
        }
    }
}

/// Reads one histogram (V2 or V2-deflate) from the front of `r`, widened to the project's
/// range so merges of any inputs never fail.
fn read_one(r: &mut &[u8]) -> Result<Histogram<u64>> {
    let h: Histogram<u64> = Deserializer::new()
        .deserialize(r)
        .map_err(|e| DataFusionError::Execution(format!("not a serialized HdrHistogram: {e}")))?;
    let mut wide = new_histogram();
    wide.add(&h)
        .map_err(|e| DataFusionError::Execution(format!("histogram out of range: {e:?}")))?;
    Ok(wide)
}

/// Reads the histogram of the values `>= 0` of a serialized histogram (any V2 or
/// V2-deflate histogram, or the first part of [`serialize_signed`]'s form).
///
/// # Errors
/// When `bytes` is not a serialized histogram.
pub fn deserialize(bytes: &[u8]) -> Result<Histogram<u64>> {
    read_one(&mut &bytes[..])
}

/// Reads [`serialize_signed`]'s form (or any single V2 histogram, which has no negative
/// values): the counts of the values `>= 0` and of the magnitudes of the values `< 0`.
///
/// # Errors
/// When `bytes` is not such a form.
pub fn deserialize_signed(bytes: &[u8]) -> Result<(HdrCounts, HdrCounts)> {
    deserialize_with(bytes).map(|(pos, neg, _)| (pos, neg))
}

/// Reads [`serialize_with`]'s form (or any single V2 histogram): the counts of the values
/// `>= 0`, of the magnitudes of the values `< 0`, and the exact extremes (unknown for a
/// histogram with values and no trailer).
///
/// # Errors
/// When `bytes` is not such a form.
pub fn deserialize_with(bytes: &[u8]) -> Result<(HdrCounts, HdrCounts, Extremes)> {
    let mut r = bytes;
    let (mut pos, mut neg) = (HdrCounts::new(), HdrCounts::new());
    pos.add_histogram(&read_one(&mut r)?);
    if !r.is_empty() && !r.starts_with(EXTREMES_TAG) {
        neg.add_histogram(&read_one(&mut r)?);
    }
    let mut extremes = if pos.is_empty() && neg.is_empty() {
        Extremes::None
    } else {
        Extremes::Unknown
    };
    if let Some(t) = r.strip_prefix(EXTREMES_TAG) {
        let Some((min, rest)) = t.split_first_chunk::<8>() else {
            return exec_err!("a serialized hoptrace histogram's trailer is cut short");
        };
        let Some((max, rest)) = rest.split_first_chunk::<8>() else {
            return exec_err!("a serialized hoptrace histogram's trailer is cut short");
        };
        let (min, max) = (i64::from_le_bytes(*min), i64::from_le_bytes(*max));
        if min > max {
            return exec_err!(
                "a serialized hoptrace histogram's trailer has its minimum {min} above its maximum {max}"
            );
        }
        extremes = Extremes::Exact(min, max);
        r = rest;
    }
    if !r.is_empty() {
        return exec_err!(
            "a serialized hoptrace histogram holds at most two HdrHistograms and their extremes; {} bytes follow",
            r.len()
        );
    }
    Ok((pos, neg, extremes))
}

/// The value reported for quantile `q` of the values `>= 0` in `h`: the middle of the
/// bucket holding it.
#[must_use]
pub fn value_at(h: &Histogram<u64>, q: f64) -> u64 {
    h.median_equivalent(h.value_at_quantile(q))
}

/// Half the width of the bucket holding quantile `q`: the exact value is within ± this.
#[must_use]
pub fn precision_at(h: &Histogram<u64>, q: f64) -> u64 {
    h.equivalent_range(h.value_at_quantile(q)) / 2
}

/// The extremes `e` and those of the non-null values of `values`.
fn extremes_of(e: Extremes, values: &Int64Array) -> Extremes {
    match (
        datafusion::arrow::compute::min(values),
        datafusion::arrow::compute::max(values),
    ) {
        (Some(min), Some(max)) => e.merge(Extremes::Exact(min, max)),
        _ => e,
    }
}

/// Records every non-null value of an Int64 array: values `>= 0` into `pos`, the
/// magnitudes of the others into `neg` (each clamped to [`MAX_TRACKABLE_NS`]).
fn record_all(pos: &mut HdrCounts, neg: &mut HdrCounts, values: &Int64Array) {
    let mut add = |v: i64| {
        if v >= 0 {
            pos.record(v as u64);
        } else {
            neg.record(v.unsigned_abs());
        }
    };
    if values.null_count() == 0 {
        values.values().iter().copied().for_each(&mut add);
    } else {
        values.iter().flatten().for_each(add);
    }
}

/// As [`record_all`], each value counted `weights[i]` times; rows with a NULL value or
/// weight are skipped.
fn record_weighted(
    pos: &mut HdrCounts,
    neg: &mut HdrCounts,
    extremes: &mut Extremes,
    values: &Int64Array,
    weights: &Int64Array,
) -> Result<()> {
    for (v, w) in values.iter().zip(weights.iter()) {
        let (Some(v), Some(w)) = (v, w) else {
            continue;
        };
        let Ok(n) = u64::try_from(w) else {
            return exec_err!("a weight must not be negative, got {w}");
        };
        if n > 0 {
            *extremes = extremes.with(v);
        }
        record_signed(pos, neg, v, n);
    }
    Ok(())
}

/// Counts `v` `n` times: into `pos` when `>= 0`, its magnitude into `neg` otherwise,
/// clamped to [`MAX_TRACKABLE_NS`].
#[inline]
pub(crate) fn record_signed(pos: &mut HdrCounts, neg: &mut HdrCounts, v: i64, n: u64) {
    if n == 0 {
        return;
    }
    let (counts, magnitude) = if v >= 0 {
        (pos, v as u64)
    } else {
        (neg, v.unsigned_abs())
    };
    counts.add_at(hdr_index(magnitude.min(MAX_TRACKABLE_NS)), n);
}

fn merge_all(
    pos: &mut HdrCounts,
    neg: &mut HdrCounts,
    extremes: &mut Extremes,
    states: &BinaryArray,
) -> Result<()> {
    for bytes in states.iter().flatten() {
        let (p, n, e) = deserialize_with(bytes)?;
        pos.merge(&p);
        neg.merge(&n);
        *extremes = extremes.merge(e);
    }
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Output {
    Histogram,
    Merge,
    Percentile,
    Precision,
    Floor,
}

/// The five aggregate functions; they share one accumulator.
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

/// Types a weight may have: integers, read as Int64.
fn coerce_weight(name: &str, t: &DataType) -> Result<DataType> {
    if t.is_integer() || *t == DataType::Null {
        Ok(DataType::Int64)
    } else {
        plan_err!("{name}: the weight must be an integer (e.g. metric_count), not {t}")
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
            Output::Floor => "hdr_floor",
        }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        let name = self.name();
        match (self.output, arg_types) {
            (Output::Histogram, [t]) => Ok(vec![coerce_ns(name, t)?]),
            (Output::Histogram, [t, w]) => Ok(vec![coerce_ns(name, t)?, coerce_weight(name, w)?]),
            (Output::Merge, [DataType::Binary | DataType::LargeBinary | DataType::BinaryView]) => {
                Ok(vec![DataType::Binary])
            }
            (Output::Merge, [t]) => plan_err!("hdr_merge takes a serialized histogram, not {t}"),
            (Output::Percentile | Output::Precision | Output::Floor, [t, q]) => {
                Ok(vec![coerce_ns(name, t)?, coerce_q(name, q)?])
            }
            (Output::Percentile | Output::Precision | Output::Floor, [t, q, w]) => Ok(vec![
                coerce_ns(name, t)?,
                coerce_q(name, q)?,
                coerce_weight(name, w)?,
            ]),
            (Output::Percentile | Output::Precision | Output::Floor, _) => {
                plan_err!("{name} takes (ns, quantile) or (ns, quantile, weight)")
            }
            (Output::Histogram, _) => plan_err!("{name} takes (ns) or (ns, weight)"),
            (Output::Merge, _) => plan_err!("{name} takes one argument"),
        }
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(match self.output {
            Output::Histogram | Output::Merge => DataType::Binary,
            Output::Percentile | Output::Precision | Output::Floor => DataType::Int64,
        })
    }

    fn accumulator(&self, acc_args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        let quantile = match self.output {
            Output::Percentile | Output::Precision | Output::Floor => {
                Some(literal_quantile(self.name(), &acc_args)?)
            }
            Output::Histogram | Output::Merge => None,
        };
        Ok(Box::new(HdrAccumulator {
            pos: HdrCounts::new(),
            neg: HdrCounts::new(),
            extremes: Extremes::None,
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
    /// Values >= 0.
    pos: HdrCounts,
    /// Magnitudes of values < 0.
    neg: HdrCounts,
    /// The exact extremes of the values counted.
    extremes: Extremes,
    output: Output,
    quantile: Option<f64>,
}

/// The percentile (or its precision) as an Int64 scalar; NULL without values.
fn percentile_scalar(p: Option<Percentile>, precision: bool) -> ScalarValue {
    ScalarValue::Int64(p.map(|p| {
        if precision {
            i64::try_from(p.precision_ns).unwrap_or(i64::MAX)
        } else {
            p.value_ns
        }
    }))
}

impl Accumulator for HdrAccumulator {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        let Some(v) = values.first() else {
            return Ok(());
        };
        if self.output == Output::Merge {
            return merge_all(
                &mut self.pos,
                &mut self.neg,
                &mut self.extremes,
                v.as_binary::<i32>(),
            );
        }
        let ns = v.as_primitive::<Int64Type>();
        // The weight, when given, is the last argument: after the value, or after the
        // value and the quantile.
        let weight_at = match self.output {
            Output::Histogram => 1,
            _ => 2,
        };
        match values.get(weight_at) {
            Some(w) => record_weighted(
                &mut self.pos,
                &mut self.neg,
                &mut self.extremes,
                ns,
                w.as_primitive::<Int64Type>(),
            ),
            None => {
                self.extremes = extremes_of(self.extremes, ns);
                record_all(&mut self.pos, &mut self.neg, ns);
                Ok(())
            }
        }
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        let q = self.quantile.unwrap_or(0.5);
        let p = || signed_percentile(&self.pos, &self.neg, q).map(|p| self.extremes.bound(p));
        Ok(match self.output {
            Output::Histogram | Output::Merge => {
                ScalarValue::Binary(Some(serialize_with(&self.pos, &self.neg, self.extremes)))
            }
            Output::Percentile => percentile_scalar(p(), false),
            Output::Precision => percentile_scalar(p(), true),
            // The bucket's own bounds: not moved within the extremes.
            Output::Floor => ScalarValue::Int64(
                signed_percentile(&self.pos, &self.neg, q).map(crate::tail::bucket_floor),
            ),
        })
    }

    fn size(&self) -> usize {
        std::mem::size_of_val(self) + self.pos.allocated_bytes() + self.neg.allocated_bytes()
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        Ok(vec![ScalarValue::Binary(Some(serialize_with(
            &self.pos,
            &self.neg,
            self.extremes,
        )))])
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        match states.first() {
            Some(s) => merge_all(
                &mut self.pos,
                &mut self.neg,
                &mut self.extremes,
                s.as_binary::<i32>(),
            ),
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
            let (pos, neg, extremes) = deserialize_with(hists.value(i))?;
            let v = match self.kind {
                ScalarKind::Count => i64::try_from(pos.len() + neg.len()).unwrap_or(i64::MAX),
                kind => {
                    let q = check_quantile(self.name(), qs.map_or(0.5, |q| q.value(i)))?;
                    let Some(p) = signed_percentile(&pos, &neg, q).map(|p| extremes.bound(p))
                    else {
                        out.append_null();
                        continue;
                    };
                    if kind == ScalarKind::ValueAt {
                        p.value_ns
                    } else {
                        i64::try_from(p.precision_ns).unwrap_or(i64::MAX)
                    }
                }
            };
            out.append_value(v);
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

    /// Runs `sql` over `t(d Int64, w UInt32)` holding `rows` in two partitions, and over
    /// `r(d)` holding each row's `d` repeated `w` times; the first row's columns.
    fn weighted_and_repeated(rows: &[(Option<i64>, Option<u32>)], sql: &str) -> Vec<ScalarValue> {
        use datafusion::arrow::array::{RecordBatch, UInt32Array};
        use datafusion::arrow::datatypes::Schema;
        use datafusion::datasource::MemTable;
        use datafusion::prelude::SessionConfig;

        let schema = Arc::new(Schema::new(vec![
            Field::new("d", DataType::Int64, true),
            Field::new("w", DataType::UInt32, true),
        ]));
        let batch = |rows: &[(Option<i64>, Option<u32>)]| {
            RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(Int64Array::from_iter(rows.iter().map(|r| r.0))),
                    Arc::new(UInt32Array::from_iter(rows.iter().map(|r| r.1))),
                ],
            )
            .unwrap()
        };
        let (a, b) = rows.split_at(rows.len() / 2);
        let t = MemTable::try_new(schema.clone(), vec![vec![batch(a)], vec![batch(b)]]).unwrap();
        let repeated: Vec<Option<i64>> = rows
            .iter()
            .flat_map(|&(d, w)| std::iter::repeat_n(d, w.unwrap_or(0) as usize))
            .collect();
        let r_schema = Arc::new(Schema::new(vec![Field::new("d", DataType::Int64, true)]));
        let r_batch = RecordBatch::try_new(
            r_schema.clone(),
            vec![Arc::new(Int64Array::from_iter(repeated))],
        )
        .unwrap();
        let r = MemTable::try_new(r_schema, vec![vec![r_batch]]).unwrap();
        let ctx = SessionContext::new_with_config(SessionConfig::new().with_target_partitions(2));
        ctx.register_table("t", Arc::new(t)).unwrap();
        ctx.register_table("r", Arc::new(r)).unwrap();
        register(&ctx);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let batches = rt
            .block_on(async { ctx.sql(sql).await?.collect().await })
            .unwrap();
        let b = &batches[0];
        (0..b.num_columns())
            .map(|i| ScalarValue::try_from_array(b.column(i), 0).unwrap())
            .collect()
    }

    #[test]
    fn a_weighted_value_counts_as_that_many_rows() {
        // Values of both signs and wide magnitudes, weights 0 to 100 and some NULLs.
        let rows: Vec<(Option<i64>, Option<u32>)> = (0..3_000_i64)
            .map(|i| {
                let x = (i * 2_654_435_761) % 50_000_017;
                let d = (i % 41 != 0).then_some(x - 1_000_000);
                let w = (i % 53 != 0).then_some(((i * 7919) % 101) as u32);
                (d, w)
            })
            .collect();
        let mut q = String::from("SELECT ");
        for (k, p) in [0.0, 0.25, 0.5, 0.9, 0.99, 0.999, 1.0].iter().enumerate() {
            q.push_str(&format!(
                "(SELECT hdr_percentile(d, {p}, w) FROM t) AS w{k}, \
                 (SELECT hdr_percentile(d, {p}) FROM r) AS r{k}, \
                 (SELECT hdr_precision(d, {p}, w) FROM t) AS wp{k}, \
                 (SELECT hdr_precision(d, {p}) FROM r) AS rp{k}, "
            ));
        }
        q.push_str(
            "(SELECT hdr_count(hdr_histogram(d, w)) FROM t) AS wn, \
             (SELECT count(d) FROM r) AS rn, \
             (SELECT CAST(sum(w) AS BIGINT) FROM t WHERE d IS NOT NULL) AS sw, \
             (SELECT hdr_histogram(d, w) = (SELECT hdr_histogram(d) FROM r) FROM t) AS same",
        );
        let v = weighted_and_repeated(&rows, &q);
        for pair in v[..28].chunks(2) {
            assert!(matches!(pair[0], ScalarValue::Int64(Some(_))), "{pair:?}");
            assert_eq!(pair[0], pair[1]);
        }
        assert_eq!(v[28], v[29]);
        assert_eq!(v[28], v[30]);
        assert_eq!(v[31], ScalarValue::Boolean(Some(true)));
        // Weighting moves the percentiles: one heavy value outweighs many light ones.
        let skewed = [
            (Some(1_000), Some(1)),
            (Some(2_000), Some(1)),
            (Some(9_000_000), Some(98)),
        ];
        let v = weighted_and_repeated(
            &skewed,
            "SELECT hdr_percentile(d, 0.5, w), hdr_percentile(d, 0.5) FROM t",
        );
        assert_eq!(v[0], ScalarValue::Int64(Some(hdr_mid(9_000_000))));
        assert_eq!(v[1], ScalarValue::Int64(Some(hdr_mid(2_000))));
    }

    #[test]
    fn sql_percentiles_never_leave_the_exact_min_and_max() {
        // 1,190,968 lies low in a bucket 1,024 ns wide whose middle is 1,191,424; -700,001
        // lies in a bucket of magnitudes 512 ns wide whose middle is beyond it.
        let rows = [
            (Some(400_000), Some(1)),
            (Some(-700_001), Some(1)),
            (Some(1_190_968), Some(2)),
            (Some(900_000), Some(1)),
        ];
        assert_eq!(hdr_mid(1_190_968), 1_191_424);
        let v = weighted_and_repeated(
            &rows,
            "SELECT hdr_percentile(d, 1.0), hdr_percentile(d, 0.0), hdr_percentile(d, 1.0, w),              (SELECT hdr_value_at(hdr_merge(h), 1.0) FROM (SELECT hdr_histogram(d) AS h FROM t GROUP BY d > 0)),              hdr_value_at(hdr_histogram(d), 0.0), hdr_precision(d, 1.0) FROM t",
        );
        assert_eq!(
            v,
            [1_190_968, -700_001, 1_190_968, 1_190_968, -700_001, 512]
                .map(|x| ScalarValue::Int64(Some(x)))
        );
        // A histogram from elsewhere (plain V2, no extremes) gives its bucket middle.
        let mut h = new_histogram();
        h.record(1_190_968).unwrap();
        let (pos, neg, e) = deserialize_with(&serialize(&h)).unwrap();
        assert_eq!(e, Extremes::Unknown);
        let p = signed_percentile(&pos, &neg, 1.0).unwrap();
        assert_eq!(e.bound(p).value_ns, 1_191_424);
        // The trailer is read back, and checked.
        let bytes = serialize_with(&pos, &neg, Extremes::Exact(1_190_968, 1_190_968));
        assert_eq!(
            deserialize_with(&bytes).unwrap().2,
            Extremes::Exact(1_190_968, 1_190_968)
        );
        assert!(deserialize_with(&bytes[..bytes.len() - 3]).is_err());
        let mut swapped = serialize_with(&pos, &neg, Extremes::Exact(5, 1));
        assert!(deserialize_with(&swapped).is_err());
        swapped.push(0);
        assert!(deserialize_with(&swapped).is_err());
    }

    fn hdr_mid(v: u64) -> i64 {
        let h = new_histogram();
        h.median_equivalent(v) as i64
    }

    #[test]
    fn weights_must_be_integers_and_not_negative() {
        let rows = [(Some(5), Some(1)), (Some(6), Some(2))];
        let ctx = SessionContext::new();
        register(&ctx);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let err = |sql: &str| {
            rt.block_on(async { ctx.sql(sql).await?.collect().await })
                .unwrap_err()
                .to_string()
        };
        let e = err("SELECT hdr_percentile(d, 0.5, w) FROM (VALUES (5, -1)) AS t(d, w)");
        assert!(e.contains("must not be negative"), "{e}");
        let e = err("SELECT hdr_histogram(d, w) FROM (VALUES (5, 1.5)) AS t(d, w)");
        assert!(e.contains("must be an integer"), "{e}");
        let e = err("SELECT hdr_percentile(d, 0.5, w, w) FROM (VALUES (5, 1)) AS t(d, w)");
        assert!(e.contains("(ns, quantile, weight)"), "{e}");
        // Unweighted and weighted by 1 agree.
        let v = weighted_and_repeated(
            &rows,
            "SELECT hdr_percentile(d, 0.9, 1), hdr_percentile(d, 0.9) FROM t",
        );
        assert_eq!(v[0], v[1]);
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
