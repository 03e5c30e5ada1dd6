//! # hoptrace-probe
//!
//! The part of hoptrace that lives inside the pipeline under test. A message carries a
//! [`TraceContext`] (trace key, metric count, intended send time and up to 16 hop stamps);
//! every hop it passes appends its own timestamp in-band and reports it to the collector
//! out of band ([`Probe::record`]). An [`Exporter`] thread batches the reports into frames
//! over TCP to the collector.
//!
//! - [`Exporter::connect`] (or [`Exporter::start`], which does not wait for the
//!   collector) with an [`ExporterConfig`], then a [`Probe`] per hop.
//! - [`context`]: the trace context and its binary and text forms (`docs/trace-format.md`).
//! - [`carrier`]: moving a context with a message: Kafka record headers (feature `kafka`),
//!   MQTT v5 user properties (feature `mqtt`), or a payload envelope.
//! - [`clock`]: where stamps come from (`CLOCK_REALTIME`); which clock status is
//!   reported is [`ClockReporting`]. [`testing`]: clocks for tests and simulated hosts.
//! - [`traceparent`]: W3C `traceparent`, to join OpenTelemetry traces.
//! - TLS to the collector (feature `tls`): set [`ExporterConfig::tls_ca`].
//!
//! A hop calls [`Probe::record`] for each message ([`Probe::record_at`] with a time read
//! once for a batch). That hot path never allocates,
//! never locks and never blocks: when the queue is full the record is dropped and
//! counted, and the counts reach the collector. Nothing else the probe does runs on the
//! caller's threads for long either: the exporter drains the queue on its own thread,
//! reads the clock status on another (asking chronyd or ptp4l only when configured to,
//! [`ClockReporting::Detect`]), and dropping it does not wait ([`Exporter::shutdown`]
//! does).
//!
//! This crate is what applications embed: it must never depend on the collector, the
//! publisher, the analysis or anything else of hoptrace beyond the wire protocol
//! (`hoptrace-protocol`, whose frames it writes) and the clock-status readers
//! (`hoptrace-clock`, run only when asked for); nor on an async runtime.
//!
//! ## Supported platforms
//!
//! Linux, on any architecture Rust supports there (tested on x86_64). Stamps are
//! `CLOCK_REALTIME` readings, and the clock status comes from the kernel's NTP state
//! (`ntp_adjtime`), chronyd and ptp4l; other targets fail to compile with a message
//! saying so. It builds with Rust 1.88 or newer (the workspace's `rust-version`, which
//! `infra/test-fast.sh` builds it with).
//!
//! ```no_run
//! use hoptrace_probe::carrier::envelope;
//! use hoptrace_probe::{Exporter, ExporterConfig, HopId};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Waits until the collector welcomes these hops (at most 5 s by default).
//! let exporter = Exporter::connect(
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

#![deny(missing_docs, unreachable_pub)]

#[cfg(not(target_os = "linux"))]
compile_error!(
    "hoptrace-probe supports Linux only: its stamps and clock status use Linux's CLOCK_REALTIME, ntp_adjtime, chronyd and ptp4l"
);

pub mod carrier;
pub mod clock;
mod clock_feed;
pub mod context;
mod counters;
mod exporter;
mod probe;
mod retention;
pub mod testing;
#[cfg(feature = "tls")]
mod tls;
pub mod traceparent;

pub use carrier::{CarrierError, Extracted};
pub use clock::{Clock, ClockStatus, SystemClock};
pub use context::{DecodeError, HopId, OtelTraceId, Stamp, TraceContext, TraceKey};
pub use counters::{AsExtracted, CounterSnapshot, Counters};
pub use exporter::{
    AWAY_AT_STOP, ClockReporting, ClockStatusFn, ExportSummary, Exporter, ExporterConfig,
    ExporterError,
};
/// The wire protocol's types that this crate's API takes or gives: a publisher's
/// accounting ([`Exporter::send_sent_frame`]), a caller's own counters
/// ([`Exporter::send_counters_frame`]) and the records [`LocalQueue::drain`] pops.
pub use hoptrace_protocol::{
    CountersFrame, EncodeError, MAX_SENT_PER_FRAME, Record, SentEntry, SentFrame,
};
pub use probe::{LocalQueue, Probe, Recorded};
