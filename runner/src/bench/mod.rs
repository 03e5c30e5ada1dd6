//! Whole-run benchmarks (`hoptrace bench ...`), whose results go into `reports/` with the
//! command line and the machine:
//!
//! - [`collector`]: synthetic probe traffic over loopback into an in-process collector.
//! - [`publisher`]: the highest rate the publisher sustains against a broker.
//! - [`report`]: `hoptrace report` over large generated runs, beside DuckDB.

pub mod collector;
pub mod publisher;
pub mod report;
