//! `hoptrace roundtrip`: the probe path end to end on one machine.
//!
//! A publisher thread sends messages on an open-loop schedule through a chain of hop
//! threads; every message is an enveloped byte buffer that each hop unwraps, stamps and
//! wraps again, exactly as a processor embedding the probe would. Every stamp is also
//! reported out of band through a real exporter over loopback TCP to an in-process
//! collector, which joins the stamps per message, writes the run directory (Parquet,
//! run.json, HDR interval logs) and yields per-stage HDR percentiles and the accounting.
//!
//! The roundtrip itself is `hoptrace_runner::roundtrip`; this is its command line and
//! its report.

pub use hoptrace_cli::roundtrip::RoundtripArgs as Args;
use std::time::Duration;

use hoptrace_collector::RunSummary;
use hoptrace_format::units;
use hoptrace_probe::CounterSnapshot;
use hoptrace_runner::roundtrip::{self, RoundtripOptions};

/// Runs the roundtrip and prints its report.
///
/// # Errors
/// Invalid options, or a failure of the receiver or the exporter.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let o = roundtrip::run(&RoundtripOptions {
        messages: args.messages,
        rate: args.rate,
        streams: args.streams,
        metrics_per_message: args.metrics_per_message,
        hops: args.hops.clone(),
        last_hop_skew_ns: args.skew_ns(),
        payload_bytes: args.payload_bytes,
        runs: args.runs.clone(),
    })?;
    print_report(args, &o.run, o.sent, o.elapsed, &o.exported);
    println!("Run directory: {}", o.run_dir.display());
    Ok(())
}

fn print_report(args: &Args, r: &RunSummary, sent: u64, elapsed: Duration, exp: &CounterSnapshot) {
    println!(
        "hoptrace roundtrip: {sent} messages in {:.2} s ({:.0} msg/s, target {} metrics/s = {:.0} msg/s), {} hops, run {}",
        elapsed.as_secs_f64(),
        sent as f64 / elapsed.as_secs_f64(),
        units::rate(args.rate),
        args.message_rate(),
        args.hops.len(),
        r.run_id
    );
    println!();
    println!("| Stage | Count | Min | P50 | P90 | P99 | P99.9 | Max | Mean | Std Dev | Negative |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for s in &r.stages {
        let q = |quantile: f64| {
            s.figures
                .percentiles
                .iter()
                .find(|p| p.quantile == quantile)
                .map_or_else(|| "-".to_owned(), |p| p.shown())
        };
        let exact = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), units::duration_f64);
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            s.name,
            s.figures.count,
            exact(s.figures.min_ns.map(|v| v as f64)),
            q(0.5),
            q(0.9),
            q(0.99),
            q(0.999),
            exact(s.figures.max_ns.map(|v| v as f64)),
            exact(s.figures.mean_ns),
            exact(s.figures.stddev_ns),
            s.figures.negative
        );
    }
    println!();
    println!(
        "Percentiles: HdrHistogram, 3 significant digits, value ± half its bucket; min, max, mean and std dev exact."
    );
    let n = args.hops.len();
    println!(
        "Clocks: every hop reads this host's CLOCK_REALTIME{}.",
        if args.skew_ns() == 0 {
            String::new()
        } else {
            format!(
                ", except {} which is skewed by {} (simulated); its negative deltas are counted, not hidden",
                args.hops[n - 1],
                units::duration_f64(args.skew_ns() as f64)
            )
        }
    );
    println!();
    let a = &r.accounting;
    for p in &a.publishers {
        println!(
            "Accounting: sent {sent} (publisher reported {}) = complete {} + incomplete {} + unseen {}",
            p.sent, p.complete, p.incomplete, p.unseen
        );
    }
    for (hop, m) in &a.missing_by_hop {
        println!("  incomplete, missing {hop}: {m}");
    }
    println!(
        "Probe records: reported {}, sent {}, {}",
        exp.reported,
        exp.sent,
        hoptrace_cli::collector::lost_line(exp)
    );
    let files = r.files.len();
    let bytes: u64 = r.files.iter().map(|f| f.bytes).sum();
    let rows: u64 = r.files.iter().map(|f| f.rows).sum();
    println!(
        "Parquet: {files} file(s), {rows} rows, {bytes} bytes ({:.1} bytes/trace)",
        bytes as f64 / rows.max(1) as f64
    );
    println!(
        "Counts add up: {}",
        if a.adds_up && a.publishers.iter().all(|p| p.sent == sent) {
            "yes"
        } else {
            "NO"
        }
    );
}
