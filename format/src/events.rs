//! What a run knows happened, on its time axis: a probe's connection lost or taken up
//! again, a collector started again on the run, a host's clock losing or regaining its
//! synchronisation or moving by a millisecond or more, and episodes of the probes'
//! counters rising (records a probe could not deliver, a broker reconnection, a publisher
//! behind its schedule). The report derives them from `run.json` and `probes.parquet`
//! after the run (`hoptrace-analysis`), the live view as the run goes on, both with what
//! this module holds.

use std::collections::BTreeMap;

use hoptrace_protocol::counter_id;
use serde::{Deserialize, Serialize};

use crate::run::{ClockRow, ProbeInfo, Restart};

/// A move of a host's clock offset between two of its reports at least this large is an
/// event (a step of the clock, or a new time source).
pub const OFFSET_MOVE_NS: i64 = 1_000_000;

/// An event lines up with a second when it lies within this of the second's start or
/// end: message times are their first stamps (a probe host's clock), event times the
/// collector's or the reporting host's.
pub const LINE_UP_NS: i64 = 1_000_000_000;

/// A connection ended this close to its run's end ended with the run, not during it
/// (unless a collector restart followed it).
pub const AT_THE_END_NS: i64 = 1_000_000_000;

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// A probe connection broke (no Goodbye) before its run ended.
    ProbeDisconnected,
    /// An exporter instance connected again after an earlier connection of the run.
    ProbeReconnected,
    /// A collector started again on the run after one was killed, and replayed its log.
    CollectorRestarted,
    /// A host's clock, synchronised in its previous report, no longer is.
    ClockUnsynchronised,
    /// A host's clock, unsynchronised in its previous report, is again.
    ClockSynchronised,
    /// A host's clock offset moved by [`OFFSET_MOVE_NS`] or more between two reports.
    ClockOffsetMoved,
    /// A probe counted records it could not deliver (queue full, send failed, evicted
    /// before the collector acknowledged them) in consecutive Counters frames.
    ProbeLostRecords,
    /// A publisher or a broker tap found its broker connection lost and opened it again.
    BrokerReconnected,
    /// A publisher sent messages more than 10 ms after their scheduled time.
    PublisherBehindSchedule,
}

impl EventKind {
    /// How a report names it.
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::ProbeDisconnected => "probe connection lost",
            Self::ProbeReconnected => "probe connected again",
            Self::CollectorRestarted => "collector restarted",
            Self::ClockUnsynchronised => "clock unsynchronised",
            Self::ClockSynchronised => "clock synchronised again",
            Self::ClockOffsetMoved => "clock offset moved",
            Self::ProbeLostRecords => "probe lost records",
            Self::BrokerReconnected => "broker connection opened again",
            Self::PublisherBehindSchedule => "publisher behind schedule",
        }
    }
}

/// One event of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunEvent {
    /// When, Unix ns.
    pub at_unix_ns: i64,
    /// What.
    pub kind: EventKind,
    /// Of what: a probe (`process@host`), `collector`, or a host.
    pub subject: String,
    /// The figures behind it, one line.
    pub detail: String,
}

impl RunEvent {
    /// One line: `probe connection lost: relay@h1 (…)`.
    #[must_use]
    pub fn line(&self) -> String {
        format!("{}: {} ({})", self.kind.label(), self.subject, self.detail)
    }
}

/// The events of one run from its parts (`run.json`'s `probes`, `restarts`, `clock` and
/// `ended_unix_ns`; for a run still going on, now), in no particular order. A connection
/// that ended without Goodbye within [`AT_THE_END_NS`] of `ended_unix_ns` ended with the
/// run, unless a collector restart followed it.
#[must_use]
pub fn events_of(
    probes: &[ProbeInfo],
    restarts: &[Restart],
    clock: &[ClockRow],
    ended_unix_ns: i64,
) -> Vec<RunEvent> {
    let mut out = Vec::new();
    // Connections cut by a killed collector end before its restart, however short the
    // run after it.
    let mid_run = restarts
        .iter()
        .map(|r| r.at_unix_ns)
        .max()
        .unwrap_or(i64::MIN)
        .max(ended_unix_ns - AT_THE_END_NS);
    probe_events(probes, mid_run, &mut out);
    for r in restarts {
        out.push(RunEvent {
            at_unix_ns: r.at_unix_ns,
            kind: EventKind::CollectorRestarted,
            subject: "collector".into(),
            detail: format!(
                "replayed {} log entries, {} hop records; probes waited {} ms for its Welcome",
                r.log_entries, r.log_records, r.replay_ms
            ),
        });
    }
    let mut changes = ClockChanges::default();
    let mut rows: Vec<&ClockRow> = clock.iter().collect();
    rows.sort_by_key(|r| r.at_ns);
    for r in rows {
        changes.row(r);
    }
    out.extend(changes.events);
    out
}

/// A probe's lost connections (those that ended by `mid_run`: the others ended with the
/// run) and renewed ones.
fn probe_events(probes: &[ProbeInfo], mid_run: i64, out: &mut Vec<RunEvent>) {
    let mut by_instance: BTreeMap<u64, Vec<&ProbeInfo>> = BTreeMap::new();
    for p in probes {
        let name = format!("{}@{}", p.process, p.host);
        if let Some(at) = p.closed_unix_ns
            && !p.clean_close
            && at <= mid_run
        {
            out.push(RunEvent {
                at_unix_ns: at,
                kind: EventKind::ProbeDisconnected,
                subject: name,
                detail: format!("instance {:x}, peer {}, no Goodbye", p.instance_id, p.peer),
            });
        }
        if p.connected_unix_ns.is_some() {
            by_instance.entry(p.instance_id).or_default().push(p);
        }
    }
    for conns in by_instance.values_mut() {
        conns.sort_by_key(|p| p.connected_unix_ns);
        for (i, p) in conns.iter().enumerate().skip(1) {
            out.push(RunEvent {
                at_unix_ns: p.connected_unix_ns.unwrap_or_default(),
                kind: EventKind::ProbeReconnected,
                subject: format!("{}@{}", p.process, p.host),
                detail: format!(
                    "instance {:x}, connection {} of {}",
                    p.instance_id,
                    i + 1,
                    conns.len()
                ),
            });
        }
    }
}

/// Changes between consecutive clock reports of each probe (exporter instance): probes
/// of one host may read its clock through different sources, which need not agree. Fed
/// with each probe's reports in time order.
#[derive(Debug, Default)]
pub struct ClockChanges {
    last: BTreeMap<(String, u64), ClockRow>,
    /// The changes so far.
    pub events: Vec<RunEvent>,
}

impl ClockChanges {
    /// The next report of its probe.
    pub fn row(&mut self, b: &ClockRow) {
        let key = (b.host.clone(), b.instance_id);
        let Some(a) = self.last.insert(key, b.clone()) else {
            return;
        };
        let mut push = |kind, detail: String| {
            self.events.push(RunEvent {
                at_unix_ns: b.at_ns,
                kind,
                subject: b.host.clone(),
                detail,
            });
        };
        if a.synced && !b.synced {
            push(
                EventKind::ClockUnsynchronised,
                format!("{}: {}", b.source, b.detail),
            );
        } else if !a.synced && b.synced {
            push(
                EventKind::ClockSynchronised,
                format!("{}, error bound {} ns", b.source, b.error_bound_ns),
            );
        }
        let moved = b.offset_ns.saturating_sub(a.offset_ns);
        if moved.unsigned_abs() >= OFFSET_MOVE_NS.unsigned_abs() {
            push(
                EventKind::ClockOffsetMoved,
                format!(
                    "offset {} → {} ({}), source {}",
                    crate::units::signed_ns(a.offset_ns),
                    crate::units::signed_ns(b.offset_ns),
                    crate::units::signed_ns(moved),
                    b.source
                ),
            );
        }
    }
}

/// The counters whose rise means records a probe could not deliver.
pub const LOSS_COUNTERS: [&str; 3] = ["queue_full", "send_failed", "lost_unacked"];

/// Counters frames of one exporter instance in which a counter rose belong to one episode
/// unless this much lies between two of them: processes send their own counters only
/// when they change, so a quiet stretch has no frames to end an episode.
pub const EPISODE_GAP_NS: i64 = 3_000_000_000;

/// An episode of a counter rising in consecutive Counters frames of one exporter instance.
#[derive(Debug)]
struct Episode {
    /// Its first and last frames' times (the probe host's clock).
    start: i64,
    end: i64,
    /// `process@host`.
    subject: String,
    /// How much the counter rose in it, and its value at its end.
    rose: i64,
    total: i64,
    /// The companion counter's rise in it, and its value at its end (0 when absent).
    extra_rose: i64,
    extra: i64,
}

impl Episode {
    /// About how long it lasted, s (a frame stands for the second before it).
    fn seconds(&self) -> f64 {
        (self.end - self.start) as f64 / 1e9 + 1.0
    }
}

/// An event read from the probes' counters: the sum of `columns` rising; `extra` a
/// companion counter the detail quotes.
#[derive(Debug)]
pub struct CounterRise {
    /// The event.
    pub kind: EventKind,
    /// The counters summed (names of `docs/collector-protocol.md`, as `probes.parquet`'s
    /// columns).
    pub columns: &'static [&'static str],
    /// The companion counter, if any.
    pub extra: Option<&'static str>,
    detail: fn(&Episode) -> String,
}

/// Every event read from counters.
pub const RISES: [CounterRise; 3] = [
    CounterRise {
        kind: EventKind::ProbeLostRecords,
        columns: &LOSS_COUNTERS,
        extra: None,
        detail: |e| {
            format!(
                "{} records it could not deliver (queue full, send failed, evicted unacknowledged) over about {:.0} s of Counters frames, {} in all",
                e.rose,
                e.seconds(),
                e.total
            )
        },
    },
    CounterRise {
        kind: EventKind::BrokerReconnected,
        columns: &["broker_reconnects"],
        extra: Some("broker_new_sessions"),
        detail: |e| {
            let mut d = format!(
                "{} reconnection{} to the broker over about {:.0} s, {} in all",
                e.rose,
                if e.rose == 1 { "" } else { "s" },
                e.seconds(),
                e.total
            );
            if e.extra_rose > 0 {
                d.push_str(&format!(
                    "; {} to a new session: what was published meanwhile never reached it",
                    e.extra_rose
                ));
            }
            d
        },
    },
    CounterRise {
        kind: EventKind::PublisherBehindSchedule,
        columns: &["late_sends"],
        extra: Some("lag_max_ns"),
        detail: |e| {
            format!(
                "{} messages sent more than {} after their scheduled time over about {:.0} s, {} in all; largest lag so far {}",
                e.rose,
                crate::units::signed_ns(counter_id::LATE_SEND_NS),
                e.seconds(),
                e.total,
                crate::units::signed_ns(e.extra)
            )
        },
    },
];

/// A sample's time, value and companion value.
type Sample = (i64, i64, i64);

/// Episodes of counters rising ([`RISES`]), fed with each exporter instance's Counters
/// frames (or one rise's sums of them) in time order.
#[derive(Debug, Default)]
pub struct CounterEpisodes {
    /// Per (rise, instance): its last sample and the episode open, if any.
    state: BTreeMap<(usize, u64), (Sample, Option<Episode>)>,
    closed: Vec<RunEvent>,
}

impl CounterEpisodes {
    /// A Counters frame of `instance` (`subject`: `process@host`), its cumulative values
    /// by id; ids no rise reads are ignored, and a frame with none of a rise's counters
    /// is no sample of it.
    pub fn frame(&mut self, instance: u64, subject: &str, at_ns: i64, values: &[(u16, u64)]) {
        for (k, rise) in RISES.iter().enumerate() {
            let (mut seen, mut n, mut extra) = (false, 0i64, 0i64);
            for (id, v) in values {
                let Some(name) = counter_id::name(*id) else {
                    continue;
                };
                let v = i64::try_from(*v).unwrap_or(i64::MAX);
                if rise.columns.contains(&name) {
                    seen = true;
                    n = n.saturating_add(v);
                } else if rise.extra == Some(name) {
                    extra = v;
                }
            }
            if seen {
                self.sample(k, instance, subject, at_ns, n, extra);
            }
        }
    }

    /// A sample of rise `rise` ([`RISES`]'s index): the sum of its counters `n` and its
    /// companion `extra` (0 when absent) in a frame of `instance`.
    pub fn sample(
        &mut self,
        rise: usize,
        instance: u64,
        subject: &str,
        at_ns: i64,
        n: i64,
        extra: i64,
    ) {
        let (last, open) = self
            .state
            .entry((rise, instance))
            .or_insert(((i64::MIN, 0, 0), None));
        let (lt, before, extra_before) = *last;
        let same = lt != i64::MIN && at_ns.saturating_sub(lt) <= EPISODE_GAP_NS;
        let (now, extra_now) = (n.max(before), extra.max(extra_before));
        if open.is_some() && (!same || now == before) {
            let e = open.take().expect("checked");
            self.closed.push(RISES[rise].event(&e));
        }
        if now > before {
            let e = open.get_or_insert_with(|| Episode {
                start: at_ns,
                end: at_ns,
                subject: subject.to_owned(),
                rose: 0,
                total: 0,
                extra_rose: 0,
                extra: 0,
            });
            e.end = at_ns;
            e.rose += now - before;
            e.total = now;
            e.extra_rose += extra_now - extra_before;
            e.extra = extra_now;
        }
        *last = (at_ns, now, extra_now);
    }

    /// The events of the episodes so far, those still open included, in no particular
    /// order.
    #[must_use]
    pub fn events(&self) -> Vec<RunEvent> {
        let mut out = self.closed.clone();
        for ((rise, _), (_, open)) in &self.state {
            if let Some(e) = open {
                out.push(RISES[*rise].event(e));
            }
        }
        out
    }
}

impl CounterRise {
    fn event(&self, e: &Episode) -> RunEvent {
        RunEvent {
            at_unix_ns: e.start,
            kind: self.kind,
            subject: e.subject.clone(),
            detail: (self.detail)(e),
        }
    }
}

/// Sorts events by time (then kind and subject).
pub fn sort(events: &mut [RunEvent]) {
    events.sort_by(|a, b| {
        (a.at_unix_ns, a.kind, &a.subject).cmp(&(b.at_unix_ns, b.kind, &b.subject))
    });
}

/// The events that line up with the second that starts at `second_unix_ns`: within
/// [`LINE_UP_NS`] of its start or its end.
#[must_use]
pub fn lines_up(events: &[RunEvent], second_unix_ns: i64) -> Vec<&RunEvent> {
    let (from, to) = (
        second_unix_ns - LINE_UP_NS,
        second_unix_ns + 1_000_000_000 + LINE_UP_NS,
    );
    events
        .iter()
        .filter(|e| e.at_unix_ns >= from && e.at_unix_ns <= to)
        .collect()
}
