//! The options of `hoptrace demo`.

use std::path::PathBuf;
use std::time::Duration;

use hoptrace_format::units;

/// Options of `hoptrace demo`.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
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
    /// Make the processor stall (take and write nothing) for --stall-for every this
    /// long from its start, as a garbage collection or a lock would: a cause of a slow
    /// tail that the report's tail attribution should find in the seconds of the stalls.
    #[arg(long, value_name = "DURATION", requires = "stall_for", value_parser = units::parse_duration)]
    pub stall_every: Option<Duration>,
    /// How long each stall of --stall-every lasts (`5ms`).
    #[arg(long, value_name = "DURATION", requires = "stall_every", value_parser = units::parse_short_duration)]
    pub stall_for: Option<Duration>,
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
    /// Step the (simulated) store host's clock by this much during the run (e.g. 2ms; a
    /// store host is simulated, with offset 0 unless --store-clock-offset): a clock step
    /// whose seconds the report's tail attribution and Events should show.
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true, requires = "store_clock_step_at", value_parser = units::parse_signed_duration_ns)]
    pub store_clock_step: Option<i64>,
    /// When the step of --store-clock-step happens, from the pipeline's start (e.g. 15s).
    #[arg(long, value_name = "DURATION", requires = "store_clock_step", value_parser = units::parse_duration)]
    pub store_clock_step_at: Option<Duration>,
    /// The error bound the simulated store host claims for its clock.
    #[arg(long, value_name = "DURATION", default_value = "1ms", value_parser = units::parse_duration_ns)]
    pub store_clock_bound: u64,
    #[command(flatten)]
    pub preflight: crate::preflight::PreflightArgs,
    /// Serve the collector's live view at http://HOST:PORT/ while the demo runs
    /// (`hoptrace collect --ui`), with --rate as its target; `:0` picks a free port.
    #[arg(long, value_name = "HOST:PORT", value_parser = crate::units::parse_listen)]
    pub ui: Option<String>,
}
