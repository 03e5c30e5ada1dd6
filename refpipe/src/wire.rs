//! The store's wire protocol: length-prefixed frames over TCP between the processor (or
//! any client) and the store.
//!
//! Every frame is `u32` length (little-endian, counting the kind byte and the body), one
//! kind byte, then the body. Integers are little-endian.
//!
//! | kind | frame | body |
//! | --- | --- | --- |
//! | `0x01` | Write | `u64` write id, `u16` n, n × (`u8` len, trace context in binary form), then the rows as one Arrow IPC stream (schema `series: Utf8, ts_ms: Int64, value: Float64`) |
//! | `0x02` | Query | `u64` query id, `i64` from_ms, `i64` to_ms (inclusive), `u16` n, n × (`u16` len, UTF-8 series name); n = 0 means every series |
//! | `0x81` | WriteAck | `u64` write id, `u32` rows stored, `u8` 1 when a query found every row |
//! | `0x82` | QueryResult | `u64` query id, `u64` rows, `f64` sum of values, `i64` min ts_ms, `i64` max ts_ms, `u64` execution ns |
//! | `0xEE` | Error | `u64` id of the frame it answers (0 if none), UTF-8 message |
//!
//! A frame longer than [`MAX_FRAME_LEN`] or one that does not decode ends the connection
//! after an Error frame naming what was wrong.

use std::io::{Read, Write};
use std::sync::Arc;

use arrow::array::{Array, Float64Array, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::StreamWriter;
use hoptrace_probe::TraceContext;

/// Largest frame accepted or sent.
pub const MAX_FRAME_LEN: usize = 64 << 20;
/// Most trace contexts in one Write.
pub const MAX_CONTEXTS: usize = u16::MAX as usize;

const WRITE: u8 = 0x01;
const QUERY: u8 = 0x02;
const WRITE_ACK: u8 = 0x81;
const QUERY_RESULT: u8 = 0x82;
const ERROR: u8 = 0xEE;

/// Why a frame could not be read or decoded. Each variant names what was wrong.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The connection failed or closed.
    #[error("connection: {0}")]
    Io(#[from] std::io::Error),
    /// The length prefix is 0 or above the limit: the peer does not speak this protocol.
    #[error("frame length {0} is outside 1..={MAX_FRAME_LEN}")]
    BadLength(u64),
    /// The kind byte is unknown: the peer does not speak this protocol.
    #[error("unknown frame kind 0x{0:02x}")]
    UnknownKind(u8),
    /// The body is shorter than its fields say.
    #[error("{0} frame truncated")]
    Truncated(&'static str),
    /// A trace context in a Write does not decode.
    #[error("trace context {index} of the write does not decode: {reason}")]
    BadContext {
        /// Its position in the frame.
        index: usize,
        /// What the decoder said.
        reason: hoptrace_probe::DecodeError,
    },
    /// The rows are not an Arrow IPC stream with the rows schema.
    #[error("rows: {0}")]
    BadRows(String),
    /// A string is not UTF-8.
    #[error("{0} is not UTF-8")]
    NotUtf8(&'static str),
}

/// The schema of rows written to the store.
#[must_use]
pub fn rows_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("series", DataType::Utf8, false),
        Field::new("ts_ms", DataType::Int64, false),
        Field::new("value", DataType::Float64, false),
    ]))
}

/// A query: rows of some series in a time range.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Query {
    /// Series names; empty means every series.
    pub series: Vec<String>,
    /// First timestamp, ms since the Unix epoch (inclusive).
    pub from_ms: i64,
    /// Last timestamp, ms since the Unix epoch (inclusive).
    pub to_ms: i64,
}

/// What a query found.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QueryResult {
    /// Rows that match.
    pub rows: u64,
    /// Sum of their values.
    pub sum: f64,
    /// Smallest matching timestamp, ms (`i64::MAX` when none).
    pub min_ts_ms: i64,
    /// Largest matching timestamp, ms (`i64::MIN` when none).
    pub max_ts_ms: i64,
    /// How long the store took to execute it, ns.
    pub exec_ns: u64,
}

/// One frame.
#[derive(Debug, Clone)]
pub enum Frame {
    /// Rows to store, with the trace contexts of the messages they came from.
    Write {
        /// Client-chosen id, echoed in the ack.
        id: u64,
        /// The messages' contexts.
        contexts: Vec<TraceContext>,
        /// The rows ([`rows_schema`]).
        rows: RecordBatch,
    },
    /// A query.
    Query {
        /// Client-chosen id, echoed in the result.
        id: u64,
        /// What to look for.
        query: Query,
    },
    /// The store took a write.
    WriteAck {
        /// The write's id.
        id: u64,
        /// Rows stored.
        rows: u32,
        /// Whether the store's visibility query found every row.
        visible: bool,
    },
    /// A query's answer.
    QueryResult {
        /// The query's id.
        id: u64,
        /// What it found.
        result: QueryResult,
    },
    /// Something was wrong with a frame.
    Error {
        /// The id of the frame it answers, 0 if unknown.
        id: u64,
        /// What was wrong.
        message: String,
    },
}

impl Frame {
    /// Appends the encoded frame, length prefix included, to `out`.
    ///
    /// # Errors
    /// [`WireError::BadRows`] when the rows cannot be written as Arrow IPC, and
    /// [`WireError::BadLength`] when the frame would exceed [`MAX_FRAME_LEN`].
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), WireError> {
        let start = out.len();
        out.extend_from_slice(&[0; 4]);
        match self {
            Self::Write { id, contexts, rows } => {
                if contexts.len() > MAX_CONTEXTS {
                    return Err(WireError::BadRows(format!(
                        "{} contexts in one write; at most {MAX_CONTEXTS}",
                        contexts.len()
                    )));
                }
                out.push(WRITE);
                out.extend_from_slice(&id.to_le_bytes());
                out.extend_from_slice(&(contexts.len() as u16).to_le_bytes());
                for c in contexts {
                    let (bytes, n) = c.encode();
                    out.push(n as u8);
                    out.extend_from_slice(&bytes[..n]);
                }
                let mut w = StreamWriter::try_new(&mut *out, &rows.schema())
                    .map_err(|e| WireError::BadRows(e.to_string()))?;
                w.write(rows)
                    .and_then(|()| w.finish())
                    .map_err(|e| WireError::BadRows(e.to_string()))?;
            }
            Self::Query { id, query } => {
                out.push(QUERY);
                out.extend_from_slice(&id.to_le_bytes());
                out.extend_from_slice(&query.from_ms.to_le_bytes());
                out.extend_from_slice(&query.to_ms.to_le_bytes());
                out.extend_from_slice(
                    &(query.series.len().min(usize::from(u16::MAX)) as u16).to_le_bytes(),
                );
                for s in query.series.iter().take(usize::from(u16::MAX)) {
                    let b = &s.as_bytes()[..s.len().min(usize::from(u16::MAX))];
                    out.extend_from_slice(&(b.len() as u16).to_le_bytes());
                    out.extend_from_slice(b);
                }
            }
            Self::WriteAck { id, rows, visible } => {
                out.push(WRITE_ACK);
                out.extend_from_slice(&id.to_le_bytes());
                out.extend_from_slice(&rows.to_le_bytes());
                out.push(u8::from(*visible));
            }
            Self::QueryResult { id, result } => {
                out.push(QUERY_RESULT);
                out.extend_from_slice(&id.to_le_bytes());
                out.extend_from_slice(&result.rows.to_le_bytes());
                out.extend_from_slice(&result.sum.to_le_bytes());
                out.extend_from_slice(&result.min_ts_ms.to_le_bytes());
                out.extend_from_slice(&result.max_ts_ms.to_le_bytes());
                out.extend_from_slice(&result.exec_ns.to_le_bytes());
            }
            Self::Error { id, message } => {
                out.push(ERROR);
                out.extend_from_slice(&id.to_le_bytes());
                out.extend_from_slice(message.as_bytes());
            }
        }
        let len = out.len() - start - 4;
        if len > MAX_FRAME_LEN {
            out.truncate(start);
            return Err(WireError::BadLength(len as u64));
        }
        out[start..start + 4].copy_from_slice(&(len as u32).to_le_bytes());
        Ok(())
    }

    /// Decodes a frame body (kind byte first, no length prefix).
    ///
    /// # Errors
    /// A [`WireError`] naming what was wrong.
    pub fn decode(body: &[u8]) -> Result<Self, WireError> {
        let (&kind, rest) = body.split_first().ok_or(WireError::BadLength(0))?;
        let mut r = Cursor {
            buf: rest,
            what: "",
        };
        match kind {
            WRITE => {
                r.what = "write";
                let id = r.u64()?;
                let n = usize::from(r.u16()?);
                let mut contexts = Vec::with_capacity(n);
                for index in 0..n {
                    let len = usize::from(r.u8()?);
                    let bytes = r.take(len)?;
                    let ctx = TraceContext::decode(bytes)
                        .map_err(|reason| WireError::BadContext { index, reason })?;
                    contexts.push(ctx);
                }
                let rows = read_rows(r.buf)?;
                Ok(Self::Write { id, contexts, rows })
            }
            QUERY => {
                r.what = "query";
                let id = r.u64()?;
                let from_ms = r.i64()?;
                let to_ms = r.i64()?;
                let n = usize::from(r.u16()?);
                let mut series = Vec::with_capacity(n);
                for _ in 0..n {
                    let len = usize::from(r.u16()?);
                    let s = std::str::from_utf8(r.take(len)?)
                        .map_err(|_| WireError::NotUtf8("a series name"))?;
                    series.push(s.to_owned());
                }
                Ok(Self::Query {
                    id,
                    query: Query {
                        series,
                        from_ms,
                        to_ms,
                    },
                })
            }
            WRITE_ACK => {
                r.what = "write ack";
                Ok(Self::WriteAck {
                    id: r.u64()?,
                    rows: r.u32()?,
                    visible: r.u8()? == 1,
                })
            }
            QUERY_RESULT => {
                r.what = "query result";
                let id = r.u64()?;
                Ok(Self::QueryResult {
                    id,
                    result: QueryResult {
                        rows: r.u64()?,
                        sum: f64::from_le_bytes(r.array()?),
                        min_ts_ms: r.i64()?,
                        max_ts_ms: r.i64()?,
                        exec_ns: r.u64()?,
                    },
                })
            }
            ERROR => {
                r.what = "error";
                let id = r.u64()?;
                let message = String::from_utf8_lossy(r.buf).into_owned();
                Ok(Self::Error { id, message })
            }
            other => Err(WireError::UnknownKind(other)),
        }
    }
}

fn read_rows(bytes: &[u8]) -> Result<RecordBatch, WireError> {
    let bad = |e: &dyn std::fmt::Display| WireError::BadRows(e.to_string());
    let reader = StreamReader::try_new(bytes, None).map_err(|e| bad(&e))?;
    let schema = reader.schema();
    let want = rows_schema();
    if schema.fields() != want.fields() {
        return Err(WireError::BadRows(format!(
            "schema {schema:?} is not the rows schema (series: Utf8, ts_ms: Int64, value: Float64, none null)"
        )));
    }
    let mut batches = Vec::new();
    for b in reader {
        batches.push(b.map_err(|e| bad(&e))?);
    }
    let batch = arrow::compute::concat_batches(&want, &batches).map_err(|e| bad(&e))?;
    if batch.columns().iter().any(|c| c.null_count() > 0) {
        return Err(WireError::BadRows("rows hold nulls".into()));
    }
    Ok(batch)
}

/// Builds a rows batch from its three columns.
///
/// # Errors
/// [`WireError::BadRows`] when the columns differ in length.
pub fn rows_batch(
    series: StringArray,
    ts_ms: Int64Array,
    value: Float64Array,
) -> Result<RecordBatch, WireError> {
    RecordBatch::try_new(
        rows_schema(),
        vec![Arc::new(series), Arc::new(ts_ms), Arc::new(value)],
    )
    .map_err(|e| WireError::BadRows(e.to_string()))
}

/// Reads one frame's body (kind byte and body, without the length prefix) into `buf`,
/// for [`Frame::decode`].
///
/// # Errors
/// [`WireError::Io`] when the connection fails or closes, [`WireError::BadLength`] when
/// the length prefix is out of bounds.
pub fn read_body<R: Read>(r: &mut R, buf: &mut Vec<u8>) -> Result<(), WireError> {
    let mut prefix = [0u8; 4];
    r.read_exact(&mut prefix)?;
    let len = u32::from_le_bytes(prefix) as usize;
    if len == 0 || len > MAX_FRAME_LEN {
        return Err(WireError::BadLength(len as u64));
    }
    buf.clear();
    buf.resize(len, 0);
    r.read_exact(buf)?;
    Ok(())
}

/// Reads and decodes one frame.
///
/// # Errors
/// [`WireError::Io`] when the connection fails or closes, others when the frame is bad.
pub fn read_frame<R: Read>(r: &mut R, buf: &mut Vec<u8>) -> Result<Frame, WireError> {
    read_body(r, buf)?;
    Frame::decode(buf)
}

/// Encodes and writes one frame.
///
/// # Errors
/// [`WireError`] when it cannot be encoded or written.
pub fn write_frame<W: Write>(w: &mut W, frame: &Frame, buf: &mut Vec<u8>) -> Result<(), WireError> {
    buf.clear();
    frame.encode(buf)?;
    w.write_all(buf)?;
    Ok(())
}

struct Cursor<'a> {
    buf: &'a [u8],
    what: &'static str,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.buf.len() < n {
            return Err(WireError::Truncated(self.what));
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, WireError> {
        self.array().map(u16::from_le_bytes)
    }

    fn u32(&mut self) -> Result<u32, WireError> {
        self.array().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Result<u64, WireError> {
        self.array().map(u64::from_le_bytes)
    }

    fn i64(&mut self) -> Result<i64, WireError> {
        self.array().map(i64::from_le_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hoptrace_probe::{HopId, Stamp, TraceKey};
    use proptest::prelude::*;

    fn rows(n: usize) -> RecordBatch {
        rows_batch(
            StringArray::from_iter_values((0..n).map(|i| format!("site/line/m{i}"))),
            Int64Array::from_iter_values((0..n as i64).map(|i| 1_700_000_000_000 + i)),
            Float64Array::from_iter_values((0..n).map(|i| i as f64 * 0.5)),
        )
        .unwrap()
    }

    fn roundtrip(f: &Frame) -> Frame {
        let mut out = Vec::new();
        f.encode(&mut out).unwrap();
        let len = u32::from_le_bytes(out[..4].try_into().unwrap()) as usize;
        assert_eq!(len, out.len() - 4);
        let mut buf = Vec::new();
        read_frame(&mut out.as_slice(), &mut buf).unwrap()
    }

    #[test]
    fn a_write_keeps_contexts_and_rows() {
        let mut ctx = TraceContext::new(
            TraceKey {
                publisher: 1,
                stream: 2,
                sequence: 3,
            },
            20,
            99,
        );
        ctx.push_stamp(Stamp {
            hop: HopId(2),
            ns: 1234,
        })
        .unwrap();
        let f = roundtrip(&Frame::Write {
            id: 7,
            contexts: vec![ctx, ctx],
            rows: rows(50),
        });
        let Frame::Write {
            id,
            contexts,
            rows: r,
        } = f
        else {
            panic!("{f:?}")
        };
        assert_eq!((id, contexts, r), (7, vec![ctx, ctx], rows(50)));
    }

    #[test]
    fn garbage_is_named() {
        let mut buf = Vec::new();
        let err = read_frame(&mut &[0u8, 0, 0, 0][..], &mut buf).unwrap_err();
        assert!(matches!(err, WireError::BadLength(0)), "{err}");
        let err = read_frame(&mut &[0xffu8, 0xff, 0xff, 0x7f][..], &mut buf).unwrap_err();
        assert!(matches!(err, WireError::BadLength(_)), "{err}");
        let err = Frame::decode(&[0x55, 1, 2]).unwrap_err();
        assert_eq!(err.to_string(), "unknown frame kind 0x55");
        let err = Frame::decode(&[WRITE, 1, 2]).unwrap_err();
        assert_eq!(err.to_string(), "write frame truncated");
        // A context byte string that is not a context.
        let mut body = vec![WRITE];
        body.extend_from_slice(&1u64.to_le_bytes());
        body.extend_from_slice(&1u16.to_le_bytes());
        body.extend_from_slice(&[3, 0xde, 0xad, 0xbe]);
        let err = Frame::decode(&body).unwrap_err();
        assert!(
            matches!(err, WireError::BadContext { index: 0, .. }),
            "{err}"
        );
        // Rows that are not Arrow IPC.
        let mut body = vec![WRITE];
        body.extend_from_slice(&1u64.to_le_bytes());
        body.extend_from_slice(&0u16.to_le_bytes());
        body.extend_from_slice(b"not arrow");
        let err = Frame::decode(&body).unwrap_err();
        assert!(matches!(err, WireError::BadRows(_)), "{err}");
    }

    #[test]
    fn rows_of_another_schema_are_refused() {
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
        let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(Int64Array::from(vec![1]))])
            .unwrap();
        let mut body = vec![WRITE];
        body.extend_from_slice(&1u64.to_le_bytes());
        body.extend_from_slice(&0u16.to_le_bytes());
        let mut w = StreamWriter::try_new(&mut body, &schema).unwrap();
        w.write(&batch).unwrap();
        w.finish().unwrap();
        drop(w);
        let err = Frame::decode(&body).unwrap_err();
        assert!(err.to_string().contains("not the rows schema"), "{err}");
    }

    proptest! {
        #[test]
        fn queries_and_answers_roundtrip(
            id in any::<u64>(),
            series in proptest::collection::vec("[a-z/0-9]{0,30}", 0..20),
            from_ms in any::<i64>(),
            to_ms in any::<i64>(),
            rows in any::<u64>(),
            sum in -1e12f64..1e12,
            exec_ns in any::<u64>(),
            visible in any::<bool>(),
        ) {
            let query = Query { series, from_ms, to_ms };
            let Frame::Query { id: i, query: q } = roundtrip(&Frame::Query { id, query: query.clone() }) else {
                panic!()
            };
            prop_assert_eq!((i, q), (id, query));
            let result = QueryResult { rows, sum, min_ts_ms: from_ms, max_ts_ms: to_ms, exec_ns };
            let Frame::QueryResult { id: i, result: r } = roundtrip(&Frame::QueryResult { id, result }) else {
                panic!()
            };
            prop_assert_eq!((i, r), (id, result));
            let Frame::WriteAck { id: i, rows: n, visible: v } = roundtrip(&Frame::WriteAck { id, rows: rows as u32, visible }) else {
                panic!()
            };
            prop_assert_eq!((i, n, v), (id, rows as u32, visible));
        }

        #[test]
        fn arbitrary_bodies_never_panic(body in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = Frame::decode(&body);
        }
    }
}
