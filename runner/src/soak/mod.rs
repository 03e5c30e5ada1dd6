//! `hoptrace soak`: the whole pipeline as separate processes (collector, reference store,
//! reference processor, publisher) through a real broker at a target rate for a duration,
//! with the CPU and RSS of every process (the broker's included) sampled every second;
//! then the report, with a resource section and the soak's targets, each met or not.
//!
//! Or, with [`External`], a pipeline hoptrace did not start (Mosquitto → Node-RED →
//! InfluxDB, Kafka → ClickHouse): no reference processor or store; the soak publishes into
//! it, runs the `hoptrace tap`s that stamp its hops (broker taps, store taps) and the
//! collector with the pipeline's own spec, and samples the processes listening on the
//! ports it is given as well as the broker.
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

/// Exit status of `hoptrace soak` (and `sweep`) when the run was measured and reported but
/// a target was missed (or, for the sweep, a cell's traces were not complete).
pub const EXIT_TARGET_MISSED: i32 = 3;

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
use hoptrace_broker::url::Endpoint;
use hoptrace_collector::metrics::fetch_progress;
use hoptrace_collector::run::Progress;
use hoptrace_format::spec::PipelineSpec;
use hoptrace_format::units;
use hoptrace_publisher::report::PublishReport;
use serde::{Deserialize, Serialize};

use crate::broker_process::BrokerProcess;
use crate::pipeline::{self, Parts};
use crate::procfs;
use crate::sampler::{Sampler, Watched};
use crate::supervisor::{Part, free_ports};
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
    /// Where the collector serves its live view (`hoptrace collect --ui`); a port of 0
    /// is replaced by a free one, so the address can be printed before it starts.
    pub ui: Option<String>,
    /// The command line, for the report.
    pub command: String,
    /// A pipeline hoptrace did not start, measured by taps (`None`: the reference
    /// pipeline).
    pub external: Option<External>,
    /// First topic level of the MQTT topics (default: `hoptrace-soak/<run id>`, or for an
    /// external pipeline the topic of the broker address).
    pub topic_root: Option<String>,
    /// The trace context also in the JSON payload's `hoptrace` field (for pipelines that
    /// keep fields but drop MQTT user properties or Kafka headers).
    pub payload_context: bool,
}

/// A pipeline under test that hoptrace did not start (the user or an `infra/` script
/// starts and stops it), described by its own spec and stamped by `hoptrace tap`s.
#[derive(Debug, Clone)]
pub struct External {
    /// Its pipeline spec (hops, stages, join window).
    pub pipeline: PathBuf,
    /// Each tap's own arguments (`--from`, `--topics`, `--hop`, store options); the soak
    /// adds `--collector`, `--pipeline` and `--publishers`.
    pub taps: Vec<Vec<String>>,
    /// TCP ports whose listening processes (the pipeline's own parts) are sampled.
    pub watch_ports: Vec<u16>,
}

impl External {
    /// Checks the pipeline: its spec loads, it has taps, each with `--from` and without
    /// the flags the soak sets itself. Returns the spec.
    ///
    /// # Errors
    /// What is wrong, naming the option.
    pub fn check(&self) -> anyhow::Result<PipelineSpec> {
        let spec = PipelineSpec::load(&self.pipeline)
            .with_context(|| format!("--pipeline {}", self.pipeline.display()))?;
        if self.taps.is_empty() {
            bail!(
                "--pipeline: give at least one --tap to stamp the pipeline's hops after the publisher"
            );
        }
        for tap in &self.taps {
            if !tap
                .iter()
                .any(|a| a == "--from" || a.starts_with("--from="))
            {
                bail!("--tap {:?}: no --from", tap.join(" "));
            }
            if let Some(a) = tap.iter().find(|a| {
                ["--collector", "--pipeline", "--publishers"]
                    .iter()
                    .any(|f| a == f || a.starts_with(&format!("{f}=")))
            }) {
                bail!(
                    "--tap {:?}: {a} is the soak's to set (it adds --collector, --pipeline and --publishers)",
                    tap.join(" ")
                );
            }
        }
        Ok(spec)
    }
}

/// A `--tap` value as arguments: split at whitespace, `'...'` and `"..."` quoting (no
/// escapes inside single quotes; `\"` and `\\` inside double quotes).
///
/// ```
/// use hoptrace_runner::soak::split_args;
/// assert_eq!(
///     split_args(r#"--from 'mqtt://h:1?version=5' --topics "a b/#""#).unwrap(),
///     ["--from", "mqtt://h:1?version=5", "--topics", "a b/#"]
/// );
/// ```
///
/// # Errors
/// A quote that is not closed.
pub fn split_args(line: &str) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::new();
    let mut cur: Option<String> = None;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                let word = cur.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => word.push(c),
                        None => bail!("unclosed ' in {line:?}"),
                    }
                }
            }
            '"' => {
                let word = cur.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c @ ('"' | '\\')) => word.push(c),
                            Some(c) => {
                                word.push('\\');
                                word.push(c);
                            }
                            None => bail!("unclosed \" in {line:?}"),
                        },
                        Some(c) => word.push(c),
                        None => bail!("unclosed \" in {line:?}"),
                    }
                }
            }
            c if c.is_whitespace() => out.extend(cur.take()),
            c => cur.get_or_insert_with(String::new).push(c),
        }
    }
    out.extend(cur);
    Ok(out)
}

impl SoakOptions {
    /// Checks the options; returns the broker address.
    ///
    /// # Errors
    /// A count that is not positive, a broker address that does not parse, an external
    /// pipeline whose spec does not load or that has no tap, or a tap given a flag the
    /// soak sets itself.
    pub fn check(&self) -> anyhow::Result<Endpoint> {
        if self.rate == 0 || self.streams == 0 || self.metrics_per_message == 0 {
            bail!("--rate, --streams and --metrics-per-message must be positive");
        }
        let endpoint = Endpoint::parse(&self.broker).context("--broker")?;
        if let Some(x) = &self.external {
            x.check()?;
        }
        Ok(endpoint)
    }

    /// The pipeline spec of the run: the external pipeline's, or the reference one.
    ///
    /// # Errors
    /// The external pipeline's spec does not load.
    pub fn spec(&self) -> anyhow::Result<PipelineSpec> {
        match &self.external {
            Some(x) => PipelineSpec::load(&x.pipeline)
                .with_context(|| format!("--pipeline {}", x.pipeline.display())),
            None => Ok(PipelineSpec::default_pipeline()),
        }
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
    /// The first topic level of the run's MQTT topics (the Kafka topic is the address's);
    /// `None`: the topic of the broker address.
    pub topic_root: Option<String>,
    /// Where the publisher writes its end summary.
    pub publisher_json: PathBuf,
    /// The publisher id in the run's trace keys (the taps report only this one's).
    pub publisher_id: u16,
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
        crate::rundir::check(&run_dir, &opts.spec()?, false)?;
        let out = opts
            .out
            .clone()
            .unwrap_or_else(|| opts.runs.join(format!("{run_id}-report")));
        let logs = out.join("logs");
        std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
        let topic_root = match (&opts.topic_root, &opts.external) {
            (Some(root), _) => Some(root.clone()),
            (None, Some(_)) => None,
            (None, None) => Some(format!("hoptrace-soak/{run_id}")),
        };
        // Not 0 (the default of a publisher that sets none), different between soaks.
        let publisher_id =
            1 + u16::try_from(hoptrace_probe::clock::realtime_ns() / 1_000_000 % 65_535)
                .expect("below 65,535");
        Ok(Self {
            topic_root,
            publisher_id,
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
    /// The collector's live view, when asked for.
    pub ui: Option<String>,
}

impl Addresses {
    /// Free loopback ports for each.
    ///
    /// # Errors
    /// No port can be bound.
    pub fn free() -> anyhow::Result<Self> {
        // Picked together: the collector's and the metrics' ports once came out the same.
        let [collector, metrics, store] = free_ports::<3>()?;
        Ok(Self {
            collector: format!("127.0.0.1:{collector}"),
            metrics: format!("127.0.0.1:{metrics}").parse()?,
            store: format!("127.0.0.1:{store}"),
            ui: None,
        })
    }

    /// The live view's address `asked`, with a free port for a port of 0.
    ///
    /// # Errors
    /// `asked` is not HOST:PORT, or no port can be bound.
    pub fn ui(asked: &str) -> anyhow::Result<String> {
        let (host, port) = asked
            .rsplit_once(':')
            .with_context(|| format!("--ui {asked}: expected HOST:PORT"))?;
        if port == "0" {
            let free = std::net::TcpListener::bind((host.trim_matches(['[', ']']), 0))
                .with_context(|| format!("--ui {asked}"))?
                .local_addr()?
                .port();
            return Ok(format!("{host}:{free}"));
        }
        Ok(asked.to_owned())
    }
}

/// The command lines of the soak's parts (without the program): the flags of
/// `hoptrace collect`, `refpipe store`, `refpipe processor`, `tap` and `publish` that the
/// soak relies on.
#[derive(Debug, Clone)]
pub struct PartCommands {
    /// `hoptrace collect ...`.
    pub collector: Vec<OsString>,
    /// `hoptrace refpipe store ...` (the reference pipeline).
    pub store: Option<Vec<OsString>>,
    /// `hoptrace refpipe processor ...` (the reference pipeline).
    pub processor: Option<Vec<OsString>>,
    /// `hoptrace tap ...`, one per tap (an external pipeline).
    pub taps: Vec<Vec<OsString>>,
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
        let pipeline = opts
            .external
            .as_ref()
            .map(|x| x.pipeline.clone().into_os_string());
        if let Some(p) = &pipeline {
            collector.extend(["--pipeline".into(), p.clone()]);
        }
        if let Some(ui) = &at.ui {
            collector.extend(args(["--ui", ui, "--target-rate", &opts.rate.to_string()]));
        }
        if let Some(max) = opts.max_clock_error_ns {
            collector.extend(args([
                "--max-clock-error",
                &format!("{max}ns"),
                "--force-clock",
            ]));
        }
        let publisher_id = plan.publisher_id.to_string();
        let taps = opts
            .external
            .iter()
            .flat_map(|x| &x.taps)
            .map(|tap| {
                let mut a = args(["tap"]);
                a.extend(tap.iter().map(OsString::from));
                a.extend(args([
                    "--collector",
                    &at.collector,
                    "--publishers",
                    &publisher_id,
                ]));
                a.extend(
                    pipeline
                        .iter()
                        .flat_map(|p| ["--pipeline".into(), p.clone()]),
                );
                a
            })
            .collect();
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
        if let (true, Some(root)) = (mqtt, &plan.topic_root) {
            // The address's path is a topic prefix for every part: the publisher publishes
            // under it, so the processor subscribes under it.
            let prefix = match Endpoint::parse(&opts.broker) {
                Ok(Endpoint::Mqtt(m)) => m.prefix,
                _ => None,
            };
            let filter = match prefix {
                Some(p) => format!("{p}/{root}/#"),
                None => format!("{root}/#"),
            };
            processor.extend(args(["--topics", &filter]));
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
            "--collector",
            &at.collector,
            "--publisher-id",
            &publisher_id,
        ]);
        if let Some(root) = &plan.topic_root {
            publisher.extend(args(["--topic-root", root]));
        }
        if opts.payload_context {
            publisher.push("--payload-context".into());
        }
        if let Some(p) = &pipeline {
            publisher.extend(["--pipeline".into(), p.clone()]);
        }
        publisher.extend([
            "--summary-json".into(),
            plan.publisher_json.clone().into_os_string(),
        ]);
        let reference = opts.external.is_none();
        Self {
            collector,
            store: reference.then_some(store),
            processor: reference.then_some(processor),
            taps,
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
    /// What each tap printed on stdout when it stopped (its summary; a store tap's says
    /// what its polling cost), in the order of the taps.
    pub taps: Vec<Vec<String>>,
    /// Sampled processes that died during the run (a part of the pipeline under test).
    pub exited: Vec<String>,
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
    let window = Duration::from_millis(opts.spec()?.join.window_ms);
    let m = pipeline::measure(parts, stop, window)?;
    let Stopped {
        output,
        samples,
        taps,
        exited,
    } = m.stopped;
    Ok(SoakMeasured {
        taps,
        exited,
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
    store: Option<Part>,
    processor: Option<Part>,
    taps: Vec<Part>,
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

/// Starts the collector, the store and the processor (or the taps of an external
/// pipeline) and the publisher, in that order, each once the one before serves; finds the
/// broker's process and those on the watched ports.
fn start_parts(
    opts: &SoakOptions,
    plan: &Plan,
    endpoint: &Endpoint,
) -> anyhow::Result<(Processes, Option<BrokerProcess>)> {
    let mut at = Addresses::free()?;
    at.ui = opts.ui.as_deref().map(Addresses::ui).transpose()?;
    if let Some(ui) = &at.ui {
        eprintln!("live view on http://{ui}/");
    }
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
    let store = match &cmds.store {
        Some(args) => {
            let mut store = part("store", args)?;
            store.ready(Duration::from_secs(20))?;
            Some(store)
        }
        None => None,
    };
    let processor = match &cmds.processor {
        Some(args) => {
            let mut processor = part("processor", args)?;
            processor.ready(Duration::from_secs(30))?;
            Some(processor)
        }
        None => None,
    };
    let mut taps = Vec::with_capacity(cmds.taps.len());
    for (i, args) in cmds.taps.iter().enumerate() {
        let mut tap = part(&format!("tap-{}", i + 1), args)?;
        // A store tap may wait for its store (`--wait-for-store`).
        tap.logged(&["tapping ", "polling "], Duration::from_secs(120))?;
        taps.push(tap);
    }
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
    let mut watched: Vec<Watched> = std::iter::once(&publisher)
        .chain(&processor)
        .chain(&store)
        .chain(&taps)
        .chain(std::iter::once(&collector))
        .map(|p| Watched {
            role: p.role().into(),
            pid: p.pid(),
        })
        .collect();
    match &broker {
        Some(b) => watched.push(Watched {
            role: b.role.clone(),
            pid: b.pid,
        }),
        None => eprintln!(
            "soak: no process listens on port {broker_port} that this user can see; the broker's resources are not sampled"
        ),
    }
    // A cluster on this host: the other bootstrap brokers are sampled too.
    if let Endpoint::Kafka(k) = endpoint {
        for &(_, port) in k.bootstrap.iter().skip(1) {
            if let Some(b) = BrokerProcess::find(port)
                && watched.iter().all(|w| w.pid != b.pid)
            {
                watched.push(Watched {
                    role: format!("{} (port {port})", b.role),
                    pid: b.pid,
                });
            }
        }
    }
    for &port in opts.external.iter().flat_map(|x| &x.watch_ports) {
        match procfs::listener_pid(port) {
            Some(pid) if watched.iter().all(|w| w.pid != pid) => watched.push(Watched {
                role: procfs::command_name(procfs::Pid::Other(pid))
                    .map_or_else(|| format!("port {port}"), |n| format!("{n} (port {port})")),
                pid,
            }),
            Some(_) => {}
            None => eprintln!(
                "soak: no process listens on port {port} that this user can see; its resources are not sampled"
            ),
        }
    }
    eprintln!(
        "hoptrace soak: {} metrics/s ({} per message) for {:.0} s over {} streams through {} ({}){}; run {}",
        units::rate(opts.rate as f64),
        opts.metrics_per_message,
        opts.duration.as_secs_f64(),
        opts.streams,
        endpoint.display(),
        broker.as_ref().map_or("unknown", |b| b.version.as_str()),
        opts.external.as_ref().map_or_else(String::new, |x| format!(
            ", pipeline {} measured by {} tap(s)",
            x.pipeline.display(),
            x.taps.len()
        )),
        plan.run_id
    );
    let mut sampler = Sampler::new(started, watched);
    sampler.sample();
    Ok((
        Processes {
            collector,
            store,
            processor,
            taps,
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

/// What the soak's parts leave when they stop.
struct Stopped {
    /// The publisher's, the processor's and the store's stdout lines.
    output: Vec<String>,
    /// The resource samples.
    samples: Vec<Sample>,
    /// Each tap's stdout lines.
    taps: Vec<Vec<String>>,
    /// Sampled processes that died during the run.
    exited: Vec<String>,
}

impl Parts for Processes {
    type Stopped = Stopped;

    fn poll_publisher(&mut self) -> anyhow::Result<Option<PublishReport>> {
        let Some(publisher) = &mut self.publisher else {
            bail!("the publisher has already reported");
        };
        let Some(status) = publisher.try_wait()? else {
            return Ok(None);
        };
        let publisher = self.publisher.take().expect("checked above");
        // Reaped: its pid is gone from /proc, as it should be.
        self.sampler.unwatch(publisher.pid());
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
        let mut output = self.publisher_out;
        // Upstream first.
        for part in self.processor.into_iter().chain(self.store) {
            output.extend(part.stop(Duration::from_secs(30))?);
        }
        let taps = self
            .taps
            .into_iter()
            .map(|tap| tap.stop(Duration::from_secs(30)))
            .collect::<anyhow::Result<_>>()?;
        self.collector.stop(Duration::from_secs(120))?;
        let exited = self
            .sampler
            .exited()
            .iter()
            .map(ToString::to_string)
            .collect();
        Ok(Stopped {
            output,
            samples: self.sampler.into_samples(),
            taps,
            exited,
        })
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
    /// The external pipeline's spec, when the soak measured one (`None`: the reference
    /// pipeline).
    #[serde(default)]
    pub pipeline: Option<String>,
    /// The taps of an external pipeline: their arguments and their summaries.
    #[serde(default)]
    pub taps: Vec<TapResult>,
    /// Sampled processes (the broker, the watched ports' processes) that died during the
    /// run: `<role> (pid N) was gone at T s`.
    #[serde(default)]
    pub exited: Vec<String>,
}

/// One tap of an external pipeline's soak.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TapResult {
    /// Its arguments, as given to `--tap`.
    pub args: String,
    /// What it printed on stdout when it stopped.
    pub summary: Vec<String>,
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
        pipeline: opts
            .external
            .as_ref()
            .map(|x| x.pipeline.display().to_string()),
        taps: opts
            .external
            .iter()
            .flat_map(|x| &x.taps)
            .zip(&m.taps)
            .map(|(args, summary)| TapResult {
                args: args.join(" "),
                summary: summary.clone(),
            })
            .collect(),
        exited: m.exited.clone(),
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
    let mut blocks = vec![
        Block::Heading(2, "Soak".into()),
        Block::Bullets(vec![
            format!("Command: `{}`", r.command),
            format!("Broker: {} ({})", r.broker, r.broker_version),
            match &r.pipeline {
                Some(spec) => format!(
                    "Pipeline: external (started and stopped outside hoptrace), spec `{spec}`, its hops stamped by {} tap(s)",
                    r.taps.len()
                ),
                None => "Pipeline: the reference pipeline (hoptrace's processor and store)".into(),
            },
            format!(
                "Load: {} metrics/s, {} metrics per message, {} streams, {:.0} s; every part a process of its own",
                units::rate(r.rate as f64),
                r.metrics_per_message,
                r.streams,
                r.duration_s
            ),
            if r.exited.is_empty() {
                "Processes that died during the run: none of those sampled".into()
            } else {
                format!(
                    "**Processes that died during the run: {}**",
                    r.exited.join("; ")
                )
            },
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
                        match (&t.not_judged, t.met) {
                            (Some(why), _) => format!("not judged: {why}"),
                            (None, true) => "yes".into(),
                            (None, false) => "NO".into(),
                        },
                    ]
                })
                .collect(),
        ),
    ];
    for (i, tap) in r.taps.iter().enumerate() {
        blocks.push(Block::Heading(3, format!("Tap {}: `{}`", i + 1, tap.args)));
        blocks.push(Block::Bullets(tap.summary.clone()));
    }
    Section {
        blocks,
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

#[cfg(test)]
mod tests;
