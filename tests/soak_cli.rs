//! `hoptrace soak` for 30 seconds (15 through Kafka), every part a process of its own,
//! against the real Mosquitto and Kafka the test command starts: the counts add up
//! exactly, every process's CPU and RSS were sampled, and the report carries the soak's
//! targets and resources.

use std::sync::Mutex;

mod common;
use common::broker;

/// The soaks take both cores: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn soak(tag: &str, broker_url: &str, duration: &str, expect_broker: &str, expect_version: &str) {
    let _one = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = std::env::temp_dir().join(format!("hoptrace-soak-{tag}-{}", std::process::id()));
    let out = dir.join("report");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_hoptrace"))
        .args(["soak", "--broker", broker_url, "--duration", duration])
        .args([
            "--rate",
            "50k",
            "--metrics-per-message",
            "25",
            "--streams",
            "200",
        ])
        .args(["--warmup", "5s"])
        .arg("--runs")
        .arg(dir.join("runs"))
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "soak failed:\n{stdout}\n{stderr}");

    let soak: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("soak.json")).unwrap()).unwrap();
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap();
    // Exact accounting: what the publisher says it sent is what the run accounts for.
    let sent = soak["publisher"]["messages"].as_u64().unwrap();
    assert!(sent > 0, "{soak}");
    let a = &summary["accounting"];
    assert_eq!(a["sent"].as_u64(), Some(sent), "{a}");
    assert_eq!(a["sent_metrics"].as_u64(), Some(sent * 25), "{a}");
    let complete = a["complete"].as_u64().unwrap();
    let incomplete = a["incomplete"].as_u64().unwrap();
    let unseen = a["unseen"].as_u64().unwrap();
    assert_eq!(complete + incomplete + unseen, sent, "{a}");
    assert_eq!(a["adds_up"].as_bool(), Some(true), "{a}");
    assert_eq!(
        complete, sent,
        "QoS 0 on loopback with a drained pipeline loses nothing: {a}"
    );
    let counts = soak["targets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"].as_str().unwrap().starts_with("Counts add up"))
        .unwrap();
    assert_eq!(counts["met"].as_bool(), Some(true), "{counts}");
    assert_eq!(soak["drained"].as_bool(), Some(true), "{soak}");
    let version = soak["broker_version"].as_str().unwrap();
    assert!(
        version.starts_with(expect_version),
        "broker version {version:?}"
    );
    // Every stage measured every message.
    for st in summary["stages"].as_array().unwrap() {
        assert_eq!(st["count"].as_u64(), Some(complete), "{}", st["name"]);
    }

    // Every process sampled, the broker included, with CPU and memory.
    let roles: Vec<&str> = soak["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["process"].as_str().unwrap())
        .collect();
    for role in ["publisher", "processor", "store", "collector"] {
        assert!(roles.contains(&role), "{role} not sampled: {roles:?}");
    }
    assert!(
        roles
            .iter()
            .any(|r| r.starts_with("broker") && r.contains(expect_broker)),
        "the broker was not sampled: {roles:?}"
    );
    for r in soak["resources"].as_array().unwrap() {
        assert!(r["samples"].as_u64().unwrap() >= 10, "{r}");
        assert!(r["rss_max_bytes"].as_u64().unwrap() > 1_000_000, "{r}");
        assert!(r["cpu_mean"].as_f64().unwrap() > 0.0, "{r}");
    }
    let run_dir = dir.join("runs").join(soak["run_id"].as_str().unwrap());
    assert!(run_dir.join("resources.parquet").is_file());

    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    for needle in ["## Soak", "## Resources", "Counts add up", "RSS flat"] {
        assert!(md.contains(needle), "report.md lacks {needle:?}");
    }
    for f in [
        "charts/resources-cpu.vl.json",
        "charts/resources-rss.vl.json",
        "logs/collector.log",
        "publisher.json",
    ] {
        assert!(out.join(f).is_file(), "{f} missing");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "needs the brokers (infra/services.sh up; source infra/env.sh): infra/test.sh runs it"]
fn a_30_second_soak_through_mosquitto_adds_up() {
    let addr = broker("HOPTRACE_MQTT");
    soak(
        "mqtt",
        &format!("mqtt://{addr}"),
        "30s",
        "mosquitto",
        "mosquitto version 2.",
    );
}

#[test]
#[ignore = "needs the brokers (infra/services.sh up; source infra/env.sh): infra/test.sh runs it"]
fn a_15_second_soak_through_kafka_adds_up() {
    let addr = broker("HOPTRACE_KAFKA");
    soak(
        "kafka",
        &format!("kafka://{addr}/hoptrace-demo"),
        "15s",
        "java",
        "Apache Kafka 3.",
    );
}
