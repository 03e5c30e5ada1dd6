//! OpenTelemetry spans to hop records: which spans stamp which hop (the spec's
//! `[hops.span]`), and which message a span stamps (the message its trace id names, or
//! each message one of its links names; `OtelTraceId::of_key`).

use std::collections::BTreeMap;

use super::wire::{AnyValue, KeyValue, Span, TracesRequest, Value};
use hoptrace_format::spec::{ResolvedSpec, SpanMatch};
use hoptrace_protocol::{HopId, OtelTraceId, Record, TRACE_ID_LEN, TraceKey};

/// The hops of a spec that spans stamp, with their matches.
#[derive(Debug, Clone, Default)]
pub struct SpanHops {
    hops: Vec<(HopId, String, SpanMatch, Option<i32>)>,
}

impl SpanHops {
    /// The hops of `spec` that declare a `span` match.
    #[must_use]
    pub fn new(spec: &ResolvedSpec) -> Self {
        let hops = spec
            .spec()
            .hops
            .iter()
            .zip(spec.hop_ids())
            .filter_map(|(h, id)| {
                let m = h.span.clone()?;
                let kind = m.kind_number();
                Some((*id, h.name.clone(), m, kind))
            })
            .collect();
        Self { hops }
    }

    /// Whether no hop is stamped by spans.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.hops.is_empty()
    }

    /// The hops, as a connection announces them.
    #[must_use]
    pub fn announced(&self) -> Vec<(HopId, String)> {
        self.hops
            .iter()
            .map(|(id, n, ..)| (*id, n.clone()))
            .collect()
    }
}

/// What became of the spans of requests, span by span. Every span is counted once in
/// `spans` and ends in exactly one of `stamped`, `unmatched`, `end_before_start`,
/// `bad_trace_id` or `no_message`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpanCounts {
    /// Spans received.
    pub spans: u64,
    /// Spans that stamped at least one hop of at least one message.
    pub stamped: u64,
    /// Hop stamps made (a span gives one per matching hop and per message it names).
    pub stamps: u64,
    /// Spans that match no hop of the spec.
    pub unmatched: u64,
    /// Spans that match a hop but end before they start.
    pub end_before_start: u64,
    /// Spans that match a hop but whose trace id is not 16 bytes, or all zero, or whose
    /// times do not fit the dataset (after 2262).
    pub bad_trace_id: u64,
    /// Spans that match a hop whose trace id (and links' trace ids) names no message:
    /// not an id `hoptrace publish --traceparent` gave.
    pub no_message: u64,
}

impl SpanCounts {
    /// Spans the request's answer reports as rejected: every span that stamped nothing.
    #[must_use]
    pub fn rejected(&self) -> u64 {
        self.spans - self.stamped
    }

    /// Why spans were rejected, in a sentence; empty when none were.
    #[must_use]
    pub fn rejection_message(&self) -> String {
        let parts: Vec<String> = [
            (self.unmatched, "match no hop of the pipeline"),
            (self.end_before_start, "end before they start"),
            (self.bad_trace_id, "have an invalid trace id or time"),
            (
                self.no_message,
                "have a trace id that names no message (not given by hoptrace publish --traceparent)",
            ),
        ]
        .into_iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, why)| format!("{n} span(s) {why}"))
        .collect();
        parts.join("; ")
    }
}

/// Who sent spans: a resource's `host.name` (or `service.instance.id`), `service.name`
/// and SDK. Its records go to the collector as one probe's.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Source {
    /// `host.name`, else `service.instance.id`, else empty.
    pub host: String,
    /// `service.name`, else empty.
    pub service: String,
    /// `telemetry.sdk.name`, `telemetry.sdk.language` and `telemetry.sdk.version`.
    pub sdk: String,
}

/// An attribute's value as text (a string as is, numbers in decimal, booleans as
/// `true`/`false`); `None` for arrays, maps, bytes and empty values.
fn text(v: Option<&AnyValue>) -> Option<String> {
    Some(match v?.value.as_ref()? {
        Value::String(s) => String::from_utf8_lossy(s).into_owned(),
        Value::Int(i) => i.to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Double(d) => d.to_string(),
    })
}

fn attribute<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a AnyValue> {
    attrs
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
}

fn source_of(attrs: &[KeyValue]) -> Source {
    let get = |k: &str| text(attribute(attrs, k)).unwrap_or_default();
    let host = match get("host.name") {
        h if h.is_empty() => get("service.instance.id"),
        h => h,
    };
    let sdk = [
        "telemetry.sdk.name",
        "telemetry.sdk.language",
        "telemetry.sdk.version",
    ]
    .map(get)
    .into_iter()
    .filter(|s| !s.is_empty())
    .collect::<Vec<_>>()
    .join(" ");
    Source {
        host,
        service: get("service.name"),
        sdk,
    }
}

/// Whether an attribute's value, as text, is `want` (without making the text).
fn equals(v: Option<&AnyValue>, want: &str) -> bool {
    match v.and_then(|v| v.value.as_ref()) {
        Some(Value::String(s)) => s == want.as_bytes(),
        Some(Value::Int(i)) => want.parse::<i64>() == Ok(*i),
        Some(Value::Bool(b)) => want == if *b { "true" } else { "false" },
        Some(Value::Double(d)) => want.parse::<f64>() == Ok(*d),
        None => false,
    }
}

fn matches(m: &SpanMatch, kind: Option<i32>, service: &str, span: &Span) -> bool {
    m.service.as_deref().is_none_or(|s| s == service)
        && kind.is_none_or(|k| k == span.kind)
        && m.name_fits(&span.name)
        && m.attributes
            .iter()
            .all(|(k, v)| equals(attribute(&span.attributes, k), v))
}

/// A trace id as the wire has it: 16 bytes, not all zero.
fn trace_id(bytes: &[u8]) -> Option<OtelTraceId> {
    let id: [u8; TRACE_ID_LEN] = bytes.try_into().ok()?;
    (id != [0; TRACE_ID_LEN]).then_some(OtelTraceId(id))
}

/// Turns the spans of `req` into hop records, grouped by who sent them (`out` is
/// cleared first), and counts what became of every span.
pub fn records(
    req: &TracesRequest,
    hops: &SpanHops,
    out: &mut BTreeMap<Source, Vec<Record>>,
) -> SpanCounts {
    out.clear();
    let mut counts = SpanCounts::default();
    let mut keys: Vec<(TraceKey, OtelTraceId)> = Vec::new();
    for rs in &req.resource_spans {
        let attrs = rs.resource.as_ref().map_or(&[][..], |r| &r.attributes[..]);
        let source = source_of(attrs);
        let service = source.service.clone();
        let recs = out.entry(source).or_default();
        for ss in &rs.scope_spans {
            for span in &ss.spans {
                counts.spans += 1;
                let mut hit = hops
                    .hops
                    .iter()
                    .filter(|(_, _, m, kind)| matches(m, *kind, &service, span))
                    .peekable();
                if hit.peek().is_none() {
                    counts.unmatched += 1;
                    continue;
                }
                let (Ok(start), Ok(end)) = (
                    i64::try_from(span.start_time_unix_nano),
                    i64::try_from(span.end_time_unix_nano),
                ) else {
                    counts.bad_trace_id += 1;
                    continue;
                };
                if end < start {
                    counts.end_before_start += 1;
                    continue;
                }
                let Some(own) = trace_id(&span.trace_id) else {
                    counts.bad_trace_id += 1;
                    continue;
                };
                keys.clear();
                for id in std::iter::once(own)
                    .chain(span.links.iter().filter_map(|l| trace_id(&l.trace_id)))
                {
                    if let Some(k) = id.key()
                        && !keys.iter().any(|(have, _)| *have == k)
                    {
                        keys.push((k, id));
                    }
                }
                if keys.is_empty() {
                    counts.no_message += 1;
                    continue;
                }
                counts.stamped += 1;
                for (hop, _, m, _) in hit {
                    let stamp_ns = if m.stamps_end() { end } else { start };
                    for (key, id) in &keys {
                        recs.push(Record {
                            key: *key,
                            hop: *hop,
                            stamp_ns,
                            metric_count: 0,
                            intended_ns: 0,
                            otel_trace_id: Some(*id),
                        });
                        counts.stamps += 1;
                    }
                }
            }
        }
    }
    out.retain(|_, recs| !recs.is_empty());
    counts
}
