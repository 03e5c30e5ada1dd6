//! # hoptrace-collector
//!
//! Receives probe records over the collector protocol (`docs/collector-protocol.md`),
//! joins the stamps of each message, and writes the run's dataset under
//! `runs/<run-id>/`: `traces/part-NNNNN.parquet` (one row per message, a timestamp
//! column per hop), and `run.json` (the pipeline, the probes, their clocks, the files and
//! the accounting: every message sent is complete, incomplete or unseen).
//!
//! It depends on the dataset format (`hoptrace-format`), the wire protocol it shares with
//! the probe (`hoptrace-protocol`) and the clock checks (`hoptrace-clock`); it must never
//! depend on the probe (it only tests against it), the publisher, the analysis or the
//! runner: they report to it, read what it writes, or start it.
//!
//! - [`PipelineSpec`] (of `hoptrace-format`): the pipeline spec (TOML): hops, expected hops,
//!   stages, join window, files.
//! - [`join`]: the join of records into traces, bounded by the window.
//! - [`writer`]: rolling Parquet files.
//! - [`stages`]: per-stage HDR histograms, exact statistics and interval logs.
//! - [`run`]: a whole run: listen, join, write, account.
//! - [`metrics`]: `/metrics` for Prometheus, and `/progress.json` ([`run::Progress`]) for
//!   programs that watch a collector in another process.
//! - [`live`]: the live view, `/` and `/live.json` ([`live::Live`]): per-stage
//!   percentiles over the last interval and the run, throughput, accounting, clocks.
//!
//! ```no_run
//! use hoptrace_collector::run::{Collector, CollectorConfig};
//! use hoptrace_format::spec::PipelineSpec;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let cfg = CollectorConfig::new("127.0.0.1:7400", PipelineSpec::default_pipeline(), "runs");
//! let collector = Collector::start(cfg)?;
//! // ... probes connect and report ...
//! let summary = collector.stop()?;
//! assert!(summary.accounting.adds_up);
//! # Ok(())
//! # }
//! ```

#![deny(missing_docs, unreachable_pub)]

mod accounting;
mod checkpoint;
mod control;
pub mod generate;
pub mod join;
#[cfg(feature = "kafka")]
pub mod kafka;
pub mod keys;
pub mod live;
pub mod metrics;
pub mod partition;
pub mod run;
pub mod server;
pub mod stages;
pub mod tables;
mod tls;
pub mod wal;
pub mod writer;

pub use hoptrace_format::run::RunSummary;
pub use hoptrace_format::spec::{PipelineSpec, ResolvedSpec, SpecError};
pub use run::{Collector, CollectorConfig, CollectorError};
