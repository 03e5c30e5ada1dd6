//! What probes say besides their records, kept for the run: who they are (Hello), their
//! clocks (with the preflight's alerts), their counters and what publishers sent. The TCP
//! collector ([`crate::run`]) and the group members ([`crate::kafka`]) both keep one;
//! checkpoints hold it whole ([`ControlSnapshot`]).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;

use hoptrace_protocol::ClockStatus;
use hoptrace_protocol::{CountersFrame, Frame, Hello, MAX_HOPS, SentEntry, counter_id};
use serde::{Deserialize, Serialize};

use crate::live::HostClock;
use crate::server::Event;
use crate::tables::{CounterRow, write_clock, write_probes};
use crate::writer::WriteError;
use hoptrace_format::events::{ClockChanges, CounterEpisodes, RunEvent};
use hoptrace_format::run::{ClockRow, ProbeInfo, Restart};
#[cfg(feature = "kafka")]
use hoptrace_format::spec::ResolvedSpec;

/// A probe connection: its Hello, where it came from, how it ended, its counters.
pub(crate) struct ProbeConn {
    hello: Hello,
    peer: SocketAddr,
    open: bool,
    clean: bool,
    /// The latest value of each counter id its Counters frames held (a frame may hold
    /// any subset: a tap's or publisher's own frames come beside the exporter's), at
    /// the latest frame's time.
    counters: Option<CountersFrame>,
    /// Stamps stored in traces, by hop index.
    pub(crate) stamps: [u64; MAX_HOPS],
    /// When it connected and when it ended, Unix ns (`None`: not known, or open).
    connected_unix_ns: Option<i64>,
    closed_unix_ns: Option<i64>,
}

/// What probes said besides their records: who they are, their clocks, their counters
/// and what publishers sent. Shared by the TCP collector and group members, which read
/// it from Kafka.
#[derive(Default)]
pub(crate) struct Control {
    pub(crate) probes: BTreeMap<u64, ProbeConn>,
    clock: Vec<ClockRow>,
    counter_rows: Vec<CounterRow>,
    sent: BTreeMap<(u16, u32), SentEntry>,
    /// Exporter instances that sent Sent frames, per publisher id.
    sent_by: BTreeMap<u16, std::collections::BTreeSet<u64>>,
    max_clock_error_ns: Option<u64>,
    clock_alerts: Vec<String>,
    /// (host, reason) of each alert raised: one per host and reason.
    clock_alert_kinds: Vec<(String, String)>,
    /// The run's events so far that clock reports and counters tell (the live view's).
    clock_changes: ClockChanges,
    counter_episodes: CounterEpisodes,
}

/// What a checkpoint keeps of [`Control`]: everything it holds.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct ControlSnapshot {
    probes: Vec<ProbeSnapshot>,
    clock: Vec<ClockRow>,
    counter_rows: Vec<CounterRow>,
    /// (publisher, stream, messages, metrics, first sequence, last sequence).
    sent: Vec<(u16, u32, u64, u64, u64, u64)>,
    sent_by: Vec<(u16, Vec<u64>)>,
    clock_alerts: Vec<String>,
    clock_alert_kinds: Vec<(String, String)>,
}

/// A probe connection in a [`ControlSnapshot`].
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ProbeSnapshot {
    id: u64,
    version: u16,
    instance_id: u64,
    host: String,
    process: String,
    software: String,
    token: String,
    hops: Vec<(u8, String)>,
    peer: SocketAddr,
    open: bool,
    clean: bool,
    /// The latest value of each counter id: (latest frame's at ns, values).
    counters: Option<(i64, Vec<(u16, u64)>)>,
    stamps: Vec<u64>,
    #[serde(default)]
    connected_unix_ns: Option<i64>,
    #[serde(default)]
    closed_unix_ns: Option<i64>,
}

/// Keeps the latest value of each id of `c` in `into` (ids `c` lacks keep theirs).
fn merge_counters(into: &mut Option<CountersFrame>, c: CountersFrame) {
    let Some(m) = into else {
        *into = Some(c);
        return;
    };
    m.at_ns = m.at_ns.max(c.at_ns);
    for (id, v) in c.values {
        match m.values.iter_mut().find(|(i, _)| *i == id) {
            Some(slot) => slot.1 = v,
            None => m.values.push((id, v)),
        }
    }
}

/// The reason of a clock alert, for one alert per host and reason.
fn preflight_kind(e: &hoptrace_clock::PreflightError) -> &'static str {
    use hoptrace_clock::PreflightError as P;
    match e {
        P::Unsynchronised { .. } => "unsynchronised",
        P::ErrorBoundTooLarge { .. } => "error_bound",
    }
}

impl Control {
    /// An empty one; a clock reporting an error bound above `max_clock_error_ns` raises
    /// an alert.
    pub(crate) fn new(max_clock_error_ns: Option<u64>) -> Self {
        Self {
            max_clock_error_ns,
            ..Self::default()
        }
    }

    /// Takes a connection event or a control frame; records frames are not its business.
    pub(crate) fn handle(&mut self, ev: Event) {
        self.handle_at(ev, None);
    }

    /// [`Self::handle`], with the collector's Unix time of a connection's start or end.
    pub(crate) fn handle_at(&mut self, ev: Event, unix_ns: Option<i64>) {
        match ev {
            Event::FrameWithBytes(id, f, _) => self.handle(Event::Frame(id, f)),
            Event::Connected(id, peer, hello) => {
                self.probes.insert(
                    id,
                    ProbeConn {
                        hello,
                        peer,
                        open: true,
                        clean: false,
                        counters: None,
                        stamps: [0; MAX_HOPS],
                        connected_unix_ns: unix_ns,
                        closed_unix_ns: None,
                    },
                );
            }
            Event::Closed(id, clean) => {
                if let Some(p) = self.probes.get_mut(&id) {
                    p.open = false;
                    p.clean = clean;
                    p.closed_unix_ns = unix_ns;
                }
            }
            Event::Frame(id, Frame::Clock(c)) => {
                let host = self
                    .probes
                    .get(&id)
                    .map(|p| p.hello.host.clone())
                    .unwrap_or_default();
                let instance_id = self.probes.get(&id).map_or(0, |p| p.hello.instance_id);
                if let Some(max) = self.max_clock_error_ns
                    && let Err(e) = hoptrace_clock::preflight_host(&host, &c, max)
                {
                    let alert = e.to_string();
                    // One alert per host and reason; the bound in the text may vary.
                    let reason = preflight_kind(&e);
                    let seen = self
                        .clock_alert_kinds
                        .iter()
                        .any(|(h, r)| *h == host && r == reason);
                    if !seen {
                        tracing::warn!("clock preflight: {alert}");
                        self.clock_alert_kinds
                            .push((host.clone(), reason.to_owned()));
                        self.clock_alerts.push(alert);
                    }
                }
                let row = clock_row(host, instance_id, &c);
                self.clock_changes.row(&row);
                self.clock.push(row);
            }
            Event::Frame(id, Frame::Counters(c)) => {
                if let Some(p) = self.probes.get_mut(&id) {
                    self.counter_episodes.frame(
                        p.hello.instance_id,
                        &format!("{}@{}", p.hello.process, p.hello.host),
                        c.at_ns,
                        &c.values,
                    );
                    self.counter_rows.push(CounterRow {
                        instance_id: p.hello.instance_id,
                        host: p.hello.host.clone(),
                        process: p.hello.process.clone(),
                        at_ns: c.at_ns,
                        values: c.values.clone(),
                    });
                    merge_counters(&mut p.counters, c);
                }
            }
            Event::Frame(id, Frame::Sent(s)) => {
                if let Some(p) = self.probes.get(&id) {
                    self.sent_by
                        .entry(s.publisher)
                        .or_default()
                        .insert(p.hello.instance_id);
                }
                for e in s.entries {
                    self.sent.insert((s.publisher, e.stream), e);
                }
            }
            Event::Frame(..) => {}
        }
    }

    /// Everything it holds, for a checkpoint.
    pub(crate) fn snapshot(&self) -> ControlSnapshot {
        ControlSnapshot {
            probes: self
                .probes
                .iter()
                .map(|(&id, p)| ProbeSnapshot {
                    id,
                    version: p.hello.version,
                    instance_id: p.hello.instance_id,
                    host: p.hello.host.clone(),
                    process: p.hello.process.clone(),
                    software: p.hello.software.clone(),
                    token: p.hello.token.clone(),
                    hops: p.hello.hops.iter().map(|(h, n)| (h.0, n.clone())).collect(),
                    peer: p.peer,
                    open: p.open,
                    clean: p.clean,
                    counters: p.counters.as_ref().map(|c| (c.at_ns, c.values.clone())),
                    stamps: p.stamps.to_vec(),
                    connected_unix_ns: p.connected_unix_ns,
                    closed_unix_ns: p.closed_unix_ns,
                })
                .collect(),
            clock: self.clock.clone(),
            counter_rows: self.counter_rows.clone(),
            sent: self
                .sent
                .iter()
                .map(|(&(p, s), e)| {
                    (
                        p,
                        s,
                        e.messages,
                        e.metrics,
                        e.first_sequence,
                        e.last_sequence,
                    )
                })
                .collect(),
            sent_by: self
                .sent_by
                .iter()
                .map(|(p, i)| (*p, i.iter().copied().collect()))
                .collect(),
            clock_alerts: self.clock_alerts.clone(),
            clock_alert_kinds: self.clock_alert_kinds.clone(),
        }
    }

    /// What a checkpoint held; `max_clock_error_ns` is this collector's.
    pub(crate) fn restore(snap: ControlSnapshot, max_clock_error_ns: Option<u64>) -> Self {
        let mut clock_changes = ClockChanges::default();
        for r in &snap.clock {
            clock_changes.row(r);
        }
        let mut counter_episodes = CounterEpisodes::default();
        for r in &snap.counter_rows {
            counter_episodes.frame(
                r.instance_id,
                &format!("{}@{}", r.process, r.host),
                r.at_ns,
                &r.values,
            );
        }
        Self {
            clock_changes,
            counter_episodes,
            probes: snap
                .probes
                .into_iter()
                .map(|p| {
                    let mut stamps = [0u64; MAX_HOPS];
                    for (d, s) in stamps.iter_mut().zip(&p.stamps) {
                        *d = *s;
                    }
                    let conn = ProbeConn {
                        hello: Hello {
                            version: p.version,
                            instance_id: p.instance_id,
                            host: p.host,
                            process: p.process,
                            software: p.software,
                            token: p.token,
                            hops: p
                                .hops
                                .into_iter()
                                .map(|(h, n)| (hoptrace_protocol::HopId(h), n))
                                .collect(),
                        },
                        peer: p.peer,
                        open: p.open,
                        clean: p.clean,
                        counters: p
                            .counters
                            .map(|(at_ns, values)| CountersFrame { at_ns, values }),
                        stamps,
                        connected_unix_ns: p.connected_unix_ns,
                        closed_unix_ns: p.closed_unix_ns,
                    };
                    (p.id, conn)
                })
                .collect(),
            clock: snap.clock,
            counter_rows: snap.counter_rows,
            sent: snap
                .sent
                .into_iter()
                .map(
                    |(p, stream, messages, metrics, first_sequence, last_sequence)| {
                        (
                            (p, stream),
                            SentEntry {
                                stream,
                                messages,
                                metrics,
                                first_sequence,
                                last_sequence,
                            },
                        )
                    },
                )
                .collect(),
            sent_by: snap
                .sent_by
                .into_iter()
                .map(|(p, i)| (p, i.into_iter().collect()))
                .collect(),
            max_clock_error_ns,
            clock_alerts: snap.clock_alerts,
            clock_alert_kinds: snap.clock_alert_kinds,
        }
    }

    /// Every probe host (of a connection now or before), with its connections open and
    /// its clock as its probes' last Clock frame said (unknown without one), by name.
    pub(crate) fn host_clocks(&self) -> Vec<HostClock> {
        let mut open: BTreeMap<&str, u64> = BTreeMap::new();
        for p in self.probes.values() {
            *open.entry(p.hello.host.as_str()).or_default() += u64::from(p.open);
        }
        // The rows come in the order the frames arrived: the last one of a host is its
        // latest report.
        let mut last: BTreeMap<&str, &ClockRow> = BTreeMap::new();
        for r in &self.clock {
            last.insert(r.host.as_str(), r);
        }
        let mut hosts: Vec<&str> = open.keys().chain(last.keys()).copied().collect();
        hosts.sort_unstable();
        hosts.dedup();
        hosts
            .into_iter()
            .map(|h| HostClock::new(h, open.get(h).copied().unwrap_or(0), last.get(h).copied()))
            .collect()
    }

    /// Probe connections still open.
    pub(crate) fn open(&self) -> usize {
        self.probes.values().filter(|p| p.open).count()
    }

    /// Ids of the probe connections still open.
    pub(crate) fn open_ids(&self) -> Vec<u64> {
        self.probes
            .iter()
            .filter(|(_, p)| p.open)
            .map(|(id, _)| *id)
            .collect()
    }

    /// The run closes: the exporters that sent what publishers sent are gone. A publisher
    /// that reports again in a continued run is the same publisher going on, whatever its
    /// exporter instance, not a second one sharing its id.
    pub(crate) fn forget_senders(&mut self) {
        self.sent_by.clear();
    }

    /// Writes `clock.parquet` and `probes.parquet` into `run_dir`.
    pub(crate) fn write_tables(&self, run_dir: &Path) -> Result<(), WriteError> {
        write_clock(&run_dir.join("clock.parquet"), &self.clock)?;
        write_probes(&run_dir.join("probes.parquet"), &self.counter_rows)
    }

    /// What publishers said they sent, per (publisher, stream): their last Sent entries.
    pub(crate) fn sent(&self) -> &BTreeMap<(u16, u32), SentEntry> {
        &self.sent
    }

    /// What publishers said they sent, per publisher: (messages, metrics).
    #[cfg(feature = "kafka")]
    pub(crate) fn sent_by_publisher(&self) -> BTreeMap<u16, (u64, u64)> {
        let mut out: BTreeMap<u16, (u64, u64)> = BTreeMap::new();
        for ((p, _), e) in &self.sent {
            let t = out.entry(*p).or_default();
            t.0 += e.messages;
            t.1 += e.metrics;
        }
        out
    }

    /// The records a relay forwarded from connection `id`, by hop wire id (counter id):
    /// the group member's count of that probe's stamps, by hop index.
    #[cfg(feature = "kafka")]
    pub(crate) fn forwarded(&mut self, id: u64, c: &CountersFrame, spec: &ResolvedSpec) {
        let Some(p) = self.probes.get_mut(&id) else {
            return;
        };
        p.stamps = [0; MAX_HOPS];
        for (hop, n) in &c.values {
            let index = u8::try_from(*hop)
                .ok()
                .and_then(|h| spec.hop_index(hoptrace_protocol::HopId(h)));
            if let Some(i) = index {
                p.stamps[i] = *n;
            }
        }
    }

    /// Counter `id` summed over exporter instances, each at its latest Counters frame.
    #[cfg(feature = "kafka")]
    pub(crate) fn latest_counter_sum(&self, id: u16) -> u64 {
        let mut last: BTreeMap<u64, &CountersFrame> = BTreeMap::new();
        for p in self.probes.values() {
            if let Some(c) = &p.counters {
                let e = last.entry(p.hello.instance_id).or_insert(c);
                if c.at_ns >= e.at_ns {
                    *e = c;
                }
            }
        }
        last.values().map(|c| c.get(id)).sum()
    }

    /// Whether one probe connection of the run announced both hops `a` and `b` (a store
    /// tap's poll send and response: a stage between them is exact).
    pub(crate) fn one_probe_announces(&self, a: &str, b: &str) -> bool {
        self.probes.values().any(|p| {
            let has = |h: &str| p.hello.hops.iter().any(|(_, n)| n == h);
            has(a) && has(b)
        })
    }

    /// Every probe connection, for `run.json`; with the pipeline's hop names when its
    /// stamps per hop are known (this collector joined them, or a relay counted them).
    /// `durable`: this is a collector with a log, whose version 2 connections were
    /// acknowledged (`None`: a group member, which does not know).
    pub(crate) fn probe_infos(
        &self,
        hop_names: Option<&[String]>,
        durable: Option<bool>,
    ) -> Vec<ProbeInfo> {
        self.probes
            .values()
            .map(|p| ProbeInfo {
                instance_id: p.hello.instance_id,
                host: p.hello.host.clone(),
                process: p.hello.process.clone(),
                software: p.hello.software.clone(),
                hops: p.hello.hops.iter().map(|(_, n)| n.clone()).collect(),
                peer: p.peer.to_string(),
                clean_close: p.clean,
                counters: p
                    .counters
                    .iter()
                    .flat_map(|c| c.values.iter())
                    .map(|(id, v)| {
                        (
                            counter_id::name(*id)
                                .map_or_else(|| format!("counter_{id}"), str::to_owned),
                            *v,
                        )
                    })
                    .collect(),
                stamps_by_hop: hop_names.map(|names| {
                    p.hello
                        .hops
                        .iter()
                        .map(|(_, name)| {
                            let n = names
                                .iter()
                                .position(|h| h == name)
                                .map_or(0, |i| p.stamps[i]);
                            (name.clone(), n)
                        })
                        .collect()
                }),
                protocol_version: Some(p.hello.version),
                durable: durable.map(|d| d && p.hello.version >= 2),
                connected_unix_ns: p.connected_unix_ns,
                closed_unix_ns: p.closed_unix_ns,
            })
            .collect()
    }

    /// Records probes could not deliver (queue full, send failed, evicted from the retention
    /// buffer before the collector had them), from each exporter's last counters. Counters are
    /// cumulative per exporter instance, across its
    /// reconnections: an instance that connected several times counts once, with the
    /// latest of its Counters frames.
    pub(crate) fn records_lost(&self) -> u64 {
        let mut last: BTreeMap<u64, &CountersFrame> = BTreeMap::new();
        for p in self.probes.values() {
            if let Some(c) = &p.counters {
                let e = last.entry(p.hello.instance_id).or_insert(c);
                if c.at_ns >= e.at_ns {
                    *e = c;
                }
            }
        }
        last.values()
            .map(|c| {
                c.get(counter_id::QUEUE_FULL)
                    + c.get(counter_id::SEND_FAILED)
                    + c.get(counter_id::LOST_UNACKED)
            })
            .sum()
    }

    /// Publisher ids whose Sent frames came from more than one exporter instance: their
    /// snapshots overwrite each other, so their accounting cannot hold.
    pub(crate) fn shared_publisher_ids(&self) -> Vec<(u16, usize)> {
        self.sent_by
            .iter()
            .filter(|(_, instances)| instances.len() > 1)
            .map(|(p, instances)| (*p, instances.len()))
            .collect()
    }

    /// The run's events so far, in time order (`hoptrace_format::events`): connections
    /// lost before `now` less a second, connections taken up again, `restarts`, clock
    /// changes and counter episodes (an open one with what it holds so far).
    pub(crate) fn events(&self, restarts: &[Restart], now: i64) -> Vec<RunEvent> {
        let mut out =
            hoptrace_format::events::events_of(&self.probe_infos(None, None), restarts, &[], now);
        out.extend(self.clock_changes.events.iter().cloned());
        out.extend(self.counter_episodes.events());
        hoptrace_format::events::sort(&mut out);
        out
    }

    /// Clock statuses received, and the preflight's alerts.
    pub(crate) fn clock(&self) -> (&[ClockRow], &[String]) {
        (&self.clock, &self.clock_alerts)
    }
}

fn clock_row(host: String, instance_id: u64, c: &ClockStatus) -> ClockRow {
    ClockRow {
        host,
        instance_id,
        at_ns: c.at_ns,
        source: c.source.name().to_owned(),
        synced: c.synced,
        offset_ns: c.offset_ns,
        error_bound_ns: c.error_bound_ns,
        leap: c.leap.name().to_owned(),
        detail: c.detail.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hoptrace_protocol::{HopId, PROTOCOL_VERSION};

    fn counters(at_ns: i64, values: &[(u16, u64)]) -> Event {
        Event::Frame(
            1,
            Frame::Counters(CountersFrame {
                at_ns,
                values: values.to_vec(),
            }),
        )
    }

    #[test]
    fn a_frame_of_other_ids_keeps_the_exporters_losses() {
        let mut c = Control::new(None);
        c.handle(Event::Connected(
            1,
            "127.0.0.1:9".parse().unwrap(),
            Hello {
                version: PROTOCOL_VERSION,
                instance_id: 42,
                host: "h".into(),
                process: "tap".into(),
                software: "s".into(),
                token: String::new(),
                hops: vec![(HopId(1), "queryable".into())],
            },
        ));
        c.handle(counters(
            10,
            &[(counter_id::QUEUE_FULL, 5), (counter_id::SEND_FAILED, 2)],
        ));
        // The tap's own frame (ids of its own), the latest: the exporter's stay.
        c.handle(counters(20, &[(64, 300)]));
        c.handle(counters(30, &[(counter_id::QUEUE_FULL, 6)]));
        assert_eq!(c.records_lost(), 8);
        let p = &c.probes[&1];
        let m = p.counters.as_ref().unwrap();
        assert_eq!(m.at_ns, 30);
        assert_eq!((m.get(64), m.get(counter_id::QUEUE_FULL)), (300, 6));
        // Every frame is a row of its own in probes.parquet.
        assert_eq!(c.counter_rows.len(), 3);
    }
}
