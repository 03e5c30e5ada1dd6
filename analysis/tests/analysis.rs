//! Analysis over a real run: two probe hosts report to a real collector over loopback;
//! the run's Parquet is then queried with SQL and summarised, and every figure is checked
//! against an exact oracle computed here from the stamps that were sent.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use hoptrace_analysis::summary::{self, Summary};
use hoptrace_analysis::{AnalysisError, RunSet, compare, report};
use hoptrace_collector::{Collector, CollectorConfig};
use hoptrace_format::spec::PipelineSpec;
use hoptrace_probe::ClockReporting;
use hoptrace_probe::clock::{ClockSource, ClockStatus, Leap};
use hoptrace_probe::testing::ManualClock;
use hoptrace_probe::{Exporter, ExporterConfig, HopId, TraceContext, TraceKey};
use hoptrace_protocol::{SentEntry, SentFrame};

const TRACES: u64 = 20_000;
/// A whole second shortly before the test started: stamps must be plausible for the run.
fn base_ns() -> i64 {
    static BASE: std::sync::LazyLock<i64> = std::sync::LazyLock::new(|| {
        let now = hoptrace_probe::clock::realtime_ns();
        now - now % 1_000_000_000 - 60_000_000_000
    });
    *BASE
}
/// Host A's (publisher) and host B's (everything else) clock error bounds.
const BOUND_A_NS: u64 = 5_000;
const BOUND_B_NS: u64 = 7_000;

/// A deterministic pseudo-random generator (64-bit LCG, high bits).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }
}

/// The trace that lost its `publish` stamp and whose intended send time is absurd (1 ns
/// after the epoch): it has no plausible time, and must not stretch the run.
const ABSURD_SEQ: u64 = 7;

/// The stamps of trace `seq` for the six default hops; `None` where a hop is skipped.
/// Latencies are log-spread (100 ns .. ~10 ms); every 97th Broker Time is negative (host
/// A's clock ahead), every 50th trace misses `queryable`, [`ABSURD_SEQ`] misses `publish`.
fn stamps(seq: u64) -> [Option<i64>; 6] {
    let mut r = Lcg(seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut spread = || {
        let exp = (r.next() % 5) as u32 + 2;
        (10_i64.pow(exp) + (r.next() % 10_u64.pow(exp)) as i64).max(1)
    };
    let publish = base_ns() + seq as i64 * 100_000;
    let broker_time = if seq.is_multiple_of(97) {
        -3_000
    } else {
        spread()
    };
    let flow_in = publish + broker_time;
    let flow_out = flow_in + spread();
    let store_in = flow_out + spread();
    let query_start = store_in + spread();
    let queryable = query_start + spread();
    let q = (!seq.is_multiple_of(50)).then_some(queryable);
    [
        (seq != ABSURD_SEQ).then_some(publish),
        Some(flow_in),
        Some(flow_out),
        Some(store_in),
        Some(query_start),
        q,
    ]
}

fn status(bound: u64, leap: Leap) -> ClockReporting {
    ClockReporting::Fixed(ClockStatus {
        at_ns: 0,
        source: ClockSource::Injected,
        synced: true,
        leap,
        offset_ns: 100,
        error_bound_ns: bound,
        detail: "test".into(),
    })
}

fn make_run(dir: &Path) {
    let spec = PipelineSpec::default_pipeline();
    let mut cfg = CollectorConfig::new("127.0.0.1:0", spec.clone(), dir);
    cfg.run_id = Some("analysis-run".into());
    let collector = Collector::start(cfg).unwrap();
    let hops: Vec<(HopId, &str)> = spec
        .hops
        .iter()
        .enumerate()
        .map(|(i, h)| (HopId(h.id.unwrap_or(i as u8)), h.name.as_str()))
        .collect();
    let exporter = |host: &str, hops: &[(HopId, &str)], bound: u64, leap: Leap| {
        let mut c = ExporterConfig::new(collector.local_addr().to_string(), "analysis-test");
        c.host = host.into();
        c.backoff_min = Duration::from_millis(5);
        c.clock = status(bound, leap);
        Exporter::start(c, hops).unwrap()
    };
    let ea = exporter("host-a", &hops[..1], BOUND_A_NS, Leap::None);
    // Host B's clock announces a leap second: a field of clock.parquet and run.json, and
    // a warning of the report.
    let eb = exporter("host-b", &hops[1..], BOUND_B_NS, Leap::Insert);
    // A probe that connects, announces `publish`, sends its (bad) clock and stamps
    // nothing: it is no host of any stage.
    let idle = exporter("bad-host", &hops[..1], 50 * BOUND_A_NS, Leap::None);
    let (ca, cb) = (ManualClock::new(0), ManualClock::new(0));
    let pa = ea.probe_with_clock(hops[0].0, ca.clone()).unwrap();
    let pb: Vec<_> = hops[1..]
        .iter()
        .map(|(h, _)| eb.probe_with_clock(*h, cb.clone()).unwrap())
        .collect();
    for seq in 0..TRACES {
        let s = stamps(seq);
        let mut ctx = TraceContext::new(
            TraceKey {
                publisher: 9,
                stream: (seq % 8) as u32,
                sequence: seq,
            },
            25,
            s[0].map_or(1, |p| p - 50),
        );
        if let Some(p) = s[0] {
            ca.set(p);
            assert!(pa.record(&mut ctx).queued);
        }
        for (i, p) in pb.iter().enumerate() {
            if let Some(ns) = s[i + 1] {
                cb.set(ns);
                assert!(p.record(&mut ctx).queued);
            }
        }
    }
    let entries = (0..8u32)
        .map(|stream| {
            let n = (0..TRACES).filter(|s| s % 8 == u64::from(stream)).count() as u64;
            SentEntry {
                stream,
                messages: n,
                metrics: n * 25,
                first_sequence: u64::from(stream),
                last_sequence: TRACES - 8 + u64::from(stream),
            }
        })
        .collect();
    ea.send_sent_frame(SentFrame {
        publisher: 9,
        entries,
    })
    .unwrap();
    assert!(ea.shutdown().clean);
    assert!(eb.shutdown().clean);
    assert!(idle.shutdown().clean);
    collector.stop().unwrap();
}

/// One run shared by the tests of this file.
fn run_dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("hoptrace-analysis-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        make_run(&dir);
        dir.join("analysis-run")
    })
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn summarise(dir: &Path) -> (Summary, Vec<summary::StageHistograms>) {
    let runs = RunSet::open(&[dir]).unwrap();
    rt().block_on(async {
        let ctx = runs.session().await.unwrap();
        summary::compute(&runs, &ctx).await.unwrap()
    })
}

/// The index of a default hop in [`stamps`].
fn hop_index(hop: &str) -> usize {
    [
        "publish",
        "flow_in",
        "flow_out",
        "store_in",
        "query_start",
        "queryable",
    ]
    .iter()
    .position(|x| *x == hop)
    .unwrap()
}

/// Exact deltas of stage `from -> to` (hop indices), negatives apart.
fn oracle(from: usize, to: usize) -> (Vec<i64>, u64) {
    let mut v = Vec::new();
    let mut negative = 0;
    for seq in 0..TRACES {
        let s = stamps(seq);
        if let (Some(a), Some(b)) = (s[from], s[to]) {
            // Every known delta counts; negative ones are also counted apart.
            negative += u64::from(b < a);
            v.push(b - a);
        }
    }
    v.sort_unstable();
    (v, negative)
}

#[test]
fn every_stage_figure_matches_the_exact_oracle() {
    let (s, _) = summarise(run_dir());
    let idx = hop_index;
    assert_eq!(s.stages.len(), 5);
    for st in &s.stages {
        let (v, negative) = oracle(idx(&st.from), idx(&st.to));
        assert_eq!(st.figures.count, v.len() as u64, "{}", st.name);
        assert_eq!(st.figures.negative, negative, "{}", st.name);
        assert_eq!(st.figures.min_ns, v.first().copied(), "{}", st.name);
        assert_eq!(st.figures.max_ns, v.last().copied(), "{}", st.name);
        let n = v.len() as f64;
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
        let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n;
        assert!(
            (st.figures.mean_ns.unwrap() - mean).abs() <= 1e-9 * mean.abs(),
            "{}",
            st.name
        );
        assert!(
            (st.figures.stddev_ns.unwrap() - var.sqrt()).abs() <= 1e-6 * var.sqrt(),
            "{}",
            st.name
        );
        assert_eq!(st.figures.percentiles.len(), 6);
        for p in &st.figures.percentiles {
            let rank = ((p.quantile * n).ceil() as usize).max(1);
            let exact = v[rank - 1];
            assert!(
                p.value_ns.abs_diff(exact) <= p.precision_ns,
                "{} {}: reported {} ± {}, exact {exact}",
                st.name,
                p.label(),
                p.value_ns,
                p.precision_ns
            );
            assert!(p.precision_ns as f64 <= 0.0005 * exact.unsigned_abs() as f64 + 1.0);
        }
    }
    // The collector's own statistics (run.json) agree with the SQL ones.
    let run = hoptrace_analysis::Run::open(run_dir()).unwrap();
    for (a, b) in s.stages.iter().zip(&run.summary.stages) {
        assert_eq!(
            (
                a.figures.count,
                a.figures.negative,
                a.figures.min_ns,
                a.figures.max_ns
            ),
            (
                b.figures.count,
                b.figures.negative,
                b.figures.min_ns,
                b.figures.max_ns
            )
        );
        for (pa, pb) in a.figures.percentiles.iter().zip(&b.figures.percentiles) {
            assert_eq!(
                (pa.value_ns, pa.precision_ns),
                (pb.value_ns, pb.precision_ns),
                "{}",
                a.name
            );
        }
    }
}

/// The exact median of `v` (sorted here), as the report ranks it.
fn exact_median(mut v: Vec<i64>) -> i64 {
    v.sort_unstable();
    v[((0.5 * v.len() as f64).ceil() as usize).max(1) - 1]
}

#[test]
fn tail_attribution_matches_the_exact_oracle() {
    let (s, _) = summarise(run_dir());
    assert_eq!(s.tails.len(), 1, "only Total Ingestion splits");
    let t = &s.tails[0];
    assert_eq!(t.stage, "Total Ingestion");
    let chain: Vec<usize> = std::iter::once(hop_index(&t.components[0].from))
        .chain(t.components.iter().map(|c| hop_index(&c.to)))
        .collect();
    assert_eq!(chain, [0, 1, 2, 3, 4, 5]);
    // Every message with both ends, its delta and its components.
    let rows: Vec<(u64, i64, Vec<i64>)> = (0..TRACES)
        .filter_map(|seq| {
            let st = stamps(seq);
            let (a, z) = (st[0]?, st[5]?);
            let parts = chain
                .windows(2)
                .map(|w| st[w[1]].unwrap() - st[w[0]].unwrap())
                .collect();
            Some((seq, z - a, parts))
        })
        .collect();
    assert_eq!(t.messages, rows.len() as u64);
    let total = s
        .stages
        .iter()
        .find(|x| x.name == "Total Ingestion")
        .unwrap();
    let mut sorted: Vec<i64> = rows.iter().map(|r| r.1).collect();
    sorted.sort_unstable();
    let labels: Vec<String> = t.levels.iter().map(|l| l.percentile.label()).collect();
    assert_eq!(labels, ["P99", "P99.9"]);
    assert!(
        t.notes.iter().any(|n| n.contains("no P99.99 tail")),
        "{:?}",
        t.notes
    );
    for l in &t.levels {
        let q = l.percentile.quantile;
        assert_eq!(Some(&l.percentile), total.percentile(&l.percentile.label()));
        // The threshold: the lowest value of the HDR bucket of the exact value of rank q.
        let exact = sorted[((q * sorted.len() as f64).ceil() as usize) - 1];
        let h = hoptrace_format::hist::new_histogram();
        assert_eq!(
            l.threshold_ns,
            h.lowest_equivalent(exact as u64) as i64,
            "{}",
            q
        );
        let tail: Vec<&(u64, i64, Vec<i64>)> =
            rows.iter().filter(|r| r.1 >= l.threshold_ns).collect();
        assert_eq!(l.messages, tail.len() as u64);
        assert!(l.messages >= hoptrace_analysis::tail::fewest_in_tail(q, sorted.len() as u64));
        let n = tail.len() as f64;
        let head_mean = tail.iter().map(|r| r.1 as f64).sum::<f64>() / n;
        assert!((l.mean_ns.unwrap() - head_mean).abs() <= 1e-9 * head_mean);
        let mut shares = 0.0;
        for (c, share) in l.components.iter().enumerate() {
            let part: Vec<i64> = tail.iter().map(|r| r.2[c]).collect();
            let mean = part.iter().map(|&x| x as f64).sum::<f64>() / n;
            assert!((share.mean_ns.unwrap() - mean).abs() <= 1e-6 * mean.abs().max(1.0));
            assert!((share.share.unwrap() - mean / head_mean).abs() <= 1e-9);
            shares += share.share.unwrap();
            let m = share.median.unwrap();
            assert!(
                m.value_ns.abs_diff(exact_median(part)) <= m.precision_ns,
                "{c}"
            );
        }
        assert!((shares - 1.0).abs() <= 1e-9, "the shares add up: {shares}");
    }
    // Over all messages, each component over those with its two hops.
    for (c, all) in t.overall.iter().enumerate() {
        let (part, _) = oracle(chain[c], chain[c + 1]);
        let mean = part.iter().map(|&x| x as f64).sum::<f64>() / part.len() as f64;
        assert!((all.mean_ns.unwrap() - mean).abs() <= 1e-6 * mean.abs());
        let m = all.median.unwrap();
        assert!(m.value_ns.abs_diff(exact_median(part)) <= m.precision_ns);
    }
    // The 20 slowest, slowest first, ties in key order, with their timelines.
    let mut slowest = rows.clone();
    slowest.sort_by_key(|r| (std::cmp::Reverse(r.1), r.0 % 8, r.0));
    assert_eq!(t.exemplars.len(), 20);
    for (e, r) in t.exemplars.iter().zip(&slowest) {
        assert_eq!(
            (e.publisher, e.stream, e.sequence),
            (9, (r.0 % 8) as u32, r.0)
        );
        assert_eq!(e.delta_ns, r.1);
        assert_eq!(
            e.components_ns,
            r.2.iter().map(|&x| Some(x)).collect::<Vec<_>>()
        );
        assert_eq!(e.time_unix_ns, stamps(r.0)[0]);
        assert_eq!(e.otel_trace_id, None);
    }
}

/// The README's query for the P99 tail's shares, as written there.
fn readme_tail_query() -> String {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    let start = readme.find("```sql\nSELECT count(*) AS messages,").unwrap() + "```sql\n".len();
    let end = start + readme[start..].find("```").unwrap();
    readme[start..end].to_owned()
}

#[test]
fn the_readmes_query_reproduces_the_p99_tails_shares() {
    let (s, _) = summarise(run_dir());
    let t = &s.tails[0];
    let p99 = &t.levels[0];
    assert_eq!(p99.percentile.label(), "P99");
    let runs = RunSet::open(&[run_dir()]).unwrap();
    rt().block_on(async {
        let ctx = runs.session().await.unwrap();
        let b = hoptrace_analysis::sql::query(&ctx, &readme_tail_query())
            .await
            .unwrap();
        let col = |i: usize| {
            datafusion::arrow::compute::cast(
                b[0].column(i),
                &datafusion::arrow::datatypes::DataType::Float64,
            )
            .unwrap()
            .as_any()
            .downcast_ref::<datafusion::arrow::array::Float64Array>()
            .unwrap()
            .value(0)
        };
        assert_eq!(col(0) as u64, p99.with_components);
        for (i, c) in p99.components.iter().enumerate() {
            let share = c.share.unwrap();
            assert!(
                (col(i + 1) - share).abs() <= 1e-9,
                "{}: {} vs {share}",
                t.components[i].name,
                col(i + 1)
            );
        }
        let q = "SELECT hdr_floor(total_ingestion_ns, 0.99) FROM traces";
        let b = hoptrace_analysis::sql::query(&ctx, q).await.unwrap();
        let floor = b[0]
            .column(0)
            .as_any()
            .downcast_ref::<datafusion::arrow::array::Int64Array>()
            .unwrap()
            .value(0);
        assert_eq!(floor, p99.threshold_ns);
    });
}

/// `tail(stage, q)` holds the report's tail sets, row for row, and `attribution(stage, q)`
/// the report's shares; bad arguments are refused by name.
#[test]
fn the_tail_table_function_holds_the_reports_tails() {
    let (s, _) = summarise(run_dir());
    let t = &s.tails[0];
    let runs = RunSet::open(&[run_dir()]).unwrap();
    rt().block_on(async {
        let ctx = runs.session().await.unwrap();
        let int = |b: &[datafusion::arrow::array::RecordBatch], c: usize| {
            datafusion::arrow::compute::cast(
                b[0].column(c),
                &datafusion::arrow::datatypes::DataType::Int64,
            )
            .unwrap()
            .as_any()
            .downcast_ref::<datafusion::arrow::array::Int64Array>()
            .unwrap()
            .value(0)
        };
        for (level, stage) in t
            .levels
            .iter()
            .zip(["Total Ingestion", "total_ingestion_ns"])
        {
            let q = level.percentile.quantile;
            let b = hoptrace_analysis::sql::query(
                &ctx,
                &format!(
                    "SELECT count(*), min(total_ingestion_ns), \
                     count(*) FILTER (WHERE status = 'complete') FROM tail('{stage}', {q})"
                ),
            )
            .await
            .unwrap();
            assert_eq!(int(&b, 0) as u64, level.messages, "{stage} {q}");
            assert!(int(&b, 1) >= level.threshold_ns);
            assert_eq!(int(&b, 2) as u64, level.with_components);
        }
        // attribution(): the report's figures, component by component.
        let b = hoptrace_analysis::sql::query(
            &ctx,
            "SELECT component, messages, share, share_of_excess, tail_mean_ns, all_mean_ns \
             FROM attribution('Total Ingestion', 0.99) ORDER BY position",
        )
        .await
        .unwrap();
        let b = datafusion::arrow::compute::concat_batches(&b[0].schema(), &b).unwrap();
        let p99 = &t.levels[0];
        assert_eq!(b.num_rows(), t.components.len());
        let float = |c: usize, r: usize| {
            datafusion::arrow::compute::cast(
                b.column(c),
                &datafusion::arrow::datatypes::DataType::Float64,
            )
            .unwrap()
            .as_any()
            .downcast_ref::<datafusion::arrow::array::Float64Array>()
            .unwrap()
            .value(r)
        };
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs().max(1.0);
        for (r, (c, share)) in t.components.iter().zip(&p99.components).enumerate() {
            let name = b
                .column(0)
                .as_any()
                .downcast_ref::<datafusion::arrow::array::StringArray>();
            assert_eq!(name.map(|n| n.value(r)), Some(c.name.as_str()));
            assert_eq!(float(1, r) as u64, p99.with_components);
            assert!(close(float(2, r), share.share.unwrap()), "{}", c.name);
            assert!(
                close(float(3, r), share.share_of_excess.unwrap()),
                "{}",
                c.name
            );
            assert!(close(float(4, r), share.mean_ns.unwrap()), "{}", c.name);
            assert!(
                close(float(5, r), t.overall[r].mean_ns.unwrap()),
                "{}",
                c.name
            );
        }
        // Every column of traces comes along.
        let b = hoptrace_analysis::sql::query(
            &ctx,
            "SELECT publisher, stream, sequence, broker_time_ns, publish_ns \
             FROM tail('total ingestion', 0.99) LIMIT 1",
        )
        .await
        .unwrap();
        assert_eq!(b[0].num_columns(), 5);
        for (bad, needle) in [
            ("tail('Nope', 0.99)", "no stage 'Nope'"),
            ("tail('Total Ingestion', 1.5)", "strictly between 0 and 1"),
            ("tail('Total Ingestion')", "takes a stage's name"),
            ("tail(0.99, 'Total Ingestion')", "takes a stage's name"),
            ("attribution('Nope', 0.99)", "attribution: no stage 'Nope'"),
        ] {
            let e = hoptrace_analysis::sql::query(&ctx, &format!("SELECT * FROM {bad}"))
                .await
                .unwrap_err()
                .to_string();
            assert!(e.contains(needle), "{bad}: {e}");
        }
    });
}

#[test]
fn counts_add_up_and_clock_uncertainty_follows_the_hosts() {
    let (s, hists) = summarise(run_dir());
    let a = &s.accounting;
    let missing = TRACES.div_ceil(50);
    assert_eq!(
        (a.sent, a.complete, a.incomplete, a.unseen),
        (TRACES, TRACES - missing - 1, missing + 1, 0)
    );
    assert_eq!(a.missing_by_hop.get("queryable"), Some(&missing));
    assert_eq!(a.missing_by_hop.get("publish"), Some(&1));
    assert_eq!(a.negative_deltas, TRACES.div_ceil(97));
    assert!(a.adds_up);
    assert_eq!(s.totals.messages, TRACES);
    assert_eq!(s.totals.metrics, TRACES * 25);
    assert_eq!(s.totals.streams, 8);
    let messages: u64 = s.throughput.buckets.iter().map(|b| b.messages).sum();
    assert_eq!(
        messages,
        TRACES - 1,
        "throughput buckets hold every message with a time"
    );
    // The heatmaps place every delta in time but the absurd trace's (it has no time).
    let absurd = stamps(ABSURD_SEQ);
    for (h, st) in hists.iter().zip(&s.stages) {
        let per_time: u64 = h.by_time.iter().map(hdrhistogram::Histogram::len).sum();
        let untimed = absurd[hop_index(&st.from)].is_some() && absurd[hop_index(&st.to)].is_some();
        assert_eq!(per_time + u64::from(untimed), h.whole.len(), "{}", h.name);
    }
    let by = |n: &str| s.stages.iter().find(|x| x.name == n).unwrap();
    // publish is on host A, flow_in on host B: both bounds count.
    assert_eq!(
        by("Broker Time").clock_uncertainty_ns,
        Some(BOUND_A_NS + BOUND_B_NS)
    );
    assert_eq!(
        by("Total Ingestion").clock_uncertainty_ns,
        Some(BOUND_A_NS + BOUND_B_NS)
    );
    assert_eq!(by("Flow Internal").clock_uncertainty_ns, Some(0));
    assert!(
        s.warnings.iter().any(|w| w.contains("negative deltas")),
        "{:?}",
        s.warnings
    );
    assert_eq!(s.environment.hosts.len(), 2);
    // The leap second host B's clock announced: in the report's warnings, naming only B.
    let leaps: Vec<_> = s
        .warnings
        .iter()
        .filter(|w| w.contains("leap second"))
        .collect();
    assert_eq!(leaps.len(), 1, "{:?}", s.warnings);
    assert!(
        leaps[0].starts_with("host-b: ") && leaps[0].contains("insert"),
        "{leaps:?}"
    );
    assert!(
        s.environment
            .idle_probes
            .iter()
            .any(|p| p.starts_with("bad-host/")),
        "{:?}",
        s.environment.idle_probes
    );
}

/// One trace without a publish stamp and with an absurd intended time (1 ns after the
/// epoch): counted and flagged, and the run keeps its true span (20,000 traces 100 µs
/// apart: 2 s), not 56 years.
#[test]
fn an_absurd_intended_time_is_flagged_and_cannot_stretch_the_run() {
    let (s, _) = summarise(run_dir());
    assert_eq!(s.accounting.implausible_traces, 1);
    let span_s = (TRACES - 1) as f64 * 100e-6;
    assert!(
        (s.totals.duration_s - span_s).abs() < 0.01,
        "duration {} s, the stamps span {span_s} s",
        s.totals.duration_s
    );
    assert!(
        s.throughput.buckets.len() <= 3,
        "{} throughput buckets",
        s.throughput.buckets.len()
    );
    // Its row is in the Parquet with flag 16, as the format documents.
    let runs = RunSet::open(&[run_dir()]).unwrap();
    let flagged = rt().block_on(async {
        let ctx = runs.session().await.unwrap();
        let df = ctx
            .sql("SELECT CAST(sequence AS BIGINT) FROM traces WHERE (flags & 16) <> 0")
            .await
            .unwrap();
        df.collect().await.unwrap()
    });
    let rows: usize = flagged.iter().map(|b| b.num_rows()).sum();
    assert_eq!(rows, 1);
    let seq = flagged[0]
        .column(0)
        .as_any()
        .downcast_ref::<datafusion::arrow::array::Int64Array>()
        .map(|a| a.value(0));
    assert_eq!(seq, Some(ABSURD_SEQ as i64));
}

#[test]
fn a_leap_second_announced_by_a_clock_is_a_field_of_run_json_and_clock_parquet() {
    let run: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run_dir().join("run.json")).unwrap()).unwrap();
    let leaps = |host: &str| -> Vec<String> {
        run["clock"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["host"] == host)
            .map(|r| r["leap"].as_str().unwrap().to_owned())
            .collect()
    };
    let (a, b) = (leaps("host-a"), leaps("host-b"));
    assert!(!a.is_empty() && a.iter().all(|l| l == "none"), "{a:?}");
    assert!(!b.is_empty() && b.iter().all(|l| l == "insert"), "{b:?}");
    let runs = RunSet::open(&[run_dir()]).unwrap();
    rt().block_on(async {
        let ctx = runs.session().await.unwrap();
        let q = "SELECT count(*) AS n FROM clock WHERE host = 'host-b' AND leap = 'insert'";
        let batches = hoptrace_analysis::sql::query(&ctx, q).await.unwrap();
        let n = batches[0]
            .column(0)
            .as_any()
            .downcast_ref::<datafusion::arrow::array::Int64Array>()
            .unwrap()
            .value(0);
        assert_eq!(
            n as usize,
            b.len(),
            "clock.parquet holds the leap of every status"
        );
    });
}

#[test]
fn sql_functions_agree_with_the_summary() {
    let (s, _) = summarise(run_dir());
    let runs = RunSet::open(&[run_dir()]).unwrap();
    let total = s
        .stages
        .iter()
        .find(|x| x.name == "Total Ingestion")
        .unwrap();
    let p99 = total.percentile("P99").unwrap();
    rt().block_on(async {
        let ctx = runs.session().await.unwrap();
        let q = "SELECT hdr_percentile(total_ingestion_ns, 0.99) AS v, \
                        hdr_precision(total_ingestion_ns, 0.99) AS p, \
                        hdr_count(hdr_histogram(total_ingestion_ns)) AS n FROM traces";
        let b = hoptrace_analysis::sql::query(&ctx, q).await.unwrap();
        let col = |i: usize| {
            b[0].column(i)
                .as_any()
                .downcast_ref::<datafusion::arrow::array::Int64Array>()
                .unwrap()
                .value(0)
        };
        assert_eq!(col(0), p99.value_ns);
        assert_eq!(col(1) as u64, p99.precision_ns);
        assert_eq!(col(2) as u64, total.figures.count);
        // Per-stream histograms merged give the whole run's percentile.
        let q = "SELECT hdr_value_at(hdr_merge(h), 0.99) AS v FROM \
                 (SELECT stream, hdr_histogram(total_ingestion_ns) AS h FROM traces GROUP BY stream)";
        let b = hoptrace_analysis::sql::query(&ctx, q).await.unwrap();
        let v = b[0]
            .column(0)
            .as_any()
            .downcast_ref::<datafusion::arrow::array::Int64Array>()
            .unwrap()
            .value(0);
        assert_eq!(v, p99.value_ns);
        // The per-metric mean and standard deviation are the weighted ones SQL computes
        // (DataFusion's Float64 sums: equal to a relative 1e-9).
        let m = total.per_metric.as_ref().unwrap();
        let one = |q: String| {
            let ctx = &ctx;
            async move {
                let b = hoptrace_analysis::sql::query(ctx, &q).await.unwrap();
                let c = datafusion::arrow::compute::cast(
                    b[0].column(0),
                    &datafusion::arrow::datatypes::DataType::Float64,
                )
                .unwrap();
                c.as_any()
                    .downcast_ref::<datafusion::arrow::array::Float64Array>()
                    .unwrap()
                    .value(0)
            }
        };
        let w = one("SELECT sum(metric_count) FROM traces WHERE total_ingestion_ns IS NOT NULL".into()).await;
        let mean = one("SELECT sum(CAST(total_ingestion_ns AS DOUBLE) * metric_count) / sum(CAST(metric_count AS DOUBLE)) \
                        FROM traces WHERE total_ingestion_ns IS NOT NULL".into()).await;
        assert_eq!(m.count as f64, w);
        let got = m.mean_ns.unwrap();
        assert!((got - mean).abs() <= 1e-9 * mean.abs(), "{got} vs {mean}");
        let sd = one(format!(
            "SELECT sqrt(sum(metric_count * power(CAST(total_ingestion_ns AS DOUBLE) - {mean}, 2)) / sum(CAST(metric_count AS DOUBLE))) \
             FROM traces WHERE total_ingestion_ns IS NOT NULL"
        ))
        .await;
        let got = m.stddev_ns.unwrap();
        assert!((got - sd).abs() <= 1e-6 * sd, "{got} vs {sd}");
        // Every message of this run carries 25 metrics: per metric and per message agree.
        let per_message = total.figures.mean_ns.unwrap();
        assert!((m.mean_ns.unwrap() - per_message).abs() <= 1e-9 * per_message.abs());
        // Tables over the run.
        let b = hoptrace_analysis::sql::query(&ctx, "SELECT count(*) FROM clock WHERE host = 'host-b'")
            .await
            .unwrap();
        assert!(b[0].num_rows() == 1);
        let b = hoptrace_analysis::sql::query(&ctx, "SELECT sent, complete, adds_up FROM runs")
            .await
            .unwrap();
        assert_eq!(b[0].num_rows(), 1);
    });
}

#[test]
fn bad_queries_and_bad_files_name_what_is_wrong() {
    let runs = RunSet::open(&[run_dir()]).unwrap();
    rt().block_on(async {
        let ctx = runs.session().await.unwrap();
        for (q, needle) in [
            (
                "SELECT hdr_percentile(total_ingestion_ns, 1.5) FROM traces",
                "outside 0..=1",
            ),
            ("SELECT hdr_histogram(status) FROM traces", "nanoseconds"),
            (
                "SELECT hdr_percentile(total_ingestion_ns, stream) FROM traces",
                "constant",
            ),
            (
                "SELECT hdr_value_at(status, 0.5) FROM traces",
                "serialized histogram",
            ),
            ("SELECT no_such_column FROM traces", "no_such_column"),
            // An unknown table names the tables there are.
            (
                "SELECT * FROM trace",
                "the tables are: cells, clock, probes",
            ),
        ] {
            let e = hoptrace_analysis::sql::query(&ctx, q)
                .await
                .unwrap_err()
                .to_string();
            assert!(e.contains(needle), "{q}: {e}");
        }
        // A syntax error is said once: no debug form of the parser's error beside it.
        let e = hoptrace_analysis::sql::query(&ctx, "SELEC 1")
            .await
            .unwrap_err()
            .to_string();
        assert_eq!(e.matches("Expected: an SQL statement").count(), 1, "{e}");
        assert!(!e.contains("ParserError("), "{e}");
    });
    // A truncated part file is named in the error; the run directory is not touched.
    let copy = std::env::temp_dir().join(format!("hoptrace-analysis-bad-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&copy);
    std::fs::create_dir_all(copy.join("traces")).unwrap();
    std::fs::copy(run_dir().join("run.json"), copy.join("run.json")).unwrap();
    let part = std::fs::read_dir(run_dir().join("traces"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let bytes = std::fs::read(&part).unwrap();
    std::fs::write(
        copy.join("traces/part-00000.parquet"),
        &bytes[..bytes.len() / 2],
    )
    .unwrap();
    let runs = RunSet::open(&[&copy]).unwrap();
    let Err(e) = rt().block_on(runs.session()) else {
        panic!("a truncated part file must not read");
    };
    assert!(
        matches!(&e, AnalysisError::BadParquet { path, .. } if path.ends_with("part-00000.parquet")),
        "{e}"
    );
    // Not a run at all.
    let e = RunSet::open(&[copy.join("traces")]).unwrap_err();
    assert!(e.to_string().contains("not a run directory"), "{e}");
    let e = RunSet::open(&[copy.join("nothing-*")]).unwrap_err();
    assert!(e.to_string().contains("no run directories"), "{e}");
    let _ = std::fs::remove_dir_all(&copy);
}

#[test]
fn report_files_and_compare_gates() {
    let (s, hists) = summarise(run_dir());
    let out = std::env::temp_dir().join(format!("hoptrace-analysis-report-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let w = report::write(&out, &s, &hists).unwrap();
    let md = std::fs::read_to_string(&w.markdown).unwrap();
    for needle in [
        "Performance Highlights",
        "Total Ingestion",
        "| P99.99 |",
        "Clock uncertainty",
        "±12.0µs",
        "Counts add up | yes",
        "Latency Heatmaps",
    ] {
        assert!(md.contains(needle), "report.md lacks {needle:?}");
    }
    let html = std::fs::read_to_string(&w.html).unwrap();
    assert!(html.contains("vegaEmbed") && !html.contains("<script src="));
    let back: Summary = serde_json::from_slice(&std::fs::read(&w.summary).unwrap()).unwrap();
    assert_eq!(back.accounting.complete, s.accounting.complete);
    assert_eq!(w.charts.len(), 3 + s.stages.len());

    // A run compared with itself meets a 10 % requirement; an absolute one below its P99
    // fails it.
    let both = [s.clone(), s];
    let ok: compare::Gate = "Total Ingestion.p99 <= +10%".parse().unwrap();
    assert!(
        compare::evaluate(&ok, &both)
            .unwrap()
            .iter()
            .all(|r| !r.failed)
    );
    let strict: compare::Gate = "Total Ingestion.p99 < 1us".parse().unwrap();
    assert!(
        compare::evaluate(&strict, &both)
            .unwrap()
            .iter()
            .all(|r| r.failed)
    );
    let unknown: compare::Gate = "Nope.p99 > 1us".parse().unwrap();
    assert!(compare::evaluate(&unknown, &both).is_err());
    assert!(compare::table(&both).contains("| Total Ingestion | P99 |"));
    let _ = std::fs::remove_dir_all(&out);
}

/// Files that hold a trace key twice never add up, whatever run.json says: here a part
/// file is copied beside itself and run.json made to account for the copy's rows (as
/// recovered ones), so every count of run.json agrees with the rows.
#[test]
fn files_holding_a_key_twice_do_not_add_up() {
    let copy = std::env::temp_dir().join(format!("hoptrace-analysis-twice-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&copy);
    std::fs::create_dir_all(copy.join("traces")).unwrap();
    let mut run: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run_dir().join("run.json")).unwrap()).unwrap();
    let files = run["files"].as_array().unwrap().clone();
    let mut rows = 0;
    for f in &files {
        let name = f["name"].as_str().unwrap();
        std::fs::copy(
            run_dir().join("traces").join(name),
            copy.join("traces").join(name),
        )
        .unwrap();
        rows += f["rows"].as_u64().unwrap();
    }
    let first = files[0]["name"].as_str().unwrap();
    std::fs::copy(
        run_dir().join("traces").join(first),
        copy.join("traces/part-99999.parquet"),
    )
    .unwrap();
    let mut twice = files[0].clone();
    twice["name"] = "part-99999.parquet".into();
    run["files"].as_array_mut().unwrap().push(twice);
    let copied = files[0]["rows"].as_u64().unwrap();
    run["recovered"] =
        serde_json::json!({"files": 0, "rows": copied, "unfinished": [], "corrupt": []});
    std::fs::write(copy.join("run.json"), serde_json::to_vec(&run).unwrap()).unwrap();
    let (s, _) = summarise(&copy);
    let a = &s.accounting;
    assert_eq!(a.complete + a.incomplete, rows + copied);
    assert!(!a.adds_up, "{a:?}");
    assert!(
        a.discrepancies.iter().any(|d| d.contains(&format!(
            "{} rows for {rows} distinct trace keys",
            rows + copied
        ))),
        "{:?}",
        a.discrepancies
    );
    let _ = std::fs::remove_dir_all(&copy);
}

/// A probe is one exporter: a connection of it that stamped nothing (it connected again,
/// and its other connection stamped) is not a probe that stamped nothing; an exporter none
/// of whose connections stamped anything is.
#[test]
fn a_reconnected_probe_is_not_listed_as_one_that_stamped_nothing() {
    let copy = std::env::temp_dir().join(format!("hoptrace-analysis-idle-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&copy);
    let status = std::process::Command::new("cp")
        .arg("-r")
        .arg(run_dir())
        .arg(&copy)
        .status()
        .unwrap();
    assert!(status.success());
    let path = copy.join("run.json");
    let mut run: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let probes = run["probes"].as_array_mut().unwrap();
    let stamping = probes
        .iter()
        .find(|p| {
            p["stamps_by_hop"]
                .as_object()
                .is_some_and(|h| h.values().any(|n| n.as_u64() > Some(0)))
        })
        .unwrap()
        .clone();
    // The same exporter again, its second connection empty; and another exporter, empty.
    let mut again = stamping.clone();
    let mut other = stamping.clone();
    for (p, instance) in [
        (&mut again, stamping["instance_id"].clone()),
        (&mut other, serde_json::json!(1)),
    ] {
        p["instance_id"] = instance;
        for n in p["stamps_by_hop"].as_object_mut().unwrap().values_mut() {
            *n = serde_json::json!(0);
        }
    }
    again["process"] = stamping["process"].clone();
    other["process"] = serde_json::json!("idle-exporter");
    probes.push(again);
    probes.push(other);
    std::fs::write(&path, serde_json::to_vec(&run).unwrap()).unwrap();
    let before = summarise(run_dir()).0.environment.idle_probes;
    let (s, _) = summarise(&copy);
    let idle = &s.environment.idle_probes;
    assert_eq!(
        idle.len(),
        before.len() + 1,
        "{idle:?} (before: {before:?})"
    );
    assert_eq!(
        idle.iter().filter(|p| p.contains("idle-exporter")).count(),
        1,
        "{idle:?}"
    );
    let _ = std::fs::remove_dir_all(&copy);
}
