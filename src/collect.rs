//! `hoptrace collect` and `hoptrace generate-config`.

use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use hoptrace_collector::metrics::{MetricsServer, render};
use hoptrace_collector::spec::{DEFAULT_PIPELINE_TOML, PipelineSpec};
use hoptrace_collector::{Collector, CollectorConfig};

/// How a probe reaches a collector that speaks TLS (`hoptrace collect --tls-cert`).
#[derive(Debug, Clone, clap::Args)]
pub struct CollectorTlsArgs {
    /// Speak TLS to the collector, trusting the CA certificates of this PEM file.
    #[arg(long, env = "HOPTRACE_COLLECTOR_CA")]
    pub collector_ca: Option<PathBuf>,
    /// The name the collector's certificate carries (default: the host of --collector).
    #[arg(long, requires = "collector_ca")]
    pub collector_tls_name: Option<String>,
}

/// Options of `hoptrace collect`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Address to listen on for probes. Any non-loopback address requires --token.
    #[arg(long, default_value = "127.0.0.1:7400")]
    pub listen: String,
    /// Pipeline spec (TOML); `hoptrace generate-config` prints a commented default.
    /// Without it, that default is used.
    #[arg(long)]
    pub pipeline: Option<PathBuf>,
    /// Directory under which the run directory `<run-id>/` is created.
    #[arg(long, default_value = "runs")]
    pub out: PathBuf,
    /// Run id (default: run-<UTC time>).
    #[arg(long)]
    pub run_id: Option<String>,
    /// Token probes must present.
    #[arg(long, env = "HOPTRACE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Serve TLS with this certificate chain (PEM); every probe must then connect with
    /// --collector-ca. Needs --tls-key.
    #[arg(long, env = "HOPTRACE_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, env = "HOPTRACE_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Stop by itself after this many seconds (default: run until SIGINT/SIGTERM).
    #[arg(long)]
    pub duration_s: Option<u64>,
    /// Serve Prometheus metrics at http://ADDR/metrics.
    #[arg(long)]
    pub metrics: Option<String>,
    #[command(flatten)]
    pub preflight: crate::clock::PreflightArgs,
    /// Read probe records from Kafka instead of listening
    /// (kafka://HOST:PORT[,HOST:PORT...]/TOPIC, written by `hoptrace relay`): this
    /// collector joins the consumer group --group and writes its own files under
    /// <out>/<run-id>/members/<member>/; the analysis reads all members as one run.
    #[arg(long, value_name = "KAFKA_URL", requires = "run_id")]
    pub from: Option<String>,
    /// Consumer group of the collectors reading --from.
    #[arg(long, default_value = "hoptrace-collectors", requires = "from")]
    pub group: String,
    /// This collector's name in the group (default: host name and process id).
    #[arg(long, requires = "from")]
    pub member: Option<String>,
    /// Seconds between checkpoints (files closed, offsets committed) with --from.
    #[arg(long, default_value_t = 5, requires = "from")]
    pub commit_interval_s: u64,
}

/// The pipeline spec at `path`, or the built-in default pipeline without one.
///
/// # Errors
/// A file that does not read or is not a valid spec (the error names the file).
pub fn load_spec(path: Option<&std::path::Path>) -> anyhow::Result<PipelineSpec> {
    match path {
        Some(p) => PipelineSpec::load(p).with_context(|| format!("pipeline spec {}", p.display())),
        None => Ok(PipelineSpec::default_pipeline()),
    }
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
        return crate::scaleout::collect_group(args, from, spec, &stop);
    }
    let mut cfg = CollectorConfig::new(&args.listen, spec, &args.out);
    cfg.run_id.clone_from(&args.run_id);
    cfg.token.clone_from(&args.token);
    cfg.tls_cert.clone_from(&args.tls_cert);
    cfg.tls_key.clone_from(&args.tls_key);
    args.preflight.check()?;
    cfg.max_clock_error_ns = args.preflight.max_clock_error;
    let collector = std::sync::Arc::new(Collector::start(cfg).context("starting the collector")?);
    eprintln!(
        "collecting on {}{} into {} (SIGINT or SIGTERM stops and flushes)",
        collector.local_addr(),
        if args.tls_cert.is_some() {
            " (TLS)"
        } else {
            ""
        },
        collector.run_dir().display()
    );
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
    let _metrics = match &args.metrics {
        Some(addr) => {
            let c = std::sync::Arc::clone(&collector);
            let server =
                MetricsServer::start(addr, std::sync::Arc::new(move || render(&c.progress())))
                    .with_context(|| format!("serving metrics on {addr}"))?;
            eprintln!("metrics on http://{}/metrics", server.local_addr());
            Some(server)
        }
        None => None,
    };

    let started = Instant::now();
    let deadline = args.duration_s.map(|s| started + Duration::from_secs(s));
    let tty = std::io::stderr().is_terminal();
    let mut last = collector.progress();
    let mut last_at = Instant::now();
    while !stop.load(Ordering::Relaxed) && deadline.is_none_or(|d| Instant::now() < d) {
        std::thread::sleep(Duration::from_millis(200));
        if last_at.elapsed() >= Duration::from_secs(1) {
            let p = collector.progress();
            let secs = last_at.elapsed().as_secs_f64();
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
            for (stage, p50, p99) in &p.stages {
                line.push_str(&format!(
                    "  {stage} p50 {} p99 {}",
                    crate::units::fmt_ns(*p50 as f64),
                    crate::units::fmt_ns(*p99 as f64)
                ));
            }
            if tty {
                eprint!("\r{line}   ");
            } else {
                eprintln!("{line}");
            }
            last = p;
            last_at = Instant::now();
        }
    }
    if tty {
        eprintln!();
    }
    eprintln!("stopping: waiting for probes to flush, then closing every file");
    drop(_metrics);
    let collector = std::sync::Arc::try_unwrap(collector)
        .map_err(|_| anyhow::anyhow!("the metrics server still holds the collector"))?;
    let summary = collector.stop().context("stopping the collector")?;
    println!(
        "run {} written to {}",
        summary.run_id,
        args.out.join(&summary.run_id).display()
    );
    print_accounting(&summary);
    Ok(())
}

/// Prints a run's accounting and files.
pub fn print_accounting(summary: &hoptrace_collector::RunSummary) {
    let a = &summary.accounting;
    for p in &a.publishers {
        let holds = p.sent == p.complete + p.incomplete + p.unseen;
        println!(
            "publisher {}: sent {} {} complete {} + incomplete {} + unseen {}{}",
            p.publisher,
            p.sent,
            if holds { "=" } else { "!=" },
            p.complete,
            p.incomplete,
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
        if a.adds_up { "yes" } else { "NO" }
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
