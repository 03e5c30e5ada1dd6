//! The command line itself: the program's options and one subcommand per job, each
//! with the options of its module.

use clap::{Parser, Subcommand};

// The binary sets its own version and description over this.
/// Measure end-to-end and per-hop latency of MQTT and Kafka ingestion pipelines.
#[derive(Debug, Parser)]
#[command(
    name = "hoptrace",
    next_line_help = true,
    max_term_width = 100,
    after_help = "Options share one grammar: `--out` is where a command writes what it \
produces (a folder, or a file for sql and record); `--runs` is the folder that holds run \
directories; `--pipeline` is a pipeline spec (TOML); rates are metrics per second (`50k`, \
`1M`); run lengths take a unit or a bare number of seconds (`90s`, `30m`, `90`), and \
settings below a second need a unit (`500us`, `10ms`)."
)]
pub struct Cli {
    /// More log output (-v info, -vv debug); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

/// One subcommand per job.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// A whole measurement in one process: publisher, MQTT broker (in process, or
    /// --broker), the reference processor and store, and the collector; then the report
    /// (md, html, json) under reports/demo/.
    Demo(crate::demo::DemoArgs),
    /// Send traced messages through a chain of in-process hops, export every stamp over
    /// TCP with the collector protocol, join them and print per-stage latency.
    Roundtrip(crate::roundtrip::RoundtripArgs),
    /// Receive probe records, join them per message and write the run's Parquet dataset,
    /// run.json and the accounting, until SIGINT/SIGTERM.
    Collect(crate::collect::CollectArgs),
    /// Take probe connections like a collector and write their records to Kafka, each in
    /// the partition of its trace key, for collectors reading with `collect --from`.
    Relay(crate::relay::RelayArgs),
    /// Print a commented default pipeline spec (the five stages of the reference report).
    GenerateConfig(GenerateConfigArgs),
    /// Whole-run benchmarks (results belong in reports/ with the command and machine).
    #[command(subcommand)]
    Bench(crate::bench::Which),
    /// This host's clock status (chrony, ptp4l or kernel): offset, error bound, leap;
    /// with --max-clock-error, a preflight that fails on an unsynchronised or too uncertain clock.
    Clock(crate::clock::ClockArgs),
    /// Query one or many runs with SQL (DataFusion): traces, clock, probes, runs, stages,
    /// and HDR functions such as hdr_percentile(total_ingestion_ns, 0.99).
    Sql(crate::analyze::SqlArgs),
    /// Write a run's report: report.md, self-contained report.html, summary.json, charts.
    Report(crate::analyze::ReportArgs),
    /// Compare stage percentiles of runs (the first is the baseline); gates for CI.
    Compare(crate::analyze::CompareArgs),
    /// Publish traced messages to MQTT or Kafka on an open-loop schedule (or replay a
    /// capture), report publish stamps and what was sent to the collector, print the
    /// schedule lag.
    Publish(Box<crate::publish::PublishArgs>),
    /// Subscribe to a broker and report an arrival stamp of every traced message to the
    /// collector (a hop you cannot modify); Kafka LogAppendTime is the broker's stamp. With
    /// a store address (influxdb://, postgres://, clickhouse://, victoriametrics://), poll
    /// the store and report when each message's data became queryable.
    Tap(crate::tap::TapArgs),
    /// The whole pipeline as separate processes (collector, reference store and
    /// processor, publisher) through a real broker at a target rate for a duration, CPU
    /// and RSS of every process sampled each second; the report with resources and targets.
    Soak(crate::soak::SoakArgs),
    /// A matrix of settings (rate, metrics per message, MQTT QoS and connections, Kafka
    /// acks and partitions), each cell a soak with a warm-up and a measured window; the
    /// sweep report with every series' knee under --sla and capacity planning. Resumes.
    Sweep(crate::soak::SweepArgs),
    /// The reference pipeline's store or processor as a process of its own.
    #[command(subcommand)]
    Refpipe(crate::refpipe::Which),
    /// Capture what a broker delivers (topic, payload, properties or headers, arrival
    /// time) into a Parquet file for `publish --replay`.
    Record(crate::publish::RecordArgs),
}

/// Options of `hoptrace generate-config`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct GenerateConfigArgs {
    /// Print instead a pipeline whose hops past the publisher are stamped by
    /// OpenTelemetry spans (`collect --otlp`): Kafka, MirrorMaker 2 under the
    /// OpenTelemetry Java agent, Kafka, a consumer.
    #[arg(long)]
    pub otel: bool,
}
