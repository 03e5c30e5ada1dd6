//! Collectors as a Kafka consumer group, the parts that do not speak Kafka: where a
//! trace's records go ([`partition_of`]), the per-partition event-time join
//! ([`PartitionJoin`]) whose checkpoints let another member take a partition over
//! without losing or repeating a trace, the member's segment and ownership logs, and the
//! merge of every member's files into one run ([`open_group`]).
//!
//! # Why a rebalance neither loses nor double-counts a trace
//! A partition's records are joined in buckets of *intended* send time. The watermark `W`
//! is the largest intended time seen in the partition; a bucket closes, emitting its
//! traces complete or incomplete, once it lies wholly before `W - window`, and a record
//! of a closed bucket is late. Every decision is a function of the partition's log alone,
//! so two members reading the same offsets decide the same.
//!
//! A member checkpoints a partition at position `P` (the next offset to read) by writing
//! the files of the traces it emitted, logging them as a *segment* `(from, P]`, then
//! committing to Kafka the offset `C` of the oldest record of any open bucket, with the
//! [`Checkpoint`] `(P, closed_below, W)` as the commit's metadata. The next owner reads
//! from `C`, skips the records before `P` whose bucket was already closed at `P` (the
//! previous owner emitted or counted them), rebuilds the open buckets from the rest, and
//! from `P` on decides exactly as the previous owner would have.
//!
//! Each member logs, when it is assigned a partition, the position it starts from
//! (`ownership.jsonl`). A segment is valid when it lies between its owner's start and the
//! next owner's start: the segments a killed member wrote after its last commit are
//! exactly the ones its successor repeats, and they are set aside.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hoptrace_probe::TraceKey;
use hoptrace_probe::protocol::Record;
use serde::{Deserialize, Serialize};

use crate::accounting::Rows;
use crate::join::{JoinStats, JoinedTrace, Joiner};
use crate::run::{Accounting, PublisherAccount, RunSummary};
use crate::spec::ResolvedSpec;
use crate::writer::PartFile;

/// Directory of a group run that holds one directory per member.
pub const MEMBERS_DIR: &str = "members";
/// A member's log of the partitions it was assigned, one JSON [`Ownership`] per line.
pub const OWNERSHIP_FILE: &str = "ownership.jsonl";
/// A member's log of checkpointed segments, one JSON [`Segment`] per line.
pub const SEGMENTS_FILE: &str = "segments.jsonl";

/// MurmurHash2 as Kafka's default partitioner computes it for a keyed record (seed
/// `0x9747b28c`, 4-byte little-endian blocks).
#[must_use]
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    let len = u32::try_from(data.len()).expect("a key shorter than 4 GiB");
    let mut h = SEED ^ len;
    let mut blocks = data.chunks_exact(4);
    for b in &mut blocks {
        let mut k = u32::from_le_bytes(b.try_into().expect("4 bytes"));
        k = k.wrapping_mul(M);
        k ^= k >> 24;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M) ^ k;
    }
    let tail = blocks.remainder();
    if tail.len() >= 3 {
        h ^= u32::from(tail[2]) << 16;
    }
    if tail.len() >= 2 {
        h ^= u32::from(tail[1]) << 8;
    }
    if let Some(&b) = tail.first() {
        h ^= u32::from(b);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h.cast_signed()
}

/// The partition of `partitions` that a record keyed by `key` (its
/// [`TraceKey::to_le_bytes`]) goes to, as Kafka's default partitioner places it:
/// `(murmur2(key bytes) & 0x7fffffff) % partitions`.
#[must_use]
pub fn partition_of(key: &TraceKey, partitions: i32) -> i32 {
    (murmur2(&key.to_le_bytes()) & 0x7fff_ffff) % partitions.max(1)
}

/// A partition's state at a position, stored as the metadata of a Kafka offset commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The next offset the committing member would have read.
    pub position: i64,
    /// Buckets with a lower index were closed (emitted) at `position`.
    pub closed_below: i64,
    /// Largest intended time seen before `position`.
    pub watermark_ns: i64,
}

impl Checkpoint {
    /// As commit metadata.
    #[must_use]
    pub fn to_metadata(&self) -> String {
        serde_json::to_string(self).expect("a checkpoint serialises")
    }

    /// From commit metadata; `None` for empty or foreign metadata.
    #[must_use]
    pub fn from_metadata(text: &str) -> Option<Self> {
        serde_json::from_str(text).ok()
    }
}

/// What a stretch of a partition's log came to, counted when buckets close (traces) or
/// records arrive late.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tally {
    /// Records of the stretch's closed buckets and late records.
    pub records: u64,
    /// Records whose bucket had closed, or whose trace had completed.
    pub late: u64,
    /// Records of a hop the spec does not declare.
    pub unknown_hop: u64,
    /// Records whose stamp was implausible.
    #[serde(default)]
    pub implausible: u64,
    /// Traces flagged for an implausible intended time.
    #[serde(default)]
    pub implausible_traces: u64,
    /// Records by hop index (stored, duplicate or late).
    pub records_by_hop: Vec<u64>,
    /// Incomplete traces by the expected hop index they miss.
    pub missing_by_hop: Vec<u64>,
    /// Traces with a duplicate stamp.
    pub duplicate_traces: u64,
    /// Traces with a negative stage delta.
    pub negative_delta_traces: u64,
    /// (complete, incomplete) traces by publisher.
    pub publishers: BTreeMap<u16, (u64, u64)>,
}

impl Tally {
    fn add_stats(&mut self, s: &JoinStats, hops: usize) {
        self.records += s.records;
        self.late += s.late;
        self.unknown_hop += s.unknown_hop;
        self.implausible += s.implausible;
        self.implausible_traces += s.implausible_traces;
        self.duplicate_traces += s.duplicate_traces;
        self.negative_delta_traces += s.negative_delta_traces;
        add_counts(&mut self.records_by_hop, &s.records_by_hop[..hops]);
        add_counts(&mut self.missing_by_hop, &s.missing_by_hop[..hops]);
    }

    /// Adds `other` to this tally.
    pub fn add(&mut self, other: &Self) {
        self.records += other.records;
        self.late += other.late;
        self.unknown_hop += other.unknown_hop;
        self.implausible += other.implausible;
        self.implausible_traces += other.implausible_traces;
        self.duplicate_traces += other.duplicate_traces;
        self.negative_delta_traces += other.negative_delta_traces;
        add_counts(&mut self.records_by_hop, &other.records_by_hop);
        add_counts(&mut self.missing_by_hop, &other.missing_by_hop);
        for (p, (c, i)) in &other.publishers {
            let e = self.publishers.entry(*p).or_default();
            e.0 += c;
            e.1 += i;
        }
    }

    /// The run accounting this tally makes, with hop names for its per-hop counts.
    #[must_use]
    pub fn accounting(
        &self,
        hops: &[String],
        publishers: Vec<PublisherAccount>,
        records_lost_by_probes: u64,
        discrepancies: Vec<String>,
    ) -> Accounting {
        let named = |counts: &[u64]| -> BTreeMap<String, u64> {
            hops.iter()
                .cloned()
                .zip(counts.iter().copied().chain(std::iter::repeat(0)))
                .collect()
        };
        Accounting {
            publishers,
            missing_by_hop: named(&self.missing_by_hop)
                .into_iter()
                .filter(|(_, n)| *n > 0)
                .collect(),
            records_by_hop: named(&self.records_by_hop),
            records_lost_by_probes,
            duplicate_traces: self.duplicate_traces,
            negative_delta_traces: self.negative_delta_traces,
            late_records: self.late,
            unknown_hop_records: self.unknown_hop,
            unannounced_hop_records: 0,
            implausible_records: self.implausible,
            implausible_traces: self.implausible_traces,
            in_flight: 0,
            backpressure_episodes: 0,
            adds_up: discrepancies.is_empty(),
            discrepancies,
        }
    }

    /// Whether nothing was counted.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.records == 0 && self.publishers.is_empty()
    }
}

fn add_counts(into: &mut Vec<u64>, from: &[u64]) {
    if into.len() < from.len() {
        into.resize(from.len(), 0);
    }
    for (a, b) in into.iter_mut().zip(from) {
        *a += b;
    }
}

struct Bucket {
    joiner: Joiner,
    /// Complete traces, held until the bucket closes.
    held: Vec<JoinedTrace>,
    /// Offset of the bucket's first record.
    first_offset: i64,
}

/// The event-time join of one partition. See the [module documentation](self).
pub struct PartitionJoin {
    spec: Arc<ResolvedSpec>,
    window_ns: i64,
    bucket_ns: i64,
    /// Records before this offset in a closed bucket were handled by the previous owner.
    skip_until: i64,
    watermark_ns: i64,
    closed_below: i64,
    position: i64,
    buckets: BTreeMap<i64, Bucket>,
    tally: Tally,
    scratch: Vec<JoinedTrace>,
}

impl std::fmt::Debug for PartitionJoin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartitionJoin")
            .field("position", &self.position)
            .field("watermark_ns", &self.watermark_ns)
            .field("closed_below", &self.closed_below)
            .field("open_buckets", &self.buckets.len())
            .finish_non_exhaustive()
    }
}

impl PartitionJoin {
    /// A partition starting fresh at `offset` (`from` = `None`), or resuming from a
    /// previous owner's checkpoint (the records are then read from the committed offset,
    /// which is at or before `from.position`).
    #[must_use]
    pub fn new(spec: Arc<ResolvedSpec>, offset: i64, from: Option<Checkpoint>) -> Self {
        let window_ns = i64::try_from(spec.window_ns()).unwrap_or(i64::MAX);
        let bucket_ns = (window_ns / 4).clamp(1_000_000, 1_000_000_000);
        let (position, closed_below, watermark_ns) = match from {
            Some(c) => (c.position, c.closed_below, c.watermark_ns),
            None => (offset, i64::MIN, i64::MIN),
        };
        Self {
            spec,
            window_ns,
            bucket_ns,
            skip_until: position,
            watermark_ns,
            closed_below,
            position,
            buckets: BTreeMap::new(),
            tally: Tally::default(),
            scratch: Vec::new(),
        }
    }

    /// The next offset to read for the log to continue where this state stands.
    #[must_use]
    pub fn position(&self) -> i64 {
        self.position
    }

    /// The offset to commit: the oldest record of any open bucket, or the position.
    #[must_use]
    pub fn resume_offset(&self) -> i64 {
        self.buckets
            .values()
            .map(|b| b.first_offset)
            .min()
            .unwrap_or(self.position)
            .min(self.position)
    }

    /// The checkpoint to commit beside [`Self::resume_offset`].
    #[must_use]
    pub fn checkpoint(&self) -> Checkpoint {
        Checkpoint {
            position: self.position,
            closed_below: self.closed_below,
            watermark_ns: self.watermark_ns,
        }
    }

    /// Traces waiting in open buckets (complete ones held, and pending ones).
    #[must_use]
    pub fn pending(&self) -> usize {
        self.buckets
            .values()
            .map(|b| b.held.len() + b.joiner.pending())
            .sum()
    }

    /// Joins the records of the Kafka message at `offset` and closes the buckets the
    /// watermark has passed, pushing their traces to `out`.
    pub fn message(&mut self, offset: i64, records: &[Record], out: &mut Vec<JoinedTrace>) {
        let replay = offset < self.skip_until;
        for r in records {
            let bucket = r.intended_ns.div_euclid(self.bucket_ns);
            if bucket < self.closed_below {
                if !replay {
                    self.tally.records += 1;
                    self.tally.late += 1;
                    if let Some(i) = self.spec.hop_index(r.hop) {
                        let by_hop = &mut self.tally.records_by_hop;
                        by_hop.resize(by_hop.len().max(self.spec.hop_count()), 0);
                        by_hop[i] += 1;
                    } else {
                        self.tally.unknown_hop += 1;
                    }
                }
                continue;
            }
            let spec = &self.spec;
            let b = self.buckets.entry(bucket).or_insert_with(|| Bucket {
                joiner: Joiner::new(spec),
                held: Vec::new(),
                first_offset: offset,
            });
            // Arrival time never advances: buckets close by the watermark, not by the
            // joiner's own expiry.
            b.joiner.insert(r, 0, &mut b.held);
            if !replay {
                self.watermark_ns = self.watermark_ns.max(r.intended_ns);
            }
        }
        if !replay {
            self.position = self.position.max(offset + 1);
            let below = self
                .watermark_ns
                .saturating_sub(self.window_ns)
                .div_euclid(self.bucket_ns);
            self.close_below(below, out);
        }
    }

    /// Moves the position past offsets that held no records (transaction markers,
    /// messages that did not decode).
    pub fn skip(&mut self, offset: i64) {
        if offset >= self.skip_until {
            self.position = self.position.max(offset + 1);
        }
    }

    /// Closes every open bucket (end of the run).
    pub fn drain(&mut self, out: &mut Vec<JoinedTrace>) {
        let below = self
            .buckets
            .keys()
            .next_back()
            .map_or(self.closed_below, |b| b + 1);
        self.close_below(below, out);
    }

    fn close_below(&mut self, below: i64, out: &mut Vec<JoinedTrace>) {
        if below <= self.closed_below {
            return;
        }
        self.closed_below = below;
        let hops = self.spec.hop_count();
        while let Some(entry) = self.buckets.first_entry() {
            if *entry.key() >= below {
                break;
            }
            let mut b = entry.remove();
            self.scratch.clear();
            b.joiner.drain(&mut self.scratch);
            self.tally.add_stats(&b.joiner.stats(), hops);
            for t in b.held.iter().chain(&self.scratch) {
                let e = self.tally.publishers.entry(t.key.publisher).or_default();
                if t.complete {
                    e.0 += 1;
                } else {
                    e.1 += 1;
                }
            }
            out.append(&mut b.held);
            out.append(&mut self.scratch);
        }
    }

    /// What was counted since the last call.
    pub fn take_tally(&mut self) -> Tally {
        std::mem::take(&mut self.tally)
    }
}

/// A member was assigned a partition, starting at `start`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ownership {
    /// The member.
    pub member: String,
    /// The partition.
    pub partition: i32,
    /// The position it continues from (the previous owner's checkpoint; the first offset
    /// it read when there was none).
    pub start: i64,
    /// When it was assigned, Unix ns (orders two owners starting at the same position).
    pub assigned_unix_ns: i64,
}

/// A checkpointed stretch `(from, to]` of a partition: the files of the traces emitted
/// in it and what it counted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    /// The member that wrote it.
    pub member: String,
    /// The partition.
    pub partition: i32,
    /// Position at the previous checkpoint.
    pub from: i64,
    /// Position at this checkpoint.
    pub to: i64,
    /// Files, relative to the member's directory.
    pub files: Vec<PartFile>,
    /// What was counted.
    pub tally: Tally,
}

/// Appends one JSON line to `path` and syncs it to disk.
///
/// # Errors
/// When the file cannot be opened, written or synced.
pub fn append_line<T: Serialize>(path: &Path, value: &T) -> std::io::Result<()> {
    let mut f = OpenOptions::new().create(true).append(true).open(path)?;
    let mut line = serde_json::to_vec(value).map_err(std::io::Error::other)?;
    line.push(b'\n');
    f.write_all(&line)?;
    f.sync_data()
}

/// Reads a JSON-lines log; a torn last line (a member killed while writing it) is
/// ignored, any other bad line is an error naming the file and line.
fn read_lines<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Vec<T>, GroupError> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(GroupError::Io {
                path: path.to_owned(),
                source,
            });
        }
    };
    let lines: Vec<String> = BufReader::new(file)
        .lines()
        .collect::<Result<_, _>>()
        .map_err(|source| GroupError::Io {
            path: path.to_owned(),
            source,
        })?;
    let mut out = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        match serde_json::from_str(line) {
            Ok(v) => out.push(v),
            Err(_) if i + 1 == lines.len() => {
                tracing::warn!(
                    "{}: ignoring a torn last line (its writer was killed)",
                    path.display()
                );
            }
            Err(e) => {
                return Err(GroupError::Log {
                    path: path.to_owned(),
                    line: i + 1,
                    reason: e.to_string(),
                });
            }
        }
    }
    Ok(out)
}

/// Why a group run cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum GroupError {
    /// A file cannot be read.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A log line is not what a member writes.
    #[error("{path}:{line}: {reason}")]
    Log {
        /// The log.
        path: PathBuf,
        /// Line number (1-based).
        line: usize,
        /// Why.
        reason: String,
    },
    /// No member finished: there is no `run.json` to take the pipeline and probes from.
    #[error("{0}: no member of the group wrote run.json (none stopped cleanly)")]
    NoFinishedMember(PathBuf),
    /// A member's `run.json` does not parse.
    #[error("{path}: {reason}")]
    RunJson {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

/// A group run read as one run.
#[derive(Debug, Clone)]
pub struct GroupRun {
    /// The merged summary: the pipeline, probes and clocks of the member that finished
    /// last, the accounting of every valid segment of every member.
    pub summary: RunSummary,
    /// The part files of the valid segments.
    pub parts: Vec<PathBuf>,
    /// The directory of the member that finished last (its `clock.parquet` and
    /// `probes.parquet` hold what every member read from the control topic).
    pub tables_dir: PathBuf,
    /// Part files of segments repeated by a later owner, set aside.
    pub set_aside: Vec<PathBuf>,
}

/// What a group run holds: members, their logs and their summaries.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct GroupInfo {
    /// The consumer group.
    pub group: String,
    /// Members that wrote into the run, and whether each finished.
    pub members: BTreeMap<String, bool>,
    /// Segments counted.
    pub segments: u64,
    /// Segments set aside (repeated by a later owner after a member stopped without
    /// committing them).
    pub segments_set_aside: u64,
    /// Rows in the set-aside segments' files.
    pub rows_set_aside: u64,
    /// Partitions and, for each, the members that owned it in order.
    pub owners: BTreeMap<i32, Vec<String>>,
    /// Records-topic messages that were not hoptrace records frames, skipped: summed
    /// over members (a message re-read by a partition's next owner counts again).
    #[serde(default)]
    pub bad_messages: u64,
    /// Control-topic messages that were not hoptrace frames, skipped: every member reads
    /// the whole control topic, so the largest member count.
    #[serde(default)]
    pub bad_control_messages: u64,
}

/// Whether `dir` is a group run (it holds `members/`, not `run.json`).
#[must_use]
pub fn is_group_run(dir: &Path) -> bool {
    !dir.join("run.json").exists() && dir.join(MEMBERS_DIR).is_dir()
}

/// Which segments are valid: for each partition, owners ordered by (start, assignment
/// time); a segment counts when it lies within its owner's stretch, from its start to
/// the next owner's start.
#[must_use]
pub fn valid_segments(owners: &[Ownership], segments: &[Segment]) -> Vec<bool> {
    let mut by_partition: BTreeMap<i32, Vec<&Ownership>> = BTreeMap::new();
    for o in owners {
        by_partition.entry(o.partition).or_default().push(o);
    }
    for v in by_partition.values_mut() {
        v.sort_by(|a, b| {
            (a.start, a.assigned_unix_ns, &a.member).cmp(&(b.start, b.assigned_unix_ns, &b.member))
        });
    }
    segments
        .iter()
        .map(|s| {
            let Some(chain) = by_partition.get(&s.partition) else {
                return false;
            };
            chain.iter().enumerate().any(|(i, o)| {
                let end = chain.get(i + 1).map_or(i64::MAX, |n| n.start);
                o.member == s.member && s.from >= o.start && s.to <= end
            })
        })
        .collect()
}

/// Reads the group run in `dir` as one run.
///
/// # Errors
/// A log or `run.json` that does not read, or no member that finished.
pub fn open_group(dir: &Path) -> Result<GroupRun, GroupError> {
    let members_dir = dir.join(MEMBERS_DIR);
    let mut names: Vec<String> = std::fs::read_dir(&members_dir)
        .map_err(|source| GroupError::Io {
            path: members_dir.clone(),
            source,
        })?
        .flatten()
        .filter(|e| e.path().is_dir())
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    names.sort();
    let mut owners = Vec::new();
    let mut segments = Vec::new();
    let mut finished: Vec<(String, RunSummary)> = Vec::new();
    let mut members = BTreeMap::new();
    for name in &names {
        let mdir = members_dir.join(name);
        owners.extend(read_lines::<Ownership>(&mdir.join(OWNERSHIP_FILE))?);
        segments.extend(read_lines::<Segment>(&mdir.join(SEGMENTS_FILE))?);
        let run_json = mdir.join("run.json");
        let done = run_json.exists();
        members.insert(name.clone(), done);
        if done {
            let text = std::fs::read_to_string(&run_json).map_err(|source| GroupError::Io {
                path: run_json.clone(),
                source,
            })?;
            let s: RunSummary = serde_json::from_str(&text).map_err(|e| GroupError::RunJson {
                path: run_json.clone(),
                reason: e.to_string(),
            })?;
            finished.push((name.clone(), s));
        }
    }
    let Some((base_name, base)) = finished
        .iter()
        .max_by_key(|(_, s)| s.ended_unix_ns)
        .cloned()
    else {
        return Err(GroupError::NoFinishedMember(dir.to_owned()));
    };
    let valid = valid_segments(&owners, &segments);
    let mut total = Tally::default();
    let mut parts = Vec::new();
    let mut set_aside = Vec::new();
    let mut files = Vec::new();
    let mut info = GroupInfo {
        group: base
            .group
            .as_ref()
            .map(|g| g.group.clone())
            .unwrap_or_default(),
        members,
        ..GroupInfo::default()
    };
    for g in finished.iter().filter_map(|(_, s)| s.group.as_ref()) {
        info.bad_messages += g.bad_messages;
        info.bad_control_messages = info.bad_control_messages.max(g.bad_control_messages);
    }
    for (s, ok) in segments.iter().zip(&valid) {
        let mdir = members_dir.join(&s.member);
        let paths = s.files.iter().map(|f| mdir.join(&f.name));
        if *ok {
            info.segments += 1;
            total.add(&s.tally);
            parts.extend(paths);
            files.extend(s.files.iter().map(|f| PartFile {
                name: format!("{MEMBERS_DIR}/{}/{}", s.member, f.name),
                ..f.clone()
            }));
        } else {
            info.segments_set_aside += 1;
            info.rows_set_aside += s.files.iter().map(|f| f.rows).sum::<u64>();
            set_aside.extend(paths);
        }
    }
    parts.sort();
    let mut chain = owners.clone();
    chain.sort_by(|a, b| {
        (a.partition, a.start, a.assigned_unix_ns).cmp(&(b.partition, b.start, b.assigned_unix_ns))
    });
    for o in chain {
        info.owners.entry(o.partition).or_default().push(o.member);
    }
    // Partitions whose last owner did not finish still hold traces nobody emitted.
    let unfinished_owner = info.owners.values().any(|v| {
        v.last()
            .is_some_and(|m| !info.members.get(m).copied().unwrap_or(false))
    });
    let hops: Vec<String> = base.pipeline.hops.iter().map(|h| h.name.clone()).collect();
    // Sent snapshots are cumulative and every member read all of them.
    let mut sent: BTreeMap<u16, (u64, u64)> = BTreeMap::new();
    for (_, s) in &finished {
        for p in &s.accounting.publishers {
            if p.sent > 0 || sent.contains_key(&p.publisher) {
                let e = sent.entry(p.publisher).or_default();
                e.0 = e.0.max(p.sent);
                e.1 = e.1.max(p.sent_metrics);
            }
        }
    }
    let rows: BTreeMap<u16, Rows> = total
        .publishers
        .iter()
        .map(|(p, (c, i))| {
            (
                *p,
                Rows {
                    complete: *c,
                    incomplete: *i,
                },
            )
        })
        .collect();
    let (publishers, mut discrepancies) = crate::accounting::publishers_by_rows(&sent, &rows);
    if unfinished_owner {
        discrepancies.push(
            "a partition's last owner did not finish: traces it held were never written".into(),
        );
    }
    let mut summary = base;
    summary.started_unix_ns = finished
        .iter()
        .map(|(_, s)| s.started_unix_ns)
        .min()
        .unwrap_or(summary.started_unix_ns);
    summary.files = files;
    summary.stages = Vec::new();
    summary.accounting = total.accounting(
        &hops,
        publishers,
        summary.accounting.records_lost_by_probes,
        discrepancies,
    );
    summary.group = Some(info);
    Ok(GroupRun {
        summary,
        parts,
        tables_dir: members_dir.join(base_name),
        set_aside,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::PipelineSpec;
    use hoptrace_probe::HopId;

    #[test]
    fn murmur2_matches_kafkas_partitioner() {
        // Values of org.apache.kafka.common.utils.Utils.murmur2 (Kafka's own tests).
        for (input, want) in [
            (&b"21"[..], -973_932_308),
            (b"foobar", -790_332_482),
            (b"a-little-bit-long-string", -985_981_536),
            (b"a-little-bit-longer-string", -1_486_304_829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58_897_971,
            ),
            (b"abc", 479_470_107),
        ] {
            assert_eq!(murmur2(input), want, "{}", String::from_utf8_lossy(input));
        }
    }

    fn spec() -> Arc<ResolvedSpec> {
        // hops a, b, c expected; window 40 ms (buckets of 10 ms).
        let toml = r#"
            name = "group-test"
            expected = ["a", "b", "c"]
            [[hops]]
            name = "a"
            [[hops]]
            name = "b"
            [[hops]]
            name = "c"
            [[stages]]
            name = "A to C"
            from = "a"
            to = "c"
            definition = ""
            [join]
            window_ms = 40
        "#;
        Arc::new(
            PipelineSpec::from_toml_str(toml)
                .unwrap()
                .resolve()
                .unwrap(),
        )
    }

    /// A deterministic partition log: traces of 1 ms spacing, their hop records spread
    /// over the next messages, some hops missing, some duplicated, a few very late.
    fn log(messages: usize, seed: u64) -> Vec<Vec<Record>> {
        let mut rng = seed | 1;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut out: Vec<Vec<Record>> = vec![Vec::new(); messages + 64];
        for seq in 0..messages as u64 {
            let intended = 1_000_000_000 + seq as i64 * 1_000_000;
            for hop in 0..3u8 {
                let r = next();
                if r % 23 == 0 {
                    continue; // a lost stamp: the trace stays incomplete
                }
                let delay = if r % 97 == 0 { 60 } else { (r >> 8) % 12 } as usize;
                let rec = Record {
                    key: TraceKey {
                        publisher: (seq % 3) as u16,
                        stream: 1,
                        sequence: seq,
                    },
                    hop: HopId(hop),
                    stamp_ns: intended + i64::from(hop) * 10_000,
                    metric_count: 10,
                    intended_ns: intended,
                    otel_trace_id: None,
                };
                out[seq as usize + delay].push(rec);
                if r % 31 == 0 {
                    out[seq as usize + delay + 1].push(rec);
                }
            }
        }
        out
    }

    /// One uninterrupted owner: every row and the whole tally.
    fn uninterrupted(log: &[Vec<Record>]) -> (Vec<JoinedTrace>, Tally) {
        let mut p = PartitionJoin::new(spec(), 0, None);
        let mut rows = Vec::new();
        for (o, recs) in log.iter().enumerate() {
            p.message(o as i64, recs, &mut rows);
        }
        p.drain(&mut rows);
        (rows, p.take_tally())
    }

    fn sorted(mut rows: Vec<JoinedTrace>) -> Vec<JoinedTrace> {
        rows.sort_by_key(|t| (t.key.sequence, t.key.publisher));
        rows
    }

    #[test]
    fn a_successor_repeats_nothing_and_loses_nothing() {
        for seed in 1..40u64 {
            let log = log(400, seed);
            let (want_rows, want_tally) = uninterrupted(&log);
            let n = log.len() as i64;
            // Owner A checkpoints at `commit`, goes on to `killed` (writing a segment it
            // never commits), and dies; owner B resumes from the checkpoint.
            let commit = 20 + (seed as i64 * 37) % (n - 40);
            let killed = (commit + (seed as i64 * 13) % 30).min(n);
            let mut a = PartitionJoin::new(spec(), 0, None);
            let mut a_rows = Vec::new();
            for o in 0..commit {
                a.message(o, &log[o as usize], &mut a_rows);
            }
            let (resume, cp) = (a.resume_offset(), a.checkpoint());
            let a_tally = a.take_tally();
            let mut a_uncommitted = Vec::new();
            for o in commit..killed {
                a.message(o, &log[o as usize], &mut a_uncommitted);
            }
            let mut b = PartitionJoin::new(spec(), resume, Some(cp));
            let mut b_rows = Vec::new();
            for o in resume..n {
                b.message(o, &log[o as usize], &mut b_rows);
            }
            b.drain(&mut b_rows);
            let mut tally = a_tally;
            tally.add(&b.take_tally());
            let mut got = a_rows;
            got.extend(b_rows);
            assert_eq!(sorted(got), sorted(want_rows.clone()), "seed {seed}");
            assert_eq!(tally, want_tally, "seed {seed}");
            // The uncommitted rows are a subset of what B wrote: set aside, not lost.
            let want = sorted(want_rows);
            for t in a_uncommitted {
                assert!(want.contains(&t), "seed {seed}: {t:?}");
            }
        }
    }

    #[test]
    fn every_record_is_counted_once() {
        let log = log(500, 7);
        let (rows, tally) = uninterrupted(&log);
        let records: u64 = log.iter().map(|m| m.len() as u64).sum();
        assert_eq!(tally.records, records);
        assert_eq!(tally.records_by_hop.iter().sum::<u64>(), records);
        assert!(tally.late > 0, "the log has very late records");
        let traces: u64 = tally.publishers.values().map(|(c, i)| c + i).sum();
        assert_eq!(traces, rows.len() as u64);
        // Each trace once, except late records that started a trace after its bucket
        // closed — those are counted late, not joined.
        let mut keys: Vec<_> = rows.iter().map(|t| t.key).collect();
        keys.sort_by_key(|k| (k.sequence, k.publisher));
        keys.dedup();
        assert_eq!(keys.len(), rows.len());
    }

    #[test]
    fn resume_offset_is_the_oldest_open_bucket() {
        let mut p = PartitionJoin::new(spec(), 100, None);
        let mut out = Vec::new();
        let log = log(30, 3);
        for (i, m) in log.iter().enumerate().take(30) {
            p.message(100 + i as i64, m, &mut out);
        }
        assert!(p.pending() > 0);
        assert!(p.resume_offset() >= 100 && p.resume_offset() < p.position());
        p.drain(&mut out);
        assert_eq!(p.resume_offset(), p.position());
        assert_eq!(p.pending(), 0);
    }

    fn seg(member: &str, partition: i32, from: i64, to: i64) -> Segment {
        Segment {
            member: member.into(),
            partition,
            from,
            to,
            files: Vec::new(),
            tally: Tally::default(),
        }
    }

    fn own(member: &str, partition: i32, start: i64, at: i64) -> Ownership {
        Ownership {
            member: member.into(),
            partition,
            start,
            assigned_unix_ns: at,
        }
    }

    #[test]
    fn segments_after_a_successors_start_are_set_aside() {
        let owners = [
            own("a", 0, 0, 1),
            own("b", 0, 50, 5),
            own("a", 1, 0, 1),
            // c took partition 1 at 30 and was killed before committing; d took it at 30.
            own("c", 1, 30, 3),
            own("d", 1, 30, 4),
        ];
        let segments = [
            seg("a", 0, 0, 20),
            seg("a", 0, 20, 50),
            seg("a", 0, 50, 60), // after b's start: b repeated it
            seg("b", 0, 50, 90),
            seg("a", 1, 0, 30),
            seg("c", 1, 30, 40), // d repeated it
            seg("d", 1, 30, 70),
            seg("x", 1, 0, 10), // no ownership
        ];
        assert_eq!(
            valid_segments(&owners, &segments),
            [true, true, false, true, true, false, true, false]
        );
    }

    #[test]
    fn checkpoints_round_trip_as_commit_metadata() {
        let c = Checkpoint {
            position: 12,
            closed_below: -3,
            watermark_ns: 1_700_000_000_000_000_000,
        };
        assert_eq!(Checkpoint::from_metadata(&c.to_metadata()), Some(c));
        assert_eq!(Checkpoint::from_metadata(""), None);
        assert_eq!(Checkpoint::from_metadata("{\"foreign\":1}"), None);
    }
}
