use super::traffic::{egress_ns, hop_delay_ns};
use super::*;
use std::sync::Mutex;

/// Runs one benchmark at a time: their CPU figures read the whole process.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn out_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "hoptrace-bench-{name}-{}-{}",
        std::process::id(),
        hoptrace_probe::clock::realtime_ns()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn check_all_complete(r: &BenchReport, opts: &BenchOptions) {
    assert_eq!(r.traces, opts.traces, "{r:#?}");
    assert_eq!(r.complete, opts.traces, "{r:#?}");
    assert_eq!(
        (r.incomplete, r.unseen, r.lost_by_probes),
        (0, 0, 0),
        "{r:#?}"
    );
    assert_eq!(r.records, opts.traces * opts.hops as u64, "{r:#?}");
    assert!(r.adds_up, "{r:#?}");
    assert!(r.parquet_bytes > 0 && r.bytes_per_trace > 0.0, "{r:#?}");
    assert!(r.seconds > 0.0 && r.records_per_s > 0.0, "{r:#?}");
    assert!(r.peak_rss_bytes >= r.probe_queue_bytes, "{r:#?}");
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(r.run_dir.join("run.json")).unwrap()).unwrap();
    assert_eq!(json["accounting"]["adds_up"], true);
    assert_eq!(
        json["accounting"]["publishers"][0]["sent"].as_u64(),
        Some(opts.traces)
    );
}

#[test]
fn a_tiny_run_completes_every_trace_and_adds_up() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let opts = BenchOptions {
        traces: 20_000,
        rate: None,
        hops: 4,
        exporters: 2,
        out_dir: out_dir("fast"),
        window_ms: 2_000,
        durable: true,
        checkpoint_interval: None,
        restart: true,
    };
    let r = run(&opts, |_| {}).unwrap();
    check_all_complete(&r, &opts);
    assert_eq!(r.max_behind_schedule_s, 0.0);
    // Durable throughout: nothing evicted, every record in the log.
    assert_eq!(r.evicted_by_probes, 0, "{r:#?}");
    assert!(r.log_bytes_per_record > 36.0, "{r:#?}");
    // A collector killed at the end would have lost nothing.
    let restart = r.restart.as_ref().expect("a restart was measured");
    assert_eq!(restart.complete, opts.traces, "{r:#?}");
    assert_eq!(restart.records_held, r.records, "{r:#?}");
    assert!(restart.adds_up, "{r:#?}");
    std::fs::remove_dir_all(&opts.out_dir).unwrap();
}

#[test]
fn a_paced_run_with_three_exporters_completes_every_trace() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let opts = BenchOptions {
        traces: 30_000,
        rate: Some(20_000),
        hops: 5,
        exporters: 3,
        out_dir: out_dir("paced"),
        window_ms: 2_000,
        durable: false,
        checkpoint_interval: None,
        restart: false,
    };
    let mut calls = 0;
    let r = run(&opts, |p| {
        calls += 1;
        assert!(p.traces_done <= opts.traces);
    })
    .unwrap();
    check_all_complete(&r, &opts);
    // 30k traces at 20k/s take at least 1.5 s, and progress is reported each second.
    assert!(r.generation_seconds >= 1.4, "{r:#?}");
    assert!(calls >= 1);
    std::fs::remove_dir_all(&opts.out_dir).unwrap();
}

#[test]
fn options_out_of_range_are_refused() {
    let base = BenchOptions {
        traces: 10,
        out_dir: out_dir("refused"),
        ..BenchOptions::default()
    };
    for bad in [
        BenchOptions {
            traces: 0,
            ..base.clone()
        },
        BenchOptions {
            rate: Some(0),
            ..base.clone()
        },
        BenchOptions {
            hops: 1,
            exporters: 1,
            ..base.clone()
        },
        BenchOptions {
            hops: 17,
            ..base.clone()
        },
        BenchOptions {
            exporters: 5,
            ..base.clone()
        },
        BenchOptions {
            exporters: 0,
            ..base.clone()
        },
        BenchOptions {
            window_ms: 0,
            ..base.clone()
        },
    ] {
        assert!(
            matches!(run(&bad, |_| {}), Err(BenchError::Options(_))),
            "{bad:?}"
        );
    }
    std::fs::remove_dir_all(&base.out_dir).unwrap();
}

#[test]
fn hops_are_split_contiguously_and_stamps_follow_the_model() {
    assert_eq!(partition(4, 2), vec![0..2, 2..4]);
    assert_eq!(partition(5, 3), vec![0..1, 1..3, 3..5]);
    assert_eq!(partition(4, 4), vec![0..1, 1..2, 2..3, 3..4]);
    let spec = pipeline(4, 10_000).resolve().unwrap();
    let stages: Vec<&str> = spec.stages().iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        stages,
        ["h0 -> h1", "h1 -> h2", "h2 -> h3", "total (h0 -> h3)"]
    );
    let n = 100_000u64;
    let mut sum = [0f64; 4];
    for t in 0..n {
        assert!((150..2_000).contains(&egress_ns(t)));
        for (h, s) in sum.iter_mut().enumerate().skip(1) {
            let d = hop_delay_ns(t, h);
            assert!((3_000..=20_003_000).contains(&d));
            *s += d as f64;
        }
    }
    // Exponential means of 400 µs, 60 µs and 1.2 ms, plus 3 µs, within 2 %.
    for (h, mean) in [(1, 403_000.0), (2, 63_000.0), (3, 1_203_000.0)] {
        let got = sum[h] / n as f64;
        assert!((got / mean - 1.0).abs() < 0.02, "hop {h}: mean {got}");
    }
    let entries = sent_entries(6_001);
    assert_eq!(entries.len(), 3000);
    assert_eq!(entries.iter().map(|e| e.messages).sum::<u64>(), 6_001);
    assert_eq!((entries[0].messages, entries[0].last_sequence), (3, 2));
    assert_eq!(entries[1].messages, 2);
}

/// The measured runs: `HOPTRACE_BENCH_TRACES` (e.g. `10M`), `HOPTRACE_BENCH_RATE`
/// (traces/s; unset = as fast as possible), `HOPTRACE_BENCH_HOPS` (4),
/// `HOPTRACE_BENCH_EXPORTERS` (2), `HOPTRACE_BENCH_WINDOW_MS` (10000),
/// `HOPTRACE_BENCH_OUT` (a temporary directory, removed afterwards unless set).
#[test]
#[ignore = "a long benchmark; run with --release -- --ignored --nocapture"]
fn bench_from_env() {
    fn var(name: &str) -> Option<String> {
        std::env::var(format!("HOPTRACE_BENCH_{name}")).ok()
    }
    fn count(s: &str) -> u64 {
        let (num, mult) = match s.trim().as_bytes().last() {
            Some(b'k' | b'K') => (&s[..s.len() - 1], 1e3),
            Some(b'M') => (&s[..s.len() - 1], 1e6),
            Some(b'G') => (&s[..s.len() - 1], 1e9),
            _ => (s, 1.0),
        };
        (num.trim().parse::<f64>().expect("a count like 10M") * mult) as u64
    }
    let keep = var("OUT").is_some();
    let opts = BenchOptions {
        traces: var("TRACES").map_or(1_000_000, |s| count(&s)),
        rate: var("RATE").map(|s| count(&s)),
        hops: var("HOPS").map_or(4, |s| count(&s) as usize),
        exporters: var("EXPORTERS").map_or(2, |s| count(&s) as usize),
        out_dir: var("OUT").map_or_else(|| out_dir("env"), PathBuf::from),
        window_ms: var("WINDOW_MS").map_or(10_000, |s| count(&s)),
        durable: var("NO_LOG").is_none(),
        checkpoint_interval: None,
        restart: false,
    };
    eprintln!("{opts:?}");
    let r = run(&opts, |p| {
        eprintln!(
            "{:6.1} s  {:>11} records  {:>10.0} rec/s  {:>10} traces done  pending {:>8}  lost {}  rss {:.0} MiB  join est {:.0} MiB  ETA {}",
            p.elapsed_s,
            p.records,
            p.records_per_s,
            p.traces_done,
            p.pending,
            p.lost_by_probes,
            p.rss_bytes as f64 / 1048576.0,
            p.join_memory_estimate_bytes as f64 / 1048576.0,
            p.eta_s.map_or_else(|| "-".into(), |s| format!("{s:.0} s")),
        );
    })
    .unwrap();
    println!("{}", serde_json::to_string_pretty(&r).unwrap());
    if !keep {
        std::fs::remove_dir_all(&opts.out_dir).unwrap();
    }
}
