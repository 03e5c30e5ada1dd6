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

mod parts;
mod plan;
mod result;
pub mod targets;

/// Exit status of `hoptrace soak` (and `sweep`) when the run was measured and reported but
/// a target was missed (or, for the sweep, a cell's traces were not complete).
pub const EXIT_TARGET_MISSED: i32 = 3;

use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use hoptrace_analysis::report::{self, Section};
use hoptrace_analysis::resources::{self, Sample};
use hoptrace_analysis::{RunSet, Summary};
use hoptrace_publisher::report::PublishReport;

use crate::pipeline;
pub use parts::{Addresses, PartCommands};
use parts::{Stopped, start_parts};
pub use plan::{External, Plan, SoakOptions, split_args};
use result::soak_section;
pub use result::{SoakOutcome, SoakResult, TapResult, read_result};
pub use targets::{TARGET_BYTES_PER_TRACE, TARGET_RATE_RATIO, TARGET_REPORT_S, Target};

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

#[cfg(test)]
mod command_tests;
#[cfg(test)]
mod tests;
