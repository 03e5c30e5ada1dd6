//! `hoptrace sweep`: a matrix of settings (rate, metrics per message, MQTT QoS and
//! connections, Kafka acks and partitions), each cell a `hoptrace soak` of its own with
//! a warm-up and a fixed measured window; the sweep report with the knee of every series
//! and capacity planning. Finished cells are kept: the same command resumes an
//! interrupted sweep where it stopped.
//!
//! Layout of `--out`: `sweep.json` (the matrix and every finished cell), `sweep.md`,
//! `sweep.html`, `charts/`; `runs/<run id>/` the cells' runs (each with `cell.json`, so
//! `hoptrace sql <out>/runs` has the `cells` table); `cells/<cell>/` each cell's soak
//! report and logs.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use hoptrace_analysis::compare::Gate;
use hoptrace_analysis::sweep::{
    self, CELL_FILE, Cell, CellProcess, RATE, Setting, SloResult, SweepInfo, SweepReport,
};
use hoptrace_analysis::{RunSet, summary};
use hoptrace_broker::url::{self, Endpoint, KafkaEndpoint};
use hoptrace_cli::argv::{self, ToArgs as _};
use hoptrace_cli::soak::{ExternalArgs, SoakArgs, SweepArgs};
use hoptrace_collector::run::host_info;
use hoptrace_format::units;

use crate::progress::LiveLine;
use crate::supervisor::Part;

/// What to sweep.
#[derive(Debug, Clone)]
pub struct SweepOptions {
    /// The `hoptrace` program whose `soak` runs each cell.
    pub program: PathBuf,
    /// Broker: `mqtt://host:port` or `kafka://host:port/topic` (with `partitions`, the
    /// topic is the stem of `<topic>-p<N>`, created with N partitions if missing).
    pub broker: String,
    /// Offered rates, metrics per second (`10k`, `50k`), as given.
    pub rate: Vec<String>,
    /// Metrics per message.
    pub metrics_per_message: Vec<u32>,
    /// MQTT QoS levels.
    pub qos: Vec<u8>,
    /// MQTT client connections of the publisher.
    pub connections: Vec<u32>,
    /// Kafka producer acks (`1`, `all`).
    pub acks: Vec<String>,
    /// Kafka topic partitions.
    pub partitions: Vec<u32>,
    /// Replicas of the Kafka topics the sweep creates (with `partitions`): 3 on a 3-node
    /// cluster makes `acks=all` wait for followers.
    pub replication: u16,
    /// `min.insync.replicas` of the topics the sweep creates (the broker's default if
    /// `None`).
    pub min_insync_replicas: Option<u16>,
    /// Streams the load is spread over.
    pub streams: u32,
    /// Left out of every cell's figures.
    pub warmup: Duration,
    /// The measured window of every cell, after the warm-up.
    pub window: Duration,
    /// Service levels a cell must meet to hold: `Total Ingestion.p99 < 5ms`.
    pub slas: Vec<String>,
    /// Size capacity planning for this load, metrics per second.
    pub capacity_target: Option<u64>,
    /// The publisher's pacing tick.
    pub tick: Duration,
    /// Sweep directory (default: `runs/sweep-<Unix ms>`).
    pub out: Option<PathBuf>,
    /// The command line, for the report.
    pub command: String,
    /// The external pipeline every cell's `hoptrace soak` measures (`--pipeline`,
    /// `--tap`, `--watch-port`, `--topic-root`, `--payload-context`).
    pub external: ExternalArgs,
}

impl SweepOptions {
    /// The sweep `hoptrace sweep`'s options ask for, its cells started from this
    /// program.
    ///
    /// # Errors
    /// This program's path cannot be found, an external pipeline that does not check.
    pub fn from_args(a: &SweepArgs) -> anyhow::Result<Self> {
        if let Some(x) = crate::soak::External::from_args(&a.external)? {
            x.check()?;
        }
        Ok(Self {
            external: a.external.clone(),
            program: std::env::current_exe().context("this program's path")?,
            broker: a.broker.clone(),
            rate: a.rate.clone(),
            metrics_per_message: a.metrics_per_message.clone(),
            qos: a.qos.clone(),
            connections: a.connections.clone(),
            acks: a.acks.clone(),
            partitions: a.partitions.clone(),
            replication: a.replication,
            min_insync_replicas: a.min_insync_replicas,
            streams: a.streams,
            warmup: a.warmup,
            window: a.window,
            slas: a.slas.clone(),
            capacity_target: a.capacity_target,
            tick: a.tick,
            out: a.out.clone(),
            command: hoptrace_cli::units::command_line(),
        })
    }
}

/// Metrics per message when the sweep does not vary it.
const DEFAULT_METRICS_PER_MESSAGE: u32 = 50;

/// One cell to run.
#[derive(Debug, Clone)]
pub struct Planned {
    /// The cell's settings, in table order.
    pub settings: Vec<Setting>,
    /// Its offered rate, metrics per second.
    pub rate: u64,
    /// Its metrics per message.
    pub metrics_per_message: u32,
    /// Its broker address, with the cell's options in it.
    pub broker: String,
    /// Its Kafka topic's partitions, when the sweep varies them.
    pub partitions: Option<u32>,
}

impl Planned {
    /// The cell's directory and run-id suffix: `mpm-50_acks-all_rate-10k`.
    #[must_use]
    pub fn slug(&self) -> String {
        self.settings
            .iter()
            .map(|s| {
                let v: String = s
                    .value
                    .chars()
                    .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
                    .collect();
                format!("{}-{v}", s.name)
            })
            .collect::<Vec<_>>()
            .join("_")
    }
}

/// The dimensions given, in table order (the rate last), and their values.
fn dimensions(args: &SweepOptions) -> Vec<(String, Vec<String>)> {
    let mut d = Vec::new();
    let mut add = |name: &str, values: Vec<String>| {
        if !values.is_empty() {
            d.push((name.to_owned(), values));
        }
    };
    let strs = |v: &[u32]| v.iter().map(ToString::to_string).collect::<Vec<_>>();
    add("metrics_per_message", strs(&args.metrics_per_message));
    add("partitions", strs(&args.partitions));
    add("acks", args.acks.clone());
    add("qos", args.qos.iter().map(ToString::to_string).collect());
    add("connections", strs(&args.connections));
    add(RATE, args.rate.clone());
    d
}

/// Every cell of the matrix, the rate varying fastest.
fn plan(args: &SweepOptions, endpoint: &Endpoint) -> anyhow::Result<Vec<Planned>> {
    let kafka = matches!(endpoint, Endpoint::Kafka(_));
    if kafka && (!args.qos.is_empty() || !args.connections.is_empty()) {
        bail!("--qos and --connections are MQTT settings; the broker is Kafka");
    }
    if !kafka && (!args.acks.is_empty() || !args.partitions.is_empty()) {
        bail!("--acks and --partitions are Kafka settings; the broker is MQTT");
    }
    if let Some(a) = args
        .acks
        .iter()
        .find(|a| !matches!(a.as_str(), "0" | "1" | "all"))
    {
        bail!("--acks {a:?}: use 0, 1 or all");
    }
    if let Some(q) = args.qos.iter().find(|q| **q > 2) {
        bail!("--qos {q}: use 0, 1 or 2");
    }
    if !kafka && (args.replication != 1 || args.min_insync_replicas.is_some()) {
        bail!("--replication and --min-insync-replicas are Kafka settings; the broker is MQTT");
    }
    if (args.replication != 1 || args.min_insync_replicas.is_some()) && args.partitions.is_empty() {
        bail!(
            "--replication and --min-insync-replicas apply to the topics the sweep creates: give --partitions too"
        );
    }
    if args.replication == 0 || args.min_insync_replicas == Some(0) {
        bail!("--replication and --min-insync-replicas must be positive");
    }
    if let Some(m) = args.min_insync_replicas.filter(|m| *m > args.replication) {
        bail!(
            "--min-insync-replicas {m} is more than --replication {}: no write could succeed",
            args.replication
        );
    }
    if args.partitions.contains(&0) || args.connections.contains(&0) {
        bail!("--partitions and --connections must be positive");
    }
    if args.metrics_per_message.contains(&0) || args.streams == 0 {
        bail!("--metrics-per-message and --streams must be positive");
    }
    for r in &args.rate {
        if units::parse_count(r).map_err(|e| anyhow::anyhow!("--rate {r:?}: {e}"))? == 0 {
            bail!("--rate {r:?}: must be positive");
        }
    }
    let dims = dimensions(args);
    let mut cells = vec![Vec::<Setting>::new()];
    for (name, values) in &dims {
        cells = cells
            .into_iter()
            .flat_map(|prefix| {
                values.iter().map(move |v| {
                    let mut s = prefix.clone();
                    s.push(Setting {
                        name: name.clone(),
                        value: v.clone(),
                    });
                    s
                })
            })
            .collect();
    }
    cells
        .into_iter()
        .map(|settings| {
            let get = |n: &str| {
                settings
                    .iter()
                    .find(|s| s.name == n)
                    .map(|s| s.value.clone())
            };
            let rate =
                units::parse_count(&get(RATE).unwrap_or_default()).map_err(anyhow::Error::msg)?;
            let metrics_per_message = get("metrics_per_message")
                .map_or(Ok(DEFAULT_METRICS_PER_MESSAGE), |v| v.parse())?;
            let partitions = get("partitions").map(|v| v.parse()).transpose()?;
            let mut broker = args.broker.clone();
            if let (Some(p), Endpoint::Kafka(k)) = (partitions, endpoint) {
                broker = url::with_path(&broker, &cell_topic(k, p, args)?)?;
            }
            for key in ["acks", "qos", "connections"] {
                if let Some(v) = get(key) {
                    broker = url::with_option(&broker, key, &v)?;
                }
            }
            Ok(Planned {
                settings,
                rate,
                metrics_per_message,
                broker,
                partitions,
            })
        })
        .collect()
}

/// The one topic of a Kafka address a partition sweep suffixes.
fn one_topic(k: &KafkaEndpoint) -> anyhow::Result<&str> {
    match k.topics.as_slice() {
        [t] => Ok(t),
        _ => bail!("--partitions needs a Kafka address with exactly one topic"),
    }
}

/// The topic of a cell with `partitions` partitions: `<topic>-p<N>`, and `-r<R>` when
/// replicated, so that topics of different layouts never share a name.
fn cell_topic(k: &KafkaEndpoint, partitions: u32, opts: &SweepOptions) -> anyhow::Result<String> {
    let stem = one_topic(k)?;
    Ok(match opts.replication {
        1 => format!("{stem}-p{partitions}"),
        r => format!("{stem}-p{partitions}-r{r}"),
    })
}

/// Creates a Kafka topic of `partitions` partitions with the sweep's replication and
/// `min.insync.replicas` if it does not exist; an existing one, and the created one as
/// the cluster reports it, must have exactly that layout.
fn ensure_topic(
    bootstrap: &str,
    topic: &str,
    partitions: u32,
    opts: &SweepOptions,
) -> anyhow::Result<()> {
    use hoptrace_broker::kafka;
    let want = i32::try_from(partitions)?;
    let min_insync = opts.min_insync_replicas.map(|m| m.to_string());
    let config: Vec<(&str, &str)> = min_insync
        .iter()
        .map(|m| ("min.insync.replicas", m.as_str()))
        .collect();
    kafka::ensure_topic(bootstrap, topic, want, i32::from(opts.replication), &config)
        .with_context(|| format!("Kafka topic {topic}"))?;
    let got =
        kafka::topic_layout(bootstrap, topic).with_context(|| format!("Kafka topic {topic}"))?;
    if got.partitions != want {
        bail!(
            "Kafka topic {topic} exists with {} partitions, not {partitions}",
            got.partitions
        );
    }
    if got.replication != i32::from(opts.replication) {
        bail!(
            "Kafka topic {topic} has {} replicas, not {} (delete it, or sweep with --replication {})",
            got.replication,
            opts.replication,
            got.replication
        );
    }
    if let Some(m) = opts.min_insync_replicas
        && got.min_insync_replicas != Some(i32::from(m))
    {
        bail!(
            "Kafka topic {topic} has min.insync.replicas {}, not {m} (delete it to have it created again)",
            got.min_insync_replicas
                .map_or_else(|| "unknown".to_owned(), |v| v.to_string())
        );
    }
    Ok(())
}

/// How the sweep's topics are replicated, for the report: `None` when the sweep creates
/// no topic.
fn topic_layout_line(opts: &SweepOptions) -> Option<String> {
    (!opts.partitions.is_empty()).then(|| {
        let isr = opts.min_insync_replicas.map_or_else(
            || "the broker's default min.insync.replicas".to_owned(),
            |m| format!("min.insync.replicas {m}"),
        );
        format!(
            "created by the sweep with replication factor {} and {isr}, checked against the cluster before each cell",
            opts.replication
        )
    })
}

fn machine() -> String {
    let h = host_info();
    format!(
        "{}, {} logical CPUs, {:.0} GiB, Linux {}",
        h.cpu_model,
        h.cpus,
        h.memory_bytes as f64 / (1u64 << 30) as f64,
        h.kernel
    )
}

fn write_json(path: &Path, value: &impl serde::Serialize) -> anyhow::Result<()> {
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(value)?)
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// A sweep ready to run: its broker, service levels and cells.
#[derive(Debug, Clone)]
pub struct Checked {
    endpoint: Endpoint,
    slos: Vec<Gate>,
    planned: Vec<Planned>,
}

impl Checked {
    /// Every cell of the matrix, the rate varying fastest.
    #[must_use]
    pub fn cells(&self) -> &[Planned] {
        &self.planned
    }
}

/// Checks the options and plans the matrix, before anything starts or is written.
///
/// # Errors
/// A broker address, service level, rate or setting that does not parse or does not
/// apply to the broker.
pub fn check(opts: &SweepOptions) -> anyhow::Result<Checked> {
    let endpoint = Endpoint::parse(&opts.broker).context("--broker")?;
    let slos: Vec<Gate> = opts
        .slas
        .iter()
        .map(|s| s.parse::<Gate>())
        .collect::<Result<_, _>>()
        .context("--sla")?;
    let planned = plan(opts, &endpoint)?;
    Ok(Checked {
        endpoint,
        slos,
        planned,
    })
}

/// What a sweep ends with.
#[derive(Debug)]
pub struct SweepOutcome {
    /// The sweep directory.
    pub out: PathBuf,
    /// The cells' runs (`hoptrace sql <runs> "SELECT * FROM cells"`).
    pub runs_dir: PathBuf,
    /// Every cell of the matrix, the resumed ones included.
    pub cells: Vec<Cell>,
    /// The cells run by this invocation.
    pub ran: usize,
    /// Seconds this invocation took.
    pub elapsed_s: f64,
}

/// Where a sweep writes.
struct Dirs {
    name: String,
    out: PathBuf,
    runs: PathBuf,
    cells: PathBuf,
}

/// Runs every cell of the matrix not done yet, each a `hoptrace soak` of its own, and
/// writes the sweep report after each.
///
/// # Errors
/// Invalid options, a directory holding another sweep, a cell whose soak fails, or an
/// interruption (the finished cells are kept, and the same options resume).
pub fn run(opts: &SweepOptions, stop: &AtomicBool) -> anyhow::Result<SweepOutcome> {
    let Checked {
        endpoint,
        slos,
        planned,
    } = check(opts)?;
    let out = opts.out.clone().unwrap_or_else(|| {
        PathBuf::from("runs").join(format!(
            "sweep-{}",
            hoptrace_probe::clock::realtime_ns() / 1_000_000
        ))
    });
    let name = out
        .file_name()
        .map_or_else(|| "sweep".into(), |n| n.to_string_lossy().into_owned());
    let info = SweepInfo {
        name: name.clone(),
        command: opts.command.clone(),
        broker: opts.broker.clone(),
        dimensions: dimensions(opts),
        warmup_s: opts.warmup.as_secs_f64(),
        window_s: opts.window.as_secs_f64(),
        slos: opts.slas.clone(),
        capacity_target_metrics_per_s: opts.capacity_target,
        machine: machine(),
        topics: topic_layout_line(opts),
    };
    let dirs = open_dirs(out, name, &info)?;
    let resumed = planned
        .iter()
        .filter(|p| dirs.cells.join(p.slug()).join(CELL_FILE).exists())
        .count();
    eprintln!(
        "hoptrace sweep {}: {} cells ({resumed} already done), {:.0} s warm-up + {:.0} s window each, through {}",
        dirs.name,
        planned.len(),
        opts.warmup.as_secs_f64(),
        opts.window.as_secs_f64(),
        endpoint.display()
    );
    let per_cell_s = (opts.warmup + opts.window).as_secs_f64() + 15.0;
    let started = Instant::now();
    let mut cells: Vec<Cell> = Vec::new();
    let mut ran = 0usize;
    for (index, p) in planned.iter().enumerate() {
        let done = dirs.cells.join(p.slug()).join(CELL_FILE);
        if done.exists() {
            cells.push(Cell::read(&done)?);
            continue;
        }
        let left = planned.len() - index;
        let eta = if ran > 0 {
            started.elapsed().as_secs_f64() / ran as f64 * left as f64
        } else {
            per_cell_s * left as f64
        };
        eprintln!(
            "cell {}/{} {}: {} metrics/s for {:.0} s; sweep ETA {:.0} s",
            index + 1,
            planned.len(),
            sweep::settings_label(&p.settings),
            units::rate(p.rate as f64),
            (opts.warmup + opts.window).as_secs_f64(),
            eta
        );
        let Some(cell) = run_cell(opts, &endpoint, &slos, p, index, &dirs, stop)? else {
            bail!(
                "interrupted: {} of {} cells done and kept in {}; the same command resumes",
                cells.len(),
                planned.len(),
                dirs.out.display()
            );
        };
        print_cell(&cell);
        cells.push(cell);
        ran += 1;
        // After every cell, so an interrupted sweep has the report of what it finished.
        write_report(&dirs.out, &info, &cells)?;
    }
    if ran == 0 {
        write_report(&dirs.out, &info, &cells)?;
    }
    Ok(SweepOutcome {
        out: dirs.out,
        runs_dir: dirs.runs,
        cells,
        ran,
        elapsed_s: started.elapsed().as_secs_f64(),
    })
}

/// The sweep directory: a new one, or one of the same matrix to resume.
fn open_dirs(out: PathBuf, name: String, info: &SweepInfo) -> anyhow::Result<Dirs> {
    let sweep_json = out.join("sweep.json");
    if sweep_json.exists() {
        let before: SweepReport = serde_json::from_slice(&std::fs::read(&sweep_json)?)
            .with_context(|| format!("reading {}", sweep_json.display()))?;
        let same = before.info.dimensions == info.dimensions
            && before.info.broker == info.broker
            && before.info.warmup_s == info.warmup_s
            && before.info.window_s == info.window_s
            && before.info.slos == info.slos;
        if !same {
            bail!(
                "{} holds another sweep ({}); give another --out",
                out.display(),
                before.info.command
            );
        }
    }
    let (runs, cells) = (out.join("runs"), out.join("cells"));
    std::fs::create_dir_all(&cells).with_context(|| format!("creating {}", cells.display()))?;
    Ok(Dirs {
        name,
        out,
        runs,
        cells,
    })
}

/// The `hoptrace soak` command line (without the program) of cell `p`: the contract
/// between the sweep and the soaks it starts.
#[must_use]
pub fn soak_args(
    opts: &SweepOptions,
    p: &Planned,
    run_id: &str,
    runs: &Path,
    cell_dir: &Path,
) -> Vec<OsString> {
    // The soak's own defaults for what a sweep does not set.
    let mut soak: SoakArgs =
        argv::parse(["--broker", p.broker.as_str()]).expect("a broker address is all a soak needs");
    soak.rate = p.rate;
    soak.duration = opts.warmup + opts.window;
    soak.warmup = opts.warmup;
    soak.metrics_per_message = p.metrics_per_message;
    soak.streams = opts.streams;
    soak.tick = opts.tick;
    soak.run_id = Some(run_id.to_owned());
    soak.runs = runs.to_owned();
    soak.out = Some(cell_dir.to_owned());
    soak.external = opts.external.clone();
    soak.to_args(&["soak"])
}

/// Runs one cell: its soak as a child process, then its figures over the measured
/// window. `None` when a stop was requested (the cell is discarded).
fn run_cell(
    opts: &SweepOptions,
    endpoint: &Endpoint,
    slos: &[Gate],
    p: &Planned,
    index: usize,
    dirs: &Dirs,
    stop: &AtomicBool,
) -> anyhow::Result<Option<Cell>> {
    let slug = p.slug();
    let run_id = format!("{}.{slug}", dirs.name);
    let cell_dir = dirs.cells.join(&slug);
    let run_dir = dirs.runs.join(&run_id);
    // What an interrupted attempt left.
    for partial in [&cell_dir, &run_dir] {
        if partial.exists() {
            std::fs::remove_dir_all(partial)
                .with_context(|| format!("removing {}", partial.display()))?;
        }
    }
    std::fs::create_dir_all(&cell_dir)?;
    if let (Some(parts), Endpoint::Kafka(k)) = (p.partitions, endpoint) {
        let bootstrap = k
            .bootstrap
            .iter()
            .map(|(h, port)| format!("{h}:{port}"))
            .collect::<Vec<_>>()
            .join(",");
        ensure_topic(&bootstrap, &cell_topic(k, parts, opts)?, parts, opts)?;
    }
    let per_cell_s = (opts.warmup + opts.window).as_secs_f64() + 15.0;
    let mut soak = Part::spawn(
        "soak",
        Command::new(&opts.program).args(soak_args(opts, p, &run_id, &dirs.runs, &cell_dir)),
        &cell_dir,
    )?;
    let cell_started = Instant::now();
    let mut live = LiveLine::new();
    while soak.try_wait()?.is_none() {
        if stop.load(Relaxed) {
            // The soak stops its publisher early on SIGTERM; the cell is discarded.
            soak.stop(Duration::from_secs(60)).ok();
            std::fs::remove_dir_all(&cell_dir).ok();
            std::fs::remove_dir_all(&run_dir).ok();
            return Ok(None);
        }
        live.tick(|_| {
            // The estimate leaves out a pipeline's drain, which waits for its join window.
            let t = cell_started.elapsed().as_secs_f64();
            let past = if t > per_cell_s { ", draining" } else { "" };
            format!("  {t:>4.0} s of about {per_cell_s:.0} s{past}")
        });
        std::thread::sleep(Duration::from_millis(500));
    }
    live.finish();
    // A soak that missed one of its own targets still measured and reported the cell;
    // the sweep judges the cell on its SLOs and completeness.
    let printed = soak
        .stop_allowing(Duration::from_secs(5), &[crate::soak::EXIT_TARGET_MISSED])
        .with_context(|| {
            format!(
                "cell {}: see {}",
                sweep::settings_label(&p.settings),
                cell_dir.join("soak.log").display()
            )
        })?;
    std::fs::write(cell_dir.join("soak.out"), printed.join("\n") + "\n")?;
    let cell = measure(
        opts, slos, p, index, &dirs.name, &run_id, &dirs.runs, &cell_dir,
    )?;
    write_json(&run_dir.join(CELL_FILE), &cell)?;
    write_json(&cell_dir.join(CELL_FILE), &cell)?;
    Ok(Some(cell))
}

/// The line that sums up a finished cell, on stderr.
fn print_cell(cell: &Cell) {
    let total = cell
        .window
        .stages
        .iter()
        .find(|s| s.headline)
        .or_else(|| cell.window.stages.last());
    eprintln!(
        "  achieved {} metrics/s, {} of {} messages complete{}; {}",
        units::rate(cell.achieved_metrics_per_s()),
        cell.window.complete,
        cell.window.messages,
        total
            .and_then(|t| t.percentile("P99").map(|p| (t, p)))
            .map_or_else(String::new, |(t, p)| format!(
                ", {} P99 {}",
                t.name,
                t.with_bounds(units::signed_ns(p.value_ns), "P99", false)
            )),
        sweep::why_not(cell).map_or_else(|| "holds".into(), |w| format!("does not hold: {w}"))
    );
}

fn write_report(out: &Path, info: &SweepInfo, cells: &[Cell]) -> anyhow::Result<()> {
    let report = SweepReport {
        info: info.clone(),
        cells: cells.to_vec(),
        knees: sweep::knees(cells),
    };
    sweep::write(out, &report)?;
    Ok(())
}

/// The cell's figures over its measured window.
#[allow(clippy::too_many_arguments)]
fn measure(
    args: &SweepOptions,
    slos: &[Gate],
    p: &Planned,
    index: usize,
    sweep_name: &str,
    run_id: &str,
    runs_dir: &Path,
    cell_dir: &Path,
) -> anyhow::Result<Cell> {
    let soak = crate::soak::read_result(cell_dir)?;
    let path = cell_dir.join("summary.json");
    let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    let whole: hoptrace_analysis::Summary =
        serde_json::from_slice(&bytes).with_context(|| format!("reading {}", path.display()))?;
    let runs = RunSet::open(&[runs_dir.join(run_id)])?;
    let rt = crate::query::runtime()?;
    let nanos = |d: Duration| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
    let window = rt.block_on(async {
        let ctx = runs.session().await?;
        summary::window(&runs, &ctx, nanos(args.warmup), nanos(args.window)).await
    })?;
    let slo_results = slos
        .iter()
        .map(|g| {
            let decision = g.met_by(&window.stages)?;
            Ok(SloResult {
                slo: g.text.clone(),
                met: decision == hoptrace_analysis::bounds::Decision::Met,
                decision: Some(decision),
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let resources = soak
        .resources
        .iter()
        .map(|r| CellProcess {
            process: r.process.clone(),
            cpu_mean: r.cpu_mean,
            rss_max_bytes: r.rss_max_bytes,
        })
        .collect();
    Ok(Cell {
        sweep: sweep_name.to_owned(),
        run_id: run_id.to_owned(),
        index,
        settings: p.settings.clone(),
        target_metrics_per_s: p.rate,
        metrics_per_message: p.metrics_per_message,
        broker: p.broker.clone(),
        broker_version: soak.broker_version,
        warmup_s: args.warmup.as_secs_f64(),
        window,
        sent: soak.publisher.messages,
        adds_up: whole.accounting.adds_up,
        drained: soak.drained,
        schedule_lag_p99_ns: soak.publisher.lag_p99_ns.unwrap_or(0),
        slos: slo_results,
        resources,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Options from a command line: `--broker B --rate R,R --acks A,A ...`.
    fn args(line: &str) -> SweepOptions {
        let mut o = SweepOptions {
            program: "hoptrace".into(),
            broker: String::new(),
            rate: Vec::new(),
            metrics_per_message: Vec::new(),
            qos: Vec::new(),
            connections: Vec::new(),
            acks: Vec::new(),
            partitions: Vec::new(),
            replication: 1,
            min_insync_replicas: None,
            streams: 1000,
            warmup: Duration::from_secs(5),
            window: Duration::from_secs(20),
            slas: Vec::new(),
            capacity_target: None,
            tick: Duration::from_micros(500),
            out: None,
            command: line.into(),
            external: ExternalArgs::default(),
        };
        let words: Vec<&str> = line.split_whitespace().collect();
        for pair in words.chunks(2) {
            let list = || pair[1].split(',').map(str::to_owned);
            let nums = || list().map(|v| v.parse().unwrap());
            match pair[0] {
                "--broker" => o.broker = pair[1].into(),
                "--rate" => o.rate = list().collect(),
                "--acks" => o.acks = list().collect(),
                "--partitions" => o.partitions = nums().collect(),
                "--replication" => o.replication = pair[1].parse().unwrap(),
                "--min-insync-replicas" => o.min_insync_replicas = Some(pair[1].parse().unwrap()),
                "--connections" => o.connections = nums().collect(),
                "--qos" => o.qos = list().map(|v| v.parse().unwrap()).collect(),
                other => panic!("{other}"),
            }
        }
        o
    }

    #[test]
    fn the_matrix_varies_the_rate_fastest_and_carries_options_in_the_address() {
        let a = args(
            "--broker kafka://127.0.0.1:19092/t?linger_ms=1 --rate 10k,20k --acks 1,all --partitions 1,3",
        );
        let e = Endpoint::parse(&a.broker).unwrap();
        let cells = plan(&a, &e).unwrap();
        assert_eq!(cells.len(), 8);
        assert_eq!(cells[0].slug(), "partitions-1_acks-1_rate-10k");
        assert_eq!(cells[1].slug(), "partitions-1_acks-1_rate-20k");
        assert_eq!(cells[1].rate, 20_000);
        assert_eq!(
            cells[7].broker,
            "kafka://127.0.0.1:19092/t-p3?linger_ms=1&acks=all"
        );
        assert_eq!(cells[7].partitions, Some(3));
        assert_eq!(cells[0].metrics_per_message, DEFAULT_METRICS_PER_MESSAGE);
    }

    #[test]
    fn settings_of_the_other_broker_are_refused() {
        let a = args("--broker mqtt://127.0.0.1:1883 --rate 1k --acks all");
        let e = Endpoint::parse(&a.broker).unwrap();
        let err = plan(&a, &e).unwrap_err().to_string();
        assert!(err.contains("Kafka settings"), "{err}");
        let a = args("--broker mqtt://127.0.0.1:1883 --rate 1k --qos 3");
        let e = Endpoint::parse(&a.broker).unwrap();
        assert!(plan(&a, &e).unwrap_err().to_string().contains("--qos 3"));
        let a = args("--broker mqtt://127.0.0.1:1883 --rate 1x");
        let e = Endpoint::parse(&a.broker).unwrap();
        assert!(plan(&a, &e).unwrap_err().to_string().contains("--rate"));
    }

    #[test]
    fn mqtt_cells_set_qos_and_connections() {
        let a = args("--broker mqtt://127.0.0.1:1883 --rate 5k --qos 0,1 --connections 2");
        let e = Endpoint::parse(&a.broker).unwrap();
        let cells = plan(&a, &e).unwrap();
        assert_eq!(cells[1].broker, "mqtt://127.0.0.1:1883?qos=1&connections=2");
        assert_eq!(cells[1].slug(), "qos-1_connections-2_rate-5k");
    }

    #[test]
    fn replicated_topics_are_named_by_their_layout_and_checked() {
        let a = args(
            "--broker kafka://127.0.0.1:19092/t --rate 1k --acks 1,all --partitions 3 --replication 3 --min-insync-replicas 2",
        );
        let e = Endpoint::parse(&a.broker).unwrap();
        let cells = plan(&a, &e).unwrap();
        assert_eq!(cells[1].broker, "kafka://127.0.0.1:19092/t-p3-r3?acks=all");
        assert_eq!(
            topic_layout_line(&a).unwrap(),
            "created by the sweep with replication factor 3 and min.insync.replicas 2, checked against the cluster before each cell"
        );
        let refused = |line: &str, says: &str| {
            let a = args(line);
            let e = Endpoint::parse(&a.broker).unwrap();
            let err = plan(&a, &e).unwrap_err().to_string();
            assert!(err.contains(says), "{line}: {err}");
        };
        refused(
            "--broker kafka://127.0.0.1:19092/t --rate 1k --replication 3",
            "give --partitions too",
        );
        refused(
            "--broker kafka://127.0.0.1:19092/t --rate 1k --partitions 1 --replication 2 --min-insync-replicas 3",
            "no write could succeed",
        );
        refused(
            "--broker mqtt://127.0.0.1:1883 --rate 1k --replication 3",
            "Kafka settings",
        );
        refused(
            "--broker kafka://127.0.0.1:19092/t --rate 1k --partitions 1 --replication 0",
            "must be positive",
        );
    }

    #[test]
    fn a_cell_gets_its_topic_and_its_settings_once() {
        let a = args(
            "--broker kafka://127.0.0.1:19092/t?acks=1&linger_ms=5 --rate 1k --partitions 3 --acks all",
        );
        let e = Endpoint::parse(&a.broker).unwrap();
        let cells = plan(&a, &e).unwrap();
        assert_eq!(
            cells[0].broker,
            "kafka://127.0.0.1:19092/t-p3?acks=all&linger_ms=5"
        );
        // A partition sweep suffixes the address's one topic.
        let a = args("--broker kafka://127.0.0.1:19092 --rate 1k --partitions 3");
        let e = Endpoint::parse(&a.broker).unwrap();
        let err = plan(&a, &e).unwrap_err().to_string();
        assert!(err.contains("exactly one topic"), "{err}");
    }

    /// An external pipeline's spec.
    const SWEEP_SPEC: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tap/testdata/nodered-influxdb.toml"
    );

    /// The soak a sweep starts for `cell` (run `s.x`, under `out/`), as this program
    /// parses its command line.
    fn cell_soak(opts: &super::SweepOptions, cell: &super::Planned) -> SoakArgs {
        let line = super::soak_args(
            opts,
            cell,
            "s.x",
            Path::new("out/runs"),
            Path::new("out/cells/x"),
        );
        assert_eq!(line[0], "soak");
        argv::parse(line[1..].iter().cloned()).unwrap()
    }

    /// Each cell is a soak started with this program's own `soak` flags: they parse,
    /// with the values the sweep means.
    #[test]
    fn the_sweep_starts_its_soaks_with_flags_they_take() {
        let args: SweepArgs = argv::parse([
            "--broker",
            "kafka://127.0.0.1:19092/t?linger_ms=1",
            "--rate",
            "10k,20k",
            "--acks",
            "all",
            "--partitions",
            "3",
            "--warmup",
            "2s",
            "--window",
            "3s",
            "--tick",
            "1ms",
            "--streams",
            "7",
        ])
        .unwrap();
        let opts = SweepOptions::from_args(&args).unwrap();
        let checked = super::check(&opts).unwrap();
        let soak = cell_soak(&opts, &checked.cells()[1]);
        assert_eq!(
            soak.broker,
            "kafka://127.0.0.1:19092/t-p3?linger_ms=1&acks=all"
        );
        assert_eq!(soak.rate, 20_000);
        assert_eq!(soak.duration, opts.warmup + opts.window);
        assert_eq!((soak.warmup, soak.tick), (opts.warmup, opts.tick));
        assert_eq!((soak.streams, soak.metrics_per_message), (7, 50));
        assert_eq!(soak.run_id.as_deref(), Some("s.x"));
        assert_eq!(soak.runs, Path::new("out/runs"));
        assert_eq!(soak.out.as_deref(), Some(Path::new("out/cells/x")));
        assert!(soak.external.pipeline.is_none());
    }

    /// A sweep of an external pipeline gives every cell's soak the same pipeline, taps
    /// and watched ports.
    #[test]
    fn a_sweep_of_an_external_pipeline_passes_it_to_every_soak() {
        let tap =
            "--from influxdb://127.0.0.1:18086/hoptrace?measurement=nodered --poll-interval 20ms";
        let args: SweepArgs = argv::parse([
            "--broker",
            "mqtt://127.0.0.1:11883/hoptrace/nr/in/sweep?version=5",
            "--rate",
            "1k,2k",
            "--pipeline",
            SWEEP_SPEC,
            "--tap",
            tap,
            "--watch-port",
            "18086",
            "--payload-context",
        ])
        .unwrap();
        let opts = SweepOptions::from_args(&args).unwrap();
        let checked = super::check(&opts).unwrap();
        let soak = cell_soak(&opts, &checked.cells()[0]);
        let x = soak.external;
        assert_eq!(x.pipeline.as_deref(), Some(Path::new(SWEEP_SPEC)));
        assert_eq!(x.taps, [tap]);
        assert_eq!(x.watch_ports, [18086]);
        assert!(x.payload_context);
        assert_eq!(x.topic_root, None);
        // A bad tap is refused before any cell runs.
        let args: SweepArgs = argv::parse([
            "--broker",
            "mqtt://127.0.0.1:11883",
            "--rate",
            "1k",
            "--pipeline",
            SWEEP_SPEC,
        ])
        .unwrap();
        let e = SweepOptions::from_args(&args).unwrap_err().to_string();
        assert!(e.contains("at least one --tap"), "{e}");
    }
}
