//! A run from the collector's generator (the one `hoptrace bench report` times), read back
//! by the analysis with its counts and figures.

use hoptrace_analysis::{RunSet, summary};
use hoptrace_collector::generate::{FLOORS_NS, GenerateOptions, Inject, generate, remove};

/// The summary of the run in `run_dir`, listing the `exemplars` slowest messages.
fn summarise(run_dir: &std::path::Path, exemplars: usize) -> summary::Summary {
    let runs = RunSet::open(&[run_dir]).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        let ctx = runs.session().await?;
        summary::compute_with(&runs, &ctx, exemplars).await
    })
    .unwrap()
    .0
}

#[test]
fn a_generated_run_is_read_back_with_its_counts() {
    let dir = std::env::temp_dir().join(format!("hoptrace-gen-{}", std::process::id()));
    let mut o = GenerateOptions::new(25_000, &dir, "gen");
    o.rows_per_file = 10_000;
    let g = generate(&o, |_| {}).unwrap();
    assert_eq!((g.traces, g.files), (25_000, 3));
    let s = summarise(&g.run_dir, 20);
    let a = &s.accounting;
    assert_eq!((a.sent, a.complete, a.incomplete), (25_000, 24_998, 2));
    assert!(a.adds_up, "{a:?}");
    let total = s
        .stages
        .iter()
        .find(|x| x.name == "Total Ingestion")
        .unwrap();
    assert_eq!(total.figures.count, 24_998);
    // The delays' floors add up to the smallest possible total.
    let floor: i64 = FLOORS_NS[1..].iter().sum();
    assert!(total.figures.min_ns.unwrap() >= floor);
    let p50 = total
        .figures
        .percentiles
        .iter()
        .find(|p| p.label() == "P50")
        .unwrap();
    // Batches add the wait for their last message to the processor's hop.
    assert!((1_500_000..6_000_000).contains(&p50.value_ns), "{p50:?}");
    remove(&g.run_dir).unwrap();
}

#[test]
fn a_run_of_ten_messages_has_no_tail_but_its_slowest_messages() {
    let dir = std::env::temp_dir().join(format!("hoptrace-gen10-{}", std::process::id()));
    let g = generate(&GenerateOptions::new(10, &dir, "gen10"), |_| {}).unwrap();
    let s = summarise(&g.run_dir, 3);
    let t = &s.tails[0];
    assert!(t.levels.is_empty(), "{:?}", t.levels);
    assert_eq!(t.notes.len(), 3, "{:?}", t.notes);
    assert!(
        t.notes[1].starts_with("no P99.9 tail: 10 messages"),
        "{:?}",
        t.notes
    );
    assert_eq!(t.exemplars.len(), 3);
    assert!(
        t.exemplars
            .windows(2)
            .all(|w| w[0].delta_ns >= w[1].delta_ns)
    );
    let total = s
        .stages
        .iter()
        .find(|x| x.name == "Total Ingestion")
        .unwrap();
    assert_eq!(Some(t.exemplars[0].delta_ns), total.figures.max_ns);
    remove(&g.run_dir).unwrap();
}

/// The columns `names` of every traces file of `run_dir`, as i64 (null: `None`), in row
/// order.
fn stamp_columns(run_dir: &std::path::Path, names: &[&str]) -> Vec<Vec<Option<i64>>> {
    use arrow::array::{Array, AsArray};
    use arrow::datatypes::TimestampNanosecondType;
    let mut files: Vec<_> = std::fs::read_dir(run_dir.join("traces"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let mut out = vec![Vec::new(); names.len()];
    for f in files {
        let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
            std::fs::File::open(&f).unwrap(),
        )
        .unwrap()
        .build()
        .unwrap();
        for batch in reader {
            let batch = batch.unwrap();
            for (col, name) in out.iter_mut().zip(names) {
                let a = batch
                    .column_by_name(name)
                    .unwrap()
                    .as_primitive::<TimestampNanosecondType>();
                col.extend((0..a.len()).map(|i| a.is_valid(i).then(|| a.value(i))));
            }
        }
    }
    out
}

#[test]
fn generated_batches_share_their_stamps_from_flow_out_on_and_shrink_the_run() {
    let dir = hoptrace_testkit::tempdir("gen-batches");
    let mut o = GenerateOptions::new(30_000, &dir, "batched");
    o.rows_per_file = 30_000;
    let batched = generate(&o, |_| {}).unwrap();
    o.run_id = "per-message".into();
    o.batch_max = 1;
    let single = generate(&o, |_| {}).unwrap();

    let names = [
        "flow_in_ns",
        "flow_out_ns",
        "store_in_ns",
        "query_start_ns",
        "queryable_ns",
    ];
    let cols = stamp_columns(&batched.run_dir, &names);
    // Batches are runs of consecutive rows with one flow_out stamp.
    let mut sizes = Vec::new();
    let mut start = 0;
    for r in 1..=cols[1].len() {
        if r == cols[1].len() || cols[1][r] != cols[1][start] {
            sizes.push(r - start);
            let last_in = (start..r).map(|i| cols[0][i].unwrap()).max().unwrap();
            // The batch leaves after its last message arrived, plus the floor.
            assert!(cols[1][start].unwrap() >= last_in + FLOORS_NS[2]);
            // Every later hop is stamped once per batch (queryable: where present).
            for c in &cols[2..] {
                let first = (start..r).find_map(|i| c[i]).unwrap();
                assert!((start..r).all(|i| c[i].is_none_or(|v| v == first)));
            }
            start = r;
        }
    }
    assert!(sizes.iter().all(|&s| (1..=24).contains(&s)), "{sizes:?}");
    let mean = 30_000.0 / sizes.len() as f64;
    assert!((10.0..15.0).contains(&mean), "mean batch {mean}");
    // Per message, the stamps differ (but for chance: a delay is one of 4096 values).
    let single_cols = stamp_columns(&single.run_dir, &names[1..2]);
    let distinct: std::collections::HashSet<_> = single_cols[0].iter().collect();
    assert!(distinct.len() > 29_900, "{}", distinct.len());
    // Batched stamps cost well under half the bytes.
    assert!(
        batched.bytes * 2 < single.bytes,
        "{} vs {}",
        batched.bytes,
        single.bytes
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A generated run of 200,000 messages over 100 streams in 10 s, with `inject`, the
/// processor taking batches of up to `batch_max` messages.
fn injected_run(
    name: &str,
    inject: Option<Inject>,
    batch_max: u32,
) -> (std::path::PathBuf, summary::Summary) {
    let dir = hoptrace_testkit::tempdir(name);
    let mut o = GenerateOptions::new(200_000, &dir, name);
    o.batch_max = batch_max;
    o.streams = 100;
    o.messages_per_s = 20_000.0;
    o.rows_per_file = 100_000;
    o.inject = inject;
    let g = generate(&o, |_| {}).unwrap();
    let s = summarise(&g.run_dir, 20);
    (g.run_dir, s)
}

/// Of the messages with `publish` and `queryable`, per stream (row index modulo 100, the
/// generator's round robin): (messages, those at or above `threshold`).
fn per_stream(run_dir: &std::path::Path, threshold: i64) -> Vec<(u64, u64)> {
    let cols = stamp_columns(run_dir, &["publish_ns", "queryable_ns"]);
    let mut out = vec![(0, 0); 100];
    for (r, (a, b)) in cols[0].iter().zip(&cols[1]).enumerate() {
        if let (Some(a), Some(b)) = (a, b) {
            out[r % 100].0 += 1;
            out[r % 100].1 += u64::from(b - a >= threshold);
        }
    }
    out
}

fn causes(l: &hoptrace_analysis::tail::TailLevel) -> Vec<(String, String)> {
    l.concentration
        .as_ref()
        .unwrap()
        .causes()
        .iter()
        .map(|(d, v)| ((*d).to_owned(), v.value.clone()))
        .collect()
}

#[test]
fn a_slow_stream_is_where_the_tail_concentrates() {
    let (run, s) = injected_run(
        "tail-slow-stream",
        Some(Inject::SlowStream {
            stream: 7,
            extra_ns: 8_000_000,
        }),
        // Each message on its own: in a batch, the messages before the slow stream's
        // wait for it and are slower still (published earlier).
        1,
    );
    let t = &s.tails[0];
    let p99 = &t.levels[0];
    let c = p99.concentration.as_ref().unwrap();
    // The stream's 1 % of the messages is most of the P99 tail.
    let stream = c
        .dimensions
        .iter()
        .find(|d| d.dimension == "stream")
        .unwrap();
    assert_eq!(stream.values, 100);
    assert_eq!(stream.messages, t.messages);
    assert_eq!(stream.in_tail, p99.messages);
    let top = &stream.listed[0];
    assert_eq!(top.value, "1/7");
    assert!(top.likely_cause && top.p_value < 1e-100, "{top:?}");
    // Exact against the Parquet.
    let oracle = per_stream(&run, p99.threshold_ns);
    assert_eq!((top.messages, top.in_tail), oracle[7]);
    assert_eq!(
        oracle.iter().map(|o| o.1).sum::<u64>(),
        p99.messages,
        "every tail message is counted once"
    );
    assert_eq!(causes(p99)[0], ("stream".to_owned(), "1/7".to_owned()));
    assert_eq!(stream.likely_causes, 1, "{:?}", stream.listed);
    // The README's query gives the same counts.
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    let start = readme
        .find("```sql\nSELECT publisher, stream, count(*) AS messages,")
        .unwrap()
        + "```sql\n".len();
    let sql = &readme[start..start + readme[start..].find("```").unwrap()];
    let runs = RunSet::open(&[&run]).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let b = rt
        .block_on(async {
            let ctx = runs.session().await.unwrap();
            hoptrace_analysis::sql::query(&ctx, sql).await
        })
        .unwrap();
    let int = |c: usize| {
        arrow::compute::cast(b[0].column(c), &arrow::datatypes::DataType::Int64)
            .unwrap()
            .as_any()
            .downcast_ref::<arrow::array::Int64Array>()
            .unwrap()
            .value(0)
    };
    assert_eq!((int(0), int(1)), (1, 7), "the first row is the slow stream");
    assert_eq!((int(2) as u64, int(3) as u64), (top.messages, top.in_tail));
    // One publisher and one metric count: nothing to compare.
    for d in ["publisher", "metric count"] {
        let d = c.dimensions.iter().find(|x| x.dimension == d).unwrap();
        assert_eq!(d.values, 1);
        assert!(d.listed.is_empty());
    }
    // The report names it.
    let dir = hoptrace_testkit::tempdir("tail-slow-stream-report");
    let w = hoptrace_analysis::report::write(&dir, &s, &[]).unwrap();
    let md = std::fs::read_to_string(&w.markdown).unwrap();
    assert!(md.contains("It concentrates in stream 1/7 ("), "{md}");
    assert!(md.contains("**Where the P99 tail concentrates.**"), "{md}");
    hoptrace_collector::generate::remove(&run).unwrap();
}

#[test]
fn a_stalling_processor_is_found_in_the_seconds_of_its_stalls() {
    let (run, s) = injected_run(
        "tail-pause",
        Some(Inject::Pause {
            every_ns: 5_000_000_000,
            length_ns: 40_000_000,
        }),
        24,
    );
    let p99 = &s.tails[0].levels[0];
    let found = causes(p99);
    let seconds: Vec<&str> = found
        .iter()
        .filter(|(d, _)| d == "second")
        .map(|(_, v)| v.as_str())
        .collect();
    for s in ["+0 s", "+5 s"] {
        assert!(seconds.contains(&s), "{s} not in {found:?}");
    }
    assert!(
        found
            .iter()
            .all(|(d, v)| d == "second" && (v == "+0 s" || v == "+5 s")),
        "a stall slows every stream alike: {found:?}"
    );
    assert!(s.events.is_empty(), "{:?}", s.events);

    // A collector restart 5.2 s into the run, as run.json records one: the stall's
    // second +5 s lines up with it, the first stall's second does not.
    let path = run.join("run.json");
    let mut r: hoptrace_format::run::RunSummary =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let at = s.throughput.start_unix_ns + 5_200_000_000;
    r.restarts.push(hoptrace_format::run::Restart {
        at_unix_ns: at,
        log_entries: 12,
        log_bytes: 4096,
        torn_bytes: 0,
        records_replayed: 0,
        checkpoint_unix_ns: None,
        replay_ms: 35,
        log_records: 100,
        resent_records_dropped: 0,
    });
    r.write(&path).unwrap();
    let s = summarise(&run, 20);
    assert_eq!(s.events.len(), 1, "{:?}", s.events);
    assert_eq!(s.events[0].at_unix_ns, at);
    let seconds = &s.tails[0].levels[0]
        .concentration
        .as_ref()
        .unwrap()
        .dimensions
        .iter()
        .find(|d| d.dimension == "second")
        .unwrap()
        .listed;
    let of = |v: &str| &seconds.iter().find(|c| c.value == v).unwrap().lines_up_with;
    assert_eq!(of("+5 s").len(), 1);
    assert!(of("+5 s")[0].starts_with("collector restarted: collector (replayed 12 log entries"));
    assert!(of("+0 s").is_empty());
    // The report says so, lists it, and the charts over time mark it.
    let dir = hoptrace_testkit::tempdir("tail-pause-report");
    let w = hoptrace_analysis::report::write(&dir, &s, &[]).unwrap();
    let md = std::fs::read_to_string(&w.markdown).unwrap();
    assert!(md.contains("+5 s (×"), "{md}");
    assert!(
        md.contains("which lines up with collector restarted: collector"),
        "{md}"
    );
    assert!(md.contains("## Events"), "{md}");
    assert!(
        md.contains("| +5.2 s | collector restarted | collector |"),
        "{md}"
    );
    let throughput = hoptrace_analysis::charts::throughput(&s);
    let marks = &throughput.spec["layer"][1]["data"]["values"];
    assert_eq!(marks[0]["t_s"], 5.2, "{marks}");
    assert_eq!(marks[0]["event"], "collector restarted");
    let _ = std::fs::remove_dir_all(&dir);
    hoptrace_collector::generate::remove(&run).unwrap();
}

#[test]
fn a_run_without_a_cause_names_none() {
    let (run, s) = injected_run("tail-no-cause", None, 24);
    for l in &s.tails[0].levels {
        assert_eq!(
            causes(l),
            Vec::<(String, String)>::new(),
            "{}",
            l.percentile.label()
        );
        let c = l.concentration.as_ref().unwrap();
        assert!(c.tested > 0);
    }
    hoptrace_collector::generate::remove(&run).unwrap();
}

/// Forty runs without a cause, half of them batched, each with its P99 and P99.9 tails
/// tested over 40 streams and 10 seconds: at the test's level, 1 % per tail, about one
/// of the 80 tails may name a cause by chance; none does.
#[test]
fn runs_without_a_cause_name_none_by_chance() {
    let mut flagged = Vec::new();
    let mut tails = 0;
    for seed in 1..=40u64 {
        let dir = hoptrace_testkit::tempdir("tail-cal");
        let mut o = GenerateOptions::new(20_000, &dir, "cal");
        o.streams = 40;
        o.messages_per_s = 2_000.0;
        o.batch_max = if seed % 2 == 0 { 1 } else { 24 };
        o.seed = seed;
        let g = generate(&o, |_| {}).unwrap();
        let s = summarise(&g.run_dir, 0);
        for l in &s.tails[0].levels {
            tails += 1;
            let c = causes(l);
            if !c.is_empty() {
                flagged.push((seed, l.percentile.label(), c));
            }
        }
        remove(&g.run_dir).unwrap();
    }
    assert_eq!(tails, 80);
    assert!(flagged.is_empty(), "{flagged:?}");
}
