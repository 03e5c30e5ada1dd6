//! Helpers of the publisher's integration tests: broker addresses from the environment,
//! an in-process collector, unique names.

#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use hoptrace_collector::{Collector, CollectorConfig};
use hoptrace_format::spec::PipelineSpec;
use hoptrace_probe::HopId;
use hoptrace_publisher::CollectorLink;

// Each test file uses some of these.
#[allow(unused_imports)]
pub use hoptrace_testkit::{broker, closed_port, tempdir, unique_id};

/// A collector on a loopback port for the pipeline `publish` (hop 0) -> `broker` (hop 1).
pub fn collector(dir: &std::path::Path) -> Collector {
    let spec = PipelineSpec::chain("publisher-test", &["publish".into(), "broker".into()]).unwrap();
    let mut cfg = CollectorConfig::new("127.0.0.1:0", spec, dir);
    cfg.run_id = Some("test".into());
    cfg.stop_timeout = Duration::from_secs(5);
    Collector::start(cfg).unwrap()
}

/// The link of hop `id` named `name` to `collector`.
pub fn link(collector: &Collector, id: u8, name: &str) -> CollectorLink {
    let mut l = CollectorLink::new(collector.local_addr().to_string());
    l.hop = (HopId(id), name.to_owned());
    l
}

/// Waits (polling a condition, never a fixed sleep) until `f` holds or 30 s pass.
pub fn wait_for(what: &str, f: impl FnMut() -> bool) {
    hoptrace_testkit::wait_for(what, Duration::from_secs(30), f);
}

/// A shutdown flag.
pub fn flag() -> Arc<AtomicBool> {
    Arc::new(AtomicBool::new(false))
}
