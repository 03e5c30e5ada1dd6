//! The aggregates behind a report's single scan of a run.
//!
//! - `stage_stats(ns)` ([`stage_stats_udaf`]): everything a report says about one stage
//!   over a group of traces, as a [`StageStats`] in a compact binary encoding: the
//!   values >= 0 counted, with their exact minimum, maximum and sum, their second moment
//!   (for the population standard deviation) and their HDR histogram ([`HdrCounts`]);
//!   values < 0 (clock error) counted apart; NULLs ignored. It aggregates per group
//!   natively (DataFusion's `GroupsAccumulator`), and a batch whose rows belong to one
//!   group (time buckets are contiguous in a run's files) is added in a few tight passes.
//! - `trace_counts(stream, publisher, complete, flags, missing_mask)`
//!   ([`trace_counts_udaf`]): rows, complete rows, the rows with each bit of `flags` and of
//!   `missing_mask` set, and the distinct streams and publishers, as a [`TraceCounts`].
//!
//! Both return `Binary`; [`StageStats::decode`] and [`TraceCounts::decode`] read it. The
//! encodings are this module's own and may change between versions: they are not for
//! storing.
//!
//! ```
//! use hoptrace_analysis::stats::StageStats;
//! let mut s = StageStats::default();
//! s.add_values(&[5, 7, -2, 9]);
//! assert_eq!((s.count, s.negative, s.min_ns(), s.max_ns()), (3, 1, Some(5), Some(9)));
//! assert_eq!(s.mean_ns(), Some(7.0));
//! let back = StageStats::decode(&s.encode()).unwrap();
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
use hoptrace_collector::stages::MAX_TRACKABLE_NS;

use crate::hdr::{HDR_LEN, HdrCounts};

/// First byte of an encoded [`StageStats`].
const STAGE_TAG: u8 = 0x53;
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

fn put_zigzag(out: &mut Vec<u8>, v: i64) {
    put_varint(out, ((v << 1) ^ (v >> 63)) as u64);
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

    fn fixed<const N: usize>(&mut self) -> Result<[u8; N]> {
        let (head, rest) = self
            .bytes
            .split_first_chunk::<N>()
            .ok_or_else(|| corrupt(self.what))?;
        self.bytes = rest;
        Ok(*head)
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

    fn zigzag(&mut self) -> Result<i64> {
        let v = self.varint()?;
        Ok(((v >> 1) as i64) ^ -((v & 1) as i64))
    }

    fn finish(&self) -> Result<()> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(corrupt(self.what))
        }
    }
}

/// One stage over a group of traces.
///
/// Values >= 0 are counted in `count` and described exactly (minimum, maximum, sum, and
/// the second moment about the mean, merged across batches with Chan's parallel formula);
/// their histogram holds each clamped to [`MAX_TRACKABLE_NS`] (`clamped` counts those
/// above it). Values < 0 are only counted, in `negative`.
#[derive(Debug, Clone, PartialEq)]
pub struct StageStats {
    /// Values >= 0.
    pub count: u64,
    /// Values < 0.
    pub negative: u64,
    /// Values above [`MAX_TRACKABLE_NS`].
    pub clamped: u64,
    /// Smallest value >= 0 (meaningless when `count` is 0).
    pub min: i64,
    /// Largest value (meaningless when `count` is 0).
    pub max: i64,
    /// Exact sum of the values >= 0.
    pub sum: i128,
    /// Sum of squared differences from their mean.
    pub m2: f64,
    /// Their histogram.
    pub hdr: HdrCounts,
}

impl Default for StageStats {
    fn default() -> Self {
        Self {
            count: 0,
            negative: 0,
            clamped: 0,
            min: i64::MAX,
            max: i64::MIN,
            sum: 0,
            m2: 0.0,
            hdr: HdrCounts::new(),
        }
    }
}

/// 2^52 as an f64's bits: ORed into an integer below 2^52, it gives 2^52 + that integer.
const TWO_52_BITS: u64 = 0x4330_0000_0000_0000;

/// `v` (0 <= v < 2^52) as an f64, exactly, with integer and float operations that
/// vectorize (no scalar conversion instruction).
#[inline(always)]
fn small_to_f64(v: i64) -> f64 {
    f64::from_bits(v as u64 | TWO_52_BITS) - f64::from_bits(TWO_52_BITS)
}

/// Figures of a slice of values >= 0 from one pass: minimum, maximum, sum, and the sum
/// of squared differences from `shift`.
struct SlicePass {
    min: i64,
    max: i64,
    sum: i128,
    squares: f64,
}

/// One pass over `values`. Exact while every value is in 0..2^51 (the sum of 4096 of them
/// fits an i64; each converts exactly); [`SlicePass::exact`] otherwise, and only `min` is
/// meaningful when a value is negative.
#[inline]
fn one_pass(values: &[i64], shift: f64) -> SlicePass {
    let mut out = SlicePass {
        min: i64::MAX,
        max: 0,
        sum: 0,
        squares: 0.0,
    };
    let mut lanes = [0.0_f64; 4];
    for chunk in values.chunks(4096) {
        let (mut min, mut max, mut sum) = (i64::MAX, 0_i64, 0_i64);
        let quads = chunk.chunks_exact(4);
        for &v in quads.remainder() {
            let d = small_to_f64(v) - shift;
            lanes[0] += d * d;
        }
        for q in quads {
            for (l, &v) in lanes.iter_mut().zip(q) {
                let d = small_to_f64(v) - shift;
                *l += d * d;
            }
        }
        for &v in chunk {
            min = min.min(v);
            max = max.max(v);
            sum = sum.wrapping_add(v);
        }
        out.min = out.min.min(min);
        out.max = out.max.max(max);
        out.sum += i128::from(sum);
    }
    out.squares = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
    out
}

impl SlicePass {
    /// The pass for values of any size: exact sum, and squares with each value converted
    /// to the nearest f64.
    fn exact(values: &[i64], shift: f64) -> Self {
        let sq = |v: i64| {
            let d = v as f64 - shift;
            d * d
        };
        Self {
            min: values.iter().copied().min().unwrap_or(i64::MAX),
            max: values.iter().copied().max().unwrap_or(0),
            sum: values.iter().map(|&v| i128::from(v)).sum(),
            squares: values.iter().map(|&v| sq(v)).sum(),
        }
    }
}

impl StageStats {
    /// Exact minimum of the values >= 0.
    #[must_use]
    pub fn min_ns(&self) -> Option<i64> {
        (self.count > 0).then_some(self.min)
    }

    /// Exact maximum of the values >= 0.
    #[must_use]
    pub fn max_ns(&self) -> Option<i64> {
        (self.count > 0).then_some(self.max)
    }

    /// Mean of the values >= 0 (their exact sum over their count).
    #[must_use]
    pub fn mean_ns(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum as f64 / self.count as f64)
    }

    /// Population standard deviation of the values >= 0.
    #[must_use]
    pub fn stddev_ns(&self) -> Option<f64> {
        (self.count > 0).then(|| (self.m2 / self.count as f64).max(0.0).sqrt())
    }

    /// Adds every value of `values` (negative ones are only counted).
    pub fn add_values(&mut self, values: &[i64]) {
        let Some(&first) = values.first() else {
            return;
        };
        // Squares are summed about the first value (close to the others), and the second
        // moment about their mean follows: sum((v - mean)^2) = sum((v - s)^2) - n (mean - s)^2.
        let pass = one_pass(values, first as f64);
        if pass.min >= 0 {
            self.add_pass(values, pass, first as f64);
            return;
        }
        // Negative deltas (clock error) are rare: the others are added on their own.
        let kept: Vec<i64> = values.iter().copied().filter(|&v| v >= 0).collect();
        self.negative += (values.len() - kept.len()) as u64;
        if let Some(&first) = kept.first() {
            self.add_pass(&kept, one_pass(&kept, first as f64), first as f64);
        }
    }

    /// Adds `values` (all >= 0) given their [`one_pass`] about `shift`.
    fn add_pass(&mut self, values: &[i64], mut pass: SlicePass, shift: f64) {
        debug_assert!(!values.is_empty() && values.iter().all(|&v| v >= 0));
        if pass.max >= 1 << 51 {
            pass = SlicePass::exact(values, shift);
        }
        let n = values.len() as u64;
        let mean = pass.sum as f64 / n as f64;
        let m2 = (pass.squares - n as f64 * (mean - shift) * (mean - shift)).max(0.0);
        self.hdr.record_non_negative(values, pass.max);
        if pass.max as u64 > MAX_TRACKABLE_NS {
            self.clamped += values
                .iter()
                .filter(|&&v| v as u64 > MAX_TRACKABLE_NS)
                .count() as u64;
        }
        self.merge_moments(n, pass.sum, m2);
        self.min = self.min.min(pass.min);
        self.max = self.max.max(pass.max);
    }

    /// Merges a count, sum and second moment of other values into these.
    fn merge_moments(&mut self, n: u64, sum: i128, m2: f64) {
        if n == 0 {
            return;
        }
        if self.count > 0 {
            let (na, nb) = (self.count as f64, n as f64);
            let delta = sum as f64 / nb - self.sum as f64 / na;
            self.m2 += m2 + delta * delta * (na * nb / (na + nb));
        } else {
            self.m2 = m2;
        }
        self.count += n;
        self.sum += sum;
    }

    /// Adds `other`'s values.
    pub fn merge(&mut self, other: &Self) {
        self.merge_moments(other.count, other.sum, other.m2);
        self.negative += other.negative;
        self.clamped += other.clamped;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
        self.hdr.merge(&other.hdr);
    }

    /// The compact binary form `stage_stats` returns.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        out.push(STAGE_TAG);
        put_varint(&mut out, self.count);
        put_varint(&mut out, self.negative);
        put_varint(&mut out, self.clamped);
        put_zigzag(&mut out, self.min);
        put_zigzag(&mut out, self.max);
        out.extend_from_slice(&self.sum.to_le_bytes());
        out.extend_from_slice(&self.m2.to_le_bytes());
        // Non-empty buckets as (zeros skipped, count) pairs.
        let mut next = 0;
        for (i, c) in self.hdr.non_zero() {
            put_varint(&mut out, (i - next) as u64);
            put_varint(&mut out, c);
            next = i + 1;
        }
        out
    }

    /// Reads [`StageStats::encode`]'s bytes.
    ///
    /// # Errors
    /// When `bytes` are not such an encoding.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let mut r = Reader {
            bytes,
            what: "stage_stats",
        };
        if r.byte()? != STAGE_TAG {
            return Err(corrupt(r.what));
        }
        let mut s = Self {
            count: r.varint()?,
            negative: r.varint()?,
            clamped: r.varint()?,
            min: r.zigzag()?,
            max: r.zigzag()?,
            sum: i128::from_le_bytes(r.fixed()?),
            m2: f64::from_le_bytes(r.fixed()?),
            hdr: HdrCounts::new(),
        };
        let mut next = 0_usize;
        while !r.bytes.is_empty() {
            let skip = usize::try_from(r.varint()?).map_err(|_| corrupt(r.what))?;
            let index = next.checked_add(skip).ok_or_else(|| corrupt(r.what))?;
            if index >= HDR_LEN {
                return Err(corrupt(r.what));
            }
            s.hdr.add_at(index, r.varint()?);
            next = index + 1;
        }
        r.finish()?;
        Ok(s)
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
    stats: &mut StageStats,
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
    stats: &mut [StageStats],
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

fn binary_of<'a>(items: impl Iterator<Item = &'a StageStats>) -> ArrayRef {
    let mut b = BinaryBuilder::new();
    for s in items {
        b.append_value(s.encode());
    }
    Arc::new(b.finish())
}

/// `stage_stats(ns)`.
#[derive(Debug, PartialEq, Eq, Hash)]
struct StageStatsAgg {
    signature: Signature,
}

/// The `stage_stats` aggregate (not registered in sessions: its result is this module's
/// own encoding, read with [`StageStats::decode`]).
#[must_use]
pub fn stage_stats_udaf() -> AggregateUDF {
    AggregateUDF::from(StageStatsAgg {
        signature: Signature::user_defined(Volatility::Immutable),
    })
}

impl AggregateUDFImpl for StageStatsAgg {
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
        Ok(Box::new(StageStatsAccumulator::default()))
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
        Ok(Box::new(StageStatsGroups::default()))
    }
}

#[derive(Debug, Default)]
struct StageStatsAccumulator {
    stats: StageStats,
}

impl Accumulator for StageStatsAccumulator {
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
        std::mem::size_of_val(self) + self.stats.hdr.allocated_bytes()
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        Ok(vec![self.evaluate()?])
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        if let Some(s) = states.first() {
            for bytes in s.as_binary::<i32>().iter().flatten() {
                self.stats.merge(&StageStats::decode(bytes)?);
            }
        }
        Ok(())
    }
}

/// `stage_stats` of every group at once.
#[derive(Debug, Default)]
struct StageStatsGroups {
    groups: Vec<StageStats>,
}

impl StageStatsGroups {
    fn emit(&mut self, emit_to: EmitTo) -> ArrayRef {
        let taken = emit_to.take_needed(&mut self.groups);
        binary_of(taken.iter())
    }
}

impl GroupsAccumulator for StageStatsGroups {
    fn update_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        opt_filter: Option<&BooleanArray>,
        total_num_groups: usize,
    ) -> Result<()> {
        self.groups
            .resize_with(total_num_groups, StageStats::default);
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
            .resize_with(total_num_groups, StageStats::default);
        let Some(states) = values.first() else {
            return Ok(());
        };
        let states: &BinaryArray = states.as_binary::<i32>();
        for (bytes, &g) in states.iter().zip(group_indices) {
            if let Some(bytes) = bytes {
                self.groups[g].merge(&StageStats::decode(bytes)?);
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
            let mut s = StageStats::default();
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
        self.groups.capacity() * std::mem::size_of::<StageStats>()
            + self
                .groups
                .iter()
                .map(|s| s.hdr.allocated_bytes())
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
        let [stream, publisher, complete, flags, missing] = cols else {
            return plan_err!("trace_counts takes five arguments");
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
        r.finish()?;
        Ok(Self {
            rows,
            complete,
            flag_bits,
            missing_bits,
            streams,
            publishers,
        })
    }
}

/// `trace_counts(stream, publisher, complete, flags, missing_mask)`.
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
            [stream, publisher, complete, flags, missing] => {
                if !matches!(complete, DataType::Boolean | DataType::Null) {
                    return plan_err!("trace_counts: `complete` is a boolean, not {complete}");
                }
                Ok(vec![
                    int(stream)?,
                    int(publisher)?,
                    DataType::Boolean,
                    int(flags)?,
                    int(missing)?,
                ])
            }
            _ => plan_err!("trace_counts takes five arguments"),
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
        std::mem::size_of_val(self) + set(&self.counts.streams) + set(&self.counts.publishers)
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
    use proptest::prelude::*;

    use super::*;

    /// The figures of `values` computed the plain way.
    fn oracle(values: &[i64]) -> StageStats {
        let kept: Vec<i64> = values.iter().copied().filter(|&v| v >= 0).collect();
        let mut hdr = HdrCounts::new();
        kept.iter().for_each(|&v| hdr.record(v as u64));
        let sum: i128 = kept.iter().map(|&v| i128::from(v)).sum();
        let mean = sum as f64 / kept.len().max(1) as f64;
        StageStats {
            count: kept.len() as u64,
            negative: (values.len() - kept.len()) as u64,
            clamped: kept
                .iter()
                .filter(|&&v| v as u64 > MAX_TRACKABLE_NS)
                .count() as u64,
            min: kept.iter().copied().min().unwrap_or(i64::MAX),
            max: kept.iter().copied().max().unwrap_or(i64::MIN),
            sum,
            m2: kept.iter().map(|&v| (v as f64 - mean).powi(2)).sum(),
            hdr,
        }
    }

    fn assert_same(got: &StageStats, want: &StageStats) {
        assert_eq!(
            (got.count, got.negative, got.clamped, got.sum),
            (want.count, want.negative, want.clamped, want.sum)
        );
        assert_eq!((got.min_ns(), got.max_ns()), (want.min_ns(), want.max_ns()));
        assert_eq!(got.hdr, want.hdr);
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
    fn expected(rows: &[(usize, Option<i64>, bool)], filtered: bool) -> Vec<StageStats> {
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

    fn feed(acc: &mut StageStatsGroups, rows: &[(usize, Option<i64>, bool)], filtered: bool) {
        for chunk in rows.chunks(37) {
            let values: ArrayRef = Arc::new(Int64Array::from_iter(chunk.iter().map(|r| r.1)));
            let groups: Vec<usize> = chunk.iter().map(|r| r.0).collect();
            let filter = BooleanArray::from_iter(chunk.iter().map(|r| Some(r.2)));
            acc.update_batch(&[values], &groups, filtered.then_some(&filter), 4)
                .unwrap();
        }
    }

    fn decode_all(array: &ArrayRef) -> Vec<StageStats> {
        array
            .as_binary::<i32>()
            .iter()
            .map(|b| StageStats::decode(b.unwrap()).unwrap())
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
            let mut acc = StageStatsGroups::default();
            feed(&mut acc, &rows, filtered);
            let got = decode_all(&acc.evaluate(EmitTo::All).unwrap());
            for (g, w) in got.iter().zip(expected(&rows, filtered)) {
                assert_same(g, &w);
            }
        }

        #[test]
        fn partial_states_merge_to_the_whole(rows in rows(), split in 0_usize..300) {
            let split = split.min(rows.len());
            let (mut a, mut b) = (StageStatsGroups::default(), StageStatsGroups::default());
            feed(&mut a, &rows[..split], false);
            feed(&mut b, &rows[split..], false);
            let mut fin = StageStatsGroups::default();
            for part in [&mut a, &mut b] {
                let state = part.state(EmitTo::All).unwrap();
                let n = state[0].len();
                fin.merge_batch(&state, &(0..n).collect::<Vec<_>>(), 4).unwrap();
            }
            // Rows converted one by one to states merge to the same figures.
            let mut each = StageStatsGroups::default();
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
            let mut s = StageStats::default();
            s.add_values(&values);
            let bytes = s.encode();
            prop_assert_eq!(StageStats::decode(&bytes).unwrap(), s);
            // Damaged states are refused or read, never a panic.
            for cut in 0..bytes.len() {
                let _ = StageStats::decode(&bytes[..cut]);
            }
            prop_assert!(StageStats::decode(&[0x00]).is_err());
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
                ),
                0..200,
            ),
            split in 0_usize..200,
        ) {
            let split = split.min(rows.len());
            let batch = |rows: &[(u64, u64, bool, u64, u64)]| -> Vec<ArrayRef> {
                let u = |f: fn(&(u64, u64, bool, u64, u64)) -> u64| -> ArrayRef {
                    Arc::new(UInt64Array::from_iter_values(rows.iter().map(f)))
                };
                vec![
                    u(|r| r.0),
                    u(|r| r.1),
                    Arc::new(BooleanArray::from_iter(rows.iter().map(|r| Some(r.2)))),
                    u(|r| r.3),
                    u(|r| r.4),
                ]
            };
            let (mut a, mut b) = (TraceCounts::default(), TraceCounts::default());
            a.update(&batch(&rows[..split])).unwrap();
            b.update(&batch(&rows[split..])).unwrap();
            let mut c = TraceCounts::decode(&a.encode()).unwrap();
            c.merge(&TraceCounts::decode(&b.encode()).unwrap());
            let distinct = |f: fn(&(u64, u64, bool, u64, u64)) -> u64| {
                rows.iter().map(f).collect::<HashSet<u64>>().len() as u64
            };
            let bit = |f: fn(&(u64, u64, bool, u64, u64)) -> u64, b: usize| {
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
        }
    }

    #[test]
    fn one_batch_of_one_group_matches_the_plain_figures() {
        let values: Vec<i64> = (0..100_000_i64)
            .map(|i| (i * 7_919) % 3_000_000 + i % 13)
            .chain([-1, -50, i64::MAX, MAX_TRACKABLE_NS as i64 + 1])
            .collect();
        let mut s = StageStats::default();
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
        let q = "SELECT trace_counts(stream, publisher, status = 'complete', flags, missing_mask), \
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
        let q = "SELECT g, stage_stats(d) AS s, count(d) FILTER (WHERE d >= 0) AS n, \
                 count(d) FILTER (WHERE d < 0) AS neg, min(d) FILTER (WHERE d >= 0) AS lo, \
                 max(d) FILTER (WHERE d >= 0) AS hi, \
                 avg(CAST(d AS DOUBLE)) FILTER (WHERE d >= 0) AS mean, \
                 stddev_pop(CAST(d AS DOUBLE)) FILTER (WHERE d >= 0) AS sd, \
                 hdr_percentile(d, 0.99) AS p99 FROM t GROUP BY g \
                 UNION ALL \
                 SELECT -1, stage_stats(d), count(d) FILTER (WHERE d >= 0), \
                 count(d) FILTER (WHERE d < 0), min(d) FILTER (WHERE d >= 0), \
                 max(d) FILTER (WHERE d >= 0), avg(CAST(d AS DOUBLE)) FILTER (WHERE d >= 0), \
                 stddev_pop(CAST(d AS DOUBLE)) FILTER (WHERE d >= 0), hdr_percentile(d, 0.99) \
                 FROM t";
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
                let s = StageStats::decode(b.column(1).as_binary::<i32>().value(r)).unwrap();
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
                let h = s.hdr.to_histogram();
                assert_eq!(
                    int(8, r),
                    ScalarValue::Int64(Some(crate::hdr::value_at(&h, 0.99) as i64))
                );
                seen += 1;
            }
        }
        assert_eq!(seen, 5, "4 groups and the whole");
    }
}
