//! What probes say besides their records, kept for the run: who they are (Hello), their
//! clocks (with the preflight's alerts), their counters and what publishers sent. The TCP
//! collector ([`crate::run`]) and the group members ([`crate::kafka`]) both keep one;
//! checkpoints hold it whole ([`ControlSnapshot`]), except the rows of the clock and
//! counters tables, which the TCP collector keeps in files of the run directory
//! ([`crate::ingest::rows`]) and a checkpoint records the length of.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;

use hoptrace_protocol::ClockStatus;
use hoptrace_protocol::{CountersFrame, Frame, Hello, MAX_HOPS, SentEntry, counter_id};
use serde::{Deserialize, Serialize};

use crate::CollectorError;
use crate::ingest::rows::{CLOCK_ROWS, COUNTER_ROWS, RowFile, Rows};
use crate::live::HostClock;
use crate::server::Event;
use crate::tables::{CounterRow, write_clock, write_probes};
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
    clock: Rows<ClockRow>,
    /// Each host's latest clock status.
    clock_last: BTreeMap<String, ClockRow>,
    counter_rows: Rows<CounterRow>,
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
    /// The rows, when they are kept in memory.
    clock: Vec<ClockRow>,
    counter_rows: Vec<CounterRow>,
    /// When they are kept in files of the run directory ([`crate::ingest::rows`]): the
    /// length of each, clock statuses then Counters frames, once synced.
    #[serde(default)]
    row_files: Option<(u64, u64)>,
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

    /// Keeps the rows of the clock and counters tables in files of `run_dir` from now on
    /// (created empty), not in memory; the rows held so far go there first.
    ///
    /// # Errors
    /// [`CollectorError::Io`] when a file cannot be created or written.
    pub(crate) fn rows_to_files(&mut self, run_dir: &Path) -> Result<(), CollectorError> {
        let clock = std::mem::take(&mut self.clock).all()?;
        let counters = std::mem::take(&mut self.counter_rows).all()?;
        self.clock = Rows::File(RowFile::create(run_dir.join(CLOCK_ROWS))?);
        self.counter_rows = Rows::File(RowFile::create(run_dir.join(COUNTER_ROWS))?);
        for r in clock {
            self.clock.push(r)?;
        }
        for r in counters {
            self.counter_rows.push(r)?;
        }
        Ok(())
    }

    /// Takes a connection event or a control frame; records frames are not its business.
    ///
    /// # Errors
    /// [`CollectorError::Io`] when a row cannot be written to its file.
    pub(crate) fn handle(&mut self, ev: Event) -> Result<(), CollectorError> {
        self.handle_at(ev, None)
    }

    /// [`Self::handle`], with the collector's Unix time of a connection's start or end.
    ///
    /// # Errors
    /// [`CollectorError::Io`] when a row cannot be written to its file.
    pub(crate) fn handle_at(
        &mut self,
        ev: Event,
        unix_ns: Option<i64>,
    ) -> Result<(), CollectorError> {
        match ev {
            Event::FrameWithBytes(id, f, _) => return self.handle(Event::Frame(id, f)),
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
                self.clock_last.insert(row.host.clone(), row.clone());
                self.clock.push(row)?;
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
                    })?;
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
        Ok(())
    }

    /// Everything it holds, for a checkpoint; the files of rows are synced first.
    ///
    /// # Errors
    /// [`CollectorError::Io`] when a file of rows cannot be written or synced.
    pub(crate) fn snapshot(&mut self) -> Result<ControlSnapshot, CollectorError> {
        let row_files = match (self.clock.synced_len()?, self.counter_rows.synced_len()?) {
            (Some(c), Some(p)) => Some((c, p)),
            _ => None,
        };
        Ok(ControlSnapshot {
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
            clock: self.clock.in_memory().to_vec(),
            counter_rows: self.counter_rows.in_memory().to_vec(),
            row_files,
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
        })
    }

    /// What a checkpoint held; `max_clock_error_ns` is this collector's. With `run_dir`,
    /// the rows of the clock and counters tables are kept in its files: cut back to the
    /// lengths the checkpoint recorded, or written from the checkpoint's own rows when it
    /// held them in memory.
    ///
    /// # Errors
    /// [`CollectorError::Io`] when a file of rows cannot be read, is shorter than the
    /// checkpoint recorded, or cannot be written.
    pub(crate) fn restore(
        mut snap: ControlSnapshot,
        max_clock_error_ns: Option<u64>,
        run_dir: Option<&Path>,
    ) -> Result<Self, CollectorError> {
        let (clock, counter_rows, clock_rows, count_rows) = match (run_dir, snap.row_files) {
            (Some(dir), Some((c, p))) => {
                let (cf, cr) = RowFile::reopen(dir.join(CLOCK_ROWS), c)?;
                let (pf, pr) = RowFile::reopen(dir.join(COUNTER_ROWS), p)?;
                (Rows::File(cf), Rows::File(pf), cr, pr)
            }
            (None, Some(_)) => {
                return Err(CollectorError::Io {
                    path: CLOCK_ROWS.into(),
                    source: std::io::Error::new(
                        std::io::ErrorKind::InvalidInput,
                        "the checkpoint's clock and counters rows are in files of a run directory, and none was given",
                    ),
                });
            }
            (_, None) => {
                let cr = std::mem::take(&mut snap.clock);
                let pr = std::mem::take(&mut snap.counter_rows);
                (Rows::Memory(cr.clone()), Rows::Memory(pr.clone()), cr, pr)
            }
        };
        let mut clock_changes = ClockChanges::default();
        let mut clock_last = BTreeMap::new();
        for r in &clock_rows {
            clock_changes.row(r);
            clock_last.insert(r.host.clone(), r.clone());
        }
        let mut counter_episodes = CounterEpisodes::default();
        for r in &count_rows {
            counter_episodes.frame(
                r.instance_id,
                &format!("{}@{}", r.process, r.host),
                r.at_ns,
                &r.values,
            );
        }
        let mut restored = Self {
            clock,
            clock_last,
            counter_rows,
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
        };
        if let (Some(dir), Rows::Memory(_)) = (run_dir, &restored.clock) {
            restored.rows_to_files(dir)?;
        }
        Ok(restored)
    }

    /// Every probe host (of a connection now or before), with its connections open and
    /// its clock as its probes' last Clock frame said (unknown without one), by name.
    pub(crate) fn host_clocks(&self) -> Vec<HostClock> {
        let mut open: BTreeMap<&str, u64> = BTreeMap::new();
        for p in self.probes.values() {
            *open.entry(p.hello.host.as_str()).or_default() += u64::from(p.open);
        }
        let last: BTreeMap<&str, &ClockRow> = self
            .clock_last
            .iter()
            .map(|(h, r)| (h.as_str(), r))
            .collect();
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
    ///
    /// # Errors
    /// [`CollectorError`] when the rows cannot be read back or a table written.
    pub(crate) fn write_tables(&mut self, run_dir: &Path) -> Result<(), CollectorError> {
        write_clock(&run_dir.join("clock.parquet"), &self.clock.all()?)?;
        write_probes(&run_dir.join("probes.parquet"), &self.counter_rows.all()?)?;
        Ok(())
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

    /// Clock statuses received (read back from their file), and the preflight's alerts.
    ///
    /// # Errors
    /// [`CollectorError::Io`] when the file cannot be read.
    pub(crate) fn clock(&mut self) -> Result<(Vec<ClockRow>, &[String]), CollectorError> {
        Ok((self.clock.all()?, &self.clock_alerts))
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
        ))
        .unwrap();
        c.handle(counters(
            10,
            &[(counter_id::QUEUE_FULL, 5), (counter_id::SEND_FAILED, 2)],
        ))
        .unwrap();
        // The tap's own frame (ids of its own), the latest: the exporter's stay.
        c.handle(counters(20, &[(64, 300)])).unwrap();
        c.handle(counters(30, &[(counter_id::QUEUE_FULL, 6)]))
            .unwrap();
        assert_eq!(c.records_lost(), 8);
        let p = &c.probes[&1];
        let m = p.counters.as_ref().unwrap();
        assert_eq!(m.at_ns, 30);
        assert_eq!((m.get(64), m.get(counter_id::QUEUE_FULL)), (300, 6));
        // Every frame is a row of its own in probes.parquet.
        assert_eq!(c.counter_rows.len(), 3);
    }

    fn clock(at_ns: i64, error_bound_ns: u64) -> Event {
        Event::Frame(
            1,
            Frame::Clock(ClockStatus {
                at_ns,
                source: hoptrace_protocol::ClockSource::Chrony,
                synced: true,
                leap: hoptrace_protocol::Leap::None,
                offset_ns: 10,
                error_bound_ns,
                detail: "test".into(),
            }),
        )
    }

    #[test]
    fn rows_in_files_are_cut_back_to_the_checkpoint_and_not_held_by_it() {
        let dir = std::env::temp_dir().join(format!("hoptrace-control-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut c = Control::new(None);
        c.rows_to_files(&dir).unwrap();
        c.handle(Event::Connected(
            1,
            "127.0.0.1:9".parse().unwrap(),
            Hello {
                version: PROTOCOL_VERSION,
                instance_id: 42,
                host: "h".into(),
                process: "p".into(),
                software: "s".into(),
                token: String::new(),
                hops: vec![(HopId(1), "flow_in".into())],
            },
        ))
        .unwrap();
        for i in 0..50 {
            c.handle(counters(i, &[(counter_id::QUEUE_FULL, i as u64)]))
                .unwrap();
        }
        c.handle(clock(7, 1_000)).unwrap();
        let snap = c.snapshot().unwrap();
        // The checkpoint holds the files' lengths, not the rows.
        assert!(snap.clock.is_empty() && snap.counter_rows.is_empty());
        let (clock_len, counters_len) = snap.row_files.expect("lengths");
        assert_eq!(
            clock_len,
            std::fs::metadata(dir.join(CLOCK_ROWS)).unwrap().len()
        );
        assert!(counters_len > 50 * 20, "{counters_len}");
        // After the checkpoint: rows a killed collector wrote, which its log replays.
        c.handle(counters(99, &[(counter_id::QUEUE_FULL, 99)]))
            .unwrap();
        c.handle(clock(100, 5_000)).unwrap();
        drop(c);
        let json = serde_json::to_string(&snap).unwrap();
        let back: ControlSnapshot = serde_json::from_str(&json).unwrap();
        let mut r = Control::restore(back, None, Some(&dir)).unwrap();
        assert_eq!(r.counter_rows.len(), 50);
        let (rows, _) = r.clock().unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].error_bound_ns, 1_000);
        let h = r.host_clocks();
        assert_eq!(h.len(), 1);
        assert_eq!(h[0].host, "h");
        // Taken up again, the files go on from the checkpoint.
        r.handle(counters(99, &[(counter_id::QUEUE_FULL, 99)]))
            .unwrap();
        r.write_tables(&dir).unwrap();
        assert_eq!(r.counter_rows.all().unwrap().last().unwrap().at_ns, 99);
        assert!(dir.join("probes.parquet").exists() && dir.join("clock.parquet").exists());
        // A checkpoint of rows held in memory (a collector of before the files) is taken
        // up into the files.
        let mut mem = Control::new(None);
        mem.clock
            .push(clock_row("g".into(), 1, &ClockStatus::default()))
            .unwrap();
        let snap = mem.snapshot().unwrap();
        assert!(snap.row_files.is_none());
        assert_eq!(snap.clock.len(), 1);
        let mut up = Control::restore(snap, None, Some(&dir)).unwrap();
        assert!(matches!(up.clock, Rows::File(_)));
        assert_eq!(up.clock().unwrap().0[0].host, "g");
        // A file shorter than its checkpoint says: refused, naming it.
        let snap = up.snapshot().unwrap();
        std::fs::write(dir.join(CLOCK_ROWS), "").unwrap();
        let err = Control::restore(snap, None, Some(&dir))
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains(CLOCK_ROWS) && err.contains("shorter"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
