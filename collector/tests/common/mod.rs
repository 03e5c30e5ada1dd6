//! What the collector's in-process tests share.

#![allow(dead_code)] // not every test file uses every helper

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
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

/// A CA, and a certificate it signs for `names`; written as PEM under `dir` with `prefix`.
/// Returns (ca.pem, cert.pem, key.pem).
pub fn make_pki(dir: &Path, prefix: &str, names: &[&str]) -> (PathBuf, PathBuf, PathBuf) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, format!("{prefix} test CA"));
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let key = rcgen::KeyPair::generate().unwrap();
    let params =
        rcgen::CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())
            .unwrap();
    let cert = params.signed_by(&key, &issuer).unwrap();
    let paths = (
        dir.join(format!("{prefix}-ca.pem")),
        dir.join(format!("{prefix}-cert.pem")),
        dir.join(format!("{prefix}-key.pem")),
    );
    std::fs::write(&paths.0, ca.pem()).unwrap();
    std::fs::write(&paths.1, cert.pem()).unwrap();
    std::fs::write(&paths.2, key.serialize_pem()).unwrap();
    paths
}
