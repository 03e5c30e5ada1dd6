//! The join: records of one message (one [`TraceKey`]) arrive from many probes, in any
//! order, and leave as one [`JoinedTrace`] with a stamp per hop.
//!
//! # Rules
//! - A trace is **complete** as soon as every hop of the spec's `expected` set has
//!   stamped it; it is emitted at once. Stamps of other (optional) hops that arrived
//!   before that are included; ones arriving after it are late.
//! - A trace still missing expected hops one window after its *first* record arrived
//!   (the caller's monotonic clock, `arrival_ns`) is emitted **incomplete** by
//!   [`Joiner::expire`], with the hops it lacks in [`JoinedTrace::missing_mask`].
//!   Expiry happens only there: a record arriving for a trace that is past its window
//!   but not yet expired still joins it. [`Joiner::drain`] emits every pending trace as
//!   incomplete at shutdown.
//! - A hop that stamps twice keeps its **first** stamp; the trace gets
//!   [`flags::DUPLICATE`]. Records of one trace that disagree on `metric_count`,
//!   `intended_ns` or the trace id keep the first value and set [`flags::CONFLICT`] (a
//!   record without a trace id does not disagree; the first id seen is kept). A record
//!   with metric count and intended time both 0 carries no figures of the message (an
//!   OpenTelemetry span's stamp, [`Record::carries_message`]) and disagrees with none:
//!   the trace takes them from the first record that has them, and a trace that no such
//!   record joined is emitted with both 0 and [`flags::IMPLAUSIBLE_TIME`].
//!   [`flags::NEGATIVE_DELTA`] marks a trace where some stage with both hops present ends
//!   before it starts (clock error); [`flags::UNEXPECTED_HOP`] one stamped by a hop that
//!   is not in `expected`.
//! - Records of a hop id the spec does not declare are counted and dropped
//!   ([`InsertOutcome::UnknownHop`]).
//! - **Implausible times.** With a plausibility window set
//!   ([`Joiner::set_plausible_window`]), a record whose stamp lies outside it is counted
//!   and dropped ([`InsertOutcome::Implausible`]): a stamp decades away from the run is no
//!   measurement. A record whose `intended_ns` lies outside it is joined, and its trace
//!   gets [`flags::IMPLAUSIBLE_TIME`] so readers keep it out of the run's span.
//! - **A key is written once.** Every emitted key is remembered for the rest of the run
//!   ([`WrittenKeys`], a set of sequence ranges per stream: memory grows with the gaps
//!   between keys, not with their number). A record whose trace was already emitted,
//!   however long ago, cannot be merged; it is counted and dropped
//!   ([`InsertOutcome::Late`]) and never starts a second trace of the same key.
//!
//! Every record is accounted for exactly once:
//! `records = stored + duplicates + late + unknown_hop + implausible`, and every trace
//! started ends in one place: `traces = completed + expired + drained + pending`, with
//! `traces` equal to the number of distinct keys written once nothing is pending.
//!
//! # Memory
//! Pending traces live in a slab of fixed-size slots (key, metadata and flags: 56 bytes)
//! with their stamps in a parallel array of `hops × 8` bytes, found through a
//! `hashbrown` table of 4-byte slot indices (5 bytes per bucket with its control byte, at
//! a load of 7/16 to 7/8). A FIFO of 16-byte entries orders traces by first arrival; it
//! is compacted when it holds more than 1.5 entries per pending trace (plus 16). The slab
//! and FIFO grow by a quarter at a time rather than doubling. Per pending trace that is
//! `56 + 8 × hops + 16..24 + 6..11` bytes plus growth slack; measured with a counting
//! allocator over 10k..2M pending traces:
//!
//! | hops | bytes per pending trace |
//! | ---: | ---: |
//! | 6 | 128-160 |
//! | 8 | 144-180 |
//! | 16 | 208-260 |
//!
//! Written keys are held apart ([`WrittenKeys`]): a stream whose keys arrive in order is
//! one range, and each gap (a message not seen, or still pending when its successors were
//! written) about 40 bytes. [`Joiner::memory_bytes`] reports the total. In steady state
//! inserting allocates nothing for pending traces: freed slots, table buckets and FIFO
//! space are reused.
//!
//! ```
//! use hoptrace_collector::join::{InsertOutcome, Joiner};
//! use hoptrace_format::spec::PipelineSpec;
//! use hoptrace_protocol::Record;
//! use hoptrace_protocol::{HopId, TraceKey};
//!
//! let spec = PipelineSpec::default_pipeline().resolve().unwrap();
//! let mut joiner = Joiner::new(&spec);
//! let key = TraceKey { publisher: 1, stream: 2, sequence: 3 };
//! let mut out = Vec::new();
//! for hop in 0..6u8 {
//!     let rec = Record {
//!         key,
//!         hop: HopId(hop),
//!         stamp_ns: 1_000 * i64::from(hop),
//!         metric_count: 50,
//!         intended_ns: 0,
//!         otel_trace_id: None,
//!     };
//!     let outcome = joiner.insert(&rec, u64::from(hop), &mut out);
//!     assert_eq!(outcome == InsertOutcome::Completed, hop == 5);
//! }
//! assert!(out[0].complete);
//! assert_eq!(out[0].stage_ns(&spec.stages()[0]), Some(1_000));
//! ```

pub mod keys;
pub mod partition;
pub mod placement;
pub mod stages;

use std::collections::VecDeque;
use std::hash::BuildHasher as _;
use std::ops::RangeInclusive;

use hashbrown::HashTable;
use hoptrace_protocol::{MAX_HOPS, Record};
use hoptrace_protocol::{OtelTraceId, TraceKey};
use rustc_hash::FxBuildHasher;

use crate::keys::WrittenKeys;
use hoptrace_format::spec::{ResolvedSpec, ResolvedStage};

/// Bits of [`JoinedTrace::flags`].
pub mod flags {
    /// A hop stamped the trace more than once; its first stamp is kept.
    pub const DUPLICATE: u8 = 1;
    /// Some stage with both hops present has `to < from` (clock error or reordering).
    pub const NEGATIVE_DELTA: u8 = 2;
    /// Records of the trace disagree on metric count, intended time or trace id; the
    /// first record's values are kept.
    pub const CONFLICT: u8 = 4;
    /// A hop that is not in the spec's `expected` set stamped the trace.
    pub const UNEXPECTED_HOP: u8 = 8;
    /// A record of the trace carried an intended send time outside the run's plausibility
    /// window: readers keep the trace out of the run's span and throughput.
    pub const IMPLAUSIBLE_TIME: u8 = 16;
    /// Every flag.
    pub const ALL: u8 = DUPLICATE | NEGATIVE_DELTA | CONFLICT | UNEXPECTED_HOP | IMPLAUSIBLE_TIME;
}

/// Internal slot flag: the slot holds a trace id.
const HAS_TRACE_ID: u8 = 0x80;
/// Internal slot flag: a record that carries the message's metric count and intended
/// time ([`Record::carries_message`]) has joined, and the slot holds its values.
const HAS_MESSAGE: u8 = 0x40;

/// What [`Joiner::insert`] did with a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InsertOutcome {
    /// Joined to a trace that still lacks expected hops.
    Pending,
    /// The hop had already stamped the record's trace: the first stamp is kept, the trace
    /// flagged [`flags::DUPLICATE`].
    Duplicate,
    /// The record completed its trace, which was pushed to `out`.
    Completed,
    /// The hop id is not in the spec: counted, not stored.
    UnknownHop,
    /// The record's trace was already emitted: counted, not stored.
    Late,
    /// The record's stamp lies outside the plausibility window: counted, not stored.
    Implausible,
}

/// One message's joined stamps, as emitted by the [`Joiner`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JoinedTrace {
    /// Which message.
    pub key: TraceKey,
    /// Metrics the message carries (from its first record).
    pub metric_count: u32,
    /// The message's intended send time, `CLOCK_REALTIME` ns (from its first record).
    pub intended_ns: i64,
    /// The message's OpenTelemetry trace id (the first one seen).
    pub otel_trace_id: Option<OtelTraceId>,
    /// Hops that stamped: bit `i` is hop index `i`.
    pub present_mask: u16,
    /// `CLOCK_REALTIME` stamps by hop *index* (not wire id); 0 where the hop's bit in
    /// `present_mask` is clear. Prefer [`Self::stamp`].
    pub stamps_ns: [i64; MAX_HOPS],
    /// Whether every expected hop stamped.
    pub complete: bool,
    /// Expected hops that did not stamp: bit `i` is hop index `i`.
    pub missing_mask: u16,
    /// [`flags`] bits.
    pub flags: u8,
}

impl JoinedTrace {
    /// The stamp of hop index `hop_index`, if that hop stamped.
    #[inline]
    #[must_use]
    pub fn stamp(&self, hop_index: usize) -> Option<i64> {
        (hop_index < MAX_HOPS && self.present_mask & (1 << hop_index) != 0)
            .then(|| self.stamps_ns[hop_index])
    }

    /// `stamp(to_index) - stamp(from_index)` when both hops stamped, saturating at the
    /// bounds of `i64`.
    #[inline]
    #[must_use]
    pub fn delta_ns(&self, from_index: usize, to_index: usize) -> Option<i64> {
        Some(
            self.stamp(to_index)?
                .saturating_sub(self.stamp(from_index)?),
        )
    }

    /// The stage's duration, when both of its hops stamped.
    #[inline]
    #[must_use]
    pub fn stage_ns(&self, stage: &ResolvedStage) -> Option<i64> {
        self.delta_ns(stage.from_index, stage.to_index)
    }

    /// Whether all bits of `flag` are set.
    #[inline]
    #[must_use]
    pub fn has_flag(&self, flag: u8) -> bool {
        self.flags & flag == flag
    }
}

/// Cumulative counters of a [`Joiner`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct JoinStats {
    /// Records given to [`Joiner::insert`].
    pub records: u64,
    /// Records whose stamp was stored in a trace.
    pub stored: u64,
    /// Records of a hop that had already stamped their trace (stamp not stored).
    pub duplicates: u64,
    /// Records of a trace already emitted.
    pub late: u64,
    /// Records of a hop id the spec does not declare.
    pub unknown_hop: u64,
    /// Records whose stamp lay outside the plausibility window.
    pub implausible: u64,
    /// Records whose intended time lay outside the plausibility window (joined; their
    /// trace is flagged [`flags::IMPLAUSIBLE_TIME`]).
    pub implausible_intended: u64,
    /// Records that disagreed with their trace's metadata (also counted in `stored` or
    /// `duplicates`).
    pub conflicts: u64,
    /// Traces started (first record of a key neither pending nor written).
    pub traces: u64,
    /// Traces emitted complete.
    pub completed: u64,
    /// Traces emitted incomplete by [`Joiner::expire`].
    pub expired: u64,
    /// Traces emitted incomplete by [`Joiner::drain`].
    pub drained: u64,
    /// Most traces pending at once.
    pub peak_pending: u64,
    /// Records received per hop index, whatever became of them (stored, duplicate, late or
    /// implausible); their sum is `records - unknown_hop`.
    pub records_by_hop: [u64; MAX_HOPS],
    /// Incomplete traces emitted, per expected hop index they miss.
    pub missing_by_hop: [u64; MAX_HOPS],
    /// Traces emitted with [`flags::DUPLICATE`].
    pub duplicate_traces: u64,
    /// Traces emitted with [`flags::NEGATIVE_DELTA`].
    pub negative_delta_traces: u64,
    /// Traces emitted with [`flags::CONFLICT`].
    pub conflict_traces: u64,
    /// Traces emitted with [`flags::UNEXPECTED_HOP`].
    pub unexpected_hop_traces: u64,
    /// Traces emitted with [`flags::IMPLAUSIBLE_TIME`].
    pub implausible_traces: u64,
    /// Records stored, per hop index: `records_by_hop` less duplicates, late and
    /// implausible records.
    pub stored_by_hop: [u64; MAX_HOPS],
}

/// A trace waiting for more records, as a checkpoint of the run keeps it
/// ([`Joiner::pending_traces`], [`Joiner::restore`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PendingTrace {
    /// When its first record arrived (the clock of [`Joiner::insert`]).
    pub first_arrival_ns: u64,
    /// Which message.
    pub key: TraceKey,
    /// Intended send time (from its first record).
    pub intended_ns: i64,
    /// Metrics carried (from its first record).
    pub metric_count: u32,
    /// The first trace id seen, if any.
    pub otel_trace_id: Option<OtelTraceId>,
    /// Hops stamped so far: bit `i` is hop index `i`.
    pub present: u16,
    /// [`flags`] gathered so far.
    pub flags: u8,
    /// Stamps by hop index; 0 where the hop's bit in `present` is clear.
    pub stamps_ns: [i64; MAX_HOPS],
}

/// A pending trace. 56 bytes.
#[derive(Debug, Clone, Copy)]
struct Slot {
    key: TraceKey,
    intended_ns: i64,
    trace_id: [u8; 16],
    metric_count: u32,
    /// Bumped when the slot is freed, so FIFO entries of earlier traces do not match.
    generation: u32,
    /// Hops stamped; 0 for a free slot.
    present: u16,
    /// [`flags`] bits gathered so far, and [`HAS_TRACE_ID`].
    flags: u8,
}

/// A pending trace in first-arrival order. 16 bytes.
#[derive(Debug, Clone, Copy)]
struct FifoEntry {
    first_arrival_ns: u64,
    slot: u32,
    generation: u32,
}

/// Joins records into traces. See the [module documentation](self) for the rules.
#[derive(Debug)]
pub struct Joiner {
    /// Hop index by wire id; `NO_HOP` for undeclared ids.
    index_by_id: [u8; 256],
    /// Hops per slot in `stamps`.
    stride: usize,
    expected: u16,
    /// (from, to) hop indices of every stage.
    stages: Vec<(usize, usize)>,
    window_ns: u64,
    max_pending: usize,
    /// Stamps and intended times outside this range are implausible.
    plausible: RangeInclusive<i64>,
    /// Latest time seen; times are clamped to it so they never go backwards.
    clock_ns: u64,
    /// Pending traces, by slot index.
    table: HashTable<u32>,
    pending: usize,
    slots: Vec<Slot>,
    stamps: Vec<i64>,
    free: Vec<u32>,
    fifo: VecDeque<FifoEntry>,
    /// Every key emitted.
    written: WrittenKeys,
    stats: JoinStats,
}

const NO_HOP: u8 = u8::MAX;

#[inline]
fn hash_key(key: &TraceKey) -> u64 {
    FxBuildHasher.hash_one(key)
}

/// Makes room for one more element, growing by a quarter rather than doubling.
#[inline]
fn reserve_vec<T>(v: &mut Vec<T>, one: usize) {
    if v.len() + one > v.capacity() {
        v.reserve_exact((v.len() / 4).max(64 * one));
    }
}

impl Joiner {
    /// A joiner for `spec`'s hops, expected set, stages, window and `max_pending`, with no
    /// plausibility window.
    #[must_use]
    pub fn new(spec: &ResolvedSpec) -> Self {
        let mut index_by_id = [NO_HOP; 256];
        for (index, id) in (0u8..).zip(spec.hop_ids()) {
            index_by_id[usize::from(id.0)] = index;
        }
        let stages = spec
            .stages()
            .iter()
            .map(|s| (s.from_index, s.to_index))
            .collect();
        Self {
            index_by_id,
            stride: spec.hop_count(),
            expected: spec.expected_mask(),
            stages,
            window_ns: spec.window_ns(),
            max_pending: spec.max_pending(),
            plausible: i64::MIN..=i64::MAX,
            clock_ns: 0,
            table: HashTable::new(),
            pending: 0,
            slots: Vec::new(),
            stamps: Vec::new(),
            free: Vec::new(),
            fifo: VecDeque::new(),
            written: WrittenKeys::new(),
            stats: JoinStats::default(),
        }
    }

    /// Takes `keys` as already written (the part files an earlier collector of the run
    /// left): a record of one of them is late, never a second row.
    pub fn set_written(&mut self, keys: WrittenKeys) {
        self.written = keys;
    }

    /// Stamps and intended times (`CLOCK_REALTIME` ns) outside `range` are implausible
    /// from now on: the collector moves the window with the run.
    pub fn set_plausible_window(&mut self, range: RangeInclusive<i64>) {
        self.plausible = range;
    }

    /// Joins one record. `arrival_ns` is the collector's monotonic clock when the record
    /// arrived; a time earlier than one seen before counts as that earlier-seen latest
    /// time. A trace the record completes is pushed to `out`.
    #[inline]
    pub fn insert(
        &mut self,
        rec: &Record,
        arrival_ns: u64,
        out: &mut Vec<JoinedTrace>,
    ) -> InsertOutcome {
        let now = self.advance(arrival_ns);
        self.stats.records += 1;
        let hop = self.index_by_id[usize::from(rec.hop.0)];
        if hop == NO_HOP {
            self.stats.unknown_hop += 1;
            return InsertOutcome::UnknownHop;
        }
        self.stats.records_by_hop[usize::from(hop)] += 1;
        if !self.plausible.contains(&rec.stamp_ns) {
            self.stats.implausible += 1;
            return InsertOutcome::Implausible;
        }
        let hash = hash_key(&rec.key);
        let slots = &self.slots;
        let found = self
            .table
            .find(hash, |&i| slots[i as usize].key == rec.key)
            .copied();
        let index = match found {
            Some(i) => i,
            None if self.written.contains(&rec.key) => {
                self.stats.late += 1;
                return InsertOutcome::Late;
            }
            None => self.start(rec, hash, now),
        };

        let slot = &mut self.slots[index as usize];
        let mut conflict = false;
        if rec.carries_message() {
            if slot.flags & HAS_MESSAGE == 0 {
                slot.metric_count = rec.metric_count;
                slot.intended_ns = rec.intended_ns;
                slot.flags |= HAS_MESSAGE;
            } else {
                conflict =
                    slot.metric_count != rec.metric_count || slot.intended_ns != rec.intended_ns;
            }
            if !self.plausible.contains(&rec.intended_ns) {
                slot.flags |= flags::IMPLAUSIBLE_TIME;
                self.stats.implausible_intended += 1;
            }
        }
        if let Some(id) = rec.otel_trace_id {
            if slot.flags & HAS_TRACE_ID == 0 {
                slot.trace_id = id.0;
                slot.flags |= HAS_TRACE_ID;
            } else if slot.trace_id != id.0 {
                conflict = true;
            }
        }
        if conflict {
            slot.flags |= flags::CONFLICT;
            self.stats.conflicts += 1;
        }
        let bit = 1u16 << hop;
        if slot.present & bit != 0 {
            slot.flags |= flags::DUPLICATE;
            self.stats.duplicates += 1;
            return InsertOutcome::Duplicate;
        }
        slot.present |= bit;
        self.stamps[index as usize * self.stride + usize::from(hop)] = rec.stamp_ns;
        self.stats.stored += 1;
        self.stats.stored_by_hop[usize::from(hop)] += 1;
        if slot.present & self.expected != self.expected {
            return InsertOutcome::Pending;
        }
        self.emit(index, hash, true, out);
        self.stats.completed += 1;
        if self.fifo.len() > self.pending + self.pending / 2 + 16 {
            let slots = &self.slots;
            self.fifo
                .retain(|e| slots[e.slot as usize].generation == e.generation);
        }
        InsertOutcome::Completed
    }

    /// Emits, as incomplete, every pending trace whose first record arrived more than one
    /// window before `now_ns` (the clock of [`Self::insert`]); oldest first.
    pub fn expire(&mut self, now_ns: u64, out: &mut Vec<JoinedTrace>) {
        let now = self.advance(now_ns);
        while let Some(&e) = self.fifo.front() {
            if self.slots[e.slot as usize].generation != e.generation {
                self.fifo.pop_front();
                continue;
            }
            if now - e.first_arrival_ns <= self.window_ns {
                break;
            }
            self.fifo.pop_front();
            let hash = hash_key(&self.slots[e.slot as usize].key);
            self.emit(e.slot, hash, false, out);
            self.stats.expired += 1;
        }
    }

    /// Emits every pending trace as incomplete, oldest first (clean shutdown). Their keys
    /// are written as for any emission.
    pub fn drain(&mut self, out: &mut Vec<JoinedTrace>) {
        while let Some(e) = self.fifo.pop_front() {
            if self.slots[e.slot as usize].generation != e.generation {
                continue;
            }
            let hash = hash_key(&self.slots[e.slot as usize].key);
            self.emit(e.slot, hash, false, out);
            self.stats.drained += 1;
        }
        debug_assert_eq!(self.pending, 0);
    }

    /// Traces waiting for records.
    #[must_use]
    pub fn pending(&self) -> usize {
        self.pending
    }

    /// Every pending trace, oldest first (the order [`Self::expire`] emits them in).
    #[must_use]
    pub fn pending_traces(&self) -> Vec<PendingTrace> {
        self.fifo
            .iter()
            .filter(|e| self.slots[e.slot as usize].generation == e.generation)
            .map(|e| {
                let slot = &self.slots[e.slot as usize];
                let base = e.slot as usize * self.stride;
                let mut stamps_ns = [0i64; MAX_HOPS];
                for (h, (dst, src)) in stamps_ns
                    .iter_mut()
                    .zip(&self.stamps[base..base + self.stride])
                    .enumerate()
                {
                    if slot.present & (1 << h) != 0 {
                        *dst = *src;
                    }
                }
                PendingTrace {
                    first_arrival_ns: e.first_arrival_ns,
                    key: slot.key,
                    intended_ns: slot.intended_ns,
                    metric_count: slot.metric_count,
                    otel_trace_id: (slot.flags & HAS_TRACE_ID != 0)
                        .then_some(OtelTraceId(slot.trace_id)),
                    present: slot.present,
                    flags: slot.flags & flags::ALL,
                    stamps_ns,
                }
            })
            .collect()
    }

    /// The latest time seen (the clock of [`Self::insert`]).
    #[must_use]
    pub fn clock_ns(&self) -> u64 {
        self.clock_ns
    }

    /// Puts a fresh joiner in the state a checkpoint recorded: its counters, its clock,
    /// the keys written and the pending traces, oldest first (as
    /// [`Self::pending_traces`] gave them). Joining then goes on exactly as it would
    /// have.
    pub fn restore(
        &mut self,
        stats: JoinStats,
        clock_ns: u64,
        written: WrittenKeys,
        pending: &[PendingTrace],
    ) {
        debug_assert_eq!(self.pending, 0, "restored into a fresh joiner");
        self.stats = stats;
        self.clock_ns = clock_ns;
        self.written = written;
        for p in pending {
            let index = self.alloc(
                (p.key, p.intended_ns, p.metric_count),
                hash_key(&p.key),
                p.first_arrival_ns,
            );
            let slot = &mut self.slots[index as usize];
            slot.present = p.present;
            slot.flags = p.flags & flags::ALL;
            if Record::figures_are_a_message(p.metric_count, p.intended_ns) {
                slot.flags |= HAS_MESSAGE;
            }
            if let Some(id) = p.otel_trace_id {
                slot.trace_id = id.0;
                slot.flags |= HAS_TRACE_ID;
            }
            let base = index as usize * self.stride;
            self.stamps[base..base + self.stride].copy_from_slice(&p.stamps_ns[..self.stride]);
        }
    }

    /// Whether `max_pending` traces are pending: the caller should stop reading records
    /// until [`Self::expire`] or completions make room. Inserting still works.
    #[must_use]
    pub fn is_full(&self) -> bool {
        self.pending() >= self.max_pending
    }

    /// The counters so far.
    #[must_use]
    pub fn stats(&self) -> JoinStats {
        self.stats
    }

    /// Whether `key` has a trace here: pending, or already emitted.
    #[must_use]
    pub fn knows(&self, key: &TraceKey) -> bool {
        let slots = &self.slots;
        self.table
            .find(hash_key(key), |&i| slots[i as usize].key == *key)
            .is_some()
            || self.written.contains(key)
    }

    /// Every key emitted so far.
    #[must_use]
    pub fn written(&self) -> &WrittenKeys {
        &self.written
    }

    /// Approximate heap bytes held: pending traces, the FIFO, the free list and the
    /// written keys, by capacity (high-water mark), not by use.
    #[must_use]
    pub fn memory_bytes(&self) -> usize {
        use std::mem::size_of;
        // hashbrown keeps at least 8/7 buckets per item of capacity, each with a
        // one-byte control byte, plus a group of trailing control bytes.
        let buckets = |cap: usize| if cap == 0 { 0 } else { cap * 8 / 7 + 16 };
        buckets(self.table.capacity()) * (size_of::<u32>() + 1)
            + self.slots.capacity() * size_of::<Slot>()
            + self.stamps.capacity() * size_of::<i64>()
            + self.free.capacity() * size_of::<u32>()
            + self.fifo.capacity() * size_of::<FifoEntry>()
            + self.written.memory_bytes()
    }

    /// Moves the clock to `t_ns` (never backwards).
    #[inline]
    fn advance(&mut self, t_ns: u64) -> u64 {
        let now = t_ns.max(self.clock_ns);
        self.clock_ns = now;
        now
    }

    /// Starts a trace for `rec` and returns its slot.
    fn start(&mut self, rec: &Record, hash: u64, now: u64) -> u32 {
        let index = self.alloc((rec.key, rec.intended_ns, rec.metric_count), hash, now);
        self.stats.traces += 1;
        self.stats.peak_pending = self.stats.peak_pending.max(self.pending as u64);
        index
    }

    /// Takes a slot for a trace of `(key, intended_ns, metric_count)`, first seen at
    /// `now`, with no stamp yet; counts nothing.
    fn alloc(
        &mut self,
        (key, intended_ns, metric_count): (TraceKey, i64, u32),
        hash: u64,
        now: u64,
    ) -> u32 {
        let fresh = Slot {
            key,
            intended_ns,
            trace_id: [0; 16],
            metric_count,
            generation: 0,
            present: 0,
            flags: 0,
        };
        let index = if let Some(i) = self.free.pop() {
            let slot = &mut self.slots[i as usize];
            *slot = Slot {
                generation: slot.generation,
                ..fresh
            };
            i
        } else {
            let i = u32::try_from(self.slots.len()).expect("fewer than 2^32 pending traces");
            reserve_vec(&mut self.slots, 1);
            reserve_vec(&mut self.stamps, self.stride);
            self.slots.push(fresh);
            self.stamps.resize(self.stamps.len() + self.stride, 0);
            i
        };
        if self.fifo.len() == self.fifo.capacity() {
            self.fifo.reserve_exact((self.fifo.len() / 4).max(64));
        }
        self.fifo.push_back(FifoEntry {
            first_arrival_ns: now,
            slot: index,
            generation: self.slots[index as usize].generation,
        });
        let slots = &self.slots;
        self.table
            .insert_unique(hash, index, |&i| hash_key(&slots[i as usize].key));
        self.pending += 1;
        index
    }

    /// Pushes the trace in slot `index` to `out`, frees the slot and writes the key.
    fn emit(&mut self, index: u32, hash: u64, complete: bool, out: &mut Vec<JoinedTrace>) {
        let slot = &mut self.slots[index as usize];
        let present = slot.present;
        let base = index as usize * self.stride;
        let stamps = &self.stamps[base..base + self.stride];
        let mut stamps_ns = [0i64; MAX_HOPS];
        for (h, (dst, src)) in stamps_ns.iter_mut().zip(stamps).enumerate() {
            if present & (1 << h) != 0 {
                *dst = *src;
            }
        }
        let mut trace_flags = slot.flags & flags::ALL;
        if slot.flags & HAS_MESSAGE == 0 {
            // Only records without the message's figures (spans) stamped it: no intended
            // time to place it by.
            trace_flags |= flags::IMPLAUSIBLE_TIME;
        }
        if present & !self.expected != 0 {
            trace_flags |= flags::UNEXPECTED_HOP;
        }
        let negative = self.stages.iter().any(|&(from, to)| {
            let both = (1u16 << from) | (1u16 << to);
            present & both == both && stamps_ns[to] < stamps_ns[from]
        });
        if negative {
            trace_flags |= flags::NEGATIVE_DELTA;
        }
        let missing = self.expected & !present;
        let stats = &mut self.stats;
        if !complete {
            for (h, n) in stats.missing_by_hop.iter_mut().enumerate() {
                *n += u64::from(missing >> h & 1);
            }
        }
        for (flag, n) in [
            (flags::DUPLICATE, &mut stats.duplicate_traces),
            (flags::NEGATIVE_DELTA, &mut stats.negative_delta_traces),
            (flags::CONFLICT, &mut stats.conflict_traces),
            (flags::UNEXPECTED_HOP, &mut stats.unexpected_hop_traces),
            (flags::IMPLAUSIBLE_TIME, &mut stats.implausible_traces),
        ] {
            *n += u64::from(trace_flags & flag != 0);
        }
        let key = slot.key;
        out.push(JoinedTrace {
            key,
            metric_count: slot.metric_count,
            intended_ns: slot.intended_ns,
            otel_trace_id: (slot.flags & HAS_TRACE_ID != 0).then_some(OtelTraceId(slot.trace_id)),
            present_mask: present,
            stamps_ns,
            complete,
            missing_mask: missing,
            flags: trace_flags,
        });

        slot.present = 0;
        slot.generation = slot.generation.wrapping_add(1);
        self.free.push(index);
        self.pending -= 1;
        let Ok(entry) = self.table.find_entry(hash, |&v| v == index) else {
            unreachable!("a pending slot is in the table");
        };
        entry.remove();
        let fresh = self.written.insert(&key);
        debug_assert!(fresh, "a key is emitted once");
    }
}

#[cfg(test)]
mod tests;
