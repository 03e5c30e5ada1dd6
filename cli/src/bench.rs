//! The options of `hoptrace bench`: the whole-run benchmarks whose results go into `reports/`.

use std::path::PathBuf;
use std::time::Duration;

use hoptrace_format::units;
use hoptrace_publisher::payload::PayloadFormat;

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
