//! `hoptrace`: one binary, one subcommand per job. Each module holds a subcommand's clap
//! arguments, the call into a library (the orchestration is `hoptrace_runner`; the parts
//! are the probe, publisher, tap, collector, analysis and refpipe crates) and the printing
//! of what it returns.

use clap::{Parser, Subcommand};

// Every line printed goes through `out`, which stops printing to a stream whose reader
// went away (`| head -1`) instead of panicking: these shadow the standard macros in
// every module below.
#[allow(unused_macros)]
macro_rules! print {
    ($($arg:tt)*) => { ::hoptrace_runner::out::print(::hoptrace_runner::out::Stream::Out, false, format_args!($($arg)*)) };
}
#[allow(unused_macros)]
macro_rules! println {
    () => { ::hoptrace_runner::out::print(::hoptrace_runner::out::Stream::Out, true, format_args!("")) };
    ($($arg:tt)*) => { ::hoptrace_runner::out::print(::hoptrace_runner::out::Stream::Out, true, format_args!($($arg)*)) };
}
#[allow(unused_macros)]
macro_rules! eprint {
    ($($arg:tt)*) => { ::hoptrace_runner::out::print(::hoptrace_runner::out::Stream::Err, false, format_args!($($arg)*)) };
}
#[allow(unused_macros)]
macro_rules! eprintln {
    () => { ::hoptrace_runner::out::print(::hoptrace_runner::out::Stream::Err, true, format_args!("")) };
    ($($arg:tt)*) => { ::hoptrace_runner::out::print(::hoptrace_runner::out::Stream::Err, true, format_args!($($arg)*)) };
}

use hoptrace_cli::{collector as collector_args, units};

mod analyze;
mod bench;
mod clock;
mod collect;
mod demo;
mod errors;
mod publish;
mod refpipe_cmd;
mod roundtrip;
mod scaleout;
mod signals;
mod soak;
mod store_tap;
mod sweep;

/// Measure end-to-end and per-hop latency of MQTT and Kafka ingestion pipelines.
#[derive(Debug, Parser)]
#[command(
    name = "hoptrace",
    version,
    about,
    next_line_help = true,
    max_term_width = 100,
    after_help = "Options share one grammar: `--out` is where a command writes what it \
produces (a folder, or a file for sql and record); `--runs` is the folder that holds run \
directories; `--pipeline` is a pipeline spec (TOML); rates are metrics per second (`50k`, \
`1M`); run lengths take a unit or a bare number of seconds (`90s`, `30m`, `90`), and \
settings below a second need a unit (`500us`, `10ms`)."
)]
struct Cli {
    /// More log output (-v info, -vv debug); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// A whole measurement in one process: publisher, MQTT broker (in process, or
    /// --broker), the reference processor and store, and the collector; then the report
    /// (md, html, json) under reports/demo/.
    Demo(demo::Args),
    /// Send traced messages through a chain of in-process hops, export every stamp over
    /// TCP with the collector protocol, join them and print per-stage latency.
    Roundtrip(roundtrip::Args),
    /// Receive probe records, join them per message and write the run's Parquet dataset,
    /// run.json and the accounting, until SIGINT/SIGTERM.
    Collect(collect::Args),
    /// Take probe connections like a collector and write their records to Kafka, each in
    /// the partition of its trace key, for collectors reading with `collect --from`.
    Relay(scaleout::RelayArgs),
    /// Print a commented default pipeline spec (the five stages of the reference report).
    GenerateConfig,
    /// Whole-run benchmarks (results belong in reports/ with the command and machine).
    #[command(subcommand)]
    Bench(bench::Which),
    /// This host's clock status (chrony, ptp4l or kernel): offset, error bound, leap;
    /// with --max-clock-error, a preflight that fails on an unsynchronised or too uncertain clock.
    Clock(clock::Args),
    /// Query one or many runs with SQL (DataFusion): traces, clock, probes, runs, stages,
    /// and HDR functions such as hdr_percentile(total_ingestion_ns, 0.99).
    Sql(analyze::SqlArgs),
    /// Write a run's report: report.md, self-contained report.html, summary.json, charts.
    Report(analyze::ReportArgs),
    /// Compare stage percentiles of runs (the first is the baseline); gates for CI.
    Compare(analyze::CompareArgs),
    /// Publish traced messages to MQTT or Kafka on an open-loop schedule (or replay a
    /// capture), report publish stamps and what was sent to the collector, print the
    /// schedule lag.
    Publish(Box<publish::PublishArgs>),
    /// Subscribe to a broker and report an arrival stamp of every traced message to the
    /// collector (a hop you cannot modify); Kafka LogAppendTime is the broker's stamp. With
    /// a store address (influxdb://, postgres://, clickhouse://, victoriametrics://), poll
    /// the store and report when each message's data became queryable.
    Tap(publish::TapArgs),
    /// The whole pipeline as separate processes (collector, reference store and
    /// processor, publisher) through a real broker at a target rate for a duration, CPU
    /// and RSS of every process sampled each second; the report with resources and targets.
    Soak(soak::Args),
    /// A matrix of settings (rate, metrics per message, MQTT QoS and connections, Kafka
    /// acks and partitions), each cell a soak with a warm-up and a measured window; the
    /// sweep report with every series' knee under --sla and capacity planning. Resumes.
    Sweep(sweep::Args),
    /// The reference pipeline's store or processor as a process of its own.
    #[command(subcommand)]
    Refpipe(refpipe_cmd::Which),
    /// Capture what a broker delivers (topic, payload, properties or headers, arrival
    /// time) into a Parquet file for `publish --replay`.
    Record(publish::RecordArgs),
}

fn main() {
    let cli = Cli::parse();
    // The demo's embedded broker (rumqttd) logs every client disconnect as an error;
    // its losses show in the run's accounting instead.
    let default = match cli.verbose {
        0 => "warn,rumqttd=off",
        1 => "info,rumqttd=warn",
        _ => "debug",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default)),
        )
        .with_writer(hoptrace_runner::out::Sink(
            hoptrace_runner::out::Stream::Err,
        ))
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let result = match cli.command {
        Command::Demo(args) => demo::run(&args),
        Command::Roundtrip(args) => roundtrip::run(&args),
        Command::Collect(args) => collect::run(&args),
        Command::Relay(args) => scaleout::relay(&args),
        Command::Bench(which) => bench::run(&which),
        Command::Clock(args) => clock::run(&args),
        Command::Sql(args) => analyze::run_sql(&args),
        Command::Report(args) => analyze::run_report(&args),
        Command::Compare(args) => analyze::run_compare(&args),
        Command::Publish(args) => publish::publish(&args),
        Command::Tap(args) => publish::tap(&args),
        Command::Record(args) => publish::record(&args),
        Command::Soak(args) => soak::run(&args),
        Command::Sweep(args) => sweep::run(&args),
        Command::Refpipe(which) => refpipe_cmd::run(&which),
        Command::GenerateConfig => {
            collect::generate_config();
            Ok(())
        }
    };
    if let Err(e) = result {
        if e.chain()
            .any(|c| c.is::<hoptrace_runner::interrupt::Interrupted>())
        {
            eprintln!("stopped by {}: {}", signals::name(), errors::render(&e));
        } else {
            eprintln!("error: {}", errors::render(&e));
        }
        std::process::exit(errors::exit_code(&e));
    }
}
