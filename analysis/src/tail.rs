//! Why the tail is slow: for each headline stage, the messages at or above its P99 and
//! P99.9 (and P99.99 when that tail holds at least 100 messages), the share of their time
//! each component stage took against all messages, and the slowest messages with their
//! per-hop timelines.
//!
//! A headline stage `from -> to` is split into **components** that chain from `from` to
//! `to` ([`components`]): from the hop reached so far, the spec's stage that starts there
//! and ends nearest on the way to `to`; where no stage leads on, the next hop of the
//! pipeline (a hop that only holds another hop's earliest instant is not on the way).
//! The components' deltas add up to the headline stage's delta for every message that
//! has all their hops, so over those messages their mean shares add up to 100 %.
//!
//! The **tail set** at quantile `q` is every message whose delta is at or above the
//! lowest value of the HDR bucket that holds the stage's percentile `q` ([`floor`]): every
//! message the percentile can stand for is in it, so it holds at least the
//! `n - rank(q) + 1` largest deltas. Each component's figures over all messages are its
//! own, from the summary's scan (which scans the components that are not stages of the
//! spec too, [`extra_stages`]); so are the thresholds. One more aggregate, `tail_stats`
//! ([`TailStats`]), then reads only the rows at or above the lowest threshold or among the
//! slowest: a filter on the stage's two stamps that the Parquet reader evaluates first, so
//! the other columns are decoded for those rows alone.

use datafusion::arrow::array::{Array, ArrayRef, AsArray, FixedSizeBinaryArray, Int64Array};
use datafusion::arrow::buffer::NullBuffer;
use datafusion::arrow::datatypes::{DataType, Int64Type, UInt64Type};
use datafusion::common::{DataFusionError, Result, plan_err};
use datafusion::prelude::{SessionContext, ident, lit};
use hoptrace_format::hist::{Percentile, SignedStats, quantile_label, rank, signed_percentile};
use hoptrace_format::schema::hop_column;
use hoptrace_format::spec::{PipelineSpec, StageSpec};
use hoptrace_format::units::count;
use hoptrace_format::varint::{Reader, put, put_zigzag};
use serde::{Deserialize, Serialize};

use crate::AnalysisError;
use crate::binary_agg::{self, BinaryState, corrupt};

pub mod concentration;
pub mod table;
pub use concentration::{Concentrated, Concentration, DimensionTail};

/// The tail levels: a quantile and the fewest messages its tail must be expected to hold
/// (`n · (1 - q)`) for the level to be reported.
pub const LEVELS: [(f64, f64); 3] = [(0.99, 1.0), (0.999, 1.0), (0.9999, 100.0)];

/// Slowest messages listed per headline stage unless told otherwise.
pub const DEFAULT_EXEMPLARS: usize = 20;

/// Most slowest messages that can be asked for per stage.
pub const MAX_EXEMPLARS: usize = 10_000;

pub use hoptrace_format::spec::Component;

/// A component's figures over a set of messages.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ComponentFigures {
    /// HDR median with its precision; absent without messages.
    pub median: Option<Percentile>,
    /// Exact mean, ns.
    pub mean_ns: Option<f64>,
}

/// A component over one tail set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ComponentShare {
    /// HDR median with its precision, over the tail's messages that have every component.
    pub median: Option<Percentile>,
    /// Exact mean over them, ns.
    pub mean_ns: Option<f64>,
    /// Its mean over the stage's mean over those messages: the share of the tail's time.
    pub share: Option<f64>,
    /// Its mean above its mean over all messages, over the stage's mean above the stage's
    /// mean over all messages: the share of what makes the tail slower than the rest.
    pub share_of_excess: Option<f64>,
    /// Its median in the tail over its median over all messages (absent when that median
    /// is not above zero).
    pub times_median: Option<f64>,
}

/// The messages at or above one percentile of a headline stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TailLevel {
    /// The stage's percentile (as the stage's figures give it).
    pub percentile: Percentile,
    /// The tail holds the messages whose delta is at least this, ns: the lowest value of
    /// the percentile's HDR bucket.
    pub threshold_ns: i64,
    /// Messages in the tail.
    pub messages: u64,
    /// Of those, with every component's hops: the messages the shares are over.
    pub with_components: u64,
    /// The stage's exact mean over those, ns.
    pub mean_ns: Option<f64>,
    /// One per component, in chain order.
    pub components: Vec<ComponentShare>,
    /// Where the tail concentrates, by each dimension of the dataset; absent where it
    /// was not computed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concentration: Option<Concentration>,
}

/// One of the slowest messages of a headline stage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exemplar {
    /// Its key.
    pub publisher: u16,
    /// Its key.
    pub stream: u32,
    /// Its key.
    pub sequence: u64,
    /// Its time as the report places messages (its first hop's stamp, else its intended
    /// send time), Unix ns.
    pub time_unix_ns: Option<i64>,
    /// The stage's delta, ns.
    pub delta_ns: i64,
    /// Each component's delta in chain order, ns; absent where a hop is missing.
    pub components_ns: Vec<Option<i64>>,
    /// The W3C trace id it carried (32 hex digits), for finding it in a trace backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub otel_trace_id: Option<String>,
}

/// The tail attribution of one headline stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TailAttribution {
    /// The headline stage.
    pub stage: String,
    /// Its components, in chain order.
    pub components: Vec<Component>,
    /// Messages with the stage's delta.
    pub messages: u64,
    /// The stage's exact mean over them, ns.
    pub mean_ns: Option<f64>,
    /// Each component over all messages with its two hops (its own figures).
    pub overall: Vec<ComponentFigures>,
    /// The tail sets, from P99 up.
    pub levels: Vec<TailLevel>,
    /// The slowest messages, slowest first.
    pub exemplars: Vec<Exemplar>,
    /// Levels left out, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

impl TailAttribution {
    /// The component with the largest share of the tail's time at `level`, with that
    /// share.
    #[must_use]
    pub fn dominant(&self, level: &TailLevel) -> Option<(&Component, f64)> {
        self.components
            .iter()
            .zip(&level.components)
            .filter_map(|(c, s)| Some((c, s.share?)))
            .max_by(|a, b| a.1.total_cmp(&b.1))
    }
}

/// The components of `head` in `spec` ([`PipelineSpec::components`]).
#[must_use]
pub fn components(spec: &PipelineSpec, head: &StageSpec) -> Vec<Component> {
    spec.components(head)
}

/// A headline stage that splits: its index in the spec and its components.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TailPlan {
    /// Index of the stage in the spec.
    pub stage: usize,
    /// Its components, in chain order.
    pub components: Vec<Component>,
}

/// Every headline stage of `spec` that splits into more than one component.
#[must_use]
pub fn plans(spec: &PipelineSpec) -> Vec<TailPlan> {
    spec.stages
        .iter()
        .enumerate()
        .filter(|(_, st)| st.headline)
        .map(|(stage, st)| TailPlan {
            stage,
            components: components(spec, st),
        })
        .filter(|p| p.components.len() > 1)
        .collect()
}

/// The components of `plans` that are not in `scan` (by their hops), as stages to add to
/// it, each once.
#[must_use]
pub fn extra_stages(plans: &[TailPlan], scan: &[StageSpec]) -> Vec<StageSpec> {
    let mut out: Vec<StageSpec> = Vec::new();
    for c in plans.iter().flat_map(|p| &p.components) {
        let known = |s: &StageSpec| s.from == c.from && s.to == c.to;
        if !scan.iter().any(known) && !out.iter().any(known) {
            out.push(StageSpec {
                name: c.name.clone(),
                from: c.from.clone(),
                to: c.to.clone(),
                definition: format!("{} to {} (a component of a headline stage)", c.from, c.to),
                headline: false,
            });
        }
    }
    out
}

/// The lowest value of the HDR bucket holding the value of rank `r` (from 1, ascending) of
/// `s`; `None` without values.
fn floor_at_rank(s: &SignedStats, r: u64) -> Option<i64> {
    let n = s.pos.len() + s.neg.len();
    // A quantile whose rank (`ceil(q · n)`) is `r`.
    floor(s, (r.clamp(1, n.max(1)) as f64 - 0.5) / n.max(1) as f64)
}

/// The lowest value of the HDR bucket holding percentile `q` of `s` (the value of rank
/// `max(1, ceil(q · n))`); `None` without values.
#[must_use]
pub fn floor(s: &SignedStats, q: f64) -> Option<i64> {
    signed_percentile(&s.pos, &s.neg, q).map(bucket_floor)
}

/// The lowest value of the HDR bucket of `p`, a percentile as the histogram gives it (the
/// middle of its bucket, not moved within the values' extremes).
#[must_use]
pub fn bucket_floor(p: Percentile) -> i64 {
    let half = i64::try_from(p.precision_ns).unwrap_or(i64::MAX);
    if p.value_ns >= 0 {
        // The bucket's lowest value is its middle less half its width.
        p.value_ns - half
    } else {
        // Magnitudes v ..= v + width - 1 (middle v + half, width 2·half or 1): the lowest
        // signed value is -(v + width - 1).
        p.value_ns - half + i64::from(half > 0)
    }
}

/// First byte of an encoded [`TailStats`].
const TAIL_TAG: u8 = 0x54;

/// One tail set's running figures.
#[derive(Debug, Clone, Default, PartialEq)]
struct LevelStats {
    threshold: i64,
    messages: u64,
    with_components: u64,
    head: SignedStats,
    components: Vec<SignedStats>,
}

/// The state of `tail_stats(exemplars, t_1, t_2, t_3, time, publisher, stream, sequence,
/// trace_id, hop_0, ..., hop_k)`: over the messages with both `hop_0` and `hop_k` (the
/// headline stage `hop_k - hop_0`), the figures of the stage and of every component
/// `hop_{i+1} - hop_i` over each tail set (delta at least `t_j`; `i64::MAX` for a level
/// not asked for), and the `exemplars` largest deltas with their keys, times, components
/// and trace ids. Rows below every threshold and the slowest so far cost a comparison.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TailStats {
    exemplars: usize,
    levels: Vec<LevelStats>,
    top: Vec<Exemplar>,
    /// Deltas below this cannot enter `top` (it is full of larger ones).
    top_floor: i64,
}

/// `top` slowest first (ties in key order), cut to its `n` slowest.
fn sort_slowest(top: &mut Vec<Exemplar>, n: usize) {
    top.sort_by(|a, b| {
        b.delta_ns.cmp(&a.delta_ns).then_with(|| {
            (a.publisher, a.stream, a.sequence).cmp(&(b.publisher, b.stream, b.sequence))
        })
    });
    top.truncate(n);
}

/// Arguments of `tail_stats` before the hops.
const FIXED_ARGS: usize = 9;

impl TailStats {
    /// The slowest messages, slowest first: a copy of them alone, not of the histograms.
    fn slowest(&self) -> Vec<Exemplar> {
        let mut top = self.top.clone();
        sort_slowest(&mut top, self.exemplars);
        top
    }

    /// Components per message.
    fn width(&self) -> usize {
        self.levels.first().map_or(0, |l| l.components.len())
    }

    /// Keeps the `exemplars` slowest of `top`, slowest first (ties by key).
    fn trim(&mut self) {
        sort_slowest(&mut self.top, self.exemplars);
        if self.exemplars > 0 && self.top.len() == self.exemplars {
            self.top_floor = self.top.last().map_or(i64::MIN, |e| e.delta_ns);
        }
    }

    fn shape(&mut self, exemplars: usize, thresholds: &[i64], components: usize) {
        if self.levels.is_empty() {
            self.exemplars = exemplars;
            self.top_floor = i64::MIN;
            self.levels = thresholds
                .iter()
                .map(|&threshold| LevelStats {
                    threshold,
                    components: vec![SignedStats::default(); components],
                    ..LevelStats::default()
                })
                .collect();
        }
    }

    /// Its figures as a [`TailAttribution`] of `stage` (name and figures over all messages)
    /// with `components` (and each one's figures over all messages); `levels`: the
    /// stage's percentile of each level asked for, with its index among the thresholds.
    #[must_use]
    pub fn attribution(
        &self,
        stage: (&str, &SignedStats),
        components: (Vec<Component>, &[&SignedStats]),
        levels: &[(usize, Percentile)],
        notes: Vec<String>,
    ) -> TailAttribution {
        let (stage, head) = stage;
        let (components, figures) = components;
        let overall: Vec<ComponentFigures> = figures
            .iter()
            .map(|c| ComponentFigures {
                median: c.percentile(0.5),
                mean_ns: c.mean_ns(),
            })
            .collect();
        let head_mean = head.mean_ns();
        let levels = levels
            .iter()
            .filter_map(|&(j, percentile)| {
                let l = self.levels.get(j)?;
                let mean = l.head.mean_ns();
                let excess = mean.zip(head_mean).map(|(t, a)| t - a);
                Some(TailLevel {
                    percentile,
                    threshold_ns: l.threshold,
                    messages: l.messages,
                    with_components: l.with_components,
                    mean_ns: mean,
                    components: l
                        .components
                        .iter()
                        .zip(&overall)
                        .map(|(c, all)| {
                            let m = c.mean_ns();
                            let median = c.percentile(0.5);
                            ComponentShare {
                                median,
                                mean_ns: m,
                                share: m.zip(mean).filter(|(_, t)| *t != 0.0).map(|(m, t)| m / t),
                                share_of_excess: m
                                    .zip(all.mean_ns)
                                    .zip(excess)
                                    .filter(|(_, e)| *e != 0.0)
                                    .map(|((m, a), e)| (m - a) / e),
                                times_median: median
                                    .zip(all.median)
                                    .filter(|(_, a)| a.value_ns > 0)
                                    .map(|(t, a)| t.value_ns as f64 / a.value_ns as f64),
                            }
                        })
                        .collect(),
                    concentration: None,
                })
            })
            .collect();
        TailAttribution {
            stage: stage.to_owned(),
            components,
            messages: head.count,
            mean_ns: head_mean,
            overall,
            levels,
            exemplars: self.slowest(),
            notes,
        }
    }
}

/// The `tail_stats` aggregate (not registered in sessions: read with
/// [`TailStats::decode`](BinaryState::decode) through [`attribution`]).
fn tail_stats_udaf() -> datafusion::logical_expr::AggregateUDF {
    binary_agg::udaf::<TailStats>()
}

/// The first value of a literal argument (expanded to the batch's length).
pub(crate) fn literal(a: &ArrayRef) -> Option<i64> {
    let a = a.as_primitive::<Int64Type>();
    (!a.is_empty() && a.is_valid(0)).then(|| a.value(0))
}

fn put_stats(out: &mut Vec<u8>, s: &SignedStats) {
    let bytes = s.encode();
    put(out, bytes.len() as u64);
    out.extend_from_slice(&bytes);
}

fn read_stats(r: &mut Reader<'_>) -> Result<SignedStats> {
    let bad = || corrupt(<TailStats as BinaryState>::NAME);
    let len = usize::try_from(r.varint().map_err(|_| bad())?).map_err(|_| bad())?;
    SignedStats::decode(r.take(len).map_err(|_| bad())?).map_err(|_| bad())
}

fn put_option(out: &mut Vec<u8>, v: Option<i64>) {
    match v {
        Some(v) => {
            out.push(1);
            put_zigzag(out, v);
        }
        None => out.push(0),
    }
}

fn read_option(r: &mut Reader<'_>) -> Result<Option<i64>> {
    let bad = || corrupt(<TailStats as BinaryState>::NAME);
    match r.byte().map_err(|_| bad())? {
        0 => Ok(None),
        1 => Ok(Some(r.zigzag().map_err(|_| bad())?)),
        _ => Err(bad()),
    }
}

/// 32 lower-case hex digits of a trace id.
fn hex(id: &[u8]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

impl BinaryState for TailStats {
    const NAME: &'static str = "tail_stats";
    const STATE: &'static str = "tail";
    const GROUPED: bool = false;

    fn coerce(arg_types: &[DataType]) -> Result<Vec<DataType>> {
        let id = |t: &DataType| matches!(t, DataType::FixedSizeBinary(16) | DataType::Null);
        if arg_types.len() < FIXED_ARGS + 2
            || !arg_types[..8].iter().all(binary_agg::nanoseconds)
            || !id(&arg_types[8])
            || !arg_types[FIXED_ARGS..].iter().all(binary_agg::nanoseconds)
        {
            return plan_err!(
                "tail_stats takes the exemplars wanted, three thresholds, a time, publisher, \
                 stream, sequence, a trace id (16 bytes) and at least two hop stamps"
            );
        }
        let mut out = vec![DataType::Int64; 5];
        out.extend(std::iter::repeat_n(DataType::UInt64, 3));
        out.push(DataType::FixedSizeBinary(16));
        out.extend(std::iter::repeat_n(
            DataType::Int64,
            arg_types.len() - FIXED_ARGS,
        ));
        Ok(out)
    }

    fn update(&mut self, values: &[ArrayRef]) -> Result<()> {
        let (fixed, hops) = values.split_at(FIXED_ARGS.min(values.len()));
        let [n, t1, t2, t3, time, publisher, stream, sequence, trace_id] = fixed else {
            return plan_err!("tail_stats: too few arguments");
        };
        if hops.len() < 2 || n.is_empty() {
            return Ok(());
        }
        let exemplars = literal(n)
            .and_then(|n| usize::try_from(n).ok())
            .filter(|&n| n <= MAX_EXEMPLARS)
            .ok_or_else(|| {
                DataFusionError::Execution(format!(
                    "tail_stats: the exemplars wanted must be 0 to {MAX_EXEMPLARS}"
                ))
            })?;
        let thresholds: Vec<i64> = [t1, t2, t3]
            .iter()
            .map(|t| literal(t).unwrap_or(i64::MAX))
            .collect();
        self.shape(exemplars, &thresholds, hops.len() - 1);
        let hops: Vec<&Int64Array> = hops.iter().map(|h| h.as_primitive::<Int64Type>()).collect();
        let (first, last) = (hops[0], hops[hops.len() - 1]);
        let all_nulls = hops.iter().fold(None::<NullBuffer>, |acc, h| {
            NullBuffer::union(acc.as_ref(), h.logical_nulls().as_ref())
        });
        let all_valid = |i: usize| all_nulls.as_ref().is_none_or(|n| n.is_valid(i));
        let ends_valid = |i: usize| first.is_valid(i) && last.is_valid(i);

        // The rows in a tail or among the slowest so far: few, one by one.
        let lowest = self
            .levels
            .iter()
            .map(|l| l.threshold)
            .min()
            .unwrap_or(i64::MAX);
        let exemplar_floor = if self.exemplars == 0 {
            i64::MAX
        } else {
            self.top_floor
        };
        let entry = lowest.min(exemplar_floor);
        let (time, trace_id): (&Int64Array, &FixedSizeBinaryArray) = (
            time.as_primitive::<Int64Type>(),
            trace_id.as_fixed_size_binary(),
        );
        let key = |a: &ArrayRef, i: usize| a.as_primitive::<UInt64Type>().value(i);
        for i in 0..first.len() {
            let d = last.value(i).wrapping_sub(first.value(i));
            if d < entry || !ends_valid(i) {
                continue;
            }
            let complete = all_valid(i);
            for l in &mut self.levels {
                if d >= l.threshold {
                    l.messages += 1;
                    if complete {
                        l.with_components += 1;
                        l.head.add(d);
                        for (c, s) in l.components.iter_mut().enumerate() {
                            s.add(hops[c + 1].value(i).wrapping_sub(hops[c].value(i)));
                        }
                    }
                }
            }
            if self.exemplars > 0 && d >= self.top_floor {
                let valid = |a: &Int64Array| a.is_valid(i).then(|| a.value(i));
                self.top.push(Exemplar {
                    publisher: u16::try_from(key(publisher, i)).unwrap_or(u16::MAX),
                    stream: u32::try_from(key(stream, i)).unwrap_or(u32::MAX),
                    sequence: key(sequence, i),
                    time_unix_ns: valid(time),
                    delta_ns: d,
                    components_ns: hops
                        .windows(2)
                        .map(|p| Some(valid(p[1])?.wrapping_sub(valid(p[0])?)))
                        .collect(),
                    otel_trace_id: trace_id.is_valid(i).then(|| hex(trace_id.value(i))),
                });
                if self.top.len() >= 2 * self.exemplars.max(8) {
                    self.trim();
                }
            }
        }
        Ok(())
    }

    fn merge(&mut self, other: &Self) {
        if other.levels.is_empty() {
            return;
        }
        if self.levels.is_empty() {
            *self = other.clone();
            return;
        }
        for (a, b) in self.levels.iter_mut().zip(&other.levels) {
            a.messages += b.messages;
            a.with_components += b.with_components;
            a.head.merge(&b.head);
            for (x, y) in a.components.iter_mut().zip(&b.components) {
                x.merge(y);
            }
        }
        self.top.extend(other.top.iter().cloned());
        self.trim();
    }

    fn encode(&self) -> Vec<u8> {
        let s = self;
        let top = s.slowest();
        let mut out = vec![TAIL_TAG];
        put(&mut out, s.exemplars as u64);
        put(&mut out, s.width() as u64);
        put(&mut out, s.levels.len() as u64);
        for l in &s.levels {
            put_zigzag(&mut out, l.threshold);
            put(&mut out, l.messages);
            put(&mut out, l.with_components);
            put_stats(&mut out, &l.head);
            for c in &l.components {
                put_stats(&mut out, c);
            }
        }
        put(&mut out, top.len() as u64);
        for e in &top {
            put(&mut out, u64::from(e.publisher));
            put(&mut out, u64::from(e.stream));
            put(&mut out, e.sequence);
            put_option(&mut out, e.time_unix_ns);
            put_zigzag(&mut out, e.delta_ns);
            for c in &e.components_ns {
                put_option(&mut out, *c);
            }
            match &e.otel_trace_id {
                Some(id) => {
                    out.push(1);
                    out.extend_from_slice(id.as_bytes());
                }
                None => out.push(0),
            }
        }
        out
    }

    fn decode(bytes: &[u8]) -> Result<Self> {
        let bad = || corrupt(Self::NAME);
        let mut r = Reader::new(bytes);
        if r.byte().map_err(|_| bad())? != TAIL_TAG {
            return Err(bad());
        }
        let count = |r: &mut Reader<'_>| {
            usize::try_from(r.varint().map_err(|_| bad())?)
                .ok()
                .filter(|&n| n <= bytes.len())
                .ok_or_else(bad)
        };
        let exemplars = count(&mut r)?;
        let width = count(&mut r)?;
        let nlevels = count(&mut r)?;
        let mut levels = Vec::with_capacity(nlevels);
        for _ in 0..nlevels {
            levels.push(LevelStats {
                threshold: r.zigzag().map_err(|_| bad())?,
                messages: r.varint().map_err(|_| bad())?,
                with_components: r.varint().map_err(|_| bad())?,
                head: read_stats(&mut r)?,
                components: (0..width)
                    .map(|_| read_stats(&mut r))
                    .collect::<Result<Vec<_>>>()?,
            });
        }
        let ntop = count(&mut r)?;
        let mut top = Vec::with_capacity(ntop);
        for _ in 0..ntop {
            top.push(Exemplar {
                publisher: u16::try_from(r.varint().map_err(|_| bad())?).map_err(|_| bad())?,
                stream: u32::try_from(r.varint().map_err(|_| bad())?).map_err(|_| bad())?,
                sequence: r.varint().map_err(|_| bad())?,
                time_unix_ns: read_option(&mut r)?,
                delta_ns: r.zigzag().map_err(|_| bad())?,
                components_ns: (0..width)
                    .map(|_| read_option(&mut r))
                    .collect::<Result<Vec<_>>>()?,
                otel_trace_id: match r.byte().map_err(|_| bad())? {
                    0 => None,
                    1 => Some(
                        std::str::from_utf8(r.take(32).map_err(|_| bad())?)
                            .map_err(|_| bad())?
                            .to_owned(),
                    ),
                    _ => return Err(bad()),
                },
            });
        }
        r.finish().map_err(|_| bad())?;
        let mut s = Self {
            exemplars,
            levels,
            top,
            top_floor: i64::MIN,
        };
        s.trim();
        Ok(s)
    }

    fn allocated_bytes(&self) -> usize {
        self.levels
            .iter()
            .flat_map(|l| std::iter::once(&l.head).chain(&l.components))
            .map(SignedStats::allocated_bytes)
            .sum::<usize>()
            + self.top.capacity() * std::mem::size_of::<Exemplar>()
    }
}

/// A plan with what the summary's scan gave it.
struct Planned<'a> {
    plan: &'a TailPlan,
    /// The stage over all messages.
    head: &'a SignedStats,
    /// Each component over all messages.
    parts: Vec<&'a SignedStats>,
    /// The levels reported: index into [`LEVELS`] and the stage's percentile.
    levels: Vec<(usize, Percentile)>,
    /// Levels left out, and why.
    notes: Vec<String>,
    /// Each level's threshold (`i64::MAX`: not reported).
    thresholds: [i64; 3],
}

/// The tail attribution of each of `plans` over the traces of `ctx` (`time_col`: the SQL
/// of a trace's time, `t_min` the run's first), with every figure over all messages from
/// `figures`, the summary's scan of `scan` (the spec's stages first, then
/// [`extra_stages`]), and the `exemplars` slowest messages of each: one aggregate per
/// plan, all in one scan of the rows that can be in a tail; beside it, one scan of every
/// row ([`concentration::DimensionStats`]) for where each tail concentrates, before and
/// after each of the run's `events` too ([`concentration::event_splits`]).
///
/// # Errors
/// When `exemplars` exceeds [`MAX_EXEMPLARS`], a component is not in `scan`, or the query
/// fails.
pub async fn attribution(
    ctx: &SessionContext,
    plans: &[TailPlan],
    scan: &[StageSpec],
    figures: &[SignedStats],
    time: (&str, i64),
    exemplars: usize,
    events: &[crate::events::RunEvent],
) -> Result<Vec<TailAttribution>, AnalysisError> {
    let (time_col, t_min) = time;
    if exemplars > MAX_EXEMPLARS {
        return Err(AnalysisError::Query(format!(
            "{exemplars} slowest messages asked for per stage: at most {MAX_EXEMPLARS}"
        )));
    }
    let scanned = |from: &str, to: &str| {
        scan.iter()
            .zip(figures)
            .find(|(s, _)| s.from == from && s.to == to)
            .map(|(_, f)| f)
            .ok_or_else(|| AnalysisError::Render(format!("internal: {from} -> {to} not scanned")))
    };
    // A session that filters rows in the Parquet reader: the rows of the tails are read
    // whole, the others only for the stage's two stamps.
    let mut state = ctx.state();
    state
        .config_mut()
        .options_mut()
        .execution
        .parquet
        .pushdown_filters = true;
    let tail_ctx = SessionContext::new_with_state(state);
    let df = tail_ctx.table("traces_raw").await?;
    let mut found = Vec::new();
    let mut aggregates = Vec::new();
    let mut wanted = None::<datafusion::prelude::Expr>;
    for plan in plans {
        let (first, last) = (
            &plan.components[0].from,
            &plan.components[plan.components.len() - 1].to,
        );
        let head = scanned(first, last)?;
        let parts = plan
            .components
            .iter()
            .map(|c| scanned(&c.from, &c.to))
            .collect::<Result<Vec<_>, _>>()?;
        let mut thresholds = [i64::MAX; 3];
        let mut levels = Vec::new();
        let mut notes = Vec::new();
        if head.count == 0 {
            notes.push(format!(
                "no message has both {first} and {last}: there is no tail to attribute"
            ));
        }
        for (j, &(q, fewest)) in LEVELS.iter().enumerate().filter(|_| head.count > 0) {
            let expected = head.count as f64 * (1.0 - q);
            match (floor(head, q), head.percentile(q)) {
                (Some(t), Some(p)) if expected >= fewest => {
                    thresholds[j] = t;
                    levels.push((j, p));
                }
                _ => notes.push(format!(
                    "no {label} tail: {} messages; a {label} tail (the top {}) is reported from {} messages, when it is expected to hold {}",
                    count(head.count),
                    format_args!("{:.2} %", (1.0 - q) * 100.0),
                    count((fewest / (1.0 - q)).round() as u64),
                    count(fewest as u64),
                    label = quantile_label(q),
                )),
            }
        }
        // The rows this plan reads: in a tail, or in the bucket of the slowest messages.
        let slowest = (exemplars > 0)
            .then(|| floor_at_rank(head, head.count.saturating_sub(exemplars as u64) + 1))
            .flatten();
        if let Some(entry) = thresholds
            .iter()
            .copied()
            .chain(slowest)
            .min()
            .filter(|&t| t < i64::MAX)
        {
            let delta = ident(hop_column(last)) - ident(hop_column(first));
            // Two stamps' difference is a duration.
            let this = delta.gt_eq(lit(datafusion::common::ScalarValue::DurationNanosecond(
                Some(entry),
            )));
            wanted = Some(match wanted {
                Some(w) => w.or(this),
                None => this,
            });
        }
        let mut args = vec![lit(exemplars as i64)];
        args.extend(thresholds.iter().map(|&t| lit(t)));
        args.push(df.parse_sql_expr(time_col)?);
        args.extend(["publisher", "stream", "sequence", "otel_trace_id"].map(ident));
        args.push(ident(hop_column(first)));
        args.extend(plan.components.iter().map(|c| ident(hop_column(&c.to))));
        aggregates.push(
            tail_stats_udaf()
                .call(args)
                .alias(format!("t_{}", found.len())),
        );
        found.push(Planned {
            plan,
            head,
            parts,
            levels,
            notes,
            thresholds,
        });
    }
    // Where each tail concentrates: one aggregate per stage with a tail, over every row.
    let all = ctx.table("traces_raw").await?;
    let mut grouped = Vec::new();
    let mut dimension_aggs = Vec::new();
    for (i, f) in found
        .iter()
        .enumerate()
        .filter(|(_, f)| !f.levels.is_empty())
    {
        let mut args = vec![lit(t_min)];
        args.extend(f.thresholds.iter().map(|&t| lit(t)));
        args.extend(["publisher", "stream", "metric_count"].map(ident));
        args.push(all.parse_sql_expr(time_col)?);
        args.push(ident(hop_column(&f.plan.components[0].from)));
        args.push(ident(hop_column(
            &f.plan.components[f.plan.components.len() - 1].to,
        )));
        dimension_aggs.push(
            concentration::dimension_stats_udaf()
                .call(args)
                .alias(format!("d_{}", grouped.len())),
        );
        grouped.push(i);
    }
    let tails = async {
        let started = std::time::Instant::now();
        let Some(w) = wanted else {
            // Nothing to look for (no message, no tail, no slowest asked for).
            return Ok(vec![TailStats::default(); found.len()]);
        };
        let batches = df
            .filter(w)?
            .aggregate(vec![], aggregates)?
            .collect()
            .await?;
        tracing::info!(
            "tail attribution: the tails' scan took {:.2} s",
            started.elapsed().as_secs_f64()
        );
        each_state(&batches, "t", found.len(), |bytes| {
            bytes.map_or(Ok(TailStats::default()), TailStats::decode)
        })
    };
    let dimensions = async {
        if grouped.is_empty() {
            return Ok::<_, AnalysisError>(Vec::new());
        }
        let started = std::time::Instant::now();
        let batches = all.aggregate(vec![], dimension_aggs)?.collect().await?;
        tracing::info!(
            "tail attribution: the dimensions' scan took {:.2} s",
            started.elapsed().as_secs_f64()
        );
        each_state(&batches, "d", grouped.len(), |bytes| {
            bytes.map_or(Ok((Vec::new(), 1.0)), |b| {
                let d = concentration::DimensionStats::decode(b)?;
                Ok((d.dimensions(), d.group_size()))
            })
        })
    };
    let (states, dims) = tokio::try_join!(tails, dimensions)?;
    let mut out: Vec<TailAttribution> = found
        .into_iter()
        .zip(states)
        .map(|(f, state)| {
            state.attribution(
                (&stage_name(f.plan, scan), f.head),
                (f.plan.components.clone(), &f.parts),
                &f.levels,
                f.notes,
            )
        })
        .collect();
    for (i, (per_level, group)) in grouped.iter().zip(dims) {
        for (level, mut counts) in out[*i].levels.iter_mut().zip(per_level) {
            let around = concentration::event_splits(&counts, events, t_min);
            counts.extend(around);
            level.concentration = Some(concentration::concentration(counts, group));
        }
    }
    Ok(out)
}

/// The `n` states of one row of aggregates named `<prefix>_0`, `<prefix>_1`, ..., each read
/// by `decode` (`None` for a NULL state).
fn each_state<T>(
    batches: &[datafusion::arrow::array::RecordBatch],
    prefix: &str,
    n: usize,
    decode: impl Fn(Option<&[u8]>) -> Result<T>,
) -> Result<Vec<T>, AnalysisError> {
    let batch = batches
        .iter()
        .find(|b| b.num_rows() > 0)
        .ok_or_else(|| AnalysisError::Render(format!("internal: {prefix}_* returned nothing")))?;
    (0..n)
        .map(|i| {
            let state = batch
                .column_by_name(&format!("{prefix}_{i}"))
                .map(|c| c.as_binary::<i32>())
                .filter(|c| c.is_valid(0))
                .map(|c| c.value(0));
            Ok(decode(state)?)
        })
        .collect()
}

/// The name of a plan's stage (the scan starts with the spec's stages).
fn stage_name(plan: &TailPlan, scan: &[StageSpec]) -> String {
    scan.get(plan.stage)
        .map_or_else(String::new, |s| s.name.clone())
}

/// Rows in the tail of quantile `q` of `n` messages at the least: `n - rank + 1`.
#[must_use]
pub fn fewest_in_tail(q: f64, n: u64) -> u64 {
    if n == 0 { 0 } else { n - rank(q, n) + 1 }
}

#[cfg(test)]
mod tests;
