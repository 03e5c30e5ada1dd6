//! A run from the collector's generator (the one `hoptrace bench report` times), read back
//! by the analysis with its counts and figures.

use hoptrace_analysis::{RunSet, summary};
use hoptrace_collector::generate::{FLOORS_NS, GenerateOptions, generate, remove};

#[test]
fn a_generated_run_is_read_back_with_its_counts() {
    let dir = std::env::temp_dir().join(format!("hoptrace-gen-{}", std::process::id()));
    let mut o = GenerateOptions::new(25_000, &dir, "gen");
    o.rows_per_file = 10_000;
    let g = generate(&o, |_| {}).unwrap();
    assert_eq!((g.traces, g.files), (25_000, 3));
    let runs = RunSet::open(&[&g.run_dir]).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let (s, _) = rt
        .block_on(async {
            let ctx = runs.session().await?;
            summary::compute(&runs, &ctx).await
        })
        .unwrap();
    let a = &s.accounting;
    assert_eq!((a.sent, a.complete, a.incomplete), (25_000, 24_998, 2));
    assert!(a.adds_up, "{a:?}");
    let total = s
        .stages
        .iter()
        .find(|x| x.name == "Total Ingestion")
        .unwrap();
    assert_eq!(total.count, 24_998);
    // The delays' floors add up to the smallest possible total.
    let floor: i64 = FLOORS_NS[1..].iter().sum();
    assert!(total.min_ns.unwrap() >= floor);
    let p50 = total.percentiles.iter().find(|p| p.label == "P50").unwrap();
    assert!((1_500_000..4_000_000).contains(&p50.value_ns), "{p50:?}");
    remove(&g.run_dir).unwrap();
}
