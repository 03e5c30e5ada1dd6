//! Each store tap against its real store (`infra/stores`) and the real `hoptrace collect`:
//! rows carrying trace contexts are written into the store directly, the tap reports each
//! key once, with `queryable` after the write began, and the run's counts add up.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::Duration;

use common::{Collector, sql, store, tempdir, unique, wait_for, write_spec};
use hoptrace_probe::clock::realtime_ns;
use hoptrace_probe::{Exporter, ExporterConfig, HopId, TraceContext, TraceKey};
use hoptrace_protocol::{SentEntry, SentFrame};
use hoptrace_tap::poll::StoreTapSummary;
use hoptrace_tap::{StoreTap, StoreTapConfig, StoreUrl};

/// Rows written per test, besides one row already there at start and one bad key.
const N: u64 = 40;

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
    let live = tap.live();
    let stop = Arc::new(AtomicBool::new(false));
    let thread = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || tap.run(&stop))
    };
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
    for seq in 0..N {
        let key = TraceKey {
            publisher,
            stream: 0,
            sequence: seq,
        };
        let mut ctx = TraceContext::new(key, 1, realtime_ns());
        probe.try_record(&mut ctx).unwrap();
        let text = ctx.to_text();
        began.insert(seq, realtime_ns());
        if seq == 0 {
            // Two rows of one message in one write, as a JSON batch of two metrics makes.
            (case.write)(&[&text, &text]);
        } else {
            (case.write)(&[&text]);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    // A key that is not a context.
    (case.write)(&["not-a-context"]);
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

    wait_for("the tap to find every key", 30 + case.visibility_s, || {
        live.keys_found.load(Relaxed) >= N && live.bad_keys.load(Relaxed) >= 1
    });
    // Polls after the last key: none may report a key again.
    let polls = live.polls.load(Relaxed);
    wait_for("more polls", 10, || live.polls.load(Relaxed) >= polls + 20);
    stop.store(true, Relaxed);
    let s = thread.join().unwrap();
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
    assert_eq!(mine["sent"], N);
    assert_eq!(mine["complete"], N, "{a}");
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

    let rows = sql(
        &run_dir(&dir),
        &format!(
            "SELECT sequence, CAST(publish_ns AS BIGINT) AS p, CAST(query_start_ns AS BIGINT) AS qs, CAST(queryable_ns AS BIGINT) AS q, {} AS s, flags FROM traces",
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
    });
    influx_q(&format!("DROP MEASUREMENT \"{m}\""));
}

#[test]
#[ignore = "needs the stores (infra/stores, installed by infra/setup.sh): infra/test.sh runs it"]
fn influxdb_refuses_a_missing_database_and_field_at_start() {
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

fn pg() -> postgres::Client {
    postgres::Client::connect(
        "host=127.0.0.1 port=15432 user=hoptrace password=hoptrace-test dbname=hoptrace",
        postgres::NoTls,
    )
    .unwrap()
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
    run_case(&mut Case {
        store: "postgres",
        resolution_ns: 1000,
        url: format!(
            "postgres://hoptrace:hoptrace-test@127.0.0.1:15432/hoptrace?table={t}&time=at"
        ),
        store_in: true,
        write: &mut write,
        visible: &mut visible,
        visibility_s: 5,
    });
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

fn ch(sql: &str) -> String {
    post("http://127.0.0.1:18123/", sql)
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
    let mut visible = |key: &str| {
        ch(&format!(
            "SELECT count() FROM hoptrace.{t} WHERE hoptrace = '{key}'"
        ))
        .trim()
            != "0"
    };
    let s = run_case(&mut Case {
        store: "clickhouse",
        resolution_ns: 1_000_000_000,
        url: format!("clickhouse://127.0.0.1:18123/hoptrace?table={t}&time=inserted"),
        store_in: false,
        write: &mut write,
        visible: &mut visible,
        visibility_s: 5,
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
    let mut visible = |key: &str| {
        let sel = format!("{{__name__=\"{metric}\",hoptrace=\"{key}\"}}");
        http()
            .get(&format!("{base}/api/v1/export"))
            .query("match[]", &sel)
            .call()
            .unwrap()
            .into_string()
            .unwrap()
            .contains(key)
    };
    run_case(&mut Case {
        store: "victoriametrics",
        resolution_ns: 1_000_000,
        url: format!("victoriametrics://127.0.0.1:18428/?metric={metric}"),
        store_in: true,
        write: &mut write,
        visible: &mut visible,
        visibility_s: 30,
    });
    let _ = http()
        .post(&format!("{base}/api/v1/admin/tsdb/delete_series"))
        .query("match[]", &metric)
        .call();
}
