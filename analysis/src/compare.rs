//! Stage percentiles of several runs side by side, and gates for CI.
//!
//! The first run is the baseline; every other run is compared with it. A gate is
//! `<stage>.<stat> <op> <threshold>`, a **requirement**: a compared run passes when it
//! holds and fails when it does not, as a sweep's service level (`--sla`) is met when it
//! holds. One syntax, one meaning, across the tool:
//!
//! - `stat`: `p50`, `p90`, `p95`, `p99`, `p99.9`, `p99.99`, `min`, `max`, `mean`;
//! - `op`: `>`, `>=`, `<`, `<=`;
//! - `threshold`: `+10%` / `-5%` (change relative to the baseline), `+500us` / `-1ms`
//!   (absolute change), or `5ms` (the run's own value).
//!
//! Example: `--require 'Total Ingestion.p99 <= +10%'` fails a run whose P99 of Total
//! Ingestion is more than 10 % above the baseline's.

use std::fmt::Write as _;

use crate::AnalysisError;
use crate::bounds::Decision;
use crate::summary::{StageSummary, Summary};
use hoptrace_format::units::{duration_f64, duration_ns};

/// What a threshold is relative to.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Threshold {
    /// Relative change from the baseline, as a fraction (0.1 = +10 %).
    Relative(f64),
    /// Absolute change from the baseline, ns.
    Change(f64),
    /// The run's own value, ns.
    Value(f64),
}

/// A comparison operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `>`
    Gt,
    /// `>=`
    Ge,
    /// `<`
    Lt,
    /// `<=`
    Le,
}

impl Op {
    fn holds(self, a: f64, b: f64) -> bool {
        match self {
            Self::Gt => a > b,
            Self::Ge => a >= b,
            Self::Lt => a < b,
            Self::Le => a <= b,
        }
    }
    fn symbol(self) -> &'static str {
        match self {
            Self::Gt => ">",
            Self::Ge => ">=",
            Self::Lt => "<",
            Self::Le => "<=",
        }
    }
}

/// A parsed gate.
#[derive(Debug, Clone, PartialEq)]
pub struct Gate {
    /// As written.
    pub text: String,
    /// Stage name.
    pub stage: String,
    /// Statistic (`p99`, `mean`, ...), lower case.
    pub stat: String,
    /// Operator.
    pub op: Op,
    /// Threshold.
    pub threshold: Threshold,
}

/// A duration with a unit (`500ns`, `250us`, `2.5ms`, `1s`, `2m`, `1h`), in the one
/// grammar of [`hoptrace_format::units`].
fn parse_ns(s: &str) -> Option<f64> {
    hoptrace_format::units::parse_duration_ns(s)
        .ok()
        .map(|ns| ns as f64)
}

impl std::str::FromStr for Gate {
    type Err = AnalysisError;
    fn from_str(text: &str) -> Result<Self, AnalysisError> {
        let bad = |reason: &str| AnalysisError::Gate {
            gate: text.to_owned(),
            reason: reason.to_owned(),
        };
        // The rightmost `<` or `>`: stage names may contain arrows (`a -> b`), thresholds
        // never contain either.
        let at = text
            .rfind(['<', '>'])
            .ok_or_else(|| bad("no operator (>, >=, <, <=)"))?;
        let eq = text[at + 1..].starts_with('=');
        let op = match (&text[at..=at], eq) {
            (">", false) => Op::Gt,
            (">", true) => Op::Ge,
            ("<", false) => Op::Lt,
            _ => Op::Le,
        };
        let pos = (at, 1 + usize::from(eq));
        let left = text[..pos.0].trim();
        let right = text[pos.0 + pos.1..].trim();
        let (stage, stat) = left
            .rsplit_once('.')
            .ok_or_else(|| bad("left side must be <stage>.<stat>"))?;
        // `p99.9` contains a dot: re-split when the stat is a fraction of a percentile.
        let (stage, stat) = match stage.rsplit_once('.') {
            Some((st, p))
                if p.starts_with(['p', 'P']) && stat.chars().all(|c| c.is_ascii_digit()) =>
            {
                (st, format!("{p}.{stat}"))
            }
            _ => (stage, stat.to_owned()),
        };
        let stat = stat.to_ascii_lowercase();
        let known = [
            "p50", "p90", "p95", "p99", "p99.9", "p99.99", "min", "max", "mean",
        ];
        if !known.contains(&stat.as_str()) {
            return Err(bad(&format!(
                "unknown statistic {stat:?}; use one of {known:?}"
            )));
        }
        let threshold = if let Some(pct) = right.strip_suffix('%') {
            let v: f64 = pct
                .trim()
                .parse()
                .map_err(|_| bad("percentage must be a number, e.g. +10%"))?;
            Threshold::Relative(v / 100.0)
        } else if right.starts_with(['+', '-']) {
            let v =
                parse_ns(&right[1..]).ok_or_else(|| bad("change must have a unit, e.g. +2ms"))?;
            Threshold::Change(if right.starts_with('-') { -v } else { v })
        } else {
            Threshold::Value(
                parse_ns(right).ok_or_else(|| bad("value must have a unit, e.g. 5ms"))?,
            )
        };
        Ok(Self {
            text: text.to_owned(),
            stage: stage.trim().to_owned(),
            stat,
            op,
            threshold,
        })
    }
}

impl Gate {
    /// Whether `stages` meet this gate read as a service level objective: with an
    /// absolute threshold, `Total Ingestion.p99 < 5ms` is met when that stage's P99 is
    /// below 5 ms for every value its bounds allow (a polled hop's, the clocks'), failed
    /// when for none, undecided otherwise. A stage without values fails it.
    ///
    /// # Errors
    /// [`AnalysisError::Gate`] when the threshold is relative to a baseline or the stage
    /// is not among `stages`.
    pub fn met_by(&self, stages: &[StageSummary]) -> Result<Decision, AnalysisError> {
        let Threshold::Value(limit) = self.threshold else {
            return Err(AnalysisError::Gate {
                gate: self.text.clone(),
                reason: "a service level needs an absolute value such as 5ms, not a change".into(),
            });
        };
        Ok(
            match self.stage_of(stages)?.stat_interval(&self.stat, false) {
                Some((lo, hi)) => Decision::over(lo, hi, |v| self.op.holds(v, limit)),
                None => Decision::Failed,
            },
        )
    }

    /// Checks that every run has the gate's stage, so that a misspelt stage is reported
    /// before anything is compared.
    ///
    /// # Errors
    /// [`AnalysisError::Gate`] naming the stages the runs have.
    pub fn check(&self, summaries: &[Summary]) -> Result<(), AnalysisError> {
        for s in summaries {
            self.stage_of(&s.stages)?;
        }
        Ok(())
    }

    /// The gate's stage among `stages`.
    fn stage_of<'a>(&self, stages: &'a [StageSummary]) -> Result<&'a StageSummary, AnalysisError> {
        stages
            .iter()
            .find(|x| x.name.eq_ignore_ascii_case(&self.stage))
            .ok_or_else(|| AnalysisError::Gate {
                gate: self.text.clone(),
                reason: format!(
                    "no stage {:?}; stages: {:?}",
                    self.stage,
                    stages.iter().map(|x| &x.name).collect::<Vec<_>>()
                ),
            })
    }
}

impl Threshold {
    /// As a gate line shows it: `+10.0%`, `+500.0µs`, `5.0ms`.
    #[must_use]
    pub fn shown(self) -> String {
        match self {
            Self::Relative(x) => format!("{:+.1}%", x * 100.0),
            Self::Change(ns) if ns < 0.0 => duration_f64(ns),
            Self::Change(ns) => format!("+{}", duration_f64(ns)),
            Self::Value(ns) => duration_f64(ns),
        }
    }
}

/// A statistic of a stage, ns.
#[must_use]
pub fn stat(s: &StageSummary, name: &str) -> Option<f64> {
    stat_counted(s, name, false)
}

pub use crate::summary::stat_counted;

/// The outcome of one gate on one run.
#[derive(Debug, Clone)]
pub struct GateResult {
    /// The gate.
    pub gate: String,
    /// The run compared.
    pub run_id: String,
    /// Whether the run fails: the gate's requirement does not hold for any value its
    /// bounds allow.
    pub failed: bool,
    /// Met, failed, or undecided (the requirement holds for some of the values the bounds
    /// allow and not for others).
    pub decision: Decision,
    /// What was compared.
    pub detail: String,
}

/// Evaluates `gate` on every run after the baseline (`summaries[0]`), with each figure's
/// interval ([`StageSummary::stat_interval`]: the bounds of a polled stage, widened by
/// the clock uncertainty): a run meets the requirement when it holds for every value the
/// intervals allow, fails it when it holds for none, and is undecided otherwise.
///
/// # Errors
/// [`AnalysisError::Gate`] when the stage is not in a run.
pub fn evaluate(gate: &Gate, summaries: &[Summary]) -> Result<Vec<GateResult>, AnalysisError> {
    let find = |s: &Summary| -> Result<(f64, (f64, f64)), AnalysisError> {
        let st = gate.stage_of(&s.stages)?;
        let none = || AnalysisError::Gate {
            gate: gate.text.clone(),
            reason: format!("stage {:?} has no data", gate.stage),
        };
        let v = stat(st, &gate.stat).ok_or_else(none)?;
        Ok((v, st.stat_interval(&gate.stat, false).ok_or_else(none)?))
    };
    let Some(base) = summaries.first() else {
        return Ok(Vec::new());
    };
    let (b, (blo, bhi)) = find(base)?;
    let mut out = Vec::new();
    let candidates = if summaries.len() == 1 {
        summaries
    } else {
        &summaries[1..]
    };
    let shown_interval = |lo: f64, hi: f64, show: &dyn Fn(f64) -> String| {
        if lo == hi {
            String::new()
        } else {
            format!(" [{}, {}]", show(lo), show(hi))
        }
    };
    for s in candidates {
        let (v, (rlo, rhi)) = find(s)?;
        let pct = |x: f64| format!("{:+.1}%", x * 100.0);
        let dur = |x: f64| duration_f64(x);
        // The compared figure at the point and over every value the intervals allow.
        let (lhs, lo, hi, show): (f64, f64, f64, &dyn Fn(f64) -> String) = match gate.threshold {
            Threshold::Relative(_) => {
                let rel = |v: f64, b: f64| if b > 0.0 { (v - b) / b } else { 0.0 };
                (rel(v, b), rel(rlo, bhi), rel(rhi, blo), &pct)
            }
            Threshold::Change(_) => (v - b, rlo - bhi, rhi - blo, &dur),
            Threshold::Value(_) => (v, rlo, rhi, &dur),
        };
        let rhs = match gate.threshold {
            Threshold::Relative(x) | Threshold::Change(x) | Threshold::Value(x) => x,
        };
        let decision = Decision::over(lo.min(lhs), hi.max(lhs), |x| gate.op.holds(x, rhs));
        out.push(GateResult {
            gate: gate.text.clone(),
            run_id: s.runs.first().map(|r| r.run_id.clone()).unwrap_or_default(),
            failed: decision == Decision::Failed,
            decision,
            detail: format!(
                "{}.{}: baseline {}{}, run {}{} ({}{} {} {}: {})",
                gate.stage,
                gate.stat,
                duration_f64(b),
                shown_interval(blo, bhi, &dur),
                duration_f64(v),
                shown_interval(rlo, rhi, &dur),
                show(lhs),
                shown_interval(lo, hi, show),
                gate.op.symbol(),
                gate.threshold.shown(),
                match decision {
                    Decision::Met => "holds",
                    Decision::Failed => "does not hold, the run fails",
                    Decision::Undecided =>
                        "undecided: the bounds (polled stamps, clocks) hold it for some values and not for others",
                }
            ),
        });
    }
    Ok(out)
}

/// A Markdown table of every stage's percentiles across runs, with deltas to the first.
#[must_use]
pub fn table(summaries: &[Summary]) -> String {
    let mut out = String::new();
    let Some(base) = summaries.first() else {
        return out;
    };
    let ids: Vec<String> = summaries
        .iter()
        .map(|s| s.runs.first().map(|r| r.run_id.clone()).unwrap_or_default())
        .collect();
    let _ = write!(out, "| Stage | Stat | {}", ids[0]);
    for id in &ids[1..] {
        let _ = write!(out, " | {id} | Δ");
    }
    out.push_str(" |\n|");
    out.push_str(&" --- |".repeat(3 + 2 * (ids.len() - 1)));
    out.push('\n');
    for st in &base.stages {
        for stat_name in ["p50", "p90", "p99", "p99.9", "p99.99", "max"] {
            let b = stat(st, stat_name);
            let fmt = |v: Option<f64>| v.map_or_else(|| "-".into(), duration_f64);
            let label = if stat_name.starts_with('p') {
                stat_name.to_ascii_uppercase()
            } else {
                stat_name.to_owned()
            };
            let _ = write!(out, "| {} | {label} | {}", st.name, fmt(b));
            for s in &summaries[1..] {
                let v = s
                    .stages
                    .iter()
                    .find(|x| x.name == st.name)
                    .and_then(|x| stat(x, stat_name));
                let delta = match (b, v) {
                    (Some(b), Some(v)) if b > 0.0 => {
                        format!("{:+.1}% ({})", (v - b) / b * 100.0, sign(v - b))
                    }
                    _ => "-".into(),
                };
                let _ = write!(out, " | {} | {delta}", fmt(v));
            }
            out.push_str(" |\n");
        }
    }
    out
}

fn sign(ns: f64) -> String {
    if ns >= 0.0 {
        format!("+{}", duration_ns(ns as u64))
    } else {
        format!("-{}", duration_ns((-ns) as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gates_parse() {
        let g: Gate = "Total Ingestion.p99 > +10%".parse().unwrap();
        assert_eq!(g.stage, "Total Ingestion");
        assert_eq!(g.stat, "p99");
        assert_eq!(g.op, Op::Gt);
        assert_eq!(g.threshold, Threshold::Relative(0.1));
        let g: Gate = "Broker Time.p99.99 >= 5ms".parse().unwrap();
        assert_eq!(g.stat, "p99.99");
        assert_eq!(g.threshold, Threshold::Value(5e6));
        let g: Gate = "Query Duration.mean < -250us".parse().unwrap();
        assert_eq!(g.threshold, Threshold::Change(-250e3));
        let g: Gate = "total (publish -> store_in).p99 <= 2ms".parse().unwrap();
        assert_eq!(
            (g.stage.as_str(), g.op),
            ("total (publish -> store_in)", Op::Le)
        );
    }

    #[test]
    fn thresholds_show_as_written() {
        let shown = |t: &str| t.parse::<Gate>().unwrap().threshold.shown();
        assert_eq!(shown("T.p99 > +10%"), "+10.0%");
        assert_eq!(shown("T.p99 > -250us"), "-250.0µs");
        assert_eq!(shown("T.p99 > +2ms"), "+2.0ms");
        assert_eq!(shown("T.p99 < 5ms"), "5.0ms");
    }

    #[test]
    fn bad_gates_say_what_is_wrong() {
        for (text, needle) in [
            ("Total.p99 10%", "operator"),
            ("Total.p42 > 1ms", "unknown statistic"),
            ("Total.p99 > 5", "unit"),
            ("p99 > 5ms", "<stage>.<stat>"),
        ] {
            let e = text.parse::<Gate>().unwrap_err().to_string();
            assert!(e.contains(needle), "{text}: {e}");
        }
    }
}
