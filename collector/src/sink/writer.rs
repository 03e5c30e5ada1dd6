//! Rolling Parquet files of joined traces: `traces/part-NNNNN.parquet`, one row per
//! message.
//!
//! Columns (all times are UTC nanoseconds since the Unix epoch, CLOCK_REALTIME of the
//! host that took them, stored as `Timestamp(ns)` without a time zone):
//!
//! | column | type | meaning |
//! | --- | --- | --- |
//! | `run_id` | Utf8 | the run |
//! | `publisher`, `stream`, `sequence` | UInt16, UInt32, UInt64 | the trace key |
//! | `metric_count` | UInt32 | metrics the message carried |
//! | `intended_ns` | Timestamp(ns) | when the open-loop schedule meant to send it |
//! | `<hop>_ns` | Timestamp(ns), nullable | one per hop of the pipeline spec, in order |
//! | `status` | Utf8 | `complete` or `incomplete` |
//! | `missing_mask` | UInt16 | bit i set: expected hop i (spec order) never stamped |
//! | `flags` | UInt8 | bit 0 duplicate stamp, 1 negative stage delta, 2 conflicting records, 3 unexpected hop |
//! | `otel_trace_id` | FixedSizeBinary(16), nullable | W3C trace id, when one travelled |
//!
//! Stage latencies are not stored: a stage is the difference of two hop columns, and the
//! analysis registers them as columns at query time (`<to>_ns - <from>_ns`), which keeps
//! files small. Timestamps, sequences and intended times use delta encoding (neighbouring
//! rows are close in time), the rest dictionary encoding, everything zstd; statistics are
//! kept per column chunk so scans can prune row groups by time.
//!
//! A file is written as `part-NNNNN.parquet.inprogress` and renamed when closed, so a
//! reader never sees a file without its footer.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{
    ArrayRef, FixedSizeBinaryBuilder, RecordBatch, StringBuilder, TimestampNanosecondBuilder,
    UInt8Builder, UInt16Builder, UInt32Builder, UInt64Builder,
};
use arrow::datatypes::SchemaRef;
use hoptrace_format::schema::{hop_column, traces_schema};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::file::properties::{EnabledStatistics, WriterProperties, WriterVersion};
use parquet::schema::types::ColumnPath;

use crate::join::JoinedTrace;
use hoptrace_format::run::{PartFile, Recovered};

/// Rows buffered in Arrow builders before they are handed to the Parquet writer.
const BATCH_ROWS: usize = 65_536;

/// Why writing traces failed.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The output directory or a file could not be created, written or renamed: check the
    /// path, permissions and free space.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// Parquet encoding failed.
    #[error("writing parquet {path}: {source}")]
    Parquet {
        /// The file.
        path: PathBuf,
        /// The error.
        source: parquet::errors::ParquetError,
    },
    /// Arrow rejected a batch (a bug: the builders disagree with the schema).
    #[error("building a record batch: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
}

/// How traces are written.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TraceWriterConfig {
    /// Directory of the part files (`runs/<run-id>/traces`).
    pub dir: PathBuf,
    /// The run id written in every row.
    pub run_id: String,
    /// Hop names in spec order; one column each.
    pub hop_names: Vec<String>,
    /// Rows per row group.
    pub row_group_rows: usize,
    /// Rows per file before rolling to the next.
    pub roll_rows: u64,
    /// Seconds before rolling to the next file.
    pub roll_seconds: u64,
    /// zstd level (1 to 22).
    pub zstd_level: i32,
}

struct Columns {
    run_id: StringBuilder,
    publisher: UInt16Builder,
    stream: UInt32Builder,
    sequence: UInt64Builder,
    metric_count: UInt32Builder,
    intended: TimestampNanosecondBuilder,
    hops: Vec<TimestampNanosecondBuilder>,
    status: StringBuilder,
    missing: UInt16Builder,
    flags: UInt8Builder,
    otel: FixedSizeBinaryBuilder,
    rows: usize,
}

impl Columns {
    fn new(n_hops: usize) -> Self {
        Self {
            run_id: StringBuilder::new(),
            publisher: UInt16Builder::with_capacity(BATCH_ROWS),
            stream: UInt32Builder::with_capacity(BATCH_ROWS),
            sequence: UInt64Builder::with_capacity(BATCH_ROWS),
            metric_count: UInt32Builder::with_capacity(BATCH_ROWS),
            intended: TimestampNanosecondBuilder::with_capacity(BATCH_ROWS),
            hops: (0..n_hops)
                .map(|_| TimestampNanosecondBuilder::with_capacity(BATCH_ROWS))
                .collect(),
            status: StringBuilder::new(),
            missing: UInt16Builder::with_capacity(BATCH_ROWS),
            flags: UInt8Builder::with_capacity(BATCH_ROWS),
            otel: FixedSizeBinaryBuilder::with_capacity(BATCH_ROWS, 16),
            rows: 0,
        }
    }

    fn push(&mut self, run_id: &str, t: &JoinedTrace) {
        self.run_id.append_value(run_id);
        self.publisher.append_value(t.key.publisher);
        self.stream.append_value(t.key.stream);
        self.sequence.append_value(t.key.sequence);
        self.metric_count.append_value(t.metric_count);
        self.intended.append_value(t.intended_ns);
        for (i, b) in self.hops.iter_mut().enumerate() {
            b.append_option(t.stamp(i));
        }
        self.status
            .append_value(if t.complete { "complete" } else { "incomplete" });
        self.missing.append_value(t.missing_mask);
        self.flags.append_value(t.flags);
        match t.otel_trace_id {
            Some(id) => self.otel.append_value(id.0).expect("16 bytes"),
            None => self.otel.append_null(),
        }
        self.rows += 1;
    }

    fn finish(&mut self, schema: &SchemaRef) -> Result<RecordBatch, arrow::error::ArrowError> {
        let mut cols: Vec<ArrayRef> = vec![
            Arc::new(self.run_id.finish()),
            Arc::new(self.publisher.finish()),
            Arc::new(self.stream.finish()),
            Arc::new(self.sequence.finish()),
            Arc::new(self.metric_count.finish()),
            Arc::new(self.intended.finish()),
        ];
        cols.extend(
            self.hops
                .iter_mut()
                .map(|b| Arc::new(b.finish()) as ArrayRef),
        );
        cols.push(Arc::new(self.status.finish()));
        cols.push(Arc::new(self.missing.finish()));
        cols.push(Arc::new(self.flags.finish()));
        cols.push(Arc::new(self.otel.finish()));
        self.rows = 0;
        RecordBatch::try_new(Arc::clone(schema), cols)
    }
}

/// Writes joined traces into rolling Parquet files.
pub struct TraceWriter {
    cfg: TraceWriterConfig,
    schema: SchemaRef,
    props: WriterProperties,
    cols: Columns,
    open: Option<OpenFile>,
    /// When the next file's first row came (buffered, or in the open file): the file
    /// closes `roll_seconds` later, however few rows it has.
    started: Option<Instant>,
    next_index: u32,
    closed: Vec<PartFile>,
}

impl std::fmt::Debug for TraceWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceWriter")
            .field("dir", &self.cfg.dir)
            .field("closed", &self.closed.len())
            .finish_non_exhaustive()
    }
}

struct OpenFile {
    writer: ArrowWriter<File>,
    tmp: PathBuf,
    name: String,
    rows: u64,
}

impl TraceWriter {
    /// Creates the directory; the first file opens with the first row.
    ///
    /// # Errors
    /// [`WriteError::Io`] when the directory cannot be created.
    pub fn new(cfg: TraceWriterConfig) -> Result<Self, WriteError> {
        std::fs::create_dir_all(&cfg.dir).map_err(|source| WriteError::Io {
            path: cfg.dir.clone(),
            source,
        })?;
        let schema = traces_schema(&cfg.hop_names);
        let props = writer_properties(&cfg.hop_names, cfg.row_group_rows, cfg.zstd_level);
        let next_index = next_part_index(&cfg.dir);
        Ok(Self {
            cols: Columns::new(cfg.hop_names.len()),
            cfg,
            schema,
            props,
            open: None,
            started: None,
            next_index,
            closed: Vec::new(),
        })
    }

    /// The schema of the files.
    #[must_use]
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// The files closed so far, in order.
    #[must_use]
    pub fn closed(&self) -> &[PartFile] {
        &self.closed
    }

    /// Takes `files`, closed by an earlier collector of this run (the run's checkpoint
    /// names them), as this writer's first ones: [`Self::finish`] lists them.
    pub fn resume_closed(&mut self, files: Vec<PartFile>) {
        debug_assert!(self.closed.is_empty() && self.open.is_none());
        self.closed = files;
    }

    /// Rows pushed that are not in a closed file yet (in the open file, or buffered).
    #[must_use]
    pub fn rows_not_closed(&self) -> u64 {
        self.open.as_ref().map_or(0, |o| o.rows) + self.cols.rows as u64
    }

    /// Adds one trace.
    ///
    /// # Errors
    /// Any [`WriteError`] of flushing a batch or rolling a file.
    pub fn push(&mut self, t: &JoinedTrace) -> Result<(), WriteError> {
        self.started.get_or_insert_with(Instant::now);
        self.cols.push(&self.cfg.run_id, t);
        // A batch never straddles a file boundary, so files hold exactly `roll_rows`.
        let in_file = self.open.as_ref().map_or(0, |o| o.rows);
        let room = self.cfg.roll_rows.saturating_sub(in_file).max(1);
        if self.cols.rows >= BATCH_ROWS.min(usize::try_from(room).unwrap_or(usize::MAX)) {
            self.flush_batch()?;
        }
        Ok(())
    }

    /// Rolls the file when its first row came `roll_seconds` ago or more (call
    /// periodically): the rows still buffered go to it, so at a low rate a row is in a
    /// closed file within `roll_seconds` and the buffers hold at most that long's rows.
    ///
    /// # Errors
    /// Any [`WriteError`] of writing the rows or closing the file.
    pub fn tick(&mut self) -> Result<(), WriteError> {
        let old = self
            .started
            .is_some_and(|t| t.elapsed().as_secs() >= self.cfg.roll_seconds);
        if old {
            self.flush_batch()?;
            self.close_file()?;
        }
        Ok(())
    }

    fn flush_batch(&mut self) -> Result<(), WriteError> {
        if self.cols.rows == 0 {
            return Ok(());
        }
        let n = self.cols.rows as u64;
        let batch = self.cols.finish(&self.schema)?;
        if self.open.is_none() {
            self.open_file()?;
        }
        let o = self.open.as_mut().expect("opened above");
        o.writer
            .write(&batch)
            .map_err(|source| WriteError::Parquet {
                path: o.tmp.clone(),
                source,
            })?;
        o.rows += n;
        if o.rows >= self.cfg.roll_rows {
            self.close_file()?;
        }
        Ok(())
    }

    fn open_file(&mut self) -> Result<(), WriteError> {
        let name = format!("part-{:05}.parquet", self.next_index);
        self.next_index += 1;
        let tmp = self.cfg.dir.join(format!("{name}.inprogress"));
        let file = File::create(&tmp).map_err(|source| WriteError::Io {
            path: tmp.clone(),
            source,
        })?;
        let writer = ArrowWriter::try_new(file, Arc::clone(&self.schema), Some(self.props.clone()))
            .map_err(|source| WriteError::Parquet {
                path: tmp.clone(),
                source,
            })?;
        self.open = Some(OpenFile {
            writer,
            tmp,
            name,
            rows: 0,
        });
        Ok(())
    }

    fn close_file(&mut self) -> Result<(), WriteError> {
        let Some(o) = self.open.take() else {
            return Ok(());
        };
        self.started = None;
        o.writer.close().map_err(|source| WriteError::Parquet {
            path: o.tmp.clone(),
            source,
        })?;
        let path = self.cfg.dir.join(&o.name);
        std::fs::rename(&o.tmp, &path).map_err(|source| WriteError::Io {
            path: path.clone(),
            source,
        })?;
        let bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        tracing::debug!(file = %path.display(), rows = o.rows, bytes, "closed traces file");
        self.closed.push(PartFile {
            name: o.name,
            rows: o.rows,
            bytes,
        });
        Ok(())
    }

    /// Writes what is buffered, closes the open file and returns every file written.
    ///
    /// # Errors
    /// Any [`WriteError`] of the last batch or file.
    pub fn finish(mut self) -> Result<Vec<PartFile>, WriteError> {
        self.flush_batch()?;
        self.close_file()?;
        Ok(std::mem::take(&mut self.closed))
    }
}

fn writer_properties(
    hop_names: &[String],
    row_group_rows: usize,
    zstd_level: i32,
) -> WriterProperties {
    let level = ZstdLevel::try_new(zstd_level).unwrap_or_default();
    let mut b = WriterProperties::builder()
        .set_writer_version(WriterVersion::PARQUET_2_0)
        .set_compression(Compression::ZSTD(level))
        .set_max_row_group_row_count(Some(row_group_rows.max(1)))
        .set_statistics_enabled(EnabledStatistics::Chunk)
        .set_created_by(concat!("hoptrace-collector ", env!("CARGO_PKG_VERSION")).to_owned());
    let delta = ["sequence", "intended_ns"]
        .into_iter()
        .map(str::to_owned)
        .chain(hop_names.iter().map(|h| hop_column(h)));
    for col in delta {
        let path = ColumnPath::from(col.as_str());
        b = b
            .set_column_dictionary_enabled(path.clone(), false)
            .set_column_encoding(path, Encoding::DELTA_BINARY_PACKED);
    }
    b.build()
}

/// Checks the part files an earlier collector left in `dir`, but for those named in
/// `own` (this run's, from its checkpoint): counts the complete ones and their rows, and
/// sets aside (renames) files left open by a killed collector and files that do not read.
/// `None` when `dir` holds nothing else.
///
/// # Errors
/// [`WriteError::Io`] when the directory cannot be listed or a file renamed.
pub fn recover(dir: &Path, own: &[String]) -> Result<Option<Recovered>, WriteError> {
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| WriteError::Io { path, source }
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(None);
    };
    let mut r = Recovered::default();
    let mut names: Vec<String> = entries
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with("part-") && !own.contains(n))
        .collect();
    names.sort();
    for name in names {
        let path = dir.join(&name);
        if name.ends_with(".inprogress") {
            let bytes = std::fs::metadata(&path).map_or(0, |m| m.len());
            let to = dir.join(name.replace(".inprogress", ".unfinished"));
            std::fs::rename(&path, &to).map_err(io(&path))?;
            r.unfinished.push((name, bytes));
        } else if name.ends_with(".parquet") {
            let rows = File::open(&path)
                .map_err(|e| e.to_string())
                .and_then(|f| {
                    parquet::file::reader::SerializedFileReader::new(f).map_err(|e| e.to_string())
                })
                .map(|reader| {
                    use parquet::file::reader::FileReader as _;
                    reader.metadata().file_metadata().num_rows()
                });
            match rows {
                Ok(n) => {
                    r.files += 1;
                    r.rows += u64::try_from(n).unwrap_or(0);
                }
                Err(e) => {
                    let to = dir.join(format!("{name}.corrupt"));
                    std::fs::rename(&path, &to).map_err(io(&path))?;
                    r.corrupt.push((name, e));
                }
            }
        }
    }
    let empty = r.files == 0 && r.unfinished.is_empty() && r.corrupt.is_empty();
    Ok((!empty).then_some(r))
}

/// The trace keys of every complete part file (`part-*.parquet`) in `dir` but those named
/// in `own` (this run's, whose keys its checkpoint holds): what a collector continuing
/// this run must never write again. Reads only the three key columns.
///
/// # Errors
/// A file that cannot be read, or lacks the key columns.
pub fn kept_keys(dir: &Path, own: &[String]) -> Result<crate::keys::WrittenKeys, WriteError> {
    use arrow::array::{Array as _, AsArray as _};
    use arrow::datatypes::{UInt16Type, UInt32Type, UInt64Type};
    use parquet::arrow::ProjectionMask;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    let mut keys = crate::keys::WrittenKeys::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(keys);
    };
    let mut names: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n.starts_with("part-") && n.ends_with(".parquet") && !own.iter().any(|o| o == n)
            })
        })
        .collect();
    names.sort();
    for path in names {
        let parquet = |source| WriteError::Parquet {
            path: path.clone(),
            source,
        };
        let file = File::open(&path).map_err(|source| WriteError::Io {
            path: path.clone(),
            source,
        })?;
        let builder = ParquetRecordBatchReaderBuilder::try_new(file).map_err(parquet)?;
        let schema = builder.parquet_schema();
        let column = |name: &str| {
            schema
                .columns()
                .iter()
                .position(|c| c.name() == name)
                .ok_or_else(|| {
                    parquet(parquet::errors::ParquetError::General(format!(
                        "no column {name}: not a traces part file"
                    )))
                })
        };
        let mask = ProjectionMask::leaves(
            schema,
            [column("publisher")?, column("stream")?, column("sequence")?],
        );
        for batch in builder.with_projection(mask).build().map_err(parquet)? {
            let batch = batch?;
            let col = |name: &str| {
                batch.column_by_name(name).ok_or_else(|| {
                    parquet(parquet::errors::ParquetError::General(format!(
                        "no column {name}"
                    )))
                })
            };
            let publisher = col("publisher")?.as_primitive::<UInt16Type>().clone();
            let stream = col("stream")?.as_primitive::<UInt32Type>().clone();
            let sequence = col("sequence")?.as_primitive::<UInt64Type>().clone();
            for i in 0..batch.num_rows() {
                if publisher.is_valid(i) && stream.is_valid(i) && sequence.is_valid(i) {
                    keys.insert(&hoptrace_protocol::TraceKey {
                        publisher: publisher.value(i),
                        stream: stream.value(i),
                        sequence: sequence.value(i),
                    });
                }
            }
        }
    }
    Ok(keys)
}

/// The index after the highest `part-NNNNN.parquet*` already in `dir`, so a restarted
/// collector never overwrites a file.
fn next_part_index(dir: &Path) -> u32 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            name.strip_prefix("part-")?.get(..5)?.parse::<u32>().ok()
        })
        .max()
        .map_or(0, |m| m + 1)
}

/// Writes one small table (clock statuses, probe counters) as a single zstd Parquet file,
/// through a temporary name so a reader never sees it half written.
///
/// # Errors
/// [`WriteError`] when the file cannot be created, written or renamed.
pub fn write_table(path: &Path, batch: &RecordBatch) -> Result<(), WriteError> {
    let tmp = path.with_extension("parquet.inprogress");
    let file = File::create(&tmp).map_err(|source| WriteError::Io {
        path: tmp.clone(),
        source,
    })?;
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::default()))
        .build();
    let parquet = |source| WriteError::Parquet {
        path: tmp.clone(),
        source,
    };
    let mut w = ArrowWriter::try_new(file, batch.schema(), Some(props)).map_err(parquet)?;
    w.write(batch).map_err(parquet)?;
    w.close().map_err(parquet)?;
    std::fs::rename(&tmp, path).map_err(|source| WriteError::Io {
        path: path.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use hoptrace_protocol::{MAX_HOPS, TraceKey};

    fn trace(sequence: u64) -> JoinedTrace {
        let mut stamps_ns = [0; MAX_HOPS];
        stamps_ns[0] = 1_000;
        stamps_ns[1] = 2_000;
        JoinedTrace {
            key: TraceKey {
                publisher: 1,
                stream: 2,
                sequence,
            },
            metric_count: 1,
            intended_ns: 900,
            otel_trace_id: None,
            present_mask: 0b11,
            stamps_ns,
            complete: true,
            missing_mask: 0,
            flags: 0,
        }
    }

    #[test]
    fn a_file_closes_roll_seconds_after_its_first_row_however_few_rows_it_has() {
        let dir = std::env::temp_dir().join(format!("hoptrace-writer-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut w = TraceWriter::new(TraceWriterConfig {
            dir: dir.clone(),
            run_id: "r".into(),
            hop_names: vec!["publish".into(), "flow_in".into()],
            row_group_rows: 1_000_000,
            roll_rows: 1_000_000,
            roll_seconds: 0,
            zstd_level: 1,
        })
        .unwrap();
        // Nothing buffered: nothing to roll.
        w.tick().unwrap();
        assert!(w.closed().is_empty());
        // Three rows, far fewer than a batch: still in a closed file once their time is up
        // (a file used to be opened only by a full batch, 65,536 rows, and to roll only
        // after that: minutes at a low rate, all of it held in memory).
        for s in 0..3 {
            w.push(&trace(s)).unwrap();
        }
        assert_eq!(w.rows_not_closed(), 3);
        w.tick().unwrap();
        assert_eq!(w.closed().len(), 1);
        assert_eq!(w.closed()[0].rows, 3);
        assert_eq!(w.rows_not_closed(), 0);
        assert!(dir.join(&w.closed()[0].name).exists());
        w.tick().unwrap();
        assert_eq!(w.closed().len(), 1, "no empty file");
        w.push(&trace(3)).unwrap();
        let files = w.finish().unwrap();
        assert_eq!(files.iter().map(|f| f.rows).collect::<Vec<_>>(), vec![3, 1]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
