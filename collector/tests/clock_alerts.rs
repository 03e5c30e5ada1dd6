//! The collector's clock preflight of probe hosts: a probe whose clock status is
//! unsynchronised, or whose bound is too large, is recorded once per host and reason in
//! run.json's `clock_alerts`; a good clock is not.

use std::time::Duration;

use hoptrace_collector::{Collector, CollectorConfig};
use hoptrace_format::spec::PipelineSpec;
use hoptrace_probe::clock::ClockSource;
use hoptrace_probe::{ClockReporting, ClockStatus, Exporter, ExporterConfig, HopId};

fn exporter(addr: &str, process: &str, synced: bool, bound_ns: u64) -> Exporter {
    let status = ClockStatus {
        source: ClockSource::Injected,
        synced,
        error_bound_ns: bound_ns,
        detail: "test".into(),
        ..ClockStatus::default()
    };
    let mut c = ExporterConfig::new(addr, process);
    c.clock_interval = Duration::from_millis(10);
    c.clock = ClockReporting::Fixed(status);
    Exporter::start(c, &[(HopId(0), "publish")]).unwrap()
}

#[test]
fn probe_hosts_that_fail_the_clock_check_are_recorded_once() {
    let dir = std::env::temp_dir().join(format!("hoptrace-clock-alerts-{}", std::process::id()));
    let mut cfg = CollectorConfig::new("127.0.0.1:0", PipelineSpec::default_pipeline(), &dir);
    cfg.run_id = Some("alerts".into());
    cfg.max_clock_error_ns = Some(100_000);
    let collector = Collector::start(cfg).unwrap();
    let addr = collector.local_addr().to_string();
    // Three exporters on this one host: fine, unsynchronised, too uncertain. Each sends a
    // clock status every 10 ms.
    let good = exporter(&addr, "good", true, 5_000);
    let unsynced = exporter(&addr, "unsynced", false, 5_000);
    let loose = exporter(&addr, "loose", true, 2_000_000);
    // All three connected, then readings taken 50 ms (five intervals) later: each has
    // reported its clock several times.
    hoptrace_testkit::wait_for("three connections", Duration::from_secs(10), || {
        collector.live().connections >= 3
    });
    let after = hoptrace_clock::realtime_ns() + 50_000_000;
    hoptrace_testkit::wait_for("later clock readings", Duration::from_secs(10), || {
        collector
            .live()
            .clocks
            .iter()
            .any(|c| c.at_unix_ns.is_some_and(|t| t >= after))
    });
    for e in [good, unsynced, loose] {
        assert!(e.shutdown().clean);
    }
    let run = collector.stop().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(run.clock.len() >= 6, "{} clock rows", run.clock.len());
    assert_eq!(run.clock_alerts.len(), 2, "{:?}", run.clock_alerts);
    assert!(
        run.clock_alerts[0].contains("not synchronised")
            || run.clock_alerts[1].contains("not synchronised")
    );
    assert!(
        run.clock_alerts
            .iter()
            .any(|a| a.contains("exceeds the allowed 100.0µs")),
        "{:?}",
        run.clock_alerts
    );
}
