//! Capture and replay: `hoptrace record` writes what a broker delivers (topic, key,
//! payload, user properties or headers, arrival time) to a Parquet file; `hoptrace
//! publish --replay` reads it back ([`read_capture`]) and sends it again with the original
//! inter-arrival timing, scaled.
//!
//! The file has one row per message:
//!
//! | column | type | meaning |
//! | --- | --- | --- |
//! | `topic` | utf8 | MQTT topic or Kafka topic |
//! | `key` | binary, nullable | Kafka record key |
//! | `payload` | binary | the payload as received |
//! | `header_keys` | list of utf8 | MQTT 5 user property or Kafka header names, in order |
//! | `header_values` | list of binary | their values |
//! | `arrival_ns` | int64 | CLOCK_REALTIME at arrival in the recorder, ns since the Unix epoch |
//! | `broker_timestamp_ms` | int64, nullable | Kafka record timestamp, ms since the Unix epoch |
//! | `log_append_time` | bool, nullable | whether that timestamp is the broker's LogAppendTime |

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

use arrow::array::{
    Array, ArrayRef, AsArray as _, BinaryBuilder, BooleanBuilder, Int64Builder, ListBuilder,
    RecordBatch, StringBuilder,
};
use arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef};
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;

use hoptrace_broker::target::{self, BrokerTime, Received, TargetError};
use hoptrace_broker::url::Endpoint;

/// Rows per record batch (and row group flush unit) while recording.
const BATCH_ROWS: usize = 8192;

/// Why a capture could not be written or read. Each variant says what to check.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// The file cannot be created, opened or written: check the path and permissions.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The Parquet or Arrow layer failed: the file is not a capture, or is damaged.
    #[error("{path}: {detail}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What failed.
        detail: String,
    },
    /// The broker cannot be used: see the message.
    #[error(transparent)]
    Target(#[from] TargetError),
}

/// One captured message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapturedMessage {
    /// MQTT topic or Kafka topic.
    pub topic: String,
    /// Kafka record key.
    pub key: Option<Vec<u8>>,
    /// Payload as received.
    pub payload: Vec<u8>,
    /// User properties or headers, in order.
    pub headers: Vec<(String, Vec<u8>)>,
    /// Arrival in the recorder, CLOCK_REALTIME ns.
    pub arrival_ns: i64,
    /// Kafka record timestamp, ms.
    pub broker_timestamp_ms: Option<i64>,
    /// Whether that timestamp is LogAppendTime.
    pub log_append_time: Option<bool>,
}

impl From<Received> for CapturedMessage {
    fn from(r: Received) -> Self {
        let (ts, lat) = match r.broker_time {
            Some(BrokerTime::CreateTimeMs(ms)) => (Some(ms), Some(false)),
            Some(BrokerTime::LogAppendTimeMs(ms)) => (Some(ms), Some(true)),
            None => (None, None),
        };
        Self {
            headers: r.meta.pairs(),
            topic: r.topic,
            key: r.key,
            payload: r.payload,
            arrival_ns: r.arrival_ns,
            broker_timestamp_ms: ts,
            log_append_time: lat,
        }
    }
}

/// The capture file's schema.
#[must_use]
pub fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("topic", DataType::Utf8, false),
        Field::new("key", DataType::Binary, true),
        Field::new("payload", DataType::Binary, false),
        Field::new(
            "header_keys",
            DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))),
            false,
        ),
        Field::new(
            "header_values",
            DataType::List(Arc::new(Field::new("item", DataType::Binary, true))),
            false,
        ),
        Field::new("arrival_ns", DataType::Int64, false),
        Field::new("broker_timestamp_ms", DataType::Int64, true),
        Field::new("log_append_time", DataType::Boolean, true),
    ]))
}

/// Writes captured messages to a Parquet file, in batches.
pub struct CaptureWriter {
    path: PathBuf,
    writer: ArrowWriter<File>,
    pending: Vec<CapturedMessage>,
    rows: u64,
}

impl std::fmt::Debug for CaptureWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaptureWriter")
            .field("path", &self.path)
            .field("rows", &self.rows)
            .finish_non_exhaustive()
    }
}

impl CaptureWriter {
    /// Creates (or truncates) `path`.
    ///
    /// # Errors
    /// [`CaptureError::Io`] or [`CaptureError::Format`].
    pub fn create(path: impl Into<PathBuf>) -> Result<Self, CaptureError> {
        let path = path.into();
        let file = File::create(&path).map_err(|source| CaptureError::Io {
            path: path.clone(),
            source,
        })?;
        let props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::try_new(1).unwrap_or_default()))
            .build();
        let writer = ArrowWriter::try_new(file, schema(), Some(props)).map_err(|e| {
            CaptureError::Format {
                path: path.clone(),
                detail: e.to_string(),
            }
        })?;
        Ok(Self {
            path,
            writer,
            pending: Vec::with_capacity(BATCH_ROWS),
            rows: 0,
        })
    }

    /// Adds one message.
    ///
    /// # Errors
    /// [`CaptureError::Format`] when a batch cannot be written.
    pub fn push(&mut self, m: CapturedMessage) -> Result<(), CaptureError> {
        self.pending.push(m);
        if self.pending.len() >= BATCH_ROWS {
            self.flush_batch()?;
        }
        Ok(())
    }

    /// Rows written or pending.
    #[must_use]
    pub fn rows(&self) -> u64 {
        self.rows + self.pending.len() as u64
    }

    fn flush_batch(&mut self) -> Result<(), CaptureError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let batch = to_batch(&self.pending).map_err(|detail| CaptureError::Format {
            path: self.path.clone(),
            detail,
        })?;
        self.writer
            .write(&batch)
            .map_err(|e| CaptureError::Format {
                path: self.path.clone(),
                detail: e.to_string(),
            })?;
        self.rows += self.pending.len() as u64;
        self.pending.clear();
        Ok(())
    }

    /// Writes what is pending and the file footer.
    ///
    /// # Errors
    /// [`CaptureError::Format`].
    pub fn finish(mut self) -> Result<u64, CaptureError> {
        self.flush_batch()?;
        self.writer.close().map_err(|e| CaptureError::Format {
            path: self.path.clone(),
            detail: e.to_string(),
        })?;
        Ok(self.rows)
    }
}

fn to_batch(rows: &[CapturedMessage]) -> Result<RecordBatch, String> {
    let mut topic = StringBuilder::new();
    let mut key = BinaryBuilder::new();
    let mut payload = BinaryBuilder::new();
    let mut hk = ListBuilder::new(StringBuilder::new());
    let mut hv = ListBuilder::new(BinaryBuilder::new());
    let mut arrival = Int64Builder::with_capacity(rows.len());
    let mut ts = Int64Builder::with_capacity(rows.len());
    let mut lat = BooleanBuilder::with_capacity(rows.len());
    for r in rows {
        topic.append_value(&r.topic);
        key.append_option(r.key.as_deref());
        payload.append_value(&r.payload);
        for (k, v) in &r.headers {
            hk.values().append_value(k);
            hv.values().append_value(v);
        }
        hk.append(true);
        hv.append(true);
        arrival.append_value(r.arrival_ns);
        ts.append_option(r.broker_timestamp_ms);
        lat.append_option(r.log_append_time);
    }
    let columns: Vec<ArrayRef> = vec![
        Arc::new(topic.finish()),
        Arc::new(key.finish()),
        Arc::new(payload.finish()),
        Arc::new(hk.finish()),
        Arc::new(hv.finish()),
        Arc::new(arrival.finish()),
        Arc::new(ts.finish()),
        Arc::new(lat.finish()),
    ];
    RecordBatch::try_new(schema(), columns).map_err(|e| e.to_string())
}

/// Writes `messages` to a new capture file at `path`.
///
/// # Errors
/// As [`CaptureWriter`].
pub fn write_capture(path: &Path, messages: &[CapturedMessage]) -> Result<u64, CaptureError> {
    let mut w = CaptureWriter::create(path)?;
    for m in messages {
        w.push(m.clone())?;
    }
    w.finish()
}

/// Reads every message of a capture file, in file order.
///
/// # Errors
/// [`CaptureError::Io`] when the file cannot be opened, [`CaptureError::Format`] when it
/// is not a capture.
pub fn read_capture(path: &Path) -> Result<Vec<CapturedMessage>, CaptureError> {
    let bad = |detail: String| CaptureError::Format {
        path: path.to_owned(),
        detail,
    };
    let file = File::open(path).map_err(|source| CaptureError::Io {
        path: path.to_owned(),
        source,
    })?;
    let reader = ParquetRecordBatchReaderBuilder::try_new(file)
        .and_then(|b| b.build())
        .map_err(|e| bad(e.to_string()))?;
    let mut out = Vec::new();
    for batch in reader {
        let batch = batch.map_err(|e| bad(e.to_string()))?;
        let col = |name: &str| {
            batch
                .column_by_name(name)
                .cloned()
                .ok_or_else(|| bad(format!("not a capture file: no column {name:?}")))
        };
        let (topic, key, payload, hk, hv, arrival, ts, lat) = (
            col("topic")?,
            col("key")?,
            col("payload")?,
            col("header_keys")?,
            col("header_values")?,
            col("arrival_ns")?,
            col("broker_timestamp_ms")?,
            col("log_append_time")?,
        );
        let check = |a: &ArrayRef, t: &DataType, name: &str| {
            if a.data_type() == t {
                Ok(())
            } else {
                Err(bad(format!(
                    "column {name:?} is {:?}, expected {t:?}",
                    a.data_type()
                )))
            }
        };
        check(&topic, &DataType::Utf8, "topic")?;
        check(&key, &DataType::Binary, "key")?;
        check(&payload, &DataType::Binary, "payload")?;
        check(&arrival, &DataType::Int64, "arrival_ns")?;
        check(&ts, &DataType::Int64, "broker_timestamp_ms")?;
        check(&lat, &DataType::Boolean, "log_append_time")?;
        if !matches!(hk.data_type(), DataType::List(_))
            || !matches!(hv.data_type(), DataType::List(_))
        {
            return Err(bad("header columns are not lists".into()));
        }
        let (topic, key, payload) = (
            topic.as_string::<i32>(),
            key.as_binary::<i32>(),
            payload.as_binary::<i32>(),
        );
        let (hk, hv) = (hk.as_list::<i32>(), hv.as_list::<i32>());
        let (arrival, ts, lat) = (
            arrival.as_primitive::<Int64Type>(),
            ts.as_primitive::<Int64Type>(),
            lat.as_boolean(),
        );
        for i in 0..batch.num_rows() {
            let keys = hk.value(i);
            let values = hv.value(i);
            let (Some(keys), Some(values)) =
                (keys.as_string_opt::<i32>(), values.as_binary_opt::<i32>())
            else {
                return Err(bad("header lists hold the wrong types".into()));
            };
            if keys.len() != values.len() {
                return Err(bad(format!(
                    "row {i}: {} header names but {} values",
                    keys.len(),
                    values.len()
                )));
            }
            out.push(CapturedMessage {
                topic: topic.value(i).to_owned(),
                key: key.is_valid(i).then(|| key.value(i).to_vec()),
                payload: payload.value(i).to_vec(),
                headers: (0..keys.len())
                    .map(|j| (keys.value(j).to_owned(), values.value(j).to_vec()))
                    .collect(),
                arrival_ns: arrival.value(i),
                broker_timestamp_ms: ts.is_valid(i).then(|| ts.value(i)),
                log_append_time: lat.is_valid(i).then(|| lat.value(i)),
            });
        }
    }
    Ok(out)
}

/// What to record: [`RecordConfig::new`], then set what differs from its defaults.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RecordConfig {
    /// The broker.
    pub source: Endpoint,
    /// MQTT topic filters or Kafka topics (empty: `#`, or the address's Kafka topics).
    pub topics: Vec<String>,
    /// The capture file to write.
    pub out: PathBuf,
    /// Stop after this long.
    pub duration: Option<Duration>,
    /// Stop after this many messages.
    pub max_messages: Option<u64>,
}

impl RecordConfig {
    /// Records every topic of `source` (`#`, or the address's Kafka topics) into `out`
    /// until stopped.
    #[must_use]
    pub fn new(source: Endpoint, out: impl Into<PathBuf>) -> Self {
        Self {
            source,
            topics: Vec::new(),
            out: out.into(),
            duration: None,
            max_messages: None,
        }
    }
}

/// What a recording wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordSummary {
    /// The broker, without credentials.
    pub source: String,
    /// The capture file.
    pub out: PathBuf,
    /// Messages written.
    pub messages: u64,
    /// Payload bytes written.
    pub payload_bytes: u64,
    /// How long the recorder ran, ns (monotonic).
    pub elapsed_ns: u64,
}

/// Subscribes and writes every message to the capture file until `shutdown` is set, the
/// duration passes or `max_messages` were written.
///
/// # Errors
/// [`CaptureError`]: the broker, or the file.
pub fn record(config: &RecordConfig, shutdown: &AtomicBool) -> Result<RecordSummary, CaptureError> {
    let mut source = target::open_source(&config.source, &config.topics, "record")?;
    record_from(source.as_mut(), config, shutdown)
}

/// As [`record`], from a source already subscribed (so a caller can publish only once
/// the recorder is ready).
///
/// # Errors
/// [`CaptureError`]: the broker, or the file.
pub fn record_from(
    source: &mut dyn target::Source,
    config: &RecordConfig,
    shutdown: &AtomicBool,
) -> Result<RecordSummary, CaptureError> {
    let mut w = CaptureWriter::create(&config.out)?;
    let started = Instant::now();
    let deadline = config.duration.map(|d| started + d);
    let mut bytes = 0u64;
    let mut failure = None;
    while !shutdown.load(Relaxed)
        && deadline.is_none_or(|d| Instant::now() < d)
        && config.max_messages.is_none_or(|m| w.rows() < m)
    {
        match source.recv(Duration::from_millis(100)) {
            Ok(Some(m)) => {
                bytes += m.payload.len() as u64;
                w.push(m.into())?;
            }
            Ok(None) => {}
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    source.close();
    let messages = w.finish()?;
    if let Some(e) = failure {
        return Err(e.into());
    }
    Ok(RecordSummary {
        source: source.describe(),
        out: config.out.clone(),
        messages,
        payload_bytes: bytes,
        elapsed_ns: started.elapsed().as_nanos() as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capture_round_trips() {
        let dir = std::env::temp_dir().join(format!(
            "hoptrace-capture-{}-{}",
            std::process::id(),
            hoptrace_probe::clock::realtime_ns()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.parquet");
        let msgs: Vec<CapturedMessage> = (0..20_000i64)
            .map(|i| CapturedMessage {
                topic: format!("plant/line-{}/t", i % 7),
                key: (i % 2 == 0).then(|| vec![i as u8]),
                payload: format!("{{\"v\":{i}}}").into_bytes(),
                headers: (0..(i % 3))
                    .map(|j| (format!("h{j}"), vec![j as u8, 0xFF]))
                    .collect(),
                arrival_ns: 1_700_000_000_000_000_000 + i * 1000,
                broker_timestamp_ms: (i % 5 == 0).then_some(1_700_000_000_000 + i),
                log_append_time: (i % 5 == 0).then_some(i % 10 == 0),
            })
            .collect();
        assert_eq!(write_capture(&path, &msgs).unwrap(), 20_000);
        assert_eq!(read_capture(&path).unwrap(), msgs);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_file_that_is_not_a_capture_is_refused() {
        let path = std::env::temp_dir().join(format!("hoptrace-notcap-{}", std::process::id()));
        std::fs::write(&path, b"not parquet").unwrap();
        assert!(matches!(
            read_capture(&path),
            Err(CaptureError::Format { .. })
        ));
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(read_capture(&path), Err(CaptureError::Io { .. })));
    }
}
