//! The live view of a running collector over HTTP: a real exporter reports a small known
//! set of traces, and `/live.json` must show exactly their figures: counts, the exact
//! minimum and maximum, percentiles of the collector's histograms (within their bucket of
//! the exact order statistic), throughput that adds up to the traces written, the
//! accounting and the probe host's clock. `/` must be the page, loading nothing from
//! elsewhere.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use hoptrace_collector::live::Live;
use hoptrace_collector::metrics::MetricsServer;
use hoptrace_collector::{Collector, CollectorConfig};
use hoptrace_format::hist::SignedStats;
use hoptrace_format::spec::PipelineSpec;
use hoptrace_probe::{TraceContext, TraceKey};
use hoptrace_testkit::wait_for;

/// The Broker Time (publish -> flow_in) of each trace, ns: one negative (clock error), the
/// rest spread over three decades.
const BROKER_TIME_NS: [i64; 7] = [-3_000, 1_000, 2_047, 5_001, 8_193, 130_017, 2_100_000];

fn get(addr: SocketAddr, path: &str) -> (String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    (head.to_owned(), body.to_owned())
}

fn live(addr: SocketAddr) -> Live {
    let (head, body) = get(addr, "/live.json");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("application/json"), "{head}");
    serde_json::from_str(&body).unwrap()
}

/// The value of rank `max(1, ceil(q n))` of `sorted`.
fn exact(sorted: &[i64], q: f64) -> i64 {
    let n = sorted.len();
    let r = ((q * n as f64).ceil() as usize).clamp(1, n);
    sorted[r - 1]
}

#[test]
fn live_json_shows_the_figures_of_the_traces_written() {
    let tmp = hoptrace_testkit::tempdir("live-view");
    let spec = PipelineSpec::default_pipeline();
    let mut cfg = CollectorConfig::new("127.0.0.1:0", spec.clone(), &tmp);
    cfg.run_id = Some("live-test".into());
    let collector = Collector::start(cfg).unwrap();
    let server = MetricsServer::start_live("127.0.0.1:0", &collector.watch(), Some(70.0)).unwrap();
    let addr = server.local_addr();

    // Before anything arrives: the run and its stages, no figures.
    let first = live(addr);
    assert_eq!(first.run_id, "live-test");
    assert!(first.running);
    assert_eq!(first.significant_digits, 3);
    let names: Vec<&str> = spec.stages.iter().map(|s| s.name.as_str()).collect();
    let shown: Vec<&str> = first.stages.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(shown, names);
    assert_eq!(first.throughput.target_metrics_per_s, Some(70.0));

    let (exporter, probes, clock) =
        common::manual_probes(&spec, collector.local_addr(), "live-test");
    let now = hoptrace_probe::clock::realtime_ns();
    let base = now - now % 1_000_000_000 - 30_000_000_000;
    for (seq, d) in BROKER_TIME_NS.iter().enumerate() {
        let publish = base + seq as i64 * 10_000_000;
        let mut ctx = TraceContext::new(
            TraceKey {
                publisher: 4,
                stream: 0,
                sequence: seq as u64,
            },
            10,
            publish,
        );
        // publish, flow_in (the stage under test), then 1 µs per hop.
        let stamps = [
            publish,
            publish + d,
            publish + d + 1_000,
            publish + d + 2_000,
            publish + d + 3_000,
            publish + d + 4_000,
        ];
        for (probe, stamp) in probes.iter().zip(stamps) {
            clock.set(stamp);
            assert!(probe.record(&mut ctx).queued);
        }
    }

    // Every update seen, by interval: until the whole run holds the 7 traces and one more
    // interval has ended.
    let mut seen: Vec<Live> = vec![first];
    wait_for(
        "the live view to show the traces",
        Duration::from_secs(30),
        || {
            let l = live(addr);
            let done = l.stages[0].run.count == 7
                && !l.clocks.is_empty()
                && l.clocks[0].source.is_some()
                && seen
                    .iter()
                    .any(|s| s.stages[0].run.count == 7 && s.intervals < l.intervals);
            if seen.last().is_none_or(|s| s.intervals != l.intervals) {
                seen.push(l);
            }
            done
        },
    );
    let last = seen.last().unwrap().clone();

    // Whole run, Broker Time: the collector's histograms of exactly these deltas.
    let st = &last.stages[0];
    assert_eq!(
        (st.name.as_str(), st.from.as_str(), st.to.as_str()),
        ("Broker Time", "publish", "flow_in")
    );
    let mut oracle = SignedStats::default();
    oracle.add_values(&BROKER_TIME_NS);
    assert_eq!(st.run, hoptrace_collector::live::Figures::of(&oracle));
    let mut sorted = BROKER_TIME_NS.to_vec();
    sorted.sort_unstable();
    assert_eq!((st.run.count, st.run.negative), (7, 1));
    assert_eq!(
        (st.run.min_ns, st.run.max_ns),
        (Some(-3_000), Some(2_100_000))
    );
    for (q, got) in [
        (0.5, st.run.p50_ns),
        (0.9, st.run.p90_ns),
        (0.99, st.run.p99_ns),
        (0.999, st.run.p999_ns),
    ] {
        let (e, got) = (exact(&sorted, q), got.unwrap());
        // 3 significant digits: within half a bucket, at most 1/2048 of the value.
        assert!(
            got.abs_diff(e) <= e.unsigned_abs() / 2048 + 1,
            "p{q}: {got} against the exact {e}"
        );
    }
    // Flow Internal is 1 µs for every trace; the other stages too.
    assert_eq!(last.stages[1].run.count, 7);
    assert_eq!(last.stages[1].run.min_ns, Some(1_000));
    assert_eq!(last.stages[1].run.max_ns, Some(1_000));
    assert_eq!(last.stages[1].run.p99_ns, Some(1_000));

    // Each interval's figures are what the whole run gained in it, and the throughput
    // counts the same traces: every update seen right after the one before.
    let (mut gained, mut gaps) = (0, 0);
    for w in seen.windows(2) {
        if w[1].intervals != w[0].intervals + 1 {
            gaps += 1;
            continue;
        }
        let (a, b) = (&w[0].stages[0], &w[1].stages[0]);
        assert_eq!(b.run.count - a.run.count, b.interval.count, "{w:#?}");
        assert_eq!(
            w[1].accounting.complete - w[0].accounting.complete,
            w[1].throughput.messages
        );
        assert_eq!(w[1].throughput.metrics, 10 * w[1].throughput.messages);
        let len = w[1].interval.unwrap().length_s;
        assert!((1.0..5.0).contains(&len), "{len}");
        let rate = w[1].throughput.messages as f64 / len;
        assert!((w[1].throughput.messages_per_s - rate).abs() < 1e-9);
        // Records arriving are shown apart from traces written, with the join window.
        assert_eq!(
            w[1].accounting.records - w[0].accounting.records,
            w[1].throughput.records
        );
        let rate = w[1].throughput.records as f64 / len;
        assert!((w[1].throughput.records_per_s - rate).abs() < 1e-9);
        assert_eq!(w[1].throughput.join_window_ms, spec.join.window_ms);
        gained += b.interval.count;
        if b.interval.count > 0 {
            assert!(b.interval.min_ns.is_some() && b.interval.p50_ns.is_some());
        } else {
            assert_eq!(b.interval.p50_ns, None);
        }
    }
    // The slowest message of each interval, of Total Ingestion (the one headline stage
    // that splits): the interval's largest delta, the trace that had it, its timeline.
    let mut slowest_seen = 0;
    for l in &seen {
        for (i, st) in l.stages.iter().enumerate() {
            let Some(m) = &st.slowest else { continue };
            assert_eq!(st.name, "Total Ingestion", "{st:?}");
            assert_eq!(Some(m.delta_ns), st.interval.max_ns);
            let seq = usize::try_from(m.sequence).unwrap();
            assert_eq!((m.publisher, m.stream), (4, 0));
            assert_eq!(m.delta_ns, BROKER_TIME_NS[seq] + 4_000);
            let names: Vec<&str> = m.components.iter().map(|c| c.name.as_str()).collect();
            assert_eq!(
                names,
                [
                    "Broker Time",
                    "Flow Internal",
                    "Transmission",
                    "store_in → query_start",
                    "Query Duration"
                ]
            );
            let parts: Vec<Option<i64>> = m.components.iter().map(|c| c.ns).collect();
            assert_eq!(
                parts,
                [
                    Some(BROKER_TIME_NS[seq]),
                    Some(1_000),
                    Some(1_000),
                    Some(1_000),
                    Some(1_000)
                ]
            );
            assert_eq!(m.from_unix_ns, base + seq as i64 * 10_000_000);
            assert_eq!(m.otel_trace_id, None);
            assert!(i == 3 && st.interval.count > 0);
            slowest_seen += 1;
        }
    }
    assert!(slowest_seen > 0, "no interval showed a slowest message");

    // Seen from before the first trace, every update: the intervals hold every trace.
    if gaps == 0 {
        assert_eq!(gained, 7);
    } else {
        assert!(gained <= 7);
    }

    // Accounting and clocks, as counted.
    let a = &last.accounting;
    assert_eq!(
        (a.records, a.complete, a.incomplete, a.pending),
        (42, 7, 0, 0)
    );
    assert_eq!((a.late_records, a.duplicate_records), (0, 0));
    assert_eq!(a.negative_delta_traces, 1);
    assert_eq!(last.connections, 1);
    let c = &last.clocks[0];
    assert_eq!(c.host, hoptrace_clock::hostname());
    assert_eq!(c.connections, 1);
    assert!(c.synced.is_some() && c.error_bound_ns.is_some() && c.at_unix_ns.is_some());
    assert!(last.elapsed_s > 0.0 && last.updated_unix_ns > last.started_unix_ns);

    // The page: served whole, pointing nowhere but this server.
    let (head, page) = get(addr, "/");
    assert!(
        head.starts_with("HTTP/1.1 200") && head.contains("text/html"),
        "{head}"
    );
    assert!(
        head.contains("content-security-policy: default-src 'none'"),
        "{head}"
    );
    assert!(page.contains("fetch(\"live.json\""));
    assert!(
        get(addr, "/metrics")
            .1
            .contains("hoptrace_records_total 42")
    );
    assert!(get(addr, "/nothing").0.starts_with("HTTP/1.1 404"));

    let s = exporter.shutdown();
    assert!(s.clean, "{s:?}");
    let summary = collector.stop().unwrap();
    // Once stopped, the view says so, with the run's final figures.
    let end = live(addr);
    assert!(!end.running);
    assert_eq!(end.stages[0].run.count, 7);
    assert_eq!(end.stages[0].run.p50_ns, st.run.p50_ns);
    assert_eq!(summary.stages[0].figures.count, 7);
    drop(server);
    let _ = std::fs::remove_dir_all(&tmp);
}

/// A stage ending at a polled hop shows, beside its figures, those of its smallest and
/// largest possible deltas (to the hop's earliest instant, and to its stamp), over the
/// interval and the run, and still at the end of the run; a stage between two stamps of
/// one poll (announced by one connection) shows none.
#[test]
fn live_json_bounds_a_stage_that_ends_at_a_polled_hop() {
    use hoptrace_probe::testing::ManualClock;
    use hoptrace_probe::{Exporter, ExporterConfig, HopId};

    let spec = PipelineSpec::from_toml_str(
        r#"
name = "polled"
[[hops]]
name = "publish"
[[hops]]
name = "query_start"
[[hops]]
name = "queryable"
earliest = "queryable_earliest"
[[hops]]
name = "queryable_earliest"
[[stages]]
name = "Total Ingestion"
from = "publish"
to = "queryable"
definition = "From the publisher's egress until a poll found the data."
headline = true
[[stages]]
name = "Query Duration"
from = "query_start"
to = "queryable"
definition = "One poll: its send to its response."
"#,
    )
    .unwrap();
    let tmp = hoptrace_testkit::tempdir("live-view-bounds");
    let mut cfg = CollectorConfig::new("127.0.0.1:0", spec.clone(), &tmp);
    cfg.run_id = Some("live-bounds".into());
    let collector = Collector::start(cfg).unwrap();
    let server = MetricsServer::start_live("127.0.0.1:0", &collector.watch(), None).unwrap();
    let addr = server.local_addr();

    // Two connections, as a publisher and a store tap are: the tap announces the poll's
    // three hops.
    let exporter = |hops: &[(HopId, &str)], process: &str| {
        let mut c = ExporterConfig::new(collector.local_addr().to_string(), process);
        c.backoff_min = Duration::from_millis(5);
        Exporter::start(c, hops).unwrap()
    };
    let publisher = exporter(&[(HopId(0), "publish")], "publisher");
    let tap = exporter(
        &[
            (HopId(1), "query_start"),
            (HopId(2), "queryable"),
            (HopId(3), "queryable_earliest"),
        ],
        "tap",
    );
    let clock = ManualClock::new(0);
    let publish = publisher.probe_with_clock(HopId(0), clock.clone()).unwrap();
    let tap_probes: Vec<_> = (1..=3)
        .map(|h| tap.probe_with_clock(HopId(h), clock.clone()).unwrap())
        .collect();

    // Per trace: the data became queryable between `earliest` and `upper` after publish.
    let earliest: [i64; 6] = [
        1_000_000, 2_000_000, 3_100_000, 900_000, 12_000_000, 4_000_000,
    ];
    let upper: [i64; 6] = [
        9_000_000, 7_500_000, 14_000_000, 3_000_000, 25_000_000, 6_100_000,
    ];
    let now = hoptrace_probe::clock::realtime_ns();
    let base = now - now % 1_000_000_000 - 30_000_000_000;
    for (seq, (e, u)) in earliest.iter().zip(upper).enumerate() {
        let p = base + seq as i64 * 50_000_000;
        let mut ctx = TraceContext::new(
            TraceKey {
                publisher: 2,
                stream: 0,
                sequence: seq as u64,
            },
            1,
            p,
        );
        for (probe, stamp) in
            std::iter::once(&publish)
                .chain(&tap_probes)
                .zip([p, p + u - 500_000, p + u, p + e])
        {
            clock.set(stamp);
            assert!(probe.record(&mut ctx).queued);
        }
    }

    let mut last = live(addr);
    wait_for(
        "the run's figures and bounds",
        Duration::from_secs(30),
        || {
            last = live(addr);
            last.stages[0].run.count == 6 && last.stages[0].bounds.is_some()
        },
    );
    let figures = |v: &[i64]| {
        let mut s = SignedStats::default();
        s.add_values(v);
        hoptrace_collector::live::Figures::of(&s)
    };
    let check = |l: &Live| {
        let total = &l.stages[0];
        let b = total
            .bounds
            .as_ref()
            .expect("Total Ingestion ends at a polled hop");
        assert_eq!(b.polled, ["queryable"]);
        assert_eq!(b.run.lower, figures(&earliest));
        assert_eq!(b.run.upper, figures(&upper));
        // The upper side is the stage's own deltas, the point figures.
        assert_eq!(b.run.upper, total.run);
        assert!(b.run.lower.p50_ns <= total.run.p50_ns && b.run.lower.max_ns <= total.run.max_ns);
        // One poll's two stamps: exact, no bounds.
        assert_eq!(l.stages[1].run.count, 6);
        assert_eq!(l.stages[1].run.max_ns, Some(500_000));
        assert_eq!(l.stages[1].bounds, None);
    };
    check(&last);
    // The interval's bounds count what the interval's figures count.
    let b = last.stages[0].bounds.as_ref().unwrap();
    assert_eq!(b.interval.upper.count, last.stages[0].interval.count);

    assert!(publisher.shutdown().clean);
    assert!(tap.shutdown().clean);
    collector.stop().unwrap();
    let end = live(addr);
    assert!(!end.running);
    check(&end);
    drop(server);
    let _ = std::fs::remove_dir_all(&tmp);
}

/// The run's events as they happen: a publisher's late sends and broker reconnection
/// (counters of its own, beside its exporter's), then its connection cut without Goodbye
/// and a new one of the same instance: the live view lists what the report's "Events"
/// section will, in time order.
#[test]
fn live_json_lists_the_runs_events_as_they_happen() {
    use hoptrace_probe::{CountersFrame, Exporter, ExporterConfig, HopId};
    use hoptrace_protocol::{Frame, Hello, MAX_FRAME_LEN, counter_id};

    let spec = PipelineSpec::default_pipeline();
    let tmp = hoptrace_testkit::tempdir("live-view-events");
    let mut cfg = CollectorConfig::new("127.0.0.1:0", spec.clone(), &tmp);
    cfg.run_id = Some("live-events".into());
    let collector = Collector::start(cfg).unwrap();
    let server = MetricsServer::start_live("127.0.0.1:0", &collector.watch(), None).unwrap();
    let addr = server.local_addr();
    let publish = (
        HopId(spec.hops[0].id.unwrap_or(0)),
        spec.hops[0].name.as_str(),
    );

    let publisher = Exporter::start(
        ExporterConfig::new(collector.local_addr().to_string(), "publisher"),
        &[publish],
    )
    .unwrap();
    let now = hoptrace_probe::clock::realtime_ns();
    let late = |n: u64, max: u64| {
        publisher
            .send_counters_frame(CountersFrame {
                at_ns: now + n as i64 * 1_000_000,
                values: vec![(counter_id::LATE_SENDS, n), (counter_id::LAG_MAX_NS, max)],
            })
            .unwrap();
    };
    let kinds = |l: &Live| -> Vec<String> {
        l.events
            .iter()
            .map(|e| {
                serde_json::to_value(e.kind)
                    .unwrap()
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .collect()
    };
    // Frames queued together go out as one (the exporter keeps the latest value of each
    // id): the second waits until the live view shows the first.
    late(3, 25_000_000);
    wait_for("the first late sends", Duration::from_secs(30), || {
        kinds(&live(addr)).contains(&"publisher_behind_schedule".to_owned())
    });
    late(7, 40_000_000);
    publisher
        .send_counters_frame(CountersFrame {
            at_ns: now + 10_000_000,
            values: vec![(counter_id::BROKER_RECONNECTS, 1)],
        })
        .unwrap();

    // A raw connection cut without Goodbye, then the same instance again.
    let hello = Frame::Hello(Hello {
        version: 1,
        instance_id: 0x5EED,
        host: "h9".into(),
        process: "relay".into(),
        software: "live_view test".into(),
        token: String::new(),
        hops: vec![(publish.0, publish.1.to_owned())],
    });
    let connect = || {
        let mut s = TcpStream::connect(collector.local_addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(&hello.to_bytes().unwrap()).unwrap();
        assert!(matches!(
            hoptrace_protocol::read_frame(&mut s, MAX_FRAME_LEN).unwrap(),
            Frame::Welcome { .. }
        ));
        s
    };
    drop(connect());
    let again = connect();

    let mut last = live(addr);
    wait_for(
        "the live view to list the events",
        Duration::from_secs(30),
        || {
            last = live(addr);
            kinds(&last).len() >= 4
        },
    );
    let k = kinds(&last);
    for want in [
        "publisher_behind_schedule",
        "broker_reconnected",
        "probe_disconnected",
        "probe_reconnected",
    ] {
        assert_eq!(
            k.iter().filter(|x| *x == want).count(),
            1,
            "{want} in {k:?}"
        );
    }
    let late = last
        .events
        .iter()
        .find(|e| e.subject.starts_with("publisher@"))
        .filter(|e| e.detail.starts_with("7 messages"))
        .unwrap_or_else(|| panic!("{:?}", last.events));
    assert!(
        late.detail.contains("largest lag so far 40.0ms"),
        "{}",
        late.detail
    );
    assert_eq!(
        late.at_unix_ns,
        now + 3_000_000,
        "the episode's first frame"
    );
    let cut = last
        .events
        .iter()
        .find(|e| serde_json::to_value(e.kind).unwrap() == "probe_disconnected")
        .unwrap();
    assert_eq!(cut.subject, "relay@h9");
    assert!(
        last.events
            .windows(2)
            .all(|w| w[0].at_unix_ns <= w[1].at_unix_ns)
    );

    drop(again);
    assert!(publisher.shutdown().clean);
    collector.stop().unwrap();
    drop(server);
    let _ = std::fs::remove_dir_all(&tmp);
}
