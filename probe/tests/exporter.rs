//! The exporter against a minimal collector over real loopback TCP: delivery, counters,
//! reconnection, rejection, and a skewed clock.

mod common;

use std::time::Duration;

use common::MiniCollector;
use hoptrace_probe::clock::ClockSource;
use hoptrace_probe::testing::OffsetClock;
use hoptrace_probe::{
    ClockReporting, ClockStatus, ExportSummary, Exporter, ExporterConfig, HopId, SystemClock,
    TraceContext, TraceKey,
};
use hoptrace_protocol::{Frame, counter_id};
use hoptrace_testkit::wait_for;

const HOPS: &[(HopId, &str)] = &[
    (HopId(0), "publish"),
    (HopId(1), "broker"),
    (HopId(2), "flow_in"),
];

fn config(addr: std::net::SocketAddr) -> ExporterConfig {
    let mut c = ExporterConfig::new(addr.to_string(), "exporter-test");
    c.backoff_min = Duration::from_millis(5);
    c.backoff_max = Duration::from_millis(50);
    c.counters_interval = Duration::from_millis(20);
    c
}

fn ctx(seq: u64) -> TraceContext {
    TraceContext::new(
        TraceKey {
            publisher: 9,
            stream: (seq % 7) as u32,
            sequence: seq,
        },
        3,
        1_000 + seq as i64,
    )
}

fn last_counters(frames: &[(usize, Frame)]) -> hoptrace_protocol::CountersFrame {
    frames
        .iter()
        .rev()
        .find_map(|(_, f)| match f {
            Frame::Counters(c) => Some(c.clone()),
            _ => None,
        })
        .expect("a counters frame")
}

#[test]
fn every_record_arrives_with_hello_clock_counters_and_goodbye() {
    let mc = MiniCollector::start(None);
    let status = ClockStatus {
        source: ClockSource::Injected,
        synced: true,
        error_bound_ns: 1234,
        detail: "test".into(),
        ..ClockStatus::default()
    };
    let mut cfg = config(mc.addr);
    cfg.clock = ClockReporting::Fixed(status);
    let exp = Exporter::start(cfg, HOPS).unwrap();
    let probes: Vec<_> = HOPS.iter().map(|(h, _)| exp.probe(*h).unwrap()).collect();
    for seq in 0..30_000u64 {
        let mut c = ctx(seq);
        for p in &probes {
            assert!(p.record(&mut c).queued);
        }
        assert_eq!(c.stamps().len(), 3);
    }
    let summary = exp.shutdown();
    assert!(summary.clean, "{summary:?}");
    assert_eq!(summary.counters.reported, 90_000);
    assert_eq!(summary.counters.sent, 90_000);
    assert_eq!(summary.counters.lost(), 0);

    mc.wait_for_goodbye();
    let frames = mc.frames.lock().unwrap().clone();
    let Frame::Hello(hello) = &frames[0].1 else {
        panic!("first frame is {:?}", frames[0].1)
    };
    assert_eq!(hello.process, "exporter-test");
    assert_eq!(hello.hops.len(), 3);
    assert_eq!(hello.hops[2], (HopId(2), "flow_in".to_owned()));
    let clock = frames.iter().find_map(|(_, f)| match f {
        Frame::Clock(c) => Some(c.clone()),
        _ => None,
    });
    assert_eq!(
        clock.map(|c| (c.source, c.error_bound_ns)),
        Some((ClockSource::Injected, 1234))
    );
    assert_eq!(frames.last().unwrap().1, Frame::Goodbye);
    let counters = last_counters(&frames);
    assert_eq!(counters.get(counter_id::REPORTED), 90_000);
    assert_eq!(counters.get(counter_id::SENT), 90_000);
    assert_eq!(counters.get(counter_id::QUEUE_FULL), 0);

    let records = mc.records();
    assert_eq!(records.len(), 90_000);
    let mut keys: Vec<_> = records.iter().map(|r| (r.key.sequence, r.hop.0)).collect();
    keys.sort_unstable();
    keys.dedup();
    assert_eq!(keys.len(), 90_000, "every (message, hop) exactly once");
    // Stamps of one message are taken in hop order on one clock.
    let mut by_seq = std::collections::HashMap::<u64, Vec<(u8, i64)>>::new();
    for r in &records {
        assert_eq!(r.metric_count, 3);
        assert_eq!(r.intended_ns, 1_000 + r.key.sequence as i64);
        by_seq
            .entry(r.key.sequence)
            .or_default()
            .push((r.hop.0, r.stamp_ns));
    }
    for stamps in by_seq.values_mut() {
        stamps.sort_unstable();
        assert!(stamps.windows(2).all(|w| w[0].1 <= w[1].1), "{stamps:?}");
    }
}

#[test]
fn records_queue_until_the_collector_comes_up() {
    // Reserve a port, close it, report while nothing listens, then listen there.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let exp = Exporter::start(config(addr), HOPS).unwrap();
    let p = exp.probe(HopId(0)).unwrap();
    for seq in 0..1000 {
        assert!(p.record(&mut ctx(seq)).queued);
    }
    wait_for("the failed attempt", Duration::from_secs(5), || {
        exp.last_error().is_some()
    });
    assert!(!exp.is_connected());
    let mc = MiniCollector::start_on(std::net::TcpListener::bind(addr).unwrap(), None);
    let summary = exp.shutdown();
    assert!(summary.clean);
    assert_eq!((summary.counters.sent, summary.counters.lost()), (1000, 0));
    mc.wait_for_goodbye();
    assert_eq!(mc.records().len(), 1000);
}

#[test]
fn a_cut_connection_reconnects_and_every_record_is_accounted_for() {
    let mc = MiniCollector::start(None);
    let exp = Exporter::start(config(mc.addr), HOPS).unwrap();
    let p = exp.probe(HopId(1)).unwrap();
    let mut reported = 0u64;
    for round in 0..20 {
        for seq in 0..2000 {
            if p.record(&mut ctx(round * 10_000 + seq)).queued {
                reported += 1;
            }
        }
        if round % 5 == 2 {
            mc.cut_connections();
        }
        // Pacing between rounds (the workload: 2,000 records every 10 ms, cut now and then).
        std::thread::sleep(Duration::from_millis(10));
    }
    let summary = exp.shutdown();
    let c = summary.counters;
    assert!(summary.clean);
    assert!(c.reconnects >= 1, "{c:?}");
    assert_eq!(c.reported, 40_000);
    assert_eq!(c.reported, reported + c.queue_full);
    // Every record reported was either delivered or counted as lost.
    assert_eq!(c.sent + c.send_failed + c.queue_full, c.reported, "{c:?}");
    // The collector reads the last connection after shutdown returns: wait for its end.
    mc.wait_for_goodbye();
    let received = mc.records().len() as u64;
    assert!(received <= c.sent, "received {received} > sent {}", c.sent);
    // The final counters frame tells the collector the same.
    let frames = mc.frames.lock().unwrap().clone();
    let last = last_counters(&frames);
    assert_eq!(last.get(counter_id::SENT), c.sent);
    assert_eq!(last.get(counter_id::SEND_FAILED), c.send_failed);
}

#[test]
fn a_rejected_probe_says_why_and_counts_what_it_could_not_send() {
    let mc = MiniCollector::start(Some("bad token"));
    let exp = Exporter::start(config(mc.addr), HOPS)
        .unwrap()
        .with_shutdown_timeout(Duration::from_millis(200));
    let p = exp.probe(HopId(0)).unwrap();
    for seq in 0..10 {
        assert!(p.record(&mut ctx(seq)).queued);
    }
    mc.wait_for("a hello", Duration::from_secs(5), |f| !f.is_empty());
    wait_for("the rejection", Duration::from_secs(5), || {
        exp.last_error().is_some_and(|e| e.contains("rejected"))
    });
    let err = exp.last_error().expect("an error");
    assert!(
        err.contains("rejected") && err.contains("bad token"),
        "{err}"
    );
    let summary = exp.shutdown();
    assert!(!summary.clean);
    assert_eq!(
        (summary.counters.sent, summary.counters.send_failed),
        (0, 10)
    );
}

/// A Reject for good (here a wrong token) ends the exporter's attempts: `connect` says
/// why at once instead of retrying until its timeout, and no second Hello follows.
#[test]
fn a_probe_refused_for_good_stops_trying_and_connect_says_why_at_once() {
    let mc = MiniCollector::start(Some("bad token"));
    let mut c = config(mc.addr);
    c.welcome_timeout = Duration::from_secs(30);
    let started = std::time::Instant::now();
    let err = Exporter::connect(c, HOPS).unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(
        matches!(err, hoptrace_probe::ExporterError::Rejected { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("bad token"), "{err}");
    // What is tested is that nothing more comes: a window of 20 retry periods at the
    // test's 5 ms backoff, in which a retrying exporter would send several more Hellos.
    std::thread::sleep(Duration::from_millis(100));
    let hellos = mc
        .frames
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, f)| matches!(f, hoptrace_protocol::Frame::Hello(_)))
        .count();
    assert_eq!(hellos, 1);

    // Started without waiting, it says so through `rejected()` and counts what it held.
    let exp = Exporter::start(config(mc.addr), HOPS)
        .unwrap()
        .with_shutdown_timeout(Duration::from_millis(200));
    let p = exp.probe(HopId(0)).unwrap();
    assert!(p.record(&mut ctx(1)).queued);
    wait_for("the rejection", Duration::from_secs(5), || {
        exp.rejected().is_some()
    });
    assert!(exp.rejected().unwrap().contains("bad token"));
    let summary = exp.shutdown();
    assert_eq!(summary.counters.sent + summary.counters.send_failed, 1);
}

#[test]
fn undeclared_hops_and_bad_hop_lists_are_refused() {
    let addr = "127.0.0.1:9".parse().unwrap();
    assert!(Exporter::start(config(addr), &[]).is_err());
    assert!(Exporter::start(config(addr), &[(HopId(1), "a"), (HopId(1), "b")]).is_err());
    let exp = Exporter::start(config(addr), HOPS)
        .unwrap()
        .with_shutdown_timeout(Duration::ZERO);
    assert!(exp.probe(HopId(7)).is_err());
    assert!(exp.probe_named("nope").is_err());
}

#[test]
fn a_skewed_host_stamps_with_its_offset() {
    let mc = MiniCollector::start(None);
    let exp = Exporter::start(config(mc.addr), HOPS).unwrap();
    let honest = exp.probe(HopId(0)).unwrap();
    // The second host's clock runs 5 ms behind: its later stamp reads earlier.
    let skewed = exp
        .probe_with_clock(HopId(1), OffsetClock::new(SystemClock, -5_000_000))
        .unwrap();
    let mut c = ctx(1);
    let a = honest.record(&mut c).stamp;
    let b = skewed.record(&mut c).stamp;
    assert!(b.ns - a.ns < -4_000_000, "delta {}", b.ns - a.ns);
    assert!(exp.shutdown().clean);
    // The collector reads the connection's end after shutdown returns.
    mc.wait_for_goodbye();
    let recs = mc.records();
    assert_eq!(recs.len(), 2);
    assert!(recs.iter().any(|r| r.hop == HopId(1) && r.stamp_ns == b.ns));
}

#[test]
fn many_threads_report_and_exit_and_nothing_is_lost() {
    let mc = MiniCollector::start(None);
    let exp = Exporter::start(config(mc.addr), HOPS).unwrap();
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let p = exp.probe(HopId((t % 3) as u8)).unwrap();
            std::thread::spawn(move || {
                for seq in 0..5_000 {
                    assert!(p.record(&mut ctx(t * 100_000 + seq)).queued);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap(); // each thread's ring outlives it until drained
    }
    let summary = exp.shutdown();
    assert!(summary.clean);
    assert_eq!(
        (
            summary.counters.reported,
            summary.counters.sent,
            summary.counters.lost()
        ),
        (40_000, 40_000, 0)
    );
    mc.wait_for_goodbye();
    let mut keys: Vec<_> = mc
        .records()
        .iter()
        .map(|r| (r.key.sequence, r.hop.0))
        .collect();
    keys.sort_unstable();
    keys.dedup();
    assert_eq!(keys.len(), 40_000);
}

/// Every numbered records frame the fake collector received, by number (a frame sent
/// again appears twice).
fn seq_frames(mc: &MiniCollector) -> Vec<(u64, usize)> {
    mc.frames
        .lock()
        .unwrap()
        .iter()
        .filter_map(|(_, f)| match f {
            Frame::SeqRecords { seq, records } => Some((*seq, records.len())),
            _ => None,
        })
        .collect()
}

#[test]
fn a_durable_collector_acknowledges_every_frame_and_nothing_is_left_over() {
    let mode = common::Durable::default();
    mode.ack.store(true, std::sync::atomic::Ordering::Relaxed);
    let mc = MiniCollector::durable(&mode);
    let exp = Exporter::start(config(mc.addr), HOPS).unwrap();
    let p = exp.probe(HopId(0)).unwrap();
    for seq in 0..5_000 {
        assert!(p.record(&mut ctx(seq)).queued);
    }
    let summary = exp.shutdown();
    assert!(summary.clean);
    assert_eq!(summary.unacknowledged, 0);
    assert_eq!(summary.counters.lost(), 0);
    mc.wait_for_goodbye();
    let frames = seq_frames(&mc);
    // Numbered 1, 2, 3, ... without a gap, every record once, no plain Records frame.
    let seqs: Vec<u64> = frames.iter().map(|f| f.0).collect();
    assert_eq!(seqs, (1..=frames.len() as u64).collect::<Vec<_>>());
    assert_eq!(frames.iter().map(|f| f.1).sum::<usize>(), 5_000);
    assert_eq!(mc.records().len(), 5_000);
}

#[test]
fn unacknowledged_frames_are_sent_again_after_a_reconnection() {
    // The collector acknowledges nothing, then loses the connection; when the exporter
    // comes back it says it holds frames up to 2.
    let mode = common::Durable::default();
    let mc = MiniCollector::durable(&mode);
    let mut cfg = config(mc.addr);
    cfg.max_batch = 100;
    let exp = Exporter::start(cfg, HOPS).unwrap();
    let p = exp.probe(HopId(0)).unwrap();
    for seq in 0..1_000 {
        assert!(p.record(&mut ctx(seq)).queued);
    }
    // Wait until all of them were written once.
    wait_for("1,000 records", Duration::from_secs(10), || {
        mc.records().len() >= 1_000
    });
    let before = seq_frames(&mc);
    let top = before.iter().map(|f| f.0).max().unwrap();
    assert!(top >= 10, "{top} frames of at most 100");
    mode.resume.store(2, std::sync::atomic::Ordering::Relaxed);
    mode.ack.store(true, std::sync::atomic::Ordering::Relaxed);
    mc.cut_connections();
    let summary = exp.shutdown();
    mc.wait_for_goodbye();
    let after = seq_frames(&mc);
    let again: Vec<&(u64, usize)> = after[before.len()..].iter().collect();
    // Exactly the frames above 2 came again, in order, each once.
    assert_eq!(
        again.iter().map(|f| f.0).collect::<Vec<_>>(),
        (3..=top).collect::<Vec<_>>()
    );
    let resent: usize = again.iter().map(|f| f.1).sum();
    assert_eq!(summary.counters.resent, resent as u64);
    assert_eq!(summary.counters.lost(), 0);
    assert_eq!(summary.unacknowledged, 0);
    assert!(summary.counters.reconnects >= 1);
}

#[test]
fn evicted_frames_the_collector_never_stored_are_counted_lost_exactly() {
    let mode = common::Durable::default();
    let mc = MiniCollector::durable(&mode);
    let mut cfg = config(mc.addr);
    cfg.max_batch = 100;
    // Room for about ten frames of 100 records (36 bytes each).
    cfg.retention_bytes = 10 * (100 * 36 + 17);
    let exp = Exporter::start(cfg, HOPS).unwrap();
    let p = exp.probe(HopId(0)).unwrap();
    for seq in 0..5_000 {
        assert!(p.record(&mut ctx(seq)).queued);
    }
    wait_for("5,000 records", Duration::from_secs(10), || {
        mc.records().len() >= 5_000
    });
    let evicted = exp.counters().evicted;
    assert!(evicted >= 3_000, "{evicted}");
    // A collector that restarted holding nothing: every evicted record is lost, every
    // kept one is sent again.
    mode.ack.store(true, std::sync::atomic::Ordering::Relaxed);
    mc.cut_connections();
    let summary = exp.shutdown();
    let c = summary.counters;
    assert_eq!(c.evicted, evicted);
    assert_eq!(c.lost_unacked, evicted);
    assert_eq!(c.resent + c.lost_unacked, 5_000);
    assert_eq!(c.lost(), evicted);
    assert_eq!(summary.unacknowledged, 0);
}

/// A collector that goes away and comes back on its address holding every frame it
/// acknowledged: records made meanwhile waited in the retention buffer.
fn collector_away_and_back(retention_bytes: usize) -> (ExportSummary, Vec<u64>, u64) {
    let mode = common::Durable::default();
    mode.ack.store(true, std::sync::atomic::Ordering::Relaxed);
    let first = MiniCollector::durable(&mode);
    let addr = first.addr;
    let mut cfg = config(addr);
    cfg.max_batch = 100;
    cfg.retention_bytes = retention_bytes;
    cfg.backoff_max = Duration::from_millis(100);
    let exp = Exporter::start(cfg, HOPS).unwrap();
    let p = exp.probe(HopId(0)).unwrap();
    for seq in 0..1_000 {
        assert!(p.record(&mut ctx(seq)).queued);
    }
    first.wait_for("1,000 records", Duration::from_secs(10), |f| {
        f.iter()
            .map(|(_, f)| match f {
                Frame::SeqRecords { records, .. } => records.len(),
                _ => 0,
            })
            .sum::<usize>()
            == 1_000
    });
    let held = seq_frames(&first).iter().map(|f| f.0).max().unwrap();
    first.stop();
    // Wait until the exporter saw the connection go, then record while it is away.
    wait_for("the exporter to see it go", Duration::from_secs(10), || {
        !exp.is_connected()
    });
    for seq in 1_000..5_000 {
        assert!(p.record(&mut ctx(seq)).queued);
    }
    // Every record moved from the queue into the retention buffer (evicting beyond it).
    wait_for("the queue to empty", Duration::from_secs(10), || {
        exp.queued() == 0
    });
    let again = common::Durable::default();
    again.ack.store(true, std::sync::atomic::Ordering::Relaxed);
    again
        .resume
        .store(held, std::sync::atomic::Ordering::Relaxed);
    let second = MiniCollector::durable_on(std::net::TcpListener::bind(addr).unwrap(), &again);
    let summary = exp.shutdown();
    second.wait_for_goodbye();
    let mut keys: Vec<u64> = second.records().iter().map(|r| r.key.sequence).collect();
    keys.sort_unstable();
    (summary, keys, held)
}

#[test]
fn records_made_while_the_collector_is_away_wait_for_it_and_none_is_lost() {
    let (summary, keys, _) = collector_away_and_back(64 << 20);
    let c = &summary.counters;
    assert_eq!(c.lost(), 0, "{c:?}");
    assert_eq!(c.evicted, 0);
    assert_eq!(summary.unacknowledged, 0);
    // The second collector got exactly the records made while the first was away.
    assert_eq!(keys, (1_000..5_000).collect::<Vec<_>>());
    assert_eq!(c.sent, 5_000);
    assert!(c.reconnects >= 1);
}

#[test]
fn an_absence_longer_than_the_retention_buffer_loses_exactly_what_it_evicted() {
    // Room for about ten frames of 100 records (36 bytes each).
    let (summary, keys, _) = collector_away_and_back(10 * (100 * 36 + 17));
    let c = &summary.counters;
    assert!(c.evicted >= 2_500, "{c:?}");
    assert_eq!(c.lost_unacked, c.evicted);
    assert_eq!(c.lost(), c.evicted);
    assert_eq!(summary.unacknowledged, 0);
    // What was kept arrived; what was evicted is exactly what is missing, oldest first.
    assert_eq!(keys.len() as u64 + c.evicted, 4_000);
    assert_eq!(keys, (1_000 + c.evicted..5_000).collect::<Vec<_>>());
}

/// A frame beyond the protocol's limits is the caller's error, returned, not a panic: the
/// exporter queues nothing of it and goes on working for every later frame and record.
#[test]
fn a_frame_beyond_the_limits_is_an_error_and_the_exporter_goes_on() {
    use hoptrace_protocol::{EncodeError, MAX_SENT_PER_FRAME, SentEntry, SentFrame};
    let mc = MiniCollector::start(None);
    let exp = Exporter::start(config(mc.addr), HOPS).unwrap();
    let entry = |stream| SentEntry {
        stream,
        messages: 1,
        metrics: 1,
        first_sequence: 0,
        last_sequence: 0,
    };
    let too_many = SentFrame {
        publisher: 1,
        entries: (0..=MAX_SENT_PER_FRAME as u32).map(entry).collect(),
    };
    assert_eq!(
        exp.send_sent_frame(too_many),
        Err(EncodeError::TooManySentEntries(MAX_SENT_PER_FRAME + 1))
    );
    // The same exporter, from another thread as well: nothing poisoned.
    std::thread::scope(|s| {
        s.spawn(|| {
            exp.send_sent_frame(SentFrame {
                publisher: 1,
                entries: vec![entry(7)],
            })
            .unwrap();
        });
    });
    let p = exp.probe(HOPS[0].0).unwrap();
    let mut c = ctx(1);
    assert!(p.record(&mut c).queued);
    let summary = exp.shutdown();
    assert!(summary.clean, "{summary:?}");
    mc.wait_for_goodbye();
    let frames = mc.frames.lock().unwrap().clone();
    let sent: Vec<_> = frames
        .iter()
        .filter_map(|(_, f)| match f {
            Frame::Sent(s) => Some(s.entries.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(sent, [vec![entry(7)]], "only the valid Sent frame went out");
    assert_eq!(mc.records().len(), 1);
}

/// Sent frames made while the collector is away wait as one entry per stream, however
/// many were made: when it comes, it gets each stream's newest snapshot, once, which is
/// all it keeps of them (`docs/collector-protocol.md`).
#[test]
fn sent_frames_made_while_the_collector_is_away_reach_it_as_the_newest_per_stream() {
    use hoptrace_protocol::{SentEntry, SentFrame};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let exp = Exporter::start(config(addr), HOPS).unwrap();
    let entry = |stream, messages| SentEntry {
        stream,
        messages,
        metrics: messages,
        first_sequence: 0,
        last_sequence: messages - 1,
    };
    for round in 1..=500u64 {
        exp.send_sent_frame(SentFrame {
            publisher: 3,
            entries: (0..3_000).map(|s| entry(s, round)).collect(),
        })
        .unwrap();
    }
    let mc = MiniCollector::start_on(std::net::TcpListener::bind(addr).unwrap(), None);
    mc.wait_for("the Sent entries", Duration::from_secs(10), |f| {
        f.iter().any(|(_, f)| matches!(f, Frame::Sent(_)))
    });
    let summary = exp.shutdown();
    assert!(summary.clean, "{summary:?}");
    let entries: Vec<SentEntry> = mc
        .frames
        .lock()
        .unwrap()
        .iter()
        .filter_map(|(_, f)| match f {
            Frame::Sent(s) if s.publisher == 3 => Some(s.entries.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(
        entries,
        (0..3_000).map(|s| entry(s, 500)).collect::<Vec<_>>(),
        "one entry per stream, the newest"
    );
}

/// Dropping an exporter returns at once, also while its thread still has seconds of
/// trying left (an unreachable collector); the thread goes on delivering in the
/// background.
#[test]
fn dropping_an_exporter_does_not_wait_and_its_thread_still_delivers() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let exp = Exporter::start(config(addr), HOPS)
        .unwrap()
        .with_shutdown_timeout(Duration::from_secs(3));
    let p = exp.probe(HopId(0)).unwrap();
    for seq in 0..100 {
        assert!(p.record(&mut ctx(seq)).queued);
    }
    let t = std::time::Instant::now();
    drop(exp);
    assert!(
        t.elapsed() < Duration::from_millis(500),
        "drop waited {:?}",
        t.elapsed()
    );

    // With a collector: everything recorded before the drop arrives, then Goodbye.
    let mc = MiniCollector::start(None);
    let exp = Exporter::start(config(mc.addr), HOPS).unwrap();
    let p = exp.probe(HopId(1)).unwrap();
    for seq in 0..1_000 {
        assert!(p.record(&mut ctx(seq)).queued);
    }
    drop(exp);
    mc.wait_for_goodbye();
    assert_eq!(mc.records().len(), 1_000);
}

#[test]
fn connect_waits_for_the_welcome_or_says_why_none_came() {
    let mc = MiniCollector::start(None);
    let exp = Exporter::connect(config(mc.addr), HOPS).unwrap();
    assert!(exp.is_connected());
    assert_eq!(exp.run_id().as_deref(), Some("test-run"));
    assert!(exp.shutdown().clean);

    // Nothing listens: the wait ends with the last connection error.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed = listener.local_addr().unwrap();
    drop(listener);
    let mut cfg = config(closed);
    cfg.welcome_timeout = Duration::from_millis(200);
    let t = std::time::Instant::now();
    let err = Exporter::connect(cfg, HOPS).unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    let hoptrace_probe::ExporterError::NotWelcomed {
        collector,
        hops,
        waited_ms,
        detail,
        ..
    } = &err
    else {
        panic!("{err:?}")
    };
    assert_eq!(
        (collector.as_str(), hops.as_str(), *waited_ms),
        (closed.to_string().as_str(), "publish, broker, flow_in", 200)
    );
    assert!(detail.contains("connect"), "{detail}");
    assert!(
        err.to_string().contains("is hoptrace collect running"),
        "{err}"
    );

    // A collector that refuses: its reason comes through.
    let refusing = MiniCollector::start(Some("bad token"));
    let mut cfg = config(refusing.addr);
    cfg.welcome_timeout = Duration::from_millis(200);
    let err = Exporter::connect(cfg, HOPS).unwrap_err().to_string();
    assert!(err.contains("bad token"), "{err}");
}

/// A host stopping while its collector is away (the collector was stopped first) waits
/// for it at most the `away` it gives, not the whole shutdown timeout, and counts what
/// it held as `send_failed`.
#[test]
fn a_prompt_shutdown_does_not_wait_out_an_absent_collector() {
    let mc = MiniCollector::start(None);
    let addr = mc.addr;
    let exp = Exporter::start(config(addr), HOPS)
        .unwrap()
        .with_shutdown_timeout(Duration::from_secs(30));
    mc.wait_for("a hello", Duration::from_secs(5), |f| !f.is_empty());
    mc.stop();
    wait_for("the disconnection", Duration::from_secs(5), || {
        !exp.is_connected()
    });
    let p = exp.probe(HopId(0)).unwrap();
    for seq in 0..5 {
        assert!(p.record(&mut ctx(seq)).queued);
    }
    let started = std::time::Instant::now();
    let summary = exp.shutdown_promptly(Duration::from_millis(200));
    let took = started.elapsed();
    assert!(took < Duration::from_secs(2), "took {took:?}");
    assert!(!summary.clean);
    assert_eq!(
        (summary.counters.sent, summary.counters.send_failed),
        (0, 5),
        "{:?}",
        summary.counters
    );
}

/// A collector that reads every frame and never acknowledges one: what the retention
/// buffer drops after writing is remembered only up to a limit, then the exporter
/// reconnects and the Welcome's resume number settles it exactly (here: it holds
/// nothing, so every record dropped is lost).
#[test]
fn a_collector_that_reads_and_never_acknowledges_is_reconnected_to_and_settled() {
    let mode = common::Durable::default();
    let mc = MiniCollector::durable(&mode);
    let mut cfg = config(mc.addr);
    // One record a frame, and room for one frame: every frame written is dropped by the
    // next one, unacknowledged.
    cfg.max_batch = 1;
    cfg.retention_bytes = 60;
    let exp = Exporter::start(cfg, HOPS).unwrap();
    let p = exp.probe(HopId(0)).unwrap();
    let n = 70_000u64;
    for seq in 0..n {
        assert!(p.record(&mut ctx(seq)).queued);
    }
    wait_for("a reconnection", Duration::from_secs(60), || {
        exp.counters().reconnects > 0
    });
    let summary = exp.shutdown_promptly(Duration::from_millis(200));
    let c = summary.counters;
    eprintln!("{c:?}, unacknowledged {}", summary.unacknowledged);
    assert!(c.reconnects >= 1, "it reconnected: {c:?}");
    assert!(
        c.lost_unacked >= 65_536,
        "settled at the reconnection: {c:?}"
    );
    assert_eq!(c.queue_full, 0);
    assert_eq!(
        c.lost_unacked + summary.unacknowledged + c.send_failed,
        n,
        "every record accounted for once: {c:?}"
    );
}
