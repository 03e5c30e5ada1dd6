//! The collector over TLS (rustls): probes that trust its CA deliver every record; a
//! plain-text probe, an untrusted or misnamed certificate, a wrong token and a silent
//! connection are each refused and counted, and none of them disturbs the good probes.

mod common;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::make_pki;
use hoptrace_collector::{Collector, CollectorConfig, CollectorError};
use hoptrace_format::spec::PipelineSpec;
use hoptrace_probe::{Exporter, ExporterConfig, ExporterError, HopId, TraceContext, TraceKey};

fn tempdir(name: &str) -> PathBuf {
    hoptrace_testkit::tempdir(&format!("tls-{name}"))
}

fn exporter(addr: &str, token: &str, ca: Option<&Path>, name: Option<&str>) -> Exporter {
    let mut c = ExporterConfig::new(addr, "tls-test");
    c.token = Some(token.into());
    c.tls_ca = ca.map(Path::to_path_buf);
    c.tls_server_name = name.map(str::to_owned);
    c.backoff_min = Duration::from_millis(20);
    Exporter::start(c, &[(HopId(0), "publish")])
        .unwrap()
        .with_shutdown_timeout(Duration::from_millis(200))
}

/// Waits until the exporter connects (`Ok`) or has failed with an error (`Err`).
fn outcome(e: &Exporter) -> Result<(), String> {
    let mut out = None;
    hoptrace_testkit::wait_for("a connection or an error", Duration::from_secs(5), || {
        out = if e.is_connected() {
            Some(Ok(()))
        } else {
            e.last_error().map(Err)
        };
        out.is_some()
    });
    out.expect("waited for")
}

#[test]
fn tls_probes_deliver_and_every_bad_peer_is_refused_and_counted() {
    let tmp = tempdir("refuse");
    let (ca, cert, key) = make_pki(&tmp, "good", &["127.0.0.1", "collector.test"]);
    let (other_ca, _, _) = make_pki(&tmp, "other", &["127.0.0.1"]);
    let mut cfg = CollectorConfig::new("127.0.0.1:0", PipelineSpec::default_pipeline(), &tmp);
    cfg.token = Some("s3cret".into());
    cfg.tls_cert = Some(cert);
    cfg.tls_key = Some(key);
    cfg.hello_timeout = Duration::from_secs(1);
    let collector = Collector::start(cfg).unwrap();
    let addr = collector.local_addr().to_string();

    // Two good probes: one names the collector by its IP, one by its DNS name.
    let good = exporter(&addr, "s3cret", Some(&ca), None);
    assert_eq!(outcome(&good), Ok(()));
    let named = exporter(&addr, "s3cret", Some(&ca), Some("collector.test"));
    assert_eq!(outcome(&named), Ok(()));

    // Refused: each with the reason the probe sees.
    let plain = exporter(&addr, "s3cret", None, None);
    let err = outcome(&plain).unwrap_err();
    assert!(err.contains("welcome"), "a plain-text probe: {err}");
    let untrusted = exporter(&addr, "s3cret", Some(&other_ca), None);
    let err = outcome(&untrusted).unwrap_err();
    assert!(
        err.contains("TLS handshake") && err.contains("UnknownIssuer"),
        "untrusted CA: {err}"
    );
    let misnamed = exporter(&addr, "s3cret", Some(&ca), Some("elsewhere.test"));
    let err = outcome(&misnamed).unwrap_err();
    assert!(err.contains("not valid for name"), "wrong name: {err}");
    let wrong_token = exporter(&addr, "guess", Some(&ca), None);
    let err = outcome(&wrong_token).unwrap_err();
    assert!(
        err.contains("token"),
        "the reject reason comes through TLS: {err}"
    );
    for e in [plain, untrusted, misnamed, wrong_token] {
        drop(e);
    }

    // A silent connection is closed at the handshake deadline; garbage fails the handshake.
    let started = Instant::now();
    let mut silent = std::net::TcpStream::connect(&addr).unwrap();
    silent
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut buf = Vec::new();
    let _ = silent.read_to_end(&mut buf);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    let mut garbage = std::net::TcpStream::connect(&addr).unwrap();
    garbage.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    garbage
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let _ = garbage.read_to_end(&mut buf);

    // The good probes were served throughout.
    for (i, e) in [&good, &named].into_iter().enumerate() {
        let p = e.probe(HopId(0)).unwrap();
        for seq in 0..500u64 {
            let mut ctx = TraceContext::new(
                TraceKey {
                    publisher: 1,
                    stream: i as u32,
                    sequence: seq,
                },
                1,
                0,
            );
            assert!(p.record(&mut ctx).queued);
        }
    }
    assert!(good.shutdown().clean);
    assert!(named.shutdown().clean);
    let summary = collector.stop().unwrap();
    assert_eq!(summary.accounting.records_by_hop["publish"], 1000);
    let c = &summary.connections;
    assert!(
        c["tls_failed"] >= 3,
        "plain, untrusted, misnamed, garbage: {c:?}"
    );
    assert!(c["bad_token"] >= 1, "{c:?}");
    assert_eq!(c["hello_timeout"], 1, "{c:?}");
    let _ = std::fs::remove_dir_all(&tmp);
}

#[test]
fn unusable_tls_settings_are_named_before_anything_runs() {
    let tmp = tempdir("settings");
    let (ca, cert, key) = make_pki(&tmp, "a", &["127.0.0.1"]);
    let (_, other_cert, _) = make_pki(&tmp, "b", &["127.0.0.1"]);
    let start = |cert: Option<&Path>, key: Option<&Path>| {
        let mut cfg = CollectorConfig::new("127.0.0.1:0", PipelineSpec::default_pipeline(), &tmp);
        cfg.tls_cert = cert.map(Path::to_path_buf);
        cfg.tls_key = key.map(Path::to_path_buf);
        Collector::start(cfg)
    };
    let Err(err) = start(Some(&cert), None) else {
        panic!("a cert without a key");
    };
    assert!(matches!(err, CollectorError::Tls(_)), "{err}");
    let Err(err) = start(Some(&other_cert), Some(&key)) else {
        panic!("a key of another certificate");
    };
    assert!(err.to_string().contains("b-cert.pem"), "{err}");
    let Err(err) = start(Some(&tmp.join("none.pem")), Some(&key)) else {
        panic!("a missing file");
    };
    assert!(err.to_string().contains("none.pem"), "{err}");

    let mut c = ExporterConfig::new("127.0.0.1:7400", "t");
    c.tls_ca = Some(cert.clone());
    c.tls_server_name = Some("not a name!".into());
    let Err(err) = Exporter::start(c, &[(HopId(0), "publish")]) else {
        panic!("a bad server name");
    };
    assert!(
        matches!(&err, ExporterError::Tls(m) if m.contains("not a name!")),
        "{err}"
    );
    let mut c = ExporterConfig::new("127.0.0.1:7400", "t");
    c.tls_ca = Some(key);
    let Err(err) = Exporter::start(c, &[(HopId(0), "publish")]) else {
        panic!("a CA file without certificates");
    };
    assert!(err.to_string().contains("a-key.pem"), "{err}");
    drop(ca);
    let _ = std::fs::remove_dir_all(&tmp);
}
