//! A percentile as the reports show it (label, quantile, value and the HDR bucket's
//! precision), and when an uncertainty beside a figure is large enough to warn about.
//! The summary, the bounds and the polled hops all build on these; they depend on none of
//! them.

use serde::{Deserialize, Serialize};

/// A stage's clock uncertainty (or a polled hop's bracket) above this fraction of its P50
/// is warned about.
pub const CLOCK_WARN_FRACTION: f64 = 0.1;

/// One percentile with its precision.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PercentileValue {
    /// Label, e.g. `P99.9`.
    pub label: String,
    /// Quantile, e.g. 0.999.
    pub quantile: f64,
    /// Middle of the HDR bucket holding it, ns; negative when the value of that rank is
    /// (clock error between hosts).
    pub value_ns: i64,
    /// Half the bucket's width: the exact value is within ± this, ns.
    pub precision_ns: u64,
}

impl From<hoptrace_format::hist::Percentile> for PercentileValue {
    fn from(p: hoptrace_format::hist::Percentile) -> Self {
        Self {
            label: quantile_label(p.quantile),
            quantile: p.quantile,
            value_ns: p.value_ns,
            precision_ns: p.precision_ns,
        }
    }
}

/// The label of a quantile: 0.999 → `P99.9`.
#[must_use]
pub fn quantile_label(q: f64) -> String {
    let pct = format!("{:.4}", q * 100.0);
    let pct = pct.trim_end_matches('0').trim_end_matches('.');
    format!("P{pct}")
}
