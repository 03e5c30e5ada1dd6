//! `probe/testdata/protocol-vectors.json` (beside the trace context's vectors, where the
//! probes in other languages read them): example frames of collector protocol versions 1 and
//! 2 (`docs/collector-protocol.md`), each with its fields and its bytes, for other
//! implementations of the protocol to test against. This test checks the file both ways:
//! every frame encodes to exactly the bytes listed, and the bytes decode to the frame.
//! `HOPTRACE_BLESS=1` writes the file from the frames below instead (review the diff: a
//! change of bytes is a change of the protocol).

use std::path::PathBuf;

use hoptrace_protocol::{
    ClockSource, ClockStatus, CountersFrame, Frame, Hello, HopId, Leap, OtelTraceId, Record,
    SentEntry, SentFrame, TraceKey,
};
use serde_json::{Value, json};

fn record(sequence: u64, hop: u8, stamp_ns: i64, otel: bool) -> Record {
    Record {
        key: TraceKey {
            publisher: 7,
            stream: 42,
            sequence,
        },
        hop: HopId(hop),
        stamp_ns,
        metric_count: 50,
        intended_ns: 1_767_225_600_000_000_000,
        otel_trace_id: otel.then_some(OtelTraceId([
            0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e,
            0x47, 0x36,
        ])),
    }
}

fn record_json(r: &Record) -> Value {
    json!({
        "publisher": r.key.publisher, "stream": r.key.stream, "sequence": r.key.sequence,
        "hop": r.hop.0, "stamp_ns": r.stamp_ns, "metric_count": r.metric_count,
        "intended_ns": r.intended_ns,
        "otel_trace_id": r.otel_trace_id.map(|t| hex::encode(t.0)),
    })
}

fn hello(version: u16) -> Frame {
    Frame::Hello(Hello {
        version,
        instance_id: 0x0123_4567_89ab_cdef,
        host: "edge-1".into(),
        process: "flow".into(),
        software: "example 1.0".into(),
        token: "s3cret".into(),
        hops: vec![(HopId(1), "flow_in".into()), (HopId(2), "flow_out".into())],
    })
}

fn hello_json(version: u16) -> Value {
    json!({"version": version, "instance_id": "0x0123456789abcdef", "host": "edge-1",
           "process": "flow", "software": "example 1.0", "token": "s3cret",
           "hops": [[1, "flow_in"], [2, "flow_out"]]})
}

/// (name, protocol versions it belongs to, frame, its fields as JSON).
fn vectors() -> Vec<(&'static str, &'static str, Frame, Value)> {
    let r1 = record(1000, 1, 1_767_225_600_001_250_000, false);
    let r2 = record(1001, 2, 1_767_225_600_002_500_000, true);
    let clock = ClockStatus {
        at_ns: 1_767_225_600_000_000_000,
        source: ClockSource::Chrony,
        synced: true,
        leap: Leap::None,
        offset_ns: -1_250,
        error_bound_ns: 35_000,
        detail: "ref 10.0.0.1 stratum 2".into(),
    };
    vec![
        ("hello, version 1", "1", hello(1), hello_json(1)),
        ("hello, version 2", "2", hello(2), hello_json(2)),
        (
            "records, two records (the second with an OpenTelemetry trace id)",
            "1",
            Frame::Records(vec![r1, r2]),
            json!({"records": [record_json(&r1), record_json(&r2)]}),
        ),
        (
            "seq records, frame number 3",
            "2",
            Frame::SeqRecords {
                seq: 3,
                records: vec![r1, r2],
            },
            json!({"seq": 3, "records": [record_json(&r1), record_json(&r2)]}),
        ),
        (
            "clock",
            "1, 2",
            Frame::Clock(clock),
            json!({"at_ns": 1_767_225_600_000_000_000_i64, "source": "chrony (2)",
                   "synced": true, "leap": "none (0)", "offset_ns": -1250,
                   "error_bound_ns": 35000, "detail": "ref 10.0.0.1 stratum 2"}),
        ),
        (
            "counters",
            "1, 2",
            Frame::Counters(CountersFrame {
                at_ns: 1_767_225_601_000_000_000,
                values: vec![(1, 2000), (3, 1990), (10, 12), (12, 0)],
            }),
            json!({"at_ns": 1_767_225_601_000_000_000_i64,
                   "values": [["reported", 1, 2000], ["sent", 3, 1990], ["resent", 10, 12],
                              ["lost_unacked", 12, 0]]}),
        ),
        (
            "sent",
            "1, 2",
            Frame::Sent(SentFrame {
                publisher: 7,
                entries: vec![SentEntry {
                    stream: 42,
                    messages: 1002,
                    metrics: 50_100,
                    first_sequence: 0,
                    last_sequence: 1001,
                }],
            }),
            json!({"publisher": 7, "entries": [{"stream": 42, "messages": 1002,
                   "metrics": 50100, "first_sequence": 0, "last_sequence": 1001}]}),
        ),
        (
            "sent, no entries (valid: a publisher that has sent nothing yet; changes nothing)",
            "1, 2",
            Frame::Sent(SentFrame {
                publisher: 7,
                entries: Vec::new(),
            }),
            json!({"publisher": 7, "entries": []}),
        ),
        ("goodbye", "1, 2", Frame::Goodbye, json!({})),
        (
            "welcome, version 1",
            "1",
            Frame::Welcome {
                version: 1,
                run_id: "run-20260101T000000Z".into(),
                resume_seq: 0,
            },
            json!({"version": 1, "run_id": "run-20260101T000000Z"}),
        ),
        (
            "welcome, version 2, resume after frame 2",
            "2",
            Frame::Welcome {
                version: 2,
                run_id: "run-20260101T000000Z".into(),
                resume_seq: 2,
            },
            json!({"version": 2, "run_id": "run-20260101T000000Z", "resume_seq": 2}),
        ),
        (
            "ack of frames up to 3",
            "2",
            Frame::Ack { seq: 3 },
            json!({"seq": 3}),
        ),
        (
            "reject, bad token",
            "1, 2",
            Frame::Reject {
                code: 2,
                reason: "bad token".into(),
            },
            json!({"code": 2, "reason": "bad token"}),
        ),
    ]
}

fn path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../probe/testdata/protocol-vectors.json")
}

#[test]
fn every_example_frame_has_exactly_the_listed_bytes_and_decodes_back() {
    let made: Vec<Value> = vectors()
        .into_iter()
        .map(|(name, versions, frame, fields)| {
            let bytes = frame.to_bytes().unwrap();
            // Bytes: u32 length (type + body), type, body.
            let (ty, body) = (bytes[4], &bytes[5..]);
            assert_eq!(
                u32::from_le_bytes(bytes[..4].try_into().unwrap()) as usize,
                bytes.len() - 4,
                "{name}: the length prefix counts the type byte and the body"
            );
            assert_eq!(Frame::decode(ty, body).unwrap(), frame, "{name}");
            json!({"name": name, "versions": versions, "type": format!("0x{ty:02x}"),
                   "fields": fields, "hex": hex::encode(&bytes)})
        })
        .collect();
    let doc = json!({
        "about": "Example frames of the hoptrace collector protocol (docs/collector-protocol.md), versions 1 and 2. hex is the whole frame: u32 little-endian length of type + body, the type byte, the body. Checked by protocol/tests/protocol_vectors.rs.",
        "frames": made,
    });
    let text = serde_json::to_string_pretty(&doc).unwrap() + "\n";
    if std::env::var("HOPTRACE_BLESS").as_deref() == Ok("1") {
        std::fs::write(path(), &text).unwrap();
        return;
    }
    let file = std::fs::read_to_string(path())
        .unwrap_or_else(|e| panic!("{}: {e} (HOPTRACE_BLESS=1 writes it)", path().display()));
    let on_disk: Value = serde_json::from_str(&file).unwrap();
    assert_eq!(
        on_disk["frames"].as_array().map(Vec::len),
        Some(made.len()),
        "the file lists other frames than this test makes"
    );
    for (disk, new) in on_disk["frames"].as_array().unwrap().iter().zip(&made) {
        assert_eq!(
            disk, new,
            "protocol-vectors.json differs for {}",
            new["name"]
        );
    }
}

/// The number that follows `before` in `text`, thousands separators allowed.
fn number_after(text: &str, before: &str) -> Option<usize> {
    let at = text.find(before)? + before.len();
    let digits: String = text[at..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == ',')
        .filter(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

#[test]
fn the_protocol_document_states_the_limits_the_code_applies() {
    use hoptrace_protocol::{MAX_HELLO_LEN, MAX_SENT_PER_FRAME};
    let doc_path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/collector-protocol.md");
    let doc = std::fs::read_to_string(&doc_path).unwrap();
    assert_eq!(
        number_after(&doc, "the largest possible Hello ("),
        Some(MAX_HELLO_LEN),
        "{}: the largest Hello",
        doc_path.display()
    );
    assert_eq!(
        number_after(&doc, "| count S | u32, 0 to "),
        Some(MAX_SENT_PER_FRAME),
        "{}: the entries of a Sent frame (0 allowed: the decoder accepts an empty one)",
        doc_path.display()
    );
    // The decoder accepts a Sent frame without entries, as the document says.
    let empty = Frame::Sent(SentFrame {
        publisher: 3,
        entries: Vec::new(),
    });
    let bytes = empty.to_bytes().unwrap();
    assert_eq!(
        hoptrace_protocol::read_frame(&mut &bytes[..], MAX_HELLO_LEN).unwrap(),
        empty
    );
}
