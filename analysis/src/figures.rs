//! A percentile as the reports show it (`format::hist::Percentile`: quantile, value, the HDR
//! bucket's precision and a label), a stage's figures, and when an uncertainty beside a
//! figure is large enough to warn about. The summary, the bounds and the polled hops all
//! build on these; they depend on none of them.

pub use hoptrace_format::hist::{Figures, Percentile, quantile_label};

/// A stage's clock uncertainty (or a polled hop's bracket) above this fraction of its P50
/// is warned about.
pub const CLOCK_WARN_FRACTION: f64 = 0.1;
