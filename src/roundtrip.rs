//! `hoptrace roundtrip`: the probe path end to end on one machine.
//!
//! A publisher thread sends messages on an open-loop schedule through a chain of hop
//! threads; every message is an enveloped byte buffer that each hop unwraps, stamps and
//! wraps again, exactly as a processor embedding the probe would. Every stamp is also
//! reported out of band through a real exporter over loopback TCP to an in-process
//! collector, which joins the stamps per message, writes the run directory (Parquet,
//! run.json, HDR interval logs) and yields per-stage HDR percentiles and the accounting.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use hoptrace_collector::{Collector, CollectorConfig, RunSummary};
use hoptrace_format::spec::PipelineSpec;
use hoptrace_probe::carrier::envelope;
use hoptrace_probe::protocol::{self, Frame, SentEntry, SentFrame};
use hoptrace_probe::{
    CounterSnapshot, Exporter, ExporterConfig, HopId, OffsetClock, SystemClock, TraceContext,
    TraceKey,
};

use hoptrace_format::units;
use hoptrace_runner::progress::LiveLine;

/// Options of `hoptrace roundtrip`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Messages to send.
    #[arg(long, default_value = "200k", value_parser = units::parse_count)]
    pub messages: u64,
    /// Target rate, metrics per second (open loop), as in every command: messages go out
    /// at --rate / --metrics-per-message per second.
    #[arg(long, default_value = "50k", value_parser = units::parse_rate)]
    pub rate: f64,
    /// Streams the messages are spread over.
    #[arg(long, default_value_t = 100)]
    pub streams: u32,
    /// Metrics carried per message.
    #[arg(long, default_value_t = 1)]
    pub metrics_per_message: u32,
    /// Hops in order; a stage is measured between each pair of neighbours, and in total.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "publish,broker,flow_in,flow_out,store_in"
    )]
    pub hops: Vec<String>,
    /// Simulate a skewed clock on the last hop's host (`-2ms`: behind, `+500us`: ahead).
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true, value_parser = units::parse_signed_duration_ns, conflicts_with = "last_hop_skew_ns")]
    pub last_hop_skew: Option<i64>,
    /// The same in plain nanoseconds (the older spelling).
    #[arg(long, hide = true, allow_hyphen_values = true)]
    pub last_hop_skew_ns: Option<i64>,
    /// Payload bytes per message.
    #[arg(long, default_value_t = 100)]
    pub payload_bytes: usize,
    /// Folder under which the run directory is written.
    #[arg(long, alias = "out", value_name = "DIR", default_value = "runs")]
    pub runs: PathBuf,
}

impl Args {
    fn skew_ns(&self) -> i64 {
        self.last_hop_skew.or(self.last_hop_skew_ns).unwrap_or(0)
    }

    /// Messages per second.
    fn message_rate(&self) -> f64 {
        self.rate / f64::from(self.metrics_per_message.max(1))
    }
}

/// Runs the roundtrip and prints its report.
///
/// # Errors
/// Invalid options, or a failure of the receiver or the exporter.
pub fn run(args: &Args) -> anyhow::Result<()> {
    ensure!(args.hops.len() >= 2, "--hops needs at least two hops");
    ensure!(args.hops.len() <= 16, "--hops allows at most 16 hops");
    ensure!(args.streams > 0, "--streams must be positive");
    ensure!(
        args.metrics_per_message > 0,
        "--metrics-per-message must be positive"
    );
    let hops: Vec<(HopId, &str)> = args
        .hops
        .iter()
        .enumerate()
        .map(|(i, n)| (HopId(i as u8), n.as_str()))
        .collect();

    let spec = PipelineSpec::chain("roundtrip", &args.hops).context("--hops")?;
    let mut cfg = CollectorConfig::new("127.0.0.1:0", spec, &args.runs);
    cfg.run_id = Some(format!(
        "roundtrip-{}",
        hoptrace_probe::clock::realtime_ns() / 1_000_000
    ));
    let collector = Collector::start(cfg).context("starting the collector")?;
    let exporter = Exporter::start(
        ExporterConfig::new(collector.local_addr().to_string(), "hoptrace-roundtrip"),
        &hops,
    )
    .context("starting the exporter")?;
    let started = Instant::now();
    let sent = drive(args, &exporter, &hops)?;
    let elapsed = started.elapsed();
    let exported = exporter.shutdown();
    let run_dir = collector.run_dir().to_owned();
    let summary = collector.stop().context("stopping the collector")?;
    print_report(args, &summary, sent, elapsed, &exported.counters);
    println!("Run directory: {}", run_dir.display());
    Ok(())
}

/// Publisher and hop threads; returns the messages sent.
fn drive(args: &Args, exporter: &Exporter, hops: &[(HopId, &str)]) -> anyhow::Result<u64> {
    let mut senders = Vec::new();
    let mut receivers = Vec::new();
    for _ in 1..hops.len() {
        let (tx, rx) = mpsc::sync_channel::<Vec<u8>>(1 << 16);
        senders.push(tx);
        receivers.push(rx);
    }
    let mut handles = Vec::new();
    let last = hops.len() - 1;
    for (i, rx) in receivers.into_iter().enumerate() {
        let hop = hops[i + 1].0;
        let skew = if i + 1 == last { args.skew_ns() } else { 0 };
        let probe = exporter.probe_with_clock(hop, OffsetClock::new(SystemClock, skew))?;
        let next = senders.get(i + 1).cloned();
        handles.push(std::thread::spawn(move || {
            let mut out = Vec::with_capacity(512);
            for msg in rx {
                let Ok((extracted, payload)) = probe.counted(envelope::unwrap(&msg)) else {
                    continue;
                };
                let mut ctx = extracted.context;
                let _ = probe.record(&mut ctx);
                if let Some(next) = &next {
                    out.clear();
                    envelope::wrap_into(&ctx, payload, &mut out);
                    if next.send(out.clone()).is_err() {
                        break;
                    }
                }
            }
        }));
    }
    let first = senders.remove(0);
    drop(senders);

    let publish = exporter.probe(hops[0].0)?;
    let payload = vec![b'x'; args.payload_bytes];
    let period_ns = 1e9 / args.message_rate();
    let start_ns = publish.now_ns();
    let start = Instant::now();
    let mut per_stream: HashMap<u32, SentEntry> = HashMap::new();
    let mut seqs = vec![0u64; args.streams as usize];
    let mut sent = 0u64;
    let mut live = LiveLine::new();
    for i in 0..args.messages {
        let offset_ns = (i as f64 * period_ns) as u64;
        let intended = start_ns + offset_ns as i64;
        // Open loop: wait for the intended time, never for the pipeline.
        let due = start + Duration::from_nanos(offset_ns);
        while Instant::now() < due {
            std::hint::spin_loop();
        }
        let stream = (i % u64::from(args.streams)) as u32;
        let seq = seqs[stream as usize];
        seqs[stream as usize] += 1;
        let mut ctx = TraceContext::new(
            TraceKey {
                publisher: 1,
                stream,
                sequence: seq,
            },
            args.metrics_per_message,
            intended,
        );
        let _ = publish.record(&mut ctx);
        first
            .send(envelope::wrap(&ctx, &payload))
            .context("the first hop stopped")?;
        sent += 1;
        let e = per_stream.entry(stream).or_insert(SentEntry {
            stream,
            first_sequence: seq,
            ..SentEntry::default()
        });
        e.messages += 1;
        e.metrics += u64::from(args.metrics_per_message);
        e.last_sequence = seq;
        live.tick(|_| {
            let rate = sent as f64 / start.elapsed().as_secs_f64();
            let eta = (args.messages - sent) as f64 / rate.max(1.0);
            format!(
                "{sent}/{} messages, {rate:.0} msg/s, ETA {eta:.0} s",
                args.messages
            )
        });
    }
    drop(first);
    for h in handles {
        h.join()
            .map_err(|_| anyhow::anyhow!("a hop thread panicked"))?;
    }
    let mut entries: Vec<SentEntry> = per_stream.into_values().collect();
    entries.sort_by_key(|e| e.stream);
    for chunk in entries.chunks(protocol::MAX_SENT_PER_FRAME) {
        exporter
            .send_frame(&Frame::Sent(SentFrame {
                publisher: 1,
                entries: chunk.to_vec(),
            }))
            .expect("chunks of MAX_SENT_PER_FRAME entries encode");
    }
    live.finish();
    Ok(sent)
}

fn print_report(args: &Args, r: &RunSummary, sent: u64, elapsed: Duration, exp: &CounterSnapshot) {
    println!(
        "hoptrace roundtrip: {sent} messages in {:.2} s ({:.0} msg/s, target {} metrics/s = {:.0} msg/s), {} hops, run {}",
        elapsed.as_secs_f64(),
        sent as f64 / elapsed.as_secs_f64(),
        units::rate(args.rate),
        args.message_rate(),
        args.hops.len(),
        r.run_id
    );
    println!();
    println!("| Stage | Count | Min | P50 | P90 | P99 | P99.9 | Max | Mean | Std Dev | Negative |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for s in &r.stages {
        let q = |quantile: f64| {
            s.percentiles
                .iter()
                .find(|p| p.quantile == quantile)
                .map_or_else(
                    || "-".to_owned(),
                    |p| {
                        format!(
                            "{} ±{}",
                            units::duration_f64(p.value_ns as f64),
                            units::duration_f64(p.precision_ns as f64)
                        )
                    },
                )
        };
        let exact = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), units::duration_f64);
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            s.name,
            s.count,
            exact(s.min_ns.map(|v| v as f64)),
            q(0.5),
            q(0.9),
            q(0.99),
            q(0.999),
            exact(s.max_ns.map(|v| v as f64)),
            exact(s.mean_ns),
            exact(s.stddev_ns),
            s.negative
        );
    }
    println!();
    println!(
        "Percentiles: HdrHistogram, 3 significant digits, value ± half its bucket; min, max, mean and std dev exact."
    );
    let n = args.hops.len();
    println!(
        "Clocks: every hop reads this host's CLOCK_REALTIME{}.",
        if args.skew_ns() == 0 {
            String::new()
        } else {
            format!(
                ", except {} which is skewed by {} (simulated); its negative deltas are counted, not hidden",
                args.hops[n - 1],
                units::duration_f64(args.skew_ns() as f64)
            )
        }
    );
    println!();
    let a = &r.accounting;
    for p in &a.publishers {
        println!(
            "Accounting: sent {sent} (publisher reported {}) = complete {} + incomplete {} + unseen {}",
            p.sent, p.complete, p.incomplete, p.unseen
        );
    }
    for (hop, m) in &a.missing_by_hop {
        println!("  incomplete, missing {hop}: {m}");
    }
    println!(
        "Probe records: reported {}, sent {}, lost {} (queue full {}, send failed {})",
        exp.reported,
        exp.sent,
        exp.lost(),
        exp.queue_full,
        exp.send_failed
    );
    let files = r.files.len();
    let bytes: u64 = r.files.iter().map(|f| f.bytes).sum();
    let rows: u64 = r.files.iter().map(|f| f.rows).sum();
    println!(
        "Parquet: {files} file(s), {rows} rows, {bytes} bytes ({:.1} bytes/trace)",
        bytes as f64 / rows.max(1) as f64
    );
    println!(
        "Counts add up: {}",
        if a.adds_up && a.publishers.iter().all(|p| p.sent == sent) {
            "yes"
        } else {
            "NO"
        }
    );
}
