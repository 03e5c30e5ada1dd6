//! `hoptrace soak`: the whole pipeline as separate processes (collector, reference store,
//! reference processor, publisher) through a real broker at a target rate for a duration,
//! with the CPU and RSS of every process (the broker's included) sampled every second;
//! then the report, with a resource section and the soak's targets, each met or not.
//!
//! Every child is the `hoptrace` program itself ([`SoakOptions::program`]) running one of
//! its commands; [`PartCommands`] holds their command lines, the contract between the soak
//! and its children. Every child logs to `<out>/logs/`; the collector's run directory holds
//! the Parquet, `run.json` and `resources.parquet`.
//!
//! A soak is two calls, so that the command can print the children's output in between:
//! [`measure`] (plan, start the parts, publish, drain, stop: see [`crate::pipeline`]) and
//! [`report()`] (resources, the timed report, the targets, `soak.json`).

pub mod targets;

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use hoptrace_analysis::report::{self, Block, Section};
use hoptrace_analysis::resources::{self, ProcessResources, Sample};
use hoptrace_analysis::{RunSet, Summary};
use hoptrace_collector::metrics::fetch_progress;
use hoptrace_collector::run::Progress;
use hoptrace_format::spec::PipelineSpec;
use hoptrace_format::units;
use hoptrace_publisher::report::PublishReport;
use hoptrace_publisher::url::Endpoint;
use serde::{Deserialize, Serialize};

use crate::broker_process::BrokerProcess;
use crate::pipeline::{self, Parts};
use crate::sampler::{Sampler, Watched};
use crate::supervisor::{Part, free_port};
pub use targets::{TARGET_BYTES_PER_TRACE, TARGET_RATE_RATIO, TARGET_REPORT_S, Target};

/// What to soak.
#[derive(Debug, Clone)]
pub struct SoakOptions {
    /// The `hoptrace` program whose commands are the parts.
    pub program: PathBuf,
    /// The broker address, as given: `mqtt://host:port` or `kafka://host:port/topic`.
    pub broker: String,
    /// Target rate, metrics per second (open loop).
    pub rate: u64,
    /// How long to publish.
    pub duration: Duration,
    /// Metrics per message (a JSON batch).
    pub metrics_per_message: u32,
    /// Streams (topics, or Kafka keys) the load is spread over.
    pub streams: u32,
    /// Zipf exponent of the per-stream rates (0: uniform).
    pub zipf: f64,
    /// The processor writes a batch once it holds this many rows...
    pub batch_rows: usize,
    /// ...or once its first row has waited this long.
    pub linger: Duration,
    /// The publisher's pacing tick.
    pub tick: Duration,
    /// Left out of the resource means and the RSS flatness judgement.
    pub warmup: Duration,
    /// Directory under which the run directory is written.
    pub runs: PathBuf,
    /// Where the report and the children's logs go (default: `<runs>/<run id>-report`).
    pub out: Option<PathBuf>,
    /// Run id (default: `soak-<Unix ms>`).
    pub run_id: Option<String>,
    /// The collector's `--max-clock-error`, ns (it then records every probe host's
    /// clock against it; the soak forces it, as its own preflight already ran).
    pub max_clock_error_ns: Option<u64>,
    /// The command line, for the report.
    pub command: String,
}

impl SoakOptions {
    /// Checks the options; returns the broker address.
    ///
    /// # Errors
    /// A count that is not positive, or a broker address that does not parse.
    pub fn check(&self) -> anyhow::Result<Endpoint> {
        if self.rate == 0 || self.streams == 0 || self.metrics_per_message == 0 {
            bail!("--rate, --streams and --metrics-per-message must be positive");
        }
        Endpoint::parse(&self.broker).context("--broker")
    }
}

/// Where a soak's files go and what its topics are called, decided before anything starts.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The run id.
    pub run_id: String,
    /// The collector's run directory.
    pub run_dir: PathBuf,
    /// The report's directory.
    pub out: PathBuf,
    /// The children's logs.
    pub logs: PathBuf,
    /// The first topic level of the run's MQTT topics (the Kafka topic is the address's).
    pub topic_root: String,
    /// Where the publisher writes its end summary.
    pub publisher_json: PathBuf,
}

impl Plan {
    /// The plan of a soak with `opts`: the run directory must be free to write (the
    /// collector would refuse it too, but only in its log), the log directory is created.
    ///
    /// # Errors
    /// The run directory holds a finished run or another pipeline's; the log directory
    /// cannot be created.
    pub fn new(opts: &SoakOptions) -> anyhow::Result<Self> {
        let run_id = opts.run_id.clone().unwrap_or_else(|| {
            format!("soak-{}", hoptrace_probe::clock::realtime_ns() / 1_000_000)
        });
        let run_dir = opts.runs.join(&run_id);
        crate::rundir::check(&run_dir, &PipelineSpec::default_pipeline(), false)?;
        let out = opts
            .out
            .clone()
            .unwrap_or_else(|| opts.runs.join(format!("{run_id}-report")));
        let logs = out.join("logs");
        std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
        Ok(Self {
            topic_root: format!("hoptrace-soak/{run_id}"),
            publisher_json: out.join("publisher.json"),
            run_id,
            run_dir,
            out,
            logs,
        })
    }
}

/// Where the parts listen.
#[derive(Debug, Clone)]
pub struct Addresses {
    /// The collector, for probes.
    pub collector: String,
    /// The collector's `/metrics` and `/progress.json`.
    pub metrics: SocketAddr,
    /// The store, for the processor's writes.
    pub store: String,
}

impl Addresses {
    /// Free loopback ports for each.
    ///
    /// # Errors
    /// No port can be bound.
    pub fn free() -> anyhow::Result<Self> {
        Ok(Self {
            collector: format!("127.0.0.1:{}", free_port()?),
            metrics: format!("127.0.0.1:{}", free_port()?).parse()?,
            store: format!("127.0.0.1:{}", free_port()?),
        })
    }
}

/// The command lines of the soak's parts (without the program): the flags of
/// `hoptrace collect`, `refpipe store`, `refpipe processor` and `publish` that the soak
/// relies on.
#[derive(Debug, Clone)]
pub struct PartCommands {
    /// `hoptrace collect ...`.
    pub collector: Vec<OsString>,
    /// `hoptrace refpipe store ...`.
    pub store: Vec<OsString>,
    /// `hoptrace refpipe processor ...`.
    pub processor: Vec<OsString>,
    /// `hoptrace publish ...`.
    pub publisher: Vec<OsString>,
}

impl PartCommands {
    /// The command lines of a soak with `opts` and `plan`, its parts at `at`.
    #[must_use]
    pub fn new(opts: &SoakOptions, plan: &Plan, at: &Addresses, mqtt: bool) -> Self {
        fn args<const N: usize>(a: [&str; N]) -> Vec<OsString> {
            a.iter().map(OsString::from).collect()
        }
        let mut collector = args([
            "collect",
            "--listen",
            &at.collector,
            "--run-id",
            &plan.run_id,
        ]);
        collector.extend([
            "--runs".into(),
            opts.runs.clone().into_os_string(),
            "--metrics".into(),
            at.metrics.to_string().into(),
        ]);
        if let Some(max) = opts.max_clock_error_ns {
            collector.extend(args([
                "--max-clock-error",
                &format!("{max}ns"),
                "--force-clock",
            ]));
        }
        let store = args([
            "refpipe",
            "store",
            "--listen",
            &at.store,
            "--collector",
            &at.collector,
        ]);
        let mut processor = args([
            "refpipe",
            "processor",
            "--from",
            &opts.broker,
            "--store",
            &at.store,
            "--collector",
            &at.collector,
            "--batch-rows",
            &opts.batch_rows.to_string(),
            "--linger",
            &format!("{}us", opts.linger.as_micros()),
        ]);
        if mqtt {
            processor.extend(args(["--topics", &format!("{}/#", plan.topic_root)]));
        }
        let mut publisher = args([
            "publish",
            "--to",
            &opts.broker,
            "--rate",
            &opts.rate.to_string(),
            "--streams",
            &opts.streams.to_string(),
            "--metrics-per-message",
            &opts.metrics_per_message.to_string(),
            "--duration",
            &format!("{}ms", opts.duration.as_millis()),
            "--zipf",
            &opts.zipf.to_string(),
            "--tick",
            &format!("{}us", opts.tick.as_micros()),
            "--topic-root",
            &plan.topic_root,
            "--collector",
            &at.collector,
        ]);
        publisher.extend([
            "--summary-json".into(),
            plan.publisher_json.clone().into_os_string(),
        ]);
        Self {
            collector,
            store,
            processor,
            publisher,
        }
    }
}

/// What [`measure`] gives back, for [`report()`].
#[derive(Debug)]
pub struct SoakMeasured {
    /// The plan the soak ran.
    pub plan: Plan,
    /// The broker's address, for the report.
    pub broker: String,
    /// The broker's program and version, as far as they could be found.
    pub broker_version: String,
    /// The publisher's end summary.
    pub published: PublishReport,
    /// Whether everything published reached the collector before the pipeline stopped.
    pub drained: bool,
    /// Whether a stop was requested while publishing.
    pub interrupted: bool,
    /// CPU and RSS of every process, about once a second.
    pub samples: Vec<Sample>,
    /// What the publisher, the processor and the store printed on stdout (their
    /// summaries), in that order.
    pub output: Vec<String>,
}

/// Runs the soak's pipeline to its end: plans the run, starts the parts, publishes,
/// drains and stops them.
///
/// # Errors
/// Invalid options, a run directory in the way, a part that does not start or fails.
pub fn measure(opts: &SoakOptions, stop: &AtomicBool) -> anyhow::Result<SoakMeasured> {
    let endpoint = opts.check()?;
    let plan = Plan::new(opts)?;
    let (parts, broker) = start_parts(opts, &plan, &endpoint)?;
    let window = Duration::from_millis(PipelineSpec::default_pipeline().join.window_ms);
    let m = pipeline::measure(parts, stop, window)?;
    let (output, samples) = m.stopped;
    Ok(SoakMeasured {
        plan,
        broker: endpoint.display(),
        broker_version: broker.map_or_else(|| "unknown".to_owned(), |b| b.version),
        published: m.published,
        drained: m.drain.drained(),
        interrupted: m.interrupted,
        samples,
        output,
    })
}

/// The soak's parts as child processes.
struct Processes {
    collector: Part,
    store: Part,
    processor: Part,
    publisher: Option<Part>,
    publisher_json: PathBuf,
    publisher_out: Vec<String>,
    logs: PathBuf,
    metrics: SocketAddr,
    sampler: Sampler,
    this_second: Vec<Sample>,
    started: Instant,
    planned: Duration,
}

/// Starts the collector, the store, the processor and the publisher, in that order, each
/// once the one before serves; finds the broker's process.
fn start_parts(
    opts: &SoakOptions,
    plan: &Plan,
    endpoint: &Endpoint,
) -> anyhow::Result<(Processes, Option<BrokerProcess>)> {
    let at = Addresses::free()?;
    let cmds = PartCommands::new(opts, plan, &at, matches!(endpoint, Endpoint::Mqtt(_)));
    let part = |role: &str, args: &[OsString]| {
        Part::spawn(role, Command::new(&opts.program).args(args), &plan.logs)
    };
    let collector = part("collector", &cmds.collector)?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while fetch_progress(at.metrics, Duration::from_secs(2)).is_err() {
        if Instant::now() > deadline {
            bail!("the collector did not start (see {})", plan.logs.display());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut store = part("store", &cmds.store)?;
    store.ready(Duration::from_secs(20))?;
    let mut processor = part("processor", &cmds.processor)?;
    processor.ready(Duration::from_secs(30))?;
    let started = Instant::now();
    let publisher = part("publisher", &cmds.publisher)?;

    let broker_port = match endpoint {
        Endpoint::Mqtt(m) => m.port,
        Endpoint::Kafka(k) => {
            k.bootstrap
                .first()
                .context("--broker: no Kafka bootstrap server")?
                .1
        }
    };
    let broker = BrokerProcess::find(broker_port);
    let mut watched: Vec<Watched> = [
        ("publisher", &publisher),
        ("processor", &processor),
        ("store", &store),
        ("collector", &collector),
    ]
    .map(|(role, p)| Watched {
        role: role.into(),
        pid: p.pid(),
    })
    .to_vec();
    match &broker {
        Some(b) => watched.push(Watched {
            role: b.role.clone(),
            pid: b.pid,
        }),
        None => eprintln!(
            "soak: no process listens on port {broker_port} that this user can see; the broker's resources are not sampled"
        ),
    }
    eprintln!(
        "hoptrace soak: {} metrics/s ({} per message) for {:.0} s over {} streams through {} ({}); run {}",
        units::rate(opts.rate as f64),
        opts.metrics_per_message,
        opts.duration.as_secs_f64(),
        opts.streams,
        endpoint.display(),
        broker.as_ref().map_or("unknown", |b| b.version.as_str()),
        plan.run_id
    );
    let mut sampler = Sampler::new(started, watched);
    sampler.sample();
    Ok((
        Processes {
            collector,
            store,
            processor,
            publisher: Some(publisher),
            publisher_json: plan.publisher_json.clone(),
            publisher_out: Vec::new(),
            logs: plan.logs.clone(),
            metrics: at.metrics,
            sampler,
            this_second: Vec::new(),
            started,
            planned: opts.duration,
        },
        broker,
    ))
}

impl Parts for Processes {
    /// The children's stdout lines, and the resource samples.
    type Stopped = (Vec<String>, Vec<Sample>);

    fn poll_publisher(&mut self) -> anyhow::Result<Option<PublishReport>> {
        let Some(publisher) = &mut self.publisher else {
            bail!("the publisher has already reported");
        };
        let Some(status) = publisher.try_wait()? else {
            return Ok(None);
        };
        let publisher = self.publisher.take().expect("checked above");
        self.publisher_out = publisher.stop(Duration::from_secs(5)).unwrap_or_default();
        if !status.success() {
            bail!(
                "the publisher failed ({status}); see {}",
                self.logs.join("publisher.log").display()
            );
        }
        let bytes = std::fs::read(&self.publisher_json).context("the publisher's summary")?;
        let report: PublishReport =
            serde_json::from_slice(&bytes).context("the publisher's summary")?;
        Ok(Some(report))
    }

    fn stop_publisher(&mut self) -> anyhow::Result<()> {
        // It stops early on SIGTERM, and still reports.
        self.publisher.as_mut().map_or(Ok(()), Part::terminate)
    }

    fn progress(&self) -> Option<Progress> {
        fetch_progress(self.metrics, Duration::from_secs(2)).ok()
    }

    fn each_second(&mut self) {
        self.this_second = self.sampler.sample().to_vec();
    }

    fn live_line(&mut self, _: Duration) -> String {
        let c = self.progress().unwrap_or_default();
        let t = self.started.elapsed().as_secs_f64();
        let cpu: Vec<String> = self
            .this_second
            .iter()
            .map(|s| format!("{} {:.2}c/{}M", s.process, s.cpu_cores, s.rss_bytes >> 20))
            .collect();
        format!(
            "{t:>5.0}s  traces {} ({}/s) pending {}  {}  ETA {:.0}s",
            c.complete + c.incomplete,
            units::rate((c.complete + c.incomplete) as f64 / t.max(1e-3)),
            c.pending,
            cpu.join("  "),
            (self.planned.as_secs_f64() - t).max(0.0)
        )
    }

    fn stop(self) -> anyhow::Result<Self::Stopped> {
        let processor = self.processor.stop(Duration::from_secs(30))?;
        let store = self.store.stop(Duration::from_secs(30))?;
        self.collector.stop(Duration::from_secs(120))?;
        let mut out = self.publisher_out;
        out.extend(processor);
        out.extend(store);
        Ok((out, self.sampler.into_samples()))
    }
}

/// What `soak.json` holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SoakResult {
    /// The command as given.
    pub command: String,
    /// Run id.
    pub run_id: String,
    /// Broker address.
    pub broker: String,
    /// Broker program and version, as far as they could be found.
    pub broker_version: String,
    /// hoptrace's version.
    pub hoptrace_version: String,
    /// Target rate, metrics per second.
    pub rate: u64,
    /// Planned duration, seconds.
    pub duration_s: f64,
    /// Metrics per message.
    pub metrics_per_message: u32,
    /// Streams.
    pub streams: u32,
    /// The publisher's end summary.
    pub publisher: PublishReport,
    /// The targets.
    pub targets: Vec<Target>,
    /// Per-process resources.
    pub resources: Vec<ProcessResources>,
    /// Seconds the report took.
    pub report_s: f64,
    /// Whether everything published reached the collector before the pipeline stopped.
    pub drained: bool,
}

/// What a soak ends with.
#[derive(Debug)]
pub struct SoakOutcome {
    /// What `soak.json` holds.
    pub result: SoakResult,
    /// The run's report summary.
    pub summary: Summary,
    /// The run directory.
    pub run_dir: PathBuf,
    /// The report's `report.md`.
    pub report: PathBuf,
}

/// Writes the soak's report: marks an interrupted run as such, writes the resource
/// samples, times the report, judges the targets, and writes the report again with the
/// soak's own section, and `soak.json`.
///
/// # Errors
/// A file that cannot be read or written, or a failed query.
pub fn report(opts: &SoakOptions, m: SoakMeasured) -> anyhow::Result<SoakOutcome> {
    let plan = &m.plan;
    if m.interrupted {
        crate::rundir::mark_interrupted(&plan.run_dir.join("run.json"))?;
    }
    resources::write_parquet(&plan.run_dir.join(resources::FILE), &m.samples)?;
    let (summary, hists, resource_section, report_s) = timed_report(opts, &m)?;
    let per_process = resources::summarize(&m.samples, opts.warmup.as_secs_f64());
    let targets = targets::evaluate(&targets::Measures {
        target_metrics_per_s: opts.rate,
        achieved_metrics_per_s: m.published.metrics_per_s,
        sent: m.published.messages,
        accounting: &summary.accounting,
        data: &summary.data,
        resources: &per_process,
        report_s,
    });
    let result = SoakResult {
        command: opts.command.clone(),
        run_id: plan.run_id.clone(),
        broker: m.broker.clone(),
        broker_version: m.broker_version.clone(),
        hoptrace_version: env!("CARGO_PKG_VERSION").into(),
        rate: opts.rate,
        duration_s: opts.duration.as_secs_f64(),
        metrics_per_message: opts.metrics_per_message,
        streams: opts.streams,
        publisher: m.published.clone(),
        targets,
        resources: per_process,
        report_s,
        drained: m.drained,
    };
    // The report again, now with the soak's own section (the figures above are final).
    let written = report::write_with(
        &plan.out,
        &summary,
        &hists,
        &[soak_section(&result), resource_section],
    )?;
    std::fs::write(
        plan.out.join("soak.json"),
        serde_json::to_vec_pretty(&result)?,
    )?;
    Ok(SoakOutcome {
        result,
        summary,
        run_dir: plan.run_dir.clone(),
        report: written.markdown,
    })
}

/// The whole-run report with its resource section, and the seconds it took: the figure
/// the report target judges.
fn timed_report(
    opts: &SoakOptions,
    m: &SoakMeasured,
) -> anyhow::Result<(
    Summary,
    Vec<hoptrace_analysis::summary::StageHistograms>,
    Section,
    f64,
)> {
    let started = Instant::now();
    let runs = RunSet::open(&[&m.plan.run_dir])?;
    let (summary, hists) = crate::query::summarize(&crate::query::runtime()?, &runs)?;
    let section = resources::section(&m.samples, opts.warmup.as_secs_f64());
    report::write_with(
        &m.plan.out,
        &summary,
        &hists,
        std::slice::from_ref(&section),
    )?;
    Ok((summary, hists, section, started.elapsed().as_secs_f64()))
}

/// The report's `## Soak` section: the command, the broker, the load, the drain and the
/// targets.
fn soak_section(r: &SoakResult) -> Section {
    Section {
        blocks: vec![
            Block::Heading(2, "Soak".into()),
            Block::Bullets(vec![
                format!("Command: `{}`", r.command),
                format!("Broker: {} ({})", r.broker, r.broker_version),
                format!(
                    "Load: {} metrics/s, {} metrics per message, {} streams, {:.0} s; every part a process of its own",
                    units::rate(r.rate as f64),
                    r.metrics_per_message,
                    r.streams,
                    r.duration_s
                ),
                format!(
                    "Drained: {}",
                    if r.drained {
                        "every published trace reached the collector before the pipeline stopped"
                    } else {
                        "NO: the pipeline stopped with traces outstanding (they count as incomplete)"
                    }
                ),
            ]),
            Block::Table(
                ["Target", "Aim", "Measured", "Met"]
                    .map(str::to_owned)
                    .to_vec(),
                r.targets
                    .iter()
                    .map(|t| {
                        vec![
                            t.name.clone(),
                            t.target.clone(),
                            t.measured.clone(),
                            if t.met { "yes" } else { "NO" }.into(),
                        ]
                    })
                    .collect(),
            ),
        ],
        charts: Vec::new(),
    }
}

/// Reads a soak's `soak.json` in `dir`.
///
/// # Errors
/// The file does not read or is not a soak's result.
pub fn read_result(dir: &Path) -> anyhow::Result<SoakResult> {
    let path = dir.join("soak.json");
    let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_slice(&bytes).with_context(|| format!("reading {}", path.display()))
}
