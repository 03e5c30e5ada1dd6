//! MQTT v5 user properties (rumqttc v5): the text form under the property `hoptrace`.

use rumqttc::v5::mqttbytes::v5::PublishProperties;

use super::{CarrierError, Extracted, HEADER, combine};
use crate::context::TraceContext;
use crate::traceparent::TRACEPARENT;

/// Sets the user property `hoptrace` to the context's text form, replacing any
/// `hoptrace` property already there.
pub fn inject(ctx: &TraceContext, props: &mut PublishProperties) {
    inject_user_properties(ctx, &mut props.user_properties);
}

/// As [`inject`], on a bare list of user properties.
pub fn inject_user_properties(ctx: &TraceContext, user_properties: &mut Vec<(String, String)>) {
    user_properties.retain(|(k, _)| k != HEADER);
    user_properties.push((HEADER.to_owned(), ctx.to_text()));
}

/// Takes the context (the last `hoptrace` property) and a `traceparent` from a publish's
/// properties; `None` (a publish without properties) is not traced.
///
/// # Errors
/// [`CarrierError::NotTraced`] without a `hoptrace` property, [`CarrierError::BadContext`]
/// when its value does not decode.
pub fn extract(props: Option<&PublishProperties>) -> Result<Extracted, CarrierError> {
    extract_user_properties(props.map_or(&[][..], |p| &p.user_properties))
}

/// As [`extract`], on a bare list of user properties.
///
/// # Errors
/// As [`extract`].
pub fn extract_user_properties(
    user_properties: &[(String, String)],
) -> Result<Extracted, CarrierError> {
    let mut context = None;
    let mut traceparent = None;
    for (k, v) in user_properties {
        if k == HEADER {
            context = Some(TraceContext::decode_text(v));
        } else if k == TRACEPARENT {
            traceparent = Some(v.as_bytes());
        }
    }
    combine(context, traceparent)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::{DecodeError, TraceKey};

    #[test]
    fn inject_replaces_and_extract_reads() {
        let a = TraceContext::new(
            TraceKey {
                publisher: 1,
                stream: 1,
                sequence: 1,
            },
            1,
            1,
        );
        let b = TraceContext::new(
            TraceKey {
                publisher: 1,
                stream: 1,
                sequence: 2,
            },
            1,
            1,
        );
        let mut props = PublishProperties::default();
        props
            .user_properties
            .push(("site".into(), "plant-7".into()));
        inject(&a, &mut props);
        inject(&b, &mut props);
        assert_eq!(props.user_properties.len(), 2);
        assert_eq!(extract(Some(&props)).unwrap().context, b);
    }

    #[test]
    fn foreign_properties_are_typed_errors() {
        assert_eq!(extract(None), Err(CarrierError::NotTraced));
        let bad = vec![(HEADER.to_owned(), "ht2.AAAA".to_owned())];
        assert_eq!(
            extract_user_properties(&bad),
            Err(CarrierError::BadContext(DecodeError::BadTextPrefix))
        );
    }
}
