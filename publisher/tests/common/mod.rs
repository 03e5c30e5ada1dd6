//! Helpers of the publisher's integration tests: broker addresses from the environment,
//! an in-process collector, unique names.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use hoptrace_collector::{Collector, CollectorConfig};
use hoptrace_format::spec::PipelineSpec;
use hoptrace_probe::ExporterConfig;

/// `host:port` of a broker from the environment; `None` skips the test unless
/// integration tests are required (`HOPTRACE_INTEGRATION=1`), which makes it a failure.
pub fn broker(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!("{var} is not set: this test needs the brokers (infra/services.sh up; source infra/env.sh), as infra/test.sh does")
    })
}

/// A publisher id unlikely to collide with earlier runs on the same broker.
pub fn unique_id() -> u16 {
    let id =
        (std::process::id() as u16) ^ (hoptrace_probe::clock::realtime_ns() as u16).rotate_left(5);
    id.max(1)
}

/// A fresh directory under the system temp dir.
pub fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "hoptrace-pub-{tag}-{}-{}",
        std::process::id(),
        hoptrace_probe::clock::realtime_ns()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A collector on a loopback port for the pipeline `publish` (hop 0) -> `broker` (hop 1).
pub fn collector(dir: &std::path::Path) -> Collector {
    let spec = PipelineSpec::chain("publisher-test", &["publish".into(), "broker".into()]).unwrap();
    let mut cfg = CollectorConfig::new("127.0.0.1:0", spec, dir);
    cfg.run_id = Some("test".into());
    cfg.stop_timeout = Duration::from_secs(5);
    Collector::start(cfg).unwrap()
}

/// A link to `collector` (the publisher and the tap report their default hops, 0
/// `publish` and 1 `broker`, as the collector's pipeline declares them).
pub fn link(collector: &Collector) -> ExporterConfig {
    ExporterConfig::new(collector.local_addr().to_string(), "publisher-test")
}

/// Waits (polling a condition, never a fixed sleep) until `f` holds or 30 s pass.
pub fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A shutdown flag.
pub fn flag() -> Arc<AtomicBool> {
    Arc::new(AtomicBool::new(false))
}

/// A loopback port nothing listens on.
pub fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}
