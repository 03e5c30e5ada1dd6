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
use hoptrace_probe::testing::OffsetClock;
use hoptrace_probe::{
    ClockReporting, CounterSnapshot, Exporter, ExporterConfig, HopId, SystemClock, TraceContext,
    TraceKey,
};
use hoptrace_protocol::{self as protocol, SentEntry, SentFrame};

use crate::progress::LiveLine;

/// What to send.
#[derive(Debug, Clone)]
pub struct RoundtripOptions {
    /// Messages to send.
    pub messages: u64,
    /// Target rate, metrics per second (open loop): messages go out at
    /// `rate / metrics_per_message` per second.
    pub rate: f64,
    /// Streams the messages are spread over.
    pub streams: u32,
    /// Metrics carried per message.
    pub metrics_per_message: u32,
    /// Hops in order; a stage is measured between each pair of neighbours, and in total.
    pub hops: Vec<String>,
    /// A simulated clock skew of the last hop's host, ns (negative: behind).
    pub last_hop_skew_ns: i64,
    /// Payload bytes per message.
    pub payload_bytes: usize,
    /// Folder under which the run directory is written.
    pub runs: PathBuf,
}

impl RoundtripOptions {
    /// Messages per second.
    #[must_use]
    pub fn message_rate(&self) -> f64 {
        self.rate / f64::from(self.metrics_per_message.max(1))
    }
}

/// What a roundtrip ends with.
#[derive(Debug)]
pub struct RoundtripOutcome {
    /// What the collector wrote to `run.json`.
    pub run: RunSummary,
    /// The run directory.
    pub run_dir: PathBuf,
    /// Messages sent.
    pub sent: u64,
    /// From the first message to the last hop's last stamp.
    pub elapsed: Duration,
    /// The exporter's final counters.
    pub exported: CounterSnapshot,
}

/// Runs the roundtrip: the messages through the chain of hops, every stamp to the
/// collector, the run written.
///
/// # Errors
/// Invalid options, or a failure of the receiver or the exporter.
pub fn run(args: &RoundtripOptions) -> anyhow::Result<RoundtripOutcome> {
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
    let mut ecfg = ExporterConfig::new(collector.local_addr().to_string(), "hoptrace-roundtrip");
    ecfg.clock = ClockReporting::Detect;
    let exporter = Exporter::start(ecfg, &hops).context("starting the exporter")?;
    let started = Instant::now();
    let sent = drive(args, &exporter, &hops)?;
    let elapsed = started.elapsed();
    let exported = exporter.shutdown();
    let run_dir = collector.run_dir().to_owned();
    let run = collector.stop().context("stopping the collector")?;
    Ok(RoundtripOutcome {
        run,
        run_dir,
        sent,
        elapsed,
        exported: exported.counters,
    })
}

/// Publisher and hop threads; returns the messages sent.
fn drive(
    args: &RoundtripOptions,
    exporter: &Exporter,
    hops: &[(HopId, &str)],
) -> anyhow::Result<u64> {
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
        let skew = if i + 1 == last {
            args.last_hop_skew_ns
        } else {
            0
        };
        let probe = exporter.probe_with_clock(hop, OffsetClock::new(SystemClock, skew))?;
        let next = senders.get(i + 1).cloned();
        handles.push(std::thread::spawn(move || {
            let mut out = Vec::with_capacity(512);
            for msg in rx {
                let Ok((extracted, payload)) = probe.counted(envelope::unwrap(&msg)) else {
                    continue;
                };
                let mut ctx = extracted.context;
                probe.record(&mut ctx);
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
        publish.record(&mut ctx);
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
            .send_sent_frame(SentFrame {
                publisher: 1,
                entries: chunk.to_vec(),
            })
            .expect("chunks of MAX_SENT_PER_FRAME entries encode");
    }
    live.finish();
    Ok(sent)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_completes_and_the_counts_add_up() {
        let runs = std::env::temp_dir().join(format!("hoptrace-roundtrip-{}", std::process::id()));
        let o = run(&RoundtripOptions {
            messages: 300,
            rate: 30_000.0,
            streams: 7,
            metrics_per_message: 3,
            hops: ["publish", "flow_in", "store_in"]
                .map(str::to_owned)
                .to_vec(),
            last_hop_skew_ns: -2_000_000,
            payload_bytes: 10,
            runs: runs.clone(),
        })
        .unwrap();
        assert_eq!(o.sent, 300);
        let a = &o.run.accounting;
        assert!(a.adds_up, "{a:?}");
        assert_eq!(a.publishers[0].sent, 300);
        assert_eq!(a.publishers[0].complete, 300);
        assert_eq!(o.exported.lost(), 0);
        // The last hop's clock is 2 ms behind: its stages are negative, counted.
        let last = o
            .run
            .stages
            .iter()
            .find(|s| s.name.contains("store_in"))
            .unwrap();
        assert!(last.figures.negative > 0, "{last:?}");
        assert!(o.run_dir.join("run.json").is_file());
        let _ = std::fs::remove_dir_all(&runs);
    }
}
