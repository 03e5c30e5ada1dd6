//! The fuzz targets' properties (`probe/fuzz/checks.rs`) over a generated corpus, in every
//! test run on stable Rust: every test vector and valid frame, and hundreds of thousands of
//! mutations of them (bit flips, truncations, extensions, lying length and count fields,
//! splices of two inputs). `infra/test.sh` also runs the coverage-guided fuzzers for a
//! bounded time where a nightly toolchain is available.

use hoptrace_probe::{ClockStatus, HopId, OtelTraceId, TraceKey};
use hoptrace_protocol::{
    CountersFrame, Frame, Hello, PROTOCOL_VERSION, Record, SentEntry, SentFrame,
};

include!("../fuzz/checks.rs");

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// A mutation of `seed`, or a splice with `other`.
fn mutate(rng: &mut Rng, seed: &[u8], other: &[u8]) -> Vec<u8> {
    let mut b = seed.to_vec();
    for _ in 0..1 + rng.below(4) {
        match rng.below(8) {
            0 | 1 if !b.is_empty() => {
                let i = rng.below(b.len());
                b[i] ^= 1 << rng.below(8);
            }
            2 if !b.is_empty() => {
                let i = rng.below(b.len());
                b[i] = [0, 1, 0x7f, 0x80, 0xff][rng.below(5)];
            }
            3 => b.truncate(rng.below(b.len() + 1)),
            4 => b.extend((0..rng.below(40)).map(|_| rng.next() as u8)),
            5 if b.len() >= 4 => {
                // A length or count field that lies.
                let i = rng.below(b.len() - 3);
                let v = [
                    0u32,
                    1,
                    27,
                    28,
                    188,
                    189,
                    0xffff,
                    1 << 20,
                    (1 << 20) + 1,
                    u32::MAX,
                ][rng.below(10)];
                b[i..i + 4].copy_from_slice(&v.to_le_bytes());
            }
            6 => {
                let cut = rng.below(other.len() + 1);
                b.extend_from_slice(&other[cut..]);
            }
            _ => {
                if !b.is_empty() {
                    let i = rng.below(b.len());
                    b.remove(i);
                }
            }
        }
    }
    b
}

fn vectors() -> serde_json::Value {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/testdata/trace-vectors.json"
    ))
    .unwrap();
    serde_json::from_str(&text).unwrap()
}

fn context_seeds() -> Vec<Vec<u8>> {
    let v = vectors();
    let mut seeds = Vec::new();
    for e in v["valid"].as_array().unwrap() {
        seeds.push(hex::decode(e["binary_hex"].as_str().unwrap()).unwrap());
        seeds.push(e["text"].as_str().unwrap().as_bytes().to_vec());
        seeds.push(hex::decode(e["envelope_hex"].as_str().unwrap()).unwrap());
    }
    for e in v["invalid"].as_array().unwrap() {
        if let Some(h) = e["input_hex"].as_str() {
            seeds.push(hex::decode(h).unwrap());
        }
        if let Some(t) = e["input_text"].as_str() {
            seeds.push(t.as_bytes().to_vec());
        }
    }
    seeds.push(b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".to_vec());
    seeds
}

fn frame_seeds() -> Vec<Vec<u8>> {
    let rec = |hop: u8, id: bool| Record {
        key: TraceKey {
            publisher: 3,
            stream: 7,
            sequence: 11,
        },
        hop: HopId(hop),
        stamp_ns: 1_700_000_000_000_000_000,
        metric_count: 5,
        intended_ns: -3,
        otel_trace_id: id.then_some(OtelTraceId([9; 16])),
    };
    let frames = [
        Frame::Hello(Hello {
            version: PROTOCOL_VERSION,
            instance_id: 42,
            host: "h".into(),
            process: "p".into(),
            software: "s".into(),
            token: "t".into(),
            hops: vec![(HopId(0), "publish".into()), (HopId(7), "é".into())],
        }),
        Frame::Records(vec![rec(0, false), rec(1, true), rec(2, false)]),
        Frame::Clock(ClockStatus {
            at_ns: 5,
            detail: "chrony".into(),
            ..ClockStatus::default()
        }),
        Frame::Counters(CountersFrame {
            at_ns: 1,
            values: vec![(1, 10), (2, 0), (99, 7)],
        }),
        Frame::Sent(SentFrame {
            publisher: 3,
            entries: vec![SentEntry {
                stream: 7,
                messages: 12,
                metrics: 60,
                first_sequence: 0,
                last_sequence: 11,
            }],
        }),
        Frame::Goodbye,
        Frame::Welcome {
            version: PROTOCOL_VERSION,
            run_id: "run".into(),
            resume_seq: 7,
        },
        Frame::Welcome {
            version: 1,
            run_id: "run".into(),
            resume_seq: 0,
        },
        Frame::SeqRecords {
            seq: 3,
            records: vec![rec(0, false), rec(1, true)],
        },
        Frame::Ack { seq: 3 },
        Frame::Reject {
            code: 3,
            reason: "no".into(),
        },
    ];
    let one: Vec<Vec<u8>> = frames.iter().map(|f| f.to_bytes().unwrap()).collect();
    let mut seeds = one.clone();
    seeds.push(one.concat());
    seeds
}

fn run(seeds: &[Vec<u8>], inputs: usize, seed: u64, check: fn(&[u8])) -> usize {
    let mut rng = Rng(seed);
    for s in seeds {
        check(s);
    }
    for _ in 0..inputs {
        let a = &seeds[rng.below(seeds.len())];
        let b = &seeds[rng.below(seeds.len())];
        check(&mutate(&mut rng, a, b));
    }
    seeds.len() + inputs
}

#[test]
fn trace_context_decoders_hold_their_properties_over_a_mutated_corpus() {
    let n = run(&context_seeds(), 300_000, 1, check_trace_context);
    assert!(n > 300_000);
}

#[test]
fn frame_decoders_hold_their_properties_over_a_mutated_corpus() {
    let n = run(&frame_seeds(), 150_000, 2, check_collector_frames);
    assert!(n > 150_000);
}
