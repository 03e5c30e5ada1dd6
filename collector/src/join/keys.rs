//! The trace keys a run has written, so that no key is ever written twice and the run's
//! accounting can count, independently of the rows, which sent messages were seen.
//!
//! Keys are kept per stream (`publisher`, `stream`) as sets of sequence ranges. A
//! publisher numbers each stream's messages 0, 1, 2, ... and the join writes them in
//! roughly that order, so a stream's set is one range that grows at its end
//! ([`SeqSet::insert`] then touches no tree) plus a few earlier ranges around the
//! messages that were never seen or are still pending. Memory is proportional to the
//! number of gaps, not of keys: 16 bytes per stream and about 40 per gap.

use std::collections::BTreeMap;

use hoptrace_protocol::TraceKey;
use rustc_hash::FxHashMap;

/// A set of `u64` sequence numbers, as disjoint inclusive ranges.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SeqSet {
    /// The latest range added to, `(first, last)` inclusive; `None` while empty.
    tail: Option<(u64, u64)>,
    /// Every other range, by first sequence; all lie before `tail` and do not touch it.
    earlier: BTreeMap<u64, u64>,
    len: u64,
}

impl SeqSet {
    /// An empty set.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Numbers in the set.
    #[must_use]
    pub fn len(&self) -> u64 {
        self.len
    }

    /// The set is empty.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Disjoint ranges held.
    #[must_use]
    pub fn ranges(&self) -> usize {
        self.earlier.len() + usize::from(self.tail.is_some())
    }

    /// Whether `x` is in the set.
    #[inline]
    #[must_use]
    pub fn contains(&self, x: u64) -> bool {
        match self.tail {
            None => false,
            Some((first, last)) if x >= first => x <= last,
            Some(_) => self
                .earlier
                .range(..=x)
                .next_back()
                .is_some_and(|(_, &last)| x <= last),
        }
    }

    /// Adds `x`; `false` when it was already in the set.
    #[inline]
    pub fn insert(&mut self, x: u64) -> bool {
        let Some((first, last)) = self.tail else {
            self.tail = Some((x, x));
            self.len = 1;
            return true;
        };
        if x >= first {
            if x <= last {
                return false;
            }
            if x == last + 1 {
                self.tail = Some((first, x));
            } else {
                // A gap: the tail becomes an earlier range.
                self.earlier.insert(first, last);
                self.tail = Some((x, x));
            }
            self.len += 1;
            return true;
        }
        let added = self.insert_earlier(x);
        if added {
            self.len += 1;
            self.join_tail();
        }
        added
    }

    /// Adds `x` below the tail's first number.
    fn insert_earlier(&mut self, x: u64) -> bool {
        let before = self.earlier.range(..=x).next_back().map(|(&f, &l)| (f, l));
        if let Some((_, l)) = before
            && x <= l
        {
            return false;
        }
        let after = x
            .checked_add(1)
            .and_then(|n| self.earlier.get(&n).map(|&l| (n, l)));
        match (before, after) {
            (Some((f, l)), Some((n, nl))) if l + 1 == x => {
                self.earlier.remove(&n);
                self.earlier.insert(f, nl);
            }
            (Some((f, l)), _) if l + 1 == x => {
                self.earlier.insert(f, x);
            }
            (_, Some((n, nl))) => {
                self.earlier.remove(&n);
                self.earlier.insert(x, nl);
            }
            _ => {
                self.earlier.insert(x, x);
            }
        }
        true
    }

    /// Joins the last earlier range to the tail when they touch.
    fn join_tail(&mut self) {
        let Some((first, last)) = self.tail else {
            return;
        };
        if let Some((&f, &l)) = self.earlier.iter().next_back()
            && l + 1 == first
        {
            self.earlier.remove(&f);
            self.tail = Some((f, last));
        }
    }

    /// Numbers of the set within `first..=last`.
    #[must_use]
    pub fn count_within(&self, first: u64, last: u64) -> u64 {
        if first > last {
            return 0;
        }
        let overlap = |f: u64, l: u64| {
            let (a, b) = (f.max(first), l.min(last));
            if a <= b { b - a + 1 } else { 0 }
        };
        // Ranges starting at or before `last` that may reach `first`.
        let start = self
            .earlier
            .range(..=first)
            .next_back()
            .map_or(first, |(&f, _)| f);
        self.earlier
            .range(start..=last)
            .map(|(&f, &l)| overlap(f, l))
            .sum::<u64>()
            + self.tail.map_or(0, |(f, l)| overlap(f, l))
    }

    /// Bytes held, roughly (the tree's nodes at their typical fill).
    #[must_use]
    pub fn memory_bytes(&self) -> usize {
        std::mem::size_of::<Self>() + self.earlier.len() * 40
    }

    /// The set's disjoint ranges `(first, last)`, inclusive, in ascending order.
    pub fn iter_ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.earlier.iter().map(|(&f, &l)| (f, l)).chain(self.tail)
    }

    /// The set of these ranges, as [`Self::iter_ranges`] gives them (ascending, disjoint,
    /// not touching); `None` when they are not.
    #[must_use]
    pub fn from_ranges(ranges: &[(u64, u64)]) -> Option<Self> {
        let mut set = Self::new();
        let mut prev: Option<u64> = None;
        for &(first, last) in ranges {
            if first > last || prev.is_some_and(|p| p.checked_add(1).is_none_or(|n| first <= n)) {
                return None;
            }
            prev = Some(last);
            set.len += last - first + 1;
        }
        let (&tail, earlier) = ranges.split_last()?;
        set.earlier = earlier.iter().copied().collect();
        set.tail = Some(tail);
        Some(set)
    }
}

/// The keys written so far, per stream.
#[derive(Debug, Clone, Default)]
pub struct WrittenKeys {
    streams: FxHashMap<(u16, u32), SeqSet>,
    len: u64,
}

impl WrittenKeys {
    /// No keys.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether `key` was written.
    #[inline]
    #[must_use]
    pub fn contains(&self, key: &TraceKey) -> bool {
        self.streams
            .get(&(key.publisher, key.stream))
            .is_some_and(|s| s.contains(key.sequence))
    }

    /// Records `key` as written; `false` when it already was.
    #[inline]
    pub fn insert(&mut self, key: &TraceKey) -> bool {
        let added = self
            .streams
            .entry((key.publisher, key.stream))
            .or_default()
            .insert(key.sequence);
        self.len += u64::from(added);
        added
    }

    /// Distinct keys written.
    #[must_use]
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Nothing written.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every stream's set: `((publisher, stream), keys)`, in no order.
    pub fn streams(&self) -> impl Iterator<Item = (&(u16, u32), &SeqSet)> {
        self.streams.iter()
    }

    /// Adds a stream's whole set (a stream not held yet, as a checkpoint restores it);
    /// `false`, changing nothing, when the stream is held already.
    pub fn insert_stream(&mut self, publisher: u16, stream: u32, keys: SeqSet) -> bool {
        if self.streams.contains_key(&(publisher, stream)) {
            return false;
        }
        self.len += keys.len();
        self.streams.insert((publisher, stream), keys);
        true
    }

    /// The set of one stream, if any of its keys was written.
    #[must_use]
    pub fn stream(&self, publisher: u16, stream: u32) -> Option<&SeqSet> {
        self.streams.get(&(publisher, stream))
    }

    /// Bytes held, roughly.
    #[must_use]
    pub fn memory_bytes(&self) -> usize {
        self.streams.capacity() * (std::mem::size_of::<((u16, u32), SeqSet)>() + 1)
            + self
                .streams
                .values()
                .map(|s| s.memory_bytes() - std::mem::size_of::<SeqSet>())
                .sum::<usize>()
    }
}

/// The keys one partition of a collector group's topic has written.
///
/// A partition holds the keys that Kafka's partitioner puts there
/// ([`super::placement::partition_of`]): about one sequence in `partitions` of each stream.
/// Kept as they are, every key would be a range of its own. The sequences just below a
/// key that belong to *other* partitions are added with it ("filled"): no key of this
/// partition is among them, so [`Self::contains`] stays exact for this partition's keys,
/// and the keys of a stream written in order stay one range. A run of other partitions'
/// sequences longer than `32 × partitions` (never, in practice) is left as a gap.
#[derive(Debug, Clone)]
pub struct PartitionKeys {
    keys: WrittenKeys,
    partition: i32,
    partitions: i32,
    len: u64,
}

impl PartitionKeys {
    /// No keys of `partition` of `partitions`.
    #[must_use]
    pub fn new(partition: i32, partitions: i32) -> Self {
        Self {
            keys: WrittenKeys::new(),
            partition,
            partitions: partitions.max(1),
            len: 0,
        }
    }

    /// Whether `key` belongs to this partition.
    #[inline]
    #[must_use]
    pub fn belongs(&self, key: &TraceKey) -> bool {
        self.partitions == 1
            || super::placement::partition_of(key, self.partitions) == self.partition
    }

    /// Whether `key`, a key of this partition, was written.
    #[inline]
    #[must_use]
    pub fn contains(&self, key: &TraceKey) -> bool {
        self.keys.contains(key)
    }

    /// Records `key`, a key of this partition, as written; `false` when it already was.
    pub fn insert(&mut self, key: &TraceKey) -> bool {
        debug_assert!(self.belongs(key), "{key:?} is not a key of this partition");
        if self.keys.contains(key) {
            return false;
        }
        let most = u64::try_from(self.partitions)
            .unwrap_or(1)
            .saturating_mul(32);
        let mut below = *key;
        let mut first = key.sequence;
        while first > 0 && key.sequence - first < most {
            below.sequence = first - 1;
            if self.belongs(&below) {
                break;
            }
            first -= 1;
        }
        if key.sequence - first < most {
            for sequence in first..key.sequence {
                self.keys.insert(&TraceKey { sequence, ..*key });
            }
        }
        self.keys.insert(key);
        self.len += 1;
        true
    }

    /// Keys of this partition written.
    #[must_use]
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Nothing written.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Disjoint ranges held, over every stream.
    #[must_use]
    pub fn ranges(&self) -> usize {
        self.keys.streams().map(|(_, s)| s.ranges()).sum()
    }

    /// Bytes held, roughly.
    #[must_use]
    pub fn memory_bytes(&self) -> usize {
        self.keys.memory_bytes()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;

    #[test]
    fn in_order_keys_stay_one_range() {
        let mut s = SeqSet::new();
        for x in 0..100_000 {
            assert!(s.insert(x));
        }
        assert_eq!((s.len(), s.ranges()), (100_000, 1));
        assert!(!s.insert(5));
        assert!(s.contains(99_999) && !s.contains(100_000));
    }

    #[test]
    fn gaps_fill_and_merge() {
        let mut s = SeqSet::new();
        for x in [0, 1, 2, 5, 6, 9] {
            s.insert(x);
        }
        assert_eq!(s.ranges(), 3);
        for x in [3, 4, 8, 7] {
            assert!(s.insert(x));
        }
        assert_eq!((s.len(), s.ranges()), (10, 1));
        assert_eq!(s.count_within(2, 7), 6);
        assert_eq!(s.count_within(8, 20), 2);
        assert_eq!(s.count_within(11, 20), 0);
    }

    #[test]
    fn the_extremes_do_not_overflow() {
        let mut s = SeqSet::new();
        assert!(s.insert(u64::MAX));
        assert!(s.insert(u64::MAX - 1));
        assert!(s.insert(0));
        assert!(!s.insert(u64::MAX));
        assert_eq!((s.len(), s.ranges()), (3, 2));
        assert_eq!(s.count_within(0, u64::MAX), 3);
    }

    proptest! {
        #[test]
        fn matches_a_plain_set(ops in prop::collection::vec(0_u64..200, 0..600), q in (0_u64..220, 0_u64..220)) {
            let mut s = SeqSet::new();
            let mut oracle = BTreeSet::new();
            for x in ops {
                prop_assert_eq!(s.insert(x), oracle.insert(x));
                prop_assert_eq!(s.len(), oracle.len() as u64);
            }
            for x in 0..210 {
                prop_assert_eq!(s.contains(x), oracle.contains(&x), "{}", x);
            }
            let (a, b) = q;
            prop_assert_eq!(s.count_within(a, b), oracle.iter().filter(|&&x| a <= x && x <= b).count() as u64);
            // Ranges are disjoint and do not touch: as few as the set needs.
            let runs = oracle.iter().zip(oracle.iter().skip(1)).filter(|(a, b)| **b != **a + 1).count()
                + usize::from(!oracle.is_empty());
            prop_assert_eq!(s.ranges(), runs);
            // Its ranges make the same set again (a checkpoint keeps a set as ranges).
            let ranges: Vec<(u64, u64)> = s.iter_ranges().collect();
            match SeqSet::from_ranges(&ranges) {
                Some(back) => {
                    prop_assert_eq!(back.len(), s.len());
                    for x in 0..210 {
                        prop_assert_eq!(back.contains(x), oracle.contains(&x));
                    }
                    prop_assert_eq!(back.iter_ranges().collect::<Vec<_>>(), ranges);
                }
                None => prop_assert!(oracle.is_empty()),
            }
        }
    }

    #[test]
    fn ranges_that_overlap_touch_or_run_backwards_are_refused() {
        assert!(SeqSet::from_ranges(&[(1, 3), (5, 9)]).is_some());
        assert!(SeqSet::from_ranges(&[(1, 3), (4, 9)]).is_none());
        assert!(SeqSet::from_ranges(&[(1, 3), (2, 9)]).is_none());
        assert!(SeqSet::from_ranges(&[(5, 9), (1, 3)]).is_none());
        assert!(SeqSet::from_ranges(&[(3, 1)]).is_none());
        assert!(SeqSet::from_ranges(&[(u64::MAX - 1, u64::MAX)]).is_some());
    }

    #[test]
    fn written_keys_count_per_stream() {
        let mut w = WrittenKeys::new();
        let k = |p, s, q| TraceKey {
            publisher: p,
            stream: s,
            sequence: q,
        };
        assert!(w.insert(&k(1, 2, 3)));
        assert!(!w.insert(&k(1, 2, 3)));
        assert!(w.insert(&k(1, 3, 3)));
        assert!(w.contains(&k(1, 2, 3)) && !w.contains(&k(2, 2, 3)));
        assert_eq!(w.len(), 2);
        assert_eq!(w.stream(1, 2).map(SeqSet::len), Some(1));
    }
}

#[cfg(test)]
mod partition_tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;

    fn key(stream: u32, sequence: u64) -> TraceKey {
        TraceKey {
            publisher: 2,
            stream,
            sequence,
        }
    }

    #[test]
    fn a_partitions_keys_written_in_order_stay_one_range_per_stream() {
        let partitions = 6;
        for p in 0..partitions {
            let mut w = PartitionKeys::new(p, partitions);
            let mut n = 0;
            for stream in 0..4 {
                for s in 0..20_000 {
                    let k = key(stream, s);
                    if w.belongs(&k) {
                        assert!(w.insert(&k));
                        assert!(!w.insert(&k));
                        n += 1;
                    }
                }
            }
            assert_eq!(w.len(), n);
            assert_eq!(w.ranges(), 4, "partition {p}");
            // Every key of the partition is in the set (the others are filled in, and
            // never asked about).
            for s in 0..20_000 {
                let k = key(1, s);
                if w.belongs(&k) {
                    assert!(w.contains(&k), "{s}");
                }
            }
            assert!(!w.contains(&key(1, 20_000 + 6 * 40)), "beyond the last key");
        }
    }

    proptest! {
        /// Against a plain set of the partition's keys, in any order, with gaps.
        #[test]
        fn matches_a_plain_set(seqs in prop::collection::vec(0_u64..3_000, 0..1_500), p in 0_i32..4) {
            let mut w = PartitionKeys::new(p, 4);
            let mut oracle = BTreeSet::new();
            for s in seqs {
                let k = key(1, s);
                if !w.belongs(&k) {
                    continue;
                }
                prop_assert_eq!(w.insert(&k), oracle.insert(s));
            }
            prop_assert_eq!(w.len(), oracle.len() as u64);
            for s in 0..3_100 {
                let k = key(1, s);
                if w.belongs(&k) {
                    prop_assert_eq!(w.contains(&k), oracle.contains(&s), "{}", s);
                }
            }
        }
    }
}
