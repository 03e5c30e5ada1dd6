//! Collectors as a Kafka consumer group, the parts that do not speak Kafka: where a
//! trace's records go ([`partition_of`]) and the per-partition event-time join
//! ([`PartitionJoin`]) whose checkpoints let another member take a partition over
//! without losing or repeating a trace. The member's logs and the merge of every member's
//! files into one run are the dataset's read side: `hoptrace_format::group`.
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
use std::sync::Arc;

use hoptrace_protocol::Record;
use hoptrace_protocol::TraceKey;
use serde::{Deserialize, Serialize};

use crate::join::{JoinStats, JoinedTrace, Joiner};
use hoptrace_format::group::{Tally, add_counts};
use hoptrace_format::spec::ResolvedSpec;

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

/// Adds a joiner's counters to `tally`: the figures of its `hops` first hops.
pub(crate) fn add_join_stats(tally: &mut Tally, s: &JoinStats, hops: usize) {
    tally.records += s.records;
    tally.late += s.late;
    tally.unknown_hop += s.unknown_hop;
    tally.implausible += s.implausible;
    tally.implausible_traces += s.implausible_traces;
    tally.duplicate_traces += s.duplicate_traces;
    tally.negative_delta_traces += s.negative_delta_traces;
    add_counts(&mut tally.records_by_hop, &s.records_by_hop[..hops]);
    add_counts(&mut tally.missing_by_hop, &s.missing_by_hop[..hops]);
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
            add_join_stats(&mut self.tally, &b.joiner.stats(), hops);
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

#[cfg(test)]
mod tests {
    use super::*;
    use hoptrace_format::spec::PipelineSpec;
    use hoptrace_protocol::HopId;

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
