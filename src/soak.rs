//! `hoptrace soak`: the whole pipeline as separate processes (collector, reference store,
//! reference processor, publisher) through a real broker at a target rate for a duration,
//! with the CPU and RSS of every process (the broker's included) sampled every second;
//! then the report, with a resource section and the soak's targets, each met or not.
//!
//! Every child logs to `<out>/logs/`; the collector's run directory holds the Parquet,
//! `run.json` and `resources.parquet`.

use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use hoptrace_analysis::report::{Block, Section};
use hoptrace_analysis::resources::{self, Sample};
use hoptrace_analysis::{RunSet, report};
use hoptrace_collector::metrics::fetch_progress;
use hoptrace_collector::run::Progress;
use hoptrace_publisher::report::PublishReport;
use hoptrace_publisher::url::Endpoint;
use hoptrace_runner::procfs::{self, Pid, USER_HZ};
use hoptrace_runner::progress::LiveLine;
use hoptrace_runner::query::{runtime, summarize};
use serde::{Deserialize, Serialize};

use hoptrace_format::units;

/// Parquet bytes per trace the soak aims at.
pub const TARGET_BYTES_PER_TRACE: f64 = 16.0;
/// Seconds the whole-run report may take.
pub const TARGET_REPORT_S: f64 = 60.0;
/// Achieved / target rate the publisher must reach.
pub const TARGET_RATE_RATIO: f64 = 0.99;

/// Options of `hoptrace soak`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Broker the pipeline runs through: `mqtt://host:port` or `kafka://host:port/topic`
    /// (the topic must exist; give it partitions for the processor to keep up).
    #[arg(long)]
    pub broker: String,
    /// Target rate, metrics per second (open loop).
    #[arg(long, default_value = "1M", value_parser = units::parse_count)]
    pub rate: u64,
    /// How long to publish.
    #[arg(long, default_value = "30m", value_parser = units::parse_duration)]
    pub duration: Duration,
    /// Metrics per message (a JSON batch): choose what the broker can carry.
    #[arg(long, default_value_t = 50)]
    pub metrics_per_message: u32,
    /// Streams (topics, or Kafka keys) the load is spread over.
    #[arg(long, default_value_t = 3000)]
    pub streams: u32,
    /// Zipf exponent of the per-stream rates (0: uniform).
    #[arg(long, default_value_t = 0.0)]
    pub zipf: f64,
    /// The processor writes a batch once it holds this many rows...
    #[arg(long, default_value_t = 2000)]
    pub batch_rows: usize,
    /// ...or once its first row has waited this long.
    #[arg(long, default_value = "1ms", value_parser = units::parse_duration)]
    pub linger: Duration,
    /// The publisher's pacing tick (`hoptrace publish --tick`): it wakes at most once per
    /// tick and sends what is due by its end, so the load generator leaves the machine's
    /// cores to the pipeline under test. The schedule lag it adds is reported.
    #[arg(long, default_value = "500us", value_parser = units::parse_duration)]
    pub tick: Duration,
    /// Left out of the resource means and the RSS flatness judgement.
    #[arg(long, default_value = "60s", value_parser = units::parse_duration)]
    pub warmup: Duration,
    /// Directory under which the run directory is written.
    #[arg(long, default_value = "runs")]
    pub runs: PathBuf,
    /// Where the report and the children's logs go (default: `<runs>/<run id>-report`).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Run id (default: `soak-<Unix ms>`); letters, digits, `.`, `_` and `-`.
    #[arg(long, value_parser = crate::units::parse_run_id)]
    pub run_id: Option<String>,
    #[command(flatten)]
    pub preflight: crate::clock::PreflightArgs,
}

/// A child process of the soak (and of the sweep: each cell's soak): its stderr goes to
/// `<logs>/<role>.log`, its stdout lines are kept.
pub(crate) struct Part {
    role: String,
    pub(crate) child: Child,
    stdout: Option<mpsc::Receiver<String>>,
}

impl Part {
    pub(crate) fn spawn(role: &str, cmd: &mut Command, logs: &Path) -> anyhow::Result<Self> {
        let log = std::fs::File::create(logs.join(format!("{role}.log")))
            .with_context(|| format!("creating the log of the {role}"))?;
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .with_context(|| format!("starting the {role}"))?;
        let stdout = child.stdout.take().map(lines_of);
        Ok(Self {
            role: role.to_owned(),
            child,
            stdout,
        })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for the child's `ready` line.
    fn ready(&mut self, within: Duration) -> anyhow::Result<()> {
        let rx = self.stdout.as_ref().context("no stdout")?;
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(line) if line.starts_with("ready") => return Ok(()),
                Ok(_) | Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
            if let Some(status) = self.child.try_wait()? {
                bail!("the {} exited ({status}) before it was ready", self.role);
            }
        }
        bail!("the {} was not ready within {within:?}", self.role)
    }

    /// Sends SIGTERM and waits for the exit; returns what it printed on stdout.
    pub(crate) fn stop(mut self, within: Duration) -> anyhow::Result<Vec<String>> {
        let pid = libc::pid_t::try_from(self.pid()).context("pid")?;
        if self.child.try_wait()?.is_none() {
            // SAFETY: a plain kill(2) of our own child.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let deadline = Instant::now() + within;
        let status = loop {
            if let Some(s) = self.child.try_wait()? {
                break s;
            }
            if Instant::now() > deadline {
                self.child.kill().ok();
                bail!("the {} did not stop within {within:?}; killed", self.role);
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let out: Vec<String> = self
            .stdout
            .take()
            .map(|rx| rx.iter().collect())
            .unwrap_or_default();
        if !status.success() {
            bail!("the {} failed ({status}): {}", self.role, out.join("; "));
        }
        Ok(out)
    }
}

impl Drop for Part {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.child.kill().ok();
            self.child.wait().ok();
        }
    }
}

fn lines_of(stdout: ChildStdout) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The collector's progress, from its `/progress.json`.
fn scrape(addr: SocketAddr) -> Option<Progress> {
    fetch_progress(addr, Duration::from_secs(2)).ok()
}

/// Samples CPU and RSS of a set of processes every second.
struct Sampler {
    started: Instant,
    last: BTreeMap<u32, (Instant, u64)>,
    samples: Vec<Sample>,
}

impl Sampler {
    fn new(started: Instant) -> Self {
        Self {
            started,
            last: BTreeMap::new(),
            samples: Vec::new(),
        }
    }

    fn sample(&mut self, procs: &[(String, u32)]) -> Vec<(String, f64, u64)> {
        let now = Instant::now();
        let mut out = Vec::new();
        for (role, pid) in procs {
            let Some(ticks) = procfs::process_ticks(Pid::Other(*pid)) else {
                continue;
            };
            let rss = procfs::status_bytes(Pid::Other(*pid), "VmRSS:").unwrap_or(0);
            let prev = self.last.insert(*pid, (now, ticks));
            let Some((then, before)) = prev else { continue };
            let secs = now.duration_since(then).as_secs_f64();
            if secs <= 0.0 {
                continue;
            }
            let cores = ticks.saturating_sub(before) as f64 / USER_HZ / secs;
            self.samples.push(Sample {
                t_s: now.duration_since(self.started).as_secs_f64(),
                process: role.clone(),
                pid: *pid,
                cpu_cores: cores,
                rss_bytes: rss,
            });
            out.push((role.clone(), cores, rss));
        }
        out
    }
}

/// One of the soak's targets.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Target {
    /// What is measured.
    pub name: String,
    /// The target.
    pub target: String,
    /// The measured figure.
    pub measured: String,
    /// Whether it was met.
    pub met: bool,
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
    pub resources: Vec<resources::ProcessResources>,
    /// Seconds the report took.
    pub report_s: f64,
    /// Whether everything published reached the collector before the pipeline stopped.
    pub drained: bool,
}

/// Runs the soak and writes its report.
///
/// # Errors
/// Invalid options, a part that does not start or fails, a report that cannot be written,
/// or counts that do not add up.
#[allow(clippy::too_many_lines)]
pub fn run(args: &Args) -> anyhow::Result<()> {
    if args.rate == 0 || args.streams == 0 || args.metrics_per_message == 0 {
        bail!("--rate, --streams and --metrics-per-message must be positive");
    }
    let endpoint = Endpoint::parse(&args.broker).context("--broker")?;
    let broker_port = match &endpoint {
        Endpoint::Mqtt(m) => m.port,
        Endpoint::Kafka(k) => {
            k.bootstrap
                .first()
                .context("--broker: no Kafka bootstrap server")?
                .1
        }
    };
    let stop = crate::signals::shutdown_flag()?;
    args.preflight.check()?;
    let exe = std::env::current_exe().context("this program's path")?;
    let run_id = args
        .run_id
        .clone()
        .unwrap_or_else(|| format!("soak-{}", hoptrace_probe::clock::realtime_ns() / 1_000_000));
    let run_dir = args.runs.join(&run_id);
    // The collector would refuse it too, but only in its log.
    crate::collect::check_run_dir(
        &run_dir,
        &hoptrace_format::spec::PipelineSpec::default_pipeline(),
        false,
    )?;
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| args.runs.join(format!("{run_id}-report")));
    let logs = out.join("logs");
    std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;

    let collector_addr = format!("127.0.0.1:{}", free_port()?);
    let metrics_addr: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
    let store_addr = format!("127.0.0.1:{}", free_port()?);
    let mut collect = Command::new(&exe);
    collect
        .args(["collect", "--listen", &collector_addr, "--run-id", &run_id])
        .arg("--runs")
        .arg(&args.runs)
        .arg("--metrics")
        .arg(metrics_addr.to_string());
    if let Some(max) = args.preflight.max_clock_error {
        collect.args(["--max-clock-error", &format!("{max}ns"), "--force-clock"]);
    }
    let collector = Part::spawn("collector", &mut collect, &logs)?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while scrape(metrics_addr).is_none() {
        if Instant::now() > deadline {
            bail!("the collector did not start (see {})", logs.display());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut store = Part::spawn(
        "store",
        Command::new(&exe).args([
            "refpipe",
            "store",
            "--listen",
            &store_addr,
            "--collector",
            &collector_addr,
        ]),
        &logs,
    )?;
    store.ready(Duration::from_secs(20))?;
    let root = format!("hoptrace-soak/{run_id}");
    let mut flow_cmd = Command::new(&exe);
    flow_cmd.args([
        "refpipe",
        "processor",
        "--from",
        &args.broker,
        "--store",
        &store_addr,
        "--collector",
        &collector_addr,
        "--batch-rows",
        &args.batch_rows.to_string(),
        "--linger",
        &format!("{}us", args.linger.as_micros()),
    ]);
    if matches!(endpoint, Endpoint::Mqtt(_)) {
        flow_cmd.args(["--topics", &format!("{root}/#")]);
    }
    let mut processor = Part::spawn("processor", &mut flow_cmd, &logs)?;
    processor.ready(Duration::from_secs(30))?;
    let publisher_json = out.join("publisher.json");
    let mut pub_cmd = Command::new(&exe);
    pub_cmd
        .args([
            "publish",
            "--to",
            &args.broker,
            "--rate",
            &args.rate.to_string(),
            "--streams",
            &args.streams.to_string(),
            "--metrics-per-message",
            &args.metrics_per_message.to_string(),
            "--duration",
            &format!("{}ms", args.duration.as_millis()),
            "--zipf",
            &args.zipf.to_string(),
            "--tick",
            &format!("{}us", args.tick.as_micros()),
            "--topic-root",
            &root,
            "--collector",
            &collector_addr,
        ])
        .arg("--summary-json")
        .arg(&publisher_json);
    let started = Instant::now();
    let mut publisher = Part::spawn("publisher", &mut pub_cmd, &logs)?;

    let broker_pid = procfs::listener_pid(broker_port);
    let broker_role = broker_pid
        .and_then(|p| procfs::command_name(Pid::Other(p)))
        .map_or_else(|| "broker".to_owned(), |n| format!("broker ({n})"));
    let broker_version = broker_pid.map_or_else(|| "unknown".to_owned(), broker_version);
    let mut procs: Vec<(String, u32)> = vec![
        ("publisher".into(), publisher.pid()),
        ("processor".into(), processor.pid()),
        ("store".into(), store.pid()),
        ("collector".into(), collector.child.id()),
    ];
    if let Some(p) = broker_pid {
        procs.push((broker_role.clone(), p));
    } else {
        eprintln!(
            "soak: no process listens on port {broker_port} that this user can see; the broker's resources are not sampled"
        );
    }
    eprintln!(
        "hoptrace soak: {} metrics/s ({} per message) for {:.0} s over {} streams through {} ({broker_version}); run {run_id}",
        units::rate(args.rate as f64),
        args.metrics_per_message,
        args.duration.as_secs_f64(),
        args.streams,
        endpoint.display()
    );
    let mut sampler = Sampler::new(started);
    sampler.sample(&procs);
    let mut live = LiveLine::new();
    let planned = args.duration.as_secs_f64();
    let mut next = started + Duration::from_secs(1);
    let publish_status = loop {
        if let Some(s) = publisher.child.try_wait()? {
            break s;
        }
        if stop.load(Relaxed) {
            // SAFETY: a plain kill(2) of our own child; it stops early and reports.
            unsafe { libc::kill(libc::pid_t::try_from(publisher.pid())?, libc::SIGTERM) };
        }
        let now = Instant::now();
        if now < next {
            std::thread::sleep((next - now).min(Duration::from_millis(100)));
            continue;
        }
        next += Duration::from_secs(1);
        let s = sampler.sample(&procs);
        live.tick(|_| {
            let c = scrape(metrics_addr).unwrap_or_default();
            let t = started.elapsed().as_secs_f64();
            let cpu: Vec<String> = s
                .iter()
                .map(|(r, cores, rss)| format!("{r} {cores:.2}c/{}M", rss >> 20))
                .collect();
            format!(
                "{t:>5.0}s  traces {} ({}/s) pending {}  {}  ETA {:.0}s",
                c.complete + c.incomplete,
                units::rate((c.complete + c.incomplete) as f64 / t.max(1e-3)),
                c.pending,
                cpu.join("  "),
                (planned - t).max(0.0)
            )
        });
    };
    live.finish();
    let interrupted = stop.load(Relaxed);
    let publisher_out = publisher.stop(Duration::from_secs(5)).unwrap_or_default();
    if !publish_status.success() {
        bail!(
            "the publisher failed ({publish_status}); see {}",
            logs.join("publisher.log").display()
        );
    }
    let published: PublishReport =
        serde_json::from_slice(&std::fs::read(&publisher_json).context("the publisher's summary")?)
            .context("the publisher's summary")?;
    let sent = published.messages;

    // Drain: until every published trace is joined (or expired) at the collector.
    let mut last = (0, Instant::now());
    let drained = loop {
        let c = scrape(metrics_addr).unwrap_or_default();
        let done = c.complete + c.incomplete;
        if done >= sent && c.pending == 0 {
            break true;
        }
        if done != last.0 {
            last = (done, Instant::now());
        } else if last.1.elapsed() > Duration::from_secs(15) || stop.load(Relaxed) {
            break false;
        }
        if Instant::now() >= next {
            next += Duration::from_secs(1);
            sampler.sample(&procs);
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let processor_out = processor.stop(Duration::from_secs(30))?;
    let store_out = store.stop(Duration::from_secs(30))?;
    collector.stop(Duration::from_secs(120))?;
    for line in publisher_out.iter().chain(&processor_out).chain(&store_out) {
        println!("{line}");
    }
    if interrupted {
        mark_interrupted(&run_dir.join("run.json"))?;
        eprintln!(
            "interrupted: published for {:.0} s of the planned {planned:.0} s; the run and its report say so",
            published.elapsed_ns as f64 / 1e9
        );
    }
    resources::write_parquet(&run_dir.join(resources::FILE), &sampler.samples)?;

    // The report, timed.
    let report_started = Instant::now();
    let runs = RunSet::open(&[&run_dir])?;
    let (s, hists) = summarize(&runtime()?, &runs)?;
    let warmup_s = args.warmup.as_secs_f64();
    let res = resources::section(&sampler.samples, warmup_s);
    let per_process = resources::summarize(&sampler.samples, warmup_s);
    report::write_with(&out, &s, &hists, std::slice::from_ref(&res))?;
    let report_s = report_started.elapsed().as_secs_f64();

    let ratio = published.metrics_per_s / args.rate as f64;
    let a = &s.accounting;
    let bytes_per_trace = s.data.bytes as f64 / s.data.rows.max(1) as f64;
    let collector_flat = per_process
        .iter()
        .find(|p| p.process == "collector")
        .is_some_and(|p| p.rss_flat);
    let targets = vec![
        Target {
            name: "Achieved / target rate over the whole run".into(),
            target: format!(">= {TARGET_RATE_RATIO}"),
            measured: format!(
                "{ratio:.4} ({} of {} metrics/s)",
                units::rate(published.metrics_per_s),
                units::rate(args.rate as f64)
            ),
            met: ratio >= TARGET_RATE_RATIO,
        },
        Target {
            name: "Counts add up (sent = complete + incomplete + dropped)".into(),
            target: "exactly".into(),
            measured: format!(
                "sent {} = complete {} + incomplete {} + unseen {}; lost by probes {}",
                a.sent, a.complete, a.incomplete, a.unseen, a.records_lost_by_probes
            ),
            met: a.adds_up && a.sent == sent,
        },
        Target {
            name: "Collector RSS flat after warm-up".into(),
            target: format!(
                "growth <= {:.0} % of its mean (or {:.0} MiB)",
                resources::FLAT_GROWTH_FRACTION * 100.0,
                resources::FLAT_GROWTH_FLOOR_BYTES / 1_048_576.0
            ),
            measured: per_process
                .iter()
                .find(|p| p.process == "collector")
                .map_or_else(
                    || "not sampled".into(),
                    |p| {
                        format!(
                            "{:.1} MiB/min slope, mean {:.0} MiB, max {:.0} MiB",
                            p.rss_slope_bytes_per_min / 1_048_576.0,
                            p.rss_mean_bytes as f64 / 1_048_576.0,
                            p.rss_max_bytes as f64 / 1_048_576.0
                        )
                    },
                ),
            met: collector_flat,
        },
        Target {
            name: "Parquet bytes per trace".into(),
            target: format!("<= {TARGET_BYTES_PER_TRACE}"),
            measured: format!(
                "{bytes_per_trace:.2} ({} bytes, {} traces)",
                s.data.bytes, s.data.rows
            ),
            met: bytes_per_trace <= TARGET_BYTES_PER_TRACE,
        },
        Target {
            name: "Report over the whole run".into(),
            target: format!("<= {TARGET_REPORT_S:.0} s"),
            measured: format!("{report_s:.1} s"),
            met: report_s <= TARGET_REPORT_S,
        },
    ];
    let command = crate::units::command_line();
    let result = SoakResult {
        command: command.clone(),
        run_id: run_id.clone(),
        broker: endpoint.display(),
        broker_version: broker_version.clone(),
        hoptrace_version: env!("CARGO_PKG_VERSION").into(),
        rate: args.rate,
        duration_s: planned,
        metrics_per_message: args.metrics_per_message,
        streams: args.streams,
        publisher: published,
        targets: targets.clone(),
        resources: per_process,
        report_s,
        drained,
    };
    // The report again, now with the soak's own section (the figures above are final).
    let soak_section = Section {
        blocks: vec![
            Block::Heading(2, "Soak".into()),
            Block::Bullets(vec![
                format!("Command: `{command}`"),
                format!("Broker: {} ({broker_version})", endpoint.display()),
                format!(
                    "Load: {} metrics/s, {} metrics per message, {} streams, {:.0} s; every part a process of its own",
                    units::rate(args.rate as f64),
                    args.metrics_per_message,
                    args.streams,
                    planned
                ),
                format!(
                    "Drained: {}",
                    if drained {
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
                targets
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
    };
    let written = report::write_with(&out, &s, &hists, &[soak_section, res])?;
    std::fs::write(out.join("soak.json"), serde_json::to_vec_pretty(&result)?)?;

    println!();
    crate::analyze::print_summary(&s);
    println!();
    for t in &targets {
        println!(
            "{:<58} {:<22} {:<60} {}",
            t.name,
            t.target,
            t.measured,
            if t.met { "met" } else { "MISSED" }
        );
    }
    for p in &result.resources {
        println!(
            "{:<24} CPU {:.2} cores (max {:.2}), RSS mean {} MiB max {} MiB, slope {:.1} MiB/min{}",
            p.process,
            p.cpu_mean,
            p.cpu_max,
            p.rss_mean_bytes >> 20,
            p.rss_max_bytes >> 20,
            p.rss_slope_bytes_per_min / 1_048_576.0,
            if p.rss_flat { "" } else { " (growing)" }
        );
    }
    println!("Run directory: {}", run_dir.display());
    println!(
        "Report: {} (also report.html, summary.json, soak.json, logs/)",
        written.markdown.display()
    );
    if !s.accounting.adds_up {
        bail!("the run's accounting does not add up: see the report");
    }
    Ok(())
}

/// Marks the run in `run_json` as interrupted (the collector that wrote it could not
/// know).
///
/// # Errors
/// The file does not read, parse or write.
pub(crate) fn mark_interrupted(run_json: &Path) -> anyhow::Result<()> {
    let text =
        std::fs::read(run_json).with_context(|| format!("reading {}", run_json.display()))?;
    let mut run: hoptrace_collector::RunSummary =
        serde_json::from_slice(&text).with_context(|| format!("reading {}", run_json.display()))?;
    run.interrupted = true;
    std::fs::write(run_json, serde_json::to_vec_pretty(&run)?)
        .with_context(|| format!("writing {}", run_json.display()))
}

/// The broker's program and version, best effort: Mosquitto from `mosquitto -h`, Kafka
/// from the jar on its class path.
fn broker_version(pid: u32) -> String {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default();
    let kafka_jar = |name: &str| {
        let stem = name.strip_suffix(".jar")?;
        let version = stem.strip_prefix("kafka_2.")?.split_once('-')?.1;
        Some(format!("Apache Kafka {version}"))
    };
    // The broker's own jar, named on the class path or inside a `dir/*` entry of it.
    let entries: Vec<&str> = cmdline.split([':', ' ']).collect();
    if let Some(v) = entries
        .iter()
        .find_map(|e| kafka_jar(e.rsplit('/').next().unwrap_or(e)))
        .or_else(|| {
            entries
                .iter()
                .filter_map(|e| e.strip_suffix("/*"))
                .filter_map(|dir| std::fs::read_dir(dir).ok())
                .flat_map(|d| d.flatten())
                .find_map(|f| kafka_jar(&f.file_name().to_string_lossy()))
        })
    {
        return v;
    }
    if cmdline.contains("mosquitto") {
        let exe = cmdline.split(' ').next().unwrap_or("mosquitto").to_owned();
        if let Ok(o) = Command::new(exe).arg("-h").output() {
            let text = String::from_utf8_lossy(&o.stdout);
            if let Some(first) = text.lines().next() {
                return first.trim().to_owned();
            }
        }
        return "Mosquitto".into();
    }
    procfs::command_name(Pid::Other(pid)).unwrap_or_else(|| "unknown".into())
}
