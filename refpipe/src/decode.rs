//! What the processor does to a message: decode its payload into metrics, transform
//! them, and append them as rows for the store.
//!
//! Payloads understood (the forms `hoptrace publish` sends, and common UNS shapes):
//! - a JSON batch: `{"timestamp_ms": T, "metrics": [{"name": N, "value": V}, ...]}`;
//!   a metric may carry its own `timestamp_ms`;
//! - a JSON scalar: `{"timestamp_ms": T, "value": V}`;
//! - a bare number as text: `21.53` (timestamped with the arrival time).
//!
//! A metric's series is the topic, plus `/N` for a named metric of a batch.

use std::borrow::Cow;

use arrow::array::{Float64Builder, Int64Builder, StringBuilder};

use crate::wire::{WireError, rows_batch};

/// Why a payload gave no rows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PayloadError {
    /// Not UTF-8.
    #[error("payload is not UTF-8")]
    NotUtf8,
    /// Neither JSON of a known shape nor a number.
    #[error("payload is neither a JSON metric, a JSON batch nor a number: {0}")]
    Unknown(String),
    /// A JSON batch without metrics.
    #[error("payload holds no metrics")]
    Empty,
}

#[derive(serde::Deserialize)]
struct Message<'a> {
    timestamp_ms: Option<i64>,
    value: Option<f64>,
    #[serde(borrow)]
    metrics: Option<Vec<Metric<'a>>>,
}

#[derive(serde::Deserialize)]
struct Metric<'a> {
    #[serde(borrow)]
    name: Cow<'a, str>,
    value: f64,
    timestamp_ms: Option<i64>,
}

/// A linear transform applied to every value (`value * scale + offset`), e.g. a unit
/// conversion; values that are not finite afterwards are dropped and counted.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Transform {
    /// Factor.
    pub scale: f64,
    /// Added after scaling.
    pub offset: f64,
}

impl Default for Transform {
    fn default() -> Self {
        Self {
            scale: 1.0,
            offset: 0.0,
        }
    }
}

/// Rows being gathered for one write to the store.
#[derive(Debug)]
pub struct RowBuilder {
    series: StringBuilder,
    ts_ms: Int64Builder,
    value: Float64Builder,
    name: String,
    rows: usize,
    dropped: u64,
    transform: Transform,
}

impl RowBuilder {
    /// An empty builder.
    #[must_use]
    pub fn new(transform: Transform) -> Self {
        Self {
            series: StringBuilder::new(),
            ts_ms: Int64Builder::new(),
            value: Float64Builder::new(),
            name: String::new(),
            rows: 0,
            dropped: 0,
            transform,
        }
    }

    /// Rows gathered so far.
    #[must_use]
    pub fn len(&self) -> usize {
        self.rows
    }

    /// Whether no rows are gathered.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// Values dropped as not finite after the transform, in total.
    #[must_use]
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Decodes `payload` of a message on `topic` that arrived at `arrival_ms`, appending
    /// its metrics; returns how many rows it added.
    ///
    /// # Errors
    /// [`PayloadError`] when the payload is not a form this processor understands; no
    /// rows are added then.
    pub fn push_payload(
        &mut self,
        topic: &str,
        payload: &[u8],
        arrival_ms: i64,
    ) -> Result<usize, PayloadError> {
        let text = std::str::from_utf8(payload).map_err(|_| PayloadError::NotUtf8)?;
        let trimmed = text.trim_ascii();
        if trimmed.starts_with('{') {
            let m: Message<'_> =
                serde_json::from_str(trimmed).map_err(|e| PayloadError::Unknown(e.to_string()))?;
            let ts = m.timestamp_ms.unwrap_or(arrival_ms);
            match (m.metrics, m.value) {
                (Some(metrics), _) => {
                    if metrics.is_empty() {
                        return Err(PayloadError::Empty);
                    }
                    let before = self.rows;
                    for metric in metrics {
                        self.name.clear();
                        self.name.push_str(topic);
                        self.name.push('/');
                        self.name.push_str(&metric.name);
                        self.push_row(metric.timestamp_ms.unwrap_or(ts), metric.value);
                    }
                    Ok(self.rows - before)
                }
                (None, Some(v)) => {
                    self.name.clear();
                    self.name.push_str(topic);
                    Ok(self.push_row(ts, v))
                }
                (None, None) => Err(PayloadError::Unknown(
                    "JSON without \"value\" or \"metrics\"".into(),
                )),
            }
        } else {
            let v: f64 = trimmed.parse().map_err(|_| {
                PayloadError::Unknown(format!(
                    "{:?}",
                    trimmed.chars().take(40).collect::<String>()
                ))
            })?;
            self.name.clear();
            self.name.push_str(topic);
            Ok(self.push_row(arrival_ms, v))
        }
    }

    /// Appends one row for the series in `self.name`; returns 1, or 0 when dropped.
    fn push_row(&mut self, ts_ms: i64, raw: f64) -> usize {
        let v = raw.mul_add(self.transform.scale, self.transform.offset);
        if !v.is_finite() {
            self.dropped += 1;
            return 0;
        }
        self.series.append_value(&self.name);
        self.ts_ms.append_value(ts_ms);
        self.value.append_value(v);
        self.rows += 1;
        1
    }

    /// Takes the gathered rows as a batch, leaving the builder empty.
    ///
    /// # Errors
    /// Never in practice: the three columns always have one length.
    pub fn finish(&mut self) -> Result<arrow::array::RecordBatch, WireError> {
        self.rows = 0;
        rows_batch(
            self.series.finish(),
            self.ts_ms.finish(),
            self.value.finish(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::AsArray as _;
    use arrow::datatypes::{Float64Type, Int64Type};

    #[test]
    fn batches_scalars_and_numbers() {
        let mut b = RowBuilder::new(Transform::default());
        let batch = br#"{"timestamp_ms":1700000000123,"metrics":[{"name":"m0","value":21.5},{"name":"m1","value":3,"timestamp_ms":5}]}"#;
        assert_eq!(b.push_payload("ent/site/line/cell/t1", batch, 9), Ok(2));
        assert_eq!(
            b.push_payload("a/b", br#"{"timestamp_ms":7,"value":1.25}"#, 9),
            Ok(1)
        );
        assert_eq!(b.push_payload("a/c", b" 42.5\n", 9), Ok(1));
        assert_eq!(b.len(), 4);
        let rows = b.finish().unwrap();
        assert!(b.is_empty());
        let series: Vec<_> = rows.column(0).as_string::<i32>().iter().flatten().collect();
        assert_eq!(
            series,
            [
                "ent/site/line/cell/t1/m0",
                "ent/site/line/cell/t1/m1",
                "a/b",
                "a/c"
            ]
        );
        let ts: Vec<_> = rows.column(1).as_primitive::<Int64Type>().values().to_vec();
        assert_eq!(ts, [1_700_000_000_123, 5, 7, 9]);
        let v: Vec<_> = rows
            .column(2)
            .as_primitive::<Float64Type>()
            .values()
            .to_vec();
        assert_eq!(v, [21.5, 3.0, 1.25, 42.5]);
    }

    #[test]
    fn the_transform_applies_and_drops_what_is_not_finite() {
        let mut b = RowBuilder::new(Transform {
            scale: 10.0,
            offset: 1.0,
        });
        assert_eq!(b.push_payload("t", b"2", 0), Ok(1));
        assert_eq!(b.push_payload("t", b"1e308", 0), Ok(0));
        assert_eq!(b.dropped(), 1);
        let rows = b.finish().unwrap();
        assert_eq!(rows.column(2).as_primitive::<Float64Type>().value(0), 21.0);
    }

    #[test]
    fn garbage_is_named_and_adds_nothing() {
        let mut b = RowBuilder::new(Transform::default());
        assert_eq!(
            b.push_payload("t", &[0xff, 0xfe], 0),
            Err(PayloadError::NotUtf8)
        );
        assert!(matches!(
            b.push_payload("t", b"{\"value\":", 0),
            Err(PayloadError::Unknown(_))
        ));
        assert!(matches!(
            b.push_payload("t", b"{\"x\":1}", 0),
            Err(PayloadError::Unknown(_))
        ));
        assert_eq!(
            b.push_payload("t", br#"{"metrics":[]}"#, 0),
            Err(PayloadError::Empty)
        );
        assert!(matches!(
            b.push_payload("t", b"xxxxxxxx", 0),
            Err(PayloadError::Unknown(_))
        ));
        assert!(b.is_empty());
    }
}
