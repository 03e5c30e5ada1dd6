//! The tail attribution finds an injected cause: the demo's processor stalls at a fixed
//! period, and the report names the seconds of the stalls, and no stream.

use std::collections::BTreeSet;

mod common;
use common::{failure, hoptrace_in, scratch, text};

/// `hoptrace demo ARGS --runs runs --out report` in `dir`; its `summary.json`.
fn demo(dir: &std::path::Path, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["demo"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--runs", "runs", "--out", "report"]);
    let o = hoptrace_in(dir, &all);
    assert!(o.status.success(), "{}", text(&o));
    serde_json::from_slice(&std::fs::read(dir.join("report/summary.json")).unwrap()).unwrap()
}

/// `demo --stall-every 4s --stall-for 40ms`: the P99 tail of Total Ingestion concentrates
/// in seconds four apart (the stalls), never in a stream.
#[test]
fn a_stalling_processor_is_named_by_the_seconds_of_its_stalls() {
    let dir = scratch("tail-stall");
    let summary = demo(
        &dir,
        &[
            "--duration",
            "17s",
            "--stall-every",
            "4s",
            "--stall-for",
            "40ms",
        ],
    );
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

/// `demo --store-clock-step 2ms --store-clock-step-at 8s`: the simulated store host's
/// clock moves by 2 ms mid-run. The report lists the step among its events (from the
/// host's clock reports, near +8 s), the P99 tail of Total Ingestion is named as lying
/// after it, and the stages that cross to the store move with it: Transmission's median
/// before the step and after it differ by about the step.
#[test]
fn a_clock_step_of_the_store_host_is_an_event_and_moves_the_stages_that_cross_it() {
    let dir = scratch("tail-clock-step");
    let summary = demo(
        &dir,
        &[
            "--duration",
            "16s",
            "--store-clock-step",
            "2ms",
            "--store-clock-step-at",
            "8s",
        ],
    );
    let events = summary["events"].as_array().unwrap();
    let steps: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| e["kind"] == "clock_offset_moved")
        .collect();
    assert_eq!(steps.len(), 1, "{events:?}");
    let step = steps[0];
    assert!(
        step["subject"].as_str().unwrap().ends_with("-store"),
        "{step}"
    );
    assert!(
        step["detail"].as_str().unwrap().contains("0ns → 2.0ms"),
        "{step}"
    );
    let md = std::fs::read_to_string(dir.join("report/report.md")).unwrap();
    assert!(md.contains("| clock offset moved |"), "{md}");
    // The P99 tail of Total Ingestion lies after the step: named as a likely cause.
    let p99 = &summary["tails"][0]["levels"][0];
    assert_eq!(p99["percentile"]["label"], "P99");
    let after: Vec<&serde_json::Value> = p99["concentration"]["dimensions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["dimension"] == "the time")
        .flat_map(|d| d["listed"].as_array().unwrap())
        .filter(|v| v["value"].as_str().unwrap().contains("clock offset moved"))
        .collect();
    assert_eq!(after.len(), 1, "{}", p99["concentration"]);
    assert!(
        after[0]["value"]
            .as_str()
            .unwrap()
            .starts_with("after clock offset moved of "),
        "{}",
        after[0]
    );
    assert_eq!(after[0]["likely_cause"], true, "{}", after[0]);

    // Transmission (flow_out → store_in) over the run's messages before and after the
    // step, from the Parquet with the run's own SQL.
    let run = std::fs::read_dir(dir.join("runs"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let at = step["at_unix_ns"].as_i64().unwrap();
    let median = |cmp: &str| {
        let o = hoptrace_in(
            &dir,
            &[
                "sql",
                run.to_str().unwrap(),
                "--format",
                "csv",
                &format!(
                    "SELECT median(CAST(store_in_ns AS BIGINT) - CAST(flow_out_ns AS BIGINT)) AS m FROM traces \
                     WHERE CAST(publish_ns AS BIGINT) {cmp} {} ",
                    if cmp == "<" {
                        at - 1_500_000_000
                    } else {
                        at + 1_500_000_000
                    }
                ),
            ],
        );
        assert!(o.status.success(), "{}", failure(&o));
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .nth(1)
            .unwrap()
            .trim()
            .parse::<f64>()
            .unwrap()
    };
    let moved = median(">") - median("<");
    assert!(
        (1_500_000.0..2_500_000.0).contains(&moved),
        "Transmission's median moved by {moved} ns"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
