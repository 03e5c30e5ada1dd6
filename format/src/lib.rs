//! # hoptrace-format
//!
//! The dataset contract that hoptrace's writers (the collector) and readers (the
//! analysis, reports, checks) share, so that neither learns it from the other:
//!
//! - [`hist`]: the histogram conventions: one bucket layout (HdrHistogram, 1 ns to 1 hour,
//!   3 significant digits), one rank rule for quantiles, one percentile type with its
//!   precision, and [`hist::SignedStats`], the statistics of a stage over *all* its known
//!   deltas, negative ones (clock error) included.
//! - [`varint`]: the varints and reader that the binary forms of aggregate states (the
//!   statistics above, the analysis's trace counts) are built from.
//!
//! This crate must never depend on the collector, the analysis, DataFusion, a network
//! client or an async runtime: it is the small common ground both sides build on.
//!
//! ```
//! use hoptrace_format::hist::SignedStats;
//!
//! let mut s = SignedStats::default();
//! s.add_values(&[1_000, 2_000, -500, 3_000]);
//! assert_eq!((s.count, s.negative), (4, 1));
//! assert_eq!((s.min_ns(), s.max_ns()), (Some(-500), Some(3_000)));
//! // Rank max(1, ceil(0.25 * 4)) = 1: the smallest value, the negative one.
//! assert_eq!(s.percentile(0.25).unwrap().value_ns, -500);
//! ```

#![deny(missing_docs, unreachable_pub)]

pub mod events;
pub mod group;
pub mod hist;
pub mod run;
pub mod schema;
pub mod spec;
pub mod tally;
pub mod units;
pub mod varint;
