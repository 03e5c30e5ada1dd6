//! `hoptrace demo`: a whole measurement in one process. The publisher sends traced metrics
//! through an MQTT broker (rumqttd in this process, or an external MQTT or Kafka broker)
//! to the reference pipeline's processor and store (`refpipe/`); every hop reports its
//! stamps over loopback TCP to the collector, which writes the run; the analysis then
//! writes the report (md, html, json, charts).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use hoptrace_analysis::{RunSet, report};
use hoptrace_collector::{Collector, CollectorConfig};
use hoptrace_format::spec::PipelineSpec;
use hoptrace_publisher::publish::{CollectorLink, PublishConfig, PublishSummary, Publisher};
use hoptrace_publisher::schedule::LoadShape;
use hoptrace_publisher::uns::TopicScheme;
use hoptrace_publisher::url::Endpoint;
use hoptrace_refpipe::broker::EmbeddedBroker;
use hoptrace_refpipe::processor::{Processor, ProcessorConfig, ProcessorSummary};
use hoptrace_refpipe::server::{StoreServer, StoreServerConfig, StoreServerSummary};
use hoptrace_refpipe::{DEFAULT_HOPS, ProbeLink, SimulatedHost};
use hoptrace_runner::progress::LiveLine;
use hoptrace_runner::query::{runtime, summarize};

use hoptrace_format::units;

/// Options of `hoptrace demo`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Use this broker instead of the one in this process: `mqtt://host:port` or
    /// `kafka://host:port/topic` (the topic must exist).
    #[arg(long)]
    pub broker: Option<String>,
    /// Target rate, metrics per second (open loop).
    #[arg(long, default_value = "100k", value_parser = units::parse_rate)]
    pub rate: f64,
    /// How long to publish.
    #[arg(long, default_value = "20s", value_parser = units::parse_duration)]
    pub duration: Duration,
    /// Streams (topics, or Kafka keys) the load is spread over.
    #[arg(long, default_value_t = 300)]
    pub streams: u32,
    /// Metrics carried per message (a JSON batch).
    #[arg(long, default_value_t = 20)]
    pub metrics_per_message: u32,
    /// Zipf exponent of the per-stream rates (0: uniform).
    #[arg(long, default_value_t = 1.0)]
    pub zipf: f64,
    /// The processor writes a batch once it holds this many rows...
    #[arg(long, default_value_t = 2000)]
    pub batch_rows: usize,
    /// ...or once its first row has waited this long.
    #[arg(long, default_value = "1ms", value_parser = units::parse_duration)]
    pub linger: Duration,
    /// Directory under which the run directory is written.
    #[arg(long, default_value = "runs")]
    pub runs: PathBuf,
    /// Where the report goes.
    #[arg(long, default_value = "reports/demo")]
    pub out: PathBuf,
    /// Simulate the store on another host whose clock is off by this much (e.g. -20ms):
    /// its probes read this host's clock plus the offset, and it reports a clock status
    /// of its own. Shows what clock error does to a report.
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true, value_parser = units::parse_signed_duration_ns)]
    pub store_clock_offset: Option<i64>,
    /// The error bound the simulated store host claims for its clock.
    #[arg(long, value_name = "DURATION", default_value = "1ms", value_parser = units::parse_duration_ns)]
    pub store_clock_bound: u64,
    #[command(flatten)]
    pub preflight: crate::clock::PreflightArgs,
}

/// Runs the demo and writes its report.
///
/// # Errors
/// Invalid options, a part that does not start, a report that cannot be written.
pub fn run(args: &Args) -> anyhow::Result<()> {
    if args.streams == 0 || args.metrics_per_message == 0 {
        bail!("--streams and --metrics-per-message must be positive");
    }
    let stop = crate::signals::shutdown_flag()?;
    args.preflight.check()?;
    // The broker address is checked before anything is started or written.
    let external = match &args.broker {
        None => None,
        Some(url) => Some(parse_broker(url)?),
    };
    let started = Instant::now();
    let run_id = format!("demo-{}", hoptrace_probe::clock::realtime_ns() / 1_000_000);
    let mut cfg = CollectorConfig::new("127.0.0.1:0", PipelineSpec::default_pipeline(), &args.runs);
    cfg.run_id = Some(run_id.clone());
    cfg.max_clock_error_ns = args.preflight.max_clock_error;
    let collector = Collector::start(cfg).context("starting the collector")?;
    let run_dir = collector.run_dir().to_owned();
    // Until the run is written whole, a failure removes its directory: a run that never
    // finished would only get in the way of `hoptrace sql 'runs/*'`.
    let unfinished = RemoveUnlessKept(Some(run_dir.clone()));
    let link = ProbeLink::new(collector.local_addr().to_string());

    let (endpoint, broker_line) = match external {
        None => {
            let b = EmbeddedBroker::start(1 << 20).context("starting the embedded MQTT broker")?;
            (
                Endpoint::parse(&b.url_v5())?,
                "MQTT 5 broker in this process (rumqttd)".to_owned(),
            )
        }
        Some(e) => {
            let line = format!("external broker {}", e.display());
            (e, line)
        }
    };
    // Topics of this run only, so a shared broker's other traffic stays out.
    let root = format!("hoptrace-demo/{run_id}");
    let topics = match endpoint {
        Endpoint::Mqtt(_) => vec![format!("{root}/#")],
        Endpoint::Kafka(_) => Vec::new(),
    };

    let mut store = StoreServerConfig::new("127.0.0.1:0");
    let mut store_link = link.clone();
    store_link.simulate = args.store_clock_offset.map(|offset| SimulatedHost {
        name: format!("{}-store", hoptrace_probe::exporter::hostname()),
        clock_offset_ns: offset,
        error_bound_ns: args.store_clock_bound,
    });
    store.probes = Some(store_link);
    let store = StoreServer::start(store).context("starting the store")?;
    let mut flow = ProcessorConfig::new(endpoint.clone(), store.local_addr().to_string());
    flow.topics = topics;
    flow.batch_rows = args.batch_rows;
    flow.linger = args.linger;
    flow.probes = Some(link.clone());
    let flow = Processor::start(flow).context("starting the processor")?;

    let mut shape = LoadShape::uniform(args.rate, args.streams);
    shape.metrics_per_message = args.metrics_per_message;
    shape.zipf_exponent = args.zipf;
    shape.duration = Some(args.duration);
    let mut pc = PublishConfig::new(endpoint, shape);
    pc.topics = TopicScheme::Uns {
        root: Some(root),
        seed: 1,
    };
    let mut cl = CollectorLink::new(link.collector.clone());
    cl.hop = (DEFAULT_HOPS[0].0, DEFAULT_HOPS[0].1.to_owned());
    pc.collector = Some(cl);
    let publisher = Publisher::new(pc).context("starting the publisher")?;
    eprintln!(
        "hoptrace demo: {} metrics/s ({} per message) for {:.0} s over {} streams through the {broker_line}; run {run_id}",
        units::rate(args.rate),
        args.metrics_per_message,
        args.duration.as_secs_f64(),
        args.streams
    );
    let published = publish_with_progress(publisher, &stop, &flow, &store, args.duration)?;
    let interrupted = stop.load(Relaxed);
    let settled = drain(&published, &flow, &stop);
    let flow = flow.stop(Duration::from_secs(10));
    let store = store.stop();
    let run = collector.stop().context("stopping the collector")?;
    if interrupted {
        hoptrace_runner::rundir::mark_interrupted(&run_dir.join("run.json"))?;
    }
    unfinished.keep();
    print_parts(&published, &flow, &store, settled);
    if interrupted {
        eprintln!(
            "interrupted: published for {:.1} s of the planned {:.0} s; the run and its report say so",
            published.elapsed_ns as f64 / 1e9,
            args.duration.as_secs_f64()
        );
    }
    if let Some(e) = &flow.error {
        bail!("the processor failed: {e}");
    }

    let runs = RunSet::open(&[&run_dir])?;
    let (s, hists) = summarize(&runtime()?, &runs)?;
    let written = report::write(&args.out, &s, &hists)?;
    println!();
    crate::analyze::print_summary(&s);
    println!();
    println!("Run directory: {}", run_dir.display());
    println!(
        "Report: {} (also report.html, summary.json and charts/ there); {} traces joined, demo took {:.0} s",
        written.markdown.display(),
        run.accounting
            .publishers
            .iter()
            .map(|p| p.complete + p.incomplete)
            .sum::<u64>(),
        started.elapsed().as_secs_f64()
    );
    if !s.accounting.adds_up {
        bail!("the run's accounting does not add up: see the report");
    }
    Ok(())
}

/// A broker address for `--broker`, with what the demo needs of it.
fn parse_broker(url: &str) -> anyhow::Result<Endpoint> {
    let e = Endpoint::parse(url).context("--broker")?;
    if let Endpoint::Kafka(k) = &e
        && k.topics.is_empty()
    {
        bail!(
            "--broker {url:?}: no topic; the demo publishes to and reads from the topic in the address: kafka://HOST:PORT/TOPIC (e.g. kafka://127.0.0.1:19092/hoptrace-demo)"
        );
    }
    Ok(e)
}

/// Removes a directory when dropped, unless [`RemoveUnlessKept::keep`] was called.
struct RemoveUnlessKept(Option<PathBuf>);

impl RemoveUnlessKept {
    fn keep(mut self) {
        self.0 = None;
    }
}

impl Drop for RemoveUnlessKept {
    fn drop(&mut self) {
        if let Some(dir) = self.0.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Runs the publisher to its end, with a live line on a terminal.
fn publish_with_progress(
    publisher: Publisher,
    stop: &Arc<AtomicBool>,
    flow: &Processor,
    store: &StoreServer,
    planned: Duration,
) -> anyhow::Result<PublishSummary> {
    let live = publisher.live();
    let worker = {
        let stop = Arc::clone(stop);
        std::thread::Builder::new()
            .name("publisher".into())
            .spawn(move || publisher.run(&stop))
            .context("starting the publisher thread")?
    };
    let mut line = LiveLine::new();
    line.wait_until(Duration::from_millis(100), || worker.is_finished(), |_| {
        let l = *live.lock().expect("live stats poisoned");
        let elapsed = Duration::from_nanos(l.elapsed_ns);
        format!(
            "{:>4.0}s  published {} msgs ({} metrics/s)  processed {}  stored {} rows  lag p99 {}  ETA {:.0}s",
            elapsed.as_secs_f64(),
            l.messages,
            units::rate(l.metrics as f64 / elapsed.as_secs_f64().max(1e-3)),
            flow.stats().messages.load(Relaxed),
            store.stats().rows.load(Relaxed),
            units::duration_f64(l.lag_p99_ns as f64),
            planned.saturating_sub(elapsed).as_secs_f64()
        )
    });
    line.finish();
    Ok(worker
        .join()
        .map_err(|_| anyhow::anyhow!("the publisher thread panicked"))??)
}

/// Waits until the processor has taken every message published, or nothing has moved for
/// two seconds; returns whether it took them all.
fn drain(published: &PublishSummary, flow: &Processor, stop: &AtomicBool) -> bool {
    let mut last = (u64::MAX, Instant::now());
    loop {
        let taken = flow.stats().messages.load(Relaxed);
        if taken >= published.messages || flow.has_failed() || stop.load(Relaxed) {
            return taken >= published.messages;
        }
        if taken != last.0 {
            last = (taken, Instant::now());
        } else if last.1.elapsed() > Duration::from_secs(2) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn print_parts(p: &PublishSummary, f: &ProcessorSummary, s: &StoreServerSummary, settled: bool) {
    println!(
        "publisher: {} messages, {} metrics in {:.1} s (kept up with the schedule: {:.4}; lag p99 {})",
        p.messages,
        p.metrics,
        p.elapsed_ns as f64 / 1e9,
        p.keep_up_ratio(),
        p.lag
            .at(0.99)
            .map_or_else(|| "-".into(), |q| units::duration_f64(q.value_ns as f64))
    );
    println!(
        "processor: {} messages taken{} ({} traced, {} bad payloads), {} rows in {} writes, {} acknowledged",
        f.messages,
        if settled {
            ""
        } else {
            " (NOT every message published reached it)"
        },
        f.traced,
        f.bad_payloads,
        f.rows,
        f.writes,
        f.acked
    );
    println!(
        "store: {} rows in {} writes, {} not visible to their query, {} rows held, {} series",
        s.rows, s.writes, s.invisible_writes, s.store.rows_held, s.store.series
    );
}
