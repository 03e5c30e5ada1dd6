//! Message payloads: a text scalar, a JSON scalar, a JSON batch of metrics, or raw bytes.
//! Values are deterministic (a hash of stream, sequence and metric index), so a run can be
//! repeated byte for byte.
//!
//! A JSON payload can also carry the message's trace context, as its last field
//! [`CONTEXT_FIELD`] (`"hoptrace"`) holding the context's text form as it left the
//! publisher (`ht1.…`, the publish stamp included; `docs/trace-format.md`, "Payload
//! field"). Pipelines that keep a payload's fields carry it into the store, where a store
//! tap finds it.

use hoptrace_probe::TraceContext;
use hoptrace_probe::context::MAX_TEXT_LEN;

/// The JSON field of a payload that carries the trace context's text form.
pub const CONTEXT_FIELD: &str = "hoptrace";

/// What a message's payload looks like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadFormat {
    /// A number as text, e.g. `21.53` (one metric per message).
    Text,
    /// `{"timestamp_ms":1700000000000,"value":21.53}` (one metric per message).
    Json,
    /// `{"timestamp_ms":...,"metrics":[{"name":"m0","value":21.53},...]}`.
    JsonBatch,
    /// `bytes` bytes of `x` (any number of metrics; for throughput runs).
    Raw {
        /// Payload size.
        bytes: usize,
    },
}

impl PayloadFormat {
    /// Parses `text`, `json`, `json-batch` or `raw:<bytes>`.
    ///
    /// # Errors
    /// A message naming the accepted forms.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            "json-batch" | "json_batch" | "batch" => Ok(Self::JsonBatch),
            _ => match s.strip_prefix("raw:").map(str::parse::<usize>) {
                Some(Ok(bytes)) => Ok(Self::Raw { bytes }),
                _ => Err(format!(
                    "{s:?} is not a payload format: text, json, json-batch or raw:<bytes>"
                )),
            },
        }
    }

    /// The format as [`parse`](Self::parse) reads it: `text`, `json`, `json-batch`,
    /// `raw:<bytes>`.
    #[must_use]
    pub fn spelling(self) -> String {
        match self {
            Self::Text => "text".into(),
            Self::Json => "json".into(),
            Self::JsonBatch => "json-batch".into(),
            Self::Raw { bytes } => format!("raw:{bytes}"),
        }
    }

    /// The default for `metrics_per_message`: a JSON scalar for one metric, a JSON batch
    /// for more.
    #[must_use]
    pub fn default_for(metrics_per_message: u32) -> Self {
        if metrics_per_message <= 1 {
            Self::Json
        } else {
            Self::JsonBatch
        }
    }

    /// Checks that the format can carry `metrics_per_message` metrics.
    ///
    /// # Errors
    /// A message when a scalar format is asked to carry more than one metric.
    pub fn check(self, metrics_per_message: u32) -> Result<(), String> {
        match self {
            Self::Text | Self::Json if metrics_per_message != 1 => Err(format!(
                "a {} payload carries exactly one metric, not {metrics_per_message}: use json-batch or raw:<bytes>",
                if self == Self::Text { "text" } else { "json" }
            )),
            _ => Ok(()),
        }
    }

    /// Whether the format is a JSON object that can carry [`CONTEXT_FIELD`].
    #[must_use]
    pub fn is_json(self) -> bool {
        matches!(self, Self::Json | Self::JsonBatch)
    }

    /// Writes the payload of message `sequence` of `stream` into `out` (cleared first).
    pub fn write(
        self,
        out: &mut Vec<u8>,
        stream: u32,
        sequence: u64,
        metrics: u32,
        timestamp_ms: i64,
    ) {
        out.clear();
        match self {
            Self::Text => write_value(out, value(stream, sequence, 0)),
            Self::Json => {
                out.extend_from_slice(b"{\"timestamp_ms\":");
                write_int(out, timestamp_ms);
                out.extend_from_slice(b",\"value\":");
                write_value(out, value(stream, sequence, 0));
                out.push(b'}');
            }
            Self::JsonBatch => {
                out.extend_from_slice(b"{\"timestamp_ms\":");
                write_int(out, timestamp_ms);
                out.extend_from_slice(b",\"metrics\":[");
                for j in 0..metrics {
                    if j > 0 {
                        out.push(b',');
                    }
                    out.extend_from_slice(b"{\"name\":\"m");
                    write_int(out, i64::from(j));
                    out.extend_from_slice(b"\",\"value\":");
                    write_value(out, value(stream, sequence, j));
                    out.push(b'}');
                }
                out.extend_from_slice(b"]}");
            }
            Self::Raw { bytes } => out.resize(bytes, b'x'),
        }
    }
}

/// Makes `ctx`'s text form the last field of the JSON object `buf[..base]` (a payload of a
/// JSON format): `buf` becomes `buf[..base - 1]` + `,"hoptrace":"ht1.…"}`. Whatever `buf`
/// held after `base` is replaced, so a retry with a new stamp calls it again with the
/// same `base`. Never allocates once `buf` has grown to hold the field.
///
/// # Panics
/// When `buf[..base]` does not end with `}` (not a JSON object).
pub fn put_context_field(buf: &mut Vec<u8>, base: usize, ctx: &TraceContext) {
    assert!(
        base > 0 && base <= buf.len(),
        "the payload is not a JSON object"
    );
    if buf.len() > base {
        // A field put by an earlier call replaced the closing brace at base - 1.
        buf.truncate(base);
        buf[base - 1] = b'}';
    }
    assert!(buf[base - 1] == b'}', "the payload is not a JSON object");
    buf.truncate(base - 1);
    let mut text = [0u8; MAX_TEXT_LEN];
    let text = ctx.encode_text(&mut text);
    // An object with no field yet ("{}") takes no comma.
    if buf.last() != Some(&b'{') {
        buf.push(b',');
    }
    buf.push(b'"');
    buf.extend_from_slice(CONTEXT_FIELD.as_bytes());
    buf.extend_from_slice(b"\":\"");
    buf.extend_from_slice(text.as_bytes());
    buf.extend_from_slice(b"\"}");
}

/// A value in hundredths, from 0.00 to 99.99.
#[inline]
fn value(stream: u32, sequence: u64, metric: u32) -> u64 {
    let mut h = crate::uns::SplitMix64::new(
        u64::from(stream) << 32 ^ sequence.rotate_left(17) ^ u64::from(metric) << 48,
    );
    h.below(10_000)
}

fn write_value(out: &mut Vec<u8>, hundredths: u64) {
    write_int(out, (hundredths / 100) as i64);
    let cents = (hundredths % 100) as u8;
    out.extend_from_slice(&[b'.', b'0' + cents / 10, b'0' + cents % 10]);
}

/// Appends `n` in decimal. Payloads are written for every message at the full rate, and
/// `write!` through `fmt` costs several times more than this.
fn write_int(out: &mut Vec<u8>, n: i64) {
    if n < 0 {
        out.push(b'-');
    }
    let mut v = n.unsigned_abs();
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        let mut out = Vec::new();
        PayloadFormat::Text.write(&mut out, 1, 2, 1, 5);
        let text = String::from_utf8(out.clone()).unwrap();
        assert!(text.parse::<f64>().is_ok(), "{text}");
        PayloadFormat::Json.write(&mut out, 1, 2, 1, 1_700_000_000_123);
        let json = String::from_utf8(out.clone()).unwrap();
        assert_eq!(
            json,
            format!("{{\"timestamp_ms\":1700000000123,\"value\":{text}}}")
        );
        PayloadFormat::JsonBatch.write(&mut out, 1, 2, 3, 7);
        let batch = String::from_utf8(out.clone()).unwrap();
        assert!(batch.starts_with("{\"timestamp_ms\":7,\"metrics\":[{\"name\":\"m0\",\"value\":"));
        assert_eq!(batch.matches("\"name\"").count(), 3);
        assert!(batch.ends_with("}]}"));
        PayloadFormat::Raw { bytes: 100 }.write(&mut out, 1, 2, 3, 7);
        assert_eq!(out, vec![b'x'; 100]);
    }

    #[test]
    fn numbers_are_written_as_fmt_writes_them() {
        for n in [
            0,
            7,
            9,
            10,
            99,
            100,
            12_345,
            -1,
            -10,
            1_700_000_000_123,
            i64::MAX,
            i64::MIN,
        ] {
            let mut out = Vec::new();
            write_int(&mut out, n);
            assert_eq!(String::from_utf8(out).unwrap(), n.to_string());
        }
        for h in [0, 1, 9, 10, 99, 100, 101, 2153, 9_999] {
            let mut out = Vec::new();
            write_value(&mut out, h);
            assert_eq!(
                String::from_utf8(out).unwrap(),
                format!("{}.{:02}", h / 100, h % 100)
            );
        }
    }

    #[test]
    fn the_context_field_is_the_last_field_and_decodes() {
        use hoptrace_probe::{HopId, Stamp, TraceKey};
        let key = TraceKey {
            publisher: 7,
            stream: 3,
            sequence: 99,
        };
        let mut ctx = TraceContext::new(key, 1, 1_700_000_000_000_000_000);
        ctx.push_stamp(Stamp {
            hop: HopId(0),
            ns: 1_700_000_000_000_001_000,
        })
        .unwrap();
        for format in [PayloadFormat::Json, PayloadFormat::JsonBatch] {
            let mut out = Vec::new();
            format.write(&mut out, 3, 99, 2, 1_700_000_000_000);
            let base = out.len();
            put_context_field(&mut out, base, &ctx);
            // Again, as a retry with a new stamp does: the field is replaced, not added.
            put_context_field(&mut out, base, &ctx);
            let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
            let text = v[CONTEXT_FIELD].as_str().unwrap();
            assert_eq!(text, ctx.to_text());
            assert_eq!(TraceContext::decode_text(text).unwrap(), ctx);
            assert_eq!(v["timestamp_ms"], 1_700_000_000_000_i64);
            assert!(out.ends_with(b"\"}"));
        }
        let mut empty = b"{}".to_vec();
        put_context_field(&mut empty, 2, &ctx);
        let v: serde_json::Value = serde_json::from_slice(&empty).unwrap();
        assert_eq!(v.as_object().unwrap().len(), 1);
    }

    #[test]
    #[should_panic(expected = "not a JSON object")]
    fn the_context_field_needs_a_json_object() {
        let ctx = TraceContext::new(hoptrace_probe::TraceKey::default(), 1, 0);
        let mut text = b"21.53".to_vec();
        put_context_field(&mut text, 5, &ctx);
    }

    #[test]
    fn deterministic_values() {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        PayloadFormat::JsonBatch.write(&mut a, 9, 99, 20, 1);
        PayloadFormat::JsonBatch.write(&mut b, 9, 99, 20, 1);
        assert_eq!(a, b);
    }

    #[test]
    fn parse_and_check() {
        assert_eq!(
            PayloadFormat::parse("raw:64"),
            Ok(PayloadFormat::Raw { bytes: 64 })
        );
        assert!(PayloadFormat::parse("xml").is_err());
        assert!(PayloadFormat::Json.is_json() && PayloadFormat::JsonBatch.is_json());
        assert!(!PayloadFormat::Text.is_json() && !PayloadFormat::Raw { bytes: 1 }.is_json());
        assert!(PayloadFormat::Text.check(20).is_err());
        assert!(PayloadFormat::JsonBatch.check(20).is_ok());
        assert_eq!(PayloadFormat::default_for(1), PayloadFormat::Json);
        assert_eq!(PayloadFormat::default_for(20), PayloadFormat::JsonBatch);
    }
}
