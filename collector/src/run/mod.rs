//! One collection run: listen, join, write `runs/<run-id>/`, account for every message.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;

use crate::control::Control;
pub use crate::error::CollectorError;
use crate::ingest::otlp::{self, OtlpCounters, OtlpListener, spans::SpanHops};
use crate::join::Joiner;
use crate::live::Live;
use crate::server::{self, ConnectionCounters, DurableSeqs, ServerConfig};
use crate::stages::StageRecorder;
use crate::writer::{TraceWriter, TraceWriterConfig};
use hoptrace_format::run::Recovered;
use hoptrace_format::run::RunSummary;
use hoptrace_format::spec::{PipelineSpec, ResolvedSpec};

mod dir;
mod host;
mod progress;
mod state;

use dir::{claim_run_dir, default_run_id, part_files, remove_derived};
pub use host::host_info;
pub use progress::{Progress, Watch};
#[cfg(feature = "kafka")]
pub(crate) use state::connection_counts;
use state::{Checkpoints, JoinState};

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
    /// Also receive OpenTelemetry spans over OTLP/HTTP: the hops the spec defines by a
    /// span match are stamped by them.
    pub otlp: Option<crate::ingest::otlp::OtlpConfig>,
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
            otlp: None,
        }
    }
}

/// A running collector.
#[derive(Debug)]
pub struct Collector {
    addr: SocketAddr,
    otlp_addr: Option<SocketAddr>,
    recovered: Option<Recovered>,
    continued: Option<hoptrace_format::run::Restart>,
    run_dir: PathBuf,
    /// The live figures the join thread updates.
    watch: Watch,
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
        let otlp = match &cfg.otlp {
            Some(o) => {
                let hops = SpanHops::new(&spec);
                if hops.is_empty() {
                    return Err(CollectorError::NoSpanHop(format!(
                        "--otlp {}: no hop of the pipeline \"{}\" has a `span` match, so no span could stamp one (hoptrace generate-config --otel shows one)",
                        o.listen, cfg.spec.name
                    )));
                }
                Some((OtlpListener::bind(o, cfg.token.as_deref())?, hops))
            }
            None => None,
        };
        let otlp_addr = otlp.as_ref().map(|(l, _)| l.addr());
        let otlp_counters = otlp.as_ref().map(|_| Arc::new(OtlpCounters::default()));
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
            let mut control = Control::new(cfg.max_clock_error_ns);
            if checkpoint.is_none() {
                // A run, or a log replayed from its start, writes these rows from the
                // first; taken up from a checkpoint, they are cut back to it (`take_up`).
                control.rows_to_files(&run_dir)?;
            }
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
                realtime_anchor: (0, started_unix_ns),
                wal: None,
                durable: durable.clone(),
                sync_interval: cfg.sync_interval.min(Duration::from_secs(1)),
                instances: FxHashMap::default(),
                logged_seq: FxHashMap::default(),
                closed_unsynced: Vec::new(),
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
                otlp: otlp_counters.clone(),
                stop_timeout: cfg.stop_timeout,
                checkpoints: Checkpoints::new(cfg.durable, cfg.checkpoint_interval),
            };
            let checkpoint_unix_ns = checkpoint.as_ref().map(|c| c.meta.taken_unix_ns);
            let from_segment = match checkpoint {
                Some(c) => {
                    // The run as it was at its checkpoint; the traces emitted after its
                    // last closed file go to the writer first, as they did then.
                    let segment = c.segment;
                    let unwritten = state.take_up(c, cfg.max_clock_error_ns)?;
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
            let conn_ids = Arc::new(AtomicU64::new(state.max_conn_id));
            let mut sources: Vec<(&str, server::Source)> = Vec::new();
            if let (Some((listener, hops)), Some(c)) = (otlp, &otlp_counters) {
                let shared = otlp::Shared::new(
                    (hops, Arc::clone(c)),
                    (cfg.token.clone(), tls.clone()),
                    run_id.clone(),
                    Arc::clone(&conn_ids),
                    durable.clone(),
                    listener.config(),
                );
                sources.push((
                    "otlp",
                    Box::new(move |tx, stop| otlp::serve(listener, shared, tx, stop)),
                ));
            }
            let server_cfg = ServerConfig {
                token: cfg.token.clone(),
                run_id: run_id.clone(),
                max_connections: cfg.max_connections,
                hello_timeout: cfg.hello_timeout,
                tls,
                durable,
                conn_ids,
            };
            server::Service::spawn(
                ("collector", "join"),
                (listener, server_cfg),
                &spec,
                &counters,
                CHANNEL_FRAMES,
                sources,
                move |rx, draining| state.run(rx, draining),
            )
            .map_err(|source| CollectorError::Io {
                path: run_dir.clone(),
                source,
            })?
        };
        tracing::info!(%addr, run_dir = %run_dir.display(), "collector listening");
        if let Some(a) = otlp_addr {
            tracing::info!(otlp = %a, "collector taking OTLP/HTTP spans at POST /v1/traces");
        }
        Ok(Self {
            addr,
            otlp_addr,
            recovered,
            continued,
            run_dir,
            watch: Watch { progress, live },
            service,
        })
    }

    /// The OTLP receiver's bound address, when it runs.
    #[must_use]
    pub fn otlp_addr(&self) -> Option<SocketAddr> {
        self.otlp_addr
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
        self.watch.progress()
    }

    /// The live view's figures, as of the last interval's end.
    #[must_use]
    pub fn live(&self) -> Live {
        self.watch.live()
    }

    /// A handle on the live figures that outlives a borrow of the collector, for servers
    /// that run until after it stopped.
    #[must_use]
    pub fn watch(&self) -> Watch {
        self.watch.clone()
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
