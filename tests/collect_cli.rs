//! `hoptrace collect` as a user runs it: a separate process, probes over TCP, metrics
//! scraped over HTTP, and SIGTERM flushing every file.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use hoptrace_probe::{Exporter, ExporterConfig, HopId, TraceContext, TraceKey};

/// The default pipeline's hops with their wire ids, as `hoptrace collect` expects them.
fn default_hops() -> Vec<(HopId, String)> {
    hoptrace_format::spec::PipelineSpec::default_pipeline()
        .hops
        .iter()
        .enumerate()
        .map(|(i, h)| (HopId(h.id.unwrap_or(i as u8)), h.name.clone()))
        .collect()
}

/// Sends `traces` messages that pass every hop, from one exporter, to the collector at
/// `addr`; stream of message `seq` is `seq % streams`. Returns the exporter's summary.
fn send_complete_traces(
    addr: String,
    process: &str,
    traces: u64,
    streams: u64,
) -> hoptrace_probe::ExportSummary {
    let hops = default_hops();
    let named: Vec<(HopId, &str)> = hops.iter().map(|(h, n)| (*h, n.as_str())).collect();
    let exporter = Exporter::start(ExporterConfig::new(addr, process), &named).unwrap();
    let probes: Vec<_> = hops
        .iter()
        .map(|(h, _)| exporter.probe(*h).unwrap())
        .collect();
    for seq in 0..traces {
        let key = TraceKey {
            publisher: 1,
            stream: (seq % streams) as u32,
            sequence: seq,
        };
        let mut ctx = TraceContext::new(key, 5, 0);
        for p in &probes {
            assert!(p.record(&mut ctx).queued);
        }
    }
    exporter.shutdown()
}

fn wait_line(rx: &mpsc::Receiver<String>, prefix: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let line = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("collector output");
        if let Some(rest) = line.strip_prefix(prefix) {
            return rest.to_owned();
        }
    }
}

/// Starts `hoptrace collect` with `args`; its stderr lines arrive on the receiver.
fn spawn_collect(args: &[&std::ffi::OsStr]) -> (std::process::Child, mpsc::Receiver<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_hoptrace"))
        .arg("collect")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (child, rx)
}

#[test]
fn collect_serves_metrics_and_flushes_everything_on_sigterm() {
    let out = std::env::temp_dir().join(format!("hoptrace-cli-{}", std::process::id()));
    let os = |s: &'static str| std::ffi::OsStr::new(s);
    let (mut child, rx) = spawn_collect(&[
        os("--listen"),
        os("127.0.0.1:0"),
        os("--metrics"),
        os("127.0.0.1:0"),
        os("--run-id"),
        os("cli-run"),
        os("--runs"),
        out.as_os_str(),
    ]);
    let addr = wait_line(&rx, "collecting on ")
        .split(' ')
        .next()
        .unwrap()
        .to_owned();
    let metrics = wait_line(&rx, "metrics on http://")
        .trim_end_matches("/metrics")
        .to_owned();

    let summary = send_complete_traces(addr, "cli-test", 20_000, 50);
    assert!(summary.clean && summary.counters.lost() == 0, "{summary:?}");

    // Scrape until the collector has taken every record (progress refreshes every 100 ms).
    let mut page = String::new();
    hoptrace_testkit::poll_until(Duration::from_secs(20), || {
        let mut s = std::net::TcpStream::connect(&metrics).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n")
            .unwrap();
        page.clear();
        s.read_to_string(&mut page).unwrap();
        page.contains("\nhoptrace_traces_total{status=\"complete\"} 20000\n")
    });
    assert!(page.starts_with("HTTP/1.1 200 OK"), "{page}");
    assert!(page.contains("\nhoptrace_records_total 120000\n"), "{page}");
    assert!(
        page.contains("\nhoptrace_traces_total{status=\"complete\"} 20000\n"),
        "{page}"
    );

    // SAFETY: signalling our own child process.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    let mut stdout = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    assert!(
        stdout.contains("sent 0 = complete 20000") || stdout.contains("complete 20000"),
        "{stdout}"
    );
    assert!(
        stdout.contains("counts add up: yes") || stdout.contains("in flight 0"),
        "{stdout}"
    );

    let run = out.join("cli-run");
    for f in ["run.json", "clock.parquet", "probes.parquet"] {
        assert!(run.join(f).is_file(), "{f} missing");
    }
    let parts: Vec<_> = std::fs::read_dir(run.join("traces"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().into_string().unwrap())
        .collect();
    assert!(
        !parts.is_empty() && parts.iter().all(|p| p.ends_with(".parquet")),
        "{parts:?}"
    );
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("run.json")).unwrap()).unwrap();
    assert_eq!(json["accounting"]["in_flight"], 0);
    assert_eq!(json["accounting"]["records_by_hop"]["queryable"], 20_000);
    let _ = std::fs::remove_dir_all(&out);
}

/// Starts `hoptrace collect` on run id `killed` under `out` with 1000-row files, sends
/// 5,500 complete traces, waits until five files are closed and kills it with SIGKILL,
/// then starts it again with the same command: returns the second collector and its
/// output lines.
fn killed_and_restarted(
    out: &std::path::Path,
    extra: &[&str],
) -> (std::process::Child, mpsc::Receiver<String>) {
    std::fs::create_dir_all(out).unwrap();
    let spec = hoptrace_format::spec::DEFAULT_PIPELINE_TOML
        .replace("roll_rows = 1000000", "roll_rows = 1000")
        .replace("row_group_rows = 1000000", "row_group_rows = 1000");
    let spec_path = out.join("pipeline.toml");
    std::fs::write(&spec_path, spec).unwrap();
    let start = || {
        let mut args: Vec<&std::ffi::OsStr> = [
            "--listen",
            "127.0.0.1:0",
            "--run-id",
            "killed",
            "--pipeline",
        ]
        .iter()
        .map(std::ffi::OsStr::new)
        .collect();
        args.extend([
            spec_path.as_os_str(),
            std::ffi::OsStr::new("--runs"),
            out.as_os_str(),
        ]);
        args.extend(extra.iter().map(std::ffi::OsStr::new));
        spawn_collect(&args)
    };
    let (mut child, rx) = start();
    let addr = wait_line(&rx, "collecting on ")
        .split(' ')
        .next()
        .unwrap()
        .to_owned();
    assert!(send_complete_traces(addr, "kill-test", 5_500, 1).clean);
    // Wait until the five full files are closed, then kill without warning.
    let traces = out.join("killed").join("traces");
    hoptrace_testkit::wait_for("five closed files", Duration::from_secs(20), || {
        std::fs::read_dir(&traces).map_or(0, |d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().ends_with(".parquet"))
                .count()
        }) >= 5
    });
    child.kill().unwrap();
    child.wait().unwrap();
    start()
}

/// SIGTERM to `child`, which must exit 0; returns the run's run.json.
fn stop_collect(child: &mut std::process::Child, out: &std::path::Path) -> serde_json::Value {
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(child.wait().unwrap().success());
    serde_json::from_slice(&std::fs::read(out.join("killed").join("run.json")).unwrap()).unwrap()
}

#[test]
fn after_sigkill_the_same_command_continues_the_run_from_its_log_and_loses_nothing() {
    let out = std::env::temp_dir().join(format!("hoptrace-kill-log-{}", std::process::id()));
    let (mut child, rx) = killed_and_restarted(&out, &[]);
    let line = wait_line(&rx, "continuing run ");
    assert!(line.starts_with("killed from its log"), "{line}");
    let json = stop_collect(&mut child, &out);
    // Every trace the killed collector had taken, complete, once (this sender reports no
    // Sent frame, so the accounting cannot add up; the rows are the point here).
    let a = &json["accounting"];
    assert_eq!(a["publishers"][0]["complete"], 5_500, "{a}");
    assert_eq!(a["publishers"][0]["incomplete"], 0, "{a}");
    assert_eq!(a["duplicate_traces"], 0, "{a}");
    let rows: u64 = json["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["rows"].as_u64().unwrap())
        .sum();
    assert_eq!(rows, 5_500, "{}", json["files"]);
    assert_eq!(json["restarts"].as_array().map(Vec::len), Some(1), "{json}");
    assert!(json["restarts"][0]["log_entries"].as_u64() > Some(0));
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn after_sigkill_without_a_log_a_restart_keeps_closed_files_and_reports_the_lost_open_one() {
    let out = std::env::temp_dir().join(format!("hoptrace-kill-{}", std::process::id()));
    let (mut child, rx) = killed_and_restarted(&out, &["--no-log"]);
    let line = wait_line(&rx, "recovered: ");
    assert_eq!(
        line,
        "5 complete file(s) with 5000 rows kept from an earlier collector in this run directory"
    );
    let json = stop_collect(&mut child, &out);
    assert_eq!(json["recovered"]["rows"], 5000);
    let _ = std::fs::remove_dir_all(&out);
}

/// No real clock has an error bound of 1 ns: the preflight refuses to start, and
/// `--force-clock` turns the refusal into a warning.
#[test]
fn the_clock_preflight_refuses_unless_forced() {
    let dir = std::env::temp_dir().join(format!("hoptrace-preflight-{}", std::process::id()));
    let run = |force: bool| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_hoptrace"));
        c.args([
            "collect",
            "--listen",
            "127.0.0.1:0",
            "--duration-s",
            "1",
            "--max-clock-error",
            "1ns",
        ])
        .arg("--runs")
        .arg(&dir);
        if force {
            c.arg("--force-clock");
        }
        c.output().unwrap()
    };
    let refused = run(false);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(stderr.contains("clock preflight failed"), "{stderr}");
    // It says how to fix it.
    for hint in ["chronyc tracking", "infra/clock/README.md", "--force-clock"] {
        assert!(stderr.contains(hint), "{hint}: {stderr}");
    }
    assert!(!dir.exists(), "a refused run writes nothing");
    let forced = run(true);
    let stderr = String::from_utf8_lossy(&forced.stderr);
    assert!(forced.status.success(), "{stderr}");
    assert!(
        stderr.contains("warning:") && stderr.contains("forced: continuing"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// One collector session on run `cont` under `out` (`extra` options): `complete` traces
/// with every hop from sequence `first`, then `partial` with only the publish hop, then a
/// Sent frame saying the publisher has sent `sent` messages (sequences `0..sent`) so far.
/// SIGTERM once the records are in; returns what the collector printed.
fn continued_session(
    out: &std::path::Path,
    extra: &[&str],
    first: u64,
    (complete, partial): (u64, u64),
    sent: u64,
) -> String {
    let mut args: Vec<&std::ffi::OsStr> = ["--listen", "127.0.0.1:0", "--run-id", "cont", "--runs"]
        .iter()
        .map(std::ffi::OsStr::new)
        .collect();
    args.push(out.as_os_str());
    args.extend(extra.iter().map(std::ffi::OsStr::new));
    let (mut child, rx) = spawn_collect(&args);
    let addr = wait_line(&rx, "collecting on ")
        .split(' ')
        .next()
        .unwrap()
        .to_owned();
    if complete + partial > 0 || sent > 0 {
        let hops = default_hops();
        let named: Vec<(HopId, &str)> = hops.iter().map(|(h, n)| (*h, n.as_str())).collect();
        let exporter = Exporter::start(ExporterConfig::new(addr, "continue-test"), &named).unwrap();
        let probes: Vec<_> = hops
            .iter()
            .map(|(h, _)| exporter.probe(*h).unwrap())
            .collect();
        for seq in first..first + complete + partial {
            let key = TraceKey {
                publisher: 1,
                stream: 0,
                sequence: seq,
            };
            let mut ctx = TraceContext::new(key, 5, hoptrace_probe::clock::realtime_ns());
            let hops = if seq < first + complete {
                probes.len()
            } else {
                1
            };
            for p in &probes[..hops] {
                assert!(p.record(&mut ctx).queued);
            }
        }
        exporter
            .send_sent_frame(hoptrace_protocol::SentFrame {
                publisher: 1,
                entries: vec![hoptrace_protocol::SentEntry {
                    stream: 0,
                    messages: sent,
                    metrics: sent * 5,
                    first_sequence: 0,
                    last_sequence: sent - 1,
                }],
            })
            .unwrap();
        let s = exporter.shutdown();
        assert!(s.clean && s.counters.lost() == 0, "{s:?}");
    }
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(child.wait().unwrap().success());
    let mut stdout = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    stdout
}

/// `hoptrace report` of run `cont` under `out`: its stdout lines after the first (which
/// holds the run's duration, longer with every session).
fn report_lines(out: &std::path::Path) -> Vec<String> {
    let o = Command::new(env!("CARGO_BIN_EXE_hoptrace"))
        .arg("report")
        .arg(out.join("cont"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .skip(1)
        .map(str::to_owned)
        .collect()
}

/// A run continued with `--continue`, with and without traffic, keeps what it had: what
/// its publisher sent, its probes, its clocks, its stages; and the report's "adds up" is
/// said of the figures it prints.
#[test]
fn a_continued_run_keeps_everything_it_had_and_its_report_adds_up() {
    for extra in [&[][..], &["--no-log"][..]] {
        let out = std::env::temp_dir().join(format!(
            "hoptrace-continue-{}-{}",
            std::process::id(),
            extra.len()
        ));
        let _ = std::fs::remove_dir_all(&out);
        let first = continued_session(&out, extra, 0, (1_000, 500), 1_520);
        assert!(first.contains("counts add up: yes"), "{first}");
        let before = report_lines(&out);
        let accounting =
            "accounting: sent 1,520 = complete 1,000 + incomplete 500 + unseen 20: adds up";
        assert!(before.iter().any(|l| l.contains(accounting)), "{before:#?}");
        let run_json = || -> serde_json::Value {
            serde_json::from_slice(&std::fs::read(out.join("cont").join("run.json")).unwrap())
                .unwrap()
        };
        let had = run_json();
        let continued = [extra, &["--continue"]].concat();
        // Twice without traffic: nothing changes but the run's end.
        for _ in 0..2 {
            let printed = continued_session(&out, &continued, 0, (0, 0), 0);
            assert!(printed.contains("counts add up: yes"), "{printed}");
            assert_eq!(report_lines(&out), before, "extra {extra:?}");
            let now = run_json();
            for field in ["probes", "clock", "stages", "files"] {
                assert_eq!(now[field], had[field], "{field} with {extra:?}");
            }
            assert_eq!(
                now["accounting"]["publishers"], had["accounting"]["publishers"],
                "{extra:?}"
            );
        }
        // With traffic: 100 more, complete; the publisher's count goes on.
        let printed = continued_session(&out, &continued, 1_520, (100, 0), 1_620);
        assert!(printed.contains("counts add up: yes"), "{printed}");
        let after = report_lines(&out);
        let accounting =
            "accounting: sent 1,620 = complete 1,100 + incomplete 500 + unseen 20: adds up";
        assert!(after.iter().any(|l| l.contains(accounting)), "{after:#?}");
        let now = run_json();
        assert_eq!(
            now["probes"].as_array().map(Vec::len),
            Some(2),
            "{}",
            now["probes"]
        );
        // And once more without: the same.
        continued_session(&out, &continued, 0, (0, 0), 0);
        assert_eq!(report_lines(&out), after);
        let _ = std::fs::remove_dir_all(&out);
    }
}

/// Stages no trace had both hops of (only `publish` stamped here) say so once each in the
/// report, and warn about nothing else (no clock uncertainty against a P50 they have not).
#[test]
fn a_stage_without_values_says_so_once_and_nothing_else() {
    let out = std::env::temp_dir().join(format!("hoptrace-empty-stages-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    continued_session(&out, &[], 0, (0, 300), 300);
    let lines = report_lines(&out);
    let stages = hoptrace_format::spec::PipelineSpec::default_pipeline().stages;
    for st in &stages {
        let said: Vec<&String> = lines
            .iter()
            .filter(|l| l.contains(&format!("warning: {}:", st.name)))
            .collect();
        assert_eq!(said.len(), 1, "{}: {lines:#?}", st.name);
        assert!(said[0].contains("no values"), "{said:?}");
    }
    assert!(
        !lines.iter().any(|l| l.contains("not small against")),
        "{lines:#?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("sent 300 = complete 0 + incomplete 300 + unseen 0: adds up")),
        "{lines:#?}"
    );
    let _ = std::fs::remove_dir_all(&out);
}
