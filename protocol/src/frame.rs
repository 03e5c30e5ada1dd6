//! The frames of collector protocol versions 1 and 2, their limits, and their encoding
//! and decoding. The byte layout is specified in `docs/collector-protocol.md`.

use std::io::Read;

use crate::clock::{ClockSource, ClockStatus, Leap};
use crate::ids::{HopId, MAX_HOPS, OtelTraceId, TRACE_ID_LEN, TraceKey};

/// Highest protocol version spoken here.
pub const PROTOCOL_VERSION: u16 = 2;
/// Lowest protocol version still accepted (version 1: no acknowledgements).
pub const MIN_PROTOCOL_VERSION: u16 = 1;
/// Largest frame (type byte and body) either side sends or accepts.
pub const MAX_FRAME_LEN: usize = 1 << 20;
/// Magic at the start of a Hello body.
pub const HELLO_MAGIC: [u8; 8] = *b"HOPTRACE";
/// Longest string field.
pub const MAX_STRING_LEN: usize = 1024;
/// Most records in one Records frame.
pub const MAX_RECORDS_PER_FRAME: usize = 20_000;
/// Bytes of one Sent entry on the wire.
pub const SENT_ENTRY_LEN: usize = 36;
/// Most entries in one Sent frame: as many as fit in [`MAX_FRAME_LEN`] after the type
/// byte, the publisher and the count (29,126).
pub const MAX_SENT_PER_FRAME: usize = (MAX_FRAME_LEN - 7) / SENT_ENTRY_LEN;
/// Largest Hello frame (type byte and body): magic, version, instance id, four strings
/// of at most [`MAX_STRING_LEN`] bytes and 16 hops with their names (20,556 bytes). A
/// collector reads a connection's first frame with this limit, so an unauthenticated
/// peer cannot make it buffer more.
pub const MAX_HELLO_LEN: usize =
    1 + 8 + 2 + 8 + 4 * (2 + MAX_STRING_LEN) + 1 + MAX_HOPS * (1 + 2 + MAX_STRING_LEN);
/// Encoded length of a record without a trace id.
pub const RECORD_LEN: usize = 36;

/// Frame type bytes.
pub mod frame_type {
    /// Probe introduces itself.
    pub const HELLO: u8 = 0x01;
    /// A batch of hop records.
    pub const RECORDS: u8 = 0x02;
    /// The host's clock status.
    pub const CLOCK: u8 = 0x03;
    /// Cumulative counters.
    pub const COUNTERS: u8 = 0x04;
    /// What a publisher sent.
    pub const SENT: u8 = 0x05;
    /// Clean end of the conversation.
    pub const GOODBYE: u8 = 0x06;
    /// A numbered batch of hop records (version 2).
    pub const SEQ_RECORDS: u8 = 0x07;
    /// Collector accepts the probe.
    pub const WELCOME: u8 = 0x81;
    /// Collector refuses the probe.
    pub const REJECT: u8 = 0x82;
    /// Collector holds the numbered records frames up to a number durably (version 2).
    pub const ACK: u8 = 0x83;
}

/// One hop's stamp of one message, as sent to the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    /// Which message.
    pub key: TraceKey,
    /// Which hop stamped it.
    pub hop: HopId,
    /// The hop's CLOCK_REALTIME reading.
    pub stamp_ns: i64,
    /// Metrics the message carries.
    pub metric_count: u32,
    /// The message's intended send time.
    pub intended_ns: i64,
    /// The message's OpenTelemetry trace id, if any.
    pub otel_trace_id: Option<OtelTraceId>,
}

impl Record {
    /// Whether the record carries the message's metric count and intended send time. One
    /// with both 0 stamps a message it did not read (a span of OpenTelemetry
    /// instrumentation names the message by trace id only): the collector takes the
    /// message's figures from its other records.
    #[inline]
    #[must_use]
    pub fn carries_message(&self) -> bool {
        Self::figures_are_a_message(self.metric_count, self.intended_ns)
    }

    /// Whether a record with this metric count and intended send time carries its
    /// message's figures ([`Self::carries_message`]), for a reader that holds the two
    /// figures without the record (a checkpoint's pending trace).
    #[inline]
    #[must_use]
    pub fn figures_are_a_message(metric_count: u32, intended_ns: i64) -> bool {
        metric_count != 0 || intended_ns != 0
    }
}

/// Hello: who the probe is.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Hello {
    /// Protocol version the probe speaks.
    pub version: u16,
    /// Random id of this exporter instance.
    pub instance_id: u64,
    /// Host name.
    pub host: String,
    /// Process or component name.
    pub process: String,
    /// Software name and version.
    pub software: String,
    /// Token, empty when none.
    pub token: String,
    /// The hops this exporter reports, with their names.
    pub hops: Vec<(HopId, String)>,
}

/// Counter ids of the Counters frame.
pub mod counter_id {
    /// Records handed to `report()`.
    pub const REPORTED: u16 = 1;
    /// Records that could not be queued.
    pub const QUEUE_FULL: u16 = 2;
    /// Records written to the socket.
    pub const SENT: u16 = 3;
    /// Records in frames that failed to write.
    pub const SEND_FAILED: u16 = 4;
    /// Reconnections after the first connection.
    pub const RECONNECTS: u16 = 5;
    /// Messages without a trace context.
    pub const NOT_TRACED: u16 = 6;
    /// Contexts that failed to decode.
    pub const BAD_CONTEXT: u16 = 7;
    /// Stamps not appended in-band because the context was full.
    pub const STAMPS_FULL: u16 = 8;
    /// `traceparent` values ignored.
    pub const BAD_TRACEPARENT: u16 = 9;
    /// Records sent again after a reconnection because the collector had not
    /// acknowledged them (version 2).
    pub const RESENT: u16 = 10;
    /// Records dropped from the retention buffer (full) before the collector
    /// acknowledged them (version 2); the ones it did not have are also `lost_unacked`.
    pub const EVICTED: u16 = 11;
    /// Of `evicted`, the records the collector turned out not to have when the exporter
    /// reconnected: lost, counted (version 2).
    pub const LOST_UNACKED: u16 = 12;
    /// Connections to the broker found lost and opened again (a publisher's or a broker
    /// tap's own counter).
    pub const BROKER_RECONNECTS: u16 = 32;
    /// MQTT: of those, the reconnections the broker answered with a new session: what
    /// was published meanwhile never reached the tap (a broker tap's own counter).
    pub const BROKER_NEW_SESSIONS: u16 = 33;
    /// Messages a publisher sent more than [`LATE_SEND_NS`] after their scheduled time
    /// (a publisher's own counter).
    pub const LATE_SENDS: u16 = 34;
    /// The largest schedule lag of a message sent so far, ns (a publisher's own counter).
    pub const LAG_MAX_NS: u16 = 35;
    /// Records a relay dropped because their hop was not announced by their connection
    /// (a relay's own counter, on a collector group's control topic).
    pub const UNANNOUNCED_HOP: u16 = 96;

    /// A message sent more than this after its scheduled time counts in [`LATE_SENDS`],
    /// ns.
    pub const LATE_SEND_NS: i64 = 10_000_000;

    /// The counter's name in `docs/collector-protocol.md`, or `None` for an unknown id.
    #[must_use]
    pub fn name(id: u16) -> Option<&'static str> {
        Some(match id {
            REPORTED => "reported",
            QUEUE_FULL => "queue_full",
            SENT => "sent",
            SEND_FAILED => "send_failed",
            RECONNECTS => "reconnects",
            NOT_TRACED => "not_traced",
            BAD_CONTEXT => "bad_context",
            STAMPS_FULL => "stamps_full",
            BAD_TRACEPARENT => "bad_traceparent",
            RESENT => "resent",
            EVICTED => "evicted",
            LOST_UNACKED => "lost_unacked",
            BROKER_RECONNECTS => "broker_reconnects",
            BROKER_NEW_SESSIONS => "broker_new_sessions",
            LATE_SENDS => "late_sends",
            LAG_MAX_NS => "lag_max_ns",
            UNANNOUNCED_HOP => "unannounced_hop",
            _ => return None,
        })
    }
}

/// Cumulative counters of one exporter.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CountersFrame {
    /// When they were read.
    pub at_ns: i64,
    /// (counter id, value) pairs.
    pub values: Vec<(u16, u64)>,
}

impl CountersFrame {
    /// The value of counter `id`, 0 when absent.
    #[must_use]
    pub fn get(&self, id: u16) -> u64 {
        self.values
            .iter()
            .find(|(i, _)| *i == id)
            .map_or(0, |(_, v)| *v)
    }
}

/// What a publisher sent on one stream, cumulative.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SentEntry {
    /// Stream id.
    pub stream: u32,
    /// Messages sent.
    pub messages: u64,
    /// Metrics in those messages.
    pub metrics: u64,
    /// First sequence sent.
    pub first_sequence: u64,
    /// Last sequence sent.
    pub last_sequence: u64,
}

/// Sent: a publisher's accounting.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SentFrame {
    /// Publisher id.
    pub publisher: u16,
    /// Per stream.
    pub entries: Vec<SentEntry>,
}

/// Reasons a collector rejects a probe.
pub mod reject_code {
    /// Bad magic or protocol version.
    pub const VERSION: u16 = 1;
    /// Bad or missing token.
    pub const TOKEN: u16 = 2;
    /// A hop the pipeline does not declare.
    pub const UNKNOWN_HOP: u16 = 3;
    /// A malformed frame.
    pub const MALFORMED: u16 = 4;
    /// Too many connections or too much load.
    pub const OVERLOADED: u16 = 5;
}

/// Any frame of protocol versions 1 and 2.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// 0x01.
    Hello(Hello),
    /// 0x02.
    Records(Vec<Record>),
    /// 0x07 (version 2): records frame number `seq` of this exporter instance.
    SeqRecords {
        /// 1 for the instance's first records frame, then one more per frame, across
        /// reconnections.
        seq: u64,
        /// The records.
        records: Vec<Record>,
    },
    /// 0x03.
    Clock(ClockStatus),
    /// 0x04.
    Counters(CountersFrame),
    /// 0x05.
    Sent(SentFrame),
    /// 0x06.
    Goodbye,
    /// 0x81: protocol version, run id and (version 2) where to resume.
    Welcome {
        /// The protocol version of this connection: the lower of the probe's and the
        /// collector's.
        version: u16,
        /// The run the records go to.
        run_id: String,
        /// Version 2: the highest records frame number of this instance the collector
        /// holds durably (0: none); the probe re-sends the retained frames above it.
        /// Not on the wire in version 1.
        resume_seq: u64,
    },
    /// 0x83 (version 2): every records frame of this connection's instance numbered up to
    /// `seq` is durable at the collector.
    Ack {
        /// Highest durable records frame number.
        seq: u64,
    },
    /// 0x82.
    Reject {
        /// One of [`reject_code`].
        code: u16,
        /// Human-readable reason.
        reason: String,
    },
}

/// Why bytes are not a valid frame. Names follow `docs/collector-protocol.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// The length prefix (first) exceeds the largest frame allowed where it was read
    /// (second: [`MAX_HELLO_LEN`] for a connection's first frame, else
    /// [`MAX_FRAME_LEN`]): a broken or hostile peer.
    #[error("frame of {0} bytes is too large: at most {1} bytes here")]
    FrameTooLarge(u32, u32),
    /// A length prefix of 0.
    #[error("empty frame")]
    EmptyFrame,
    /// An unknown frame type byte: a peer of another protocol or version.
    #[error("unknown frame type {0:#04x}")]
    UnknownType(u8),
    /// The body ended before its fields did.
    #[error("truncated frame body")]
    Truncated,
    /// Bytes left over after the last field.
    #[error("{0} trailing bytes in frame body")]
    TrailingBytes(usize),
    /// A string longer than 1024 bytes or not UTF-8.
    #[error("bad string field")]
    BadString,
    /// Hello does not start with `HOPTRACE`: not a hoptrace probe.
    #[error("bad hello magic")]
    BadMagic,
    /// A protocol version this side does not speak.
    #[error("unsupported protocol version {0}")]
    UnsupportedVersion(u16),
    /// A count outside its allowed range.
    #[error("count {0} out of range")]
    BadCount(u32),
    /// Reserved flag bits set.
    #[error("reserved bits set: {0:#04x}")]
    ReservedBits(u8),
    /// The connection failed or closed mid-frame.
    #[error("i/o: {0:?}")]
    Io(std::io::ErrorKind),
}

impl ProtocolError {
    /// The error's name in `docs/collector-protocol.md`, used as a counter label.
    #[must_use]
    pub fn name(&self) -> &'static str {
        match self {
            Self::FrameTooLarge(..) => "frame_too_large",
            Self::EmptyFrame => "empty_frame",
            Self::UnknownType(_) => "unknown_type",
            Self::Truncated => "truncated",
            Self::TrailingBytes(_) => "trailing_bytes",
            Self::BadString => "bad_string",
            Self::BadMagic => "bad_magic",
            Self::UnsupportedVersion(_) => "unsupported_version",
            Self::BadCount(_) => "bad_count",
            Self::ReservedBits(_) => "reserved_bits",
            Self::Io(_) => "io",
        }
    }
}

/// Why a frame cannot be encoded: caller data beyond the protocol's limits. Split such
/// data over several frames, or shorten the string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// More than [`MAX_HOPS`] hops in a Hello.
    #[error("a hello announces at most {MAX_HOPS} hops, not {0}")]
    TooManyHops(usize),
    /// More than 255 counters in a Counters frame.
    #[error("a counters frame holds at most 255 counters, not {0}")]
    TooManyCounters(usize),
    /// More than [`MAX_SENT_PER_FRAME`] entries in a Sent frame.
    #[error("a sent frame holds at most {MAX_SENT_PER_FRAME} entries, not {0}")]
    TooManySentEntries(usize),
    /// More than [`MAX_RECORDS_PER_FRAME`] records in a Records frame.
    #[error("a records frame holds at most {MAX_RECORDS_PER_FRAME} records, not {0}")]
    TooManyRecords(usize),
    /// A string field longer than [`MAX_STRING_LEN`] bytes.
    #[error("a string field holds at most {MAX_STRING_LEN} bytes, not {0}")]
    StringTooLong(usize),
}

// ---------------------------------------------------------------------------------------
// Encoding

/// Appends little-endian fields to a buffer.
trait Put {
    fn put_u8(&mut self, v: u8);
    fn put_u16(&mut self, v: u16);
    fn put_u32(&mut self, v: u32);
    fn put_u64(&mut self, v: u64);
    fn put_i64(&mut self, v: i64);
    fn put_str(&mut self, s: &str);
}

impl Put for Vec<u8> {
    fn put_u8(&mut self, v: u8) {
        self.push(v);
    }
    fn put_u16(&mut self, v: u16) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_u32(&mut self, v: u32) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_u64(&mut self, v: u64) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_i64(&mut self, v: i64) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    /// Strings longer than [`MAX_STRING_LEN`] are cut at a char boundary.
    fn put_str(&mut self, s: &str) {
        // Callers check the length first (`check_str`); a longer string is cut at a
        // character boundary rather than written malformed.
        let mut end = s.len().min(MAX_STRING_LEN);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        self.put_u16(u16::try_from(end).unwrap_or(0));
        self.extend_from_slice(&s.as_bytes()[..end]);
    }
}

fn check_str(s: &str) -> Result<(), EncodeError> {
    if s.len() > MAX_STRING_LEN {
        return Err(EncodeError::StringTooLong(s.len()));
    }
    Ok(())
}

fn check_count(n: usize, max: usize, err: fn(usize) -> EncodeError) -> Result<(), EncodeError> {
    if n > max {
        return Err(err(n));
    }
    Ok(())
}

/// Starts a frame of type `ty` in `out`; returns where its length goes.
fn begin(out: &mut Vec<u8>, ty: u8) -> usize {
    let at = out.len();
    out.extend_from_slice(&[0, 0, 0, 0, ty]);
    at
}

/// Writes the length of the frame started at `at`. Every frame the checked encoders
/// write fits in [`MAX_FRAME_LEN`].
fn finish(out: &mut [u8], at: usize) {
    let len = (out.len() - at - 4) as u32;
    debug_assert!(len as usize <= MAX_FRAME_LEN);
    out[at..at + 4].copy_from_slice(&len.to_le_bytes());
}

/// Appends one record's 36 or 52 bytes.
#[inline]
fn put_record(out: &mut Vec<u8>, r: &Record) {
    out.put_u8(u8::from(r.otel_trace_id.is_some()));
    out.put_u8(r.hop.0);
    out.put_u16(r.key.publisher);
    out.put_u32(r.key.stream);
    out.put_u64(r.key.sequence);
    out.put_i64(r.stamp_ns);
    out.put_u32(r.metric_count);
    out.put_i64(r.intended_ns);
    if let Some(id) = r.otel_trace_id {
        out.extend_from_slice(&id.0);
    }
}

/// Builds a Records or SeqRecords frame record by record, without an intermediate
/// `Vec<Record>`.
#[derive(Debug)]
pub struct RecordsWriter<'a> {
    out: &'a mut Vec<u8>,
    at: usize,
    /// Where the count goes: after the type byte, and after the number in SeqRecords.
    count_at: usize,
    count: u32,
}

impl<'a> RecordsWriter<'a> {
    /// Starts a Records frame at the end of `out`.
    pub fn new(out: &'a mut Vec<u8>) -> Self {
        let at = begin(out, frame_type::RECORDS);
        let count_at = out.len();
        out.put_u32(0);
        Self {
            out,
            at,
            count_at,
            count: 0,
        }
    }

    /// Starts a SeqRecords frame numbered `seq` at the end of `out` (version 2).
    pub fn numbered(out: &'a mut Vec<u8>, seq: u64) -> Self {
        let at = begin(out, frame_type::SEQ_RECORDS);
        out.put_u64(seq);
        let count_at = out.len();
        out.put_u32(0);
        Self {
            out,
            at,
            count_at,
            count: 0,
        }
    }
    /// Records so far.
    #[must_use]
    pub fn len(&self) -> usize {
        self.count as usize
    }
    /// Whether no record was added.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
    /// Whether the frame holds [`MAX_RECORDS_PER_FRAME`] records.
    #[must_use]
    pub fn is_full(&self) -> bool {
        self.count as usize >= MAX_RECORDS_PER_FRAME
    }
    /// Adds a record.
    ///
    /// # Errors
    /// [`EncodeError::TooManyRecords`] when the frame already holds
    /// [`MAX_RECORDS_PER_FRAME`] records; the record is not added and the frame stays valid.
    #[inline]
    pub fn push(&mut self, r: &Record) -> Result<(), EncodeError> {
        if self.is_full() {
            return Err(EncodeError::TooManyRecords(self.count as usize + 1));
        }
        put_record(self.out, r);
        self.count += 1;
        Ok(())
    }
    /// Completes the frame; an empty one is removed again.
    pub fn finish(self) -> usize {
        if self.count == 0 {
            self.out.truncate(self.at);
            return 0;
        }
        let c = self.count_at;
        self.out[c..c + 4].copy_from_slice(&self.count.to_le_bytes());
        finish(self.out, self.at);
        self.count as usize
    }
}

impl Frame {
    /// Checks the frame against the protocol's limits.
    ///
    /// # Errors
    /// A count or string beyond its limit: see [`EncodeError`].
    pub fn check(&self) -> Result<(), EncodeError> {
        match self {
            Self::Hello(h) => {
                for s in [&h.host, &h.process, &h.software, &h.token] {
                    check_str(s)?;
                }
                check_count(h.hops.len(), MAX_HOPS, EncodeError::TooManyHops)?;
                h.hops.iter().try_for_each(|(_, n)| check_str(n))
            }
            Self::Records(r) | Self::SeqRecords { records: r, .. } => {
                check_count(r.len(), MAX_RECORDS_PER_FRAME, EncodeError::TooManyRecords)
            }
            Self::Clock(c) => check_str(&c.detail),
            Self::Counters(c) => check_count(c.values.len(), 255, EncodeError::TooManyCounters),
            Self::Sent(s) => check_count(
                s.entries.len(),
                MAX_SENT_PER_FRAME,
                EncodeError::TooManySentEntries,
            ),
            Self::Goodbye | Self::Ack { .. } => Ok(()),
            Self::Welcome { run_id, .. } => check_str(run_id),
            Self::Reject { reason, .. } => check_str(reason),
        }
    }

    /// Appends the frame's bytes (length prefix included) to `out`.
    ///
    /// # Errors
    /// A count or string beyond the protocol's limit (more than 20,000 records, 29,126
    /// sent entries, 16 hops, 255 counters, or a string over 1024 bytes): `out` is left
    /// as it was. Split such data over several frames.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        self.check()?;
        self.encode_checked(out);
        Ok(())
    }

    /// [`Self::encode`] of a frame that passed [`Self::check`].
    fn encode_checked(&self, out: &mut Vec<u8>) {
        match self {
            Self::Hello(h) => {
                let at = begin(out, frame_type::HELLO);
                out.extend_from_slice(&HELLO_MAGIC);
                out.put_u16(h.version);
                out.put_u64(h.instance_id);
                out.put_str(&h.host);
                out.put_str(&h.process);
                out.put_str(&h.software);
                out.put_str(&h.token);
                out.put_u8(h.hops.len() as u8);
                for (id, name) in &h.hops {
                    out.put_u8(id.0);
                    out.put_str(name);
                }
                finish(out, at);
            }
            Self::Records(records) => {
                let mut w = RecordsWriter::new(out);
                for r in records {
                    w.push(r).expect("checked: within the frame's record limit");
                }
                w.finish();
            }
            Self::SeqRecords { seq, records } => {
                let mut w = RecordsWriter::numbered(out, *seq);
                for r in records {
                    w.push(r).expect("checked: within the frame's record limit");
                }
                w.finish();
            }
            Self::Ack { seq } => {
                let at = begin(out, frame_type::ACK);
                out.put_u64(*seq);
                finish(out, at);
            }
            Self::Clock(c) => {
                let at = begin(out, frame_type::CLOCK);
                out.put_i64(c.at_ns);
                out.put_u8(c.source as u8);
                out.put_u8(u8::from(c.synced));
                out.put_u8(c.leap as u8);
                out.put_i64(c.offset_ns);
                out.put_u64(c.error_bound_ns);
                out.put_str(&c.detail);
                finish(out, at);
            }
            Self::Counters(c) => {
                let at = begin(out, frame_type::COUNTERS);
                out.put_i64(c.at_ns);
                out.put_u8(c.values.len() as u8);
                for (id, v) in &c.values {
                    out.put_u16(*id);
                    out.put_u64(*v);
                }
                finish(out, at);
            }
            Self::Sent(s) => {
                let at = begin(out, frame_type::SENT);
                out.put_u16(s.publisher);
                out.put_u32(s.entries.len() as u32);
                for e in &s.entries {
                    out.put_u32(e.stream);
                    out.put_u64(e.messages);
                    out.put_u64(e.metrics);
                    out.put_u64(e.first_sequence);
                    out.put_u64(e.last_sequence);
                }
                finish(out, at);
            }
            Self::Goodbye => {
                let at = begin(out, frame_type::GOODBYE);
                finish(out, at);
            }
            Self::Welcome {
                version,
                run_id,
                resume_seq,
            } => {
                let at = begin(out, frame_type::WELCOME);
                out.put_u16(*version);
                out.put_str(run_id);
                if *version >= 2 {
                    out.put_u64(*resume_seq);
                }
                finish(out, at);
            }
            Self::Reject { code, reason } => {
                let at = begin(out, frame_type::REJECT);
                out.put_u16(*code);
                out.put_str(reason);
                finish(out, at);
            }
        }
    }

    /// The frame's bytes as a new buffer.
    ///
    /// # Errors
    /// As [`Self::encode`].
    pub fn to_bytes(&self) -> Result<Vec<u8>, EncodeError> {
        let mut out = Vec::new();
        self.encode(&mut out)?;
        Ok(out)
    }
}

// ---------------------------------------------------------------------------------------
// Decoding

/// Reads little-endian fields from a body, failing with `Truncated` at its end.
#[derive(Debug)]
struct Cursor<'a> {
    b: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], ProtocolError> {
        if self.b.len() < n {
            return Err(ProtocolError::Truncated);
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }
    fn arr<const N: usize>(&mut self) -> Result<[u8; N], ProtocolError> {
        Ok(self.take(N)?.try_into().expect("took N bytes"))
    }
    fn u8(&mut self) -> Result<u8, ProtocolError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, ProtocolError> {
        self.arr().map(u16::from_le_bytes)
    }
    fn u32(&mut self) -> Result<u32, ProtocolError> {
        self.arr().map(u32::from_le_bytes)
    }
    fn u64(&mut self) -> Result<u64, ProtocolError> {
        self.arr().map(u64::from_le_bytes)
    }
    fn i64(&mut self) -> Result<i64, ProtocolError> {
        self.arr().map(i64::from_le_bytes)
    }
    fn string(&mut self) -> Result<String, ProtocolError> {
        let n = usize::from(self.u16()?);
        if n > MAX_STRING_LEN {
            return Err(ProtocolError::BadString);
        }
        let bytes = self.take(n)?;
        std::str::from_utf8(bytes)
            .map(str::to_owned)
            .map_err(|_| ProtocolError::BadString)
    }
    fn count(&mut self, max: usize, min: usize) -> Result<usize, ProtocolError> {
        let n = self.u32()?;
        if (n as usize) < min || n as usize > max {
            return Err(ProtocolError::BadCount(n));
        }
        Ok(n as usize)
    }
    fn end(&self) -> Result<(), ProtocolError> {
        if self.b.is_empty() {
            Ok(())
        } else {
            Err(ProtocolError::TrailingBytes(self.b.len()))
        }
    }
}

/// Decodes the records of a Records frame body lazily.
#[derive(Debug)]
pub struct RecordsIter<'a> {
    cur: Cursor<'a>,
    left: usize,
}

impl<'a> RecordsIter<'a> {
    /// Iterates the records of `body` (a Records frame body, after the type byte).
    ///
    /// # Errors
    /// [`ProtocolError::BadCount`] when the count is 0 or above the limit.
    pub fn new(body: &'a [u8]) -> Result<Self, ProtocolError> {
        let mut cur = Cursor { b: body };
        let left = cur.count(MAX_RECORDS_PER_FRAME, 1)?;
        Ok(Self { cur, left })
    }

    fn next_record(&mut self) -> Result<Record, ProtocolError> {
        let c = &mut self.cur;
        let flags = c.u8()?;
        if flags & !1 != 0 {
            return Err(ProtocolError::ReservedBits(flags));
        }
        let hop = HopId(c.u8()?);
        let key = TraceKey {
            publisher: c.u16()?,
            stream: c.u32()?,
            sequence: c.u64()?,
        };
        let stamp_ns = c.i64()?;
        let metric_count = c.u32()?;
        let intended_ns = c.i64()?;
        let otel_trace_id = if flags & 1 == 1 {
            Some(OtelTraceId(c.arr::<TRACE_ID_LEN>()?))
        } else {
            None
        };
        Ok(Record {
            key,
            hop,
            stamp_ns,
            metric_count,
            intended_ns,
            otel_trace_id,
        })
    }
}

impl Iterator for RecordsIter<'_> {
    type Item = Result<Record, ProtocolError>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return if self.cur.b.is_empty() {
                None
            } else {
                let e = self.cur.end().unwrap_err();
                self.cur.b = &[];
                Some(Err(e))
            };
        }
        self.left -= 1;
        let r = self.next_record();
        if r.is_err() {
            self.left = 0;
            self.cur.b = &[];
        }
        Some(r)
    }
}

impl Frame {
    /// Decodes a frame from its type byte and body.
    ///
    /// # Errors
    /// A [`ProtocolError`] naming what is wrong with the body.
    pub fn decode(ty: u8, body: &[u8]) -> Result<Self, ProtocolError> {
        let mut c = Cursor { b: body };
        let frame = match ty {
            frame_type::HELLO => {
                if c.take(8).map_err(|_| ProtocolError::BadMagic)? != HELLO_MAGIC {
                    return Err(ProtocolError::BadMagic);
                }
                let version = c.u16()?;
                if !(MIN_PROTOCOL_VERSION..=PROTOCOL_VERSION).contains(&version) {
                    return Err(ProtocolError::UnsupportedVersion(version));
                }
                let instance_id = c.u64()?;
                let host = c.string()?;
                let process = c.string()?;
                let software = c.string()?;
                let token = c.string()?;
                let n = c.u8()?;
                if n == 0 || usize::from(n) > MAX_HOPS {
                    return Err(ProtocolError::BadCount(u32::from(n)));
                }
                let mut hops = Vec::with_capacity(usize::from(n));
                for _ in 0..n {
                    hops.push((HopId(c.u8()?), c.string()?));
                }
                Self::Hello(Hello {
                    version,
                    instance_id,
                    host,
                    process,
                    software,
                    token,
                    hops,
                })
            }
            frame_type::RECORDS => {
                let records = RecordsIter::new(body)?.collect::<Result<Vec<_>, _>>()?;
                return Ok(Self::Records(records));
            }
            frame_type::SEQ_RECORDS => {
                let seq = c.u64()?;
                let records = RecordsIter::new(c.b)?.collect::<Result<Vec<_>, _>>()?;
                return Ok(Self::SeqRecords { seq, records });
            }
            frame_type::ACK => Self::Ack { seq: c.u64()? },
            frame_type::CLOCK => Self::Clock(ClockStatus {
                at_ns: c.i64()?,
                source: ClockSource::from_code(c.u8()?),
                synced: c.u8()? != 0,
                leap: Leap::from_code(c.u8()?),
                offset_ns: c.i64()?,
                error_bound_ns: c.u64()?,
                detail: c.string()?,
            }),
            frame_type::COUNTERS => {
                let at_ns = c.i64()?;
                let n = c.u8()?;
                let values = (0..n)
                    .map(|_| Ok((c.u16()?, c.u64()?)))
                    .collect::<Result<_, ProtocolError>>()?;
                Self::Counters(CountersFrame { at_ns, values })
            }
            frame_type::SENT => {
                let publisher = c.u16()?;
                let n = c.count(MAX_SENT_PER_FRAME, 0)?;
                if c.b.len() < n * 36 {
                    return Err(ProtocolError::Truncated);
                }
                let entries = (0..n)
                    .map(|_| {
                        Ok(SentEntry {
                            stream: c.u32()?,
                            messages: c.u64()?,
                            metrics: c.u64()?,
                            first_sequence: c.u64()?,
                            last_sequence: c.u64()?,
                        })
                    })
                    .collect::<Result<_, ProtocolError>>()?;
                Self::Sent(SentFrame { publisher, entries })
            }
            frame_type::GOODBYE => Self::Goodbye,
            frame_type::WELCOME => {
                let version = c.u16()?;
                if !(MIN_PROTOCOL_VERSION..=PROTOCOL_VERSION).contains(&version) {
                    return Err(ProtocolError::UnsupportedVersion(version));
                }
                let run_id = c.string()?;
                let resume_seq = if version >= 2 { c.u64()? } else { 0 };
                Self::Welcome {
                    version,
                    run_id,
                    resume_seq,
                }
            }
            frame_type::REJECT => Self::Reject {
                code: c.u16()?,
                reason: c.string()?,
            },
            other => return Err(ProtocolError::UnknownType(other)),
        };
        c.end()?;
        Ok(frame)
    }
}

/// Finds the first complete frame in `buf`.
///
/// Returns `Ok(None)` when more bytes are needed, or `Ok(Some((type, body range, frame
/// length)))`: the frame occupies `buf[..frame length]`.
///
/// # Errors
/// [`ProtocolError::FrameTooLarge`] or [`ProtocolError::EmptyFrame`] as soon as the length
/// prefix is read, before any body arrives.
pub fn split_frame(
    buf: &[u8],
    max_frame_len: usize,
) -> Result<Option<(u8, std::ops::Range<usize>, usize)>, ProtocolError> {
    let Some(prefix) = buf.get(..4) else {
        return Ok(None);
    };
    let len = u32::from_le_bytes(prefix.try_into().expect("4 bytes"));
    if len == 0 {
        return Err(ProtocolError::EmptyFrame);
    }
    if len as usize > max_frame_len {
        return Err(ProtocolError::FrameTooLarge(
            len,
            u32::try_from(max_frame_len).unwrap_or(u32::MAX),
        ));
    }
    let total = 4 + len as usize;
    if buf.len() < total {
        return Ok(None);
    }
    Ok(Some((buf[4], 5..total, total)))
}

/// Decodes every complete frame at the start of `buf`, calling `f` for each; returns the
/// bytes consumed. Incomplete trailing bytes are left for the next call.
///
/// # Errors
/// The first [`ProtocolError`]; frames before it were already passed to `f`.
pub fn decode_frames(
    buf: &[u8],
    max_frame_len: usize,
    mut f: impl FnMut(Frame),
) -> Result<usize, ProtocolError> {
    let mut at = 0;
    while let Some((ty, body, len)) = split_frame(&buf[at..], max_frame_len)? {
        f(Frame::decode(ty, &buf[at + body.start..at + body.end])?);
        at += len;
    }
    Ok(at)
}

/// Reads exactly one frame from a blocking reader.
///
/// # Errors
/// [`ProtocolError::Io`] when the reader fails or ends mid-frame, otherwise as
/// [`Frame::decode`].
pub fn read_frame<R: Read>(r: &mut R, max_frame_len: usize) -> Result<Frame, ProtocolError> {
    let mut prefix = [0u8; 4];
    r.read_exact(&mut prefix)
        .map_err(|e| ProtocolError::Io(e.kind()))?;
    let len = u32::from_le_bytes(prefix);
    if len == 0 {
        return Err(ProtocolError::EmptyFrame);
    }
    if len as usize > max_frame_len {
        return Err(ProtocolError::FrameTooLarge(
            len,
            u32::try_from(max_frame_len).unwrap_or(u32::MAX),
        ));
    }
    let mut body = vec![0u8; len as usize];
    r.read_exact(&mut body)
        .map_err(|e| ProtocolError::Io(e.kind()))?;
    Frame::decode(body[0], &body[1..])
}

#[cfg(test)]
mod tests;
