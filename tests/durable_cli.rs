//! `hoptrace collect` killed with SIGKILL and started again with the same command, as a
//! user would: the real binary, probes over TCP.
//!
//! - a raw version 2 client sends numbered frames, the collector is killed, and the
//!   frames re-sent from below Welcome's `resume_seq` are dropped, exactly, with one row
//!   per key;
//! - the end of a connection after Goodbye means its last Sent frame is durable;
//! - a long run keeps its log bounded (checkpoints delete the segments before them), and
//!   a restart after a checkpoint loses nothing and counts nothing twice;
//! - a collector started without `--run-id` names the unfinished run it finds, and
//!   `--resume` continues it;
//! - a run closed cleanly leaves no log behind.

mod common;

use std::io::{BufRead, BufReader, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use hoptrace_probe::{Exporter, ExporterConfig, HopId, TraceContext, TraceKey};
use hoptrace_protocol::{
    self as protocol, Frame, Hello, MAX_FRAME_LEN, Record, SentEntry, SentFrame,
};

/// Two hops, publish and broker; part files of `roll` rows.
fn spec(roll: u64) -> String {
    format!(
        r#"name = "durable"
[[hops]]
name = "publish"
id = 0
[[hops]]
name = "broker"
id = 1
[[stages]]
name = "Broker Time"
from = "publish"
to = "broker"
definition = "publish to broker"
[output]
roll_rows = {roll}
row_group_rows = {roll}
"#
    )
}

const HOPS: &[(HopId, &str)] = &[(HopId(0), "publish"), (HopId(1), "broker")];

/// A port nothing listens on now, for a collector that must come back on the same one.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A `hoptrace collect` process; its stderr lines arrive on `lines`.
struct Collect {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Collect {
    fn start<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Self {
        let mut child = Command::new(common::bin())
            .arg("collect")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, lines) = mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self { child, lines }
    }

    /// Waits for a stderr line starting with `prefix`; returns the rest.
    fn wait_line(&self, prefix: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut seen = Vec::new();
        loop {
            let Ok(line) = self
                .lines
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            else {
                panic!(
                    "no line {prefix:?} from the collector; it said:\n{}",
                    seen.join("\n")
                );
            };
            if let Some(rest) = line.strip_prefix(prefix) {
                return rest.to_owned();
            }
            seen.push(line);
        }
    }

    /// Waits until it listens; returns its address.
    fn listening(&self) -> SocketAddr {
        self.wait_line("collecting on ")
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    }

    fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// SIGTERM; it must exit 0. Returns what it printed on stdout.
    fn stop(mut self) -> String {
        // SAFETY: signalling our own child process.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = common::wait_within(&mut self.child, Duration::from_secs(60), "collect");
        assert!(status.success(), "{status}");
        let mut out = String::new();
        std::io::Read::read_to_string(&mut self.child.stdout.take().unwrap(), &mut out).unwrap();
        out
    }
}

/// A fresh scratch directory `tag` holding the spec (part files of `roll` rows), and the
/// arguments of `hoptrace collect` for run `run_id` on a free loopback port, then `extra`:
/// (the directory, its runs directory, the arguments).
fn collect_setup(
    tag: &str,
    roll: u64,
    run_id: &str,
    extra: &[&str],
) -> (PathBuf, PathBuf, Vec<String>) {
    let out = common::scratch(tag);
    let spec_path = out.join("spec.toml");
    std::fs::write(&spec_path, spec(roll)).unwrap();
    let runs = out.join("runs");
    let mut args: Vec<String> = [
        "--listen",
        &format!("127.0.0.1:{}", free_port()),
        "--pipeline",
        spec_path.to_str().unwrap(),
        "--runs",
        runs.to_str().unwrap(),
        "--run-id",
        run_id,
    ]
    .iter()
    .map(|a| (*a).to_owned())
    .collect();
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    (out, runs, args)
}

/// The run's one publisher sent `sent` messages, every one complete, and its accounting
/// adds up (`why` prefixes the failure message).
fn assert_every_message_complete(json: &serde_json::Value, sent: u64, why: &str) {
    let a = &json["accounting"];
    let p = &a["publishers"][0];
    assert_eq!(
        (&p["sent"], &p["complete"], &p["unseen"]),
        (&sent.into(), &sent.into(), &0.into()),
        "{why}{a}"
    );
    assert_eq!(a["adds_up"], true, "{a}");
}

fn run_json(run: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(run.join("run.json")).unwrap()).unwrap()
}

/// Rows in the run's part files (run.json) and distinct keys in them (read back).
fn rows_and_keys(run: &Path, json: &serde_json::Value) -> (u64, u64) {
    let rows = json["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["rows"].as_u64().unwrap())
        .sum();
    let keys = hoptrace_collector::writer::kept_keys(&run.join("traces"), &[])
        .unwrap()
        .len();
    (rows, keys)
}

// ---------------------------------------------------------------------------------------
// A raw version 2 client

/// Traces per frame; each frame holds both hops of its traces.
const TRACES_PER_FRAME: u64 = 50;

/// Frame `seq` (from 1): traces `(seq - 1) * 50 ..`, both hops of each.
fn frame(seq: u64) -> Frame {
    let first = (seq - 1) * TRACES_PER_FRAME;
    let records = (first..first + TRACES_PER_FRAME)
        .flat_map(|sequence| {
            let key = TraceKey {
                publisher: 1,
                stream: 0,
                sequence,
            };
            let now = hoptrace_probe::clock::realtime_ns();
            HOPS.iter().map(move |(hop, _)| Record {
                key,
                hop: *hop,
                stamp_ns: now + i64::from(hop.0) * 1_000,
                metric_count: 1,
                intended_ns: now,
                otel_trace_id: None,
            })
        })
        .collect();
    Frame::SeqRecords { seq, records }
}

/// Connects as exporter instance `instance`, version 2; returns the connection and
/// Welcome's `resume_seq`.
fn connect(addr: SocketAddr, instance: u64) -> (TcpStream, u64) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let hello = Frame::Hello(Hello {
        version: 2,
        instance_id: instance,
        host: "raw".into(),
        process: "raw-v2-client".into(),
        software: "durable_cli test".into(),
        token: String::new(),
        hops: HOPS.iter().map(|(h, n)| (*h, (*n).to_owned())).collect(),
    });
    s.write_all(&hello.to_bytes().unwrap()).unwrap();
    match protocol::read_frame(&mut s, MAX_FRAME_LEN).unwrap() {
        Frame::Welcome {
            version,
            resume_seq,
            ..
        } => {
            assert_eq!(version, 2, "the collector does not speak version 2");
            (s, resume_seq)
        }
        other => panic!("answered hello with {other:?}"),
    }
}

fn send(s: &mut TcpStream, f: &Frame) {
    s.write_all(&f.to_bytes().unwrap()).unwrap();
}

/// The publisher's Sent frame: `sent` messages of stream 0, sequences from 0.
fn sent_frame(sent: u64) -> Frame {
    Frame::Sent(SentFrame {
        publisher: 1,
        entries: vec![SentEntry {
            stream: 0,
            messages: sent,
            metrics: sent,
            first_sequence: 0,
            last_sequence: sent - 1,
        }],
    })
}

/// Reads Acks until one reaches `seq`.
fn wait_ack(s: &mut TcpStream, seq: u64) {
    loop {
        match protocol::read_frame(s, MAX_FRAME_LEN).unwrap() {
            Frame::Ack { seq: acked } if acked >= seq => return,
            Frame::Ack { .. } => {}
            other => panic!("expected an ack, got {other:?}"),
        }
    }
}

/// A probe that finds its connection broken connects again at once, while frames it sent
/// on the old one are still on their way: Welcome's `resume_seq` covers all of them (the
/// collector reads the old connection to its end and makes it durable first), so a probe
/// would count none it had evicted as lost, and the run holds every record once.
#[test]
fn a_reconnection_resumes_after_every_frame_the_broken_connection_delivered() {
    let (_out, runs, args) = collect_setup("reconnect-resume", 1_000_000, "reconnect", &[]);
    let c = Collect::start(&args);
    let addr = c.listening();
    let (mut s, resume) = connect(addr, 0xBEE5);
    assert_eq!(resume, 0);
    let frames = 100;
    for seq in 1..=frames {
        send(&mut s, &frame(seq));
    }
    // Broken from the probe's side: no Goodbye, and a new connection at once.
    drop(s);
    let (mut s, resume) = connect(addr, 0xBEE5);
    assert_eq!(
        resume, frames,
        "Welcome's resume_seq right after the old connection broke"
    );
    let sent = frames * TRACES_PER_FRAME;
    send(&mut s, &sent_frame(sent));
    send(&mut s, &Frame::Goodbye);
    wait_ack(&mut s, frames);
    c.stop();

    assert_every_message_complete(&run_json(&runs.join("reconnect")), sent, "");
}

/// The same instance connects again while its earlier connection is still open at the
/// collector (its peer gone without a close, as across a network partition): the
/// Welcome comes within the half second the collector waits for that connection, well
/// within the 2 s every probe gives a connection attempt, and says what is durable.
#[test]
fn a_reconnection_is_welcomed_while_the_earlier_connection_stays_open() {
    let (_out, _runs, args) = collect_setup("reconnect-open", 1_000_000, "open", &[]);
    let c = Collect::start(&args);
    let addr = c.listening();
    let (mut old, _) = connect(addr, 0x0BE7);
    for seq in 1..=10 {
        send(&mut old, &frame(seq));
    }
    wait_ack(&mut old, 10);
    let asked = Instant::now();
    let (mut s, resume) = connect(addr, 0x0BE7);
    let waited = asked.elapsed();
    assert_eq!(resume, 10, "what the old connection made durable");
    assert!(
        waited < Duration::from_secs(2),
        "the Welcome took {waited:?}: a probe would have given up"
    );
    send(&mut s, &sent_frame(10 * TRACES_PER_FRAME));
    send(&mut s, &Frame::Goodbye);
    wait_ack(&mut s, 10);
    drop(old);
    c.stop();
}

/// Frames 1 to 20 acknowledged, then SIGKILL; the same command again; Welcome says 20;
/// frames 11 to 30 sent: the ten below it (1,000 records) are dropped, exactly, and each of
/// the 1,500 keys is one row.
#[test]
fn frames_sent_again_below_resume_seq_are_dropped_exactly_and_each_key_is_one_row() {
    let (out, runs, args) = collect_setup("resent", 1_000_000, "resent", &[]);
    let c = Collect::start(&args);
    let addr = c.listening();
    let (mut s, resume) = connect(addr, 0xD0_0D);
    assert_eq!(resume, 0);
    for seq in 1..=20 {
        send(&mut s, &frame(seq));
    }
    wait_ack(&mut s, 20);
    c.kill();
    drop(s);

    let c = Collect::start(&args);
    let addr = c.listening();
    let (mut s, resume) = connect(addr, 0xD0_0D);
    assert_eq!(resume, 20, "Welcome's resume_seq after the restart");
    for seq in 11..=30 {
        send(&mut s, &frame(seq));
    }
    let sent = 30 * TRACES_PER_FRAME;
    send(&mut s, &sent_frame(sent));
    send(&mut s, &Frame::Goodbye);
    wait_ack(&mut s, 30);
    let stdout = c.stop();

    let run = runs.join("resent");
    let json = run_json(&run);
    let a = &json["accounting"];
    let dropped = 10 * 2 * TRACES_PER_FRAME;
    assert_eq!(a["resent_records_dropped"], dropped, "{a}");
    assert_eq!(json["restarts"][0]["resent_records_dropped"], dropped);
    let p = &a["publishers"][0];
    assert_eq!(
        (&p["sent"], &p["complete"], &p["incomplete"], &p["unseen"]),
        (&sent.into(), &sent.into(), &0.into(), &0.into()),
        "{a}"
    );
    // Each record of the pipeline counted once: none twice, none late.
    assert_eq!(a["records_by_hop"]["publish"], sent, "{a}");
    assert_eq!(a["records_by_hop"]["broker"], sent, "{a}");
    assert_eq!(
        (&a["duplicate_traces"], &a["late_records"]),
        (&0.into(), &0.into())
    );
    assert_eq!(a["adds_up"], true, "{a}");
    assert_eq!(rows_and_keys(&run, &json), (sent, sent));
    assert!(
        stdout.contains("1000 records sent again were already held"),
        "{stdout}"
    );
    assert!(!run.join("wal").exists(), "the log outlived a clean stop");

    // The instance's two connections with their times: the first cut by the kill before
    // the restart, the second taken after it and ended by Goodbye.
    let probes = json["probes"].as_array().unwrap();
    assert_eq!(probes.len(), 2, "{probes:?}");
    let t = |i: usize, k: &str| {
        probes[i][k]
            .as_i64()
            .unwrap_or_else(|| panic!("{k} of {}", probes[i]))
    };
    let restart = json["restarts"][0]["at_unix_ns"].as_i64().unwrap();
    assert_eq!(
        (&probes[0]["clean_close"], &probes[1]["clean_close"]),
        (&false.into(), &true.into())
    );
    assert!(t(0, "connected_unix_ns") <= t(0, "closed_unix_ns"));
    assert!(
        t(0, "closed_unix_ns") <= restart,
        "{probes:?}, restart at {restart}"
    );
    assert!(restart <= t(1, "connected_unix_ns"));
    assert!(t(1, "connected_unix_ns") <= t(1, "closed_unix_ns"));
    assert!(t(1, "closed_unix_ns") <= json["ended_unix_ns"].as_i64().unwrap());
    // The report lists them as the run's events, in time order.
    let o = Command::new(common::bin())
        .arg("report")
        .arg(&run)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("report/summary.json")).unwrap()).unwrap();
    let kinds: Vec<&str> = summary["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "probe_disconnected",
            "collector_restarted",
            "probe_reconnected"
        ],
        "{}",
        summary["events"]
    );
    let md = std::fs::read_to_string(run.join("report/report.md")).unwrap();
    assert!(md.contains("| collector restarted | collector |"), "{md}");
    let _ = std::fs::remove_dir_all(&out);
}

/// A publisher's last frames are numbered by nothing (Sent, Counters): the collector ends a
/// version 2 connection after Goodbye only once its log holds them. Frames 1 to 5
/// acknowledged, then the Sent frame and Goodbye; once the collector ends the connection it
/// is killed at once (its log syncs only every second): the run continued holds what the
/// publisher said it sent, and adds up.
#[test]
fn the_end_of_a_connection_after_goodbye_means_its_last_sent_frame_is_durable() {
    let (out, runs, args) = collect_setup(
        "goodbye-durable",
        1_000_000,
        "goodbye",
        &["--log-sync", "1s"],
    );
    let c = Collect::start(&args);
    let addr = c.listening();
    let (mut s, _) = connect(addr, 0xB7E);
    for seq in 1..=5 {
        send(&mut s, &frame(seq));
    }
    wait_ack(&mut s, 5);
    let sent = 5 * TRACES_PER_FRAME;
    send(&mut s, &sent_frame(sent));
    send(&mut s, &Frame::Goodbye);
    // Acks, then the end of the connection.
    loop {
        match protocol::read_frame(&mut s, MAX_FRAME_LEN) {
            Ok(Frame::Ack { .. }) => {}
            Ok(other) => panic!("after goodbye: {other:?}"),
            Err(_) => break,
        }
    }
    c.kill();

    let c = Collect::start(&args);
    c.listening();
    c.stop();
    assert_every_message_complete(
        &run_json(&runs.join("goodbye")),
        sent,
        "the Sent frame before Goodbye survived the kill: ",
    );
    let _ = std::fs::remove_dir_all(&out);
}

// ---------------------------------------------------------------------------------------
// Checkpoints

/// Bytes in the run's log directory, and its segments' numbers.
fn log_on_disk(run: &Path) -> (u64, Vec<u32>) {
    let mut bytes = 0;
    let mut segments = Vec::new();
    for e in std::fs::read_dir(run.join("wal"))
        .into_iter()
        .flatten()
        .flatten()
    {
        bytes += e.metadata().map_or(0, |m| m.len());
        let name = e.file_name().into_string().unwrap_or_default();
        if let Some(n) = name.strip_suffix(".log").and_then(|n| n.parse().ok()) {
            segments.push(n);
        }
    }
    segments.sort_unstable();
    (bytes, segments)
}

/// 300,000 traces of two hops at about 60,000 traces/s through a real exporter, part
/// files of 5,000 rows, a checkpoint at most every 200 ms. The log on disk stays a small
/// part of what went through it; the collector is killed after a few checkpoints and
/// started again with the same command; the run ends with every trace once.
#[test]
fn a_long_run_keeps_its_log_bounded_and_a_restart_after_a_checkpoint_loses_nothing() {
    const TRACES: u64 = 300_000;
    let (out, runs, args) = collect_setup(
        "checkpoints",
        5_000,
        "long",
        &["--checkpoint-interval", "200ms"],
    );
    let run = runs.join("long");
    let c = Collect::start(&args);
    c.listening();

    // The log's size on disk, sampled while the run goes on.
    let watching = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let watcher = {
        let (run, watching) = (run.clone(), watching.clone());
        std::thread::spawn(move || {
            let (mut most, mut segments_seen) = (0u64, std::collections::BTreeSet::new());
            let mut most_segments = 0;
            while watching.load(std::sync::atomic::Ordering::Relaxed) {
                let (bytes, segments) = log_on_disk(&run);
                most = most.max(bytes);
                most_segments = most_segments.max(segments.len());
                segments_seen.extend(segments);
                // Sampling every 5 ms is the measurement: the log's largest size on disk.
                std::thread::sleep(Duration::from_millis(5));
            }
            (most, most_segments, segments_seen)
        })
    };

    // The collector's address: the value of --listen.
    let mut cfg = ExporterConfig::new(args[1].clone(), "checkpoint-test");
    cfg.backoff_min = Duration::from_millis(20);
    cfg.backoff_max = Duration::from_millis(200);
    cfg.max_batch = 2_000;
    let exporter = Exporter::start(cfg, HOPS).unwrap();
    let probes: Vec<_> = HOPS
        .iter()
        .map(|(h, _)| exporter.probe(*h).unwrap())
        .collect();
    let started = Instant::now();
    let mut c = Some(c);
    let mut killed_at = None;
    for chunk in 0..TRACES / 1_000 {
        for sequence in chunk * 1_000..(chunk + 1) * 1_000 {
            let key = TraceKey {
                publisher: 1,
                stream: (sequence % 10) as u32,
                sequence: sequence / 10,
            };
            let mut ctx = TraceContext::new(key, 1, hoptrace_probe::clock::realtime_ns());
            for p in &probes {
                assert!(p.record(&mut ctx).queued);
            }
        }
        // About 60,000 traces/s: the workload's pace.
        let due = started + Duration::from_micros((chunk + 1) * 1_000_000 / 60);
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
        // Killed once checkpoints have deleted some of the log, half-way through.
        if chunk == TRACES / 2_000 {
            assert!(
                run.join("wal").join("checkpoint").exists(),
                "no checkpoint after {:?}",
                started.elapsed()
            );
            c.take().unwrap().kill();
            killed_at = Some(chunk);
            c = Some(Collect::start(&args));
            let line = c.as_ref().unwrap().wait_line("continuing run ");
            assert!(line.contains("took up its checkpoint"), "{line}");
        }
    }
    assert!(killed_at.is_some());
    let entries: Vec<SentEntry> = (0..10)
        .map(|stream| SentEntry {
            stream,
            messages: TRACES / 10,
            metrics: TRACES / 10,
            first_sequence: 0,
            last_sequence: TRACES / 10 - 1,
        })
        .collect();
    exporter
        .send_sent_frame(SentFrame {
            publisher: 1,
            entries,
        })
        .unwrap();
    let summary = exporter.shutdown();
    assert!(summary.clean, "{summary:?}");
    assert_eq!(summary.counters.lost(), 0, "{summary:?}");
    watching.store(false, std::sync::atomic::Ordering::Relaxed);
    let (most_bytes, most_segments, segments_seen) = watcher.join().unwrap();
    c.take().unwrap().stop();

    let json = run_json(&run);
    let a = &json["accounting"];
    // A record of a trace is 36 bytes in its frame: the log held about that much per
    // record that went through it, the run sent 600,000 records (21.6 MB).
    let through = 2 * TRACES * 36;
    eprintln!(
        "log on disk: at most {most_bytes} bytes in {most_segments} segment(s) at once; {} segments in the run; {through} bytes of records went through; restart: {}",
        segments_seen.len(),
        json["restarts"][0]
    );
    assert!(
        most_bytes * 4 < through,
        "the log reached {most_bytes} bytes on disk of {through} that went through it"
    );
    assert!(most_segments <= 4, "{most_segments} log segments at once");
    assert!(
        segments_seen.len() >= 5,
        "only {} segments in the run: {segments_seen:?}",
        segments_seen.len()
    );
    let restarts = json["restarts"].as_array().unwrap();
    assert_eq!(restarts.len(), 1, "{restarts:?}");
    assert!(
        restarts[0]["checkpoint_unix_ns"].as_i64().is_some(),
        "{restarts:?}"
    );
    let p = &a["publishers"][0];
    assert_eq!(
        (&p["sent"], &p["complete"], &p["incomplete"], &p["unseen"]),
        (&TRACES.into(), &TRACES.into(), &0.into(), &0.into()),
        "{a}"
    );
    assert_eq!(a["records_by_hop"]["publish"], TRACES, "{a}");
    assert_eq!(a["records_by_hop"]["broker"], TRACES, "{a}");
    assert_eq!(
        (&a["duplicate_traces"], &a["late_records"]),
        (&0.into(), &0.into()),
        "{a}"
    );
    assert_eq!(a["adds_up"], true, "{a}");
    assert_eq!(rows_and_keys(&run, &json), (TRACES, TRACES));
    assert!(!run.join("wal").exists(), "the log outlived a clean stop");
    let _ = std::fs::remove_dir_all(&out);
}

// ---------------------------------------------------------------------------------------
// Unfinished runs

/// A run killed with its log; a collector started without `--run-id` says how to
/// continue it and starts a new run; `--resume` continues it.
#[test]
fn a_collector_without_run_id_names_the_unfinished_run_and_resume_continues_it() {
    let out = common::scratch("unfinished");
    std::fs::write(out.join("spec.toml"), spec(1_000_000)).unwrap();
    let spec_path = out.join("spec.toml");
    let runs: PathBuf = out.join("runs");
    let base = |extra: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = [
            "--listen",
            "127.0.0.1:0",
            "--pipeline",
            spec_path.to_str().unwrap(),
            "--runs",
            runs.to_str().unwrap(),
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        v.extend(extra.iter().map(|s| (*s).to_owned()));
        v
    };
    let collect = |args: &[String]| {
        let mut all = vec!["collect"];
        all.extend(args.iter().map(String::as_str));
        common::hoptrace_in(&out, &all)
    };

    // Nothing unfinished yet: --resume refuses.
    let refused = collect(&base(&["--resume", "--duration", "1s"]));
    assert!(!refused.status.success(), "{}", common::text(&refused));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("no unfinished run of this pipeline"),
        "{}",
        common::text(&refused)
    );

    let first = base(&["--run-id", "killed"]);
    let c = Collect::start(&first.iter().map(String::as_str).collect::<Vec<_>>());
    let (mut s, _) = connect(c.listening(), 7);
    for seq in 1..=4 {
        send(&mut s, &frame(seq));
    }
    wait_ack(&mut s, 4);
    c.kill();
    drop(s);
    assert!(runs.join("killed").join("wal").is_dir());

    // Without --run-id: named, with the way to continue it; a new run starts.
    let fresh = collect(&base(&["--duration", "1s"]));
    let err = String::from_utf8_lossy(&fresh.stderr).into_owned();
    assert!(fresh.status.success(), "{}", common::text(&fresh));
    assert!(
        err.contains("killed is an unfinished run") && err.contains("--run-id killed"),
        "{}",
        common::text(&fresh)
    );
    assert!(runs.join("killed").join("wal").is_dir());
    let new_runs: Vec<String> = std::fs::read_dir(&runs)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().into_string().unwrap())
        .filter(|n| n.starts_with("run-"))
        .collect();
    assert_eq!(new_runs.len(), 1, "{new_runs:?}");

    // --resume: the unfinished run is continued and closed.
    let resumed = collect(&base(&["--resume", "--duration", "1s"]));
    let err = String::from_utf8_lossy(&resumed.stderr).into_owned();
    assert!(resumed.status.success(), "{}", common::text(&resumed));
    assert!(err.contains("resuming the unfinished run killed"), "{err}");
    let run = runs.join("killed");
    let json = run_json(&run);
    assert_eq!(json["restarts"].as_array().map(Vec::len), Some(1), "{json}");
    assert_eq!(
        json["accounting"]["publishers"][0]["complete"],
        4 * TRACES_PER_FRAME
    );
    assert!(!run.join("wal").exists(), "the log outlived a clean stop");
    let _ = std::fs::remove_dir_all(&out);
}

/// Publish from a probe; `broker` stamped by producer spans over OTLP.
const OTLP_SPEC: &str = r#"name = "durable-otlp"
[[hops]]
name = "publish"
id = 0
[[hops]]
name = "broker"
id = 1
span = { kind = "producer", name = "* publish" }
[[stages]]
name = "Broker Time"
from = "publish"
to = "broker"
definition = "publish to the producer span's start"
"#;

/// POSTs an OTLP/JSON body to `addr`; returns the answer's status line.
fn post_otlp_json(addr: &str, body: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "POST /v1/traces HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    std::io::Read::read_to_string(&mut s, &mut answer).unwrap();
    answer.lines().next().unwrap_or_default().to_owned()
}

/// The collector answers an OTLP request only once its stamps are in the run's log: spans
/// answered 200 just before a SIGKILL are in the run the same command continues, and every
/// message is complete.
#[test]
fn otlp_spans_answered_before_a_sigkill_are_in_the_continued_run() {
    const N: u64 = 100;
    let dir = common::scratch("otlp-kill");
    let spec = dir.join("otlp.toml");
    std::fs::write(&spec, OTLP_SPEC).unwrap();
    let runs = dir.join("runs");
    let (listen, otlp) = (
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
    );
    let (spec_s, runs_s) = (spec.display().to_string(), runs.display().to_string());
    let args = [
        "--listen",
        &listen,
        "--otlp",
        &otlp,
        "--pipeline",
        &spec_s,
        "--runs",
        &runs_s,
        "--run-id",
        "otlp-kill",
    ];
    let base = hoptrace_probe::clock::realtime_ns() - 10_000_000_000;
    let key = |sequence| TraceKey {
        publisher: 1,
        stream: 0,
        sequence,
    };
    let spans: Vec<String> = (0..N)
        .map(|seq| {
            format!(
                r#"{{"traceId":"{}","spanId":"0102030405060708","name":"orders publish","kind":4,"startTimeUnixNano":"{}","endTimeUnixNano":"{}"}}"#,
                hoptrace_protocol::OtelTraceId::of_key(&key(seq)).to_hex(),
                base + seq as i64 * 1_000 + 700,
                base + seq as i64 * 1_000 + 900
            )
        })
        .collect();
    let body = format!(
        r#"{{"resourceSpans":[{{"resource":{{"attributes":[{{"key":"service.name","value":{{"stringValue":"producer"}}}}]}},"scopeSpans":[{{"spans":[{}]}}]}}]}}"#,
        spans.join(",")
    );

    let c = Collect::start(&args);
    c.listening();
    c.wait_line("taking OTLP/HTTP spans at ");
    let status = post_otlp_json(&otlp, &body);
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    c.kill();

    let c = Collect::start(&args);
    let addr = c.listening();
    let (mut s, _) = connect(addr, 77);
    let records = (0..N)
        .map(|seq| Record {
            key: key(seq),
            hop: HopId(0),
            stamp_ns: base + seq as i64 * 1_000,
            metric_count: 1,
            intended_ns: base + seq as i64 * 1_000 - 50,
            otel_trace_id: None,
        })
        .collect();
    send(&mut s, &Frame::SeqRecords { seq: 1, records });
    wait_ack(&mut s, 1);
    send(
        &mut s,
        &Frame::Sent(SentFrame {
            publisher: 1,
            entries: vec![SentEntry {
                stream: 0,
                messages: N,
                metrics: N,
                first_sequence: 0,
                last_sequence: N - 1,
            }],
        }),
    );
    send(&mut s, &Frame::Goodbye);
    drop(s);
    c.stop();
    let run = run_json(&runs.join("otlp-kill"));
    let acc = &run["accounting"];
    assert_eq!(acc["adds_up"], true, "{acc}");
    assert_eq!(acc["publishers"][0]["complete"], N, "{acc}");
    assert_eq!(
        run["restarts"].as_array().map(Vec::len),
        Some(1),
        "{}",
        run["restarts"]
    );
    let broker = run["stages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "Broker Time")
        .unwrap();
    assert_eq!(broker["min_ns"], 700, "{broker}");
    assert_eq!(broker["max_ns"], 700, "{broker}");
}

#[test]
fn otlp_needs_a_span_hop_and_generate_config_otel_prints_one() {
    let dir = common::scratch("otlp-config");
    let out = common::hoptrace_in(&dir, &["generate-config", "--otel"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    std::fs::write(dir.join("otel.toml"), &text).unwrap();
    assert!(text.contains("span = {") && text.contains("kind = \"consumer\""));
    let refused = common::hoptrace_in(
        &dir,
        &[
            "collect",
            "--otlp",
            "127.0.0.1:0",
            "--duration",
            "1s",
            "--runs",
            "runs",
        ],
    );
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        err.contains("no hop of the pipeline \"mqtt-flow-store\" has a `span` match"),
        "{err}"
    );
    let ok = common::hoptrace_in(
        &dir,
        &[
            "collect",
            "--otlp",
            "127.0.0.1:0",
            "--listen",
            "127.0.0.1:0",
            "--duration",
            "1s",
            "--runs",
            "runs",
            "--pipeline",
            "otel.toml",
        ],
    );
    assert!(ok.status.success(), "{}", common::failure(&ok));
    let run_dir = common::list(&dir.join("runs")).pop().unwrap();
    let run = run_json(&run_dir);
    assert_eq!(run["otlp"]["requests"], 0, "{}", run["otlp"]);
}
