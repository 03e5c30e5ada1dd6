//! The tail attribution finds an injected cause: the demo's processor stalls at a fixed
//! period, and the report names the seconds of the stalls, and no stream.

use std::collections::BTreeSet;

mod common;
use common::{failure, hoptrace_in, scratch, text};

/// `demo --stall-every 4s --stall-for 40ms`: the P99 tail of Total Ingestion concentrates
/// in seconds four apart (the stalls), never in a stream.
#[test]
fn a_stalling_processor_is_named_by_the_seconds_of_its_stalls() {
    let dir = scratch("tail-stall");
    let o = hoptrace_in(
        &dir,
        &[
            "demo",
            "--duration",
            "17s",
            "--stall-every",
            "4s",
            "--stall-for",
            "40ms",
            "--runs",
            "runs",
            "--out",
            "report",
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("report/summary.json")).unwrap()).unwrap();
    let p99 = &summary["tails"][0]["levels"][0];
    assert_eq!(p99["percentile"]["label"], "P99");
    let c = &p99["concentration"];
    let mut seconds = BTreeSet::new();
    for d in c["dimensions"].as_array().unwrap() {
        for v in d["listed"].as_array().unwrap() {
            if v["likely_cause"].as_bool().unwrap() {
                assert_eq!(d["dimension"], "second", "a stall slows every stream: {c}");
                let s = v["value"].as_str().unwrap();
                seconds.insert(
                    s.trim_matches(|ch| ch == '+' || ch == ' ' || ch == 's')
                        .parse::<i64>()
                        .unwrap(),
                );
            }
        }
    }
    // At least two stalls named, four seconds apart (a stall straddling a second's end
    // may name the next one).
    let apart = seconds.iter().any(|a| {
        seconds
            .iter()
            .any(|b| b > a && [3, 4, 5, 7, 8, 9].contains(&(b - a)))
    });
    assert!(apart, "flagged seconds {seconds:?}: {c}");
    let md = std::fs::read_to_string(dir.join("report/report.md")).unwrap();
    assert!(md.contains("It concentrates in second +"), "{md}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A stall needs both its period and its length.
#[test]
fn a_stall_without_its_length_is_refused() {
    let dir = scratch("tail-stall-half");
    let err = failure(&hoptrace_in(&dir, &["demo", "--stall-every", "2s"]));
    assert!(err.contains("--stall-for"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
