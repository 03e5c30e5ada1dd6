//! # hoptrace-protocol
//!
//! The collector protocol, versions 1 and 2: the length-prefixed frames a probe's exporter
//! and the collector exchange over TCP (or TLS), their limits, and their encoding and
//! decoding, with the identifiers the frames carry ([`HopId`], [`TraceKey`],
//! [`OtelTraceId`]) and the clock status a Clock frame reports. The byte layout is
//! specified in `docs/collector-protocol.md`; `probe/testdata/protocol-vectors.json` holds
//! example frames with their bytes for implementations in other languages, checked here
//! by `tests/protocol_vectors.rs`. Version 2 adds numbered records frames and the
//! collector's acknowledgements of the ones it holds durably, so an exporter can keep and
//! re-send what a crashed collector never stored.
//!
//! Both sides build on this crate: `hoptrace-probe` (the exporter) writes Hello, Records,
//! Clock, Counters, Sent and Goodbye frames and reads Welcome, Reject and Ack;
//! `hoptrace-collector` does the opposite; `hoptrace-format` takes [`HopId`] and
//! [`MAX_HOPS`] from here for the dataset's hop columns.
//!
//! This crate is bytes in, bytes out. It must never depend on another hoptrace crate, and
//! never open a socket, start a thread, read a clock or run a program: whatever speaks
//! the protocol brings its own I/O ([`read_frame`] takes any [`std::io::Read`]).
//!
//! ```
//! use hoptrace_protocol::{Frame, HopId, Hello, MAX_FRAME_LEN, PROTOCOL_VERSION, decode_frames};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let hello = Frame::Hello(Hello {
//!     version: PROTOCOL_VERSION,
//!     process: "my-processor".into(),
//!     hops: vec![(HopId(2), "flow_in".into())],
//!     ..Hello::default()
//! });
//! let mut bytes = Vec::new();
//! hello.encode(&mut bytes)?;
//! Frame::Goodbye.encode(&mut bytes)?;
//!
//! let mut got = Vec::new();
//! let used = decode_frames(&bytes, MAX_FRAME_LEN, |f| got.push(f))?;
//! assert_eq!((used, got), (bytes.len(), vec![hello, Frame::Goodbye]));
//! # Ok(())
//! # }
//! ```

#![deny(missing_docs, unreachable_pub)]

mod clock;
mod frame;
mod ids;

pub use clock::{ClockSource, ClockStatus, Leap};
pub use frame::{
    CountersFrame, EncodeError, Frame, HELLO_MAGIC, Hello, MAX_FRAME_LEN, MAX_HELLO_LEN,
    MAX_RECORDS_PER_FRAME, MAX_SENT_PER_FRAME, MAX_STRING_LEN, MIN_PROTOCOL_VERSION,
    PROTOCOL_VERSION, ProtocolError, RECORD_LEN, Record, RecordsIter, RecordsWriter,
    SENT_ENTRY_LEN, SentEntry, SentFrame, counter_id, decode_frames, frame_type, read_frame,
    reject_code, split_frame,
};
pub use ids::{HopId, KEYED_TRACE_ID_TAG, MAX_HOPS, OtelTraceId, TRACE_ID_LEN, TraceKey};
