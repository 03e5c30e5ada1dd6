//! The run's write-ahead log, `runs/<run-id>/wal/`: every event the join thread handles,
//! in the order it handled them, so that a collector killed at any moment and started
//! again with the same run id rebuilds exactly the state it had reached (the join, the
//! accounting, the files) and continues the same run.
//!
//! The log does not grow with the run: a checkpoint (`wal/checkpoint`, taken when a part
//! file closes) starts a new segment and records the state the run reached, and the
//! segments before it are deleted; a restart takes up the checkpoint and replays the
//! segments from its own on ([`replay`] from a segment).
//!
//! # Format
//! Segment files `NNNNNN.log`, numbered from 1, each a sequence of entries:
//!
//! | field | size |
//! | --- | --- |
//! | payload length L | u32 LE |
//! | CRC-32 (IEEE) of the payload | u32 LE |
//! | payload | L bytes |
//!
//! and the payload is one of (integers little-endian; `at` is the collector's join clock,
//! ns since the run started, which a restarted collector continues):
//!
//! | kind | fields |
//! | --- | --- |
//! | 1 connected | connection id u64, at u64, peer (u16 length + UTF-8), the Hello frame (type byte and body) |
//! | 2 frame | connection id u64, at u64, the frame (type byte and body) as received |
//! | 3 closed | connection id u64, at u64, clean u8 |
//! | 4 tick | at u64, realtime ns i64: the join's periodic step (expiry, the plausibility window, the end of an interval) |
//! | 5 started | realtime ns i64: when the run started (the log's first entry) |
//! | 6 restarted | realtime ns i64, entries u64, bytes u64, torn bytes u64, checkpoint realtime ns i64 (`i64::MIN`: none), replay ms u64, hop records replayed u64: a collector started again, took up the checkpoint and replayed the log after it (the last three fields are absent in logs of earlier versions) |
//! | 7 resent | connection id u64, records u64: a frame the log already held came again and was dropped |
//!
//! A reader stops at the first entry that is incomplete or fails its checksum: the tail a
//! killed writer left half written. Nothing after the last sync was acknowledged to a
//! probe, so probes speaking version 2 send it again.

use std::fs::{File, OpenOptions};
use std::io::{BufReader, BufWriter, Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use hoptrace_protocol::{Frame, Hello, MAX_FRAME_LEN};

/// The log's directory in a run directory.
pub const WAL_DIR: &str = "wal";

/// The file in the log's directory naming, one per line, the part files of `traces/` that
/// were there before the log started (a run continued with `--continue`): a replay keeps
/// them and writes every other part file again.
const KEPT: &str = "kept";

/// The file in the log's directory naming, one per line as `id name`, the hops of the
/// pipeline the log was written for: a log is replayed only by a collector of the same
/// hops.
const HOPS: &str = "hops";

/// Start a new segment after this many bytes.
const SEGMENT_BYTES: u64 = 256 << 20;

const CONNECTED: u8 = 1;
const FRAME: u8 = 2;
const CLOSED: u8 = 3;
const TICK: u8 = 4;
const STARTED: u8 = 5;
const RESTARTED: u8 = 6;
const RESENT: u8 = 7;

/// One logged event.
#[derive(Debug, Clone, PartialEq)]
pub enum Entry {
    /// A probe connected and said Hello.
    Connected {
        /// Connection id.
        id: u64,
        /// Join clock, ns.
        at: u64,
        /// Peer address.
        peer: SocketAddr,
        /// Its Hello.
        hello: Hello,
    },
    /// A frame of a connection (type byte and body, as received).
    Frame {
        /// Connection id.
        id: u64,
        /// Join clock, ns.
        at: u64,
        /// The frame.
        frame: Frame,
    },
    /// A connection ended.
    Closed {
        /// Connection id.
        id: u64,
        /// Join clock, ns.
        at: u64,
        /// After Goodbye.
        clean: bool,
    },
    /// The join's periodic step.
    Tick {
        /// Join clock, ns.
        at: u64,
        /// `CLOCK_REALTIME` at the step, ns.
        realtime_ns: i64,
    },
    /// The run started.
    Started {
        /// `CLOCK_REALTIME`, ns.
        realtime_ns: i64,
    },
    /// A collector started again on this log.
    Restarted {
        /// `CLOCK_REALTIME`, ns.
        realtime_ns: i64,
        /// Entries it replayed.
        entries: u64,
        /// Bytes it replayed.
        bytes: u64,
        /// Bytes of a torn tail it skipped.
        torn_bytes: u64,
        /// When the checkpoint it took up was taken, `CLOCK_REALTIME` ns.
        checkpoint_unix_ns: Option<i64>,
        /// How long taking up the checkpoint and replaying took, ms.
        replay_ms: u64,
        /// Hop records in the log it replayed.
        log_records: u64,
    },
    /// A numbered frame the log already held came again: dropped.
    Resent {
        /// Connection id.
        id: u64,
        /// Its records.
        records: u64,
    },
}

/// Why the log cannot be written or read.
#[derive(Debug, thiserror::Error)]
pub enum WalError {
    /// A file of the log cannot be created, written, synced or read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> WalError + '_ {
    move |source| WalError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Appends entries to the log; [`Wal::sync`] makes everything appended so far durable.
#[derive(Debug)]
pub struct Wal {
    dir: PathBuf,
    segment: u32,
    path: PathBuf,
    file: BufWriter<File>,
    segment_bytes: u64,
    /// Bytes appended in all, and bytes made durable.
    appended: u64,
    synced: u64,
    scratch: Vec<u8>,
}

impl Wal {
    /// Starts a new log in `run_dir/wal/`, first recording the part files `kept` that
    /// were in `traces/` before it (see [`kept`]).
    ///
    /// # Errors
    /// [`WalError::Io`] when the directory or a file cannot be created.
    pub fn create(
        run_dir: &Path,
        kept: &[String],
        hops: &[(u8, String)],
    ) -> Result<Self, WalError> {
        let dir = run_dir.join(WAL_DIR);
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        write_lines(&dir, KEPT, kept.iter().cloned())?;
        write_lines(
            &dir,
            HOPS,
            hops.iter().map(|(id, name)| format!("{id} {name}")),
        )?;
        Self::open(run_dir, 0)
    }

    /// Opens the log in `run_dir/wal/`, appending after `last_segment` (0: none yet).
    ///
    /// # Errors
    /// [`WalError::Io`] when the directory or the segment cannot be created.
    pub fn open(run_dir: &Path, last_segment: u32) -> Result<Self, WalError> {
        let dir = run_dir.join(WAL_DIR);
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        let segment = last_segment + 1;
        let (path, file) = create_segment(&dir, segment)?;
        sync_dir(&dir)?;
        Ok(Self {
            dir,
            segment,
            path,
            file,
            segment_bytes: 0,
            appended: 0,
            synced: 0,
            scratch: Vec::with_capacity(1 << 16),
        })
    }

    /// Appends a connection's Hello.
    ///
    /// # Errors
    /// [`WalError::Io`].
    pub fn connected(
        &mut self,
        id: u64,
        at: u64,
        peer: SocketAddr,
        hello: &Hello,
    ) -> Result<(), WalError> {
        let mut p = std::mem::take(&mut self.scratch);
        p.clear();
        p.push(CONNECTED);
        p.extend_from_slice(&id.to_le_bytes());
        p.extend_from_slice(&at.to_le_bytes());
        let peer = peer.to_string();
        p.extend_from_slice(&(peer.len() as u16).to_le_bytes());
        p.extend_from_slice(peer.as_bytes());
        let at_frame = p.len();
        Frame::Hello(hello.clone())
            .encode(&mut p)
            .expect("a decoded hello encodes again");
        // The frame without its length prefix.
        p.drain(at_frame..at_frame + 4);
        let r = self.append(&p);
        self.scratch = p;
        r
    }

    /// Appends a frame of connection `id` (`raw`: its type byte and body).
    ///
    /// # Errors
    /// [`WalError::Io`].
    pub fn frame(&mut self, id: u64, at: u64, raw: &[u8]) -> Result<(), WalError> {
        let mut head = [0u8; 17];
        head[0] = FRAME;
        head[1..9].copy_from_slice(&id.to_le_bytes());
        head[9..17].copy_from_slice(&at.to_le_bytes());
        self.append_parts(&head, raw)
    }

    /// Appends the end of connection `id`.
    ///
    /// # Errors
    /// [`WalError::Io`].
    pub fn closed(&mut self, id: u64, at: u64, clean: bool) -> Result<(), WalError> {
        let mut p = [0u8; 18];
        p[0] = CLOSED;
        p[1..9].copy_from_slice(&id.to_le_bytes());
        p[9..17].copy_from_slice(&at.to_le_bytes());
        p[17] = u8::from(clean);
        self.append(&p)
    }

    /// Appends the start of the run.
    ///
    /// # Errors
    /// [`WalError::Io`].
    pub fn started(&mut self, realtime_ns: i64) -> Result<(), WalError> {
        let mut p = [0u8; 9];
        p[0] = STARTED;
        p[1..9].copy_from_slice(&realtime_ns.to_le_bytes());
        self.append(&p)
    }

    /// Appends a restart: what the collector replayed.
    ///
    /// # Errors
    /// [`WalError::Io`].
    pub fn restarted(&mut self, r: &hoptrace_format::run::Restart) -> Result<(), WalError> {
        let mut p = [0u8; 57];
        p[0] = RESTARTED;
        p[1..9].copy_from_slice(&r.at_unix_ns.to_le_bytes());
        p[9..17].copy_from_slice(&r.log_entries.to_le_bytes());
        p[17..25].copy_from_slice(&r.log_bytes.to_le_bytes());
        p[25..33].copy_from_slice(&r.torn_bytes.to_le_bytes());
        p[33..41].copy_from_slice(&r.checkpoint_unix_ns.unwrap_or(i64::MIN).to_le_bytes());
        p[41..49].copy_from_slice(&r.replay_ms.to_le_bytes());
        p[49..57].copy_from_slice(&r.log_records.to_le_bytes());
        self.append(&p)
    }

    /// Appends a dropped re-sent frame of connection `id`.
    ///
    /// # Errors
    /// [`WalError::Io`].
    pub fn resent(&mut self, id: u64, records: u64) -> Result<(), WalError> {
        let mut p = [0u8; 17];
        p[0] = RESENT;
        p[1..9].copy_from_slice(&id.to_le_bytes());
        p[9..17].copy_from_slice(&records.to_le_bytes());
        self.append(&p)
    }

    /// Appends a step of the join.
    ///
    /// # Errors
    /// [`WalError::Io`].
    pub fn tick(&mut self, at: u64, realtime_ns: i64) -> Result<(), WalError> {
        let mut p = [0u8; 17];
        p[0] = TICK;
        p[1..9].copy_from_slice(&at.to_le_bytes());
        p[9..17].copy_from_slice(&realtime_ns.to_le_bytes());
        self.append(&p)
    }

    fn append(&mut self, payload: &[u8]) -> Result<(), WalError> {
        self.append_parts(payload, &[])
    }

    /// Appends one entry whose payload is `first` followed by `rest`, copying neither.
    fn append_parts(&mut self, first: &[u8], rest: &[u8]) -> Result<(), WalError> {
        if self.segment_bytes >= SEGMENT_BYTES {
            self.roll()?;
        }
        let len = u32::try_from(first.len() + rest.len()).expect("an entry is at most one frame");
        let mut crc = crc32fast::Hasher::new();
        crc.update(first);
        crc.update(rest);
        let mut head = [0u8; 8];
        head[..4].copy_from_slice(&len.to_le_bytes());
        head[4..].copy_from_slice(&crc.finalize().to_le_bytes());
        self.file
            .write_all(&head)
            .and_then(|()| self.file.write_all(first))
            .and_then(|()| self.file.write_all(rest))
            .map_err(io(&self.path))?;
        let n = 8 + u64::from(len);
        self.segment_bytes += n;
        self.appended += n;
        Ok(())
    }

    /// Starts a new segment for a checkpoint (the current one is synced first) and
    /// returns its number: every entry appended from now on is in it or after it.
    ///
    /// # Errors
    /// [`WalError::Io`].
    pub fn start_segment(&mut self) -> Result<u32, WalError> {
        self.roll()?;
        Ok(self.segment)
    }

    /// Deletes the segments before `segment`, which a checkpoint made unnecessary;
    /// returns their bytes.
    ///
    /// # Errors
    /// [`WalError::Io`].
    pub fn remove_before(&self, segment: u32) -> Result<u64, WalError> {
        remove_segments_before(self.dir.parent().unwrap_or(&self.dir), segment)
    }

    /// Starts the next segment (the current one is synced first).
    fn roll(&mut self) -> Result<(), WalError> {
        self.sync()?;
        self.segment += 1;
        let (path, file) = create_segment(&self.dir, self.segment)?;
        sync_dir(&self.dir)?;
        self.path = path;
        self.file = file;
        self.segment_bytes = 0;
        Ok(())
    }

    /// Writes what is buffered and waits until the disk has it (`fdatasync`).
    ///
    /// # Errors
    /// [`WalError::Io`].
    pub fn sync(&mut self) -> Result<(), WalError> {
        if self.synced == self.appended {
            return Ok(());
        }
        self.file.flush().map_err(io(&self.path))?;
        self.file.get_ref().sync_data().map_err(io(&self.path))?;
        self.synced = self.appended;
        Ok(())
    }

    /// Bytes appended so far (by this process).
    #[must_use]
    pub fn bytes(&self) -> u64 {
        self.appended
    }

    /// Deletes the log: the run closed cleanly and its files hold everything.
    ///
    /// # Errors
    /// [`WalError::Io`].
    pub fn remove(self) -> Result<(), WalError> {
        drop(self.file);
        std::fs::remove_dir_all(&self.dir).map_err(io(&self.dir))
    }
}

fn create_segment(dir: &Path, segment: u32) -> Result<(PathBuf, BufWriter<File>), WalError> {
    let path = dir.join(format!("{segment:06}.log"));
    let file = OpenOptions::new()
        .create_new(true)
        .write(true)
        .open(&path)
        .map_err(io(&path))?;
    Ok((path, BufWriter::with_capacity(4 << 20, file)))
}

/// Makes a new file's directory entry durable.
fn sync_dir(dir: &Path) -> Result<(), WalError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))
}

/// Writes `dir/name`, one line per item, through a temporary file and a rename.
fn write_lines(
    dir: &Path,
    name: &str,
    lines: impl Iterator<Item = String>,
) -> Result<(), WalError> {
    let tmp = dir.join(format!("{name}.tmp"));
    let path = dir.join(name);
    let mut text = String::new();
    for l in lines {
        text.push_str(&l);
        text.push('\n');
    }
    File::create(&tmp)
        .and_then(|mut f| {
            f.write_all(text.as_bytes())?;
            f.sync_all()
        })
        .map_err(io(&tmp))?;
    std::fs::rename(&tmp, &path).map_err(io(&path))
}

/// The hops (id, name) of the pipeline the log in `run_dir` was written for; `None` when
/// the log does not say.
///
/// # Errors
/// [`WalError::Io`] when the list exists but cannot be read.
pub fn hops(run_dir: &Path) -> Result<Option<Vec<(u8, String)>>, WalError> {
    let path = run_dir.join(WAL_DIR).join(HOPS);
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(Some(
            text.lines()
                .filter_map(|l| {
                    let (id, name) = l.split_once(' ')?;
                    Some((id.parse().ok()?, name.to_owned()))
                })
                .collect(),
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io(&path)(e)),
    }
}

/// The part files of `traces/` that were there before the log in `run_dir` started.
///
/// # Errors
/// [`WalError::Io`] when the list exists but cannot be read.
pub fn kept(run_dir: &Path) -> Result<Vec<String>, WalError> {
    let path = run_dir.join(WAL_DIR).join(KEPT);
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(text
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(io(&path)(e)),
    }
}

/// Deletes the segments of the log in `run_dir` numbered below `segment`; returns their
/// bytes.
///
/// # Errors
/// [`WalError::Io`] when the directory cannot be listed or a segment deleted.
pub fn remove_segments_before(run_dir: &Path, segment: u32) -> Result<u64, WalError> {
    let mut bytes = 0;
    for (n, path) in segments(run_dir)? {
        if n < segment {
            bytes += std::fs::metadata(&path).map_or(0, |m| m.len());
            std::fs::remove_file(&path).map_err(io(&path))?;
        }
    }
    Ok(bytes)
}

/// What a log held.
#[derive(Debug, Default)]
pub struct Replayed {
    /// The last segment's number (0: no log).
    pub last_segment: u32,
    /// Entries read.
    pub entries: u64,
    /// Bytes of entries read.
    pub bytes: u64,
    /// Bytes after the last whole entry of the last segment (a torn tail), skipped. The
    /// tails of earlier segments were counted by the restart that followed them.
    pub torn_bytes: u64,
}

/// The segments of the log in `run_dir`, in order; empty when there is none.
///
/// # Errors
/// [`WalError::Io`] when the directory cannot be listed.
pub fn segments(run_dir: &Path) -> Result<Vec<(u32, PathBuf)>, WalError> {
    let dir = run_dir.join(WAL_DIR);
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io(&dir)(e)),
    };
    let mut out: Vec<(u32, PathBuf)> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let n = name.strip_suffix(".log")?.parse().ok()?;
            Some((n, e.path()))
        })
        .collect();
    out.sort();
    Ok(out)
}

/// Reads every entry of the log in `run_dir` from segment `from` on (1: all of it), in
/// order, handing each to `f`; stops at a torn or corrupt entry (counted in
/// [`Replayed::torn_bytes`]) and at the first error `f` returns.
///
/// # Errors
/// [`WalError::Io`] when a segment cannot be read, or `f`'s error.
pub fn replay<E: From<WalError>>(
    run_dir: &Path,
    from: u32,
    mut f: impl FnMut(Entry) -> Result<(), E>,
) -> Result<Replayed, E> {
    let all = segments(run_dir)?;
    let mut r = Replayed {
        last_segment: all
            .last()
            .map_or(0, |(n, _)| *n)
            .max(from.saturating_sub(1)),
        ..Replayed::default()
    };
    let segs: Vec<(u32, PathBuf)> = all.into_iter().filter(|(n, _)| *n >= from).collect();
    for (i, (_, path)) in segs.iter().enumerate() {
        let file = File::open(path).map_err(io(path))?;
        let size = file.metadata().map_err(io(path))?.len();
        let mut reader = BufReader::with_capacity(1 << 20, file);
        let mut read = 0u64;
        let mut payload = Vec::new();
        loop {
            let mut head = [0u8; 8];
            match read_full(&mut reader, &mut head).map_err(io(path))? {
                0 => break,
                8 => {}
                _ => break,
            }
            let len = u32::from_le_bytes(head[..4].try_into().expect("4 bytes")) as usize;
            let crc = u32::from_le_bytes(head[4..].try_into().expect("4 bytes"));
            if len > MAX_FRAME_LEN + 64 {
                break;
            }
            payload.resize(len, 0);
            if read_full(&mut reader, &mut payload).map_err(io(path))? != len
                || crc32fast::hash(&payload) != crc
            {
                break;
            }
            let Some(entry) = decode(&payload) else {
                break;
            };
            read += 8 + len as u64;
            r.entries += 1;
            f(entry)?;
        }
        r.bytes += read;
        if read < size && i + 1 == segs.len() {
            r.torn_bytes = size - read;
        }
    }
    Ok(r)
}

/// Reads until `buf` is full or the input ends; the bytes read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

fn decode(p: &[u8]) -> Option<Entry> {
    let u64_at = |i: usize| {
        p.get(i..i + 8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8")))
    };
    match *p.first()? {
        CONNECTED => {
            let (id, at) = (u64_at(1)?, u64_at(9)?);
            let n = usize::from(u16::from_le_bytes(p.get(17..19)?.try_into().ok()?));
            let peer = std::str::from_utf8(p.get(19..19 + n)?).ok()?.parse().ok()?;
            let raw = p.get(19 + n..)?;
            match Frame::decode(*raw.first()?, &raw[1..]).ok()? {
                Frame::Hello(hello) => Some(Entry::Connected {
                    id,
                    at,
                    peer,
                    hello,
                }),
                _ => None,
            }
        }
        FRAME => {
            let (id, at) = (u64_at(1)?, u64_at(9)?);
            let raw = p.get(17..)?;
            let frame = Frame::decode(*raw.first()?, &raw[1..]).ok()?;
            Some(Entry::Frame { id, at, frame })
        }
        CLOSED => Some(Entry::Closed {
            id: u64_at(1)?,
            at: u64_at(9)?,
            clean: *p.get(17)? != 0,
        }),
        TICK => Some(Entry::Tick {
            at: u64_at(1)?,
            realtime_ns: u64_at(9)?.cast_signed(),
        }),
        STARTED => Some(Entry::Started {
            realtime_ns: u64_at(1)?.cast_signed(),
        }),
        RESTARTED => Some(Entry::Restarted {
            realtime_ns: u64_at(1)?.cast_signed(),
            entries: u64_at(9)?,
            bytes: u64_at(17)?,
            torn_bytes: u64_at(25)?,
            checkpoint_unix_ns: u64_at(33).map(u64::cast_signed).filter(|&t| t != i64::MIN),
            replay_ms: u64_at(41).unwrap_or(0),
            log_records: u64_at(49).unwrap_or(0),
        }),
        RESENT => Some(Entry::Resent {
            id: u64_at(1)?,
            records: u64_at(9)?,
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use hoptrace_protocol::{HopId, TraceKey};
    use hoptrace_protocol::{PROTOCOL_VERSION, Record};

    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "hoptrace-wal-{name}-{}-{}",
            std::process::id(),
            hoptrace_clock::realtime_ns()
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn hello() -> Hello {
        Hello {
            version: PROTOCOL_VERSION,
            instance_id: 42,
            host: "h".into(),
            process: "p".into(),
            software: "s".into(),
            token: String::new(),
            hops: vec![(HopId(0), "publish".into())],
        }
    }

    fn records(seq: u64) -> Frame {
        Frame::SeqRecords {
            seq,
            records: (0..3)
                .map(|i| Record {
                    key: TraceKey {
                        publisher: 1,
                        stream: 2,
                        sequence: seq * 10 + i,
                    },
                    hop: HopId(0),
                    stamp_ns: 5,
                    metric_count: 1,
                    intended_ns: 4,
                    otel_trace_id: None,
                })
                .collect(),
        }
    }

    fn raw(f: &Frame) -> Vec<u8> {
        f.to_bytes().unwrap()[4..].to_vec()
    }

    fn all(run: &Path) -> (Vec<Entry>, Replayed) {
        let mut got = Vec::new();
        let r = replay::<WalError>(run, 1, |e| {
            got.push(e);
            Ok(())
        })
        .unwrap();
        (got, r)
    }

    #[test]
    fn entries_come_back_in_order_across_reopenings() {
        let run = dir("order");
        let peer: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let mut w = Wal::open(&run, 0).unwrap();
        w.connected(1, 10, peer, &hello()).unwrap();
        w.frame(1, 11, &raw(&records(1))).unwrap();
        w.tick(12, 1_700).unwrap();
        w.sync().unwrap();
        drop(w);
        // A second process continues in a new segment.
        let (_, r) = all(&run);
        let mut w = Wal::open(&run, r.last_segment).unwrap();
        w.frame(1, 13, &raw(&records(2))).unwrap();
        w.closed(1, 14, true).unwrap();
        w.sync().unwrap();
        let (got, r) = all(&run);
        assert_eq!(r.last_segment, 2);
        assert_eq!(r.torn_bytes, 0);
        assert_eq!(
            got,
            [
                Entry::Connected {
                    id: 1,
                    at: 10,
                    peer,
                    hello: hello()
                },
                Entry::Frame {
                    id: 1,
                    at: 11,
                    frame: records(1)
                },
                Entry::Tick {
                    at: 12,
                    realtime_ns: 1_700
                },
                Entry::Frame {
                    id: 1,
                    at: 13,
                    frame: records(2)
                },
                Entry::Closed {
                    id: 1,
                    at: 14,
                    clean: true
                },
            ]
        );
        w.remove().unwrap();
        assert!(segments(&run).unwrap().is_empty());
        let _ = std::fs::remove_dir_all(&run);
    }

    #[test]
    fn a_torn_or_corrupt_tail_ends_the_replay_and_is_counted() {
        let run = dir("torn");
        let mut w = Wal::open(&run, 0).unwrap();
        for seq in 1..=3 {
            w.frame(1, seq, &raw(&records(seq))).unwrap();
        }
        w.sync().unwrap();
        drop(w);
        let path = run.join(WAL_DIR).join("000001.log");
        let whole = std::fs::read(&path).unwrap();
        let entry = whole.len() / 3;
        // Cut in the middle of the third entry: two come back, the rest is torn.
        std::fs::write(&path, &whole[..2 * entry + 5]).unwrap();
        let (got, r) = all(&run);
        assert_eq!((got.len(), r.torn_bytes), (2, 5));
        // A flipped bit in the second: one comes back.
        let mut bad = whole.clone();
        bad[entry + 20] ^= 1;
        std::fs::write(&path, &bad).unwrap();
        let (got, r) = all(&run);
        assert_eq!(got.len(), 1);
        assert_eq!(r.torn_bytes, (whole.len() - entry) as u64);
        let _ = std::fs::remove_dir_all(&run);
    }
}
