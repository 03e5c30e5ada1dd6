//! `hoptrace bench ...`: whole-run benchmarks whose results go into `reports/`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use hoptrace_broker::url::Endpoint;
use hoptrace_format::units;
use hoptrace_publisher::payload::PayloadFormat;
use hoptrace_runner::bench::collector::{self as bench, BenchOptions};
use hoptrace_runner::bench::publisher::{PublisherBenchOptions, Step};
use hoptrace_runner::bench::report::{ReportBenchOptions, SizeResult};
use hoptrace_runner::progress::LiveLine;

/// Which benchmark.
#[derive(Debug, clap::Subcommand)]
pub enum Which {
    /// Synthetic probe traffic over loopback into an in-process collector: sustained hop
    /// records/s including Parquet writing, peak RSS, bytes per trace on disk.
    Collector(CollectorArgs),
    /// The highest rate the publisher sustains against a broker (achieved/target >= 0.99,
    /// every message confirmed), with its CPU use.
    Publisher(PublisherArgs),
    /// `hoptrace report` over large generated runs (time, peak RSS), side by side with
    /// DuckDB's exact quantiles on the same Parquet, every figure checked.
    Report(ReportArgs),
}

/// Options of `hoptrace bench collector`.
#[derive(Debug, clap::Args)]
pub struct CollectorArgs {
    /// Traces (messages) to generate.
    #[arg(long, default_value = "10M", value_parser = units::parse_count)]
    pub traces: u64,
    /// Target rate, metrics per second (open loop; every generated message carries one
    /// metric, so this is traces per second); omit for as fast as the collector takes them.
    #[arg(long, allow_negative_numbers = true, value_parser = units::parse_count)]
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
    /// Run the collector without its write-ahead log and acknowledgements, as `hoptrace
    /// collect --no-log` (to measure what durability costs).
    #[arg(long)]
    pub no_log: bool,
    /// Least time between the collector's checkpoints (as `hoptrace collect
    /// --checkpoint-interval`; `1h`: none in the run, so --restart replays the whole log).
    #[arg(long, value_name = "DURATION", value_parser = units::parse_duration, conflicts_with = "no_log")]
    pub checkpoint_interval: Option<Duration>,
    /// Also measure a restart: once every record is in, the run directory is copied as a
    /// killed collector would leave it, and after the run a second collector continues
    /// the copy (its checkpoint, then the log after it); the figures are under `restart`.
    #[arg(long, conflicts_with = "no_log")]
    pub restart: bool,
}

/// Options of `hoptrace bench publisher`.
#[derive(Debug, clap::Args)]
pub struct PublisherArgs {
    /// Broker: `mqtt://host:port?qos=0` or `kafka://host:port/topic?acks=all`.
    #[arg(long)]
    pub to: String,
    /// Metrics per message (more than 1: JSON batches).
    #[arg(long, allow_negative_numbers = true, default_value_t = 1)]
    pub metrics_per_message: u32,
    /// Payload format (default: json, or json-batch for several metrics per message).
    #[arg(long, value_parser = PayloadFormat::parse)]
    pub payload: Option<PayloadFormat>,
    /// Streams the load is spread over.
    #[arg(long, allow_negative_numbers = true, default_value_t = 100)]
    pub streams: u32,
    /// First target rate, metrics per second.
    #[arg(long, default_value = "20k", value_parser = units::parse_count)]
    pub start: u64,
    /// Length of each step.
    #[arg(long, default_value = "5s", value_parser = units::parse_duration)]
    pub step: Duration,
    /// Stop bisecting when the failing rate is within this fraction of the passing one.
    #[arg(long, default_value_t = 0.05)]
    pub precision: f64,
    /// Most steps.
    #[arg(long, default_value_t = 20)]
    pub max_steps: usize,
    /// The baseline: publish bare (the same client, settings, payloads and schedule, no
    /// stamp and no trace context in the messages), to compare the traced rate with.
    #[arg(long)]
    pub bare: bool,
}

/// Options of `hoptrace bench report`.
#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    /// Run sizes in traces, comma separated (e.g. `100M,1B`).
    #[arg(long, default_value = "100M", value_delimiter = ',', value_parser = units::parse_count)]
    pub traces: Vec<u64>,
    /// Where generated runs, reports and DuckDB's answers go.
    #[arg(long, default_value = "/var/tmp/hoptrace-bench")]
    pub dir: PathBuf,
    /// Keep each generated run (a later invocation reuses a run of the same size).
    #[arg(long)]
    pub keep: bool,
    /// Rows per generated Parquet file.
    #[arg(long, default_value = "1M", value_parser = units::parse_count)]
    pub rows_per_file: u64,
    /// Most messages per processor batch in the generated runs: from `flow_out` on, a
    /// batch is stamped once, as in real pipelines; 1 stamps every hop per message.
    #[arg(long, default_value_t = hoptrace_collector::generate::DEFAULT_BATCH_MAX, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub batch_max: u32,
    /// Python with the `duckdb` package.
    #[arg(long, default_value = "python3")]
    pub python: String,
    /// Skip DuckDB (only time the report).
    #[arg(long)]
    pub no_duckdb: bool,
}

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
