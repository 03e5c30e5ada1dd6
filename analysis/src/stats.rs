//! The aggregates behind a report's single scan of a run.
//!
//! - `stage_stats(ns)` ([`stage_stats_udaf`]): everything a report says about one stage
//!   over a group of traces, as a [`SignedStats`] in its compact binary encoding: every
//!   value counted, negative ones (clock error) included and also counted apart, with
//!   their exact minimum, maximum and sum, their second moment (for the population
//!   standard deviation) and their HDR histograms (one per sign); NULLs ignored. It aggregates per group
//!   natively (DataFusion's `GroupsAccumulator`), and a batch whose rows belong to one
//!   group (time buckets are contiguous in a run's files) is added in a few tight passes.
//! - `trace_counts(stream, publisher, complete, flags, missing_mask, sequence)`
//!   ([`trace_counts_udaf`]): rows, complete rows, the rows with each bit of `flags` and of
//!   `missing_mask` set, the distinct streams and publishers, and the distinct trace keys
//!   (publisher, stream, sequence) with the rows that repeat one, as a [`TraceCounts`].
//!
//! Both return `Binary`; [`SignedStats::decode`] and [`TraceCounts::decode`] read it. The
//! encodings are this module's own and may change between versions: they are not for
//! storing.
//!
//! ```
//! use hoptrace_format::hist::SignedStats;
//! let mut s = SignedStats::default();
//! s.add_values(&[5, 7, -2, 9]);
//! assert_eq!((s.count, s.negative, s.min_ns(), s.max_ns()), (4, 1, Some(-2), Some(9)));
//! assert_eq!(s.mean_ns(), Some(4.75));
//! let back = SignedStats::decode(&s.encode()).unwrap();
//! assert_eq!(back, s);
//! ```

use std::collections::HashSet;
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BinaryArray, BinaryBuilder, BooleanArray, PrimitiveArray,
};
use datafusion::arrow::buffer::BooleanBuffer;
use datafusion::arrow::datatypes::{
    ArrowNativeType, ArrowPrimitiveType, DataType, Field, FieldRef, Int64Type, UInt8Type,
    UInt16Type, UInt32Type, UInt64Type,
};
use datafusion::common::{DataFusionError, Result, ScalarValue, exec_err, plan_err};
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, EmitTo, GroupsAccumulator, Signature, Volatility,
};
use hoptrace_format::hist::SignedStats;

/// First byte of an encoded [`TraceCounts`].
const COUNTS_TAG: u8 = 0x54;

fn corrupt(what: &str) -> DataFusionError {
    DataFusionError::Execution(format!("internal: malformed {what} state"))
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Reads what the `put_*` functions wrote.
struct Reader<'a> {
    bytes: &'a [u8],
    what: &'static str,
}

impl Reader<'_> {
    fn byte(&mut self) -> Result<u8> {
        let (&b, rest) = self.bytes.split_first().ok_or_else(|| corrupt(self.what))?;
        self.bytes = rest;
        Ok(b)
    }

    fn varint(&mut self) -> Result<u64> {
        let mut v = 0_u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            v |= u64::from(b & 0x7F) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(corrupt(self.what))
    }

    fn finish(&self) -> Result<()> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(corrupt(self.what))
        }
    }
}

/// Which rows of a batch count: valid, and passing the aggregate's FILTER if any.
fn kept_rows(values: &dyn Array, filter: Option<&BooleanArray>) -> Option<BooleanBuffer> {
    let valid = values.logical_nulls().map(|n| n.inner().clone());
    let passing = filter.map(|f| match f.nulls() {
        Some(n) => f.values() & n.inner(),
        None => f.values().clone(),
    });
    match (valid, passing) {
        (Some(a), Some(b)) => Some(&a & &b),
        (a, b) => a.or(b),
    }
}

/// Adds the rows `range` of `values` (those set in `kept`, when given) to `stats`: each
/// stretch of kept rows as a slice.
fn add_rows(
    stats: &mut SignedStats,
    values: &[i64],
    range: std::ops::Range<usize>,
    kept: Option<&BooleanBuffer>,
) {
    let slice = &values[range.clone()];
    match kept.map(|k| k.slice(range.start, range.len())) {
        Some(kept) if kept.count_set_bits() < slice.len() => {
            for (start, end) in kept.set_slices() {
                stats.add_values(&slice[start..end]);
            }
        }
        _ => stats.add_values(slice),
    }
}

/// Adds a batch of values, grouped by `groups` (one group index per row), to `stats`:
/// each run of consecutive rows of one group is added as a slice.
fn add_grouped(
    stats: &mut [SignedStats],
    values: &ArrayRef,
    groups: &[usize],
    filter: Option<&BooleanArray>,
) {
    let array = values.as_primitive::<Int64Type>();
    let kept = kept_rows(array, filter);
    let raw = array.values().as_ref();
    // Rows grouped by time bucket: most batches are one group.
    if let Some(&g) = groups.first()
        && groups
            .chunks(256)
            .all(|c| c.iter().fold(true, |all, &x| all & (x == g)))
    {
        add_rows(&mut stats[g], raw, 0..groups.len(), kept.as_ref());
        return;
    }
    let mut start = 0;
    while let Some(&g) = groups.get(start) {
        let end = groups[start..]
            .iter()
            .position(|&x| x != g)
            .map_or(groups.len(), |n| start + n);
        add_rows(&mut stats[g], raw, start..end, kept.as_ref());
        start = end;
    }
}

fn binary_of<'a>(items: impl Iterator<Item = &'a SignedStats>) -> ArrayRef {
    let mut b = BinaryBuilder::new();
    for s in items {
        b.append_value(s.encode());
    }
    Arc::new(b.finish())
}

/// `stage_stats(ns)`.
#[derive(Debug, PartialEq, Eq, Hash)]
struct SignedStatsAgg {
    signature: Signature,
}

/// The `stage_stats` aggregate (not registered in sessions: its result is this module's
/// own encoding, read with [`SignedStats::decode`]).
#[must_use]
pub fn stage_stats_udaf() -> AggregateUDF {
    AggregateUDF::from(SignedStatsAgg {
        signature: Signature::user_defined(Volatility::Immutable),
    })
}

impl AggregateUDFImpl for SignedStatsAgg {
    fn name(&self) -> &str {
        "stage_stats"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        match arg_types {
            [t] => Ok(vec![crate::hdr::coerce_ns(self.name(), t)?]),
            _ => plan_err!("stage_stats takes one argument"),
        }
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Binary)
    }

    fn accumulator(&self, _args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        Ok(Box::new(SignedStatsAccumulator::default()))
    }

    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        Ok(vec![Arc::new(Field::new(
            format!("{}_stats", args.name),
            DataType::Binary,
            true,
        ))])
    }

    fn groups_accumulator_supported(&self, _args: AccumulatorArgs) -> bool {
        true
    }

    fn create_groups_accumulator(
        &self,
        _args: AccumulatorArgs,
    ) -> Result<Box<dyn GroupsAccumulator>> {
        Ok(Box::new(SignedStatsGroups::default()))
    }
}

#[derive(Debug, Default)]
struct SignedStatsAccumulator {
    stats: SignedStats,
}

impl Accumulator for SignedStatsAccumulator {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        if let Some(v) = values.first() {
            let array = v.as_primitive::<Int64Type>();
            let kept = kept_rows(array, None);
            add_rows(
                &mut self.stats,
                array.values(),
                0..array.len(),
                kept.as_ref(),
            );
        }
        Ok(())
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        Ok(ScalarValue::Binary(Some(self.stats.encode())))
    }

    fn size(&self) -> usize {
        std::mem::size_of_val(self) + self.stats.allocated_bytes()
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        Ok(vec![self.evaluate()?])
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        if let Some(s) = states.first() {
            for bytes in s.as_binary::<i32>().iter().flatten() {
                self.stats
                    .merge(&SignedStats::decode(bytes).map_err(|_| corrupt("stage_stats"))?);
            }
        }
        Ok(())
    }
}

/// `stage_stats` of every group at once.
#[derive(Debug, Default)]
struct SignedStatsGroups {
    groups: Vec<SignedStats>,
}

impl SignedStatsGroups {
    fn emit(&mut self, emit_to: EmitTo) -> ArrayRef {
        let taken = emit_to.take_needed(&mut self.groups);
        binary_of(taken.iter())
    }
}

impl GroupsAccumulator for SignedStatsGroups {
    fn update_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        opt_filter: Option<&BooleanArray>,
        total_num_groups: usize,
    ) -> Result<()> {
        self.groups
            .resize_with(total_num_groups, SignedStats::default);
        if let Some(v) = values.first() {
            add_grouped(&mut self.groups, v, group_indices, opt_filter);
        }
        Ok(())
    }

    fn evaluate(&mut self, emit_to: EmitTo) -> Result<ArrayRef> {
        Ok(self.emit(emit_to))
    }

    fn state(&mut self, emit_to: EmitTo) -> Result<Vec<ArrayRef>> {
        Ok(vec![self.emit(emit_to)])
    }

    fn merge_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        total_num_groups: usize,
    ) -> Result<()> {
        self.groups
            .resize_with(total_num_groups, SignedStats::default);
        let Some(states) = values.first() else {
            return Ok(());
        };
        let states: &BinaryArray = states.as_binary::<i32>();
        for (bytes, &g) in states.iter().zip(group_indices) {
            if let Some(bytes) = bytes {
                self.groups[g]
                    .merge(&SignedStats::decode(bytes).map_err(|_| corrupt("stage_stats"))?);
            }
        }
        Ok(())
    }

    fn convert_to_state(
        &self,
        values: &[ArrayRef],
        opt_filter: Option<&BooleanArray>,
    ) -> Result<Vec<ArrayRef>> {
        let Some(v) = values.first() else {
            return plan_err!("stage_stats takes one argument");
        };
        let array = v.as_primitive::<Int64Type>();
        let kept = kept_rows(array, opt_filter);
        let rows = (0..array.len()).map(|i| {
            let mut s = SignedStats::default();
            if kept.as_ref().is_none_or(|k| k.value(i)) {
                s.add_values(&[array.value(i)]);
            }
            s
        });
        let mut b = BinaryBuilder::new();
        for s in rows {
            b.append_value(s.encode());
        }
        Ok(vec![Arc::new(b.finish())])
    }

    fn size(&self) -> usize {
        // Groups are few (time buckets): summing them per batch is cheap.
        self.groups.capacity() * std::mem::size_of::<SignedStats>()
            + self
                .groups
                .iter()
                .map(SignedStats::allocated_bytes)
                .sum::<usize>()
    }
}

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
        put_varint(out, ids.len() as u64);
        let mut prev = 0;
        for id in ids {
            put_varint(out, id - prev);
            prev = id;
        }
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self> {
        let n = r.varint()?;
        let mut set = Self::default();
        let mut id = 0_u64;
        for _ in 0..n {
            id = id.checked_add(r.varint()?).ok_or_else(|| corrupt(r.what))?;
            set.insert(id);
        }
        Ok(set)
    }
}

/// Sequences per block of a [`KeySet`].
const KEY_BLOCK: u64 = 4096;
/// A block's sequences are listed until they are this many, then a bitmap (512 bytes).
const SPARSE_MAX: usize = 256;

/// The sequences of one block of a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Block {
    /// Sorted offsets within the block.
    Sparse(Vec<u16>),
    /// One bit per offset.
    Dense(Box<[u64; (KEY_BLOCK / 64) as usize]>),
}

impl Block {
    /// Adds offset `o`; `false` when it was there.
    fn insert(&mut self, o: u16) -> bool {
        match self {
            Self::Sparse(v) => match v.binary_search(&o) {
                Ok(_) => false,
                Err(at) => {
                    v.insert(at, o);
                    if v.len() > SPARSE_MAX {
                        let mut bits = Box::new([0u64; (KEY_BLOCK / 64) as usize]);
                        for &x in v.iter() {
                            bits[usize::from(x >> 6)] |= 1 << (x & 63);
                        }
                        *self = Self::Dense(bits);
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

    fn offsets(&self) -> Vec<u16> {
        match self {
            Self::Sparse(v) => v.clone(),
            Self::Dense(bits) => (0..KEY_BLOCK as u16)
                .filter(|o| bits[usize::from(o >> 6)] & (1 << (o & 63)) != 0)
                .collect(),
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Self::Sparse(v) => v.capacity() * 2,
            Self::Dense(_) => (KEY_BLOCK / 8) as usize,
        }
    }
}

/// The distinct trace keys (publisher, stream, sequence) of the rows, and how many rows
/// repeated a key already seen. A stream's sequences are dense (0, 1, 2, ...), so they
/// are kept as bitmaps of 4096 sequences, listed while a block holds few: about one bit
/// per key, in any order of rows, files or partitions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct KeySet {
    blocks: std::collections::HashMap<(u64, u64, u64), Block>,
    keys: u64,
    repeated: u64,
}

impl KeySet {
    #[inline]
    fn insert(&mut self, publisher: u64, stream: u64, sequence: u64) {
        let o = u16::try_from(sequence % KEY_BLOCK).expect("below the block size");
        let fresh = self
            .blocks
            .entry((publisher, stream, sequence / KEY_BLOCK))
            .or_insert_with(|| Block::Sparse(Vec::new()))
            .insert(o);
        if fresh {
            self.keys += 1;
        } else {
            self.repeated += 1;
        }
    }

    fn merge(&mut self, other: &Self) {
        self.repeated += other.repeated;
        for (&(p, st, b), block) in &other.blocks {
            for o in block.offsets() {
                self.insert(p, st, b * KEY_BLOCK + u64::from(o));
            }
        }
    }

    fn bytes(&self) -> usize {
        self.blocks.capacity() * 48 + self.blocks.values().map(Block::bytes).sum::<usize>()
    }

    fn encode(&self, out: &mut Vec<u8>) {
        put_varint(out, self.repeated);
        put_varint(out, self.blocks.len() as u64);
        for (&(p, st, b), block) in &self.blocks {
            for v in [p, st, b] {
                put_varint(out, v);
            }
            let offsets = block.offsets();
            put_varint(out, offsets.len() as u64);
            let mut prev = 0;
            for o in offsets {
                put_varint(out, u64::from(o - prev));
                prev = o;
            }
        }
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self> {
        let repeated = r.varint()?;
        let mut set = Self::default();
        for _ in 0..r.varint()? {
            let (p, st, b) = (r.varint()?, r.varint()?, r.varint()?);
            let n = r.varint()?;
            if n > KEY_BLOCK {
                return Err(corrupt(r.what));
            }
            let mut o = 0u64;
            for _ in 0..n {
                o += r.varint()?;
                if o >= KEY_BLOCK {
                    return Err(corrupt(r.what));
                }
                let base = b.checked_mul(KEY_BLOCK).ok_or_else(|| corrupt(r.what))?;
                set.insert(p, st, base + o);
            }
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
        for &v in raw.iter() {
            let v = to_u64(v);
            words[(v >> 6) as usize] |= 1 << (v & 63);
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

    fn update(&mut self, cols: &[ArrayRef]) -> Result<()> {
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
        for i in 0..q.len() {
            if p.is_valid(i) && st.is_valid(i) && q.is_valid(i) {
                self.keys.insert(p.value(i), st.value(i), q.value(i));
            }
        }
        Ok(())
    }

    fn merge(&mut self, other: &Self) {
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
        put_varint(&mut out, self.rows);
        put_varint(&mut out, self.complete);
        for bits in [&self.flag_bits, &self.missing_bits] {
            put_varint(&mut out, bits.len() as u64);
            bits.iter().for_each(|&b| put_varint(&mut out, b));
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
        let mut r = Reader {
            bytes,
            what: "trace_counts",
        };
        if r.byte()? != COUNTS_TAG {
            return Err(corrupt(r.what));
        }
        let rows = r.varint()?;
        let complete = r.varint()?;
        let mut bits = || -> Result<Vec<u64>> {
            let n = r.varint()?;
            if n > 64 {
                return Err(corrupt(r.what));
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

/// `trace_counts(stream, publisher, complete, flags, missing_mask, sequence)`.
#[derive(Debug, PartialEq, Eq, Hash)]
struct TraceCountsAgg {
    signature: Signature,
}

/// The `trace_counts` aggregate (not registered in sessions: its result is this module's
/// own encoding, read with [`TraceCounts::decode`]).
#[must_use]
pub fn trace_counts_udaf() -> AggregateUDF {
    AggregateUDF::from(TraceCountsAgg {
        signature: Signature::user_defined(Volatility::Immutable),
    })
}

impl AggregateUDFImpl for TraceCountsAgg {
    fn name(&self) -> &str {
        "trace_counts"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
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

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Binary)
    }

    fn accumulator(&self, _args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        Ok(Box::new(TraceCountsAccumulator::default()))
    }

    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        Ok(vec![Arc::new(Field::new(
            format!("{}_counts", args.name),
            DataType::Binary,
            true,
        ))])
    }
}

#[derive(Debug, Default)]
struct TraceCountsAccumulator {
    counts: TraceCounts,
}

impl Accumulator for TraceCountsAccumulator {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        self.counts.update(values)
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        Ok(ScalarValue::Binary(Some(self.counts.encode())))
    }

    fn size(&self) -> usize {
        let set = |s: &IdSet| match s {
            IdSet::Bits(w) => w.capacity() * 8,
            IdSet::Hashed(h) => h.capacity() * 16,
        };
        std::mem::size_of_val(self)
            + set(&self.counts.streams)
            + set(&self.counts.publishers)
            + self.counts.keys.bytes()
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        Ok(vec![self.evaluate()?])
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        if let Some(s) = states.first() {
            for bytes in s.as_binary::<i32>().iter().flatten() {
                self.counts.merge(&TraceCounts::decode(bytes)?);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::{Int64Array, UInt64Array};
    use hoptrace_format::hist::{HdrCounts, MAX_TRACKABLE_NS};
    use proptest::prelude::*;

    use super::*;

    /// The figures of `values` computed the plain way.
    fn oracle(values: &[i64]) -> SignedStats {
        let (mut pos, mut neg) = (HdrCounts::new(), HdrCounts::new());
        for &v in values {
            if v < 0 {
                neg.record(v.unsigned_abs());
            } else {
                pos.record(v as u64);
            }
        }
        let sum: i128 = values.iter().map(|&v| i128::from(v)).sum();
        let mean = sum as f64 / values.len().max(1) as f64;
        SignedStats {
            count: values.len() as u64,
            negative: values.iter().filter(|&&v| v < 0).count() as u64,
            clamped: values
                .iter()
                .filter(|&&v| v.unsigned_abs() > MAX_TRACKABLE_NS)
                .count() as u64,
            min: values.iter().copied().min().unwrap_or(i64::MAX),
            max: values.iter().copied().max().unwrap_or(i64::MIN),
            sum,
            m2: values.iter().map(|&v| (v as f64 - mean).powi(2)).sum(),
            pos,
            neg,
        }
    }

    fn assert_same(got: &SignedStats, want: &SignedStats) {
        assert_eq!(
            (got.count, got.negative, got.clamped, got.sum),
            (want.count, want.negative, want.clamped, want.sum)
        );
        assert_eq!((got.min_ns(), got.max_ns()), (want.min_ns(), want.max_ns()));
        assert_eq!((&got.pos, &got.neg), (&want.pos, &want.neg));
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(b.abs()) + 1e-6;
        assert!(close(got.m2, want.m2), "m2 {} vs {}", got.m2, want.m2);
        assert_eq!(got.mean_ns(), want.mean_ns());
    }

    /// Latency-like values: mostly small, some negative, some beyond the histogram.
    fn value() -> impl Strategy<Value = Option<i64>> {
        prop_oneof![
            8 => (0_i64..50_000_000).prop_map(Some),
            1 => (-5_000_i64..0).prop_map(Some),
            1 => Just(None),
            1 => prop_oneof![
                Just(i64::MAX),
                (MAX_TRACKABLE_NS as i64..i64::MAX).prop_map(|v| v),
                Just(0_i64),
            ]
            .prop_map(Some),
        ]
    }

    /// Rows as (group, value, passes the filter).
    fn rows() -> impl Strategy<Value = Vec<(usize, Option<i64>, bool)>> {
        prop::collection::vec((0_usize..4, value(), prop::bool::weighted(0.9)), 0..300)
    }

    /// The expected figures per group of `rows` (of the rows passing the filter when
    /// `filtered`).
    fn expected(rows: &[(usize, Option<i64>, bool)], filtered: bool) -> Vec<SignedStats> {
        (0..4)
            .map(|g| {
                let v: Vec<i64> = rows
                    .iter()
                    .filter(|r| r.0 == g && (r.2 || !filtered))
                    .filter_map(|r| r.1)
                    .collect();
                oracle(&v)
            })
            .collect()
    }

    fn feed(acc: &mut SignedStatsGroups, rows: &[(usize, Option<i64>, bool)], filtered: bool) {
        for chunk in rows.chunks(37) {
            let values: ArrayRef = Arc::new(Int64Array::from_iter(chunk.iter().map(|r| r.1)));
            let groups: Vec<usize> = chunk.iter().map(|r| r.0).collect();
            let filter = BooleanArray::from_iter(chunk.iter().map(|r| Some(r.2)));
            acc.update_batch(&[values], &groups, filtered.then_some(&filter), 4)
                .unwrap();
        }
    }

    fn decode_all(array: &ArrayRef) -> Vec<SignedStats> {
        array
            .as_binary::<i32>()
            .iter()
            .map(|b| SignedStats::decode(b.unwrap()).unwrap())
            .collect()
    }

    proptest! {
        #[test]
        fn groups_get_the_figures_of_their_values(
            mut rows in rows(),
            sorted in any::<bool>(),
            filtered in any::<bool>(),
        ) {
            if sorted {
                rows.sort_by_key(|r| r.0);
            }
            let mut acc = SignedStatsGroups::default();
            feed(&mut acc, &rows, filtered);
            let got = decode_all(&acc.evaluate(EmitTo::All).unwrap());
            for (g, w) in got.iter().zip(expected(&rows, filtered)) {
                assert_same(g, &w);
            }
        }

        #[test]
        fn partial_states_merge_to_the_whole(rows in rows(), split in 0_usize..300) {
            let split = split.min(rows.len());
            let (mut a, mut b) = (SignedStatsGroups::default(), SignedStatsGroups::default());
            feed(&mut a, &rows[..split], false);
            feed(&mut b, &rows[split..], false);
            let mut fin = SignedStatsGroups::default();
            for part in [&mut a, &mut b] {
                let state = part.state(EmitTo::All).unwrap();
                let n = state[0].len();
                fin.merge_batch(&state, &(0..n).collect::<Vec<_>>(), 4).unwrap();
            }
            // Rows converted one by one to states merge to the same figures.
            let mut each = SignedStatsGroups::default();
            let values: ArrayRef = Arc::new(Int64Array::from_iter(rows.iter().map(|r| r.1)));
            let state = each.convert_to_state(&[values], None).unwrap();
            let groups: Vec<usize> = rows.iter().map(|r| r.0).collect();
            each.merge_batch(&state, &groups, 4).unwrap();
            let want = expected(&rows, false);
            for acc in [&mut fin, &mut each] {
                let got = decode_all(&acc.evaluate(EmitTo::All).unwrap());
                for (g, w) in got.iter().zip(&want) {
                    assert_same(g, w);
                }
            }
        }

        #[test]
        fn stage_stats_encode_and_decode(values in prop::collection::vec(value(), 0..200)) {
            let values: Vec<i64> = values.into_iter().flatten().collect();
            let mut s = SignedStats::default();
            s.add_values(&values);
            let bytes = s.encode();
            prop_assert_eq!(SignedStats::decode(&bytes).unwrap(), s);
            // Damaged states are refused or read, never a panic.
            for cut in 0..bytes.len() {
                let _ = SignedStats::decode(&bytes[..cut]);
            }
            prop_assert!(SignedStats::decode(&[0x00]).is_err());
        }

        #[test]
        fn trace_counts_count_and_round_trip(
            rows in prop::collection::vec(
                (
                    prop_oneof![0_u64..5_000, 0_u64..u64::MAX],
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
            a.update(&batch(&rows[..split])).unwrap();
            b.update(&batch(&rows[split..])).unwrap();
            let mut c = TraceCounts::decode(&a.encode()).unwrap();
            c.merge(&TraceCounts::decode(&b.encode()).unwrap());
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

    #[test]
    fn one_batch_of_one_group_matches_the_plain_figures() {
        let values: Vec<i64> = (0..100_000_i64)
            .map(|i| (i * 7_919) % 3_000_000 + i % 13)
            .chain([-1, -50, i64::MAX, MAX_TRACKABLE_NS as i64 + 1])
            .collect();
        let mut s = SignedStats::default();
        for chunk in values.chunks(8192) {
            s.add_values(chunk);
        }
        assert_same(&s, &oracle(&values));
        let exact_mean = s.sum as f64 / s.count as f64;
        assert_eq!(s.mean_ns(), Some(exact_mean));
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

    /// Through DataFusion: grouped (partial and final aggregation over two partitions)
    /// and not, against its own aggregates.
    #[test]
    fn stage_stats_in_sql_agrees_with_the_standard_aggregates() {
        use datafusion::arrow::datatypes::Schema;
        use datafusion::datasource::MemTable;
        use datafusion::prelude::{SessionConfig, SessionContext};

        let schema = Arc::new(Schema::new(vec![
            Field::new("g", DataType::Int64, false),
            Field::new("d", DataType::Int64, true),
        ]));
        let part = |seed: i64| {
            let g = Int64Array::from_iter_values((0..5_000).map(|i| (i + seed) / 1_300));
            let d = Int64Array::from_iter((0..5_000_i64).map(|i| {
                let x = (i * 2_654_435_761 + seed) % 10_000_019;
                (x % 17 != 0).then_some(x - 100_000)
            }));
            datafusion::arrow::array::RecordBatch::try_new(
                schema.clone(),
                vec![Arc::new(g), Arc::new(d)],
            )
            .unwrap()
        };
        let table = MemTable::try_new(schema.clone(), vec![vec![part(0)], vec![part(7)]]).unwrap();
        let ctx = SessionContext::new_with_config(SessionConfig::new().with_target_partitions(2));
        ctx.register_table("t", Arc::new(table)).unwrap();
        ctx.register_udaf(stage_stats_udaf());
        crate::hdr::register(&ctx);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        // Every value counts, negative ones included.
        let q = "SELECT g, stage_stats(d) AS s, count(d) AS n, \
                 count(d) FILTER (WHERE d < 0) AS neg, min(d) AS lo, max(d) AS hi, \
                 avg(CAST(d AS DOUBLE)) AS mean, stddev_pop(CAST(d AS DOUBLE)) AS sd, \
                 hdr_percentile(d, 0.99) AS p99 FROM t GROUP BY g \
                 UNION ALL \
                 SELECT -1, stage_stats(d), count(d), count(d) FILTER (WHERE d < 0), min(d), \
                 max(d), avg(CAST(d AS DOUBLE)), stddev_pop(CAST(d AS DOUBLE)), \
                 hdr_percentile(d, 0.99) FROM t";
        let batches = rt
            .block_on(async { ctx.sql(q).await?.collect().await })
            .unwrap();
        let mut seen = 0;
        for b in &batches {
            let int = |i: usize, r: usize| {
                let c = b.column(i);
                ScalarValue::try_from_array(c, r).unwrap()
            };
            for r in 0..b.num_rows() {
                let s = SignedStats::decode(b.column(1).as_binary::<i32>().value(r)).unwrap();
                assert_eq!(int(2, r), ScalarValue::Int64(Some(s.count as i64)));
                assert_eq!(int(3, r), ScalarValue::Int64(Some(s.negative as i64)));
                assert_eq!(int(4, r), ScalarValue::Int64(s.min_ns()));
                assert_eq!(int(5, r), ScalarValue::Int64(s.max_ns()));
                let ScalarValue::Float64(Some(mean)) = int(6, r) else {
                    panic!("no mean")
                };
                let ScalarValue::Float64(Some(sd)) = int(7, r) else {
                    panic!("no stddev")
                };
                assert!((s.mean_ns().unwrap() - mean).abs() <= 1e-9 * mean.abs());
                assert!((s.stddev_ns().unwrap() - sd).abs() <= 1e-9 * sd.abs());
                assert_eq!(
                    int(8, r),
                    ScalarValue::Int64(s.percentile(0.99).map(|p| p.value_ns))
                );
                seen += 1;
            }
        }
        assert_eq!(seen, 5, "4 groups and the whole");
    }
}
