//! The publisher's per-message hot path: take the next slot of the open-loop schedule,
//! write the payload, build and stamp the trace context, and encode it into each carrier.
//! No broker is involved: this is the cost the publisher adds to every message.
//!
//! The `phase/` benchmarks take the path apart, one step each, in the order a message
//! goes through them (`reports/publisher-bench.md` sets them beside the CPU per message
//! measured against a broker): the schedule, the payload, the trace context (built and
//! stamped, with its clock read), the Kafka headers with and without the context (what a
//! bare message gets instead), and the accounting (what was sent, the schedule lag).

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use hoptrace_probe::carrier::envelope;
use hoptrace_probe::context::MAX_TEXT_LEN;
use hoptrace_probe::{HopId, Stamp, TraceContext, TraceKey};
use hoptrace_publisher::accounting::{LagHistogram, SentLedger};
use hoptrace_publisher::payload::PayloadFormat;
use hoptrace_publisher::schedule::{LoadShape, Schedule};
use rdkafka::message::OwnedHeaders;

fn shape(streams: u32, zipf: f64) -> LoadShape {
    let mut s = LoadShape::uniform(1e12, streams);
    s.zipf_exponent = zipf;
    s
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("publish");
    g.throughput(Throughput::Elements(1));

    for (streams, zipf) in [(1u32, 0.0), (3000, 0.0), (3000, 1.1)] {
        let mut sched = Schedule::new(&shape(streams, zipf)).unwrap();
        g.bench_function(
            format!("schedule_next/{streams}_streams_zipf_{zipf}"),
            |b| {
                b.iter(|| black_box(sched.next_slot()));
            },
        );
    }

    // The whole per-message path for each carrier, without the broker client.
    let mut sched = Schedule::new(&shape(3000, 1.1)).unwrap();
    let mut payload = Vec::with_capacity(4096);
    let mut wire = Vec::with_capacity(4096);
    let mut text = [0u8; MAX_TEXT_LEN];
    let mut ledger = SentLedger::new(1, 3000);
    let mut lag = LagHistogram::new();
    let start_ns = hoptrace_probe::clock::realtime_ns();
    for carrier in ["envelope", "property", "header"] {
        for (format, metrics) in [(PayloadFormat::Json, 1u32), (PayloadFormat::JsonBatch, 20)] {
            let name = format!("message/{carrier}/{metrics}_metrics");
            g.bench_function(name, |b| {
                b.iter(|| {
                    let s = sched.next_slot().unwrap();
                    let intended_ns = start_ns + s.offset_ns as i64;
                    format.write(
                        &mut payload,
                        s.stream,
                        s.sequence,
                        metrics,
                        intended_ns / 1_000_000,
                    );
                    let mut ctx = TraceContext::new(
                        TraceKey {
                            publisher: 1,
                            stream: s.stream,
                            sequence: s.sequence,
                        },
                        metrics,
                        intended_ns,
                    );
                    let stamp = Stamp {
                        hop: HopId(0),
                        ns: hoptrace_probe::clock::realtime_ns(),
                    };
                    let _ = ctx.push_stamp(stamp);
                    match carrier {
                        "envelope" => {
                            wire.clear();
                            envelope::wrap_into(&ctx, &payload, &mut wire);
                            black_box(&wire);
                        }
                        "property" => {
                            black_box(ctx.encode_text(&mut text));
                        }
                        _ => {
                            black_box(ctx.encode());
                        }
                    }
                    ledger.record(s.stream, s.sequence, metrics);
                    lag.record(stamp.ns - intended_ns);
                });
            });
        }
    }
    g.finish();
}

/// The path of one message, a step at a time.
fn phases(c: &mut Criterion) {
    let mut g = c.benchmark_group("phase");
    g.throughput(Throughput::Elements(1));
    let start_ns = hoptrace_probe::clock::realtime_ns();
    let mut sched = Schedule::new(&shape(100, 0.0)).unwrap();
    g.bench_function("schedule", |b| b.iter(|| black_box(sched.next_slot())));
    // The payload alone: its stream, sequence and time change as the schedule's would, but
    // no slot is taken (the schedule is measured above).
    let mut payload = Vec::with_capacity(4096);
    for (format, metrics) in [(PayloadFormat::Json, 1u32), (PayloadFormat::JsonBatch, 50)] {
        let mut n = 0u64;
        g.bench_function(format!("payload/{metrics}_metrics"), |b| {
            b.iter(|| {
                n += 1;
                format.write(
                    &mut payload,
                    (n % 100) as u32,
                    n / 100,
                    metrics,
                    start_ns / 1_000_000 + (n / 1_000) as i64,
                );
                black_box(&payload);
            });
        });
    }
    let key = TraceKey {
        publisher: 1,
        stream: 7,
        sequence: 1_000_000,
    };
    // A bare message's one clock read (its schedule lag) against a traced message's
    // context, built and stamped.
    g.bench_function("clock_read_bare", |b| {
        b.iter(|| black_box(hoptrace_probe::clock::realtime_ns()));
    });
    g.bench_function("context", |b| {
        b.iter(|| {
            let mut ctx = TraceContext::new(black_box(key), 1, start_ns);
            let stamp = Stamp {
                hop: HopId(0),
                ns: hoptrace_probe::clock::realtime_ns(),
            };
            let _ = ctx.push_stamp(stamp);
            black_box(ctx)
        });
    });
    let mut ctx = TraceContext::new(key, 1, start_ns);
    let _ = ctx.push_stamp(Stamp {
        hop: HopId(0),
        ns: start_ns,
    });
    // The Kafka target's headers: a bare record gets an empty list, a traced one the
    // context's binary form (librdkafka copies it).
    g.bench_function("kafka_headers_bare", |b| {
        b.iter(|| black_box(OwnedHeaders::new_with_capacity(1)));
    });
    g.bench_function("kafka_headers_traced", |b| {
        b.iter(|| {
            black_box(hoptrace_probe::carrier::kafka_header::inject(
                black_box(&ctx),
                OwnedHeaders::new_with_capacity(1),
            ))
        });
    });
    let mut ledger = SentLedger::new(1, 100);
    let mut lag = LagHistogram::new();
    let mut n = 0u64;
    g.bench_function("accounting", |b| {
        b.iter(|| {
            n += 1;
            ledger.record((n % 100) as u32, n / 100, 1);
            lag.record(black_box(25_000));
        });
    });
    g.finish();
}

criterion_group!(benches, bench, phases);
criterion_main!(benches);
