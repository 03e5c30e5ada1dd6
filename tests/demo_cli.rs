//! `hoptrace demo` as a user runs it, against the real Mosquitto and the real Kafka the
//! test command starts: the report's counts add up to what was published and every stage
//! of the reference pipeline is measured for every message.

use std::path::Path;
use std::process::Command;

mod common;
use common::broker;

/// Runs the demo through `broker_url` and returns its summary.json.
fn demo(tag: &str, broker_url: &str) -> serde_json::Value {
    let dir = std::env::temp_dir().join(format!("hoptrace-demo-cli-{tag}-{}", std::process::id()));
    let out = dir.join("report");
    let output = Command::new(env!("CARGO_BIN_EXE_hoptrace"))
        .args([
            "demo",
            "--broker",
            broker_url,
            "--duration",
            "3s",
            "--rate",
            "40k",
        ])
        .args(["--metrics-per-message", "10", "--streams", "50"])
        .arg("--runs")
        .arg(dir.join("runs"))
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "demo failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("adds up"), "{stdout}");
    for f in [
        "report.md",
        "report.html",
        "summary.json",
        "charts/latency-cdf.vl.json",
    ] {
        assert!(out.join(f).is_file(), "{f} missing");
    }
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap();
    remove(&dir);
    summary
}

fn remove(dir: &Path) {
    let _ = std::fs::remove_dir_all(dir);
}

fn check(summary: &serde_json::Value) {
    let a = &summary["accounting"];
    let sent = a["sent"].as_u64().unwrap();
    assert!(sent > 0, "{a}");
    assert_eq!(a["complete"].as_u64(), Some(sent), "{a}");
    assert_eq!(a["incomplete"].as_u64(), Some(0), "{a}");
    assert_eq!(a["unseen"].as_u64(), Some(0), "{a}");
    assert_eq!(a["adds_up"].as_bool(), Some(true), "{a}");
    assert_eq!(a["sent_metrics"].as_u64(), Some(sent * 10), "{a}");
    let stages = summary["stages"].as_array().unwrap();
    let names: Vec<&str> = stages.iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "Broker Time",
            "Flow Internal",
            "Transmission",
            "Total Ingestion",
            "Query Duration"
        ]
    );
    for s in stages {
        assert_eq!(s["count"].as_u64(), Some(sent), "{}", s["name"]);
        assert_eq!(s["negative"].as_u64(), Some(0), "{}", s["name"]);
        let p50 = s["percentiles"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["label"] == "P50")
            .unwrap();
        assert!(p50["value_ns"].as_u64().unwrap() > 0, "{}", s["name"]);
        // One host, one clock.
        assert_eq!(s["clock_uncertainty_ns"].as_u64(), Some(0), "{}", s["name"]);
    }
    // Total ingestion spans the stages before it.
    let p = |i: usize, what: &str| stages[i][what].as_f64().unwrap();
    assert!(p(3, "mean_ns") >= p(0, "mean_ns") + p(1, "mean_ns") + p(2, "mean_ns") - 1.0);
}

#[test]
#[ignore = "needs the brokers (infra/services.sh up; source infra/env.sh): infra/test.sh runs it"]
fn demo_through_mosquitto() {
    let addr = broker("HOPTRACE_MQTT");
    check(&demo("mosquitto", &format!("mqtt://{addr}?qos=1")));
}

#[test]
#[ignore = "needs the brokers (infra/services.sh up; source infra/env.sh): infra/test.sh runs it"]
fn demo_through_kafka() {
    let addr = broker("HOPTRACE_KAFKA");
    check(&demo("kafka", &format!("kafka://{addr}/hoptrace-demo")));
}

/// The store simulated on a host whose clock is 5 s behind, through the broker in the
/// process: every message still completes and is counted, the stages that cross into the
/// store host turn negative and are flagged, and the report puts the store host's clock
/// bound beside them, while stages within one host have no clock uncertainty.
#[test]
fn a_skewed_store_host_shows_in_the_report() {
    let dir = std::env::temp_dir().join(format!("hoptrace-demo-skew-{}", std::process::id()));
    let out = dir.join("report");
    let output = Command::new(env!("CARGO_BIN_EXE_hoptrace"))
        .args([
            "demo",
            "--duration",
            "2s",
            "--rate",
            "20k",
            "--metrics-per-message",
            "10",
        ])
        .args([
            "--streams",
            "20",
            "--store-clock-offset=-5s",
            "--store-clock-bound",
            "2ms",
        ])
        .arg("--runs")
        .arg(dir.join("runs"))
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let s: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap();
    remove(&dir);
    let a = &s["accounting"];
    let sent = a["sent"].as_u64().unwrap();
    assert!(sent > 0 && a["complete"].as_u64() == Some(sent), "{a}");
    assert_eq!(a["negative_deltas"].as_u64(), Some(sent), "{a}");
    let stage = |name: &str| {
        s["stages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["name"] == name)
            .unwrap()
            .clone()
    };
    for crossing in ["Transmission", "Total Ingestion"] {
        let st = stage(crossing);
        assert_eq!(st["negative"].as_u64(), Some(sent), "{crossing}");
        assert!(
            st["clock_uncertainty_ns"].as_u64().unwrap() >= 2_000_000,
            "{crossing}: {st}"
        );
    }
    for within in ["Flow Internal", "Query Duration"] {
        let st = stage(within);
        assert_eq!(st["negative"].as_u64(), Some(0), "{within}");
        assert_eq!(st["clock_uncertainty_ns"].as_u64(), Some(0), "{within}");
    }
    let warnings = s["warnings"].to_string();
    assert!(warnings.contains("negative"), "{warnings}");
}
