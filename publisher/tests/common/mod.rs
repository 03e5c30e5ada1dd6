//! Helpers of the publisher's integration tests: broker addresses from the environment,
//! an in-process collector, unique names.

#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use hoptrace_collector::{Collector, CollectorConfig};
use hoptrace_format::spec::PipelineSpec;
use hoptrace_probe::ExporterConfig;

// Each test file uses some of these.
#[allow(unused_imports)]
pub use hoptrace_testkit::{broker, closed_port, tempdir, unique_id};

pub mod mosquitto;

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
pub fn wait_for(what: &str, f: impl FnMut() -> bool) {
    hoptrace_testkit::wait_for(what, Duration::from_secs(30), f);
}

/// A shutdown flag.
pub fn flag() -> Arc<AtomicBool> {
    Arc::new(AtomicBool::new(false))
}
