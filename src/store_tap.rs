//! `hoptrace tap --from <store URL>`: the store tap's options, its run and its summary, a
//! thin wrapper over `hoptrace_tap`.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use anyhow::{Context as _, bail};
use hoptrace_tap::poll::Spread;
use hoptrace_tap::{StoreTap, StoreTapConfig, StoreTapSummary, StoreUrl};

use crate::clock::Preflight as _;
use crate::publish::TapArgs;
use hoptrace_format::units;
use hoptrace_runner::interrupt::{interruptible, run_watching};

/// Whether `--from` names a store rather than a broker.
#[must_use]
pub fn is_store(from: &str) -> bool {
    hoptrace_tap::store::is_store_url(from)
}

fn config(args: &TapArgs) -> anyhow::Result<StoreTapConfig> {
    let s = &args.store;
    let url = StoreUrl::parse(&args.from).context("--from")?;
    let mut c = StoreTapConfig::new(url);
    c.poll_interval = s.poll_interval;
    c.pollers = usize::from(s.pollers);
    c.idle_poll_interval = s.idle_poll_interval;
    c.catch_up = s.catch_up;
    c.catch_up_interval = s.catch_up_every;
    c.wait_for_store = s.wait_for_store;
    c.store_host.clone_from(&s.store_host);
    c.publishers = (!args.publishers.is_empty()).then(|| args.publishers.clone());
    c.duration = args.duration;
    c.max_keys = args.messages;
    let store_in = match s.store_in.as_str() {
        "on" => Some(true),
        "off" => Some(false),
        _ => None,
    };
    let Some(exporter) = args.collector.exporter_config("hoptrace-tap") else {
        if !store_in.unwrap_or(c.url.kind.store_in_by_default()) {
            c.store_in_hop = None;
        }
        return Ok(c);
    };
    if args.hop_spec.hop_id.is_some() {
        bail!(
            "--hop-id names one hop; a store tap reports several: pass the collector's spec with --pipeline"
        );
    }
    let spec = crate::collect::load_spec(args.hop_spec.pipeline.as_deref())?;
    let find = |name: &str| spec.hop(name).map(|id| (id, name.to_owned()));
    c.queryable_hop = find(&s.queryable_hop).with_context(|| {
        format!(
            "{}: pass the collector's spec with --pipeline, or name the hop with --queryable-hop",
            spec.undeclared(&s.queryable_hop)
        )
    })?;
    c.query_start_hop = match s.query_start_hop.as_str() {
        "none" | "" => None,
        name => Some(find(name).with_context(|| {
            format!(
                "{}: --query-start-hop none leaves it out",
                spec.undeclared(name)
            )
        })?),
    };
    c.store_in_hop = match (store_in, find(&s.store_in_hop)) {
        (Some(false), _) => None,
        (Some(true), None) => bail!("--store-in on, but {}", spec.undeclared(&s.store_in_hop)),
        (Some(true), hop) => hop,
        (None, hop) => hop.filter(|_| c.url.kind.store_in_by_default()),
    };
    // The spec's earliest instant of the queryable hop, when it declares one: reported
    // per message, so that every stage ending there has bounds.
    c.earliest_hop = spec
        .earliest_of(&c.queryable_hop.1)
        .map(|e| find(e).expect("the spec checked its `earliest`"));
    if let Some(id) = spec.hop("publish") {
        c.publish_hop = id;
    }
    c.collector = Some(exporter);
    Ok(c)
}

/// Runs a store tap until SIGINT/SIGTERM (or --duration / --messages).
///
/// # Errors
/// Invalid options, a store that refuses at start (missing table, unreachable), a
/// collector that does not accept the tap, a signal while the store does not answer.
pub fn run(args: &TapArgs) -> anyhow::Result<()> {
    let stop = crate::signals::shutdown_flag()?;
    args.preflight.check()?;
    let config = config(args)?;
    let store = config.url.display();
    let tap = interruptible(&stop, &format!("connecting to {store}"), move || {
        StoreTap::start(config)
    })?
    .context("starting the store tap")?;
    let describe = tap.describe();
    let live = tap.live();
    let started = Instant::now();
    let mut last_polls = 0u64;
    // Rows already in the store belong to no message of this run: "polling" once the
    // first poll has taken them as the baseline, so that what is published after this
    // line is reported.
    let mut announced = false;
    let s = run_watching(
        "store-tap",
        &stop,
        &format!("polling {store}"),
        move |stop| tap.run(stop),
        || {
            if !announced && live.baseline_taken.load(Relaxed) {
                announced = true;
                eprintln!("polling {describe} (SIGINT or SIGTERM stops)");
            }
        },
        |since| {
            let polls = live.polls.load(Relaxed);
            let rate = polls.saturating_sub(last_polls) as f64 / since.as_secs_f64();
            last_polls = polls;
            format!(
                "{:>6.0}s  {rate:>6.0} polls/s  keys found {}  poll errors {}  bad keys {}",
                started.elapsed().as_secs_f64(),
                live.keys_found.load(Relaxed),
                live.poll_errors.load(Relaxed),
                live.bad_keys.load(Relaxed),
            )
        },
    )?;
    print_summary(&s);
    if let Some(r) = &s.collector_refused {
        bail!("the collector refused the tap for good: {r}");
    }
    Ok(())
}

fn spread(s: &Spread) -> String {
    if s.count == 0 {
        return "-".into();
    }
    format!(
        "mean {}  p50 {}  p99 {}  max {}",
        units::duration_f64(s.mean_ns),
        units::duration_f64(s.p50_ns as f64),
        units::duration_f64(s.p99_ns as f64),
        units::duration_f64(s.max_ns as f64)
    )
}

fn print_summary(s: &StoreTapSummary) {
    println!(
        "hoptrace tap: {}{} for {:.1} s",
        s.source,
        s.run_id
            .as_ref()
            .map(|r| format!(", run {r}"))
            .unwrap_or_default(),
        s.elapsed_ns as f64 / 1e9
    );
    println!("query: {}", s.query);
    if let Some(n) = &s.notice {
        println!("note at start: {n}");
    }
    println!(
        "cost: {} polls ({} polls/s at --poll-interval {}), {} failed{}; query time (send -> response) {}{}",
        s.polls,
        units::rate(s.polls_per_s()),
        units::duration_f64(s.poll_interval.as_nanos() as f64),
        s.poll_errors,
        s.last_error
            .as_ref()
            .map(|e| format!(" (last: {e})"))
            .unwrap_or_default(),
        spread(&s.query_time),
        s.server_elapsed
            .as_ref()
            .map(|e| format!("; the store's own query duration {}", spread(e)))
            .unwrap_or_default()
    );
    println!(
        "keys: {} found (in {} polls), {} undecodable, {} of other publishers, {} already there at start; rows {} ({} repeats of a key, {} without a key){}",
        s.keys_found,
        s.polls_with_keys,
        s.bad_keys,
        s.foreign_keys,
        s.baseline_keys,
        s.rows,
        s.rows_repeated,
        s.untraced_rows,
        if s.keys_evicted_early > 0 {
            format!("; {} keys forgotten early (set full)", s.keys_evicted_early)
        } else {
            String::new()
        }
    );
    println!(
        "bounds (the earliest instant the data can have become queryable -> this response; the queryable stamp is late by at most this): {}; {} poller(s){}{}",
        spread(&s.bracket),
        s.pollers,
        count_clause(
            s.earliest_from_store_time,
            "keys bounded by their own store time"
        ),
        count_clause(
            s.earliest_fallbacks,
            "keys no remembered poll covered (bounded by their publish stamp)"
        )
    );
    if s.reconnections > 0 {
        println!(
            "connections: {} lost and opened again (the polls they failed are among the failed polls; a poll that failed bounds nothing)",
            s.reconnections
        );
    }
    let d = &s.store_time_disagrees;
    if !d.trusted() {
        println!(
            "row times off this host's clock: {} after the response that returned them (up to {:.1} ms), {} before their publish stamp (up to {:.1} ms); from the first of them on, row times no longer bounded the queryable stamp from below",
            d.ahead,
            d.ahead_max_ns as f64 / 1e6,
            d.behind,
            d.behind_max_ns as f64 / 1e6
        );
    }
    if s.late_rows > 0 {
        println!(
            "late rows: {} keys became visible behind the newest row time already seen (up to {:.1} ms); polls ended looking {:.1} ms back",
            s.late_rows,
            s.late_max_ns as f64 / 1e6,
            s.look_back_ns as f64 / 1e6
        );
    }
    if let Some((series, resolutions, errors)) = s.series {
        println!(
            "series: {series} polled by value, resolved {resolutions} times{}",
            if errors > 0 {
                format!(" ({errors} resolutions failed)")
            } else {
                String::new()
            }
        );
    }
    if s.catch_up_ns > 0 {
        println!(
            "catch-up: {} polls looking {:.1} s back found {} keys the regular polls had missed{}",
            s.catch_up_polls,
            s.catch_up_ns as f64 / 1e9,
            s.caught_up_keys,
            if s.caught_up_keys > 0 {
                format!(
                    " (up to {:.1} ms behind the newest row time)",
                    s.caught_up_late_max_ns as f64 / 1e6
                )
            } else {
                String::new()
            }
        );
    }
    if s.publish_to_queryable.count > 0 {
        println!(
            "publish stamp -> queryable here: {}",
            spread(&s.publish_to_queryable)
        );
    }
    if let Some((host, res)) = &s.store_in {
        println!(
            "store_in: the row's own time, announced as host {host}, resolution {}{}",
            units::duration_f64(*res as f64),
            s.publish_to_store
                .as_ref()
                .filter(|p| p.count > 0)
                .map(|p| format!("; publish stamp -> store_in {}", spread(p)))
                .unwrap_or_default()
        );
    }
    for (i, (c, clean)) in s.exporters.iter().enumerate() {
        println!(
            "collector{}: stamps reported {}, delivered {}, {}; closed cleanly: {}",
            if i == 0 { "" } else { " (store clock)" },
            c.reported,
            c.sent,
            crate::collector_args::lost_line(c),
            if *clean { "yes" } else { "NO" }
        );
    }
}

/// `"; N what"` when `n` is not 0, else nothing: a clause of a summary line.
fn count_clause(n: u64, what: &str) -> String {
    if n > 0 {
        format!("; {n} {what}")
    } else {
        String::new()
    }
}
