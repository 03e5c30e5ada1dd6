//! Checkpoints of a collector run, `runs/<run-id>/wal/checkpoint`: what the run had
//! reached at one moment, so that the write-ahead log before that moment can be deleted
//! and a collector started again after a kill replays only the log after it.
//!
//! A checkpoint is taken at the join's periodic step after a part file of `traces/` closed
//! (at most one per [`MIN_INTERVAL`], or the interval the collector is given). At that moment every trace the join emitted is in a
//! closed, synced part file, except the few emitted since that file closed, which the
//! checkpoint holds itself (`unwritten`). It records:
//!
//! - the log segment to replay from (the log starts a new segment for it);
//! - the closed part files, and the keys written (ranges per stream);
//! - the join: its counters, its clock and every pending trace with its stamps;
//! - the stages: their statistics so far and the length of each interval log;
//! - the accounting so far (rows per publisher, records, re-sent records dropped, the
//!   restarts), what probes said (connections, counters, clock statuses, what publishers
//!   sent) and, per exporter instance, the highest numbered frame the run holds.
//!
//! # File
//! Written whole through a temporary file, synced and renamed over the previous one.
//!
//! | field | size |
//! | --- | --- |
//! | magic `HTCKPT02` | 8 |
//! | CRC-32 (IEEE) of the body | u32 LE |
//! | body length | u64 LE |
//! | body | |
//!
//! The body is (integers little-endian): the segment (u32); the JSON of [`Meta`] (u32
//! length, bytes); the written keys (u32 streams, then per stream publisher u16, stream
//! u32, u32 ranges, ranges as first and last u64); the stages (u16 count, then per stage
//! u32 length and [`SignedStats::encode`] of the total, the same of the open interval, log
//! length u64, negative log length u64 or `u64::MAX` for none; then the interval's start,
//! i64); the bounds of the stages with a polled hop (u16 count, then per stage its name as
//! u32 length and bytes, and four [`SignedStats::encode`]s, each with its u32 length: the
//! smallest deltas' total and open interval, then the largest deltas'); the pending traces (u64 count, then per trace: first arrival u64, key, intended
//! i64, metric count u32, flags u8, present u16, trace id flag u8 and 16 bytes, a stamp
//! i64 per hop); the unwritten traces (u64 count, then per trace: key, intended i64, metric
//! count u32, flags u8, present u16, missing u16, complete u8, trace id flag u8 and 16
//! bytes, a stamp i64 per hop). A key is publisher u16, stream u32, sequence u64.
//!
//! The same state, taken as a run's collector closes it cleanly, is kept as
//! `runs/<run-id>/closed.checkpoint` ([`CLOSED`]): a collector continuing the run takes
//! it up as it would a checkpoint.
//!
//! The format belongs to the collector that wrote it: a collector of another version
//! refuses a checkpoint it cannot read, and says so.

use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hoptrace_format::hist::SignedStats;
use hoptrace_format::run::{PartFile, Restart};
use hoptrace_protocol::MAX_HOPS;
use hoptrace_protocol::{OtelTraceId, TraceKey};
use serde::{Deserialize, Serialize};

use crate::join::{JoinStats, JoinedTrace, PendingTrace};
use crate::keys::{SeqSet, WrittenKeys};
use crate::stages::{BoundSnapshot, StageSnapshot, StagesSnapshot};
use crate::wal::{WAL_DIR, WalError};

/// The checkpoint's file in the log's directory.
pub(crate) const FILE: &str = "checkpoint";

/// The run's state at its last clean close, in the run directory: a checkpoint with
/// nothing pending and every trace in a closed file, whose log starts at segment 1 (the
/// log of a continued run is new). A collector that continues the run (`collect --run-id
/// ID --continue`) takes it up, so the run keeps what its earlier collectors had: what
/// publishers sent, the probes, the clocks, the stages, the keys written.
pub(crate) const CLOSED: &str = "closed.checkpoint";

/// Checkpoints are at least this far apart unless the collector is told otherwise
/// (`CollectorConfig::checkpoint_interval`): a run whose part files close every second
/// (1M traces/s) does not write its state every second.
pub(crate) const MIN_INTERVAL: Duration = Duration::from_secs(5);

const MAGIC: &[u8; 8] = b"HTCKPT02";

/// The state of a run at a checkpoint, apart from the bulk below.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Meta {
    /// When it was taken, `CLOCK_REALTIME` ns.
    pub(crate) taken_unix_ns: i64,
    /// The join clock when it was taken (ns since the run started).
    pub(crate) at_ns: u64,
    /// The joiner's clock.
    pub(crate) joiner_clock_ns: u64,
    /// When the run started.
    pub(crate) started_unix_ns: i64,
    /// When the current interval of the progress figures began.
    pub(crate) interval_start_ns: i64,
    /// Hop records received so far.
    pub(crate) records: u64,
    /// Records of re-sent frames dropped so far.
    pub(crate) resent_dropped: u64,
    /// Times the join filled up so far.
    pub(crate) backpressure_episodes: u64,
    /// Highest connection id so far.
    pub(crate) max_conn_id: u64,
    /// Restarts so far.
    pub(crate) restarts: Vec<Restart>,
    /// Rows written per publisher: (publisher, complete, incomplete).
    pub(crate) tallies: Vec<(u16, u64, u64)>,
    /// Highest numbered frame held, per exporter instance.
    pub(crate) logged_seq: Vec<(u64, u64)>,
    /// Exporter instance of each connection.
    pub(crate) instances: Vec<(u64, u64)>,
    /// The join's counters.
    pub(crate) stats: JoinStats,
    /// The part files closed, in order.
    pub(crate) files: Vec<PartFile>,
    /// Hops per trace in the bulk below.
    pub(crate) hops: usize,
    /// Checkpoints taken in the run, this one included.
    pub(crate) checkpoints: u64,
    /// What probes said.
    pub(crate) control: crate::control::ControlSnapshot,
}

/// What a run had reached at a checkpoint.
#[derive(Debug, Clone)]
pub(crate) struct Checkpoint {
    /// The first log segment after it: a restart replays from there.
    pub(crate) segment: u32,
    pub(crate) meta: Meta,
    /// Every key written (kept files' keys included).
    pub(crate) written: WrittenKeys,
    pub(crate) stages: StagesSnapshot,
    /// Traces waiting for records, oldest first.
    pub(crate) pending: Vec<PendingTrace>,
    /// Traces emitted after the last closed part file, in order: not in any file yet.
    pub(crate) unwritten: Vec<JoinedTrace>,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> WalError + '_ {
    move |source| WalError::Io {
        path: path.to_owned(),
        source,
    }
}

fn corrupt(path: &Path, why: &str) -> WalError {
    WalError::Io {
        path: path.to_owned(),
        source: std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "the run's checkpoint does not read ({why}): it was written by another version of hoptrace, or damaged"
            ),
        ),
    }
}

impl Checkpoint {
    /// The body of the file.
    fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(
            1024 + self.pending.len() * (60 + 8 * self.meta.hops)
                + self.unwritten.len() * (60 + 8 * self.meta.hops),
        );
        b.extend_from_slice(&self.segment.to_le_bytes());
        let meta = serde_json::to_vec(&self.meta).expect("the checkpoint's state serializes");
        put_len(&mut b, meta.len());
        b.extend_from_slice(&meta);

        let streams: Vec<_> = self.written.streams().collect();
        put_len(&mut b, streams.len());
        for (&(publisher, stream), set) in streams {
            b.extend_from_slice(&publisher.to_le_bytes());
            b.extend_from_slice(&stream.to_le_bytes());
            let ranges: Vec<(u64, u64)> = set.iter_ranges().collect();
            put_len(&mut b, ranges.len());
            for (first, last) in ranges {
                b.extend_from_slice(&first.to_le_bytes());
                b.extend_from_slice(&last.to_le_bytes());
            }
        }

        b.extend_from_slice(
            &u16::try_from(self.stages.stages.len())
                .expect("at most 255 stages")
                .to_le_bytes(),
        );
        for s in &self.stages.stages {
            put_bytes(&mut b, s.name.as_bytes());
            put_bytes(&mut b, &s.total.encode());
            put_bytes(&mut b, &s.interval.encode());
            b.extend_from_slice(&s.log_len.to_le_bytes());
            b.extend_from_slice(&s.negative_log_len.unwrap_or(u64::MAX).to_le_bytes());
        }
        b.extend_from_slice(&self.stages.interval_start_unix_ns.to_le_bytes());
        b.extend_from_slice(
            &u16::try_from(self.stages.bounds.len())
                .expect("at most 255 stages")
                .to_le_bytes(),
        );
        for s in &self.stages.bounds {
            put_bytes(&mut b, s.stage.as_bytes());
            for st in [&s.lower.0, &s.lower.1, &s.upper.0, &s.upper.1] {
                put_bytes(&mut b, &st.encode());
            }
        }

        let hops = self.meta.hops;
        b.extend_from_slice(&(self.pending.len() as u64).to_le_bytes());
        for p in &self.pending {
            b.extend_from_slice(&p.first_arrival_ns.to_le_bytes());
            put_key(&mut b, &p.key);
            b.extend_from_slice(&p.intended_ns.to_le_bytes());
            b.extend_from_slice(&p.metric_count.to_le_bytes());
            b.push(p.flags);
            b.extend_from_slice(&p.present.to_le_bytes());
            put_trace_id(&mut b, p.otel_trace_id);
            for s in &p.stamps_ns[..hops] {
                b.extend_from_slice(&s.to_le_bytes());
            }
        }
        b.extend_from_slice(&(self.unwritten.len() as u64).to_le_bytes());
        for t in &self.unwritten {
            put_key(&mut b, &t.key);
            b.extend_from_slice(&t.intended_ns.to_le_bytes());
            b.extend_from_slice(&t.metric_count.to_le_bytes());
            b.push(t.flags);
            b.extend_from_slice(&t.present_mask.to_le_bytes());
            b.extend_from_slice(&t.missing_mask.to_le_bytes());
            b.push(u8::from(t.complete));
            put_trace_id(&mut b, t.otel_trace_id);
            for s in &t.stamps_ns[..hops] {
                b.extend_from_slice(&s.to_le_bytes());
            }
        }
        b
    }

    /// Reads a body written by [`Self::encode`]; `None` when it is not one.
    fn decode(body: &[u8]) -> Option<Self> {
        let mut r = Reader(body);
        let segment = r.u32()?;
        let meta: Meta = serde_json::from_slice(r.bytes()?).ok()?;
        let hops = meta.hops;
        if !(1..=MAX_HOPS).contains(&hops) {
            return None;
        }

        let mut written = WrittenKeys::new();
        for _ in 0..r.u32()? {
            let (publisher, stream) = (r.u16()?, r.u32()?);
            let n = r.u32()? as usize;
            let mut ranges = Vec::with_capacity(n.min(r.0.len() / 16));
            for _ in 0..n {
                ranges.push((r.u64()?, r.u64()?));
            }
            if !written.insert_stream(publisher, stream, SeqSet::from_ranges(&ranges)?) {
                return None;
            }
        }

        let mut stages = Vec::new();
        for _ in 0..r.u16()? {
            let name = String::from_utf8(r.bytes()?.to_vec()).ok()?;
            let total = SignedStats::decode(r.bytes()?).ok()?;
            let interval = SignedStats::decode(r.bytes()?).ok()?;
            let log_len = r.u64()?;
            let negative = r.u64()?;
            stages.push(StageSnapshot {
                name,
                total,
                interval,
                log_len,
                negative_log_len: (negative != u64::MAX).then_some(negative),
            });
        }
        let interval_start_unix_ns = r.i64()?;
        let mut bounds = Vec::new();
        for _ in 0..r.u16()? {
            let stage = String::from_utf8(r.bytes()?.to_vec()).ok()?;
            let mut stats = || SignedStats::decode(r.bytes()?).ok();
            bounds.push(BoundSnapshot {
                stage,
                lower: (stats()?, stats()?),
                upper: (stats()?, stats()?),
            });
        }
        let stages = StagesSnapshot {
            interval_start_unix_ns,
            stages,
            bounds,
        };

        let n = r.u64()?;
        let mut pending = Vec::with_capacity(usize::try_from(n).ok()?.min(r.0.len() / 40));
        for _ in 0..n {
            let first_arrival_ns = r.u64()?;
            let key = r.key()?;
            let intended_ns = r.i64()?;
            let metric_count = r.u32()?;
            let flags = r.u8()?;
            let present = r.u16()?;
            let otel_trace_id = r.trace_id()?;
            let mut stamps_ns = [0i64; MAX_HOPS];
            for s in &mut stamps_ns[..hops] {
                *s = r.i64()?;
            }
            pending.push(PendingTrace {
                first_arrival_ns,
                key,
                intended_ns,
                metric_count,
                otel_trace_id,
                present,
                flags,
                stamps_ns,
            });
        }
        let n = r.u64()?;
        let mut unwritten = Vec::with_capacity(usize::try_from(n).ok()?.min(r.0.len() / 40));
        for _ in 0..n {
            let key = r.key()?;
            let intended_ns = r.i64()?;
            let metric_count = r.u32()?;
            let flags = r.u8()?;
            let present_mask = r.u16()?;
            let missing_mask = r.u16()?;
            let complete = r.u8()? != 0;
            let otel_trace_id = r.trace_id()?;
            let mut stamps_ns = [0i64; MAX_HOPS];
            for s in &mut stamps_ns[..hops] {
                *s = r.i64()?;
            }
            unwritten.push(JoinedTrace {
                key,
                metric_count,
                intended_ns,
                otel_trace_id,
                present_mask,
                stamps_ns,
                complete,
                missing_mask,
                flags,
            });
        }
        r.0.is_empty().then_some(Self {
            segment,
            meta,
            written,
            stages,
            pending,
            unwritten,
        })
    }

    /// Writes the checkpoint as `run_dir/wal/checkpoint` (whole, or not at all: a
    /// temporary file, synced and renamed over the previous one); returns its bytes.
    ///
    /// # Errors
    /// [`WalError::Io`].
    pub(crate) fn write(&self, run_dir: &Path) -> Result<u64, WalError> {
        self.write_to(&run_dir.join(WAL_DIR), FILE)
    }

    /// Writes the state of a run its collector closed cleanly to `run_dir/`[`CLOSED`],
    /// for a collector that continues the run (`collect --continue`).
    ///
    /// # Errors
    /// [`WalError::Io`] when it cannot be written or synced.
    pub(crate) fn write_closed(&self, run_dir: &Path) -> Result<u64, WalError> {
        self.write_to(run_dir, CLOSED)
    }

    /// Writes the checkpoint as `dir/name`, whole, through a synced temporary file.
    fn write_to(&self, dir: &Path, name: &str) -> Result<u64, WalError> {
        let body = self.encode();
        let tmp = dir.join(format!("{name}.tmp"));
        let path = dir.join(name);
        let mut head = Vec::with_capacity(20);
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
        head.extend_from_slice(&(body.len() as u64).to_le_bytes());
        File::create(&tmp)
            .and_then(|mut f| {
                f.write_all(&head)?;
                f.write_all(&body)?;
                f.sync_all()
            })
            .map_err(io(&tmp))?;
        std::fs::rename(&tmp, &path).map_err(io(&path))?;
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io(dir))?;
        Ok((head.len() + body.len()) as u64)
    }

    /// The checkpoint of the log in `run_dir`, if it has one.
    ///
    /// # Errors
    /// [`WalError::Io`] when it cannot be read, or does not read as a checkpoint.
    pub(crate) fn read(run_dir: &Path) -> Result<Option<Self>, WalError> {
        Self::read_from(&path(run_dir))
    }

    /// The state a collector left at its clean close (`run_dir/`[`CLOSED`]), if any.
    ///
    /// # Errors
    /// [`WalError::Io`] when it cannot be read, or does not read as a checkpoint.
    pub(crate) fn read_closed(run_dir: &Path) -> Result<Option<Self>, WalError> {
        Self::read_from(&run_dir.join(CLOSED))
    }

    fn read_from(path: &Path) -> Result<Option<Self>, WalError> {
        let path = path.to_owned();
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io(&path)(e)),
        };
        if bytes.len() < 20 || &bytes[..8] != MAGIC {
            return Err(corrupt(&path, "not a checkpoint of this version"));
        }
        let crc = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
        let len = u64::from_le_bytes(bytes[12..20].try_into().expect("8 bytes"));
        let body = &bytes[20..];
        if body.len() as u64 != len || crc32fast::hash(body) != crc {
            return Err(corrupt(&path, "its length or checksum does not match"));
        }
        Self::decode(body)
            .map(Some)
            .ok_or_else(|| corrupt(&path, "its content does not decode"))
    }
}

/// `run_dir/wal/checkpoint`.
pub(crate) fn path(run_dir: &Path) -> PathBuf {
    run_dir.join(WAL_DIR).join(FILE)
}

fn put_len(b: &mut Vec<u8>, n: usize) {
    b.extend_from_slice(
        &u32::try_from(n)
            .expect("fewer than 2^32 items")
            .to_le_bytes(),
    );
}

fn put_bytes(b: &mut Vec<u8>, bytes: &[u8]) {
    put_len(b, bytes.len());
    b.extend_from_slice(bytes);
}

fn put_key(b: &mut Vec<u8>, k: &TraceKey) {
    b.extend_from_slice(&k.publisher.to_le_bytes());
    b.extend_from_slice(&k.stream.to_le_bytes());
    b.extend_from_slice(&k.sequence.to_le_bytes());
}

fn put_trace_id(b: &mut Vec<u8>, id: Option<OtelTraceId>) {
    b.push(u8::from(id.is_some()));
    b.extend_from_slice(&id.map_or([0; 16], |i| i.0));
}

/// Reads the body front to back; every method `None` past its end.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.0.split_first_chunk::<N>()?;
        self.0 = rest;
        Some(*head)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take::<1>().map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take().map(u16::from_le_bytes)
    }
    fn u32(&mut self) -> Option<u32> {
        self.take().map(u32::from_le_bytes)
    }
    fn u64(&mut self) -> Option<u64> {
        self.take().map(u64::from_le_bytes)
    }
    fn i64(&mut self) -> Option<i64> {
        self.take().map(i64::from_le_bytes)
    }
    fn bytes(&mut self) -> Option<&[u8]> {
        let n = self.u32()? as usize;
        let head = self.0.get(..n)?;
        self.0 = &self.0[n..];
        Some(head)
    }
    fn key(&mut self) -> Option<TraceKey> {
        Some(TraceKey {
            publisher: self.u16()?,
            stream: self.u32()?,
            sequence: self.u64()?,
        })
    }
    fn trace_id(&mut self) -> Option<Option<OtelTraceId>> {
        let some = self.u8()?;
        let id = self.take::<16>()?;
        match some {
            0 => Some(None),
            1 => Some(Some(OtelTraceId(id))),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(sequence: u64) -> TraceKey {
        TraceKey {
            publisher: 3,
            stream: 9,
            sequence,
        }
    }

    fn sample() -> Checkpoint {
        let mut written = WrittenKeys::new();
        for s in (0..100).chain(150..160) {
            written.insert(&key(s));
        }
        written.insert(&TraceKey {
            publisher: 1,
            stream: 2,
            sequence: 7,
        });
        let mut stats = SignedStats::default();
        stats.add_values(&[5, -3, 1_000_000]);
        let mut stamps_ns = [0; MAX_HOPS];
        stamps_ns[1] = 42;
        Checkpoint {
            segment: 7,
            meta: Meta {
                taken_unix_ns: 1,
                at_ns: 2,
                joiner_clock_ns: 3,
                started_unix_ns: 4,
                interval_start_ns: 5,
                records: 6,
                resent_dropped: 7,
                backpressure_episodes: 8,
                max_conn_id: 9,
                restarts: Vec::new(),
                tallies: vec![(3, 100, 10)],
                logged_seq: vec![(77, 12)],
                instances: vec![(1, 77)],
                stats: JoinStats {
                    records: 11,
                    ..JoinStats::default()
                },
                files: vec![PartFile {
                    name: "part-00000.parquet".into(),
                    rows: 100,
                    bytes: 1234,
                }],
                hops: 3,
                checkpoints: 1,
                control: crate::control::ControlSnapshot::default(),
            },
            written,
            stages: StagesSnapshot {
                interval_start_unix_ns: 99,
                stages: vec![StageSnapshot {
                    name: "Broker Time".into(),
                    total: stats.clone(),
                    interval: SignedStats::default(),
                    log_len: 400,
                    negative_log_len: Some(300),
                }],
                bounds: vec![BoundSnapshot {
                    stage: "Broker Time".into(),
                    lower: (SignedStats::default(), stats.clone()),
                    upper: (stats.clone(), SignedStats::default()),
                }],
            },
            pending: vec![PendingTrace {
                first_arrival_ns: 10,
                key: key(200),
                intended_ns: -5,
                metric_count: 50,
                otel_trace_id: Some(OtelTraceId([9; 16])),
                present: 0b10,
                flags: 1,
                stamps_ns,
            }],
            unwritten: vec![JoinedTrace {
                key: key(160),
                metric_count: 5,
                intended_ns: 6,
                otel_trace_id: None,
                present_mask: 0b10,
                stamps_ns,
                complete: false,
                missing_mask: 0b101,
                flags: 2,
            }],
        }
    }

    #[test]
    fn a_checkpoint_reads_back_as_written_and_a_damaged_one_is_refused() {
        let run = std::env::temp_dir().join(format!(
            "hoptrace-checkpoint-{}-{}",
            std::process::id(),
            hoptrace_clock::realtime_ns()
        ));
        std::fs::create_dir_all(run.join(WAL_DIR)).unwrap();
        assert!(Checkpoint::read(&run).unwrap().is_none());
        let c = sample();
        c.write(&run).unwrap();
        let back = Checkpoint::read(&run).unwrap().unwrap();
        assert_eq!(back.segment, 7);
        assert_eq!(back.meta.tallies, c.meta.tallies);
        assert_eq!(back.meta.stats, c.meta.stats);
        assert_eq!(back.meta.files, c.meta.files);
        assert_eq!(back.written.len(), c.written.len());
        for s in 0..200 {
            assert_eq!(back.written.contains(&key(s)), c.written.contains(&key(s)));
        }
        assert_eq!(back.stages, c.stages);
        assert_eq!(back.pending, c.pending);
        assert_eq!(back.unwritten, c.unwritten);
        // One flipped bit anywhere: refused, never half read.
        let p = path(&run);
        let mut bytes = std::fs::read(&p).unwrap();
        let at = bytes.len() / 2;
        bytes[at] ^= 4;
        std::fs::write(&p, &bytes).unwrap();
        let e = Checkpoint::read(&run).unwrap_err().to_string();
        assert!(e.contains("does not read"), "{e}");
        let _ = std::fs::remove_dir_all(&run);
    }
}
