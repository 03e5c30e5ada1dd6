//! What a soak produced: `soak.json`, and the report's `## Soak` section.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use hoptrace_analysis::Summary;
use hoptrace_analysis::report::{Block, Section};
use hoptrace_analysis::resources::ProcessResources;
use hoptrace_format::units;
use hoptrace_publisher::report::PublishReport;
use serde::{Deserialize, Serialize};

use super::targets::Target;

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

/// The report's `## Soak` section: the command, the broker, the load, the drain and the
/// targets.
pub(super) fn soak_section(r: &SoakResult) -> Section {
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
