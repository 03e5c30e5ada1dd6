//! Carriers move a [`TraceContext`] with a message: a Kafka record header
//! ([`kafka_header`], feature `kafka`), an MQTT v5 user property ([`mqtt_property`],
//! feature `mqtt`), or an envelope in front of the payload ([`envelope`]).
//!
//! Extraction never panics on foreign or garbage input: it returns a [`CarrierError`],
//! which [`crate::Counters::count_extract`] counts.

pub mod envelope;
#[cfg(feature = "kafka")]
pub mod kafka_header;
#[cfg(feature = "mqtt")]
pub mod mqtt_property;

use crate::context::{DecodeError, TraceContext};
#[cfg(any(feature = "kafka", feature = "mqtt"))]
use crate::traceparent;
use crate::traceparent::TraceparentError;

/// Header and user-property name of the trace context.
pub const HEADER: &str = "hoptrace";

/// Why no context could be taken from a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CarrierError {
    /// The message carries no hoptrace context (sent by something else, or not sampled).
    #[error("message carries no hoptrace context")]
    NotTraced,
    /// A context is present but does not decode; the sender is broken or speaks another
    /// version.
    #[error("bad hoptrace context: {0}")]
    BadContext(#[from] DecodeError),
}

/// A context taken from a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extracted {
    /// The context, with the trace id of a valid `traceparent` when it had none.
    pub context: TraceContext,
    /// A `traceparent` was present but ignored, and why.
    pub bad_traceparent: Option<TraceparentError>,
}

/// Combines the last `hoptrace` value and the last `traceparent` value of a message.
#[cfg(any(feature = "kafka", feature = "mqtt"))]
pub(crate) fn combine(
    context: Option<Result<TraceContext, DecodeError>>,
    traceparent: Option<&[u8]>,
) -> Result<Extracted, CarrierError> {
    let mut context = context.ok_or(CarrierError::NotTraced)??;
    let mut bad_traceparent = None;
    if let Some(value) = traceparent {
        match traceparent::parse(value) {
            Ok(id) => {
                if context.otel_trace_id.is_none() {
                    context.otel_trace_id = Some(id);
                }
            }
            Err(e) => bad_traceparent = Some(e),
        }
    }
    Ok(Extracted {
        context,
        bad_traceparent,
    })
}
