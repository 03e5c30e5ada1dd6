//! Every command stops on SIGINT or SIGTERM within a second, whatever it waits for: a
//! store, broker or collector that accepts a connection and never answers, or a store that
//! is not up yet. Each ends with a line that names what it waited for, and exit status
//! 128 + the signal (130 for SIGINT, 143 for SIGTERM), as a shell reports it.

mod common;

use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use common::{scratch, spawn_in, text};

/// A loopback server that takes connections and never reads nor writes a byte.
struct Silent {
    listener: TcpListener,
    taken: Vec<TcpStream>,
}

impl Silent {
    fn new() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        Self {
            listener,
            taken: Vec::new(),
        }
    }

    fn port(&self) -> u16 {
        self.listener.local_addr().unwrap().port()
    }

    /// Takes whatever connected since the last call; true when something ever did.
    fn connected(&mut self) -> bool {
        while let Ok((s, _)) = self.listener.accept() {
            self.taken.push(s);
        }
        !self.taken.is_empty()
    }
}

/// Runs `hoptrace ARGS` (each `{port}` is the silent server's port) until it has connected
/// to the silent server, sends it `sig`, and checks it stopped within a second, with exit
/// status 128 + `sig` and a last line naming `waiting_for`.
fn stops_within_a_second(tag: &str, args: &[&str], sig: i32, waiting_for: &str) {
    let mut silent = Silent::new();
    let port = silent.port().to_string();
    let args: Vec<String> = args.iter().map(|a| a.replace("{port}", &port)).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let dir = scratch(tag);
    let mut run = spawn_in(&dir, &args);
    hoptrace_testkit::wait_for(
        &format!("{tag} to connect"),
        Duration::from_secs(30),
        || {
            assert!(run.running(), "{tag}: ended before it connected");
            silent.connected()
        },
    );
    let sent = Instant::now();
    run.signal(sig);
    let out = run.finish_within(Duration::from_secs(10));
    let took = sent.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        took < Duration::from_secs(1),
        "{tag}: took {took:?}\n{}",
        text(&out)
    );
    assert_eq!(out.status.code(), Some(128 + sig), "{tag}: {}", text(&out));
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("stopped by SIG") && last.contains(waiting_for),
        "{tag}: {last:?}\n{}",
        text(&out)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn store_taps_stop_while_a_silent_store_does_not_answer() {
    for (tag, from) in [
        ("pg", "postgres://u@127.0.0.1:{port}/db?table=t&time=at"),
        ("influx", "influxdb://127.0.0.1:{port}/db?measurement=m"),
        ("clickhouse", "clickhouse://127.0.0.1:{port}/db?table=t"),
        ("vm", "victoriametrics://127.0.0.1:{port}/?metric=m"),
    ] {
        stops_within_a_second(tag, &["tap", "--from", from], libc::SIGINT, "connecting to");
    }
    stops_within_a_second(
        "pg-term",
        &[
            "tap",
            "--from",
            "postgres://u@127.0.0.1:{port}/db?table=t&time=at",
        ],
        libc::SIGTERM,
        "connecting to",
    );
}

#[test]
fn brokers_that_never_answer_do_not_hold_publish_or_tap() {
    for (tag, args) in [
        (
            "pub-mqtt",
            &["publish", "--to", "mqtt://127.0.0.1:{port}"][..],
        ),
        (
            "pub-kafka",
            &["publish", "--to", "kafka://127.0.0.1:{port}/t"],
        ),
        ("tap-mqtt", &["tap", "--from", "mqtt://127.0.0.1:{port}"]),
        (
            "tap-kafka",
            &["tap", "--from", "kafka://127.0.0.1:{port}/t"],
        ),
    ] {
        stops_within_a_second(tag, args, libc::SIGINT, "connecting to");
    }
}

#[test]
fn a_silent_collector_does_not_hold_a_part_that_reports_to_it() {
    stops_within_a_second(
        "store-collector",
        &[
            "refpipe",
            "store",
            "--listen",
            "127.0.0.1:0",
            "--collector",
            "127.0.0.1:{port}",
        ],
        libc::SIGINT,
        "connecting to the collector",
    );
}

/// `--wait-for-store 30s` for a store that is not up: SIGINT ends the wait, and the
/// message does not suggest the option given.
#[test]
fn waiting_for_a_store_ends_on_sigint() {
    // A server that closes every connection at once: the tap retries, with backoff.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let closer = std::thread::spawn(move || {
        let mut n = 0;
        for s in listener.incoming() {
            drop(s);
            n += 1;
            if n == 2 {
                return;
            }
        }
    });
    let dir = scratch("wait-for-store");
    let from = format!("influxdb://127.0.0.1:{port}/db?measurement=m");
    let run = spawn_in(&dir, &["tap", "--from", &from, "--wait-for-store", "30s"]);
    // Two attempts: it is waiting.
    closer.join().unwrap();
    let sent = Instant::now();
    run.interrupt();
    let out = run.finish_within(Duration::from_secs(10));
    assert!(sent.elapsed() < Duration::from_secs(1), "{}", text(&out));
    assert_eq!(out.status.code(), Some(130), "{}", text(&out));
    let _ = std::fs::remove_dir_all(&dir);

    // Without waiting, the message suggests waiting; with it, it says the wait ran out.
    let dir = scratch("wait-for-store-2");
    let closed = hoptrace_testkit::closed_port();
    let from = format!("influxdb://127.0.0.1:{closed}/db?measurement=m");
    let out = common::hoptrace_in(&dir, &["tap", "--from", &from]);
    let err = common::failure(&out);
    assert!(err.contains("--wait-for-store 30s"), "{err}");
    let out = common::hoptrace_in(&dir, &["tap", "--from", &from, "--wait-for-store", "300ms"]);
    let err = common::failure(&out);
    assert!(!err.contains("`--wait-for-store 30s`"), "{err}");
    assert!(
        err.contains("did not come up in the time --wait-for-store gave it"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A silent HTTP store is reported in one line: where, and which timeout ran out; never
/// "Network Error: Network Error".
#[test]
fn a_store_that_does_not_answer_in_time_is_said_once() {
    let mut silent = Silent::new();
    let dir = scratch("silent-http");
    let from = format!(
        "influxdb://127.0.0.1:{}/db?measurement=m&timeout=500ms",
        silent.port()
    );
    let run = spawn_in(&dir, &["tap", "--from", &from]);
    let out = run.finish_within(Duration::from_secs(30));
    assert!(silent.connected());
    let err = common::failure(&out);
    assert!(!err.contains("Network Error: Network Error"), "{err}");
    assert!(err.contains("no answer within 500ms"), "{err}");
    assert!(
        !err.contains("SELECT"),
        "the address's query is not printed: {err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A probe the collector refuses for good (a hop its pipeline does not declare) does not
/// retry until a timeout: the command ends at once with the collector's reason.
#[test]
fn a_probe_refused_for_good_ends_the_command_with_the_reason() {
    let dir = scratch("refused");
    std::fs::write(dir.join("other.toml"), common::OTHER_PIPELINE).unwrap();
    let port = hoptrace_testkit::closed_port();
    let listen = format!("127.0.0.1:{port}");
    let collect = spawn_in(
        &dir,
        &[
            "collect",
            "--listen",
            &listen,
            "--pipeline",
            "other.toml",
            "--run-id",
            "refused",
        ],
    );
    hoptrace_testkit::wait_for("the collector to listen", Duration::from_secs(30), || {
        TcpStream::connect(&listen).is_ok()
    });
    let started = Instant::now();
    let out = common::hoptrace_in(
        &dir,
        &[
            "refpipe",
            "store",
            "--listen",
            "127.0.0.1:0",
            "--collector",
            &listen,
        ],
    );
    let err = common::failure(&out);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}: {err}",
        started.elapsed()
    );
    assert!(
        err.contains("refused") && err.contains("not declared"),
        "{err}"
    );
    assert!(
        err.matches("cannot reach the collector").count() <= 1,
        "retried: {err}"
    );
    collect.interrupt();
    let out = collect.finish_within(Duration::from_secs(30));
    assert!(out.status.success(), "{}", text(&out));
    let _ = std::fs::remove_dir_all(&dir);
}
