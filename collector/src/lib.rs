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
//! Its modules follow a record's way through it:
//!
//! - [`ingest`]: the listener and the probes' connections ([`server`]), TLS, control frames.
//! - [`join`]: the join of records into traces, bounded by the window; the keys already
//!   written ([`keys`]); per-stage HDR histograms, exact statistics and interval logs
//!   ([`stages`]); the partitions of a scaled-out run ([`partition`]).
//! - [`durability`]: the write-ahead log ([`wal`]) and the checkpoints that cut it and let
//!   a run be continued.
//! - [`sink`]: rolling Parquet files ([`writer`]) and the tables beside them ([`tables`]).
//! - [`observe`]: `/metrics` for Prometheus and `/progress.json` ([`run::Progress`])
//!   ([`metrics`]); the live view, `/` and `/live.json` ([`live::Live`]).
//! - [`run`]: a whole run's lifecycle: listen, join, write, account.
//! - [`PipelineSpec`] (of `hoptrace-format`): the pipeline spec (TOML): hops, expected hops,
//!   stages, join window, files.
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
pub mod durability;
mod error;
pub mod generate;
pub mod ingest;
pub mod join;
#[cfg(feature = "kafka")]
pub mod kafka;
pub mod observe;
pub mod run;
pub mod sink;

// The modules' paths before they were grouped by stage, kept for the crate's users.
use durability::checkpoint;
pub use durability::wal;
pub use ingest::server;
use ingest::{control, tls};
pub use join::{keys, partition, stages};
pub use observe::{live, metrics};
pub use sink::{tables, writer};

pub use hoptrace_format::run::RunSummary;
pub use hoptrace_format::spec::{PipelineSpec, ResolvedSpec, SpecError};
pub use run::{Collector, CollectorConfig, CollectorError};
