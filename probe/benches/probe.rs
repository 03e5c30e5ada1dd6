//! Hot-path benchmarks of the probe: stamp, stamp+report, and each carrier's encode and
//! decode. Figures and the machine they ran on go to `reports/probe-bench.md`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use hoptrace_probe::LocalQueue;
use hoptrace_probe::carrier::envelope;
use hoptrace_probe::{HopId, Stamp, TraceContext, TraceKey};

fn ctx() -> TraceContext {
    let mut c = TraceContext::new(
        TraceKey {
            publisher: 1,
            stream: 1234,
            sequence: 987_654,
        },
        50,
        1_700_000_000_000_000_000,
    );
    for h in 0..3 {
        c.push_stamp(Stamp {
            hop: HopId(h),
            ns: 1_700_000_000_000_000_000 + i64::from(h) * 1000,
        })
        .unwrap();
    }
    c
}

/// Times `iters` calls of `f`, draining the queue outside the timed region whenever it
/// is half full, so every timed call is a successful enqueue.
fn timed_with_drain(q: &LocalQueue, iters: u64, mut f: impl FnMut()) -> Duration {
    const CHUNK: u64 = 1 << 19;
    let mut total = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let n = left.min(CHUNK);
        let t = Instant::now();
        for _ in 0..n {
            f();
        }
        total += t.elapsed();
        q.drain(usize::MAX, |r| {
            black_box(r);
        });
        left -= n;
    }
    assert_eq!(q.counters().queue_full, 0, "a timed call hit a full queue");
    total
}

fn hot_path(c: &mut Criterion) {
    let q = LocalQueue::new(1 << 20);
    let p = q.probe(HopId(3));
    let mut g = c.benchmark_group("probe");
    g.throughput(Throughput::Elements(1));
    g.bench_function("clock_realtime", |b| {
        b.iter(|| black_box(hoptrace_probe::clock::realtime_ns()));
    });
    g.bench_function("stamp", |b| {
        let base = ctx();
        b.iter_custom(|iters| {
            let mut c = base;
            let t = Instant::now();
            for i in 0..iters {
                if i.is_multiple_of(12) {
                    c = base;
                }
                black_box(p.stamp(black_box(&mut c)));
            }
            t.elapsed()
        });
    });
    g.bench_function("report", |b| {
        let mut c = ctx();
        let s = p.stamp(&mut c);
        b.iter_custom(|iters| {
            timed_with_drain(&q, iters, || {
                black_box(p.report_stamp(black_box(&c), s.ns));
            })
        });
    });
    g.bench_function("stamp_and_report", |b| {
        let base = ctx();
        let mut c = base;
        let mut i = 0u32;
        b.iter_custom(|iters| {
            timed_with_drain(&q, iters, || {
                i += 1;
                if i.is_multiple_of(12) {
                    c = base;
                }
                black_box(p.record(black_box(&mut c)));
            })
        });
    });
    g.finish();
}

fn carriers(c: &mut Criterion) {
    let ctx = ctx();
    let mut g = c.benchmark_group("carrier");
    g.throughput(Throughput::Elements(1));
    g.bench_function("binary_encode", |b| {
        b.iter(|| black_box(black_box(&ctx).encode()))
    });
    let bin = ctx.to_bytes();
    g.bench_function("binary_decode", |b| {
        b.iter(|| black_box(TraceContext::decode(black_box(&bin))))
    });
    g.bench_function("text_encode", |b| {
        let mut buf = [0u8; hoptrace_probe::context::MAX_TEXT_LEN];
        b.iter(|| black_box(black_box(&ctx).encode_text(&mut buf).len()));
    });
    let text = ctx.to_text();
    g.bench_function("text_decode", |b| {
        b.iter(|| black_box(TraceContext::decode_text(black_box(&text))))
    });
    let payload = [b'x'; 100];
    let mut out = Vec::with_capacity(512);
    g.bench_function("envelope_wrap_100B", |b| {
        b.iter(|| {
            out.clear();
            envelope::wrap_into(black_box(&ctx), black_box(&payload), &mut out);
            black_box(out.len())
        })
    });
    let msg = envelope::wrap(&ctx, &payload);
    g.bench_function("envelope_unwrap_100B", |b| {
        b.iter(|| {
            black_box(envelope::unwrap(black_box(&msg)).map(|(e, p)| (e.context.key, p.len())))
        })
    });
    g.finish();
}

criterion_group!(benches, hot_path, carriers);
criterion_main!(benches);
