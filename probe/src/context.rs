//! Trace context v1: the fields that travel with a message, and their binary and text
//! forms. The byte layout is specified in `docs/trace-format.md`.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
pub use hoptrace_protocol::{HopId, OtelTraceId, TRACE_ID_LEN, TraceKey};

/// Version byte of the binary form.
pub const VERSION: u8 = 1;
/// Most stamps one context holds.
pub const MAX_STAMPS: usize = 16;
/// Length of the fixed header of the binary form.
pub const HEADER_LEN: usize = 28;
/// Length of one encoded stamp (hop id + i64).
pub const STAMP_LEN: usize = 9;
/// Longest binary form: header, trace id and 16 stamps.
pub const MAX_BINARY_LEN: usize = HEADER_LEN + TRACE_ID_LEN + STAMP_LEN * MAX_STAMPS;
/// Prefix of the text form.
pub const TEXT_PREFIX: &str = "ht1.";
/// Longest text form.
pub const MAX_TEXT_LEN: usize = TEXT_PREFIX.len() + (MAX_BINARY_LEN * 4).div_ceil(3);

const INFO_COUNT_MASK: u8 = 0b0001_1111;
const INFO_RESERVED_MASK: u8 = 0b0110_0000;
const INFO_TRACE_ID: u8 = 0b1000_0000;

/// One hop's timestamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stamp {
    /// The hop that took the stamp.
    pub hop: HopId,
    /// CLOCK_REALTIME nanoseconds since the Unix epoch.
    pub ns: i64,
}

/// What travels with a message. `Copy`, fixed-size, never allocates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceContext {
    /// Which message this is.
    pub key: TraceKey,
    /// How many metrics the message carries.
    pub metric_count: u32,
    /// When the open-loop schedule meant the message to be sent (CLOCK_REALTIME ns).
    pub intended_ns: i64,
    /// Trace id of a `traceparent` that travelled with the message.
    pub otel_trace_id: Option<OtelTraceId>,
    stamps: [Stamp; MAX_STAMPS],
    len: u8,
}

/// Why a trace context could not be decoded. Names follow `docs/trace-format.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The input ended before the layout said it would; the sender truncated it.
    #[error("truncated: need {needed} bytes, have {have}")]
    Truncated {
        /// Bytes the layout requires.
        needed: usize,
        /// Bytes present.
        have: usize,
    },
    /// Byte 0 is not version 1; the sender speaks another version.
    #[error("unsupported version {0}")]
    UnsupportedVersion(u8),
    /// More than 16 stamps declared.
    #[error("too many stamps: {0} (at most 16)")]
    TooManyStamps(u8),
    /// Reserved bits of the info byte are set.
    #[error("reserved bits set in info byte {0:#04x}")]
    ReservedBits(u8),
    /// Bytes follow the last stamp.
    #[error("{0} trailing bytes after the context")]
    TrailingBytes(usize),
    /// A present trace id is all zeros.
    #[error("trace id is all zeros")]
    InvalidTraceId,
    /// A text form does not start with `ht1.`.
    #[error("text form does not start with \"ht1.\"")]
    BadTextPrefix,
    /// A text form is not unpadded base64url.
    #[error("text form is not unpadded base64url")]
    BadBase64,
    /// A payload does not start with the envelope magic.
    #[error("payload is not enveloped")]
    NotEnveloped,
}

impl DecodeError {
    /// The error's name in `docs/trace-format.md` and the test vectors.
    #[must_use]
    pub fn name(&self) -> &'static str {
        match self {
            Self::Truncated { .. } => "truncated",
            Self::UnsupportedVersion(_) => "unsupported_version",
            Self::TooManyStamps(_) => "too_many_stamps",
            Self::ReservedBits(_) => "reserved_bits",
            Self::TrailingBytes(_) => "trailing_bytes",
            Self::InvalidTraceId => "invalid_trace_id",
            Self::BadTextPrefix => "bad_text_prefix",
            Self::BadBase64 => "bad_base64",
            Self::NotEnveloped => "not_enveloped",
        }
    }
}

/// A context already holds [`MAX_STAMPS`] stamps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("context already holds 16 stamps")]
pub struct StampsFull;

impl TraceContext {
    /// A context with no stamps.
    #[must_use]
    pub const fn new(key: TraceKey, metric_count: u32, intended_ns: i64) -> Self {
        Self {
            key,
            metric_count,
            intended_ns,
            otel_trace_id: None,
            stamps: [Stamp {
                hop: HopId(0),
                ns: 0,
            }; MAX_STAMPS],
            len: 0,
        }
    }

    /// The stamps appended so far, oldest first.
    #[must_use]
    pub fn stamps(&self) -> &[Stamp] {
        &self.stamps[..usize::from(self.len)]
    }

    /// The most recent stamp taken by `hop`.
    #[must_use]
    pub fn stamp_of(&self, hop: HopId) -> Option<Stamp> {
        self.stamps().iter().rev().find(|s| s.hop == hop).copied()
    }

    /// Appends a stamp.
    ///
    /// # Errors
    /// [`StampsFull`] when the context already holds 16 stamps; it is left unchanged.
    #[inline]
    pub fn push_stamp(&mut self, stamp: Stamp) -> Result<(), StampsFull> {
        let i = usize::from(self.len);
        if i >= MAX_STAMPS {
            return Err(StampsFull);
        }
        self.stamps[i] = stamp;
        self.len += 1;
        Ok(())
    }

    /// Length of the binary form.
    #[must_use]
    pub fn binary_len(&self) -> usize {
        HEADER_LEN
            + if self.otel_trace_id.is_some() {
                TRACE_ID_LEN
            } else {
                0
            }
            + STAMP_LEN * usize::from(self.len)
    }

    /// Writes the binary form into `out` and returns its length.
    ///
    /// # Panics
    /// If `out` is shorter than [`Self::binary_len`] (use a `[u8; MAX_BINARY_LEN]`).
    pub fn encode_into(&self, out: &mut [u8]) -> usize {
        let n = self.binary_len();
        let out = &mut out[..n];
        out[0] = VERSION;
        out[1] = self.len
            | if self.otel_trace_id.is_some() {
                INFO_TRACE_ID
            } else {
                0
            };
        out[2..16].copy_from_slice(&self.key.to_le_bytes());
        out[16..20].copy_from_slice(&self.metric_count.to_le_bytes());
        out[20..28].copy_from_slice(&self.intended_ns.to_le_bytes());
        let mut at = HEADER_LEN;
        if let Some(id) = self.otel_trace_id {
            out[at..at + TRACE_ID_LEN].copy_from_slice(&id.0);
            at += TRACE_ID_LEN;
        }
        for s in self.stamps() {
            out[at] = s.hop.0;
            out[at + 1..at + STAMP_LEN].copy_from_slice(&s.ns.to_le_bytes());
            at += STAMP_LEN;
        }
        n
    }

    /// The binary form as a fixed buffer and its length. No allocation.
    #[must_use]
    pub fn encode(&self) -> ([u8; MAX_BINARY_LEN], usize) {
        let mut buf = [0u8; MAX_BINARY_LEN];
        let n = self.encode_into(&mut buf);
        (buf, n)
    }

    /// The binary form as a `Vec`.
    #[must_use]
    pub fn to_bytes(&self) -> Vec<u8> {
        let (buf, n) = self.encode();
        buf[..n].to_vec()
    }

    /// Decodes the binary form; `bytes` must hold exactly one context.
    ///
    /// # Errors
    /// A [`DecodeError`] naming the first rule of `docs/trace-format.md` the input breaks.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        Self::parse(bytes, true).map(|(ctx, _)| ctx)
    }

    /// Decodes a context at the start of `bytes` and returns it with the bytes it used.
    ///
    /// # Errors
    /// As [`Self::decode`], except that trailing bytes are allowed.
    pub fn decode_prefix(bytes: &[u8]) -> Result<(Self, usize), DecodeError> {
        Self::parse(bytes, false)
    }

    /// Applies the rules of `docs/trace-format.md` in the order its table lists them.
    fn parse(bytes: &[u8], exact: bool) -> Result<(Self, usize), DecodeError> {
        if bytes.len() < HEADER_LEN {
            return Err(DecodeError::Truncated {
                needed: HEADER_LEN,
                have: bytes.len(),
            });
        }
        if bytes[0] != VERSION {
            return Err(DecodeError::UnsupportedVersion(bytes[0]));
        }
        let info = bytes[1];
        let count = info & INFO_COUNT_MASK;
        if usize::from(count) > MAX_STAMPS {
            return Err(DecodeError::TooManyStamps(count));
        }
        if info & INFO_RESERVED_MASK != 0 {
            return Err(DecodeError::ReservedBits(info));
        }
        let has_id = info & INFO_TRACE_ID != 0;
        let needed =
            HEADER_LEN + if has_id { TRACE_ID_LEN } else { 0 } + STAMP_LEN * usize::from(count);
        if bytes.len() < needed {
            return Err(DecodeError::Truncated {
                needed,
                have: bytes.len(),
            });
        }
        if exact && bytes.len() > needed {
            return Err(DecodeError::TrailingBytes(bytes.len() - needed));
        }
        let mut ctx = Self::new(
            TraceKey {
                publisher: u16::from_le_bytes([bytes[2], bytes[3]]),
                stream: u32::from_le_bytes(arr(&bytes[4..8])),
                sequence: u64::from_le_bytes(arr(&bytes[8..16])),
            },
            u32::from_le_bytes(arr(&bytes[16..20])),
            i64::from_le_bytes(arr(&bytes[20..28])),
        );
        let mut at = HEADER_LEN;
        if has_id {
            let id: [u8; TRACE_ID_LEN] = arr(&bytes[at..at + TRACE_ID_LEN]);
            if id == [0; TRACE_ID_LEN] {
                return Err(DecodeError::InvalidTraceId);
            }
            ctx.otel_trace_id = Some(OtelTraceId(id));
            at += TRACE_ID_LEN;
        }
        for i in 0..usize::from(count) {
            ctx.stamps[i] = Stamp {
                hop: HopId(bytes[at]),
                ns: i64::from_le_bytes(arr(&bytes[at + 1..at + STAMP_LEN])),
            };
            at += STAMP_LEN;
        }
        ctx.len = count;
        Ok((ctx, needed))
    }

    /// Writes the text form (`ht1.` + unpadded base64url) into `out` and returns it.
    pub fn encode_text<'a>(&self, out: &'a mut [u8; MAX_TEXT_LEN]) -> &'a str {
        let (bin, n) = self.encode();
        out[..TEXT_PREFIX.len()].copy_from_slice(TEXT_PREFIX.as_bytes());
        let written = URL_SAFE_NO_PAD
            .encode_slice(&bin[..n], &mut out[TEXT_PREFIX.len()..])
            .expect("MAX_TEXT_LEN holds any context");
        std::str::from_utf8(&out[..TEXT_PREFIX.len() + written]).expect("base64 is ASCII")
    }

    /// The text form as a `String`.
    #[must_use]
    pub fn to_text(&self) -> String {
        let mut buf = [0u8; MAX_TEXT_LEN];
        self.encode_text(&mut buf).to_owned()
    }

    /// Decodes the text form.
    ///
    /// # Errors
    /// [`DecodeError::BadTextPrefix`], [`DecodeError::BadBase64`], or any error of the
    /// binary form.
    pub fn decode_text(text: &str) -> Result<Self, DecodeError> {
        let b64 = text
            .strip_prefix(TEXT_PREFIX)
            .ok_or(DecodeError::BadTextPrefix)?;
        if b64.len() > MAX_TEXT_LEN - TEXT_PREFIX.len() {
            // Longer than any context: an error path, so decoding into a Vec is fine.
            let bytes = URL_SAFE_NO_PAD
                .decode(b64)
                .map_err(|_| DecodeError::BadBase64)?;
            return Self::decode(&bytes);
        }
        let mut buf = [0u8; MAX_BINARY_LEN + 3];
        let n = URL_SAFE_NO_PAD
            .decode_slice(b64, &mut buf)
            .map_err(|_| DecodeError::BadBase64)?;
        Self::decode(&buf[..n])
    }
}

fn arr<const N: usize>(s: &[u8]) -> [u8; N] {
    s.try_into().expect("length checked by the caller")
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    fn example() -> TraceContext {
        let mut c = TraceContext::new(
            TraceKey {
                publisher: 1,
                stream: 2,
                sequence: 3,
            },
            50,
            1_700_000_000_000_000_000,
        );
        c.push_stamp(Stamp {
            hop: HopId(0),
            ns: 1_700_000_000_000_001_000,
        })
        .unwrap();
        c
    }

    #[test]
    fn documented_example_bytes() {
        let hex = "010101000200000003000000000000003200000000002a36fe9c9717\
                   00e8032a36fe9c9717";
        assert_eq!(hex::encode(example().to_bytes()), hex);
    }

    #[test]
    fn four_stamps_fit_in_64_bytes() {
        let mut c = example();
        for i in 1..4 {
            c.push_stamp(Stamp {
                hop: HopId(i),
                ns: 5,
            })
            .unwrap();
        }
        assert_eq!(c.to_bytes().len(), 64);
    }

    #[test]
    fn seventeenth_stamp_is_refused_and_context_unchanged() {
        let mut c = example();
        for _ in 1..MAX_STAMPS {
            c.push_stamp(Stamp::default()).unwrap();
        }
        let before = c;
        assert_eq!(c.push_stamp(Stamp::default()), Err(StampsFull));
        assert_eq!(c, before);
        assert_eq!(c.to_bytes().len(), HEADER_LEN + 16 * STAMP_LEN);
    }

    #[test]
    fn overlong_text_is_rejected_not_panicking() {
        let text = format!("{TEXT_PREFIX}{}", "A".repeat(1000));
        assert!(TraceContext::decode_text(&text).is_err());
        let text = format!("{}{}", example().to_text(), "AAAA".repeat(100));
        assert!(matches!(
            TraceContext::decode_text(&text),
            Err(DecodeError::TrailingBytes(_))
        ));
    }

    pub(crate) fn arb_context() -> impl Strategy<Value = TraceContext> {
        (
            any::<(u16, u32, u64, u32, i64)>(),
            proptest::option::of(any::<[u8; 16]>().prop_filter("non-zero", |a| *a != [0; 16])),
            proptest::collection::vec(any::<(u8, i64)>(), 0..=MAX_STAMPS),
        )
            .prop_map(|((p, s, q, m, i), id, stamps)| {
                let mut c = TraceContext::new(
                    TraceKey {
                        publisher: p,
                        stream: s,
                        sequence: q,
                    },
                    m,
                    i,
                );
                c.otel_trace_id = id.map(OtelTraceId);
                for (h, ns) in stamps {
                    c.push_stamp(Stamp { hop: HopId(h), ns }).unwrap();
                }
                c
            })
    }

    proptest! {
        #[test]
        fn binary_round_trip(c in arb_context()) {
            let bytes = c.to_bytes();
            prop_assert_eq!(bytes.len(), c.binary_len());
            prop_assert_eq!(TraceContext::decode(&bytes), Ok(c));
        }

        #[test]
        fn text_round_trip(c in arb_context()) {
            let text = c.to_text();
            prop_assert!(text.len() <= MAX_TEXT_LEN);
            prop_assert_eq!(TraceContext::decode_text(&text), Ok(c));
        }

        #[test]
        fn any_prefix_of_a_context_is_truncated(c in arb_context(), cut in 0usize..188) {
            let bytes = c.to_bytes();
            let cut = cut % bytes.len();
            let is_truncated = matches!(
                TraceContext::decode(&bytes[..cut]),
                Err(DecodeError::Truncated { .. })
            );
            prop_assert!(is_truncated);
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = TraceContext::decode(&bytes);
            let _ = TraceContext::decode_prefix(&bytes);
            if let Ok(s) = std::str::from_utf8(&bytes) {
                let _ = TraceContext::decode_text(s);
            }
        }
    }
}
