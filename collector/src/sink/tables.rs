//! The run's small tables: `clock.parquet` (every clock status each probe host sent) and
//! `probes.parquet` (every Counters frame of every probe: its counters over time).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use arrow::array::{
    ArrayRef, BooleanArray, Int64Array, RecordBatch, StringArray, TimestampNanosecondArray,
    UInt64Array,
};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use hoptrace_protocol::counter_id;

use crate::writer::{WriteError, write_table};
use hoptrace_format::run::ClockRow;

/// One Counters frame of one probe.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct CounterRow {
    /// Exporter instance.
    pub instance_id: u64,
    /// Probe host.
    pub host: String,
    /// Probe process.
    pub process: String,
    /// When the probe read its counters (Unix ns).
    pub at_ns: i64,
    /// (counter id, value), cumulative.
    pub values: Vec<(u16, u64)>,
}

fn ts() -> DataType {
    DataType::Timestamp(TimeUnit::Nanosecond, None)
}

/// Writes `clock.parquet`.
///
/// # Errors
/// [`WriteError`] when the file cannot be written.
pub fn write_clock(path: &Path, rows: &[ClockRow]) -> Result<(), WriteError> {
    let schema = hoptrace_format::schema::clock_schema();
    let cols: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(rows.iter().map(|r| &r.host))),
        Arc::new(UInt64Array::from_iter_values(
            rows.iter().map(|r| r.instance_id),
        )),
        Arc::new(TimestampNanosecondArray::from_iter_values(
            rows.iter().map(|r| r.at_ns),
        )),
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| &r.source),
        )),
        Arc::new(BooleanArray::from_iter(rows.iter().map(|r| Some(r.synced)))),
        Arc::new(Int64Array::from_iter_values(
            rows.iter().map(|r| r.offset_ns),
        )),
        Arc::new(UInt64Array::from_iter_values(
            rows.iter().map(|r| r.error_bound_ns),
        )),
        Arc::new(StringArray::from_iter_values(rows.iter().map(|r| &r.leap))),
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| &r.detail),
        )),
    ];
    write_table(path, &RecordBatch::try_new(schema, cols)?)
}

/// Writes `probes.parquet`: one row per Counters frame, one column per counter (known
/// counters by name, unknown ones as `counter_<id>`).
///
/// # Errors
/// [`WriteError`] when the file cannot be written.
pub fn write_probes(path: &Path, rows: &[CounterRow]) -> Result<(), WriteError> {
    let mut ids: Vec<u16> = (counter_id::REPORTED..=counter_id::BAD_TRACEPARENT).collect();
    for r in rows {
        for (id, _) in &r.values {
            if !ids.contains(id) {
                ids.push(*id);
            }
        }
    }
    let mut fields = vec![
        Field::new("instance_id", DataType::UInt64, false),
        Field::new("host", DataType::Utf8, false),
        Field::new("process", DataType::Utf8, false),
        Field::new("at_ns", ts(), false),
    ];
    let mut cols: Vec<ArrayRef> = vec![
        Arc::new(UInt64Array::from_iter_values(
            rows.iter().map(|r| r.instance_id),
        )),
        Arc::new(StringArray::from_iter_values(rows.iter().map(|r| &r.host))),
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| &r.process),
        )),
        Arc::new(TimestampNanosecondArray::from_iter_values(
            rows.iter().map(|r| r.at_ns),
        )),
    ];
    for id in ids {
        let name = counter_id::name(id).map_or_else(|| format!("counter_{id}"), str::to_owned);
        fields.push(Field::new(name, DataType::UInt64, true));
        let values: BTreeMap<usize, u64> = rows
            .iter()
            .enumerate()
            .filter_map(|(i, r)| {
                r.values
                    .iter()
                    .find(|(k, _)| *k == id)
                    .map(|(_, v)| (i, *v))
            })
            .collect();
        cols.push(Arc::new(UInt64Array::from_iter(
            (0..rows.len()).map(|i| values.get(&i).copied()),
        )));
    }
    write_table(
        path,
        &RecordBatch::try_new(Arc::new(Schema::new(fields)), cols)?,
    )
}
