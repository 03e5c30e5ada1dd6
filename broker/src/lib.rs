//! # hoptrace-broker
//!
//! What every part of hoptrace that talks to a broker shares:
//!
//! - [`url`]: the addresses (`mqtt://...`, `kafka://...`) with their options, parsed once
//!   into typed endpoints and changed as addresses ([`url::with_path`],
//!   [`url::with_option`]) rather than as strings;
//! - [`target`]: the clients, one module per broker kind behind the [`Target`] (send) and
//!   [`Source`] (receive) traits, carrying the trace context in the message;
//! - [`kafka`]: librdkafka's logs summarised, and topics checked, created with a layout
//!   (partitions, replication, `min.insync.replicas`) and read back.
//!
//! The publisher and its taps, the reference pipeline, the collector's scale-out over
//! Kafka, the sweep and the tests use it. It depends on the probe alone (for the trace
//! context and its carriers) and must never depend on the publisher, the collector, the
//! analysis or the runner: it knows brokers and messages, not runs.
//!
//! ```
//! use hoptrace_broker::url::{self, Endpoint};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let base = "kafka://127.0.0.1:19092/load?linger_ms=5";
//! let cell = url::with_option(&url::with_path(base, "load-p3")?, "acks", "all")?;
//! assert_eq!(cell, "kafka://127.0.0.1:19092/load-p3?linger_ms=5&acks=all");
//! let Endpoint::Kafka(k) = Endpoint::parse(&cell)? else { unreachable!() };
//! assert_eq!((k.topics[0].as_str(), k.acks.as_str()), ("load-p3", "all"));
//! # Ok(())
//! # }
//! ```

#![deny(missing_docs, unreachable_pub)]

pub mod kafka;
pub mod target;
pub mod url;

pub use target::{Source, Target, TargetError};
pub use url::{Carrier, Endpoint, UrlError};
