//! The text of a collector's start (a run continued from its log, files recovered), its
//! live line and its end (the run's accounting and files).

use std::time::{Duration, Instant};

use hoptrace_collector::RunSummary;
use hoptrace_collector::run::Progress;
use hoptrace_format::run::{Recovered, Restart};
use hoptrace_format::units;

/// What the collector says when it continued run `run_id` from its log.
#[must_use]
pub fn continued_line(run_id: &str, r: &Restart) -> String {
    format!(
        "continuing run {run_id} from its log: a collector was stopped without closing it; {}replayed {} entries ({}) in {:.1} s{}, probes send again what it had not acknowledged",
        r.checkpoint_unix_ns.map_or_else(String::new, |t| format!(
            "took up its checkpoint of {}, ",
            units::utc_iso(t)
        )),
        r.log_entries,
        units::bytes(r.log_bytes),
        r.replay_ms as f64 / 1e3,
        if r.torn_bytes > 0 {
            format!(
                "; {} half-written at the end, never acknowledged, skipped",
                units::bytes(r.torn_bytes)
            )
        } else {
            String::new()
        }
    )
}

/// What the collector says of the files an earlier collector left in the run directory.
#[must_use]
pub fn recovered_lines(r: &Recovered) -> Vec<String> {
    let mut lines = vec![format!(
        "recovered: {} complete file(s) with {} rows kept from an earlier collector in this run directory",
        r.files, r.rows
    )];
    for (name, bytes) in &r.unfinished {
        lines.push(format!(
            "recovered: {name} ({bytes} bytes) was left open by a killed collector: its rows (one row group at most) are lost; set aside as .unfinished"
        ));
    }
    for (name, err) in &r.corrupt {
        lines.push(format!(
            "recovered: {name} does not read ({err}); set aside as .corrupt"
        ));
    }
    lines
}

/// The collector's live line: traces and records per second since the last line, the
/// join's state, and each stage's running percentiles.
#[derive(Debug)]
pub struct CollectLine {
    started: Instant,
    last: Progress,
    join_window: Duration,
}

impl CollectLine {
    /// A line from `first` on, for a join that waits `join_window` for a trace's hops.
    #[must_use]
    pub fn new(first: Progress, join_window: Duration) -> Self {
        Self {
            started: Instant::now(),
            last: first,
            join_window,
        }
    }

    /// The line for `p`, `since` the last one.
    pub fn line(&mut self, p: Progress, since: Duration) -> String {
        let last = &self.last;
        let secs = since.as_secs_f64();
        let traces = (p.complete + p.incomplete).saturating_sub(last.complete + last.incomplete);
        let mut line = format!(
            "{:>6.0}s  {:>9.0} traces/s  {:>9.0} records/s  complete {}  incomplete {}  pending {}  probes {}",
            self.started.elapsed().as_secs_f64(),
            traces as f64 / secs,
            p.records.saturating_sub(last.records) as f64 / secs,
            p.complete,
            p.incomplete,
            p.pending,
            p.connections
        );
        if p.pending > 0 && p.complete + p.incomplete == 0 {
            // Records arrive from the start, traces only once complete or at the end
            // of their join window: say so rather than show 0 traces/s unexplained.
            line.push_str(&format!(
                "  (waiting in the join: a trace is written when its last hop arrives, or incomplete after the join window of {})",
                units::duration_f64(self.join_window.as_nanos() as f64)
            ));
        }
        for (stage, p50, p99) in &p.stages {
            line.push_str(&format!(
                "  {stage} p50 {} p99 {}",
                units::duration_f64(*p50 as f64),
                units::duration_f64(*p99 as f64)
            ));
        }
        self.last = p;
        line
    }
}

/// A run's accounting and files, one line each.
#[must_use]
pub fn accounting_lines(summary: &RunSummary) -> Vec<String> {
    let mut lines = Vec::new();
    let a = &summary.accounting;
    for p in &a.publishers {
        let holds = p.sent == p.complete + p.incomplete + p.recovered + p.unseen;
        lines.push(format!(
            "publisher {}: sent {} {} complete {} + incomplete {}{} + unseen {}{}",
            p.publisher,
            p.sent,
            if holds { "=" } else { "!=" },
            p.complete,
            p.incomplete,
            if p.recovered > 0 {
                format!(
                    " + recovered {} (in the part files of an earlier collector)",
                    p.recovered
                )
            } else {
                String::new()
            },
            p.unseen,
            if p.not_sent > 0 {
                format!(" ({} traces of keys it never reported sending)", p.not_sent)
            } else {
                String::new()
            }
        ));
    }
    for (hop, n) in &a.missing_by_hop {
        lines.push(format!("  incomplete, missing {hop}: {n}"));
    }
    lines.push(format!(
        "records lost by probes {}, duplicate traces {}, negative deltas {}, late records {}, in flight {}; counts add up: {}",
        a.records_lost_by_probes,
        a.duplicate_traces,
        a.negative_delta_traces,
        a.late_records,
        a.in_flight,
        if a.adds_up
            && a.publishers
                .iter()
                .all(|p| p.sent == p.complete + p.incomplete + p.recovered + p.unseen)
        {
            "yes"
        } else {
            "NO"
        }
    ));
    for d in &a.discrepancies {
        lines.push(format!("  does not add up: {d}"));
    }
    let dropped = [
        ("records of unannounced hops", a.unannounced_hop_records),
        ("records with implausible stamps", a.implausible_records),
        (
            "traces with implausible intended times (flagged)",
            a.implausible_traces,
        ),
        ("records of undeclared hops", a.unknown_hop_records),
    ];
    for (what, n) in dropped.into_iter().filter(|(_, n)| *n > 0) {
        lines.push(format!("  {what}: {n}"));
    }
    for (i, r) in summary.restarts.iter().enumerate() {
        lines.push(format!(
            "restart {} at {}: from {}, replayed {} log entries in {:.1} s ({} hop records held), skipped a half-written tail of {}; {} records sent again were already held (dropped)",
            i + 1,
            units::utc_iso(r.at_unix_ns),
            r.checkpoint_unix_ns.map_or_else(
                || "the run's start".to_owned(),
                |t| format!("the checkpoint of {}", units::utc_iso(t))
            ),
            r.log_entries,
            r.replay_ms as f64 / 1e3,
            r.records_replayed,
            units::bytes(r.torn_bytes),
            r.resent_records_dropped
        ));
    }
    let v1: Vec<String> = summary
        .probes
        .iter()
        .filter(|p| p.durable == Some(false))
        .map(|p| format!("{}/{}", p.host, p.process))
        .collect();
    if !v1.is_empty() {
        lines.push(format!(
            "  not durable (protocol version 1: nothing acknowledged or kept to send again): {}",
            v1.join(", ")
        ));
    }
    let rows: u64 = summary.files.iter().map(|f| f.rows).sum();
    let bytes: u64 = summary.files.iter().map(|f| f.bytes).sum();
    lines.push(format!(
        "{} parquet file(s), {rows} rows, {bytes} bytes",
        summary.files.len()
    ));
    lines
}
