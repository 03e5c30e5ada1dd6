//! `hoptrace collect` and `hoptrace generate-config`.

pub use hoptrace_cli::collect::{CollectArgs as Args, DEFAULT_LISTEN};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use hoptrace_collector::metrics::MetricsServer;
use hoptrace_collector::{Collector, CollectorConfig};
use hoptrace_format::spec::{DEFAULT_PIPELINE_TOML, PipelineSpec};

use hoptrace_format::units;
use hoptrace_runner::progress::LiveLine;

use crate::clock::Preflight as _;

/// The pipeline spec at `path`, or the built-in default pipeline without one.
///
/// # Errors
/// A file that does not read or is not a valid spec (the error names the file).
pub fn load_spec(path: Option<&std::path::Path>) -> anyhow::Result<PipelineSpec> {
    let Some(p) = path else {
        return Ok(PipelineSpec::default_pipeline());
    };
    let spec = PipelineSpec::load(p).with_context(|| format!("pipeline spec {}", p.display()))?;
    for w in spec.warnings() {
        eprintln!("warning: pipeline spec {}: {w}", p.display());
    }
    Ok(spec)
}

/// Runs a collector until SIGINT/SIGTERM (or `--duration-s`), then flushes every file,
/// writes `run.json` and prints the accounting.
///
/// # Errors
/// A bad spec, a bind failure, a write failure.
pub fn run(args: &Args) -> anyhow::Result<()> {
    // First of all, so a signal that arrives while starting still flushes and exits cleanly.
    let stop = crate::signals::shutdown_flag()?;
    let spec = load_spec(args.pipeline.as_deref())?;
    if let Some(from) = &args.from {
        refuse_listener_options(args)?;
        if let Some(id) = &args.run_id {
            hoptrace_runner::rundir::check_group(&args.runs.join(id), &spec)?;
        }
        args.preflight.check()?;
        return crate::scaleout::collect_group(args, from, spec, &stop);
    }
    args.preflight.check()?;
    let mut run_id = args.run_id.clone();
    if run_id.is_none() {
        run_id = unfinished_runs(args, &spec)?;
    }
    if let Some(id) = &run_id {
        hoptrace_runner::rundir::check(&args.runs.join(id), &spec, args.continue_run)?;
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
    if let Some(r) = collector.continued() {
        eprintln!(
            "continuing run {} from its log: a collector was stopped without closing it; {}replayed {} entries ({}) in {:.1} s{}, probes send again what it had not acknowledged",
            collector
                .run_dir()
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
            r.checkpoint_unix_ns.map_or_else(String::new, |t| format!(
                "took up its checkpoint of {}, ",
                units::utc_iso(t)
            )),
            r.log_entries,
            units::bytes(r.log_bytes),
            r.replay_ms as f64 / 1e3,
            if r.torn_bytes > 0 {
                format!(
                    "; {} half-written at the end, never acknowledged, skipped",
                    units::bytes(r.torn_bytes)
                )
            } else {
                String::new()
            }
        );
    }
    if let Some(r) = collector.recovered() {
        eprintln!(
            "recovered: {} complete file(s) with {} rows kept from an earlier collector in this run directory",
            r.files, r.rows
        );
        for (name, bytes) in &r.unfinished {
            eprintln!(
                "recovered: {name} ({bytes} bytes) was left open by a killed collector: its rows (one row group at most) are lost; set aside as .unfinished"
            );
        }
        for (name, err) in &r.corrupt {
            eprintln!("recovered: {name} does not read ({err}); set aside as .corrupt");
        }
    }
    let servers = serve(&collector, args)?;

    let started = Instant::now();
    let deadline = args.duration.map(|d| started + d);
    // A plain line every second where stderr is a log.
    let mut live = LiveLine::with_plain_every(Some(Duration::from_secs(1)));
    let mut last = collector.progress();
    live.wait_while_running(
        &stop,
        Duration::from_millis(200),
        || deadline.is_some_and(|d| Instant::now() >= d),
        |since| {
            let p = collector.progress();
            let secs = since.as_secs_f64();
            let traces =
                (p.complete + p.incomplete).saturating_sub(last.complete + last.incomplete);
            let mut line = format!(
                "{:>6.0}s  {:>9.0} traces/s  {:>9.0} records/s  complete {}  incomplete {}  pending {}  probes {}",
                started.elapsed().as_secs_f64(),
                traces as f64 / secs,
                p.records.saturating_sub(last.records) as f64 / secs,
                p.complete,
                p.incomplete,
                p.pending,
                p.connections
            );
            if p.pending > 0 && p.complete + p.incomplete == 0 {
                // Records arrive from the start, traces only once complete or at the end
                // of their join window: say so rather than show 0 traces/s unexplained.
                line.push_str(&format!(
                    "  (waiting in the join: a trace is written when its last hop arrives, or incomplete after the join window of {})",
                    units::duration_f64(join_window.as_nanos() as f64)
                ));
            }
            for (stage, p50, p99) in &p.stages {
                line.push_str(&format!(
                    "  {stage} p50 {} p99 {}",
                    units::duration_f64(*p50 as f64),
                    units::duration_f64(*p99 as f64)
                ));
            }
            last = p;
            line
        },
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
    print_accounting(&summary);
    Ok(())
}

/// Starts the HTTP servers of `--metrics` and `--ui`: one when both name the same address
/// (or only one is given), two otherwise. They read the collector's figures through a
/// [`hoptrace_collector::run::Watch`], so they can answer until after it stopped.
///
/// # Errors
/// An address cannot be bound.
fn serve(collector: &Collector, args: &Args) -> anyhow::Result<Vec<MetricsServer>> {
    let mut servers = Vec::new();
    if let Some(addr) = &args.ui {
        let server = start_ui(collector, addr, args.target_rate)?;
        if args.metrics.as_ref() == Some(addr) {
            eprintln!("metrics on http://{}/metrics", server.local_addr());
        }
        servers.push(server);
    }
    if let Some(addr) = args
        .metrics
        .as_ref()
        .filter(|m| args.ui.as_ref() != Some(*m))
    {
        let w = collector.watch();
        let server = MetricsServer::start(addr, std::sync::Arc::new(move || w.progress()))
            .with_context(|| format!("serving metrics on {addr}"))?;
        eprintln!("metrics on http://{}/metrics", server.local_addr());
        servers.push(server);
    }
    Ok(servers)
}

/// Serves the live view of `collector` (and `/metrics`, `/progress.json`) on `addr`,
/// showing `target_rate` (metrics per second) as the target, and says where on stderr.
///
/// # Errors
/// The address cannot be bound.
fn start_ui(
    collector: &Collector,
    addr: &str,
    target_rate: Option<f64>,
) -> anyhow::Result<MetricsServer> {
    let server = MetricsServer::start_live(addr, &collector.watch(), target_rate)
        .with_context(|| format!("serving the live view on {addr}"))?;
    eprintln!("live view on http://{}/", server.local_addr());
    Ok(server)
}

/// For a collector started without `--run-id`: the unfinished runs under `--runs` (their
/// collector was stopped without closing them: their log, `wal/`, is still there). With
/// `--resume`, the id of the newest one of this pipeline, to continue; without, each is
/// named with the command that continues it, and the collector starts a new run (`None`).
///
/// # Errors
/// `--resume` and no unfinished run of this pipeline.
fn unfinished_runs(args: &Args, spec: &PipelineSpec) -> anyhow::Result<Option<String>> {
    let resolved = hoptrace_format::spec::ResolvedSpec::new(spec)?;
    let ours: Vec<(u8, String)> = resolved
        .hop_ids()
        .iter()
        .zip(resolved.hop_names())
        .map(|(id, name)| (id.0, name.clone()))
        .collect();
    // (modified, id, of this pipeline)
    let mut found: Vec<(std::time::SystemTime, String, bool)> = std::fs::read_dir(&args.runs)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let wal = e.path().join(hoptrace_collector::wal::WAL_DIR);
            let modified = std::fs::metadata(&wal).ok()?.modified().ok()?;
            let id = e.file_name().into_string().ok()?;
            let theirs = hoptrace_collector::wal::hops(&e.path()).ok().flatten();
            Some((modified, id, theirs.is_none_or(|t| t == ours)))
        })
        .collect();
    found.sort();
    if args.resume {
        let Some((_, id, _)) = found.iter().rev().find(|(_, _, ours)| *ours) else {
            bail!(
                "--resume: no unfinished run of this pipeline under {} (an unfinished run is one whose collector was stopped without closing it: its wal/ is still there); start without --resume for a new run",
                args.runs.display()
            );
        };
        eprintln!(
            "resuming the unfinished run {id} under {} (--resume)",
            args.runs.display()
        );
        return Ok(Some(id.clone()));
    }
    for (_, id, ours) in &found {
        let dir = args.runs.join(id);
        if *ours {
            eprintln!(
                "warning: {} is an unfinished run: its collector was stopped without closing it, and its log ({}/wal/) is still there. To continue it with nothing lost, start this collector with --run-id {id} (or --resume); this one starts a new run",
                dir.display(),
                dir.display()
            );
        } else {
            eprintln!(
                "warning: {} is an unfinished run of another pipeline (its log, {}/wal/, names other hops): to continue it, start a collector with that run's pipeline spec and --run-id {id}",
                dir.display(),
                dir.display()
            );
        }
    }
    Ok(None)
}

/// `collect --from` reads Kafka and listens for nobody: the options of a listener would be
/// silently ignored, so they are refused. Values that only come from the environment
/// (`HOPTRACE_TOKEN`, ...) are not the user's request here and pass.
fn refuse_listener_options(args: &Args) -> anyhow::Result<()> {
    let from_env =
        |var: &str, value: Option<String>| value.is_none() || std::env::var(var).ok() == value;
    let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
    let given: Vec<&str> = [
        ("--listen", args.listen.is_some()),
        ("--no-log", args.no_log),
        ("--resume", args.resume),
        ("--metrics", args.metrics.is_some()),
        ("--ui", args.ui.is_some()),
        (
            "--token",
            !from_env("HOPTRACE_TOKEN", args.listener.token.clone()),
        ),
        (
            "--tls-cert",
            !from_env("HOPTRACE_TLS_CERT", path(&args.listener.tls_cert)),
        ),
        (
            "--tls-key",
            !from_env("HOPTRACE_TLS_KEY", path(&args.listener.tls_key)),
        ),
    ]
    .into_iter()
    .filter_map(|(name, set)| set.then_some(name))
    .collect();
    if !given.is_empty() {
        bail!(
            "{} cannot be used with --from: a collector reading Kafka takes no probe connections; give {} to `hoptrace relay`, which does",
            given.join(", "),
            if given.len() == 1 { "it" } else { "them" }
        );
    }
    Ok(())
}

/// Prints a run's accounting and files.
pub fn print_accounting(summary: &hoptrace_collector::RunSummary) {
    let a = &summary.accounting;
    for p in &a.publishers {
        let holds = p.sent == p.complete + p.incomplete + p.recovered + p.unseen;
        println!(
            "publisher {}: sent {} {} complete {} + incomplete {}{} + unseen {}{}",
            p.publisher,
            p.sent,
            if holds { "=" } else { "!=" },
            p.complete,
            p.incomplete,
            if p.recovered > 0 {
                format!(
                    " + recovered {} (in the part files of an earlier collector)",
                    p.recovered
                )
            } else {
                String::new()
            },
            p.unseen,
            if p.not_sent > 0 {
                format!(" ({} traces of keys it never reported sending)", p.not_sent)
            } else {
                String::new()
            }
        );
    }
    for (hop, n) in &a.missing_by_hop {
        println!("  incomplete, missing {hop}: {n}");
    }
    println!(
        "records lost by probes {}, duplicate traces {}, negative deltas {}, late records {}, in flight {}; counts add up: {}",
        a.records_lost_by_probes,
        a.duplicate_traces,
        a.negative_delta_traces,
        a.late_records,
        a.in_flight,
        if a.adds_up
            && a.publishers
                .iter()
                .all(|p| p.sent == p.complete + p.incomplete + p.recovered + p.unseen)
        {
            "yes"
        } else {
            "NO"
        }
    );
    for d in &a.discrepancies {
        println!("  does not add up: {d}");
    }
    let dropped = [
        ("records of unannounced hops", a.unannounced_hop_records),
        ("records with implausible stamps", a.implausible_records),
        (
            "traces with implausible intended times (flagged)",
            a.implausible_traces,
        ),
        ("records of undeclared hops", a.unknown_hop_records),
    ];
    for (what, n) in dropped.into_iter().filter(|(_, n)| *n > 0) {
        println!("  {what}: {n}");
    }
    for (i, r) in summary.restarts.iter().enumerate() {
        println!(
            "restart {} at {}: from {}, replayed {} log entries in {:.1} s ({} hop records held), skipped a half-written tail of {}; {} records sent again were already held (dropped)",
            i + 1,
            units::utc_iso(r.at_unix_ns),
            r.checkpoint_unix_ns.map_or_else(
                || "the run's start".to_owned(),
                |t| format!("the checkpoint of {}", units::utc_iso(t))
            ),
            r.log_entries,
            r.replay_ms as f64 / 1e3,
            r.records_replayed,
            units::bytes(r.torn_bytes),
            r.resent_records_dropped
        );
    }
    let v1: Vec<String> = summary
        .probes
        .iter()
        .filter(|p| p.durable == Some(false))
        .map(|p| format!("{}/{}", p.host, p.process))
        .collect();
    if !v1.is_empty() {
        println!(
            "  not durable (protocol version 1: nothing acknowledged or kept to send again): {}",
            v1.join(", ")
        );
    }
    let rows: u64 = summary.files.iter().map(|f| f.rows).sum();
    let bytes: u64 = summary.files.iter().map(|f| f.bytes).sum();
    println!(
        "{} parquet file(s), {rows} rows, {bytes} bytes",
        summary.files.len()
    );
}

/// Prints the commented default pipeline spec.
pub fn generate_config() {
    print!("{DEFAULT_PIPELINE_TOML}");
}
