//! `hoptrace relay` and `hoptrace collect --from kafka://...`: collectors as a Kafka
//! consumer group (the member itself is `hoptrace_runner::scaleout`).

pub use hoptrace_cli::relay::RelayArgs;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use hoptrace_collector::kafka::{RecordsTopic, Relay, RelayConfig};
use hoptrace_format::spec::PipelineSpec;

use hoptrace_cli::progress::LiveLine;
use hoptrace_runner::scaleout::{self, MemberOptions};

/// Runs a relay until SIGINT/SIGTERM (or `--duration-s`).
///
/// # Errors
/// A bad target or spec, Kafka unreachable, a bind failure.
pub fn relay(args: &RelayArgs) -> anyhow::Result<()> {
    let stop = hoptrace_cli::signals::shutdown_flag()?;
    let target = RecordsTopic::parse(&args.to)?;
    let mut cfg = RelayConfig::new(
        args.listen.clone(),
        hoptrace_cli::collect::load_spec(args.pipeline.as_deref())?,
        target.clone(),
        args.run_id.clone(),
    );
    cfg.partitions = args.partitions;
    cfg.replication = args.replication;
    args.listener
        .apply(&mut cfg.token, &mut cfg.tls_cert, &mut cfg.tls_key);
    let relay = Relay::start(cfg).context("starting the relay")?;
    eprintln!(
        "relaying probes on {} to {} (SIGINT or SIGTERM stops and flushes)",
        relay.local_addr(),
        args.to
    );
    let started = Instant::now();
    let deadline = args.duration.map(|d| started + d);
    // A plain line every second where stderr is a log.
    let mut live = LiveLine::with_plain_every(Some(Duration::from_secs(1)));
    let mut last = relay.stats();
    live.wait_while_running(
        &stop,
        Duration::from_millis(200),
        || deadline.is_some_and(|d| Instant::now() >= d),
        |since| {
            let s = relay.stats();
            let line = format!(
                "{:>6.0}s  {:>9.0} records/s  records {}  delivered {}  failed {}  probes {}",
                started.elapsed().as_secs_f64(),
                s.records.saturating_sub(last.records) as f64 / since.as_secs_f64(),
                s.records,
                s.delivered_records,
                s.failed_records,
                s.connections
            );
            last = s;
            line
        },
    );
    live.finish();
    eprintln!("stopping: waiting for probes to say goodbye, then flushing to Kafka");
    let s = relay.stop().context("stopping the relay")?;
    println!(
        "relayed {} records in {} Kafka messages to {}: delivered {}, failed {}",
        s.records, s.messages, target.topic, s.delivered_records, s.failed_records
    );
    for (p, n) in &s.records_by_partition {
        println!("  partition {p}: {n} records");
    }
    for (reason, n) in s.closed_connections.iter().filter(|(_, n)| **n > 0) {
        println!("  connections refused or closed, {reason}: {n}");
    }
    Ok(())
}

/// `hoptrace collect --from kafka://...`: one member of the collectors' group.
///
/// # Errors
/// A bad target, Kafka unreachable, a file that cannot be written.
pub fn collect_group(
    args: &crate::collect::Args,
    from: &str,
    spec: PipelineSpec,
    stop: &Arc<AtomicBool>,
) -> anyhow::Result<()> {
    let run_id = args.run_id.clone().context("--from needs --run-id")?;
    let opts = MemberOptions {
        from: from.to_owned(),
        group: args.group.clone(),
        member: args.member.clone(),
        spec,
        runs: args.runs.clone(),
        run_id: run_id.clone(),
        commit_interval: args.commit_interval,
        duration: args.duration,
    };
    let started = Instant::now();
    let mut last = (Instant::now(), 0u64, 0u64);
    // The member reports once a second: every report is shown.
    let mut live = LiveLine::new();
    let o = scaleout::collect_group(&opts, stop, |p| {
        let secs = last.0.elapsed().as_secs_f64().max(1e-3);
        live.show(&format!(
            "{:>6.0}s  {:>9.0} records/s  {:>9.0} traces/s  partitions {:?}  pending {}  commits {}  rebalances {}  bad messages {}",
            started.elapsed().as_secs_f64(),
            p.records.saturating_sub(last.1) as f64 / secs,
            p.traces.saturating_sub(last.2) as f64 / secs,
            p.partitions,
            p.pending,
            p.commits,
            p.rebalances,
            p.bad_messages + p.bad_control_messages
        ));
        last = (Instant::now(), p.records, p.traces);
    });
    live.finish();
    let o = o?;
    println!(
        "member {} of run {run_id} written to {}; `hoptrace report {}` reads every member as one run",
        o.member,
        o.dir.display(),
        args.runs.join(&run_id).display()
    );
    for line in hoptrace_cli::collect::text::accounting_lines(&o.run) {
        println!("{line}");
    }
    if let Some(g) = o
        .run
        .group
        .as_ref()
        .filter(|g| g.bad_messages + g.bad_control_messages > 0)
    {
        println!(
            "skipped Kafka messages that are not hoptrace frames: {} on the records topic, {} on the control topic",
            g.bad_messages, g.bad_control_messages
        );
    }
    Ok(())
}
