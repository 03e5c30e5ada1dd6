//! What one core does with OTLP spans: decode an `ExportTraceServiceRequest` (protobuf and
//! JSON), turn its spans into hop records, and join them. A request holds 1,000 consumer
//! process spans of the kind OpenTelemetry's Kafka instrumentations export (name, kind,
//! times, trace and span ids, a parent, five messaging attributes), each naming a message
//! by its keyed trace id and stamping two hops (the span's start and end).
//!
//!     cargo bench -p hoptrace-collector --bench otlp
//!
//! Throughput is in spans per second; `reports/otlp-bench.md` holds the figures.

use std::collections::BTreeMap;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use hoptrace_collector::ingest::otlp::spans::{self, SpanHops};
use hoptrace_collector::ingest::otlp::wire::TracesRequest;
use hoptrace_collector::join::Joiner;
use hoptrace_format::spec::PipelineSpec;
use hoptrace_protocol::{Frame, OtelTraceId, TraceKey};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prost::Message as _;

const SPANS: u64 = 1_000;

const SPEC: &str = r#"
name = "bench"
expected = ["flow_in", "flow_out"]
[[hops]]
name = "publish"
[[hops]]
name = "flow_in"
span = { service = "flow", kind = "consumer", name = "* process", attributes = { "messaging.destination.name" = "orders" } }
[[hops]]
name = "flow_out"
span = { service = "flow", kind = "consumer", name = "* process", stamp = "end" }
[[stages]]
name = "Flow Internal"
from = "flow_in"
to = "flow_out"
definition = "d"
[join]
max_pending = 10000000
"#;

fn kv(k: &str, v: any_value::Value) -> KeyValue {
    KeyValue {
        key: k.into(),
        value: Some(AnyValue { value: Some(v) }),
        ..KeyValue::default()
    }
}

fn s(v: &str) -> any_value::Value {
    any_value::Value::StringValue(v.into())
}

/// A request of [`SPANS`] spans for the messages from `first` on.
fn request(first: u64) -> ExportTraceServiceRequest {
    let base = 1_790_000_000_000_000_000u64;
    let spans = (first..first + SPANS)
        .map(|seq| {
            let key = TraceKey {
                publisher: 1,
                stream: (seq % 100) as u32,
                sequence: seq / 100,
            };
            Span {
                trace_id: OtelTraceId::of_key(&key).0.to_vec(),
                span_id: (seq | 1).to_be_bytes().to_vec(),
                parent_span_id: (seq << 1 | 1).to_be_bytes().to_vec(),
                name: "orders process".into(),
                kind: SpanKind::Consumer as i32,
                start_time_unix_nano: base + seq * 1_000,
                end_time_unix_nano: base + seq * 1_000 + 350,
                attributes: vec![
                    kv("messaging.system", s("kafka")),
                    kv("messaging.destination.name", s("orders")),
                    kv("messaging.operation.type", s("process")),
                    kv(
                        "messaging.kafka.message.offset",
                        any_value::Value::IntValue(seq as i64),
                    ),
                    kv("messaging.destination.partition.id", s("0")),
                ],
                ..Span::default()
            }
        })
        .collect();
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![
                    kv("service.name", s("flow")),
                    kv("host.name", s("flow-1")),
                    kv("telemetry.sdk.name", s("opentelemetry")),
                    kv("telemetry.sdk.language", s("java")),
                ],
                ..Resource::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans,
                ..ScopeSpans::default()
            }],
            ..ResourceSpans::default()
        }],
    }
}

fn bench(c: &mut Criterion) {
    let spec = PipelineSpec::from_toml_str(SPEC)
        .unwrap()
        .resolve()
        .unwrap();
    let hops = SpanHops::new(&spec);
    let full = request(0);
    let proto = bytes::Bytes::from(full.encode_to_vec());
    let json = serde_json::to_vec(&full).unwrap();
    let req = TracesRequest::decode(proto.clone()).unwrap();
    let mut g = c.benchmark_group("otlp");
    g.throughput(Throughput::Elements(SPANS));
    g.bench_function("decode protobuf", |b| {
        b.iter(|| TracesRequest::decode(proto.clone()).unwrap());
    });
    g.bench_function("decode protobuf into opentelemetry-proto's types", |b| {
        b.iter(|| ExportTraceServiceRequest::decode(&proto[..]).unwrap());
    });
    g.bench_function("decode json", |b| {
        b.iter(|| {
            TracesRequest::from(serde_json::from_slice::<ExportTraceServiceRequest>(&json).unwrap())
        });
    });
    let mut out = BTreeMap::new();
    g.bench_function("spans to records", |b| {
        b.iter(|| spans::records(&req, &hops, &mut out));
    });
    // Decode, map and join, request after request: each span's two stamps complete its
    // message (publish is not expected here). Every 64 requests the joiner starts afresh
    // (its keys would repeat), which the figure includes.
    let mut joiner = Joiner::new(&spec);
    let mut joined = Vec::new();
    let mut first = 0u64;
    let requests: Vec<bytes::Bytes> = (0..64)
        .map(|i| bytes::Bytes::from(request(i * SPANS).encode_to_vec()))
        .collect();
    let mut at = 0u64;
    g.bench_function("decode, map and join protobuf", |b| {
        b.iter(|| {
            // Each request's keys once per joiner: a key is written once.
            if first.is_multiple_of(64) {
                joiner = Joiner::new(&spec);
            }
            let body = &requests[(first % 64) as usize];
            let req = TracesRequest::decode(body.clone()).unwrap();
            first += 1;
            spans::records(&req, &hops, &mut out);
            for recs in out.values() {
                for r in recs {
                    at += 1;
                    joiner.insert(r, at, &mut joined);
                }
            }
            joined.clear();
        });
    });
    // The native protocol beside it: the same 1,000 messages' 2,000 stamps as one Records
    // frame (as a probe sends them), decoded and joined.
    let mut native_joiner = Joiner::new(&spec);
    let mut native_first = 0u64;
    let frames: Vec<Vec<u8>> = (0..64)
        .map(|i| {
            let req = TracesRequest::decode(bytes::Bytes::from(request(i * SPANS).encode_to_vec()))
                .unwrap();
            spans::records(&req, &hops, &mut out);
            let recs: Vec<_> = out.values().flatten().copied().collect();
            let mut bytes = Frame::Records(recs).to_bytes().unwrap();
            bytes.drain(..4);
            bytes
        })
        .collect();
    g.bench_function(
        "native: decode a Records frame of the same stamps and join",
        |b| {
            b.iter(|| {
                if native_first.is_multiple_of(64) {
                    native_joiner = Joiner::new(&spec);
                }
                let raw = &frames[(native_first % 64) as usize];
                native_first += 1;
                let Frame::Records(recs) = Frame::decode(raw[0], &raw[1..]).unwrap() else {
                    unreachable!("a Records frame")
                };
                for r in &recs {
                    at += 1;
                    native_joiner.insert(r, at, &mut joined);
                }
                joined.clear();
            });
        },
    );
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
