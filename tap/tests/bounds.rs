//! The bounds of polled stamps, against the real InfluxDB and PostgreSQL, each holding
//! history (tens of thousands of older series or rows) as a staging store does, polled
//! only for the run's series (`where=`; on InfluxDB also by value, `series=`, over series
//! created mid-run) by two pollers taking turns.
//!
//! Beside the tap, an independent poller of its own (its own connection, back to back,
//! sharing nothing with the tap) records for each key the send of its last poll that did
//! not see it and the response of its first that did. The truth lies within both the
//! tap's bounds and the independent poller's, so: the tap's earliest instant is at most
//! the independent first sight, and the independent last miss is before the tap's
//! `queryable`. Then the report's bounds: the true figure between the lower and upper.
//! Once more with the tap's PostgreSQL connections ended by the server halfway through:
//! counted as reconnections, and every bound holds all the same.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Collector, bin, sql, store, tempdir, unique, wait_for};
use hoptrace_probe::clock::realtime_ns;
use hoptrace_probe::{Exporter, ExporterConfig, HopId, TraceContext, TraceKey};
use hoptrace_protocol::{SentEntry, SentFrame};
use hoptrace_tap::poll::StoreTapSummary;
use hoptrace_tap::{StoreTap, StoreTapConfig, StoreUrl};

/// Messages per run.
const N: u64 = 60;

/// The spec of these runs: `queryable` is polled, its earliest instant a hop of its own.
const SPEC: &str = r#"name = "bounds-test"

[[hops]]
name = "publish"
id = 0

[[hops]]
name = "store_in"
id = 3

[[hops]]
name = "query_start"
id = 4

[[hops]]
name = "queryable"
id = 5
earliest = "queryable_earliest"

[[hops]]
name = "queryable_earliest"
id = 6

[[stages]]
name = "Total Ingestion"
from = "publish"
to = "queryable"
definition = "publish to queryable"
headline = true

[[stages]]
name = "Store Visibility"
from = "store_in"
to = "queryable"
definition = "the row's store time to queryable"

[[stages]]
name = "Query Duration"
from = "query_start"
to = "queryable"
definition = "the poll that found it"
"#;

/// What the independent poller saw of each key: the send of its last poll without it and
/// the response of its first poll with it, `CLOCK_REALTIME` ns.
type Sightings = Arc<Mutex<HashMap<String, (i64, i64)>>>;

/// Polls back to back with `snapshot` (the keys the store shows now) until `stop`.
fn independent_poller(
    stop: Arc<AtomicBool>,
    mut snapshot: impl FnMut() -> Vec<String> + Send + 'static,
) -> (Sightings, std::thread::JoinHandle<u64>) {
    let seen: Sightings = Arc::default();
    let out = Arc::clone(&seen);
    let thread = std::thread::spawn(move || {
        let mut last_send = realtime_ns();
        let mut polls = 0u64;
        while !stop.load(Relaxed) {
            let send = realtime_ns();
            let keys = snapshot();
            let resp = realtime_ns();
            polls += 1;
            let mut s = out.lock().unwrap();
            for k in keys {
                s.entry(k).or_insert((last_send, resp));
            }
            last_send = send;
        }
        polls
    });
    (seen, thread)
}

/// One run: the collector, the tap at `url`, the independent poller, `N` messages written
/// by `write` (one key each, `topic` the run's series); checks the bounds per message and
/// in the report. `mid_run`, when given, is done halfway through the messages (a fault
/// that ends one of the tap's connections: counted, and the bounds must hold all the same).
fn run(
    store_name: &str,
    url: &str,
    mut write: impl FnMut(&str),
    snapshot: impl FnMut() -> Vec<String> + Send + 'static,
    mut mid_run: Option<&mut dyn FnMut()>,
    configure: &dyn Fn(&mut StoreTapConfig),
) -> StoreTapSummary {
    let dir = tempdir(store_name);
    let spec = dir.join("pipeline.toml");
    std::fs::write(&spec, SPEC).unwrap();
    let collector = Collector::start(&dir, &spec);
    let mut tc = StoreTapConfig::new(StoreUrl::parse(url).unwrap());
    tc.collector = Some(ExporterConfig::new(&collector.addr, "bounds-test"));
    tc.earliest_hop = Some((HopId(6), "queryable_earliest".into()));
    tc.pollers = 2;
    tc.poll_interval = Duration::from_millis(5);
    configure(&mut tc);
    let tap = StoreTap::start(tc).unwrap();
    let live = tap.live();
    let stop = Arc::new(AtomicBool::new(false));
    let tapping = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || tap.run(&stop))
    };
    wait_for("the baseline", 20, || live.baseline_taken.load(Relaxed));
    let (seen, independent) = independent_poller(Arc::clone(&stop), snapshot);

    let publisher = 1 + (realtime_ns() % 60_000) as u16;
    let exporter = Exporter::start(
        ExporterConfig::new(&collector.addr, "bounds-writer"),
        &[(HopId(0), "publish")],
    )
    .unwrap();
    let probe = exporter.probe(HopId(0)).unwrap();
    let mut texts = Vec::new();
    for seq in 0..N {
        if seq == N / 2
            && let Some(fault) = mid_run.as_mut()
        {
            fault();
        }
        let key = TraceKey {
            publisher,
            stream: 0,
            sequence: seq,
        };
        let mut ctx = TraceContext::new(key, 1, realtime_ns());
        assert!(probe.record(&mut ctx).queued);
        let text = ctx.to_text();
        write(&text);
        texts.push(text);
        // Pacing (what is measured): one write every 7 ms, against polls of their own.
        std::thread::sleep(Duration::from_millis(7));
    }
    exporter
        .send_sent_frame(SentFrame {
            publisher,
            entries: vec![SentEntry {
                stream: 0,
                messages: N,
                metrics: N,
                first_sequence: 0,
                last_sequence: N - 1,
            }],
        })
        .unwrap();
    assert_eq!(exporter.shutdown().counters.lost(), 0);
    wait_for("the tap to find every key", 30, || {
        live.keys_found.load(Relaxed) >= N
    });
    wait_for("the independent poller to see every key", 30, || {
        let s = seen.lock().unwrap();
        texts.iter().all(|t| s.contains_key(t))
    });
    stop.store(true, Relaxed);
    let s = tapping.join().unwrap();
    let independent_polls = independent.join().unwrap();
    eprintln!("{store_name}: {s:?}; independent polls {independent_polls}");
    assert_eq!(s.keys_found, N);
    if let Some(l) = &s.listen {
        // The listener's connection is the one a fault ends.
        assert_eq!(s.reconnections, 0);
        assert_eq!(l.errors, u64::from(mid_run.is_some()), "{l:?}");
        assert_eq!(l.bad, 0);
        assert!(
            l.keys_notified >= N / 2 && l.notifications >= l.keys_notified,
            "most keys arrive by notification before the next poll: {l:?}"
        );
    } else if mid_run.is_some() {
        assert!(
            s.reconnections >= 1,
            "the fault ended a connection, found lost and opened again: {s:?}"
        );
    } else {
        assert_eq!(s.reconnections, 0);
        assert_eq!(s.poll_errors, 0, "{:?}", s.last_error);
    }
    assert_eq!(s.pollers, 2);
    assert_eq!(s.earliest_fallbacks, 0, "every key was covered by a poll");

    // The live view, once every trace is in an interval that ended: its whole-run bounds,
    // compared with the report's below.
    let mut live = serde_json::Value::Null;
    wait_for("the live view to hold every trace", 30, || {
        live = collector.live();
        live["stages"][0]["run"]["count"] == N
    });
    let run = collector.stop();
    assert_eq!(run["accounting"]["adds_up"], true, "{}", run["accounting"]);
    let rows = sql(
        &collector_run(&dir),
        "SELECT sequence, CAST(queryable_earliest_ns AS BIGINT) AS e, CAST(queryable_ns AS BIGINT) AS q, \
         CAST(query_start_ns AS BIGINT) AS qs FROM traces",
    );
    assert_eq!(rows.len() as u64, N);
    let seen = seen.lock().unwrap();
    for r in &rows {
        let seq = r["sequence"].as_u64().unwrap();
        let (e, q, qs) = (
            r["e"].as_i64().unwrap(),
            r["q"].as_i64().unwrap(),
            r["qs"].as_i64().unwrap(),
        );
        let (miss, first) = seen[&texts[seq as usize]];
        assert!(e <= q, "key {seq}: earliest {e} after queryable {q}");
        assert!(qs <= q, "key {seq}");
        // The truth lies in both intervals.
        assert!(
            e <= first,
            "key {seq}: the tap's earliest {e} after the independent poller saw it at {first}"
        );
        assert!(
            miss < q,
            "key {seq}: the independent poller missed it at {miss}, after the tap's queryable {q}"
        );
    }

    // The report: every bounded figure between its lower and upper bound, Query Duration
    // exact.
    let out = dir.join("report");
    let o = std::process::Command::new(bin())
        .arg("report")
        .arg(collector_run(&dir))
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap();
    // summary.json holds to its schema, bounds and store taps included (Python's
    // jsonschema, which the test command installs).
    let schema = common::root().join("analysis/schema/summary.schema.json");
    let check = std::process::Command::new("python3")
        .args([
            "-c",
            "import json, sys, jsonschema; jsonschema.Draft202012Validator(json.load(open(sys.argv[2]))).validate(json.load(open(sys.argv[1])))",
        ])
        .arg(out.join("summary.json"))
        .arg(&schema)
        .output()
        .expect("python3");
    assert!(
        check.status.success(),
        "summary.json against {}: {}",
        schema.display(),
        String::from_utf8_lossy(&check.stderr)
    );
    // The report says what the tap's listener took, from its counters.
    let notified = &summary["store_taps"][0]["notified"];
    match s.listen.as_ref().filter(|l| l.subscription.is_none()) {
        Some(l) => {
            assert_eq!(notified["keys"], l.keys_notified, "{notified}");
            assert_eq!(notified["notifications"], l.notifications);
            assert_eq!(notified["errors"], l.errors);
        }
        None => assert!(notified.is_null(), "{notified}"),
    }
    // Query Duration (one poll's two stamps) is 0 for a notified key, and the report says
    // so with how many.
    let said: Vec<&str> = summary["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|w| w.as_str())
        .filter(|w| w.starts_with("Query Duration: ") && w.contains("store's notification"))
        .collect();
    match s
        .listen
        .as_ref()
        .filter(|l| l.keys_notified > 0 && l.subscription.is_none())
    {
        Some(l) => assert!(
            said.len() == 1 && said[0].contains(&format!(" {} keys came", l.keys_notified)),
            "{said:?}"
        ),
        None => assert!(said.is_empty(), "{said:?}"),
    }
    for st in summary["stages"].as_array().unwrap() {
        let name = st["name"].as_str().unwrap();
        if name == "Query Duration" {
            assert!(
                st["bounds"].is_null(),
                "one poll's two stamps are exact: {st}"
            );
            continue;
        }
        let b = &st["bounds"];
        assert_eq!(b["polled"][0], "queryable", "{name}: {st}");
        for (i, p) in st["percentiles"].as_array().unwrap().iter().enumerate() {
            let v = p["value_ns"].as_i64().unwrap();
            let lo = b["lower"]["percentiles"][i]["value_ns"].as_i64().unwrap();
            let hi = b["upper"]["percentiles"][i]["value_ns"].as_i64().unwrap();
            assert!(
                lo <= v && v <= hi,
                "{name} {}: {lo} <= {v} <= {hi}",
                p["label"]
            );
        }
        assert!(b["lower"]["min_ns"].as_i64() <= st["min_ns"].as_i64());
    }
    // The live view showed the report's bounds of the same traces: the same counts and
    // extremes, and the same percentiles (one kind of histogram, one precision); Query
    // Duration none.
    let (l, r) = (&live["stages"][0], &summary["stages"][0]);
    assert_eq!(l["name"], "Total Ingestion");
    assert_eq!(r["name"], "Total Ingestion");
    assert_eq!(l["bounds"]["polled"][0], "queryable", "{l}");
    for side in ["lower", "upper"] {
        let (lb, rb) = (&l["bounds"]["run"][side], &r["bounds"][side]);
        assert_eq!(lb["count"], rb["count"], "{side}: {lb} against {rb}");
        assert_eq!(lb["min_ns"], rb["min_ns"], "{side}");
        assert_eq!(lb["max_ns"], rb["max_ns"], "{side}");
        for (field, label) in [
            ("p50_ns", "P50"),
            ("p90_ns", "P90"),
            ("p99_ns", "P99"),
            ("p999_ns", "P99.9"),
        ] {
            let at = rb["percentiles"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["label"] == label)
                .unwrap_or_else(|| panic!("{label} in {rb}"));
            assert_eq!(lb[field], at["value_ns"], "{side} {label}");
        }
    }
    let query = live["stages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|st| st["name"] == "Query Duration")
        .unwrap();
    assert!(query["bounds"].is_null(), "{query}");
    // And the bound columns of `traces` give the same percentiles.
    let p = sql(
        &collector_run(&dir),
        "SELECT hdr_percentile(total_ingestion_lower_ns, 0.99) AS lo, \
         hdr_percentile(total_ingestion_upper_ns, 0.99) AS hi, \
         hdr_percentile(total_ingestion_ns, 0.99) AS v FROM traces",
    );
    let (lo, hi, v) = (
        p[0]["lo"].as_i64().unwrap(),
        p[0]["hi"].as_i64().unwrap(),
        p[0]["v"].as_i64().unwrap(),
    );
    assert!(lo <= v && v == hi, "{lo} {v} {hi}");
    std::fs::remove_dir_all(&dir).ok();
    s
}

fn collector_run(dir: &std::path::Path) -> std::path::PathBuf {
    dir.join("t")
}

/// Runs its closure when dropped, also when the test panics.
struct Cleanup<F: FnMut()>(F);

impl<F: FnMut()> Drop for Cleanup<F> {
    fn drop(&mut self) {
        (self.0)();
    }
}

/// Drops measurement `m` however the test ends: a store's history is the test's, not the
/// next one's.
fn drop_on_exit(m: &str) -> Cleanup<impl FnMut()> {
    let m = m.to_owned();
    Cleanup(move || {
        let _ = http()
            .post("http://127.0.0.1:18086/query")
            .query("db", "hoptrace")
            .query("q", &format!("DROP MEASUREMENT \"{m}\""))
            .call();
    })
}

/// The independent poller's snapshot of measurement `m`: the keys of the last 30 s in the
/// series whose topic starts with `root/`.
fn influx_snapshot(m: &str, root: &str) -> impl FnMut() -> Vec<String> + Send + 'static {
    let q = format!(
        "SELECT \"hoptrace\" FROM \"{m}\" WHERE time > now() - 30s AND \"topic\" =~ /^{root}\\//"
    );
    move || {
        let body = http()
            .get("http://127.0.0.1:18086/query")
            .query("db", "hoptrace")
            .query("q", &q)
            .call()
            .unwrap()
            .into_string()
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        v["results"][0]["series"][0]["values"]
            .as_array()
            .map(|rows| {
                rows.iter()
                    .filter_map(|r| r[1].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    }
}

fn http() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(60))
        .build()
}

#[test]
#[ignore = "needs the stores (infra/stores, installed by infra/setup.sh): infra/test.sh runs it"]
fn influxdb_with_history() {
    let _guard = store("influxdb");
    let m = format!("bounds_{}", unique());
    let base = "http://127.0.0.1:18086";
    let _drop = drop_on_exit(&m);
    // History: 30,000 series of older data in the same measurement.
    let hour_ago = realtime_ns() - 3_600_000_000_000;
    for chunk in 0..6 {
        let lines: Vec<String> = (0..5_000)
            .map(|i| {
                let n = chunk * 5_000 + i;
                format!(
                    "{m},topic=old/s{n} hoptrace=\"\",value=1 {}",
                    hour_ago + n as i64
                )
            })
            .collect();
        http()
            .post(&format!("{base}/write?db=hoptrace"))
            .send_string(&lines.join("\n"))
            .unwrap();
    }
    // Twice: polled with a regular expression in `where=` (matched against every series
    // of the measurement), then by value (`series=`) over six series that do not exist
    // when the tap starts: each is found by a resolution, and its first rows by the
    // catch-up poll that follows, bounded by what polls that asked for the series proved.
    for (select, root) in [
        ("where=%22topic%22%20%3D~%20%2F%5Erun%5C%2F%2F", "run"),
        ("series=topic%3D~%2F%5Esr%5C%2F%2F", "sr"),
    ] {
        let mut n = 0u64;
        let wm = m.clone();
        let write = move |key: &str| {
            let line = format!("{wm},topic={root}/s{} hoptrace=\"{key}\",value=1.5", n % 6);
            n += 1;
            http()
                .post(&format!("{base}/write?db=hoptrace"))
                .send_string(&line)
                .unwrap();
        };
        let snapshot = influx_snapshot(&m, root);
        let url = format!("influxdb://127.0.0.1:18086/hoptrace?measurement={m}&{select}");
        let s = run("influxdb", &url, write, snapshot, None, &|_| {});
        if root == "sr" {
            let (series, resolutions, errors) = s.series.expect("series resolved");
            assert_eq!((series, errors), (6, 0), "{s:?}");
            assert!(resolutions >= 2, "{s:?}");
        } else {
            assert_eq!(s.series, None);
        }
    }
}

/// The subscriptions of database `hoptrace`, as `SHOW SUBSCRIPTIONS` lists them.
fn influx_subscriptions() -> Vec<String> {
    let body = http()
        .get("http://127.0.0.1:18086/query")
        .query("q", "SHOW SUBSCRIPTIONS")
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["results"][0]["series"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["name"] == "hoptrace")
        .flat_map(|s| s["values"].as_array().cloned().unwrap_or_default())
        .filter_map(|r| r[1].as_str().map(str::to_owned))
        .collect()
}

/// InfluxDB's subscription as a trigger: every write the store accepts comes to the tap,
/// which asks at once for its points; the polls, every 200 ms, only back it up. The
/// bounds hold against the independent poller as before, most keys are found by the
/// triggered queries, and the tap drops its subscription when it ends.
#[test]
#[ignore = "needs the stores (infra/stores, installed by infra/setup.sh): infra/test.sh runs it"]
fn influxdb_subscription_triggers_queries() {
    let _guard = store("influxdb");
    let m = format!("bounds_{}", unique());
    let base = "http://127.0.0.1:18086";
    let _drop = drop_on_exit(&m);
    // History: older series in the same measurement, and writes to another measurement
    // that the subscription also brings (skipped).
    let hour_ago = realtime_ns() - 3_600_000_000_000;
    let lines: Vec<String> = (0..5_000)
        .map(|n| format!("{m},topic=old/s{n} hoptrace=\"\",value=1 {}", hour_ago + n))
        .collect();
    http()
        .post(&format!("{base}/write?db=hoptrace"))
        .send_string(&lines.join("\n"))
        .unwrap();
    let before = influx_subscriptions();
    let mut n = 0u64;
    let wm = m.clone();
    let write = move |key: &str| {
        // Two points per write: the run's, and one of another measurement.
        let line = format!(
            "{wm},topic=sb/s{},site=a\\ b hoptrace=\"{key}\",value=1.5\n{wm}_other,topic=x value=1",
            n % 6
        );
        n += 1;
        http()
            .post(&format!("{base}/write?db=hoptrace"))
            .send_string(&line)
            .unwrap();
    };
    let snapshot = influx_snapshot(&m, "sb");
    let url = format!(
        "influxdb://127.0.0.1:18086/hoptrace?measurement={m}&series=topic%3D~%2F%5Esb%5C%2F%2F&subscribe=127.0.0.1:0"
    );
    let configure = |tc: &mut StoreTapConfig| {
        tc.poll_interval = Duration::from_millis(200);
        tc.idle_poll_interval = Duration::from_millis(200);
    };
    let s = run("influxdb", &url, write, snapshot, None, &configure);
    let l = s.listen.as_ref().expect("the subscription's counts");
    let sub = l.subscription.as_ref().expect("a subscription");
    assert_eq!(sub.retention_policy, "autogen", "{l:?}");
    assert!(sub.writes >= N, "every write came: {l:?}");
    assert!(l.notifications >= N && sub.queries >= 1, "{l:?}");
    assert!(
        l.keys_notified >= N * 3 / 4,
        "most keys are found by the query their write triggered, before the next poll: {l:?}"
    );
    assert_eq!(
        influx_subscriptions(),
        before,
        "the tap dropped its subscription"
    );
}

fn pg() -> postgres::Client {
    postgres::Client::connect(
        "host=127.0.0.1 port=15432 user=hoptrace password=hoptrace-test dbname=hoptrace",
        postgres::NoTls,
    )
    .unwrap()
}

/// A PostgreSQL table with history, polled for the run's rows; with `drop_connections`,
/// the server ends the tap's connections halfway through (`pg_terminate_backend`): the
/// loss is counted, the pollers connect again, and every bound still holds (a poll that
/// failed bounds nothing). With `notify`, a trigger notifies each row (the one
/// `docs/dataset.md` gives), the tap listens and polls only every 200 ms, and the
/// connection ended is the listener's: polls find what it missed meanwhile.
fn postgres_run(drop_connections: bool, notify: bool) {
    let _guard = store("postgres");
    let t = format!("bounds_{}", unique());
    let t_name = t.clone();
    let mut c = pg();
    // History: 300,000 older rows of 30,000 series in the same table.
    c.batch_execute(&format!(
        "CREATE TABLE {t} (topic text, hoptrace text, at timestamptz NOT NULL DEFAULT clock_timestamp());
         INSERT INTO {t} (topic, hoptrace, at)
           SELECT 'old/s' || (n % 30000), '', now() - interval '1 hour' + n * interval '1 microsecond'
           FROM generate_series(1, 300000) AS n;
         CREATE INDEX ON {t} (at);
         CREATE INDEX ON {t} (topic, at);"
    ))
    .unwrap();
    if notify {
        c.batch_execute(&format!(
            "CREATE FUNCTION {t}_notify() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
               PERFORM pg_notify('{t}', NEW.hoptrace || ' ' || (extract(epoch FROM NEW.at) * 1000000)::int8);
               RETURN NULL;
             END $$;
             CREATE TRIGGER {t}_notify AFTER INSERT ON {t} FOR EACH ROW EXECUTE FUNCTION {t}_notify();"
        ))
        .unwrap();
    }
    let insert = format!("INSERT INTO {t} (topic, hoptrace) VALUES ('run/s0', $1)");
    let mut writer = pg();
    let write = move |key: &str| {
        writer.execute(&insert, &[&key]).unwrap();
    };
    let select = format!(
        "SELECT hoptrace FROM {t} WHERE at > now() - interval '30 seconds' AND topic LIKE 'run/%'"
    );
    let mut reader = pg();
    let snapshot = move || {
        reader
            .query(&select, &[])
            .unwrap()
            .iter()
            .map(|r| r.get::<_, String>(0))
            .collect()
    };
    let mut url = format!(
        "postgres://hoptrace:hoptrace-test@127.0.0.1:15432/hoptrace?table={t}&time=at&where=topic%20LIKE%20%27run%2F%25%27"
    );
    if notify {
        url.push_str(&format!("&notify={t}"));
    }
    let _drop = Cleanup(move || {
        let _ = c.batch_execute(&format!(
            "DROP TABLE IF EXISTS {t}; DROP FUNCTION IF EXISTS {t}_notify()"
        ));
    });
    // The tap's connections (the independent poller and the writer announce no
    // application name), by the table their last statement named: its pollers'
    // (`hoptrace-tap`; the busy one finds its connection lost at its next poll, an idle
    // one when next used), or its listener's (`hoptrace-listen`, one).
    let mut admin = pg();
    let mut terminate = move |application: &str| {
        let ended = admin
            .query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE application_name = $1 AND query LIKE '%' || $2 || '%'",
                &[&application, &t_name],
            )
            .unwrap();
        assert!(!ended.is_empty(), "no {application} connection on {t_name}");
        assert!(ended.iter().all(|r| r.get::<_, bool>(0)));
        ended.len()
    };
    let mut end = || {
        if notify {
            assert_eq!(terminate("hoptrace-listen"), 1, "one listener");
        } else {
            terminate("hoptrace-tap");
        }
    };
    let fault = drop_connections.then_some(&mut end as &mut dyn FnMut());
    let configure = |tc: &mut StoreTapConfig| {
        if notify {
            tc.poll_interval = Duration::from_millis(200);
            tc.idle_poll_interval = Duration::from_millis(200);
        }
    };
    let s = run("postgres", &url, write, snapshot, fault, &configure);
    assert_eq!(s.series, None);
    assert_eq!(s.listen.is_some(), notify);
}

#[test]
#[ignore = "needs the stores (infra/stores, installed by infra/setup.sh): infra/test.sh runs it"]
fn postgres_with_history() {
    postgres_run(false, false);
}

#[test]
#[ignore = "needs the stores (infra/stores, installed by infra/setup.sh): infra/test.sh runs it"]
fn postgres_notified_rows() {
    postgres_run(false, true);
}

#[test]
#[ignore = "needs the stores (infra/stores, installed by infra/setup.sh): infra/test.sh runs it"]
fn postgres_listener_connection_dropped_mid_run() {
    postgres_run(true, true);
}

#[test]
#[ignore = "needs the stores (infra/stores, installed by infra/setup.sh): infra/test.sh runs it"]
fn postgres_poller_connections_dropped_mid_run() {
    postgres_run(true, false);
}
