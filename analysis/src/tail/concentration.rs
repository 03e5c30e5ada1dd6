//! Where a tail concentrates: the messages of a tail set broken down by each dimension the
//! dataset holds (publisher, stream, metric count, second of the run), each value's share
//! of the tail against its share of all messages, and a test of whether the difference is
//! beyond chance.
//!
//! **The test.** Were the tail spread over a dimension's values by chance, a value holding
//! `n` of the dimension's `N` messages would hold a number of the tail's `K` messages
//! drawn from Binomial(`n`, `K / N`). A value holding `k` tail messages, more than that
//! expects, has the one-sided p-value P(X ≥ k) ([`binomial_at_least`]). It is flagged as a
//! **likely cause** when that p-value is below [`ALPHA`] divided by the number of values
//! over every dimension of the tail set that has more than one (Bonferroni): with
//! thousands of streams and seconds tested, one of them is flagged by chance at most
//! once in a hundred runs.
//! Values that hold fewer tail messages than expected are not tested: they cause nothing.
//!
//! **Messages that share their fate.** The binomial test takes messages as independent.
//! Messages that leave the stage's last hop together (a batch: one stamp for all of them)
//! are slow or fast together, and would make a second that merely held one slow batch
//! look like a cause. The test therefore counts in groups: a value's messages and its
//! tail messages are both divided by the pipeline's group size, the mean size of the
//! group a message belongs to (Σ size² / Σ size over the distinct last stamps of a sample
//! of all messages: the factor by which such groups inflate a count's variance). It is
//! taken over all messages, not over the tail: a cause such as a stall makes the tail's
//! own groups larger (the backlog leaves in big batches), and that is its effect, not
//! chance.
//!
//! The counts come from one aggregate over every row ([`DimensionStats`]), beside the
//! tails' scan; the README shows the same counts per stream as a query.

use std::collections::BTreeMap;

use datafusion::arrow::array::{Array, ArrayRef, AsArray};
use datafusion::arrow::buffer::NullBuffer;
use datafusion::arrow::datatypes::{DataType, Int64Type};
use datafusion::common::{Result, plan_err};
use hoptrace_format::tally::Tally;
use hoptrace_format::varint::{Reader, put, put_zigzag};
use serde::{Deserialize, Serialize};

use super::literal;
use crate::binary_agg::{self, BinaryState, corrupt};

/// The test's significance level over all values of a tail set (Bonferroni-corrected per
/// value).
pub const ALPHA: f64 = 0.01;

/// Values listed per dimension: those with the most tail messages above expectation.
pub const LISTED: usize = 10;

/// Terms of the binomial tail summed one by one before the rest is bounded.
const MAX_TERMS: u64 = 1_000_000;

/// One value of a dimension.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Concentrated {
    /// The value (a publisher id, `publisher/stream`, a metric count, or the second of
    /// the run as `+S s`).
    pub value: String,
    /// Messages with the headline stage's delta that have this value.
    pub messages: u64,
    /// Of those, in the tail.
    pub in_tail: u64,
    /// Tail messages it would hold were the tail spread by chance: `messages · K / N`.
    pub expected: f64,
    /// Its tail rate over the dimension's.
    pub times: f64,
    /// P(X ≥ `in_tail` / g) for X ~ Binomial(`messages` / g, `K / N`), g the pipeline's
    /// group size ([`Concentration::cluster_size`]), both rounded: exact to the
    /// precision of doubles, never below the truth.
    pub p_value: f64,
    /// Below the corrected level ([`Concentration::level`]).
    pub likely_cause: bool,
    /// Of a second: the run's events that line up with it ([`crate::events::lines_up`]),
    /// one line each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lines_up_with: Vec<String>,
}

/// One dimension of a tail set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DimensionTail {
    /// What the values are: `publisher`, `stream`, `metric count`, `second`.
    pub dimension: String,
    /// Values with at least one message.
    pub values: u64,
    /// Messages over all values (`N`).
    pub messages: u64,
    /// Tail messages over all values (`K`).
    pub in_tail: u64,
    /// Values whose tail messages exceed expectation, the largest excess first: the
    /// [`LISTED`] largest and every likely cause.
    pub listed: Vec<Concentrated>,
    /// Of all values, those flagged as likely causes (listed or not).
    pub likely_causes: u64,
}

/// Where one tail set concentrates.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Concentration {
    /// The pipeline's group size ([`DimensionStats::group_size`]; 1: each message on its
    /// own): the test divides counts by it.
    pub cluster_size: f64,
    /// Values tested over every dimension (each value of a dimension with more than one).
    pub tested: u64,
    /// The per-value level a p-value must be below: [`ALPHA`] over `tested`.
    pub level: f64,
    /// One per dimension with messages.
    pub dimensions: Vec<DimensionTail>,
}

impl Concentration {
    /// The flagged values, most significant first: (dimension, value).
    #[must_use]
    pub fn causes(&self) -> Vec<(&str, &Concentrated)> {
        let mut out: Vec<(&str, &Concentrated)> = self
            .dimensions
            .iter()
            .flat_map(|d| {
                d.listed
                    .iter()
                    .filter(|c| c.likely_cause)
                    .map(move |c| (d.dimension.as_str(), c))
            })
            .collect();
        out.sort_by(|a, b| a.1.p_value.total_cmp(&b.1.p_value));
        out
    }
}

/// The value of the `second` dimension for second `k` of the run: `+k s`.
fn second_value(k: i64) -> String {
    format!("+{k} s")
}

/// The second of the run a `second` dimension's value names.
fn second_of(value: &str) -> Option<i64> {
    value.strip_prefix('+')?.strip_suffix(" s")?.parse().ok()
}

/// Most events whose before and after are compared ([`event_splits`]).
pub const MAX_EVENT_SPLITS: usize = 8;

/// The dimension of [`event_splits`].
pub const AROUND_EVENTS: &str = "the time";

/// For each event of the run (at most [`MAX_EVENT_SPLITS`], one per second), a dimension
/// [`AROUND_EVENTS`] of two values, the seconds before the event's and those after it,
/// from the `second` counts of `dimensions` (second 0 starting at `t_min`; the event's own
/// second is in neither): a cause that starts with an event (a clock step, a restart) and
/// lasts shows as the tail's share after it, when no single second stands out.
#[must_use]
pub fn event_splits(
    dimensions: &Dimensions,
    events: &[crate::events::RunEvent],
    t_min: i64,
) -> Dimensions {
    let Some((_, seconds)) = dimensions.iter().find(|(n, _)| n == "second") else {
        return Vec::new();
    };
    let seconds: Vec<(i64, u64, u64)> = seconds
        .iter()
        .filter_map(|(v, m, t)| Some((second_of(v)?, *m, *t)))
        .collect();
    let mut out = Vec::new();
    let mut split_at = std::collections::BTreeSet::new();
    for e in events {
        if out.len() == MAX_EVENT_SPLITS {
            break;
        }
        let k = (e.at_unix_ns - t_min).div_euclid(1_000_000_000);
        if !split_at.insert(k) {
            continue;
        }
        let side = |before: bool| {
            seconds
                .iter()
                .filter(|(s, ..)| if before { *s < k } else { *s > k })
                .fold((0u64, 0u64), |(m, t), (_, sm, st)| (m + sm, t + st))
        };
        let (before, after) = (side(true), side(false));
        if before.0 == 0 || after.0 == 0 {
            continue;
        }
        let name = format!("{} of {} at {}", e.kind.label(), e.subject, second_value(k));
        out.push((
            AROUND_EVENTS.to_owned(),
            vec![
                (format!("before {name}"), before.0, before.1),
                (format!("after {name}"), after.0, after.1),
            ],
        ));
    }
    out
}

impl Concentration {
    /// Fills each listed second's [`Concentrated::lines_up_with`] from `events`, second 0
    /// starting at `t_min` (Unix ns).
    pub fn mark_events(&mut self, events: &[crate::events::RunEvent], t_min: i64) {
        for d in self
            .dimensions
            .iter_mut()
            .filter(|d| d.dimension == "second")
        {
            for v in &mut d.listed {
                if let Some(k) = second_of(&v.value) {
                    let start = t_min.saturating_add(k.saturating_mul(1_000_000_000));
                    v.lines_up_with = crate::events::lines_up(events, start)
                        .into_iter()
                        .map(crate::events::RunEvent::line)
                        .collect();
                }
            }
        }
    }
}

/// The counts of one dimension: per value, (messages, tail messages).
pub type Counts = Vec<(String, u64, u64)>;

/// Each dimension's name and counts.
pub type Dimensions = Vec<(String, Counts)>;

/// Values with their counters.
type Named = Vec<(String, Vec<u64>)>;

/// The concentration of a tail set from each dimension's counts (values without messages
/// are left out), its messages sharing their fate in groups of `cluster_size`.
#[must_use]
pub fn concentration(dimensions: Dimensions, cluster_size: f64) -> Concentration {
    let g = cluster_size.max(1.0);
    let grouped = |x: u64| (x as f64 / g).round() as u64;
    // Each dimension's rate: over its own messages (the second leaves out messages
    // without a time).
    let rated: Vec<(String, Counts, u64, u64)> = dimensions
        .into_iter()
        .map(|(name, mut values)| {
            values.retain(|v| v.1 > 0);
            let n = values.iter().map(|v| v.1).sum();
            let k = values.iter().map(|v| v.2).sum();
            (name, values, n, k)
        })
        .filter(|d| d.2 > 0)
        .collect();
    let above =
        |v: &(String, u64, u64), n: u64, k: u64| v.2 as f64 > v.1 as f64 * k as f64 / n as f64;
    // Every value that could have been flagged counts in the correction, not only those
    // found above the rate.
    let tested = rated
        .iter()
        .filter(|(_, values, ..)| values.len() > 1)
        .map(|(_, values, ..)| values.len() as u64)
        .sum::<u64>();
    let level = ALPHA / tested.max(1) as f64;
    let dimensions = rated
        .into_iter()
        .map(|(dimension, values, n, k)| {
            let rate = k as f64 / n as f64;
            let mut listed: Vec<Concentrated> = values
                .iter()
                .filter(|v| values.len() > 1 && above(v, n, k))
                .map(|(value, messages, in_tail)| {
                    let p_value = binomial_at_least(grouped(*in_tail), grouped(*messages), rate);
                    Concentrated {
                        value: value.clone(),
                        messages: *messages,
                        in_tail: *in_tail,
                        expected: *messages as f64 * rate,
                        times: (*in_tail as f64 / *messages as f64) / rate,
                        p_value,
                        likely_cause: p_value < level,
                        lines_up_with: Vec::new(),
                    }
                })
                .collect();
            let likely_causes = listed.iter().filter(|c| c.likely_cause).count() as u64;
            listed.sort_by(|a, b| {
                (b.in_tail as f64 - b.expected)
                    .total_cmp(&(a.in_tail as f64 - a.expected))
                    .then_with(|| a.value.cmp(&b.value))
            });
            // The largest excesses, and every likely cause whatever its excess (a small
            // stream can hold few tail messages and still be one).
            let mut rank = 0;
            listed.retain(|c| {
                rank += 1;
                rank <= LISTED || c.likely_cause
            });
            DimensionTail {
                dimension,
                values: values.len() as u64,
                messages: n,
                in_tail: k,
                listed,
                likely_causes,
            }
        })
        .collect();
    Concentration {
        cluster_size: g,
        tested,
        level,
        dimensions,
    }
}

/// `ln Γ(x)` for `x > 0`: Stirling's series from 10 on, the recurrence
/// `Γ(x) = Γ(x + 1) / x` below (absolute error below 1e-13 at small `x`, relative
/// 1e-15 at large).
fn ln_gamma(x: f64) -> f64 {
    let mut shift = 0.0;
    let mut x = x;
    while x < 10.0 {
        shift -= x.ln();
        x += 1.0;
    }
    let inv = 1.0 / x;
    let inv2 = inv * inv;
    let series =
        inv * (1.0 / 12.0 - inv2 * (1.0 / 360.0 - inv2 * (1.0 / 1260.0 - inv2 * (1.0 / 1680.0))));
    shift + (x - 0.5) * x.ln() - x + 0.5 * (2.0 * std::f64::consts::PI).ln() + series
}

/// `ln C(n, k)`.
fn ln_choose(n: u64, k: u64) -> f64 {
    ln_gamma(n as f64 + 1.0) - ln_gamma(k as f64 + 1.0) - ln_gamma((n - k) as f64 + 1.0)
}

/// P(X ≥ `k`) for X ~ Binomial(`n`, `p`).
///
/// Above the mean, the terms from `k` up are summed (each from the one before) until they
/// fall below 1e-17 of the sum or after a million of them; what is left is bounded above
/// by a geometric series (each term is at most the ratio of the last two times the one
/// before it), so stopping early never makes the result smaller. Its relative error is
/// that of the first term's logarithm, about 1e-16 · ln(n!): 1e-12 at n = 1,000, 2e-7 at
/// n = 10^8. At or below the mean the result is at least about one half and is computed
/// as one minus the lower tail.
#[must_use]
pub fn binomial_at_least(k: u64, n: u64, p: f64) -> f64 {
    if k == 0 || p >= 1.0 {
        return 1.0;
    }
    if k > n || p <= 0.0 {
        return 0.0;
    }
    if (k as f64) <= n as f64 * p {
        // 1 - P(X <= k - 1) = 1 - P(n - X >= n - k + 1), with n - X ~ Binomial(n, 1 - p),
        // above its mean.
        return (1.0 - binomial_at_least(n - k + 1, n, 1.0 - p)).clamp(0.0, 1.0);
    }
    let odds = p / (1.0 - p);
    let mut term = (ln_choose(n, k) + k as f64 * p.ln() + (n - k) as f64 * (-p).ln_1p()).exp();
    let mut sum = 0.0;
    let mut j = k;
    for _ in 0..MAX_TERMS {
        sum += term;
        if j == n {
            return sum.min(1.0);
        }
        // term(j + 1) / term(j), below 1 above the mean and falling as j rises.
        let ratio = (n - j) as f64 / (j + 1) as f64 * odds;
        term *= ratio;
        j += 1;
        if term <= sum * 1e-17 || term == 0.0 {
            return (sum + term / (1.0 - ratio)).min(1.0);
        }
    }
    let ratio = (n - j) as f64 / (j + 1) as f64 * odds;
    (sum + term / (1.0 - ratio).max(f64::MIN_POSITIVE)).min(1.0)
}

/// Messages per state whose last stamps are sampled for the pipeline's groups (whole
/// batches of rows are taken until this many are).
const GROUP_SAMPLE: u64 = 65_536;

/// First byte of an encoded [`DimensionStats`].
const DIMENSIONS_TAG: u8 = 0x44;

/// The state of `dimension_stats(t_min, t_1, t_2, t_3, publisher, stream, metric_count,
/// time, first, last)`: over the messages with both stamps, per stream (`publisher`,
/// `stream`), per metric count and per second of `time` from `t_min`, the messages and
/// those whose `last - first` is at least each threshold (`i64::MAX`: a level not asked
/// for, not counted). One pass over every row: the keys and deltas by Arrow's kernels,
/// the counting by [`Tally::add_rows`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DimensionStats {
    thresholds: Vec<i64>,
    /// The last stamps of the first [`GROUP_SAMPLE`] or so messages a state saw (whole
    /// batches of rows, in file order), each with its messages: the pipeline's groups.
    groups: Tally,
    /// Messages sampled over the states merged into this one, and Σ size² of their
    /// groups.
    merged_groups: (u64, u64),
    /// Messages this state put in `groups`.
    group_rows: u64,
    /// Per stream, keyed `publisher · 2^32 + stream`.
    streams: Tally,
    metrics: Tally,
    seconds: Tally,
}

impl DimensionStats {
    /// Messages in the sample and Σ size² over their groups.
    fn group_sums(&self) -> (u64, u64) {
        let (mut n, mut sq) = self.merged_groups;
        for (_, c) in self.groups.entries() {
            n += c[0];
            sq += c[0] * c[0];
        }
        (n, sq)
    }

    /// The mean size of the group a message belongs to (Σ size² / Σ size over the
    /// messages sampled; 1 without them): how many messages, on average, leave the last
    /// hop with each one.
    #[must_use]
    pub fn group_size(&self) -> f64 {
        match self.group_sums() {
            (0, _) => 1.0,
            (n, sq) => (sq as f64 / n as f64).max(1.0),
        }
    }

    fn width(&self) -> usize {
        1 + self.thresholds.len()
    }

    fn is_empty(&self) -> bool {
        self.thresholds.is_empty() && self.metrics.is_empty()
    }

    /// Its counts as each dimension's values, one list per threshold asked for.
    #[must_use]
    pub fn dimensions(&self) -> Vec<Dimensions> {
        let w = self.width();
        let mut publishers: BTreeMap<i64, Vec<u64>> = BTreeMap::new();
        for (key, c) in self.streams.entries() {
            let sum = publishers.entry(key >> 32).or_insert_with(|| vec![0; w]);
            for (a, b) in sum.iter_mut().zip(c.iter()) {
                *a += b;
            }
        }
        let named = |t: &Tally, name: fn(i64) -> String| -> Named {
            t.entries()
                .into_iter()
                .map(|(k, c)| (name(k), c.to_vec()))
                .collect()
        };
        let dims: [(&str, Named); 4] = [
            (
                "publisher",
                publishers
                    .into_iter()
                    .map(|(k, c)| (k.to_string(), c))
                    .collect(),
            ),
            (
                "stream",
                named(&self.streams, |k| {
                    format!("{}/{}", k >> 32, k & 0xffff_ffff)
                }),
            ),
            ("metric count", named(&self.metrics, |k| k.to_string())),
            ("second", named(&self.seconds, second_value)),
        ];
        (0..self.thresholds.len())
            .map(|j| {
                dims.iter()
                    .map(|(name, values)| {
                        let counts: Counts = values
                            .iter()
                            .map(|(k, c)| (k.clone(), c[0], c[1 + j]))
                            .collect();
                        ((*name).to_owned(), counts)
                    })
                    .collect()
            })
            .collect()
    }
}

fn put_tally(out: &mut Vec<u8>, t: &Tally) {
    let entries = t.entries();
    put(out, entries.len() as u64);
    for (k, c) in entries {
        put_zigzag(out, k);
        c.iter().for_each(|&n| put(out, n));
    }
}

fn read_tally(r: &mut Reader<'_>, width: usize, len: usize) -> Result<Tally> {
    let bad = || corrupt(DimensionStats::NAME);
    let n = usize::try_from(r.varint().map_err(|_| bad())?)
        .ok()
        .filter(|&n| n <= len)
        .ok_or_else(bad)?;
    let mut t = Tally::new(width);
    let mut counters = vec![0; width];
    for _ in 0..n {
        let k = r.zigzag().map_err(|_| bad())?;
        for c in &mut counters {
            *c = r.varint().map_err(|_| bad())?;
        }
        t.add(k, &counters);
    }
    Ok(t)
}

impl BinaryState for DimensionStats {
    const NAME: &'static str = "dimension_stats";
    const STATE: &'static str = "dimensions";
    const GROUPED: bool = false;

    fn coerce(arg_types: &[DataType]) -> Result<Vec<DataType>> {
        if arg_types.len() != 10 || !arg_types.iter().all(binary_agg::nanoseconds) {
            return plan_err!(
                "dimension_stats takes the run's first time, three thresholds, a publisher, a \
                 stream, a metric count, a time and two hop stamps"
            );
        }
        Ok(vec![DataType::Int64; 10])
    }

    fn update(&mut self, values: &[ArrayRef]) -> Result<()> {
        use datafusion::arrow::array::Int64Array;
        use datafusion::arrow::compute::kernels::numeric::{
            add_wrapping, div, mul_wrapping, sub_wrapping,
        };
        let [
            t_min,
            t1,
            t2,
            t3,
            publisher,
            stream,
            metrics,
            time,
            first,
            last,
        ] = values
        else {
            return plan_err!("dimension_stats takes ten arguments");
        };
        if first.is_empty() {
            return Ok(());
        }
        if self.is_empty() {
            self.thresholds = [t1, t2, t3]
                .iter()
                .filter_map(|t| literal(t))
                .filter(|&t| t < i64::MAX)
                .collect();
            let w = self.width();
            (self.streams, self.metrics, self.seconds) =
                (Tally::new(w), Tally::new(w), Tally::new(w));
            self.groups = Tally::new(1);
        }
        let t_min = literal(t_min).unwrap_or(0);
        let scalar = Int64Array::new_scalar;
        let deltas = sub_wrapping(last, first)?;
        let streams = add_wrapping(&mul_wrapping(publisher, &scalar(1 << 32))?, stream)?;
        let seconds = div(&sub_wrapping(time, &scalar(t_min))?, &scalar(1_000_000_000))?;
        let both = NullBuffer::union(
            first.logical_nulls().as_ref(),
            last.logical_nulls().as_ref(),
        );
        let timed = NullBuffer::union(both.as_ref(), time.logical_nulls().as_ref());
        fn bits(n: &Option<NullBuffer>) -> Option<(&[u8], usize)> {
            n.as_ref().map(|n| (n.inner().values(), n.inner().offset()))
        }
        let ints = |a: &ArrayRef| a.as_primitive::<Int64Type>().values().clone();
        let (d, st, m, sec) = (ints(&deltas), ints(&streams), ints(metrics), ints(&seconds));
        self.streams
            .add_rows(&st, &d, bits(&both), &self.thresholds);
        self.metrics.add_rows(&m, &d, bits(&both), &self.thresholds);
        self.seconds
            .add_rows(&sec, &d, bits(&timed), &self.thresholds);
        if self.group_rows < GROUP_SAMPLE {
            let stamps = last.as_primitive::<Int64Type>().values();
            self.groups.add_rows(stamps, &d, bits(&both), &[]);
            self.group_rows += (d.len() - both.as_ref().map_or(0, NullBuffer::null_count)) as u64;
        }
        Ok(())
    }

    fn merge(&mut self, other: &Self) {
        if other.is_empty() {
            return;
        }
        if self.is_empty() {
            *self = other.clone();
            return;
        }
        self.streams.merge(&other.streams);
        self.metrics.merge(&other.metrics);
        self.seconds.merge(&other.seconds);
        // Two states' samples are disjoint runs of rows: a batch split between them
        // counts as two groups, which only makes groups look smaller.
        let (n, sq) = other.group_sums();
        self.merged_groups.0 += n;
        self.merged_groups.1 += sq;
    }

    fn encode(&self) -> Vec<u8> {
        let mut out = vec![DIMENSIONS_TAG];
        put(&mut out, self.thresholds.len() as u64);
        self.thresholds
            .iter()
            .for_each(|&t| put_zigzag(&mut out, t));
        for t in [&self.streams, &self.metrics, &self.seconds] {
            put_tally(&mut out, t);
        }
        let (n, sq) = self.group_sums();
        put(&mut out, n);
        put(&mut out, sq);
        out
    }

    fn decode(bytes: &[u8]) -> Result<Self> {
        let bad = || corrupt(Self::NAME);
        let mut r = Reader::new(bytes);
        if r.byte().map_err(|_| bad())? != DIMENSIONS_TAG {
            return Err(bad());
        }
        let levels = usize::try_from(r.varint().map_err(|_| bad())?)
            .ok()
            .filter(|&n| n <= 3)
            .ok_or_else(bad)?;
        let thresholds = (0..levels)
            .map(|_| r.zigzag().map_err(|_| bad()))
            .collect::<Result<Vec<_>>>()?;
        let w = 1 + thresholds.len();
        let streams = read_tally(&mut r, w, bytes.len())?;
        let metrics = read_tally(&mut r, w, bytes.len())?;
        let seconds = read_tally(&mut r, w, bytes.len())?;
        let merged_groups = (
            r.varint().map_err(|_| bad())?,
            r.varint().map_err(|_| bad())?,
        );
        r.finish().map_err(|_| bad())?;
        Ok(Self {
            thresholds,
            groups: Tally::new(1),
            merged_groups,
            group_rows: 0,
            streams,
            metrics,
            seconds,
        })
    }

    fn allocated_bytes(&self) -> usize {
        self.streams.allocated_bytes()
            + self.groups.allocated_bytes()
            + self.metrics.allocated_bytes()
            + self.seconds.allocated_bytes()
    }
}

/// The `dimension_stats` aggregate (read with [`DimensionStats::decode`]).
pub(crate) fn dimension_stats_udaf() -> datafusion::logical_expr::AggregateUDF {
    binary_agg::udaf::<DimensionStats>()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Exact P(X >= k) by the terms' sum in f64, for small n.
    fn direct(k: u64, n: u64, p: f64) -> f64 {
        let mut c = 1.0_f64;
        let mut sum = 0.0;
        for j in 0..=n {
            if j > 0 {
                c = c * (n - j + 1) as f64 / j as f64;
            }
            if j >= k {
                sum += c * p.powi(j as i32) * (1.0 - p).powi((n - j) as i32);
            }
        }
        sum
    }

    #[test]
    fn the_binomial_tail_is_exact_where_it_can_be_checked() {
        assert!((binomial_at_least(8, 10, 0.5) - 56.0 / 1024.0).abs() < 1e-13);
        assert_eq!(binomial_at_least(0, 10, 0.3), 1.0);
        assert_eq!(binomial_at_least(11, 10, 0.3), 0.0);
        assert_eq!(binomial_at_least(1, 10, 0.0), 0.0);
        for (k, n, p) in [
            (3, 1000, 0.001),
            (1, 1, 0.01),
            (12, 40, 0.1),
            (2, 40, 0.1),
            (30, 60, 0.5),
            (5, 200, 0.01),
            (0, 5, 0.2),
        ] {
            let (got, want) = (binomial_at_least(k, n, p), direct(k, n, p));
            assert!(
                (got - want).abs() <= 1e-10 * want.max(1e-300) + 1e-15,
                "P(X >= {k}), n {n}, p {p}: {got} vs {want}"
            );
        }
    }

    #[test]
    fn the_binomial_tail_holds_at_a_hundred_million() {
        // Mean 1,000,000, standard deviation ~995: 5,000 above the mean is five of them.
        let p = binomial_at_least(1_005_000, 100_000_000, 0.01);
        // The normal tail beyond 5.03 standard deviations is ~2.5e-7.
        assert!((1e-7..1e-6).contains(&p), "{p}");
        // Just above the mean: about one half, and never below it.
        let p = binomial_at_least(1_000_001, 100_000_000, 0.01);
        assert!((0.45..0.51).contains(&p), "{p}");
        // Far beyond: below anything a double holds apart from zero.
        assert!(binomial_at_least(2_000_000, 100_000_000, 0.01) < 1e-300);
    }

    #[test]
    fn a_value_holding_the_tail_is_flagged_and_chance_is_not() {
        // 100 streams of 10,000 messages; the tail is 1 % overall. Stream 7 holds 600 of
        // the 10,000 tail messages; the others share the rest as chance would.
        let mut streams: Counts = (0..100)
            .map(|s| (format!("1/{s}"), 10_000, if s == 7 { 600 } else { 95 }))
            .collect();
        streams[3].2 = 110;
        let total_tail: u64 = streams.iter().map(|s| s.2).sum();
        let c = concentration(
            vec![
                ("stream".into(), streams),
                (
                    "publisher".into(),
                    vec![("1".into(), 1_000_000, total_tail)],
                ),
            ],
            1.0,
        );
        let d = &c.dimensions[0];
        assert_eq!(
            (d.values, d.messages, d.in_tail),
            (100, 1_000_000, total_tail)
        );
        assert_eq!(d.listed[0].value, "1/7");
        assert!(d.listed[0].likely_cause && d.listed[0].p_value < 1e-100);
        let rate = total_tail as f64 / 1e6;
        assert!((d.listed[0].times - 0.06 / rate).abs() < 1e-9);
        assert!((d.listed[0].expected - 10_000.0 * rate).abs() < 1e-9);
        // 110 where ~100 are expected is chance.
        assert_eq!(d.listed[1].value, "1/3");
        assert!(!d.listed[1].likely_cause, "{:?}", d.listed[1]);
        assert_eq!(d.likely_causes, 1);
        assert_eq!(c.causes().len(), 1);
        // One publisher holds the whole tail: nothing to compare, nothing tested.
        assert!(c.dimensions[1].listed.is_empty());
        assert_eq!(c.tested, 100);
        assert!((c.level - ALPHA / 100.0).abs() < 1e-18);
    }

    #[test]
    fn messages_that_share_their_fate_count_once() {
        // 10 seconds of 20,000 messages, 1,990 in the tail, second 3 holding 60 more than
        // each other: strong evidence one message at a time, none in groups of 12.
        let seconds: Counts = (0..10)
            .map(|s| (format!("+{s} s"), 20_000, if s == 3 { 253 } else { 193 }))
            .collect();
        let alone = concentration(vec![("second".into(), seconds.clone())], 1.0);
        assert_eq!(alone.causes().len(), 1);
        let batched = concentration(vec![("second".into(), seconds)], 12.0);
        assert!(batched.causes().is_empty(), "{batched:?}");
        let v = &batched.dimensions[0].listed[0];
        // The figures shown stay the messages'.
        assert_eq!(
            (v.value.as_str(), v.messages, v.in_tail),
            ("+3 s", 20_000, 253)
        );
        assert!(v.p_value > 0.01);
    }

    #[test]
    fn a_small_value_that_is_a_cause_is_listed_beyond_the_largest_excesses() {
        // Twelve large streams a little above the rate (chance), and a small one holding
        // 20 tail messages of 50 (0.5 expected): twelve larger excesses, one cause.
        let mut streams: Counts = (0..12)
            .map(|s| (format!("1/{s}"), 100_000, 1_030))
            .collect();
        streams.push(("1/99".into(), 50, 20));
        streams.extend((100..200).map(|s| (format!("1/{s}"), 100_000, 960)));
        let c = concentration(vec![("stream".into(), streams)], 1.0);
        let d = &c.dimensions[0];
        assert_eq!(d.likely_causes, 1);
        assert_eq!(d.listed.len(), LISTED + 1);
        let last = d.listed.last().unwrap();
        assert_eq!((last.value.as_str(), last.likely_cause), ("1/99", true));
        assert_eq!(c.causes()[0].1.value, "1/99");
        assert!(d.listed[..LISTED].iter().all(|v| !v.likely_cause));
    }

    #[test]
    fn one_slow_group_is_no_cause() {
        // The whole tail is one batch of 20 in one second of ten.
        let seconds: Counts = (0..10)
            .map(|s| (format!("+{s} s"), 2_000, if s == 4 { 20 } else { 0 }))
            .collect();
        let alone = concentration(vec![("second".into(), seconds.clone())], 1.0);
        assert_eq!(alone.causes().len(), 1);
        let grouped = concentration(vec![("second".into(), seconds)], 20.0);
        let v = &grouped.dimensions[0].listed[0];
        assert_eq!((v.value.as_str(), v.in_tail), ("+4 s", 20));
        // One group among the second's 100: as likely in any second.
        assert!(
            (v.p_value - (1.0 - 0.999_f64.powi(100))).abs() < 1e-9,
            "{v:?}"
        );
        assert!(grouped.causes().is_empty());
    }

    /// A row of (publisher, stream, metric count, time, first, last).
    type Row = (i64, i64, i64, i64, Option<i64>, Option<i64>);

    /// A dimension's value of a row, as the aggregate names it.
    type KeyOf = fn(&Row) -> String;

    /// Ten arguments of `dimension_stats` over `rows` of (publisher, stream, metric count,
    /// time, first, last), thresholds 50 and 80 (the third not asked for).
    fn args(rows: &[Row]) -> Vec<ArrayRef> {
        use datafusion::arrow::array::Int64Array;
        use std::sync::Arc;
        let n = rows.len();
        let lit = |v: i64| Arc::new(Int64Array::from(vec![v; n])) as ArrayRef;
        let col = |f: &dyn Fn(&Row) -> Option<i64>| {
            Arc::new(rows.iter().map(f).collect::<Int64Array>()) as ArrayRef
        };
        vec![
            lit(1_000_000_000),
            lit(50),
            lit(80),
            lit(i64::MAX),
            col(&|r| Some(r.0)),
            col(&|r| Some(r.1)),
            col(&|r| Some(r.2)),
            col(&|r| Some(r.3)),
            col(&|r| r.4),
            col(&|r| r.5),
        ]
    }

    #[test]
    fn dimension_stats_count_every_value_exactly_and_merge_as_one() {
        let mut rows = Vec::new();
        let mut r = 7_u64;
        for i in 0..5_000_i64 {
            r = r.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let d = ((r >> 40) % 100) as i64;
            // A publisher beyond the vector's reach, a stream beyond the dense range, a
            // missing stamp now and then.
            let publisher = if i % 97 == 0 { 70_000 } else { i % 3 };
            let stream = if i % 89 == 0 { 1 << 30 } else { i % 11 };
            let first = (i % 53 != 0).then_some(1_000);
            rows.push((
                publisher,
                stream,
                20 + i % 4,
                1_000_000_000 + i * 1_000_000,
                first,
                Some(1_000 + d),
            ));
        }
        let mut whole = DimensionStats::default();
        whole.update(&args(&rows)).unwrap();
        let (a, b) = rows.split_at(1_234);
        let mut left = DimensionStats::default();
        left.update(&args(a)).unwrap();
        let mut right = DimensionStats::default();
        right.update(&args(b)).unwrap();
        let mut merged = DimensionStats::decode(&left.encode()).unwrap();
        merged.merge(&DimensionStats::decode(&right.encode()).unwrap());
        assert_eq!(merged.dimensions(), whole.dimensions());
        let dims = whole.dimensions();
        assert_eq!(dims.len(), 2, "two thresholds asked for");
        for (j, t) in [50, 80].into_iter().enumerate() {
            let keys: [(&str, KeyOf); 4] = [
                ("publisher", |r| r.0.to_string()),
                ("stream", |r| format!("{}/{}", r.0, r.1)),
                ("metric count", |r| r.2.to_string()),
                ("second", |r| {
                    format!("+{} s", (r.3 - 1_000_000_000) / 1_000_000_000)
                }),
            ];
            for (d, key) in keys {
                let mut want: BTreeMap<String, (u64, u64)> = BTreeMap::new();
                for row in rows.iter().filter(|r| r.4.is_some()) {
                    let e = want.entry(key(row)).or_default();
                    e.0 += 1;
                    e.1 += u64::from(row.5.unwrap() - row.4.unwrap() >= t);
                }
                let got: BTreeMap<String, (u64, u64)> = dims[j]
                    .iter()
                    .find(|x| x.0 == d)
                    .unwrap()
                    .1
                    .iter()
                    .map(|(k, n, i)| (k.clone(), (*n, *i)))
                    .collect();
                assert_eq!(got, want, "{d} at {t}");
            }
        }
        assert!(DimensionStats::decode(&[0x44, 9]).is_err());
    }

    #[test]
    fn a_cause_that_starts_with_an_event_and_lasts_is_found_after_it() {
        // 20 seconds of 1,000 messages; 10 tail messages a second before second 10, 30
        // after: no second alone is unlikely at the level, the time after the event is.
        let seconds: Counts = (0..20)
            .map(|k| (second_value(k), 1_000, if k < 10 { 10 } else { 30 }))
            .collect();
        let dims: Dimensions = vec![("second".into(), seconds)];
        let t_min = 1_000_000_000_000;
        let event = |at_s: i64| crate::events::RunEvent {
            at_unix_ns: t_min + at_s * 1_000_000_000 + 400_000_000,
            kind: crate::events::EventKind::ClockOffsetMoved,
            subject: "h2".into(),
            detail: "d".into(),
        };
        // Two events in one second split once; one after the last second, not at all.
        let splits = event_splits(&dims, &[event(9), event(9), event(25)], t_min);
        assert_eq!(splits.len(), 1, "{splits:?}");
        assert_eq!(splits[0].0, AROUND_EVENTS);
        assert_eq!(
            splits[0].1,
            vec![
                ("before clock offset moved of h2 at +9 s".into(), 9_000, 90),
                ("after clock offset moved of h2 at +9 s".into(), 10_000, 300),
            ]
        );
        let mut all = dims.clone();
        all.extend(splits);
        let c = concentration(all, 1.0);
        assert_eq!(c.tested, 22);
        let causes = c.causes();
        assert_eq!(causes.len(), 1, "{causes:?}");
        assert_eq!(causes[0].0, AROUND_EVENTS);
        assert_eq!(causes[0].1.value, "after clock offset moved of h2 at +9 s");
        assert!(c.dimensions[0].likely_causes == 0);
    }
}
