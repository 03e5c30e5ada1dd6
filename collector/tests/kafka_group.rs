//! A collector group end to end through a real Kafka (`infra/services.sh up`, `source
//! infra/env.sh`: `HOPTRACE_KAFKA`): probes report to a relay, a member joins the
//! partitions and writes its files, and the run is read back as one run.
//!
//! - The records of one message that disagree on its intended time (three windows
//!   apart) make one row, not one per bucket; the accounting's keys are counted apart
//!   from its rows.
//! - A probe that stamped nothing is listed with no stamps (no host of any stage's clock
//!   uncertainty), and records of a hop their connection did not announce, which the
//!   relay drops, are counted in the run.
#![cfg(feature = "kafka")]

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::Duration;

use arrow::array::AsArray as _;
use arrow::datatypes::{UInt16Type, UInt32Type, UInt64Type};
use hoptrace_collector::kafka::{MemberConfig, RecordsTopic, Relay, RelayConfig, run_member};
use hoptrace_format::spec::PipelineSpec;
use hoptrace_probe::{Exporter, ExporterConfig, HopId, TraceKey};
use hoptrace_protocol::{Frame, Hello, PROTOCOL_VERSION, Record, SentEntry, SentFrame};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

const PUBLISHER: u16 = 4;
const MESSAGES: u64 = 300;
const UNANNOUNCED: u64 = 7;

fn kafka() -> String {
    std::env::var("HOPTRACE_KAFKA").unwrap_or_else(|_| {
        panic!("HOPTRACE_KAFKA is not set: this test needs Kafka (infra/services.sh up; source infra/env.sh)")
    })
}

fn spec() -> PipelineSpec {
    PipelineSpec::from_toml_str(
        r#"
        name = "group-e2e"
        expected = ["a", "b"]
        [[hops]]
        name = "a"
        [[hops]]
        name = "b"
        [[hops]]
        name = "c"
        [[stages]]
        name = "A to B"
        from = "a"
        to = "b"
        definition = "x"
        [join]
        window_ms = 200
        "#,
    )
    .unwrap()
}

fn record(seq: u64, hop: u8, intended_ns: i64) -> Record {
    Record {
        key: TraceKey {
            publisher: PUBLISHER,
            stream: 1,
            sequence: seq,
        },
        hop: HopId(hop),
        stamp_ns: intended_ns + i64::from(hop) * 1_000 + 500,
        metric_count: 10,
        intended_ns,
        otel_trace_id: None,
    }
}

/// A connection written frame by frame: an exporter never sends records of a hop it did
/// not announce, which is what the relay must drop and count here.
struct Raw(TcpStream);

impl Raw {
    fn connect(addr: std::net::SocketAddr, process: &str, hops: &[(HopId, &str)]) -> Self {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let hello = Frame::Hello(Hello {
            version: PROTOCOL_VERSION,
            instance_id: hoptrace_probe::clock::realtime_ns() as u64,
            host: "test".into(),
            process: process.into(),
            software: "kafka_group".into(),
            token: String::new(),
            hops: hops.iter().map(|(h, n)| (*h, (*n).to_owned())).collect(),
        });
        s.write_all(&hello.to_bytes().unwrap()).unwrap();
        match hoptrace_protocol::read_frame(&mut s, 1 << 20).unwrap() {
            Frame::Welcome { .. } => {}
            other => panic!("no welcome: {other:?}"),
        }
        Self(s)
    }

    fn send(&mut self, f: &Frame) {
        self.0.write_all(&f.to_bytes().unwrap()).unwrap();
    }

    /// Goodbye, then wait for the relay to close.
    fn bye(mut self) {
        self.send(&Frame::Goodbye);
        let mut rest = Vec::new();
        let _ = self.0.read_to_end(&mut rest);
    }
}

/// Every key of the run's part files, once per row.
fn keys(files: &[std::path::PathBuf]) -> Vec<(u16, u32, u64)> {
    let mut out = Vec::new();
    for path in files {
        let file = std::fs::File::open(path).unwrap();
        for batch in ParquetRecordBatchReaderBuilder::try_new(file)
            .unwrap()
            .build()
            .unwrap()
        {
            let b = batch.unwrap();
            let p = b
                .column_by_name("publisher")
                .unwrap()
                .as_primitive::<UInt16Type>();
            let s = b
                .column_by_name("stream")
                .unwrap()
                .as_primitive::<UInt32Type>();
            let q = b
                .column_by_name("sequence")
                .unwrap()
                .as_primitive::<UInt64Type>();
            out.extend((0..b.num_rows()).map(|i| (p.value(i), s.value(i), q.value(i))));
        }
    }
    out
}

fn run(dir: &Path) -> hoptrace_format::group::GroupRun {
    let tag = format!("{:x}", hoptrace_probe::clock::realtime_ns());
    let target = RecordsTopic::parse(&format!("kafka://{}/ht-e2e-{tag}", kafka())).unwrap();
    let relay = Relay::start(RelayConfig::new(
        "127.0.0.1:0",
        spec(),
        target.clone(),
        "e2e",
    ))
    .unwrap();
    // The stamping probe announces a and b; the idle one announces c and sends nothing.
    let mut stamping = Raw::connect(
        relay.local_addr(),
        "stamping",
        &[(HopId(0), "a"), (HopId(1), "b")],
    );
    let mut idle = ExporterConfig::new(relay.local_addr().to_string(), "idle");
    idle.backoff_min = Duration::from_millis(5);
    let idle = Exporter::connect(idle, &[(HopId(2), "c")]).unwrap();
    let t0 = hoptrace_probe::clock::realtime_ns() - 5_000_000_000;
    let mut frame = Vec::new();
    for seq in 0..MESSAGES {
        let t = t0 + seq as i64 * 1_000_000;
        frame.push(record(seq, 0, t));
        // Message 17's hop b says it was meant 600 ms (three windows) later.
        let b_intended = if seq == 17 { t + 600_000_000 } else { t };
        frame.push(record(seq, 1, b_intended));
    }
    // Hop c was not announced by this connection: the relay drops and counts them.
    for seq in 0..UNANNOUNCED {
        frame.push(record(seq, 2, t0 + seq as i64 * 1_000_000));
    }
    for chunk in frame.chunks(100) {
        stamping.send(&Frame::Records(chunk.to_vec()));
    }
    // Two messages more were sent than reached anything.
    stamping.send(&Frame::Sent(SentFrame {
        publisher: PUBLISHER,
        entries: vec![SentEntry {
            stream: 1,
            messages: MESSAGES + 2,
            metrics: (MESSAGES + 2) * 10,
            first_sequence: 0,
            last_sequence: MESSAGES + 1,
        }],
    }));
    stamping.bye();
    assert!(idle.shutdown().clean);
    relay.stop().unwrap();

    let stop = AtomicBool::new(false);
    let mut cfg = MemberConfig::new(target, format!("ht-e2e-{tag}"), "m1", spec(), dir, "e2e");
    cfg.commit_interval = Duration::from_secs(1);
    cfg.stop_timeout = Duration::from_secs(30);
    // Stops once every record was read (or after a minute), then reads to the end.
    let want = MESSAGES * 2;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    run_member(&cfg, &stop, |p| {
        if p.records >= want || std::time::Instant::now() > deadline {
            stop.store(true, Relaxed);
        }
    })
    .unwrap();
    hoptrace_format::group::open_group(&dir.join("e2e")).unwrap()
}

#[test]
#[ignore = "needs Kafka (infra/services.sh up; source infra/env.sh): infra/test.sh runs it"]
fn a_group_writes_each_key_once_and_accounts_for_probes_and_dropped_hops() {
    let dir = std::env::temp_dir().join(format!(
        "hoptrace-kafka-group-{}-{}",
        std::process::id(),
        hoptrace_probe::clock::realtime_ns()
    ));
    let g = run(&dir);
    let rows = keys(&g.parts);
    let mut per_key: BTreeMap<(u16, u32, u64), u64> = BTreeMap::new();
    for k in &rows {
        *per_key.entry(*k).or_default() += 1;
    }
    assert_eq!(
        per_key.get(&(PUBLISHER, 1, 17)),
        Some(&1),
        "message 17 has one row"
    );
    assert_eq!(per_key.len() as u64, MESSAGES, "{per_key:?}");
    assert_eq!(rows.len() as u64, MESSAGES, "a key with two rows");
    let a = &g.summary.accounting;
    assert!(a.adds_up, "{:?}", a.discrepancies);
    let p = a
        .publishers
        .iter()
        .find(|p| p.publisher == PUBLISHER)
        .unwrap();
    assert_eq!(
        (p.sent, p.complete + p.incomplete, p.unseen),
        (MESSAGES + 2, MESSAGES, 2),
        "{p:?}"
    );
    assert_eq!(a.unannounced_hop_records, UNANNOUNCED);
    // The stamping probe's stamps are known; the idle probe stamped nothing.
    let probe = |process: &str| {
        g.summary
            .probes
            .iter()
            .find(|p| p.process == process)
            .unwrap_or_else(|| panic!("{process}: {:?}", g.summary.probes))
    };
    let stamped = probe("stamping").stamps_by_hop.clone().unwrap();
    assert_eq!(stamped.get("a"), Some(&MESSAGES));
    assert_eq!(stamped.get("b"), Some(&MESSAGES));
    let idle = probe("idle").stamps_by_hop.clone().unwrap();
    assert_eq!(idle.get("c"), Some(&0), "{idle:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
