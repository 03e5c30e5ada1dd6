//! `hoptrace bench ...`: whole-run benchmarks whose results go into `reports/`.

pub use hoptrace_cli::bench::{PublisherArgs, ReportArgs, Which};
use std::time::Instant;

use anyhow::{Context as _, bail};
use hoptrace_broker::url::Endpoint;
use hoptrace_cli::progress::LiveLine;
use hoptrace_format::units;
use hoptrace_runner::bench::collector::{self as bench, BenchOptions};
use hoptrace_runner::bench::publisher::{PublisherBenchOptions, Step};
use hoptrace_runner::bench::report::{ReportBenchOptions, SizeResult};

/// Runs a benchmark and prints its figures as JSON after a progress line.
///
/// # Errors
/// Invalid options, or a failure of the collector or the generators.
pub fn run(which: &Which) -> anyhow::Result<()> {
    match which {
        Which::Publisher(a) => publisher(a),
        Which::Report(a) => report(a),
        Which::Collector(a) => {
            let opts = BenchOptions {
                traces: a.traces,
                rate: a.rate,
                hops: a.hops,
                exporters: a.exporters,
                out_dir: a.runs.clone(),
                window_ms: a
                    .window_ms
                    .unwrap_or_else(|| u64::try_from(a.window.as_millis()).unwrap_or(u64::MAX)),
                durable: !a.no_log,
                checkpoint_interval: a.checkpoint_interval,
                restart: a.restart,
            };
            // The benchmark reports once a second: every report is shown.
            let mut live = LiveLine::new();
            let report = bench::run(&opts, |p| {
                live.show(&format!(
                    "{:>5.0}s  {:>10.0} records/s  traces {}/{}  pending {}  lost {}  rss {} MiB  ETA {}",
                    p.elapsed_s,
                    p.records_per_s,
                    p.traces_done,
                    opts.traces,
                    p.pending,
                    p.lost_by_probes,
                    p.rss_bytes >> 20,
                    p.eta_s.map_or_else(|| "-".to_owned(), |e| format!("{e:.0}s"))
                ));
            })
            .context("collector benchmark")?;
            live.finish();
            println!(
                "{:.2}M hop records/s, {:.0} traces/s, {:.2} bytes/trace, peak RSS {} MiB, lost by probes {}, counts add up: {}",
                report.records_per_s / 1e6,
                report.traces_per_s,
                report.bytes_per_trace,
                report.peak_rss_bytes >> 20,
                report.lost_by_probes,
                if report.adds_up { "yes" } else { "NO" }
            );
            if report.durable && report.evicted_by_probes > 0 {
                eprintln!(
                    "warning: the exporters evicted {} records before the collector acknowledged them: durability was not in force throughout, so this is not a figure of a durable collector",
                    report.evicted_by_probes
                );
            }
            if let Some(r) = &report.restart {
                println!(
                    "restart: {} in {:.2} s ({:.2}M log records/s), {} log bytes per record; complete {}, counts add up: {}",
                    if r.from_checkpoint {
                        "took up the checkpoint and replayed the log after it"
                    } else {
                        "replayed the whole log"
                    },
                    r.start_seconds,
                    r.log_records_per_s / 1e6,
                    format_args!("{:.1}", report.log_bytes_per_record),
                    r.complete,
                    if r.adds_up { "yes" } else { "NO" }
                );
            }
            println!("{}", serde_json::to_string_pretty(&report)?);
            Ok(())
        }
    }
}

fn publisher(args: &PublisherArgs) -> anyhow::Result<()> {
    let opts = PublisherBenchOptions {
        to: Endpoint::parse(&args.to).context("--to")?,
        metrics_per_message: args.metrics_per_message,
        payload: args.payload,
        streams: args.streams,
        start: args.start,
        step: args.step,
        precision: args.precision,
        max_steps: args.max_steps,
        bare: args.bare,
    };
    let started = Instant::now();
    let mut n = 0;
    let search = hoptrace_runner::bench::publisher::run(&opts, |step| {
        n += 1;
        print_step(n, step);
    })?;
    match search.best() {
        Some(b) => println!(
            "highest passing rate: {} metrics/s ({} msg/s) using {:.2} cores; first failure at {}; {} steps in {:.0} s",
            units::rate(b.target_metrics_per_s),
            units::rate(b.messages_per_s),
            b.cpu_cores,
            search
                .lowest_failing_metrics_per_s
                .map_or_else(|| "none".into(), units::rate),
            search.steps.len(),
            started.elapsed().as_secs_f64()
        ),
        None => println!("no step passed; lower --start"),
    }
    println!("{}", serde_json::to_string_pretty(&search)?);
    Ok(())
}

fn print_step(n: usize, step: &Step) {
    println!(
        "{n:>4}  target {:>8} metrics/s  achieved {:>8} delivered {:>8} ({:.4})  {:>8} msg/s  cpu {:.2} cores  waits {}  lag p99 {}  unconfirmed {}  {}",
        units::rate(step.target_metrics_per_s),
        units::rate(step.achieved_metrics_per_s),
        units::rate(step.delivered_metrics_per_s),
        step.ratio,
        units::rate(step.messages_per_s),
        step.cpu_cores,
        step.backpressure_waits,
        units::duration_f64(step.lag_p99_ns as f64),
        step.unconfirmed,
        if step.pass { "pass" } else { "FAIL" }
    );
}

fn report(args: &ReportArgs) -> anyhow::Result<()> {
    let opts = ReportBenchOptions {
        program: std::env::current_exe().context("this program's path")?,
        traces: args.traces.clone(),
        dir: args.dir.clone(),
        keep: args.keep,
        rows_per_file: args.rows_per_file,
        batch_max: args.batch_max,
        python: args.python.clone(),
        no_duckdb: args.no_duckdb,
    };
    let bench = hoptrace_runner::bench::report::run(&opts, print_result)?;
    println!("{}", serde_json::to_string_pretty(&bench)?);
    if !bench.agrees() {
        bail!("the report and DuckDB disagree beyond the stated precision");
    }
    Ok(())
}

fn print_result(r: &SizeResult) {
    println!(
        "{} traces ({} files, {:.2} GiB Parquet, {:.2} bytes/trace)",
        units::rate(r.traces as f64),
        r.files,
        r.parquet_bytes as f64 / (1u64 << 30) as f64,
        r.parquet_bytes as f64 / r.traces.max(1) as f64
    );
    println!(
        "  hoptrace report  {:>8.1} s wall  {:>8.1} s CPU  peak RSS {:>6} MiB",
        r.report.wall_s,
        r.report.cpu_s,
        r.report.peak_rss_bytes >> 20
    );
    if let Some(d) = &r.duckdb {
        println!(
            "  DuckDB {:<9} {:>8.1} s wall  {:>8.1} s CPU  peak RSS {:>6} MiB  (queries {:.1} s)",
            r.duckdb_version.as_deref().unwrap_or("?"),
            d.wall_s,
            d.cpu_s,
            d.peak_rss_bytes >> 20,
            r.duckdb_query_s.unwrap_or(0.0)
        );
        println!(
            "  report / DuckDB = {:.3}; {} percentiles checked, {} outside the stated precision",
            r.ratio.unwrap_or(0.0),
            r.percentiles_checked,
            r.disagreements.len()
        );
    }
    for d in &r.disagreements {
        println!("  DISAGREES: {d}");
    }
}
