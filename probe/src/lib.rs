//! # hoptrace-probe
//!
//! The part of hoptrace that lives inside the pipeline under test. A message carries a
//! [`TraceContext`] (trace key, metric count, intended send time and up to 16 hop stamps);
//! every hop it passes appends its own timestamp in-band with [`Probe::stamp`] and hands it
//! to the collector out of band with [`Probe::report`]. An [`Exporter`] thread batches the
//! reports into frames over TCP to the collector.
//!
//! - [`context`]: the trace context and its binary and text forms (`docs/trace-format.md`).
//! - [`carrier`]: moving a context with a message: Kafka record headers (feature `kafka`),
//!   MQTT v5 user properties (feature `mqtt`), or a payload envelope.
//! - [`clock`]: CLOCK_REALTIME, injectable clocks for tests, the host's clock status.
//! - the probe-to-collector frames are the `hoptrace-protocol` crate's
//!   (`docs/collector-protocol.md`).
//! - `tls` (feature `tls`): TLS to the collector with rustls; set
//!   [`ExporterConfig::tls_ca`].
//!
//! The hot path (`stamp`, `report`, `record`) never allocates, never locks and never
//! blocks: when the queue is full the record is dropped and counted, and the counts reach
//! the collector.
//!
//! ```no_run
//! use hoptrace_probe::carrier::envelope;
//! use hoptrace_probe::{Exporter, ExporterConfig, HopId};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let exporter = Exporter::start(
//!     ExporterConfig::new("127.0.0.1:7400", "my-processor"),
//!     &[(HopId(2), "flow_in"), (HopId(3), "flow_out")],
//! )?;
//! let flow_in = exporter.probe_named("flow_in")?;
//! let flow_out = exporter.probe_named("flow_out")?;
//!
//! # let payload: Vec<u8> = Vec::new();
//! // For each message taken from the broker:
//! if let Ok((extracted, body)) = flow_in.counted(envelope::unwrap(&payload)) {
//!     let mut ctx = extracted.context;
//!     flow_in.record(&mut ctx); // stamp in-band + report out of band
//!     // ... process `body` ...
//!     flow_out.record(&mut ctx);
//!     let forwarded = envelope::wrap(&ctx, body); // the next hop sees every stamp
//!     # drop(forwarded);
//! }
//!
//! let summary = exporter.shutdown(); // flush, final counters, goodbye
//! assert_eq!(summary.counters.lost(), 0);
//! # Ok(())
//! # }
//! ```

pub mod carrier;
pub mod clock;
mod clock_feed;
pub mod context;
pub mod counters;
pub mod exporter;
pub mod probe;
mod retention;
#[cfg(feature = "tls")]
mod tls;
pub mod traceparent;

pub use carrier::{CarrierError, Extracted};
pub use clock::{Clock, ClockStatus, ManualClock, OffsetClock, SystemClock};
pub use context::{DecodeError, HopId, OtelTraceId, Stamp, TraceContext, TraceKey};
pub use counters::{CounterSnapshot, Counters};
pub use exporter::{ClockReporting, ExportSummary, Exporter, ExporterConfig, ExporterError};
pub use probe::{Probe, ReportError};
