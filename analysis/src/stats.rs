//! The aggregates behind a report's single scan of a run.
//!
//! - `stage_stats(ns)` ([`stage_stats_udaf`]): everything a report says about one stage
//!   over a group of traces, as a [`SignedStats`] in its compact binary encoding: every
//!   value counted, negative ones (clock error) included and also counted apart, with
//!   their exact minimum, maximum and sum, their second moment (for the population
//!   standard deviation) and their HDR histograms (one per sign); NULLs ignored. It aggregates per group
//!   natively (DataFusion's `GroupsAccumulator`), and a batch whose rows belong to one
//!   group (time buckets are contiguous in a run's files) is added in a few tight passes.
//! - `bucket_stats(time_ns, t0_ns, width_ns, to_0, from_0, ...)` ([`bucket_stats_udaf`]):
//!   the same figures for every stage `to_i - from_i`, per time bucket, without a
//!   `GROUP BY`: the report's scan when every message carried the same number of metrics
//!   (a [`BucketStats`]).
//! - `trace_counts(stream, publisher, complete, flags, missing_mask, sequence)`
//!   ([`trace_counts_udaf`], in `counts.rs`): the rows, flags and distinct trace keys of a
//!   group, as a [`TraceCounts`].
//!
//! All return `Binary`; [`SignedStats::decode`], [`BucketStats::decode`] and
//! [`TraceCounts::decode`] read it. The encodings are this module's own and may change
//! between versions: they are not for storing.
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

use datafusion::arrow::array::{Array, ArrayRef, AsArray, BooleanArray};
use datafusion::arrow::buffer::{BooleanBuffer, NullBuffer};
use datafusion::arrow::datatypes::{DataType, Int64Type};
use datafusion::common::{DataFusionError, Result, plan_err};
use datafusion::logical_expr::AggregateUDF;
use hoptrace_format::hist::SignedStats;
use hoptrace_format::varint::put;

use crate::binary_agg::{self, BinaryState, corrupt};

pub use crate::counts::{TraceCounts, trace_counts_udaf};

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

/// The `stage_stats` aggregate (not registered in sessions: its result is this module's
/// own encoding, read with [`SignedStats::decode`]).
#[must_use]
pub fn stage_stats_udaf() -> AggregateUDF {
    binary_agg::udaf::<SignedStats>()
}

impl BinaryState for SignedStats {
    const NAME: &'static str = "stage_stats";
    const STATE: &'static str = "stats";
    const GROUPED: bool = true;

    fn coerce(arg_types: &[DataType]) -> Result<Vec<DataType>> {
        match arg_types {
            [t] => Ok(vec![crate::hdr::coerce_ns(Self::NAME, t)?]),
            _ => plan_err!("stage_stats takes one argument"),
        }
    }

    fn update(&mut self, values: &[ArrayRef]) -> Result<()> {
        if let Some(v) = values.first() {
            let array = v.as_primitive::<Int64Type>();
            let kept = kept_rows(array, None);
            add_rows(self, array.values(), 0..array.len(), kept.as_ref());
        }
        Ok(())
    }

    fn update_groups(
        groups: &mut [Self],
        values: &[ArrayRef],
        group_indices: &[usize],
        filter: Option<&BooleanArray>,
    ) -> Result<()> {
        match values.first() {
            Some(v) => {
                add_grouped(groups, v, group_indices, filter);
                Ok(())
            }
            None => plan_err!("stage_stats takes one argument"),
        }
    }

    fn merge(&mut self, other: &Self) {
        SignedStats::merge(self, other);
    }

    fn encode(&self) -> Vec<u8> {
        SignedStats::encode(self)
    }

    fn decode(bytes: &[u8]) -> Result<Self> {
        SignedStats::decode(bytes).map_err(|_| corrupt(Self::NAME))
    }

    fn allocated_bytes(&self) -> usize {
        SignedStats::allocated_bytes(self)
    }
}

/// First byte of an encoded [`BucketStats`].
const BUCKETS_TAG: u8 = 0x42;
/// The largest bucket number `bucket_stats` takes (a report has at most a few hundred).
const MAX_BUCKET: i64 = 1 << 20;

/// One time bucket of [`BucketStats`]: its rows and every stage's figures over them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BucketCell {
    /// Rows (messages) in the bucket, whatever their stages.
    pub messages: u64,
    /// Per stage argument, in order.
    pub stages: Vec<SignedStats>,
}

/// The state of `bucket_stats(time_ns, t0_ns, width_ns, to_0, from_0, ..., to_k,
/// from_k)` ([`bucket_stats_udaf`]): per time bucket (`(time_ns - t0_ns) / width_ns`,
/// from 0; NULL times in a bucket of their own), the rows and the [`SignedStats`] of every
/// stage `to_i - from_i` (NULL where either stamp is). It is the report's scan without a
/// `GROUP BY` and without intermediate columns: a bucket is found by index, not by
/// hashing every row's bucket number; a row in the same bucket as the row before needs no
/// division; a stage's deltas are computed into one buffer reused for every stage; and a
/// batch's rows (time-ordered in a run's files) mostly fall in one bucket, added as
/// slices.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BucketStats {
    /// By bucket number; `None` where no row fell.
    pub cells: Vec<Option<BucketCell>>,
    /// Rows without a time.
    pub untimed: Option<BucketCell>,
}

/// The `bucket_stats` aggregate (not registered in sessions: its result is this module's
/// own encoding, read with [`BucketStats::decode`]).
#[must_use]
pub fn bucket_stats_udaf() -> AggregateUDF {
    binary_agg::udaf::<BucketStats>()
}

impl BucketStats {
    fn cell(&mut self, bucket: Option<usize>, stages: usize) -> &mut BucketCell {
        let slot = match bucket {
            Some(b) => {
                if self.cells.len() <= b {
                    self.cells.resize_with(b + 1, || None);
                }
                &mut self.cells[b]
            }
            None => &mut self.untimed,
        };
        slot.get_or_insert_with(|| BucketCell {
            messages: 0,
            stages: vec![SignedStats::default(); stages],
        })
    }

    /// Every cell with its bucket number (`None` for the rows without a time).
    pub fn iter(&self) -> impl Iterator<Item = (Option<usize>, &BucketCell)> {
        self.cells
            .iter()
            .enumerate()
            .filter_map(|(b, c)| c.as_ref().map(|c| (Some(b), c)))
            .chain(self.untimed.as_ref().map(|c| (None, c)))
    }

    /// Reads the encoding `bucket_stats` returns.
    ///
    /// # Errors
    /// When `bytes` are not such an encoding.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let bad = || corrupt(<Self as BinaryState>::NAME);
        let mut r = hoptrace_format::varint::Reader::new(bytes);
        if r.byte().map_err(|_| bad())? != BUCKETS_TAG {
            return Err(bad());
        }
        let mut out = Self::default();
        let mut width: Option<usize> = None;
        let n = r.varint().map_err(|_| bad())?;
        for _ in 0..n {
            let key = r.varint().map_err(|_| bad())?;
            let bucket = match key {
                0 => None,
                k if k - 1 <= MAX_BUCKET as u64 => Some((k - 1) as usize),
                _ => return Err(bad()),
            };
            let messages = r.varint().map_err(|_| bad())?;
            let stages = r.varint().map_err(|_| bad())?;
            let mut cell = BucketCell {
                messages,
                stages: Vec::new(),
            };
            for _ in 0..stages {
                let len = usize::try_from(r.varint().map_err(|_| bad())?).map_err(|_| bad())?;
                let part = r.take(len).map_err(|_| bad())?;
                cell.stages
                    .push(SignedStats::decode(part).map_err(|_| bad())?);
            }
            // Every cell has the same stages, and a bucket is listed once.
            let listed = match bucket {
                Some(b) => out.cells.get(b).is_some_and(Option::is_some),
                None => out.untimed.is_some(),
            };
            if listed || *width.get_or_insert(cell.stages.len()) != cell.stages.len() {
                return Err(bad());
            }
            *out.cell(bucket, 0) = cell;
        }
        r.finish().map_err(|_| bad())?;
        Ok(out)
    }
}

/// A run of consecutive rows in one time bucket: (first row, end, bucket; `None` for rows
/// without a time).
type BucketRun = (usize, usize, Option<usize>);

/// The runs of consecutive rows of `time` in one bucket of `width` ns from `t0`.
fn bucket_runs(
    time: &datafusion::arrow::array::Int64Array,
    t0: i64,
    width: i64,
) -> Result<Vec<BucketRun>> {
    let bucket_of = |t: i64| {
        let b = t.wrapping_sub(t0) / width;
        if (0..=MAX_BUCKET).contains(&b) {
            Ok(b as usize)
        } else {
            Err(DataFusionError::Execution(format!(
                "bucket_stats: time {t} ns falls in bucket {b}, outside 0..={MAX_BUCKET}"
            )))
        }
    };
    // The usual batch lies in one bucket: its earliest and latest times say so (a
    // bucket's number grows with the time where `t - t0` does not overflow).
    if time.null_count() == 0 && !time.is_empty() {
        let (earliest, latest) = time
            .values()
            .iter()
            .fold((i64::MAX, i64::MIN), |(lo, hi), &t| (lo.min(t), hi.max(t)));
        if earliest.checked_sub(t0).is_some() && latest.checked_sub(t0).is_some() {
            let first = bucket_of(earliest)?;
            if first == bucket_of(latest)? {
                return Ok(vec![(0, time.len(), Some(first))]);
            }
        }
    }
    let mut runs: Vec<BucketRun> = Vec::new();
    // The times of the last bucket computed, and its number: rows within need no division.
    let mut known: Option<(std::ops::Range<i64>, usize)> = None;
    for i in 0..time.len() {
        let bucket = if time.is_valid(i) {
            let t = time.value(i);
            match &known {
                Some((times, b)) if times.contains(&t) => Some(*b),
                _ => {
                    let b = bucket_of(t)?;
                    known = (b as i64)
                        .checked_mul(width)
                        .and_then(|x| t0.checked_add(x))
                        .and_then(|lo| Some((lo..lo.checked_add(width)?, b)));
                    Some(b)
                }
            }
        } else {
            None
        };
        match runs.last_mut() {
            Some((_, end, b)) if *b == bucket => *end = i + 1,
            _ => runs.push((i, i + 1, bucket)),
        }
    }
    Ok(runs)
}

impl BinaryState for BucketStats {
    const NAME: &'static str = "bucket_stats";
    const STATE: &'static str = "buckets";
    const GROUPED: bool = false;

    fn coerce(arg_types: &[DataType]) -> Result<Vec<DataType>> {
        match arg_types {
            [_, _, _, hops @ ..]
                if !hops.is_empty()
                    && hops.len() % 2 == 0
                    && arg_types.iter().all(binary_agg::nanoseconds) =>
            {
                Ok(vec![DataType::Int64; arg_types.len()])
            }
            _ => plan_err!(
                "bucket_stats takes a time, the first bucket's start, the bucket width and \
                 pairs of hop stamps (to, from), all integer nanoseconds"
            ),
        }
    }

    fn update(&mut self, values: &[ArrayRef]) -> Result<()> {
        let [time, t0, width, hops @ ..] = values else {
            return plan_err!("bucket_stats takes a time, a start, a width and hop pairs");
        };
        let time = time.as_primitive::<Int64Type>();
        let (Some(t0), Some(width)) = (
            t0.as_primitive::<Int64Type>().values().first().copied(),
            width.as_primitive::<Int64Type>().values().first().copied(),
        ) else {
            return Ok(());
        };
        if width <= 0 {
            return Err(DataFusionError::Execution(format!(
                "bucket_stats: bucket width {width} ns is not positive"
            )));
        }
        let runs = bucket_runs(time, t0, width)?;
        let stages = hops.len() / 2;
        for &(start, end, bucket) in &runs {
            self.cell(bucket, stages).messages += (end - start) as u64;
        }
        let mut deltas: Vec<i64> = Vec::with_capacity(time.len());
        for (s, pair) in hops.chunks_exact(2).enumerate() {
            let (to, from) = (
                pair[0].as_primitive::<Int64Type>(),
                pair[1].as_primitive::<Int64Type>(),
            );
            deltas.clear();
            deltas.extend(
                to.values()
                    .iter()
                    .zip(from.values().iter())
                    .map(|(&a, &b)| a.wrapping_sub(b)),
            );
            let kept =
                NullBuffer::union(to.logical_nulls().as_ref(), from.logical_nulls().as_ref())
                    .map(|n| n.inner().clone());
            for &(start, end, bucket) in &runs {
                let cell = self.cell(bucket, stages);
                add_rows(&mut cell.stages[s], &deltas, start..end, kept.as_ref());
            }
        }
        Ok(())
    }

    fn merge(&mut self, other: &Self) {
        for (bucket, theirs) in other.iter() {
            let mine = self.cell(bucket, theirs.stages.len());
            mine.messages += theirs.messages;
            for (a, b) in mine.stages.iter_mut().zip(&theirs.stages) {
                a.merge(b);
            }
        }
    }

    fn encode(&self) -> Vec<u8> {
        let mut out = vec![BUCKETS_TAG];
        put(&mut out, self.iter().count() as u64);
        for (bucket, cell) in self.iter() {
            put(&mut out, bucket.map_or(0, |b| b as u64 + 1));
            put(&mut out, cell.messages);
            put(&mut out, cell.stages.len() as u64);
            for st in &cell.stages {
                let bytes = st.encode();
                put(&mut out, bytes.len() as u64);
                out.extend_from_slice(&bytes);
            }
        }
        out
    }

    fn decode(bytes: &[u8]) -> Result<Self> {
        Self::decode(bytes)
    }

    fn allocated_bytes(&self) -> usize {
        self.iter()
            .flat_map(|(_, c)| &c.stages)
            .map(SignedStats::allocated_bytes)
            .sum::<usize>()
            + self.cells.capacity() * std::mem::size_of::<Option<BucketCell>>()
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::datatypes::Field;
    use datafusion::common::ScalarValue;
    use std::sync::Arc;

    use datafusion::arrow::array::Int64Array;
    use datafusion::logical_expr::{EmitTo, GroupsAccumulator};
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

    fn feed(acc: &mut dyn GroupsAccumulator, rows: &[(usize, Option<i64>, bool)], filtered: bool) {
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
            let mut acc = binary_agg::groups::<SignedStats>();
            feed(acc.as_mut(), &rows, filtered);
            let got = decode_all(&acc.evaluate(EmitTo::All).unwrap());
            for (g, w) in got.iter().zip(expected(&rows, filtered)) {
                assert_same(g, &w);
            }
        }

        #[test]
        fn partial_states_merge_to_the_whole(rows in rows(), split in 0_usize..300) {
            let split = split.min(rows.len());
            let (mut a, mut b) = (binary_agg::groups::<SignedStats>(), binary_agg::groups::<SignedStats>());
            feed(a.as_mut(), &rows[..split], false);
            feed(b.as_mut(), &rows[split..], false);
            let mut fin = binary_agg::groups::<SignedStats>();
            for part in [&mut a, &mut b] {
                let state = part.state(EmitTo::All).unwrap();
                let n = state[0].len();
                fin.merge_batch(&state, &(0..n).collect::<Vec<_>>(), 4).unwrap();
            }
            // Rows converted one by one to states merge to the same figures.
            let mut each = binary_agg::groups::<SignedStats>();
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

    #[test]
    fn bucket_stats_agree_with_each_bucket_added_alone() {
        // Batches with buckets in runs and out of order, rows without a time, stage
        // values missing in places; one batch all in one bucket, one whose times are
        // all known but in two buckets.
        type Column = Vec<Option<i64>>;
        let batches: [(Column, Column, Column); 4] = [
            (
                vec![Some(3); 3],
                vec![Some(1), Some(2), Some(3)],
                vec![Some(4), None, Some(6)],
            ),
            (
                vec![Some(4), Some(6), Some(4)],
                vec![Some(1), Some(1), Some(-1)],
                vec![Some(2), Some(2), Some(2)],
            ),
            (
                vec![Some(0), Some(0), Some(2), None, Some(2), Some(0)],
                vec![Some(5), None, Some(7), Some(-3), Some(9), Some(11)],
                vec![Some(1), Some(2), None, Some(4), Some(5), Some(6)],
            ),
            (
                vec![Some(2), Some(5), Some(5), None],
                vec![Some(13), Some(17), Some(19), None],
                vec![Some(7), None, Some(8), Some(9)],
            ),
        ];
        let mut parts = Vec::new();
        let mut want: std::collections::BTreeMap<Option<i64>, (u64, [Vec<i64>; 2])> =
            std::collections::BTreeMap::new();
        // Buckets of 10 ns from 1000: a row's time is somewhere in its bucket.
        let (t0, width) = (1000_i64, 10_i64);
        for (b, s0, s1) in &batches {
            let mut state = BucketStats::default();
            let n = b.len();
            let time: Vec<Option<i64>> = b
                .iter()
                .enumerate()
                .map(|(i, b)| b.map(|b| t0 + b * width + (i as i64 * 7) % width))
                .collect();
            // Each stage is `to - from`, its `from` a stamp of its own (NULL in places
            // where `to` is not, so the delta is missing there too).
            let from: Vec<Option<i64>> = (0..n).map(|i| (i != 1).then_some(i as i64 * 3)).collect();
            let to = |stage: &Column| -> Column {
                stage
                    .iter()
                    .zip(&from)
                    .map(|(v, f)| Some(v.unwrap_or(0) + f.unwrap_or(0)).filter(|_| v.is_some()))
                    .collect()
            };
            let arrays: Vec<ArrayRef> = vec![
                Arc::new(Int64Array::from(time)),
                Arc::new(Int64Array::from(vec![t0; n])),
                Arc::new(Int64Array::from(vec![width; n])),
                Arc::new(Int64Array::from(to(s0))),
                Arc::new(Int64Array::from(from.clone())),
                Arc::new(Int64Array::from(to(s1))),
                Arc::new(Int64Array::from(from.clone())),
            ];
            state.update(&arrays).unwrap();
            parts.push(state);
            for i in 0..n {
                let cell = want.entry(b[i]).or_default();
                cell.0 += 1;
                if from[i].is_some() {
                    cell.1[0].extend(s0[i]);
                    cell.1[1].extend(s1[i]);
                }
            }
        }
        let mut whole = BucketStats::default();
        for p in &parts {
            whole.merge(p);
        }
        let whole = BucketStats::decode(&BinaryState::encode(&whole)).unwrap();
        let got: Vec<_> = whole
            .iter()
            .map(|(b, c)| (b.map(|b| b as i64), c.clone()))
            .collect();
        assert_eq!(got.len(), want.len());
        for (bucket, cell) in got {
            let (messages, values) = &want[&bucket];
            assert_eq!(cell.messages, *messages, "bucket {bucket:?}");
            for (st, v) in cell.stages.iter().zip(values) {
                let mut alone = SignedStats::default();
                alone.add_values(v);
                // Merged moments round differently from one pass: equal to 1e-9.
                assert!((st.m2 - alone.m2).abs() <= 1e-9 * alone.m2.max(1.0));
                let exact = |x: &SignedStats| (x.count, x.negative, x.min, x.max, x.sum);
                assert_eq!(exact(st), exact(&alone), "bucket {bucket:?}");
                assert_eq!(
                    (&st.pos, &st.neg),
                    (&alone.pos, &alone.neg),
                    "bucket {bucket:?}"
                );
            }
        }
    }

    #[test]
    fn bucket_stats_refuse_garbage_and_far_buckets() {
        assert!(BucketStats::decode(&[]).is_err());
        assert!(BucketStats::decode(&[BUCKETS_TAG, 1, 1, 1, 1, 2, 0x53]).is_err());
        let mut bytes = BinaryState::encode(&BucketStats::default());
        bytes.push(0);
        assert!(BucketStats::decode(&bytes).is_err());
        // A bucket listed twice, and cells of different stage counts.
        let cell = |b: u8, stages: u8| {
            let mut v = vec![b + 1, 1, stages];
            for _ in 0..stages {
                let st = SignedStats::default().encode();
                v.push(st.len() as u8);
                v.extend(st);
            }
            v
        };
        for (a, b) in [(cell(3, 1), cell(3, 1)), (cell(3, 1), cell(4, 2))] {
            let mut bytes = vec![BUCKETS_TAG, 2];
            bytes.extend(a.iter().chain(&b));
            assert!(BucketStats::decode(&bytes).is_err());
            let mut one = vec![BUCKETS_TAG, 1];
            one.extend(&a);
            assert!(BucketStats::decode(&one).is_ok());
        }
        let mut state = BucketStats::default();
        let far = |time: i64, width: i64| -> Vec<ArrayRef> {
            vec![
                Arc::new(Int64Array::from(vec![time])),
                Arc::new(Int64Array::from(vec![0])),
                Arc::new(Int64Array::from(vec![width])),
                Arc::new(Int64Array::from(vec![1])),
                Arc::new(Int64Array::from(vec![0])),
            ]
        };
        assert!(state.update(&far(MAX_BUCKET * 2 + 2, 2)).is_err());
        assert!(
            state.update(&far(-1, 2)).is_ok(),
            "bucket 0: division truncates"
        );
        assert!(state.update(&far(-2, 2)).is_err());
        assert!(state.update(&far(5, 0)).is_err());
    }
}
