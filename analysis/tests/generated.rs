//! A run from the collector's generator (the one `hoptrace bench report` times), read back
//! by the analysis with its counts and figures.

use hoptrace_analysis::{RunSet, summary};
use hoptrace_collector::generate::{FLOORS_NS, GenerateOptions, generate, remove};

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
