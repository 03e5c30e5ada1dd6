//! `hoptrace publish`, `hoptrace tap` and `hoptrace record`: their options, configuration
//! and text are `hoptrace_cli`'s; the work is `hoptrace_publisher`'s and `hoptrace_tap`'s.

use anyhow::{Context as _, bail};
use hoptrace_cli::interrupt::{interruptible, run_watching, run_with_line};
pub use hoptrace_cli::publish::{PublishArgs, RecordArgs};
use hoptrace_cli::publish::{PublishLine, publish_summary, record_summary};
pub use hoptrace_cli::tap::TapArgs;
use hoptrace_cli::tap::text::{StoreTapLine, TapLine, store_tap_summary, tap_summary};
use hoptrace_publisher::capture;
use hoptrace_publisher::publish::Publisher;
use hoptrace_publisher::report::PublishReport;
use hoptrace_publisher::tap::Tap;
use hoptrace_tap::StoreTap;

/// Runs `hoptrace publish`: a live line on a terminal, a summary always.
///
/// # Errors
/// Invalid options, an unusable broker or collector, a failure during the run.
pub fn publish(args: &PublishArgs) -> anyhow::Result<()> {
    let stop = hoptrace_cli::signals::shutdown_flag()?;
    args.preflight.check()?;
    let config = args.config()?;
    if let Some(w) = args.sparse_warning() {
        eprintln!("warning: {w}");
    }
    let publisher = interruptible(&stop, &format!("connecting to {}", args.to), move || {
        Publisher::new(config)
    })?
    .context("starting the publisher")?;
    eprintln!(
        "{} (SIGINT or SIGTERM stops, flushes and prints the summary)",
        publisher.describe()
    );
    let live = publisher.live();
    let mut line = PublishLine::new(*live.lock().expect("live stats poisoned"), args.duration);
    let summary = run_with_line(
        "publisher",
        &stop,
        &format!("publishing to {} (flushing)", args.to),
        move |stop| publisher.run(stop),
        |since| line.line(*live.lock().expect("live stats poisoned"), since),
    )??;
    let window_s = args.rate_window_s(&summary);
    for l in publish_summary(&summary, window_s) {
        println!("{l}");
    }
    if let Some(path) = &args.summary_json {
        std::fs::write(
            path,
            serde_json::to_vec_pretty(&PublishReport::new(&summary, window_s))?,
        )
        .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(r) = &summary.collector_refused {
        bail!("the collector refused the publisher for good: {r}");
    }
    Ok(())
}

/// Runs `hoptrace tap` until SIGINT/SIGTERM (or --duration / --messages): a broker tap,
/// or a store tap when `--from` names a store.
///
/// # Errors
/// Invalid options, an unusable broker, store or collector.
pub fn tap(args: &TapArgs) -> anyhow::Result<()> {
    if args.is_store() {
        return store_tap(args);
    }
    let stop = hoptrace_cli::signals::shutdown_flag()?;
    args.preflight.check()?;
    let c = args.broker_config()?;
    let tap = interruptible(&stop, &format!("connecting to {}", args.from), move || {
        Tap::start(c)
    })?
    .context("starting the tap")?;
    eprintln!("tapping {} (SIGINT or SIGTERM stops)", tap.describe());
    let live = tap.live();
    let mut line = TapLine::new();
    let s = run_with_line(
        "tap",
        &stop,
        &format!("tapping {}", args.from),
        move |stop| tap.run(stop),
        |since| line.line(&live, since),
    )??;
    for l in tap_summary(&s) {
        println!("{l}");
    }
    if let Some(r) = &s.collector_refused {
        bail!("the collector refused the tap for good: {r}");
    }
    Ok(())
}

/// A store tap until SIGINT/SIGTERM (or --duration / --messages).
fn store_tap(args: &TapArgs) -> anyhow::Result<()> {
    let stop = hoptrace_cli::signals::shutdown_flag()?;
    args.preflight.check()?;
    let config = args.store_config()?;
    let store = config.url.display();
    let tap = interruptible(&stop, &format!("connecting to {store}"), move || {
        StoreTap::start(config)
    })?
    .context("starting the store tap")?;
    let describe = tap.describe();
    let live = tap.live();
    let mut line = StoreTapLine::new();
    // Rows already in the store belong to no message of this run: "polling" once the
    // first poll has taken them as the baseline, so that what is published after this
    // line is reported.
    let mut announced = false;
    let watched = std::sync::Arc::clone(&live);
    let s = run_watching(
        "store-tap",
        &stop,
        &format!("polling {store}"),
        move |stop| tap.run(stop),
        || {
            if !announced
                && watched
                    .baseline_taken
                    .load(std::sync::atomic::Ordering::Relaxed)
            {
                announced = true;
                eprintln!("polling {describe} (SIGINT or SIGTERM stops)");
            }
        },
        |since| line.line(&live, since),
    )?;
    for l in store_tap_summary(&s) {
        println!("{l}");
    }
    if let Some(r) = &s.collector_refused {
        bail!("the collector refused the tap for good: {r}");
    }
    Ok(())
}

/// Runs `hoptrace record` until SIGINT/SIGTERM (or --duration / --messages).
///
/// # Errors
/// Invalid options, an unusable broker, an unwritable file.
pub fn record(args: &RecordArgs) -> anyhow::Result<()> {
    let stop = hoptrace_cli::signals::shutdown_flag()?;
    let c = args.config()?;
    eprintln!(
        "recording {} into {} (SIGINT or SIGTERM stops and closes the file)",
        c.source.display(),
        c.out.display()
    );
    let source = c.source.display();
    let s = run_with_line(
        "record",
        &stop,
        &format!("recording {source}"),
        move |stop| capture::record(&c, stop),
        |_| String::new(),
    )?
    .context("recording")?;
    println!("{}", record_summary(&s));
    Ok(())
}
