//! Per-stage latency as traces are written: every known delta of a stage (negative ones,
//! from clock error between hosts, included) into [`SignedStats`] (exact count, minimum,
//! maximum, mean and population standard deviation; HDR percentiles at 3 significant
//! digits over all of them), and HdrHistogram interval logs per stage, the standard format
//! HdrHistogram's own tools read, values in nanoseconds:
//!
//! - `hdr/<stage>.hlog`: the deltas `>= 0`, one histogram per interval (1 s);
//! - `hdr/<stage>.negative.hlog`: the *magnitudes* of the deltas `< 0`, written from the
//!   first interval that has one (intervals before it had none). A stage whose clocks
//!   never disagreed has no such file.
//!
//! Together the two logs hold every delta of the stage; `run.json` states the figures
//! over all of them and counts the negative ones apart (`negative`).

use std::fs::File;
use std::io::{BufWriter, Write as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hdrhistogram::serialization::V2DeflateSerializer;
use hdrhistogram::serialization::interval_log::{IntervalLogWriterBuilder, Tag};
use hoptrace_format::hist::SignedStats;
pub use hoptrace_format::hist::{
    MAX_TRACKABLE_NS, Percentile, QUANTILES, SIGNIFICANT_DIGITS, new_histogram,
};
use hoptrace_format::run::StageStats;

use crate::join::JoinedTrace;
use hoptrace_format::spec::{ResolvedSpec, ResolvedStage, slug};

/// Values buffered per stage before they are added to the interval's statistics in one
/// pass.
const BATCH: usize = 1024;

/// One interval log file.
struct Log {
    file: BufWriter<File>,
    path: PathBuf,
    rel: String,
    /// The header's comment lines, to write the header again with another base time.
    comments: Vec<String>,
}

impl Log {
    /// Creates `run_dir/rel` with the interval log's header.
    fn create(
        run_dir: &Path,
        rel: String,
        comments: &[&str],
        base: SystemTime,
        serializer: &mut V2DeflateSerializer,
    ) -> std::io::Result<Self> {
        let path = run_dir.join(&rel);
        let mut file = BufWriter::new(File::create(&path)?);
        let mut builder = IntervalLogWriterBuilder::new();
        for c in comments {
            builder.add_comment(c);
        }
        builder
            .with_start_time(base)
            .with_base_time(base)
            .begin_log_with(&mut file, serializer)?;
        writeln!(
            file,
            "\"StartTimestamp\",\"Interval_Length\",\"Interval_Max\",\"Interval_Compressed_Histogram\""
        )?;
        Ok(Self {
            file,
            path,
            rel,
            comments: comments.iter().map(|c| (*c).to_owned()).collect(),
        })
    }

    /// Opens `run_dir/rel`, an interval log written before, cut back to its first `len`
    /// bytes (what a checkpoint recorded), to append to it.
    fn reopen(run_dir: &Path, rel: String, comments: &[&str], len: u64) -> std::io::Result<Self> {
        let path = run_dir.join(&rel);
        let file = std::fs::OpenOptions::new().write(true).open(&path)?;
        if file.metadata()?.len() < len {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "{} is shorter than the {len} bytes the run's checkpoint recorded",
                    path.display()
                ),
            ));
        }
        file.set_len(len)?;
        let mut file = BufWriter::new(file);
        std::io::Seek::seek(&mut file, std::io::SeekFrom::End(0))?;
        Ok(Self {
            file,
            path,
            rel,
            comments: comments.iter().map(|c| (*c).to_owned()).collect(),
        })
    }

    /// Bytes written so far, once on their way to the disk, and synced when `sync`.
    fn flushed_len(&mut self, sync: bool) -> std::io::Result<u64> {
        self.file.flush()?;
        if sync {
            self.file.get_ref().sync_data()?;
        }
        Ok(self.file.get_ref().metadata()?.len())
    }

    /// Writes the file again, empty, headed by `base`.
    fn recreate(
        &mut self,
        run_dir: &Path,
        base: SystemTime,
        serializer: &mut V2DeflateSerializer,
    ) -> std::io::Result<()> {
        let comments: Vec<&str> = self.comments.iter().map(String::as_str).collect();
        *self = Self::create(run_dir, self.rel.clone(), &comments, base, serializer)?;
        Ok(())
    }

    fn write(
        &mut self,
        counts: &hoptrace_format::hist::HdrCounts,
        (start, len): (Duration, Duration),
        tag: &str,
        serializer: &mut V2DeflateSerializer,
    ) -> std::io::Result<()> {
        let mut w = IntervalLogWriterBuilder::new().begin_log_with(&mut self.file, serializer)?;
        w.write_histogram(&counts.to_histogram(), start, len, Tag::new(tag))
            .map_err(|e| std::io::Error::other(format!("{}: {e:?}", self.path.display())))?;
        self.file.flush()
    }
}

/// What a checkpoint of the run keeps of one stage: its statistics so far and how long
/// its interval logs were.
#[derive(Debug, Clone, PartialEq)]
pub struct StageSnapshot {
    /// The stage's name (a checkpoint is resumed by the same stages only).
    pub name: String,
    /// Every interval ended so far.
    pub total: SignedStats,
    /// The open interval.
    pub interval: SignedStats,
    /// Bytes of `hdr/<stage>.hlog`.
    pub log_len: u64,
    /// Bytes of `hdr/<stage>.negative.hlog`, when there is one.
    pub negative_log_len: Option<u64>,
}

/// What a checkpoint of the run keeps of one bounded stage: the statistics so far of its
/// smallest and of its largest possible deltas (the stage's own where a side is its pair;
/// taking the checkpoint up again reads those from the stage).
#[derive(Debug, Clone, PartialEq)]
pub struct BoundSnapshot {
    /// The stage's name.
    pub stage: String,
    /// The smallest deltas: every interval ended so far, and the open interval.
    pub lower: (SignedStats, SignedStats),
    /// The largest deltas, the same.
    pub upper: (SignedStats, SignedStats),
}

/// What a checkpoint of the run keeps of the stages ([`StageRecorder::snapshot`],
/// [`StageRecorder::resume`]).
#[derive(Debug, Clone, PartialEq)]
pub struct StagesSnapshot {
    /// When the open interval began, `CLOCK_REALTIME` ns.
    pub interval_start_unix_ns: i64,
    /// Per stage, in the spec's order.
    pub stages: Vec<StageSnapshot>,
    /// Per stage with a polled hop, in the spec's order.
    pub bounds: Vec<BoundSnapshot>,
}

impl StagesSnapshot {
    /// The figures over every interval ended so far of each stage's bounds, per stage in
    /// the spec's order (`None` for a stage without a polled hop).
    #[must_use]
    pub fn run_bounds(&self) -> Vec<Option<crate::live::BoundFigures>> {
        self.stages
            .iter()
            .map(|st| {
                self.bounds
                    .iter()
                    .find(|b| b.stage == st.name)
                    .map(|b| crate::live::BoundFigures::of(&b.lower.0, &b.upper.0))
            })
            .collect()
    }
}

/// The deltas between two hops: a stage's, or one side of a bounded stage (its smallest
/// or its largest possible deltas).
struct Side {
    from_index: usize,
    to_index: usize,
    total: SignedStats,
    interval: SignedStats,
    /// Deltas not yet added to `interval`.
    batch: Vec<i64>,
}

impl Side {
    fn new(
        from_index: usize,
        to_index: usize,
        (total, interval): (SignedStats, SignedStats),
    ) -> Self {
        Self {
            from_index,
            to_index,
            total,
            interval,
            batch: Vec::with_capacity(BATCH),
        }
    }

    fn flush(&mut self) {
        self.interval.add_values(&self.batch);
        self.batch.clear();
    }

    #[inline]
    fn record(&mut self, t: &JoinedTrace) {
        if let Some(d) = t.delta_ns(self.from_index, self.to_index) {
            self.batch.push(d);
            if self.batch.len() == BATCH {
                self.flush();
            }
        }
    }

    fn end_interval(&mut self) {
        self.flush();
        self.total.merge(&self.interval);
        self.interval.clear();
    }
}

/// A stage that starts or ends at a polled hop (one with an `earliest` in the spec): the
/// deltas of the hop pairs that give its smallest and its largest possible values, as
/// `hoptrace_format::spec::PipelineSpec::stage_bound` names them. A side whose pair is the
/// stage's own (`None`) is the stage's deltas, not recorded twice.
struct BoundAcc {
    /// Index of the stage in the spec.
    stage: usize,
    /// The stage's polled hops.
    polled: Vec<String>,
    lower: Option<Side>,
    upper: Option<Side>,
}

/// The bounded stages of `spec`, each side's statistics from `state` (the stage's name
/// given) or empty.
fn bound_accs(
    spec: &ResolvedSpec,
    mut state: impl FnMut(&str) -> Option<((SignedStats, SignedStats), (SignedStats, SignedStats))>,
) -> Vec<BoundAcc> {
    let p = spec.spec();
    let index = |hop: &str| {
        spec.hop_names()
            .iter()
            .position(|h| h == hop)
            .expect("a validated spec's stage bounds name its hops")
    };
    p.stages
        .iter()
        .enumerate()
        .filter_map(|(i, st)| {
            let b = p.stage_bound(st)?;
            let polled = [&st.from, &st.to]
                .into_iter()
                .filter(|h| p.earliest_of(h).is_some())
                .cloned()
                .collect();
            let (lower, upper) = state(&st.name).unwrap_or_default();
            let side = |(from, to): (String, String), saved| {
                (from != st.from || to != st.to).then(|| Side::new(index(&from), index(&to), saved))
            };
            Some(BoundAcc {
                stage: i,
                polled,
                lower: side(b.lower, lower),
                upper: side(b.upper, upper),
            })
        })
        .collect()
}

struct Acc {
    stage: ResolvedStage,
    from: String,
    to: String,
    deltas: Side,
    log: Log,
    negative_log: Option<Log>,
    tag: String,
}

/// Side `side` of bound `b`: its own deltas, or the stage's when the side is the stage's pair.
fn side_of<'a>(stages: &'a [Acc], b: &'a BoundAcc, side: &'a Option<Side>) -> &'a Side {
    side.as_ref().unwrap_or(&stages[b.stage].deltas)
}

/// The slowest message of an interval of a headline stage that splits into components.
struct Slowest {
    /// Index of the stage.
    stage: usize,
    /// The chain's hop indices, first to last.
    hops: Vec<usize>,
    /// The components' names.
    names: Vec<String>,
    /// The slowest so far this interval: its delta and trace.
    best: Option<(i64, JoinedTrace)>,
}

impl Slowest {
    #[inline]
    fn record(&mut self, t: &JoinedTrace) {
        let (first, last) = (self.hops[0], self.hops[self.hops.len() - 1]);
        if let Some(d) = t.delta_ns(first, last)
            && self.best.as_ref().is_none_or(|(b, _)| d > *b)
        {
            self.best = Some((d, *t));
        }
    }

    /// The slowest message, with its timeline.
    fn live(&self) -> Option<crate::live::LiveSlowest> {
        let (d, t) = self.best.as_ref()?;
        Some(crate::live::LiveSlowest {
            publisher: t.key.publisher,
            stream: t.key.stream,
            sequence: t.key.sequence,
            delta_ns: *d,
            from_unix_ns: t.stamp(self.hops[0]).unwrap_or_default(),
            components: self
                .hops
                .windows(2)
                .zip(&self.names)
                .map(|(w, name)| crate::live::LiveSegment {
                    name: name.clone(),
                    ns: t.delta_ns(w[0], w[1]),
                })
                .collect(),
            otel_trace_id: t.otel_trace_id.map(|id| id.to_hex()),
        })
    }
}

/// A [`Slowest`] for every headline stage of `spec` that splits into components.
fn slowest_of(spec: &ResolvedSpec) -> Vec<Slowest> {
    let names = spec.hop_names();
    let index = |hop: &str| names.iter().position(|h| h == hop);
    spec.spec()
        .stages
        .iter()
        .enumerate()
        .filter(|(_, st)| st.headline)
        .filter_map(|(stage, st)| {
            let components = spec.spec().components(st);
            if components.len() < 2 {
                return None;
            }
            let hops = std::iter::once(index(&components[0].from))
                .chain(components.iter().map(|c| index(&c.to)))
                .collect::<Option<Vec<usize>>>()?;
            Some(Slowest {
                stage,
                hops,
                names: components.into_iter().map(|c| c.name).collect(),
                best: None,
            })
        })
        .collect()
}

/// Records every written trace into its stages.
pub struct StageRecorder {
    stages: Vec<Acc>,
    bounds: Vec<BoundAcc>,
    slowest: Vec<Slowest>,
    run_dir: PathBuf,
    base: SystemTime,
    base_unix_ns: i64,
    interval_start_unix_ns: i64,
    serializer: V2DeflateSerializer,
}

impl std::fmt::Debug for StageRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StageRecorder")
            .field("stages", &self.stages.len())
            .finish_non_exhaustive()
    }
}

impl StageRecorder {
    /// Opens `run_dir/hdr/<stage>.hlog` for every stage, headed by the start time.
    ///
    /// # Errors
    /// The directory or a log file cannot be created.
    pub fn new(spec: &ResolvedSpec, run_dir: &Path, base_unix_ns: i64) -> std::io::Result<Self> {
        std::fs::create_dir_all(run_dir.join("hdr"))?;
        let base = UNIX_EPOCH + Duration::from_nanos(u64::try_from(base_unix_ns).unwrap_or(0));
        let mut serializer = V2DeflateSerializer::new();
        let mut stages = Vec::new();
        for s in spec.stages() {
            let tag = slug(&s.name);
            let (from, to) = (
                spec.hop_names()[s.from_index].clone(),
                spec.hop_names()[s.to_index].clone(),
            );
            let heading = stage_heading(&s.name, &from, &to, &tag);
            let log = Log::create(
                run_dir,
                format!("hdr/{tag}.hlog"),
                &[&heading, &s.definition],
                base,
                &mut serializer,
            )?;
            stages.push(Acc {
                from,
                to,
                deltas: Side::new(s.from_index, s.to_index, Default::default()),
                stage: s.clone(),
                log,
                negative_log: None,
                tag,
            });
        }
        Ok(Self {
            stages,
            bounds: bound_accs(spec, |_| None),
            slowest: slowest_of(spec),
            run_dir: run_dir.to_owned(),
            base,
            base_unix_ns,
            interval_start_unix_ns: base_unix_ns,
            serializer,
        })
    }

    /// The stages as a checkpoint keeps them; the interval logs are synced to disk first.
    ///
    /// # Errors
    /// A log cannot be flushed or synced.
    pub fn snapshot(&mut self) -> std::io::Result<StagesSnapshot> {
        let mut stages = Vec::with_capacity(self.stages.len());
        self.flush();
        for a in &mut self.stages {
            stages.push(StageSnapshot {
                name: a.stage.name.clone(),
                total: a.deltas.total.clone(),
                interval: a.deltas.interval.clone(),
                log_len: a.log.flushed_len(true)?,
                negative_log_len: a
                    .negative_log
                    .as_mut()
                    .map(|l| l.flushed_len(true))
                    .transpose()?,
            });
        }
        let state = |side: &Side| (side.total.clone(), side.interval.clone());
        let bounds = self
            .bounds
            .iter()
            .map(|b| BoundSnapshot {
                stage: self.stages[b.stage].stage.name.clone(),
                lower: state(side_of(&self.stages, b, &b.lower)),
                upper: state(side_of(&self.stages, b, &b.upper)),
            })
            .collect();
        Ok(StagesSnapshot {
            interval_start_unix_ns: self.interval_start_unix_ns,
            stages,
            bounds,
        })
    }

    /// Takes up the stages of a run from a checkpoint: the interval logs in `run_dir/hdr/`
    /// are cut back to the lengths it recorded (what was written after it is written
    /// again), the statistics are its own.
    ///
    /// # Errors
    /// A log cannot be opened or cut, or the checkpoint's stages are not `spec`'s.
    pub fn resume(
        spec: &ResolvedSpec,
        run_dir: &Path,
        base_unix_ns: i64,
        snap: StagesSnapshot,
    ) -> std::io::Result<Self> {
        let names: Vec<&str> = spec.stages().iter().map(|s| s.name.as_str()).collect();
        let theirs: Vec<&str> = snap.stages.iter().map(|s| s.name.as_str()).collect();
        if names != theirs {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "the run's checkpoint has stages {theirs:?}, the pipeline {names:?}: continue the run with the pipeline spec it started with"
                ),
            ));
        }
        let bounded: Vec<&str> = bound_accs(spec, |_| None)
            .iter()
            .map(|b| spec.stages()[b.stage].name.as_str())
            .collect();
        let theirs: Vec<&str> = snap.bounds.iter().map(|b| b.stage.as_str()).collect();
        if bounded != theirs {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "the run's checkpoint has bounds of stages {theirs:?}, the pipeline's polled hops give {bounded:?}: continue the run with the pipeline spec it started with"
                ),
            ));
        }
        let mut saved = snap.bounds.into_iter();
        let bounds = bound_accs(spec, |_| saved.next().map(|b| (b.lower, b.upper)));
        let base = UNIX_EPOCH + Duration::from_nanos(u64::try_from(base_unix_ns).unwrap_or(0));
        let mut stages = Vec::new();
        for (s, snap) in spec.stages().iter().zip(snap.stages) {
            let tag = slug(&s.name);
            let (from, to) = (
                spec.hop_names()[s.from_index].clone(),
                spec.hop_names()[s.to_index].clone(),
            );
            let heading = stage_heading(&s.name, &from, &to, &tag);
            let log = Log::reopen(
                run_dir,
                format!("hdr/{tag}.hlog"),
                &[&heading, &s.definition],
                snap.log_len,
            )?;
            let negative_rel = format!("hdr/{tag}.negative.hlog");
            let negative_log = match snap.negative_log_len {
                Some(len) => Some(Log::reopen(
                    run_dir,
                    negative_rel,
                    &[&negative_heading(&s.name, &from, &to)],
                    len,
                )?),
                None => {
                    match std::fs::remove_file(run_dir.join(&negative_rel)) {
                        Ok(()) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        Err(e) => return Err(e),
                    }
                    None
                }
            };
            stages.push(Acc {
                from,
                to,
                deltas: Side::new(s.from_index, s.to_index, (snap.total, snap.interval)),
                stage: s.clone(),
                log,
                negative_log,
                tag,
            });
        }
        Ok(Self {
            stages,
            bounds,
            // The live view's slowest message is the open interval's: not kept across a
            // restart.
            slowest: slowest_of(spec),
            run_dir: run_dir.to_owned(),
            base,
            base_unix_ns,
            interval_start_unix_ns: snap.interval_start_unix_ns,
            serializer: V2DeflateSerializer::new(),
        })
    }

    /// Moves the start of the logs' first interval and their base time to `base_unix_ns`
    /// (a replayed run starts when its log says): the logs, still empty, are written
    /// again with that start time in their headers. Only before anything was recorded.
    ///
    /// # Errors
    /// A log cannot be written.
    pub fn rebase(&mut self, base_unix_ns: i64) -> std::io::Result<()> {
        self.base_unix_ns = base_unix_ns;
        self.interval_start_unix_ns = base_unix_ns;
        self.base = UNIX_EPOCH + Duration::from_nanos(u64::try_from(base_unix_ns).unwrap_or(0));
        for a in &mut self.stages {
            a.log
                .recreate(&self.run_dir, self.base, &mut self.serializer)?;
        }
        Ok(())
    }

    /// Adds a trace's stage deltas.
    #[inline]
    pub fn record(&mut self, t: &JoinedTrace) {
        for a in &mut self.stages {
            a.deltas.record(t);
        }
        for b in &mut self.bounds {
            for side in [&mut b.lower, &mut b.upper].into_iter().flatten() {
                side.record(t);
            }
        }
        for s in &mut self.slowest {
            s.record(t);
        }
    }

    /// The open interval's slowest message per stage in the spec's order (`None` for a
    /// stage that does not split into components, or that no message finished yet): taken
    /// with [`Self::interval_figures`].
    #[must_use]
    pub fn interval_slowest(&self) -> Vec<Option<crate::live::LiveSlowest>> {
        let mut out = vec![None; self.stages.len()];
        for s in &self.slowest {
            out[s.stage] = s.live();
        }
        out
    }

    /// Adds every value recorded so far to the open interval's statistics.
    fn flush(&mut self) {
        for a in &mut self.stages {
            a.deltas.flush();
        }
        for b in &mut self.bounds {
            for side in [&mut b.lower, &mut b.upper].into_iter().flatten() {
                side.flush();
            }
        }
    }

    /// Per stage in the spec's order (`None` for a stage without a polled hop), the
    /// figures of its bounds from statistics `of` a side.
    fn bound_figures(
        &self,
        of: impl Fn(&Side) -> &SignedStats,
    ) -> Vec<Option<crate::live::BoundFigures>> {
        let mut out = vec![None; self.stages.len()];
        for b in &self.bounds {
            out[b.stage] = Some(crate::live::BoundFigures::of(
                of(side_of(&self.stages, b, &b.lower)),
                of(side_of(&self.stages, b, &b.upper)),
            ));
        }
        out
    }

    /// The current interval's p50 and p99 per stage that saw traces (name, p50, p99), for
    /// progress lines.
    pub fn interval_p50_p99(&mut self) -> Vec<(String, i64, i64)> {
        self.stages
            .iter_mut()
            .filter_map(|a| {
                a.deltas.flush();
                let p = |q| a.deltas.interval.percentile(q).map(|p| p.value_ns);
                Some((a.stage.name.clone(), p(0.5)?, p(0.99)?))
            })
            .collect()
    }

    /// Every stage, in the spec's order, with no figures yet: for the live view before
    /// its first interval ends.
    #[must_use]
    pub fn live_stages(&self) -> Vec<crate::live::LiveStage> {
        self.stages
            .iter()
            .map(|a| crate::live::LiveStage {
                name: a.stage.name.clone(),
                from: a.from.clone(),
                to: a.to.clone(),
                headline: a.stage.headline,
                ..crate::live::LiveStage::default()
            })
            .collect()
    }

    /// The figures of the open interval per stage, in the spec's order: what its interval
    /// histograms hold, taken just before [`Self::end_interval`] writes them.
    pub fn interval_figures(&mut self) -> Vec<crate::live::Figures> {
        self.stages
            .iter_mut()
            .map(|a| {
                a.deltas.flush();
                crate::live::Figures::of(&a.deltas.interval)
            })
            .collect()
    }

    /// The figures over every interval ended so far per stage, in the spec's order (the
    /// cumulative histograms each interval is merged into as it ends).
    #[must_use]
    pub fn run_figures(&self) -> Vec<crate::live::Figures> {
        self.stages
            .iter()
            .map(|a| crate::live::Figures::of(&a.deltas.total))
            .collect()
    }

    /// The figures of the open interval of each stage's bounds, per stage in the spec's
    /// order (`None` for a stage without a polled hop): taken with
    /// [`Self::interval_figures`].
    pub fn interval_bounds(&mut self) -> Vec<Option<crate::live::BoundFigures>> {
        self.flush();
        self.bound_figures(|side| &side.interval)
    }

    /// The figures over every interval ended so far of each stage's bounds, per stage in
    /// the spec's order (`None` for a stage without a polled hop).
    #[must_use]
    pub fn run_bounds(&self) -> Vec<Option<crate::live::BoundFigures>> {
        self.bound_figures(|side| &side.total)
    }

    /// Each stage's polled hops, per stage in the spec's order (empty for a stage without
    /// one).
    #[must_use]
    pub fn polled_hops(&self) -> Vec<Vec<String>> {
        let mut out = vec![Vec::new(); self.stages.len()];
        for b in &self.bounds {
            out[b.stage].clone_from(&b.polled);
        }
        out
    }

    /// Appends every stage's interval histograms to its logs and starts a new interval.
    ///
    /// # Errors
    /// A log cannot be written.
    pub fn end_interval(&mut self, now_unix_ns: i64) -> std::io::Result<()> {
        let start = Duration::from_nanos(
            u64::try_from(self.interval_start_unix_ns - self.base_unix_ns).unwrap_or(0),
        );
        let len = Duration::from_nanos(
            u64::try_from(now_unix_ns - self.interval_start_unix_ns).unwrap_or(0),
        );
        self.flush();
        for a in &mut self.stages {
            let interval = &a.deltas.interval;
            a.log
                .write(&interval.pos, (start, len), &a.tag, &mut self.serializer)?;
            if a.negative_log.is_none() && !interval.neg.is_empty() {
                let heading = negative_heading(&a.stage.name, &a.from, &a.to);
                a.negative_log = Some(Log::create(
                    &self.run_dir,
                    format!("hdr/{}.negative.hlog", a.tag),
                    &[&heading],
                    self.base,
                    &mut self.serializer,
                )?);
            }
            if let Some(log) = &mut a.negative_log {
                log.write(&interval.neg, (start, len), &a.tag, &mut self.serializer)?;
            }
            a.deltas.end_interval();
        }
        for b in &mut self.bounds {
            for side in [&mut b.lower, &mut b.upper].into_iter().flatten() {
                side.end_interval();
            }
        }
        for s in &mut self.slowest {
            s.best = None;
        }
        self.interval_start_unix_ns = now_unix_ns;
        Ok(())
    }

    /// Ends the last interval and returns every stage's statistics.
    ///
    /// # Errors
    /// A log cannot be written.
    pub fn finish(self, now_unix_ns: i64) -> std::io::Result<Vec<StageStats>> {
        self.close(now_unix_ns).map(|(stats, _)| stats)
    }

    /// Ends the last interval and returns every stage's statistics, and the stages as a
    /// checkpoint keeps them (the interval logs synced), for a run continued later.
    ///
    /// # Errors
    /// A log cannot be written or synced.
    pub fn close(mut self, now_unix_ns: i64) -> std::io::Result<(Vec<StageStats>, StagesSnapshot)> {
        self.end_interval(now_unix_ns)?;
        let snapshot = self.snapshot()?;
        let stats = self
            .stages
            .into_iter()
            .map(|a| StageStats {
                name: a.stage.name.clone(),
                from: a.from,
                to: a.to,
                definition: a.stage.definition.clone(),
                headline: a.stage.headline,
                figures: a.deltas.total.figures(),
                hdr_log: a.log.rel,
                hdr_negative_log: a.negative_log.map(|l| l.rel),
            })
            .collect();
        Ok((stats, snapshot))
    }
}

/// The first comment line of a stage's interval log.
fn stage_heading(name: &str, from: &str, to: &str, tag: &str) -> String {
    format!(
        "hoptrace stage \"{name}\": {from} -> {to}; values in nanoseconds, the deltas >= 0 (negative ones are in {tag}.negative.hlog)"
    )
}

/// The first comment line of a stage's log of negative deltas.
fn negative_heading(name: &str, from: &str, to: &str) -> String {
    format!(
        "hoptrace stage \"{name}\": {from} -> {to}; values in nanoseconds, the MAGNITUDES of the deltas < 0 (clock error); intervals before the first one here had none"
    )
}

/// Seconds since the Unix epoch of a `SystemTime`, for logs.
#[must_use]
pub fn unix_ns(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A complete trace whose only delta is `delta` on `stage` (from 0 to `delta`).
    fn stage_trace(stage: &ResolvedStage, delta: i64) -> JoinedTrace {
        let mut t = JoinedTrace {
            key: hoptrace_protocol::TraceKey {
                publisher: 1,
                stream: 1,
                sequence: 1,
            },
            metric_count: 1,
            intended_ns: 0,
            otel_trace_id: None,
            present_mask: (1 << stage.from_index) | (1 << stage.to_index),
            stamps_ns: [0; hoptrace_protocol::MAX_HOPS],
            complete: true,
            missing_mask: 0,
            flags: 0,
        };
        t.stamps_ns[stage.to_index] = delta;
        t
    }

    #[test]
    fn the_slowest_message_of_an_interval_is_kept_with_its_timeline() {
        let spec = hoptrace_format::spec::PipelineSpec::default_pipeline()
            .resolve()
            .unwrap();
        let dir = hoptrace_testkit::tempdir("stages-slowest");
        let mut r = StageRecorder::new(&spec, &dir, 0).unwrap();
        assert_eq!(r.interval_slowest(), vec![None; 5]);
        let trace = |seq: u64, broker: i64| {
            let mut t = stage_trace(&spec.stages()[0], broker);
            t.key.sequence = seq;
            t.present_mask = 0b11_1111;
            for h in 2..6 {
                t.stamps_ns[h] = broker + (h as i64 - 1) * 10;
            }
            t
        };
        for (seq, b) in [(1, 500), (2, 9_000), (3, 9_000), (4, 20)] {
            r.record(&trace(seq, b));
        }
        let slowest = r.interval_slowest();
        // Total Ingestion (index 3) splits; no other stage does or is a headline one.
        assert!(
            slowest
                .iter()
                .enumerate()
                .all(|(i, s)| (i == 3) == s.is_some())
        );
        let m = slowest[3].as_ref().unwrap();
        // The first of two equally slow.
        assert_eq!((m.sequence, m.delta_ns, m.from_unix_ns), (2, 9_040, 0));
        let parts: Vec<Option<i64>> = m.components.iter().map(|c| c.ns).collect();
        assert_eq!(parts, [Some(9_000), Some(10), Some(10), Some(10), Some(10)]);
        r.end_interval(1_000_000_000).unwrap();
        assert_eq!(r.interval_slowest(), vec![None; 5]);
        // A trace missing a middle hop: its component is unknown.
        let mut t = trace(7, 100);
        t.present_mask &= !(1 << 2);
        r.record(&t);
        let m = r.interval_slowest()[3].clone().unwrap();
        assert_eq!(m.components[1].ns, None);
        assert_eq!(m.components[2].ns, None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_total_holds_every_interval() {
        use hoptrace_format::spec::PipelineSpec;
        let spec = PipelineSpec::default_pipeline().resolve().unwrap();
        let dir = std::env::temp_dir().join(format!("hoptrace-stages-{}", std::process::id()));
        let mut r = StageRecorder::new(&spec, &dir, 0).unwrap();
        let stage = &spec.stages()[0];
        let mut t = stage_trace(stage, 0);
        // Three intervals of 1000 values each: 1..=1000 µs, then 1001..=2000, ...
        for interval in 0..3i64 {
            for i in 1..=1_000i64 {
                t.stamps_ns[stage.to_index] = (interval * 1_000 + i) * 1_000;
                r.record(&t);
            }
            r.end_interval((interval + 1) * 1_000_000_000).unwrap();
        }
        let stats = r.finish(4_000_000_000).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let s = &stats[0];
        assert_eq!(s.figures.count, 3_000);
        assert_eq!(s.figures.min_ns, Some(1_000));
        assert_eq!(s.figures.max_ns, Some(3_000_000));
        assert_eq!(s.figures.mean_ns, Some(1_500_500.0));
        let median = s.figures.percentile("P50").unwrap();
        assert!(median.value_ns.abs_diff(1_500_000) <= median.precision_ns + 1_000);
        let p99 = s.figures.percentile("P99").unwrap();
        assert!(p99.value_ns.abs_diff(2_970_000) <= p99.precision_ns + 1_000);
    }

    /// Stages resumed from a snapshot, after their logs went on past it, end as the
    /// original did: the same statistics and the same log bytes.
    #[test]
    fn resumed_from_a_snapshot_the_stages_end_as_the_original() {
        use hoptrace_format::spec::PipelineSpec;
        let spec = PipelineSpec::default_pipeline().resolve().unwrap();
        let dir =
            std::env::temp_dir().join(format!("hoptrace-stages-resume-{}", std::process::id()));
        let stage = spec.stages()[0].clone();
        let trace = |delta: i64| stage_trace(&stage, delta);
        // After the snapshot: the rest of the open interval (negative deltas among them,
        // so a log of negative deltas appears) and one more interval.
        let after = |r: &mut StageRecorder| {
            for i in 0..500 {
                r.record(&trace(if i % 7 == 0 { -i } else { i * 1_000 }));
            }
            r.end_interval(2_000_000_000).unwrap();
            for i in 0..300 {
                r.record(&trace(i * 3_000));
            }
        };
        let mut r = StageRecorder::new(&spec, &dir, 0).unwrap();
        for i in 1..=1_000 {
            r.record(&trace(i * 1_000));
        }
        r.end_interval(1_000_000_000).unwrap();
        for i in 1..=200 {
            r.record(&trace(i * 2_000));
        }
        let snap = r.snapshot().unwrap();
        after(&mut r);
        let original = r.finish(3_000_000_000).unwrap();
        let files = |d: &Path| {
            let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(d.join("hdr"))
                .unwrap()
                .flatten()
                .map(|e| {
                    (
                        e.file_name().into_string().unwrap(),
                        std::fs::read(e.path()).unwrap(),
                    )
                })
                .collect();
            v.sort();
            v
        };
        let before = files(&dir);
        assert!(before.iter().any(|(n, _)| n.ends_with(".negative.hlog")));
        let mut r = StageRecorder::resume(&spec, &dir, 0, snap).unwrap();
        after(&mut r);
        let resumed = r.finish(3_000_000_000).unwrap();
        let again = files(&dir);
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(format!("{original:?}"), format!("{resumed:?}"));
        assert_eq!(before, again);
    }

    /// The live view's figures: those of the open interval before it ends, and those of
    /// every interval ended after (a sorted set as the oracle of each percentile).
    #[test]
    fn live_figures_are_the_interval_and_the_whole_run() {
        use crate::live::Figures;
        use hoptrace_format::spec::PipelineSpec;
        let spec = PipelineSpec::default_pipeline().resolve().unwrap();
        let dir = std::env::temp_dir().join(format!("hoptrace-stages-live-{}", std::process::id()));
        let mut r = StageRecorder::new(&spec, &dir, 0).unwrap();
        let stage = spec.stages()[0].clone();
        let trace = |delta: i64| stage_trace(&stage, delta);
        let first = [-40, 7, 9, 1_500, 3_001];
        let second = [100_003, 2_000_000, 5, 6];
        for d in first {
            r.record(&trace(d));
        }
        let live = r.live_stages();
        assert_eq!(live.len(), spec.stages().len());
        assert_eq!(live[0].name, stage.name);
        let i1 = r.interval_figures();
        assert_eq!(
            i1[0],
            Figures {
                count: 5,
                negative: 1,
                min_ns: Some(-40),
                p50_ns: Some(9),
                p90_ns: Some(3_001),
                p99_ns: Some(3_001),
                p999_ns: Some(3_001),
                max_ns: Some(3_001),
            }
        );
        // Before the interval ends, the whole run holds nothing yet.
        assert_eq!(r.run_figures()[0], Figures::default());
        assert_eq!(i1[1], Figures::default());
        r.end_interval(1_000_000_000).unwrap();
        assert_eq!(r.run_figures()[0], i1[0]);
        for d in second {
            r.record(&trace(d));
        }
        let i2 = r.interval_figures();
        r.end_interval(2_000_000_000).unwrap();
        let run = r.run_figures();
        let _ = r.finish(2_000_000_000);
        let _ = std::fs::remove_dir_all(&dir);
        let check = |f: &Figures, values: &[i64]| {
            let mut v = values.to_vec();
            v.sort_unstable();
            let at = |q: f64| v[((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
            assert_eq!(f.count, v.len() as u64);
            assert_eq!(
                (f.min_ns, f.max_ns),
                (v.first().copied(), v.last().copied())
            );
            for (q, got) in [
                (0.5, f.p50_ns),
                (0.9, f.p90_ns),
                (0.99, f.p99_ns),
                (0.999, f.p999_ns),
            ] {
                let (e, got) = (at(q), got.unwrap());
                assert!(
                    got.abs_diff(e) <= e.unsigned_abs() / 2048 + 1,
                    "p{q}: {got} vs {e}"
                );
            }
        };
        check(&i2[0], &second);
        let all: Vec<i64> = first.iter().chain(&second).copied().collect();
        check(&run[0], &all);
        assert_eq!(run[0].negative, 1);
    }

    #[test]
    fn slugs() {
        assert_eq!(slug("Broker Time"), "broker_time");
        assert_eq!(slug("Total Ingestion (p->q)"), "total_ingestion_p_q");
        assert_eq!(slug("publish -> broker"), "publish_broker");
    }

    /// A stage that ends at a polled hop keeps the figures of its smallest deltas (to the
    /// hop's earliest instant) and its largest (to the stamp), per interval and over the
    /// run, through a snapshot taken up again; one that ends elsewhere has none.
    #[test]
    fn bounds_of_a_polled_stage_survive_a_snapshot() {
        use crate::live::BoundFigures;
        use hoptrace_format::spec::PipelineSpec;
        let spec = PipelineSpec::from_toml_str(
            r#"
name = "p"
[[hops]]
name = "publish"
[[hops]]
name = "queryable"
earliest = "queryable_earliest"
[[hops]]
name = "queryable_earliest"
[[stages]]
name = "Total"
from = "publish"
to = "queryable"
definition = "x"
[[stages]]
name = "Window"
from = "publish"
to = "queryable_earliest"
definition = "x"
"#,
        )
        .unwrap()
        .resolve()
        .unwrap();
        let dir =
            std::env::temp_dir().join(format!("hoptrace-stages-bounds-{}", std::process::id()));
        // Per trace (earliest, stamp) after publish, ns.
        let trace = |(e, u): (i64, i64)| {
            let mut t = stage_trace(&spec.stages()[0], u);
            t.present_mask |= 1 << 2;
            t.stamps_ns[2] = e;
            t
        };
        let first: Vec<(i64, i64)> = (1..=300).map(|i| (i * 1_000, i * 5_000)).collect();
        let second: Vec<(i64, i64)> = (1..=200).map(|i| (i * 3_000, i * 4_000 + 7)).collect();
        let stats = |v: &[(i64, i64)], side: fn(&(i64, i64)) -> i64| {
            let mut s = SignedStats::default();
            s.add_values(&v.iter().map(side).collect::<Vec<_>>());
            s
        };
        let mut r = StageRecorder::new(&spec, &dir, 0).unwrap();
        assert_eq!(r.polled_hops(), [vec!["queryable".to_owned()], vec![]]);
        first.iter().copied().for_each(|v| r.record(&trace(v)));
        let want = BoundFigures::of(&stats(&first, |v| v.0), &stats(&first, |v| v.1));
        assert_eq!(r.interval_bounds(), [Some(want), None]);
        assert_eq!(r.run_bounds()[0], Some(BoundFigures::default()));
        r.end_interval(1_000_000_000).unwrap();
        assert_eq!(r.run_bounds(), [Some(want), None]);
        let snap = r.snapshot().unwrap();
        assert_eq!(snap.bounds.len(), 1);
        drop(r);

        let mut r = StageRecorder::resume(&spec, &dir, 0, snap.clone()).unwrap();
        second.iter().copied().for_each(|v| r.record(&trace(v)));
        let (_, closed) = r.close(2_000_000_000).unwrap();
        let all: Vec<_> = first.iter().chain(&second).copied().collect();
        let want = BoundFigures::of(&stats(&all, |v| v.0), &stats(&all, |v| v.1));
        assert_eq!(closed.run_bounds(), [Some(want), None]);

        // A checkpoint whose bounds are not the pipeline's is refused.
        let mut other = snap;
        other.bounds.clear();
        let e = StageRecorder::resume(&spec, &dir, 0, other).unwrap_err();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(e.to_string().contains("bounds of stages"), "{e}");
    }
}
