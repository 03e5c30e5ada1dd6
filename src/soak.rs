//! `hoptrace soak`: the whole pipeline as separate processes (collector, reference store,
//! reference processor, publisher) through a real broker at a target rate for a duration,
//! with the CPU and RSS of every process (the broker's included) sampled every second;
//! then the report, with a resource section and the soak's targets, each met or not.
//!
//! The soak itself is `hoptrace_runner::soak`; its options are `hoptrace_cli::soak`'s;
//! this prints what it returns.

pub use hoptrace_cli::soak::SoakArgs as Args;
use hoptrace_runner::soak::{self, SoakOptions};

/// Runs the soak and prints the children's summaries, the run's figures, the targets
/// and the resources.
///
/// # Errors
/// Invalid options, a part that does not start or fails, a report that cannot be written,
/// or counts that do not add up.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let opts = SoakOptions::from_args(args)?;
    opts.check()?;
    let stop = hoptrace_cli::signals::shutdown_flag()?;
    args.preflight.check()?;
    let measured = soak::measure(&opts, &stop)?;
    for line in &measured.output {
        println!("{line}");
    }
    for e in &measured.exited {
        eprintln!("warning: a sampled process died during the run: {e}");
    }
    if measured.interrupted {
        eprintln!(
            "interrupted: published for {:.0} s of the planned {:.0} s; the run and its report say so",
            measured.published.elapsed_ns as f64 / 1e9,
            args.duration.as_secs_f64()
        );
    }
    let o = soak::report(&opts, measured)?;
    println!();
    crate::analyze::print_summary(&o.summary);
    println!();
    for t in &o.result.targets {
        println!(
            "{:<58} {:<22} {:<60} {}",
            t.name,
            t.target,
            t.measured,
            t.verdict()
        );
    }
    for p in &o.result.resources {
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
    println!("Run directory: {}", o.run_dir.display());
    println!(
        "Report: {} (also report.html, summary.json, soak.json, logs/)",
        o.report.display()
    );
    let missed: Vec<&str> = o
        .result
        .targets
        .iter()
        .filter(|t| t.missed())
        .map(|t| t.name.as_str())
        .collect();
    if !missed.is_empty() {
        return Err(hoptrace_cli::errors::exit_with(
            SOAK_TARGET_MISSED,
            anyhow::anyhow!(
                "{} target(s) missed: {} (the run and its report are written: see the Soak section)",
                missed.len(),
                missed.join("; ")
            ),
        ));
    }
    Ok(())
}

pub use hoptrace_runner::soak::EXIT_TARGET_MISSED as SOAK_TARGET_MISSED;
