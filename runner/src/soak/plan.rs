//! What a soak is told (its options, an external pipeline and its taps) and the plan it
//! makes of them: the run id, the topic root, the publisher, where its files go.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use hoptrace_format::spec::PipelineSpec;

use hoptrace_broker::url::Endpoint;
use hoptrace_cli::soak::{ExternalArgs, SoakArgs};

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

impl SoakOptions {
    /// The soak `hoptrace soak`'s options ask for, its parts started from this program.
    ///
    /// # Errors
    /// This program's path cannot be found, a `--tap` with an unclosed quote.
    pub fn from_args(a: &SoakArgs) -> anyhow::Result<Self> {
        Ok(Self {
            external: External::from_args(&a.external)?,
            topic_root: a.external.topic_root.clone(),
            payload_context: a.external.payload_context,
            program: std::env::current_exe().context("this program's path")?,
            broker: a.broker.clone(),
            rate: a.rate,
            duration: a.duration,
            metrics_per_message: a.metrics_per_message,
            streams: a.streams,
            zipf: a.zipf,
            batch_rows: a.batch_rows,
            linger: a.linger,
            tick: a.tick,
            warmup: a.warmup,
            runs: a.runs.clone(),
            out: a.out.clone(),
            run_id: a.run_id.clone(),
            max_clock_error_ns: a.preflight.max_clock_error,
            ui: a.ui.clone(),
            command: hoptrace_cli::units::command_line(),
        })
    }
}

/// A pipeline under test that hoptrace did not start (the user or an `infra/` script
/// starts and stops it), described by its own spec and stamped by `hoptrace tap`s.
#[derive(Debug, Clone)]
pub struct External {
    /// Its pipeline spec (hops, stages, join window).
    pub pipeline: PathBuf,
    /// Each tap's own arguments (`--from`, `--topics`, `--hop`, store options); the soak
    /// sets `--collector`, `--pipeline` and `--publishers` (over any given here).
    pub taps: Vec<Vec<String>>,
    /// TCP ports whose listening processes (the pipeline's own parts) are sampled.
    pub watch_ports: Vec<u16>,
}

impl External {
    /// The external pipeline these options describe (`None`: the reference pipeline).
    ///
    /// # Errors
    /// A `--tap` with an unclosed quote.
    pub fn from_args(a: &ExternalArgs) -> anyhow::Result<Option<Self>> {
        let Some(pipeline) = &a.pipeline else {
            return Ok(None);
        };
        Ok(Some(Self {
            pipeline: pipeline.clone(),
            taps: a
                .taps
                .iter()
                .map(|t| split_args(t).context("--tap"))
                .collect::<anyhow::Result<_>>()?,
            watch_ports: a.watch_ports.clone(),
        }))
    }

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
