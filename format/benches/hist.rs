//! Hot-path benchmark of the report's scan: adding a column of stage deltas to a
//! [`SignedStats`] (exact moments and the HDR counts), for deltas that differ from row to
//! row and for deltas that repeat in runs, as every hop after a processor batch stamps
//! its messages alike. Figures and the machine go to `reports/analysis-bench.md`.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use hoptrace_format::hist::SignedStats;

/// `n` deltas around 350 µs with an exponential spread, from a fixed seed; with
/// `batch_max` above 1 each value repeats for 1..=batch_max rows (uniformly).
fn deltas(n: usize, batch_max: u64) -> Vec<i64> {
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let u = (next() >> 11) as f64 / (1u64 << 53) as f64;
        let v = 130_000 + (-(1.0 - u).ln() * 350_000.0) as i64;
        let run = if batch_max > 1 {
            1 + next() % batch_max
        } else {
            1
        };
        for _ in 0..run {
            out.push(v);
        }
    }
    out.truncate(n);
    out
}

fn add_values(c: &mut Criterion) {
    const ROWS: usize = 8192;
    let mut g = c.benchmark_group("signed_stats_add_values");
    g.throughput(Throughput::Elements(ROWS as u64));
    for (name, batch_max) in [("distinct", 1), ("runs_1_to_24", 24)] {
        let values = deltas(ROWS, batch_max);
        g.bench_function(name, |b| {
            let mut s = SignedStats::default();
            b.iter(|| s.add_values(black_box(&values)));
        });
    }
    g.finish();
}

criterion_group!(benches, add_values);
criterion_main!(benches);
