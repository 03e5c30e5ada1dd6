//! Outside input against a real collector over loopback TCP, each case beside good
//! traffic whose figures must stay exact: stamps re-sent long after their trace was
//! written, absurd times, records of hops a connection never announced, connections that
//! only say Hello, keys nobody reported sending, and many connections sending random and
//! malformed frames at once.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::Duration;

use hoptrace_collector::{Collector, CollectorConfig, RunSummary};
use hoptrace_format::spec::PipelineSpec;
use hoptrace_probe::{HopId, TraceKey};
use hoptrace_protocol::{
    Frame, Hello, MAX_RECORDS_PER_FRAME, PROTOCOL_VERSION, Record, SentEntry, SentFrame,
};
use hoptrace_testkit::wait_for;

/// publish (0) → broker (1) → store (2), all expected; stage publish → store; a short
/// join window so lateness is quick to reach.
fn spec() -> PipelineSpec {
    PipelineSpec::from_toml_str(
        r#"
        name = "hostile"
        [[hops]]
        name = "publish"
        [[hops]]
        name = "broker"
        [[hops]]
        name = "store"
        [[stages]]
        name = "Total"
        from = "publish"
        to = "store"
        definition = "publish to store"
        [join]
        window_ms = 150
        "#,
    )
    .unwrap()
}

fn tempdir(name: &str) -> PathBuf {
    hoptrace_testkit::tempdir(&format!("hostile-{name}"))
}

fn now_ns() -> i64 {
    hoptrace_probe::clock::realtime_ns()
}

/// A raw probe connection: Hello, then frames written by the test.
struct Raw(TcpStream);

impl Raw {
    fn connect(addr: SocketAddr, host: &str, hops: &[(u8, &str)]) -> Self {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let hello = Frame::Hello(Hello {
            version: PROTOCOL_VERSION,
            instance_id: now_ns() as u64 ^ u64::from(hops[0].0),
            host: host.into(),
            process: "raw".into(),
            software: "test".into(),
            token: String::new(),
            hops: hops
                .iter()
                .map(|(i, n)| (HopId(*i), (*n).to_owned()))
                .collect(),
        });
        s.write_all(&hello.to_bytes().unwrap()).unwrap();
        let mut r = s.try_clone().unwrap();
        match hoptrace_protocol::read_frame(&mut r, 1 << 20).unwrap() {
            Frame::Welcome { .. } => {}
            other => panic!("no welcome: {other:?}"),
        }
        Self(s)
    }

    fn send(&mut self, f: &Frame) {
        self.0.write_all(&f.to_bytes().unwrap()).unwrap();
    }

    fn records(&mut self, recs: &[Record]) {
        for chunk in recs.chunks(MAX_RECORDS_PER_FRAME) {
            self.send(&Frame::Records(chunk.to_vec()));
        }
    }

    /// Goodbye, then wait for the collector to close.
    fn bye(mut self) {
        self.send(&Frame::Goodbye);
        let mut buf = Vec::new();
        let _ = self.0.read_to_end(&mut buf);
    }
}

fn rec(publisher: u16, sequence: u64, hop: u8, stamp_ns: i64, intended_ns: i64) -> Record {
    Record {
        key: TraceKey {
            publisher,
            stream: 0,
            sequence,
        },
        hop: HopId(hop),
        stamp_ns,
        metric_count: 10,
        intended_ns,
        otel_trace_id: None,
    }
}

fn sent(publisher: u16, messages: u64) -> Frame {
    Frame::Sent(SentFrame {
        publisher,
        entries: vec![SentEntry {
            stream: 0,
            messages,
            metrics: messages * 10,
            first_sequence: 0,
            last_sequence: messages - 1,
        }],
    })
}

/// Every trace `0..n` of publisher `p` through all three hops, 1 ms apart per hop.
fn full_traces(p: u16, n: u64, base: i64) -> Vec<Record> {
    (0..n)
        .flat_map(|s| {
            let t = base + s as i64 * 1_000;
            (0..3u8).map(move |h| rec(p, s, h, t + i64::from(h) * 1_000_000, t))
        })
        .collect()
}

fn collect(dir: &PathBuf) -> Collector {
    let mut cfg = CollectorConfig::new("127.0.0.1:0", spec(), dir);
    cfg.run_id = Some("run".into());
    cfg.stop_timeout = Duration::from_secs(5);
    Collector::start(cfg).unwrap()
}

fn publisher(summary: &RunSummary, p: u16) -> &hoptrace_format::run::PublisherAccount {
    summary
        .accounting
        .publishers
        .iter()
        .find(|a| a.publisher == p)
        .expect("the publisher is in the accounting")
}

/// Rows of the run's Parquet, by reading it back.
fn rows(dir: &std::path::Path) -> u64 {
    let mut n = 0;
    for e in std::fs::read_dir(dir.join("run").join("traces")).unwrap() {
        let f = std::fs::File::open(e.unwrap().path()).unwrap();
        let r = parquet::file::reader::SerializedFileReader::new(f).unwrap();
        n += parquet::file::reader::FileReader::metadata(&r)
            .file_metadata()
            .num_rows() as u64;
    }
    n
}

#[test]
fn stamps_resent_long_after_their_trace_was_written_never_make_a_second_row() {
    let dir = tempdir("late");
    let collector = collect(&dir);
    let addr = collector.local_addr();
    let base = now_ns() - 10_000_000_000;
    let mut c = Raw::connect(addr, "h1", &[(0, "publish"), (1, "broker"), (2, "store")]);
    // 1000 traces; 50 of them never get their store stamp (incomplete).
    let recs: Vec<Record> = full_traces(1, 1_000, base)
        .into_iter()
        .filter(|r| !(r.hop.0 == 2 && r.key.sequence % 20 == 0))
        .collect();
    c.records(&recs);
    c.send(&sent(1, 1_002));
    // Once every trace is written (the incomplete ones when their window expired):
    // duplicates of stamps of complete and of incomplete traces, and the missing store
    // stamp of an incomplete one.
    let written = |n: u64| {
        let p = collector.progress();
        p.records >= n && p.pending == 0 && p.complete + p.incomplete == 1_000
    };
    wait_for("every trace written", Duration::from_secs(10), || {
        written(recs.len() as u64)
    });
    let late = [
        rec(1, 7, 1, base + 7_000 + 1_000_000, base + 7_000),
        rec(1, 8, 0, base + 8_000, base + 8_000),
        rec(1, 20, 2, base + 20_000 + 2_000_000, base + 20_000),
        rec(1, 40, 1, base + 40_000 + 1_000_000, base + 40_000),
    ];
    c.records(&late);
    wait_for("the late stamps", Duration::from_secs(10), || {
        written(recs.len() as u64 + 4)
    });
    c.records(&late[..2]);
    c.bye();
    let s = collector.stop().unwrap();
    let p = publisher(&s, 1);
    assert_eq!(
        (p.sent, p.complete, p.incomplete, p.unseen),
        (1_002, 950, 50, 2)
    );
    assert_eq!(s.accounting.late_records, 6);
    assert!(s.accounting.adds_up, "{:?}", s.accounting.discrepancies);
    assert_eq!(rows(&dir), 1_000, "one row per key");
    assert_eq!(s.accounting.missing_by_hop["store"], 50);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn keys_nobody_reported_sending_do_not_add_up() {
    let dir = tempdir("unsent");
    let collector = collect(&dir);
    let base = now_ns() - 10_000_000_000;
    let mut c = Raw::connect(
        collector.local_addr(),
        "h1",
        &[(0, "publish"), (1, "broker"), (2, "store")],
    );
    c.records(&full_traces(1, 100, base));
    // Publisher 1 reports 90 messages only; publisher 2 sends traces and no report.
    c.send(&sent(1, 90));
    c.records(&full_traces(2, 5, base));
    c.bye();
    let s = collector.stop().unwrap();
    let a = &s.accounting;
    assert!(!a.adds_up);
    assert!(
        a.discrepancies
            .iter()
            .any(|d| d.contains("publisher 1: 10 traces whose keys lie outside")),
        "{:?}",
        a.discrepancies
    );
    assert!(
        a.discrepancies
            .iter()
            .any(|d| d.contains("publisher 2") && d.contains("never reported")),
        "{:?}",
        a.discrepancies
    );
    assert_eq!(publisher(&s, 1).not_sent, 10);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn absurd_times_are_counted_and_cannot_stretch_the_run() {
    let dir = tempdir("absurd");
    let collector = collect(&dir);
    let base = now_ns() - 10_000_000_000;
    let mut c = Raw::connect(
        collector.local_addr(),
        "h1",
        &[(0, "publish"), (1, "broker"), (2, "store")],
    );
    let mut recs = full_traces(1, 100, base);
    // Trace 5's intended time is 1 ns after the epoch; trace 6's broker stamp is too.
    for r in recs.iter_mut().filter(|r| r.key.sequence == 5) {
        r.intended_ns = 1;
    }
    for r in recs
        .iter_mut()
        .filter(|r| r.key.sequence == 6 && r.hop.0 == 1)
    {
        r.stamp_ns = 1;
    }
    c.records(&recs);
    c.send(&sent(1, 100));
    c.bye();
    let s = collector.stop().unwrap();
    let a = &s.accounting;
    assert_eq!((a.implausible_records, a.implausible_traces), (1, 1));
    let p = publisher(&s, 1);
    // Trace 6 lacks its (absurd) broker stamp: incomplete, and still accounted for.
    assert_eq!((p.complete, p.incomplete, p.unseen), (99, 1, 0));
    assert!(a.adds_up, "{:?}", a.discrepancies);
    let total = &s.stages[0];
    assert_eq!(
        total.figures.count, 100,
        "trace 6 still has publish and store"
    );
    assert!(total.figures.max_ns.unwrap() < 10_000_000, "{total:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn records_of_unannounced_hops_are_dropped_and_counted() {
    let dir = tempdir("unannounced");
    let collector = collect(&dir);
    let base = now_ns() - 10_000_000_000;
    // This connection announced publish only, then sends publish and store records.
    let mut c = Raw::connect(collector.local_addr(), "h1", &[(0, "publish")]);
    let recs: Vec<Record> = full_traces(1, 50, base)
        .into_iter()
        .filter(|r| r.hop.0 != 1)
        .collect();
    c.records(&recs);
    c.send(&sent(1, 50));
    c.bye();
    let s = collector.stop().unwrap();
    let a = &s.accounting;
    assert_eq!(a.unannounced_hop_records, 50);
    assert_eq!(a.records_by_hop["publish"], 50);
    assert_eq!(a.records_by_hop["store"], 0);
    assert_eq!(publisher(&s, 1).incomplete, 50);
    assert!(a.adds_up, "{:?}", a.discrepancies);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn connections_that_only_say_hello_stamp_nothing_in_run_json() {
    let dir = tempdir("idle");
    let collector = collect(&dir);
    let addr = collector.local_addr();
    let base = now_ns() - 10_000_000_000;
    let idle = Raw::connect(addr, "bad-host", &[(0, "publish")]);
    let mut good = Raw::connect(
        addr,
        "good-host",
        &[(0, "publish"), (1, "broker"), (2, "store")],
    );
    good.records(&full_traces(1, 10, base));
    good.send(&sent(1, 10));
    good.bye();
    idle.bye();
    let s = collector.stop().unwrap();
    let stamps = |host: &str| {
        s.probes
            .iter()
            .find(|p| p.host == host)
            .and_then(|p| p.stamps_by_hop.clone())
            .unwrap()
    };
    assert_eq!(stamps("bad-host")["publish"], 0);
    assert_eq!(stamps("good-host")["publish"], 10);
    assert_eq!(stamps("good-host")["store"], 10);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Before a peer has authenticated, its first frame may be no larger than the largest
/// Hello (about 20 KiB), not the 1 MiB of later frames: a first frame announcing 100 KiB is
/// refused from its length alone, without the collector reading its body, and counted.
#[test]
fn a_first_frame_larger_than_any_hello_is_refused_from_its_length() {
    use hoptrace_protocol::{MAX_FRAME_LEN, MAX_HELLO_LEN, reject_code};
    let dir = tempdir("bighello");
    let collector = collect(&dir);
    let addr = collector.local_addr();
    let len: u32 = 100 * 1024;
    assert!((MAX_HELLO_LEN as u32) < len && (len as usize) < MAX_FRAME_LEN);
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    // The length and the type byte of a Hello, and no body: the collector must answer
    // without waiting for the 100 KiB.
    let mut head = len.to_le_bytes().to_vec();
    head.push(0x01);
    s.write_all(&head).unwrap();
    match hoptrace_protocol::read_frame(&mut s, 1 << 20).unwrap() {
        Frame::Reject { code, reason } => {
            assert_eq!(code, reject_code::MALFORMED, "{reason}");
            assert!(
                reason.contains(&format!("at most {MAX_HELLO_LEN} bytes")),
                "{reason}"
            );
        }
        other => panic!("no reject: {other:?}"),
    }
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert!(rest.is_empty(), "the collector closed after its reject");
    // A good probe beside it is exact.
    let mut good = Raw::connect(
        addr,
        "good-host",
        &[(0, "publish"), (1, "broker"), (2, "store")],
    );
    good.records(&full_traces(1, 10, now_ns() - 10_000_000_000));
    good.send(&sent(1, 10));
    good.bye();
    let summary = collector.stop().unwrap();
    assert_eq!(
        summary.connections["too_large"], 1,
        "{:?}",
        summary.connections
    );
    assert_eq!(publisher(&summary, 1).complete, 10);
    let _ = std::fs::remove_dir_all(&dir);
}

/// splitmix64, for the crowd below.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// One hostile connection: random bytes, a valid frame with bytes flipped, a lying length,
/// a truncated frame, a hello then garbage, or a hello announcing a hop then records of
/// keys nobody sent for hops it did not announce.
fn hostile(addr: SocketAddr, seed: u64) {
    let mut rng = Rng(seed);
    let Ok(mut s) = TcpStream::connect(addr) else {
        return;
    };
    let _ = s.set_write_timeout(Some(Duration::from_secs(2)));
    let hello = Frame::Hello(Hello {
        version: PROTOCOL_VERSION,
        instance_id: seed,
        host: format!("junk-{seed}"),
        process: "junk".into(),
        software: "junk".into(),
        token: String::new(),
        hops: vec![(HopId(1), "broker".into())],
    })
    .to_bytes()
    .unwrap();
    let records = Frame::Records(
        (0..50)
            .map(|i| rec(9, i, (rng.next() % 3) as u8, now_ns(), now_ns()))
            .collect(),
    )
    .to_bytes()
    .unwrap();
    let bytes: Vec<u8> = match seed % 6 {
        0 => (0..rng.next() % 4_000).map(|_| rng.next() as u8).collect(),
        1 => {
            let mut b = [hello.clone(), records.clone()].concat();
            for _ in 0..1 + rng.next() % 8 {
                let i = (rng.next() as usize) % b.len();
                b[i] ^= 1 << (rng.next() % 8);
            }
            b
        }
        2 => {
            let mut b = hello.clone();
            b[..4].copy_from_slice(&(rng.next() as u32 | 0x10_0000).to_le_bytes());
            b
        }
        3 => hello[..(rng.next() as usize) % hello.len()].to_vec(),
        4 => [hello.clone(), (0..500).map(|_| rng.next() as u8).collect()].concat(),
        _ => [hello.clone(), records].concat(),
    };
    let _ = s.write_all(&bytes);
    if seed % 6 == 5 {
        let _ = s.write_all(&Frame::Goodbye.to_bytes().unwrap());
    }
    let _ = s.shutdown(std::net::Shutdown::Write);
    let _ = s.set_read_timeout(Some(Duration::from_secs(6)));
    let mut sink = Vec::new();
    let _ = s.read_to_end(&mut sink);
}

#[test]
fn a_crowd_of_hostile_connections_leaves_a_good_probe_exact() {
    let dir = tempdir("crowd");
    let collector = collect(&dir);
    let addr = collector.local_addr();
    let base = now_ns() - 10_000_000_000;
    let crowd: Vec<_> = (0..4)
        .map(|t| {
            std::thread::spawn(move || {
                for i in 0..60 {
                    hostile(addr, t * 1_000 + i);
                }
            })
        })
        .collect();
    let mut good = Raw::connect(
        addr,
        "good-host",
        &[(0, "publish"), (1, "broker"), (2, "store")],
    );
    let traces = full_traces(1, 20_000, base);
    for chunk in traces.chunks(3_000) {
        good.records(chunk);
        // Pacing (the workload): the good probe's chunks spread among the crowd's.
        std::thread::sleep(Duration::from_millis(20));
    }
    good.send(&sent(1, 20_000));
    for t in crowd {
        t.join().unwrap();
    }
    good.bye();
    let s = collector.stop().unwrap();
    let p = publisher(&s, 1);
    assert_eq!(
        (p.sent, p.complete, p.incomplete, p.unseen),
        (20_000, 20_000, 0, 0)
    );
    // Keys of other publishers came from hostile connections (publisher 9, or ids their
    // flipped bits made): nobody reported sending them, and that is all that is wrong.
    assert!(
        s.accounting
            .discrepancies
            .iter()
            .all(|d| d.starts_with("publisher ") && !d.starts_with("publisher 1:")),
        "{:?}",
        s.accounting.discrepancies
    );
    let total = &s.stages[0];
    assert_eq!((total.figures.count, total.figures.negative), (20_000, 0));
    assert_eq!(
        (total.figures.min_ns, total.figures.max_ns),
        (Some(2_000_000), Some(2_000_000))
    );
    let closed: u64 = ["malformed", "too_large", "bad_version", "hello_timeout"]
        .iter()
        .map(|k| s.connections[*k])
        .sum();
    assert!(closed >= 100, "{:?}", s.connections);
    let _ = std::fs::remove_dir_all(&dir);
}
