//! A run continued by a second collector (`collect --run-id ID --continue`, or the same
//! command after a collector was killed without its log): the part files of the first
//! are kept, and their keys are written already. A late stamp for one of them is a late
//! record, never a second row, and its message is recovered, not unseen.

mod common;

use std::path::Path;

use arrow::array::AsArray as _;
use arrow::datatypes::UInt64Type;
use hoptrace_collector::{Collector, CollectorConfig, RunSummary};
use hoptrace_format::spec::PipelineSpec;
use hoptrace_probe::{TraceContext, TraceKey};
use hoptrace_protocol::{SentEntry, SentFrame};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

const PUBLISHER: u16 = 5;

fn base_ns() -> i64 {
    hoptrace_probe::clock::realtime_ns() - 30_000_000_000
}

/// One collector session on run `id`: `hops` of each key in `keys` (all six when `None`),
/// then a Sent frame saying `sent` messages over sequences `0..sent`.
fn session(dir: &Path, durable: bool, traces: &[(u64, Option<usize>)], sent: u64) -> RunSummary {
    let spec = PipelineSpec::default_pipeline();
    let mut cfg = CollectorConfig::new("127.0.0.1:0", spec.clone(), dir);
    cfg.run_id = Some("continued".into());
    cfg.durable = durable;
    let collector = Collector::start(cfg).unwrap();
    let (exporter, probes, clock) =
        common::manual_probes(&spec, collector.local_addr(), "continued-test");
    let base = base_ns();
    for &(seq, only) in traces {
        let t = base + seq as i64 * 1_000;
        let mut ctx = TraceContext::new(
            TraceKey {
                publisher: PUBLISHER,
                stream: 1,
                sequence: seq,
            },
            10,
            t,
        );
        let which: Vec<usize> = only.map_or_else(|| (0..probes.len()).collect(), |h| vec![h]);
        for i in which {
            clock.set(t + i as i64 * 1_000);
            assert!(probes[i].record(&mut ctx).queued);
        }
    }
    exporter
        .send_sent_frame(SentFrame {
            publisher: PUBLISHER,
            entries: vec![SentEntry {
                stream: 1,
                messages: sent,
                metrics: sent * 10,
                first_sequence: 0,
                last_sequence: sent - 1,
            }],
        })
        .unwrap();
    let s = exporter.shutdown();
    assert!(s.clean && s.counters.lost() == 0, "{s:?}");
    collector.stop().unwrap()
}

/// Every sequence in the run's part files, one per row.
fn sequences(run: &Path) -> Vec<u64> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(run.join("traces")).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !(name.starts_with("part-") && name.ends_with(".parquet")) {
            continue;
        }
        let file = std::fs::File::open(e.path()).unwrap();
        for batch in ParquetRecordBatchReaderBuilder::try_new(file)
            .unwrap()
            .build()
            .unwrap()
        {
            let batch = batch.unwrap();
            let seq = batch
                .column_by_name("sequence")
                .unwrap()
                .as_primitive::<UInt64Type>();
            out.extend((0..seq.len()).map(|i| seq.value(i)));
        }
    }
    out.sort_unstable();
    out
}

/// `closed_state`: the first collector's state at its close is there for the second to
/// take up (a clean close); without it, the second finds only the first's part files (a
/// collector killed without its log, or a run of an older collector).
fn check(durable: bool, closed_state: bool) {
    let dir = std::env::temp_dir().join(format!(
        "hoptrace-continued-{}-{durable}-{}",
        std::process::id(),
        hoptrace_probe::clock::realtime_ns()
    ));
    // First collector: 100 complete messages.
    let first: Vec<(u64, Option<usize>)> = (0..100).map(|s| (s, None)).collect();
    let one = session(&dir, durable, &first, 100);
    assert!(one.accounting.adds_up, "{:?}", one.accounting.discrepancies);
    let state = dir.join("continued").join("closed.checkpoint");
    assert!(state.is_file(), "a clean close keeps the run's state");
    if !closed_state {
        std::fs::remove_file(&state).unwrap();
    }
    // Second collector on the same run: a late flow_in stamp for message 7 (its trace is
    // in the first collector's files), and 50 new messages; the publisher has sent 152.
    let mut second: Vec<(u64, Option<usize>)> = vec![(7, Some(2))];
    second.extend((100..150).map(|s| (s, None)));
    let two = session(&dir, durable, &second, 152);
    let run = dir.join("continued");
    let seqs = sequences(&run);
    assert_eq!(
        seqs.iter().filter(|s| **s == 7).count(),
        1,
        "a second row for a key of the kept files"
    );
    assert_eq!(seqs.len(), 150);
    let a = &two.accounting;
    assert_eq!(a.late_records, 1, "{a:?}");
    let p = a
        .publishers
        .iter()
        .find(|p| p.publisher == PUBLISHER)
        .unwrap();
    if closed_state {
        // The run goes on: 150 complete (100 of them the first collector's), 2 never seen.
        assert_eq!(
            (p.sent, p.complete, p.incomplete, p.recovered, p.unseen),
            (152, 150, 0, 0, 2),
            "{p:?}"
        );
        assert_eq!(two.recovered, None);
        // The first collector's probe connection is still the run's.
        assert_eq!(two.probes.len(), 2, "{:?}", two.probes);
        let total = two.stages.iter().map(|s| s.figures.count).max();
        assert_eq!(total, Some(150), "{:?}", two.stages);
    } else {
        // 100 recovered (the first collector's), 50 complete, 2 never seen.
        assert_eq!(
            (p.sent, p.complete, p.incomplete, p.recovered, p.unseen),
            (152, 50, 0, 100, 2),
            "{p:?}"
        );
        assert_eq!(two.recovered.as_ref().map(|r| r.rows), Some(100));
    }
    assert!(a.adds_up, "{:?}", a.discrepancies);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_late_stamp_for_a_key_of_the_kept_files_is_late_not_a_second_row() {
    check(true, true);
    check(true, false);
}

#[test]
fn the_same_without_the_write_ahead_log() {
    check(false, true);
    check(false, false);
}
