//! The identifiers every frame and every trace context carries: which message
//! ([`TraceKey`]), which hop ([`HopId`]), and an OpenTelemetry trace id.

/// Most hops one pipeline declares and one exporter announces: hop ids index arrays of
/// this size in the collector and the dataset.
pub const MAX_HOPS: usize = 16;
/// Length of an OpenTelemetry trace id.
pub const TRACE_ID_LEN: usize = 16;

/// Names one message within a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct TraceKey {
    /// Publisher instance id.
    pub publisher: u16,
    /// Stream id within the publisher.
    pub stream: u32,
    /// Per-stream sequence number.
    pub sequence: u64,
}

impl TraceKey {
    /// The key's 14 bytes as the binary forms lay them out: publisher (u16), stream (u32),
    /// sequence (u64), little-endian.
    #[inline]
    #[must_use]
    pub fn to_le_bytes(&self) -> [u8; 14] {
        let mut b = [0u8; 14];
        b[..2].copy_from_slice(&self.publisher.to_le_bytes());
        b[2..6].copy_from_slice(&self.stream.to_le_bytes());
        b[6..].copy_from_slice(&self.sequence.to_le_bytes());
        b
    }

    /// The key of [`Self::to_le_bytes`]'s layout.
    #[inline]
    #[must_use]
    pub fn from_le_bytes(b: [u8; 14]) -> Self {
        Self {
            publisher: u16::from_le_bytes([b[0], b[1]]),
            stream: u32::from_le_bytes([b[2], b[3], b[4], b[5]]),
            sequence: u64::from_le_bytes([b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13]]),
        }
    }
}

/// Numeric id of a hop, mapped to a name by the pipeline spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct HopId(pub u8);

/// A W3C trace id carried beside the context so results join OpenTelemetry traces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OtelTraceId(pub [u8; TRACE_ID_LEN]);

/// The first two bytes of a trace id that names its message ([`OtelTraceId::of_key`]):
/// `ht`, so the id's hex form starts with `6874`.
pub const KEYED_TRACE_ID_TAG: [u8; 2] = *b"ht";

impl OtelTraceId {
    /// The trace id `hoptrace publish --traceparent` gives a message: [`KEYED_TRACE_ID_TAG`]
    /// then the key's 14 bytes ([`TraceKey::to_le_bytes`]). Never all zeros, and one per
    /// message, so whatever sees the id (an OpenTelemetry span) names the message with it.
    #[inline]
    #[must_use]
    pub fn of_key(key: &TraceKey) -> Self {
        let mut id = [0u8; TRACE_ID_LEN];
        id[..2].copy_from_slice(&KEYED_TRACE_ID_TAG);
        id[2..].copy_from_slice(&key.to_le_bytes());
        Self(id)
    }

    /// The message an id of [`Self::of_key`]'s layout names; `None` for any other id.
    #[inline]
    #[must_use]
    pub fn key(&self) -> Option<TraceKey> {
        if self.0[..2] != KEYED_TRACE_ID_TAG {
            return None;
        }
        let mut b = [0u8; 14];
        b.copy_from_slice(&self.0[2..]);
        Some(TraceKey::from_le_bytes(b))
    }

    /// The id as 32 lower-case hex digits, as OpenTelemetry prints it.
    #[must_use]
    pub fn to_hex(&self) -> String {
        use std::fmt::Write as _;
        self.0.iter().fold(String::with_capacity(32), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_keyed_trace_id_gives_its_key_back() {
        for key in [
            TraceKey::default(),
            TraceKey {
                publisher: 7,
                stream: 123_456,
                sequence: u64::MAX - 3,
            },
        ] {
            let id = OtelTraceId::of_key(&key);
            assert!(id.to_hex().starts_with("6874"));
            assert_ne!(id.0, [0; TRACE_ID_LEN]);
            assert_eq!(id.key(), Some(key));
        }
        let other = OtelTraceId([0x4b; TRACE_ID_LEN]);
        assert_eq!(other.key(), None);
    }
}
