//! `trace_counts(stream, publisher, complete, flags, missing_mask, sequence)`
//! ([`trace_counts_udaf`]): rows, complete rows, the rows with each bit of `flags` and of
//! `missing_mask` set, the distinct streams and publishers, and the distinct trace keys
//! (publisher, stream, sequence) with the rows that repeat one, as a [`TraceCounts`] in
//! its compact binary encoding ([`TraceCounts::decode`] reads it; the encoding is this
//! module's own and may change between versions: it is not for storing).

use std::collections::HashSet;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, PrimitiveArray};
use datafusion::arrow::datatypes::{
    ArrowNativeType, ArrowPrimitiveType, DataType, Int64Type, UInt8Type, UInt16Type, UInt32Type,
    UInt64Type,
};
use datafusion::common::{Result, exec_err, plan_err};
use datafusion::logical_expr::AggregateUDF;
use hoptrace_format::varint::{DecodeError, Reader, put};

use crate::binary_agg::{self, BinaryState, corrupt};

/// First byte of an encoded [`TraceCounts`].
const COUNTS_TAG: u8 = 0x54;

/// A set of ids: a bitmap while they are small, a hash set beyond.
#[derive(Debug, Clone, PartialEq, Eq)]
enum IdSet {
    Bits(Vec<u64>),
    Hashed(HashSet<u64>),
}

/// Ids below this are kept in a bitmap (at most 512 KiB).
const BITMAP_IDS: u64 = 1 << 22;

impl Default for IdSet {
    fn default() -> Self {
        Self::Bits(Vec::new())
    }
}

impl IdSet {
    #[inline]
    fn insert(&mut self, id: u64) {
        match self {
            Self::Bits(words) if id < BITMAP_IDS => {
                let w = (id >> 6) as usize;
                if w >= words.len() {
                    words.resize(w + 1, 0);
                }
                words[w] |= 1 << (id & 63);
            }
            Self::Bits(_) => {
                let mut set: HashSet<u64> = self.ids().collect();
                set.insert(id);
                *self = Self::Hashed(set);
            }
            Self::Hashed(set) => {
                set.insert(id);
            }
        }
    }

    fn len(&self) -> u64 {
        match self {
            Self::Bits(words) => words.iter().map(|w| u64::from(w.count_ones())).sum(),
            Self::Hashed(set) => set.len() as u64,
        }
    }

    /// The ids, in ascending order for a bitmap.
    fn ids(&self) -> Box<dyn Iterator<Item = u64> + '_> {
        match self {
            Self::Bits(words) => Box::new(words.iter().enumerate().flat_map(|(i, &w)| {
                let base = (i as u64) << 6;
                (0..64)
                    .filter(move |b| w & (1 << b) != 0)
                    .map(move |b| base + b)
            })),
            Self::Hashed(set) => Box::new(set.iter().copied()),
        }
    }

    fn merge(&mut self, other: &Self) {
        match (&mut *self, other) {
            (Self::Bits(a), Self::Bits(b)) => {
                if a.len() < b.len() {
                    a.resize(b.len(), 0);
                }
                for (x, y) in a.iter_mut().zip(b) {
                    *x |= y;
                }
            }
            _ => other.ids().for_each(|id| self.insert(id)),
        }
    }

    fn encode(&self, out: &mut Vec<u8>) {
        let mut ids: Vec<u64> = self.ids().collect();
        ids.sort_unstable();
        put(out, ids.len() as u64);
        let mut prev = 0;
        for id in ids {
            put(out, id - prev);
            prev = id;
        }
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let n = r.varint()?;
        let mut set = Self::default();
        let mut id = 0_u64;
        for _ in 0..n {
            id = id.checked_add(r.varint()?).ok_or(DecodeError)?;
            set.insert(id);
        }
        Ok(set)
    }
}

/// Keys per block of a [`KeySet`].
const KEY_BLOCK: u64 = 1 << KEY_BLOCK_BITS;
/// Bits of a block's offsets.
const KEY_BLOCK_BITS: u32 = 12;
/// Words of a block's bitmap.
const BLOCK_WORDS: usize = (KEY_BLOCK / 64) as usize;
/// A block's keys are listed until they are this many, then a bitmap (512 bytes).
const SPARSE_MAX: usize = 256;

/// The keys of one block of a [`KeySet`], by their offsets in it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Block {
    /// Sorted offsets within the block.
    Sparse(Vec<u16>),
    /// One bit per offset.
    Dense(Box<[u64; BLOCK_WORDS]>),
}

impl Block {
    fn new() -> Self {
        Self::Sparse(Vec::with_capacity(16))
    }

    /// The bitmap of the listed offsets `v`.
    fn bitmap(v: &[u16]) -> Box<[u64; BLOCK_WORDS]> {
        let mut bits = Box::new([0u64; BLOCK_WORDS]);
        for &x in v {
            bits[usize::from(x >> 6)] |= 1 << (x & 63);
        }
        bits
    }

    /// Adds offset `o`; `false` when it was there.
    fn insert(&mut self, o: u16) -> bool {
        match self {
            // Keys mostly arrive in ascending order of offsets: append without a search.
            Self::Sparse(v) if v.last().is_none_or(|&l| l < o) => {
                v.push(o);
                if v.len() > SPARSE_MAX {
                    *self = Self::Dense(Self::bitmap(v));
                }
                true
            }
            Self::Sparse(v) => match v.binary_search(&o) {
                Ok(_) => false,
                Err(at) => {
                    v.insert(at, o);
                    if v.len() > SPARSE_MAX {
                        *self = Self::Dense(Self::bitmap(v));
                    }
                    true
                }
            },
            Self::Dense(bits) => {
                let (w, b) = (usize::from(o >> 6), o & 63);
                let new = bits[w] & (1 << b) == 0;
                bits[w] |= 1 << b;
                new
            }
        }
    }

    /// Adds `offsets`: how many were not there. Once the block is a bitmap, without
    /// looking at its kind again.
    fn insert_all(&mut self, mut offsets: impl Iterator<Item = u16>) -> u64 {
        let mut fresh = 0;
        while let Self::Sparse(_) = self {
            match offsets.next() {
                Some(o) => fresh += u64::from(self.insert(o)),
                None => return fresh,
            }
        }
        if let Self::Dense(bits) = self {
            // Offsets in one word (neighbouring streams at one sequence) gather in a
            // register and meet the bitmap once: the new ones are the gathered bits it
            // lacks.
            let (mut word, mut gathered) = (usize::MAX, 0_u64);
            for o in offsets {
                let w = usize::from(o >> 6);
                if w != word {
                    if let Some(old) = bits.get_mut(word) {
                        fresh += u64::from((gathered & !*old).count_ones());
                        *old |= gathered;
                    }
                    (word, gathered) = (w, 0);
                }
                gathered |= 1 << (o & 63);
            }
            if let Some(old) = bits.get_mut(word) {
                fresh += u64::from((gathered & !*old).count_ones());
                *old |= gathered;
            }
        }
        fresh
    }

    /// Keys in the block.
    fn len(&self) -> u64 {
        match self {
            Self::Sparse(v) => v.len() as u64,
            Self::Dense(bits) => bits.iter().map(|w| u64::from(w.count_ones())).sum(),
        }
    }

    /// Adds `other`'s offsets: (offsets new here, offsets already here).
    fn union(&mut self, other: &Self) -> (u64, u64) {
        if let (Self::Dense(mine), Self::Dense(theirs)) = (&mut *self, other) {
            let (mut fresh, mut seen) = (0, 0);
            for (a, &b) in mine.iter_mut().zip(theirs.iter()) {
                fresh += u64::from((b & !*a).count_ones());
                seen += u64::from((b & *a).count_ones());
                *a |= b;
            }
            return (fresh, seen);
        }
        let offsets = other.offsets();
        let fresh = offsets.iter().filter(|&&o| self.insert(o)).count() as u64;
        (fresh, offsets.len() as u64 - fresh)
    }

    fn offsets(&self) -> Vec<u16> {
        match self {
            Self::Sparse(v) => v.clone(),
            Self::Dense(bits) => (0..KEY_BLOCK as u16)
                .filter(|o| bits[usize::from(o >> 6)] & (1 << (o & 63)) != 0)
                .collect(),
        }
    }

    /// A list (0, the count, the offsets' differences) or a bitmap (1, 64 words).
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Self::Sparse(v) => {
                put(out, 0);
                put(out, v.len() as u64);
                let mut prev = 0;
                for &o in v {
                    put(out, u64::from(o - prev));
                    prev = o;
                }
            }
            Self::Dense(bits) => {
                put(out, 1);
                for w in bits.iter() {
                    out.extend_from_slice(&w.to_le_bytes());
                }
            }
        }
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        match r.varint()? {
            0 => {
                let n = r.varint()?;
                if n > SPARSE_MAX as u64 {
                    return Err(DecodeError);
                }
                let mut v = Vec::with_capacity(n as usize);
                let mut o = 0u64;
                for i in 0..n {
                    let d = r.varint()?;
                    // Strictly increasing: only the first difference may be 0.
                    if d == 0 && i > 0 {
                        return Err(DecodeError);
                    }
                    o = o
                        .checked_add(d)
                        .filter(|&o| o < KEY_BLOCK)
                        .ok_or(DecodeError)?;
                    v.push(o as u16);
                }
                Ok(Self::Sparse(v))
            }
            1 => {
                let mut bits = Box::new([0u64; BLOCK_WORDS]);
                for w in bits.iter_mut() {
                    *w = u64::from_le_bytes(r.fixed()?);
                }
                Ok(Self::Dense(bits))
            }
            _ => Err(DecodeError),
        }
    }
}

/// The hasher of a [`KeySet`]'s map: a multiply-rotate mix of the three words of a
/// (publisher, stream, block) key, about a nanosecond where SipHash takes tens (the map
/// is probed once per row). It starts from a random seed per set, so keys read from
/// files cannot be chosen to collide.
#[derive(Debug, Clone, Copy)]
struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    #[inline]
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(w));
        }
    }

    #[inline]
    fn finish(&self) -> u64 {
        // The multiplications mix upwards: bring the best-mixed bits to the bottom, where
        // the map takes its bucket index.
        self.0.rotate_left(26)
    }
}

/// Builds [`KeyHasher`]s from one random seed.
#[derive(Debug, Clone)]
struct KeyHashing(u64);

impl Default for KeyHashing {
    fn default() -> Self {
        use std::hash::BuildHasher as _;
        Self(std::collections::hash_map::RandomState::new().hash_one(0x6b65_7973_u64))
    }
}

impl std::hash::BuildHasher for KeyHashing {
    type Hasher = KeyHasher;

    fn build_hasher(&self) -> KeyHasher {
        KeyHasher(self.0)
    }
}

/// The most streams one block holds side by side: 2 to this power.
const MAX_LANES: u32 = 6;

/// How a publisher's keys fill blocks: a block holds 2^`lanes` neighbouring streams (the
/// stream numbers equal but for their low `lanes` bits) over 4096 / 2^`lanes`
/// neighbouring sequences; a key's offset in it is its sequence's row times 2^`lanes`
/// plus its stream's lane.
///
/// Publishers send their streams in turn (streams 0, 1, 2, ... at one sequence, then all
/// at the next), so with a lane per stream a batch's consecutive rows set bits of one
/// word of one block, where a block per stream would take a cache miss per row; a
/// single stream (no lanes) fills a block with 4096 of its sequences. A publisher takes
/// its layout when first seen, from the stream numbers of that batch, and keeps it: as
/// many lanes as its streams fill more than half of, so that blocks fill (one bit per
/// key) whether stream numbers are neighbours or scattered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Layout {
    lanes: u32,
}

impl Layout {
    /// The widest layout (up to 2^[`MAX_LANES`] lanes) whose lanes `streams` fill more
    /// than half of: neighbouring stream numbers (0, 1, 2, ...) side by side, scattered
    /// ones (hashes, say) one per block, where a block with one lane used of 64 would
    /// hold 64 keys and stay a list.
    fn for_streams(streams: &[u64]) -> Self {
        let mut ids = streams.to_vec();
        ids.sort_unstable();
        ids.dedup();
        let lanes = (1..=MAX_LANES)
            .rev()
            .find(|&lanes| {
                let groups = 1 + ids
                    .windows(2)
                    .filter(|w| w[0] >> lanes != w[1] >> lanes)
                    .count();
                2 * ids.len() > groups << lanes
            })
            .unwrap_or(0);
        Self { lanes }
    }

    /// Bits of a sequence's row within a block.
    fn depth(self) -> u32 {
        KEY_BLOCK_BITS - self.lanes
    }

    /// The place of key (`stream`, `sequence`): (stream group, block of the group,
    /// offset in the block).
    #[inline]
    fn place(self, stream: u64, sequence: u64) -> (u64, u64, u16) {
        let lane = stream & ((1 << self.lanes) - 1);
        let row = sequence & ((1 << self.depth()) - 1);
        let offset = u16::try_from((row << self.lanes) | lane).expect("below the block size");
        (stream >> self.lanes, sequence >> self.depth(), offset)
    }

    /// Whether block `block` of stream group `group` holds 64-bit keys only.
    fn holds(self, group: u64, block: u64) -> bool {
        group <= u64::MAX >> self.lanes && block <= u64::MAX >> self.depth()
    }

    /// The key (stream, sequence) at `offset` of block `block` of stream group `group`
    /// (a place [`Layout::holds`]).
    fn key(self, group: u64, block: u64, offset: u16) -> (u64, u64) {
        let o = u64::from(offset);
        (
            (group << self.lanes) | (o & ((1 << self.lanes) - 1)),
            (block << self.depth()) | (o >> self.lanes),
        )
    }
}

/// Stream numbers below this are found by index; others through the map.
const DIRECT_STREAMS: u64 = 1 << 16;
/// A stream group's index reaches this many blocks from its first one, or twice the
/// blocks it holds if more; blocks beyond go through the map (so keys scattered far
/// apart cannot make an index larger than the blocks themselves).
const DIRECT_SPAN: usize = 4096;
/// Publishers found by index; more go through the map.
const DIRECT_PUBLISHERS: usize = 64;
/// An empty slot of an index.
const NO_BLOCK: usize = usize::MAX;

/// The blocks of one stream group found by index: block `base + i` is the key set's
/// block `slots[i]`.
#[derive(Debug, Clone, Default)]
struct Group {
    base: u64,
    slots: Vec<usize>,
    /// Slots that are not empty.
    held: usize,
}

/// A publisher whose stream groups are found by index.
#[derive(Debug, Clone)]
struct Publisher {
    id: u64,
    layout: Layout,
    groups: Vec<Group>,
}

/// The distinct trace keys (publisher, stream, sequence) of the rows, and how many rows
/// repeated a key already seen. A stream's sequences are dense (0, 1, 2, ...), so keys
/// are kept as bitmaps of 4096 (in the [`Layout`] of their publisher), listed while a
/// block holds few: about one bit per key, in any order of rows, files or partitions.
/// Sets merge block by block.
///
/// A row finds its block by index (publisher, stream group, block from the group's
/// first) in the usual case of a few publishers, streams numbered from 0 and sequences
/// that start near 0; any other key goes through a hash map.
#[derive(Debug, Clone, Default)]
struct KeySet {
    /// Up to [`DIRECT_PUBLISHERS`], in the order first seen, with their layouts; others
    /// have the default one.
    publishers: Vec<Publisher>,
    /// Every block with its key (publisher, stream group, block of the group).
    blocks: Vec<((u64, u64, u64), Block)>,
    /// Where the blocks outside the publishers' indexes are.
    other: std::collections::HashMap<(u64, u64, u64), usize, KeyHashing>,
    /// Slots of all indexes.
    slots: usize,
    keys: u64,
    repeated: u64,
}

impl PartialEq for KeySet {
    /// The same keys and repeats, in whatever layout.
    fn eq(&self, other: &Self) -> bool {
        (self.keys, self.repeated) == (other.keys, other.repeated)
            && self.sorted_keys() == other.sorted_keys()
    }
}

impl Eq for KeySet {}

impl KeySet {
    /// The layout of publisher `p` and its place in the index, if any. A publisher seen
    /// for the first time takes `layout()` and a place while there is room; beyond, the
    /// default layout.
    fn publisher(&mut self, p: u64, layout: impl FnOnce() -> Layout) -> (Layout, Option<usize>) {
        match self.publishers.iter().position(|d| d.id == p) {
            Some(at) => (self.publishers[at].layout, Some(at)),
            None if self.publishers.len() < DIRECT_PUBLISHERS => {
                let layout = layout();
                self.publishers.push(Publisher {
                    id: p,
                    layout,
                    groups: Vec::new(),
                });
                (layout, Some(self.publishers.len() - 1))
            }
            None => (Layout::default(), None),
        }
    }

    /// The layout publisher `p`'s blocks are in.
    fn layout_of(&self, p: u64) -> Layout {
        self.publishers
            .iter()
            .find(|d| d.id == p)
            .map_or_else(Layout::default, |d| d.layout)
    }

    /// Where block `block` of stream group `group` of publisher `p` (at place `at` of
    /// the index) is in `blocks`, added empty when new.
    fn block_at(&mut self, p: u64, at: Option<usize>, group: u64, block: u64) -> usize {
        let key = (p, group, block);
        if let Some(publisher) = at.map(|at| &mut self.publishers[at])
            && group < DIRECT_STREAMS >> publisher.layout.lanes
        {
            let g = usize::try_from(group).expect("below DIRECT_STREAMS");
            if publisher.groups.len() <= g {
                publisher.groups.resize_with(g + 1, Group::default);
            }
            let gr = &mut publisher.groups[g];
            if gr.slots.is_empty() {
                gr.base = block;
            }
            if let Some(i) = block
                .checked_sub(gr.base)
                .and_then(|i| usize::try_from(i).ok())
                .filter(|&i| i < DIRECT_SPAN.max(2 * gr.held))
            {
                if gr.slots.len() <= i {
                    self.slots += i + 1 - gr.slots.len();
                    gr.slots.resize(i + 1, NO_BLOCK);
                }
                if gr.slots[i] == NO_BLOCK {
                    gr.slots[i] = self.blocks.len();
                    gr.held += 1;
                    self.blocks.push((key, Block::new()));
                }
                return gr.slots[i];
            }
        }
        let next = self.blocks.len();
        let at = *self.other.entry(key).or_insert(next);
        if at == next {
            self.blocks.push((key, Block::new()));
        }
        at
    }

    /// Adds offset `o` to block `at`.
    #[inline]
    fn insert_at(&mut self, at: usize, o: u16) {
        if self.blocks[at].1.insert(o) {
            self.keys += 1;
        } else {
            self.repeated += 1;
        }
    }

    /// Adds key (`publisher`, `stream`, `sequence`); a publisher seen for the first time
    /// takes `layout()`.
    fn insert(
        &mut self,
        publisher: u64,
        stream: u64,
        sequence: u64,
        layout: impl FnOnce() -> Layout,
    ) {
        let (layout, at) = self.publisher(publisher, layout);
        let (g, b, o) = layout.place(stream, sequence);
        let i = self.block_at(publisher, at, g, b);
        self.insert_at(i, o);
    }

    /// Adds the keys of the rows valid in all three arrays. A publisher first seen here
    /// takes the layout of the rows' stream numbers ([`Layout::for_streams`]). Rows of
    /// one publisher (the usual batch) find its place once, and consecutive rows in one
    /// block find it once.
    fn insert_rows(
        &mut self,
        p: &PrimitiveArray<UInt64Type>,
        st: &PrimitiveArray<UInt64Type>,
        q: &PrimitiveArray<UInt64Type>,
    ) {
        // Worked out once, and only when a publisher is new.
        let mut chosen = None;
        let mut layout = || *chosen.get_or_insert_with(|| Layout::for_streams(st.values()));
        let one_publisher = p.values().first().copied().filter(|&p0| {
            p.null_count() + st.null_count() + q.null_count() == 0
                && p.values().iter().all(|&x| x == p0)
        });
        let Some(p0) = one_publisher else {
            for i in 0..q.len() {
                if p.is_valid(i) && st.is_valid(i) && q.is_valid(i) {
                    self.insert(p.value(i), st.value(i), q.value(i), &mut layout);
                }
            }
            return;
        };
        let (layout, at) = self.publisher(p0, layout);
        let mut places = st
            .values()
            .iter()
            .zip(q.values().iter())
            .map(|(&s, &seq)| layout.place(s, seq))
            .peekable();
        while let Some(&(g, b, _)) = places.peek() {
            // The run of rows in this row's block: found once, filled at once.
            let i = self.block_at(p0, at, g, b);
            let mut rows = 0;
            let run = std::iter::from_fn(|| places.next_if(|p| (p.0, p.1) == (g, b)));
            let fresh = self.blocks[i].1.insert_all(run.map(|p| {
                rows += 1;
                p.2
            }));
            self.keys += fresh;
            self.repeated += rows - fresh;
        }
    }

    /// Adds `block`, block `b` of stream group `g` of publisher `p` (at place `at`) in
    /// this set's layout of `p`.
    fn add_block(&mut self, (p, g, b): (u64, u64, u64), at: Option<usize>, block: Block) {
        let before = self.blocks.len();
        let i = self.block_at(p, at, g, b);
        if i == before {
            self.keys += block.len();
            self.blocks[i].1 = block;
        } else {
            let (fresh, seen) = self.blocks[i].1.union(&block);
            self.keys += fresh;
            self.repeated += seen;
        }
    }

    /// Adds `other`'s keys and repeats: block by block where both keep a publisher in one
    /// layout, key by key where not.
    fn merge(&mut self, other: &Self) {
        self.repeated += other.repeated;
        // Blocks of one publisher come together: its layouts are looked up once.
        let mut last: Option<(u64, Layout, Layout, Option<usize>)> = None;
        for &((p, g, b), ref block) in &other.blocks {
            let (theirs, mine, at) = match last {
                Some((lp, theirs, mine, at)) if lp == p => (theirs, mine, at),
                _ => {
                    let theirs = other.layout_of(p);
                    let (mine, at) = self.publisher(p, || theirs);
                    last = Some((p, theirs, mine, at));
                    (theirs, mine, at)
                }
            };
            if mine == theirs {
                self.add_block((p, g, b), at, block.clone());
            } else {
                for o in block.offsets() {
                    let (s, q) = theirs.key(g, b, o);
                    let (g, b, o) = mine.place(s, q);
                    let i = self.block_at(p, at, g, b);
                    self.insert_at(i, o);
                }
            }
        }
    }

    /// Every key (publisher, stream, sequence), sorted.
    fn sorted_keys(&self) -> Vec<(u64, u64, u64)> {
        let mut keys = Vec::new();
        for &((p, g, b), ref block) in &self.blocks {
            let layout = self.layout_of(p);
            keys.extend(block.offsets().into_iter().map(|o| {
                let (s, q) = layout.key(g, b, o);
                (p, s, q)
            }));
        }
        keys.sort_unstable();
        keys
    }

    /// An upper bound of the heap bytes held, in constant time (DataFusion asks after
    /// every batch): a block lists at most 256 two-byte offsets or holds a 512-byte
    /// bitmap, beside its entry; a slot of an index or the map takes at most 64 bytes.
    fn bytes(&self) -> usize {
        self.blocks.capacity() * std::mem::size_of::<((u64, u64, u64), Block)>()
            + self.blocks.len() * (KEY_BLOCK / 8) as usize
            + self.slots * std::mem::size_of::<usize>()
            + self.other.capacity() * 64
    }

    /// The repeats, the publishers with their layouts, then every block with its key.
    fn encode(&self, out: &mut Vec<u8>) {
        put(out, self.repeated);
        put(out, self.publishers.len() as u64);
        for d in &self.publishers {
            put(out, d.id);
            put(out, u64::from(d.layout.lanes));
        }
        put(out, self.blocks.len() as u64);
        for ((p, g, b), block) in &self.blocks {
            for &v in [p, g, b] {
                put(out, v);
            }
            block.encode(out);
        }
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let repeated = r.varint()?;
        let mut set = Self::default();
        let listed = r.varint()?;
        if listed > DIRECT_PUBLISHERS as u64 {
            return Err(DecodeError);
        }
        for _ in 0..listed {
            let (id, lanes) = (r.varint()?, r.varint()?);
            let lanes = u32::try_from(lanes)
                .ok()
                .filter(|&l| l <= MAX_LANES)
                .ok_or(DecodeError)?;
            if set.publishers.iter().any(|d| d.id == id) {
                return Err(DecodeError);
            }
            set.publisher(id, || Layout { lanes });
        }
        for _ in 0..r.varint()? {
            let (p, g, b) = (r.varint()?, r.varint()?, r.varint()?);
            // A publisher not listed is one beyond the index, in the default layout.
            let at = set.publishers.iter().position(|d| d.id == p);
            if at.is_none() && set.publishers.len() < DIRECT_PUBLISHERS {
                return Err(DecodeError);
            }
            let layout = at.map_or_else(Layout::default, |at| set.publishers[at].layout);
            if !layout.holds(g, b) {
                return Err(DecodeError);
            }
            set.add_block((p, g, b), at, Block::decode(r)?);
        }
        set.repeated += repeated;
        Ok(set)
    }
}

/// Figures of a run's small columns, from `trace_counts`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TraceCounts {
    /// Rows.
    pub rows: u64,
    /// Rows whose `complete` argument is true.
    pub complete: u64,
    /// Rows with each bit of `flags` set.
    pub flag_bits: Vec<u64>,
    /// Rows with each bit of `missing_mask` set.
    pub missing_bits: Vec<u64>,
    streams: IdSet,
    publishers: IdSet,
    keys: KeySet,
}

/// An id, flag or mask of any integer type as a u64 (negative ones wrap around: they
/// stay distinct, and their bits are their two's complement).
#[inline(always)]
fn to_u64<N: ArrowNativeType>(v: N) -> u64 {
    v.as_usize() as u64
}

/// Adds the rows with each bit set to `bits[bit]`, over the valid values.
fn count_bits<T: ArrowPrimitiveType>(bits: &mut Vec<u64>, values: &PrimitiveArray<T>) {
    let raw = values.values();
    let nulls = values.nulls().filter(|n| n.null_count() > 0);
    let any = match nulls {
        None => raw.iter().fold(0, |a, &v| a | to_u64(v)),
        Some(n) => n.valid_indices().fold(0, |a, i| a | to_u64(raw[i])),
    };
    // Flags and masks are mostly zero: only the bits seen at all are counted.
    let mut rest = any;
    while rest != 0 {
        let b = rest.trailing_zeros() as usize;
        rest &= rest - 1;
        let set = |v: T::Native| (to_u64(v) >> b) & 1 != 0;
        let n = match nulls {
            None => raw.iter().filter(|&&v| set(v)).count(),
            Some(n) => n.valid_indices().filter(|&i| set(raw[i])).count(),
        };
        if bits.len() <= b {
            bits.resize(b + 1, 0);
        }
        bits[b] += n as u64;
    }
}

fn insert_ids<T: ArrowPrimitiveType>(set: &mut IdSet, values: &PrimitiveArray<T>) {
    if values.null_count() > 0 {
        for (i, &v) in values.values().iter().enumerate() {
            if values.is_valid(i) {
                set.insert(to_u64(v));
            }
        }
        return;
    }
    let raw = values.values();
    let (min, max) = raw.iter().fold((u64::MAX, 0), |(lo, hi), &v| {
        let v = to_u64(v);
        (lo.min(v), hi.max(v))
    });
    if min == max {
        // One id throughout (a single publisher).
        set.insert(min);
    } else if let IdSet::Bits(words) = set
        && max < BITMAP_IDS
    {
        let need = (max >> 6) as usize + 1;
        if words.len() < need {
            words.resize(need, 0);
        }
        // Ids in one word (streams in turn) gather in a register first.
        let (mut word, mut gathered) = (usize::MAX, 0_u64);
        for &v in raw.iter() {
            let v = to_u64(v);
            let w = (v >> 6) as usize;
            if w != word {
                if let Some(old) = words.get_mut(word) {
                    *old |= gathered;
                }
                (word, gathered) = (w, 0);
            }
            gathered |= 1 << (v & 63);
        }
        if let Some(old) = words.get_mut(word) {
            *old |= gathered;
        }
    } else {
        raw.iter().for_each(|&v| set.insert(to_u64(v)));
    }
}

/// Calls `$f` with `$array` as the primitive array of its integer type.
macro_rules! with_integers {
    ($array:expr, $f:ident, $($arg:expr),*) => {
        match $array.data_type() {
            DataType::UInt8 => $f($($arg,)* $array.as_primitive::<UInt8Type>()),
            DataType::UInt16 => $f($($arg,)* $array.as_primitive::<UInt16Type>()),
            DataType::UInt32 => $f($($arg,)* $array.as_primitive::<UInt32Type>()),
            DataType::UInt64 => $f($($arg,)* $array.as_primitive::<UInt64Type>()),
            DataType::Int64 => $f($($arg,)* $array.as_primitive::<Int64Type>()),
            other => return exec_err!("trace_counts: unexpected argument type {other}"),
        }
    };
}

impl TraceCounts {
    /// Distinct streams.
    #[must_use]
    pub fn streams(&self) -> u64 {
        self.streams.len()
    }

    /// Distinct publishers.
    #[must_use]
    pub fn publishers(&self) -> u64 {
        self.publishers.len()
    }

    /// Distinct trace keys (publisher, stream, sequence).
    #[must_use]
    pub fn distinct_keys(&self) -> u64 {
        self.keys.keys
    }

    /// Rows whose trace key an earlier row already had: `rows - distinct_keys`.
    #[must_use]
    pub fn repeated_keys(&self) -> u64 {
        self.keys.repeated
    }

    /// Rows with bit `bit` of `flags` set.
    #[must_use]
    pub fn flag(&self, bit: usize) -> u64 {
        self.flag_bits.get(bit).copied().unwrap_or(0)
    }

    /// Rows with bit `bit` of `missing_mask` set.
    #[must_use]
    pub fn missing(&self, bit: usize) -> u64 {
        self.missing_bits.get(bit).copied().unwrap_or(0)
    }

    fn add_batch(&mut self, cols: &[ArrayRef]) -> Result<()> {
        let [stream, publisher, complete, flags, missing, sequence] = cols else {
            return plan_err!("trace_counts takes six arguments");
        };
        self.rows += stream.len() as u64;
        let complete = complete.as_boolean();
        self.complete += match complete.nulls() {
            Some(n) => (complete.values() & n.inner()).count_set_bits(),
            None => complete.values().count_set_bits(),
        } as u64;
        with_integers!(stream, insert_ids, &mut self.streams);
        with_integers!(publisher, insert_ids, &mut self.publishers);
        with_integers!(flags, count_bits, &mut self.flag_bits);
        with_integers!(missing, count_bits, &mut self.missing_bits);
        let [p, st, q] = [publisher, stream, sequence]
            .map(|c| datafusion::arrow::compute::cast(c, &DataType::UInt64));
        let (p, st, q) = (p?, st?, q?);
        let (p, st, q) = (
            p.as_primitive::<UInt64Type>(),
            st.as_primitive::<UInt64Type>(),
            q.as_primitive::<UInt64Type>(),
        );
        self.keys.insert_rows(p, st, q);
        Ok(())
    }

    fn add_counts(&mut self, other: &Self) {
        self.rows += other.rows;
        self.complete += other.complete;
        for (mine, theirs) in [
            (&mut self.flag_bits, &other.flag_bits),
            (&mut self.missing_bits, &other.missing_bits),
        ] {
            if mine.len() < theirs.len() {
                mine.resize(theirs.len(), 0);
            }
            for (a, b) in mine.iter_mut().zip(theirs) {
                *a += b;
            }
        }
        self.streams.merge(&other.streams);
        self.publishers.merge(&other.publishers);
        self.keys.merge(&other.keys);
    }

    /// The binary form `trace_counts` returns.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![COUNTS_TAG];
        put(&mut out, self.rows);
        put(&mut out, self.complete);
        for bits in [&self.flag_bits, &self.missing_bits] {
            put(&mut out, bits.len() as u64);
            bits.iter().for_each(|&b| put(&mut out, b));
        }
        self.streams.encode(&mut out);
        self.publishers.encode(&mut out);
        self.keys.encode(&mut out);
        out
    }

    /// Reads [`TraceCounts::encode`]'s bytes.
    ///
    /// # Errors
    /// When `bytes` are not such an encoding.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        Self::read(bytes).map_err(|_| corrupt("trace_counts"))
    }

    fn read(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(bytes);
        if r.byte()? != COUNTS_TAG {
            return Err(DecodeError);
        }
        let rows = r.varint()?;
        let complete = r.varint()?;
        let mut bits = || -> Result<Vec<u64>, DecodeError> {
            let n = r.varint()?;
            if n > 64 {
                return Err(DecodeError);
            }
            (0..n).map(|_| r.varint()).collect()
        };
        let flag_bits = bits()?;
        let missing_bits = bits()?;
        let streams = IdSet::decode(&mut r)?;
        let publishers = IdSet::decode(&mut r)?;
        let keys = KeySet::decode(&mut r)?;
        r.finish()?;
        Ok(Self {
            rows,
            complete,
            flag_bits,
            missing_bits,
            streams,
            publishers,
            keys,
        })
    }
}

/// The `trace_counts` aggregate (not registered in sessions: its result is this module's
/// own encoding, read with [`TraceCounts::decode`]).
#[must_use]
pub fn trace_counts_udaf() -> AggregateUDF {
    binary_agg::udaf::<TraceCounts>()
}

impl BinaryState for TraceCounts {
    const NAME: &'static str = "trace_counts";
    const STATE: &'static str = "counts";
    // One group (the whole run): no groups accumulator.
    const GROUPED: bool = false;

    fn coerce(arg_types: &[DataType]) -> Result<Vec<DataType>> {
        // Unsigned integers are read as they are; signed ones as Int64.
        let int = |t: &DataType| match t {
            DataType::UInt8 | DataType::UInt16 | DataType::UInt32 | DataType::UInt64 => {
                Ok(t.clone())
            }
            DataType::Null => Ok(DataType::UInt64),
            t if t.is_integer() => Ok(DataType::Int64),
            t => plan_err!("trace_counts: ids, flags and masks are integers, not {t}"),
        };
        match arg_types {
            [stream, publisher, complete, flags, missing, sequence] => {
                if !matches!(complete, DataType::Boolean | DataType::Null) {
                    return plan_err!("trace_counts: `complete` is a boolean, not {complete}");
                }
                Ok(vec![
                    int(stream)?,
                    int(publisher)?,
                    DataType::Boolean,
                    int(flags)?,
                    int(missing)?,
                    int(sequence)?,
                ])
            }
            _ => plan_err!("trace_counts takes six arguments"),
        }
    }

    fn update(&mut self, values: &[ArrayRef]) -> Result<()> {
        self.add_batch(values)
    }

    fn merge(&mut self, other: &Self) {
        self.add_counts(other);
    }

    fn encode(&self) -> Vec<u8> {
        TraceCounts::encode(self)
    }

    fn decode(bytes: &[u8]) -> Result<Self> {
        TraceCounts::decode(bytes)
    }

    fn allocated_bytes(&self) -> usize {
        let set = |s: &IdSet| match s {
            IdSet::Bits(w) => w.capacity() * 8,
            IdSet::Hashed(h) => h.capacity() * 16,
        };
        set(&self.streams) + set(&self.publishers) + self.keys.bytes()
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::datatypes::Field;
    use std::sync::Arc;

    use datafusion::arrow::array::{BooleanArray, UInt64Array};
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #[test]
        fn trace_counts_count_and_round_trip(
            rows in prop::collection::vec(
                (
                    prop_oneof![0_u64..3, 0_u64..5_000, 0_u64..u64::MAX],
                    0_u64..3,
                    any::<bool>(),
                    0_u64..4,
                    0_u64..64,
                    prop_oneof![0_u64..30, 0_u64..u64::MAX],
                ),
                0..200,
            ),
            split in 0_usize..200,
        ) {
            type Row = (u64, u64, bool, u64, u64, u64);
            let split = split.min(rows.len());
            let batch = |rows: &[Row]| -> Vec<ArrayRef> {
                let u = |f: fn(&Row) -> u64| -> ArrayRef {
                    Arc::new(UInt64Array::from_iter_values(rows.iter().map(f)))
                };
                vec![
                    u(|r| r.0),
                    u(|r| r.1),
                    Arc::new(BooleanArray::from_iter(rows.iter().map(|r| Some(r.2)))),
                    u(|r| r.3),
                    u(|r| r.4),
                    u(|r| r.5),
                ]
            };
            let (mut a, mut b) = (TraceCounts::default(), TraceCounts::default());
            a.add_batch(&batch(&rows[..split])).unwrap();
            b.add_batch(&batch(&rows[split..])).unwrap();
            let mut c = TraceCounts::decode(&a.encode()).unwrap();
            c.add_counts(&TraceCounts::decode(&b.encode()).unwrap());
            let distinct = |f: fn(&Row) -> u64| {
                rows.iter().map(f).collect::<HashSet<u64>>().len() as u64
            };
            let bit = |f: fn(&Row) -> u64, b: usize| {
                rows.iter().filter(|r| f(r) & (1 << b) != 0).count() as u64
            };
            prop_assert_eq!(c.rows, rows.len() as u64);
            prop_assert_eq!(c.complete, rows.iter().filter(|r| r.2).count() as u64);
            prop_assert_eq!(c.streams(), distinct(|r| r.0));
            prop_assert_eq!(c.publishers(), distinct(|r| r.1));
            for b in 0..8 {
                prop_assert_eq!(c.flag(b), bit(|r| r.3, b));
                prop_assert_eq!(c.missing(b), bit(|r| r.4, b));
            }
            let keys = rows
                .iter()
                .map(|r| (r.1, r.0, r.5))
                .collect::<HashSet<_>>()
                .len() as u64;
            prop_assert_eq!(c.distinct_keys(), keys);
            prop_assert_eq!(c.repeated_keys(), rows.len() as u64 - keys);
        }
    }

    proptest! {
        /// One publisher's batches (the usual ones, filled a block's run of rows at a
        /// time): streams in turn or at random, sequences in order or not, repeats; the
        /// same keys and repeats as one key at a time.
        #[test]
        fn one_publishers_rows_count_as_key_by_key(
            streams in 1_u64..200,
            rounds in 1_u64..40,
            shuffle in any::<bool>(),
            repeats in prop::collection::vec(0_usize..8_000, 0..50),
            seed in any::<u64>(),
            split in 0_usize..8_000,
        ) {
            let mut keys: Vec<(u64, u64)> = (0..rounds)
                .flat_map(|q| (0..streams).map(move |s| (s, q + 10 * (s % 3))))
                .collect();
            for r in repeats {
                if let Some(&k) = keys.get(r) {
                    keys.push(k);
                }
            }
            if shuffle {
                // A fixed permutation from the seed.
                let n = keys.len();
                let mut x = seed | 1;
                for i in (1..n).rev() {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    keys.swap(i, (x % (i as u64 + 1)) as usize);
                }
            }
            let split = split.min(keys.len());
            let column = |v: Vec<u64>| PrimitiveArray::<UInt64Type>::from(v);
            let mut rows = KeySet::default();
            for part in [&keys[..split], &keys[split..]] {
                rows.insert_rows(
                    &column(vec![4; part.len()]),
                    &column(part.iter().map(|k| k.0).collect()),
                    &column(part.iter().map(|k| k.1).collect()),
                );
            }
            let mut one = KeySet::default();
            for &(s, q) in &keys {
                one.insert(4, s, q, Layout::default);
            }
            let distinct = keys.iter().collect::<HashSet<_>>().len() as u64;
            prop_assert_eq!((rows.keys, rows.repeated), (distinct, keys.len() as u64 - distinct));
            prop_assert_eq!(&rows, &one);
        }
    }

    /// Keys the index does not hold (a 65th publisher, a stream numbered 2^16 or more,
    /// blocks before a group's first one or 4096 blocks after it) go through the map,
    /// and every key is still counted once, whatever the order of rows, the layout of
    /// blocks and merges.
    #[test]
    fn keys_outside_the_index_count_once() {
        let mut keys: Vec<(u64, u64, u64)> = Vec::new();
        for p in 0..70 {
            keys.push((p, 1, 5));
        }
        for st in [0, 65_535, 65_536, u64::MAX] {
            keys.extend([(1, st, 10_000), (1, st, 3), (1, st, 10_000 + 4_096 * 4_096)]);
        }
        keys.extend([(2, 9, u64::MAX), (2, 9, 0), (2, 9, 1 << 40)]);
        let distinct = keys.iter().collect::<HashSet<_>>().len() as u64;
        for lanes in [(0, 0), (0, 6), (6, 6), (3, 1)] {
            // Each key twice: once in each of two sets filled in opposite orders.
            let (mut a, mut b) = (KeySet::default(), KeySet::default());
            for &(p, st, q) in &keys {
                a.insert(p, st, q, || Layout { lanes: lanes.0 });
            }
            for &(p, st, q) in keys.iter().rev() {
                b.insert(p, st, q, || Layout { lanes: lanes.1 });
            }
            assert_eq!((a.keys, a.repeated), (distinct, 0));
            assert_eq!(a, b);
            let mut out = Vec::new();
            b.encode(&mut out);
            a.merge(&KeySet::decode(&mut Reader::new(&out)).unwrap());
            assert_eq!((a.keys, a.repeated), (distinct, distinct), "{lanes:?}");
        }
    }

    /// A key's place in a block and back, in every layout, at the ends of the ranges.
    #[test]
    fn layouts_place_keys_and_read_them_back() {
        for lanes in 0..=MAX_LANES {
            let layout = Layout { lanes };
            for (s, q) in [
                (0, 0),
                (63, 4095),
                (u64::MAX, u64::MAX),
                (1 << 40, 3),
                (5, 1 << 50),
            ] {
                let (g, b, o) = layout.place(s, q);
                assert!(u64::from(o) < KEY_BLOCK && layout.holds(g, b));
                assert_eq!(layout.key(g, b, o), (s, q), "{lanes} {s} {q}");
            }
            assert!(!layout.holds(u64::MAX, u64::MAX));
        }
        // Streams side by side: 64 streams at one sequence set bits of one word.
        let six = Layout { lanes: 6 };
        let words: HashSet<(u64, u64, u16)> = (0..64)
            .map(|s| {
                let (g, b, o) = six.place(s, 77);
                (g, b, o >> 6)
            })
            .collect();
        assert_eq!(words.len(), 1);
        let lanes = |streams: &[u64]| Layout::for_streams(streams).lanes;
        assert_eq!(lanes(&[7, 7, 7]), 0);
        assert_eq!(lanes(&[0, 1, 2]), 2);
        assert_eq!(lanes(&[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]), 4);
        assert_eq!(lanes(&(0..3_000).rev().collect::<Vec<_>>()), 6);
        // Scattered numbers (hashes): a stream per block.
        assert_eq!(lanes(&[3, 1 << 20, 77_777, 1 << 31, u64::MAX]), 0);
        // Two dense runs far apart: still side by side.
        assert_eq!(
            lanes(&(0..64).chain(1 << 30..(1 << 30) + 64).collect::<Vec<_>>()),
            6
        );
    }

    /// Blocks fill whether a publisher's stream numbers are neighbours or scattered: about
    /// a bit per key either way, not a list of 64 keys per block.
    #[test]
    fn scattered_and_neighbouring_streams_fill_their_blocks() {
        let column = |v: Vec<u64>| PrimitiveArray::<UInt64Type>::from(v);
        for (streams, rounds, most_blocks) in [
            // 4 streams numbered like hashes, 100k sequences each: 25 blocks of 4096 each.
            (vec![3, 1 << 20, 77_777, 1 << 31], 100_000, 4 * 25),
            // 3000 streams from 0, 128 sequences each: 47 groups x 2 blocks of 64.
            ((0..3_000).collect::<Vec<u64>>(), 128, 47 * 2),
        ] {
            let mut set = KeySet::default();
            let keys: Vec<(u64, u64)> = (0..rounds)
                .flat_map(|q| streams.iter().map(move |&s| (s, q)))
                .collect();
            for batch in keys.chunks(8192) {
                set.insert_rows(
                    &column(vec![1; batch.len()]),
                    &column(batch.iter().map(|k| k.0).collect()),
                    &column(batch.iter().map(|k| k.1).collect()),
                );
            }
            assert_eq!((set.keys, set.repeated), (keys.len() as u64, 0));
            assert!(
                set.blocks.len() <= most_blocks,
                "{} blocks",
                set.blocks.len()
            );
            assert!(set.blocks.iter().all(|(_, b)| matches!(b, Block::Dense(_))));
        }
    }

    /// Key sets whose blocks turn into bitmaps merge block by block (or key by key
    /// between layouts), through their binary form, to the keys and repeats counted one
    /// by one; a malformed block or set is refused.
    #[test]
    fn dense_key_sets_merge_and_round_trip() {
        for lanes in [(0, 0), (0, 6), (6, 6), (2, 5)] {
            // Stream 7: sequences 0..9000 in one set, 4000..13000 (and 5000 twice) in the
            // other; stream 8: a few sparse ones in both.
            let (mut a, mut b) = (KeySet::default(), KeySet::default());
            let (la, lb) = (Layout { lanes: lanes.0 }, Layout { lanes: lanes.1 });
            let mut all: Vec<(u64, u64, u64)> = Vec::new();
            for q in 0..9_000 {
                a.insert(1, 7, q, || la);
                all.push((1, 7, q));
            }
            for q in (4_000..13_000).chain([5_000]) {
                b.insert(1, 7, q, || lb);
                all.push((1, 7, q));
            }
            for q in [3, 90, 4_095, 4_096] {
                a.insert(1, 8, q, || la);
                b.insert(1, 8, q, || lb);
                all.extend([(1, 8, q), (1, 8, q)]);
            }
            assert!(
                a.blocks.iter().any(|(_, b)| matches!(b, Block::Dense(_))) || lanes.0 > 0,
                "one stream fills bitmaps"
            );
            let decode = |s: &KeySet| {
                let mut out = Vec::new();
                s.encode(&mut out);
                let mut r = Reader::new(&out);
                let back = KeySet::decode(&mut r).unwrap();
                r.finish().unwrap();
                back
            };
            let mut merged = decode(&a);
            assert_eq!(merged, a);
            merged.merge(&decode(&b));
            let distinct = all.iter().collect::<HashSet<_>>().len() as u64;
            assert_eq!(merged.keys, distinct, "{lanes:?}");
            assert_eq!(merged.keys + merged.repeated, all.len() as u64);
            assert_eq!(merged.sorted_keys().len() as u64, distinct);
        }

        // A list whose offsets do not increase, a list too long, an unknown kind.
        let varints = |v: &[u64]| {
            let mut bytes = Vec::new();
            v.iter().for_each(|&v| put(&mut bytes, v));
            bytes
        };
        for bad in [vec![0, 2, 5, 0], vec![0, 300], vec![2]] {
            let bytes = varints(&bad);
            let block = Block::decode(&mut Reader::new(&bytes));
            assert_eq!(block, Err(DecodeError), "{bad:?}");
        }
        // Sets: 7 lanes; a publisher listed twice; a block of a publisher not listed
        // while the list has room; a block beyond 64-bit keys.
        for bad in [
            vec![0, 1, 4, 7, 0],
            vec![0, 2, 4, 1, 4, 1, 0],
            vec![0, 1, 4, 1, 1, 5, 0, 0, 0, 0],
            vec![0, 1, 4, 6, 1, 4, 0, u64::MAX, 0, 0],
        ] {
            let bytes = varints(&bad);
            let set = KeySet::decode(&mut Reader::new(&bytes));
            assert_eq!(set, Err(DecodeError), "{bad:?}");
        }
    }

    /// Through DataFusion, over the collector's column types, against its own aggregates.
    #[test]
    fn trace_counts_in_sql_agrees_with_the_standard_aggregates() {
        use datafusion::arrow::array::{StringArray, UInt8Array, UInt16Array, UInt32Array};
        use datafusion::arrow::datatypes::Schema;
        use datafusion::datasource::MemTable;
        use datafusion::prelude::{SessionConfig, SessionContext};

        let schema = Arc::new(Schema::new(vec![
            Field::new("stream", DataType::UInt32, false),
            Field::new("publisher", DataType::UInt16, true),
            Field::new("status", DataType::Utf8, false),
            Field::new("flags", DataType::UInt8, false),
            Field::new("missing_mask", DataType::UInt16, false),
            Field::new("sequence", DataType::UInt64, false),
        ]));
        let part = |seed: u32| {
            let n = 3_000_u32;
            let columns: Vec<ArrayRef> = vec![
                Arc::new(UInt32Array::from_iter_values((0..n).map(|i| {
                    (i * 7 + seed) % 101 + u32::from(i % 500 == 0) * 9_000_000
                }))),
                Arc::new(UInt16Array::from_iter(
                    (0..n).map(|i| (i % 13 != 0).then_some((i / 1_000 + seed) as u16)),
                )),
                Arc::new(StringArray::from_iter_values(
                    (0..n).map(|i| if i % 7 == 0 { "incomplete" } else { "complete" }),
                )),
                Arc::new(UInt8Array::from_iter_values(
                    (0..n).map(|i| (i % 5 == 0) as u8 * 3),
                )),
                Arc::new(UInt16Array::from_iter_values(
                    (0..n).map(|i| if i % 7 == 0 { 1 << (i % 6) } else { 0 }),
                )),
                // Rows 101 apart share their stream, and their sequence: keys repeat.
                Arc::new(UInt64Array::from_iter_values(
                    (0..n).map(|i| u64::from(i % 101)),
                )),
            ];
            datafusion::arrow::array::RecordBatch::try_new(schema.clone(), columns).unwrap()
        };
        let table = MemTable::try_new(schema.clone(), vec![vec![part(0)], vec![part(5)]]).unwrap();
        let ctx = SessionContext::new_with_config(SessionConfig::new().with_target_partitions(2));
        ctx.register_table("t", Arc::new(table)).unwrap();
        ctx.register_udaf(trace_counts_udaf());
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let q = "SELECT trace_counts(stream, publisher, status = 'complete', flags, missing_mask, sequence), \
                 count(*), count(DISTINCT stream), count(DISTINCT publisher), \
                 count(*) FILTER (WHERE status = 'complete'), \
                 count(*) FILTER (WHERE (flags & 1) <> 0), count(*) FILTER (WHERE (flags & 2) <> 0), \
                 count(*) FILTER (WHERE (missing_mask & 1) <> 0), \
                 count(*) FILTER (WHERE (missing_mask & 32) <> 0) FROM t";
        let batches = rt
            .block_on(async { ctx.sql(q).await?.collect().await })
            .unwrap();
        let b = &batches[0];
        let c = TraceCounts::decode(b.column(0).as_binary::<i32>().value(0)).unwrap();
        let n = |i: usize| b.column(i).as_primitive::<Int64Type>().value(0) as u64;
        assert_eq!(
            [c.rows, c.streams(), c.publishers(), c.complete],
            [n(1), n(2), n(3), n(4)]
        );
        assert_eq!(
            [c.flag(0), c.flag(1), c.missing(0), c.missing(5)],
            [n(5), n(6), n(7), n(8)]
        );
        assert!(c.missing(5) > 0 && c.flag(1) > 0 && c.streams() > 101);
        let keys = rt
            .block_on(async {
                ctx.sql(
                    "SELECT (SELECT count(*) FROM (SELECT DISTINCT publisher, stream, sequence \
                     FROM t WHERE publisher IS NOT NULL)) AS keys, \
                     (SELECT count(*) FROM t WHERE publisher IS NOT NULL) AS keyed",
                )
                .await?
                .collect()
                .await
            })
            .unwrap();
        let n = |i: usize| keys[0].column(i).as_primitive::<Int64Type>().value(0) as u64;
        assert_eq!(c.distinct_keys(), n(0));
        assert_eq!(c.repeated_keys(), n(1) - n(0));
        assert!(c.repeated_keys() > 0, "keys repeat");
    }
}
