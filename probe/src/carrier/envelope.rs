//! The envelope form: the binary context in front of an opaque payload, for MQTT 3.1.1
//! and transports without headers. Layout in `docs/trace-format.md`.

use super::{CarrierError, Extracted};
use crate::context::{DecodeError, MAX_BINARY_LEN, TraceContext};

/// The four bytes every envelope starts with: `0xFF` then ASCII `HT1`.
pub const MAGIC: [u8; 4] = [0xFF, b'H', b'T', b'1'];
/// Bytes in front of the binary context (magic and length byte).
pub const PREFIX_LEN: usize = MAGIC.len() + 1;
/// Most bytes an envelope adds to a payload.
pub const MAX_OVERHEAD: usize = PREFIX_LEN + MAX_BINARY_LEN;

/// Appends the envelope of `ctx` and then `payload` to `out`.
pub fn wrap_into(ctx: &TraceContext, payload: &[u8], out: &mut Vec<u8>) {
    let (bin, n) = ctx.encode();
    out.reserve(PREFIX_LEN + n + payload.len());
    out.extend_from_slice(&MAGIC);
    out.push(u8::try_from(n).expect("a context is at most 188 bytes"));
    out.extend_from_slice(&bin[..n]);
    out.extend_from_slice(payload);
}

/// The envelope of `ctx` around `payload`, as a new buffer.
#[must_use]
pub fn wrap(ctx: &TraceContext, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    wrap_into(ctx, payload, &mut out);
    out
}

/// Splits an enveloped message into its context and the original payload.
///
/// # Errors
/// [`CarrierError::NotTraced`] when `message` does not start with [`MAGIC`] (use it as
/// the payload unchanged); [`CarrierError::BadContext`] when the envelope is truncated or
/// its context does not decode.
pub fn unwrap(message: &[u8]) -> Result<(Extracted, &[u8]), CarrierError> {
    if !message.starts_with(&MAGIC) {
        return Err(CarrierError::NotTraced);
    }
    let Some(&len) = message.get(MAGIC.len()) else {
        return Err(DecodeError::Truncated {
            needed: PREFIX_LEN,
            have: message.len(),
        }
        .into());
    };
    let end = PREFIX_LEN + usize::from(len);
    let Some(bin) = message.get(PREFIX_LEN..end) else {
        return Err(DecodeError::Truncated {
            needed: end,
            have: message.len(),
        }
        .into());
    };
    let context = TraceContext::decode(bin)?;
    Ok((
        Extracted {
            context,
            bad_traceparent: None,
        },
        &message[end..],
    ))
}

/// Like [`unwrap`], but reports a missing envelope as
/// [`DecodeError::NotEnveloped`], the name the test vectors use.
///
/// # Errors
/// As [`unwrap`].
pub fn decode(message: &[u8]) -> Result<(TraceContext, &[u8]), DecodeError> {
    match unwrap(message) {
        Ok((e, payload)) => Ok((e.context, payload)),
        Err(CarrierError::NotTraced) => Err(DecodeError::NotEnveloped),
        Err(CarrierError::BadContext(e)) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::tests::arb_context;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trip(c in arb_context(), payload in proptest::collection::vec(any::<u8>(), 0..64)) {
            let msg = wrap(&c, &payload);
            let (got, rest) = decode(&msg).unwrap();
            prop_assert_eq!(got, c);
            prop_assert_eq!(rest, &payload[..]);
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = unwrap(&bytes);
            let mut enveloped = MAGIC.to_vec();
            enveloped.extend_from_slice(&bytes);
            let _ = unwrap(&enveloped);
        }
    }

    #[test]
    fn text_payload_is_not_enveloped() {
        assert_eq!(
            decode(br#"{"v":1}"#).unwrap_err(),
            DecodeError::NotEnveloped
        );
    }
}
