//! The stream processor: takes messages from MQTT or Kafka, decodes and transforms their
//! metrics, batches them, and writes each batch to the store over TCP, with the probes
//! embedded as a user would embed them in their own processor:
//!
//! - `flow_in`: the message has been taken from the broker client and its trace context
//!   extracted (`Probe::counted` counts what had none, or a bad one);
//! - `flow_out`: the batch holding the message's rows is about to be encoded and sent to
//!   the store. Every message of a batch gets the same stamp, and the contexts travel to
//!   the store in the write, so the store's probes continue the same traces.
//!
//! A message whose payload does not decode gives no rows and is not forwarded: it stays
//! incomplete in the run (missing `flow_out` and later hops), and is counted here.

use std::io::{BufReader, Write as _};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hoptrace_broker::target::{self, Received, Source};
use hoptrace_broker::url::{Carrier, Endpoint};
use hoptrace_probe::carrier::envelope;
use hoptrace_probe::{ExportSummary, Exporter, Probe, TraceContext};

use crate::decode::{RowBuilder, Transform};
use crate::wire::{self, Frame, WireError};
use crate::{HostClock, Probes, RefpipeError};

/// How the processor runs.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ProcessorConfig {
    /// The broker to consume from.
    pub source: Endpoint,
    /// MQTT topic filters or Kafka topics (empty: `#`, or the address's Kafka topics).
    pub topics: Vec<String>,
    /// Where the trace context travels; default per transport.
    pub carrier: Option<Carrier>,
    /// The store's address.
    pub store: String,
    /// A batch is written once it holds this many rows...
    pub batch_rows: usize,
    /// ...or once its first row has waited this long.
    pub linger: Duration,
    /// Applied to every value.
    pub transform: Transform,
    /// The collector, and the ids of hops `flow_in` and `flow_out`; without it the
    /// processor runs unmeasured.
    pub probes: Option<Probes>,
    /// A stall to inject, as a processor pausing for garbage collection or a lock would:
    /// every `.0` from its start it takes nothing and writes nothing for `.1`. None by
    /// default.
    pub stall: Option<(Duration, Duration)>,
}

impl ProcessorConfig {
    /// A processor from `source` to the store at `store`, 1000-row batches, 1 ms linger.
    #[must_use]
    pub fn new(source: Endpoint, store: impl Into<String>) -> Self {
        Self {
            source,
            topics: Vec::new(),
            carrier: None,
            store: store.into(),
            batch_rows: 1000,
            linger: Duration::from_millis(1),
            transform: Transform::default(),
            probes: None,
            stall: None,
        }
    }
}

/// Live counts of a processor.
#[derive(Debug, Default)]
pub struct ProcessorStats {
    /// Messages taken from the broker.
    pub messages: AtomicU64,
    /// Messages with a trace context.
    pub traced: AtomicU64,
    /// Messages without one (or with one that did not decode); still processed.
    pub untraced: AtomicU64,
    /// Messages whose payload did not decode (no rows, not forwarded).
    pub bad_payloads: AtomicU64,
    /// Rows sent to the store.
    pub rows: AtomicU64,
    /// Values dropped by the transform (not finite).
    pub dropped_values: AtomicU64,
    /// Writes sent.
    pub writes: AtomicU64,
    /// Writes the store acknowledged.
    pub acked: AtomicU64,
    /// Acknowledged writes the store's query found in full.
    pub visible: AtomicU64,
    /// Error frames from the store.
    pub store_errors: AtomicU64,
}

/// What a processor did, at its end.
#[derive(Debug, Clone)]
pub struct ProcessorSummary {
    /// Messages taken from the broker.
    pub messages: u64,
    /// Messages with a trace context.
    pub traced: u64,
    /// Messages without one.
    pub untraced: u64,
    /// Messages whose payload did not decode.
    pub bad_payloads: u64,
    /// Rows sent.
    pub rows: u64,
    /// Values dropped by the transform.
    pub dropped_values: u64,
    /// Writes sent.
    pub writes: u64,
    /// Writes acknowledged.
    pub acked: u64,
    /// Writes found in full by the store's visibility query.
    pub visible: u64,
    /// The error that stopped it early, if any.
    pub error: Option<String>,
    /// The exporter's end, when probes were on.
    pub exporter: Option<ExportSummary>,
}

/// A running processor.
#[derive(Debug)]
pub struct Processor {
    stats: Arc<ProcessorStats>,
    stop: Arc<AtomicBool>,
    worker: Option<JoinHandle<Option<String>>>,
    acks: Option<JoinHandle<()>>,
    /// The store connection, to end the ack reader if the store never closes its side.
    store: TcpStream,
    exporter: Option<Exporter>,
    error: Arc<Mutex<Option<String>>>,
}

struct Worker {
    config: ProcessorConfig,
    carrier: Carrier,
    source: Box<dyn Source>,
    store: TcpStream,
    flow_in: Option<Probe<HostClock>>,
    flow_out: Option<Probe<HostClock>>,
    stats: Arc<ProcessorStats>,
    stop: Arc<AtomicBool>,
    rows: RowBuilder,
    contexts: Vec<TraceContext>,
    first_row_at: Option<Instant>,
    next_write: u64,
    buf: Vec<u8>,
    /// When it started: stalls are placed from here.
    started: Instant,
}

impl Processor {
    /// Connects to the store and the collector, subscribes to the broker, and starts.
    /// Every message published after this returns is processed.
    ///
    /// # Errors
    /// [`RefpipeError`]: an unreachable broker or store, a bad carrier, undeclared hops.
    pub fn start(config: ProcessorConfig) -> Result<Self, RefpipeError> {
        let carrier = config
            .source
            .carrier(config.carrier)
            .map_err(|e| RefpipeError::Source(e.into()))?;
        let store = TcpStream::connect(&config.store).map_err(|source| RefpipeError::Store {
            addr: config.store.clone(),
            source,
        })?;
        store
            .set_nodelay(true)
            .map_err(|source| RefpipeError::Store {
                addr: config.store.clone(),
                source,
            })?;
        let (exporter, flow_in, flow_out) = match &config.probes {
            None => (None, None, None),
            Some(link) => {
                let (exporter, probes) =
                    link.connect("refpipe-processor", &["flow_in", "flow_out"])?;
                let [i, o]: [Probe<HostClock>; 2] = probes.try_into().expect("two hops asked for");
                (Some(exporter), Some(i), Some(o))
            }
        };
        let source = target::open_source(&config.source, &config.topics, "processor")
            .map_err(RefpipeError::Source)?;
        let stats = Arc::new(ProcessorStats::default());
        let stop = Arc::new(AtomicBool::new(false));
        let error: Arc<Mutex<Option<String>>> = Arc::default();
        let acks = {
            let reader = store.try_clone().map_err(|source| RefpipeError::Store {
                addr: config.store.clone(),
                source,
            })?;
            let (stats, error) = (stats.clone(), error.clone());
            std::thread::Builder::new()
                .name("processor-acks".into())
                .spawn(move || read_acks(reader, &stats, &error))
                .map_err(|source| RefpipeError::Store {
                    addr: config.store.clone(),
                    source,
                })?
        };
        let store_handle = store.try_clone().map_err(|source| RefpipeError::Store {
            addr: config.store.clone(),
            source,
        })?;
        let mut worker = Worker {
            rows: RowBuilder::new(config.transform),
            config,
            carrier,
            source,
            store,
            flow_in,
            flow_out,
            stats: stats.clone(),
            stop: stop.clone(),
            contexts: Vec::new(),
            first_row_at: None,
            next_write: 1,
            buf: Vec::with_capacity(1 << 20),
            started: Instant::now(),
        };
        let worker = std::thread::Builder::new()
            .name("processor".into())
            .spawn(move || worker.run())
            .map_err(|source| RefpipeError::Store {
                addr: String::new(),
                source,
            })?;
        Ok(Self {
            stats,
            stop,
            worker: Some(worker),
            acks: Some(acks),
            store: store_handle,
            exporter,
            error,
        })
    }

    /// Live counts.
    #[must_use]
    pub fn stats(&self) -> &ProcessorStats {
        &self.stats
    }

    /// Whether the processor stopped on its own (broker or store lost).
    #[must_use]
    pub fn has_failed(&self) -> bool {
        self.worker.as_ref().is_some_and(JoinHandle::is_finished)
    }

    /// Writes what is batched, waits up to `timeout` for the store to acknowledge every
    /// write, disconnects, and flushes the probes' exporter.
    #[must_use]
    pub fn stop(mut self, timeout: Duration) -> ProcessorSummary {
        self.stop.store(true, Relaxed);
        let worker_error = self.worker.take().and_then(|w| {
            w.join()
                .unwrap_or_else(|_| Some("the processor thread panicked".into()))
        });
        let deadline = Instant::now() + timeout;
        while self.stats.acked.load(Relaxed) + self.stats.store_errors.load(Relaxed)
            < self.stats.writes.load(Relaxed)
            && Instant::now() < deadline
            && !self.acks.as_ref().is_some_and(JoinHandle::is_finished)
        {
            std::thread::sleep(Duration::from_millis(2));
        }
        // The worker closed its half of the store connection and the store closes its
        // own once it has answered everything; past the timeout, close it here.
        if Instant::now() >= deadline {
            let _ = self.store.shutdown(std::net::Shutdown::Both);
        }
        if let Some(a) = self.acks.take() {
            let _ = a.join();
        }
        let exporter = self.exporter.take().map(Exporter::shutdown);
        let s = &self.stats;
        let error = worker_error.or_else(|| self.error.lock().expect("error poisoned").clone());
        ProcessorSummary {
            messages: s.messages.load(Relaxed),
            traced: s.traced.load(Relaxed),
            untraced: s.untraced.load(Relaxed),
            bad_payloads: s.bad_payloads.load(Relaxed),
            rows: s.rows.load(Relaxed),
            dropped_values: s.dropped_values.load(Relaxed),
            writes: s.writes.load(Relaxed),
            acked: s.acked.load(Relaxed),
            visible: s.visible.load(Relaxed),
            error,
            exporter,
        }
    }
}

impl Worker {
    /// The thread's body; returns the error that ended it early.
    fn run(&mut self) -> Option<String> {
        let error = loop {
            if self.stop.load(Relaxed) {
                break None;
            }
            self.stall();
            let wait = match self.first_row_at {
                Some(t) => self.config.linger.saturating_sub(t.elapsed()),
                None => Duration::from_millis(20),
            };
            match self.source.recv(wait) {
                Ok(Some(msg)) => self.take(&msg),
                Ok(None) => {}
                Err(e) => break Some(format!("broker: {e}")),
            }
            let due = self
                .first_row_at
                .is_some_and(|t| t.elapsed() >= self.config.linger);
            if (self.rows.len() >= self.config.batch_rows || due)
                && let Err(e) = self.flush()
            {
                break Some(format!("store {}: {e}", self.config.store));
            }
        };
        let error = error.or_else(|| {
            self.flush()
                .err()
                .map(|e| format!("store {}: {e}", self.config.store))
        });
        if let Some(e) = &error {
            tracing::error!("the processor stopped: {e}");
        }
        self.source.close();
        let _ = self.store.shutdown(std::net::Shutdown::Write);
        error
    }

    /// Within an injected stall: takes nothing until it ends (or the processor stops).
    fn stall(&self) {
        let Some((every, length)) = self.config.stall.filter(|(e, _)| !e.is_zero()) else {
            return;
        };
        let into = self.started.elapsed().as_nanos() % every.as_nanos();
        let into = Duration::from_nanos(u64::try_from(into).unwrap_or(u64::MAX));
        if into >= length {
            return;
        }
        let until = Instant::now() + (length - into);
        while !self.stop.load(Relaxed) {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            std::thread::sleep(left.min(Duration::from_millis(5)));
        }
    }

    /// Processes one message: extract and stamp its context, decode its rows.
    fn take(&mut self, msg: &Received) {
        self.stats.messages.fetch_add(1, Relaxed);
        let (extracted, body) = match self.carrier {
            Carrier::Envelope => match envelope::unwrap(&msg.payload) {
                Ok((e, body)) => (Ok(e), body),
                Err(e) => (Err(e), msg.payload.as_slice()),
            },
            c => (msg.extract(c), msg.payload.as_slice()),
        };
        let ctx = match (&self.flow_in, extracted) {
            (Some(p), e) => p.counted(e).ok().map(|e| {
                let mut ctx = e.context;
                p.record(&mut ctx);
                ctx
            }),
            (None, e) => e.ok().map(|e| e.context),
        };
        if ctx.is_some() {
            self.stats.traced.fetch_add(1, Relaxed);
        } else {
            self.stats.untraced.fetch_add(1, Relaxed);
        }
        let dropped = self.rows.dropped();
        match self
            .rows
            .push_payload(&msg.topic, body, msg.arrival_ns / 1_000_000)
        {
            Ok(_) => {
                self.stats
                    .dropped_values
                    .fetch_add(self.rows.dropped() - dropped, Relaxed);
                if let Some(ctx) = ctx {
                    self.contexts.push(ctx);
                }
                if self.first_row_at.is_none() && !self.rows.is_empty() {
                    self.first_row_at = Some(Instant::now());
                }
            }
            Err(e) => {
                self.stats.bad_payloads.fetch_add(1, Relaxed);
                tracing::debug!(topic = %msg.topic, "a payload gave no rows: {e}");
            }
        }
        if self.contexts.len() >= wire::MAX_CONTEXTS {
            self.first_row_at = Some(Instant::now() - self.config.linger);
        }
    }

    /// Writes the batch to the store.
    fn flush(&mut self) -> Result<(), WireError> {
        self.first_row_at = None;
        if self.rows.is_empty() && self.contexts.is_empty() {
            return Ok(());
        }
        let rows = self.rows.finish()?;
        if let Some(p) = &self.flow_out {
            let t = p.now_ns();
            for c in &mut self.contexts {
                p.record_at(c, t);
            }
        }
        let id = self.next_write;
        self.next_write += 1;
        let n = rows.num_rows() as u64;
        let frame = Frame::Write {
            id,
            contexts: std::mem::take(&mut self.contexts),
            rows,
        };
        self.buf.clear();
        frame.encode(&mut self.buf)?;
        self.store.write_all(&self.buf)?;
        self.store.flush()?;
        if let Frame::Write { contexts, .. } = frame {
            self.contexts = contexts;
            self.contexts.clear();
        }
        self.stats.writes.fetch_add(1, Relaxed);
        self.stats.rows.fetch_add(n, Relaxed);
        Ok(())
    }
}

/// Reads the store's answers until the connection closes.
fn read_acks(stream: TcpStream, stats: &ProcessorStats, error: &Mutex<Option<String>>) {
    let mut reader = BufReader::new(stream);
    let mut buf = Vec::new();
    loop {
        match wire::read_frame(&mut reader, &mut buf) {
            Ok(Frame::WriteAck { visible, .. }) => {
                stats.acked.fetch_add(1, Relaxed);
                if visible {
                    stats.visible.fetch_add(1, Relaxed);
                }
            }
            Ok(Frame::Error { id, message }) => {
                stats.store_errors.fetch_add(1, Relaxed);
                tracing::error!(write = id, "the store refused a write: {message}");
                *error.lock().expect("error poisoned") =
                    Some(format!("the store refused write {id}: {message}"));
            }
            Ok(other) => {
                tracing::warn!("unexpected answer from the store: {other:?}");
            }
            Err(WireError::Io(_)) => break,
            Err(e) => {
                *error.lock().expect("error poisoned") =
                    Some(format!("bad answer from the store: {e}"));
                break;
            }
        }
    }
}
