//! The Arrow schemas of a run's Parquet files (`docs/dataset.md`): `traces/part-*.parquet`
//! and `clock.parquet`. `probes.parquet` has one column per counter a probe sent, so its
//! schema is the data's own.

use std::sync::Arc;

use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};

fn ts() -> DataType {
    DataType::Timestamp(TimeUnit::Nanosecond, None)
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

/// The column of a trace's stamp at hop `hop`: `<hop>_ns`.
#[must_use]
pub fn hop_column(hop: &str) -> String {
    format!("{hop}_ns")
}

/// The column holding a stage's deltas in the `traces` view: `<slug>_ns`.
#[must_use]
pub fn stage_column(stage: &str) -> String {
    format!("{}_ns", slug(stage))
}

/// The columns of a polled stage's bounds in the `traces` view: its deltas at the earliest
/// and at the latest instants the polled stamps allow, `<slug>_lower_ns` and
/// `<slug>_upper_ns` (`PipelineSpec::stage_bound`).
#[must_use]
pub fn stage_bound_columns(stage: &str) -> (String, String) {
    let slug = slug(stage);
    (format!("{slug}_lower_ns"), format!("{slug}_upper_ns"))
}

/// The schema of a traces file for these hops (in the spec's order).
#[must_use]
pub fn traces_schema(hop_names: &[String]) -> SchemaRef {
    let mut fields = vec![
        Field::new("run_id", DataType::Utf8, false),
        Field::new("publisher", DataType::UInt16, false),
        Field::new("stream", DataType::UInt32, false),
        Field::new("sequence", DataType::UInt64, false),
        Field::new("metric_count", DataType::UInt32, false),
        Field::new("intended_ns", ts(), false),
    ];
    fields.extend(
        hop_names
            .iter()
            .map(|h| Field::new(hop_column(h), ts(), true)),
    );
    fields.extend([
        Field::new("status", DataType::Utf8, false),
        Field::new("missing_mask", DataType::UInt16, false),
        Field::new("flags", DataType::UInt8, false),
        Field::new("otel_trace_id", DataType::FixedSizeBinary(16), true),
    ]);
    Arc::new(Schema::new(fields))
}

/// The schema of `clock.parquet`: one row per clock status a probe sent.
#[must_use]
pub fn clock_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("host", DataType::Utf8, false),
        Field::new("instance_id", DataType::UInt64, false),
        Field::new("at_ns", ts(), false),
        Field::new("source", DataType::Utf8, false),
        Field::new("synced", DataType::Boolean, false),
        Field::new("offset_ns", DataType::Int64, false),
        Field::new("error_bound_ns", DataType::UInt64, false),
        Field::new("leap", DataType::Utf8, false),
        Field::new("detail", DataType::Utf8, false),
    ]))
}
