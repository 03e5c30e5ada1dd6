//! `hoptrace bench ...`: whole-run benchmarks whose results go into `reports/`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use hoptrace_collector::bench::{self, BenchOptions};

use hoptrace_format::units;
use hoptrace_runner::progress::LiveLine;

/// Which benchmark.
#[derive(Debug, clap::Subcommand)]
pub enum Which {
    /// Synthetic probe traffic over loopback into an in-process collector: sustained hop
    /// records/s including Parquet writing, peak RSS, bytes per trace on disk.
    Collector(CollectorArgs),
    /// The highest rate the publisher sustains against a broker (achieved/target >= 0.99,
    /// every message confirmed), with its CPU use.
    Publisher(crate::bench_publisher::Args),
    /// `hoptrace report` over large generated runs (time, peak RSS), side by side with
    /// DuckDB's exact quantiles on the same Parquet, every figure checked.
    Report(crate::bench_report::Args),
}

/// Options of `hoptrace bench collector`.
#[derive(Debug, clap::Args)]
pub struct CollectorArgs {
    /// Traces (messages) to generate.
    #[arg(long, default_value = "10M", value_parser = units::parse_count)]
    pub traces: u64,
    /// Target rate, metrics per second (open loop; every generated message carries one
    /// metric, so this is traces per second); omit for as fast as the collector takes them.
    #[arg(long, value_parser = units::parse_count)]
    pub rate: Option<u64>,
    /// Hops per trace.
    #[arg(long, default_value_t = 4)]
    pub hops: usize,
    /// Exporters (simulated probe processes), each owning a share of the hops.
    #[arg(long, default_value_t = 2)]
    pub exporters: usize,
    /// Join window (`10s`).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = units::parse_duration, conflicts_with = "window_ms")]
    pub window: Duration,
    /// The join window in plain milliseconds (the older spelling).
    #[arg(long, hide = true)]
    pub window_ms: Option<u64>,
    /// Folder under which the run directory is written.
    #[arg(long, alias = "out", value_name = "DIR", default_value = "runs")]
    pub runs: PathBuf,
}

/// Runs a benchmark and prints its figures as JSON after a progress line.
///
/// # Errors
/// Invalid options, or a failure of the collector or the generators.
pub fn run(which: &Which) -> anyhow::Result<()> {
    match which {
        Which::Publisher(a) => crate::bench_publisher::run(a),
        Which::Report(a) => crate::bench_report::run(a),
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
            println!("{}", serde_json::to_string_pretty(&report)?);
            Ok(())
        }
    }
}
