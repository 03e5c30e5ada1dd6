//! `hoptrace refpipe store|processor`: the reference pipeline's parts as processes of
//! their own, as `hoptrace soak` runs them (each with its own CPU and memory), or by hand
//! against any broker and collector.
//!
//! Each prints `ready <address>` on stdout once it serves (the store) or consumes (the
//! processor), a progress line on stderr every few seconds, and its summary when SIGINT
//! or SIGTERM stops it.

pub use hoptrace_cli::refpipe::Which;
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use hoptrace_broker::url::Endpoint;
use hoptrace_refpipe::processor::{Processor, ProcessorConfig};
use hoptrace_refpipe::server::{StoreServer, StoreServerConfig};

use hoptrace_cli::interrupt::interruptible;
use hoptrace_cli::progress::LiveLine;
pub use hoptrace_cli::refpipe::{ProcessorArgs, StoreArgs};
use hoptrace_format::units;

/// Runs a part until SIGINT or SIGTERM.
///
/// # Errors
/// Invalid options, a part that does not start or fails.
pub fn run(which: &Which) -> anyhow::Result<()> {
    let stop = hoptrace_cli::signals::shutdown_flag()?;
    match which {
        Which::Store(a) => store(a, &stop),
        Which::Processor(a) => processor(a, &stop),
    }
}

fn ready(addr: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready {addr}")?;
    out.flush()?;
    Ok(())
}

/// Shows `line` (given the seconds since the start) until `stop` (or `done`) holds.
fn wait_with_progress(stop: &AtomicBool, done: impl Fn() -> bool, line: impl Fn(f64) -> String) {
    let started = Instant::now();
    let mut live = LiveLine::new();
    live.wait_while_running(stop, Duration::from_millis(100), done, |_| {
        line(started.elapsed().as_secs_f64())
    });
}

fn store(a: &StoreArgs, stop: &AtomicBool) -> anyhow::Result<()> {
    let mut cfg = StoreServerConfig::new(&a.listen);
    cfg.probes = a
        .collector
        .exporter_config("refpipe")
        .map(hoptrace_refpipe::Probes::new);
    let what = format!(
        "starting the store{}",
        a.collector
            .collector
            .as_ref()
            .map(|c| format!(" (connecting to the collector {c})"))
            .unwrap_or_default()
    );
    let server = interruptible(stop, &what, move || StoreServer::start(cfg))?
        .context("starting the store")?;
    ready(&server.local_addr().to_string())?;
    let stats = server.stats();
    wait_with_progress(
        stop,
        || false,
        |t| {
            let rows = stats.rows.load(Relaxed);
            format!(
                "store {t:>6.0}s  {} writes  {} rows ({} rows/s)",
                stats.writes.load(Relaxed),
                rows,
                units::rate(rows as f64 / t.max(1e-3))
            )
        },
    );
    let s = server.stop();
    println!(
        "store: {} rows in {} writes, {} not visible to their query, {} rows held, {} series",
        s.rows, s.writes, s.invisible_writes, s.store.rows_held, s.store.series
    );
    Ok(())
}

fn processor(a: &ProcessorArgs, stop: &AtomicBool) -> anyhow::Result<()> {
    let endpoint = Endpoint::parse(&a.from).context("--from")?;
    let mut cfg = ProcessorConfig::new(endpoint, &a.store);
    cfg.topics.clone_from(&a.topics);
    cfg.batch_rows = a.batch_rows;
    cfg.linger = a.linger;
    cfg.probes = a
        .collector
        .exporter_config("refpipe")
        .map(hoptrace_refpipe::Probes::new);
    let what = format!("starting the processor (connecting to {})", a.from);
    let flow = interruptible(stop, &what, move || Processor::start(cfg))?
        .context("starting the processor")?;
    ready(&a.from)?;
    let stats = flow.stats();
    wait_with_progress(
        stop,
        || flow.has_failed(),
        |t| {
            let m = stats.messages.load(Relaxed);
            format!(
                "processor {t:>6.0}s  {m} messages ({} msgs/s)",
                units::rate(m as f64 / t.max(1e-3))
            )
        },
    );
    let f = flow.stop(Duration::from_secs(10));
    println!(
        "processor: {} messages taken ({} traced, {} bad payloads), {} rows in {} writes, {} acknowledged",
        f.messages, f.traced, f.bad_payloads, f.rows, f.writes, f.acked
    );
    if let Some(e) = &f.error {
        bail!("the processor failed: {e}");
    }
    Ok(())
}
