//! `hoptrace demo`: a whole measurement in one process. The publisher sends traced metrics
//! through an MQTT broker (rumqttd in this process, or an external MQTT or Kafka broker)
//! to the reference pipeline's processor and store (`refpipe/`); every hop reports its
//! stamps over loopback TCP to the collector, which writes the run; the analysis then
//! writes the report (md, html, json, charts).
//!
//! The demo itself is `hoptrace_runner::demo`; this is its command line and what it
//! prints.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use hoptrace_format::units;
use hoptrace_runner::demo::{self, DemoMeasured, DemoOptions};

use crate::clock::Preflight as _;

/// Options of `hoptrace demo`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Use this broker instead of the one in this process: `mqtt://host:port` or
    /// `kafka://host:port/topic` (the topic must exist).
    #[arg(long)]
    pub broker: Option<String>,
    /// Target rate, metrics per second (open loop).
    #[arg(long, allow_negative_numbers = true, default_value = "100k", value_parser = units::parse_rate)]
    pub rate: f64,
    /// How long to publish.
    #[arg(long, default_value = "20s", value_parser = units::parse_duration)]
    pub duration: Duration,
    /// Streams (topics, or Kafka keys) the load is spread over.
    #[arg(long, allow_negative_numbers = true, default_value_t = 300)]
    pub streams: u32,
    /// Metrics carried per message (a JSON batch).
    #[arg(long, allow_negative_numbers = true, default_value_t = 20)]
    pub metrics_per_message: u32,
    /// Zipf exponent of the per-stream rates (0: uniform).
    #[arg(long, allow_negative_numbers = true, default_value_t = 1.0)]
    pub zipf: f64,
    /// The processor writes a batch once it holds this many rows...
    #[arg(long, default_value_t = 2000)]
    pub batch_rows: usize,
    /// ...or once its first row has waited this long (a unit is needed: `1ms`, `500us`).
    #[arg(long, default_value = "1ms", value_parser = units::parse_short_duration)]
    pub linger: Duration,
    /// Folder under which the run directory `<run-id>/` is created.
    #[arg(long, value_name = "DIR", default_value = "runs")]
    pub runs: PathBuf,
    /// Where to write the report (a folder: report.md, report.html, summary.json,
    /// charts/).
    #[arg(long, value_name = "DIR", default_value = "reports/demo")]
    pub out: PathBuf,
    /// Simulate the store on another host whose clock is off by this much (e.g. -20ms):
    /// its probes read this host's clock plus the offset, and it reports a clock status
    /// of its own. Shows what clock error does to a report.
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true, value_parser = units::parse_signed_duration_ns)]
    pub store_clock_offset: Option<i64>,
    /// The error bound the simulated store host claims for its clock.
    #[arg(long, value_name = "DURATION", default_value = "1ms", value_parser = units::parse_duration_ns)]
    pub store_clock_bound: u64,
    #[command(flatten)]
    pub preflight: crate::clock::PreflightArgs,
    /// Serve the collector's live view at http://HOST:PORT/ while the demo runs
    /// (`hoptrace collect --ui`), with --rate as its target; `:0` picks a free port.
    #[arg(long, value_name = "HOST:PORT", value_parser = crate::units::parse_listen)]
    pub ui: Option<String>,
}

impl Args {
    /// The demo these options ask for.
    #[must_use]
    pub fn options(&self) -> DemoOptions {
        DemoOptions {
            broker: self.broker.clone(),
            rate: self.rate,
            duration: self.duration,
            streams: self.streams,
            metrics_per_message: self.metrics_per_message,
            zipf: self.zipf,
            batch_rows: self.batch_rows,
            linger: self.linger,
            runs: self.runs.clone(),
            store_clock_offset_ns: self.store_clock_offset,
            store_clock_bound_ns: self.store_clock_bound,
            max_clock_error_ns: self.preflight.max_clock_error,
            ui: self.ui.clone(),
        }
    }
}

/// Runs the demo and writes its report.
///
/// # Errors
/// Invalid options, a part that does not start, a report that cannot be written.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let opts = args.options();
    opts.check()?;
    hoptrace_runner::rundir::check_writable(&args.out, "--out")?;
    hoptrace_runner::rundir::check_writable(&args.runs, "--runs")?;
    let stop = crate::signals::shutdown_flag()?;
    args.preflight.check()?;
    let m = demo::measure(&opts, &stop)?;
    print_parts(&m);
    if m.interrupted {
        eprintln!(
            "interrupted: published for {:.1} s of the planned {:.0} s; the run and its report say so",
            m.published.elapsed_ns as f64 / 1e9,
            args.duration.as_secs_f64()
        );
    }
    if let Some(e) = &m.processor.error {
        bail!("the processor failed: {e}");
    }
    let r = demo::report(&m, &args.out).with_context(|| {
        format!(
            "writing the report (the run is kept in {}: `hoptrace report {} --out DIR` writes its report elsewhere)",
            m.run_dir.display(),
            m.run_dir.display()
        )
    })?;
    println!();
    crate::analyze::print_summary(&r.summary);
    println!();
    println!("Run directory: {}", m.run_dir.display());
    println!(
        "Report: {} (also report.html, summary.json and charts/ there); {} traces joined, demo took {:.0} s",
        r.markdown.display(),
        m.run
            .accounting
            .publishers
            .iter()
            .map(|p| p.complete + p.incomplete)
            .sum::<u64>(),
        m.started.elapsed().as_secs_f64()
    );
    if !r.summary.accounting.adds_up {
        bail!("the run's accounting does not add up: see the report");
    }
    Ok(())
}

fn print_parts(m: &DemoMeasured) {
    let (p, f, s) = (&m.published, &m.processor, &m.store);
    let settled = f.messages >= p.messages;
    println!(
        "publisher: {} messages, {} metrics in {:.1} s (kept up with the schedule: {:.4}; lag p99 {})",
        p.messages,
        p.metrics,
        p.elapsed_ns as f64 / 1e9,
        p.keep_up_ratio,
        p.lag_p99_ns
            .map_or_else(|| "-".into(), |ns| units::duration_f64(ns as f64))
    );
    println!(
        "processor: {} messages taken{} ({} traced, {} bad payloads), {} rows in {} writes, {} acknowledged",
        f.messages,
        if settled {
            ""
        } else {
            " (NOT every message published reached it)"
        },
        f.traced,
        f.bad_payloads,
        f.rows,
        f.writes,
        f.acked
    );
    println!(
        "store: {} rows in {} writes, {} not visible to their query, {} rows held, {} series",
        s.rows, s.writes, s.invisible_writes, s.store.rows_held, s.store.series
    );
}
