//! A whole run over loopback TCP: a real exporter reports stamps to a real collector,
//! which joins them and writes Parquet and run.json. The Parquet is read back here, and
//! by pyarrow (an independent reader) through `check_run.py`.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use hoptrace_collector::{Collector, CollectorConfig};
use hoptrace_format::spec::PipelineSpec;
use hoptrace_probe::{Exporter, ExporterConfig, HopId, TraceContext, TraceKey};
use hoptrace_protocol::{SentEntry, SentFrame};
use hoptrace_testkit::wait_for;

const TRACES: u64 = 5_000;

/// Which hops trace `seq` passes: every 10th misses `store_in` (index 3), every 25th
/// misses everything after `publish`; the rest are complete.
fn hops_of(seq: u64) -> Vec<usize> {
    match seq {
        s if s % 25 == 0 => vec![0],
        s if s % 10 == 0 => vec![0, 1, 2, 4, 5],
        _ => (0..6).collect(),
    }
}

/// A whole second shortly before the test started: stamps must be plausible for the run.
fn base_ns() -> i64 {
    static BASE: std::sync::LazyLock<i64> = std::sync::LazyLock::new(|| {
        let now = hoptrace_probe::clock::realtime_ns();
        now - now % 1_000_000_000 - 60_000_000_000
    });
    *BASE
}

/// The stamp hop `i` takes for trace `seq`: 1 µs per hop, plus the sequence.
fn stamp_ns(seq: u64, i: usize) -> i64 {
    base_ns() + seq as i64 * 1_000 + i as i64 * 1_000 + if i == 1 { 500 } else { 0 }
}

fn run_once(dir: &Path) -> hoptrace_collector::RunSummary {
    let spec = PipelineSpec::default_pipeline();
    let mut cfg = CollectorConfig::new("127.0.0.1:0", spec.clone(), dir);
    cfg.run_id = Some("test-run".into());
    let collector = Collector::start(cfg).unwrap();

    let (exporter, probes, clock) =
        common::manual_probes(&spec, collector.local_addr(), "collect-test");
    let mut sent = SentFrame {
        publisher: 3,
        entries: vec![],
    };
    for seq in 0..TRACES {
        let stream = (seq % 4) as u32;
        let mut ctx = TraceContext::new(
            TraceKey {
                publisher: 3,
                stream,
                sequence: seq,
            },
            10,
            stamp_ns(seq, 0) - 100,
        );
        for i in hops_of(seq) {
            clock.set(stamp_ns(seq, i));
            assert!(probes[i].record(&mut ctx).queued);
        }
    }
    for stream in 0..4u32 {
        let n = (0..TRACES).filter(|s| s % 4 == u64::from(stream)).count() as u64;
        sent.entries.push(SentEntry {
            stream,
            messages: n,
            metrics: n * 10,
            first_sequence: u64::from(stream),
            last_sequence: (0..TRACES)
                .filter(|s| s % 4 == u64::from(stream))
                .max()
                .unwrap(),
        });
    }
    // Two messages that never reached anything: sent, but unseen.
    sent.entries[0].messages += 2;
    exporter.send_sent_frame(sent).unwrap();
    let s = exporter.shutdown();
    assert!(s.clean && s.counters.lost() == 0, "{s:?}");
    collector.stop().unwrap()
}

#[test]
fn a_run_accounts_for_every_message_and_writes_valid_parquet() {
    let tmp = tempdir();
    let summary = run_once(&tmp);
    let a = &summary.accounting;
    let complete = (0..TRACES).filter(|s| hops_of(*s).len() == 6).count() as u64;
    assert_eq!(a.publishers.len(), 1);
    let p = &a.publishers[0];
    assert_eq!(
        (p.sent, p.complete, p.incomplete, p.unseen),
        (TRACES + 2, complete, TRACES - complete, 2)
    );
    assert!(a.adds_up, "{:?}", a.discrepancies);
    assert_eq!(a.in_flight, 0);
    assert_eq!(a.missing_by_hop.get("store_in"), Some(&(TRACES - complete)));
    assert_eq!(a.missing_by_hop.get("flow_in"), Some(&(TRACES / 25)));
    assert_eq!(summary.probes.len(), 1);
    assert!(summary.probes[0].clean_close);
    assert!(
        !summary.clock.is_empty(),
        "the probe's clock status arrived"
    );

    // Stages: every complete trace has Broker Time = flow_in - publish = 1.5 µs exactly.
    let broker = summary
        .stages
        .iter()
        .find(|s| s.name == "Broker Time")
        .unwrap();
    assert_eq!(broker.figures.count, TRACES - TRACES / 25);
    assert_eq!(
        (broker.figures.min_ns, broker.figures.max_ns),
        (Some(1_500), Some(1_500))
    );
    assert_eq!(broker.figures.stddev_ns, Some(0.0));
    let p50 = &broker.figures.percentiles[0];
    assert!(p50.value_ns.abs_diff(1_500) <= p50.precision_ns, "{p50:?}");
    let transmission = summary
        .stages
        .iter()
        .find(|s| s.name == "Transmission")
        .unwrap();
    assert_eq!(
        transmission.figures.count, complete,
        "traces without store_in have no Transmission"
    );

    let run_dir = tmp.join("test-run");
    for s in &summary.stages {
        let log = std::fs::read_to_string(run_dir.join(&s.hdr_log)).unwrap();
        assert!(
            log.contains("#[StartTime:") && log.contains("HISTFAAA"),
            "{}: {log}",
            s.hdr_log
        );
    }
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run_dir.join("run.json")).unwrap()).unwrap();
    assert_eq!(json["accounting"]["adds_up"], true);

    // Read back every row with the parquet crate's own reader.
    let mut rows = BTreeMap::new();
    for f in &summary.files {
        let file = std::fs::File::open(run_dir.join("traces").join(&f.name)).unwrap();
        let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
            .unwrap()
            .build()
            .unwrap();
        for batch in reader {
            let batch = batch.unwrap();
            use arrow::array::{Array, AsArray};
            use arrow::datatypes::{TimestampNanosecondType, UInt64Type};
            let seqs = batch
                .column_by_name("sequence")
                .unwrap()
                .as_primitive::<UInt64Type>();
            let hop_cols: Vec<_> = PipelineSpec::default_pipeline()
                .hops
                .iter()
                .map(|h| {
                    batch
                        .column_by_name(&hoptrace_format::schema::hop_column(&h.name))
                        .unwrap()
                        .as_primitive::<TimestampNanosecondType>()
                        .clone()
                })
                .collect();
            for r in 0..batch.num_rows() {
                let stamps: Vec<Option<i64>> = hop_cols
                    .iter()
                    .map(|c| if c.is_null(r) { None } else { Some(c.value(r)) })
                    .collect();
                rows.insert(seqs.value(r), stamps);
            }
        }
    }
    assert_eq!(rows.len() as u64, TRACES, "one row per message");
    for (seq, stamps) in &rows {
        for (i, s) in stamps.iter().enumerate() {
            let expected = hops_of(*seq).contains(&i).then(|| stamp_ns(*seq, i));
            assert_eq!(*s, expected, "trace {seq} hop {i}");
        }
    }

    let _ = std::fs::remove_dir_all(&tmp);
}

/// The same run read with pyarrow, which knows nothing of this crate: every row and stamp
/// as written. Needs python3 with pyarrow (`infra/test.sh` installs it).
#[test]
#[ignore = "needs python3 with pyarrow: infra/test.sh runs it"]
fn a_run_reads_the_same_with_pyarrow() {
    let tmp = tempdir();
    run_once(&tmp);
    let run_dir = tmp.join("test-run");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/check_run.py");
    let out = std::process::Command::new("python3")
        .arg(script)
        .arg(&run_dir)
        .arg(TRACES.to_string())
        .arg(base_ns().to_string())
        .output()
        .unwrap_or_else(|e| panic!("cannot run python3: {e}"));
    assert!(
        out.status.success(),
        "check_run.py failed (pyarrow missing? infra/test.sh installs it):\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&tmp);
}

#[test]
fn a_wrong_hop_or_token_is_rejected_with_a_reason() {
    let tmp = tempdir();
    let mut cfg = CollectorConfig::new("127.0.0.1:0", PipelineSpec::default_pipeline(), &tmp);
    cfg.token = Some("secret".into());
    let collector = Collector::start(cfg).unwrap();
    let addr = collector.local_addr().to_string();

    let mut ecfg = ExporterConfig::new(addr.clone(), "t");
    ecfg.token = Some("wrong".into());
    let e = Exporter::start(ecfg, &[(HopId(0), "publish")])
        .unwrap()
        .with_shutdown_timeout(Duration::from_millis(100));
    wait_for(
        "the refusal of the wrong token",
        Duration::from_secs(10),
        || e.last_error().unwrap_or_default().contains("token"),
    );
    drop(e);

    let mut ecfg = ExporterConfig::new(addr, "t");
    ecfg.token = Some("secret".into());
    let e = Exporter::start(ecfg, &[(HopId(0), "flow_in")])
        .unwrap()
        .with_shutdown_timeout(Duration::from_millis(100));
    wait_for(
        "the refusal of the undeclared hop",
        Duration::from_secs(10),
        || {
            let err = e.last_error().unwrap_or_default();
            err.contains("flow_in") && err.contains("not declared")
        },
    );
    drop(e);

    let summary = collector.stop().unwrap();
    assert!(summary.connections["bad_token"] >= 1);
    assert!(summary.connections["unknown_hop"] >= 1);
    let _ = std::fs::remove_dir_all(&tmp);
}

#[test]
fn garbage_and_oversized_frames_close_only_their_connection() {
    use std::io::{Read, Write};
    let tmp = tempdir();
    let collector = Collector::start(CollectorConfig::new(
        "127.0.0.1:0",
        PipelineSpec::default_pipeline(),
        &tmp,
    ))
    .unwrap();
    let addr = collector.local_addr();
    // A good probe connected the whole time.
    let exporter = Exporter::start(
        ExporterConfig::new(addr.to_string(), "good"),
        &[(HopId(0), "publish")],
    )
    .unwrap();
    let p = exporter.probe(HopId(0)).unwrap();
    for (i, bytes) in [
        b"GET / HTTP/1.1\r\n\r\n".to_vec(),
        (u32::MAX).to_le_bytes().to_vec(),
        vec![0, 0, 0, 0],
    ]
    .into_iter()
    .enumerate()
    {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.write_all(&bytes).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf); // the collector closes it
        let mut ctx = TraceContext::new(
            TraceKey {
                publisher: 1,
                stream: 0,
                sequence: i as u64,
            },
            1,
            0,
        );
        assert!(p.record(&mut ctx).queued);
    }
    let s = exporter.shutdown();
    assert!(s.clean);
    let summary = collector.stop().unwrap();
    assert_eq!(
        summary.accounting.records_by_hop["publish"], 3,
        "the good probe lost nothing"
    );
    assert!(
        summary.connections["malformed"]
            + summary.connections["too_large"]
            + summary.connections["bad_version"]
            >= 3,
        "{:?}",
        summary.connections
    );
    let _ = std::fs::remove_dir_all(&tmp);
}

fn tempdir() -> std::path::PathBuf {
    hoptrace_testkit::tempdir("collect")
}

#[test]
fn a_slow_loris_is_closed_at_the_hello_deadline_and_counted() {
    use std::io::{Read, Write};
    let tmp = tempdir();
    let mut cfg = CollectorConfig::new("127.0.0.1:0", PipelineSpec::default_pipeline(), &tmp);
    cfg.hello_timeout = Duration::from_secs(1);
    let collector = Collector::start(cfg).unwrap();
    let addr = collector.local_addr();
    // A valid hello, trickled a byte every 100 ms: each byte would reset a per-read
    // timeout, but the whole hello has one deadline.
    let hello = hoptrace_protocol::Frame::Hello(hoptrace_protocol::Hello {
        version: hoptrace_protocol::PROTOCOL_VERSION,
        instance_id: 7,
        host: "loris".into(),
        process: "slow".into(),
        software: "test".into(),
        token: String::new(),
        hops: vec![(HopId(0), "publish".into())],
    })
    .to_bytes()
    .unwrap();
    let started = std::time::Instant::now();
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    let mut closed_at = None;
    for b in &hello {
        if s.write_all(std::slice::from_ref(b)).is_err() {
            closed_at = Some(started.elapsed());
            break;
        }
        // One byte every 100 ms: the slow writer is what is tested.
        std::thread::sleep(Duration::from_millis(100));
        let _ = s.set_nonblocking(true);
        let mut buf = [0u8; 64];
        let gone = matches!(s.read(&mut buf), Ok(0));
        let _ = s.set_nonblocking(false);
        if gone {
            closed_at = Some(started.elapsed());
            break;
        }
    }
    let closed_at = closed_at.expect("the collector kept a trickling connection open");
    assert!(
        closed_at < Duration::from_secs(3),
        "closed only after {closed_at:?}"
    );
    // A good probe is served meanwhile and afterwards.
    let exporter = Exporter::start(
        ExporterConfig::new(addr.to_string(), "good"),
        &[(HopId(0), "publish")],
    )
    .unwrap();
    let p = exporter.probe(HopId(0)).unwrap();
    let mut ctx = TraceContext::new(
        TraceKey {
            publisher: 1,
            stream: 0,
            sequence: 0,
        },
        1,
        0,
    );
    assert!(p.record(&mut ctx).queued);
    assert!(exporter.shutdown().clean);
    let summary = collector.stop().unwrap();
    assert_eq!(
        summary.connections["hello_timeout"], 1,
        "{:?}",
        summary.connections
    );
    assert_eq!(summary.accounting.records_by_hop["publish"], 1);
    let _ = std::fs::remove_dir_all(&tmp);
}
