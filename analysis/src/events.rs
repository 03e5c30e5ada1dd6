//! What a run knows happened, on its time axis (`hoptrace_format::events`, re-exported
//! here): from `run.json` (the probes' connections with their start and end, the
//! collector's restarts, the clock statuses probes reported) and `probes.parquet` (the
//! probes' counters over time), so a report of an old run simply lists fewer kinds.
//!
//! A report marks them on the throughput chart and the heatmaps, lists them, and says when
//! a second that holds more of a tail than chance would give it lines up with one
//! ([`lines_up`]).

pub use hoptrace_format::events::*;
use hoptrace_format::run::RunSummary;

/// Every event of `runs` (their `run.json`) and of the probes' counters in `ctx`'s
/// `probes` table ([`counter_events`]), in time order.
///
/// # Errors
/// When the `probes` table cannot be read.
pub async fn all_events<'a>(
    runs: impl IntoIterator<Item = &'a RunSummary>,
    ctx: &datafusion::prelude::SessionContext,
) -> Result<Vec<RunEvent>, crate::AnalysisError> {
    let mut out = Vec::new();
    for run in runs {
        out.extend(events_of(
            &run.probes,
            &run.restarts,
            &run.clock,
            run.ended_unix_ns,
        ));
    }
    out.extend(counter_events(ctx).await?);
    sort(&mut out);
    Ok(out)
}

/// The events read from the probes' counters (`probes.parquet`, [`RISES`]): each episode
/// of a probe counting records it could not deliver ([`LOSS_COUNTERS`]), of a publisher or
/// broker tap reconnecting to its broker (`broker_reconnects`), of a publisher sending
/// behind its schedule (`late_sends`), at the episode's first frame (the probe host's
/// clock), in no particular order. Empty when no probe sent such counters.
///
/// # Errors
/// When the `probes` table cannot be read.
pub async fn counter_events(
    ctx: &datafusion::prelude::SessionContext,
) -> Result<Vec<RunEvent>, crate::AnalysisError> {
    use datafusion::arrow::array::AsArray;
    use datafusion::arrow::datatypes::{DataType, Int64Type, UInt64Type};

    let schema = ctx.table("probes").await?.schema().clone();
    let mut episodes = CounterEpisodes::default();
    for (k, rise) in RISES.iter().enumerate() {
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
        // Only the frames that hold one of the rise's counters: a frame of other ids
        // (a tap's own, the exporter's) is no sample of it.
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
        for b in ctx.sql(&sql).await?.collect().await? {
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
                episodes.sample(
                    k,
                    inst.value(row),
                    &format!("{}@{}", process.value(row), host.value(row)),
                    at.value(row),
                    n.value(row),
                    extra.value(row),
                );
            }
        }
    }
    Ok(episodes.events())
}

#[cfg(test)]
mod tests {
    use super::*;
    use hoptrace_format::run::{ClockRow, ProbeInfo, Restart};

    const S: i64 = 1_000_000_000;

    /// Each event's (second, kind, subject).
    fn seconds_kinds_subjects(ev: &[RunEvent]) -> Vec<(i64, EventKind, &str)> {
        ev.iter()
            .map(|e| (e.at_unix_ns / S, e.kind, e.subject.as_str()))
            .collect()
    }

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
        let got = seconds_kinds_subjects(&ev);
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
        let got = seconds_kinds_subjects(&ev);
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
