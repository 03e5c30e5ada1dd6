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
}

/// Numeric id of a hop, mapped to a name by the pipeline spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct HopId(pub u8);

/// A W3C trace id carried beside the context so results join OpenTelemetry traces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OtelTraceId(pub [u8; TRACE_ID_LEN]);

impl OtelTraceId {
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
