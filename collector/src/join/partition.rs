//! Collectors as a Kafka consumer group, the parts that do not speak Kafka: where a
//! trace's records go ([`partition_of`]) and the per-partition event-time join
//! ([`PartitionJoin`]) whose checkpoints let another member take a partition over
//! without losing or repeating a trace. The member's logs and the merge of every member's
//! files into one run are the dataset's read side: `hoptrace_format::group`.
//!
//! # Why a rebalance neither loses nor double-counts a trace
//! A partition's records are joined in buckets of *intended* send time. The watermark `W`
//! is the largest plausible intended time of a trace's first record seen in the
//! partition; a bucket closes,
//! emitting its traces complete or incomplete, once it lies wholly before `W - window`,
//! and a record of a closed bucket is late. A key is written once: the first record of a
//! key places its trace in a bucket, every later record of that key joins the trace
//! there whatever intended time it carries, and a record of a key already written (the
//! partition keeps every key it wrote, [`PartitionKeys`]) is late. Every decision is a
//! function of the partition's log alone (the plausibility of an intended time is judged
//! against the Kafka message's own timestamp), so two members reading the same offsets
//! decide the same.
//!
//! A member checkpoints a partition at position `P` (the next offset to read) by writing
//! the files of the traces it emitted, logging them as a *segment* `(from, P]`, then
//! committing to Kafka the offset `P` with the [`Checkpoint`] as the commit's metadata:
//! `P`, the partition's origin (the offset its join began at), `closed_below`, `W`, and
//! the closes that were not decided by the log (a member that stops closes every
//! bucket). The next owner reads from the origin and replays the log up to `P` without
//! writing or counting anything, applying those closes where they happened: that
//! rebuilds the previous owner's state at `P` exactly, the keys it wrote included, and
//! from `P` on it decides as the previous owner would have. The replay is checked
//! against the checkpoint; a mismatch (records deleted from Kafka since) is counted and
//! makes the run's accounting fail. A member that gets back a partition it just had,
//! unchanged, keeps its state and reads on from `P`.
//!
//! Each member logs, when it is assigned a partition, the position it starts from
//! (`ownership.jsonl`). A segment is valid when it lies between its owner's start and the
//! next owner's start: the segments a killed member wrote after its last commit are
//! exactly the ones its successor repeats, and they are set aside.

use std::collections::BTreeMap;
use std::sync::Arc;

use hoptrace_protocol::Record;
use serde::{Deserialize, Serialize};

pub use super::placement::{murmur2, partition_of};
use crate::join::{JoinStats, JoinedTrace, Joiner};
use crate::keys::PartitionKeys;
use hoptrace_format::group::{Tally, add_counts};
use hoptrace_format::spec::ResolvedSpec;

/// A partition's state at a position, stored as the metadata of a Kafka offset commit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The next offset the committing member would have read.
    pub position: i64,
    /// Buckets with a lower index were closed (emitted) at `position`.
    pub closed_below: i64,
    /// Largest plausible intended time seen before `position`.
    pub watermark_ns: i64,
    /// The offset the partition's join began at: a new owner replays from here.
    pub origin: i64,
    /// Keys the partition had written at `position` (checks a new owner's replay).
    #[serde(default)]
    pub written: u64,
    /// Closes not decided by the log, `(position, closed_below)` in order: a member that
    /// stopped closed every bucket at `position`.
    #[serde(default)]
    pub closes: Vec<(i64, i64)>,
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
}

/// The event-time join of one partition. See the [module documentation](self).
pub struct PartitionJoin {
    spec: Arc<ResolvedSpec>,
    window_ns: i64,
    bucket_ns: i64,
    /// A record's intended time is plausible within this many ns of its Kafka message's
    /// timestamp.
    plausible_ns: i64,
    partition: i32,
    /// The offset the partition's join began at.
    origin: i64,
    /// While replaying a previous owner's stretch: its checkpoint. What is decided before
    /// it was the previous owner's to write and count.
    resume: Option<Checkpoint>,
    watermark_ns: i64,
    closed_below: i64,
    position: i64,
    buckets: BTreeMap<i64, Bucket>,
    /// Every key this partition wrote since `origin`.
    written: PartitionKeys,
    /// Closes not decided by the log (a member stopping), in order.
    closes: Vec<(i64, i64)>,
    tally: Tally,
    scratch: Vec<JoinedTrace>,
}

impl std::fmt::Debug for PartitionJoin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartitionJoin")
            .field("partition", &self.partition)
            .field("origin", &self.origin)
            .field("position", &self.position)
            .field("replaying", &self.resume.is_some())
            .field("watermark_ns", &self.watermark_ns)
            .field("closed_below", &self.closed_below)
            .field("open_buckets", &self.buckets.len())
            .field("written", &self.written.len())
            .finish_non_exhaustive()
    }
}

impl PartitionJoin {
    /// Partition `partition` of a topic of `partitions`, starting fresh at `offset`
    /// (`from` = `None`), or taking over from a previous owner's checkpoint: the records
    /// are then read from [`Self::start_offset`] (the partition's origin) and replayed up
    /// to the checkpoint without writing or counting anything, which rebuilds every
    /// decision the previous owner made, its written keys included.
    #[must_use]
    pub fn new(
        spec: Arc<ResolvedSpec>,
        partition: i32,
        partitions: i32,
        offset: i64,
        from: Option<Checkpoint>,
    ) -> Self {
        let window_ns = i64::try_from(spec.window_ns()).unwrap_or(i64::MAX);
        let bucket_ns = (window_ns / 4).clamp(1_000_000, 1_000_000_000);
        let origin = from.as_ref().map_or(offset, |c| c.origin);
        let mut join = Self {
            plausible_ns: spec.plausible_window_ns(),
            spec,
            window_ns,
            bucket_ns,
            partition,
            origin,
            resume: None,
            watermark_ns: i64::MIN,
            closed_below: i64::MIN,
            position: origin,
            buckets: BTreeMap::new(),
            written: PartitionKeys::new(partition, partitions),
            closes: Vec::new(),
            tally: Tally::default(),
            scratch: Vec::new(),
        };
        if let Some(c) = from {
            join.resume = Some(c);
            join.replay_done_at(origin);
        }
        join
    }

    /// Where to read from: the origin when replaying, else the position.
    #[must_use]
    pub fn start_offset(&self) -> i64 {
        if self.resume.is_some() {
            self.origin
        } else {
            self.position
        }
    }

    /// The next offset to read for the log to continue where this state stands.
    #[must_use]
    pub fn position(&self) -> i64 {
        self.position
    }

    /// Whether the previous owner's stretch is still being replayed.
    #[must_use]
    pub fn replaying(&self) -> bool {
        self.resume.is_some()
    }

    /// The checkpoint to commit (with its position as the offset): while replaying, the
    /// previous owner's, unchanged.
    #[must_use]
    pub fn checkpoint(&self) -> Checkpoint {
        if let Some(c) = &self.resume {
            return c.clone();
        }
        Checkpoint {
            position: self.position,
            closed_below: self.closed_below,
            watermark_ns: self.watermark_ns,
            origin: self.origin,
            written: self.written.len(),
            closes: self.closes.clone(),
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

    /// Keys written since the origin.
    #[must_use]
    pub fn written(&self) -> u64 {
        self.written.len()
    }

    /// Joins the records of the Kafka message at `offset`, whose timestamp is
    /// `timestamp_ns` (`CLOCK_REALTIME` ns; `None` when the message has none), and closes
    /// the buckets the watermark has passed, pushing their traces to `out`.
    ///
    /// A record's intended time is plausible within `[join] plausible_window_s` of its
    /// message's timestamp (the relay's clock when it produced it, part of the log, so a
    /// replay decides the same). A record with an implausible intended time still joins
    /// its trace, which is flagged, and a new trace of such a record goes in the bucket of
    /// the message's timestamp: it never moves the watermark. A record with an
    /// implausible stamp is counted and dropped.
    pub fn message(
        &mut self,
        offset: i64,
        timestamp_ns: Option<i64>,
        records: &[Record],
        out: &mut Vec<JoinedTrace>,
    ) {
        if offset < self.position {
            return;
        }
        self.replay_done_at(offset);
        let mut replayed = Vec::new();
        let sink = if self.resume.is_some() {
            &mut replayed
        } else {
            out
        };
        let plausible = timestamp_ns.map_or(i64::MIN..=i64::MAX, |t| {
            t.saturating_sub(self.plausible_ns)..=t.saturating_add(self.plausible_ns)
        });
        for r in records {
            self.record(r, timestamp_ns, &plausible);
        }
        self.position = offset + 1;
        let below = self
            .watermark_ns
            .saturating_sub(self.window_ns)
            .div_euclid(self.bucket_ns);
        self.close_below(below, sink);
        self.replay_done_at(self.position);
    }

    fn record(
        &mut self,
        r: &Record,
        timestamp_ns: Option<i64>,
        plausible: &std::ops::RangeInclusive<i64>,
    ) {
        if !self.written.belongs(&r.key) {
            self.tally.misplaced += 1;
            self.count_unjoined(r);
            return;
        }
        if self.written.contains(&r.key) {
            // Its trace was written, whatever this record says its intended time is.
            self.tally.late += 1;
            self.count_unjoined(r);
            return;
        }
        let intended_ok = plausible.contains(&r.intended_ns);
        // A key that has a trace in an open bucket joins it there. Only a trace's first
        // record places it in time: a later one that disagrees (the trace is flagged as
        // conflicting) moves nothing.
        let mut starts = false;
        let bucket = match self.buckets.iter().find(|(_, b)| b.joiner.knows(&r.key)) {
            Some((b, _)) => *b,
            None => {
                starts = true;
                let time = match timestamp_ns {
                    Some(t) if !intended_ok => t,
                    _ => r.intended_ns,
                };
                let bucket = time.div_euclid(self.bucket_ns);
                if bucket < self.closed_below {
                    self.tally.late += 1;
                    self.count_unjoined(r);
                    return;
                }
                bucket
            }
        };
        let spec = &self.spec;
        let b = self.buckets.entry(bucket).or_insert_with(|| Bucket {
            joiner: Joiner::new(spec),
            held: Vec::new(),
        });
        b.joiner.set_plausible_window(plausible.clone());
        // Arrival time never advances: buckets close by the watermark, not by the
        // joiner's own expiry.
        b.joiner.insert(r, 0, &mut b.held);
        if starts && intended_ok && plausible.contains(&r.stamp_ns) {
            self.watermark_ns = self.watermark_ns.max(r.intended_ns);
        }
    }

    /// Counts a record that joins nothing (late or misplaced) by its hop.
    fn count_unjoined(&mut self, r: &Record) {
        self.tally.records += 1;
        if let Some(i) = self.spec.hop_index(r.hop) {
            let by_hop = &mut self.tally.records_by_hop;
            by_hop.resize(by_hop.len().max(self.spec.hop_count()), 0);
            by_hop[i] += 1;
        } else {
            self.tally.unknown_hop += 1;
        }
    }

    /// Moves the position past offsets that held no records (transaction markers,
    /// messages that did not decode).
    pub fn skip(&mut self, offset: i64) {
        if offset >= self.position {
            self.replay_done_at(offset);
            self.position = offset + 1;
            self.replay_done_at(self.position);
        }
    }

    /// Closes every open bucket (the member stops). The close is not decided by the log,
    /// so it is carried in the checkpoint for whoever replays this partition next.
    pub fn drain(&mut self, out: &mut Vec<JoinedTrace>) {
        // Whatever was not read of the previous owner's stretch is not in the log.
        self.finish_replay();
        let below = self
            .buckets
            .keys()
            .next_back()
            .map_or(self.closed_below, |b| b + 1);
        if below > self.closed_below {
            self.closes.push((self.position, below));
        }
        self.close_below(below, out);
    }

    /// Ends the replay once the log has been read to the previous owner's position
    /// (`reached` is the offset about to be read, or the position after a message).
    fn replay_done_at(&mut self, reached: i64) {
        let Some(c) = &self.resume else {
            return;
        };
        let done = reached >= c.position;
        self.apply_closes(reached);
        if done {
            self.finish_replay();
        }
    }

    /// Applies the previous owners' closes at or before `reached`, in order.
    fn apply_closes(&mut self, reached: i64) {
        let Some(c) = &self.resume else {
            return;
        };
        let pending: Vec<(i64, i64)> = c
            .closes
            .iter()
            .skip(self.closes.len())
            .copied()
            .take_while(|(at, _)| *at <= reached)
            .collect();
        for (at, below) in pending {
            let mut discard = Vec::new();
            self.close_below(below, &mut discard);
            self.closes.push((at, below));
        }
    }

    /// The replay is over: the state is the previous owner's at its checkpoint, and
    /// from here on this owner writes and counts.
    fn finish_replay(&mut self) {
        let Some(c) = self.resume.clone() else {
            return;
        };
        self.apply_closes(i64::MAX);
        if self.closed_below != c.closed_below
            || self.watermark_ns != c.watermark_ns
            || self.written.len() != c.written
        {
            tracing::error!(
                partition = self.partition,
                origin = self.origin,
                position = c.position,
                "replaying the partition did not reach the previous owner's checkpoint ({} keys written, closed below {}, watermark {}; the checkpoint says {}, {}, {}): records were deleted from Kafka since, or this is another log",
                self.written.len(),
                self.closed_below,
                self.watermark_ns,
                c.written,
                c.closed_below,
                c.watermark_ns
            );
            self.closed_below = self.closed_below.max(c.closed_below);
            self.watermark_ns = self.watermark_ns.max(c.watermark_ns);
            self.resume = None;
            self.tally = Tally::default();
            self.tally.replay_mismatches = 1;
        } else {
            self.resume = None;
            self.tally = Tally::default();
        }
        self.position = self.position.max(c.position);
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
                // Counted apart from the rows: a key written twice is counted once.
                if self.written.insert(&t.key) {
                    *self.tally.keys.entry(t.key.publisher).or_default() += 1;
                } else {
                    debug_assert!(false, "{:?} written twice", t.key);
                }
            }
            out.append(&mut b.held);
            out.append(&mut self.scratch);
        }
    }

    /// What was counted since the last call (nothing while replaying: that was the
    /// previous owner's to count).
    pub fn take_tally(&mut self) -> Tally {
        if self.resume.is_some() {
            return Tally::default();
        }
        std::mem::take(&mut self.tally)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hoptrace_format::spec::PipelineSpec;
    use hoptrace_protocol::{HopId, TraceKey};

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
    /// over the next messages, some hops missing, some duplicated, a few very late, and
    /// some whose records disagree on the intended time by three windows.
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
                let conflicting = r % 53 == 0;
                let rec = Record {
                    key: TraceKey {
                        publisher: (seq % 3) as u16,
                        stream: 1,
                        sequence: seq,
                    },
                    hop: HopId(hop),
                    stamp_ns: intended + i64::from(hop) * 10_000,
                    metric_count: 10,
                    intended_ns: intended + if conflicting { 120_000_000 } else { 0 },
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

    fn join(from: Option<Checkpoint>) -> PartitionJoin {
        PartitionJoin::new(spec(), 0, 1, 0, from)
    }

    /// One uninterrupted owner: every row and the whole tally.
    fn uninterrupted(log: &[Vec<Record>]) -> (Vec<JoinedTrace>, Tally) {
        let mut p = join(None);
        let mut rows = Vec::new();
        for (o, recs) in log.iter().enumerate() {
            p.message(o as i64, None, recs, &mut rows);
        }
        p.drain(&mut rows);
        (rows, p.take_tally())
    }

    fn sorted(mut rows: Vec<JoinedTrace>) -> Vec<JoinedTrace> {
        rows.sort_by_key(|t| (t.key.sequence, t.key.publisher));
        rows
    }

    fn distinct_keys(rows: &[JoinedTrace]) -> usize {
        rows.iter()
            .map(|t| t.key)
            .collect::<std::collections::BTreeSet<_>>()
            .len()
    }

    #[test]
    fn a_successor_repeats_nothing_and_loses_nothing() {
        for seed in 1..40u64 {
            let log = log(400, seed);
            let (want_rows, want_tally) = uninterrupted(&log);
            let n = log.len() as i64;
            // Owner A checkpoints at `commit`, goes on to `killed` (writing a segment it
            // never commits), and dies; owner B takes over from the checkpoint.
            let commit = 20 + (seed as i64 * 37) % (n - 40);
            let killed = (commit + (seed as i64 * 13) % 30).min(n);
            let mut a = join(None);
            let mut a_rows = Vec::new();
            for o in 0..commit {
                a.message(o, None, &log[o as usize], &mut a_rows);
            }
            let cp = a.checkpoint();
            let a_tally = a.take_tally();
            let mut a_uncommitted = Vec::new();
            for o in commit..killed {
                a.message(o, None, &log[o as usize], &mut a_uncommitted);
            }
            let mut b = join(Some(cp.clone()));
            assert_eq!(b.start_offset(), 0, "a new owner replays from the origin");
            assert_eq!(b.checkpoint(), cp, "nothing changes while replaying");
            let mut b_rows = Vec::new();
            for o in b.start_offset()..n {
                b.message(o, None, &log[o as usize], &mut b_rows);
            }
            b.drain(&mut b_rows);
            let mut tally = a_tally;
            tally.add(&b.take_tally());
            let mut got = a_rows;
            got.extend(b_rows);
            assert_eq!(
                distinct_keys(&got),
                got.len(),
                "seed {seed}: a key written twice"
            );
            assert_eq!(sorted(got), sorted(want_rows.clone()), "seed {seed}");
            assert_eq!(tally, want_tally, "seed {seed}");
            // The uncommitted rows are a subset of what B wrote: set aside, not lost.
            let want = sorted(want_rows);
            for t in a_uncommitted {
                assert!(want.contains(&t), "seed {seed}: {t:?}");
            }
        }
    }

    /// A member stops (every bucket closes, not decided by the log); late records come
    /// after; another member takes the partition over and counts them late, as the first
    /// would have, writing nothing again.
    #[test]
    fn a_successor_after_a_stop_writes_nothing_again() {
        let log = log(300, 5);
        let n = log.len() as i64;
        let stop = 200;
        let mut a = join(None);
        let mut a_rows = Vec::new();
        for o in 0..stop {
            a.message(o, None, &log[o as usize], &mut a_rows);
        }
        a.drain(&mut a_rows);
        let cp = a.checkpoint();
        assert_eq!(cp.closes.len(), 1);
        let a_tally = a.take_tally();
        // What the first member would have done, had it gone on after its stop.
        let mut reference = Vec::new();
        for o in stop..n {
            a.message(o, None, &log[o as usize], &mut reference);
        }
        a.drain(&mut reference);
        let want_tally = a.take_tally();

        let mut b = join(Some(cp));
        let mut b_rows = Vec::new();
        for o in b.start_offset()..n {
            b.message(o, None, &log[o as usize], &mut b_rows);
        }
        b.drain(&mut b_rows);
        assert_eq!(sorted(b_rows.clone()), sorted(reference));
        assert_eq!(b.take_tally(), want_tally);
        let mut all = a_rows;
        all.extend(b_rows);
        assert_eq!(distinct_keys(&all), all.len());
        assert!(a_tally.late + want_tally.late > 0);
    }

    #[test]
    fn every_record_is_counted_once_and_every_key_written_once() {
        let log = log(500, 7);
        let (rows, tally) = uninterrupted(&log);
        let records: u64 = log.iter().map(|m| m.len() as u64).sum();
        assert_eq!(tally.records, records);
        assert_eq!(tally.records_by_hop.iter().sum::<u64>(), records);
        assert!(tally.late > 0, "the log has very late records");
        let traces: u64 = tally.publishers.values().map(|(c, i)| c + i).sum();
        assert_eq!(traces, rows.len() as u64);
        // Records disagreeing on their intended time never make a second row.
        assert_eq!(distinct_keys(&rows), rows.len());
        assert_eq!(tally.keys.values().sum::<u64>(), rows.len() as u64);
        for (p, (c, i)) in &tally.publishers {
            assert_eq!(tally.keys.get(p), Some(&(c + i)), "publisher {p}");
        }
    }

    fn rec(sequence: u64, hop: u8, intended_ns: i64) -> Record {
        Record {
            key: TraceKey {
                publisher: 1,
                stream: 1,
                sequence,
            },
            hop: HopId(hop),
            stamp_ns: intended_ns + i64::from(hop) * 1_000,
            metric_count: 1,
            intended_ns,
            otel_trace_id: None,
        }
    }

    /// The audit's case: the records of one key carry intended times three windows
    /// apart. Joined per record's intended time they made two traces, in two buckets,
    /// and a late record for a written key whose intended time fell in an open bucket
    /// made a third.
    #[test]
    fn records_of_one_key_with_conflicting_intended_times_make_one_row() {
        let t0 = 1_000_000_000;
        let mut p = join(None);
        let mut rows = Vec::new();
        p.message(0, None, &[rec(1, 0, t0)], &mut rows);
        // Hop b says the message was meant 120 ms later (three windows): same trace.
        p.message(1, None, &[rec(1, 1, t0 + 120_000_000)], &mut rows);
        // Time moves on: the bucket of t0 + 120 ms closes.
        for o in 2..10 {
            let t = t0 + 200_000_000 + o * 1_000_000;
            p.message(o, None, &[rec(100 + o as u64, 0, t)], &mut rows);
        }
        let first: Vec<_> = rows.iter().filter(|t| t.key.sequence == 1).collect();
        assert_eq!(first.len(), 1, "{rows:?}");
        assert!(first[0].has_flag(crate::join::flags::CONFLICT));
        // Hop c of the written key, claiming an intended time in an open bucket: late.
        let now = t0 + 209_000_000;
        p.message(10, None, &[rec(1, 2, now)], &mut rows);
        p.drain(&mut rows);
        assert_eq!(
            rows.iter().filter(|t| t.key.sequence == 1).count(),
            1,
            "{rows:?}"
        );
        let tally = p.take_tally();
        assert_eq!(tally.late, 1);
        assert_eq!(tally.keys.get(&1), Some(&(rows.len() as u64)));
    }

    /// One record whose intended time is years away is implausible against its message's
    /// timestamp: it joins its trace, which is flagged, and moves no watermark, so the
    /// records after it are not late.
    #[test]
    fn an_absurd_intended_time_is_flagged_and_moves_no_watermark() {
        let t0: i64 = 1_700_000_000_000_000_000;
        let ts = |o: i64| Some(t0 + o * 1_000_000);
        let mut p = join(None);
        let mut rows = Vec::new();
        let absurd = t0 + 10 * 365 * 86_400 * 1_000_000_000;
        // Its stamps are fine: only the intended time it carries is absurd.
        let absurd_rec = |hop: u8| Record {
            stamp_ns: t0 + i64::from(hop) * 1_000,
            ..rec(0, hop, absurd)
        };
        p.message(
            0,
            ts(0),
            &[absurd_rec(0), absurd_rec(1), absurd_rec(2)],
            &mut rows,
        );
        for o in 1..200 {
            let t = t0 + o * 1_000_000;
            let seq = o as u64;
            p.message(
                o,
                ts(o),
                &[rec(seq, 0, t), rec(seq, 1, t), rec(seq, 2, t)],
                &mut rows,
            );
        }
        // A stamp years away is dropped and counted.
        let mut bad = rec(500, 0, t0 + 200_000_000);
        bad.stamp_ns = absurd;
        p.message(200, ts(200), &[bad], &mut rows);
        p.drain(&mut rows);
        let tally = p.take_tally();
        assert_eq!(tally.late, 0, "the absurd record made the others late");
        assert_eq!(tally.implausible_traces, 1);
        assert_eq!(tally.implausible, 1);
        let flagged: Vec<_> = rows
            .iter()
            .filter(|t| t.has_flag(crate::join::flags::IMPLAUSIBLE_TIME))
            .collect();
        assert_eq!(flagged.len(), 1);
        assert_eq!(flagged[0].key.sequence, 0);
        assert!(flagged[0].complete);
        assert_eq!(rows.iter().filter(|t| t.complete).count(), 200);
    }

    /// A record whose key maps to another partition is counted, not joined.
    #[test]
    fn records_of_another_partition_are_counted_not_joined() {
        let partitions = 4;
        let mine = (0..100u64)
            .map(|s| rec(s, 0, 1_000_000_000))
            .find(|r| partition_of(&r.key, partitions) == 0)
            .unwrap();
        let other = (0..100u64)
            .map(|s| rec(s, 0, 1_000_000_000))
            .find(|r| partition_of(&r.key, partitions) != 0)
            .unwrap();
        let mut p = PartitionJoin::new(spec(), 0, partitions, 0, None);
        let mut rows = Vec::new();
        p.message(0, None, &[mine, other], &mut rows);
        p.drain(&mut rows);
        let tally = p.take_tally();
        assert_eq!((tally.misplaced, tally.records), (1, 2));
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].key, mine.key);
    }

    #[test]
    fn a_replay_that_does_not_reach_the_checkpoint_is_counted() {
        let log = log(100, 9);
        let mut a = join(None);
        let mut rows = Vec::new();
        for (o, m) in log.iter().enumerate().take(80) {
            a.message(o as i64, None, m, &mut rows);
        }
        let cp = a.checkpoint();
        // The log's first 40 messages are gone (deleted by retention).
        let mut b = join(Some(cp));
        for (o, m) in log.iter().enumerate().skip(40) {
            b.message(o as i64, None, m, &mut rows);
        }
        b.drain(&mut rows);
        assert_eq!(b.take_tally().replay_mismatches, 1);
    }

    #[test]
    fn checkpoints_round_trip_as_commit_metadata() {
        let c = Checkpoint {
            position: 12,
            closed_below: -3,
            watermark_ns: 1_700_000_000_000_000_000,
            origin: 2,
            written: 9,
            closes: vec![(12, 7)],
        };
        assert_eq!(Checkpoint::from_metadata(&c.to_metadata()), Some(c));
        assert_eq!(Checkpoint::from_metadata(""), None);
        assert_eq!(Checkpoint::from_metadata("{\"foreign\":1}"), None);
    }
}
