//! `hoptrace demo`: a whole measurement in one process. The publisher sends traced metrics
//! through an MQTT broker (rumqttd in this process, or an external MQTT or Kafka broker)
//! to the reference pipeline's processor and store (`refpipe/`); every hop reports its
//! stamps over loopback TCP to the collector, which writes the run; the analysis then
//! writes the report (md, html, json, charts).
//!
//! Like the soak, a demo is two calls, so that the command can print the parts' summaries
//! in between: [`measure`] (start the parts, then [`crate::pipeline::measure`]: publish,
//! drain by the one drain rule, stop) and [`report`].

use hoptrace_cli::demo::DemoArgs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use hoptrace_analysis::{RunSet, Summary, report as reports};
use hoptrace_broker::url::Endpoint;
use hoptrace_collector::metrics::MetricsServer;
use hoptrace_collector::run::Progress;
use hoptrace_collector::{Collector, CollectorConfig, RunSummary};
use hoptrace_format::spec::PipelineSpec;
use hoptrace_format::units;
use hoptrace_probe::{ClockReporting, ExporterConfig};
use hoptrace_publisher::publish::{
    LiveSnapshot, PublishConfig, PublishError, PublishSummary, Publisher,
};
use hoptrace_publisher::report::PublishReport;
use hoptrace_publisher::schedule::LoadShape;
use hoptrace_publisher::uns::TopicScheme;
use hoptrace_refpipe::broker::EmbeddedBroker;
use hoptrace_refpipe::processor::{Processor, ProcessorConfig, ProcessorSummary};
use hoptrace_refpipe::server::{StoreServer, StoreServerConfig, StoreServerSummary};
use hoptrace_refpipe::{ClockStep, DEFAULT_HOPS, Probes, SimulatedHost};

use crate::pipeline::{self, DrainEnd, Parts};

/// What to demonstrate.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// An external broker instead of the one in this process: `mqtt://host:port` or
    /// `kafka://host:port/topic` (the topic must exist).
    pub broker: Option<String>,
    /// Target rate, metrics per second (open loop).
    pub rate: f64,
    /// How long to publish.
    pub duration: Duration,
    /// Streams (topics, or Kafka keys) the load is spread over.
    pub streams: u32,
    /// Metrics carried per message (a JSON batch).
    pub metrics_per_message: u32,
    /// Zipf exponent of the per-stream rates (0: uniform).
    pub zipf: f64,
    /// The processor writes a batch once it holds this many rows...
    pub batch_rows: usize,
    /// ...or once its first row has waited this long.
    pub linger: Duration,
    /// The processor stalls for `.1` every `.0` (none by default).
    pub stall: Option<(Duration, Duration)>,
    /// Directory under which the run directory is written.
    pub runs: PathBuf,
    /// Simulate the store on another host whose clock is off by this much, ns.
    pub store_clock_offset_ns: Option<i64>,
    /// The error bound the simulated store host claims for its clock, ns.
    pub store_clock_bound_ns: u64,
    /// Step the simulated store host's clock by `.1` ns `.0` after the pipeline starts.
    pub store_clock_step: Option<(Duration, i64)>,
    /// The collector's clock check of every probe host, ns.
    pub max_clock_error_ns: Option<u64>,
    /// Serve the collector's live view (and `/metrics`, `/progress.json`) here.
    pub ui: Option<String>,
}

impl DemoOptions {
    /// Checks the counts (the broker address is checked by [`measure`], before anything
    /// starts).
    ///
    /// # Errors
    /// A count that is not positive.
    pub fn check(&self) -> anyhow::Result<()> {
        if self.streams == 0 || self.metrics_per_message == 0 {
            bail!("--streams and --metrics-per-message must be positive");
        }
        Ok(())
    }
}

/// What [`measure`] gives back.
#[derive(Debug)]
pub struct DemoMeasured {
    /// The run directory, written whole.
    pub run_dir: PathBuf,
    /// The publisher's end summary.
    pub published: PublishReport,
    /// The processor's summary.
    pub processor: ProcessorSummary,
    /// The store's summary.
    pub store: StoreServerSummary,
    /// What the collector wrote to `run.json`.
    pub run: RunSummary,
    /// How the drain ended.
    pub drain: DrainEnd,
    /// Whether a stop was requested while publishing.
    pub interrupted: bool,
    /// When the demo started.
    pub started: Instant,
}

/// Runs the demo's pipeline to its end: starts the collector, the broker (unless an
/// external one is given), the store, the processor and the publisher in this process,
/// publishes, drains and stops them. A run that does not get that far leaves no run
/// directory behind.
///
/// # Errors
/// Invalid options, a part that does not start, a failure while publishing.
pub fn measure(opts: &DemoOptions, stop: &AtomicBool) -> anyhow::Result<DemoMeasured> {
    opts.check()?;
    // The broker address is checked before anything is started or written.
    let external = opts.broker.as_deref().map(parse_broker).transpose()?;
    let started = Instant::now();
    let run_id = format!("demo-{}", hoptrace_probe::clock::realtime_ns() / 1_000_000);
    let spec = PipelineSpec::default_pipeline();
    let window = Duration::from_millis(spec.join.window_ms);
    let mut cfg = CollectorConfig::new("127.0.0.1:0", spec, &opts.runs);
    cfg.run_id = Some(run_id.clone());
    cfg.max_clock_error_ns = opts.max_clock_error_ns;
    let collector = Collector::start(cfg).context("starting the collector")?;
    let run_dir = collector.run_dir().to_owned();
    // Served until the demo's run is written (then it shows it finished).
    let _ui = match &opts.ui {
        Some(addr) => {
            let server = MetricsServer::start_live(addr, &collector.watch(), Some(opts.rate))
                .with_context(|| format!("serving the live view on {addr}"))?;
            eprintln!("live view on http://{}/", server.local_addr());
            Some(server)
        }
        None => None,
    };
    // Until the run is written whole, a failure removes its directory: a run that never
    // finished would only get in the way of `hoptrace sql 'runs/*'`.
    let unfinished = RemoveUnlessKept(Some(run_dir.clone()));
    let parts = start_parts(opts, collector, external, &run_id)?;
    let m = pipeline::measure(parts, stop, window)?;
    let (processor, store, run) = m.stopped;
    keep_run(unfinished, &run_dir.join("run.json"), m.interrupted)?;
    Ok(DemoMeasured {
        run_dir,
        published: m.published,
        processor,
        store,
        run,
        drain: m.drain,
        interrupted: m.interrupted,
        started,
    })
}

/// A broker address for `--broker`, with what the demo needs of it.
fn parse_broker(url: &str) -> anyhow::Result<Endpoint> {
    let e = Endpoint::parse(url).context("--broker")?;
    if let Endpoint::Kafka(k) = &e
        && k.topics.is_empty()
    {
        bail!(
            "--broker {url:?}: no topic; the demo publishes to and reads from the topic in the address: kafka://HOST:PORT/TOPIC (e.g. kafka://127.0.0.1:19092/hoptrace-demo)"
        );
    }
    Ok(e)
}

/// Keeps the run the collector wrote whole, then marks it interrupted when it was: a
/// failure to mark it must not cost the run itself.
fn keep_run(
    unfinished: RemoveUnlessKept,
    run_json: &Path,
    interrupted: bool,
) -> anyhow::Result<()> {
    unfinished.keep();
    if interrupted {
        crate::rundir::mark_interrupted(run_json)?;
    }
    Ok(())
}

/// Removes a directory when dropped, unless [`RemoveUnlessKept::keep`] was called.
struct RemoveUnlessKept(Option<PathBuf>);

impl RemoveUnlessKept {
    fn keep(mut self) {
        self.0 = None;
    }
}

impl Drop for RemoveUnlessKept {
    fn drop(&mut self) {
        if let Some(dir) = self.0.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// The demo's parts, all in this process.
struct InProcess {
    collector: Collector,
    // The embedded broker's handle (it serves until the process ends).
    _broker: Option<EmbeddedBroker>,
    store: StoreServer,
    flow: Processor,
    publisher: Option<JoinHandle<Result<PublishSummary, PublishError>>>,
    publisher_stop: Arc<AtomicBool>,
    live: Arc<Mutex<LiveSnapshot>>,
    planned: Duration,
}

/// Starts the broker (unless `external`), the store, the processor and the publisher.
fn start_parts(
    opts: &DemoOptions,
    collector: Collector,
    external: Option<Endpoint>,
    run_id: &str,
) -> anyhow::Result<InProcess> {
    // The demo's probes report the clock status of the daemon that keeps this host's
    // clock, as every probe of the hoptrace command does.
    let mut exporter = ExporterConfig::new(collector.local_addr().to_string(), "hoptrace-demo");
    exporter.clock = ClockReporting::Detect;
    let link = Probes::new(exporter);
    let (broker, endpoint, broker_line) = match external {
        None => {
            let b = EmbeddedBroker::start(1 << 20).context("starting the embedded MQTT broker")?;
            let e = Endpoint::parse(&b.url_v5())?;
            (
                Some(b),
                e,
                "MQTT 5 broker in this process (rumqttd)".to_owned(),
            )
        }
        Some(e) => {
            let line = format!("external broker {}", e.display());
            (None, e, line)
        }
    };
    // Topics of this run only, so a shared broker's other traffic stays out.
    let root = format!("hoptrace-demo/{run_id}");
    let topics = match endpoint {
        Endpoint::Mqtt(_) => vec![format!("{root}/#")],
        Endpoint::Kafka(_) => Vec::new(),
    };

    let mut store = StoreServerConfig::new("127.0.0.1:0");
    let mut store_link = link.clone();
    let step = opts.store_clock_step.map(|(after, by_ns)| ClockStep {
        at: std::time::Instant::now() + after,
        by_ns,
    });
    store_link.simulate =
        (opts.store_clock_offset_ns.is_some() || step.is_some()).then(|| SimulatedHost {
            name: format!("{}-store", hoptrace_clock::hostname()),
            clock_offset_ns: opts.store_clock_offset_ns.unwrap_or(0),
            error_bound_ns: opts.store_clock_bound_ns,
            step,
        });
    store.probes = Some(store_link);
    let store = StoreServer::start(store).context("starting the store")?;
    let mut flow = ProcessorConfig::new(endpoint.clone(), store.local_addr().to_string());
    flow.topics = topics;
    flow.batch_rows = opts.batch_rows;
    flow.linger = opts.linger;
    flow.stall = opts.stall;
    flow.probes = Some(link.clone());
    let flow = Processor::start(flow).context("starting the processor")?;

    let mut shape = LoadShape::uniform(opts.rate, opts.streams);
    shape.metrics_per_message = opts.metrics_per_message;
    shape.zipf_exponent = opts.zipf;
    shape.duration = Some(opts.duration);
    let mut pc = PublishConfig::new(endpoint, shape);
    pc.topics = TopicScheme::Uns {
        root: Some(root),
        seed: 1,
    };
    let mut publish = link.exporter.clone();
    "hoptrace-publish".clone_into(&mut publish.process);
    pc.collector = Some(publish);
    pc.hop = (DEFAULT_HOPS[0].0, DEFAULT_HOPS[0].1.to_owned());
    let publisher = Publisher::new(pc).context("starting the publisher")?;
    eprintln!(
        "hoptrace demo: {} metrics/s ({} per message) for {:.0} s over {} streams through the {broker_line}; run {run_id}",
        units::rate(opts.rate),
        opts.metrics_per_message,
        opts.duration.as_secs_f64(),
        opts.streams
    );
    let live = publisher.live();
    let publisher_stop = Arc::new(AtomicBool::new(false));
    let worker = {
        let stop = Arc::clone(&publisher_stop);
        std::thread::Builder::new()
            .name("publisher".into())
            .spawn(move || publisher.run(&stop))
            .context("starting the publisher thread")?
    };
    Ok(InProcess {
        collector,
        _broker: broker,
        store,
        flow,
        publisher: Some(worker),
        publisher_stop,
        live,
        planned: opts.duration,
    })
}

impl Parts for InProcess {
    type Stopped = (ProcessorSummary, StoreServerSummary, RunSummary);

    fn poll_publisher(&mut self) -> anyhow::Result<Option<PublishReport>> {
        if !self.publisher.as_ref().is_some_and(JoinHandle::is_finished) {
            return Ok(None);
        }
        let worker = self
            .publisher
            .take()
            .context("the publisher already reported")?;
        let summary = worker
            .join()
            .map_err(|_| anyhow::anyhow!("the publisher thread panicked"))??;
        Ok(Some(PublishReport::new(
            &summary,
            summary.elapsed_ns as f64 / 1e9,
        )))
    }

    fn stop_publisher(&mut self) -> anyhow::Result<()> {
        self.publisher_stop.store(true, Relaxed);
        Ok(())
    }

    fn progress(&self) -> Option<Progress> {
        Some(self.collector.progress())
    }

    fn failed(&self) -> bool {
        self.flow.has_failed()
    }

    fn live_line(&mut self, _: Duration) -> String {
        let l = *self.live.lock().expect("live stats poisoned");
        let elapsed = Duration::from_nanos(l.elapsed_ns);
        format!(
            "{:>4.0}s  published {} msgs ({} metrics/s)  processed {}  stored {} rows  lag p99 {}  ETA {:.0}s",
            elapsed.as_secs_f64(),
            l.messages,
            units::rate(l.metrics as f64 / elapsed.as_secs_f64().max(1e-3)),
            self.flow.stats().messages.load(Relaxed),
            self.store.stats().rows.load(Relaxed),
            units::duration_f64(l.lag_p99_ns as f64),
            self.planned.saturating_sub(elapsed).as_secs_f64()
        )
    }

    fn stop(self) -> anyhow::Result<Self::Stopped> {
        let flow = self.flow.stop(Duration::from_secs(10));
        let store = self.store.stop();
        let run = self.collector.stop().context("stopping the collector")?;
        Ok((flow, store, run))
    }
}

/// The demo's report.
#[derive(Debug)]
pub struct DemoReport {
    /// The report's summary.
    pub summary: Summary,
    /// Its `report.md`.
    pub markdown: PathBuf,
}

/// Writes the report of the demo's run into `out`.
///
/// # Errors
/// The run does not read, a query fails, or the report cannot be written.
pub fn report(m: &DemoMeasured, out: &Path) -> anyhow::Result<DemoReport> {
    let runs = RunSet::open(&[&m.run_dir])?;
    let (summary, hists) = crate::query::summarize(&crate::query::runtime()?, &runs)?;
    let written = reports::write(out, &summary, &hists)?;
    Ok(DemoReport {
        summary,
        markdown: written.markdown,
    })
}

impl DemoOptions {
    /// The demo `hoptrace demo`'s options ask for.
    #[must_use]
    pub fn from_args(a: &DemoArgs) -> Self {
        Self {
            broker: a.broker.clone(),
            rate: a.rate,
            duration: a.duration,
            streams: a.streams,
            metrics_per_message: a.metrics_per_message,
            zipf: a.zipf,
            batch_rows: a.batch_rows,
            linger: a.linger,
            stall: a.stall_every.zip(a.stall_for),
            runs: a.runs.clone(),
            store_clock_offset_ns: a.store_clock_offset,
            store_clock_bound_ns: a.store_clock_bound,
            store_clock_step: a.store_clock_step_at.zip(a.store_clock_step),
            max_clock_error_ns: a.preflight.max_clock_error,
            ui: a.ui.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_that_cannot_be_marked_interrupted_is_kept() {
        let dir = std::env::temp_dir().join(format!("hoptrace-demo-keep-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // A run.json that does not read: marking it fails.
        std::fs::write(dir.join("run.json"), b"{ not json").unwrap();
        let unfinished = RemoveUnlessKept(Some(dir.clone()));
        let e = keep_run(unfinished, &dir.join("run.json"), true).unwrap_err();
        assert!(format!("{e:#}").contains("run.json"), "{e:#}");
        assert!(dir.join("run.json").is_file(), "the run was removed");
        // Not interrupted: nothing to mark, the run is kept.
        keep_run(
            RemoveUnlessKept(Some(dir.clone())),
            &dir.join("run.json"),
            false,
        )
        .unwrap();
        assert!(dir.is_dir());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
