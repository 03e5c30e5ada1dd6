//! Version 2 probes meeting collectors that do not acknowledge: a collector of version 1
//! only (the probe connects again with version 1 and says so), a collector that
//! welcomes version 1 (a collector run with `--no-log`: the probe says so), and an
//! exporter configured to keep nothing (`retention_bytes` 0: it speaks version 1, sends
//! each record once and counts nothing as evicted).

mod common;

use std::sync::{Mutex, Once};
use std::time::Duration;

use common::MiniCollector;
use hoptrace_probe::{Exporter, ExporterConfig, HopId, TraceContext, TraceKey};
use hoptrace_protocol::Frame;

const HOPS: &[(HopId, &str)] = &[(HopId(0), "publish"), (HopId(1), "broker")];

/// Every event logged in this test process, as `LEVEL message`.
static LINES: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// A subscriber that keeps the events' levels and messages, from every thread.
struct Capture;

impl tracing::Subscriber for Capture {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, e: &tracing::Event<'_>) {
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                if f.name() == "message" {
                    self.0 = format!("{v:?}");
                }
            }
        }
        let mut m = Message(String::new());
        e.record(&mut m);
        lines().push(format!("{} {}", e.metadata().level(), m.0));
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

fn capture() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| tracing::subscriber::set_global_default(Capture).unwrap());
}

/// The lines, also after a test failed while holding them.
fn lines() -> std::sync::MutexGuard<'static, Vec<String>> {
    LINES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Whether a line holds `part`; on failure, every line, for the message.
fn logged(part: &str) -> Result<(), Vec<String>> {
    let lines = lines().clone();
    if lines.iter().any(|l| l.contains(part)) {
        Ok(())
    } else {
        Err(lines)
    }
}

fn config(addr: std::net::SocketAddr) -> ExporterConfig {
    let mut c = ExporterConfig::new(addr.to_string(), "downgrade-test");
    c.backoff_min = Duration::from_millis(5);
    c.backoff_max = Duration::from_millis(50);
    c.counters_interval = Duration::from_millis(20);
    c
}

/// Reports `n` records of hop 0 and shuts the exporter down.
fn send(exp: Exporter, n: u64) -> hoptrace_probe::ExportSummary {
    let p = exp.probe(HopId(0)).unwrap();
    for seq in 0..n {
        let key = TraceKey {
            publisher: 4,
            stream: 1,
            sequence: seq,
        };
        assert!(p.record(&mut TraceContext::new(key, 1, 0)).queued);
    }
    exp.shutdown()
}

/// The Hello versions the collector received, in the order of the connections.
fn hello_versions(mc: &MiniCollector) -> Vec<u16> {
    let mut hellos: Vec<(usize, u16)> = mc
        .frames
        .lock()
        .unwrap()
        .iter()
        .filter_map(|(c, f)| match f {
            Frame::Hello(h) => Some((*c, h.version)),
            _ => None,
        })
        .collect();
    hellos.sort_unstable();
    hellos.into_iter().map(|(_, v)| v).collect()
}

fn numbered_frames(mc: &MiniCollector) -> usize {
    mc.frames
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, f)| matches!(f, Frame::SeqRecords { .. }))
        .count()
}

#[test]
fn a_version_2_probe_rejected_by_a_version_1_collector_connects_again_with_version_1_and_says_so() {
    capture();
    let mc = MiniCollector::version_1_only();
    let summary = send(Exporter::start(config(mc.addr), HOPS).unwrap(), 2_000);
    mc.wait_for_goodbye();
    assert!(summary.clean, "{summary:?}");
    assert_eq!(hello_versions(&mc), [2, 1]);
    // Everything arrived once, unnumbered: nothing kept, nothing to acknowledge.
    assert_eq!(mc.records().len(), 2_000);
    assert_eq!(numbered_frames(&mc), 0);
    assert_eq!(summary.counters.lost(), 0);
    assert_eq!(summary.counters.evicted, 0);
    assert_eq!(summary.unacknowledged, 0);
    logged("WARN the collector speaks only protocol version 1").unwrap();
}

#[test]
fn a_version_2_probe_welcomed_at_version_1_says_its_records_are_not_kept() {
    capture();
    // Welcome version 1 to a version 2 Hello: a collector with no log (--no-log).
    let mc = MiniCollector::start(None);
    let summary = send(Exporter::start(config(mc.addr), HOPS).unwrap(), 500);
    mc.wait_for_goodbye();
    assert!(summary.clean, "{summary:?}");
    assert_eq!(hello_versions(&mc), [2]);
    assert_eq!((mc.records().len(), numbered_frames(&mc)), (500, 0));
    assert_eq!(summary.counters.evicted, 0);
    logged("WARN the collector runs protocol version 1").unwrap();
}

/// `retention_bytes` 0 means no retention: the probe speaks version 1 even to a
/// collector that acknowledges, sends each record once, and evicts nothing (it counted
/// every record as evicted before).
#[test]
fn no_retention_sends_every_record_once_and_evicts_nothing() {
    let mode = common::Durable::default();
    mode.ack.store(true, std::sync::atomic::Ordering::Relaxed);
    let mc = MiniCollector::durable(&mode);
    let mut cfg = config(mc.addr);
    cfg.retention_bytes = 0;
    cfg.max_batch = 100;
    let summary = send(Exporter::start(cfg, HOPS).unwrap(), 3_000);
    mc.wait_for_goodbye();
    assert!(summary.clean, "{summary:?}");
    assert_eq!(hello_versions(&mc), [1]);
    assert_eq!(mc.records().len(), 3_000);
    assert_eq!(numbered_frames(&mc), 0);
    assert_eq!(summary.counters.evicted, 0);
    assert_eq!(summary.counters.sent, 3_000);
    assert_eq!(summary.counters.lost(), 0);
    assert_eq!(summary.unacknowledged, 0);
}
