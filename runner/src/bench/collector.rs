//! A whole-run benchmark of the collector (`hoptrace bench collector`).
//!
//! [`run`] starts a real [`Collector`] in this process on `127.0.0.1:0` with a pipeline of
//! `hops` hops (`h0`, `h1`, ...; a stage between each pair of neighbours and a total, see
//! [`pipeline`]) and feeds it synthetic traffic through `exporters` real [`Exporter`]s, one
//! per simulated probe process, each owning a contiguous run of hops and sending its
//! records over loopback TCP. When every trace has been generated, delivered, joined and
//! written, the collector is stopped and the run is summed up in a [`BenchReport`]:
//! throughput, CPU, peak memory, Parquet bytes per trace and the accounting.
//!
//! # Traffic
//! - Trace `t` (0-based) is message `t / 3000` of stream `t % 3000` of publisher 1
//!   (sequential sequences per stream over [`STREAMS`] streams), carrying 10 metrics.
//! - Its intended send time is the run's start plus `t / rate` (with no rate, stamps are
//!   spaced as if sent at [`NOMINAL_RATE`] traces/s: they are synthetic and do not depend
//!   on when the generator produced them). `h0` stamps 0.15-2 µs after the intended time;
//!   every later hop stamps 3 µs plus an exponentially distributed delay after the
//!   previous hop (means of 400 µs, 60 µs and 1.2 ms in turn, capped at 20 ms). Stamps
//!   are a pure function of `(t, hop)`, so generators owning different hops agree on
//!   every trace without talking to each other.
//! - With a rate the load is **open loop**: the generator of an exporter whose first hop
//!   is `hN` releases trace `t` at `start + t / rate + N × 0.5 ms` and never waits for the
//!   collector; a full probe queue drops the record and the exporter counts it
//!   (`queue_full`), which the report shows as `lost_by_probes`. How late the generators
//!   ran against their schedule is [`BenchReport::max_behind_schedule_s`].
//! - Without a rate the load is **closed loop**: a generator waits while its exporter
//!   holds more than 128 Ki unsent records, and while it is more than 64 Ki traces ahead
//!   of the slowest generator, so the records of one trace reach the collector close
//!   together, as in a pipeline. Nothing is dropped; the run measures how fast the
//!   collector absorbs records.
//!
//! # Measurements
//! - `seconds`: from the first generated trace until [`Collector::stop`] returned (every
//!   record received, joined and written, files closed, `run.json` written).
//! - `peak_rss_bytes`: `VmHWM` of this process, reset (through `/proc/self/clear_refs`)
//!   once the collector and exporters are up. It includes the generator and exporter
//!   threads of the benchmark, above all the exporters' probe queues, which are allocated
//!   and touched when they are created ([`BenchReport::probe_queue_bytes`]); their share
//!   is in [`BenchReport::rss_before_traffic_bytes`], `VmRSS` just before traffic starts,
//!   so `peak_rss_bytes - rss_before_traffic_bytes` is what the run added.
//! - `collector_cpu_seconds`: user + system CPU of this process over the run
//!   (`/proc/self/stat`, which includes threads that have exited) minus the CPU of the
//!   generator threads (each reads its own `/proc/thread-self/stat` when it ends), the
//!   exporter threads (sampled from `/proc/self/task/*/stat` every 100 ms and once more
//!   just before they are shut down) and the calling thread. What remains is the
//!   collector's accept, connection reader (socket reads and frame decoding) and join
//!   threads (join, stage histograms, Parquet encoding, zstd and file writes), and the
//!   kernel work of their system calls; any other thread of the host process is counted
//!   there too. Resolution is one clock tick (10 ms).
//!
//! ```no_run
//! use hoptrace_runner::bench::collector::{self as bench, BenchOptions};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let opts = BenchOptions {
//!     traces: 1_000_000,
//!     rate: None,
//!     hops: 4,
//!     exporters: 2,
//!     out_dir: "runs".into(),
//!     window_ms: 10_000,
//!     durable: true,
//!     checkpoint_interval: None,
//!     restart: false,
//! };
//! let report = bench::run(&opts, |p| eprintln!("{:.0} records/s", p.records_per_s))?;
//! println!("{:.0} records/s, {:.1} bytes/trace", report.records_per_s, report.bytes_per_trace);
//! # Ok(())
//! # }
//! ```

mod monitor;
mod options;
mod traffic;

use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use hoptrace_probe::{ClockReporting, Exporter, ExporterConfig, ExporterError, HopId, Probe};
use hoptrace_protocol::{MAX_SENT_PER_FRAME, Record, SentEntry, SentFrame};
use serde::Serialize;

use crate::procfs::{Pid, USER_HZ, process_ticks, status_bytes, thread_ticks};
use hoptrace_collector::run::{Collector, CollectorConfig, CollectorError};
use hoptrace_format::spec::PipelineSpec;
use monitor::{Monitor, ThreadKind};
use options::MAX_IN_FLIGHT_RECORDS;
pub use options::{
    BenchOptions, BenchProgress, METRICS_PER_TRACE, NOMINAL_RATE, PROBE_QUEUE_RECORDS, PUBLISHER,
    RETENTION_BYTES, STREAMS,
};
use traffic::{GenPlan, GenResult, generate};

/// The result of a run.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    /// The collector ran with its write-ahead log and acknowledgements.
    pub durable: bool,
    /// Traces generated (the publisher's count).
    pub traces: u64,
    /// Hop records the collector received.
    pub records: u64,
    /// Wall time from the first generated trace until the collector had stopped.
    pub seconds: f64,
    /// `records / seconds`.
    pub records_per_s: f64,
    /// Traces written (complete + incomplete) per second.
    pub traces_per_s: f64,
    /// `VmHWM` of this process during the run; includes the generators (see the module
    /// documentation and [`Self::rss_before_traffic_bytes`]).
    pub peak_rss_bytes: u64,
    /// Bytes of the Parquet files written.
    pub parquet_bytes: u64,
    /// `parquet_bytes` per row written.
    pub bytes_per_trace: f64,
    /// Traces written complete.
    pub complete: u64,
    /// Traces written incomplete.
    pub incomplete: u64,
    /// Records the exporters could not deliver (queue full + send failed), from their
    /// final counters.
    pub lost_by_probes: u64,
    /// CPU seconds of the collector's threads over the run (see the module
    /// documentation for what is included).
    pub collector_cpu_seconds: f64,
    /// Of which the join thread (join, stage histograms, Parquet): the collector's CPU
    /// minus its reader and accept threads.
    pub join_thread_cpu_seconds: f64,
    /// Of which the connection reader threads (socket reads, frame decoding).
    pub reader_threads_cpu_seconds: f64,
    /// CPU seconds of the generator and exporter threads.
    pub generator_cpu_seconds: f64,
    /// CPU seconds of the whole process over the run.
    pub process_cpu_seconds: f64,
    /// Wall time the generators took to produce every trace.
    pub generation_seconds: f64,
    /// Open loop: the most a generator ran behind its schedule, seconds (0 without a
    /// rate).
    pub max_behind_schedule_s: f64,
    /// `VmRSS` once the collector and the exporters were up, before any traffic.
    pub rss_before_traffic_bytes: u64,
    /// Bytes of the exporters' probe queues (allocated and touched at start, part of
    /// every RSS figure).
    pub probe_queue_bytes: u64,
    /// Highest [`BenchProgress::join_memory_estimate_bytes`] seen.
    pub peak_join_memory_estimate_bytes: u64,
    /// Messages sent of which no record reached the collector.
    pub unseen: u64,
    /// Whether the collector's accounting adds up (sent = complete + incomplete + unseen,
    /// nothing in flight).
    pub adds_up: bool,
    /// Records the exporters dropped from their retention buffers before the collector
    /// acknowledged them (`evicted`, [`RETENTION_BYTES`] each). With `durable`, those
    /// records were not covered while in flight: a figure with any is not a durable one.
    pub evicted_by_probes: u64,
    /// Bytes the collector appended to its write-ahead log (0 without one).
    pub log_bytes: u64,
    /// `log_bytes` per hop record received.
    pub log_bytes_per_record: f64,
    /// Checkpoints the collector took (each deleted the log before it).
    pub checkpoints: u64,
    /// The restart measured on a copy of the run directory, with
    /// [`BenchOptions::restart`].
    pub restart: Option<RestartReport>,
    /// The run directory (Parquet, `run.json`, HDR logs); left in place.
    pub run_dir: PathBuf,
}

/// A collector started on a copy of the run directory taken once every record was in,
/// as a killed collector would have left it.
#[derive(Debug, Clone, Serialize)]
pub struct RestartReport {
    /// Wall time of starting it (reading the checkpoint, replaying, binding), seconds.
    pub start_seconds: f64,
    /// The replay as the collector measured it ([`hoptrace_format::run::Restart`]).
    pub replay_ms: u64,
    /// It took up a checkpoint (else it replayed the whole log).
    pub from_checkpoint: bool,
    /// Log replayed: bytes, entries and hop records.
    pub log_bytes: u64,
    /// Log entries replayed.
    pub log_entries: u64,
    /// Hop records in the log replayed.
    pub log_records: u64,
    /// `log_records` per second of `replay_ms`.
    pub log_records_per_s: f64,
    /// Hop records the restarted run held (checkpoint and log).
    pub records_held: u64,
    /// Traces it wrote complete over the whole run, when it was stopped.
    pub complete: u64,
    /// Its accounting added up.
    pub adds_up: bool,
}

/// Why a benchmark could not run or finish.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// An option is out of range: give at least one trace, a positive rate and window,
    /// 2 to 16 hops and 1 to `hops` exporters.
    #[error("invalid bench options: {0}")]
    Options(String),
    /// The in-process collector could not start or stop.
    #[error(transparent)]
    Collector(#[from] CollectorError),
    /// An exporter could not start.
    #[error(transparent)]
    Exporter(#[from] ExporterError),
    /// An exporter could not reach the in-process collector within 10 s: check that
    /// loopback TCP works here (firewall rules, the open-file limit).
    #[error("exporter {index} could not connect to the collector: {reason}")]
    Connect {
        /// The exporter.
        index: usize,
        /// Its last connection error.
        reason: String,
    },
    /// A generator thread could not be spawned: raise the thread or memory limits.
    #[error("cannot spawn a generator thread: {0}")]
    Spawn(std::io::Error),
    /// A generator thread panicked (a bug).
    #[error("a generator thread panicked")]
    Panicked,
    /// The run directory could not be copied for the restart: check the free space.
    #[error("copying {dir} for the restart: {source}")]
    Copy {
        /// The run directory.
        dir: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// Nothing moved for 30 s: the collector or an exporter is stuck (look for errors in
    /// the log). The collector was stopped and its files closed.
    #[error("the run stalled: the collector received {records} of {expected} records")]
    Stalled {
        /// Records received.
        records: u64,
        /// Records the exporters sent.
        expected: u64,
    },
}

/// The benchmark's pipeline: hops `h0..h{hops-1}` with wire ids 0.., a stage between each
/// pair of neighbours, a headline total from the first to the last hop when there are
/// more than two hops, the given join window and default output settings.
#[must_use]
pub fn pipeline(hops: usize, window_ms: u64) -> PipelineSpec {
    let names: Vec<String> = (0..hops).map(|i| format!("h{i}")).collect();
    let mut spec = PipelineSpec::chain("collector-bench", &names)
        .expect("h0..hN is a valid chain of 2 to 16 hops");
    spec.join.window_ms = window_ms;
    spec
}

/// Runs the benchmark; `progress` is called about once a second on the calling thread.
///
/// # Errors
/// [`BenchError::Options`] for options out of range; a collector or exporter that cannot
/// start, connect or stop; a generator that cannot be spawned or panics; a run that
/// stalls. The collector is stopped (files closed) before any error after it started.
pub fn run(
    opts: &BenchOptions,
    progress: impl FnMut(&BenchProgress),
) -> Result<BenchReport, BenchError> {
    validate(opts)?;
    let spec = pipeline(opts.hops, opts.window_ms);
    let names: Vec<String> = spec.hops.iter().map(|h| h.name.clone()).collect();
    let max_pending = spec.join.max_pending as u64;
    let mut cfg = CollectorConfig::new("127.0.0.1:0", spec, &opts.out_dir);
    cfg.run_id = Some(format!(
        "bench-{}",
        hoptrace_probe::clock::realtime_ns() / 1_000_000
    ));
    cfg.stop_timeout = Duration::from_secs(60);
    cfg.durable = opts.durable;
    if let Some(i) = opts.checkpoint_interval {
        cfg.checkpoint_interval = i;
    }
    let restart_cfg = cfg.clone();
    let collector = Collector::start(cfg)?;
    let run_dir = collector.run_dir().to_owned();
    let addr = collector.local_addr().to_string();

    let parts = partition(opts.hops, opts.exporters);
    let mut exporters: Vec<Exporter> = Vec::with_capacity(parts.len());
    for (e, range) in parts.iter().enumerate() {
        let hops: Vec<(HopId, &str)> = range
            .clone()
            .map(|h| (hop_id(h), names[h].as_str()))
            .collect();
        let mut ecfg = ExporterConfig::new(addr.clone(), format!("bench-probe-{e}"));
        ecfg.queue_capacity = PROBE_QUEUE_RECORDS;
        ecfg.retention_bytes = RETENTION_BYTES;
        ecfg.backoff_min = Duration::from_millis(5);
        ecfg.clock = ClockReporting::Detect;
        match Exporter::start(ecfg, &hops) {
            Ok(x) => exporters.push(x.with_shutdown_timeout(Duration::from_secs(60))),
            Err(err) => {
                abandon(exporters, collector);
                return Err(err.into());
            }
        }
    }
    let connect_deadline = Instant::now() + Duration::from_secs(10);
    while let Some(index) = exporters.iter().position(|x| !x.is_connected()) {
        if Instant::now() >= connect_deadline {
            let reason = exporters[index]
                .last_error()
                .unwrap_or_else(|| "no answer".into());
            abandon(exporters, collector);
            return Err(BenchError::Connect { index, reason });
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut gen_probes: Vec<Vec<Probe>> = Vec::with_capacity(parts.len());
    for (x, range) in exporters.iter().zip(&parts) {
        match range.clone().map(|h| x.probe(hop_id(h))).collect() {
            Ok(p) => gen_probes.push(p),
            Err(err) => {
                abandon(exporters, collector);
                return Err(err.into());
            }
        }
    }

    // Traffic starts here: reset the RSS high-water mark and take the baselines.
    let hwm_reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
    if !hwm_reset {
        tracing::warn!("cannot reset VmHWM; the peak RSS covers the whole life of this process");
    }
    let rss_before = status_bytes(Pid::This, "VmRSS:").unwrap_or(0);
    let process_cpu0 = process_ticks(Pid::This).unwrap_or(0);
    let self_cpu0 = thread_ticks();
    let t0 = Instant::now();
    let start_ns = hoptrace_probe::clock::realtime_ns();
    let mut mon = Monitor::new(opts, max_pending, progress, t0);

    let done: Vec<AtomicU64> = (0..parts.len()).map(|_| AtomicU64::new(0)).collect();
    let abort = AtomicBool::new(false);
    let rate = opts.rate;
    let stamp_period_ns = 1e9 / rate.unwrap_or(NOMINAL_RATE) as f64;
    let (gen_results, spawn_error, stalled) = std::thread::scope(|s| {
        let mut handles = Vec::with_capacity(parts.len());
        let mut spawn_error = None;
        for (g, (probes, range)) in gen_probes.into_iter().zip(&parts).enumerate() {
            let plan = GenPlan {
                me: g,
                traces: opts.traces,
                hops: range.clone(),
                rate,
                t0,
                start_ns,
                stamp_period_ns,
                lag_ns: range.start as f64 * 500_000.0,
                max_in_flight: MAX_IN_FLIGHT_RECORDS,
            };
            let (done, abort) = (&done, &abort);
            match std::thread::Builder::new()
                .name(format!("bench-gen-{g}"))
                .spawn_scoped(s, move || generate(&plan, &probes, done, abort))
            {
                Ok(h) => handles.push(h),
                Err(e) => {
                    abort.store(true, Relaxed);
                    spawn_error = Some(e);
                    break;
                }
            }
        }
        let mut stalled = false;
        while !handles
            .iter()
            .all(std::thread::ScopedJoinHandle::is_finished)
        {
            let generated = done.iter().map(|d| d.load(Relaxed)).min().unwrap_or(0);
            if mon.step(&collector, &exporters, generated) && !stalled {
                stalled = true;
                abort.store(true, Relaxed);
            }
        }
        let results: Vec<Option<GenResult>> = handles.into_iter().map(|h| h.join().ok()).collect();
        (results, spawn_error, stalled)
    });
    let generation_seconds = t0.elapsed().as_secs_f64();
    let panicked = gen_results.iter().any(Option::is_none);
    let gen_results: Vec<GenResult> = gen_results.into_iter().flatten().collect();
    let generated = gen_results.first().map_or(0, |r| r.generated);

    // Tell the collector what the publisher sent, so its accounting can add up.
    let entries = sent_entries(generated);
    for chunk in entries.chunks(MAX_SENT_PER_FRAME) {
        exporters[0]
            .send_sent_frame(SentFrame {
                publisher: PUBLISHER,
                entries: chunk.to_vec(),
            })
            .expect("chunks of MAX_SENT_PER_FRAME entries encode");
    }
    // Let the exporters empty their queues, then shut them down.
    let mut stalled = stalled;
    while !stalled
        && exporters.iter().any(|x| {
            let c = x.counters();
            c.reported > c.sent + c.lost()
        })
    {
        stalled = mon.step(&collector, &exporters, generated);
    }
    mon.cpu.sample();
    let summaries: Vec<_> = exporters.into_iter().map(Exporter::shutdown).collect();
    let lost_by_probes: u64 = summaries.iter().map(|s| s.counters.lost()).sum();
    let evicted_by_probes: u64 = summaries.iter().map(|s| s.counters.evicted).sum();
    let expected: u64 = summaries.iter().map(|s| s.counters.sent).sum();
    while !stalled && collector.progress().records < expected {
        stalled = mon.step(&collector, &[], generated);
    }
    mon.cpu.sample();
    let progress = collector.progress();
    let received = progress.records;
    // What a collector killed now would leave (the log synced: every record acknowledged).
    let copy = (opts.restart && opts.durable && !stalled)
        .then(|| copy_run(&run_dir, &opts.out_dir))
        .transpose();
    let summary = collector.stop()?;
    let seconds = t0.elapsed().as_secs_f64();
    let peak_rss = status_bytes(Pid::This, "VmHWM:").unwrap_or(0);
    let process_cpu = process_ticks(Pid::This)
        .unwrap_or(0)
        .saturating_sub(process_cpu0);
    let self_cpu = thread_ticks().saturating_sub(self_cpu0);
    if let Some(e) = spawn_error {
        return Err(BenchError::Spawn(e));
    }
    if panicked {
        return Err(BenchError::Panicked);
    }
    if stalled {
        return Err(BenchError::Stalled {
            records: received,
            expected,
        });
    }
    let restart = match copy.map_err(|source| BenchError::Copy {
        dir: run_dir.clone(),
        source,
    })? {
        Some(out_dir) => {
            let r = restart(restart_cfg, &out_dir);
            let _ = std::fs::remove_dir_all(&out_dir);
            Some(r?)
        }
        None => None,
    };

    let a = &summary.accounting;
    let (complete, incomplete, unseen) = a.publishers.iter().fold((0, 0, 0), |acc, p| {
        (acc.0 + p.complete, acc.1 + p.incomplete, acc.2 + p.unseen)
    });
    let records: u64 = a.records_by_hop.values().sum();
    let parquet_bytes: u64 = summary.files.iter().map(|f| f.bytes).sum();
    let rows: u64 = summary.files.iter().map(|f| f.rows).sum();
    let gen_ticks: u64 =
        gen_results.iter().map(|r| r.cpu_ticks).sum::<u64>() + mon.cpu.ticks(ThreadKind::Exporter);
    let collector_ticks = process_cpu.saturating_sub(gen_ticks + self_cpu);
    let readers = mon.cpu.ticks(ThreadKind::Reader);
    let accept = mon.cpu.ticks(ThreadKind::Accept);
    let secs = |ticks: u64| ticks as f64 / USER_HZ;
    Ok(BenchReport {
        durable: opts.durable,
        traces: generated,
        records,
        seconds,
        records_per_s: records as f64 / seconds,
        traces_per_s: (complete + incomplete) as f64 / seconds,
        peak_rss_bytes: peak_rss,
        parquet_bytes,
        bytes_per_trace: parquet_bytes as f64 / rows.max(1) as f64,
        complete,
        incomplete,
        lost_by_probes,
        collector_cpu_seconds: secs(collector_ticks),
        join_thread_cpu_seconds: secs(collector_ticks.saturating_sub(readers + accept)),
        reader_threads_cpu_seconds: secs(readers),
        generator_cpu_seconds: secs(gen_ticks),
        process_cpu_seconds: secs(process_cpu),
        generation_seconds,
        max_behind_schedule_s: gen_results
            .iter()
            .map(|r| r.max_behind_ns)
            .fold(0.0, f64::max)
            / 1e9,
        rss_before_traffic_bytes: rss_before,
        probe_queue_bytes: (parts.len() * PROBE_QUEUE_RECORDS * queue_slot_bytes()) as u64,
        peak_join_memory_estimate_bytes: mon.peak_join_estimate,
        unseen,
        adds_up: a.adds_up,
        evicted_by_probes,
        log_bytes: progress.log_bytes,
        log_bytes_per_record: progress.log_bytes as f64 / received.max(1) as f64,
        checkpoints: progress.checkpoints,
        restart,
        run_dir,
    })
}

/// Copies the run directory `run_dir` (as a killed collector would leave it: the log, its
/// checkpoint and the files) to `<out_dir>/restart-<pid>/<run id>`, once the log has been
/// synced; returns the copy's parent.
fn copy_run(run_dir: &std::path::Path, out_dir: &std::path::Path) -> std::io::Result<PathBuf> {
    // Two sync intervals of the log: every record received is in it.
    std::thread::sleep(Duration::from_millis(300));
    let parent = out_dir.join(format!("restart-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&parent);
    let to = parent.join(run_dir.file_name().unwrap_or_default());
    copy_tree(run_dir, &to)?;
    Ok(parent)
}

fn copy_tree(from: &std::path::Path, to: &std::path::Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let dest = to.join(e.file_name());
        if e.file_type()?.is_dir() {
            copy_tree(&e.path(), &dest)?;
        } else {
            // A file removed while copying (a part file renamed) is not needed.
            match std::fs::copy(e.path(), &dest) {
                Ok(_) => {}
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                Err(err) => return Err(err),
            }
        }
    }
    Ok(())
}

/// Starts a collector of the run's settings on the copy under `out_dir`, which continues
/// the run from its checkpoint and log, and stops it.
fn restart(
    mut cfg: CollectorConfig,
    out_dir: &std::path::Path,
) -> Result<RestartReport, BenchError> {
    cfg.out_dir = out_dir.to_owned();
    cfg.stop_timeout = Duration::from_secs(1);
    let t = Instant::now();
    let c = Collector::start(cfg)?;
    let start_seconds = t.elapsed().as_secs_f64();
    let r = c.continued().cloned();
    let summary = c.stop()?;
    let r = r.unwrap_or(hoptrace_format::run::Restart {
        at_unix_ns: 0,
        log_entries: 0,
        log_bytes: 0,
        torn_bytes: 0,
        records_replayed: 0,
        resent_records_dropped: 0,
        checkpoint_unix_ns: None,
        replay_ms: 0,
        log_records: 0,
    });
    Ok(RestartReport {
        start_seconds,
        replay_ms: r.replay_ms,
        from_checkpoint: r.checkpoint_unix_ns.is_some(),
        log_bytes: r.log_bytes,
        log_entries: r.log_entries,
        log_records: r.log_records,
        log_records_per_s: r.log_records as f64 / (r.replay_ms.max(1) as f64 / 1e3),
        records_held: r.records_replayed,
        complete: summary
            .accounting
            .publishers
            .iter()
            .map(|p| p.complete)
            .sum(),
        adds_up: summary.accounting.adds_up,
    })
}

fn validate(opts: &BenchOptions) -> Result<(), BenchError> {
    let bad = |m: String| Err(BenchError::Options(m));
    if opts.traces == 0 {
        return bad("traces must be at least 1".into());
    }
    if opts.rate == Some(0) {
        return bad("rate must be positive (leave it out to run as fast as possible)".into());
    }
    if !(2..=16).contains(&opts.hops) {
        return bad(format!("hops is {}; use 2 to 16", opts.hops));
    }
    if !(1..=opts.hops).contains(&opts.exporters) {
        return bad(format!(
            "exporters is {}; use 1 to hops ({})",
            opts.exporters, opts.hops
        ));
    }
    if opts.window_ms == 0 {
        return bad("window_ms must be positive".into());
    }
    Ok(())
}

/// Exporter `e` of `exporters` owns hops `e * hops / exporters ..`, contiguous.
fn partition(hops: usize, exporters: usize) -> Vec<Range<usize>> {
    (0..exporters)
        .map(|e| e * hops / exporters..(e + 1) * hops / exporters)
        .collect()
}

fn hop_id(index: usize) -> HopId {
    HopId(u8::try_from(index).unwrap_or(u8::MAX))
}

/// Stops whatever was started, for an error before traffic.
fn abandon(exporters: Vec<Exporter>, collector: Collector) {
    for x in exporters {
        let _ = x.shutdown();
    }
    let _ = collector.stop();
}

/// Per stream: the messages among traces `0..generated`.
fn sent_entries(generated: u64) -> Vec<SentEntry> {
    let streams = u64::from(STREAMS);
    (0..STREAMS)
        .filter_map(|s| {
            let n = generated / streams + u64::from(u64::from(s) < generated % streams);
            (n > 0).then(|| SentEntry {
                stream: s,
                messages: n,
                metrics: n * u64::from(METRICS_PER_TRACE),
                first_sequence: 0,
                last_sequence: n - 1,
            })
        })
        .collect()
}

/// Bytes of one probe queue slot: the record and the queue's sequence stamp.
fn queue_slot_bytes() -> usize {
    std::mem::size_of::<Record>() + std::mem::size_of::<usize>()
}

#[cfg(test)]
mod tests;
