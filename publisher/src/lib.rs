//! # hoptrace-publisher
//!
//! The load side of a hoptrace measurement: an open-loop, rate-controlled publisher of
//! traced messages for MQTT (rumqttc) and Kafka (rdkafka), taps that stamp broker
//! delivery for hops you cannot modify, and capture and replay of live traffic.
//!
//! Every message carries a trace context (`docs/trace-format.md`) in the carrier the
//! target uses (MQTT 5 user property, Kafka header, or an envelope for MQTT 3.1.1): the
//! publisher id, the stream, a per-stream sequence, the metric count, the time the
//! open-loop schedule meant the message to leave, and a `publish` stamp taken just before
//! the message is handed to the broker client. The stamp also goes to the collector out
//! of band, and so does what was sent (Sent frames), so the run's accounting adds up.
//! How late each message left against its schedule (schedule lag) is measured, never
//! hidden; waits for a full client queue (broker back-pressure) are counted.
//!
//! It depends on the probe; it must never depend on the collector, the analysis or the
//! runner (they receive what it reports, or start it).
//!
//! Broker addresses and their options ([`Endpoint`]) and the transports behind the
//! [`Target`] and [`Source`] traits are `hoptrace-broker`'s.
//!
//! - [`schedule`]: the open-loop schedule (rate, streams, Zipf, ramp-up, bursts).
//! - [`uns`]: ISA-95 style topic trees; [`payload`]: payload formats.
//! - [`publish`]: a whole publish run; [`tap`]: a broker tap; [`capture`]: record/replay.
//! - [`accounting`]: Sent frames and the schedule lag histogram.
//! - [`report`]: the end summary as a file (`hoptrace publish --summary-json`), read back
//!   by the soak and the sweep.
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::sync::atomic::AtomicBool;
//! use std::time::Duration;
//!
//! use hoptrace_probe::ExporterConfig;
//! use hoptrace_publisher::publish::{self, PublishConfig};
//! use hoptrace_publisher::schedule::LoadShape;
//! use hoptrace_broker::url::Endpoint;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut shape = LoadShape::uniform(100_000.0, 3000); // metrics/s over 3000 streams
//! shape.metrics_per_message = 20;
//! shape.zipf_exponent = 1.1;
//! shape.ramp_up = Duration::from_secs(5);
//! shape.duration = Some(Duration::from_secs(30));
//! let mut config = PublishConfig::new(Endpoint::parse("mqtt://127.0.0.1:11883?qos=1")?, shape);
//! config.collector = Some(ExporterConfig::new("127.0.0.1:7400", "my-load"));
//! let summary = publish::run(config, Arc::new(AtomicBool::new(false)))?;
//! println!(
//!     "{} messages, lag p99 {} ns",
//!     summary.messages,
//!     summary.lag.at(0.99).map_or(0, |q| q.value_ns)
//! );
//! # Ok(())
//! # }
//! ```

#![deny(missing_docs, unreachable_pub)]

pub mod accounting;
pub mod capture;
pub mod payload;
pub mod publish;
pub mod report;
pub mod schedule;
pub mod tap;
pub mod uns;

pub use hoptrace_broker::target::{Source, Target, TargetError};
pub use hoptrace_broker::url::{Carrier, Endpoint, UrlError};
pub use publish::{
    LiveSnapshot, PublishConfig, PublishError, PublishSummary, Publisher, ReplayConfig,
};
pub use schedule::{Burst, LoadShape, Schedule};
pub use tap::{Tap, TapConfig, TapError, TapSummary};
