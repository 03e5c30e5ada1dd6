//! The soak's targets, each met or not: the rate achieved, counts that add up, a flat
//! collector RSS, Parquet bytes per trace and the time of the report.

use hoptrace_analysis::resources::{self, ProcessResources};
use hoptrace_analysis::summary::{AccountingSummary, DataRead};
use hoptrace_format::units;
use serde::{Deserialize, Serialize};

/// Parquet bytes per trace the soak aims at.
pub const TARGET_BYTES_PER_TRACE: f64 = 16.0;
/// Seconds the whole-run report may take.
pub const TARGET_REPORT_S: f64 = 60.0;
/// Achieved / target rate the publisher must reach.
pub const TARGET_RATE_RATIO: f64 = 0.99;
/// Share of the messages sent whose traces must be complete (every hop seen).
pub const TARGET_COMPLETE_FRACTION: f64 = 0.999;
/// Traces below which Parquet bytes per trace is not judged: a file's footer, schema and
/// row-group statistics are a few kilobytes whatever it holds, so a short run measures
/// them, not the encoding of a trace (10,000 traces at 4 KiB of overhead add 0.4 bytes).
pub const MIN_TRACES_FOR_SIZE: u64 = 100_000;
/// Collector samples (one a second) below which "RSS flat" is not judged:
/// a slope over less than a minute says nothing of a 30-minute run.
pub const MIN_SAMPLES_FOR_RSS: u64 = 60;

/// Whether `complete` of `sent` messages is at least [`TARGET_COMPLETE_FRACTION`] (and
/// something was sent), in integers: `complete / sent >= 999 / 1000`.
#[must_use]
pub fn complete_enough(complete: u64, sent: u64) -> bool {
    sent > 0 && u128::from(complete) * 1000 >= u128::from(sent) * 999
}

/// The completeness target's measured figure: complete of sent, and which hops the
/// incomplete traces miss (the hop that broke first is the one most miss).
#[must_use]
pub fn completeness(a: &AccountingSummary) -> String {
    let mut missing: Vec<(&String, &u64)> = a.missing_by_hop.iter().collect();
    missing.sort_by(|x, y| y.1.cmp(x.1).then(x.0.cmp(y.0)));
    format!(
        "{} of {} ({:.3} %){}",
        a.complete,
        a.sent,
        if a.sent > 0 {
            a.complete as f64 / a.sent as f64 * 100.0
        } else {
            0.0
        },
        if missing.is_empty() {
            String::new()
        } else {
            format!(
                "; incomplete traces miss {}",
                missing
                    .iter()
                    .map(|(h, n)| format!("{h} ({n})"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }
    )
}

/// One of the soak's targets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Target {
    /// What is measured.
    pub name: String,
    /// The target.
    pub target: String,
    /// The measured figure.
    pub measured: String,
    /// Whether it was met.
    pub met: bool,
    /// Why the run is too short to judge this target (it is then neither met nor missed,
    /// whatever `met` says of the figure): `None` when it was judged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_judged: Option<String>,
}

impl Target {
    /// Whether the target was judged and missed: what makes a soak fail.
    #[must_use]
    pub fn missed(&self) -> bool {
        self.not_judged.is_none() && !self.met
    }

    /// "met", "MISSED", or "not judged (why)".
    #[must_use]
    pub fn verdict(&self) -> String {
        match &self.not_judged {
            Some(why) => format!("not judged ({why})"),
            None if self.met => "met".into(),
            None => "MISSED".into(),
        }
    }
}

/// What the targets are judged on.
#[derive(Debug, Clone, Copy)]
pub struct Measures<'a> {
    /// The target rate, metrics per second.
    pub target_metrics_per_s: u64,
    /// The rate the publisher achieved over the run, metrics per second.
    pub achieved_metrics_per_s: f64,
    /// Messages the publisher says it sent.
    pub sent: u64,
    /// Where the run's messages ended up, as the report found.
    pub accounting: &'a AccountingSummary,
    /// The Parquet the report read.
    pub data: &'a DataRead,
    /// Per-process resources.
    pub resources: &'a [ProcessResources],
    /// Seconds the report took.
    pub report_s: f64,
}

/// Every target, judged on `m`.
#[must_use]
pub fn evaluate(m: &Measures<'_>) -> Vec<Target> {
    let ratio = m.achieved_metrics_per_s / m.target_metrics_per_s as f64;
    let a = m.accounting;
    let bytes_per_trace = m.data.bytes as f64 / m.data.rows.max(1) as f64;
    let collector = m.resources.iter().find(|p| p.process == "collector");
    vec![
        Target {
            name: "Achieved / target rate over the whole run".into(),
            target: format!(">= {TARGET_RATE_RATIO}"),
            measured: format!(
                "{ratio:.4} ({} of {} metrics/s)",
                units::rate(m.achieved_metrics_per_s),
                units::rate(m.target_metrics_per_s as f64)
            ),
            met: ratio >= TARGET_RATE_RATIO,
            not_judged: None,
        },
        Target {
            name: "Counts add up (sent = complete + incomplete + dropped)".into(),
            target: "exactly".into(),
            measured: format!(
                "sent {} = complete {} + incomplete {} + unseen {}; lost by probes {}",
                a.sent, a.complete, a.incomplete, a.unseen, a.records_lost_by_probes
            ),
            met: a.adds_up && a.sent == m.sent,
            not_judged: None,
        },
        Target {
            name: "Complete traces (every hop seen)".into(),
            target: format!(">= {:.1} % of sent", TARGET_COMPLETE_FRACTION * 100.0),
            measured: completeness(a),
            met: complete_enough(a.complete, a.sent),
            not_judged: None,
        },
        Target {
            name: "Collector RSS flat after warm-up".into(),
            target: format!(
                "growth <= {:.0} % of its mean (or {:.0} MiB)",
                resources::FLAT_GROWTH_FRACTION * 100.0,
                resources::FLAT_GROWTH_FLOOR_BYTES / 1_048_576.0
            ),
            measured: collector.map_or_else(
                || "not sampled".into(),
                |p| {
                    format!(
                        "{:.1} MiB/min slope, mean {:.0} MiB, max {:.0} MiB",
                        p.rss_slope_bytes_per_min / 1_048_576.0,
                        p.rss_mean_bytes as f64 / 1_048_576.0,
                        p.rss_max_bytes as f64 / 1_048_576.0
                    )
                },
            ),
            met: collector.is_some_and(|p| p.rss_flat),
            not_judged: collector
                .filter(|p| p.samples < MIN_SAMPLES_FOR_RSS)
                .map(|p| {
                    format!(
                        "{} samples, fewer than {MIN_SAMPLES_FOR_RSS}",
                        p.samples
                    )
                }),
        },
        Target {
            name: "Parquet bytes per trace".into(),
            target: format!("<= {TARGET_BYTES_PER_TRACE}"),
            measured: format!(
                "{bytes_per_trace:.2} ({} bytes, {} traces)",
                m.data.bytes, m.data.rows
            ),
            met: bytes_per_trace <= TARGET_BYTES_PER_TRACE,
            not_judged: (m.data.rows < MIN_TRACES_FOR_SIZE).then(|| {
                format!(
                    "{} traces, fewer than {MIN_TRACES_FOR_SIZE}: the files' fixed overhead dominates",
                    m.data.rows
                )
            }),
        },
        Target {
            name: "Report over the whole run".into(),
            target: format!("<= {TARGET_REPORT_S:.0} s"),
            measured: format!("{:.1} s", m.report_s),
            met: m.report_s <= TARGET_REPORT_S,
            not_judged: None,
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accounting(sent: u64, complete: u64, adds_up: bool) -> AccountingSummary {
        serde_json::from_value(serde_json::json!({
            "sent": sent, "sent_metrics": sent * 10, "complete": complete,
            "incomplete": sent - complete, "missing_by_hop": {}, "unseen": 0,
            "records_lost_by_probes": 0, "duplicates": 0, "negative_deltas": 0,
            "late_records": 0, "unknown_hop_records": 0, "adds_up": adds_up,
        }))
        .unwrap()
    }

    fn collector(flat: bool) -> ProcessResources {
        ProcessResources {
            process: "collector".into(),
            pid: 1,
            samples: 120,
            cpu_mean: 0.2,
            cpu_max: 0.4,
            rss_mean_bytes: 50 << 20,
            rss_max_bytes: 60 << 20,
            rss_end_bytes: 55 << 20,
            rss_slope_bytes_per_min: 1_048_576.0,
            rss_flat: flat,
        }
    }

    #[test]
    fn a_good_soak_meets_every_target() {
        let (a, data, res) = (
            accounting(1000, 1000, true),
            DataRead {
                files: 1,
                bytes: 1_600_000,
                rows: 200_000,
            },
            [collector(true)],
        );
        let a = AccountingSummary {
            sent: 200_000,
            complete: 200_000,
            incomplete: 0,
            ..a
        };
        let t = evaluate(&Measures {
            target_metrics_per_s: 100_000,
            achieved_metrics_per_s: 99_500.0,
            sent: 200_000,
            accounting: &a,
            data: &data,
            resources: &res,
            report_s: 2.5,
        });
        assert_eq!(t.len(), 6);
        assert!(t.iter().all(|t| t.met && !t.missed()), "{t:#?}");
        assert!(t.iter().all(|t| t.verdict() == "met"), "{t:#?}");
        assert_eq!(t[0].measured, "0.9950 (99.5k of 100.0k metrics/s)");
        assert_eq!(t[2].measured, "200000 of 200000 (100.000 %)");
        assert_eq!(t[4].measured, "8.00 (1600000 bytes, 200000 traces)");
        assert_eq!(t[5].measured, "2.5 s");
    }

    #[test]
    fn each_target_can_be_missed() {
        let (a, data, res) = (
            accounting(1000, 990, false),
            DataRead {
                files: 1,
                bytes: 1_700_000,
                rows: 100_000,
            },
            [collector(false)],
        );
        let t = evaluate(&Measures {
            target_metrics_per_s: 100_000,
            achieved_metrics_per_s: 98_000.0,
            sent: 1001,
            accounting: &a,
            data: &data,
            resources: &res,
            report_s: 61.0,
        });
        assert!(t.iter().all(Target::missed), "{t:#?}");
        assert_eq!(t[4].verdict(), "MISSED");
        // Without a collector sample its target cannot be met.
        let t = evaluate(&Measures {
            resources: &[],
            ..Measures {
                target_metrics_per_s: 1,
                achieved_metrics_per_s: 1.0,
                sent: 1000,
                accounting: &accounting(1000, 1000, true),
                data: &data,
                resources: &res,
                report_s: 1.0,
            }
        });
        assert_eq!(t[3].measured, "not sampled");
        assert!(t[3].missed());
    }

    #[test]
    fn a_short_run_does_not_judge_size_or_growth() {
        // A few seconds at a few hundred messages: the Parquet footer is most of the bytes
        // and the collector was sampled a handful of times.
        let (a, data) = (
            accounting(1000, 1000, true),
            DataRead {
                files: 1,
                bytes: 40_000,
                rows: 1000,
            },
        );
        let mut short = collector(false);
        short.samples = 8;
        let t = evaluate(&Measures {
            target_metrics_per_s: 200,
            achieved_metrics_per_s: 200.0,
            sent: 1000,
            accounting: &a,
            data: &data,
            resources: &[short],
            report_s: 1.0,
        });
        assert!(!t[4].met && !t[4].missed(), "{t:#?}");
        assert_eq!(
            t[4].verdict(),
            "not judged (1000 traces, fewer than 100000: the files' fixed overhead dominates)"
        );
        assert!(!t[3].missed());
        assert_eq!(t[3].verdict(), "not judged (8 samples, fewer than 60)");
        assert!(t.iter().filter(|t| t.not_judged.is_none()).all(|t| t.met));
    }

    #[test]
    fn completeness_names_the_hop_the_incomplete_traces_miss() {
        // The reference pipeline with its processor subscribed elsewhere: nothing passed
        // flow_in, so every hop after it is missing too.
        let mut a = accounting(1_800_000, 0, true);
        a.missing_by_hop = [
            ("flow_in", 1_800_000),
            ("store_in", 1_800_000),
            ("broker", 3),
        ]
        .into_iter()
        .map(|(h, n)| (h.to_owned(), n))
        .collect();
        assert!(!complete_enough(a.complete, a.sent));
        assert_eq!(
            completeness(&a),
            "0 of 1800000 (0.000 %); incomplete traces miss flow_in (1800000), store_in (1800000), broker (3)"
        );
        assert!(complete_enough(999, 1000) && !complete_enough(998, 1000));
        assert!(!complete_enough(0, 0), "nothing sent is not complete");
    }
}
