//! The exporter never holds up the process it lives in, whatever the collector does.
//! Against collectors that refuse, cannot be reached (SYNs dropped), accept and never read,
//! send garbage, close after Hello, answer Welcome late or never, stall the TLS handshake,
//! or restart again and again, every call a host makes on its message path
//! ([`Probe::record`], [`Exporter::send_sent_frame`], [`Exporter::send_counters_frame`],
//! [`Exporter::counters`]) returns at once, and what cannot be queued is counted and
//! reaches the collector once one behaves.
//!
//! The time asserted ([`MAX_CALL`]) bounds blocking, not speed: a call that waited for the
//! network, a lock held across I/O or a full queue would take the connect, write or
//! Welcome timeouts (300 ms and more here), not microseconds. On a machine busy with other
//! work a call can also take long because its thread waited for a CPU; where the slowest
//! call of a batch passes half the bound, the time this process's threads spent waiting for
//! a CPU during the batch (Linux's schedstat run delay) is taken off it, so that the test
//! measures the probe, not the machine's load.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::MiniCollector;
use hoptrace_probe::{
    ClockReporting, CountersFrame, Exporter, ExporterConfig, HopId, Probe, SentEntry, SentFrame,
    TraceContext, TraceKey,
};
use hoptrace_protocol::{self as protocol, Frame, MAX_FRAME_LEN, counter_id};
use hoptrace_testkit::{Acceptor, wait_for};

const MAX_CALL: Duration = Duration::from_millis(50);
const QUEUE: usize = 2000;
const STREAMS: u32 = 3;
const PUBLISHER: u16 = 9;
const TAP_IDS: [u16; 2] = [64, 65];
const HOPS: &[(HopId, &str)] = &[(HopId(1), "flow_in"), (HopId(2), "flow_out")];

fn config(addr: SocketAddr) -> ExporterConfig {
    let mut c = ExporterConfig::new(addr.to_string(), "hostile-test");
    c.clock = ClockReporting::Off;
    c.queue_capacity = QUEUE;
    c.retention_bytes = 64 << 10;
    c.counters_interval = Duration::from_millis(50);
    c.backoff_min = Duration::from_millis(10);
    c.backoff_max = Duration::from_millis(100);
    c.connect_timeout = Duration::from_millis(300);
    c.write_timeout = Duration::from_millis(300);
    c
}

/// What a collector does to every connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Accepts, never reads, never answers (also: a TLS handshake that never ends).
    Silent,
    /// Answers Welcome, then never reads: the socket buffers fill.
    WelcomeThenDeaf,
    /// Answers Hello with bytes that are no frame.
    Garbage,
    /// Welcome, then bytes that are no frame.
    WelcomeThenGarbage,
    /// Reads Hello and closes.
    CloseAfterHello,
    /// Answers Welcome this long after Hello, then reads everything and acknowledges
    /// nothing.
    SlowWelcome(Duration),
}

/// A frame header that claims the largest frame, then junk: no decoder may take it.
fn garbage() -> Vec<u8> {
    let mut g = vec![0xff, 0xff, 0xff, 0x7f];
    g.extend((0..=255u8).cycle().take(1024));
    g
}

/// A collector that does one wrong thing to every connection, on 127.0.0.1.
struct Hostile {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    hellos: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
    acceptor: Acceptor,
}

impl Hostile {
    fn start(mode: Mode) -> Self {
        let (accepted, hellos, stop, conns) = (
            Arc::<AtomicUsize>::default(),
            Arc::<AtomicUsize>::default(),
            Arc::<AtomicBool>::default(),
            Arc::<Mutex<Vec<TcpStream>>>::default(),
        );
        let acceptor = {
            let (accepted, hellos, stop, conns) = (
                accepted.clone(),
                hellos.clone(),
                stop.clone(),
                conns.clone(),
            );
            Acceptor::spawn(TcpListener::bind("127.0.0.1:0").unwrap(), move |s| {
                accepted.fetch_add(1, Relaxed);
                conns.lock().unwrap().push(s.try_clone().unwrap());
                let (hellos, stop) = (hellos.clone(), stop.clone());
                std::thread::spawn(move || serve(s, mode, &hellos, &stop));
            })
        };
        Self {
            addr: acceptor.addr(),
            accepted,
            hellos,
            stop,
            conns,
            acceptor,
        }
    }

    /// Stops listening and closes every connection: the port is free again.
    fn close(&self) {
        self.stop.store(true, Relaxed);
        self.acceptor.stop();
        for c in self.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// Waits `d`, or less when the collector is closed; whether it was closed. The waiting is
/// what is tested: a collector that says nothing (or says it late), or restarts on a beat.
fn nap(stop: &AtomicBool, d: Duration) -> bool {
    let end = Instant::now() + d;
    while Instant::now() < end {
        if stop.load(Relaxed) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    stop.load(Relaxed)
}

fn serve(mut s: TcpStream, mode: Mode, hellos: &AtomicUsize, stop: &AtomicBool) {
    if mode == Mode::Silent {
        nap(stop, Duration::from_secs(3600));
        return;
    }
    let Ok(Frame::Hello(hello)) = protocol::read_frame(&mut s, MAX_FRAME_LEN) else {
        return;
    };
    hellos.fetch_add(1, Relaxed);
    let welcome = Frame::Welcome {
        version: hello.version,
        run_id: "hostile-run".into(),
        resume_seq: 0,
    }
    .to_bytes()
    .unwrap();
    let _ = match mode {
        Mode::CloseAfterHello | Mode::Silent => return,
        Mode::Garbage => s.write_all(&garbage()),
        Mode::SlowWelcome(d) => {
            if nap(stop, d) {
                return;
            }
            if s.write_all(&welcome).is_err() {
                return;
            }
            let mut buf = vec![0u8; 1 << 16];
            while matches!(s.read(&mut buf), Ok(n) if n > 0) {}
            return;
        }
        Mode::WelcomeThenDeaf => s.write_all(&welcome),
        Mode::WelcomeThenGarbage => s.write_all(&welcome).and_then(|()| s.write_all(&garbage())),
    };
    // Reads nothing more.
    nap(stop, Duration::from_secs(3600));
}

/// A listening port whose accept queue is full: the kernel drops every further SYN, so a
/// connection attempt hangs until its own timeout, as with a host that does not answer.
struct Unreachable {
    addr: SocketAddr,
    _listener: socket2::Socket,
    _held: Vec<TcpStream>,
}

impl Unreachable {
    fn start() -> Self {
        use socket2::{Domain, Socket, Type};
        let l = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        l.set_reuse_address(true).unwrap();
        l.bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
            .unwrap();
        l.listen(0).unwrap();
        let addr = l.local_addr().unwrap().as_socket().unwrap();
        let mut held = Vec::new();
        // Fill the queue until an attempt times out: from then on SYNs are dropped.
        while held.len() < 16 {
            match TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
                Ok(s) => held.push(s),
                Err(_) => break,
            }
        }
        assert!(held.len() < 16, "the accept queue never filled");
        Self {
            addr,
            _listener: l,
            _held: held,
        }
    }
}

/// Nanoseconds this process's threads have waited for a CPU (0 where unknown).
fn run_delay_ns() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum()
}

/// What the host did, and the slowest call it made.
#[derive(Debug)]
struct Load {
    calls: u64,
    records: u64,
    slowest: Duration,
    /// The newest cumulative Sent entry of each stream the host handed over.
    last_sent: BTreeMap<u32, SentEntry>,
    /// The newest value of each of the host's own counters.
    last_counters: BTreeMap<u16, u64>,
}

fn ctx(seq: u64) -> TraceContext {
    TraceContext::new(
        TraceKey {
            publisher: 1,
            stream: (seq % u64::from(STREAMS)) as u32,
            sequence: seq,
        },
        1,
        0,
    )
}

/// What a host does on its message path for `run`: records at two hops, and every 100
/// messages its own cumulative Sent frame, counters of its own, and a look at the
/// exporter's counters; every call timed.
fn host_load(ex: &Exporter, run: Duration) -> Load {
    let probes: Vec<Probe> = HOPS.iter().map(|(h, _)| ex.probe(*h).unwrap()).collect();
    let mut load = Load {
        calls: 0,
        records: 0,
        slowest: Duration::ZERO,
        last_sent: BTreeMap::new(),
        last_counters: BTreeMap::new(),
    };
    let mut seq = 0u64;
    let end = Instant::now() + run;
    let timed = |slowest: &mut Duration, f: &mut dyn FnMut()| {
        let t = Instant::now();
        f();
        *slowest = (*slowest).max(t.elapsed());
    };
    while Instant::now() < end {
        let mut batch = Duration::ZERO;
        let waited = run_delay_ns();
        for _ in 0..200 {
            let mut c = ctx(seq);
            seq += 1;
            timed(&mut batch, &mut || {
                for p in &probes {
                    p.record(&mut c);
                }
            });
            load.records += probes.len() as u64;
            load.calls += probes.len() as u64;
            if seq.is_multiple_of(100) {
                let entries: Vec<SentEntry> = (0..STREAMS)
                    .map(|s| {
                        let m = seq / u64::from(STREAMS);
                        SentEntry {
                            stream: s,
                            messages: m,
                            metrics: m,
                            first_sequence: 0,
                            last_sequence: m.saturating_sub(1),
                        }
                    })
                    .collect();
                let values: Vec<(u16, u64)> = TAP_IDS.iter().map(|&i| (i, seq)).collect();
                timed(&mut batch, &mut || {
                    ex.send_sent_frame(SentFrame {
                        publisher: PUBLISHER,
                        entries: entries.clone(),
                    })
                    .unwrap();
                    ex.send_counters_frame(CountersFrame {
                        at_ns: 1,
                        values: values.clone(),
                    })
                    .unwrap();
                    std::hint::black_box(ex.counters());
                    std::hint::black_box(ex.is_connected());
                });
                load.calls += 4;
                load.last_sent = entries.into_iter().map(|e| (e.stream, e)).collect();
                load.last_counters = values.into_iter().collect();
            }
        }
        if batch > MAX_CALL / 2 {
            batch = batch.saturating_sub(Duration::from_nanos(run_delay_ns() - waited));
        }
        load.slowest = load.slowest.max(batch);
        // Pacing: a host that also does other work (the sleep is the workload, not a wait
        // for a condition); it gives the exporter's threads their turns.
        std::thread::sleep(Duration::from_millis(1));
    }
    load
}

fn assert_host_never_waited(load: &Load, ex: &Exporter) {
    assert!(
        load.slowest < MAX_CALL,
        "a host call took {:?} ({load:?})",
        load.slowest
    );
    assert!(load.calls > 5000, "thousands of calls measured: {load:?}");
    let c = ex.counters();
    eprintln!(
        "{} calls, slowest {:?}; {c:?}; last error {:?}",
        load.calls,
        load.slowest,
        ex.last_error()
    );
    assert_eq!(c.reported, load.records, "every record reported is counted");
}

/// A collector that behaves, on the same port, then the host shuts down: the exporter's
/// counters (the records it could not queue among them), the host's newest Sent entry of
/// each stream and its own counters reach it. They were kept while no collector took
/// them; where a collector took them and lost them (`send_again`), the host sends them
/// again, as a publisher does every second.
fn recover_and_check(ex: Exporter, addr: SocketAddr, load: &Load, send_again: bool) {
    let mc = MiniCollector::start_on(TcpListener::bind(addr).unwrap(), None);
    // Its Hello first: until then `is_connected` may still speak of the hostile
    // collector's last connection.
    mc.wait_for("a hello", Duration::from_secs(10), |f| {
        f.iter().any(|(_, f)| matches!(f, Frame::Hello(_)))
    });
    wait_for(
        "a connection to the collector that behaves",
        Duration::from_secs(10),
        || ex.is_connected(),
    );
    if send_again {
        ex.send_sent_frame(SentFrame {
            publisher: PUBLISHER,
            entries: load.last_sent.values().copied().collect(),
        })
        .unwrap();
        ex.send_counters_frame(CountersFrame {
            at_ns: 1,
            values: load.last_counters.iter().map(|(k, v)| (*k, *v)).collect(),
        })
        .unwrap();
    }
    let summary = ex.shutdown();
    assert!(summary.clean, "{summary:?}");
    mc.wait_for_goodbye();
    let frames = mc.frames.lock().unwrap().clone();
    let finals: Vec<&CountersFrame> = frames
        .iter()
        .filter_map(|(_, f)| match f {
            Frame::Counters(c) => Some(c),
            _ => None,
        })
        .collect();
    let s = summary.counters;
    let exporter_final = finals
        .iter()
        .rev()
        .find(|c| c.get(counter_id::REPORTED) > 0)
        .expect("the exporter's final counters");
    assert_eq!(exporter_final.get(counter_id::REPORTED), load.records);
    assert_eq!(exporter_final.get(counter_id::QUEUE_FULL), s.queue_full);
    for (id, v) in &load.last_counters {
        assert!(
            finals.iter().any(|c| c.get(*id) == *v),
            "the host's counter {id} = {v} arrived"
        );
    }
    let mut sent: BTreeMap<u32, SentEntry> = BTreeMap::new();
    for (_, f) in &frames {
        if let Frame::Sent(sf) = f
            && sf.publisher == PUBLISHER
        {
            for e in &sf.entries {
                sent.insert(e.stream, *e);
            }
        }
    }
    assert_eq!(sent, load.last_sent, "the newest Sent entry of each stream");
}

fn never_welcomed(addr: SocketAddr, tweak: impl FnOnce(&mut ExporterConfig)) -> (Exporter, Load) {
    let mut cfg = config(addr);
    tweak(&mut cfg);
    let ex = Exporter::start(cfg, HOPS).unwrap();
    let load = host_load(&ex, Duration::from_millis(1500));
    assert!(!ex.is_connected());
    assert!(ex.last_error().is_some(), "it says why it is not connected");
    assert_host_never_waited(&load, &ex);
    let c = ex.counters();
    assert!(
        c.queue_full >= load.records - QUEUE as u64,
        "beyond the queue every record is counted: {c:?}"
    );
    (ex, load)
}

#[test]
fn a_refused_connection_costs_the_host_nothing() {
    let addr: SocketAddr = ([127, 0, 0, 1], hoptrace_testkit::closed_port()).into();
    let (ex, load) = never_welcomed(addr, |_| {});
    assert!(
        ex.last_error().unwrap().contains("connect"),
        "{:?}",
        ex.last_error()
    );
    recover_and_check(ex, addr, &load, false);
}

#[test]
fn an_unreachable_collector_costs_the_host_nothing() {
    let u = Unreachable::start();
    let addr = u.addr;
    let t = Instant::now();
    let (ex, load) = never_welcomed(addr, |_| {});
    assert!(t.elapsed() >= Duration::from_millis(1500));
    let err = ex.last_error().unwrap();
    assert!(err.contains("timed out"), "{err}");
    drop(u);
    recover_and_check(ex, addr, &load, false);
}

#[test]
fn collectors_that_never_welcome_cost_the_host_nothing() {
    for mode in [
        Mode::Silent,
        Mode::Garbage,
        Mode::CloseAfterHello,
        Mode::SlowWelcome(Duration::from_secs(30)),
    ] {
        let h = Hostile::start(mode);
        let (ex, load) = never_welcomed(h.addr, |_| {});
        assert!(h.accepted.load(Relaxed) >= 2, "{mode:?}: it tried again");
        if mode != Mode::Silent {
            assert!(h.hellos.load(Relaxed) >= 2, "{mode:?}: it said Hello again");
        }
        let err = ex.last_error().unwrap();
        let why = match mode {
            Mode::Silent | Mode::SlowWelcome(_) => "within 300ms (connect_timeout)",
            Mode::Garbage => "too large",
            _ => "no welcome",
        };
        assert!(
            err.contains("no welcome") && err.contains(why),
            "{mode:?}: {err}"
        );
        h.close();
        recover_and_check(ex, h.addr, &load, false);
    }
}

#[test]
fn collectors_that_welcome_then_misbehave_cost_the_host_nothing() {
    for mode in [Mode::WelcomeThenDeaf, Mode::WelcomeThenGarbage] {
        let h = Hostile::start(mode);
        let ex = Exporter::start(config(h.addr), HOPS).unwrap();
        let load = host_load(&ex, Duration::from_secs(2));
        assert_host_never_waited(&load, &ex);
        assert!(
            h.hellos.load(Relaxed) >= 2,
            "{mode:?}: it gave up on the connection and tried again"
        );
        let c = ex.counters();
        if mode == Mode::WelcomeThenDeaf {
            // Writes block until the write timeout; the queue fills meanwhile.
            assert!(c.queue_full > 0 && c.evicted > 0, "{c:?}");
            let err = ex.last_error().unwrap_or_default();
            assert!(err.contains("read nothing for 300ms"), "{err}");
        }
        // A connection that is lost soon after its Welcome backs off like a failed
        // attempt: no tight loop of reconnections, each sending the retention buffer
        // again (at most one attempt per 10 ms backoff, doubling to 100 ms).
        assert!(c.reconnects <= 30, "{mode:?}: {c:?}");
        h.close();
        recover_and_check(ex, h.addr, &load, true);
    }
}

#[test]
fn a_late_welcome_costs_the_host_nothing() {
    let h = Hostile::start(Mode::SlowWelcome(Duration::from_millis(1500)));
    let mut cfg = config(h.addr);
    cfg.connect_timeout = Duration::from_secs(5);
    let t = Instant::now();
    let ex = Exporter::start(cfg, HOPS).unwrap();
    let load = host_load(&ex, Duration::from_millis(2500));
    assert_host_never_waited(&load, &ex);
    wait_for("the late Welcome", Duration::from_secs(5), || {
        ex.is_connected()
    });
    assert!(t.elapsed() >= Duration::from_millis(1500));
    assert_eq!(
        h.hellos.load(Relaxed),
        1,
        "one attempt waited for the Welcome"
    );
    let summary = ex.shutdown_promptly(Duration::from_millis(200));
    assert_eq!(summary.counters.reported, load.records);
    h.close();
}

#[cfg(feature = "tls")]
#[test]
fn a_tls_handshake_that_never_ends_costs_the_host_nothing() {
    let dir = hoptrace_testkit::tempdir("hostile-tls");
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = dir.join("ca.pem");
    std::fs::write(&ca, params.self_signed(&key).unwrap().pem()).unwrap();
    let h = Hostile::start(Mode::Silent);
    let (ex, _load) = never_welcomed(h.addr, |c| c.tls_ca = Some(ca.clone()));
    assert!(h.accepted.load(Relaxed) >= 2, "it tried again");
    let err = ex.last_error().unwrap();
    assert!(
        err.contains("TLS handshake: the collector did not answer within connect_timeout"),
        "{err}"
    );
    let t = Instant::now();
    let _ = ex.shutdown_promptly(Duration::from_millis(100));
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "shutdown waited {:?}",
        t.elapsed()
    );
    h.close();
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_collector_that_restarts_again_and_again_costs_the_host_nothing() {
    let mode = common::Durable::default();
    mode.ack.store(true, Relaxed);
    let mc = Arc::new(MiniCollector::durable(&mode));
    let stop = Arc::new(AtomicBool::new(false));
    let restarts = {
        let (stop, mc) = (stop.clone(), mc.clone());
        std::thread::spawn(move || {
            let mut n = 0u32;
            // The period is what is tested: a restart every 200 ms, keeping what it holds.
            while !nap(&stop, Duration::from_millis(200)) {
                mc.cut_connections();
                n += 1;
            }
            n
        })
    };
    let ex = Exporter::start(config(mc.addr), HOPS).unwrap();
    let load = host_load(&ex, Duration::from_secs(2));
    stop.store(true, Relaxed);
    let restarts = restarts.join().unwrap();
    assert!(restarts >= 5, "{restarts} restarts");
    assert_host_never_waited(&load, &ex);
    wait_for(
        "the connection after the last restart",
        Duration::from_secs(5),
        || ex.is_connected(),
    );
    let summary = ex.shutdown();
    assert!(summary.clean, "{summary:?}");
    mc.wait_for_goodbye();
    let s = summary.counters;
    assert!(s.reconnects >= 3, "{s:?}");
    // Every record reached the collector (once or, sent again after a cut, more) or is
    // counted as not delivered.
    let delivered: BTreeSet<(u8, u64)> = mc
        .records()
        .iter()
        .map(|r| (r.hop.0, r.key.sequence))
        .collect();
    assert!(delivered.len() as u64 <= load.records);
    assert!(
        delivered.len() as u64 + s.queue_full + s.lost_unacked + s.send_failed >= load.records,
        "delivered {} of {}: {s:?}",
        delivered.len(),
        load.records
    );
}
