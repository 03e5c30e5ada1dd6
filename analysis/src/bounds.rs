//! Bounds of the stages that start or end at a polled hop, and decisions made with them.
//!
//! A polled stamp (a store tap's `queryable`) is an interval: the data became queryable
//! no earlier than the hop the spec names as its `earliest` and no later than the stamp.
//! A stage ending there is, message by message, between its delta to the earliest instant
//! and its delta to the stamp; one starting there, the other way round. Every statistic
//! this crate reports (min, max, mean, each percentile) is monotone in the values, so the
//! statistic over the smallest possible deltas and over the largest are true bounds of the
//! statistic over the true deltas: [`StageBounds`].
//!
//! A stage between two stamps of one poll (the poll's send and its response, `Query
//! Duration`) is exact and gets none.
//!
//! Clocks add their own uncertainty (`clock_uncertainty_ns`, the two hosts' error bounds):
//! shown beside the poll's, and added to it where a decision is made ([`Decision`]).

use hoptrace_format::hist::{QUANTILES, SignedStats, signed_percentile};
use hoptrace_format::spec::{PipelineSpec, StageSpec};
use serde::{Deserialize, Serialize};

use crate::figures::Percentile;
use crate::weighted::WeightedStage;

/// A stage's figures over the smallest or over the largest values its polled stamps
/// allow.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct BoundFigures {
    /// Traces with both hops.
    pub count: u64,
    /// Exact minimum, ns.
    pub min_ns: Option<i64>,
    /// Exact maximum, ns.
    pub max_ns: Option<i64>,
    /// Exact mean, ns.
    pub mean_ns: Option<f64>,
    /// HDR percentiles per message (3 significant digits), within `[min_ns, max_ns]`.
    pub percentiles: Vec<Percentile>,
    /// The same per metric (each trace weighted by its metric count), when the run's
    /// messages carried batches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_metric: Option<Vec<Percentile>>,
}

/// Where a stage's true figures lie when a hop at one of its ends is polled.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StageBounds {
    /// The stage's polled hops (those with an `earliest` in the spec).
    pub polled: Vec<String>,
    /// The hop pair whose deltas are the stage at its smallest (`from`, `to`).
    pub lower_hops: (String, String),
    /// The hop pair whose deltas are the stage at its largest.
    pub upper_hops: (String, String),
    /// Over the smallest possible deltas.
    pub lower: BoundFigures,
    /// Over the largest possible deltas.
    pub upper: BoundFigures,
}

/// The stages a scan computes for bounds: the pipeline's, then for each stage with
/// bounds the pairs of hops of its lower and upper deltas that are not the stage itself.
#[derive(Debug, Clone)]
pub(crate) struct BoundStages {
    /// Every stage to scan: the pipeline's first, in its order.
    pub(crate) scan: Vec<StageSpec>,
    /// Per pipeline stage: the indices in `scan` of its lower and upper deltas.
    pub(crate) of: Vec<Option<(usize, usize)>>,
}

impl BoundStages {
    /// The bounded stages of `spec`; `exact` says whether a stage's two hops were stamped
    /// by one poll (no bounds then).
    pub(crate) fn new(spec: &PipelineSpec, exact: impl Fn(&StageSpec) -> bool) -> Self {
        let mut scan = spec.stages.clone();
        let mut of = Vec::with_capacity(spec.stages.len());
        for (i, st) in spec.stages.iter().enumerate() {
            let Some(b) = spec.stage_bound(st).filter(|_| !exact(st)) else {
                of.push(None);
                continue;
            };
            let mut index = |(from, to): (String, String), side: &str| {
                if from == st.from && to == st.to {
                    return i;
                }
                // Named so that its column in the `traces` view is the stage's bound
                // column (`<slug>_lower_ns`, `<slug>_upper_ns`).
                scan.push(StageSpec {
                    name: format!("{} {side}", st.name),
                    from,
                    to,
                    definition: String::new(),
                    headline: false,
                });
                scan.len() - 1
            };
            let lower = index(b.lower, "lower");
            let upper = index(b.upper, "upper");
            of.push(Some((lower, upper)));
        }
        Self { scan, of }
    }
}

/// The percentiles of `w`'s weighted histograms, within `figures`' exact extremes.
pub(crate) fn weighted_percentiles(w: &WeightedStage, figures: &SignedStats) -> Vec<Percentile> {
    QUANTILES
        .iter()
        .filter_map(|&q| signed_percentile(&w.pos, &w.neg, q))
        .map(|p| p.within(figures.min, figures.max))
        .collect()
}

impl BoundFigures {
    /// The figures of one bound's deltas; per metric too when `weighted` is given.
    pub(crate) fn of(s: &SignedStats, weighted: Option<&WeightedStage>) -> Self {
        Self {
            count: s.count,
            min_ns: s.min_ns(),
            max_ns: s.max_ns(),
            mean_ns: s.mean_ns(),
            percentiles: s.percentiles().into_iter().collect(),
            per_metric: weighted.map(|w| weighted_percentiles(w, s)),
        }
    }

    /// The percentile of `label`, per metric when `per_metric` and kept.
    #[must_use]
    pub fn percentile(&self, label: &str, per_metric: bool) -> Option<i64> {
        let list = match (&self.per_metric, per_metric) {
            (Some(m), true) => m,
            _ => &self.percentiles,
        };
        list.iter().find(|p| p.is(label)).map(|p| p.value_ns)
    }

    /// A statistic (`p99`, `min`, `max`, `mean`), ns.
    #[must_use]
    pub fn stat(&self, name: &str, per_metric: bool) -> Option<f64> {
        match name {
            "min" => self.min_ns.map(|v| v as f64),
            "max" => self.max_ns.map(|v| v as f64),
            "mean" => self.mean_ns,
            p => self.percentile(p, per_metric).map(|v| v as f64),
        }
    }
}

/// A decision made with bounds: a limit the whole interval meets is met, one the whole
/// interval fails is failed, and one inside the interval is undecided (the measurement
/// cannot tell).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Decision {
    /// Met for every value the stamps allow.
    Met,
    /// Failed for every value the stamps allow.
    Failed,
    /// Met for some and failed for others.
    Undecided,
}

impl Decision {
    /// The decision on `holds` over the interval `[lo, hi]`, where `holds` is monotone (a
    /// limit: `< 5ms` holds at the low end first, `> 5ms` at the high end).
    #[must_use]
    pub fn over(lo: f64, hi: f64, holds: impl Fn(f64) -> bool) -> Self {
        match (holds(lo), holds(hi)) {
            (true, true) => Self::Met,
            (false, false) => Self::Failed,
            _ => Self::Undecided,
        }
    }

    /// As the report and the command line say it.
    #[must_use]
    pub fn word(self) -> &'static str {
        match self {
            Self::Met => "met",
            Self::Failed => "failed",
            Self::Undecided => "undecided",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions_follow_the_interval() {
        let below = |limit: f64| move |v: f64| v < limit;
        assert_eq!(Decision::over(1.0, 2.0, below(3.0)), Decision::Met);
        assert_eq!(Decision::over(1.0, 2.0, below(0.5)), Decision::Failed);
        assert_eq!(Decision::over(1.0, 2.0, below(1.5)), Decision::Undecided);
        let above = |limit: f64| move |v: f64| v > limit;
        assert_eq!(Decision::over(1.0, 2.0, above(1.5)), Decision::Undecided);
        assert_eq!(Decision::over(1.0, 2.0, above(0.5)), Decision::Met);
    }

    #[test]
    fn a_stage_ending_at_a_polled_hop_scans_its_earliest_instant() {
        let text = r#"
name = "p"
[[hops]]
name = "publish"
[[hops]]
name = "query_start"
[[hops]]
name = "queryable"
earliest = "queryable_earliest"
[[hops]]
name = "queryable_earliest"
[[stages]]
name = "Total"
from = "publish"
to = "queryable"
definition = "x"
[[stages]]
name = "Query"
from = "query_start"
to = "queryable"
definition = "x"
"#;
        let spec = PipelineSpec::from_toml_str(text).unwrap();
        let b = BoundStages::new(&spec, |st| st.from == "query_start");
        assert_eq!(b.scan.len(), 3);
        assert_eq!(b.scan[2].from, "publish");
        assert_eq!(b.scan[2].to, "queryable_earliest");
        // The lower delta is the extra stage, the upper is the stage itself.
        assert_eq!(b.of, vec![Some((2, 0)), None]);
    }
}
