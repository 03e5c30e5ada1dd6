//! The bounds of stages at a polled hop, over a real run whose stamps are known here: every
//! bound figure against an exact oracle, the stage between one poll's two stamps exact,
//! and the decisions (service levels, requirements) met, failed or undecided as the
//! bounds say.

use std::time::Duration;

use hoptrace_analysis::bounds::Decision;
use hoptrace_analysis::summary::{self, StageSummary};
use hoptrace_analysis::{RunSet, compare};
use hoptrace_collector::{Collector, CollectorConfig};
use hoptrace_format::spec::PipelineSpec;
use hoptrace_probe::clock::{ClockSource, ClockStatus};
use hoptrace_probe::testing::ManualClock;
use hoptrace_probe::{ClockReporting, Exporter, ExporterConfig, HopId, TraceContext, TraceKey};
use hoptrace_protocol::{SentEntry, SentFrame};

const TRACES: u64 = 5_000;

const SPEC: &str = r#"name = "polled"

[[hops]]
name = "publish"

[[hops]]
name = "query_start"

[[hops]]
name = "queryable"
earliest = "queryable_earliest"

[[hops]]
name = "queryable_earliest"

[[hops]]
name = "seen"

[[stages]]
name = "Total"
from = "publish"
to = "queryable"
definition = "publish to queryable"
headline = true

[[stages]]
name = "Query"
from = "query_start"
to = "queryable"
definition = "the poll that found it"

[[stages]]
name = "Read"
from = "queryable"
to = "seen"
definition = "queryable to a reader's sight"
"#;

/// The stamps of trace `seq`: publish, query_start, queryable, earliest, seen.
fn stamps(seq: u64, base: i64) -> [i64; 5] {
    let mut x = seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut r = |m: u64| {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((x >> 33) % m) as i64
    };
    let publish = base + seq as i64 * 100_000;
    let earliest = publish + 1_000_000 + r(20_000_000);
    let queryable = earliest + 1 + r(15_000_000);
    let query_start = queryable - 500_000 - r(1_000_000);
    let seen = queryable + r(3_000_000);
    [publish, query_start, queryable, earliest, seen]
}

fn make_run(dir: &std::path::Path) -> (Vec<[i64; 5]>, std::path::PathBuf) {
    let spec = PipelineSpec::from_toml_str(SPEC).unwrap();
    let mut cfg = CollectorConfig::new("127.0.0.1:0", spec.clone(), dir);
    cfg.run_id = Some("polled".into());
    let collector = Collector::start(cfg).unwrap();
    let hops: Vec<(HopId, &str)> = spec
        .hops
        .iter()
        .enumerate()
        .map(|(i, h)| (HopId(i as u8), h.name.as_str()))
        .collect();
    // One host, its clock exact: the bounds are the polled stamps' alone.
    let exporter = |hops: &[(HopId, &str)], process: &str| {
        let mut c = ExporterConfig::new(collector.local_addr().to_string(), process);
        c.host = "host".into();
        c.backoff_min = Duration::from_millis(5);
        c.clock = ClockReporting::Fixed(ClockStatus {
            source: ClockSource::Injected,
            synced: true,
            error_bound_ns: 0,
            ..ClockStatus::default()
        });
        Exporter::start(c, hops).unwrap()
    };
    // The publisher, the tap (query_start, queryable, earliest: one connection) and a
    // reader.
    let ep = exporter(&hops[..1], "publisher");
    let et = exporter(&hops[1..4], "tap");
    let er = exporter(&hops[4..], "reader");
    let clock = ManualClock::new(0);
    let probe = |e: &Exporter, h: u8| e.probe_with_clock(HopId(h), clock.clone()).unwrap();
    let probes = [
        probe(&ep, 0),
        probe(&et, 1),
        probe(&et, 2),
        probe(&et, 3),
        probe(&er, 4),
    ];
    let now = hoptrace_probe::clock::realtime_ns();
    let base = now - now % 1_000_000_000 - 30_000_000_000;
    let mut all = Vec::new();
    for seq in 0..TRACES {
        let s = stamps(seq, base);
        let mut ctx = TraceContext::new(
            TraceKey {
                publisher: 4,
                stream: 0,
                sequence: seq,
            },
            1,
            s[0],
        );
        for (p, ns) in probes.iter().zip(s) {
            clock.set(ns);
            assert!(p.record(&mut ctx).queued);
        }
        all.push(s);
    }
    ep.send_sent_frame(SentFrame {
        publisher: 4,
        entries: vec![SentEntry {
            stream: 0,
            messages: TRACES,
            metrics: TRACES,
            first_sequence: 0,
            last_sequence: TRACES - 1,
        }],
    })
    .unwrap();
    for e in [ep, et, er] {
        assert!(e.shutdown().clean);
    }
    collector.stop().unwrap();
    (all, dir.join("polled"))
}

/// The value of rank `max(1, ceil(q n))` of `v`.
fn exact(v: &mut [i64], q: f64) -> i64 {
    v.sort_unstable();
    let r = ((q * v.len() as f64).ceil() as usize).max(1);
    v[r - 1]
}

fn check(name: &str, f: &hoptrace_analysis::bounds::BoundFigures, mut values: Vec<i64>) {
    assert_eq!(f.count, values.len() as u64, "{name}");
    assert_eq!(f.min_ns, values.iter().copied().min(), "{name}");
    assert_eq!(f.max_ns, values.iter().copied().max(), "{name}");
    let mean = values.iter().map(|&v| v as f64).sum::<f64>() / values.len() as f64;
    assert!((f.mean_ns.unwrap() - mean).abs() < 1e-3, "{name}");
    for p in &f.percentiles {
        let e = exact(&mut values, p.quantile);
        assert!(
            p.value_ns.abs_diff(e) <= p.precision_ns,
            "{name} {}: {} ± {} against the exact {e}",
            p.label(),
            p.value_ns,
            p.precision_ns
        );
    }
}

#[test]
fn a_polled_hop_bounds_every_figure_of_its_stages() {
    let dir = std::env::temp_dir().join(format!("hoptrace-bounds-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (stamps, run) = make_run(&dir);
    let runs = RunSet::open(&[&run]).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (s, _) = rt
        .block_on(async {
            let ctx = runs.session().await?;
            summary::compute(&runs, &ctx).await
        })
        .unwrap();
    let stage = |n: &str| -> &StageSummary { s.stages.iter().find(|st| st.name == n).unwrap() };

    // Total ends at the polled hop: from its earliest instant (lower) to its stamp (upper).
    let total = stage("Total");
    let b = total.bounds.as_ref().expect("Total has bounds");
    assert_eq!(b.polled, ["queryable"]);
    assert_eq!(
        b.lower_hops,
        ("publish".into(), "queryable_earliest".into())
    );
    assert_eq!(b.upper_hops, ("publish".into(), "queryable".into()));
    check(
        "Total lower",
        &b.lower,
        stamps.iter().map(|s| s[3] - s[0]).collect(),
    );
    check(
        "Total upper",
        &b.upper,
        stamps.iter().map(|s| s[2] - s[0]).collect(),
    );
    // Read starts there: from its stamp (lower) to its earliest instant (upper).
    let read = stage("Read").bounds.as_ref().expect("Read has bounds");
    check(
        "Read lower",
        &read.lower,
        stamps.iter().map(|s| s[4] - s[2]).collect(),
    );
    check(
        "Read upper",
        &read.upper,
        stamps.iter().map(|s| s[4] - s[3]).collect(),
    );
    // One poll's send and response: exact.
    assert!(stage("Query").bounds.is_none());

    // Decisions: a limit between the bounds of the P99 is undecided, beyond them decided.
    let (lo, hi) = total.stat_interval("p99", false).unwrap();
    assert!(lo < hi);
    let ms = |ns: f64| format!("{}us", (ns / 1e3).round() as i64);
    for (limit, want) in [
        (hi + 1_000.0, Decision::Met),
        ((lo + hi) / 2.0, Decision::Undecided),
        (lo - 1_000.0, Decision::Failed),
    ] {
        let gate: compare::Gate = format!("Total.p99 < {}", ms(limit)).parse().unwrap();
        assert_eq!(gate.met_by(&s.stages).unwrap(), want, "{}", gate.text);
    }
    // A run against itself with a relative requirement: its own bounds make a 0 % change
    // undecided, a wide margin met.
    let both = [s.clone(), s.clone()];
    let r: compare::Gate = "Total.p99 <= +0%".parse().unwrap();
    assert_eq!(
        compare::evaluate(&r, &both).unwrap()[0].decision,
        Decision::Undecided
    );
    let r: compare::Gate = "Total.p99 <= +1000%".parse().unwrap();
    assert_eq!(
        compare::evaluate(&r, &both).unwrap()[0].decision,
        Decision::Met
    );
    std::fs::remove_dir_all(&dir).ok();
}
