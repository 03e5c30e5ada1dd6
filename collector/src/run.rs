//! One collection run: listen, join, write `runs/<run-id>/`, account for every message.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hoptrace_protocol::Frame;
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use crate::accounting::{self, Rows};
use crate::control::Control;
pub use crate::error::CollectorError;
use crate::join::{InsertOutcome, JoinedTrace, Joiner};
use crate::live::{Live, LiveAccounting, Throughput};
use crate::server::{self, ConnectionCounters, DurableSeqs, Event, ServerConfig};
use crate::stages::StageRecorder;
use crate::writer::{TraceWriter, TraceWriterConfig};
use hoptrace_format::run::{Accounting, HostInfo, RunSummary, StageStats};
use hoptrace_format::run::{PartFile, Recovered};
use hoptrace_format::spec::{PipelineSpec, ResolvedSpec};

/// Events buffered between connection readers and the join thread; when full, readers
/// block and TCP pushes back on probes.
const CHANNEL_FRAMES: usize = 256;

/// How a collector runs.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct CollectorConfig {
    /// Address to listen on, e.g. `127.0.0.1:7400` (`:0` picks a port).
    pub listen: String,
    /// The pipeline.
    pub spec: PipelineSpec,
    /// Directory under which `<run-id>/` is created.
    pub out_dir: PathBuf,
    /// Run id; default `run-<UTC time>`.
    pub run_id: Option<String>,
    /// Token probes must present; required when `listen` is not a loopback address.
    pub token: Option<String>,
    /// TLS: the collector's certificate chain (PEM); with `tls_key`, every probe must
    /// speak TLS.
    pub tls_cert: Option<PathBuf>,
    /// TLS: the private key (PEM) of `tls_cert`.
    pub tls_key: Option<PathBuf>,
    /// Most probe connections at once.
    pub max_connections: usize,
    /// Time a connection has to send Hello.
    pub hello_timeout: Duration,
    /// On stop, how long to wait for connected probes to say Goodbye.
    pub stop_timeout: Duration,
    /// Clock preflight of the probe hosts: a clock status that is unsynchronised or has a
    /// larger error bound than this (ns) is warned about and recorded in the run's
    /// `clock_alerts`, once per host and reason.
    pub max_clock_error_ns: Option<u64>,
    /// Keep a write-ahead log of the run (`runs/<run-id>/wal/`), acknowledge probes'
    /// numbered frames once it holds them (protocol version 2), and continue the run from
    /// it when started again after a kill. Off: version 1 only, and a killed collector
    /// loses what it had not written.
    pub durable: bool,
    /// How often the log is synced to disk (and acknowledgements sent): at most a second.
    pub sync_interval: Duration,
    /// Least time between two checkpoints of the run (taken when a part file closes):
    /// the log before a checkpoint is deleted, and a restart replays only the log after
    /// the last one.
    pub checkpoint_interval: Duration,
}

impl CollectorConfig {
    /// Defaults for `spec`, listening on `listen`, writing under `out_dir`.
    #[must_use]
    pub fn new(listen: impl Into<String>, spec: PipelineSpec, out_dir: impl Into<PathBuf>) -> Self {
        Self {
            listen: listen.into(),
            spec,
            out_dir: out_dir.into(),
            run_id: None,
            token: None,
            tls_cert: None,
            tls_key: None,
            max_connections: 256,
            hello_timeout: Duration::from_secs(5),
            stop_timeout: Duration::from_secs(10),
            max_clock_error_ns: None,
            durable: true,
            sync_interval: Duration::from_millis(100),
            checkpoint_interval: crate::checkpoint::MIN_INTERVAL,
        }
    }
}

/// Live figures, for progress lines, `/metrics` and `/progress.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Progress {
    /// Hop records received.
    pub records: u64,
    /// Traces written complete.
    pub complete: u64,
    /// Traces written incomplete.
    pub incomplete: u64,
    /// Traces waiting for more hops.
    pub pending: u64,
    /// Probe connections open.
    pub connections: u64,
    /// Last interval's (stage, p50 ns, p99 ns).
    pub stages: Vec<(String, i64, i64)>,
    /// Connections refused or closed, by reason.
    pub closed_connections: BTreeMap<String, u64>,
    /// Times the join filled up and the collector pushed back on probes.
    pub backpressure_episodes: u64,
    /// Bytes this collector appended to the run's write-ahead log (0 without one).
    pub log_bytes: u64,
    /// Checkpoints the run has taken (its log before the last one is deleted).
    pub checkpoints: u64,
}

/// The live figures of a collector ([`Collector::watch`]): read for each request of
/// `/metrics`, `/progress.json` and `/live.json`, also once the collector stopped (then
/// [`Live::running`] is false).
#[derive(Debug, Clone)]
pub struct Watch {
    progress: Arc<Mutex<Progress>>,
    live: Arc<Mutex<Live>>,
}

impl Watch {
    /// The figures of `/progress.json`.
    #[must_use]
    pub fn progress(&self) -> Progress {
        self.progress.lock().expect("progress poisoned").clone()
    }

    /// The figures of `/live.json`.
    #[must_use]
    pub fn live(&self) -> Live {
        self.live.lock().expect("live poisoned").clone()
    }
}

/// A running collector.
#[derive(Debug)]
pub struct Collector {
    addr: SocketAddr,
    recovered: Option<Recovered>,
    continued: Option<hoptrace_format::run::Restart>,
    run_dir: PathBuf,
    progress: Arc<Mutex<Progress>>,
    live: Arc<Mutex<Live>>,
    /// The accept thread and the join thread.
    service: server::Service<Result<RunSummary, CollectorError>>,
}

impl Collector {
    /// Binds, creates `out_dir/<run-id>/` and starts accepting probes.
    ///
    /// # Errors
    /// An invalid spec, a non-loopback address without token, a bind or directory error.
    pub fn start(cfg: CollectorConfig) -> Result<Self, CollectorError> {
        let spec = Arc::new(ResolvedSpec::new(&cfg.spec)?);
        let (listener, addr, tls) = server::bind(
            &cfg.listen,
            cfg.token.as_deref(),
            cfg.tls_cert.as_deref(),
            cfg.tls_key.as_deref(),
        )?;
        let started_unix_ns = hoptrace_clock::realtime_ns();
        let (run_id, run_dir) = match &cfg.run_id {
            Some(id) => {
                let run_dir = cfg.out_dir.join(id);
                std::fs::create_dir_all(&run_dir).map_err(|source| CollectorError::Io {
                    path: run_dir.clone(),
                    source,
                })?;
                (id.clone(), run_dir)
            }
            // A new run never lands in another's directory, even when two start within
            // the same second.
            None => claim_run_dir(&cfg.out_dir, &default_run_id(started_unix_ns))?,
        };
        // A restart's replay, as probes wait for it: from reading the checkpoint on.
        let replay_started = Instant::now();
        let (log, checkpoint) = if cfg.durable {
            (
                crate::wal::segments(&run_dir)?,
                crate::checkpoint::Checkpoint::read(&run_dir)?,
            )
        } else {
            (Vec::new(), None)
        };
        let replaying = !log.is_empty() || checkpoint.is_some();
        // A run closed cleanly before and continued (`collect --continue`): its state at
        // that close, taken up as a checkpoint would be (unless a log holds a later one).
        let closed = match &checkpoint {
            Some(_) => None,
            None => crate::checkpoint::Checkpoint::read_closed(&run_dir)?,
        };
        let took_up_closed = closed.is_some();
        let checkpoint = checkpoint.or(closed);
        let hops: Vec<(u8, String)> = spec
            .hop_ids()
            .iter()
            .zip(spec.hop_names())
            .map(|(id, name)| (id.0, name.clone()))
            .collect();
        if replaying
            && let Some(theirs) = crate::wal::hops(&run_dir)?
            && theirs != hops
        {
            let list = |h: &[(u8, String)]| {
                h.iter()
                    .map(|(id, n)| format!("{n} ({id})"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            return Err(CollectorError::OtherPipeline {
                dir: run_dir,
                theirs: list(&theirs),
                ours: list(&hops),
            });
        }
        // The part files this run closed before its last checkpoint: kept, with their keys
        // in the checkpoint.
        let own: Vec<String> = checkpoint
            .as_ref()
            .map(|c| c.meta.files.iter().map(|f| f.name.clone()).collect())
            .unwrap_or_default();
        if replaying {
            // Every file derived from the log after the checkpoint (or from the whole log,
            // without one) is written again; the part files from before the log (a
            // continued run) and those the checkpoint holds are kept.
            let mut keep = crate::wal::kept(&run_dir)?;
            keep.extend(own.iter().cloned());
            remove_derived(&run_dir, &keep, checkpoint.is_some())?;
        }
        let recovered = crate::writer::recover(&run_dir.join("traces"), &own)?;
        if let Some(r) = &recovered {
            tracing::warn!(
                files = r.files,
                rows = r.rows,
                unfinished = r.unfinished.len(),
                "run directory {} already held data: kept {} complete file(s) with {} rows; set aside {} unfinished file(s) a killed collector left open",
                run_dir.display(),
                r.files,
                r.rows,
                r.unfinished.len()
            );
        }
        // Keys in the part files kept from an earlier collector of this run are written
        // already: a late record for one of them must not make a second row.
        let kept = crate::writer::kept_keys(&run_dir.join("traces"), &own)?;
        let out = &cfg.spec.output;
        let writer = TraceWriter::new(TraceWriterConfig {
            dir: run_dir.join("traces"),
            run_id: run_id.clone(),
            hop_names: spec.hop_names().to_vec(),
            row_group_rows: out.row_group_rows,
            roll_rows: out.roll_rows,
            roll_seconds: out.roll_seconds,
            zstd_level: out.zstd_level,
        })?;
        let hdr_err = |source| CollectorError::Io {
            path: run_dir.join("hdr"),
            source,
        };

        let progress = Arc::new(Mutex::new(Progress::default()));
        let live = Arc::new(Mutex::new(Live::default()));
        let counters = Arc::new(ConnectionCounters::default());
        let durable = cfg.durable.then(|| Arc::new(DurableSeqs::default()));
        let continued;
        let service = {
            let mut joiner = Joiner::new(&spec);
            if checkpoint.is_none() {
                joiner.set_written(kept.clone());
            }
            let stages = match &checkpoint {
                Some(c) => {
                    StageRecorder::resume(&spec, &run_dir, c.meta.started_unix_ns, c.stages.clone())
                        .map_err(hdr_err)?
                }
                None => StageRecorder::new(&spec, &run_dir, started_unix_ns).map_err(hdr_err)?,
            };
            *live.lock().expect("live poisoned") =
                Live::starting(&run_id, started_unix_ns, stages.live_stages());
            let control = Control::new(cfg.max_clock_error_ns);
            let mut state = JoinState {
                joiner,
                kept,
                spec: Arc::clone(&spec),
                writer: Some(writer),
                stages: Some(stages),
                interval_start_ns: started_unix_ns,
                run_id: run_id.clone(),
                run_dir: run_dir.clone(),
                started_unix_ns,
                epoch: Instant::now(),
                clock_offset_ns: 0,
                wal: None,
                durable: durable.clone(),
                sync_interval: cfg.sync_interval.min(Duration::from_secs(1)),
                instances: FxHashMap::default(),
                logged_seq: FxHashMap::default(),
                resent_dropped: 0,
                restarts: Vec::new(),
                max_conn_id: 0,
                control,
                tallies: FxHashMap::default(),
                plausible_ns: spec.plausible_window_ns(),
                records: 0,
                recovered: recovered.clone(),
                backpressure_episodes: 0,
                out: Vec::with_capacity(1024),
                progress: Arc::clone(&progress),
                live: Arc::clone(&live),
                metrics_written: 0,
                at_last_interval: (0, 0, 0),
                counters: Arc::clone(&counters),
                stop_timeout: cfg.stop_timeout,
                checkpoints: Checkpoints::new(cfg.durable, cfg.checkpoint_interval),
            };
            let checkpoint_unix_ns = checkpoint.as_ref().map(|c| c.meta.taken_unix_ns);
            let from_segment = match checkpoint {
                Some(c) => {
                    // The run as it was at its checkpoint; the traces emitted after its
                    // last closed file go to the writer first, as they did then.
                    let segment = c.segment;
                    let unwritten = state.take_up(c, cfg.max_clock_error_ns);
                    let w = state.writer.as_mut().expect("set above");
                    for t in &unwritten {
                        w.push(t)?;
                    }
                    segment
                }
                None => 1,
            };
            if cfg.durable {
                state.open_log(
                    replaying,
                    (from_segment, checkpoint_unix_ns),
                    &part_files(&run_dir.join("traces")),
                    &hops,
                    replay_started,
                    took_up_closed,
                )?;
            }
            continued = replaying.then(|| state.restarts.last().cloned()).flatten();
            state.move_plausible_window(hoptrace_clock::realtime_ns());
            let server_cfg = ServerConfig {
                token: cfg.token.clone(),
                run_id: run_id.clone(),
                max_connections: cfg.max_connections,
                hello_timeout: cfg.hello_timeout,
                tls,
                durable,
                first_conn_id: state.max_conn_id + 1,
            };
            server::Service::spawn(
                ("collector", "join"),
                listener,
                server_cfg,
                &spec,
                &counters,
                CHANNEL_FRAMES,
                move |rx, draining| state.run(rx, draining),
            )
            .map_err(|source| CollectorError::Io {
                path: run_dir.clone(),
                source,
            })?
        };
        tracing::info!(%addr, run_dir = %run_dir.display(), "collector listening");
        Ok(Self {
            addr,
            recovered,
            continued,
            run_dir,
            progress,
            live,
            service,
        })
    }

    /// The bound address.
    #[must_use]
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// What an earlier, interrupted collector left in the run directory, if anything.
    #[must_use]
    pub fn recovered(&self) -> Option<&Recovered> {
        self.recovered.as_ref()
    }

    /// The restart this collector is, when it continued a run from the log a killed
    /// collector left (what it replayed).
    #[must_use]
    pub fn continued(&self) -> Option<&hoptrace_format::run::Restart> {
        self.continued.as_ref()
    }

    /// `out_dir/<run-id>`.
    #[must_use]
    pub fn run_dir(&self) -> &Path {
        &self.run_dir
    }

    /// Live figures.
    #[must_use]
    pub fn progress(&self) -> Progress {
        self.progress.lock().expect("progress poisoned").clone()
    }

    /// The live view's figures, as of the last interval's end.
    #[must_use]
    pub fn live(&self) -> Live {
        self.live.lock().expect("live poisoned").clone()
    }

    /// A handle on the live figures that outlives a borrow of the collector, for servers
    /// that run until after it stopped.
    #[must_use]
    pub fn watch(&self) -> Watch {
        Watch {
            progress: Arc::clone(&self.progress),
            live: Arc::clone(&self.live),
        }
    }

    /// Stops accepting, waits (up to the stop timeout) for connected probes to finish,
    /// writes every pending trace as incomplete, closes every file and writes `run.json`.
    ///
    /// # Errors
    /// A write error of the last files, or a panicked join thread.
    pub fn stop(self) -> Result<RunSummary, CollectorError> {
        self.service.stop().map_err(|_| CollectorError::Panicked)?
    }
}

/// This host's CPU, memory and kernel, from `/proc`.
#[must_use]
pub fn host_info() -> HostInfo {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpuinfo = read("/proc/cpuinfo");
    let cpu_model = cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|r| r.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "unknown".into());
    let memory_bytes = read("/proc/meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|r| r.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024);
    HostInfo {
        host: hoptrace_clock::hostname(),
        cpu_model,
        cpus: std::thread::available_parallelism().map_or(1, usize::from),
        memory_bytes,
        kernel: read("/proc/sys/kernel/osrelease").trim().to_owned(),
    }
}

struct JoinState {
    joiner: Joiner,
    /// Keys of the part files kept from an earlier collector of this run.
    kept: crate::keys::WrittenKeys,
    spec: Arc<ResolvedSpec>,
    writer: Option<TraceWriter>,
    stages: Option<StageRecorder>,
    /// When the current interval of the stages' logs began, `CLOCK_REALTIME` ns.
    interval_start_ns: i64,
    run_id: String,
    run_dir: PathBuf,
    started_unix_ns: i64,
    epoch: Instant,
    /// Added to `epoch.elapsed()`: a restarted collector's join clock goes on from the
    /// log's last entry.
    clock_offset_ns: u64,
    /// The write-ahead log, when durable.
    wal: Option<crate::wal::Wal>,
    /// What is durable per exporter instance, for the connection readers' Acks.
    durable: Option<Arc<DurableSeqs>>,
    sync_interval: Duration,
    /// Exporter instance of each connection.
    instances: FxHashMap<u64, u64>,
    /// Highest numbered frame logged per exporter instance.
    logged_seq: FxHashMap<u64, u64>,
    /// Records of re-sent frames the log already held, dropped.
    resent_dropped: u64,
    restarts: Vec<hoptrace_format::run::Restart>,
    /// Highest connection id in the log.
    max_conn_id: u64,
    control: Control,
    /// Rows written per publisher; looked up once per trace, so hashed with Fx rather
    /// than SipHash.
    tallies: FxHashMap<u16, Rows>,
    /// Stamps are plausible within this many ns of the run (before its start, after now).
    plausible_ns: i64,
    records: u64,
    recovered: Option<Recovered>,
    backpressure_episodes: u64,
    out: Vec<JoinedTrace>,
    progress: Arc<Mutex<Progress>>,
    /// The live view's figures, taken as each interval ends.
    live: Arc<Mutex<Live>>,
    /// Metrics of the traces written (each trace's `metric_count`).
    metrics_written: u64,
    /// Traces and metrics written, and hop records received, when the last interval
    /// ended.
    at_last_interval: (u64, u64, u64),
    counters: Arc<ConnectionCounters>,
    stop_timeout: Duration,
    checkpoints: Checkpoints,
}

/// When the run takes checkpoints (`crate::checkpoint`), and what it keeps for the next.
struct Checkpoints {
    /// The run keeps a log, so it takes checkpoints.
    enabled: bool,
    /// A part file closed at least `interval` after the last checkpoint: the next step
    /// takes one.
    wanted: bool,
    /// The traces written since that file closed, while one is wanted: not in a closed
    /// file, so the checkpoint holds them.
    since_close: Vec<JoinedTrace>,
    /// When the last one was taken (or the collector started).
    last: Instant,
    /// Taken in the run so far.
    taken: u64,
    /// Closed part files already synced to disk by an earlier checkpoint.
    files_synced: usize,
    /// Least time between two.
    interval: Duration,
}

impl Checkpoints {
    /// A part file closed: every trace written so far is in a closed file. A checkpoint
    /// is wanted when the last one is old enough.
    fn note_close(&mut self) {
        self.since_close.clear();
        self.wanted = self.last.elapsed() >= self.interval;
    }

    fn new(enabled: bool, interval: Duration) -> Self {
        Self {
            enabled,
            wanted: false,
            since_close: Vec::new(),
            last: Instant::now(),
            taken: 0,
            files_synced: 0,
            interval,
        }
    }
}

impl JoinState {
    fn now_ns(&self) -> u64 {
        self.clock_offset_ns
            .saturating_add(u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX))
    }

    /// Opens the run's log: replays it first when it exists (a collector was killed on
    /// this run), then appends after it.
    fn open_log(
        &mut self,
        replaying: bool,
        (from_segment, checkpoint_unix_ns): (u32, Option<i64>),
        kept: &[String],
        hops: &[(u8, String)],
        started: Instant,
        continued_closed: bool,
    ) -> Result<(), CollectorError> {
        use crate::wal::Entry;
        // A checkpoint's join clock, or 0 for a log replayed from the run's start.
        let mut last_at = self.clock_offset_ns;
        let mut replayed = crate::wal::Replayed::default();
        let records_before = self.records;
        if replaying {
            let run_dir = self.run_dir.clone();
            // Segments before the checkpoint a killed collector did not get to delete.
            crate::wal::remove_segments_before(&run_dir, from_segment)?;
            replayed = crate::wal::replay::<CollectorError>(&run_dir, from_segment, |entry| {
                match entry {
                    Entry::Started { realtime_ns } => {
                        self.started_unix_ns = realtime_ns;
                        self.interval_start_ns = realtime_ns;
                        if let Some(st) = self.stages.as_mut() {
                            st.rebase(realtime_ns)
                                .map_err(|source| CollectorError::Io {
                                    path: self.run_dir.join("hdr"),
                                    source,
                                })?;
                        }
                    }
                    Entry::Restarted {
                        realtime_ns,
                        entries,
                        bytes,
                        torn_bytes,
                        checkpoint_unix_ns,
                        replay_ms,
                        log_records,
                    } => self.restarts.push(hoptrace_format::run::Restart {
                        at_unix_ns: realtime_ns,
                        log_entries: entries,
                        log_bytes: bytes,
                        torn_bytes,
                        records_replayed: self.records,
                        resent_records_dropped: 0,
                        checkpoint_unix_ns,
                        replay_ms,
                        log_records,
                    }),
                    Entry::Resent { records, .. } => self.count_resent(records),
                    Entry::Tick { at, realtime_ns } => {
                        last_at = last_at.max(at);
                        self.step(at, realtime_ns)?;
                    }
                    Entry::Connected {
                        id,
                        at,
                        peer,
                        hello,
                    } => {
                        last_at = last_at.max(at);
                        self.apply(Event::Connected(id, peer, hello), at)?;
                    }
                    Entry::Frame { id, at, frame } => {
                        last_at = last_at.max(at);
                        self.apply(Event::Frame(id, frame), at)?;
                    }
                    Entry::Closed { id, at, clean } => {
                        last_at = last_at.max(at);
                        self.apply(Event::Closed(id, clean), at)?;
                    }
                }
                Ok(())
            })?;
            self.clock_offset_ns = last_at;
            tracing::warn!(
                entries = replayed.entries,
                bytes = replayed.bytes,
                torn = replayed.torn_bytes,
                checkpoint = checkpoint_unix_ns.is_some(),
                "continuing run {} from its log: a collector was stopped without closing it",
                self.run_id
            );
        }
        let mut wal = if replaying {
            crate::wal::Wal::open(&self.run_dir, replayed.last_segment)?
        } else {
            crate::wal::Wal::create(&self.run_dir, kept, hops)?
        };
        let now = hoptrace_clock::realtime_ns();
        if replaying {
            let restart = hoptrace_format::run::Restart {
                at_unix_ns: now,
                log_entries: replayed.entries,
                log_bytes: replayed.bytes,
                torn_bytes: replayed.torn_bytes,
                records_replayed: self.records,
                resent_records_dropped: 0,
                checkpoint_unix_ns,
                replay_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
                log_records: self.records - records_before,
            };
            wal.restarted(&restart)?;
            self.restarts.push(restart);
            // The connections of the killed collector are gone.
            let open: Vec<u64> = self.control.open_ids();
            let at = self.now_ns();
            for id in open {
                wal.closed(id, at, false)?;
                self.control.handle(Event::Closed(id, false));
            }
        } else if !continued_closed {
            // A run continued after a clean close keeps the start it had: its log has no
            // start of its own, whose replay would start the run's interval logs again.
            wal.started(self.started_unix_ns)?;
        }
        wal.sync()?;
        self.wal = Some(wal);
        if let Some(d) = &self.durable {
            d.raise(self.logged_seq.iter().map(|(i, s)| (*i, *s)));
        }
        Ok(())
    }

    /// Makes the log durable and lets the connection readers acknowledge it.
    fn sync_log(&mut self) -> Result<(), CollectorError> {
        if let Some(wal) = self.wal.as_mut() {
            wal.sync()?;
            if let Some(d) = &self.durable {
                d.raise(self.logged_seq.iter().map(|(i, s)| (*i, *s)));
            }
        }
        Ok(())
    }

    fn run(
        &mut self,
        rx: &mpsc::Receiver<Event>,
        draining: &AtomicBool,
    ) -> Result<RunSummary, CollectorError> {
        let mut drain_deadline: Option<Instant> = None;
        let mut last_expire = Instant::now();
        let mut last_sync = Instant::now();
        let mut pushing_back = false;
        loop {
            if self.joiner.is_full() {
                // Bounded memory: take no more frames until traces complete or expire.
                // Readers block on the full channel and TCP pushes back on the probes.
                if !pushing_back {
                    pushing_back = true;
                    self.backpressure_episodes += 1;
                    tracing::warn!(
                        pending = self.joiner.pending(),
                        "join is full: pushing back on probes until traces complete or expire"
                    );
                }
                std::thread::sleep(Duration::from_millis(10));
            } else {
                if pushing_back {
                    pushing_back = false;
                    tracing::info!("join has room again: reading from probes");
                }
                match rx.recv_timeout(Duration::from_millis(20)) {
                    Ok(ev) => self.handle(ev)?,
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            }
            if last_expire.elapsed() >= Duration::from_millis(100) {
                last_expire = Instant::now();
                let (at, realtime_ns) = (self.now_ns(), hoptrace_clock::realtime_ns());
                if let Some(wal) = self.wal.as_mut() {
                    wal.tick(at, realtime_ns)?;
                }
                self.step(at, realtime_ns)?;
                self.publish_progress();
            }
            if last_sync.elapsed() >= self.sync_interval {
                last_sync = Instant::now();
                self.sync_log()?;
            }
            if draining.load(Relaxed) {
                let deadline =
                    *drain_deadline.get_or_insert_with(|| Instant::now() + self.stop_timeout);
                let open = self.control.open();
                if open == 0 || Instant::now() >= deadline {
                    if open > 0 {
                        tracing::warn!(
                            open,
                            "stopping with probes still connected; their unsent records are counted by them"
                        );
                    }
                    // Take whatever is already queued before finishing.
                    while let Ok(ev) = rx.try_recv() {
                        self.handle(ev)?;
                    }
                    break;
                }
            }
        }
        self.finish()
    }

    /// Moves the plausibility window with the run: from `join.plausible_window_s` before
    /// the start to that long after `now` (`CLOCK_REALTIME` ns).
    fn move_plausible_window(&mut self, now: i64) {
        self.joiner.set_plausible_window(
            self.started_unix_ns.saturating_sub(self.plausible_ns)
                ..=now.saturating_add(self.plausible_ns),
        );
    }

    /// The join's periodic step at join clock `at` and `realtime_ns`: the plausibility
    /// window moves, traces past their window expire, files roll, and each whole second
    /// ends an interval of the stages' logs. Logged, so a replay takes the same steps.
    fn step(&mut self, at: u64, realtime_ns: i64) -> Result<(), CollectorError> {
        self.move_plausible_window(realtime_ns);
        self.joiner.expire(at, &mut self.out);
        self.write_out()?;
        if let Some(w) = self.writer.as_mut() {
            let closed = w.closed().len();
            w.tick()?;
            if w.closed().len() != closed && self.checkpoints.enabled && self.wal.is_some() {
                self.checkpoints.note_close();
            }
        }
        if realtime_ns - self.interval_start_ns >= 1_000_000_000 {
            let start = std::mem::replace(&mut self.interval_start_ns, realtime_ns);
            if let Some(st) = self.stages.as_mut() {
                let interval = st.interval_p50_p99();
                let figures = st.interval_figures();
                st.end_interval(realtime_ns)
                    .map_err(|source| CollectorError::Io {
                        path: self.run_dir.join("hdr"),
                        source,
                    })?;
                let run = st.run_figures();
                self.progress.lock().expect("progress poisoned").stages = interval;
                self.publish_live((start, realtime_ns), &figures, &run, true);
            }
        }
        if self.checkpoints.wanted && self.wal.is_some() {
            self.checkpoint(realtime_ns)?;
        }
        Ok(())
    }

    /// Takes a checkpoint (see `crate::checkpoint`): the part files closed since the last
    /// one and the stages' logs are synced, the log starts a new segment, the state goes
    /// to `wal/checkpoint`, and the segments before it are deleted.
    fn checkpoint(&mut self, realtime_ns: i64) -> Result<(), CollectorError> {
        self.checkpoints.wanted = false;
        let unwritten = std::mem::take(&mut self.checkpoints.since_close);
        let (Some(wal), Some(w), Some(st)) = (
            self.wal.as_mut(),
            self.writer.as_ref(),
            self.stages.as_mut(),
        ) else {
            return Ok(());
        };
        if w.rows_not_closed() != unwritten.len() as u64 {
            // Never a checkpoint that does not hold what it should: the log stays whole.
            tracing::error!(
                kept = unwritten.len(),
                writer = w.rows_not_closed(),
                "not taking a checkpoint: the traces written since the last closed file do not match the writer's (a bug); the log is kept whole"
            );
            return Ok(());
        }
        let started = Instant::now();
        let traces = self.run_dir.join("traces");
        let fsync = |p: &Path| {
            std::fs::File::open(p)
                .and_then(|f| f.sync_all())
                .map_err(|source| CollectorError::Io {
                    path: p.to_owned(),
                    source,
                })
        };
        let files = w.closed();
        for f in &files[self.checkpoints.files_synced.min(files.len())..] {
            fsync(&traces.join(&f.name))?;
        }
        fsync(&traces)?;
        let stages = st.snapshot().map_err(|source| CollectorError::Io {
            path: self.run_dir.join("hdr"),
            source,
        })?;
        fsync(&self.run_dir.join("hdr"))?;
        let segment = wal.start_segment()?;
        self.checkpoints.taken += 1;
        let c = crate::checkpoint::Checkpoint {
            segment,
            meta: self.meta(realtime_ns, files.to_vec()),
            written: self.joiner.written().clone(),
            stages,
            pending: self.joiner.pending_traces(),
            unwritten,
        };
        let bytes = c.write(&self.run_dir)?;
        self.checkpoints.files_synced = files.len();
        let wal = self.wal.as_ref().expect("checked above");
        let freed = wal.remove_before(segment)?;
        self.checkpoints.last = Instant::now();
        tracing::debug!(
            segment,
            bytes,
            freed,
            pending = c.pending.len(),
            unwritten = c.unwritten.len(),
            took_ms = started.elapsed().as_millis() as u64,
            "checkpoint: the log before segment {segment} deleted"
        );
        Ok(())
    }

    /// The run's state at `realtime_ns` with closed part files `files`, for a checkpoint.
    fn meta(&self, realtime_ns: i64, files: Vec<PartFile>) -> crate::checkpoint::Meta {
        crate::checkpoint::Meta {
            taken_unix_ns: realtime_ns,
            at_ns: self.now_ns(),
            joiner_clock_ns: self.joiner.clock_ns(),
            started_unix_ns: self.started_unix_ns,
            interval_start_ns: self.interval_start_ns,
            records: self.records,
            resent_dropped: self.resent_dropped,
            backpressure_episodes: self.backpressure_episodes,
            max_conn_id: self.max_conn_id,
            restarts: self.restarts.clone(),
            tallies: self
                .tallies
                .iter()
                .map(|(p, r)| (*p, r.complete, r.incomplete))
                .collect(),
            logged_seq: self.logged_seq.iter().map(|(i, s)| (*i, *s)).collect(),
            instances: self.instances.iter().map(|(c, i)| (*c, *i)).collect(),
            stats: self.joiner.stats(),
            files,
            hops: self.spec.hop_count(),
            checkpoints: self.checkpoints.taken,
            control: self.control.snapshot(),
        }
    }

    /// Keeps the run's state at its clean close (`crate::checkpoint::CLOSED`): every trace
    /// is in `files`, nothing is pending, and a continued run's log starts at segment 1.
    fn write_closed_state(
        &mut self,
        realtime_ns: i64,
        files: &[PartFile],
        stages: crate::stages::StagesSnapshot,
    ) -> Result<(), CollectorError> {
        // The probes of this collector are gone when the run is continued.
        let open: Vec<u64> = self.control.open_ids();
        for id in open {
            self.control.handle(Event::Closed(id, false));
        }
        self.control.forget_senders();
        let c = crate::checkpoint::Checkpoint {
            segment: 1,
            meta: self.meta(realtime_ns, files.to_vec()),
            written: self.joiner.written().clone(),
            stages,
            pending: Vec::new(),
            unwritten: Vec::new(),
        };
        c.write_closed(&self.run_dir)?;
        Ok(())
    }

    /// Takes up the run from a checkpoint; returns the traces it holds that no closed
    /// file has, for the writer.
    fn take_up(
        &mut self,
        c: crate::checkpoint::Checkpoint,
        max_clock_error_ns: Option<u64>,
    ) -> Vec<JoinedTrace> {
        let m = c.meta;
        self.joiner
            .restore(m.stats, m.joiner_clock_ns, c.written, &c.pending);
        self.started_unix_ns = m.started_unix_ns;
        self.interval_start_ns = m.interval_start_ns;
        self.clock_offset_ns = m.at_ns;
        self.records = m.records;
        self.resent_dropped = m.resent_dropped;
        self.backpressure_episodes = m.backpressure_episodes;
        self.max_conn_id = m.max_conn_id;
        self.restarts = m.restarts;
        self.tallies = m
            .tallies
            .into_iter()
            .map(|(p, complete, incomplete)| {
                (
                    p,
                    Rows {
                        complete,
                        incomplete,
                    },
                )
            })
            .collect();
        // The live view's throughput counts from here: the traces written before are not
        // in the next interval, and the checkpoint does not keep their metrics.
        self.at_last_interval = (
            self.tallies
                .values()
                .map(|t| t.complete + t.incomplete)
                .sum(),
            self.metrics_written,
            self.records,
        );
        self.logged_seq = m.logged_seq.into_iter().collect();
        self.instances = m.instances.into_iter().collect();
        self.control = Control::restore(m.control, max_clock_error_ns);
        self.checkpoints.taken = m.checkpoints;
        self.checkpoints.files_synced = m.files.len();
        if let Some(w) = self.writer.as_mut() {
            w.resume_closed(m.files);
        }
        c.unwritten
    }

    /// Records a probe sent again that the log already held: dropped, counted in the run
    /// and in the restart that made the probe send them.
    fn count_resent(&mut self, records: u64) {
        self.resent_dropped += records;
        if let Some(r) = self.restarts.last_mut() {
            r.resent_records_dropped += records;
        }
    }

    /// An event from a connection reader: logged, then applied.
    fn handle(&mut self, ev: Event) -> Result<(), CollectorError> {
        let at = self.now_ns();
        // The frame's bytes as the probe sent them, when the reader kept them: logged as
        // they are (encoding the decoded frame again cost the join thread a third of its
        // time).
        let (ev, raw) = match ev {
            Event::FrameWithBytes(id, f, raw) => (Event::Frame(id, f), Some(raw)),
            other => (other, None),
        };
        if let Event::Connected(_, peer, hello) = &ev
            && hello.version < 2
        {
            let why = if self.checkpoints.enabled {
                "the probe speaks only version 1, or keeps nothing to send again (--collector-retention 0)"
            } else {
                "this collector keeps no log (--no-log)"
            };
            tracing::warn!(
                %peer,
                host = %hello.host,
                process = %hello.process,
                "a probe connection runs at protocol version 1 ({why}): its records are not acknowledged or kept to send again, and a collector killed loses what it had not written of them (run.json: probes[].durable false)"
            );
        }
        if let Some(wal) = self.wal.as_mut() {
            match &ev {
                Event::Connected(id, peer, hello) => wal.connected(*id, at, *peer, hello)?,
                Event::Closed(id, clean) => wal.closed(*id, at, *clean)?,
                Event::Frame(id, f) => {
                    if let Frame::SeqRecords { seq, records } = f {
                        let instance = self.instances.get(id).copied().unwrap_or(0);
                        if *seq <= self.logged_seq.get(&instance).copied().unwrap_or(0) {
                            // Sent again after a reconnection: the log has it already.
                            let n = records.len() as u64;
                            wal.resent(*id, n)?;
                            self.count_resent(n);
                            return Ok(());
                        }
                    }
                    match &raw {
                        Some(raw) => wal.frame(*id, at, raw)?,
                        None => wal.frame(*id, at, &frame_bytes(f))?,
                    }
                }
                Event::FrameWithBytes(..) => unreachable!("taken apart above"),
            }
        }
        self.apply(ev, at)
    }

    /// Applies an event at join clock `at` (live, or replayed from the log).
    fn apply(&mut self, ev: Event, at: u64) -> Result<(), CollectorError> {
        let ev = match ev {
            Event::Frame(id, Frame::SeqRecords { seq, records }) => {
                let instance = self.instances.get(&id).copied().unwrap_or(0);
                let logged = self.logged_seq.entry(instance).or_insert(0);
                if seq <= *logged {
                    self.count_resent(records.len() as u64);
                    return Ok(());
                }
                *logged = seq;
                Event::Frame(id, Frame::Records(records))
            }
            Event::Connected(id, peer, hello) => {
                // Kept in checkpoints: a collector that takes the run up numbers its
                // connections after every one the run has seen.
                self.max_conn_id = self.max_conn_id.max(id);
                self.instances.insert(id, hello.instance_id);
                Event::Connected(id, peer, hello)
            }
            other => other,
        };
        if let Event::Frame(id, Frame::Records(recs)) = ev {
            let now = at;
            self.records += recs.len() as u64;
            let mut stamps = self.control.probes.get_mut(&id).map(|p| &mut p.stamps);
            for r in &recs {
                let stored = matches!(
                    self.joiner.insert(r, now, &mut self.out),
                    InsertOutcome::Pending | InsertOutcome::Completed
                );
                if stored
                    && let (Some(s), Some(h)) = (stamps.as_deref_mut(), self.spec.hop_index(r.hop))
                {
                    s[h] += 1;
                }
            }
            return self.write_out();
        }
        self.control.handle(ev);
        Ok(())
    }

    fn write_out(&mut self) -> Result<(), CollectorError> {
        let (Some(w), Some(st)) = (self.writer.as_mut(), self.stages.as_mut()) else {
            return Ok(());
        };
        let ck = &mut self.checkpoints;
        // Checkpoints are taken by a collector that writes its log (not while it replays).
        let watch = ck.enabled && self.wal.is_some();
        for t in self.out.drain(..) {
            st.record(&t);
            self.metrics_written += u64::from(t.metric_count);
            let tally = self.tallies.entry(t.key.publisher).or_default();
            if t.complete {
                tally.complete += 1;
            } else {
                tally.incomplete += 1;
            }
            let closed = w.closed().len();
            w.push(&t)?;
            if watch {
                if w.closed().len() != closed {
                    ck.note_close();
                } else if ck.wanted {
                    ck.since_close.push(t);
                }
            }
        }
        Ok(())
    }

    fn publish_progress(&self) {
        let mut p = self.progress.lock().expect("progress poisoned");
        p.records = self.records;
        p.complete = self.tallies.values().map(|t| t.complete).sum();
        p.incomplete = self.tallies.values().map(|t| t.incomplete).sum();
        p.pending = self.joiner.pending() as u64;
        p.connections = self.control.open() as u64;
        p.closed_connections = connection_counts(&self.counters);
        p.backpressure_episodes = self.backpressure_episodes;
        p.closed_connections.remove("accepted");
        p.log_bytes = self.wal.as_ref().map_or(0, crate::wal::Wal::bytes);
        p.checkpoints = self.checkpoints.taken;
    }

    /// Takes the live view's figures at the end of the interval `start..end`: the
    /// stages' `interval` and `run` figures (in the spec's order), throughput over the
    /// interval, the counts so far and the hosts' clocks. Once per interval.
    fn publish_live(
        &mut self,
        (start, end): (i64, i64),
        interval: &[crate::live::Figures],
        run: &[crate::live::Figures],
        running: bool,
    ) {
        let stats = self.joiner.stats();
        let complete: u64 = self.tallies.values().map(|t| t.complete).sum();
        let incomplete: u64 = self.tallies.values().map(|t| t.incomplete).sum();
        let written = (complete + incomplete, self.metrics_written, self.records);
        let (messages, metrics, records) = (
            written.0.saturating_sub(self.at_last_interval.0),
            written.1.saturating_sub(self.at_last_interval.1),
            written.2.saturating_sub(self.at_last_interval.2),
        );
        self.at_last_interval = written;
        let length_s = (end - start) as f64 / 1e9;
        let per_s = |n: u64| {
            if length_s > 0.0 {
                n as f64 / length_s
            } else {
                0.0
            }
        };
        let names = self.spec.hop_names();
        let accounting = LiveAccounting {
            records: self.records,
            complete,
            incomplete,
            pending: self.joiner.pending() as u64,
            published_messages: self.control.sent().values().map(|e| e.messages).sum(),
            published_metrics: self.control.sent().values().map(|e| e.metrics).sum(),
            late_records: stats.late,
            duplicate_records: stats.duplicates,
            duplicate_traces: stats.duplicate_traces,
            negative_delta_traces: stats.negative_delta_traces,
            implausible_records: stats.implausible,
            unknown_hop_records: stats.unknown_hop,
            unannounced_hop_records: self.counters.unannounced_hop_records.load(Relaxed),
            records_lost_by_probes: self.control.records_lost(),
            missing_by_hop: names
                .iter()
                .zip(stats.missing_by_hop.iter())
                .filter(|(_, n)| **n > 0)
                .map(|(h, n)| (h.clone(), *n))
                .collect(),
            backpressure_episodes: self.backpressure_episodes,
            resent_records_dropped: self.resent_dropped,
        };
        let connections = self.control.open() as u64;
        let clocks = self.control.host_clocks();
        let mut live = self.live.lock().expect("live poisoned");
        live.run_id.clone_from(&self.run_id);
        live.running = running;
        live.started_unix_ns = self.started_unix_ns;
        live.updated_unix_ns = end;
        live.elapsed_s = (end - self.started_unix_ns) as f64 / 1e9;
        live.intervals += 1;
        live.interval = Some(crate::live::Interval {
            start_unix_ns: start,
            end_unix_ns: end,
            length_s,
        });
        for ((s, i), r) in live.stages.iter_mut().zip(interval).zip(run) {
            s.interval = *i;
            s.run = *r;
        }
        live.throughput = Throughput {
            messages,
            metrics,
            messages_per_s: per_s(messages),
            metrics_per_s: per_s(metrics),
            // Not the collector's to know: the server of the live view adds it.
            target_metrics_per_s: None,
            records,
            records_per_s: per_s(records),
            join_window_ms: self.spec.spec().join.window_ms,
        };
        live.accounting = accounting;
        live.connections = connections;
        live.clocks = clocks;
    }

    fn finish(&mut self) -> Result<RunSummary, CollectorError> {
        self.joiner.drain(&mut self.out);
        self.write_out()?;
        let files = self
            .writer
            .take()
            .map(TraceWriter::finish)
            .transpose()?
            .unwrap_or_default();
        let end_unix_ns = hoptrace_clock::realtime_ns();
        let (stages, stages_snapshot) = match self.stages.take() {
            Some(mut st) => {
                let last = st.interval_figures();
                let (stages, snapshot) =
                    st.close(end_unix_ns).map_err(|source| CollectorError::Io {
                        path: self.run_dir.join("hdr"),
                        source,
                    })?;
                let run: Vec<_> = stages.iter().map(crate::live::Figures::of_stage).collect();
                self.publish_live((self.interval_start_ns, end_unix_ns), &last, &run, false);
                (stages, Some(snapshot))
            }
            None => (Vec::new(), None),
        };
        self.publish_progress();
        self.control.write_tables(&self.run_dir)?;
        let summary = self.summary(files, stages);
        if let Some(stages) = stages_snapshot {
            self.write_closed_state(end_unix_ns, &summary.files, stages)?;
        }
        let path = self.run_dir.join("run.json");
        summary
            .write(&path)
            .map_err(|source| CollectorError::Io { path, source })?;
        // The run's files hold everything now: once the disk has them, the log goes.
        if let Some(wal) = self.wal.take() {
            sync_files(&self.run_dir)?;
            wal.remove()?;
        }
        Ok(summary)
    }

    fn summary(&self, files: Vec<PartFile>, stages: Vec<StageStats>) -> RunSummary {
        let stats = self.joiner.stats();
        let names = self.spec.hop_names();
        let rows: BTreeMap<u16, Rows> = self.tallies.iter().map(|(p, r)| (*p, *r)).collect();
        let (publishers, mut discrepancies) = accounting::publishers(
            self.control.sent(),
            &rows,
            self.joiner.written(),
            &self.kept,
        );
        if self.joiner.pending() > 0 {
            discrepancies.push(format!(
                "{} traces still in the join when the run ended",
                self.joiner.pending()
            ));
        }
        for (p, n) in self.control.shared_publisher_ids() {
            discrepancies.push(format!(
                "publisher id {p} was reported by {n} exporters: give each publisher its own id (--publisher-id)"
            ));
        }
        let probes = self
            .control
            .probe_infos(Some(names), Some(self.checkpoints.enabled));
        let records_lost_by_probes = self.control.records_lost();
        let connections = connection_counts(&self.counters);
        RunSummary {
            run_id: self.run_id.clone(),
            pipeline: self.spec.spec().clone(),
            started_unix_ns: self.started_unix_ns,
            ended_unix_ns: hoptrace_clock::realtime_ns(),
            collector_host: host_info(),
            probes,
            clock: self.control.clock().0.to_vec(),
            clock_alerts: self.control.clock().1.to_vec(),
            files,
            stages,
            recovered: self.recovered.clone(),
            accounting: Accounting {
                publishers,
                missing_by_hop: names
                    .iter()
                    .zip(stats.missing_by_hop.iter())
                    .filter(|(_, n)| **n > 0)
                    .map(|(h, n)| (h.clone(), *n))
                    .collect(),
                records_by_hop: names
                    .iter()
                    .zip(stats.records_by_hop.iter())
                    .map(|(h, n)| (h.clone(), *n))
                    .collect(),
                records_lost_by_probes,
                duplicate_traces: stats.duplicate_traces,
                negative_delta_traces: stats.negative_delta_traces,
                late_records: stats.late,
                unknown_hop_records: stats.unknown_hop,
                unannounced_hop_records: self.counters.unannounced_hop_records.load(Relaxed),
                implausible_records: stats.implausible,
                implausible_traces: stats.implausible_traces,
                in_flight: self.joiner.pending() as u64,
                backpressure_episodes: self.backpressure_episodes,
                resent_records_dropped: self.resent_dropped,
                adds_up: discrepancies.is_empty(),
                discrepancies,
            },
            connections,
            group: None,
            interrupted: false,
            restarts: self.restarts.clone(),
        }
    }
}

/// A frame's type byte and body, as the log keeps it.
fn frame_bytes(f: &Frame) -> Vec<u8> {
    let mut out = f.to_bytes().expect("a decoded frame encodes again");
    out.drain(..4);
    out
}

/// Connection outcomes by reason.
pub(crate) fn connection_counts(c: &ConnectionCounters) -> BTreeMap<String, u64> {
    [
        ("accepted", &c.accepted),
        ("refused_limit", &c.refused_limit),
        ("hello_timeout", &c.hello_timeout),
        ("bad_version", &c.bad_version),
        ("bad_token", &c.bad_token),
        ("unknown_hop", &c.unknown_hop),
        ("malformed", &c.malformed),
        ("too_large", &c.too_large),
        ("tls_failed", &c.tls_failed),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.load(Relaxed)))
    .collect()
}

/// `run-YYYYMMDDTHHMMSSZ` from Unix ns.
fn default_run_id(unix_ns: i64) -> String {
    let (y, m, d, h, min, s, _) = hoptrace_format::units::utc_parts(unix_ns);
    format!("run-{y:04}{m:02}{d:02}T{h:02}{min:02}{s:02}Z")
}

/// Creates `out_dir/<base>` for a new run, or `<base>-2`, `<base>-3`, ... when a run of
/// that name exists; returns the id and the directory.
fn claim_run_dir(out_dir: &Path, base: &str) -> Result<(String, PathBuf), CollectorError> {
    std::fs::create_dir_all(out_dir).map_err(|source| CollectorError::Io {
        path: out_dir.to_owned(),
        source,
    })?;
    let mut n = 1u32;
    loop {
        let id = if n == 1 {
            base.to_owned()
        } else {
            format!("{base}-{n}")
        };
        let dir = out_dir.join(&id);
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok((id, dir)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 10_000 => n += 1,
            Err(source) => return Err(CollectorError::Io { path: dir, source }),
        }
    }
}

/// Waits until the disk has every file of the run directory outside the log, and the
/// directories' entries (`fsync`).
fn sync_files(run_dir: &Path) -> Result<(), CollectorError> {
    let sync = |p: &Path| {
        std::fs::File::open(p)
            .and_then(|f| f.sync_all())
            .map_err(|source| CollectorError::Io {
                path: p.to_owned(),
                source,
            })
    };
    for dir in [
        run_dir.to_owned(),
        run_dir.join("traces"),
        run_dir.join("hdr"),
    ] {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_file()) {
                sync(&e.path())?;
            }
        }
        sync(&dir)?;
    }
    Ok(())
}

/// The complete part files (`part-*.parquet`) in `dir`, by name.
fn part_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n.starts_with("part-") && n.ends_with(".parquet"))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Removes what a replayed log writes again: the part files of `traces/` not in `kept`
/// (finished or left open by the killed collector; files set aside earlier as unfinished
/// or corrupt stay), `hdr/` (unless the replay starts from a checkpoint, which cuts the
/// interval logs back to what it recorded), `clock.parquet` and `probes.parquet`.
fn remove_derived(run_dir: &Path, kept: &[String], checkpoint: bool) -> Result<(), CollectorError> {
    let rm_err = |path: &Path| {
        let path = path.to_owned();
        move |source| CollectorError::Io { path, source }
    };
    let traces = run_dir.join("traces");
    if let Ok(rd) = std::fs::read_dir(&traces) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let ours = name.ends_with(".parquet") || name.ends_with(".inprogress");
            if name.starts_with("part-") && ours && !kept.contains(&name) {
                std::fs::remove_file(e.path()).map_err(rm_err(&e.path()))?;
            }
        }
    }
    let hdr = run_dir.join("hdr");
    if !checkpoint && hdr.exists() {
        std::fs::remove_dir_all(&hdr).map_err(rm_err(&hdr))?;
    }
    for name in ["clock.parquet", "probes.parquet"] {
        let p = run_dir.join(name);
        match std::fs::remove_file(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(rm_err(&p)(e)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_are_utc_times() {
        assert_eq!(default_run_id(0), "run-19700101T000000Z");
        // Two runs started within the same second get directories of their own.
        let out = std::env::temp_dir().join(format!("hoptrace-claim-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&out);
        let (a, _) = claim_run_dir(&out, "run-x").unwrap();
        let (b, dir) = claim_run_dir(&out, "run-x").unwrap();
        assert_eq!((a.as_str(), b.as_str()), ("run-x", "run-x-2"));
        assert!(dir.is_dir());
        std::fs::remove_dir_all(&out).unwrap();
        assert_eq!(
            default_run_id(1_700_000_000_000_000_000),
            "run-20231114T221320Z"
        );
        assert_eq!(
            default_run_id(1_709_210_096_000_000_000),
            "run-20240229T123456Z"
        );
    }
}
