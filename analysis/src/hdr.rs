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

/// Records every non-negative, non-null value of an Int64 array.
fn record_all(h: &mut Histogram<u64>, values: &Int64Array) {
    let mut add = |v: i64| {
        if let Ok(v) = u64::try_from(v) {
            h.saturating_record(v.min(MAX_TRACKABLE_NS));
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
fn coerce_ns(name: &str, t: &DataType) -> Result<DataType> {
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
    h: Histogram<u64>,
    output: Output,
    quantile: Option<f64>,
}

impl Accumulator for HdrAccumulator {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        let Some(v) = values.first() else {
            return Ok(());
        };
        if self.output == Output::Merge {
            return merge_all(&mut self.h, v.as_binary::<i32>());
        }
        record_all(&mut self.h, v.as_primitive::<Int64Type>());
        Ok(())
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
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
        std::mem::size_of_val(self) + self.h.distinct_values() * 8
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
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
