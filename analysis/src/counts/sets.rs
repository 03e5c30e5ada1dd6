//! The sets `trace_counts` keeps: ids (a bitmap while they are small, a hash set beyond)
//! and trace keys (publisher, stream, sequence) in blocks of bits, with their encodings.

use std::collections::HashSet;

use datafusion::arrow::array::{Array, PrimitiveArray};
use datafusion::arrow::datatypes::UInt64Type;
use datafusion::common::Result;
use hoptrace_format::varint::{DecodeError, Reader, put};

/// A set of ids: a bitmap while they are small, a hash set beyond.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum IdSet {
    Bits(Vec<u64>),
    Hashed(HashSet<u64>),
}

/// Ids below this are kept in a bitmap (at most 512 KiB).
pub(super) const BITMAP_IDS: u64 = 1 << 22;

impl Default for IdSet {
    fn default() -> Self {
        Self::Bits(Vec::new())
    }
}

impl IdSet {
    #[inline]
    pub(super) fn insert(&mut self, id: u64) {
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

    pub(super) fn len(&self) -> u64 {
        match self {
            Self::Bits(words) => words.iter().map(|w| u64::from(w.count_ones())).sum(),
            Self::Hashed(set) => set.len() as u64,
        }
    }

    /// The ids, in ascending order for a bitmap.
    pub(super) fn ids(&self) -> Box<dyn Iterator<Item = u64> + '_> {
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

    pub(super) fn merge(&mut self, other: &Self) {
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

    pub(super) fn encode(&self, out: &mut Vec<u8>) {
        let mut ids: Vec<u64> = self.ids().collect();
        ids.sort_unstable();
        put(out, ids.len() as u64);
        let mut prev = 0;
        for id in ids {
            put(out, id - prev);
            prev = id;
        }
    }

    pub(super) fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
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
pub(super) const KEY_BLOCK: u64 = 1 << KEY_BLOCK_BITS;
/// Bits of a block's offsets.
pub(super) const KEY_BLOCK_BITS: u32 = 12;
/// Words of a block's bitmap.
pub(super) const BLOCK_WORDS: usize = (KEY_BLOCK / 64) as usize;
/// A block's keys are listed until they are this many, then a bitmap (512 bytes).
pub(super) const SPARSE_MAX: usize = 256;

/// The keys of one block of a [`KeySet`], by their offsets in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Block {
    /// Sorted offsets within the block.
    Sparse(Vec<u16>),
    /// One bit per offset.
    Dense(Box<[u64; BLOCK_WORDS]>),
}

impl Block {
    pub(super) fn new() -> Self {
        Self::Sparse(Vec::with_capacity(16))
    }

    /// The bitmap of the listed offsets `v`.
    pub(super) fn bitmap(v: &[u16]) -> Box<[u64; BLOCK_WORDS]> {
        let mut bits = Box::new([0u64; BLOCK_WORDS]);
        for &x in v {
            bits[usize::from(x >> 6)] |= 1 << (x & 63);
        }
        bits
    }

    /// Adds offset `o`; `false` when it was there.
    pub(super) fn insert(&mut self, o: u16) -> bool {
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
    pub(super) fn insert_all(&mut self, mut offsets: impl Iterator<Item = u16>) -> u64 {
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
    pub(super) fn len(&self) -> u64 {
        match self {
            Self::Sparse(v) => v.len() as u64,
            Self::Dense(bits) => bits.iter().map(|w| u64::from(w.count_ones())).sum(),
        }
    }

    /// Adds `other`'s offsets: (offsets new here, offsets already here).
    pub(super) fn union(&mut self, other: &Self) -> (u64, u64) {
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

    pub(super) fn offsets(&self) -> Vec<u16> {
        match self {
            Self::Sparse(v) => v.clone(),
            Self::Dense(bits) => (0..KEY_BLOCK as u16)
                .filter(|o| bits[usize::from(o >> 6)] & (1 << (o & 63)) != 0)
                .collect(),
        }
    }

    /// A list (0, the count, the offsets' differences) or a bitmap (1, 64 words).
    pub(super) fn encode(&self, out: &mut Vec<u8>) {
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

    pub(super) fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
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
pub(super) struct KeyHasher(u64);

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
pub(super) struct KeyHashing(u64);

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
pub(super) const MAX_LANES: u32 = 6;

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
pub(super) struct Layout {
    pub(super) lanes: u32,
}

impl Layout {
    /// The widest layout (up to 2^[`MAX_LANES`] lanes) whose lanes `streams` fill more
    /// than half of: neighbouring stream numbers (0, 1, 2, ...) side by side, scattered
    /// ones (hashes, say) one per block, where a block with one lane used of 64 would
    /// hold 64 keys and stay a list.
    pub(super) fn for_streams(streams: &[u64]) -> Self {
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
    pub(super) fn depth(self) -> u32 {
        KEY_BLOCK_BITS - self.lanes
    }

    /// The place of key (`stream`, `sequence`): (stream group, block of the group,
    /// offset in the block).
    #[inline]
    pub(super) fn place(self, stream: u64, sequence: u64) -> (u64, u64, u16) {
        let lane = stream & ((1 << self.lanes) - 1);
        let row = sequence & ((1 << self.depth()) - 1);
        let offset = u16::try_from((row << self.lanes) | lane).expect("below the block size");
        (stream >> self.lanes, sequence >> self.depth(), offset)
    }

    /// Whether block `block` of stream group `group` holds 64-bit keys only.
    pub(super) fn holds(self, group: u64, block: u64) -> bool {
        group <= u64::MAX >> self.lanes && block <= u64::MAX >> self.depth()
    }

    /// The key (stream, sequence) at `offset` of block `block` of stream group `group`
    /// (a place [`Layout::holds`]).
    pub(super) fn key(self, group: u64, block: u64, offset: u16) -> (u64, u64) {
        let o = u64::from(offset);
        (
            (group << self.lanes) | (o & ((1 << self.lanes) - 1)),
            (block << self.depth()) | (o >> self.lanes),
        )
    }
}

/// Stream numbers below this are found by index; others through the map.
pub(super) const DIRECT_STREAMS: u64 = 1 << 16;
/// A stream group's index reaches this many blocks from its first one, or twice the
/// blocks it holds if more; blocks beyond go through the map (so keys scattered far
/// apart cannot make an index larger than the blocks themselves).
pub(super) const DIRECT_SPAN: usize = 4096;
/// Publishers found by index; more go through the map.
pub(super) const DIRECT_PUBLISHERS: usize = 64;
/// An empty slot of an index.
pub(super) const NO_BLOCK: usize = usize::MAX;

/// The blocks of one stream group found by index: block `base + i` is the key set's
/// block `slots[i]`.
#[derive(Debug, Clone, Default)]
pub(super) struct Group {
    pub(super) base: u64,
    pub(super) slots: Vec<usize>,
    /// Slots that are not empty.
    pub(super) held: usize,
}

/// A publisher whose stream groups are found by index.
#[derive(Debug, Clone)]
pub(super) struct Publisher {
    pub(super) id: u64,
    pub(super) layout: Layout,
    pub(super) groups: Vec<Group>,
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
pub(super) struct KeySet {
    /// Up to [`DIRECT_PUBLISHERS`], in the order first seen, with their layouts; others
    /// have the default one.
    pub(super) publishers: Vec<Publisher>,
    /// Every block with its key (publisher, stream group, block of the group).
    pub(super) blocks: Vec<((u64, u64, u64), Block)>,
    /// Where the blocks outside the publishers' indexes are.
    pub(super) other: std::collections::HashMap<(u64, u64, u64), usize, KeyHashing>,
    /// Slots of all indexes.
    pub(super) slots: usize,
    pub(super) keys: u64,
    pub(super) repeated: u64,
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
    pub(super) fn publisher(
        &mut self,
        p: u64,
        layout: impl FnOnce() -> Layout,
    ) -> (Layout, Option<usize>) {
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
    pub(super) fn layout_of(&self, p: u64) -> Layout {
        self.publishers
            .iter()
            .find(|d| d.id == p)
            .map_or_else(Layout::default, |d| d.layout)
    }

    /// Where block `block` of stream group `group` of publisher `p` (at place `at` of
    /// the index) is in `blocks`, added empty when new.
    pub(super) fn block_at(&mut self, p: u64, at: Option<usize>, group: u64, block: u64) -> usize {
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
    pub(super) fn insert_at(&mut self, at: usize, o: u16) {
        if self.blocks[at].1.insert(o) {
            self.keys += 1;
        } else {
            self.repeated += 1;
        }
    }

    /// Adds key (`publisher`, `stream`, `sequence`); a publisher seen for the first time
    /// takes `layout()`.
    pub(super) fn insert(
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
    pub(super) fn insert_rows(
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
    pub(super) fn add_block(
        &mut self,
        (p, g, b): (u64, u64, u64),
        at: Option<usize>,
        block: Block,
    ) {
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
    pub(super) fn merge(&mut self, other: &Self) {
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
    pub(super) fn sorted_keys(&self) -> Vec<(u64, u64, u64)> {
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
    pub(super) fn bytes(&self) -> usize {
        self.blocks.capacity() * std::mem::size_of::<((u64, u64, u64), Block)>()
            + self.blocks.len() * (KEY_BLOCK / 8) as usize
            + self.slots * std::mem::size_of::<usize>()
            + self.other.capacity() * 64
    }

    /// The repeats, the publishers with their layouts, then every block with its key.
    pub(super) fn encode(&self, out: &mut Vec<u8>) {
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

    pub(super) fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
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
