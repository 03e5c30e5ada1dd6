//! Each store tap against its real store (`infra/stores`) and the real `hoptrace collect`:
//! rows carrying trace contexts are written into the store directly, the tap reports each
//! key once, with `queryable` after the write began, and the run's counts add up; rows
//! that never land leave their traces incomplete, missing `queryable`.
//!
//! Bad input against the real stores: a store down when the tap starts (it waits for it,
//! or gives up saying so), a store stopped and started again mid-run (every key still
//! found once, the failed polls counted), a table dropped mid-run and created again (the
//! tap polls on, counts, and finds the new table's rows), a query that fails mid-run (the
//! time column's type changed under it: counted, polled on, found again once it is back),
//! rows that become visible seconds behind the newest row time (found by the catch-up
//! polls, counted; missed without them), a store holding another run's series beside
//! this run's (`where=`: only this run's keys found), and row times stamped by a clock
//! seconds ahead of or behind the tap's (counted, never taken as a lower bound).

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::Duration;

use common::{Collector, root, sql, store, tempdir, unique, wait_for, write_spec};
use hoptrace_probe::clock::realtime_ns;
use hoptrace_probe::{Exporter, ExporterConfig, HopId, Stamp, TraceContext, TraceKey};
use hoptrace_protocol::{SentEntry, SentFrame};
use hoptrace_tap::poll::{StoreTapLive, StoreTapSummary};
use hoptrace_tap::{StoreTap, StoreTapConfig, StoreUrl};

/// Rows written per test, besides one row already there at start and one bad key.
const N: u64 = 40;

/// Tests that stop InfluxDB take it for themselves; the others share it. Taken before the
/// store guard, which starts a store it finds down: one another test stopped on purpose.
static INFLUXDB: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// One store under test: its address and how to write rows carrying `keys` (in one
/// request or statement).
struct Case<'a> {
    store: &'static str,
    url: String,
    store_in: bool,
    write: &'a mut dyn FnMut(&[&str]),
    /// Whether a row written is already returned by a query (false: wait for it).
    visible: &'a mut dyn FnMut(&str) -> bool,
    /// How long the store may take to show a row.
    visibility_s: u64,
    /// Resolution of the store's row time: a store_in stamp truncated to it can fall
    /// before the publish stamp by up to this much (a negative delta, flagged).
    resolution_ns: i64,
    /// Messages published and reported sent whose rows are never written: their traces
    /// must end incomplete, missing the tap's hops.
    never_land: u64,
}

/// A store tap polling on a thread of its own until [`Polling::stop`].
struct Polling {
    live: Arc<StoreTapLive>,
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<StoreTapSummary>,
}

impl Polling {
    fn start(tap: StoreTap) -> Self {
        let live = tap.live();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || tap.run(&stop))
        };
        Self { live, stop, thread }
    }

    /// Its counters, read while it runs.
    fn live(&self) -> Arc<StoreTapLive> {
        Arc::clone(&self.live)
    }

    /// Whether it still runs.
    fn polls_on(&self) -> bool {
        !self.thread.is_finished()
    }

    /// Stops it and returns its summary.
    fn stop(self) -> StoreTapSummary {
        self.stop.store(true, Relaxed);
        self.thread.join().unwrap()
    }
}

fn http() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(10))
        .build()
}

fn post(url: &str, body: &str) -> String {
    match http().post(url).send_string(body) {
        Ok(r) => r.into_string().unwrap(),
        Err(ureq::Error::Status(code, r)) => {
            panic!(
                "POST {url}: HTTP {code}: {}",
                r.into_string().unwrap_or_default()
            )
        }
        Err(e) => panic!("POST {url}: {e}"),
    }
}

fn run_case(case: &mut Case<'_>) -> StoreTapSummary {
    let dir = tempdir(case.store);
    let mut hops = vec![("publish", 0), ("query_start", 4), ("queryable", 5)];
    if case.store_in {
        hops.push(("store_in", 3));
    }
    let mut stages = vec![
        ("Total Ingestion", "publish", "queryable"),
        ("Query Duration", "query_start", "queryable"),
    ];
    if case.store_in {
        stages.push(("Store Ingestion", "publish", "store_in"));
    }
    let spec = write_spec(&dir, &hops, &stages);
    let collector = Collector::start(&dir, &spec);

    // A row of an earlier run, present before the tap starts: never reported.
    let earlier = TraceContext::new(
        TraceKey {
            publisher: 999,
            stream: 0,
            sequence: 0,
        },
        1,
        realtime_ns(),
    )
    .to_text();
    (case.write)(&[&earlier]);
    wait_for("the earlier row to be visible", case.visibility_s, || {
        (case.visible)(&earlier)
    });

    let mut tc = StoreTapConfig::new(StoreUrl::parse(&case.url).unwrap());
    tc.collector = Some(ExporterConfig::new(&collector.addr, "store-tap-test"));
    tc.store_in_hop = case.store_in.then(|| (HopId(3), "store_in".to_owned()));
    let tap = StoreTap::start(tc).unwrap();
    let polling = Polling::start(tap);
    let live = polling.live();
    wait_for("the baseline poll", 10, || live.polls.load(Relaxed) >= 2);

    // The publisher of this run: publish stamps and a Sent frame from a real exporter.
    let publisher = 1 + (realtime_ns() % 60_000) as u16;
    let exporter = Exporter::start(
        ExporterConfig::new(&collector.addr, "test-writer"),
        &[(HopId(0), "publish")],
    )
    .unwrap();
    let probe = exporter.probe(HopId(0)).unwrap();
    let mut began: BTreeMap<u64, i64> = BTreeMap::new();
    let sent = N + case.never_land;
    for seq in N..sent {
        // Published and stamped, but its row never reaches the store.
        let key = TraceKey {
            publisher,
            stream: 0,
            sequence: seq,
        };
        probe.record(&mut TraceContext::new(key, 1, realtime_ns()));
    }
    for seq in 0..N {
        let key = TraceKey {
            publisher,
            stream: 0,
            sequence: seq,
        };
        let mut ctx = TraceContext::new(key, 1, realtime_ns());
        assert!(probe.record(&mut ctx).queued);
        let text = ctx.to_text();
        began.insert(seq, realtime_ns());
        if seq == 0 {
            // Two rows of one message in one write, as a JSON batch of two metrics makes.
            (case.write)(&[&text, &text]);
        } else {
            (case.write)(&[&text]);
        }
        // Pacing (the workload): one write every 5 ms, spread over many polls.
        std::thread::sleep(Duration::from_millis(5));
    }
    // A key that is not a context.
    (case.write)(&["not-a-context"]);
    exporter
        .send_sent_frame(SentFrame {
            publisher,
            entries: vec![SentEntry {
                stream: 0,
                messages: sent,
                metrics: sent,
                first_sequence: 0,
                last_sequence: sent - 1,
            }],
        })
        .unwrap();
    assert_eq!(exporter.shutdown().counters.lost(), 0);

    wait_for("the tap to find every key", 30 + case.visibility_s, || {
        live.keys_found.load(Relaxed) >= N && live.bad_keys.load(Relaxed) >= 1
    });
    // Polls after the last key: none may report a key again.
    let polls = live.polls.load(Relaxed);
    wait_for("more polls", 10, || live.polls.load(Relaxed) >= polls + 20);
    let s = polling.stop();
    eprintln!("{}: {s:?}", case.store);
    assert_eq!(s.keys_found, N, "every key once");
    assert_eq!(s.bad_keys, 1);
    assert_eq!(s.baseline_keys, 1, "the earlier row is not reported");
    assert_eq!(s.poll_errors, 0, "{:?}", s.last_error);
    assert_eq!(s.bracket.count, N, "a bracket per key");
    assert!(s.bracket.p50_ns > 0 && s.bracket.p50_ns <= s.bracket.max_ns);
    assert!(s.polls_with_keys >= 1 && s.polls_with_keys <= N);
    assert!(s.exporters.iter().all(|(c, clean)| *clean && c.lost() == 0));
    assert_eq!(s.exporters.len(), if case.store_in { 2 } else { 1 });

    let run = collector.stop();
    let a = &run["accounting"];
    assert_eq!(a["adds_up"], true, "{a}");
    let mine = a["publishers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["publisher"] == publisher)
        .unwrap();
    assert_eq!(mine["sent"], sent);
    assert_eq!(mine["complete"], N, "{a}");
    // Rows that never land: incomplete, missing every hop the tap stamps, nothing else.
    assert_eq!(mine["incomplete"], case.never_land, "{a}");
    assert_eq!(mine["unseen"], 0, "{a}");
    let missing = |hop: &str| a["missing_by_hop"][hop].as_u64().unwrap_or(0);
    assert_eq!(missing("queryable"), case.never_land, "{a}");
    assert_eq!(missing("query_start"), case.never_land, "{a}");
    assert_eq!(missing("publish"), 0, "{a}");
    assert_eq!(
        a["records_by_hop"]["queryable"], N,
        "each key reported once"
    );
    assert_eq!(a["records_by_hop"]["query_start"], N);
    if case.store_in {
        assert_eq!(a["records_by_hop"]["store_in"], N);
    }
    assert_eq!(a["late_records"], 0);
    assert_eq!(a["duplicate_traces"], 0);

    let lost = sql(
        &run_dir(&dir),
        "SELECT sequence FROM traces WHERE status = 'incomplete' AND queryable_ns IS NULL AND publish_ns IS NOT NULL ORDER BY sequence",
    );
    let lost: Vec<u64> = lost
        .iter()
        .map(|r| r["sequence"].as_u64().unwrap())
        .collect();
    assert_eq!(
        lost,
        (N..sent).collect::<Vec<_>>(),
        "the rows that never landed"
    );
    let rows = sql(
        &run_dir(&dir),
        &format!(
            "SELECT sequence, CAST(publish_ns AS BIGINT) AS p, CAST(query_start_ns AS BIGINT) AS qs, CAST(queryable_ns AS BIGINT) AS q, {} AS s, flags FROM traces WHERE status = 'complete'",
            if case.store_in {
                "CAST(store_in_ns AS BIGINT)"
            } else {
                "NULL"
            }
        ),
    );
    assert_eq!(rows.len() as u64, N);
    for r in &rows {
        let seq = r["sequence"].as_u64().unwrap();
        let q = r["q"].as_i64().unwrap();
        assert!(
            q > began[&seq],
            "key {seq}: queryable {q} before its write began {}",
            began[&seq]
        );
        assert!(r["qs"].as_i64().unwrap() <= q);
        let flags = r["flags"].as_u64().unwrap();
        if flags == 2 {
            // Negative delta: only a store time truncated to its resolution, before publish.
            let early = r["p"].as_i64().unwrap() - r["s"].as_i64().unwrap_or(i64::MIN);
            assert!(
                early > 0 && early < case.resolution_ns,
                "a negative delta beyond the store time's resolution: {r}"
            );
        } else {
            assert_eq!(flags, 0, "no conflict, duplicate or negative delta: {r}");
        }
    }
    std::fs::remove_dir_all(&dir).ok();
    s
}

fn run_dir(dir: &std::path::Path) -> std::path::PathBuf {
    dir.join("t")
}

fn influx_q(q: &str) {
    http()
        .post("http://127.0.0.1:18086/query")
        .query("db", "hoptrace")
        .query("q", q)
        .call()
        .unwrap();
}

#[test]
#[ignore = "needs the stores (infra/stores, installed by infra/setup.sh): infra/test.sh runs it"]
fn influxdb() {
    let _shared = INFLUXDB
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let _guard = store("influxdb");
    let m = format!("storetap_{}", unique());
    let base = "http://127.0.0.1:18086";
    let mut write = |keys: &[&str]| {
        let lines: Vec<String> = keys
            .iter()
            .enumerate()
            .map(|(i, key)| format!("{m},metric=m{i} hoptrace=\"{key}\",value=1.5"))
            .collect();
        post(&format!("{base}/write?db=hoptrace"), &lines.join("\n"));
    };
    let mut visible = |key: &str| {
        let q = format!("SELECT \"hoptrace\" FROM \"{m}\"");
        http()
            .get(&format!("{base}/query"))
            .query("db", "hoptrace")
            .query("q", &q)
            .call()
            .unwrap()
            .into_string()
            .unwrap()
            .contains(key)
    };
    run_case(&mut Case {
        store: "influxdb",
        resolution_ns: 1,
        url: format!("influxdb://127.0.0.1:18086/hoptrace?measurement={m}"),
        store_in: true,
        write: &mut write,
        visible: &mut visible,
        visibility_s: 5,
        never_land: 0,
    });
    influx_q(&format!("DROP MEASUREMENT \"{m}\""));
}

#[test]
#[ignore = "needs the stores (infra/stores, installed by infra/setup.sh): infra/test.sh runs it"]
fn influxdb_refuses_a_missing_database_and_field_at_start() {
    let _shared = INFLUXDB
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let _guard = store("influxdb");
    let e = StoreTap::start(StoreTapConfig::new(
        StoreUrl::parse("influxdb://127.0.0.1:18086/no_such_db?measurement=m").unwrap(),
    ))
    .unwrap_err();
    assert!(e.to_string().contains("database not found"), "{e}");
    let m = format!("storetap_{}", unique());
    post(
        "http://127.0.0.1:18086/write?db=hoptrace",
        &format!("{m} other=1"),
    );
    let e = StoreTap::start(StoreTapConfig::new(
        StoreUrl::parse(&format!(
            "influxdb://127.0.0.1:18086/hoptrace?measurement={m}"
        ))
        .unwrap(),
    ))
    .unwrap_err();
    assert!(e.to_string().contains("no field \"hoptrace\""), "{e}");
    influx_q(&format!("DROP MEASUREMENT \"{m}\""));
}

/// A subscription InfluxDB cannot deliver to is seen in its statistics (what the tap reads
/// once a second to say so); one left behind on the same address is replaced, and dropped;
/// one a killed tap left is dropped by the next tap.
#[test]
#[ignore = "needs the stores (infra/stores, installed by infra/setup.sh): infra/test.sh runs it"]
fn influxdb_subscription_that_cannot_be_delivered_is_seen() {
    use hoptrace_tap::store::influxdb::InfluxDb;
    let _shared = INFLUXDB
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let _guard = store("influxdb");
    let m = format!("storetap_{}", unique());
    // Not `hoptrace_…`: a tap starting meanwhile would drop it as abandoned (below).
    let name = format!("test_{m}");
    let db = InfluxDb::new(
        &StoreUrl::parse(&format!(
            "influxdb://127.0.0.1:18086/hoptrace?measurement={m}"
        ))
        .unwrap(),
    )
    .unwrap();
    let rp = db.subscription_rp().unwrap();
    assert_eq!(rp, "autogen");
    // Port 1 on loopback: nothing listens, every delivery fails.
    let nowhere = "http://127.0.0.1:1";
    db.subscribe(&rp, &name, nowhere).unwrap();
    // Made twice: the one left behind is dropped first, not refused as a duplicate.
    db.subscribe(&rp, &name, nowhere).unwrap();
    assert_eq!(db.subscriber_enabled().unwrap(), Some(true));
    assert_eq!(
        db.subscriber_stats(&name).unwrap(),
        (0, 0),
        "nothing sent yet"
    );
    post(
        "http://127.0.0.1:18086/write?db=hoptrace",
        &format!("{m} hoptrace=\"x\",v=1"),
    );
    wait_for("InfluxDB to count the failed delivery", 10, || {
        db.subscriber_stats(&name).unwrap().1 >= 1
    });
    db.unsubscribe(&rp, &name).unwrap();
    let listed = || {
        http()
            .get("http://127.0.0.1:18086/query")
            .query("q", "SHOW SUBSCRIPTIONS")
            .call()
            .unwrap()
            .into_string()
            .unwrap()
    };
    assert!(!listed().contains(&name), "{}", listed());
    // One a killed tap left (named as taps name theirs, its address refusing
    // connections) is dropped by the next tap that subscribes.
    let abandoned = format!("hoptrace_{m}");
    db.subscribe(&rp, &abandoned, nowhere).unwrap();
    assert!(listed().contains(&abandoned));
    let mut tc = StoreTapConfig::new(
        StoreUrl::parse(&format!(
            "influxdb://127.0.0.1:18086/hoptrace?measurement={m}&subscribe=127.0.0.1:0"
        ))
        .unwrap(),
    );
    tc.poll_interval = Duration::from_millis(100);
    let polling = Polling::start(StoreTap::start(tc).unwrap());
    let live = polling.live();
    wait_for("the baseline", 10, || live.baseline_taken.load(Relaxed));
    wait_for("the abandoned subscription dropped", 10, || {
        !listed().contains(&abandoned)
    });
    let s = polling.stop();
    let own = &s.listen.as_ref().expect("a subscription").channel;
    assert!(own.starts_with("hoptrace_127_0_0_1_"), "{own}");
    assert!(
        !listed().contains(own.as_str()),
        "the tap dropped its own: {}",
        listed()
    );
    influx_q(&format!("DROP MEASUREMENT \"{m}\""));
}

/// `infra/stores/influxdb.sh CMD`.
fn influxd(cmd: &str) {
    let out = std::process::Command::new(root().join("infra/stores/influxdb.sh"))
        .arg(cmd)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "influxdb.sh {cmd}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Starts InfluxDB again when dropped, whatever the test did to it.
struct RunningAgain;

impl Drop for RunningAgain {
    fn drop(&mut self) {
        let _ = std::process::Command::new(root().join("infra/stores/influxdb.sh"))
            .arg("start")
            .output();
    }
}

/// InfluxDB restarted without its subscriber service, and on drop (however the test ends)
/// with the test configuration again.
struct WithoutSubscriber;

impl WithoutSubscriber {
    fn start() -> Self {
        influxd("stop");
        let out = std::process::Command::new(root().join("infra/stores/influxdb.sh"))
            .arg("start")
            .env("HOPTRACE_INFLUXDB_SUBSCRIBER", "false")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Self
    }
}

impl Drop for WithoutSubscriber {
    fn drop(&mut self) {
        let sh = root().join("infra/stores/influxdb.sh");
        let _ = std::process::Command::new(&sh).arg("stop").output();
        let _ = std::process::Command::new(&sh).arg("start").output();
    }
}

/// A tap asked to subscribe to a server whose subscriber service is off says so at start,
/// drops the subscription it made, and polls.
#[test]
#[ignore = "needs the stores (infra/stores, installed by infra/setup.sh): infra/test.sh runs it"]
fn influxdb_subscriber_service_off_leaves_the_tap_polling() {
    let _alone = INFLUXDB
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let _guard = store("influxdb");
    let _off = WithoutSubscriber::start();
    let m = format!("storetap_{}", unique());
    influx_write(&m, &keys(0..1));
    let mut tc = StoreTapConfig::new(
        StoreUrl::parse(&format!(
            "influxdb://127.0.0.1:18086/hoptrace?measurement={m}&subscribe=127.0.0.1:0"
        ))
        .unwrap(),
    );
    tc.poll_interval = Duration::from_millis(20);
    let polling = Polling::start(StoreTap::start(tc).unwrap());
    let live = polling.live();
    wait_for("the baseline", 10, || live.baseline_taken.load(Relaxed));
    // One write each: points of one write without a time or tags share one.
    for k in keys(1..6) {
        influx_write(&m, &[k]);
        std::thread::sleep(Duration::from_millis(5));
    }
    wait_for("the keys, by polls", 10, || {
        live.keys_found.load(Relaxed) >= 5
    });
    let s = polling.stop();
    assert_eq!(s.keys_found, 5);
    assert!(s.listen.is_none(), "no subscription taken: {:?}", s.listen);
    let listed = http()
        .get("http://127.0.0.1:18086/query")
        .query("q", "SHOW SUBSCRIPTIONS")
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    assert!(!listed.contains("hoptrace_127_0_0_1_"), "dropped: {listed}");
    influx_q(&format!("DROP MEASUREMENT \"{m}\""));
}

/// Writes one point per key into measurement `m`.
fn influx_write(m: &str, keys: &[String]) {
    let lines: Vec<String> = keys
        .iter()
        .map(|k| format!("{m} hoptrace=\"{k}\",value=1.5"))
        .collect();
    post(
        "http://127.0.0.1:18086/write?db=hoptrace",
        &lines.join("\n"),
    );
}

/// Writes one point per key into measurement `m` with times of their own: `at`, `at` + 1
/// ns, ... (a writer that stamps its points).
fn influx_write_at(m: &str, keys: &[String], at: i64) {
    let lines: Vec<String> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| format!("{m} hoptrace=\"{k}\",value=1.5 {}", at + i as i64))
        .collect();
    post(
        "http://127.0.0.1:18086/write?db=hoptrace",
        &lines.join("\n"),
    );
}

/// Trace contexts of `seqs` of publisher 3.
fn keys(seqs: std::ops::Range<u64>) -> Vec<String> {
    seqs.map(|sequence| {
        TraceContext::new(
            TraceKey {
                publisher: 3,
                stream: 0,
                sequence,
            },
            1,
            realtime_ns(),
        )
        .to_text()
    })
    .collect()
}

#[test]
#[ignore = "needs the stores (infra/stores, installed by infra/setup.sh): infra/test.sh runs it"]
fn influxdb_down_at_start_then_stopped_and_started_mid_run() {
    let _alone = INFLUXDB
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let _guard = store("influxdb");
    let _again = RunningAgain;
    let m = format!("storetap_{}", unique());
    let url = StoreUrl::parse(&format!(
        "influxdb://127.0.0.1:18086/hoptrace?measurement={m}"
    ))
    .unwrap();
    influxd("stop");

    // Down at start: without a wait the tap gives up at once, with one it gives up after
    // it, saying how to wait.
    let e = StoreTap::start(StoreTapConfig::new(url.clone())).unwrap_err();
    assert!(
        e.to_string().contains("did not answer") && e.to_string().contains("--wait-for-store"),
        "{e}"
    );
    let mut c = StoreTapConfig::new(url.clone());
    c.wait_for_store = Duration::from_secs(1);
    let t0 = std::time::Instant::now();
    let e = StoreTap::start(c).unwrap_err();
    assert!(t0.elapsed() >= Duration::from_secs(1), "{:?}", t0.elapsed());
    assert!(e.to_string().contains("within 1"), "{e}");

    // Down at start, waited for: the tap starts once the store answers.
    let mut c = StoreTapConfig::new(url);
    c.wait_for_store = Duration::from_secs(60);
    let starting = std::thread::spawn(move || StoreTap::start(c));
    // What is tested: a second in which the store is down and the tap still waits.
    std::thread::sleep(Duration::from_secs(1));
    assert!(!starting.is_finished(), "the tap waits for the store");
    influxd("start");
    let tap = starting.join().unwrap().unwrap();
    let polling = Polling::start(tap);
    let live = polling.live();
    wait_for("the baseline", 10, || live.baseline_taken.load(Relaxed));
    let all = keys(0..2 * N);
    for k in &all[..N as usize] {
        influx_write(&m, std::slice::from_ref(k));
        // Pacing (the workload): one write every 5 ms.
        std::thread::sleep(Duration::from_millis(5));
    }
    wait_for("the first half", 20, || live.keys_found.load(Relaxed) >= N);

    // Stopped and started again mid-run: polls fail meanwhile, nothing is lost.
    influxd("stop");
    let errors = live.poll_errors.load(Relaxed);
    wait_for("failed polls", 10, || {
        live.poll_errors.load(Relaxed) > errors
    });
    influxd("start");
    for k in &all[N as usize..] {
        influx_write(&m, std::slice::from_ref(k));
        // Pacing (the workload): one write every 5 ms.
        std::thread::sleep(Duration::from_millis(5));
    }
    wait_for("the second half", 30, || {
        live.keys_found.load(Relaxed) >= 2 * N
    });
    let polls = live.polls.load(Relaxed);
    wait_for("more polls", 10, || live.polls.load(Relaxed) >= polls + 20);
    let s = polling.stop();
    eprintln!("influxdb restarted: {s:?}");
    assert_eq!(s.keys_found, 2 * N, "every key, once");
    assert!(s.poll_errors > 0);
    assert!(
        s.last_error
            .as_deref()
            .unwrap_or("")
            .contains("unreachable"),
        "{:?}",
        s.last_error
    );
    assert_eq!(s.bracket.count, 2 * N);
    influx_q(&format!("DROP MEASUREMENT \"{m}\""));
}

fn pg() -> postgres::Client {
    postgres::Client::connect(
        "host=127.0.0.1 port=15432 user=hoptrace password=hoptrace-test dbname=hoptrace",
        postgres::NoTls,
    )
    .unwrap()
}

/// A Postgres table of its own, a tap polling it, and the first `N` of `all` keys
/// written and found.
struct PgTapped {
    c: postgres::Client,
    /// The table.
    t: String,
    /// The statement that creates it.
    create: String,
    /// The statement that inserts rows carrying `$1`, an array of keys.
    insert: String,
    polling: Polling,
    all: Vec<String>,
}

fn pg_tapped() -> PgTapped {
    let t = format!("storetap_{}", unique());
    let create = format!(
        "CREATE TABLE {t} (hoptrace text, at timestamptz NOT NULL DEFAULT clock_timestamp())"
    );
    let mut c = pg();
    c.batch_execute(&create).unwrap();
    let insert = format!("INSERT INTO {t} (hoptrace) SELECT unnest($1::text[])");
    let url =
        format!("postgres://hoptrace:hoptrace-test@127.0.0.1:15432/hoptrace?table={t}&time=at");
    let tap = StoreTap::start(StoreTapConfig::new(StoreUrl::parse(&url).unwrap())).unwrap();
    let polling = Polling::start(tap);
    let live = polling.live();
    wait_for("the baseline", 10, || live.baseline_taken.load(Relaxed));
    let all = keys(0..2 * N);
    c.execute(&insert, &[&&all[..N as usize]]).unwrap();
    wait_for("the first rows", 10, || live.keys_found.load(Relaxed) >= N);
    PgTapped {
        c,
        t,
        create,
        insert,
        polling,
        all,
    }
}

#[test]
#[ignore = "needs the stores (infra/stores, installed by infra/setup.sh): infra/test.sh runs it"]
fn postgres() {
    let _guard = store("postgres");
    let t = format!("storetap_{}", unique());
    let mut c = pg();
    c.batch_execute(&format!(
        "CREATE TABLE {t} (hoptrace text, value float8, at timestamptz NOT NULL DEFAULT clock_timestamp());
         CREATE INDEX ON {t} (at);"
    ))
    .unwrap();
    let insert = format!("INSERT INTO {t} (hoptrace, value) SELECT unnest($1::text[]), 1.5");
    let mut writer = pg();
    let mut write = |keys: &[&str]| {
        writer.execute(&insert, &[&keys]).unwrap();
    };
    let select = format!("SELECT count(*) FROM {t} WHERE hoptrace = $1");
    let mut reader = pg();
    let mut visible = |key: &str| reader.query_one(&select, &[&key]).unwrap().get::<_, i64>(0) > 0;
    // The store's own duration, sampled by EXPLAIN ANALYZE every 5th answered poll.
    let s = run_case(&mut Case {
        store: "postgres",
        resolution_ns: 1000,
        url: format!(
            "postgres://hoptrace:hoptrace-test@127.0.0.1:15432/hoptrace?table={t}&time=at&explain_every=5"
        ),
        store_in: true,
        write: &mut write,
        visible: &mut visible,
        visibility_s: 5,
        never_land: 3,
    });
    let e = s
        .server_elapsed
        .expect("EXPLAIN ANALYZE sampled the store's own duration");
    assert_eq!(e.count, (s.polls - s.poll_errors) / 5, "{e:?}");
    assert!(
        e.max_ns > 0 && e.mean_ns < s.query_time.mean_ns,
        "the store's execution time {e:?} within the round trip {:?}",
        s.query_time
    );
    c.batch_execute(&format!("DROP TABLE {t}")).unwrap();
}

#[test]
#[ignore = "needs the stores (infra/stores, installed by infra/setup.sh): infra/test.sh runs it"]
fn postgres_refuses_a_missing_table_and_column_at_start() {
    let _guard = store("postgres");
    let url = "postgres://hoptrace:hoptrace-test@127.0.0.1:15432/hoptrace";
    let e = StoreTap::start(StoreTapConfig::new(
        StoreUrl::parse(&format!("{url}?table=no_such_table&time=at")).unwrap(),
    ))
    .unwrap_err();
    assert!(e.to_string().contains("does not exist"), "{e}");
    let t = format!("storetap_{}", unique());
    let mut c = pg();
    c.batch_execute(&format!("CREATE TABLE {t} (k text, at timestamptz)"))
        .unwrap();
    let e = StoreTap::start(StoreTapConfig::new(
        StoreUrl::parse(&format!("{url}?table={t}&time=at")).unwrap(),
    ))
    .unwrap_err();
    assert!(e.to_string().contains("hoptrace"), "{e}");
    c.batch_execute(&format!("DROP TABLE {t}")).unwrap();
}

#[test]
#[ignore = "needs the stores (infra/stores, installed by infra/setup.sh): infra/test.sh runs it"]
fn postgres_table_dropped_mid_run_and_created_again() {
    let _guard = store("postgres");
    let PgTapped {
        mut c,
        t,
        create,
        insert,
        polling,
        all,
    } = pg_tapped();
    let live = polling.live();

    // Dropped: the polls fail (42P01), counted; the tap goes on.
    c.batch_execute(&format!("DROP TABLE {t}")).unwrap();
    let errors = live.poll_errors.load(Relaxed);
    wait_for("failed polls", 10, || {
        live.poll_errors.load(Relaxed) >= errors + 2
    });
    assert!(polling.polls_on(), "the tap polls on");
    // Created again: its rows are found.
    c.batch_execute(&create).unwrap();
    c.execute(&insert, &[&&all[N as usize..]]).unwrap();
    wait_for("the new table's rows", 20, || {
        live.keys_found.load(Relaxed) >= 2 * N
    });
    let s = polling.stop();
    eprintln!("postgres table dropped: {s:?}");
    assert_eq!(s.keys_found, 2 * N, "every key, once");
    assert!(s.poll_errors >= 2);
    let last = s.last_error.unwrap_or_default();
    assert!(
        last.contains("does not exist") && last.contains("42P01"),
        "{last}"
    );
    c.batch_execute(&format!("DROP TABLE {t}")).unwrap();
}

#[test]
#[ignore = "needs the stores (infra/stores, installed by infra/setup.sh): infra/test.sh runs it"]
fn postgres_query_failing_mid_run() {
    let _guard = store("postgres");
    let PgTapped {
        mut c,
        t,
        create: _,
        insert,
        polling,
        all,
    } = pg_tapped();
    let live = polling.live();

    // The time column becomes text: the poll's `extract(epoch from ...)` fails (a query
    // error, not a missing object); counted, and the tap goes on.
    c.batch_execute(&format!("ALTER TABLE {t} ALTER COLUMN at TYPE text"))
        .unwrap();
    let errors = live.poll_errors.load(Relaxed);
    wait_for("failed polls", 10, || {
        live.poll_errors.load(Relaxed) >= errors + 2
    });
    assert!(polling.polls_on(), "the tap polls on");
    let failed = live.poll_errors.load(Relaxed);
    // Back to a timestamp: polls answer again and the new rows are found.
    c.batch_execute(&format!(
        "ALTER TABLE {t} ALTER COLUMN at TYPE timestamptz USING at::timestamptz"
    ))
    .unwrap();
    c.execute(&insert, &[&&all[N as usize..]]).unwrap();
    wait_for("the rows after the error", 20, || {
        live.keys_found.load(Relaxed) >= 2 * N
    });
    let s = polling.stop();
    eprintln!("postgres query failing: {s:?}");
    assert_eq!(s.keys_found, 2 * N, "every key, once");
    assert!(s.poll_errors >= failed);
    assert_eq!(s.bad_keys, 0);
    assert!(s.polls > s.poll_errors, "{s:?}");
    c.batch_execute(&format!("DROP TABLE {t}")).unwrap();
}

fn ch(sql: &str) -> String {
    post("http://127.0.0.1:18123/", sql)
}

/// Whether ClickHouse's table `hoptrace.t` answers a row of `key` now.
fn ch_visible(t: &str, key: &str) -> bool {
    ch(&format!(
        "SELECT count() FROM hoptrace.{t} WHERE hoptrace = '{key}'"
    ))
    .trim()
        != "0"
}

#[test]
#[ignore = "needs the stores (infra/stores, installed by infra/setup.sh): infra/test.sh runs it"]
fn clickhouse() {
    let _guard = store("clickhouse");
    let t = format!("storetap_{}", unique());
    ch(&format!(
        "CREATE TABLE hoptrace.{t} (hoptrace String, value Float64, inserted DateTime DEFAULT now()) ENGINE = MergeTree ORDER BY inserted"
    ));
    let mut write = |keys: &[&str]| {
        let values: Vec<String> = keys.iter().map(|k| format!("('{k}', 1.5)")).collect();
        ch(&format!(
            "INSERT INTO hoptrace.{t} (hoptrace, value) VALUES {}",
            values.join(", ")
        ));
    };
    let mut visible = |key: &str| ch_visible(&t, key);
    let s = run_case(&mut Case {
        store: "clickhouse",
        resolution_ns: 1_000_000_000,
        url: format!("clickhouse://127.0.0.1:18123/hoptrace?table={t}&time=inserted"),
        store_in: false,
        write: &mut write,
        visible: &mut visible,
        visibility_s: 5,
        never_land: 0,
    });
    let e = s
        .server_elapsed
        .expect("ClickHouse reports its query duration");
    assert_eq!(e.count, s.polls - s.poll_errors);
    assert!(
        e.mean_ns > 0.0 && e.mean_ns < s.query_time.mean_ns,
        "{e:?} vs {:?}",
        s.query_time
    );
    let err = StoreTap::start(StoreTapConfig::new(
        StoreUrl::parse(&format!(
            "clickhouse://127.0.0.1:18123/hoptrace?table={t}&key=nope"
        ))
        .unwrap(),
    ))
    .unwrap_err();
    assert!(err.to_string().contains("nope"), "{err}");
    ch(&format!("DROP TABLE hoptrace.{t}"));
}

/// Whether VictoriaMetrics answers `key`'s series of `metric` now.
fn vm_visible(metric: &str, key: &str) -> bool {
    let sel = format!("{{__name__=\"{metric}\",hoptrace=\"{key}\"}}");
    http()
        .get("http://127.0.0.1:18428/api/v1/export")
        .query("match[]", &sel)
        .call()
        .unwrap()
        .into_string()
        .unwrap()
        .contains(key)
}

#[test]
#[ignore = "needs the stores (infra/stores, installed by infra/setup.sh): infra/test.sh runs it"]
fn victoriametrics() {
    let _guard = store("victoriametrics");
    let m = format!("storetap_{}", unique());
    let base = "http://127.0.0.1:18428";
    // InfluxDB line protocol without a timestamp: VictoriaMetrics stamps the sample with its
    // own clock (ms), the one case where its sample time is a store_in stamp.
    let mut write = |keys: &[&str]| {
        let lines: Vec<String> = keys
            .iter()
            .enumerate()
            .map(|(i, key)| format!("{m},hoptrace={key},metric=m{i} value=1.5"))
            .collect();
        post(&format!("{base}/write"), &lines.join("\n"));
    };
    let metric = format!("{m}_value");
    let mut visible = |key: &str| vm_visible(&metric, key);
    run_case(&mut Case {
        store: "victoriametrics",
        resolution_ns: 1_000_000,
        url: format!("victoriametrics://127.0.0.1:18428/?metric={metric}"),
        store_in: true,
        write: &mut write,
        visible: &mut visible,
        visibility_s: 30,
        never_land: 0,
    });
    let _ = http()
        .post(&format!("{base}/api/v1/admin/tsdb/delete_series"))
        .query("match[]", &metric)
        .call();
}

/// Rows that become visible far behind the newest row time already seen (a writer that
/// stamps its own times and sends a batch seconds late): a tap whose catch-up polls look
/// `catch_up` back finds every key once, counts those only they found, and does not widen
/// its regular look-back for them; without catch-up polls they are missed.
fn rows_far_behind(
    url: &str,
    catch_up: Duration,
    write: &mut dyn FnMut(&[String], i64),
) -> StoreTapSummary {
    let mut config = StoreTapConfig::new(StoreUrl::parse(url).unwrap());
    config.catch_up = catch_up;
    let polling = Polling::start(StoreTap::start(config).unwrap());
    let live = polling.live();
    wait_for("the baseline", 10, || live.baseline_taken.load(Relaxed));
    let all = keys(0..2 * N);
    write(&all[..N as usize], 0);
    wait_for("the first rows", 10, || live.keys_found.load(Relaxed) >= N);
    // Four seconds behind: beyond the regular look-back (1 s PostgreSQL, 200 ms InfluxDB).
    write(&all[N as usize..], 4_000_000_000);
    if catch_up > Duration::ZERO {
        wait_for("the late rows", 15, || {
            live.keys_found.load(Relaxed) >= 2 * N
        });
    } else {
        let polls = live.polls.load(Relaxed);
        wait_for("20 more polls", 15, || {
            live.polls.load(Relaxed) >= polls + 20
        });
    }
    polling.stop()
}

fn assert_caught_up(s: &StoreTapSummary, overlap_ns: u64) {
    eprintln!("{s:?}");
    assert_eq!(s.keys_found, 2 * N, "every key, once");
    assert_eq!(
        s.caught_up_keys, N,
        "the late rows, found by a catch-up poll only"
    );
    assert!(s.catch_up_polls >= 1 && s.catch_up_polls < s.polls);
    assert!(
        (3_500_000_000..6_000_000_000).contains(&s.caught_up_late_max_ns),
        "about 4 s behind: {}",
        s.caught_up_late_max_ns
    );
    assert_eq!(s.catch_up_ns, 10_000_000_000);
    assert_eq!(
        s.look_back_ns, overlap_ns,
        "the regular look-back did not widen"
    );
    assert_eq!(s.keys_evicted_early, 0);
}

fn assert_missed(s: &StoreTapSummary) {
    eprintln!("{s:?}");
    assert_eq!(s.keys_found, N, "the late rows are beyond every poll");
    assert_eq!(
        (s.catch_up_polls, s.caught_up_keys, s.catch_up_ns),
        (0, 0, 0)
    );
}

#[test]
#[ignore = "needs the stores (infra/stores, installed by infra/setup.sh): infra/test.sh runs it"]
fn postgres_rows_visible_far_behind_the_newest_row_time() {
    let _guard = store("postgres");
    for catch_up in [Duration::from_secs(10), Duration::ZERO] {
        let at = "clock_timestamp() - make_interval(secs => $2::float8 / 1e9)";
        pg_keys_table(at, |url, write| {
            let s = rows_far_behind(url, catch_up, &mut |keys, behind_ns| {
                write(keys, behind_ns as f64);
            });
            if catch_up > Duration::ZERO {
                assert_caught_up(&s, 1_000_000_000);
            } else {
                assert_missed(&s);
            }
        });
    }
}

#[test]
#[ignore = "needs the stores (infra/stores, installed by infra/setup.sh): infra/test.sh runs it"]
fn influxdb_rows_visible_far_behind_the_newest_row_time() {
    let _shared = INFLUXDB
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let _guard = store("influxdb");
    for catch_up in [Duration::from_secs(10), Duration::ZERO] {
        let m = format!("storetap_{}", unique());
        // The measurement must exist for the tap to start.
        post(
            "http://127.0.0.1:18086/write?db=hoptrace",
            &format!("{m} hoptrace=\"not a key\",value=0"),
        );
        let url = format!("influxdb://127.0.0.1:18086/hoptrace?measurement={m}");
        let s = rows_far_behind(&url, catch_up, &mut |keys, behind_ns| {
            influx_write_at(&m, keys, realtime_ns() - behind_ns);
        });
        if catch_up > Duration::ZERO {
            assert_caught_up(&s, 200_000_000);
        } else {
            assert_missed(&s);
        }
        influx_q(&format!("DROP MEASUREMENT \"{m}\""));
    }
}

/// A writer whose clock is `offset_ns` from the tap's (ahead when positive) stamps its
/// own row times (`write(keys, row_ns)`): the messages carry publish stamps on the tap's
/// clock, so every row time is after the response that returned it (ahead) or before the
/// message was published (behind). The tap counts each with how far and takes none as the
/// earliest instant of `queryable`; a writer on the tap's clock (offset 0) trips neither.
fn clock_far(url: &str, offset_ns: i64, write: &mut dyn FnMut(&[String], i64)) {
    let mut config = StoreTapConfig::new(StoreUrl::parse(url).unwrap());
    config.store_in_hop = Some((HopId(3), "store_in".to_owned()));
    let polling = Polling::start(StoreTap::start(config).unwrap());
    let live = polling.live();
    wait_for("the baseline", 10, || live.baseline_taken.load(Relaxed));
    let published: Vec<String> = (0..N)
        .map(|sequence| {
            let key = TraceKey {
                publisher: 3,
                stream: 0,
                sequence,
            };
            let mut ctx = TraceContext::new(key, 1, realtime_ns());
            ctx.push_stamp(Stamp {
                hop: HopId(0),
                ns: realtime_ns(),
            })
            .unwrap();
            ctx.to_text()
        })
        .collect();
    write(&published, realtime_ns() + offset_ns);
    wait_for("every key", 15, || live.keys_found.load(Relaxed) >= N);
    let s = polling.stop();
    eprintln!("offset {offset_ns} ns: {s:?}");
    let d = s.store_time_disagrees;
    assert_eq!(s.keys_found, N);
    let off = u64::try_from(offset_ns.abs()).unwrap();
    let near = |ns: u64| ns > off - off / 10 && ns < off + off / 10;
    match offset_ns.signum() {
        1 => {
            assert_eq!((d.ahead, d.behind), (N, 0), "{d:?}");
            assert!(near(d.ahead_max_ns), "{d:?}");
            assert_eq!(s.earliest_from_store_time, 0, "no row time bounds a key");
        }
        -1 => {
            assert_eq!((d.ahead, d.behind), (0, N), "{d:?}");
            assert!(near(d.behind_max_ns), "{d:?}");
            assert_eq!(s.earliest_from_store_time, 0, "no row time bounds a key");
        }
        _ => assert!(d.trusted(), "a writer on the tap's clock: {d:?}"),
    }
}

/// Row times of a writer 5 s ahead of, 20 s behind, and on the tap's clock.
const CLOCK_OFFSETS_NS: [i64; 3] = [5_000_000_000, -20_000_000_000, 0];

#[test]
#[ignore = "needs the stores (infra/stores, installed by infra/setup.sh): infra/test.sh runs it"]
fn influxdb_row_times_off_the_taps_clock() {
    let _shared = INFLUXDB
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let _guard = store("influxdb");
    for offset_ns in CLOCK_OFFSETS_NS {
        let m = format!("storetap_{}", unique());
        // The measurement must exist for the tap to start: a row a second before the
        // writer's, so the writer's rows are the newest.
        post(
            "http://127.0.0.1:18086/write?db=hoptrace",
            &format!(
                "{m} hoptrace=\"not a key\",value=0 {}",
                realtime_ns() + offset_ns - 1_000_000_000
            ),
        );
        let url = format!("influxdb://127.0.0.1:18086/hoptrace?measurement={m}");
        clock_far(&url, offset_ns, &mut |keys, at| {
            influx_write_at(&m, keys, at)
        });
        influx_q(&format!("DROP MEASUREMENT \"{m}\""));
    }
}

#[test]
#[ignore = "needs the stores (infra/stores, installed by infra/setup.sh): infra/test.sh runs it"]
fn postgres_row_times_off_the_taps_clock() {
    let _guard = store("postgres");
    for offset_ns in CLOCK_OFFSETS_NS {
        pg_keys_table("to_timestamp($2::float8 / 1e9)", |url, write| {
            clock_far(url, offset_ns, &mut |keys, at| write(keys, at as f64));
        });
    }
}

/// A PostgreSQL table of its own (`hoptrace text, at timestamptz`) for `f`, with the tap's
/// address for it and a writer that inserts keys with `at` = `at_sql` (SQL of `$2`, the
/// float8 it is given); dropped afterwards.
fn pg_keys_table(at_sql: &str, f: impl FnOnce(&str, &mut dyn FnMut(&[String], f64))) {
    let t = format!("storetap_{}", unique());
    let mut c = pg();
    c.batch_execute(&format!(
        "CREATE TABLE {t} (hoptrace text, at timestamptz NOT NULL)"
    ))
    .unwrap();
    let insert = format!("INSERT INTO {t} (hoptrace, at) SELECT unnest($1::text[]), {at_sql}");
    let url =
        format!("postgres://hoptrace:hoptrace-test@127.0.0.1:15432/hoptrace?table={t}&time=at");
    let mut writer = pg();
    f(&url, &mut |keys, v| {
        writer.execute(&insert, &[&keys, &v]).unwrap();
    });
    c.batch_execute(&format!("DROP TABLE {t}")).unwrap();
}

/// A store holding another run's rows beside this run's: a tap whose `where=` names this
/// run's series finds exactly this run's keys. `write(keys, run)` writes rows of `keys`
/// under this run's series (`run`) or the other one's; `visible(key)` asks the store
/// directly.
fn only_where(
    url: &str,
    write: &mut dyn FnMut(&[String], bool),
    visible: &mut dyn FnMut(&str) -> bool,
    visibility_s: u64,
) -> StoreTapSummary {
    let polling = Polling::start(
        StoreTap::start(StoreTapConfig::new(StoreUrl::parse(url).unwrap())).unwrap(),
    );
    let live = polling.live();
    wait_for("the baseline", 10, || live.baseline_taken.load(Relaxed));
    let all = keys(0..2 * N);
    write(&all[..N as usize], false);
    write(&all[N as usize..], true);
    wait_for("this run's rows", visibility_s, || {
        live.keys_found.load(Relaxed) >= N
    });
    wait_for("the other run's rows, asked directly", visibility_s, || {
        visible(&all[N as usize - 1])
    });
    let polls = live.polls.load(Relaxed);
    wait_for("10 more polls", 10, || {
        live.polls.load(Relaxed) >= polls + 10
    });
    let s = polling.stop();
    eprintln!("{s:?}");
    assert_eq!(s.keys_found, N, "this run's keys only");
    assert_eq!((s.bad_keys, s.foreign_keys), (0, 0));
    assert!(
        s.query.contains("run"),
        "the query names the condition: {}",
        s.query
    );
    s
}

#[test]
#[ignore = "needs the stores (infra/stores, installed by infra/setup.sh): infra/test.sh runs it"]
fn clickhouse_polls_only_the_runs_rows() {
    let _guard = store("clickhouse");
    let t = format!("storetap_{}", unique());
    ch(&format!(
        "CREATE TABLE hoptrace.{t} (topic String, hoptrace String, inserted DateTime DEFAULT now()) ENGINE = MergeTree ORDER BY inserted"
    ));
    let mut write = |keys: &[String], run: bool| {
        let topic = if run { "run/a" } else { "other/a" };
        let values: Vec<String> = keys.iter().map(|k| format!("('{topic}', '{k}')")).collect();
        ch(&format!(
            "INSERT INTO hoptrace.{t} (topic, hoptrace) VALUES {}",
            values.join(", ")
        ));
    };
    let mut visible = |key: &str| ch_visible(&t, key);
    only_where(
        &format!(
            "clickhouse://127.0.0.1:18123/hoptrace?table={t}&time=inserted&where=topic%20LIKE%20%27run%2F%25%27"
        ),
        &mut write,
        &mut visible,
        10,
    );
    ch(&format!("DROP TABLE hoptrace.{t}"));
}

#[test]
#[ignore = "needs the stores (infra/stores, installed by infra/setup.sh): infra/test.sh runs it"]
fn victoriametrics_polls_only_the_runs_series() {
    let _guard = store("victoriametrics");
    let m = format!("storetap_{}", unique());
    let base = "http://127.0.0.1:18428";
    let mut write = |keys: &[String], run: bool| {
        let topic = if run { "run/a" } else { "other/a" };
        let lines: Vec<String> = keys
            .iter()
            .map(|key| format!("{m},hoptrace={key},topic={topic} value=1.5"))
            .collect();
        post(&format!("{base}/write"), &lines.join("\n"));
    };
    let metric = format!("{m}_value");
    let mut visible = |key: &str| vm_visible(&metric, key);
    only_where(
        &format!(
            "victoriametrics://127.0.0.1:18428/?metric={metric}&where=topic%3D~%22run%2F.%2A%22"
        ),
        &mut write,
        &mut visible,
        30,
    );
    let _ = http()
        .post(&format!("{base}/api/v1/admin/tsdb/delete_series"))
        .query("match[]", &metric)
        .call();
}

/// A measurement for messages written as several points, holding one untraced point, and
/// the address's condition keeping one point per message (`one_point`) or none.
fn several_points_measurement(one_point: bool) -> (String, &'static str) {
    let m = format!("storetap_{}", unique());
    post(
        "http://127.0.0.1:18086/write?db=hoptrace",
        &format!("{m},metric=m0 hoptrace=\"not a key\",value=0"),
    );
    let filter = if one_point {
        "&where=%22metric%22%3D%27m0%27"
    } else {
        ""
    };
    (m, filter)
}

/// Once `polling` has its baseline, writes `rounds` messages to `m`, each as `points`
/// points of one write, `pause_ms` apart; stops it once it found every key.
fn write_messages_of_points(
    polling: Polling,
    m: &str,
    points: u64,
    rounds: u64,
    pause_ms: u64,
) -> StoreTapSummary {
    let live = polling.live();
    wait_for("the baseline", 10, || live.baseline_taken.load(Relaxed));
    for k in &keys(0..rounds) {
        let lines: Vec<String> = (0..points)
            .map(|p| format!("{m},metric=m{p} hoptrace=\"{k}\",value={p}"))
            .collect();
        post(
            "http://127.0.0.1:18086/write?db=hoptrace",
            &lines.join("\n"),
        );
        std::thread::sleep(Duration::from_millis(pause_ms));
    }
    wait_for("every key", 10, || live.keys_found.load(Relaxed) >= rounds);
    polling.stop()
}

/// A subscription's writes of messages written as several points: a key is found with any
/// of its points, so with `where=` keeping one point per message the others are not asked
/// for again, and no key is left to the polls.
#[test]
#[ignore = "needs the stores (infra/stores, installed by infra/setup.sh): infra/test.sh runs it"]
fn influxdb_subscription_messages_of_several_points() {
    const POINTS: u64 = 4;
    const ROUNDS: u64 = 30;
    let _shared = INFLUXDB
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let _guard = store("influxdb");
    for one_point in [false, true] {
        let (m, filter) = several_points_measurement(one_point);
        let url = format!(
            "influxdb://127.0.0.1:18086/hoptrace?measurement={m}{filter}&subscribe=127.0.0.1:0"
        );
        let mut tc = StoreTapConfig::new(StoreUrl::parse(&url).unwrap());
        tc.poll_interval = Duration::from_secs(1);
        tc.idle_poll_interval = Duration::from_secs(1);
        let polling = Polling::start(StoreTap::start(tc).unwrap());
        let s = write_messages_of_points(polling, &m, POINTS, ROUNDS, 50);
        eprintln!("{s:?}");
        assert_eq!(s.keys_found, ROUNDS, "every key, once");
        let l = s.listen.as_ref().expect("the subscription's counts");
        let sub = l.subscription.as_ref().expect("a subscription");
        assert_eq!(l.notifications, POINTS * ROUNDS, "every point came: {l:?}");
        assert!(
            l.keys_notified >= ROUNDS * 3 / 4,
            "found by the queries the writes triggered: {l:?}"
        );
        assert_eq!(
            (sub.unconfirmed, sub.delivery_failures, l.bad, l.errors),
            (0, 0, 0, 0),
            "{l:?}"
        );
        influx_q(&format!("DROP MEASUREMENT \"{m}\""));
    }
}

/// Messages written as several points each (one per metric, as the Node-RED flow writes a
/// `metrics` array), all on InfluxDB's clock, none late: the tap finds each key once, counts
/// the points of a key its own poll had already returned (`rows_sharing_a_key`), and its
/// catch-up polls, finding nothing, slow down to half their window apart. A `where=`
/// equality on the metric tag reads one point per message.
#[test]
#[ignore = "needs the stores (infra/stores, installed by infra/setup.sh): infra/test.sh runs it"]
fn influxdb_messages_of_several_points() {
    const POINTS: u64 = 4;
    const ROUNDS: u64 = 45;
    let _shared = INFLUXDB
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let _guard = store("influxdb");
    for one_point in [false, true] {
        let (m, filter) = several_points_measurement(one_point);
        let url = format!("influxdb://127.0.0.1:18086/hoptrace?measurement={m}{filter}");
        let polling = Polling::start(
            StoreTap::start(StoreTapConfig::new(StoreUrl::parse(&url).unwrap())).unwrap(),
        );
        // A message every 200 ms for 9 s.
        let s = write_messages_of_points(polling, &m, POINTS, ROUNDS, 200);
        eprintln!("{s:?}");
        assert_eq!(s.keys_found, ROUNDS, "every key, once");
        assert_eq!((s.bad_keys, s.foreign_keys, s.caught_up_keys), (0, 0, 0));
        if one_point {
            assert_eq!(s.rows_sharing_a_key, 0, "one point per message read");
            assert!((s.rows_per_key() - 1.0).abs() < 1e-9);
        } else {
            // The poll that finds a key finds the points of its write that are visible by
            // then: nearly always all of them, though InfluxDB does not promise a write's
            // points become visible at one instant (the rest are re-reads of later polls).
            let most = (POINTS - 1) * ROUNDS;
            assert!(
                s.rows_sharing_a_key > most / 2 && s.rows_sharing_a_key <= most,
                "{} of at most {most}",
                s.rows_sharing_a_key
            );
            assert!(s.rows_per_key() > 2.5 && s.rows_per_key() <= POINTS as f64);
        }
        // Catch-up polls 1 s, 2 s, 4 s, then 5 s apart while none finds a key: at most
        // five in 9 s (nine at a steady 1 s).
        assert_eq!(s.catch_up_pace_max_ns, 5_000_000_000);
        assert!(
            (1..=5).contains(&s.catch_up_polls),
            "catch-up polls: {}",
            s.catch_up_polls
        );
        influx_q(&format!("DROP MEASUREMENT \"{m}\""));
    }
}
