//! A generator of realistic runs for benchmarking the analysis: it writes a run
//! directory (the collector's Parquet layout, written by the collector's own writer, and
//! a `run.json`) directly, without probes or a collector, at millions of traces per
//! second.
//!
//! The traces follow the default pipeline (publish → flow_in → flow_out → store_in →
//! query_start → queryable) at a fixed message rate over `streams` streams, with a cause
//! of slowness injected when asked ([`Inject`]: one slow stream, a stalling processor). Each stage's
//! delay is a constant plus an exponential with a stage-specific mean, with a heavy tail
//! (one delay in a thousand is ten times longer): 20 µs schedule lag, broker ~1 ms,
//! processor ~500 µs, transmission ~350 µs, store ~100 µs, query ~300 µs. One trace in
//! ten thousand misses its `queryable` stamp (incomplete). Values are deterministic for a
//! seed.
//!
//! As in the pipelines hoptrace measures, the processor works in batches: consecutive
//! messages (1 to [`GenerateOptions::batch_max`] of them, uniformly) leave it together
//! when the last of them has arrived plus the processor's delay, and from there on every
//! hop stamps the batch once (`flow_out` to `queryable` are equal within a batch). The
//! publish and broker stamps stay per message. With `batch_max` 1 every hop is stamped
//! per message, which costs about 17.7 bytes per trace in Parquet; batches of up to 24
//! give 8.05, near the soaks' runs (6.6-8.9).

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::join::JoinedTrace;
use crate::run::host_info;
use crate::writer::{TraceWriter, TraceWriterConfig, WriteError};
use hoptrace_format::run::{Accounting, PublisherAccount, RunSummary};
use hoptrace_format::spec::PipelineSpec;
use hoptrace_protocol::TraceKey;

/// What to generate.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct GenerateOptions {
    /// Traces (messages).
    pub traces: u64,
    /// Directory under which the run directory is created.
    pub out_dir: PathBuf,
    /// Run id (the run directory's name).
    pub run_id: String,
    /// Streams the messages are spread over, round robin.
    pub streams: u32,
    /// Metrics per message.
    pub metrics_per_message: u32,
    /// Messages per second: sets the time span the traces cover.
    pub messages_per_s: f64,
    /// Rows per Parquet file (and most rows per row group), as the collector rolls.
    pub rows_per_file: u64,
    /// Most messages per processor batch; batch sizes are uniform in 1..=batch_max, and
    /// 1 stamps every hop per message.
    pub batch_max: u32,
    /// Seed of the delays.
    pub seed: u64,
    /// A cause of slowness to inject, as a partition behind a slow link or a processor
    /// that stalls would: none by default.
    pub inject: Option<Inject>,
}

/// A cause of slowness the generator injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inject {
    /// Every message of `stream` spends `extra_ns` more in the broker (`publish →
    /// flow_in`).
    SlowStream {
        /// The stream.
        stream: u32,
        /// Added to its broker time, ns.
        extra_ns: i64,
    },
    /// The processor stalls for `length_ns` every `every_ns` from the run's start: a
    /// batch whose last message arrives within a stall leaves when it ends.
    Pause {
        /// Time between stalls' starts, ns.
        every_ns: i64,
        /// Each stall's length, ns.
        length_ns: i64,
    },
}

impl GenerateOptions {
    /// `traces` traces of the default shape (3000 streams, 20 metrics per message, 1M
    /// messages/s, processor batches of up to 24 messages, files and row groups of 1M
    /// rows as the collector's defaults) under `out_dir/run_id`.
    #[must_use]
    pub fn new(traces: u64, out_dir: impl Into<PathBuf>, run_id: impl Into<String>) -> Self {
        Self {
            traces,
            out_dir: out_dir.into(),
            run_id: run_id.into(),
            streams: 3000,
            metrics_per_message: 20,
            messages_per_s: 1e6,
            rows_per_file: 1_000_000,
            batch_max: DEFAULT_BATCH_MAX,
            seed: 1,
            inject: None,
        }
    }
}

/// Progress of a generation.
#[derive(Debug, Clone, Copy)]
pub struct GenerateProgress {
    /// Traces written so far.
    pub traces: u64,
    /// Seconds since the start.
    pub elapsed_s: f64,
}

/// What a generation wrote.
#[derive(Debug, Clone)]
pub struct Generated {
    /// The run directory.
    pub run_dir: PathBuf,
    /// Traces written.
    pub traces: u64,
    /// Parquet files.
    pub files: usize,
    /// Bytes of Parquet.
    pub bytes: u64,
    /// Seconds it took.
    pub elapsed_s: f64,
}

/// Means of the six delays, ns: schedule lag, then the five hop-to-hop steps.
const MEANS_NS: [f64; 6] = [20e3, 1_000e3, 500e3, 350e3, 100e3, 300e3];
/// Constant part of each delay, ns.
/// The smallest delay of each hop after the one before it, ns.
pub const FLOORS_NS: [i64; 6] = [1_000, 60_000, 18_000, 130_000, 20_000, 55_000];
/// The default of [`GenerateOptions::batch_max`].
pub const DEFAULT_BATCH_MAX: u32 = 24;
/// The hop a processor batch leaves by: from it on, stamps are per batch.
const BATCH_HOP: usize = 2;
/// One trace in this many misses `queryable`.
const INCOMPLETE_EVERY: u64 = 10_000;

/// A fast deterministic generator (SplitMix64).
struct Rng(u64);

impl Rng {
    #[inline]
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// Inverse CDF of the unit exponential at 4096 points, for sampling without `ln` per
/// value; a sample interpolates nothing (the 12 high bits pick the point) and the
/// heavy tail comes from a separate 1-in-1000 draw.
struct Exponential([f64; 4096]);

impl Exponential {
    fn new() -> Self {
        let mut t = [0.0; 4096];
        for (i, v) in t.iter_mut().enumerate() {
            let u = (i as f64 + 0.5) / 4096.0;
            *v = -(1.0 - u).ln();
        }
        Self(t)
    }

    #[inline]
    fn sample(&self, r: u64, mean: f64) -> i64 {
        let x = self.0[(r >> 52) as usize] * mean;
        let tail = if r & 0x3FF == 0 { 10.0 } else { 1.0 };
        (x * tail) as i64
    }
}

/// Writes a run of `opts.traces` traces; `progress` is called every 10M traces.
///
/// # Errors
/// [`WriteError`] when the run cannot be written.
pub fn generate(
    opts: &GenerateOptions,
    mut progress: impl FnMut(GenerateProgress),
) -> Result<Generated, WriteError> {
    let started = Instant::now();
    let spec = PipelineSpec::default_pipeline();
    let hop_names: Vec<String> = spec.hops.iter().map(|h| h.name.clone()).collect();
    let run_dir = opts.out_dir.join(&opts.run_id);
    let mut writer = TraceWriter::new(TraceWriterConfig {
        dir: run_dir.join("traces"),
        run_id: opts.run_id.clone(),
        hop_names: hop_names.clone(),
        row_group_rows: usize::try_from(opts.rows_per_file.min(1_000_000)).unwrap_or(1_000_000),
        roll_rows: opts.rows_per_file,
        roll_seconds: u64::MAX,
        zstd_level: 1,
    })?;
    let exp = Exponential::new();
    let mut rng = Rng(opts.seed);
    let start_ns: i64 = 1_800_000_000_000_000_000;
    let period_ns = 1e9 / opts.messages_per_s;
    let streams = u64::from(opts.streams.max(1));
    let mut incomplete = 0u64;
    let template = JoinedTrace {
        key: TraceKey::default(),
        metric_count: opts.metrics_per_message,
        intended_ns: 0,
        otel_trace_id: None,
        present_mask: 0b11_1111,
        stamps_ns: [0; 16],
        complete: true,
        missing_mask: 0,
        flags: 0,
    };
    let batch_max = u64::from(opts.batch_max.max(1));
    let mut batch: Vec<JoinedTrace> = Vec::with_capacity(batch_max as usize);
    let mut i = 0u64;
    while i < opts.traces {
        // No draw for batches of one, so that batch_max 1 gives the per-message runs of
        // the generator's first version, value for value.
        let size = if batch_max == 1 {
            1
        } else {
            (1 + rng.next() % batch_max).min(opts.traces - i)
        };
        batch.clear();
        // Per message: the schedule lag and the broker, up to the processor's input.
        for _ in 0..size {
            let mut t = template;
            t.key = TraceKey {
                publisher: 1,
                stream: (i % streams) as u32,
                sequence: i / streams,
            };
            t.intended_ns = start_ns + (i as f64 * period_ns) as i64;
            let mut at = t.intended_ns;
            for h in 0..BATCH_HOP {
                at += FLOORS_NS[h] + exp.sample(rng.next(), MEANS_NS[h]);
                if let (1, Some(Inject::SlowStream { stream, extra_ns })) = (h, opts.inject)
                    && t.key.stream == stream
                {
                    at += extra_ns;
                }
                t.stamps_ns[h] = at;
            }
            if i % INCOMPLETE_EVERY == INCOMPLETE_EVERY - 1 {
                t.present_mask = 0b01_1111;
                t.missing_mask = 0b10_0000;
                t.complete = false;
                incomplete += 1;
            }
            batch.push(t);
            i += 1;
            if i.is_multiple_of(10_000_000) {
                progress(GenerateProgress {
                    traces: i,
                    elapsed_s: started.elapsed().as_secs_f64(),
                });
            }
        }
        // Per batch: it leaves the processor after its last message arrived, and every
        // later hop stamps it once.
        let mut at = batch
            .iter()
            .map(|t| t.stamps_ns[BATCH_HOP - 1])
            .max()
            .unwrap_or_default();
        if let Some(Inject::Pause {
            every_ns,
            length_ns,
        }) = opts.inject
        {
            let into = (at - start_ns).rem_euclid(every_ns.max(1));
            if into < length_ns {
                at += length_ns - into;
            }
        }
        for h in BATCH_HOP..MEANS_NS.len() {
            at += FLOORS_NS[h] + exp.sample(rng.next(), MEANS_NS[h]);
            for t in &mut batch {
                t.stamps_ns[h] = at;
            }
        }
        for t in &batch {
            writer.push(t)?;
        }
    }
    let files = writer.finish()?;
    let bytes = files.iter().map(|f| f.bytes).sum();
    let summary = RunSummary {
        run_id: opts.run_id.clone(),
        pipeline: spec,
        started_unix_ns: start_ns,
        ended_unix_ns: start_ns + (opts.traces as f64 * period_ns) as i64,
        collector_host: host_info(),
        probes: Vec::new(),
        clock: Vec::new(),
        clock_alerts: Vec::new(),
        files: files.clone(),
        stages: Vec::new(),
        recovered: None,
        accounting: Accounting {
            publishers: vec![PublisherAccount {
                publisher: 1,
                sent: opts.traces,
                sent_metrics: opts.traces * u64::from(opts.metrics_per_message),
                complete: opts.traces - incomplete,
                incomplete,
                recovered: 0,
                unseen: 0,
                not_sent: 0,
            }],
            missing_by_hop: [("queryable".to_owned(), incomplete)].into(),
            records_by_hop: hop_names
                .iter()
                .enumerate()
                .map(|(i, h)| {
                    (
                        h.clone(),
                        if i == 5 {
                            opts.traces - incomplete
                        } else {
                            opts.traces
                        },
                    )
                })
                .collect(),
            adds_up: true,
            ..Accounting::default()
        },
        connections: Default::default(),
        otlp: Default::default(),
        group: None,
        interrupted: false,
        restarts: Vec::new(),
    };
    let path = run_dir.join("run.json");
    summary
        .write(&path)
        .map_err(|source| WriteError::Io { path, source })?;
    Ok(Generated {
        run_dir,
        traces: opts.traces,
        files: files.len(),
        bytes,
        elapsed_s: started.elapsed().as_secs_f64(),
    })
}

/// Removes a generated run directory.
///
/// # Errors
/// [`WriteError::Io`].
pub fn remove(run_dir: &Path) -> Result<(), WriteError> {
    std::fs::remove_dir_all(run_dir).map_err(|source| WriteError::Io {
        path: run_dir.to_owned(),
        source,
    })
}
