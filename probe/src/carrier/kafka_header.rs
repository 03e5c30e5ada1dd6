//! Kafka record headers (rdkafka): the binary form under the header `hoptrace`.

use rdkafka::message::{Header, Headers, OwnedHeaders};

use super::{CarrierError, Extracted, HEADER, combine};
use crate::context::TraceContext;
use crate::traceparent::TRACEPARENT;

/// Adds the context's binary form to `headers` as the header `hoptrace`.
///
/// A record that already carries a `hoptrace` header keeps it; the one added last wins
/// on extraction.
#[must_use]
pub fn inject(ctx: &TraceContext, headers: OwnedHeaders) -> OwnedHeaders {
    let (bin, n) = ctx.encode();
    headers.insert(Header {
        key: HEADER,
        value: Some(&bin[..n]),
    })
}

/// Takes the context (the last `hoptrace` header) and a `traceparent` from a record's
/// headers.
///
/// # Errors
/// [`CarrierError::NotTraced`] without a `hoptrace` header, [`CarrierError::BadContext`]
/// when its value does not decode.
pub fn extract<H: Headers>(headers: &H) -> Result<Extracted, CarrierError> {
    let mut context = None;
    let mut traceparent = None;
    for h in headers.iter() {
        if h.key == HEADER {
            context = Some(TraceContext::decode(h.value.unwrap_or_default()));
        } else if h.key == TRACEPARENT {
            traceparent = Some(h.value.unwrap_or_default());
        }
    }
    combine(context, traceparent)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::{DecodeError, TraceKey};

    #[test]
    fn round_trip_with_traceparent() {
        let ctx = TraceContext::new(
            TraceKey {
                publisher: 3,
                stream: 4,
                sequence: 5,
            },
            1,
            9,
        );
        let headers = inject(&ctx, OwnedHeaders::new()).insert(Header {
            key: TRACEPARENT,
            value: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
        });
        let got = extract(&headers).unwrap();
        assert_eq!(got.context.key, ctx.key);
        assert_eq!(
            got.context.otel_trace_id.unwrap().to_hex(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
    }

    #[test]
    fn foreign_headers_are_typed_errors() {
        let none = OwnedHeaders::new().insert(Header {
            key: "other",
            value: Some("x"),
        });
        assert_eq!(extract(&none), Err(CarrierError::NotTraced));
        let garbage = OwnedHeaders::new().insert(Header {
            key: HEADER,
            value: Some("garbage"),
        });
        assert!(matches!(
            extract(&garbage),
            Err(CarrierError::BadContext(DecodeError::Truncated { .. }))
        ));
        let null = OwnedHeaders::new().insert(Header::<&[u8]> {
            key: HEADER,
            value: None,
        });
        assert!(matches!(extract(&null), Err(CarrierError::BadContext(_))));
    }
}
