//! The collector's own thread: the join state it owns (the joiner, the writer, the log,
//! the stage recorder, the accounting) and the loop that feeds it the listener's events,
//! steps the join's clock, takes checkpoints and writes the run out at the end.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hoptrace_format::run::{Accounting, RunSummary, StageStats};
use hoptrace_format::run::{PartFile, Recovered};
use hoptrace_format::spec::ResolvedSpec;
use hoptrace_protocol::Frame;
use rustc_hash::FxHashMap;

use super::dir::sync_files;
use super::host::host_info;
use super::progress::Progress;
use crate::accounting::{self, Rows};
use crate::control::Control;
use crate::error::CollectorError;
use crate::join::{InsertOutcome, JoinedTrace, Joiner};
use crate::live::{Live, LiveAccounting, Throughput};
use crate::server::{ConnectionCounters, DurableSeqs, Event};
use crate::stages::StageRecorder;
use crate::writer::TraceWriter;

/// Least time between two syncs of the log asked for by a waiting reader (group commit).
const EAGER_SYNC_GAP: Duration = Duration::from_millis(2);

/// What the collector's thread owns while the run lasts, and the counts it keeps.
pub(super) struct JoinState {
    pub(super) joiner: Joiner,
    /// Keys of the part files kept from an earlier collector of this run.
    pub(super) kept: crate::keys::WrittenKeys,
    pub(super) spec: Arc<ResolvedSpec>,
    pub(super) writer: Option<TraceWriter>,
    pub(super) stages: Option<StageRecorder>,
    /// When the current interval of the stages' logs began, `CLOCK_REALTIME` ns.
    pub(super) interval_start_ns: i64,
    pub(super) run_id: String,
    pub(super) run_dir: PathBuf,
    pub(super) started_unix_ns: i64,
    pub(super) epoch: Instant,
    /// Added to `epoch.elapsed()`: a restarted collector's join clock goes on from the
    /// log's last entry.
    pub(super) clock_offset_ns: u64,
    /// A join clock reading and the `CLOCK_REALTIME` of the same moment (the latest step,
    /// start or restart, live or replayed): the Unix time of an event at join clock `at`
    /// is `realtime + (at - join)`. The join clock does not run while no collector does.
    pub(super) realtime_anchor: (u64, i64),
    /// The write-ahead log, when durable.
    pub(super) wal: Option<crate::wal::Wal>,
    /// What is durable per exporter instance, for the connection readers' Acks.
    pub(super) durable: Option<Arc<DurableSeqs>>,
    pub(super) sync_interval: Duration,
    /// Exporter instance of each connection.
    pub(super) instances: FxHashMap<u64, u64>,
    /// Highest numbered frame logged per exporter instance.
    pub(super) logged_seq: FxHashMap<u64, u64>,
    /// Connections whose clean close was logged since the last sync: durable at the next.
    pub(super) closed_unsynced: Vec<u64>,
    /// Records of re-sent frames the log already held, dropped.
    pub(super) resent_dropped: u64,
    pub(super) restarts: Vec<hoptrace_format::run::Restart>,
    /// Highest connection id in the log.
    pub(super) max_conn_id: u64,
    pub(super) control: Control,
    /// Rows written per publisher; looked up once per trace, so hashed with Fx rather
    /// than SipHash.
    pub(super) tallies: FxHashMap<u16, Rows>,
    /// Stamps are plausible within this many ns of the run (before its start, after now).
    pub(super) plausible_ns: i64,
    pub(super) records: u64,
    pub(super) recovered: Option<Recovered>,
    pub(super) backpressure_episodes: u64,
    pub(super) out: Vec<JoinedTrace>,
    pub(super) progress: Arc<Mutex<Progress>>,
    /// The live view's figures, taken as each interval ends.
    pub(super) live: Arc<Mutex<Live>>,
    /// Metrics of the traces written (each trace's `metric_count`).
    pub(super) metrics_written: u64,
    /// Traces and metrics written, and hop records received, when the last interval
    /// ended.
    pub(super) at_last_interval: (u64, u64, u64),
    pub(super) counters: Arc<ConnectionCounters>,
    /// The OTLP receiver's counts, when it runs.
    pub(super) otlp: Option<Arc<crate::ingest::otlp::OtlpCounters>>,
    pub(super) stop_timeout: Duration,
    pub(super) checkpoints: Checkpoints,
}

/// When the run takes checkpoints (`crate::checkpoint`), and what it keeps for the next.
pub(super) struct Checkpoints {
    /// The run keeps a log, so it takes checkpoints.
    pub(super) enabled: bool,
    /// A part file closed at least `interval` after the last checkpoint: the next step
    /// takes one.
    pub(super) wanted: bool,
    /// The traces written since that file closed, while one is wanted: not in a closed
    /// file, so the checkpoint holds them.
    pub(super) since_close: Vec<JoinedTrace>,
    /// When the last one was taken (or the collector started).
    pub(super) last: Instant,
    /// Taken in the run so far.
    pub(super) taken: u64,
    /// Closed part files already synced to disk by an earlier checkpoint.
    pub(super) files_synced: usize,
    /// Least time between two.
    pub(super) interval: Duration,
}

impl Checkpoints {
    /// A part file closed: every trace written so far is in a closed file. A checkpoint
    /// is wanted when the last one is old enough.
    fn note_close(&mut self) {
        self.since_close.clear();
        self.wanted = self.last.elapsed() >= self.interval;
    }

    pub(super) fn new(enabled: bool, interval: Duration) -> Self {
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
    /// The Unix time, ns, of join clock `at` ([`Self::realtime_anchor`]).
    fn unix_ns(&self, at: u64) -> i64 {
        let (join, realtime) = self.realtime_anchor;
        let d = i64::try_from(at.abs_diff(join)).unwrap_or(i64::MAX);
        if at >= join {
            realtime.saturating_add(d)
        } else {
            realtime.saturating_sub(d)
        }
    }

    fn now_ns(&self) -> u64 {
        self.clock_offset_ns
            .saturating_add(u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX))
    }

    /// Opens the run's log: replays it first when it exists (a collector was killed on
    /// this run), then appends after it.
    pub(super) fn open_log(
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
                        self.realtime_anchor = (0, realtime_ns);
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
                    } => {
                        self.realtime_anchor = (last_at, realtime_ns);
                        self.restarts.push(hoptrace_format::run::Restart {
                            at_unix_ns: realtime_ns,
                            log_entries: entries,
                            log_bytes: bytes,
                            torn_bytes,
                            records_replayed: self.records,
                            resent_records_dropped: 0,
                            checkpoint_unix_ns,
                            replay_ms,
                            log_records,
                        });
                    }
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
            // The connections of the killed collector are gone: when, its log does not say
            // past its last entry.
            let gone = self.unix_ns(last_at);
            self.realtime_anchor = (last_at, now);
            let open: Vec<u64> = self.control.open_ids();
            for id in open {
                wal.closed(id, last_at, false)?;
                self.control
                    .handle_at(Event::Closed(id, false), Some(gone))?;
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
                d.mark_closed(self.closed_unsynced.drain(..));
            }
        }
        Ok(())
    }

    pub(super) fn run(
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
            // A sync at every interval, and sooner (group commit, at most every 2 ms) when
            // someone waits for what they sent to be durable.
            let since = last_sync.elapsed();
            if since >= self.sync_interval
                || (since >= EAGER_SYNC_GAP
                    && self.durable.as_ref().is_some_and(|d| d.take_sync_wanted()))
            {
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
                    // Probes that said Goodbye wait for their close to be on disk.
                    self.sync_log()?;
                    break;
                }
            }
        }
        self.finish()
    }

    /// Moves the plausibility window with the run: from `join.plausible_window_s` before
    /// the start to that long after `now` (`CLOCK_REALTIME` ns).
    pub(super) fn move_plausible_window(&mut self, now: i64) {
        self.joiner.set_plausible_window(
            self.started_unix_ns.saturating_sub(self.plausible_ns)
                ..=now.saturating_add(self.plausible_ns),
        );
    }

    /// The join's periodic step at join clock `at` and `realtime_ns`: the plausibility
    /// window moves, traces past their window expire, files roll, and each whole second
    /// ends an interval of the stages' logs. Logged, so a replay takes the same steps.
    fn step(&mut self, at: u64, realtime_ns: i64) -> Result<(), CollectorError> {
        self.realtime_anchor = (at, realtime_ns);
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
                let bounds = st.interval_bounds();
                let slowest = st.interval_slowest();
                st.end_interval(realtime_ns)
                    .map_err(|source| CollectorError::Io {
                        path: self.run_dir.join("hdr"),
                        source,
                    })?;
                let run = st.run_figures();
                let (polled, run_bounds) = (st.polled_hops(), st.run_bounds());
                let bounds = self.live_bounds(polled, bounds, run_bounds);
                self.progress.lock().expect("progress poisoned").stages = interval;
                self.publish_live((start, realtime_ns), &figures, &run, &bounds, true);
                self.publish_slowest(slowest);
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
        let control = self.control.snapshot()?;
        let c = crate::checkpoint::Checkpoint {
            segment,
            meta: self.meta(realtime_ns, files.to_vec(), control),
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

    /// The run's state at `realtime_ns` with closed part files `files` and what probes
    /// said, `control`, for a checkpoint.
    fn meta(
        &self,
        realtime_ns: i64,
        files: Vec<PartFile>,
        control: crate::control::ControlSnapshot,
    ) -> crate::checkpoint::Meta {
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
            control,
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
            self.control.handle(Event::Closed(id, false))?;
        }
        self.control.forget_senders();
        let control = self.control.snapshot()?;
        let c = crate::checkpoint::Checkpoint {
            segment: 1,
            meta: self.meta(realtime_ns, files.to_vec(), control),
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
    ///
    /// # Errors
    /// [`CollectorError::Io`] when the files of the clock and counters rows do not hold
    /// what the checkpoint recorded.
    pub(super) fn take_up(
        &mut self,
        c: crate::checkpoint::Checkpoint,
        max_clock_error_ns: Option<u64>,
    ) -> Result<Vec<JoinedTrace>, CollectorError> {
        let m = c.meta;
        self.joiner
            .restore(m.stats, m.joiner_clock_ns, c.written, &c.pending);
        self.started_unix_ns = m.started_unix_ns;
        self.interval_start_ns = m.interval_start_ns;
        self.clock_offset_ns = m.at_ns;
        self.realtime_anchor = (m.at_ns, m.taken_unix_ns);
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
        self.control = Control::restore(m.control, max_clock_error_ns, Some(&self.run_dir))?;
        self.checkpoints.taken = m.checkpoints;
        self.checkpoints.files_synced = m.files.len();
        if let Some(w) = self.writer.as_mut() {
            w.resume_closed(m.files);
        }
        Ok(c.unwritten)
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
                Event::Closed(id, clean) => {
                    wal.closed(*id, at, *clean)?;
                    if *clean {
                        self.closed_unsynced.push(*id);
                    }
                }
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
        let unix_ns =
            matches!(ev, Event::Connected(..) | Event::Closed(..)).then(|| self.unix_ns(at));
        self.control.handle_at(ev, unix_ns)
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

    /// Per stage, its live bounds from its polled hops and its bounds' figures over the
    /// interval and the run: none for a stage without a polled hop, nor for one whose two
    /// hops one probe connection announced (a poll's send and its response: exact).
    fn live_bounds(
        &self,
        polled: Vec<Vec<String>>,
        interval: Vec<Option<crate::live::BoundFigures>>,
        run: Vec<Option<crate::live::BoundFigures>>,
    ) -> Vec<Option<crate::live::LiveBounds>> {
        let stages = self.spec.spec().stages.iter();
        stages
            .zip(polled)
            .zip(interval.into_iter().zip(run))
            .map(|((st, polled), bounds)| match bounds {
                (Some(interval), Some(run))
                    if !self.control.one_probe_announces(&st.from, &st.to) =>
                {
                    Some(crate::live::LiveBounds {
                        polled,
                        interval,
                        run,
                    })
                }
                _ => None,
            })
            .collect()
    }

    /// Takes the live view's figures at the end of the interval `start..end`: the
    /// stages' `interval` and `run` figures and their `bounds` (in the spec's order), throughput over the
    /// interval, the counts so far and the hosts' clocks. Once per interval.
    fn publish_live(
        &mut self,
        (start, end): (i64, i64),
        interval: &[crate::live::Figures],
        run: &[crate::live::Figures],
        bounds: &[Option<crate::live::LiveBounds>],
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
            missing_by_hop: per_hop(names, &stats.missing_by_hop, false),
            backpressure_episodes: self.backpressure_episodes,
            resent_records_dropped: self.resent_dropped,
        };
        let connections = self.control.open() as u64;
        let clocks = self.control.host_clocks();
        let mut events = self.control.events(&self.restarts, end);
        events.drain(..events.len().saturating_sub(crate::live::LIVE_EVENTS));
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
        for (((s, i), r), b) in live.stages.iter_mut().zip(interval).zip(run).zip(bounds) {
            s.interval = *i;
            s.run = *r;
            s.bounds.clone_from(b);
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
        live.events = events;
    }

    /// Puts each stage's slowest message of the interval just ended into the live view.
    fn publish_slowest(&self, slowest: Vec<Option<crate::live::LiveSlowest>>) {
        let mut live = self.live.lock().expect("live poisoned");
        for (s, slow) in live.stages.iter_mut().zip(slowest) {
            s.slowest = slow;
        }
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
                let last_bounds = st.interval_bounds();
                let slowest = st.interval_slowest();
                let polled = st.polled_hops();
                let (stages, snapshot) =
                    st.close(end_unix_ns).map_err(|source| CollectorError::Io {
                        path: self.run_dir.join("hdr"),
                        source,
                    })?;
                let run: Vec<_> = stages.iter().map(crate::live::Figures::of_stage).collect();
                let bounds = self.live_bounds(polled, last_bounds, snapshot.run_bounds());
                self.publish_live(
                    (self.interval_start_ns, end_unix_ns),
                    &last,
                    &run,
                    &bounds,
                    false,
                );
                self.publish_slowest(slowest);
                (stages, Some(snapshot))
            }
            None => (Vec::new(), None),
        };
        self.publish_progress();
        self.control.write_tables(&self.run_dir)?;
        let (clock, clock_alerts) = self.control.clock()?;
        let clock_alerts = clock_alerts.to_vec();
        let summary = self.summary(files, stages, clock, clock_alerts);
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

    fn summary(
        &self,
        files: Vec<PartFile>,
        stages: Vec<StageStats>,
        clock: Vec<hoptrace_format::run::ClockRow>,
        clock_alerts: Vec<String>,
    ) -> RunSummary {
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
            clock,
            clock_alerts,
            files,
            stages,
            recovered: self.recovered.clone(),
            accounting: Accounting {
                publishers,
                missing_by_hop: per_hop(names, &stats.missing_by_hop, false),
                records_by_hop: per_hop(names, &stats.records_by_hop, true),
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
            otlp: self.otlp.as_ref().map(|c| c.snapshot()).unwrap_or_default(),
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

/// Counts per hop (`counts[i]` is hop `names[i]`'s) by hop name; hops counted 0 are left
/// out unless `zeros`.
fn per_hop(names: &[String], counts: &[u64], zeros: bool) -> BTreeMap<String, u64> {
    names
        .iter()
        .zip(counts)
        .filter(|(_, n)| zeros || **n > 0)
        .map(|(h, n)| (h.clone(), *n))
        .collect()
}
