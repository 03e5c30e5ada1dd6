//! # hoptrace-analysis
//!
//! SQL over the Parquet a collector wrote, HDR percentile tables, charts, and reports.
//!
//! It reads the dataset through its contract (`hoptrace-format`: the pipeline spec,
//! run.json, the Parquet schemas, the histogram conventions) and must never depend on
//! the collector that writes it, the probe, the publisher or the runner: it only reads
//! what they leave in a run directory.
//!
//! - [`session`]: open run directories ([`RunSet`]); [`RunSet::session`] gives a
//!   DataFusion session with `traces`, `clock`, `probes`, `runs`, `stages` and the sweep's
//!   `cells` registered;
//! - [`hdr`]: the SQL functions `hdr_histogram`, `hdr_percentile`, `hdr_precision`, ...;
//! - [`stats`]: the aggregates behind a report's single scan (`stage_stats`, `trace_counts`);
//! - [`summary`]: everything a report says about a run, computed by SQL over its Parquet
//!   (`summary.json` is this, serialized);
//! - [`report`]: `report.md`, `report.html` and the Vega-Lite chart specs;
//! - [`events`]: what a run knows happened on its time axis (lost connections, restarts,
//!   clock changes, probes losing records), marked on its charts;
//! - [`compare`]: percentiles of several runs side by side and CI gates;
//! - [`bounds`]: the bounds of stages with a polled hop, and decisions made with them;
//! - [`sweep`]: a sweep's cells, its knee and its report.
//!
//! Its modules are layered, none importing one above it: percentiles as shown and the
//! bounds at the bottom; the run set above them; the polled hops, then the summary; then
//! compare, charts and the report; the sweep; and the SQL session over all of it on top.
//!
//! ```no_run
//! # async fn example() -> Result<(), hoptrace_analysis::AnalysisError> {
//! use hoptrace_analysis::RunSet;
//! let runs = RunSet::open(&["runs/demo"])?;
//! let ctx = runs.session().await?;
//! let df = ctx
//!     .sql("SELECT hdr_percentile(total_ingestion_ns, 0.99) AS p99 FROM traces")
//!     .await?;
//! df.show().await?;
//! # Ok(())
//! # }
//! ```

#![deny(missing_docs, unreachable_pub)]

use std::path::PathBuf;

mod binary_agg;
pub mod bounds;
pub mod charts;
pub mod compare;
mod counts;
pub mod events;
mod figures;
pub mod hdr;
mod polled;
mod query;
pub mod report;
pub mod resources;
pub mod session;
pub mod sql;
pub mod stats;
pub mod summary;
pub mod sweep;
pub mod tail;
pub mod weighted;

pub use datafusion;
pub use session::{Run, RunSet};
pub use summary::Summary;

/// Errors of the analysis layer.
#[derive(Debug, thiserror::Error)]
pub enum AnalysisError {
    /// A path is not a run directory: give the directory a collector wrote (with `run.json`).
    #[error("{dir} is not a run directory (no readable run.json): {source}")]
    NotARun {
        /// The directory.
        dir: PathBuf,
        /// Why it could not be read.
        source: std::io::Error,
    },
    /// `run.json` does not parse: it was not written by this version of hoptrace, or was
    /// edited.
    #[error("{path}: not a hoptrace run.json: {source}")]
    RunJson {
        /// The file.
        path: PathBuf,
        /// The parse error.
        source: serde_json::Error,
    },
    /// A collector group's run does not read (a member's log or run.json).
    #[error("collector group run: {0}")]
    Group(String),
    /// An aggregate's state does not decode (a bug).
    #[error("internal: {0}")]
    State(#[from] hoptrace_format::hist::DecodeError),
    /// Nothing matched the paths given: check the run directory or glob.
    #[error("no run directories match {0:?}")]
    NoRuns(String),
    /// Runs cannot be read together.
    #[error("runs cannot be read together: {0}")]
    Mismatch(String),
    /// Part files a run's `run.json` lists are gone from its `traces/`: the run cannot be
    /// reported as it was written (its counts would not add up). Put them back, or report
    /// another copy of the run.
    #[error(
        "{dir}: {} part file(s) its run.json lists are missing from traces/: {}",
        missing.len(),
        missing.join(", ")
    )]
    MissingFiles {
        /// The run directory.
        dir: PathBuf,
        /// The missing files' names.
        missing: Vec<String>,
    },
    /// A Parquet file is truncated or not Parquet: the run's collector was killed before
    /// closing it, or the file was damaged; move it aside (the collector's recovery does).
    #[error("{path}: not a readable Parquet file: {reason}")]
    BadParquet {
        /// The file.
        path: PathBuf,
        /// What the reader said.
        reason: String,
    },
    /// A query failed: the message names the column, table or function.
    #[error(transparent)]
    DataFusion(#[from] datafusion::error::DataFusionError),
    /// A query failed, said with what to write instead (a syntax error, an unknown table
    /// and the tables there are).
    #[error("{0}")]
    Query(String),
    /// Writing an output failed.
    #[error("writing {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A chart or report asset is missing or failed to render.
    #[error("{0}")]
    Render(String),
    /// A sweep cell's file does not read.
    #[error("sweep cell {path}: {reason}")]
    Cell {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A comparison gate is malformed: see `hoptrace compare --help` for its grammar.
    #[error("bad gate {gate:?}: {reason}")]
    Gate {
        /// The gate as given.
        gate: String,
        /// What is wrong.
        reason: String,
    },
}

impl From<datafusion::arrow::error::ArrowError> for AnalysisError {
    fn from(e: datafusion::arrow::error::ArrowError) -> Self {
        Self::DataFusion(e.into())
    }
}

/// Writes `bytes` to `path`, creating its directory.
///
/// # Errors
/// [`AnalysisError::Io`] naming the file.
pub fn write_file(path: &std::path::Path, bytes: impl AsRef<[u8]>) -> Result<(), AnalysisError> {
    let io = |source| AnalysisError::Io {
        path: path.to_owned(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    std::fs::write(path, bytes).map_err(io)
}
