//! `hoptrace roundtrip`: the probe path end to end on one machine.
//!
//! A publisher thread sends messages on an open-loop schedule through a chain of hop
//! threads; every message is an enveloped byte buffer that each hop unwraps, stamps and
//! wraps again, exactly as a processor embedding the probe would. Every stamp is also
//! reported out of band through a real exporter over loopback TCP to a receiver that
//! speaks the collector protocol, joins the stamps per message and prints per-stage HDR
//! percentiles with the run's accounting.

use std::collections::HashMap;
use std::io::Write as _;
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use hdrhistogram::Histogram;
use hoptrace_probe::carrier::envelope;
use hoptrace_probe::protocol::{
    self, CountersFrame, Frame, MAX_FRAME_LEN, PROTOCOL_VERSION, SentEntry, SentFrame, counter_id,
};
use hoptrace_probe::{
    Exporter, ExporterConfig, HopId, OffsetClock, Record, SystemClock, TraceContext, TraceKey,
};

use crate::units::{fmt_ns, parse_count};

/// Options of `hoptrace roundtrip`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Messages to send.
    #[arg(long, default_value = "200k", value_parser = parse_count)]
    pub messages: u64,
    /// Target send rate, messages per second (open loop).
    #[arg(long, default_value = "50k", value_parser = parse_count)]
    pub rate: u64,
    /// Streams the messages are spread over.
    #[arg(long, default_value_t = 100)]
    pub streams: u32,
    /// Metrics carried per message.
    #[arg(long, default_value_t = 10)]
    pub metrics_per_message: u32,
    /// Hops in order; a stage is measured between each pair of neighbours, and in total.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "publish,broker,flow_in,flow_out,store_in"
    )]
    pub hops: Vec<String>,
    /// Simulate a skewed clock on the last hop's host (ns; negative: behind).
    #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
    pub last_hop_skew_ns: i64,
    /// Payload bytes per message.
    #[arg(long, default_value_t = 100)]
    pub payload_bytes: usize,
}

/// What the receiver gathered.
#[derive(Debug, Default)]
struct Received {
    records: Vec<Record>,
    counters: HashMap<u64, CountersFrame>,
    sent: HashMap<(u16, u32), SentEntry>,
    goodbyes: usize,
    connections: usize,
}

/// Runs the roundtrip and prints its report.
///
/// # Errors
/// Invalid options, or a failure of the receiver or the exporter.
pub fn run(args: &Args) -> anyhow::Result<()> {
    ensure!(args.hops.len() >= 2, "--hops needs at least two hops");
    ensure!(args.hops.len() <= 16, "--hops allows at most 16 hops");
    ensure!(args.rate > 0, "--rate must be positive");
    ensure!(args.streams > 0, "--streams must be positive");
    let hops: Vec<(HopId, &str)> = args
        .hops
        .iter()
        .enumerate()
        .map(|(i, n)| (HopId(i as u8), n.as_str()))
        .collect();

    let listener = TcpListener::bind("127.0.0.1:0").context("binding the receiver")?;
    let addr = listener.local_addr()?;
    let received = Arc::new(Mutex::new(Received::default()));
    let hop_names: Vec<String> = args.hops.clone();
    {
        let received = Arc::clone(&received);
        std::thread::spawn(move || accept_loop(&listener, &received, &hop_names));
    }

    let exporter = Exporter::start(
        ExporterConfig::new(addr.to_string(), "hoptrace-roundtrip"),
        &hops,
    )
    .context("starting the exporter")?;
    let started = Instant::now();
    let sent = drive(args, &exporter, &hops)?;
    let elapsed = started.elapsed();
    let summary = exporter.shutdown();

    // Wait for the receiver to take everything the exporter says it sent.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = received.lock().expect("receiver poisoned");
        if r.goodbyes >= 1 && r.records.len() as u64 >= summary.counters.sent {
            break;
        }
        drop(r);
        if Instant::now() > deadline {
            bail!("the receiver did not get every record within 10 s (exporter: {summary:?})");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let r = received.lock().expect("receiver poisoned");
    print_report(args, &r, sent, elapsed, &summary.counters);
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
    let period_ns = 1e9 / args.rate as f64;
    let start_ns = publish.now_ns();
    let start = Instant::now();
    let mut per_stream: HashMap<u32, SentEntry> = HashMap::new();
    let mut seqs = vec![0u64; args.streams as usize];
    let mut sent = 0u64;
    let mut last_progress = Instant::now();
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
        if last_progress.elapsed() >= Duration::from_secs(1) {
            last_progress = Instant::now();
            let rate = sent as f64 / start.elapsed().as_secs_f64();
            let eta = (args.messages - sent) as f64 / rate.max(1.0);
            eprint!(
                "\r{sent}/{} messages, {rate:.0} msg/s, ETA {eta:.0} s   ",
                args.messages
            );
            let _ = std::io::stderr().flush();
        }
    }
    drop(first);
    for h in handles {
        h.join()
            .map_err(|_| anyhow::anyhow!("a hop thread panicked"))?;
    }
    let mut entries: Vec<SentEntry> = per_stream.into_values().collect();
    entries.sort_by_key(|e| e.stream);
    for chunk in entries.chunks(protocol::MAX_SENT_PER_FRAME) {
        exporter.send_frame(Frame::Sent(SentFrame {
            publisher: 1,
            entries: chunk.to_vec(),
        }));
    }
    eprintln!();
    Ok(sent)
}

fn accept_loop(listener: &TcpListener, received: &Arc<Mutex<Received>>, hops: &[String]) {
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        let received = Arc::clone(received);
        let hops = hops.to_vec();
        std::thread::spawn(move || {
            if let Err(e) = serve(stream, &received, &hops) {
                tracing::warn!("receiver: connection closed: {e:#}");
            }
        });
    }
}

fn serve(mut stream: TcpStream, received: &Mutex<Received>, hops: &[String]) -> anyhow::Result<()> {
    stream.set_nodelay(true)?;
    let Frame::Hello(hello) = protocol::read_frame(&mut stream, MAX_FRAME_LEN)? else {
        bail!("first frame is not hello");
    };
    for (id, name) in &hello.hops {
        if hops.get(usize::from(id.0)) != Some(name) {
            stream.write_all(
                &Frame::Reject {
                    code: protocol::reject_code::UNKNOWN_HOP,
                    reason: format!("hop {name:?} with id {} is not in this run", id.0),
                }
                .to_bytes(),
            )?;
            bail!("rejected unknown hop {name:?}");
        }
    }
    stream.write_all(
        &Frame::Welcome {
            version: PROTOCOL_VERSION,
            run_id: "roundtrip".into(),
        }
        .to_bytes(),
    )?;
    received.lock().expect("receiver poisoned").connections += 1;
    let mut reader = std::io::BufReader::with_capacity(1 << 20, stream);
    loop {
        let frame = match protocol::read_frame(&mut reader, MAX_FRAME_LEN) {
            Ok(f) => f,
            Err(protocol::ProtocolError::Io(std::io::ErrorKind::UnexpectedEof)) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let mut r = received.lock().expect("receiver poisoned");
        match frame {
            Frame::Records(recs) => r.records.extend(recs),
            Frame::Counters(c) => {
                r.counters.insert(hello.instance_id, c);
            }
            Frame::Sent(s) => {
                for e in s.entries {
                    r.sent.insert((s.publisher, e.stream), e);
                }
            }
            Frame::Goodbye => r.goodbyes += 1,
            Frame::Clock(_) | Frame::Hello(_) | Frame::Welcome { .. } | Frame::Reject { .. } => {}
        }
    }
}

fn print_report(
    args: &Args,
    r: &Received,
    sent: u64,
    elapsed: Duration,
    exp: &hoptrace_probe::CounterSnapshot,
) {
    let n_hops = args.hops.len();
    let mut traces: HashMap<TraceKey, Vec<Option<i64>>> = HashMap::new();
    let mut duplicates = 0u64;
    for rec in &r.records {
        let slot = &mut traces.entry(rec.key).or_insert_with(|| vec![None; n_hops])
            [usize::from(rec.hop.0)];
        if slot.is_some() {
            duplicates += 1;
        }
        *slot = Some(rec.stamp_ns);
    }
    let mut stages: Vec<(String, usize, usize)> = (0..n_hops - 1)
        .map(|i| {
            (
                format!("{} -> {}", args.hops[i], args.hops[i + 1]),
                i,
                i + 1,
            )
        })
        .collect();
    stages.push((
        format!("total ({} -> {})", args.hops[0], args.hops[n_hops - 1]),
        0,
        n_hops - 1,
    ));
    let mut hists: Vec<Histogram<u64>> = stages
        .iter()
        .map(|_| Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid bounds"))
        .collect();
    let mut negative = vec![0u64; stages.len()];
    let mut complete = 0u64;
    let mut missing = vec![0u64; n_hops];
    for stamps in traces.values() {
        if stamps.iter().all(Option::is_some) {
            complete += 1;
        } else {
            for (i, s) in stamps.iter().enumerate() {
                if s.is_none() {
                    missing[i] += 1;
                }
            }
        }
        for (k, (_, a, b)) in stages.iter().enumerate() {
            if let (Some(a), Some(b)) = (stamps[*a], stamps[*b]) {
                let d = b - a;
                if d < 0 {
                    negative[k] += 1;
                } else {
                    hists[k].saturating_record(d.max(1) as u64);
                }
            }
        }
    }
    let incomplete = traces.len() as u64 - complete;
    let reported_sent: u64 = r.sent.values().map(|e| e.messages).sum();
    let lost_by_probe = exp.queue_full + exp.send_failed;

    println!(
        "hoptrace roundtrip: {sent} messages in {:.2} s ({:.0} msg/s, target {} msg/s), {} hops over {} collector connection(s)",
        elapsed.as_secs_f64(),
        sent as f64 / elapsed.as_secs_f64(),
        args.rate,
        n_hops,
        r.connections
    );
    println!();
    println!("| Stage | Count | Min | P50 | P90 | P99 | P99.9 | Max | Negative |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for (k, (name, _, _)) in stages.iter().enumerate() {
        let h = &hists[k];
        let q = |p: f64| {
            let v = h.value_at_quantile(p);
            format!(
                "{} ±{}",
                fmt_ns(v as f64),
                fmt_ns(h.equivalent_range(v) as f64)
            )
        };
        println!(
            "| {name} | {} | {} | {} | {} | {} | {} | {} | {} |",
            h.len(),
            fmt_ns(h.min() as f64),
            q(0.5),
            q(0.9),
            q(0.99),
            q(0.999),
            fmt_ns(h.max() as f64),
            negative[k]
        );
    }
    println!();
    println!(
        "Percentiles: HdrHistogram, 3 significant digits; ± is the histogram bucket width at that value."
    );
    println!(
        "Clocks: every hop reads this host's CLOCK_REALTIME{}.",
        if args.last_hop_skew_ns == 0 {
            String::new()
        } else {
            format!(
                ", except {} which is skewed by {} (simulated)",
                args.hops[n_hops - 1],
                fmt_ns(args.last_hop_skew_ns as f64)
            )
        }
    );
    println!();
    println!(
        "Accounting: sent {sent} (publisher reported {reported_sent}), complete {complete}, incomplete {incomplete}, duplicate stamps {duplicates}"
    );
    for (i, m) in missing.iter().enumerate() {
        if *m > 0 {
            println!("  missing {}: {m}", args.hops[i]);
        }
    }
    println!(
        "Probe records: reported {}, sent {}, lost (queue full {} + send failed {}) {lost_by_probe}, received {}",
        exp.reported,
        exp.sent,
        exp.queue_full,
        exp.send_failed,
        r.records.len()
    );
    let final_counters = r
        .counters
        .values()
        .map(|c| c.get(counter_id::SENT))
        .sum::<u64>();
    println!(
        "Collector view: final counters say {final_counters} records sent, {} received",
        r.records.len()
    );
    let adds_up = sent == complete + incomplete + traces_never_seen(sent, traces.len() as u64)
        && sent == reported_sent;
    println!("Counts add up: {}", if adds_up { "yes" } else { "NO" });
}

/// Messages of which not even one stamp reached the receiver (all lost by probes).
fn traces_never_seen(sent: u64, seen: u64) -> u64 {
    sent.saturating_sub(seen)
}
