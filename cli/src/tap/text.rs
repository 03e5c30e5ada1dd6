//! The text of the taps' live lines and end summaries.

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use hoptrace_format::units;
use hoptrace_publisher::tap::{TapLive, TapSummary};
use hoptrace_tap::poll::Spread;
use hoptrace_tap::{StoreTapLive, StoreTapSummary};

use crate::collector::lost_line;
use crate::publish::lag_line;

/// The broker tap's live line: messages traced per second since the last line.
#[derive(Debug)]
pub struct TapLine {
    started: Instant,
    last: u64,
}

impl TapLine {
    /// A line from now on.
    #[must_use]
    pub fn new() -> Self {
        Self {
            started: Instant::now(),
            last: 0,
        }
    }

    /// The line for `live`, `since` the last one.
    pub fn line(&mut self, live: &TapLive, since: Duration) -> String {
        let traced = live.traced.load(Relaxed);
        let rate = traced.saturating_sub(self.last) as f64 / since.as_secs_f64();
        self.last = traced;
        format!(
            "{:>6.0}s  {rate:>8.0} traced/s  received {}  traced {}  untraced {}  garbage {}  foreign {}",
            self.started.elapsed().as_secs_f64(),
            live.received.load(Relaxed),
            traced,
            live.not_traced.load(Relaxed),
            live.bad_context.load(Relaxed),
            live.foreign.load(Relaxed),
        )
    }
}

impl Default for TapLine {
    fn default() -> Self {
        Self::new()
    }
}

/// The store tap's live line: polls per second since the last line, keys found.
#[derive(Debug)]
pub struct StoreTapLine {
    started: Instant,
    last_polls: u64,
}

impl StoreTapLine {
    /// A line from now on.
    #[must_use]
    pub fn new() -> Self {
        Self {
            started: Instant::now(),
            last_polls: 0,
        }
    }

    /// The line for `live`, `since` the last one.
    pub fn line(&mut self, live: &StoreTapLive, since: Duration) -> String {
        let polls = live.polls.load(Relaxed);
        let rate = polls.saturating_sub(self.last_polls) as f64 / since.as_secs_f64();
        self.last_polls = polls;
        format!(
            "{:>6.0}s  {rate:>6.0} polls/s  keys found {}  poll errors {}  bad keys {}",
            self.started.elapsed().as_secs_f64(),
            live.keys_found.load(Relaxed),
            live.poll_errors.load(Relaxed),
            live.bad_keys.load(Relaxed),
        )
    }
}

impl Default for StoreTapLine {
    fn default() -> Self {
        Self::new()
    }
}

/// The broker tap's end summary.
#[must_use]
pub fn tap_summary(s: &TapSummary) -> Vec<String> {
    let mut lines = Vec::new();
    lines.push(format!(
        "hoptrace tap: {} ({} carrier){}{} for {:.1} s",
        s.source,
        s.carrier,
        s.hop
            .as_ref()
            .map(|h| format!(", hop {h}"))
            .unwrap_or_default(),
        s.run_id
            .as_ref()
            .map(|r| format!(", run {r}"))
            .unwrap_or_default(),
        s.elapsed_ns as f64 / 1e9
    ));
    lines.push(format!(
        "received {}: traced {}, untraced {}, undecodable context {}, other publishers {}; reconnects {}",
        s.received, s.traced, s.not_traced, s.bad_context, s.foreign, s.reconnects
    ));
    if s.new_sessions > 0 {
        lines.push(format!(
            "note: {} reconnection(s) found no session kept by the broker (a clean session, or a broker restarted without persistence): messages published from the break until the tap subscribed again never reached it",
            s.new_sessions
        ));
    }
    lines.push(format!(
        "stamps: {} at arrival in the tap (CLOCK_REALTIME), {} from Kafka LogAppendTime",
        s.arrival_stamps, s.log_append_time_stamps
    ));
    if let Some(r) = s.stamp_resolution_ns {
        lines.push(format!(
            "note: LogAppendTime has {} resolution (truncated), so stages ending at this hop are up to {} short and may be negative",
            units::duration_f64(r as f64),
            units::duration_f64(r as f64)
        ));
    }
    if s.publish_to_arrival.count > 0 {
        lines.push(format!(
            "publish stamp -> arrival here: {}",
            lag_line(&s.publish_to_arrival)
        ));
    }
    if let Some(c) = &s.exporter {
        lines.push(format!(
            "collector: stamps reported {}, delivered {}, {}; closed cleanly: {}",
            c.reported,
            c.sent,
            lost_line(c),
            if s.exporter_clean == Some(true) {
                "yes"
            } else {
                "NO"
            }
        ));
    }
    lines
}

fn spread(s: &Spread) -> String {
    if s.count == 0 {
        return "-".into();
    }
    format!(
        "mean {}  p50 {}  p99 {}  max {}",
        units::duration_f64(s.mean_ns),
        units::duration_f64(s.p50_ns as f64),
        units::duration_f64(s.p99_ns as f64),
        units::duration_f64(s.max_ns as f64)
    )
}

/// The store tap's end summary.
#[must_use]
pub fn store_tap_summary(s: &StoreTapSummary) -> Vec<String> {
    let mut lines = Vec::new();
    lines.push(format!(
        "hoptrace tap: {}{} for {:.1} s",
        s.source,
        s.run_id
            .as_ref()
            .map(|r| format!(", run {r}"))
            .unwrap_or_default(),
        s.elapsed_ns as f64 / 1e9
    ));
    lines.push(format!("query: {}", s.query));
    if let Some(n) = &s.notice {
        lines.push(format!("note at start: {n}"));
    }
    lines.push(format!(
        "cost: {} polls ({} polls/s at --poll-interval {}), {} failed{}; query time (send -> response) {}{}",
        s.polls,
        units::rate(s.polls_per_s()),
        units::duration_f64(s.poll_interval.as_nanos() as f64),
        s.poll_errors,
        s.last_error
            .as_ref()
            .map(|e| format!(" (last: {e})"))
            .unwrap_or_default(),
        spread(&s.query_time),
        s.server_elapsed
            .as_ref()
            .map(|e| format!("; the store's own query duration {}", spread(e)))
            .unwrap_or_default()
    ));
    lines.push(format!(
        "keys: {} found (in {} polls), {} undecodable, {} of other publishers, {} already there at start; rows {} ({} repeats of a key, {} without a key){}",
        s.keys_found,
        s.polls_with_keys,
        s.bad_keys,
        s.foreign_keys,
        s.baseline_keys,
        s.rows,
        s.rows_repeated,
        s.untraced_rows,
        if s.keys_evicted_early > 0 {
            format!("; {} keys forgotten early (set full)", s.keys_evicted_early)
        } else {
            String::new()
        }
    ));
    if let Some(n) = &s.listen
        && let Some(sub) = &n.subscription
    {
        lines.push(format!(
            "subscription {} on {:?} to {}: {} writes, {} points with a key, {} queries triggered by them, {} keys found by those before any poll (query_start/queryable = that query's send/answer), {} keys no query found within 63 ms (left to the polls), {} lines not parsed, {} requests or queries failed, {} writes InfluxDB could not deliver",
            n.channel, sub.retention_policy, sub.destination, sub.writes, n.notifications, sub.queries, n.keys_notified, sub.unconfirmed, n.bad, n.errors, sub.delivery_failures
        ));
    } else if let Some(n) = &s.listen {
        lines.push(format!(
            "notifications on channel {:?}: {} received, {} keys found by them before any poll (queryable = arrival; query_start the same instant), {} not `KEY TIME_US`, {} listener connections failed or lost",
            n.channel, n.notifications, n.keys_notified, n.bad, n.errors
        ));
    }
    if s.rows_per_key() >= 2.0 {
        lines.push(format!(
            "each key came in {:.1} rows of the poll that found it: {}",
            s.rows_per_key(),
            hoptrace_tap::ROWS_PER_KEY_HINT
        ));
    }
    lines.push(format!(
        "bounds (the earliest instant the data can have become queryable -> this response; the queryable stamp is late by at most this): {}; {} poller(s){}{}",
        spread(&s.bracket),
        s.pollers,
        count_clause(
            s.earliest_from_store_time,
            "keys bounded by their own store time"
        ),
        count_clause(
            s.earliest_fallbacks,
            "keys no remembered poll covered (bounded by their publish stamp)"
        )
    ));
    if s.reconnections > 0 {
        lines.push(format!(
            "connections: {} lost and opened again (the polls they failed are among the failed polls; a poll that failed bounds nothing)",
            s.reconnections
        ));
    }
    let d = &s.store_time_disagrees;
    if !d.trusted() {
        lines.push(format!(
            "row times off this host's clock: {} after the response that returned them (up to {:.1} ms), {} before their publish stamp (up to {:.1} ms); from the first of them on, row times no longer bounded the queryable stamp from below",
            d.ahead,
            d.ahead_max_ns as f64 / 1e6,
            d.behind,
            d.behind_max_ns as f64 / 1e6
        ));
    }
    if s.late_rows > 0 {
        lines.push(format!(
            "late rows: {} keys became visible behind the newest row time already seen (up to {:.1} ms); polls ended looking {:.1} ms back",
            s.late_rows,
            s.late_max_ns as f64 / 1e6,
            s.look_back_ns as f64 / 1e6
        ));
    }
    if let Some((series, resolutions, errors)) = s.series {
        lines.push(format!(
            "series: {series} polled by value, resolved {resolutions} times{}",
            if errors > 0 {
                format!(" ({errors} resolutions failed)")
            } else {
                String::new()
            }
        ));
    }
    if s.catch_up_ns > 0 {
        lines.push(format!(
            "catch-up: {} polls looking {:.1} s back (at most {:.1} s apart) found {} keys the regular polls had missed{}",
            s.catch_up_polls,
            s.catch_up_ns as f64 / 1e9,
            s.catch_up_pace_max_ns as f64 / 1e9,
            s.caught_up_keys,
            if s.caught_up_keys > 0 {
                format!(
                    " (up to {:.1} ms behind the newest row time)",
                    s.caught_up_late_max_ns as f64 / 1e6
                )
            } else {
                String::new()
            }
        ));
    }
    if s.publish_to_queryable.count > 0 {
        lines.push(format!(
            "publish stamp -> queryable here: {}",
            spread(&s.publish_to_queryable)
        ));
    }
    if let Some((host, res)) = &s.store_in {
        lines.push(format!(
            "store_in: the row's own time, announced as host {host}, resolution {}{}",
            units::duration_f64(*res as f64),
            s.publish_to_store
                .as_ref()
                .filter(|p| p.count > 0)
                .map(|p| format!("; publish stamp -> store_in {}", spread(p)))
                .unwrap_or_default()
        ));
    }
    for (i, (c, clean)) in s.exporters.iter().enumerate() {
        lines.push(format!(
            "collector{}: stamps reported {}, delivered {}, {}; closed cleanly: {}",
            if i == 0 { "" } else { " (store clock)" },
            c.reported,
            c.sent,
            lost_line(c),
            if *clean { "yes" } else { "NO" }
        ));
    }
    lines
}

/// `"; N what"` when `n` is not 0, else nothing: a clause of a summary line.
fn count_clause(n: u64, what: &str) -> String {
    if n > 0 {
        format!("; {n} {what}")
    } else {
        String::new()
    }
}
