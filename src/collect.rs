//! `hoptrace collect` and `hoptrace generate-config` (the options and text are
//! `hoptrace_cli::collect`'s).

use std::time::{Duration, Instant};

use anyhow::Context as _;
use hoptrace_cli::collect::load_spec;
use hoptrace_cli::collect::text::{CollectLine, accounting_lines, continued_line, recovered_lines};
pub use hoptrace_cli::collect::{CollectArgs as Args, DEFAULT_LISTEN};
use hoptrace_cli::progress::LiveLine;
use hoptrace_collector::{Collector, CollectorConfig};
use hoptrace_format::spec::{DEFAULT_PIPELINE_TOML, OTEL_PIPELINE_TOML};
use hoptrace_runner::rundir;

/// Runs a collector until SIGINT/SIGTERM (or `--duration-s`), then flushes every file,
/// writes `run.json` and prints the accounting.
///
/// # Errors
/// A bad spec, a bind failure, a write failure.
pub fn run(args: &Args) -> anyhow::Result<()> {
    // First of all, so a signal that arrives while starting still flushes and exits cleanly.
    let stop = hoptrace_cli::signals::shutdown_flag()?;
    let spec = load_spec(args.pipeline.as_deref())?;
    if let Some(from) = &args.from {
        args.refuse_listener_options()?;
        if let Some(id) = &args.run_id {
            rundir::check_group(&args.runs.join(id), &spec)?;
        }
        args.preflight.check()?;
        return crate::scaleout::collect_group(args, from, spec, &stop);
    }
    args.preflight.check()?;
    let mut run_id = args.run_id.clone();
    if run_id.is_none() {
        let (unfinished, said) = rundir::unfinished_runs(&args.runs, &spec, args.resume)?;
        for line in said {
            eprintln!("{line}");
        }
        run_id = unfinished;
    }
    if let Some(id) = &run_id {
        rundir::check(&args.runs.join(id), &spec, args.continue_run)?;
    }
    let listen = args.listen.as_deref().unwrap_or(DEFAULT_LISTEN);
    let join_window = Duration::from_millis(spec.join.window_ms);
    let mut cfg = CollectorConfig::new(listen, spec, &args.runs);
    cfg.run_id = run_id;
    args.listener
        .apply(&mut cfg.token, &mut cfg.tls_cert, &mut cfg.tls_key);
    cfg.max_clock_error_ns = args.preflight.max_clock_error;
    cfg.durable = !args.no_log;
    cfg.sync_interval = args.log_sync;
    cfg.checkpoint_interval = args.checkpoint_interval;
    cfg.otlp = args.otlp_config();
    let collector = std::sync::Arc::new(Collector::start(cfg).context("starting the collector")?);
    eprintln!(
        "collecting on {}{} into {} (SIGINT or SIGTERM stops and flushes)",
        collector.local_addr(),
        if args.listener.tls_cert.is_some() {
            " (TLS)"
        } else {
            ""
        },
        collector.run_dir().display()
    );
    if let Some(a) = collector.otlp_addr() {
        eprintln!("taking OTLP/HTTP spans at http://{a}/v1/traces (protobuf or JSON)");
    }
    if let Some(r) = collector.continued() {
        let id = collector
            .run_dir()
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        eprintln!("{}", continued_line(&id, r));
    }
    for line in collector
        .recovered()
        .map(recovered_lines)
        .unwrap_or_default()
    {
        eprintln!("{line}");
    }
    let servers = args.serve(&collector)?;

    let deadline = args.duration.map(|d| Instant::now() + d);
    // A plain line every second where stderr is a log.
    let mut live = LiveLine::with_plain_every(Some(Duration::from_secs(1)));
    let mut line = CollectLine::new(collector.progress(), join_window);
    live.wait_while_running(
        &stop,
        Duration::from_millis(200),
        || deadline.is_some_and(|d| Instant::now() >= d),
        |since| line.line(collector.progress(), since),
    );
    live.finish();
    eprintln!("stopping: waiting for probes to flush, then closing every file");
    let collector = std::sync::Arc::try_unwrap(collector)
        .map_err(|_| anyhow::anyhow!("the metrics server still holds the collector"))?;
    let summary = collector.stop().context("stopping the collector")?;
    // Served until the run is written, so the live view shows it finished.
    drop(servers);
    println!(
        "run {} written to {}",
        summary.run_id,
        args.runs.join(&summary.run_id).display()
    );
    for line in accounting_lines(&summary) {
        println!("{line}");
    }
    Ok(())
}

/// Prints the commented default pipeline spec, or with `otel` the one whose hops spans
/// stamp.
pub fn generate_config(otel: bool) {
    print!(
        "{}",
        if otel {
            OTEL_PIPELINE_TOML
        } else {
            DEFAULT_PIPELINE_TOML
        }
    );
}
