//! What a run knows happened, on its time axis: a probe's connection lost or taken up
//! again, a collector started again on the run, a host's clock losing or regaining its
//! synchronisation or moving by a millisecond or more, a probe counting records it could
//! not deliver. It comes from `run.json` (the probes' connections with their start and end,
//! the collector's restarts, the clock statuses probes reported) and `probes.parquet` (the
//! probes' counters over time), so a report of an old run simply lists fewer kinds.
//!
//! A report marks them on the throughput chart and the heatmaps, lists them, and says when
//! a second that holds more of a tail than chance would give it lines up with one
//! ([`lines_up`]).

use std::collections::BTreeMap;

use hoptrace_format::run::{ClockRow, ProbeInfo, Restart, RunSummary};
use serde::{Deserialize, Serialize};

/// A move of a host's clock offset between two of its reports at least this large is an
/// event (a step of the clock, or a new time source).
pub const OFFSET_MOVE_NS: i64 = 1_000_000;

/// An event lines up with a second when it lies within this of the second's start or
/// end: message times are their first stamps (a probe host's clock), event times the
/// collector's or the reporting host's.
pub const LINE_UP_NS: i64 = 1_000_000_000;

/// A connection ended this close to its run's end ended with the run, not during it
/// (unless a collector restart followed it).
const AT_THE_END_NS: i64 = 1_000_000_000;

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

/// Every event of `runs` (their `run.json`) and of the probes' counters in `ctx`'s
/// `probes` table ([`counter_events`]), in time order.
///
/// # Errors
/// When the `probes` table cannot be read.
pub async fn all_events<'a>(
    runs: impl IntoIterator<Item = &'a RunSummary>,
    ctx: &datafusion::prelude::SessionContext,
) -> Result<Vec<RunEvent>, crate::AnalysisError> {
    let mut out = run_json_events(runs);
    out.extend(counter_events(ctx).await?);
    sort(&mut out);
    Ok(out)
}

fn sort(events: &mut [RunEvent]) {
    events.sort_by(|a, b| {
        (a.at_unix_ns, a.kind, &a.subject).cmp(&(b.at_unix_ns, b.kind, &b.subject))
    });
}

/// The events `runs`' `run.json` tells (connections, restarts, clocks), in no particular
/// order.
fn run_json_events<'a>(runs: impl IntoIterator<Item = &'a RunSummary>) -> Vec<RunEvent> {
    let mut out = Vec::new();
    for run in runs {
        out.extend(events_of(
            &run.probes,
            &run.restarts,
            &run.clock,
            run.ended_unix_ns,
        ));
    }
    out
}

/// The events of one run from its parts (`run.json`'s `probes`, `restarts`, `clock` and
/// `ended_unix_ns`), in no particular order.
fn events_of(
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
    clock_events(clock, &mut out);
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
/// of one host may read its clock through different sources, which need not agree.
fn clock_events(rows: &[ClockRow], out: &mut Vec<RunEvent>) {
    let mut by_probe: BTreeMap<(&str, u64), Vec<&ClockRow>> = BTreeMap::new();
    for r in rows {
        by_probe
            .entry((r.host.as_str(), r.instance_id))
            .or_default()
            .push(r);
    }
    for ((host, _), mut rows) in by_probe {
        rows.sort_by_key(|r| r.at_ns);
        for w in rows.windows(2) {
            let (a, b) = (w[0], w[1]);
            let mut push = |kind, detail: String| {
                out.push(RunEvent {
                    at_unix_ns: b.at_ns,
                    kind,
                    subject: host.to_owned(),
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
                        hoptrace_format::units::signed_ns(a.offset_ns),
                        hoptrace_format::units::signed_ns(b.offset_ns),
                        hoptrace_format::units::signed_ns(moved),
                        b.source
                    ),
                );
            }
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

/// An event read from `probes.parquet`: the sum of `columns` rising; `extra` a companion
/// counter the detail quotes.
struct CounterRise {
    kind: EventKind,
    columns: &'static [&'static str],
    extra: Option<&'static str>,
    detail: fn(&Episode) -> String,
}

/// Every event read from counters.
const RISES: [CounterRise; 3] = [
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
                hoptrace_format::units::signed_ns(hoptrace_protocol::counter_id::LATE_SEND_NS),
                e.seconds(),
                e.total,
                hoptrace_format::units::signed_ns(e.extra)
            )
        },
    },
];

/// The events read from the probes' counters (`probes.parquet`): each episode of a probe
/// counting records it could not deliver ([`LOSS_COUNTERS`]), of a publisher or broker
/// tap reconnecting to its broker (`broker_reconnects`), of a publisher sending behind
/// its schedule (`late_sends`), at the episode's first frame (the probe host's clock), in
/// no particular order. Empty when no probe sent such counters.
///
/// # Errors
/// When the `probes` table cannot be read.
pub async fn counter_events(
    ctx: &datafusion::prelude::SessionContext,
) -> Result<Vec<RunEvent>, crate::AnalysisError> {
    let schema = ctx.table("probes").await?.schema().clone();
    let mut out = Vec::new();
    for rise in &RISES {
        let present: Vec<&str> = rise
            .columns
            .iter()
            .copied()
            .filter(|c| schema.has_column_with_unqualified_name(c))
            .collect();
        if present.is_empty() {
            continue;
        }
        let extra = rise
            .extra
            .filter(|c| schema.has_column_with_unqualified_name(c))
            .map_or_else(|| "0".to_owned(), |c| format!("coalesce({c}, 0)"));
        let sql = format!(
            "SELECT instance_id, host, process, CAST(at_ns AS BIGINT) AS at, CAST({} AS BIGINT) AS n, \
             CAST({extra} AS BIGINT) AS extra FROM probes WHERE {} ORDER BY instance_id, at_ns",
            present
                .iter()
                .map(|c| format!("coalesce({c}, 0)"))
                .collect::<Vec<_>>()
                .join(" + "),
            present
                .iter()
                .map(|c| format!("{c} IS NOT NULL"))
                .collect::<Vec<_>>()
                .join(" OR "),
        );
        for e in episodes(ctx, &sql).await? {
            out.push(RunEvent {
                at_unix_ns: e.start,
                kind: rise.kind,
                subject: e.subject.clone(),
                detail: (rise.detail)(&e),
            });
        }
    }
    Ok(out)
}

/// The episodes of `sql`'s rows (instance, host, process, at, n, extra; ordered by
/// instance and time): consecutive rows of an instance in which `n` rose, no more than
/// [`EPISODE_GAP_NS`] apart.
async fn episodes(
    ctx: &datafusion::prelude::SessionContext,
    sql: &str,
) -> Result<Vec<Episode>, crate::AnalysisError> {
    use datafusion::arrow::array::AsArray;
    use datafusion::arrow::datatypes::{DataType, Int64Type, UInt64Type};

    let mut out = Vec::new();
    // The previous row: (instance, time, n so far, extra so far).
    let mut last: Option<(u64, i64, i64, i64)> = None;
    let mut open: Option<Episode> = None;
    for b in ctx.sql(sql).await?.collect().await? {
        // Whatever string type the table holds (Utf8, a view, a dictionary).
        let text = |i: usize| datafusion::arrow::compute::cast(b.column(i), &DataType::Utf8);
        let (hosts, processes) = (text(1)?, text(2)?);
        let (Some(inst), Some(host), Some(process), Some(at), Some(n), Some(extra)) = (
            b.column(0).as_primitive_opt::<UInt64Type>(),
            hosts.as_string_opt::<i32>(),
            processes.as_string_opt::<i32>(),
            b.column(3).as_primitive_opt::<Int64Type>(),
            b.column(4).as_primitive_opt::<Int64Type>(),
            b.column(5).as_primitive_opt::<Int64Type>(),
        ) else {
            continue;
        };
        for row in 0..b.num_rows() {
            let (i, t) = (inst.value(row), at.value(row));
            let (before, extra_before, same) = match last {
                Some((li, lt, ln, le)) if li == i => (ln, le, t - lt <= EPISODE_GAP_NS),
                _ => (0, 0, false),
            };
            let (now, extra_now) = (n.value(row).max(before), extra.value(row).max(extra_before));
            if open.is_some() && (!same || now == before) {
                out.extend(open.take());
            }
            if now > before {
                let e = open.get_or_insert_with(|| Episode {
                    start: t,
                    end: t,
                    subject: format!("{}@{}", process.value(row), host.value(row)),
                    rose: 0,
                    total: 0,
                    extra_rose: 0,
                    extra: 0,
                });
                e.end = t;
                e.rose += now - before;
                e.total = now;
                e.extra_rose += extra_now - extra_before;
                e.extra = extra_now;
            }
            last = Some((i, t, now, extra_now));
        }
    }
    out.extend(open);
    Ok(out)
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

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000_000;

    fn probe(instance: u64, connected: i64, closed: Option<i64>, clean: bool) -> ProbeInfo {
        serde_json::from_value(serde_json::json!({"instance_id": instance, "host": "h1",
            "process": "relay", "software": "x", "hops": ["broker"], "peer": "127.0.0.1:1",
            "clean_close": clean, "counters": {}, "connected_unix_ns": connected,
            "closed_unix_ns": closed}))
        .unwrap()
    }

    fn clock(at: i64, synced: bool, offset_ns: i64) -> ClockRow {
        clock_of(9, at, synced, offset_ns)
    }

    fn clock_of(instance: u64, at: i64, synced: bool, offset_ns: i64) -> ClockRow {
        serde_json::from_value(
            serde_json::json!({"host": "h2", "instance_id": instance, "at_ns": at,
            "source": "chrony", "synced": synced, "offset_ns": offset_ns, "error_bound_ns": 1000,
            "detail": "d"}),
        )
        .unwrap()
    }

    #[test]
    fn a_lost_connection_a_restart_a_reconnection_and_clock_changes_in_time_order() {
        let probes = [
            probe(7, S, Some(30 * S), false),
            probe(7, 32 * S, Some(100 * S), false),
            probe(8, S, Some(99_500_000_000), false),
            probe(9, S, Some(50 * S), true),
        ];
        let restarts: Vec<Restart> = serde_json::from_value(serde_json::json!([{"at_unix_ns": 31 * S,
            "log_entries": 12, "log_bytes": 1, "torn_bytes": 0, "log_records": 40, "replay_ms": 5}]))
        .unwrap();
        let clock = [
            clock(10 * S, true, 0),
            clock(11 * S, true, 200_000),
            clock(12 * S, true, 2_300_000),
            clock(13 * S, false, 2_300_000),
            clock(14 * S, true, 2_300_000),
        ];
        let mut ev = events_of(&probes, &restarts, &clock, 100 * S);
        ev.sort_by_key(|e| e.at_unix_ns);
        let got: Vec<(i64, EventKind, &str)> = ev
            .iter()
            .map(|e| (e.at_unix_ns / S, e.kind, e.subject.as_str()))
            .collect();
        // Instance 8 and 7's second connection ended with the run; instance 9 said Goodbye.
        assert_eq!(
            got,
            vec![
                (12, EventKind::ClockOffsetMoved, "h2"),
                (13, EventKind::ClockUnsynchronised, "h2"),
                (14, EventKind::ClockSynchronised, "h2"),
                (30, EventKind::ProbeDisconnected, "relay@h1"),
                (31, EventKind::CollectorRestarted, "collector"),
                (32, EventKind::ProbeReconnected, "relay@h1"),
            ]
        );
        assert!(ev[0].detail.contains("(2.1ms)"), "{}", ev[0].detail);
        assert!(
            ev[5].detail.contains("connection 2 of 2"),
            "{}",
            ev[5].detail
        );
        assert!(ev[4].detail.contains("12 log entries"), "{}", ev[4].detail);
        // A second lines up with what lies within a second of it.
        let at = |s: i64| {
            lines_up(&ev, s * S)
                .iter()
                .map(|e| e.kind)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            at(29),
            vec![EventKind::ProbeDisconnected, EventKind::CollectorRestarted]
        );
        assert_eq!(at(20), Vec::<EventKind>::new());
    }

    /// A `probes` table of the given nullable counter columns, one row per (instance, at
    /// s, values); `at_ns` as the collector writes it (a timestamp), the events read from it.
    fn counters_table(columns: &[&str], rows: &[(u64, i64, Vec<Option<u64>>)]) -> Vec<RunEvent> {
        use std::sync::Arc;

        use datafusion::arrow::array::{
            ArrayRef, RecordBatch, StringArray, TimestampNanosecondArray, UInt64Array,
        };
        use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
        use datafusion::datasource::MemTable;

        let mut fields = vec![
            Field::new("instance_id", DataType::UInt64, false),
            Field::new("host", DataType::Utf8, false),
            Field::new("process", DataType::Utf8, false),
            Field::new(
                "at_ns",
                DataType::Timestamp(TimeUnit::Nanosecond, None),
                false,
            ),
        ];
        let mut cols: Vec<ArrayRef> = vec![
            Arc::new(UInt64Array::from_iter_values(rows.iter().map(|r| r.0))),
            Arc::new(StringArray::from_iter_values(rows.iter().map(|_| "h1"))),
            Arc::new(StringArray::from_iter_values(
                rows.iter().map(|r| format!("p{}", r.0)),
            )),
            Arc::new(TimestampNanosecondArray::from_iter_values(
                rows.iter().map(|r| r.1 * S),
            )),
        ];
        for (i, c) in columns.iter().enumerate() {
            fields.push(Field::new(*c, DataType::UInt64, true));
            cols.push(Arc::new(UInt64Array::from_iter(
                rows.iter().map(|r| r.2[i]),
            )));
        }
        let schema = Arc::new(Schema::new(fields));
        let batch = RecordBatch::try_new(schema.clone(), cols).unwrap();
        let ctx = datafusion::prelude::SessionContext::new();
        ctx.register_table(
            "probes",
            Arc::new(MemTable::try_new(schema, vec![vec![batch]]).unwrap()),
        )
        .unwrap();
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(counter_events(&ctx))
            .map(|mut ev| {
                ev.sort_by_key(|e| (e.at_unix_ns, e.kind));
                ev
            })
            .unwrap()
    }

    /// (instance, at s, queue_full, send_failed) rows, `lost_unacked` absent as in a
    /// version 1 run.
    fn losses(rows: &[(u64, i64, Option<u64>, Option<u64>)]) -> Vec<RunEvent> {
        let rows: Vec<_> = rows.iter().map(|r| (r.0, r.1, vec![r.2, r.3])).collect();
        counters_table(&["queue_full", "send_failed"], &rows)
    }

    #[test]
    fn each_episode_of_a_probe_losing_records_is_one_event() {
        let ev = losses(&[
            // Instance 1: nothing lost, then 10 and 5 more in two frames, then nothing,
            // then 1 again.
            (1, 10, Some(0), None),
            (1, 11, Some(10), None),
            (1, 12, Some(12), Some(3)),
            (1, 13, Some(12), Some(3)),
            (1, 20, Some(13), Some(3)),
            // Instance 2: loses from its first frame on, and to its last.
            (2, 5, Some(7), None),
            (2, 6, Some(7), Some(1)),
        ]);
        let got: Vec<(i64, &str, &str)> = ev
            .iter()
            .map(|e| (e.at_unix_ns / S, e.subject.as_str(), e.detail.as_str()))
            .collect();
        assert_eq!(got.len(), 3, "{got:?}");
        assert_eq!((got[0].0, got[0].1), (5, "p2@h1"));
        assert!(got[0].2.starts_with("8 records"), "{got:?}");
        assert!(got[0].2.ends_with("8 in all"), "{got:?}");
        assert_eq!((got[1].0, got[1].1), (11, "p1@h1"));
        assert!(got[1].2.starts_with("15 records"), "{got:?}");
        assert!(got[1].2.contains("over about 2 s"), "{got:?}");
        assert_eq!(got[2].0, 20);
        assert!(
            got[2].2.starts_with("1 records") && got[2].2.ends_with("16 in all"),
            "{got:?}"
        );
        assert!(ev.iter().all(|e| e.kind == EventKind::ProbeLostRecords));
        assert!(losses(&[(1, 10, Some(0), Some(0))]).is_empty());
    }

    #[test]
    fn probes_of_one_host_that_read_its_clock_differently_give_no_events() {
        // One probe sees the clock synchronised at offset 0, another (another source)
        // unsynchronised at 3 ms, their reports interleaved: neither changes.
        let rows: Vec<ClockRow> = (0..10)
            .map(|i| {
                if i % 2 == 0 {
                    clock_of(1, i * S, true, 0)
                } else {
                    clock_of(2, i * S, false, 3_000_000)
                }
            })
            .collect();
        assert!(events_of(&[], &[], &rows, 100 * S).is_empty());
    }

    #[test]
    fn runs_of_older_collectors_give_no_probe_events() {
        let mut p = probe(7, S, Some(30 * S), false);
        (p.connected_unix_ns, p.closed_unix_ns) = (None, None);
        assert!(events_of(&[p.clone(), p], &[], &[], 100 * S).is_empty());
    }

    #[test]
    fn frames_of_other_counters_and_quiet_stretches_end_an_episode_only_by_their_gap() {
        let cols = [
            "queue_full",
            "broker_reconnects",
            "broker_new_sessions",
            "late_sends",
            "lag_max_ns",
        ];
        let none = || vec![None; 5];
        let with = |i: usize, v: u64, j: usize, w: u64| {
            let mut r = vec![None; 5];
            r[i] = Some(v);
            r[j] = Some(w);
            r
        };
        let ev = counters_table(
            &cols,
            &[
                // A publisher: the exporter's frames (no losses) between its own.
                (1, 10, with(0, 0, 0, 0)),
                (1, 11, with(3, 2, 4, 15_000_000)),
                (1, 11, with(0, 0, 0, 0)),
                (1, 12, with(3, 9, 4, 31_000_000)),
                // Quiet for 40 s (no frame of its own), then late again.
                (1, 52, with(3, 10, 4, 31_000_000)),
                (1, 53, none()),
                // A broker tap: two reconnections 1 s apart, the second to a new session,
                // then one more a minute later.
                (2, 20, with(1, 1, 2, 0)),
                (2, 21, with(1, 2, 2, 1)),
                (2, 80, with(1, 3, 2, 1)),
            ],
        );
        let got: Vec<(i64, EventKind, &str)> = ev
            .iter()
            .map(|e| (e.at_unix_ns / S, e.kind, e.subject.as_str()))
            .collect();
        assert_eq!(
            got,
            vec![
                (11, EventKind::PublisherBehindSchedule, "p1@h1"),
                (20, EventKind::BrokerReconnected, "p2@h1"),
                (52, EventKind::PublisherBehindSchedule, "p1@h1"),
                (80, EventKind::BrokerReconnected, "p2@h1"),
            ]
        );
        let d: Vec<&str> = ev.iter().map(|e| e.detail.as_str()).collect();
        assert!(
            d[1].starts_with(
                "2 reconnections to the broker over about 2 s, 2 in all; 1 to a new session"
            ),
            "{d:?}"
        );
        assert!(
            d[3].starts_with("1 reconnection to the broker") && !d[3].contains("new session"),
            "{d:?}"
        );
        assert!(
            d[0].starts_with("9 messages sent more than 10.0ms after")
                && d[0].ends_with("largest lag so far 31.0ms"),
            "{d:?}"
        );
        assert!(
            d[2].starts_with("1 messages") && d[2].contains("10 in all"),
            "{d:?}"
        );
    }
}
