//! What the collector's in-process tests share.

use std::net::SocketAddr;
use std::time::Duration;

use hoptrace_format::spec::PipelineSpec;
use hoptrace_probe::testing::ManualClock;
use hoptrace_probe::{Exporter, ExporterConfig, HopId, Probe};

/// An exporter named `process` connected to the collector at `addr`, announcing every hop
/// of `spec`, and one probe per hop (in the spec's order) reading one manual clock.
pub fn manual_probes(
    spec: &PipelineSpec,
    addr: SocketAddr,
    process: &str,
) -> (Exporter, Vec<Probe<ManualClock>>, ManualClock) {
    let hops: Vec<(HopId, &str)> = spec
        .hops
        .iter()
        .enumerate()
        .map(|(i, h)| (HopId(h.id.unwrap_or(i as u8)), h.name.as_str()))
        .collect();
    let mut ecfg = ExporterConfig::new(addr.to_string(), process);
    ecfg.backoff_min = Duration::from_millis(5);
    let exporter = Exporter::start(ecfg, &hops).unwrap();
    let clock = ManualClock::new(0);
    let probes = hops
        .iter()
        .map(|(h, _)| exporter.probe_with_clock(*h, clock.clone()).unwrap())
        .collect();
    (exporter, probes, clock)
}
