//! `hoptrace`: one binary, one subcommand per job. Each module holds a subcommand's clap
//! arguments, the call into a library (the orchestration is `hoptrace_runner`; the parts
//! are the probe, publisher, tap, collector, analysis and refpipe crates) and the printing
//! of what it returns.

use clap::{CommandFactory as _, FromArgMatches as _};
use hoptrace_cli::command::{Cli, Command};

// Every line printed goes through `out`, which stops printing to a stream whose reader
// went away (`| head -1`) instead of panicking: these shadow the standard macros in
// every module below.
#[allow(unused_macros)]
macro_rules! print {
    ($($arg:tt)*) => { ::hoptrace_cli::out::print(::hoptrace_cli::out::Stream::Out, false, format_args!($($arg)*)) };
}
#[allow(unused_macros)]
macro_rules! println {
    () => { ::hoptrace_cli::out::print(::hoptrace_cli::out::Stream::Out, true, format_args!("")) };
    ($($arg:tt)*) => { ::hoptrace_cli::out::print(::hoptrace_cli::out::Stream::Out, true, format_args!($($arg)*)) };
}
#[allow(unused_macros)]
macro_rules! eprint {
    ($($arg:tt)*) => { ::hoptrace_cli::out::print(::hoptrace_cli::out::Stream::Err, false, format_args!($($arg)*)) };
}
#[allow(unused_macros)]
macro_rules! eprintln {
    () => { ::hoptrace_cli::out::print(::hoptrace_cli::out::Stream::Err, true, format_args!("")) };
    ($($arg:tt)*) => { ::hoptrace_cli::out::print(::hoptrace_cli::out::Stream::Err, true, format_args!($($arg)*)) };
}

mod analyze;
mod bench;
mod clock;
mod collect;
mod demo;
mod publish;
mod refpipe_cmd;
mod roundtrip;
mod scaleout;
mod soak;
mod sweep;

fn main() {
    // The program's own name, version and description (the options are the library's).
    let matches = Cli::command()
        .version(env!("CARGO_PKG_VERSION"))
        .about(env!("CARGO_PKG_DESCRIPTION"))
        .get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
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
        .with_writer(hoptrace_cli::out::Sink(hoptrace_cli::out::Stream::Err))
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
        Command::GenerateConfig(args) => {
            collect::generate_config(args.otel);
            Ok(())
        }
    };
    if let Err(e) = result {
        if e.chain()
            .any(|c| c.is::<hoptrace_cli::interrupt::Interrupted>())
        {
            eprintln!(
                "stopped by {}: {}",
                hoptrace_cli::signals::name(),
                hoptrace_cli::errors::render(&e)
            );
        } else {
            eprintln!("error: {}", hoptrace_cli::errors::render(&e));
        }
        std::process::exit(hoptrace_cli::errors::exit_code(&e));
    }
}
