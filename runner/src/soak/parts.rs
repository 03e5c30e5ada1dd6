//! The soak's parts: where they listen, the command line of each, and the child processes
//! that run them.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use hoptrace_analysis::resources::Sample;
use hoptrace_broker::url::Endpoint;
use hoptrace_cli::argv::{self, ToArgs as _};
use hoptrace_cli::collect::CollectArgs;
use hoptrace_cli::publish::PublishArgs;
use hoptrace_cli::refpipe::{ProcessorArgs, StoreArgs};
use hoptrace_cli::tap::TapArgs;
use hoptrace_collector::metrics::fetch_progress;
use hoptrace_collector::run::Progress;
use hoptrace_format::units;
use hoptrace_publisher::report::PublishReport;

use crate::broker_process::BrokerProcess;
use crate::pipeline::Parts;
use crate::procfs;
use crate::sampler::{Sampler, Watched};
use crate::supervisor::{Part, free_ports};

use super::plan::{Plan, SoakOptions};

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

/// The command lines of the soak's parts (without the program). Those of `hoptrace
/// collect`, `refpipe store`, `refpipe processor` and `publish` are written from the same
/// option structs the command parses (`hoptrace-cli`), and so are each `tap`'s, from its
/// own arguments.
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
    ///
    /// # Errors
    /// A part's options that do not parse at their defaults (a `HOPTRACE_*` variable of
    /// the environment, which the parts inherit, that the part refuses).
    pub fn new(
        opts: &SoakOptions,
        plan: &Plan,
        at: &Addresses,
        mqtt: bool,
    ) -> anyhow::Result<Self> {
        let mut c: CollectArgs =
            argv::parse(std::iter::empty::<&str>()).context("the collector's options")?;
        c.listen = Some(at.collector.clone());
        c.run_id = Some(plan.run_id.clone());
        c.runs.clone_from(&opts.runs);
        c.metrics = Some(at.metrics.to_string());
        c.pipeline = opts.external.as_ref().map(|x| x.pipeline.clone());
        if let Some(ui) = &at.ui {
            c.ui = Some(ui.clone());
            c.target_rate = Some(opts.rate as f64);
        }
        if let Some(max) = opts.max_clock_error_ns {
            c.preflight.max_clock_error = Some(max);
            c.preflight.force_clock = true;
        }
        let collector = c.to_args(&["collect"]);
        let taps = opts
            .external
            .iter()
            .flat_map(|x| &x.taps)
            .map(|tap| {
                let mut t: TapArgs =
                    argv::parse(tap).with_context(|| format!("the tap `{}`", tap.join(" ")))?;
                t.collector.collector = Some(at.collector.clone());
                t.publishers = vec![plan.publisher_id];
                t.hop_spec.pipeline.clone_from(&c.pipeline);
                Ok(t.to_args(&["tap"]))
            })
            .collect::<anyhow::Result<_>>()?;
        let mut store: StoreArgs =
            argv::parse(std::iter::empty::<&str>()).context("the store's options")?;
        store.listen.clone_from(&at.store);
        store.collector.collector = Some(at.collector.clone());
        let mut processor: ProcessorArgs =
            argv::parse(["--from", &opts.broker]).context("the processor's options")?;
        processor.store.clone_from(&at.store);
        processor.collector.collector = Some(at.collector.clone());
        processor.batch_rows = opts.batch_rows;
        processor.linger = opts.linger;
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
            processor.topics = vec![filter];
        }
        let mut p: PublishArgs =
            argv::parse(["--to", &opts.broker]).context("the publisher's options")?;
        p.rate = opts.rate as f64;
        p.streams = opts.streams;
        p.metrics_per_message = opts.metrics_per_message;
        p.duration = opts.duration;
        p.zipf = opts.zipf;
        p.tick = opts.tick;
        p.collector.collector = Some(at.collector.clone());
        p.publisher_id = Some(plan.publisher_id);
        p.topic_root.clone_from(&plan.topic_root);
        p.payload_context = opts.payload_context;
        p.hop_spec.pipeline.clone_from(&c.pipeline);
        p.summary_json = Some(plan.publisher_json.clone());
        let publisher = p.to_args(&["publish"]);
        let reference = opts.external.is_none();
        Ok(Self {
            collector,
            store: reference.then(|| store.to_args(&["refpipe", "store"])),
            processor: reference.then(|| processor.to_args(&["refpipe", "processor"])),
            taps,
            publisher,
        })
    }
}

/// The soak's parts as child processes.
pub(super) struct Processes {
    pub(super) collector: Part,
    pub(super) store: Option<Part>,
    pub(super) processor: Option<Part>,
    pub(super) taps: Vec<Part>,
    pub(super) publisher: Option<Part>,
    pub(super) publisher_json: PathBuf,
    pub(super) publisher_out: Vec<String>,
    pub(super) logs: PathBuf,
    pub(super) metrics: SocketAddr,
    pub(super) sampler: Sampler,
    pub(super) this_second: Vec<Sample>,
    pub(super) started: Instant,
    pub(super) planned: Duration,
}

/// Starts the collector, the store and the processor (or the taps of an external
/// pipeline) and the publisher, in that order, each once the one before serves; finds the
/// broker's process and those on the watched ports.
pub(super) fn start_parts(
    opts: &SoakOptions,
    plan: &Plan,
    endpoint: &Endpoint,
) -> anyhow::Result<(Processes, Option<BrokerProcess>)> {
    let mut at = Addresses::free()?;
    at.ui = opts.ui.as_deref().map(Addresses::ui).transpose()?;
    if let Some(ui) = &at.ui {
        eprintln!("live view on http://{ui}/");
    }
    let cmds = PartCommands::new(opts, plan, &at, matches!(endpoint, Endpoint::Mqtt(_)))?;
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
pub(super) struct Stopped {
    /// The publisher's, the processor's and the store's stdout lines.
    pub(super) output: Vec<String>,
    /// The resource samples.
    pub(super) samples: Vec<Sample>,
    /// Each tap's stdout lines.
    pub(super) taps: Vec<Vec<String>>,
    /// Sampled processes that died during the run.
    pub(super) exited: Vec<String>,
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
