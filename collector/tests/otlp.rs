//! The OTLP receiver end to end over loopback: a real exporter reports the publisher's
//! stamps, OTLP/HTTP requests (protobuf built with the OpenTelemetry types, JSON written
//! by hand as the OTLP specification lays it out) stamp the other hops, and the run
//! joins both, accounts for every span and answers every bad request with a clear error.

mod common;

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use hoptrace_collector::ingest::otlp::OtlpConfig;
use hoptrace_collector::{Collector, CollectorConfig, RunSummary};
use hoptrace_format::spec::PipelineSpec;
use hoptrace_probe::testing::ManualClock;
use hoptrace_probe::{Exporter, ExporterConfig, HopId, OtelTraceId, TraceContext, TraceKey};
use hoptrace_protocol::{SentEntry, SentFrame};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prost::Message as _;

const SPEC: &str = r#"
name = "otel-test"
[[hops]]
name = "publish"
[[hops]]
name = "flow_in"
span = { service = "flow", kind = "consumer", name = "* process" }
[[hops]]
name = "flow_out"
span = { service = "flow", kind = "consumer", name = "* process", stamp = "end" }
[[hops]]
name = "store_in"
span = { service = "sink", kind = "producer", attributes = { "messaging.destination.name" = "store" } }
[[stages]]
name = "Broker Time"
from = "publish"
to = "flow_in"
definition = "d"
[[stages]]
name = "Flow Internal"
from = "flow_in"
to = "flow_out"
definition = "d"
[[stages]]
name = "Total"
from = "publish"
to = "store_in"
definition = "d"
headline = true
"#;

const MESSAGES: u64 = 200;
const PUBLISHER: u16 = 4;

fn key(sequence: u64) -> TraceKey {
    TraceKey {
        publisher: PUBLISHER,
        stream: 0,
        sequence,
    }
}

/// A whole second a minute before the test started: plausible for the run.
fn base_ns() -> i64 {
    static BASE: std::sync::LazyLock<i64> = std::sync::LazyLock::new(|| {
        let now = hoptrace_probe::clock::realtime_ns();
        now - now % 1_000_000_000 - 60_000_000_000
    });
    *BASE
}

fn publish_ns(seq: u64) -> i64 {
    base_ns() + seq as i64 * 10_000
}

fn start(dir: &std::path::Path, otlp: OtlpConfig, token: Option<&str>) -> Collector {
    let spec = PipelineSpec::from_toml_str(SPEC).unwrap();
    let mut cfg = CollectorConfig::new("127.0.0.1:0", spec, dir);
    cfg.run_id = Some("otlp".into());
    cfg.otlp = Some(otlp);
    cfg.token = token.map(str::to_owned);
    cfg.stop_timeout = Duration::from_secs(5);
    Collector::start(cfg).unwrap()
}

/// The publisher's stamps of `seqs` (with their keyed trace ids) and its Sent frame.
fn publish(addr: SocketAddr, token: Option<&str>, seqs: std::ops::Range<u64>) {
    publish_over(addr, token, None, seqs);
}

/// [`publish`], over TLS trusting `ca` when given.
fn publish_over(
    addr: SocketAddr,
    token: Option<&str>,
    ca: Option<&std::path::Path>,
    seqs: std::ops::Range<u64>,
) {
    let mut ecfg = ExporterConfig::new(addr.to_string(), "publisher");
    ecfg.token = token.map(str::to_owned);
    ecfg.tls_ca = ca.map(std::path::Path::to_path_buf);
    let exporter = Exporter::start(ecfg, &[(HopId(0), "publish")]).unwrap();
    let clock = ManualClock::new(0);
    let probe = exporter.probe_with_clock(HopId(0), clock.clone()).unwrap();
    for seq in seqs.clone() {
        let mut ctx = TraceContext::new(key(seq), 5, publish_ns(seq) - 50);
        ctx.otel_trace_id = Some(OtelTraceId::of_key(&key(seq)));
        clock.set(publish_ns(seq));
        assert!(probe.record(&mut ctx).queued);
    }
    exporter
        .send_sent_frame(SentFrame {
            publisher: PUBLISHER,
            entries: vec![SentEntry {
                stream: 0,
                messages: seqs.end - seqs.start,
                metrics: (seqs.end - seqs.start) * 5,
                first_sequence: seqs.start,
                last_sequence: seqs.end - 1,
            }],
        })
        .unwrap();
    let s = exporter.shutdown();
    assert!(s.clean && s.counters.lost() == 0, "{s:?}");
}

fn text(k: &str, v: &str) -> KeyValue {
    KeyValue {
        key: k.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(v.into())),
        }),
        ..KeyValue::default()
    }
}

fn span(trace_id: &[u8], name: &str, kind: SpanKind, start: i64, end: i64) -> Span {
    Span {
        trace_id: trace_id.to_vec(),
        span_id: vec![1, 2, 3, 4, 5, 6, 7, 8],
        name: name.into(),
        kind: kind as i32,
        start_time_unix_nano: start as u64,
        end_time_unix_nano: end as u64,
        ..Span::default()
    }
}

fn request(service: &str, host: &str, spans: Vec<Span>) -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![
                    text("service.name", service),
                    text("host.name", host),
                    text("telemetry.sdk.name", "opentelemetry"),
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

/// The flow's process spans of `seqs`: 1 µs after publish, 2 µs long.
fn flow_spans(seqs: std::ops::Range<u64>) -> Vec<Span> {
    seqs.map(|s| {
        let id = OtelTraceId::of_key(&key(s)).0;
        span(
            &id,
            "orders process",
            SpanKind::Consumer,
            publish_ns(s) + 1_000,
            publish_ns(s) + 3_000,
        )
    })
    .collect()
}

/// POSTs `body` and returns the status, headers and body of the answer.
fn post(
    addr: SocketAddr,
    content_type: &str,
    extra: &[(&str, &str)],
    body: &[u8],
) -> (u16, String, Vec<u8>) {
    let mut req = ureq::post(&format!("http://{addr}/v1/traces")).set("Content-Type", content_type);
    for (k, v) in extra {
        req = req.set(k, v);
    }
    let resp = match req.send_bytes(body) {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("POST failed: {e}"),
    };
    let status = resp.status();
    let retry = resp.header("Retry-After").unwrap_or_default().to_owned();
    let mut out = Vec::new();
    resp.into_reader().read_to_end(&mut out).unwrap();
    (status, retry, out)
}

fn counts(s: &RunSummary, name: &str) -> u64 {
    s.otlp
        .get(name)
        .copied()
        .unwrap_or_else(|| panic!("run.json otlp has no {name}: {:?}", s.otlp))
}

#[test]
fn spans_in_protobuf_and_json_stamp_their_hops_and_every_span_is_accounted_for() {
    let tmp = hoptrace_testkit::tempdir("otlp");
    let collector = start(&tmp, OtlpConfig::new("127.0.0.1:0"), None);
    let otlp = collector.otlp_addr().unwrap();

    // The flow's spans before the publisher's stamps arrive: joined all the same.
    let mut flow = flow_spans(0..MESSAGES);
    let foreign = [0x4bu8; 16];
    flow.push(span(&foreign, "orders process", SpanKind::Consumer, 1, 2));
    flow.push(span(
        &OtelTraceId::of_key(&key(1)).0,
        "orders process",
        SpanKind::Consumer,
        10,
        5,
    ));
    flow.push(span(
        &OtelTraceId::of_key(&key(2)).0,
        "housekeeping",
        SpanKind::Internal,
        1,
        2,
    ));
    flow.push(span(&[1, 2, 3], "orders process", SpanKind::Consumer, 1, 2));
    let (status, _, body) = post(
        otlp,
        "application/x-protobuf",
        &[],
        &request("flow", "flow-host", flow).encode_to_vec(),
    );
    assert_eq!(status, 200);
    let resp = ExportTraceServiceResponse::decode(&body[..]).unwrap();
    let partial = resp.partial_success.expect("4 spans rejected");
    assert_eq!(partial.rejected_spans, 4);
    for why in [
        "1 span(s) match no hop",
        "1 span(s) end before they start",
        "1 span(s) have an invalid trace id",
        "1 span(s) have a trace id that names no message",
    ] {
        assert!(
            partial.error_message.contains(why),
            "{why}: {}",
            partial.error_message
        );
    }

    publish(collector.local_addr(), None, 0..MESSAGES);

    // The sink's producer spans in OTLP/JSON as the specification writes it: hex ids,
    // enum as integer, 64-bit times as strings. One batch span links the last 50
    // messages; the attribute the hop asks for is on every span.
    let single: Vec<String> = (0..MESSAGES - 50)
        .map(|s| {
            format!(
                r#"{{"traceId":"{}","spanId":"0102030405060708","name":"store publish","kind":4,"startTimeUnixNano":"{}","endTimeUnixNano":"{}","attributes":[{{"key":"messaging.destination.name","value":{{"stringValue":"store"}}}}]}}"#,
                OtelTraceId::of_key(&key(s)).to_hex(),
                publish_ns(s) + 7_000,
                publish_ns(s) + 8_000
            )
        })
        .collect();
    let links: Vec<String> = (MESSAGES - 50..MESSAGES)
        .map(|s| {
            format!(
                r#"{{"traceId":"{}","spanId":"0102030405060708"}}"#,
                OtelTraceId::of_key(&key(s)).to_hex()
            )
        })
        .collect();
    let batch_start = publish_ns(MESSAGES - 1) + 9_000;
    let batch = format!(
        r#"{{"traceId":"{}","spanId":"1112131415161718","name":"store publish","kind":4,"startTimeUnixNano":"{batch_start}","endTimeUnixNano":"{}","links":[{}],"attributes":[{{"key":"messaging.destination.name","value":{{"stringValue":"store"}}}}]}}"#,
        "0af7651916cd43dd8448eb211c80319c",
        batch_start + 500,
        links.join(",")
    );
    let json = format!(
        r#"{{"resourceSpans":[{{"resource":{{"attributes":[{{"key":"service.name","value":{{"stringValue":"sink"}}}},{{"key":"service.instance.id","value":{{"stringValue":"sink-1"}}}}]}},"scopeSpans":[{{"scope":{{"name":"io.opentelemetry.kafka-clients-2.6"}},"spans":[{},{batch}]}}]}}]}}"#,
        single.join(",")
    );
    let (status, _, body) = post(otlp, "application/json", &[], json.as_bytes());
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let resp: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert!(
        resp.get("partialSuccess")
            .is_none_or(serde_json::Value::is_null),
        "{resp}"
    );

    let summary = collector.stop().unwrap();
    let a = &summary.accounting;
    assert!(a.adds_up, "{:?}", a.discrepancies);
    let p = &a.publishers[0];
    assert_eq!((p.sent, p.complete, p.incomplete), (MESSAGES, MESSAGES, 0));
    let stage = |n: &str| {
        summary
            .stages
            .iter()
            .find(|s| s.name == n)
            .unwrap()
            .figures
            .clone()
    };
    let broker = stage("Broker Time");
    assert_eq!(
        (broker.count, broker.min_ns, broker.max_ns),
        (MESSAGES, Some(1_000), Some(1_000))
    );
    let flow = stage("Flow Internal");
    assert_eq!(
        (flow.count, flow.min_ns, flow.max_ns),
        (MESSAGES, Some(2_000), Some(2_000))
    );
    let total = stage("Total");
    assert_eq!(total.count, MESSAGES);
    assert_eq!(total.min_ns, Some(7_000));
    // The batch span's start, for the message published first of its 50.
    assert_eq!(total.max_ns, Some(batch_start - publish_ns(MESSAGES - 50)));
    assert_eq!(counts(&summary, "spans"), MESSAGES + 4 + MESSAGES - 50 + 1);
    assert_eq!(
        counts(&summary, "spans_stamped"),
        MESSAGES + MESSAGES - 50 + 1
    );
    assert_eq!(counts(&summary, "stamps"), 2 * MESSAGES + MESSAGES);
    for (name, n) in [
        ("spans_unmatched", 1),
        ("spans_end_before_start", 1),
        ("spans_bad_trace_id", 1),
        ("spans_no_message", 1),
        ("requests", 2),
        ("accepted", 2),
    ] {
        assert_eq!(counts(&summary, name), n, "{name}");
    }
    // Each sender of spans is a probe of the run, with its host and service.
    let senders: Vec<(String, String)> = summary
        .probes
        .iter()
        .filter(|p| p.software.starts_with("OTLP"))
        .map(|p| (p.host.clone(), p.process.clone()))
        .collect();
    assert_eq!(
        senders,
        [
            ("flow-host".to_owned(), "flow".to_owned()),
            ("sink-1".to_owned(), "sink".to_owned())
        ]
    );
    assert_eq!(a.records_by_hop.get("flow_in"), Some(&MESSAGES));
    // The trace ids are in the dataset.
    let written = std::fs::read_to_string(tmp.join("otlp").join("run.json")).unwrap();
    assert!(written.contains("\"spans_no_message\": 1"), "{written}");
}

#[test]
fn a_span_sent_twice_is_counted_once_with_its_first_stamp() {
    let tmp = hoptrace_testkit::tempdir("otlp-dup");
    let collector = start(&tmp, OtlpConfig::new("127.0.0.1:0"), None);
    let otlp = collector.otlp_addr().unwrap();
    let body = request("flow", "h", flow_spans(0..10)).encode_to_vec();
    for _ in 0..2 {
        assert_eq!(post(otlp, "application/x-protobuf", &[], &body).0, 200);
    }
    publish(collector.local_addr(), None, 0..10);
    let summary = collector.stop().unwrap();
    let a = &summary.accounting;
    assert_eq!(a.duplicate_traces, 10);
    assert_eq!(a.publishers[0].incomplete, 10, "store_in never stamped");
    let flow = summary
        .stages
        .iter()
        .find(|s| s.name == "Flow Internal")
        .unwrap();
    assert_eq!((flow.figures.count, flow.figures.max_ns), (10, Some(2_000)));
}

/// Writes `head` and `body` on a fresh connection and reads the answer's status line and
/// body (the connection closes after it).
fn raw(addr: SocketAddr, head: &str, body: &[u8]) -> (String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(head.as_bytes()).unwrap();
    let _ = s.write_all(body);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text.lines().next().unwrap_or_default().to_owned();
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

#[test]
fn bad_requests_get_a_clear_answer_are_counted_and_lose_nothing_else() {
    let tmp = hoptrace_testkit::tempdir("otlp-bad");
    let mut ocfg = OtlpConfig::new("127.0.0.1:0");
    ocfg.max_request_bytes = 1 << 20;
    let token = "s3cret";
    let collector = start(&tmp, ocfg, Some(token));
    let otlp = collector.otlp_addr().unwrap();
    let auth = [("Authorization", "Bearer s3cret")];

    // Malformed protobuf and JSON: 400 with the reason.
    let (status, _, body) = post(
        otlp,
        "application/x-protobuf",
        &auth,
        &[0x0a, 0xff, 0xff, 0xff],
    );
    assert_eq!(status, 400);
    assert!(
        String::from_utf8_lossy(&body)
            .contains("not an OTLP ExportTraceServiceRequest in protobuf")
    );
    let (status, _, body) = post(otlp, "application/json", &auth, b"{\"resourceSpans\": [");
    assert_eq!(status, 400);
    let err: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert!(
        err["message"].as_str().unwrap().contains("in JSON"),
        "{err}"
    );
    // No token, a wrong one: 401.
    assert_eq!(post(otlp, "application/json", &[], b"{}").0, 401);
    assert_eq!(
        post(
            otlp,
            "application/json",
            &[("Authorization", "Bearer nope")],
            b"{}"
        )
        .0,
        401
    );
    // Another content type, encoding, path, method.
    assert_eq!(post(otlp, "text/plain", &auth, b"{}").0, 415);
    assert_eq!(
        post(
            otlp,
            "application/json",
            &[auth[0], ("Content-Encoding", "br")],
            b"{}"
        )
        .0,
        415
    );
    let (status, _) = raw(
        otlp,
        "POST /v1/metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
        b"",
    );
    assert!(status.starts_with("HTTP/1.1 404"), "{status}");
    let (status, _) = raw(otlp, "GET /v1/traces HTTP/1.1\r\nHost: x\r\n\r\n", b"");
    assert!(status.starts_with("HTTP/1.1 405"), "{status}");
    // A 100 MB request is refused from its head, before its body is read.
    let (status, body) = raw(
        otlp,
        "POST /v1/traces HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret\r\nContent-Type: application/x-protobuf\r\nContent-Length: 104857600\r\n\r\n",
        &[0u8; 4096],
    );
    assert!(status.starts_with("HTTP/1.1 413"), "{status}");
    assert!(body.contains("above the limit of 1048576 bytes"), "{body}");
    // A gzip body that inflates past the limit: 413 as well.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(&vec![0u8; 4 << 20]).unwrap();
    let bomb = gz.finish().unwrap();
    assert_eq!(
        post(
            otlp,
            "application/x-protobuf",
            &[auth[0], ("Content-Encoding", "gzip")],
            &bomb
        )
        .0,
        413
    );
    // Not HTTP at all.
    let (status, _) = raw(otlp, "\x16\x03\x01\x02\x00garbage\r\n\r\n", b"");
    assert!(status.starts_with("HTTP/1.1 400"), "{status}");

    // Then good requests, gzip and chunked among them, are taken whole.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&request("flow", "h", flow_spans(0..50)).encode_to_vec())
        .unwrap();
    let (status, _, _) = post(
        otlp,
        "application/x-protobuf",
        &[auth[0], ("Content-Encoding", "gzip")],
        &gz.finish().unwrap(),
    );
    assert_eq!(status, 200);
    let body = request("flow", "h", flow_spans(50..100)).encode_to_vec();
    let mut chunked = Vec::new();
    for part in body.chunks(700) {
        chunked.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
        chunked.extend_from_slice(part);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let (status, _) = raw(
        otlp,
        "POST /v1/traces HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret\r\nContent-Type: application/x-protobuf\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
        &chunked,
    );
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    publish(collector.local_addr(), Some(token), 0..100);
    let summary = collector.stop().unwrap();
    let flow = summary
        .stages
        .iter()
        .find(|s| s.name == "Flow Internal")
        .unwrap();
    assert_eq!(flow.figures.count, 100);
    for (name, n) in [
        ("malformed", 2),
        ("unauthorized", 2),
        ("unsupported", 5),
        ("too_large", 2),
        ("accepted", 2),
    ] {
        assert_eq!(counts(&summary, name), n, "{name}: {:?}", summary.otlp);
    }
}

#[test]
fn a_pipeline_without_a_span_hop_refuses_otlp_and_says_why() {
    let tmp = hoptrace_testkit::tempdir("otlp-none");
    let mut cfg = CollectorConfig::new("127.0.0.1:0", PipelineSpec::default_pipeline(), &tmp);
    cfg.otlp = Some(OtlpConfig::new("127.0.0.1:0"));
    let err = Collector::start(cfg).unwrap_err().to_string();
    assert!(
        err.contains("no hop of the pipeline") && err.contains("generate-config --otel"),
        "{err}"
    );
}

/// With the probes' certificate the OTLP port speaks HTTPS: an exporter that trusts the CA
/// is answered, and plain HTTP to it gets no answer and costs nothing else.
#[test]
fn with_a_certificate_the_otlp_port_speaks_https_only() {
    use rustls::pki_types::pem::PemObject as _;
    let tmp = hoptrace_testkit::tempdir("otlp-tls");
    let (ca, cert, key) = common::make_pki(&tmp, "otlp", &["127.0.0.1"]);
    let spec = PipelineSpec::from_toml_str(SPEC).unwrap();
    let mut cfg = CollectorConfig::new("127.0.0.1:0", spec, &tmp);
    cfg.otlp = Some(OtlpConfig::new("127.0.0.1:0"));
    cfg.tls_cert = Some(cert);
    cfg.tls_key = Some(key);
    let collector = Collector::start(cfg).unwrap();
    let otlp = collector.otlp_addr().unwrap();

    // Plain HTTP to the HTTPS port: the handshake fails, no HTTP answer.
    let (status, _) = raw(
        otlp,
        "POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n",
        b"{}",
    );
    assert!(!status.starts_with("HTTP/1.1"), "{status}");

    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_file_iter(&ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let client = std::sync::Arc::new(
        rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth(),
    );
    let body = request("flow", "h", flow_spans(0..20)).encode_to_vec();
    let conn = rustls::ClientConnection::new(client, "127.0.0.1".try_into().unwrap()).unwrap();
    let tcp = TcpStream::connect(otlp).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    write!(
        tls,
        "POST /v1/traces HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-protobuf\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .unwrap();
    tls.write_all(&body).unwrap();
    let mut answer = Vec::new();
    let _ = tls.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    publish_over(collector.local_addr(), None, Some(&ca), 0..20);
    let summary = collector.stop().unwrap();
    let flow = summary
        .stages
        .iter()
        .find(|s| s.name == "Flow Internal")
        .unwrap();
    assert_eq!(flow.figures.count, 20);
    assert_eq!(counts(&summary, "accepted"), 1);
}

/// An exporter faster than the join: with the join full (its pending traces at
/// `max_pending`, none completing), the channel to it fills, and the next request is
/// answered 503 with `Retry-After` after a second, counted as throttled; every request
/// answered 200 before it is in the run.
#[test]
fn an_exporter_faster_than_the_join_is_told_to_retry_and_loses_nothing_it_was_told_was_taken() {
    let tmp = hoptrace_testkit::tempdir("otlp-busy");
    let spec = format!("{SPEC}\n[join]\nmax_pending = 4\nwindow_ms = 600000\n");
    let mut cfg = CollectorConfig::new(
        "127.0.0.1:0",
        PipelineSpec::from_toml_str(&spec).unwrap(),
        &tmp,
    );
    let mut ocfg = OtlpConfig::new("127.0.0.1:0");
    ocfg.ack_durable = false;
    cfg.otlp = Some(ocfg);
    cfg.stop_timeout = Duration::from_secs(2);
    let collector = Collector::start(cfg).unwrap();
    let otlp = collector.otlp_addr().unwrap();
    let mut taken = 0u64;
    let mut throttled = None;
    for i in 0..400u64 {
        let body = request("flow", "h", flow_spans(i * 2..i * 2 + 2)).encode_to_vec();
        let (status, retry, _) = post(otlp, "application/x-protobuf", &[], &body);
        match status {
            200 => taken += 1,
            503 => {
                throttled = Some(retry);
                break;
            }
            other => panic!("answered {other}"),
        }
    }
    assert_eq!(
        throttled.as_deref(),
        Some("1"),
        "503 with Retry-After: 1 once the channel is full"
    );
    assert!(taken >= 200, "the channel took {taken} requests first");
    let summary = collector.stop().unwrap();
    assert_eq!(counts(&summary, "throttled"), 1);
    assert_eq!(counts(&summary, "accepted"), taken);
    assert_eq!(counts(&summary, "stamps"), taken * 4);
    // Every stamp of every request answered 200 reached the join (a trace each, drained
    // incomplete at the end: nothing published).
    assert_eq!(
        summary.accounting.records_by_hop.get("flow_in"),
        Some(&(taken * 2))
    );
    assert_eq!(
        summary.accounting.records_by_hop.get("flow_out"),
        Some(&(taken * 2))
    );
}
