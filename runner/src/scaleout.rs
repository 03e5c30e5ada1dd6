//! A collector as one member of a Kafka consumer group (`hoptrace collect --from`): it
//! reads the records a relay wrote, joins the traces of its partitions and writes its own
//! files under `<runs>/<run id>/members/<member>/`; the analysis reads every member as
//! one run.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use hoptrace_broker::kafka;
use hoptrace_collector::RunSummary;
use hoptrace_collector::kafka::{MemberConfig, MemberProgress, RecordsTopic, run_member};
use hoptrace_format::spec::PipelineSpec;

/// What a member reads and where it writes.
#[derive(Debug, Clone)]
pub struct MemberOptions {
    /// The records topic: `kafka://HOST:PORT[,HOST:PORT...]/TOPIC`.
    pub from: String,
    /// The consumer group of the collectors.
    pub group: String,
    /// This member's name (default: host name and process id).
    pub member: Option<String>,
    /// The pipeline spec.
    pub spec: PipelineSpec,
    /// Folder of the run directory.
    pub runs: PathBuf,
    /// The run id.
    pub run_id: String,
    /// Time between checkpoints (files closed, offsets committed); at least 100 ms.
    pub commit_interval: Duration,
    /// Stop by itself after this long.
    pub duration: Option<Duration>,
}

/// What a member ends with.
#[derive(Debug)]
pub struct MemberOutcome {
    /// Its name.
    pub member: String,
    /// Where it wrote its files.
    pub dir: PathBuf,
    /// What it wrote to its `run.json`.
    pub run: RunSummary,
}

/// Runs one member until `stop` (or its duration): checks the broker and the topics
/// first (so a broker that is not there is an error at once, and only a stop cuts the
/// wait short), then reads, joins and writes. `on_progress` sees its figures about once
/// a second.
///
/// # Errors
/// A bad address, Kafka unreachable, a missing topic, a file that cannot be written.
pub fn collect_group(
    opts: &MemberOptions,
    stop: &Arc<AtomicBool>,
    on_progress: impl FnMut(&MemberProgress),
) -> anyhow::Result<MemberOutcome> {
    let target = RecordsTopic::parse(&opts.from)?;
    let member = opts
        .member
        .clone()
        .unwrap_or_else(|| format!("{}-{}", hoptrace_clock::hostname(), std::process::id()));
    let mut cfg = MemberConfig::new(
        target,
        opts.group.clone(),
        member.clone(),
        opts.spec.clone(),
        opts.runs.clone(),
        opts.run_id.clone(),
    );
    cfg.commit_interval = opts.commit_interval.max(Duration::from_millis(100));
    // Before the clock of the duration starts.
    kafka::check_topics(
        &cfg.target.brokers,
        &[&cfg.target.topic, &cfg.target.control_topic()],
        stop,
        kafka::BROKER_WAIT,
    )
    .context("collecting from Kafka")?;
    let dir = opts.runs.join(&opts.run_id).join("members").join(&member);
    eprintln!(
        "collecting from {} as member {member} of group {} into {} (SIGINT or SIGTERM stops and flushes)",
        opts.from,
        opts.group,
        dir.display()
    );
    let deadline = opts.duration.map(|d| Instant::now() + d);
    let stop_all = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (stop, stop_all) = (Arc::clone(stop), Arc::clone(&stop_all));
        std::thread::spawn(move || {
            // Until a stop request, the duration, or the member's own end.
            while !stop.load(Ordering::Relaxed)
                && !stop_all.load(Ordering::Relaxed)
                && deadline.is_none_or(|d| Instant::now() < d)
            {
                std::thread::sleep(Duration::from_millis(100));
            }
            stop_all.store(true, Ordering::Relaxed);
        })
    };
    let run = run_member(&cfg, &stop_all, on_progress).context("collecting from Kafka");
    stop_all.store(true, Ordering::Relaxed);
    let _ = watcher.join();
    Ok(MemberOutcome {
        member,
        dir,
        run: run?,
    })
}
