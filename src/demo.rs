//! `hoptrace demo`: a whole measurement in one process. The publisher sends traced metrics
//! through an MQTT broker (rumqttd in this process, or an external MQTT or Kafka broker)
//! to the reference pipeline's processor and store (`refpipe/`); every hop reports its
//! stamps over loopback TCP to the collector, which writes the run; the analysis then
//! writes the report (md, html, json, charts).
//!
//! The demo itself is `hoptrace_runner::demo`; this is its command line and what it
//! prints.

pub use hoptrace_cli::demo::DemoArgs as Args;

use anyhow::{Context as _, bail};
use hoptrace_format::units;
use hoptrace_runner::demo::{self, DemoMeasured, DemoOptions};

/// Runs the demo and writes its report.
///
/// # Errors
/// Invalid options, a part that does not start, a report that cannot be written.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let opts = DemoOptions::from_args(args);
    opts.check()?;
    hoptrace_runner::rundir::check_writable(&args.out, "--out")?;
    hoptrace_runner::rundir::check_writable(&args.runs, "--runs")?;
    let stop = hoptrace_cli::signals::shutdown_flag()?;
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
