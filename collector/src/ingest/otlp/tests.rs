use std::collections::BTreeMap;

use hoptrace_format::spec::PipelineSpec;
use hoptrace_protocol::{HopId, OtelTraceId, TraceKey};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, ArrayValue, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::span::{Event, Link, SpanKind};
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};
use prost::Message as _;

use super::spans::{self, Source, SpanCounts, SpanHops};
use super::wire::TracesRequest;

const SPEC: &str = r#"
name = "t"
[[hops]]
name = "publish"
[[hops]]
name = "by_attributes"
span = { attributes = { "s" = "orders", "i" = "42", "b" = "true", "d" = "0.5" } }
[[hops]]
name = "by_array"
span = { attributes = { "list" = "x" } }
[[hops]]
name = "consumer_end"
span = { kind = "consumer", name = "orders *", stamp = "end" }
[[stages]]
name = "s"
from = "publish"
to = "by_attributes"
definition = "d"
"#;

fn kv(k: &str, v: any_value::Value) -> KeyValue {
    KeyValue {
        key: k.into(),
        value: Some(AnyValue { value: Some(v) }),
        ..KeyValue::default()
    }
}

fn key(sequence: u64) -> TraceKey {
    TraceKey {
        publisher: 2,
        stream: 1,
        sequence,
    }
}

fn id(sequence: u64) -> Vec<u8> {
    OtelTraceId::of_key(&key(sequence)).0.to_vec()
}

/// Spans exercising every attribute type, a link, and fields the receiver skips.
fn request() -> ExportTraceServiceRequest {
    use any_value::Value as V;
    let everything = vec![
        kv("s", V::StringValue("orders".into())),
        kv("i", V::IntValue(42)),
        kv("b", V::BoolValue(true)),
        kv("d", V::DoubleValue(0.5)),
        kv(
            "list",
            V::ArrayValue(ArrayValue {
                values: vec![AnyValue {
                    value: Some(V::StringValue("x".into())),
                }],
            }),
        ),
    ];
    let spans = vec![
        // Matches by_attributes (start) and consumer_end (end); carries an event and a
        // status, which are skipped; links message 9 too.
        Span {
            trace_id: id(1),
            span_id: vec![1; 8],
            parent_span_id: vec![2; 8],
            name: "orders process".into(),
            kind: SpanKind::Consumer as i32,
            start_time_unix_nano: 1_000,
            end_time_unix_nano: 3_000,
            attributes: everything.clone(),
            events: vec![Event {
                name: "retry".into(),
                time_unix_nano: 2_000,
                ..Event::default()
            }],
            links: vec![Link {
                trace_id: id(9),
                span_id: vec![3; 8],
                ..Link::default()
            }],
            status: Some(Status {
                message: "ok".into(),
                code: 1,
            }),
            ..Span::default()
        },
        // One attribute off (i = 43): matches nothing.
        Span {
            trace_id: id(2),
            name: "other".into(),
            kind: SpanKind::Internal as i32,
            start_time_unix_nano: 5,
            end_time_unix_nano: 6,
            attributes: {
                let mut a = everything;
                a[1] = kv("i", V::IntValue(43));
                a
            },
            ..Span::default()
        },
    ];
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![
                    kv("service.name", V::StringValue("svc".into())),
                    kv("service.instance.id", V::StringValue("i-1".into())),
                    kv("telemetry.sdk.language", V::StringValue("rust".into())),
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

fn hops() -> SpanHops {
    SpanHops::new(
        &PipelineSpec::from_toml_str(SPEC)
            .unwrap()
            .resolve()
            .unwrap(),
    )
}

#[test]
fn every_attribute_type_matches_as_text_and_arrays_never_do() {
    let req = TracesRequest::decode(bytes::Bytes::from(request().encode_to_vec())).unwrap();
    let mut out = BTreeMap::new();
    let counts = spans::records(&req, &hops(), &mut out);
    assert_eq!(
        counts,
        SpanCounts {
            spans: 2,
            stamped: 1,
            stamps: 4,
            unmatched: 1,
            ..SpanCounts::default()
        }
    );
    let (source, recs) = out.into_iter().next().unwrap();
    assert_eq!(
        source,
        Source {
            host: "i-1".into(),
            service: "svc".into(),
            sdk: "rust".into(),
        }
    );
    let got: Vec<(u64, HopId, i64)> = recs
        .iter()
        .map(|r| (r.key.sequence, r.hop, r.stamp_ns))
        .collect();
    // The span's own message and the one its link names, at both hops it matches.
    assert_eq!(
        got,
        [
            (1, HopId(1), 1_000),
            (9, HopId(1), 1_000),
            (1, HopId(3), 3_000),
            (9, HopId(3), 3_000),
        ]
    );
    assert!(recs.iter().all(|r| !r.carries_message()));
    assert_eq!(recs[1].otel_trace_id.unwrap().0.to_vec(), id(9));
}

#[test]
fn json_and_protobuf_give_the_same_records() {
    let full = request();
    let from_proto = TracesRequest::decode(bytes::Bytes::from(full.encode_to_vec())).unwrap();
    let json = serde_json::to_vec(&full).unwrap();
    let from_json =
        TracesRequest::from(serde_json::from_slice::<ExportTraceServiceRequest>(&json).unwrap());
    let (mut a, mut b) = (BTreeMap::new(), BTreeMap::new());
    assert_eq!(
        spans::records(&from_proto, &hops(), &mut a),
        spans::records(&from_json, &hops(), &mut b)
    );
    assert_eq!(a, b);
}

#[test]
fn a_span_past_2262_or_with_a_short_trace_id_is_counted_not_stamped() {
    let mut full = request();
    let spans = &mut full.resource_spans[0].scope_spans[0].spans;
    spans[0].end_time_unix_nano = u64::MAX;
    spans[1] = Span {
        trace_id: vec![1, 2, 3],
        ..spans[0].clone()
    };
    spans[1].end_time_unix_nano = 4_000;
    let req = TracesRequest::decode(bytes::Bytes::from(full.encode_to_vec())).unwrap();
    let mut out = BTreeMap::new();
    let c = spans::records(&req, &hops(), &mut out);
    assert_eq!((c.spans, c.bad_trace_id, c.stamps), (2, 2, 0));
    assert!(out.is_empty(), "no sender without a stamp joins the run");
    assert_eq!(c.rejected(), 2);
    assert!(
        c.rejection_message()
            .contains("2 span(s) have an invalid trace id or time")
    );
}

/// A request that waits to hand its sender's frames to the join holds that sender's lock
/// only: another sender's request goes through meanwhile.
#[test]
fn a_sender_waiting_on_the_join_holds_up_no_other_sender() {
    use std::net::SocketAddr;
    use std::sync::atomic::{AtomicBool, AtomicU64};
    use std::sync::{Arc, mpsc};
    use std::time::Duration;

    let shared = super::Shared::new(
        (hops(), Arc::new(super::OtlpCounters::default())),
        (None, None),
        "run".into(),
        Arc::new(AtomicU64::new(0)),
        None,
        &super::OtlpConfig::new("127.0.0.1:0"),
    );
    let (tx, rx) = mpsc::sync_channel(64);
    let peer: SocketAddr = "127.0.0.1:1".parse().unwrap();
    let source = |host: &str| Source {
        host: host.into(),
        service: "svc".into(),
        sdk: String::new(),
    };
    let records = |sequence: u64| {
        vec![hoptrace_protocol::Record {
            key: key(sequence),
            hop: HopId(1),
            stamp_ns: 1_000,
            metric_count: 0,
            intended_ns: 0,
            otel_trace_id: None,
        }]
    };
    let stopping = AtomicBool::new(false);
    // Sender a connects, then a request of it stalls mid-delivery: its lock is held.
    super::deliver(
        &shared,
        BTreeMap::from([(source("a"), records(1))]),
        peer,
        &tx,
        &stopping,
    )
    .unwrap();
    let a = Arc::clone(super::lock(&shared.sources).get(&source("a")).unwrap());
    let held = super::lock(&a);
    let (done_tx, done_rx) = mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| {
            let r = super::deliver(
                &shared,
                BTreeMap::from([(source("b"), records(2))]),
                peer,
                &tx,
                &stopping,
            );
            done_tx.send(r).unwrap();
        });
        let r = done_rx.recv_timeout(Duration::from_secs(10));
        drop(held);
        assert_eq!(r.expect("sender b's request waited for sender a's"), Ok(()));
    });
    // The join got a's Hello and frame, then b's.
    let events: Vec<_> = rx.try_iter().collect();
    assert_eq!(events.len(), 4, "{events:?}");
}
