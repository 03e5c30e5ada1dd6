//! `testdata/trace-vectors.json`, produced by the independent Python implementation of
//! `docs/trace-format.md`, checked in both directions against this crate.

use hoptrace_probe::carrier::envelope;
use hoptrace_probe::{HopId, OtelTraceId, Stamp, TraceContext, TraceKey};
use serde::Deserialize;

#[derive(Deserialize)]
struct Vectors {
    valid: Vec<Valid>,
    invalid: Vec<Invalid>,
}

#[derive(Deserialize)]
struct Valid {
    name: String,
    context: Ctx,
    binary_hex: String,
    text: String,
    envelope_payload_hex: String,
    envelope_hex: String,
}

#[derive(Deserialize)]
struct Ctx {
    publisher: u16,
    stream: u32,
    sequence: u64,
    metric_count: u32,
    intended_ns: i64,
    otel_trace_id: Option<String>,
    stamps: Vec<JsonStamp>,
}

#[derive(Deserialize)]
struct JsonStamp {
    hop: u8,
    ns: i64,
}

#[derive(Deserialize)]
struct Invalid {
    name: String,
    form: String,
    input_hex: Option<String>,
    input_text: Option<String>,
    error: String,
}

fn load() -> Vectors {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/trace-vectors.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn context(c: &Ctx) -> TraceContext {
    let mut ctx = TraceContext::new(
        TraceKey {
            publisher: c.publisher,
            stream: c.stream,
            sequence: c.sequence,
        },
        c.metric_count,
        c.intended_ns,
    );
    ctx.otel_trace_id = c
        .otel_trace_id
        .as_ref()
        .map(|h| OtelTraceId(hex::decode(h).unwrap().try_into().unwrap()));
    for s in &c.stamps {
        ctx.push_stamp(Stamp {
            hop: HopId(s.hop),
            ns: s.ns,
        })
        .unwrap();
    }
    ctx
}

#[test]
fn enough_vectors_of_every_kind() {
    let v = load();
    assert!(v.valid.len() + v.invalid.len() >= 12);
    for form in ["binary", "text", "envelope"] {
        assert!(
            v.invalid.iter().any(|i| i.form == form),
            "no invalid {form} vector"
        );
    }
}

#[test]
fn valid_vectors_encode_and_decode() {
    for v in load().valid {
        let ctx = context(&v.context);
        let name = &v.name;
        assert_eq!(
            hex::encode(ctx.to_bytes()),
            v.binary_hex,
            "{name}: binary encode"
        );
        assert_eq!(ctx.to_text(), v.text, "{name}: text encode");
        let payload = hex::decode(&v.envelope_payload_hex).unwrap();
        assert_eq!(
            hex::encode(envelope::wrap(&ctx, &payload)),
            v.envelope_hex,
            "{name}: envelope"
        );

        let bin = hex::decode(&v.binary_hex).unwrap();
        assert_eq!(TraceContext::decode(&bin), Ok(ctx), "{name}: binary decode");
        assert_eq!(
            TraceContext::decode_text(&v.text),
            Ok(ctx),
            "{name}: text decode"
        );
        let msg = hex::decode(&v.envelope_hex).unwrap();
        let (got, rest) = envelope::decode(&msg).unwrap();
        assert_eq!((got, rest), (ctx, &payload[..]), "{name}: envelope decode");
    }
}

#[test]
fn invalid_vectors_give_the_named_error() {
    for v in load().invalid {
        let got = match v.form.as_str() {
            "binary" => TraceContext::decode(&hex::decode(v.input_hex.unwrap()).unwrap()).map(drop),
            "text" => TraceContext::decode_text(&v.input_text.unwrap()).map(drop),
            "envelope" => envelope::decode(&hex::decode(v.input_hex.unwrap()).unwrap()).map(drop),
            other => panic!("{}: unknown form {other}", v.name),
        };
        assert_eq!(
            got.map_err(|e| e.name()),
            Err(v.error.as_str()),
            "{}",
            v.name
        );
    }
}
