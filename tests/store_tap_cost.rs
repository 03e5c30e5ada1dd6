//! What a store tap cost, end to end: a real store tap polls a scripted ClickHouse HTTP
//! endpoint (its answers carry the store's own query duration, one poll fails) and
//! reports to a real `hoptrace collect`; the collector writes the tap's counters into
//! `probes.parquet`, and the analysis reads them back (`polled_hops`, `summary.json`)
//! with the figures the tap printed: polls, polls/s, failed polls, query time P50/P99/max,
//! the store's own duration, rows and keys.
//!
//! The store is scripted rather than real so that the store's own durations are known
//! exactly and the test needs no service; `tap/tests/stores.rs` runs the same tap against
//! the real ClickHouse.

mod common;

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hoptrace_analysis::RunSet;
use hoptrace_analysis::summary::{self, StoreTapCost};
use hoptrace_probe::ExporterConfig;
use hoptrace_probe::clock::realtime_ns;
use hoptrace_probe::{TraceContext, TraceKey};
use hoptrace_tap::poll::Spread;
use hoptrace_tap::{StoreTap, StoreTapConfig, StoreUrl};
use hoptrace_testkit::Acceptor;

/// The poll (counting from 1, the opening query apart) the scripted store fails.
const FAILING_POLL: u64 = 6;

/// The store's own duration it reports for its `n`-th poll: 100, 200, 300 or 400 µs.
fn server_elapsed_s(n: u64) -> f64 {
    (n % 4 + 1) as f64 * 100e-6
}

/// A ClickHouse HTTP endpoint answering the tap's queries from `rows` (key, Unix s).
struct ScriptedClickHouse {
    addr: String,
    rows: Arc<Mutex<Vec<(String, i64)>>>,
    polls: Arc<AtomicU64>,
    /// Stops (when the store is dropped) and frees the port.
    _acceptor: Acceptor,
}

impl ScriptedClickHouse {
    fn start() -> Self {
        let rows = Arc::new(Mutex::new(Vec::new()));
        let polls = Arc::new(AtomicU64::new(0));
        let (r, p) = (Arc::clone(&rows), Arc::clone(&polls));
        let acceptor = Acceptor::spawn(TcpListener::bind("127.0.0.1:0").unwrap(), move |conn| {
            let (r, p) = (Arc::clone(&r), Arc::clone(&p));
            std::thread::spawn(move || serve(conn, &r, &p));
        });
        Self {
            addr: acceptor.addr().to_string(),
            rows,
            polls,
            _acceptor: acceptor,
        }
    }
}

/// One keep-alive connection: every request answered from `rows`.
fn serve(conn: TcpStream, rows: &Mutex<Vec<(String, i64)>>, polls: &AtomicU64) {
    conn.set_nonblocking(false).unwrap();
    let mut out = conn.try_clone().unwrap();
    let mut r = BufReader::new(conn);
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut length = 0usize;
        loop {
            let mut h = String::new();
            if r.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                length = v.trim().parse().unwrap();
            }
        }
        let mut body = vec![0; length];
        r.read_exact(&mut body).unwrap();
        let sql = String::from_utf8(body).unwrap();
        let (status, answer) = if sql.contains("max(toUnixTimestamp") {
            (200, r#"{"data":[[0,"0"]],"rows":1}"#.to_owned())
        } else {
            let n = polls.fetch_add(1, Relaxed) + 1;
            if n == FAILING_POLL {
                (
                    500,
                    "Code: 159, e.displayText() = DB::Exception: Timeout exceeded".to_owned(),
                )
            } else {
                let data: Vec<String> = rows
                    .lock()
                    .unwrap()
                    .iter()
                    .map(|(k, s)| format!("[\"{k}\",{s}]"))
                    .collect();
                (
                    200,
                    format!(
                        r#"{{"data":[{}],"rows":{},"statistics":{{"elapsed":{},"rows_read":1,"bytes_read":1}}}}"#,
                        data.join(","),
                        data.len(),
                        server_elapsed_s(n)
                    ),
                )
            }
        };
        let head = format!(
            "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            answer.len()
        );
        if out.write_all(head.as_bytes()).is_err() || out.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}

fn write_spec(dir: &Path) -> std::path::PathBuf {
    let spec = dir.join("pipeline.toml");
    std::fs::write(
        &spec,
        r#"name = "tap-cost"

[[hops]]
name = "publish"
id = 0

[[hops]]
name = "query_start"
id = 4

[[hops]]
name = "queryable"
id = 5

[[stages]]
name = "Total Ingestion"
from = "publish"
to = "queryable"
definition = "publish to queryable"
headline = true

[[stages]]
name = "Query Duration"
from = "query_start"
to = "queryable"
definition = "the poll that found it"
"#,
    )
    .unwrap();
    spec
}

/// The tap's own distribution against the one the analysis read back from its counters.
fn same_spread(what: &str, tap: &Spread, read: &summary::CostSpread) {
    assert_eq!(read.count, tap.count, "{what}: count");
    let mean = read.mean_ns.unwrap();
    assert!(
        (mean - tap.mean_ns).abs() < 1.0,
        "{what}: mean {mean} vs the tap's {}",
        tap.mean_ns
    );
    assert_eq!(read.p50_ns, Some(tap.p50_ns), "{what}: P50");
    assert_eq!(read.p99_ns, Some(tap.p99_ns), "{what}: P99");
    assert_eq!(read.max_ns, Some(tap.max_ns), "{what}: max");
}

#[test]
fn the_analysis_reads_what_a_store_tap_cost_from_a_real_runs_probes_parquet() {
    let dir = hoptrace_testkit::tempdir("tap-cost");
    let spec = write_spec(&dir);
    let listen = format!("127.0.0.1:{}", hoptrace_testkit::closed_port());
    let mut collector = Command::new(env!("CARGO_BIN_EXE_hoptrace"))
        .args([
            "collect",
            "--listen",
            &listen,
            "--run-id",
            "t",
            "--pipeline",
        ])
        .arg(&spec)
        .arg("--runs")
        .arg(&dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = BufReader::new(collector.stderr.take().unwrap());
    let mut lines = stderr.lines();
    loop {
        let l = lines.next().expect("collector output").unwrap();
        if l.starts_with("collecting on") {
            break;
        }
    }
    std::thread::spawn(move || for _ in lines {});

    let store = ScriptedClickHouse::start();
    let url = format!("clickhouse://{}/db?table=t&time=inserted", store.addr);
    let mut config = StoreTapConfig::new(StoreUrl::parse(&url).unwrap());
    config.poll_interval = Duration::from_millis(20);
    config.counters_interval = Duration::from_millis(200);
    config.collector = Some(ExporterConfig::new(&listen, "hoptrace-tap"));
    let tap = StoreTap::start(config).unwrap();
    let live = tap.live();
    let stop = Arc::new(AtomicBool::new(false));
    let worker = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || tap.run(&stop))
    };
    hoptrace_testkit::wait_for("the baseline poll", Duration::from_secs(10), || {
        live.polls.load(Relaxed) >= 2
    });
    // 30 keys, 3 at a time; each JSON batch row twice (two metrics of one message).
    let now_s = realtime_ns() / 1_000_000_000;
    for batch in 0..10u64 {
        for i in 0..3 {
            let key = TraceKey {
                publisher: 7,
                stream: 1,
                sequence: batch * 3 + i,
            };
            let text = TraceContext::new(key, 2, realtime_ns()).to_text();
            let mut rows = store.rows.lock().unwrap();
            rows.push((text.clone(), now_s));
            rows.push((text, now_s));
        }
        // Pacing (the workload): three rows every 60 ms, so that several polls find some.
        std::thread::sleep(Duration::from_millis(60));
    }
    hoptrace_testkit::wait_for("every key", Duration::from_secs(10), || {
        live.keys_found.load(Relaxed) >= 30
    });
    // Past the scripted failure, and enough polls (two seconds' worth at 20 ms) that the
    // rate the analysis derives from the counters frames compares within 5 %.
    hoptrace_testkit::wait_for("100 polls", Duration::from_secs(20), || {
        store.polls.load(Relaxed) >= 100
    });
    stop.store(true, Relaxed);
    let tap = worker.join().unwrap();
    common::interrupt(&collector);
    assert!(collector.wait().unwrap().success());
    assert!(store.polls.load(Relaxed) >= FAILING_POLL);

    // What the tap itself says it cost.
    assert_eq!(tap.keys_found, 30);
    assert_eq!(tap.poll_errors, 1, "the scripted failure");
    let server = tap.server_elapsed.expect("the store's own duration");
    assert_eq!(
        server.count,
        tap.polls - tap.poll_errors,
        "every answered poll"
    );

    // What the analysis reads from the run's probes.parquet.
    let run = dir.join("t");
    assert!(run.join("probes.parquet").is_file());
    let runs = RunSet::open(&[&run]).unwrap();
    let rt = hoptrace_runner::query::runtime().unwrap();
    let (polled, whole) = rt.block_on(async {
        let ctx = runs.session().await.unwrap();
        let polled = summary::polled_hops(&runs, &ctx).await.unwrap();
        let whole = summary::compute(&runs, &ctx).await.unwrap().0;
        (polled, whole)
    });
    assert_eq!(polled.len(), 1, "{polled:?}");
    assert_eq!(polled[0].hop, "queryable");
    assert_eq!(polled[0].taps.len(), 1);
    let c: &StoreTapCost = &polled[0].taps[0];
    assert_eq!(c.hop, "queryable");
    assert_eq!(c.process, "hoptrace-tap");
    assert_eq!(c.poll_interval_ns, 20_000_000);
    assert_eq!((c.polls, c.poll_errors), (tap.polls, tap.poll_errors));
    assert_eq!(
        (
            c.keys_found,
            c.rows,
            c.rows_repeated,
            c.polls_with_keys,
            c.bad_keys
        ),
        (
            tap.keys_found,
            tap.rows,
            tap.rows_repeated,
            tap.polls_with_keys,
            tap.bad_keys
        )
    );
    let per_s = c.polls_per_s.unwrap();
    assert!(
        (per_s - tap.polls_per_s()).abs() <= 0.05 * tap.polls_per_s(),
        "polls/s {per_s} vs the tap's {}",
        tap.polls_per_s()
    );
    same_spread("query time", &tap.query_time, &c.query_time);
    let read = c.server_elapsed.as_ref().expect("the store's own duration");
    same_spread("store's own duration", &server, read);
    // The scripted durations are 100-400 µs: the figures are the store's, not the tap's.
    assert_eq!(read.max_ns, Some(400_000));
    assert!(read.p50_ns.unwrap() >= 100_000 && read.p50_ns.unwrap() <= 400_000);
    // The report's summary carries the same figures.
    assert_eq!(whole.store_taps, polled[0].taps);
    std::fs::remove_dir_all(&dir).ok();
}
